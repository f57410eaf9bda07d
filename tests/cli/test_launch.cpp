// Tests of `backplane launch`, run as a child process: the variables each rank
// gets, the relayed output (prefixes, whole lines, partial and overlong
// lines), exit codes and stopping (a failing rank, a rank killed by a signal,
// a rank that ignores SIGTERM, signals sent to the launcher, a SIGKILLed
// launcher), a missing or unusable command, and bad command lines.
#include "cli_runner.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

using namespace bptest;
using bpcli::Result;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitUsage = 64;
constexpr int kExitNotExecutable = 127;

// How long a test waits for something that takes milliseconds when all is
// well; only reached when the launcher hangs or leaks a process.
constexpr auto kHangGuard = std::chrono::seconds(20);

Result cli(const TempDir& tmp, const std::vector<std::string>& args, const bpcli::Options& options = {}) {
  Result r = bpcli::run(args, tmp.path(), options);
  REQUIRE_MESSAGE(r.exited, r.describe());
  return r;
}

// `text` split at '\n'; the text must end with one (every relayed line does).
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  if (text.empty()) return lines;
  REQUIRE_MESSAGE(text.back() == '\n', "output does not end with a newline: " << text);
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines = split_lines(text);
  std::sort(lines.begin(), lines.end());
  return lines;
}

bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// Starts the CLI without waiting (output to files in `scratch`), for tests
// that signal the launcher while it runs. The environment is the test's,
// minus BACKPLANE_* (as in bpcli::run).
class Background {
 public:
  // `stdout_fd` >= 0: the launcher's stdout (a pipe the test reads); else a file.
  Background(const std::vector<std::string>& args, const fs::path& scratch, int stdout_fd = -1)
      : out_file_(scratch / "bg_stdout.txt"), err_file_(scratch / "bg_stderr.txt") {
    std::vector<std::string> argv_storage{BP_TEST_CLI};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_storage;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "BACKPLANE_", 10) != 0) env_storage.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (std::string& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    REQUIRE(posix_spawn_file_actions_init(&actions) == 0);
    REQUIRE(posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0) == 0);
    if (stdout_fd >= 0) {
      REQUIRE(posix_spawn_file_actions_adddup2(&actions, stdout_fd, STDOUT_FILENO) == 0);
    } else {
      REQUIRE(posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_file_.c_str(),
                                               O_WRONLY | O_CREAT | O_TRUNC, 0644) == 0);
    }
    REQUIRE(posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_file_.c_str(),
                                             O_WRONLY | O_CREAT | O_TRUNC, 0644) == 0);
    // Default SIGPIPE whatever the test runner ignores, as in a shell.
    posix_spawnattr_t attr;
    REQUIRE(posix_spawnattr_init(&attr) == 0);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    REQUIRE(posix_spawnattr_setsigdefault(&attr, &defaults) == 0);
    REQUIRE(posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF) == 0);
    const int rc = posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE_MESSAGE(rc == 0, "posix_spawn " << argv[0] << ": " << std::strerror(rc));
  }
  // A test that failed half-way must not leave the launcher running.
  ~Background() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  pid_t pid() const { return pid_; }

  // Waits for the launcher to exit; fails the test if it hangs.
  Result wait() {
    const auto deadline = Clock::now() + kHangGuard;
    int status = 0;
    pid_t waited;
    while ((waited = ::waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE_MESSAGE(waited == pid_, "the launcher did not exit (it is killed now)");
    pid_ = -1;
    Result r;
    r.exited = WIFEXITED(status);
    if (r.exited) r.code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = bpcli::slurp(out_file_);
    r.err = bpcli::slurp(err_file_);
    return r;
  }

 private:
  fs::path out_file_;
  fs::path err_file_;
  pid_t pid_ = -1;
};

// The complete lines of a file that processes append pids to.
std::vector<pid_t> read_pids(const fs::path& file) {
  const std::string text = bpcli::slurp(file);
  std::vector<pid_t> pids;
  std::size_t begin = 0;
  for (std::size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    pids.push_back(static_cast<pid_t>(std::stol(text.substr(begin, end - begin))));
  }
  return pids;
}

// Waits until `count` pids are in `file` (the ranks are set up).
std::vector<pid_t> wait_for_pids(const fs::path& file, std::size_t count) {
  const auto deadline = Clock::now() + kHangGuard;
  std::vector<pid_t> pids;
  while ((pids = read_pids(file)).size() < count && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE_MESSAGE(pids.size() == count, "only " << pids.size() << " of " << count << " pids in " << file);
  return pids;
}

// Gone, or a zombie that nobody reaped yet (it runs no code any more).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string stat = bpcli::slurp("/proc/" + std::to_string(pid) + "/stat");
  const std::size_t paren = stat.rfind(')');
  if (stat.empty() || paren == std::string::npos) return true;
  const char state = paren + 2 < stat.size() ? stat[paren + 2] : '?';
  return state == 'Z' || state == 'X';
}

// Waits (bounded) for every pid to be gone; returns those still alive.
std::vector<pid_t> survivors(const std::vector<pid_t>& pids) {
  const auto deadline = Clock::now() + kHangGuard;
  std::vector<pid_t> alive = pids;
  while (!alive.empty() && Clock::now() < deadline) {
    alive.erase(std::remove_if(alive.begin(), alive.end(), process_gone), alive.end());
    if (!alive.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const pid_t pid : alive) ::kill(pid, SIGKILL);  // do not leak them into other tests
  return alive;
}

// sh -c SCRIPT as the command of `backplane launch -n N`.
std::vector<std::string> launch_sh(int n, const std::string& script, std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"launch", "-n", std::to_string(n)};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"--", "sh", "-c", script});
  return args;
}

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

}  // namespace

