// Tests of `backplane train`'s checkpoints and restarts, run as a child
// process: a resumed run (from a checkpoint taken mid-epoch or at an epoch's
// end, with one or two ranks) ends byte for byte where an uninterrupted one
// does; a damaged newest checkpoint is skipped with a warning, one made for
// another run is refused naming the option; --keep and interrupted writes;
// and `--max-restarts` bringing a job through two ranks killed with SIGKILL.
// The launcher's own restarts (any command) are in test_launch.cpp.
#include "cli_runner.hpp"
#include "memory_cgroup.hpp"
#include "test_support.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/types.h>
#include <unistd.h>

using namespace bptest;
using bpcli::Result;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 64;

const std::string kDigits = std::string(BP_TEST_SOURCE_DIR) + "/data/digits.csv.gz";

Result cli(const TempDir& tmp, const std::vector<std::string>& args) {
  Result r = bpcli::run(args, tmp.path());
  REQUIRE_MESSAGE(r.exited, r.describe());
  return r;
}

// `train` on the cpu plugin alone, with the repository's data and seed 0.
std::vector<std::string> train_args(const TempDir& tmp, const std::string& nproc, const std::string& epochs,
                                    std::vector<std::string> more = {}) {
  const fs::path config = tmp / "backends.json";
  if (!fs::exists(config))
    tmp.write("backends.json", config_json({backend_json("cpu", "backplane_cpu", true)}));
  std::vector<std::string> args{"train",  "--nproc", nproc,      "--epochs",      epochs,      "--seed", "0",
                                "--data", kDigits,   "--config", config.string(), "--backend", "cpu"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

struct Outcome {
  std::string weights;  // the --save-model file's bytes
  nlohmann::json metrics;
};

Outcome outcome(const TempDir& tmp, const std::string& name) {
  return {bpcli::slurp(tmp / (name + ".safetensors")),
          nlohmann::json::parse(bpcli::slurp(tmp / (name + ".json")))};
}

std::vector<std::string> outputs(const TempDir& tmp, const std::string& name) {
  return {"--save-model", (tmp / (name + ".safetensors")).string(), "--metrics-out",
          (tmp / (name + ".json")).string()};
}

// The same final weights (byte for byte), epoch losses and test accuracy.
void expect_identical(const Outcome& a, const Outcome& b) {
  REQUIRE(!a.weights.empty());
  CHECK(a.weights == b.weights);
  CHECK(a.metrics["epoch_loss"] == b.metrics["epoch_loss"]);
  CHECK(a.metrics["test_accuracy"] == b.metrics["test_accuracy"]);
  CHECK(a.metrics["steps"] == b.metrics["steps"]);
}

Outcome uninterrupted(const TempDir& tmp, const std::string& nproc, const std::string& epochs) {
  const std::string name = "full_" + nproc + "_" + epochs;
  std::vector<std::string> args = train_args(tmp, nproc, epochs, outputs(tmp, name));
  const Result r = cli(tmp, args);
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  return outcome(tmp, name);
}

// The folder's names, sorted, but for the lock file every job leaves there.
std::vector<std::string> checkpoint_files(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename() != ".backplane-train.lock") names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("train checkpoints: runs resumed mid-epoch and at an epoch's end end byte for byte as one run") {
  for (const std::string nproc : {"1", "2"}) {
    CAPTURE(nproc);
    TempDir tmp;
    const Outcome full = uninterrupted(tmp, nproc, "3");
    const fs::path dir = tmp / "checkpoints";
    // 1 epoch, a checkpoint every 7 steps and at its end; then drop the
    // end-of-epoch one, so the run resumes mid-epoch.
    Result r =
        cli(tmp, train_args(tmp, nproc, "1", {"--checkpoint-dir", dir.string(), "--checkpoint-every", "7"}));
    REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
    std::vector<std::string> files = checkpoint_files(dir);
    REQUIRE(files.size() == 2);  // --keep 2
    fs::remove(dir / files.back());
    r = cli(tmp, train_args(tmp, nproc, "2", {"--checkpoint-dir", dir.string(), "--checkpoint-every", "7"}));
    REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
    BP_CHECK_CONTAINS(r.out, "resuming from " + (dir / files.front()).string());
    BP_CHECK_CONTAINS(r.out, "of its steps done");
    // ... and from the end of epoch 2 (the 2-epoch run's last checkpoint)
    // to the end of epoch 3.
    std::vector<std::string> more{"--checkpoint-dir", dir.string(), "--checkpoint-every", "7"};
    for (const std::string& a : outputs(tmp, "resumed")) more.push_back(a);
    r = cli(tmp, train_args(tmp, nproc, "3", more));
    REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
    BP_CHECK_CONTAINS(r.out, "epoch 2 done");
    expect_identical(outcome(tmp, "resumed"), full);
    // A finished job run again has nothing left to train and says the same.
    r = cli(tmp, train_args(tmp, nproc, "3", more));
    REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
    BP_CHECK_CONTAINS(r.out, "epoch 3 done");
    expect_identical(outcome(tmp, "resumed"), full);
  }
}

TEST_CASE("train checkpoints: a damaged newest checkpoint is skipped with a warning naming it") {
  TempDir tmp;
  const Outcome full = uninterrupted(tmp, "1", "3");
  const fs::path dir = tmp / "checkpoints";
  Result r = cli(tmp, train_args(tmp, "1", "2", {"--checkpoint-dir", dir.string()}));
  REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
  const std::vector<std::string> files = checkpoint_files(dir);
  REQUIRE(files.size() == 2);  // one per epoch
  SUBCASE("truncated") { fs::resize_file(dir / files.back(), fs::file_size(dir / files.back()) / 2); }
  SUBCASE("a flipped byte in a tensor") {
    std::fstream f(dir / files.back(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    f.put('\x7f');
  }
  SUBCASE("one bit flipped in the metadata's step count") {
    std::string bytes = bpcli::slurp(dir / files.back());
    const std::size_t at = bytes.find("\"step\":\"90\"");
    REQUIRE(at != std::string::npos);
    bytes[at + 9] ^= 0x01;  // '9' (0x39) -> '8' (0x38): still a valid count
    std::ofstream(dir / files.back(), std::ios::binary | std::ios::trunc) << bytes;
  }
  SUBCASE("one bit flipped in the loss history") {
    std::string bytes = bpcli::slurp(dir / files.back());
    const std::size_t at = bytes.find("\"epoch_loss\":\"[\\\"");
    REQUIRE(at != std::string::npos);
    REQUIRE(std::isdigit(static_cast<unsigned char>(bytes[at + 17])));
    bytes[at + 17] ^= 0x01;  // the first loss's first digit: another digit, another valid number
    std::ofstream(dir / files.back(), std::ios::binary | std::ios::trunc) << bytes;
  }
  std::vector<std::string> more{"--checkpoint-dir", dir.string()};
  for (const std::string& a : outputs(tmp, "resumed")) more.push_back(a);
  r = cli(tmp, train_args(tmp, "1", "3", more));
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.err, "skipping checkpoint " + (dir / files.back()).string());
  BP_CHECK_CONTAINS(r.out, "resuming from " + (dir / files.front()).string());
  expect_identical(outcome(tmp, "resumed"), full);
}

namespace {

// A safetensors file that declares `tensors` (name -> shape, F32) and the
// checkpoint metadata, with a buffer that is a hole: a planted 8 GiB tensor
// takes a few kilobytes of disk.
void plant_checkpoint(const fs::path& file,
                      const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"backplane.checkpoint", "2"}, {"checksum", "sha256:00"}, {"step", "9999"}};
  uint64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    uint64_t bytes = 4;
    for (const int64_t d : shape) bytes *= static_cast<uint64_t>(d);
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(uint64_t{text.size()} >> (8 * i));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes << text;
  fs::resize_file(file, 8 + text.size() + offset);
}

}  // namespace

TEST_CASE(
    "train checkpoints: names, dtypes and shapes are checked before a tensor is read (a planted 8 GiB "
    "tensor)") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Result r = cli(tmp, train_args(tmp, "1", "1", {"--checkpoint-dir", dir.string()}));
  REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
  const std::vector<std::string> files = checkpoint_files(dir);
  REQUIRE(files.size() == 1);
  // Newer than the good one; one tensor of 2^31 floats, as a hole.
  plant_checkpoint(dir / "step-0000009999.safetensors", {{"model.l1.weight", {int64_t{1} << 31}}});
  plant_checkpoint(dir / "step-0000009998.safetensors", {{"model.l3.weight", {4}}});
  // In a 2 GiB memory cgroup where root may make one: a tensor read or
  // copied before the check would be killed there.
  bptest::MemoryCgroup cgroup(uint64_t{2} << 30);
  if (!cgroup.ok()) MESSAGE("no 2 GiB memory cgroup (" << cgroup.why() << "): the run is not memory-limited");
  const pid_t pid = bpcli::spawn(train_args(tmp, "1", "2", {"--checkpoint-dir", dir.string()}), tmp.path());
  if (cgroup.ok()) REQUIRE(bptest::MemoryCgroup::write_file(cgroup.procs(), std::to_string(pid)));
  r = bpcli::wait_for(pid, tmp.path());
  INFO(r.describe());
  REQUIRE(r.exited);
  REQUIRE(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.err, "skipping checkpoint " + (dir / "step-0000009999.safetensors").string());
  BP_CHECK_CONTAINS(r.err, "its tensor \"model.l1.weight\" is f32 [2147483648], this run's is f32 [64, 128]");
  BP_CHECK_CONTAINS(r.err, "skipping checkpoint " + (dir / "step-0000009998.safetensors").string());
  BP_CHECK_CONTAINS(
      r.err, "it holds the tensor \"model.l3.weight\", which this run's model and optimizer do not have");
  BP_CHECK_CONTAINS(r.out, "resuming from " + (dir / files.front()).string());
}

