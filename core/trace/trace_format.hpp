// What the recorder (trace.cpp), the clock alignment (clock.cpp) and the
// merge (merge.cpp) agree on: event categories, the part file's name and
// its metadata records.
//
// A part is a Trace Event Format JSON array, one event per line, each line
// but the last ending in ",": "[", a backplane_part record (rank, world,
// pid), events and metadata, then backplane_end (events kept, dropped) and
// "]". A rank that dies leaves a part without the end (which viewers also
// open: the format allows a missing "]").
#ifndef BACKPLANE_CORE_TRACE_TRACE_FORMAT_HPP_
#define BACKPLANE_CORE_TRACE_TRACE_FORMAT_HPP_

#include <backplane/abi.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace backplane {
class Store;
}

namespace backplane::trace::detail {

// Categories ("cat"): what `backplane trace summary` groups by.
inline constexpr const char* kCatOp = "op";              // an op run natively
inline constexpr const char* kCatFallback = "fallback";  // an op run on its backend's op_fallback device
inline constexpr const char* kCatCopy = "copy";          // bytes moved for placement
inline constexpr const char* kCatCollective = "collective";
inline constexpr const char* kCatDdp = "ddp";              // a gradient bucket's all-reduce
inline constexpr const char* kCatAutograd = "autograd";    // backward()
inline constexpr const char* kCatJob = "job";              // rendezvous, checkpoints, restarts, store waits
inline constexpr const char* kCatRemote = "remote";        // a request to a server and its execution there
inline constexpr const char* kCatRange = "range";          // trace::Range, bp.trace regions
inline constexpr const char* kCatTransport = "transport";  // a plugin's collective on its transport
inline constexpr const char* kCatPlugin = "plugin";        // a plugin's event of another category

// Metadata records ("ph":"M") of a part.
inline constexpr const char* kMetaPart = "backplane_part";
inline constexpr const char* kMetaClock = "backplane_clock";
inline constexpr const char* kMetaDropped = "backplane_dropped";
inline constexpr const char* kMetaEnd = "backplane_end";

// "<path>.rank<R>.part"; "<path>.rank<R>.start<K>.part" for restart K of a
// job under `backplane launch --max-restarts` (BACKPLANE_RESTART_COUNT), so
// that each start's parts stay beside the others.
inline std::string part_path(const std::string& path, int32_t rank, int32_t start = 0) {
  return path + ".rank" + std::to_string(rank) +
         (start > 0 ? ".start" + std::to_string(start) : std::string()) + ".part";
}

// True when the part at `path` exists and ends with its end record.
bool part_ended(const std::string& path);

// `text` as the inside of a JSON string.
std::string json_escape(std::string_view text);

// This rank's clock against rank 0's: rank 0's clock reads
// now_ns() + offset_ns, give or take error_ns (half the best round trip).
struct ClockOffset {
  int64_t offset_ns = 0;
  int64_t error_ns = 0;
  int32_t rounds = 0;
};
// Every rank of the group calls it together (a collective over the store):
// rank 0 answers each other rank's pings in turn.
ClockOffset measure_clock_offset(int32_t rank, int32_t world, Store& store, std::string_view key_prefix);

// bp_host_api.trace_event: a plugin's event, checked and copied.
void record_plugin_event(const bp_trace_event* event) noexcept;

// Starts the BACKPLANE_TRACE session once per process (when the variable is
// set); stopped at exit. Throws Errc::invalid_argument for a malformed
// BACKPLANE_TRACE_MAX_EVENTS, what Session throws otherwise.
void start_from_env();

}  // namespace backplane::trace::detail

#endif  // BACKPLANE_CORE_TRACE_TRACE_FORMAT_HPP_
