// memory_room (memory_room.hpp).
#include "backplane_common/memory_room.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

namespace backplane::common {
namespace {

// A file's first line, or "" when it cannot be read.
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A decimal number, or kUnknownBytes ("max", empty, garbage).
uint64_t number(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return kUnknownBytes;
  try {
    return std::stoull(text);
  } catch (...) {
    return kUnknownBytes;
  }
}

// The value of `key` in a "key value" file (memory.stat), or 0.
uint64_t stat_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

struct Level {
  uint64_t limit = kUnknownBytes;
  uint64_t room = kUnknownBytes;
};

// One cgroup folder: v2 names its files memory.max / memory.current, v1
// memory.limit_in_bytes / memory.usage_in_bytes (whose "unlimited" is a
// huge number near 2^63).
Level level(const std::string& dir, bool v2) {
  Level l;
  const uint64_t limit = number(first_line(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes")));
  if (limit == kUnknownBytes || limit >= (uint64_t{1} << 60)) return l;
  const uint64_t usage = number(first_line(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes")));
  if (usage == kUnknownBytes) return l;
  const uint64_t cache = stat_value(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
  const uint64_t held = usage - std::min(usage, cache);
  l.limit = limit;
  l.room = limit - std::min(limit, held);
  return l;
}

// The folders of a cgroup path from itself up to the mount's root:
// "/a/b" -> {"/a/b", "/a", ""}.
std::vector<std::string> up_to_root(std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path != "/") {
    out.push_back(path);
    path = path.substr(0, path.rfind('/'));
  }
  out.push_back("");
  return out;
}

}  // namespace

std::string byte_size_text(uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char text[32];
  if (u == 0)
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(text, sizeof text, "%.1f %s", v, units[u]);
  return text;
}

std::string MemoryRoom::describe() const {
  if (bytes == kUnknownBytes) return "unknown (neither /proc/meminfo nor a memory cgroup could be read)";
  std::string out = byte_size_text(bytes) + " (";
  if (!cgroup.empty())
    out += "memory cgroup " + cgroup + ": limit " + byte_size_text(cgroup_limit) + ", " +
           byte_size_text(cgroup_room) + " left" + (available != kUnknownBytes ? "; " : "");
  if (available != kUnknownBytes) out += "MemAvailable " + byte_size_text(available);
  return out + ")";
}

MemoryRoom memory_room(const std::string& proc_root, const std::string& cgroup_root) {
  MemoryRoom r;
  try {
    std::ifstream meminfo(proc_root + "/meminfo");
    std::string key;
    uint64_t kb = 0;
    for (std::string line; std::getline(meminfo, line);) {
      std::istringstream fields(line);
      if (fields >> key >> kb && key == "MemAvailable:") {
        r.available = kb * 1024;
        break;
      }
    }
    // Each line of /proc/self/cgroup: "ID:CONTROLLERS:PATH"; v2 is "0::PATH".
    std::ifstream cgroups(proc_root + "/self/cgroup");
    for (std::string line; std::getline(cgroups, line);) {
      const auto a = line.find(':');
      const auto b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string controllers = line.substr(a + 1, b - a - 1);
      const std::string path = line.substr(b + 1);
      std::vector<std::string> mounts;
      bool v2 = false;
      if (controllers.empty() && line.compare(0, a, "0") == 0) {
        v2 = true;
        mounts = {cgroup_root, cgroup_root + "/unified"};
      } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
        mounts = {cgroup_root + "/memory"};
      } else {
        continue;
      }
      for (const std::string& mount : mounts) {
        for (const std::string& folder : up_to_root(path)) {
          const std::string dir = mount + folder;
          const Level l = level(dir, v2);
          if (l.room < r.cgroup_room) {
            r.cgroup_room = l.room;
            r.cgroup_limit = l.limit;
            r.cgroup = dir;
          }
        }
      }
    }
  } catch (...) {  // an allocation failure while reading: what was read stands
  }
  r.bytes = std::min(r.available, r.cgroup_room);
  return r;
}

}  // namespace backplane::common