TEST_CASE("train checkpoints: links in the folder are never followed, replaced when written, never pruned") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  fs::create_directories(dir);
  tmp.write("victim.txt", "precious");
  // Where this run will write (step 20), and a "newest checkpoint" that is a
  // link to a file outside the folder.
  fs::create_symlink("../victim.txt", dir / "step-0000000020.safetensors");
  fs::create_symlink("../victim.txt", dir / "step-0000009999.safetensors");
  const Result r =
      cli(tmp, train_args(tmp, "1", "1",
                          {"--checkpoint-dir", dir.string(), "--checkpoint-every", "10", "--keep", "2"}));
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  CHECK(bpcli::slurp(tmp / "victim.txt") == "precious");
  BP_CHECK_CONTAINS(r.err, "skipping checkpoint " + (dir / "step-0000009999.safetensors").string());
  BP_CHECK_CONTAINS(r.err, "it is a symbolic link, which is not followed here");
  // Steps 10..45 written; the newest 2 kept; the link nobody here wrote is left.
  CHECK(checkpoint_files(dir) == std::vector<std::string>{"step-0000000040.safetensors",
                                                          "step-0000000045.safetensors",
                                                          "step-0000009999.safetensors"});
  CHECK(fs::is_symlink(dir / "step-0000009999.safetensors"));
  CHECK(fs::is_regular_file(fs::symlink_status(dir / "step-0000000045.safetensors")));
}

