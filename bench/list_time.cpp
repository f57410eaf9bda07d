// Wall time of `backplane list` with the default config, as a median over
// runs, next to `backplane --version` (the same binary loading no plugin) and a
// trivial process (`true`) in the same run. The target is < 15 ms median: loading
// the plugins and listing devices must start no thread pool, BLAS or Gloo.
#include "bench_util.hpp"

#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern char** environ;

namespace {

// Runs argv with stdout/stderr to /dev/null; returns wall ns, or -1 on failure.
double run_once(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 1, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", 1, 0);
  const double t0 = bench::now_ns();
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  const double dt = bench::now_ns() - t0;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? dt : -1;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 41;
  const std::string cli = argc > 2 ? argv[2] : BP_BENCH_CLI;
  const std::string config = argc > 3 ? argv[3] : BP_BENCH_CONFIG;
  std::vector<double> list, version, base;
  for (int i = 0; i < runs; ++i) {
    const double l = run_once({cli, "list", "--config", config});
    const double v = run_once({cli, "--version"});
    const double b = run_once({"true"});
    if (l < 0) {
      std::fprintf(stderr, "bench_list_time: `%s list --config %s` failed\n", cli.c_str(), config.c_str());
      return 1;
    }
    list.push_back(l);
    version.push_back(v);
    base.push_back(b);
  }
  const double ml = bench::median(list) / 1e6, mv = bench::median(version) / 1e6,
               mb = bench::median(base) / 1e6;
  std::printf("backplane list, default config, median of %d runs\n", runs);
  std::printf("  spawn `true`            %7.2f ms\n", mb);
  std::printf("  backplane --version     %7.2f ms\n", mv);
  std::printf("  backplane list          %7.2f ms  (%.2fx --version, +%.2f ms; target < 15 ms)\n", ml,
              ml / mv, ml - mv);
  return 0;
}
