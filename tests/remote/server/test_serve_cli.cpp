// `backplane serve` as a process: what it prints, serving a client, stopping
// cleanly on SIGTERM, and refusing to start where it must.
#include "memory_cgroup.hpp"
#include "server_support.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

extern char** environ;

using namespace rstest;

namespace {

// A config naming the built cpu plugin.
fs::path write_config(const fs::path& dir) {
  const fs::path p = dir / "server.json";
  std::ofstream(p)
      << R"({"schema_version": 1, "plugin_dirs": [")" << BP_TEST_PLUGIN_DIR
      << R"("], "default_backend": "cpu", "backends": [{"name": "cpu", "library": "backplane_cpu",
                         "required": true, "options": {"threads": 1}}]})";
  return p;
}

// `backplane serve ARGS...` with stdout and stderr captured; killed at the end if still running.
class ServeProcess {
 public:
  // `max_files`, when not 0, is the serve process's RLIMIT_NOFILE (set by sh's
  // ulimit); `cgroup_procs`, when given, is the cgroup.procs file of a cgroup
  // it joins before it starts.
  ServeProcess(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
               int max_files = 0, const std::string& cgroup_procs = "") {
    int out[2], err[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
    std::vector<std::string> argv_s{BP_TEST_CLI, "serve"};
    std::string setup;
    if (max_files != 0) setup += "ulimit -n " + std::to_string(max_files) + " && ";
    if (!cgroup_procs.empty()) setup += "echo $$ > '" + cgroup_procs + "' && ";
    if (!setup.empty()) argv_s.insert(argv_s.begin(), {"/bin/sh", "-c", setup + "exec \"$0\" \"$@\""});
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::string(*e).rfind("BACKPLANE_", 0) != 0) env_s.emplace_back(*e);
    for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (std::string& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    REQUIRE(::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()) == 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
    ::close(err_);
  }

  // Reads stdout until a line equal to `line` (true) or EOF / the safety bound (false).
  bool wait_for_line(const std::string& line) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      std::size_t start = 0, nl = 0;
      while ((nl = out_text.find('\n', start)) != std::string::npos) {
        if (out_text.compare(start, nl - start, line) == 0) return true;
        start = nl + 1;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(out_, out_text, left)) return false;
    }
  }

  // Waits for the exit; returns its status and the rest of the output.
  int wait_exit() {
    while (read_some(out_, out_text, 60s)) {
    }
    while (read_some(err_, err_text, 60s)) {
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  void signal(int sig) { ::kill(pid_, sig); }

  std::string out_text, err_text;

 private:
  static bool read_some(int fd, std::string& into, std::chrono::milliseconds timeout) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    into.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
};

uint16_t port_from(const std::string& out) {
  const std::string marker = " on 127.0.0.1:";
  const auto at = out.find(marker);
  REQUIRE(at != std::string::npos);
  return static_cast<uint16_t>(std::stoi(out.substr(at + marker.size())));
}

}  // namespace

TEST_CASE("remote server: backplane serve prints its devices and serves and stops cleanly on SIGTERM") {
  TempDir dir;
  const fs::path config = write_config(dir.path());
  const fs::path token = dir.path() / "token";
  std::ofstream(token) << "cli-test-token\n";
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write);
  ServeProcess serve({"--config", config.string(), "--backend", "cpu", "--listen", "127.0.0.1:0",
                      "--token-file", token.string(), "--idle-timeout-ms", "30000"});
  REQUIRE_MESSAGE(serve.wait_for_line("ready"), serve.out_text);
  CHECK(serve.out_text.rfind("serving cpu (1 device) on 127.0.0.1:", 0) == 0);
  CHECK(serve.out_text.find(", token required, no TLS\n") != std::string::npos);
  CHECK(serve.out_text.find("  device 0: host (1 thread") != std::string::npos);
  CHECK(serve.out_text.find("collective") != std::string::npos);
  const uint16_t port = port_from(serve.out_text);
  check_round_trip(port, "cli-test-token");
  RawClient held(port);  // a session open at the stop: told, then freed
  REQUIRE(held.handshake("cli-test-token"));
  serve.signal(SIGTERM);
  const int status = serve.wait_exit();
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(serve.out_text.find("stopping (SIGTERM): closing every session") != std::string::npos);
  CHECK_MESSAGE(
      serve.out_text.find("stopped: closed 1 session and freed what they held") != std::string::npos,
      serve.out_text);
  CHECK(serve.err_text.find("serve: session") != std::string::npos);
  std::optional<Frame> last;
  CHECK(held.closed_by_peer(20s, &last));
  REQUIRE(last);
  CHECK(answer_of(*last).message == "the server is shutting down");
}

