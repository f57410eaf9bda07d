// The cpu plugin in a memory cgroup: a buffer larger than the room left under
// the cgroup's limit is an out_of_memory status naming the limit, not a
// SIGKILL when its pages are touched; one that fits is allocated and touched
// in full. A program of its own (not doctest): it forks before anything is
// loaded, moves the child into a fresh memory cgroup (v1 or v2) with a 256 MiB
// limit and runs the plugin there. Exit 0: as described; 1: it failed (the
// message says how); 77: skipped (no writable memory cgroup; not root).
#include <backplane/abi.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace {

constexpr uint64_t kLimit = uint64_t{256} << 20;

const bp_host_api g_host{BP_HOST_API_STRUCT_SIZE, BP_ABI_MAJOR, BP_ABI_MINOR, nullptr,
                         [](void*, int32_t, const char*) {}};

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

// This process's cgroup path for the v1 memory controller ("4:memory:/x") or v2 ("0::/x").
std::string own_path(bool v2) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    if (v2 && line.rfind("0::", 0) == 0) return line.substr(3);
    if (!v2 && line.find(":memory:") != std::string::npos) return line.substr(line.find(":memory:") + 8);
  }
  return "";
}

// A fresh memory cgroup with kLimit, beside this process's own; "" with `why` set when none can be made.
std::string make_cgroup(bool& v2, std::string& why) {
  const std::string name = "/backplane-test-" + std::to_string(::getpid());
  const std::string v1_root = "/sys/fs/cgroup/memory";
  std::string path = own_path(false);
  if (!path.empty() && ::access((v1_root + "/memory.limit_in_bytes").c_str(), F_OK) == 0) {
    const std::string dir = v1_root + (path == "/" ? "" : path) + name;
    if (::mkdir(dir.c_str(), 0755) == 0) {
      if (write_file(dir + "/memory.limit_in_bytes", std::to_string(kLimit))) {
        v2 = false;
        return dir;
      }
      ::rmdir(dir.c_str());
    }
    why = "cannot make a v1 memory cgroup under " + v1_root + path + " (" + std::strerror(errno) + ")";
  }
  path = own_path(true);
  for (const std::string root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    if (path.empty() || ::access((root + "/cgroup.controllers").c_str(), F_OK) != 0) continue;
    const std::string parent = root + (path == "/" ? "" : path);
    const std::string dir = parent + name;
    if (::mkdir(dir.c_str(), 0755) != 0) {
      why = "cannot make a v2 cgroup under " + parent + " (" + std::strerror(errno) + ")";
      continue;
    }
    if (write_file(dir + "/memory.max", std::to_string(kLimit))) {
      v2 = true;
      return dir;
    }
    why = "the memory controller is not enabled for " + parent;
    ::rmdir(dir.c_str());
  }
  if (why.empty()) why = "no memory cgroup file system is mounted";
  return "";
}

int fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  return 1;
}

struct Outcome {
  int32_t code = BP_STATUS_OK;
  std::string message;
};

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

int main() {
  if (::geteuid() != 0) {
    std::printf("skipped: not root, so no memory cgroup can be made\n");
    return 77;
  }
  bool v2 = false;
  std::string why;
  const std::string dir = make_cgroup(v2, why);
  if (dir.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!write_file(dir + "/cgroup.procs", "0")) _exit(fail("cannot join " + dir));
    const int rc = child();
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::rmdir(dir.c_str());
  if (WIFSIGNALED(status))
    return fail(std::string("the plugin's process was killed by signal ") + std::to_string(WTERMSIG(status)) +
                " (" + strsignal(WTERMSIG(status)) + ") in a " + (v2 ? "v2" : "v1") + " memory cgroup");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
