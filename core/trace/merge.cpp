// Joining the ranks' parts into the job's trace file, and the clock
// alignment the join relies on.
#include "trace/recorder.hpp"
#include "trace/trace_format.hpp"

#include <backplane/error.hpp>
#include <backplane/rendezvous.hpp>
#include <backplane/trace.hpp>
#include <backplane_common/atomic_file.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace backplane::trace::detail {

std::string json_escape(std::string_view text) {
  std::string dumped =
      nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return dumped.substr(1, dumped.size() - 2);
}

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

int64_t parse_ns(const std::vector<uint8_t>& v) {
  const std::string s(v.begin(), v.end());
  return std::stoll(s);
}

// The line without its trailing comma; whether it looks whole (ends in '}').
std::string_view body_of(std::string_view line) {
  while (!line.empty() && (line.back() == ',' || line.back() == '\r' || line.back() == ' '))
    line.remove_suffix(1);
  return line;
}

bool is_meta(std::string_view line, const char* name) {
  return line.find("\"ph\":\"M\"") != std::string_view::npos &&
         line.find(std::string("\"name\":\"") + name + "\"") != std::string_view::npos;
}

struct PartInfo {
  int32_t rank = -1;
  int32_t start = 0;  // which start of a restarted job
  int64_t pid = 0;
  int64_t offset_ns = 0;
  int64_t error_ns = -1;  // -1: not measured
  uint64_t dropped = 0;
  bool ended = false;
  uint64_t events = 0;
  uint64_t torn = 0;
  // A trace merged before (by a job or by hand: `trace merge` of a job's and
  // a server's): its ranks as it lists them, its clocks already aligned.
  bool merged = false;
  nlohmann::json merged_ranks;
  std::set<int64_t> pids;  // the process ids its events use
  int64_t pid_shift = 0;   // added to each, so that no two inputs share one
};

constexpr std::string_view kMergedHead = "{\"traceEvents\":[";
constexpr std::string_view kMergedTail = "],\"displayTimeUnit\":";

// The number after "key": in a line of ours, or `otherwise`.
int64_t number_after(std::string_view line, std::string_view key, int64_t otherwise) {
  const std::size_t at = line.find(key);
  if (at == std::string_view::npos) return otherwise;
  const char* begin = line.data() + at + key.size();
  char* end = nullptr;
  const long long v = std::strtoll(begin, &end, 10);
  return end == begin ? otherwise : static_cast<int64_t>(v);
}

[[noreturn]] void unreadable(const std::string& path, const std::string& why) {
  throw Error(Errc::io_error, "trace merge: cannot read '" + path + "': " + why);
}

PartInfo read_info_unchecked(const std::string& path);

// First pass: the part's metadata records. A record of the wrong shape is the
// file's fault, said as such.
PartInfo read_info(const std::string& path) {
  try {
    return read_info_unchecked(path);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::invalid_argument,
                "trace merge: '" + path + "' holds a backplane record of the wrong shape: " + e.what());
  }
}

PartInfo read_info_unchecked(const std::string& path) {
  std::ifstream in(path);
  if (!in) unreadable(path, std::strerror(errno));
  PartInfo info;
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (first) {
      first = false;
      info.merged = line == kMergedHead;
      if (line != "[" && !info.merged)
        throw Error(Errc::invalid_argument,
                    "trace merge: '" + path +
                        "' is neither a backplane trace part nor a trace backplane wrote (it begins with "
                        "neither \"[\" nor " +
                        std::string(kMergedHead) + "; give the FILE.rank<R>.part files a job left, or FILE)");
      continue;
    }
    const std::string_view body = body_of(line);
    if (info.merged) {
      if (body.substr(0, kMergedTail.size()) == kMergedTail) {
        const nlohmann::json j = nlohmann::json::parse("{" + line.substr(2), nullptr, false);
        if (!j.is_discarded() && j.contains("otherData"))
          info.merged_ranks = j["otherData"]
                                  .value("backplane_trace", nlohmann::json::object())
                                  .value("ranks", nlohmann::json::array());
        info.ended = true;
        continue;
      }
      info.pids.insert(number_after(body, "\"pid\":", 0));
      continue;
    }
    if (body.find("\"backplane_") == std::string_view::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("args")) continue;
    const auto& a = j["args"];
    const std::string name = j.value("name", "");
    if (name == kMetaPart) {
      info.rank = a.value("rank", -1);
      info.pid = a.value("pid", int64_t{0});
      info.start = a.value("start", 0);
    } else if (name == kMetaClock) {
      info.offset_ns = a.value("offset_ns", int64_t{0});
      info.error_ns = a.value("error_ns", int64_t{-1});
    } else if (name == kMetaDropped) {
      info.dropped = a.value("dropped", uint64_t{0});
    } else if (name == kMetaEnd) {
      info.ended = true;
      info.dropped = a.value("dropped", info.dropped);
    }
  }
  if (first) unreadable(path, "it is empty");
  if (info.merged) {
    if (!info.ended)
      throw Error(Errc::invalid_argument, "trace merge: '" + path +
                                              "' ends before its \"otherData\" line: a "
                                              "trace cut short; merge the parts it was made from instead");
    info.rank = 0;
    info.ended = true;
    return info;
  }
  if (info.rank < 0)
    throw Error(Errc::invalid_argument,
                "trace merge: '" + path + "' is not a backplane trace part (no backplane_part record)");
  return info;
}

