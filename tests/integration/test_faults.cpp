// Faults across processes: a rank dies mid-collective, a rank never
// arrives, a wrong world size. Ranks are started directly (not through the
// launcher, which would stop the survivors) and must end with an error that
// names the problem within the configured timeout; the hang guard below
// kills everything and fails the test if they do not.
#include <doctest/doctest.h>

#include "free_port.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

struct Rank {
  pid_t pid = -1;
  fs::path log;
  bool exited = false;
  int code = -1;
  int signal = 0;
  std::string output;
};

using bptest::free_port;

fs::path scratch_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("bp_faults_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Starts one rank with RANK/WORLD_SIZE/MASTER_* set and its stdout+stderr in a file.
Rank start_rank(int rank, int world, uint16_t port, double timeout_s,
                const std::vector<std::string>& extra_args, const fs::path& dir) {
  Rank r;
  r.log = dir / ("rank" + std::to_string(rank) + ".log");
  std::vector<std::string> args{BP_TEST_WORKER, "--config", BP_TEST_COLLECTIVES_JSON};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env;
  auto inherited = [](const std::string& kv) {
    for (const char* drop : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT=",
                             "BACKPLANE_TIMEOUT=", "OMPI_", "SLURM_"})
      if (kv.rfind(drop, 0) == 0) return false;
    return true;
  };
  for (char** e = environ; *e != nullptr; ++e)
    if (inherited(*e)) env.emplace_back(*e);
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + std::to_string(world));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port));
  std::ostringstream t;
  t << timeout_s;
  env.push_back("BACKPLANE_TIMEOUT=" + t.str());
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, r.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const int rc = posix_spawn(&r.pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(rc == 0, "posix_spawn " << argv[0] << ": " << std::strerror(rc));
  return r;
}