TEST_CASE(
    "remote server: backplane serve refuses a public address without a token and a readable token file") {
  TempDir dir;
  const fs::path config = write_config(dir.path());
  {
    ServeProcess serve({"--config", config.string(), "--listen", "0.0.0.0:0"});
    const int status = serve.wait_exit();
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 1);
    CHECK(serve.err_text.find("backplane: error: serve: refusing to listen on 0.0.0.0:0") !=
          std::string::npos);
    CHECK(serve.out_text.find("ready") == std::string::npos);
  }
  {
    const fs::path token = dir.path() / "open-token";
    std::ofstream(token) << "t\n";
    fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                               fs::perms::others_read);
    ServeProcess serve(
        {"--config", config.string(), "--listen", "127.0.0.1:0", "--token-file", token.string()});
    const int status = serve.wait_exit();
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 64);
    CHECK(serve.err_text.find("can be read or written by others than its owner (mode 0644)") !=
          std::string::npos);
    CHECK(serve.err_text.find("chmod 600") != std::string::npos);
  }
  {
    ServeProcess serve({"--config", config.string(), "--listen", "127.0.0.1:0"},
                       {{"BACKPLANE_REMOTE_TOKEN", ""}});
    const int status = serve.wait_exit();
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 64);
    CHECK(serve.err_text.find("BACKPLANE_REMOTE_TOKEN is set but empty") != std::string::npos);
  }
  {
    ServeProcess serve({"--config", config.string(), "--backend", "nope", "--listen", "127.0.0.1:0"});
    const int status = serve.wait_exit();
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 1);
    CHECK(serve.err_text.find("nope") != std::string::npos);
  }
}

#ifdef BP_TEST_SANITIZED
constexpr bool kSanitized = true;  // the sanitizers' runtime fails without descriptors (CMakeLists.txt)
#else
constexpr bool kSanitized = false;
#endif

TEST_CASE("remote server: backplane serve out of file descriptors backs off and then serves again" *
          doctest::skip(kSanitized)) {
  TempDir dir;
  const fs::path config = write_config(dir.path());
  ServeProcess serve(
      {"--config", config.string(), "--listen", "127.0.0.1:0", "--handshake-timeout-ms", "60000",
       "--max-handshakes-per-address", "1000"},  // every connection here comes from 127.0.0.1
      {}, 48);
  REQUIRE_MESSAGE(serve.wait_for_line("ready"), serve.out_text);
  const uint16_t port = port_from(serve.out_text);
  // More silent connections than the server has descriptors: accepting fails with EMFILE.
  std::vector<std::unique_ptr<RawClient>> flood;
  for (int i = 0; i < 80; ++i) flood.push_back(std::make_unique<RawClient>(port));
  std::optional<Frame> none;
  CHECK_FALSE(flood.back()->closed_by_peer(1s, &none));  // waits in the backlog, neither served nor closed
  flood.clear();  // their ends close: the server's descriptors come back
  check_round_trip(port);
  serve.signal(SIGTERM);
  const int status = serve.wait_exit();
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_MESSAGE(serve.err_text.find("(out of file descriptors; raise `ulimit -n`); retrying with backoff") !=
                    std::string::npos,
                serve.err_text);
  CHECK(serve.err_text.find("accepting connections again") != std::string::npos);
}

