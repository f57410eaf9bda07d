// What the recorder (trace.cpp), the clock alignment and the merge
// (merge.cpp) agree on: event categories, the part file's name and layout,
// and its metadata records.
//
// A part is binary, written as the rank records and read only by the merge
// (formatting JSON while a job runs cost more than recording did: the merge
// formats at the end). It is the magic line kPartMagic, then records, each a
// little-endian u32 payload size, a u8 Record type and the payload:
//  - string: a u32 id and the text (JSON-escaped) the part's events name by it;
//  - event: an event in varints (EventFields and encode_event below): about 30 bytes for an
//    op where the fixed layout of part 2 took 140;
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
#include <cstddef>
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
inline constexpr std::string_view kPartMagic = "backplane trace part 3\n";
inline constexpr std::string_view kPartTrailer = "\nbackplane trace part end\n";
enum class Record : uint8_t { string = 'S', event = 'E', meta = 'M', end = 'Z' };
inline constexpr std::size_t kRecordHeader = 5;  // u32 size, u8 type
// Ids of a part's strings: below kPointerIds the session's interned ids
// (intern(), the same for every part of a process), from it the writer's
// own for static text (op names, categories, argument keys). 0: none.
inline constexpr uint32_t kPointerIds = 1u << 16;
// An event record's payload. Integers are LEB128 varints, signed ones
// zigzag-encoded first, in this order:
//   u8 flags (kHas* below), u8 kind | nshapes << 2,
//   t0 as the difference from the part's previous event's t0 (signed; the
//   first event's from 0), t1 - t0 (signed, spans only), tid, cat, name,
//   device (string ids, 0 for none),
//   then only what the flags say: bytes (signed), count (signed) and
//   count_key, flow, peer, text_key and text, dtype;
//   then nshapes u8 dims counts and the dims (signed).
// A reader must read every event of a part in order (the times are chained).
struct EventFields {
  int64_t t0 = 0;
  int64_t t1 = 0;
  int64_t bytes = -1;  // -1: none
  int64_t count = -1;
  uint64_t flow = 0;
  int64_t tid = 0;
  uint32_t cat = 0;  // string ids
  uint32_t name = 0;
  uint32_t device = 0;
  uint32_t peer = 0;
  uint32_t text_key = 0;
  uint32_t text = 0;
  uint32_t count_key = 0;  // 0: no count
  int16_t dtype = -1;
  uint8_t kind = 0;  // recorder.hpp's Kind
  uint8_t nshapes = 0;
  bool shapes_cut = false;
};
enum : uint8_t {
  kHasBytes = 1,
  kHasCount = 2,
  kHasFlow = 4,
  kHasPeer = 8,
  kHasText = 16,
  kHasDtype = 32,
  kShapesCut = 64,
};
// The largest payload: two bytes, 14 varints of at most 10 bytes, four dims
// counts and 16 dims.
inline constexpr std::size_t kMaxEventPayload = 2 + 14 * 10 + 4 + 16 * 10;