TEST_CASE("train outputs: another user's link in a sticky world-writable folder is refused before training") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: making a link owned by another user needs root");
    return;
  }
  TempDir tmp;
  tmp.write("victim", "root's file");
  const fs::path shared = tmp / "shared";
  fs::create_directory(shared);
  REQUIRE(::chmod(shared.c_str(), 01777) == 0);
  for (const std::string flag : {"--metrics-out", "--plot", "--save-model"}) {
    CAPTURE(flag);
    const fs::path link = shared / (flag == "--plot" ? "out.svg" : "out.bin");
    fs::remove(link);
    fs::create_symlink(tmp / "victim", link);
    REQUIRE(::lchown(link.c_str(), 65534, 65534) == 0);
    const Result r = cli(tmp, train_args(tmp, "1", "1", {flag, link.string()}));
    CHECK(r.code == kExitFailed);
    BP_CHECK_CONTAINS(r.err, flag + ": cannot write '" + link.string() + "'");
    BP_CHECK_CONTAINS(r.err, "is a symbolic link owned by uid 65534 in the sticky world-writable folder");
    CHECK(r.out.find("epoch 1") == std::string::npos);  // refused before training
  }
  CHECK(bpcli::slurp(tmp / "victim") == "root's file");
}

TEST_CASE("train checkpoints: a second job on the folder is refused, naming the first") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  fs::create_directories(dir);
  // The first job: this test process, holding the lock as a train job would.
  const fs::path lock =
      tmp.write("checkpoints/.backplane-train.lock", "pid 4242 on node7, since 2026-01-01T00:00:00Z\n");
  const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  for (const std::string nproc : {"1", "2"}) {
    CAPTURE(nproc);
    const Result r = cli(tmp, train_args(tmp, nproc, "1", {"--checkpoint-dir", dir.string()}));
    CHECK(r.code == kExitFailed);
    BP_CHECK_CONTAINS(r.err,
                      "is in use by another train job (pid 4242 on node7, since 2026-01-01T00:00:00Z)");
    BP_CHECK_CONTAINS(r.err, "pass another --checkpoint-dir");
  }
  ::close(fd);  // the first job ends: the folder is free
  const Result r = cli(tmp, train_args(tmp, "1", "1", {"--checkpoint-dir", dir.string()}));
  INFO(r.describe());
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(bpcli::slurp(dir / ".backplane-train.lock"), "pid ");
}

