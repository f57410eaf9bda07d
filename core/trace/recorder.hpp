// The core's side of tracing (include/backplane/trace.hpp): the one flag the
// hot paths test, the fixed-size event every subsystem records, and the
// helpers that fill one. Recording appends to the calling thread's buffer;
// a background thread of the session turns events into JSON.
#ifndef BACKPLANE_CORE_TRACE_RECORDER_HPP_
#define BACKPLANE_CORE_TRACE_RECORDER_HPP_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <string_view>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

struct bp_tensor;

namespace backplane {
class Store;
}

namespace backplane::trace::detail {

// Set while a session records. Read relaxed: the branch the hot paths take.
extern std::atomic<bool> g_active;
inline bool active() noexcept { return g_active.load(std::memory_order_relaxed); }

// CLOCK_MONOTONIC in nanoseconds: the clock of every event of a rank.
inline int64_t now_ns() noexcept {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Spans' clock: the CPU's time-stamp counter where the kernel itself keeps
// CLOCK_MONOTONIC on it (x86-64, clocksource "tsc": constant, synchronised
// across cores), read in a third of clock_gettime's time here; the writer
// turns its ticks into now_ns()'s nanoseconds. now_ns() everywhere else.
// Decided once per process, before the first session records.
extern std::atomic<bool> g_span_ticks;
inline int64_t span_clock() noexcept {
#if defined(__x86_64__)
  if (g_span_ticks.load(std::memory_order_relaxed)) return static_cast<int64_t>(__rdtsc());
#endif
  return now_ns();
}

enum class Kind : uint8_t {
  span,      // "X": t0..t1
  instant,   // "i": at t0
  flow_out,  // "s": a flow (remote request) leaves here
  flow_in,   // "f": and arrives here
};

// One event. Names and categories are static text (abi.h's op names,
// literals); other text is interned (intern()) and stored as its id, so
// recording allocates nothing.
struct Event {
  static constexpr int kMaxShapes = 4;
  static constexpr int kMaxDims = 16;  // over all shapes; longer shapes are cut (and marked)

  int64_t t0 = 0;  // now_ns()
  int64_t t1 = 0;
  const char* name = nullptr;  // static; or name_id
  const char* cat = "";        // static
  uint32_t name_id = 0;        // interned name when `name` is null
  uint32_t device = 0;         // interned "cpu:0"; 0: none
  uint32_t peer = 0;           // interned second device (a fallback's or copy's other end); 0: none
  uint32_t text = 0;           // interned value of text_key; 0: none
  const char* text_key = nullptr;
  int64_t bytes = -1;  // -1: none
  int64_t count = -1;  // a second number (e.g. a bucket's index); -1: none
  const char* count_key = nullptr;
  uint64_t flow = 0;  // flow events: the id both ends share
  int16_t dtype = -1;
  Kind kind = Kind::span;
  uint8_t nshapes = 0;
  bool shapes_cut = false;
  bool ticks = false;  // t0 and t1 are span_clock() ticks, not nanoseconds
  uint8_t ndim[kMaxShapes] = {};
  // dims[0 .. used_dims()) are the shapes' extents (add_shape writes them in
  // order); the rest is never read, so neither zeroed nor copied: an event
  // is made and copied once per op while tracing.
  int64_t dims[kMaxDims];

  Event() noexcept {}
  Event(const Event& other) noexcept { copy_from(other); }
  Event& operator=(const Event& other) noexcept {
    if (this != &other) copy_from(other);
    return *this;
  }
  int used_dims() const noexcept {
    int n = 0;
    for (int i = 0; i < nshapes && i < kMaxShapes; ++i) n += ndim[i];
    return n < kMaxDims ? n : kMaxDims;
  }

 private:
  void copy_from(const Event& other) noexcept;
};

inline void Event::copy_from(const Event& other) noexcept {
  std::memcpy(static_cast<void*>(this), &other, offsetof(Event, dims));
  // Fixed sizes, so the compiler copies with vector moves: a copy of the
  // exact length is a `rep movs`, whose start-up cost was a fifth of an
  // event's recording. The bytes past used_dims() are copied unread.
  if (other.used_dims() <= kMaxDims / 2) [[likely]] {
    std::memcpy(dims, other.dims, sizeof(int64_t) * (kMaxDims / 2));
  } else {
    std::memcpy(dims, other.dims, sizeof(dims));
  }
}

// Appends `e` to this thread's buffer (or counts it as dropped past the
// session's max_events). A no-op when no session records.
void record(const Event& e) noexcept;

// The id of `text` in the session's string table (same text, same id; 0 for
// empty text). Off the hot path: called once per label by the caches below.
uint32_t intern(std::string_view text) noexcept;
// The id of "<backend>:<device>", cached per thread by BackendImpl::serial.
uint32_t device_label(uint64_t backend_serial, std::string_view backend, int32_t device) noexcept;

// Adds a tensor's shape to e (up to kMaxShapes / kMaxDims).
void add_shape(Event& e, const bp_tensor& t) noexcept;

// A span on the calling thread: begins at construction when a session
// records, is recorded at destruction. Fill its event between.
class Span {
 public:
  Span(const char* cat, const char* name) noexcept : on_(active()) {
    if (on_) [[unlikely]] {
      event_.cat = cat;
      event_.name = name;
      event_.ticks = g_span_ticks.load(std::memory_order_relaxed);
      event_.t0 = span_clock();
    }
  }
  ~Span() {
    if (on_) [[unlikely]] {
      event_.t1 = span_clock();
      record(event_);
    }
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  bool on() const noexcept { return on_; }
  Event& event() noexcept { return event_; }

 private:
  bool on_;
  Event event_;
};

// This process's rank and the job's size, as the part's file name and the
// events say them. Set from the environment at the start, and by the first
// process group (with its store: the clocks are aligned then, every rank
// taking part). A no-op when no session records.
void joined_job(int32_t rank, int32_t world, Store& store, std::string_view key_prefix);

}  // namespace backplane::trace::detail

#endif  // BACKPLANE_CORE_TRACE_RECORDER_HPP_