// "pid":<n> plus `shift`, in place.
void shift_pid(std::string& line, int64_t shift) {
  const std::size_t at = line.find("\"pid\":");
  if (at == std::string::npos || shift == 0) return;
  const std::size_t begin = at + 6;
  char* end = nullptr;
  const long long pid = std::strtoll(line.c_str() + begin, &end, 10);
  if (end == line.c_str() + begin) return;
  line.replace(begin, static_cast<std::size_t>(end - (line.c_str() + begin)), std::to_string(pid + shift));
}

// "ts":<number> shifted by offset_us, in place.
bool shift_ts(std::string& line, double offset_us) {
  const std::size_t at = line.find("\"ts\":");
  if (at == std::string::npos) return true;
  const std::size_t begin = at + 5;
  char* end = nullptr;
  const double ts = std::strtod(line.c_str() + begin, &end);
  if (end == line.c_str() + begin) return false;
  char buf[40];
  const int n = std::snprintf(buf, sizeof buf, "%.3f", ts + offset_us);
  line.replace(begin, static_cast<std::size_t>(end - (line.c_str() + begin)), buf,
               static_cast<std::size_t>(n));
  return true;
}

}  // namespace

bool part_ended(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size <= 0) return false;
  const std::streamoff tail = std::min<std::streamoff>(size, 512);
  in.seekg(size - tail);
  std::string text(static_cast<std::size_t>(tail), '\0');
  in.read(text.data(), tail);
  return text.find(kMetaEnd) != std::string::npos && text.find("\n]") != std::string::npos;
}

ClockOffset measure_clock_offset(int32_t rank, int32_t world, Store& store, std::string_view key_prefix) {
  constexpr int kRounds = 8;
  ClockOffset best;
  if (world <= 1) return best;
  const std::string base = std::string(key_prefix) + "trace/clock/";
  // Short: a rank that does not trace never answers, and a group's creation
  // should not wait the store's whole timeout for it.
  const auto timeout = std::min<std::chrono::milliseconds>(store.timeout(), std::chrono::seconds(10));
  if (rank == 0) {
    for (int32_t r = 1; r < world; ++r) {
      const std::string k = base + std::to_string(r) + "/";
      store.set(k + "go", bytes_of("1"));
      for (int i = 0; i < kRounds; ++i) {
        store.get(k + "ping/" + std::to_string(i), timeout);
        store.set(k + "pong/" + std::to_string(i), bytes_of(std::to_string(now_ns())));
      }
    }
    best.rounds = kRounds;
    return best;
  }
  const std::string k = base + std::to_string(rank) + "/";
  store.get(k + "go", timeout);
  best.error_ns = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < kRounds; ++i) {
    const int64_t t0 = now_ns();
    store.set(k + "ping/" + std::to_string(i), bytes_of("1"));
    const int64_t remote = parse_ns(store.get(k + "pong/" + std::to_string(i), timeout));
    const int64_t t1 = now_ns();
    const int64_t error = (t1 - t0) / 2;
    if (error < best.error_ns) {
      best.error_ns = error;
      best.offset_ns = remote - (t0 + error);
    }
  }
  best.rounds = kRounds;
  return best;
}

}  // namespace backplane::trace::detail

namespace backplane::trace {

std::vector<std::string> parts_of(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".rank";
  std::map<std::pair<long, long>, std::string> found;  // (rank, start)
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() + 5 || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - 5, 5, ".part") != 0)
      continue;
    // "<R>" or "<R>.start<K>"
    const std::string middle = name.substr(prefix.size(), name.size() - prefix.size() - 5);
    const std::size_t dot = middle.find(".start");
    const std::string rank = middle.substr(0, dot);
    const std::string start = dot == std::string::npos ? "0" : middle.substr(dot + 6);
    auto number = [](const std::string& d) {
      return !d.empty() && d.size() <= 8 && std::all_of(d.begin(), d.end(), ::isdigit);
    };
    if (!number(rank) || !number(start)) continue;
    found.emplace(std::make_pair(std::stol(rank), std::stol(start)),
                  p.has_parent_path() ? (dir / name).string() : name);
  }
  std::vector<std::string> out;
  for (auto& [key, file] : found) out.push_back(file);
  return out;
}