// ---- environment -------------------------------------------------------------------

TEST_CASE(
    "launch: each rank gets RANK LOCAL_RANK WORLD_SIZE MASTER_ADDR MASTER_PORT BACKPLANE_TIMEOUT over "
    "inherited values") {
  TempDir tmp;
  bpcli::Options options;
  // Inherited values of the launcher's variables are replaced; others pass.
  options.env = {{"RANK", "99"},
                 {"WORLD_SIZE", "7"},
                 {"MASTER_PORT", "1"},
                 {"BACKPLANE_TIMEOUT", "9"},
                 {"BP_LAUNCH_TEST", "inherited"}};
  const Result r =
      cli(tmp,
          launch_sh(3,
                    "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
                    "$BACKPLANE_TIMEOUT $BP_LAUNCH_TEST\"",
                    {"--master-addr", "10.1.2.3", "--master-port", "4567", "--timeout", "42"}),
          options);
  INFO(r.describe());
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  const std::vector<std::string> want = {"[rank 0] 0 0 3 3 10.1.2.3 4567 42 inherited",
                                         "[rank 1] 1 1 3 3 10.1.2.3 4567 42 inherited",
                                         "[rank 2] 2 2 3 3 10.1.2.3 4567 42 inherited"};
  CHECK(sorted_lines(r.out) == want);
}

