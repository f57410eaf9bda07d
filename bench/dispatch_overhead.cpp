// Per-op dispatch overhead: a 16-element f32 add through backplane (validation,
// output allocation through the plugin, the ABI call, the handle) against the
// add computed directly, measured interleaved in one run. A third line calls
// the plugin's ABI table directly (alloc, execute, free: what the core does per
// op, without the core), splitting the overhead between the two.
// Prints the added nanoseconds per op; the target is < 100 ns (limit 150 ns).
// Where a python3 with torch is on PATH, PyTorch's per-op time is printed too.
// With `--ops N through|plugin` it runs N adds by one path and nothing else,
// for counting instructions under valgrind (docs/benchmarks.md).
//
// The direct reference is the add loop written here, as the cpu plugin writes
// its contiguous kernel: an `omp simd` loop on one thread (the plugin runs with
// {"threads": 1} here, and 16 elements never reach its threaded path), in a
// function that is never inlined, as the plugin's kernel is reached through a
// call. A loop here rather than the plugin's execute entry: execute carries the
// plugin's own dispatch, which is part of what this bench measures, so it cannot
// also be the baseline. The "+ alloc/free" line takes the output from the
// plugin's own allocator through its ABI (buffer_alloc, buffer_pointer,
// buffer_free): the plugin's handle is opaque, so its address comes from
// buffer_pointer, a call the plugin-alone line does not make. Alloc and free
// cross the ABI on both lines, so the plugin side printed below is what the
// plugin's execute adds over the loop.
#include "bench_util.hpp"

#include <backplane/abi.h>
#include <backplane/backplane.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace bp = backplane;

namespace {

double torch_ns_per_op() {
  return bench::torch_measure(
      "torch.set_num_threads(1);a=torch.ones(16);b=torch.ones(16);n=200000;"
      "import statistics;print(statistics.median(timeit.repeat(lambda: a+b, number=n, repeat=5))/n*1e9)");
}

// The cpu plugin's table, created directly (no core): for the per-op cost of the
// plugin side alone.
struct DirectPlugin {
  const bp_plugin_api* api = nullptr;
  bp_plugin* plugin = nullptr;

