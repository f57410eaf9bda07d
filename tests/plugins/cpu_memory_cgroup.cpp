// The cpu plugin in a memory cgroup: a buffer larger than the room left under
// the cgroup's limit is an out_of_memory status naming the limit, not a
// SIGKILL when its pages are touched; one that fits is allocated and touched
// in full. With --block-cache, under 1 GiB: 800 MiB freed can be allocated
// again, and 40 MiB buffers beside it end in out_of_memory, never a SIGKILL
// (freed blocks the plugin keeps for reuse are not counted against it). A
// program of its own (not doctest): it forks before anything is loaded, moves
// the child into a fresh memory cgroup (v1 or v2) and runs the plugin there.
// Exit 0: as described; 1: it failed (the message says how); 77: skipped (no
// writable memory cgroup; not root).
#include <backplane/abi.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "memory_cgroup.hpp"

namespace {

constexpr uint64_t kLimit = uint64_t{256} << 20;
constexpr uint64_t kCacheLimit = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

const bp_host_api g_host{BP_HOST_API_STRUCT_SIZE,
                         BP_ABI_MAJOR,
                         BP_ABI_MINOR,
                         nullptr,
                         [](void*, int32_t, const char*) {},
                         nullptr,
                         nullptr};

int fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  return 1;
}

struct Outcome {
  int32_t code = BP_STATUS_OK;
  std::string message;
};

// The plugin, created; its calls return an Outcome.
class Plugin {
 public:
  std::string open() {
    const std::string path = std::string(BP_TEST_PLUGIN_DIR) + "/libbackplane_cpu.so";
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return std::string("dlopen: ") + ::dlerror();
    auto entry = reinterpret_cast<bp_plugin_entry_fn>(::dlsym(lib, BP_PLUGIN_ENTRY_SYMBOL));
    if (entry == nullptr) return "no " BP_PLUGIN_ENTRY_SYMBOL;
    api_ = entry(&g_host);
    if (api_ == nullptr) return "bp_plugin_entry returned NULL";
    bp_create_args c{BP_CREATE_ARGS_STRUCT_SIZE, "cpu", R"({"threads": 1})", &g_host, nullptr};
    if (const Outcome o = take(api_->create(&c)); o.code != BP_STATUS_OK) return "create: " + o.message;
    plugin_ = c.plugin;
    return "";
  }
  // A buffer of `size` bytes with every page written, or nullptr and why.
  bp_buffer* touched(uint64_t size, Outcome& o) {
    bp_buffer_alloc_args a{BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, plugin_, 0, 0, size, nullptr};
    o = take(api_->buffer_alloc(&a));
    if (o.code != BP_STATUS_OK) return nullptr;
    bp_buffer_pointer_args p{BP_BUFFER_POINTER_ARGS_STRUCT_SIZE, plugin_, a.buffer, nullptr, 0, 0};
    if (o = take(api_->buffer_pointer(&p)); o.code != BP_STATUS_OK) return nullptr;
    std::memset(p.data, 1, size);
    return a.buffer;
  }
  void free(bp_buffer* b) {
    bp_buffer_free_args f{BP_BUFFER_FREE_ARGS_STRUCT_SIZE, plugin_, b};
    take(api_->buffer_free(&f));
  }

 private:
  Outcome take(bp_status* s) {
    Outcome o;
    if (s != nullptr) {
      o.code = api_->status_code(s);
      o.message = api_->status_message(s);
      api_->status_free(s);
    }
    return o;
  }
  const bp_plugin_api* api_ = nullptr;
  bp_plugin* plugin_ = nullptr;
};

// In a 1 GiB cgroup: 800 MiB allocated, touched and freed, then again; then
// 40 MiB buffers, each touched, until out_of_memory. Then the same 40 MiB
// buffers without the 800 MiB one, freed and taken again from the cache.
int child_block_cache() {
  Plugin plugin;
  if (const std::string why = plugin.open(); !why.empty()) return fail(why);
  Outcome o;
  bp_buffer* big = plugin.touched(800 * kMiB, o);
  if (big == nullptr) return fail("800 MiB in a 1 GiB cgroup: " + o.message);
  plugin.free(big);
  big = plugin.touched(800 * kMiB, o);
  if (big == nullptr) return fail("800 MiB in a 1 GiB cgroup, after 800 MiB were freed: " + o.message);
  std::printf("800 MiB allocated, freed and allocated again\n");
  std::vector<bp_buffer*> small;
  for (;;) {
    bp_buffer* b = plugin.touched(40 * kMiB, o);
    if (b == nullptr) break;
    small.push_back(b);
  }
  if (o.code != BP_STATUS_OUT_OF_MEMORY) return fail("a 40 MiB buffer gave status " + std::to_string(o.code));
  std::printf("beside it, %zu buffers of 40 MiB, then: %s\n", small.size(), o.message.c_str());
  plugin.free(big);
  for (bp_buffer* b : small) plugin.free(b);
  // Without the 800 MiB: more 40 MiB buffers, and after freeing them all,
  // as many again (from the cache, or anew where it gave them back).
  for (int round = 0; round < 2; ++round) {
    small.clear();
    for (;;) {
      bp_buffer* b = plugin.touched(40 * kMiB, o);
      if (b == nullptr) break;
      small.push_back(b);
    }
    if (o.code != BP_STATUS_OUT_OF_MEMORY)
      return fail("a 40 MiB buffer gave status " + std::to_string(o.code));
    std::printf("round %d: %zu buffers of 40 MiB, then out_of_memory\n", round + 1, small.size());
    if (small.size() < 15) return fail("fewer than 15 buffers of 40 MiB fit in a 1 GiB cgroup");
    for (bp_buffer* b : small) plugin.free(b);
  }
  return 0;
}