TEST_CASE(
    "launch: by default MASTER_ADDR is 127.0.0.1 and MASTER_PORT one free port and BACKPLANE_TIMEOUT is "
    "inherited") {
  TempDir tmp;
  // A port that is certainly busy while the launcher picks one.
  const int busy = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(busy >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  REQUIRE(::bind(busy, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(busy, 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int busy_port = ntohs(addr.sin_port);

  bpcli::Options options;
  options.env = {{"BACKPLANE_TIMEOUT", "17"}};
  const Result r = cli(tmp, launch_sh(2, "echo \"$MASTER_ADDR $MASTER_PORT $BACKPLANE_TIMEOUT\""), options);
  ::close(busy);
  INFO(r.describe());
  REQUIRE(r.code == 0);
  const std::vector<std::string> lines = sorted_lines(r.out);
  REQUIRE(lines.size() == 2);
  std::set<int> ports;
  for (std::size_t k = 0; k < lines.size(); ++k) {
    const std::string prefix = "[rank " + std::to_string(k) + "] 127.0.0.1 ";
    REQUIRE(lines[k].rfind(prefix, 0) == 0);
    const std::string rest = lines[k].substr(prefix.size());  // "<port> 17"
    REQUIRE(rest.size() > 3);
    CHECK(rest.substr(rest.size() - 3) == " 17");
    ports.insert(std::stoi(rest.substr(0, rest.size() - 3)));
  }
  REQUIRE(ports.size() == 1);  // every rank meets at the same port
  const int port = *ports.begin();
  CHECK(port > 0);
  CHECK(port <= 65535);
  CHECK(port != busy_port);
}

// ---- output ------------------------------------------------------------------------

TEST_CASE("launch: output is relayed line by line with the rank prefix and never interleaves") {
  TempDir tmp;
  constexpr int kRanks = 4;
  constexpr int kOutLines = 3000;
  constexpr int kErrLines = 500;
  // awk writes in blocks that end mid-line, so the launcher must reassemble.
  const std::string script =
      "exec awk -v r=\"$RANK\" 'BEGIN { pad = sprintf(\"%200s\", \"\"); gsub(/ /, \"x\", pad);"
      " for (i = 0; i < " +
      std::to_string(kOutLines) +
      "; i++) printf \"rank %d line %d %s\\n\", r, i, pad;"
      " for (i = 0; i < " +
      std::to_string(kErrLines) + "; i++) printf \"err %d %d\\n\", r, i > \"/dev/stderr\" }'";
  const Result r = cli(tmp, launch_sh(kRanks, script));
  INFO("exit code " << r.code << "; stderr starts: " << r.err.substr(0, 500));
  REQUIRE(r.code == 0);

  const std::string pad(200, 'x');
  std::map<int, int> next_out;
  for (const std::string& line : split_lines(r.out)) {
    int prefix_rank = -1, rank = -1, index = -1;
    char tail[256] = {};
    REQUIRE_MESSAGE(
        std::sscanf(line.c_str(), "[rank %d] rank %d line %d %255s", &prefix_rank, &rank, &index, tail) == 4,
        line.substr(0, 300));
    REQUIRE(prefix_rank == rank);
    REQUIRE(std::string(tail) == pad);
    REQUIRE(line == "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) + " line " +
                        std::to_string(index) + " " + pad);
    REQUIRE(index == next_out[rank]);  // in order, none lost or repeated
    ++next_out[rank];
  }
  std::map<int, int> next_err;
  for (const std::string& line : split_lines(r.err)) {
    int prefix_rank = -1, rank = -1, index = -1;
    REQUIRE_MESSAGE(std::sscanf(line.c_str(), "[rank %d] err %d %d", &prefix_rank, &rank, &index) == 3, line);
    REQUIRE(line ==
            "[rank " + std::to_string(rank) + "] err " + std::to_string(rank) + " " + std::to_string(index));
    REQUIRE(prefix_rank == rank);
    REQUIRE(index == next_err[rank]);
    ++next_err[rank];
  }
  for (int k = 0; k < kRanks; ++k) {
    CHECK(next_out[k] == kOutLines);
    CHECK(next_err[k] == kErrLines);
  }
}

TEST_CASE("launch: a last line without a newline is still relayed on stdout and on stderr") {
  TempDir tmp;
  const Result r = cli(tmp, launch_sh(1, "printf 'first\\nno newline at the end'; printf 'err tail' >&2"));
  INFO(r.describe());
  CHECK(r.code == 0);
  CHECK(r.out == "[rank 0] first\n[rank 0] no newline at the end\n");
  CHECK(r.err == "[rank 0] err tail\n");
}

TEST_CASE("launch: --no-prefix relays the lines as they are") {
  TempDir tmp;
  const Result r = cli(tmp, launch_sh(2, "echo \"hello from $RANK\"", {"--no-prefix"}));
  INFO(r.describe());
  CHECK(r.code == 0);
  CHECK(sorted_lines(r.out) == std::vector<std::string>{"hello from 0", "hello from 1"});
}

TEST_CASE("launch: --rank0-passthrough lets rank 0 write straight to the launcher's output") {
  TempDir tmp;
  // Rank 0's bytes arrive as written (no prefix, no newline added); rank 1 is relayed.
  const Result r =
      cli(tmp, launch_sh(2, "printf \"r$RANK\"; printf \"e$RANK\" >&2", {"--rank0-passthrough"}));
  INFO(r.describe());
  CHECK(r.code == 0);
  CHECK((r.out == "r0[rank 1] r1\n" || r.out == "[rank 1] r1\nr0"));
  CHECK((r.err == "e0[rank 1] e1\n" || r.err == "[rank 1] e1\ne0"));
}

TEST_CASE("launch: a line over 64 KiB is relayed in pieces that do not split a UTF-8 character") {
  TempDir tmp;
  // 'a' then 60000 two-byte characters: byte 65536 of the line is the second
  // byte of a character, so a cut at exactly 64 KiB would split it.
  std::string line = "a";
  for (int i = 0; i < 60000; ++i) line += "\xC3\xA9";  // U+00E9
  const fs::path file = tmp.write("long.txt", line + "\nshort\n" + line);
  const Result r = cli(tmp, {"launch", "-n", "1", "--", "cat", file.string()});
  REQUIRE_MESSAGE(r.code == 0, r.err);

  const std::string prefix = "[rank 0] ";
  std::vector<std::string> pieces;
  for (const std::string& out_line : split_lines(r.out)) {
    REQUIRE(out_line.rfind(prefix, 0) == 0);
    pieces.push_back(out_line.substr(prefix.size()));
  }
  REQUIRE(pieces.size() == 5);  // 2 pieces, "short", 2 pieces (the last one unterminated)
  for (const std::string& piece : pieces) {
    CHECK(piece.size() <= 64 * 1024);
    REQUIRE_FALSE(piece.empty());
    // A piece starts with an ASCII or a lead byte and ends with a complete character.
    CHECK((static_cast<unsigned char>(piece.front()) & 0xC0) != 0x80);
    CHECK(static_cast<unsigned char>(piece.back()) != 0xC3);
  }
  CHECK(pieces[0].size() == 64 * 1024 - 1);
  CHECK(pieces[0] + pieces[1] == line);
  CHECK(pieces[2] == "short");
  CHECK(pieces[3] + pieces[4] == line);
}

// ---- failures and stopping ---------------------------------------------------------

TEST_CASE("launch: a rank that exits non-zero stops the others and its code is the launcher's") {
  TempDir tmp;
  const fs::path pids = tmp / "pids";
  const std::string script =
      "echo $$ >> " + quoted(pids) +
      "; if [ \"$RANK\" = 1 ]; then echo 'rank one fails' >&2; exit 3; fi; exec sleep 60";
  const auto start = Clock::now();
  const Result r = cli(tmp, launch_sh(3, script));
  const auto elapsed = Clock::now() - start;
  INFO(r.describe());
  CHECK(r.code == 3);
  CHECK(elapsed < kHangGuard);  // the sleeping ranks were stopped, not waited for
  const std::size_t said = r.err.find("[rank 1] rank one fails\n");
  const std::size_t verdict = r.err.find("backplane launch: rank 1 (pid ");
  REQUIRE(said != std::string::npos);
  REQUIRE(verdict != std::string::npos);
  CHECK(said < verdict);  // the rank's last words come first
  CHECK(contains(r.err, ") exited with code 3; stopping the other 2 ranks\n"));
  CHECK(survivors(read_pids(pids)).empty());
}

TEST_CASE("launch: a rank killed by a signal gives 128 + signal and names the signal") {
  TempDir tmp;
  const Result r = cli(tmp, launch_sh(2, "if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; exec sleep 60"));
  INFO(r.describe());
  CHECK(r.code == 128 + SIGKILL);
  CHECK(contains(r.err, "backplane launch: rank 0 (pid "));
  CHECK(contains(r.err, ") was killed by signal 9 (SIGKILL); stopping the other rank\n"));
}

TEST_CASE("launch: a rank that ignores SIGTERM is killed after the grace period") {
  TempDir tmp;
  const fs::path ready = tmp / "ready";
  // Rank 0 ignores SIGTERM (sleep inherits that); rank 1 fails once it does.
  const std::string script = "if [ \"$RANK\" = 0 ]; then trap '' TERM; echo $$ > " + quoted(ready) +
                             "; exec sleep 60; fi; while [ ! -s " + quoted(ready) +
                             " ]; do sleep 0.02; done; exit 5";
  const auto start = Clock::now();
  const Result r = cli(tmp, launch_sh(2, script, {"--grace", "0.5"}));
  const auto elapsed = Clock::now() - start;
  INFO(r.describe());
  CHECK(r.code == 5);
  CHECK(elapsed < kHangGuard);
  CHECK(contains(r.err, ") exited with code 5; stopping the other rank\n"));
  CHECK(contains(r.err, "backplane launch: rank 0 (pid "));
  CHECK(contains(r.err, ") did not stop within 0.5 s; sending SIGKILL\n"));
  const std::vector<pid_t> pid = read_pids(ready);
  REQUIRE(pid.size() == 1);
  CHECK(survivors(pid).empty());
}

TEST_CASE("launch: SIGTERM to the launcher is forwarded and no rank or child of a rank outlives it") {
  TempDir tmp;
  const fs::path pids = tmp / "pids";
  // Each rank records itself and a child it started in the background.
  const std::string script =
      "sleep 60 & echo $! >> " + quoted(pids) + "; echo $$ >> " + quoted(pids) + "; wait";
  Background launcher(launch_sh(3, script), tmp.path());
  const std::vector<pid_t> started = wait_for_pids(pids, 6);
  REQUIRE(::kill(launcher.pid(), SIGTERM) == 0);
  const Result r = launcher.wait();
  INFO(r.describe());
  REQUIRE(r.exited);
  CHECK(r.code == 128 + SIGTERM);
  CHECK(contains(r.err, "backplane launch: received SIGTERM; forwarding it to the 3 running ranks"));
  CHECK(survivors(started).empty());
}

TEST_CASE("launch: SIGINT to the launcher reaches the ranks as SIGINT") {
  TempDir tmp;
  const fs::path pids = tmp / "pids";
  const std::string script =
      "trap 'echo \"got INT\"; exit 0' INT; echo $$ >> " + quoted(pids) + "; while :; do sleep 0.05; done";
  Background launcher(launch_sh(2, script), tmp.path());
  const std::vector<pid_t> started = wait_for_pids(pids, 2);
  REQUIRE(::kill(launcher.pid(), SIGINT) == 0);
  const Result r = launcher.wait();
  INFO(r.describe());
  REQUIRE(r.exited);
  CHECK(r.code == 128 + SIGINT);
  CHECK(sorted_lines(r.out) == std::vector<std::string>{"[rank 0] got INT", "[rank 1] got INT"});
  CHECK(survivors(started).empty());
}

TEST_CASE("launch: the ranks die with a launcher that is SIGKILLed") {
  TempDir tmp;
  const fs::path pids = tmp / "pids";
  Background launcher(launch_sh(2, "echo $$ >> " + quoted(pids) + "; exec sleep 60"), tmp.path());
  const std::vector<pid_t> started = wait_for_pids(pids, 2);
  REQUIRE(::kill(launcher.pid(), SIGKILL) == 0);
  const Result r = launcher.wait();
  CHECK(r.signal == SIGKILL);
  CHECK(survivors(started).empty());
}

TEST_CASE(
    "launch: when the reader of the launcher's stdout goes away the ranks get SIGPIPE and the job stops") {
  TempDir tmp;
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  Background launcher(launch_sh(2, "exec yes"), tmp.path(), fds[1]);
  ::close(fds[1]);
  char head[64] = {};
  std::size_t got = 0;
  while (got < sizeof head) {
    const ssize_t n = ::read(fds[0], head + got, sizeof head - got);
    REQUIRE(n > 0);
    got += static_cast<std::size_t>(n);
  }
  ::close(fds[0]);  // like `| head -c 64`
  CHECK(std::string(head, 6) == "[rank ");
  const Result r = launcher.wait();
  INFO(r.describe());
  REQUIRE(r.exited);
  CHECK(r.code == 128 + SIGPIPE);
  CHECK(contains(r.err, ") was killed by signal 13 (SIGPIPE); stopping the other rank"));
}

// ---- unusable commands and bad command lines ----------------------------------------

TEST_CASE("launch: a command that cannot be found or executed fails with 127 before any rank starts") {
  TempDir tmp;
  const fs::path marker = tmp / "started";
  // No rank may run: the first argument would be the marker file otherwise.
  struct Case {
    std::string command;
    std::string message;
  };
  const fs::path not_executable = tmp.write("script.sh", "#!/bin/sh\ntouch \"$1\"\n");
  fs::permissions(not_executable, fs::perms::owner_read | fs::perms::owner_write);
  const fs::path bad_format = tmp.write("garbage", "this is not a program\n");
  fs::permissions(bad_format, fs::perms::owner_all);
  const std::vector<Case> cases = {
      {"bp-no-such-command-for-launch",
       "launch: command 'bp-no-such-command-for-launch' not found in PATH ("},
      {(tmp / "missing" / "prog").string(), "' does not exist; nothing was started"},
      {tmp.path().string(), "' is a directory, not a program; nothing was started"},
      {not_executable.string(), "' is not executable; make it executable (chmod +x)"},
      {bad_format.string(), "launch: cannot start rank 0: cannot execute '" + bad_format.string() + "': "},
  };
  for (const Case& c : cases) {
    CAPTURE(c.command);
    const Result r = cli(tmp, {"launch", "-n", "2", "--", c.command, marker.string()});
    INFO(r.describe());
    CHECK(r.code == kExitNotExecutable);
    CHECK(contains(r.err, "backplane: error: "));
    CHECK(contains(r.err, c.message));
    CHECK(r.out.empty());
    CHECK_FALSE(fs::exists(marker));
  }
}

TEST_CASE("launch: bad command lines exit 64 with the reason") {
  TempDir tmp;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"launch", "-n", "0", "--", "true"}, "0 is not a valid number of ranks; pass 1 to"},
      {{"launch", "-n", "-2", "--", "true"}, "number of ranks"},
      {{"launch", "-n", "two", "--", "true"}, "'two' is not a whole number"},
      {{"launch", "--", "true"}, "--nproc is required"},
      {{"launch", "-n", "2"}, "command is required"},
      {{"launch", "-n", "2", "--master-port", "0", "--", "true"}, "0 is not a valid port; pass 1 to 65535"},
      {{"launch", "-n", "2", "--master-port", "70000", "--", "true"}, "70000 is not a valid port"},
      {{"launch", "-n", "2", "--timeout", "0", "--", "true"}, "0 is not a valid timeout in seconds"},
      {{"launch", "-n", "2", "--grace", "-1", "--", "true"}, "'-1' is not a valid grace period"},
      {{"launch", "-n", "2", "--master-addr", "", "--", "true"}, "--master-addr is empty"},
      {{"launch", "-n", "2", "--", ""}, "the command is an empty string"},
      {{"launch", "-n", "2", "--max-restarts", "-1", "--", "true"}, "-1 is not a valid number of restarts"},
  };
  for (const auto& [args, message] : cases) {
    std::string shown;
    for (const std::string& a : args) shown += "'" + a + "' ";
    CAPTURE(shown);
    const Result r = cli(tmp, args);
    INFO(r.describe());
    CHECK(r.code == kExitUsage);
    CHECK(contains(r.err, message));
    CHECK(r.out.empty());
  }
}

TEST_CASE("launch: the command's own options need no -- and do not reach the launcher") {
  TempDir tmp;
  const Result r = cli(tmp, {"launch", "-n", "2", "sh", "-c", "echo \"$0 $1 $RANK\"", "-n", "5"});
  INFO(r.describe());
  CHECK(r.code == 0);
  CHECK(sorted_lines(r.out) == std::vector<std::string>{"[rank 0] -n 5 0", "[rank 1] -n 5 1"});
}

TEST_CASE("launch: --max-restarts starts every rank again with a fresh secret, then gives up") {
  TempDir tmp;
  // Every start fails: 1 + 2 starts of 2 ranks, then the job ends with the
  // failing rank's code. Rank 1 fails only once rank 0 has said its line
  // (else the launcher may stop rank 0 before it speaks, on a slow machine).
  const std::string mark = (tmp / "rank0-said-").string();
  const Result r =
      cli(tmp, launch_sh(2,
                         "echo \"start $BACKPLANE_RESTART_COUNT $BACKPLANE_JOB_TOKEN\"; "
                         "if [ \"$RANK\" = 0 ]; then touch '" +
                             mark +
                             "'\"$BACKPLANE_RESTART_COUNT\"; exec sleep 60; fi; "
                             "i=0; while [ ! -e '" +
                             mark +
                             "'\"$BACKPLANE_RESTART_COUNT\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); "
                             "done; exit 3",
                         {"--max-restarts", "2", "--restart-delay", "0.05"}));
  INFO(r.describe());
  CHECK(r.code == 3);
  // The pause doubles with each restart.
  CHECK(contains(r.err,
                 "backplane launch: restart 1/2: rank 1 exited with code 3; starting every rank again; "
                 "restarting in 0.05 s\n"));
  CHECK(contains(r.err, "backplane launch: restart 2/2: rank 1 exited with code 3"));
  CHECK(contains(r.err, "; restarting in 0.1 s\n"));
  CHECK(contains(r.err, "giving up: the job failed again after 2 restarts (--max-restarts 2)"));
  std::set<std::string> tokens;
  std::map<std::string, int> starts;
  for (const std::string& line : split_lines(r.out)) {
    const auto at = line.find("start ");
    REQUIRE(at != std::string::npos);
    const auto space = line.find(' ', at + 6);
    REQUIRE(space != std::string::npos);
    ++starts[line.substr(at + 6, space - at - 6)];
    tokens.insert(line.substr(space + 1));
  }
  CHECK(starts == std::map<std::string, int>{{"0", 2}, {"1", 2}, {"2", 2}});
  CHECK(tokens.size() == 3);  // one secret per start
}

TEST_CASE("launch: a usage error (exit 64) or a configuration error (exit 2) is not restarted") {
  TempDir tmp;
  for (const int code : {64, 2}) {
    CAPTURE(code);
    const Result r =
        cli(tmp, launch_sh(2, "echo \"start $BACKPLANE_RESTART_COUNT\"; exit " + std::to_string(code),
                           {"--max-restarts", "3"}));
    INFO(r.describe());
    CHECK(r.code == code);
    CHECK(contains(r.err, "not restarting: rank "));
    CHECK(contains(
        r.err, code == 64 ? "exited with 64, a usage error, which a restart would repeat"
                          : "exited with 2, a configuration or usage error, which a restart would repeat"));
    CHECK_FALSE(contains(r.err, "restart 1/3"));
    CHECK_FALSE(contains(r.out, "start 1"));
  }
}

TEST_CASE("launch: a job that fails once completes after one restart and exits 0") {
  TempDir tmp;
  const Result r = cli(tmp, launch_sh(2, "if [ \"$BACKPLANE_RESTART_COUNT\" = 0 ]; then kill -9 $$; fi",
                                      {"--max-restarts", "3"}));
  INFO(r.describe());
  CHECK(r.code == 0);
  CHECK(contains(r.err, "restart 1/3: rank "));
  CHECK(contains(r.err, "was killed by signal 9 (SIGKILL); starting every rank again"));
  CHECK_FALSE(contains(r.err, "restart 2/3"));
}

TEST_CASE("launch: restarts pause --restart-delay, 1 s by default") {
  TempDir tmp;
  const Result r = cli(tmp, launch_sh(1, "exit 3", {"--max-restarts", "1"}));
  INFO(r.describe());
  CHECK(r.code == 3);
  CHECK(contains(r.err,
                 "restart 1/1: rank 0 exited with code 3; starting every rank again; restarting in 1 s\n"));
  const Result bad = cli(tmp, launch_sh(1, "true", {"--restart-delay", "-1"}));
  CHECK(bad.code == 64);
  CHECK(contains(bad.err, "is not a valid restart delay; pass seconds from 0 to 86400"));
}

TEST_CASE("launch: a stop signal while waiting to restart ends the job without restarting") {
  TempDir tmp;
  const fs::path starts = tmp / "starts";
  Background launcher(
      launch_sh(2, "echo \"start $BACKPLANE_RESTART_COUNT\" >> " + quoted(starts) + "; exit 3",
                {"--max-restarts", "5", "--restart-delay", "600"}),
      tmp.path());
  // Waits (bounded) until the launcher says it is pausing.
  const auto deadline = Clock::now() + kHangGuard;
  while (!contains(bpcli::slurp(tmp / "bg_stderr.txt"), "restarting in 600 s") && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(::kill(launcher.pid(), SIGINT) == 0);
  const Result r = launcher.wait();
  INFO(r.describe());
  CHECK(r.code == 128 + SIGINT);
  CHECK(contains(r.err, "restarting in 600 s"));
  CHECK(contains(r.err, "received SIGINT while waiting to restart; not restarting"));
  CHECK_FALSE(contains(bpcli::slurp(starts), "start 1"));  // nothing started again
}

TEST_CASE("launch: a launcher stopped by a signal does not restart the job") {
  TempDir tmp;
  const fs::path pids = tmp / "pids";
  Background launcher(launch_sh(2, "echo $$ >> " + quoted(pids) + "; exec sleep 60", {"--max-restarts", "5"}),
                      tmp.path());
  const std::vector<pid_t> started = wait_for_pids(pids, 2);
  REQUIRE(::kill(launcher.pid(), SIGTERM) == 0);
  const Result r = launcher.wait();
  INFO(r.describe());
  CHECK(r.code == 128 + SIGTERM);
  CHECK_FALSE(contains(r.err, "restart 1/5"));
  CHECK(survivors(started).empty());
}