TEST_CASE(
    "train: a malformed environment variable is exit 64 before any rank starts, and is never restarted") {
  TempDir tmp;
  bpcli::Options options;
  options.env["BACKPLANE_TIMEOUT"] = "abc";
  Result r = bpcli::run(train_args(tmp, "2", "1", {"--max-restarts", "3"}), tmp.path(), options);
  INFO(r.describe());
  CHECK(r.code == kExitUsage);
  BP_CHECK_CONTAINS(r.err, "BACKPLANE_TIMEOUT='abc' is not a number of seconds");
  CHECK(r.err.find("restart 1/3") == std::string::npos);
  // A rank started by another launcher says the same, with the same code.
  options.env["RANK"] = "0";
  options.env["WORLD_SIZE"] = "2";
  r = bpcli::run(train_args(tmp, "1", "1"), tmp.path(), options);
  CHECK(r.code == kExitUsage);
  BP_CHECK_CONTAINS(r.err, "BACKPLANE_TIMEOUT='abc' is not a number of seconds");
}

TEST_CASE("train checkpoints: damaged later checkpoints never push out the ones a resumed run writes") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Result r = cli(tmp, train_args(tmp, "1", "3", {"--checkpoint-dir", dir.string(), "--keep", "3"}));
  REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
  const std::vector<std::string> files = checkpoint_files(dir);  // epochs 1, 2, 3
  REQUIRE(files.size() == 3);
  for (const std::string& damaged : {files[1], files[2]}) {
    std::fstream f(dir / damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    f.put('\x7f');
  }
  // Resumes from epoch 1 and writes epoch 2 with --keep 1: the damaged epoch
  // 3 must go, not the checkpoint just written.
  r = cli(tmp, train_args(tmp, "1", "2", {"--checkpoint-dir", dir.string(), "--keep", "1"}));
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.out, "resuming from " + (dir / files[0]).string());
  CHECK(checkpoint_files(dir) == std::vector<std::string>{files[1]});
  // And it reads back whole: a third run resumes from it.
  r = cli(tmp, train_args(tmp, "1", "2", {"--checkpoint-dir", dir.string()}));
  REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
  BP_CHECK_CONTAINS(r.out, "resuming from " + (dir / files[1]).string());
  CHECK(r.err.find("skipping checkpoint") == std::string::npos);
}

