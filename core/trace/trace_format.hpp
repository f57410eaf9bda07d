// What the recorder (trace.cpp), the clock alignment and the merge
// (merge.cpp) agree on: event categories, the part file's name and layout,
// and its metadata records.
//
// A part is binary, written as the rank records and read only by the merge
// (formatting JSON while a job runs cost more than recording did: the merge
// formats at the end). It is the magic line kPartMagic, then records, each a
// little-endian u32 payload size, a u8 Record type and the payload:
//  - string: a u32 id and the text (JSON-escaped) the part's events name by it;
//  - event: an EventHead, then nshapes u8 dims counts, then the dims (i64);
//  - meta: a Trace Event Format metadata event as JSON text: backplane_part
//    (rank, world, pid), backplane_clock, backplane_dropped, thread and
//    process names;
//  - end: the backplane_end metadata event (events kept, dropped), followed by
//    kPartTrailer, the file's last bytes.
// A rank that dies leaves a part without the end, its last record possibly
// cut short: the merge keeps every whole record and marks the rank incomplete.
#ifndef BACKPLANE_CORE_TRACE_TRACE_FORMAT_HPP_
#define BACKPLANE_CORE_TRACE_TRACE_FORMAT_HPP_

#include <backplane/abi.h>

#include <bit>
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

// The part file's layout (see the top of this file).
inline constexpr std::string_view kPartMagic = "backplane trace part 2\n";
inline constexpr std::string_view kPartTrailer = "\nbackplane trace part end\n";
enum class Record : uint8_t { string = 'S', event = 'E', meta = 'M', end = 'Z' };
inline constexpr std::size_t kRecordHeader = 5;  // u32 size, u8 type
// Ids of a part's strings: below kPointerIds the session's interned ids
// (intern(), the same for every part of a process), from it the writer's
// own for static text (op names, categories, argument keys). 0: none.
inline constexpr uint32_t kPointerIds = 1u << 16;
// An event record's fixed head.
struct EventHead {
  int64_t t0 = 0;
  int64_t t1 = 0;
  int64_t bytes = -1;
  int64_t count = -1;
  uint64_t flow = 0;
  int64_t tid = 0;
  uint32_t cat = 0;  // string ids
  uint32_t name = 0;
  uint32_t device = 0;
  uint32_t peer = 0;
  uint32_t text_key = 0;
  uint32_t text = 0;
  uint32_t count_key = 0;
  int16_t dtype = -1;
  uint8_t kind = 0;  // recorder.hpp's Kind
  uint8_t nshapes = 0;
  uint8_t shapes_cut = 0;
  uint8_t reserved[7] = {};
};
static_assert(sizeof(EventHead) == 88, "EventHead has no hidden padding");
static_assert(std::endian::native == std::endian::little, "trace parts are little-endian");

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