MergeResult merge(const std::vector<std::string>& parts, const std::string& output) {
  if (parts.empty())
    throw Error(Errc::invalid_argument, "trace merge: no parts to merge into '" + output +
                                            "' (a job writes FILE.rank<R>.part; were they merged already?)");
  std::vector<detail::PartInfo> infos;
  for (const std::string& p : parts) infos.push_back(detail::read_info(p));
  // Parts are one job's: a rank's parts (one per start) share its track.
  // Traces merged before come from other jobs (a server's) and may use the
  // same process ids: each moves up by thousands until none collide.
  std::set<int64_t> taken;
  for (const detail::PartInfo& info : infos)
    if (!info.merged) taken.insert(info.rank);
  for (detail::PartInfo& info : infos) {
    if (!info.merged) continue;
    auto collides = [&](int64_t shift) {
      for (int64_t pid : info.pids)
        if (taken.count(pid + shift) != 0) return true;
      return false;
    };
    while (collides(info.pid_shift)) info.pid_shift += 1000;
    for (int64_t pid : info.pids) taken.insert(pid + info.pid_shift);
  }
  MergeResult result;
  try {
    common::AtomicFileWriter out(output);
    out.write("{\"traceEvents\":[\n");
    bool first_event = true;
    std::string pending;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      detail::PartInfo& info = infos[i];
      std::ifstream in(parts[i]);
      if (!in) detail::unreadable(parts[i], std::strerror(errno));
      const double offset_us = static_cast<double>(info.offset_ns) / 1000.0;
      std::string line;
      while (std::getline(in, line)) {
        const std::string_view body = detail::body_of(line);
        if (body.empty() || body == "[" || body == "]" || body == detail::kMergedHead ||
            body.substr(0, detail::kMergedTail.size()) == detail::kMergedTail)
          continue;
        if (body.find("\"backplane_") != std::string_view::npos &&
            (detail::is_meta(body, detail::kMetaPart) || detail::is_meta(body, detail::kMetaClock) ||
             detail::is_meta(body, detail::kMetaDropped) || detail::is_meta(body, detail::kMetaEnd)))
          continue;
        std::string event(body);
        // A rank killed mid-write leaves a torn last line: skip what is not whole.
        if (event.back() != '}' || !nlohmann::json::accept(event) || !detail::shift_ts(event, offset_us)) {
          ++info.torn;
          continue;
        }
        detail::shift_pid(event, info.pid_shift);
        if (!first_event) pending += ",\n";
        first_event = false;
        pending += event;
        ++info.events;
        if (pending.size() >= (1u << 20)) {  // one write per MiB, not per event
          out.write(pending);
          pending.clear();
        }
      }
      result.events += info.events;
      result.dropped += info.dropped;
      if (!info.ended) ++result.incomplete;
    }
    out.write(pending);
    nlohmann::json ranks = nlohmann::json::array();
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const detail::PartInfo& info = infos[i];
      if (info.merged) {  // its ranks as it listed them, each with its process id here
        for (nlohmann::json r : info.merged_ranks) {
          r["trace_pid"] = r.value("trace_pid", r.value("rank", 0)) + info.pid_shift;
          ranks.push_back(std::move(r));
        }
        continue;
      }
      ranks.push_back({{"rank", info.rank},
                       {"start", info.start},
                       {"trace_pid", info.rank + info.pid_shift},
                       {"pid", info.pid},
                       {"clock_offset_us", static_cast<double>(info.offset_ns) / 1000.0},
                       {"clock_error_us", info.error_ns < 0
                                              ? nlohmann::json(nullptr)
                                              : nlohmann::json(static_cast<double>(info.error_ns) / 1000.0)},
                       {"events", info.events},
                       {"dropped", info.dropped},
                       {"torn_lines", info.torn},
                       {"complete", info.ended}});
    }
    nlohmann::json other = {{"backplane_trace", {{"format", 1}, {"ranks", ranks}}}};
    out.write("\n],\"displayTimeUnit\":\"ms\",\"otherData\":");
    out.write(other.dump());
    out.write("}\n");
    out.commit();
  } catch (const common::FileWriteError& e) {
    throw Error(Errc::io_error, std::string("trace merge: ") + e.what());
  }
  result.ranks = parts.size();
  return result;
}

}  // namespace backplane::trace