TEST_CASE("train checkpoints: one made by another run is refused, naming each option that differs") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  Result r = cli(tmp, train_args(tmp, "1", "1", {"--checkpoint-dir", dir.string()}));
  REQUIRE_MESSAGE(r.code == kExitOk, r.describe());
  r = cli(tmp, train_args(tmp, "1", "2",
                          {"--checkpoint-dir", dir.string(), "--batch-size", "16", "--lr", "0.05"}));
  INFO(r.describe());
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.err, "cannot resume from " + (dir / "step-0000000045.safetensors").string());
  BP_CHECK_CONTAINS(r.err, "--batch-size 32 (this run: 16)");
  BP_CHECK_CONTAINS(r.err, "--lr 0.1 (this run: 0.05)");
  BP_CHECK_CONTAINS(r.err, "pass another --checkpoint-dir");
  // Another world size, through the launcher: rank 0 refuses, rank 1 is told.
  r = cli(tmp, train_args(tmp, "2", "2", {"--checkpoint-dir", dir.string()}));
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.out + r.err, "world size 1 (this run: 2)");
  CHECK(checkpoint_files(dir) == std::vector<std::string>{"step-0000000045.safetensors"});
}

TEST_CASE("train checkpoints: --keep keeps the newest, interrupted writes are cleared, bad options refused") {
  TempDir tmp;
  const fs::path dir = tmp / "checkpoints";
  tmp.write("checkpoints/.step-0000000005.safetensors.tmp-123-abcdef", "half a checkpoint");
  tmp.write("checkpoints/notes.txt", "not ours");
  Result r =
      cli(tmp, train_args(tmp, "1", "1",
                          {"--checkpoint-dir", dir.string(), "--checkpoint-every", "10", "--keep", "3"}));
  INFO(r.describe());
  REQUIRE(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.err, "removed 1 unfinished checkpoint write");
  BP_CHECK_CONTAINS(r.out, "checkpoints: 5 written to " + dir.string());
  // Steps 10, 20, 30, 40 and 45 (the epoch's end); the newest 3 stay.
  CHECK(checkpoint_files(dir) == std::vector<std::string>{"notes.txt", "step-0000000030.safetensors",
                                                          "step-0000000040.safetensors",
                                                          "step-0000000045.safetensors"});
  for (const char* flag : {"--keep", "--checkpoint-every"}) {
    CAPTURE(flag);
    r = cli(tmp, train_args(tmp, "1", "1", {flag, "3"}));
    CHECK(r.code == kExitUsage);
    BP_CHECK_CONTAINS(r.err, std::string(flag) + " needs --checkpoint-dir");
  }
  // An empty folder name (a script's unset variable) is a usage error, not "no checkpoints".
  r = cli(tmp, train_args(tmp, "1", "1", {"--checkpoint-dir", ""}));
  CHECK(r.code == kExitUsage);
  BP_CHECK_CONTAINS(r.err, "--checkpoint-dir");
  BP_CHECK_CONTAINS(r.err, "is empty");
  tmp.write("a_file", "x");
  r = cli(tmp, train_args(tmp, "1", "1", {"--checkpoint-dir", (tmp / "a_file").string()}));
  CHECK(r.code == kExitFailed);
  BP_CHECK_CONTAINS(r.err, "--checkpoint-dir");
}

namespace {

// The pids of `parent`'s children (the ranks of a launcher).
std::set<pid_t> children_of(pid_t parent) {
  std::set<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces and parentheses.
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent &&
        state != 'Z')
      out.insert(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

int64_t newest_checkpoint_step(const fs::path& dir) {
  int64_t newest = -1;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.size() == 27)
      newest = std::max<int64_t>(newest, std::stoll(name.substr(5, 10)));
  }
  return newest;
}

}  // namespace

