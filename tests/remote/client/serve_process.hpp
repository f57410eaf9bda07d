// `backplane serve` as a child process for the remote plugin's tests: started
// on an ephemeral loopback port with a config naming the built cpu plugin,
// ready once it prints "ready"; stopped with SIGTERM (or killed with SIGKILL
// by a test). The child gets the parent's environment minus BACKPLANE_*.
#ifndef BACKPLANE_TESTS_REMOTE_CLIENT_SERVE_PROCESS_HPP_
#define BACKPLANE_TESTS_REMOTE_CLIENT_SERVE_PROCESS_HPP_

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace backplane::remote::test {

class ServeProcess {
 public:
  // Serves the cpu backend; `extra` are more command-line arguments.
  ServeProcess(const std::string& dir, std::vector<std::string> extra = {}) {
    const std::string config = dir + "/server.json";
    std::ofstream(config) << R"({"schema_version": 1, "plugin_dirs": [")" << BP_TEST_PLUGIN_DIR
                          << R"("], "default_backend": "cpu", "backends": [{"name": "cpu", "library": )"
                          << R"("backplane_cpu", "required": true, "options": {"threads": 1}}]})";
    std::vector<std::string> args{BP_TEST_CLI, "serve", "--config", config, "--listen", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_text;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "BACKPLANE_", 10) != 0) env_text.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    const int rc = posix_spawn(&pid_, BP_TEST_CLI, &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    REQUIRE_MESSAGE(rc == 0, "cannot start " << BP_TEST_CLI << ": " << std::strerror(rc));
    stdout_fd_ = out[0];
    // Reads until "ready" (a safety bound of 60 s for a loaded machine).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (output_.find("\nready") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{stdout_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(stdout_fd_, buf, sizeof buf);
      if (n <= 0) break;
      output_.append(buf, static_cast<std::size_t>(n));
    }
    REQUIRE_MESSAGE(output_.find("\nready") != std::string::npos, "backplane serve did not get ready:\n"
                                                                      << output_);
    const auto at = output_.find(" on 127.0.0.1:");
    REQUIRE(at != std::string::npos);
    const auto start = at + 4;
    endpoint_ = output_.substr(start, output_.find_first_not_of("0123456789.:", start) - start);
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      bool gone = false;
      for (int i = 0; i < 1000 && !(gone = reaped()); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!gone) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
      }
    }
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  const std::string& endpoint() const noexcept { return endpoint_; }
  const std::string& output() const noexcept { return output_; }
  // kill -9, reaped.
  void kill_hard() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  bool reaped() {
    const pid_t r = ::waitpid(pid_, nullptr, WNOHANG);
    if (r == pid_ || r < 0) {
      pid_ = -1;
      return true;
    }
    return false;
  }

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string output_;
  std::string endpoint_;
};

}  // namespace backplane::remote::test

#endif  // BACKPLANE_TESTS_REMOTE_CLIENT_SERVE_PROCESS_HPP_
