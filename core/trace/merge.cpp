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
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <istream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
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

// Reads a part's records in order (trace_format.hpp). A record cut short
// (its rank died mid-write) ends the reading and is counted as torn.
class PartReader {
 public:
  explicit PartReader(std::istream& in) : in_(in) {}
  // The next whole record; false at the end of the file or of its whole records.
  bool next(Record& type, std::string& payload) {
    if (ended_) return false;  // what follows the end record is the trailer
    char header[kRecordHeader];
    in_.read(header, sizeof header);
    if (in_.gcount() == 0) return false;
    uint32_t size = 0;
    if (in_.gcount() == static_cast<std::streamsize>(sizeof header)) std::memcpy(&size, header, sizeof size);
    const char t = header[4];
    const bool known = t == static_cast<char>(Record::string) || t == static_cast<char>(Record::event) ||
                       t == static_cast<char>(Record::meta) || t == static_cast<char>(Record::end);
    if (in_.gcount() != static_cast<std::streamsize>(sizeof header) || !known || size > (64u << 20)) {
      torn_ = true;
      return false;
    }
    payload.resize(size);
    in_.read(payload.data(), size);
    if (in_.gcount() != static_cast<std::streamsize>(size)) {
      torn_ = true;
      return false;
    }
    type = static_cast<Record>(t);
    if (type == Record::end) ended_ = true;
    return true;
  }
  bool torn() const noexcept { return torn_; }

 private:
  std::istream& in_;
  bool torn_ = false;
  bool ended_ = false;
};

template <class Int>
void append_int(std::string& out, Int v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, static_cast<std::size_t>(r.ptr - buf));
}

// Nanoseconds as microseconds with three decimals ("1234.567").
void append_ts(std::string& out, int64_t signed_ns) {
  uint64_t ns = static_cast<uint64_t>(signed_ns);
  if (signed_ns < 0) {
    out += '-';
    ns = 0 - ns;  // the magnitude, INT64_MIN's too
  }
  append_int(out, ns / 1000);
  const auto frac = static_cast<int>(ns % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                          static_cast<char>('0' + frac % 10)};
  out.append(digits, 4);
}

// A part's strings by id (JSON-escaped as the writer stored them).
using StringTable = std::unordered_map<uint32_t, std::string>;

std::string_view text_of(const StringTable& t, uint32_t id) {
  if (id == 0) return {};
  auto it = t.find(id);
  return it != t.end() ? std::string_view(it->second) : std::string_view("?");
}

// An event record as a Trace Event Format event, its t0 read after prev_t0
// (and set to it); false when it is malformed.
bool append_event(std::string& out, const std::string& record, const StringTable& t, int64_t pid,
                  int64_t offset_ns, int64_t& prev_t0) {
  EventFields h;
  uint8_t ndim[kMaxEventShapes] = {};
  int64_t dim_values[kMaxEventDims] = {};
  if (!decode_event(record, prev_t0, h, ndim, dim_values)) return false;
  prev_t0 = h.t0;
  const auto kind = static_cast<Kind>(h.kind);
  const std::string_view cat = text_of(t, h.cat);
  out += "{\"ph\":\"";
  out += kind == Kind::span ? 'X' : kind == Kind::instant ? 'i' : kind == Kind::flow_out ? 's' : 'f';
  out += "\",\"cat\":\"";
  out += cat;
  out += "\",\"name\":\"";
  out += text_of(t, h.name);
  out += "\",\"pid\":";
  append_int(out, pid);
  out += ",\"tid\":";
  append_int(out, h.tid);
  out += ",\"ts\":";
  append_ts(out, wrap_add(h.t0, offset_ns));
  if (kind == Kind::span) {
    out += ",\"dur\":";
    append_ts(out, wrap_sub(h.t1, h.t0));
  } else if (kind == Kind::instant) {
    out += ",\"s\":\"t\"";
  } else {
    out += ",\"id\":";
    append_int(out, static_cast<int64_t>(h.flow));
    if (kind == Kind::flow_in) out += ",\"bp\":\"e\"";
  }
  // "args" only when there are some: viewers show an empty object beside the name.
  bool first = true;
  auto key = [&](std::string_view k) {
    out += first ? ",\"args\":{\"" : ",\"";
    first = false;
    out += k;
    out += "\":";
  };
  auto quoted = [&](std::string_view v) {
    out += '"';
    out += v;
    out += '"';
  };
  if (h.device != 0) {
    key("device");
    quoted(text_of(t, h.device));
  }
  if (h.peer != 0) {
    key(cat == kCatCopy ? "to" : "for");
    quoted(text_of(t, h.peer));
  }
  if (h.dtype >= 0) {
    key("dtype");
    const char* d = bp_dtype_name(h.dtype);
    quoted(d != nullptr ? d : "?");
  }
  if (h.nshapes > 0) {
    key("shapes");
    out += '[';
    std::size_t at = 0;
    for (int i = 0; i < h.nshapes; ++i) {
      if (i > 0) out += ',';
      out += '[';
      for (int j = 0; j < ndim[i]; ++j) {
        if (j > 0) out += ',';
        append_int(out, dim_values[at++]);
      }
      out += ']';
    }
    out += ']';
    if (h.shapes_cut) {
      key("shapes_cut");
      out += "true";
    }
  }
  if (h.bytes >= 0) {
    key("bytes");
    append_int(out, h.bytes);
  }
  if (h.count_key != 0) {
    key(text_of(t, h.count_key));
    append_int(out, h.count);
  }
  if (h.text_key != 0) {
    key(text_of(t, h.text_key));
    quoted(text_of(t, h.text));
  }
  out += first ? "}" : "}}";
  return true;
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

// A backplane_* metadata record's contents into info.
void read_meta(const std::string& text, PartInfo& info) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("args")) return;
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

