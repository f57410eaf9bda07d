// How much more memory this process can take before the kernel's OOM killer
// ends it: the lower of the room left in its memory cgroup (v2 or v1, every
// level from its own cgroup up to the root) and the host's MemAvailable. A
// large allocation checked against it fails with an error instead of a
// SIGKILL when its pages are touched (Linux overcommits: malloc succeeds).
#ifndef BACKPLANE_COMMON_MEMORY_ROOM_HPP_
#define BACKPLANE_COMMON_MEMORY_ROOM_HPP_

#include <cstdint>
#include <limits>
#include <string>

namespace backplane::common {

inline constexpr uint64_t kUnknownBytes = std::numeric_limits<uint64_t>::max();

struct MemoryRoom {
  uint64_t bytes = kUnknownBytes;         // the lower of the two below; kUnknownBytes if neither is known
  uint64_t available = kUnknownBytes;     // MemAvailable of /proc/meminfo
  uint64_t cgroup_room = kUnknownBytes;   // the tightest cgroup level: its limit minus what it holds
  uint64_t cgroup_limit = kUnknownBytes;  // that level's limit (memory.max, memory.limit_in_bytes)
  std::string cgroup;                     // that level's folder; empty when no cgroup limits memory

  // "1.5 GiB (memory cgroup /sys/fs/cgroup/memory/job: limit 2.0 GiB; MemAvailable 20.3 GiB)"
  std::string describe() const;
};

// Reads /proc/self/cgroup, the cgroup file systems under `cgroup_root` and
// /proc/meminfo under `proc_root` (the tests point both at fake trees). What
// cannot be read stays kUnknownBytes; never throws. A cgroup's room is its
// limit minus its usage, less the page cache the kernel can drop
// (inactive_file), which it reclaims before it kills.
MemoryRoom memory_room(const std::string& proc_root = "/proc",
                       const std::string& cgroup_root = "/sys/fs/cgroup");

// "512 B", "1.5 GiB".
std::string byte_size_text(uint64_t bytes);

}  // namespace backplane::common

#endif  // BACKPLANE_COMMON_MEMORY_ROOM_HPP_