// In the cgroup: the plugin, a too-large buffer and one that fits.
int child() {
  const std::string path = std::string(BP_TEST_PLUGIN_DIR) + "/libbackplane_cpu.so";
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return fail(std::string("dlopen: ") + ::dlerror());
  auto entry = reinterpret_cast<bp_plugin_entry_fn>(::dlsym(lib, BP_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) return fail("no " BP_PLUGIN_ENTRY_SYMBOL);
  const bp_plugin_api* api = entry(&g_host);
  if (api == nullptr) return fail("bp_plugin_entry returned NULL");
  auto take = [&](bp_status* s) {
    Outcome o;
    if (s != nullptr) {
      o.code = api->status_code(s);
      o.message = api->status_message(s);
      api->status_free(s);
    }
    return o;
  };
  bp_create_args c{BP_CREATE_ARGS_STRUCT_SIZE, "cpu", R"({"threads": 1})", &g_host, nullptr};
  if (const Outcome o = take(api->create(&c)); o.code != BP_STATUS_OK) return fail("create: " + o.message);
  // 1 GiB in a 256 MiB cgroup: malloc would succeed; touching it would be a SIGKILL.
  bp_buffer_alloc_args big{BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, c.plugin, 0, 0, uint64_t{1} << 30, nullptr};
  const Outcome refused = take(api->buffer_alloc(&big));
  if (refused.code != BP_STATUS_OUT_OF_MEMORY)
    return fail("a 1 GiB buffer in a 256 MiB cgroup gave status " + std::to_string(refused.code) + ": " +
                refused.message);
  if (refused.message.find("memory cgroup") == std::string::npos ||
      refused.message.find("limit 256.0 MiB") == std::string::npos)
    return fail("the out_of_memory message does not name the cgroup and its limit: " + refused.message);
  std::printf("refused as expected: %s\n", refused.message.c_str());
  // 96 MiB fits: allocated, and every page touched.
  bp_buffer_alloc_args fits{BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, c.plugin, 0, 0, uint64_t{96} << 20, nullptr};
  if (const Outcome o = take(api->buffer_alloc(&fits)); o.code != BP_STATUS_OK)
    return fail("a 96 MiB buffer in a 256 MiB cgroup was refused: " + o.message);
  bp_buffer_pointer_args p{BP_BUFFER_POINTER_ARGS_STRUCT_SIZE, c.plugin, fits.buffer, nullptr, 0, 0};
  if (const Outcome o = take(api->buffer_pointer(&p)); o.code != BP_STATUS_OK || p.data == nullptr)
    return fail("buffer_pointer: " + o.message);
  std::memset(p.data, 1, fits.size);
  bp_buffer_free_args f{BP_BUFFER_FREE_ARGS_STRUCT_SIZE, c.plugin, fits.buffer};
  take(api->buffer_free(&f));
  api->destroy(c.plugin);
  std::printf("a 96 MiB buffer was allocated and touched\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool block_cache = argc > 1 && std::strcmp(argv[1], "--block-cache") == 0;
#ifdef BP_TEST_TSAN
  std::printf("skipped: ThreadSanitizer's runtime and shadow memory take more than the cgroup allows\n");
  return 77;
#endif
#ifdef BP_TEST_ASAN
  if (block_cache) {
    std::printf(
        "skipped: AddressSanitizer's shadow memory and quarantine (freed blocks it holds back) are memory "
        "the "
        "plugin's room cannot see; the release build runs this sequence\n");
    return 77;
  }
#endif
  bptest::MemoryCgroup cgroup(block_cache ? kCacheLimit : kLimit);
  if (!cgroup.ok()) {
    std::printf("skipped: %s\n", cgroup.why().c_str());
    return 77;
  }
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!bptest::MemoryCgroup::write_file(cgroup.procs(), "0")) _exit(fail("cannot join " + cgroup.dir()));
    const int rc = block_cache ? child_block_cache() : child();
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    return fail(std::string("the plugin's process was killed by signal ") + std::to_string(WTERMSIG(status)) +
                " (" + strsignal(WTERMSIG(status)) + ") in the memory cgroup " + cgroup.dir());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