// True when `in` begins with a part's magic line (and is then past it).
bool is_part(std::istream& in) {
  std::string head(kPartMagic.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (in.gcount() == static_cast<std::streamsize>(head.size()) && head == kPartMagic) return true;
  in.clear();
  in.seekg(0);
  return false;
}

PartInfo read_info_unchecked(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) unreadable(path, std::strerror(errno));
  PartInfo info;
  if (is_part(in)) {
    PartReader reader(in);
    Record type{};
    std::string payload;
    while (reader.next(type, payload))
      if (type == Record::meta || type == Record::end) read_meta(payload, info);
    if (info.rank < 0)
      throw Error(Errc::invalid_argument,
                  "trace merge: '" + path + "' is not a backplane trace part (no backplane_part record)");
    return info;
  }
  std::string line;
  if (!std::getline(in, line)) unreadable(path, "it is empty");
  info.merged = line == kMergedHead;
  if (line.rfind("backplane trace part ", 0) == 0)
    throw Error(Errc::invalid_argument, "trace merge: '" + path + "' is a trace part of another version (\"" +
                                            line + "\", this build reads \"" +
                                            std::string(kPartMagic.substr(0, kPartMagic.size() - 1)) +
                                            "\"); merge it with the backplane that wrote it");
  if (line == "[") {
    std::string second;
    if (std::getline(in, second) && second.find("\"backplane_part\"") != std::string::npos)
      throw Error(Errc::invalid_argument,
                  "trace merge: '" + path +
                      "' is a trace part an older backplane wrote (JSON lines, format 1); merge it with "
                      "that version's `backplane trace merge`, which also opens it in a viewer as it is");
  }
  if (!info.merged)
    throw Error(Errc::invalid_argument,
                "trace merge: '" + path +
                    "' is neither a backplane trace part nor a trace backplane wrote (it begins with "
                    "neither \"" +
                    std::string(kPartMagic.substr(0, kPartMagic.size() - 1)) + "\" nor " +
                    std::string(kMergedHead) + "; give the FILE.rank<R>.part files a job left, or FILE)");
  while (std::getline(in, line)) {
    const std::string_view body = body_of(line);
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
  }
  if (!info.ended)
    throw Error(Errc::invalid_argument, "trace merge: '" + path +
                                            "' ends before its \"otherData\" line: a "
                                            "trace cut short; merge the parts it was made from instead");
  info.rank = 0;
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
  const auto tail = static_cast<std::streamoff>(kPartTrailer.size());
  if (size < tail) return false;
  in.seekg(size - tail);
  std::string text(kPartTrailer.size(), '\0');
  in.read(text.data(), tail);
  return text == kPartTrailer;
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
      std::ifstream in(parts[i], std::ios::binary);
      if (!in) detail::unreadable(parts[i], std::strerror(errno));
      auto emit = [&](const std::string& event) {
        if (!first_event) pending += ",\n";
        first_event = false;
        pending += event;
        if (pending.size() >= (1u << 20)) {  // one write per MiB, not per event
          out.write(pending);
          pending.clear();
        }
      };
      std::string line;
      if (detail::is_part(in)) {
        // A part: its strings as they come, each event formatted on its
        // rank's track with its clock aligned to rank 0's.
        detail::PartReader reader(in);
        detail::StringTable strings;
        detail::Record type{};
        std::string payload;
        int64_t prev_t0 = 0;      // events' times are chained (trace_format.hpp)
        bool chain_lost = false;  // after a malformed event the later events' times are unknown
        while (reader.next(type, payload)) {
          if (type == detail::Record::string) {
            uint32_t id = 0;
            if (payload.size() < sizeof id) {
              ++info.torn;
              continue;
            }
            std::memcpy(&id, payload.data(), sizeof id);
            strings[id] = payload.substr(sizeof id);
          } else if (type == detail::Record::event) {
            if (chain_lost) {  // counted: what the part held and the trace does not show
              ++info.torn;
              continue;
            }
            line.clear();
            if (!detail::append_event(line, payload, strings, info.rank + info.pid_shift, info.offset_ns,
                                      prev_t0)) {
              ++info.torn;
              chain_lost = true;
              continue;
            }
            emit(line);
            ++info.events;
          } else if (type == detail::Record::meta && payload.find("\"backplane_") == std::string::npos) {
            if (!nlohmann::json::accept(
                    payload)) {  // thread and process names, checked: the part may be corrupt
              ++info.torn;
              continue;
            }
            emit(payload);
          }
        }
        if (reader.torn()) ++info.torn;
      } else {
        const double offset_us = static_cast<double>(info.offset_ns) / 1000.0;
        while (std::getline(in, line)) {
          const std::string_view body = detail::body_of(line);
          if (body.empty() || body == "[" || body == "]" || body == detail::kMergedHead ||
              body.substr(0, detail::kMergedTail.size()) == detail::kMergedTail)
            continue;
          std::string event(body);
          if (event.back() != '}' || !nlohmann::json::accept(event) || !detail::shift_ts(event, offset_us)) {
            ++info.torn;
            continue;
          }
          detail::shift_pid(event, info.pid_shift);
          emit(event);
          ++info.events;
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
