// Per-op dispatch overhead: a 16-element f32 add through backplane (validation,
// output allocation through the plugin, the ABI call, the handle) against the
// same cpu kernel called directly, measured interleaved in one run.
// Prints the added nanoseconds per op; the target is < 100 ns (limit 150 ns).
// Where a python3 with torch is on PATH, PyTorch's per-op time is printed too.
#include "bench_util.hpp"
#include "cpu/host_buffer.hpp"
#include "cpu/kernels.hpp"

#include <backplane/backplane.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace bp = backplane;

namespace {

double torch_ns_per_op() {
  return bench::torch_measure(
      "torch.set_num_threads(1);a=torch.ones(16);b=torch.ones(16);n=200000;"
      "import statistics;print(statistics.median(timeit.repeat(lambda: a+b, number=n, repeat=5))/n*1e9)");
}

}  // namespace

int main(int argc, char** argv) {
  const int batches = argc > 1 ? std::atoi(argv[1]) : 15;
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

    auto direct = [&] {
      bp::cpu::binary_contiguous<bp::cpu::BinaryOp::add, float>(xa, xb, xo, kN, 1);
      sink = xo[0];
    };
    auto direct_alloc = [&] {  // the plugin's own allocator, so only dispatch differs
      bp_buffer* buf = bp::cpu::allocate_buffer(kN * sizeof(float));
      auto* o = reinterpret_cast<float*>(bp::cpu::buffer_data(buf));
      bp::cpu::binary_contiguous<bp::cpu::BinaryOp::add, float>(xa, xb, o, kN, 1);
      sink = o[0];
      bp::cpu::free_buffer(buf);
    };
    auto through = [&] {
      bp::Tensor c = a + b;
      sink = static_cast<float>(c.numel());
    };
    // Interleave the three so drift on a noisy machine hits them alike.
    std::vector<double> d, da, t;
    for (int i = 0; i < batches; ++i) {
      d.push_back(bench::ns_per_call(direct, kIters, 1));
      da.push_back(bench::ns_per_call(direct_alloc, kIters, 1));
      t.push_back(bench::ns_per_call(through, kIters, 1));
    }
    const double nd = bench::median(d), nda = bench::median(da), nt = bench::median(t);
    std::printf("dispatch overhead, 16-element f32 add, median of %d batches of %d ops\n", batches, kIters);
    std::printf("  direct kernel call (preallocated output)   %8.1f ns/op\n", nd);
    std::printf("  direct kernel call + the plugin's alloc/free %7.1f ns/op\n", nda);
    std::printf("  through backplane (a + b -> new Tensor)    %8.1f ns/op\n", nt);
    std::printf("  added by backplane vs direct               %8.1f ns/op  (ratio %.2fx; target < 100, limit 150)\n",
                nt - nd, nt / nd);
    std::printf("  added by backplane vs direct + alloc       %8.1f ns/op  (ratio %.2fx)\n", nt - nda, nt / nda);
    const double torch = torch_ns_per_op();
    if (torch > 0) {
      std::printf("  PyTorch a + b (same size, 1 thread)        %8.1f ns/op  (backplane is %.1fx cheaper; goal >= 5x)\n",
                  torch, torch / nt);
    } else {
      std::printf("  PyTorch: not measured (python3 with torch not found; Debian: apt-get install python3-torch)\n");
    }
    (void)sink;
  } catch (const bp::Error& e) {
    std::fprintf(stderr, "bench_dispatch: %s\n", e.what());
    return 1;
  }
  return 0;
}