inline uint64_t zigzag(int64_t v) noexcept {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t unzigzag(uint64_t v) noexcept {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}
// a - b and a + b modulo 2^64: a part read wrong must not make the reader's
// arithmetic undefined.
inline int64_t wrap_sub(int64_t a, int64_t b) noexcept {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
inline int64_t wrap_add(int64_t a, int64_t b) noexcept {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
// Writes v at p and returns the byte after it.
inline unsigned char* put_varint(unsigned char* p, uint64_t v) noexcept {
  while (v >= 0x80) {
    *p++ = static_cast<unsigned char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<unsigned char>(v);
  return p;
}
// Reads varints from [p, end); once one runs past the end or past 10 bytes,
// ok() is false and every later read gives 0.
class VarintReader {
 public:
  VarintReader(const unsigned char* p, const unsigned char* end) noexcept : p_(p), end_(end) {}
  uint64_t next() noexcept {
    uint64_t v = 0;
    for (int shift = 0; ok_ && shift < 70; shift += 7) {
      if (p_ == end_) break;
      const unsigned char b = *p_++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    ok_ = false;
    return 0;
  }
  int64_t next_signed() noexcept { return unzigzag(next()); }
  uint8_t byte() noexcept {
    if (!ok_ || p_ == end_) {
      ok_ = false;
      return 0;
    }
    return *p_++;
  }
  bool ok() const noexcept { return ok_; }
  bool at_end() const noexcept { return p_ == end_; }

 private:
  const unsigned char* p_;
  const unsigned char* end_;
  bool ok_ = true;
};

inline constexpr int kMaxEventShapes = 4;
inline constexpr int kMaxEventDims = 16;

// Writes e's payload into out (kMaxEventPayload bytes), its t0 after
// prev_t0; ndim holds e.nshapes counts (their sum at most kMaxEventDims) and
// dims their dims. Returns the payload's size.
inline std::size_t encode_event(unsigned char* out, const EventFields& e, const uint8_t* ndim,
                                const int64_t* dims, int64_t prev_t0) noexcept {
  unsigned char* p = out;
  uint8_t flags = 0;
  if (e.bytes >= 0) flags |= kHasBytes;
  if (e.count_key != 0) flags |= kHasCount;
  if (e.flow != 0) flags |= kHasFlow;
  if (e.peer != 0) flags |= kHasPeer;
  if (e.text_key != 0) flags |= kHasText;
  if (e.dtype >= 0) flags |= kHasDtype;
  if (e.shapes_cut) flags |= kShapesCut;
  *p++ = flags;
  *p++ = static_cast<unsigned char>((e.kind & 3) | (e.nshapes << 2));
  p = put_varint(p, zigzag(wrap_sub(e.t0, prev_t0)));
  if ((e.kind & 3) == 0) p = put_varint(p, zigzag(wrap_sub(e.t1, e.t0)));
  p = put_varint(p, static_cast<uint64_t>(e.tid));
  p = put_varint(p, e.cat);
  p = put_varint(p, e.name);
  p = put_varint(p, e.device);
  if (flags & kHasBytes) p = put_varint(p, zigzag(e.bytes));
  if (flags & kHasCount) {
    p = put_varint(p, zigzag(e.count));
    p = put_varint(p, e.count_key);
  }
  if (flags & kHasFlow) p = put_varint(p, e.flow);
  if (flags & kHasPeer) p = put_varint(p, e.peer);
  if (flags & kHasText) {
    p = put_varint(p, e.text_key);
    p = put_varint(p, e.text);
  }
  if (flags & kHasDtype) p = put_varint(p, static_cast<uint64_t>(e.dtype));
  int total = 0;
  for (int i = 0; i < e.nshapes; ++i) {
    *p++ = ndim[i];
    total += ndim[i];
  }
  for (int i = 0; i < total; ++i) p = put_varint(p, zigzag(dims[i]));
  return static_cast<std::size_t>(p - out);
}

// Reads a payload encode_event wrote after prev_t0: false when it is
// malformed (a field cut short, a count out of range, bytes left over).
// ndim gets kMaxEventShapes entries at most, dims kMaxEventDims.
inline bool decode_event(std::string_view payload, int64_t prev_t0, EventFields& e, uint8_t* ndim,
                         int64_t* dims) noexcept {
  const auto* begin = reinterpret_cast<const unsigned char*>(payload.data());
  VarintReader r(begin, begin + payload.size());
  const uint8_t flags = r.byte();
  const uint8_t kind_shapes = r.byte();
  e.kind = kind_shapes & 3;
  e.nshapes = static_cast<uint8_t>(kind_shapes >> 2);
  if (!r.ok() || e.nshapes > kMaxEventShapes) return false;
  e.t0 = wrap_add(prev_t0, r.next_signed());
  e.t1 = e.kind == 0 ? wrap_add(e.t0, r.next_signed()) : e.t0;
  e.tid = static_cast<int64_t>(r.next());
  const auto id = [&r] { return static_cast<uint32_t>(r.next()); };
  e.cat = id();
  e.name = id();
  e.device = id();
  e.bytes = (flags & kHasBytes) ? r.next_signed() : -1;
  if (flags & kHasCount) {
    e.count = r.next_signed();
    e.count_key = id();
  } else {
    e.count = -1;
    e.count_key = 0;
  }
  e.flow = (flags & kHasFlow) ? r.next() : 0;
  e.peer = (flags & kHasPeer) ? id() : 0;
  if (flags & kHasText) {
    e.text_key = id();
    e.text = id();
  } else {
    e.text_key = e.text = 0;
  }
  e.dtype = (flags & kHasDtype) ? static_cast<int16_t>(r.next()) : int16_t{-1};
  e.shapes_cut = (flags & kShapesCut) != 0;
  int total = 0;
  for (int i = 0; i < e.nshapes; ++i) {
    ndim[i] = r.byte();
    total += ndim[i];
  }
  if (!r.ok() || total > kMaxEventDims) return false;
  for (int i = 0; i < total; ++i) dims[i] = r.next_signed();
  return r.ok() && r.at_end();
}

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