  DirectPlugin() {
    const std::string path = std::string(BP_BENCH_PLUGIN_DIR) + "/libbackplane_cpu.so";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto entry = reinterpret_cast<bp_plugin_entry_fn>(dlsym(lib, BP_PLUGIN_ENTRY_SYMBOL));
    static const bp_host_api host = {BP_HOST_API_STRUCT_SIZE,
                                     BP_ABI_MAJOR,
                                     BP_ABI_MINOR,
                                     nullptr,
                                     [](void*, int32_t, const char*) {},
                                     nullptr,
                                     nullptr};
    api = entry != nullptr ? entry(&host) : nullptr;
    // buffer_pointer is optional in the ABI; the cpu plugin (host_visible) has it.
    if (api == nullptr || !BP_HAS_FIELD(bp_plugin_api, buffer_pointer, api->struct_size) ||
        api->buffer_pointer == nullptr) {
      api = nullptr;
      return;
    }
    bp_create_args c{BP_CREATE_ARGS_STRUCT_SIZE, "cpu", R"({"threads": 1})", &host, nullptr};
    if (bp_status* s = api->create(&c)) {
      api->status_free(s);
      api = nullptr;
      return;
    }
    plugin = c.plugin;
  }
  bp_buffer* alloc(uint64_t bytes) const {
    bp_buffer_alloc_args a{BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, plugin, 0, 0, bytes, nullptr};
    if (bp_status* s = api->buffer_alloc(&a)) api->status_free(s);
    return a.buffer;
  }
  // The buffer's host address (the cpu plugin is host_visible).
  float* data(bp_buffer* b) const {
    bp_buffer_pointer_args p{BP_BUFFER_POINTER_ARGS_STRUCT_SIZE, plugin, b, nullptr, 0, 0};
    if (bp_status* s = api->buffer_pointer(&p)) api->status_free(s);
    return static_cast<float*>(p.data);
  }
  void free(bp_buffer* b) const {
    bp_buffer_free_args f{BP_BUFFER_FREE_ARGS_STRUCT_SIZE, plugin, b};
    if (bp_status* s = api->buffer_free(&f)) api->status_free(s);
  }
};

// The direct reference: out = a + b, as the plugin's contiguous kernel computes it.
[[gnu::noinline]] void add_loop(const float* a, const float* b, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

int main(int argc, char** argv) {
  // `--ops N through|plugin`: only N adds by one path, untimed, for counting
  // instructions (valgrind --tool=callgrind; the difference between two N
  // divided by their difference is the count per op, without the set-up).
  const bool count_only = argc > 3 && std::string(argv[1]) == "--ops";
  const long count_ops = count_only ? std::atol(argv[2]) : 0;
  const std::string count_path = count_only ? argv[3] : "";
  if (argc > 1 && std::string(argv[1]) == "--ops" &&
      (!count_only || count_ops < 0 || (count_path != "through" && count_path != "plugin"))) {
    std::fprintf(stderr, "usage: bench_dispatch [batches] | bench_dispatch --ops N through|plugin\n");
    return 2;
  }
  const int batches = argc > 1 && !count_only ? std::atoi(argv[1]) : 15;
  constexpr int kIters = 200000;
  constexpr int64_t kN = 16;
  try {
    bp::Registry reg = bp::Registry::from_json(
        R"({"schema_version": 1, "backends": [{"name": "cpu", "library": "backplane_cpu", "required": true,
            "options": {"threads": 1}}]})",
        BP_BENCH_PLUGIN_DIR, "bench");
    bp::Device dev = reg.backend("cpu").device(0);
    std::vector<float> host(kN, 1.5f);
    bp::Tensor a = bp::Tensor::from_vector(dev, {kN}, host);
    bp::Tensor b = bp::Tensor::from_vector(dev, {kN}, host);

    alignas(64) float xa[kN], xb[kN], xo[kN];
    std::fill_n(xa, kN, 1.5f);
    std::fill_n(xb, kN, 1.5f);
    volatile float sink = 0;
    // The length as the plugin's kernel gets it, at run time (not folded into the loop).
    volatile int64_t runtime_n = kN;
    const int64_t n = runtime_n;

    // The plugin alone: alloc the output, execute add, free it (what the core adds
    // on top of this is the core's share).
    DirectPlugin direct_plugin;
    if (direct_plugin.api == nullptr) {
      std::fprintf(stderr, "bench_dispatch: cannot load the cpu plugin from %s\n", BP_BENCH_PLUGIN_DIR);
      return 1;
    }
    auto direct = [&] {
      add_loop(xa, xb, xo, n);
      sink = xo[0];
    };
    auto direct_alloc = [&] {  // the plugin's own allocator, so only dispatch differs
      bp_buffer* buf = direct_plugin.alloc(kN * sizeof(float));
      float* o = direct_plugin.data(buf);
      add_loop(xa, xb, o, n);
      sink = o[0];
      direct_plugin.free(buf);
    };
    bp_buffer* pa = direct_plugin.alloc(kN * sizeof(float));
    bp_buffer* pb = direct_plugin.alloc(kN * sizeof(float));
    const int64_t shape[1] = {kN};
    const int64_t strides[1] = {1};
    const bp_op_attrs attrs{BP_OP_ATTRS_STRUCT_SIZE, 0, 0, 0, 0.0, 0.0, 0};
    auto plugin_only = [&] {
      bp_buffer* po = direct_plugin.alloc(kN * sizeof(float));
      const bp_tensor in[2] = {{pa, 0, 0, BP_DTYPE_F32, 1, 0, shape, strides},
                               {pb, 0, 0, BP_DTYPE_F32, 1, 0, shape, strides}};
      const bp_tensor out = {po, 0, 0, BP_DTYPE_F32, 1, 0, shape, strides};
      bp_execute_args e{
          BP_EXECUTE_ARGS_STRUCT_SIZE, direct_plugin.plugin, 0, BP_OP_ADD, in, &out, 2, 1, &attrs};
      if (bp_status* s = direct_plugin.api->execute(&e)) direct_plugin.api->status_free(s);
      direct_plugin.free(po);  // execute is a call into another library: it cannot be elided
    };
    auto through = [&] {
      bp::Tensor c = a + b;
      sink = static_cast<float>(c.numel());
    };
    if (count_only) {
      if (count_path == "through")
        for (long i = 0; i < count_ops; ++i) through();
      else
        for (long i = 0; i < count_ops; ++i) plugin_only();
      return 0;
    }
    // Interleave the three so drift on a noisy machine hits them alike.
    std::vector<double> d, da, p, t;
    for (int i = 0; i < batches; ++i) {
      d.push_back(bench::ns_per_call(direct, kIters, 1));
      da.push_back(bench::ns_per_call(direct_alloc, kIters, 1));
      p.push_back(bench::ns_per_call(plugin_only, kIters, 1));
      t.push_back(bench::ns_per_call(through, kIters, 1));
    }
    const double nd = bench::median(d), nda = bench::median(da), np = bench::median(p), nt = bench::median(t);
    std::printf("dispatch overhead, 16-element f32 add, median of %d batches of %d ops\n", batches, kIters);
    std::printf("  direct kernel call (preallocated output)   %8.1f ns/op\n", nd);
    std::printf("  direct kernel call + the plugin's alloc/free %7.1f ns/op\n", nda);
    std::printf(
        "  the plugin's ABI alone (alloc, execute, free) %6.1f ns/op  (plugin side: +%.1f ns over direct + "
        "alloc)\n",
        np, np - nda);
    std::printf(
        "  through backplane (a + b -> new Tensor)    %8.1f ns/op  (core side: +%.1f ns over the plugin "
        "alone)\n",
        nt, nt - np);
    std::printf(
        "  added by backplane vs direct               %8.1f ns/op  (ratio %.2fx; target < 100, limit 150)\n",
        nt - nd, nt / nd);
    std::printf("  added by backplane vs direct + alloc       %8.1f ns/op  (ratio %.2fx)\n", nt - nda,
                nt / nda);
    {
      // The same op with a trace recording (each op an event; the file is
      // written by the session's thread): what --trace adds per op.
      const std::string path = (std::filesystem::temp_directory_path() /
                                ("bench_dispatch_" + std::to_string(::getpid()) + ".json"))
                                   .string();
      constexpr int kTracedIters = 20000;
      std::vector<double> traced, plain;
      {
        bp::trace::Session session({path, uint64_t{1} << 30});
        for (int i = 0; i < 7; ++i) traced.push_back(bench::ns_per_call(through, kTracedIters, 1));
      }
      for (int i = 0; i < 7; ++i) plain.push_back(bench::ns_per_call(through, kTracedIters, 1));
      std::filesystem::remove(path);
      const double ntr = bench::median(traced), npl = bench::median(plain);
      std::printf("  through backplane with a trace recording   %8.1f ns/op  (+%.1f ns per op recorded)\n",
                  ntr, ntr - npl);
    }
    const double torch = torch_ns_per_op();
    if (torch > 0) {
      std::printf(
          "  PyTorch a + b (same size, 1 thread)        %8.1f ns/op  (backplane is %.1fx cheaper; goal >= "
          "5x)\n",
          torch, torch / nt);
    } else {
      std::printf(
          "  PyTorch: not measured (python3 with torch not found; Debian: apt-get install python3-torch)\n");
    }
    (void)sink;
  } catch (const bp::Error& e) {
    std::fprintf(stderr, "bench_dispatch: %s\n", e.what());
    return 1;
  }
  return 0;
}