TEST_CASE(
    "train --max-restarts: two ranks killed by SIGKILL, the job ends with the uninterrupted run's weights") {
  TempDir tmp;
  const Outcome full = uninterrupted(tmp, "2", "30");
  const fs::path dir = tmp / "checkpoints";
  std::vector<std::string> more{"--checkpoint-dir", dir.string(), "--checkpoint-every", "4",
                                "--max-restarts",   "3",          "--restart-delay",    "0.1"};
  for (const std::string& a : outputs(tmp, "restarted")) more.push_back(a);
  const pid_t launcher = bpcli::spawn(train_args(tmp, "2", "30", more), tmp.path());

  std::mt19937 random(std::random_device{}());
  std::set<pid_t> killed;
  // The first kill once a checkpoint past step 40 exists, the second past
  // step 200 (after the restart resumed from ~40); 690 steps in all.
  for (const int64_t after : {40, 200}) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    std::set<pid_t> ranks;
    for (;;) {
      REQUIRE_MESSAGE(Clock::now() < deadline, "no checkpoint past step " << after << " within 60 s");
      ranks = children_of(launcher);
      bool fresh = ranks.size() == 2;
      for (pid_t p : ranks) fresh = fresh && killed.count(p) == 0;
      if (fresh && newest_checkpoint_step(dir) > after) break;
      REQUIRE_MESSAGE(::kill(launcher, 0) == 0, "the job ended before the kill past step " << after);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    auto it = ranks.begin();
    std::advance(it, std::uniform_int_distribution<int>(0, 1)(random));
    REQUIRE(::kill(*it, SIGKILL) == 0);
    killed.insert(*it);
  }
  const Result r = bpcli::wait_for(launcher, tmp.path());
  INFO(r.describe());
  REQUIRE(r.exited);
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.err, "restart 1/3: rank ");
  BP_CHECK_CONTAINS(r.err, "restart 2/3: rank ");
  BP_CHECK_CONTAINS(r.err, "was killed by signal 9 (SIGKILL) at step ");
  BP_CHECK_CONTAINS(r.err, "; resuming from step ");
  CHECK(r.err.find("restart 3/3") == std::string::npos);
  expect_identical(outcome(tmp, "restarted"), full);
}

TEST_CASE("train --max-restarts --trace: each start's parts are kept and merged, the restart marked") {
  TempDir tmp;
  const fs::path trace = tmp / "job.json";
  // Long enough (about a second) for the writer's 100 ms ticks to write
  // events while the job runs: shorter jobs write theirs when they end.
  const pid_t launcher =
      bpcli::spawn(train_args(tmp, "2", "200",
                              {"--max-restarts", "1", "--restart-delay", "0.1", "--trace", trace.string()}),
                   tmp.path());
  // Kill a rank of the first start once its part holds events.
  const fs::path part = trace.string() + ".rank1.part";
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  std::set<pid_t> ranks;
  while (!(fs::exists(part) && fs::file_size(part) > 20000 && (ranks = children_of(launcher)).size() == 2)) {
    REQUIRE_MESSAGE(Clock::now() < deadline, "the first start recorded nothing within 60 s");
    REQUIRE_MESSAGE(::kill(launcher, 0) == 0, "the job ended before a rank could be killed");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(::kill(*ranks.rbegin(), SIGKILL) == 0);
  const Result r = bpcli::wait_for(launcher, tmp.path());
  INFO(r.describe());
  REQUIRE(r.exited);
  CHECK(r.code == kExitOk);
  BP_CHECK_CONTAINS(r.err, "restart 1/1: rank ");
  for (const auto& e : fs::directory_iterator(tmp.path())) CHECK(e.path().extension() != ".part");
  const nlohmann::json t = nlohmann::json::parse(bpcli::slurp(trace));
  std::map<std::pair<int, int>, bool> complete;  // (rank, start) -> ended with its end record
  for (const auto& rank : t["otherData"]["backplane_trace"]["ranks"])
    complete[{rank["rank"].get<int>(), rank["start"].get<int>()}] = rank["complete"].get<bool>();
  REQUIRE(complete.size() == 4);
  CHECK_FALSE(complete[{1, 0}]);  // killed
  CHECK(complete[{0, 1}]);
  CHECK(complete[{1, 1}]);
  int restarts = 0;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "i" && e["name"] == "restart") restarts += e["args"]["start"] == 1;
  CHECK(restarts == 2);  // one per rank of the second start
}