// Waits for every rank; past `guard` it kills them all and fails: a hang.
void wait_all(std::vector<Rank>& ranks, std::chrono::seconds guard) {
  const auto deadline = std::chrono::steady_clock::now() + guard;
  std::size_t left = ranks.size();
  while (left > 0) {
    for (Rank& r : ranks) {
      if (r.pid < 0) continue;
      int status = 0;
      const pid_t got = ::waitpid(r.pid, &status, WNOHANG);
      if (got != r.pid) continue;
      r.exited = WIFEXITED(status);
      r.code = r.exited ? WEXITSTATUS(status) : -1;
      r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      r.pid = -1;
      std::ifstream in(r.log);
      r.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      --left;
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (Rank& r : ranks)
        if (r.pid > 0) {
          ::kill(r.pid, SIGKILL);
          ::waitpid(r.pid, nullptr, 0);
        }
      FAIL("ranks still running after " << guard.count() << " s: a hang");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string describe(const std::vector<Rank>& ranks) {
  std::ostringstream s;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    s << "--- rank " << i << ": ";
    if (ranks[i].exited)
      s << "exit " << ranks[i].code;
    else
      s << "signal " << ranks[i].signal;
    s << "\n" << ranks[i].output << "\n";
  }
  return s.str();
}

// `backend`: "cpu" (ranks on one host exchange data through shared memory),
// "cpu_inboxes" (the same in the layout of groups above 16 ranks) or
// "cpu_tcp" (the same plugin with shared memory off: Gloo over TCP).
// `late`: the extra worker arguments (--late-rank R --late-ms N) that hold one
// survivor back until the others have failed and exited.
void check_dead_peer(int world, int die_rank, const std::string& backend = "cpu",
                     const std::vector<std::string>& late = {}) {
  const fs::path dir = scratch_dir("die" + std::to_string(world) + backend);
  const uint16_t port = free_port();
  std::vector<Rank> ranks;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> args{"--backend", backend,      "--mode",
                                "die",       "--die-rank", std::to_string(die_rank)};
  args.insert(args.end(), late.begin(), late.end());
  for (int r = 0; r < world; ++r) ranks.push_back(start_rank(r, world, port, 3.0, args, dir));
  wait_all(ranks, std::chrono::seconds(60));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(describe(ranks));
  INFO("took " << took << " s");
  CHECK(ranks[static_cast<std::size_t>(die_rank)].signal == SIGKILL);
  for (int r = 0; r < world; ++r) {
    if (r == die_rank) continue;
    const Rank& s = ranks[static_cast<std::size_t>(r)];
    CHECK(s.exited);
    CHECK(s.code == 0);  // 0: caught timeout or collective_error; 3: no error; 4: another error
    CHECK(s.output.find("caught") != std::string::npos);
    // The message names the peer that went away.
    CHECK(s.output.find("rank " + std::to_string(die_rank)) != std::string::npos);
    // On shared memory the process's exit is seen (a survivor may instead
    // report another survivor's failure, which names the dead rank).
    if (backend != "cpu_tcp" && world == 2)
      CHECK(s.output.find("exited without closing the connection") != std::string::npos);
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("faults: a rank that dies mid-collective fails its peer with an error naming it (2 ranks)") {
  check_dead_peer(2, 1);
}

TEST_CASE("faults: a rank that dies mid-collective fails every survivor with an error naming it (3 ranks)") {
  check_dead_peer(3, 1);
}

TEST_CASE("faults: the host rank dying fails the others (3 ranks)") { check_dead_peer(3, 0); }

TEST_CASE("faults: a rank that dies mid-collective over shared-memory inboxes fails its peer (2 ranks)") {
  check_dead_peer(2, 1, "cpu_inboxes");
}

TEST_CASE(
    "faults: a rank that dies mid-collective over shared-memory inboxes fails every survivor (3 ranks)") {
  check_dead_peer(3, 1, "cpu_inboxes");
}

TEST_CASE("faults: a rank that dies mid-collective over TCP fails its peer naming it (2 ranks)") {
  check_dead_peer(2, 1, "cpu_tcp");
}

TEST_CASE("faults: a rank that dies mid-collective over TCP fails every survivor (3 ranks)") {
  check_dead_peer(3, 1, "cpu_tcp");
}

TEST_CASE(
    "faults: over TCP, a survivor that calls after the store's rank failed and exited still learns why "
    "(3 ranks)") {
  // Rank 0 hosts the store, fails on rank 2's death and exits while rank 1
  // is held back. Rank 1 then reads from rank 0 first (its ring neighbour),
  // finds the connection closed, and learns why only from the failure board
  // in rank 0's store, which a failed rank keeps serving to the ranks still
  // connected (BACKPLANE_STORE_FAILED_LINGER_MS=0 turns that off: rank 1
  // then says only that rank 0 closed the connection).
  check_dead_peer(3, 2, "cpu_tcp", {"--late-rank", "1", "--late-ms", "1000"});
}

TEST_CASE("faults: a rank that never arrives times out group creation with a clear error") {
  const fs::path dir = scratch_dir("missing");
  const uint16_t port = free_port();
  std::vector<Rank> ranks;
  ranks.push_back(start_rank(0, 2, port, 2.0, {"--mode", "all"}, dir));
  wait_all(ranks, std::chrono::seconds(60));
  INFO(describe(ranks));
  CHECK(ranks[0].exited);
  CHECK(ranks[0].code == 1);
  CHECK(ranks[0].output.find("timeout") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("faults: ranks that disagree on the world size fail at the store handshake") {
  const fs::path dir = scratch_dir("worldsize");
  const uint16_t port = free_port();
  std::vector<Rank> ranks;
  ranks.push_back(start_rank(0, 2, port, 5.0, {"--mode", "all"}, dir));
  ranks.push_back(start_rank(1, 3, port, 5.0, {"--mode", "all"}, dir));
  wait_all(ranks, std::chrono::seconds(60));
  INFO(describe(ranks));
  CHECK(ranks[1].exited);
  CHECK(ranks[1].code == 1);
  CHECK(ranks[1].output.find("world_size") != std::string::npos);
  CHECK(ranks[0].exited);
  CHECK(ranks[0].code == 1);  // rank 0 waits for a rank 1 that was refused, then times out
  fs::remove_all(dir);
}