// Not under the sanitizers: their runtimes' own memory would crowd the cgroup.
TEST_CASE(
    "remote server: serve in a 256 MiB memory cgroup answers a 1 GiB Alloc with out_of_memory and serves on" *
    doctest::skip(kSanitized)) {
  bptest::MemoryCgroup cgroup(uint64_t{256} << 20);
  if (!cgroup.ok()) {
    MESSAGE("skipped: " << cgroup.why());
    return;
  }
  TempDir dir;
  const fs::path config = write_config(dir.path());
  for (const bool default_cap : {true, false}) {
    CAPTURE(default_cap);
    // Without --max-total-bytes the caps (90% of the cgroup's room, and the
    // per-session default within it) refuse; with caps past the limit the
    // backend's own check does.
    std::vector<std::string> args{"--config", config.string(), "--listen", "127.0.0.1:0"};
    if (!default_cap) args.insert(args.end(), {"--max-total-bytes", std::to_string(uint64_t{8} << 30)});
    ServeProcess serve(args, {}, 0, cgroup.procs());
    REQUIRE_MESSAGE(serve.wait_for_line("ready"), serve.out_text);
    if (default_cap) CHECK(serve.out_text.find("memory cgroup " + cgroup.dir()) != std::string::npos);
    const uint16_t port = port_from(serve.out_text);
    {
      RawClient c(port);
      const auto welcome = c.handshake();
      REQUIRE(welcome);
      REQUIRE(welcome->type() == wire::Body::Welcome);
      REQUIRE(c.send(msg::alloc(1, 1, 0, uint64_t{1} << 30)));
      const auto r = c.request(msg::synchronize(2));
      REQUIRE(r);
      const Answer a = answer_of(*r);
      CHECK(a.status == BP_STATUS_OUT_OF_MEMORY);
      CHECK_MESSAGE(
          a.message.find(default_cap ? "(backplane serve --max-" : "memory cgroup") != std::string::npos,
          a.message);
      CHECK(c.send(msg::goodbye(3)));
    }
    // The server lives and serves the next session.
    check_round_trip(port);
    serve.signal(SIGTERM);
    const int status = serve.wait_exit();
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE(
    "remote server: traced client and server merge into one timeline, each request a flow from send to run") {
  TempDir dir;
  const fs::path config = write_config(dir.path());
  const fs::path server_trace = dir.path() / "server.json";
  ServeProcess serve({"--config", config.string(), "--backend", "cpu", "--listen", "127.0.0.1:0"},
                     {{"BACKPLANE_TRACE", server_trace.string()}});
  REQUIRE_MESSAGE(serve.wait_for_line("ready"), serve.out_text);
  const uint16_t port = port_from(serve.out_text);
  const fs::path client_config = dir.path() / "remote.json";
  std::ofstream(client_config) << R"({"schema_version": 1, "plugin_dirs": [")" << BP_TEST_PLUGIN_DIR
                               << R"("], "default_backend": "remote", "backends": [{"name": "remote",
                                     "library": "backplane_remote", "required": true,
                                     "options": {"endpoints": ["127.0.0.1:)"
                               << port << R"("]}}]})";
  const fs::path client_trace = dir.path() / "client.json";
  const std::string cli = BP_TEST_CLI;
  const std::string train = "env -u BACKPLANE_CONFIG -u BACKPLANE_TRACE '" + cli + "' train --config '" +
                            client_config.string() + "' --nproc 1 --epochs 1 --batch-size 256 --data '" +
                            BP_TEST_DIGITS + "' --trace '" + client_trace.string() + "' > '" +
                            (dir.path() / "train.log").string() + "' 2>&1";
  REQUIRE_MESSAGE(std::system(train.c_str()) == 0, std::ifstream(dir.path() / "train.log").rdbuf());
  serve.signal(SIGTERM);
  const int status = serve.wait_exit();
  REQUIRE(WIFEXITED(status));
  REQUIRE(fs::exists(server_trace));  // written at the server's exit
  const fs::path all = dir.path() / "all.json";
  const std::string merge = "'" + cli + "' trace merge -o '" + all.string() + "' '" + client_trace.string() +
                            "' '" + server_trace.string() + "' > /dev/null";
  REQUIRE(std::system(merge.c_str()) == 0);
  std::ifstream in(all);
  const nlohmann::json t = nlohmann::json::parse(in);
  std::map<uint64_t, int64_t> sent;  // flow id -> the pid it left
  std::map<uint64_t, int64_t> ran;   // flow id -> the pid it arrived at
  std::map<int64_t, std::string> names;
  int executes = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "s") sent[e["id"].get<uint64_t>()] = e["pid"].get<int64_t>();
    if (e["ph"] == "f") ran[e["id"].get<uint64_t>()] = e["pid"].get<int64_t>();
    if (e["ph"] == "X" && e["cat"] == "remote" && e["name"] == "Execute") ++executes;
    if (e["ph"] == "M" && e["name"] == "process_name") names[e["pid"].get<int64_t>()] = e["args"]["name"];
  }
  REQUIRE(names.size() == 2);  // the client's rank 0 and the server, apart
  CHECK(names[0].rfind("rank 0 \xC2\xB7 remote:0", 0) == 0);
  const int64_t server_pid = std::next(names.begin())->first;
  CHECK(names[server_pid].rfind("serve 127.0.0.1:", 0) == 0);
  CHECK(executes > 100);
  std::size_t joined = 0;
  for (const auto& [id, pid] : ran) {
    const auto s = sent.find(id);
    REQUIRE_MESSAGE(s != sent.end(), "the server ran request flow " << id << " that no client sent");
    CHECK(s->second == 0);
    CHECK(pid == server_pid);
    ++joined;
  }
  CHECK(joined > 100);
  CHECK(sent.size() <= ran.size() + 2);  // the Goodbye, and a last request cut by the exit, may go unanswered
}
