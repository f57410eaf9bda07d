// memory_room against fake /proc and cgroup trees: v1 and v2, a tighter
// parent, reclaimable cache, unlimited levels and nothing readable.
#include <backplane_common/memory_room.hpp>

#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using backplane::common::kUnknownBytes;
using backplane::common::memory_room;

namespace {

// A fake /proc and cgroup tree.
class FakeRoot : public bptest::TempDir {
 public:
  FakeRoot() : TempDir("backplane-memroom") {}
  std::string proc() const { return (path() / "proc").string(); }
  std::string cgroup() const { return (path() / "cgroup").string(); }
};

}  // namespace

TEST_CASE("memory_room: a v1 memory cgroup's limit less its usage, below MemAvailable") {
  FakeRoot root;
  root.write("proc/meminfo", "MemTotal:       8000000 kB\nMemFree:  100 kB\nMemAvailable:    4000 kB\n");
  root.write("proc/self/cgroup", "9:pids:/\n4:memory:/job/a\n0::/\n");
  root.write("cgroup/memory/job/a/memory.limit_in_bytes", "1048576\n");
  root.write("cgroup/memory/job/a/memory.usage_in_bytes", "524288\n");
  root.write("cgroup/memory/job/a/memory.stat", "cache 0\ntotal_inactive_file 131072\n");
  root.write("cgroup/memory/job/memory.limit_in_bytes", "9223372036854771712\n");  // unlimited
  root.write("cgroup/memory/job/memory.usage_in_bytes", "524288\n");
  const auto r = memory_room(root.proc(), root.cgroup());
  CHECK(r.available == 4000 * 1024);
  CHECK(r.cgroup_limit == 1048576);
  CHECK(r.cgroup_room == 1048576 - (524288 - 131072));  // the inactive page cache is reclaimable
  CHECK(r.bytes == r.cgroup_room);
  CHECK(r.cgroup == root.cgroup() + "/memory/job/a");
  CHECK(r.describe().find("memory cgroup " + root.cgroup() + "/memory/job/a: limit 1.0 MiB") !=
        std::string::npos);
}

TEST_CASE("memory_room: v2, where a parent's limit is the tighter one and \"max\" is no limit") {
  FakeRoot root;
  root.write("proc/meminfo", "MemAvailable:    9000000 kB\n");
  root.write("proc/self/cgroup", "0::/svc/job\n");
  root.write("cgroup/memory.max", "max\n");
  root.write("cgroup/svc/memory.max", "2097152\n");
  root.write("cgroup/svc/memory.current", "1048576\n");
  root.write("cgroup/svc/memory.stat", "anon 1\ninactive_file 524288\n");
  root.write("cgroup/svc/job/memory.max", "max\n");
  root.write("cgroup/svc/job/memory.current", "1048576\n");
  const auto r = memory_room(root.proc(), root.cgroup());
  CHECK(r.cgroup == root.cgroup() + "/svc");
  CHECK(r.cgroup_room == 2097152 - (1048576 - 524288));
  CHECK(r.bytes == r.cgroup_room);
}

TEST_CASE("memory_room: without a limiting cgroup MemAvailable decides, with nothing readable, unknown") {
  FakeRoot root;
  root.write("proc/meminfo", "MemAvailable:    2048 kB\n");
  root.write("proc/self/cgroup", "4:memory:/\n");
  root.write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  const auto r = memory_room(root.proc(), root.cgroup());
  CHECK(r.bytes == 2048 * 1024);
  CHECK(r.cgroup.empty());
  CHECK(r.describe() == "2.0 MiB (MemAvailable 2.0 MiB)");

  FakeRoot empty;
  const auto none = memory_room(empty.proc(), empty.cgroup());
  CHECK(none.bytes == kUnknownBytes);
  CHECK(none.describe().find("unknown") != std::string::npos);
}

TEST_CASE("memory_room: this process's own answer is sane") {
  const auto r = memory_room();
  CHECK(r.bytes > 0);
  if (r.available != kUnknownBytes) CHECK(r.bytes <= r.available);
}
