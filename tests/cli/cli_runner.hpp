// Runs the backplane CLI as a child process (posix_spawn) and captures its
// exit status, stdout and stderr. The child gets the parent's environment
// minus every BACKPLANE_* variable (so the developer's own settings cannot
// change what a test sees), plus the variables a test sets, and optionally
// another working directory.
#ifndef BACKPLANE_TESTS_CLI_RUNNER_HPP_
#define BACKPLANE_TESTS_CLI_RUNNER_HPP_

#include <doctest/doctest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#ifndef BP_TEST_CLI
#error "BP_TEST_CLI must name the backplane executable"
#endif

namespace bpcli {

namespace fs = std::filesystem;

struct Result {
  bool exited = false;  // false: killed by a signal (a crash)
  int code = -1;        // the exit code when exited
  int signal = 0;       // the signal when not exited
  std::string out;
  std::string err;

  // For failure messages: everything the child said.
  std::string describe() const {
    std::ostringstream s;
    if (exited) {
      s << "exit code " << code;
    } else {
      s << "killed by signal " << signal;
    }
    s << "\n--- stdout ---\n" << out << "\n--- stderr ---\n" << err;
    return s.str();
  }
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Options {
  std::map<std::string, std::string> env;  // extra environment variables
  fs::path cwd;                            // empty: the test's own
};

// Starts `backplane args...` and returns its pid; `scratch` is a directory
// for the captured output. Collect it with wait_for().
inline pid_t spawn(const std::vector<std::string>& args, const fs::path& scratch,
                   const Options& options = {}) {
  const fs::path out_file = scratch / "cli_stdout.txt";
  const fs::path err_file = scratch / "cli_stderr.txt";

  std::vector<std::string> argv_storage;
  argv_storage.emplace_back(BP_TEST_CLI);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "BACKPLANE_", 10) == 0) continue;
    // A variable the test sets replaces the inherited one (getenv finds the first).
    const std::string_view entry(*e);
    if (options.env.count(std::string(entry.substr(0, entry.find('=')))) != 0) continue;
    env_storage.emplace_back(*e);
  }
  for (const auto& [name, value] : options.env) env_storage.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  REQUIRE(posix_spawn_file_actions_init(&actions) == 0);
  REQUIRE(posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0) == 0);
  REQUIRE(posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_file.c_str(),
                                           O_WRONLY | O_CREAT | O_TRUNC, 0644) == 0);
  REQUIRE(posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_file.c_str(),
                                           O_WRONLY | O_CREAT | O_TRUNC, 0644) == 0);
  if (!options.cwd.empty()) {
    REQUIRE(posix_spawn_file_actions_addchdir_np(&actions, options.cwd.c_str()) == 0);
  }

  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(rc == 0, "posix_spawn " << argv[0] << ": " << std::strerror(rc));
  return pid;
}

// Waits for a spawn()ed child and collects what it said.
inline Result wait_for(pid_t pid, const fs::path& scratch) {
  int status = 0;
  pid_t waited;
  do {
    waited = ::waitpid(pid, &status, 0);
  } while (waited == -1 && errno == EINTR);
  REQUIRE(waited == pid);

  Result r;
  r.exited = WIFEXITED(status);
  if (r.exited) {
    r.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  }
  r.out = slurp(scratch / "cli_stdout.txt");
  r.err = slurp(scratch / "cli_stderr.txt");
  return r;
}

// Runs `backplane args...`; `scratch` is a directory for the captured output.
inline Result run(const std::vector<std::string>& args, const fs::path& scratch,
                  const Options& options = {}) {
  return wait_for(spawn(args, scratch, options), scratch);
}

}  // namespace bpcli

#endif  // BACKPLANE_TESTS_CLI_RUNNER_HPP_
