// Tracing's recorder: per-thread event buffers, the session's writer thread
// that turns them into a rank's part file, clock alignment through the
// store, and the BACKPLANE_TRACE session. merge.cpp joins the parts.
//
// Recording (record()) is lock-free for the recording thread: it appends to
// the current chunk of its own buffer and publishes the count; the writer
// thread reads up to the published count. A thread marks itself "writing"
// around the append (a store and a load, both sequentially consistent), so
// stop() can clear g_active and then wait until no thread is inside an
// append before it drains and frees the buffers.
#include "trace/recorder.hpp"
#include "trace/trace_format.hpp"

#include <backplane/abi.h>
#include <backplane/error.hpp>
#include <backplane/log.hpp>
#include <backplane/rendezvous.hpp>
#include <backplane/trace.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace backplane::trace::detail {

std::atomic<bool> g_active{false};
std::atomic<bool> g_span_ticks{false};

namespace {

constexpr std::size_t kChunkEvents = 512;
constexpr uint64_t kGrant = 256;
// Made at the start: 7.4 MB, 32768 events, about the first 25 ms of a job of
// tiny ops (the main job records some 1.2 million events a second a rank).
// The writer runs only on an idle core, so in a job that keeps every core
// busy it may write none back for that long; a chunk made on a recording
// thread instead costs that thread 40-100 us of page faults (16 prepared
// chunks left 25-30 such stalls in a 2-rank 20-epoch job, 8% of its step).
constexpr std::size_t kPreparedChunks = 64;
// A recording thread wakes the writer once per this many full chunks (as
// many as were prepared, 32768 events); the writer also drains every 100 ms
// by itself. On cores the job keeps busy, a woken writer runs at the next
// scheduler tick and holds the core from a rank for 0.3-0.6 ms: woken every
// 8th chunk, that was a tenth of a 2-rank step. Where a core is idle, it
// writes the chunks back as fast as they fill.
constexpr uint32_t kWakeChunks = 64;
constexpr std::size_t kMaxNames = 65536;  // interned strings; later ones share one id

struct Chunk {
  std::array<Event, kChunkEvents> events;
  std::atomic<uint32_t> count{0};
  std::atomic<Chunk*> next{nullptr};
  Chunk* next_free = nullptr;  // in a ThreadBuffer's list of written chunks
};

// One recording thread's events in one session.
struct ThreadBuffer {
  int64_t tid = 0;
  std::string name;
  Chunk* tail = nullptr;  // the recording thread's
  Chunk* head = nullptr;  // the writer's
  uint32_t written = 0;   // events of head already written
  bool named = false;     // thread_name written
  // The recording thread's: events it may still keep before it asks the
  // session for more (one atomic add per kGrant events, not per event), and
  // events kept.
  uint64_t quota = 0;
  uint64_t kept = 0;
  uint32_t filled = 0;  // the recording thread's: chunks filled, for waking the writer every kWakeChunks
  // Chunks the writer has written, for this thread to fill again (a fresh
  // chunk's pages would fault in on the recording thread: 40-100 us each).
  // The writer pushes onto `written_chunks`; the recording thread takes the
  // whole list at once into `reuse`, its own. No lock: the writer runs at
  // idle priority, and a lock it held when a core was taken from it kept the
  // recording thread waiting until it got one back.
  // At most kWakeChunks wait in the two lists (counted by both sides); the
  // writer frees the rest, so a backlog's memory goes once it is written.
  std::atomic<Chunk*> written_chunks{nullptr};
  Chunk* reuse = nullptr;
  std::atomic<int32_t> free_chunks{0};
  ~ThreadBuffer() {
    for (Chunk* c = written_chunks.load(std::memory_order_relaxed); c != nullptr;)
      delete std::exchange(c, c->next_free);
    for (Chunk* c = reuse; c != nullptr;) delete std::exchange(c, c->next_free);
    for (Chunk* c = head; c != nullptr;) delete std::exchange(c, c->next.load(std::memory_order_relaxed));
  }
};

// The string table: process-wide, never cleared (ids stay valid for every
// session and every per-thread cache); held in its JSON-escaped form. Adding
// takes the mutex; reading an id's text does not (the writer formats without
// holding anything a recording thread may wait for): each slot is published
// once, with a release store, and never changes.
struct Names {
  std::mutex mutex;
  std::map<std::string, std::string, std::less<>> keys;  // plugins' argument names, raw -> escaped
  std::unordered_map<std::string, uint32_t> ids;
  std::unique_ptr<std::atomic<const std::string*>[]> table {
    new std::atomic<const std::string*>[ kMaxNames ]()
  };
  uint32_t count = 0;  // mutex held
  Names() {
    table[0].store(new std::string(), std::memory_order_release);
    table[1].store(new std::string("(more names than the trace keeps)"), std::memory_order_release);
    count = 2;
  }
};
constexpr uint32_t kOverflowName = 1;
Names& names() {
  static Names* n = new Names;  // never destroyed: threads may intern during exit
  return *n;
}
// Plugins' text is cut to this many bytes before it is kept.
constexpr std::size_t kMaxText = 256;

// The recording session.
struct State {
  std::string path;
  std::string part_path;
  uint64_t max_events = 0;
  int32_t rank = 0;
  int32_t world = 1;
  int32_t start = 0;  // BACKPLANE_RESTART_COUNT: which start of a restarted job
  std::string label;  // the process track's name; empty: "rank <R>"
  bool joined = false;
  bool merge_here = true;
  uint64_t generation = 0;

  // Events granted to the recording threads (kGrant at a time, up to
  // max_events) and events not kept; on cache lines of their own, away from
  // the writer's fields.
  alignas(64) std::atomic<uint64_t> granted{0};
  alignas(64) std::atomic<uint64_t> dropped{0};

  std::mutex buffers_mutex;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;

  // Chunks made at the start, for recording threads whose own written
  // chunks (ThreadBuffer::reuse) do not suffice. Only recording threads take
  // the mutex: never the writer.
  std::mutex spare_mutex;
  std::vector<Chunk*> spare;
  ~State() {
    for (Chunk* c : spare) delete c;
  }

  // The writer.
  int fd = -1;
  std::mutex writer_mutex;  // the part file and everything below
  // The writer's doorbell, a futex word: a recording thread adds one and
  // wakes it. Not a condition variable: glibc's has an internal lock that
  // both sides take, and a recording thread that signalled while the
  // idle-priority writer held it stalled for 300-430 us.
  std::atomic<uint32_t> doorbell{0};
  std::atomic<bool> stopping{false};
  // Set by stop() before it waits for writer_mutex: the writer, an idle
  // thread that may get almost no CPU on busy cores, leaves the rest of its
  // drain to stop(), which runs at the caller's priority.
  std::atomic<bool> stop_requested{false};
  std::thread writer;
  std::string out;
  uint32_t process_device = 0;  // the first device an op ran on: the process track's name
  bool process_named = false;
  uint64_t dropped_written = 0;
  // The part's string ids (trace_format.hpp): static text by address, and
  // which interned ids have gone out.
  std::unordered_map<const char*, uint32_t> pointer_ids;
  const char* last_pointer = nullptr;
  uint32_t last_pointer_id = 0;
  std::vector<bool> names_sent = std::vector<bool>(kMaxNames);
  // span_clock()'s ticks as nanoseconds (g_span_ticks): the rate between the
  // session's first (tick, ns) pair and the latest, which the writer takes
  // at every drain, so the events it converts are never far from it.
  int64_t tick0 = 0;
  int64_t ns0 = 0;
  int64_t tick_ref = 0;
  int64_t ns_ref = 0;
  double ns_per_tick = 1.0;
  int64_t prev_t0 = 0;  // the last event's t0 in the part: the next one's is written after it
  std::string write_error;
};

std::mutex g_state_mutex;  // starting and stopping, g_process_label
std::string g_process_label;
State* g_state = nullptr;  // read by recording threads only while g_active
std::atomic<uint64_t> g_generation{0};

// A recording thread's marker, alive as long as the thread: "inside an
// append" for stop(), and the buffer it appends to in which session.
struct Slot;
std::mutex g_slots_mutex;
std::vector<Slot*>& slots() {
  static auto* v = new std::vector<Slot*>;  // never destroyed: threads end after static destructors run
  return *v;
}
struct Slot {
  std::atomic<bool> writing{false};
  ThreadBuffer* buffer = nullptr;
  uint64_t generation = 0;
  Slot() {
    std::lock_guard lock(g_slots_mutex);
    slots().push_back(this);
  }
  ~Slot() {
    std::lock_guard lock(g_slots_mutex);
    auto& v = slots();
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
};
thread_local Slot t_slot;

int64_t gettid_now() { return static_cast<int64_t>(::syscall(SYS_gettid)); }

ThreadBuffer* register_thread(State& s) noexcept {
  try {
    auto b = std::make_unique<ThreadBuffer>();
    b->tid = gettid_now();
    char name[32] = {};
    if (::pthread_getname_np(::pthread_self(), name, sizeof name) == 0) b->name = json_escape(name);
    b->tail = b->head = new Chunk;
    ThreadBuffer* raw = b.get();
    std::lock_guard lock(s.buffers_mutex);
    s.buffers.push_back(std::move(b));
    return raw;
  } catch (...) {
    return nullptr;
  }
}

// ---- span_clock()'s ticks ---------------------------------------------------

// Whether the kernel keeps CLOCK_MONOTONIC on the time-stamp counter: then
// the counter is constant-rate and synchronised across cores.
bool kernel_clock_is_tsc() {
#if defined(__x86_64__)
  std::ifstream in("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(in >> name) && name == "tsc";
#else
  return false;
#endif
}

// A tick and the nanoseconds read together (the read between two tick
// reads, the closest of three tries).
std::pair<int64_t, int64_t> clock_pair() noexcept {
  std::pair<int64_t, int64_t> best{span_clock(), now_ns()};
  int64_t best_gap = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < 3; ++i) {
    const int64_t a = span_clock();
    const int64_t n = now_ns();
    const int64_t b = span_clock();
    if (b - a < best_gap) {
      best_gap = b - a;
      best = {a + (b - a) / 2, n};
    }
  }
  return best;
}

// Takes a new reference pair and the rate since the first. writer_mutex held.
void calibrate(State& s) noexcept {
  if (!g_span_ticks.load(std::memory_order_relaxed)) return;
  const auto [tick, ns] = clock_pair();
  if (tick > s.tick0 && ns > s.ns0)
    s.ns_per_tick = static_cast<double>(ns - s.ns0) / static_cast<double>(tick - s.tick0);
  s.tick_ref = tick;
  s.ns_ref = ns;
}

int64_t ticks_to_ns(const State& s, int64_t tick) noexcept {
  return s.ns_ref + std::llround(static_cast<double>(tick - s.tick_ref) * s.ns_per_tick);
}

// ---- the part file (trace_format.hpp) ---------------------------------------

void put_record(std::string& out, Record type, std::string_view a, std::string_view b = {}) {
  const auto size = static_cast<uint32_t>(a.size() + b.size());
  out.append(reinterpret_cast<const char*>(&size), sizeof size);
  out += static_cast<char>(type);
  out.append(a);
  out.append(b);
}

void put_string(std::string& out, uint32_t id, std::string_view text) {
  put_record(out, Record::string, std::string_view(reinterpret_cast<const char*>(&id), sizeof id), text);
}

const std::string& name_of(uint32_t id) {  // lock-free: published slots never change
  static const std::string none;
  if (id >= kMaxNames) return none;
  const std::string* text = names().table[id].load(std::memory_order_acquire);
  return text != nullptr ? *text : none;
}

static_assert(kMaxNames <= kPointerIds, "interned ids and the writer's own do not overlap");

// The part's id of a static text; its string record goes out the first time.
uint32_t pointer_id(State& s, const char* text) {
  if (text == nullptr || *text == '\0') return 0;
  if (text == s.last_pointer) return s.last_pointer_id;  // an op's name, again and again
  auto [it, fresh] = s.pointer_ids.try_emplace(text, 0);
  if (fresh) {
    it->second = kPointerIds + static_cast<uint32_t>(s.pointer_ids.size());
    put_string(s.out, it->second, text);
  }
  s.last_pointer = text;
  s.last_pointer_id = it->second;
  return it->second;
}

// An interned id, its string record written the first time the part uses it.
uint32_t interned_id(State& s, uint32_t id) {
  if (id == 0 || id >= kMaxNames) return 0;
  if (!s.names_sent[id]) {
    s.names_sent[id] = true;
    put_string(s.out, id, name_of(id));
  }
  return id;
}

static_assert(Event::kMaxShapes == kMaxEventShapes && Event::kMaxDims == kMaxEventDims,
              "an event's shapes fit its record");

void append_event(State& s, int64_t tid, const Event& e) {
  EventFields f;
  f.t0 = e.ticks ? ticks_to_ns(s, e.t0) : e.t0;
  f.t1 = e.ticks ? ticks_to_ns(s, e.t1) : e.t1;
  f.bytes = e.bytes;
  f.count = e.count;
  f.flow = e.flow;
  f.tid = tid;
  f.cat = pointer_id(s, e.cat);
  f.name = e.name != nullptr ? pointer_id(s, e.name) : interned_id(s, e.name_id);
  f.device = interned_id(s, e.device);
  f.peer = interned_id(s, e.peer);
  f.text_key = pointer_id(s, e.text_key);
  f.text = f.text_key != 0 ? interned_id(s, e.text) : 0;
  f.count_key = pointer_id(s, e.count_key);  // 0 for none, as text_key
  f.dtype = e.dtype;
  f.kind = static_cast<uint8_t>(e.kind);
  f.nshapes = std::min<uint8_t>(e.nshapes, Event::kMaxShapes);
  f.shapes_cut = e.shapes_cut;
  uint8_t ndim[Event::kMaxShapes];
  int dims = 0;
  for (int i = 0; i < f.nshapes; ++i) {
    ndim[i] = static_cast<uint8_t>(std::min<int>(e.ndim[i], Event::kMaxDims - dims));
    dims += ndim[i];
  }
  // The record (trace_format.hpp) built in place: its header, then the payload.
  unsigned char record[kRecordHeader + kMaxEventPayload];
  const std::size_t payload = encode_event(record + kRecordHeader, f, ndim, e.dims, s.prev_t0);
  s.prev_t0 = f.t0;
  const auto size = static_cast<uint32_t>(payload);
  std::memcpy(record, &size, sizeof size);
  record[4] = static_cast<unsigned char>(Record::event);
  s.out.append(reinterpret_cast<const char*>(record), kRecordHeader + payload);
}

void append_metadata(std::string& out, const State& s, const char* name, int64_t tid, const std::string& args,
                     Record type = Record::meta) {
  const std::string json = "{\"ph\":\"M\",\"name\":\"" + std::string(name) +
                           "\",\"pid\":" + std::to_string(s.rank) + ",\"tid\":" + std::to_string(tid) +
                           ",\"args\":{" + args + "}}";
  put_record(out, type, json);
}

uint64_t kept_events(State& s) {  // recording has stopped
  uint64_t n = 0;
  std::lock_guard lock(s.buffers_mutex);
  for (const auto& b : s.buffers) n += b->kept;
  return n;
}

// The process track's name, JSON-escaped: "rank 1", or set_process_label's.
std::string process_label(const State& s) {
  return s.label.empty() ? "rank " + std::to_string(s.rank) : s.label;
}

void write_out(State& s) {  // writer_mutex held
  std::size_t at = 0;
  while (at < s.out.size() && s.fd >= 0) {
    const ssize_t n = ::write(s.fd, s.out.data() + at, s.out.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The part ends here, mid-line: nothing more goes into it (not even the
      // end record), so a merge sees a part cut short, not a complete one.
      if (s.write_error.empty()) s.write_error = n < 0 ? std::strerror(errno) : "nothing written";
      ::close(s.fd);
      s.fd = -1;
      break;
    }
    at += static_cast<std::size_t>(n);
  }
  s.out.clear();
}

// Writes every published event not yet written. writer_mutex held.
void drain(State& s, bool yield_to_stop = false) {
  calibrate(s);
  std::vector<ThreadBuffer*> buffers;
  {
    std::lock_guard lock(s.buffers_mutex);
    for (auto& b : s.buffers) buffers.push_back(b.get());
  }
  for (ThreadBuffer* b : buffers) {
    if (yield_to_stop && s.stop_requested.load(std::memory_order_relaxed)) break;
    if (!b->named) {
      b->named = true;
      std::string args = "\"name\":\"" + (b->name.empty() ? std::string("thread") : b->name) + " " +
                         std::to_string(b->tid) + "\"";
      append_metadata(s.out, s, "thread_name", b->tid, args);
    }
    while (b->head != nullptr && !(yield_to_stop && s.stop_requested.load(std::memory_order_relaxed))) {
      Chunk* c = b->head;
      const uint32_t n = c->count.load(std::memory_order_acquire);
      for (uint32_t i = b->written; i < n; ++i) {
        const Event& e = c->events[i];
        if (!s.process_named && s.process_device == 0 && e.device != 0 && e.cat == std::string_view(kCatOp))
          s.process_device = e.device;  // the first device an op ran on names the track
        append_event(s, b->tid, e);
      }
      b->written = n;
      Chunk* next = c->next.load(std::memory_order_acquire);
      if (n < kChunkEvents || next == nullptr) break;
      b->head = next;
      b->written = 0;
      c->count.store(0, std::memory_order_relaxed);
      c->next.store(nullptr, std::memory_order_relaxed);
      if (b->free_chunks.load(std::memory_order_relaxed) >= static_cast<int32_t>(kWakeChunks)) {
        delete c;
        continue;
      }
      // Back to its thread (release: the resets above come with it).
      c->next_free = b->written_chunks.load(std::memory_order_relaxed);
      while (!b->written_chunks.compare_exchange_weak(c->next_free, c, std::memory_order_release,
                                                      std::memory_order_relaxed)) {
      }
      b->free_chunks.fetch_add(1, std::memory_order_relaxed);
    }
    if (s.out.size() > (1u << 20)) write_out(s);
  }
  if (!s.process_named && s.process_device != 0) {
    s.process_named = true;
    append_metadata(s.out, s, "process_name", 0,
                    "\"name\":\"" + process_label(s) + " \xC2\xB7 " + name_of(s.process_device) + "\"");
  }
  const uint64_t dropped = s.dropped.load(std::memory_order_relaxed);
  if (dropped != s.dropped_written) {
    s.dropped_written = dropped;
    append_metadata(s.out, s, kMetaDropped, 0, "\"dropped\":" + std::to_string(dropped));
  }
  write_out(s);
}

void writer_loop(State& s) {
  // The job's threads come first: on a busy core (OpenMP's workers spin
  // between parallel regions, ranks spin for their peers) the writer takes
  // the leftovers, and the events wait in their buffers meanwhile.
  // SCHED_IDLE, not only nice 19: a woken nice-19 thread still preempts the
  // thread on its core, and a rank preempted mid-collective stalls every
  // peer spinning for it (2 ranks on 2 cores: a 40% longer step).
  ::pthread_setname_np(::pthread_self(), "bp-trace");
  sched_param idle{};
  if (::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &idle) != 0)
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(gettid_now()), 19);
  while (!s.stopping.load(std::memory_order_acquire)) {
    // A ring after this load changes the word, so the wait below returns at
    // once; one before it is drained now.
    const uint32_t rung = s.doorbell.load(std::memory_order_acquire);
    {
      std::lock_guard lock(s.writer_mutex);
      drain(s, /*yield_to_stop=*/true);
    }
    if (s.stopping.load(std::memory_order_acquire)) break;
    const timespec tick{0, 100'000'000};
    (void)::syscall(SYS_futex, &s.doorbell, FUTEX_WAIT_PRIVATE, rung, &tick, nullptr, 0);
  }
}

// Wakes the writer (a recording thread, or stop()).
void ring(State& s) noexcept {
  s.doorbell.fetch_add(1, std::memory_order_release);
  (void)::syscall(SYS_futex, &s.doorbell, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

int32_t parse_int_or(const char* text, int32_t otherwise) {
  if (text == nullptr || *text == '\0') return otherwise;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < 0 || v > (1 << 24)) return otherwise;
  return static_cast<int32_t>(v);
}

// The world size the launcher family of env_rank() names; 1 when unknown.
int32_t env_world() {
  for (const char* v : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
    const int32_t w = parse_int_or(std::getenv(v), 0);
    if (w > 0) return w;
  }
  return 1;
}

std::string open_error(const std::string& path, int err) {
  return "trace: cannot create the trace part '" + path + "': " + std::strerror(err) +
         (err == ELOOP ? " (it is a symbolic link; remove it or choose another trace file)" : "");
}

// True when a live process holds the part's lock (its rank still records).
bool part_locked(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

// A forked child has no writer thread: it records nothing (its parent's
// session stays the parent's; the child's copy of it is left as it is). Only
// the forking thread lives on in the child: locks another thread held at
// the fork are made anew, and the other threads' markers forgotten (one
// caught inside an append would keep a later stop() waiting forever).
void forget_in_child() {
  g_active.store(false, std::memory_order_seq_cst);
  g_state = nullptr;
  new (&g_state_mutex) std::mutex();
  new (&g_slots_mutex) std::mutex();
  new (&names().mutex) std::mutex();
  slots().clear();
  t_slot.writing.store(false, std::memory_order_relaxed);  // constructed now if need be: it joins the list
  std::lock_guard lock(g_slots_mutex);
  if (std::find(slots().begin(), slots().end(), &t_slot) == slots().end()) slots().push_back(&t_slot);
}

void start(Options options) {
  if (options.path.empty()) throw Error(Errc::invalid_argument, "trace: the trace file's path is empty");
  if (options.max_events == 0)
    throw Error(Errc::invalid_argument, "trace: max_events is 0; give at least 1 (default " +
                                            std::to_string(kDefaultMaxEvents) + ")");
  std::lock_guard lock(g_state_mutex);
  if (g_state != nullptr)
    throw Error(Errc::invalid_argument, "trace: a session already records into '" + g_state->path +
                                            "' in this process (BACKPLANE_TRACE or another trace::Session); "
                                            "stop it first");
  auto s = std::make_unique<State>();
  s->path = std::move(options.path);
  s->max_events = options.max_events;
  if (auto r = Rendezvous::env_rank()) s->rank = parse_int_or(r->c_str(), 0);
  s->world = std::max(env_world(), s->rank + 1);
  const char* merge = std::getenv("BACKPLANE_TRACE_MERGE");
  s->merge_here = merge == nullptr || std::string_view(merge) != "launcher";
  s->start = parse_int_or(std::getenv("BACKPLANE_RESTART_COUNT"), 0);
  s->label = json_escape(g_process_label);
  s->part_path = part_path(s->path, s->rank, s->start);
  s->fd = ::open(s->part_path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (s->fd < 0) throw Error(Errc::io_error, open_error(s->part_path, errno));
  // One writer per part: a process that inherited BACKPLANE_TRACE and RANK
  // (a worker the rank spawned, `backplane check`'s children) must not
  // truncate the part its parent is writing.
  if (::flock(s->fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(s->fd);
    throw Error(Errc::io_error, "trace: another process is writing '" + s->part_path + "' (" +
                                    (err == EWOULDBLOCK ? std::string("it holds the part's lock")
                                                        : std::string(std::strerror(err))) +
                                    "); this process records nothing into it");
  }
  if (::ftruncate(s->fd, 0) != 0) {
    const int err = errno;
    ::close(s->fd);
    throw Error(Errc::io_error, open_error(s->part_path, err));
  }
  static std::once_flag clock_decided;  // before any span of any session records
  std::call_once(clock_decided, [] { g_span_ticks.store(kernel_clock_is_tsc(), std::memory_order_relaxed); });
  if (g_span_ticks.load(std::memory_order_relaxed)) {
    // The rate over a millisecond to begin with (better than 1e-4), then
    // over the whole session at each drain.
    std::tie(s->tick0, s->ns0) = clock_pair();
    while (now_ns() - s->ns0 < 1'000'000) std::this_thread::yield();
    calibrate(*s);
  }
  // Chunks made (and their pages touched) now rather than on a recording
  // thread: the writer runs only when a core is idle, and until it has
  // written the first chunks back the job's threads take these.
  for (std::size_t i = 0; i < kPreparedChunks; ++i) s->spare.push_back(new Chunk);
  s->generation = g_generation.fetch_add(1) + 1;
  s->out = kPartMagic;
  append_metadata(s->out, *s, kMetaPart, 0,
                  "\"format\":3,\"rank\":" + std::to_string(s->rank) +
                      ",\"world\":" + std::to_string(s->world) + ",\"pid\":" + std::to_string(::getpid()) +
                      ",\"max_events\":" + std::to_string(s->max_events) +
                      ",\"start\":" + std::to_string(s->start));
  append_metadata(s->out, *s, "process_sort_index", 0, "\"sort_index\":" + std::to_string(s->rank));
  write_out(*s);
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { ::pthread_atfork(nullptr, nullptr, &forget_in_child); });
  State* raw = s.get();
  s->writer = std::thread([raw] { writer_loop(*raw); });
  const int32_t start_count = s->start;
  g_state = s.release();
  g_active.store(true, std::memory_order_seq_cst);
  if (start_count > 0) {  // this process is a restart: mark where the start begins
    Event e;
    e.kind = Kind::instant;
    e.cat = kCatJob;
    e.name = "restart";
    e.t0 = now_ns();
    e.count_key = "start";
    e.count = start_count;
    record(e);
  }
}

// Stops recording; writes the part's end; rank 0 merges. Throws what merging throws.
void stop() {
  std::unique_ptr<State> s;
  {
    std::lock_guard lock(g_state_mutex);
    if (g_state == nullptr) return;
    s.reset(g_state);
    g_active.store(false, std::memory_order_seq_cst);
    // Wait out appends that saw g_active before it was cleared.
    {
      std::lock_guard slots_lock(g_slots_mutex);
      for (Slot* slot : slots())
        while (slot->writing.load(std::memory_order_seq_cst)) std::this_thread::yield();
    }
    g_state = nullptr;
  }
  s->stop_requested.store(true, std::memory_order_relaxed);
  s->stopping.store(true, std::memory_order_release);
  ring(*s);
  s->writer.join();
  {
    std::lock_guard lock(s->writer_mutex);
    drain(*s);
    if (!s->process_named) {
      s->process_named = true;
      append_metadata(s->out, *s, "process_name", 0, "\"name\":\"" + process_label(*s) + "\"");
    }
    append_metadata(
        s->out, *s, kMetaEnd, 0,
        "\"events\":" + std::to_string(kept_events(*s)) + ",\"dropped\":" + std::to_string(s->dropped.load()),
        Record::end);
    s->out.append(kPartTrailer);
    write_out(*s);
    if (s->fd >= 0 && ::close(s->fd) != 0 && s->write_error.empty()) s->write_error = std::strerror(errno);
    s->fd = -1;
  }
  if (!s->write_error.empty())
    throw Error(Errc::io_error, "trace: writing '" + s->part_path + "' failed: " + s->write_error);
  if (s->rank != 0 || !s->merge_here) return;
  // Rank 0 merges: the other ranks' parts, once they have ended (or after the wait).
  const double wait_s = [] {
    const char* w = std::getenv("BACKPLANE_TRACE_MERGE_WAIT");
    const int32_t v = parse_int_or(w, 10);
    return static_cast<double>(v);
  }();
  std::vector<std::string> parts;
  for (int32_t r = 0; r < s->world; ++r) parts.push_back(part_path(s->path, r, s->start));
  // Only for parts that exist: every rank began its part long before now, so
  // one that is missing was written on another host (or its rank does not
  // trace), and waiting would only delay the exit.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (const std::string& p : parts) {
    while (::access(p.c_str(), F_OK) == 0 && !part_ended(p) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<std::string> present;
  for (const std::string& p : parts)
    if (::access(p.c_str(), F_OK) == 0) present.push_back(p);
  const MergeResult m = trace::merge(present, s->path);
  // Merged parts go, except one whose rank is still writing it (it outlived
  // the wait: its writer still holds the part's lock), which stays for
  // `backplane trace merge` with what it records from now on.
  std::string still_written;
  for (const std::string& p : present) {
    if (part_ended(p) || !part_locked(p)) {
      ::unlink(p.c_str());
    } else {
      still_written += (still_written.empty() ? "" : ", ") + p;
    }
  }
  if (m.ranks < static_cast<std::size_t>(s->world) || m.incomplete > 0) {
    log(LogLevel::warning,
        "trace: wrote '" + s->path + "' with " + std::to_string(m.ranks) + " of " + std::to_string(s->world) +
            " ranks (" + std::to_string(m.incomplete) +
            " of them ended early: a rank died or is still running)" +
            (still_written.empty() ? std::string()
                                   : "; kept, as their ranks still write them: " + still_written));
  }
}

// The BACKPLANE_TRACE session: started with the first registry, stopped at exit.
struct EnvSession {
  ~EnvSession() {
    try {
      detail::stop();
    } catch (const std::exception& e) {
      log(LogLevel::error, e.what());
    }
  }
};

}  // namespace

void record(const Event& e) noexcept {
  Slot& slot = t_slot;
  slot.writing.store(true, std::memory_order_seq_cst);
  if (!g_active.load(std::memory_order_seq_cst)) [[unlikely]] {
    slot.writing.store(false, std::memory_order_release);
    return;
  }
  // g_state stays valid until `writing` is false again (stop() waits).
  State& s = *g_state;
  if (slot.generation != s.generation) [[unlikely]] {
    slot.buffer = register_thread(s);  // takes buffers_mutex, never held while stop() waits
    slot.generation = s.generation;
  }
  ThreadBuffer* b = slot.buffer;
  if (b != nullptr && b->quota == 0) [[unlikely]] {
    const uint64_t before = s.granted.fetch_add(kGrant, std::memory_order_relaxed);
    b->quota = before < s.max_events ? std::min(kGrant, s.max_events - before) : 0;
  }
  if (b == nullptr || b->quota == 0) [[unlikely]] {
    s.dropped.fetch_add(1, std::memory_order_relaxed);
    slot.writing.store(false, std::memory_order_release);
    return;
  }
  Chunk* c = b->tail;
  uint32_t n = c->count.load(std::memory_order_relaxed);
  if (n == kChunkEvents) [[unlikely]] {
    if (b->reuse == nullptr) b->reuse = b->written_chunks.exchange(nullptr, std::memory_order_acquire);
    Chunk* fresh = b->reuse;
    if (fresh != nullptr) {
      b->reuse = fresh->next_free;
      b->free_chunks.fetch_sub(1, std::memory_order_relaxed);
    } else {
      std::lock_guard spare_lock(s.spare_mutex);  // until this thread's first chunks come back
      if (!s.spare.empty()) {
        fresh = s.spare.back();
        s.spare.pop_back();
      }
    }
    if (fresh == nullptr) fresh = new (std::nothrow) Chunk;
    if (fresh == nullptr) {
      s.dropped.fetch_add(1, std::memory_order_relaxed);
      slot.writing.store(false, std::memory_order_release);
      return;
    }
    c->next.store(fresh, std::memory_order_release);
    b->tail = c = fresh;
    n = 0;
    if (++b->filled % kWakeChunks == 0) ring(s);
  }
  --b->quota;
  ++b->kept;
  c->events[n] = e;
  c->count.store(n + 1, std::memory_order_release);
  slot.writing.store(false, std::memory_order_release);
}

uint32_t intern(std::string_view text) noexcept {
  if (text.empty()) return 0;
  // The names a thread uses again and again (a range per step, a plugin's
  // transport per collective) are found here without the table's mutex.
  struct Cached {
    std::string text;
    uint32_t id = 0;
  };
  thread_local std::array<Cached, 8> cache;
  thread_local std::size_t next = 0;
  for (const Cached& c : cache)
    if (c.id != 0 && c.text == text) return c.id;
  try {
    Names& n = names();
    uint32_t id = 0;
    {
      std::lock_guard lock(n.mutex);
      auto it = n.ids.find(std::string(text));
      if (it != n.ids.end()) {
        id = it->second;
      } else {
        if (n.count >= kMaxNames) return kOverflowName;
        id = n.count++;
        n.table[id].store(new std::string(json_escape(text)), std::memory_order_release);
        n.ids.emplace(std::string(text), id);
      }
    }
    cache[next++ % cache.size()] = Cached{std::string(text), id};
    return id;
  } catch (...) {
    return 0;
  }
}

uint32_t device_label(uint64_t backend_serial, std::string_view backend, int32_t device) noexcept {
  struct Entry {
    uint64_t key;
    int32_t device;
    uint32_t id;
  };
  thread_local std::array<Entry, 8> cache{};
  thread_local std::size_t next = 0;
  for (const Entry& e : cache)
    if (e.key == backend_serial && e.device == device && e.id != 0) return e.id;
  uint32_t id = 0;
  try {
    id = intern(std::string(backend) + ":" + std::to_string(device));
  } catch (...) {
    return 0;
  }
  cache[next++ % cache.size()] = Entry{backend_serial, device, id};
  return id;
}

void add_shape(Event& e, const bp_tensor& t) noexcept {
  if (e.nshapes >= Event::kMaxShapes) {
    e.shapes_cut = true;
    return;
  }
  int used = 0;
  for (int i = 0; i < e.nshapes; ++i) used += e.ndim[i];
  const int ndim = std::max<int32_t>(t.ndim, 0);
  const int take = std::min(ndim, Event::kMaxDims - used);
  if (take < ndim) e.shapes_cut = true;
  for (int i = 0; i < take; ++i) e.dims[used + i] = t.shape[i];
  e.ndim[e.nshapes++] = static_cast<uint8_t>(take);
}

const char* stable_key(std::string_view key) noexcept {
  try {
    Names& n = names();
    std::lock_guard lock(n.mutex);
    auto it = n.keys.find(key);
    if (it == n.keys.end()) {
      if (n.keys.size() >= 1024) return nullptr;
      it = n.keys.emplace(std::string(key), json_escape(key)).first;
    }
    return it->second.c_str();  // a map node's: stays where it is
  } catch (...) {
    return nullptr;
  }
}

void record_plugin_event(const bp_trace_event* p) noexcept {
  if (!active() || p == nullptr || !BP_HAS_FIELD(bp_trace_event, flow_id, p->struct_size) ||
      p->name == nullptr || p->start_ns < 0 || p->end_ns < p->start_ns)
    return;
  auto cut = [](const char* text) {  // a plugin's text, bounded (a cut UTF-8 sequence is escaped as U+FFFD)
    const std::string_view v(text);
    return v.substr(0, std::min(v.size(), kMaxText));
  };
  Event e;
  const std::string_view cat = p->category != nullptr ? p->category : "";
  e.cat = cat == std::string_view(kCatTransport) ? kCatTransport
          : cat == std::string_view(kCatRemote)  ? kCatRemote
                                                 : kCatPlugin;
  e.name_id = intern(cut(p->name));
  e.t0 = p->start_ns;
  e.t1 = p->end_ns;
  e.bytes = p->bytes >= 0 ? p->bytes : -1;
  if (p->number_key != nullptr) {
    e.count_key = stable_key(cut(p->number_key));
    e.count = p->number;
  }
  if (p->text_key != nullptr && p->text != nullptr) {
    e.text_key = stable_key(cut(p->text_key));
    e.text = intern(cut(p->text));
  }
  if (p->flow == BP_TRACE_FLOW_OUT || p->flow == BP_TRACE_FLOW_IN) {
    // The flow's own event, at the span's start, beside the span itself.
    Event f = e;
    f.kind = p->flow == BP_TRACE_FLOW_OUT ? Kind::flow_out : Kind::flow_in;
    f.flow = p->flow_id;
    f.bytes = -1;
    f.count_key = nullptr;
    f.text_key = nullptr;
    record(f);
  }
  e.kind = p->end_ns > p->start_ns ? Kind::span : Kind::instant;
  record(e);
}

void start_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("BACKPLANE_TRACE");
    if (path == nullptr || *path == '\0') return;
    Options o;
    o.path = path;
    if (const char* m = std::getenv("BACKPLANE_TRACE_MAX_EVENTS")) {
      char* end = nullptr;
      errno = 0;
      const unsigned long long v = std::strtoull(m, &end, 10);
      if (errno != 0 || end == m || *end != '\0' || v == 0)
        throw Error(Errc::invalid_argument, std::string("BACKPLANE_TRACE_MAX_EVENTS='") + m +
                                                "' is not a positive whole number of events");
      o.max_events = v;
    }
    start(std::move(o));
    static EnvSession at_exit;
  });
}

void joined_job(int32_t rank, int32_t world, Store& store, std::string_view key_prefix) {
  if (!active()) return;
  uint64_t generation = 0;
  {
    std::lock_guard lock(g_state_mutex);
    if (g_state == nullptr || g_state->joined) return;
    g_state->joined = true;
    g_state->world = std::max(g_state->world, world);
    generation = g_state->generation;
  }
  ClockOffset c;
  try {
    c = measure_clock_offset(rank, world, store, key_prefix);
  } catch (const std::exception& e) {
    // A rank that does not trace never answers: its events keep their own clock.
    log(LogLevel::warning, std::string("trace: this rank's clock is not aligned to rank 0's (does every rank "
                                       "trace? set BACKPLANE_TRACE for all of them): ") +
                               e.what());
    return;
  }
  std::lock_guard lock(g_state_mutex);
  if (g_state == nullptr || g_state->generation != generation) return;  // measured for a session now stopped
  State& s = *g_state;
  std::lock_guard wl(s.writer_mutex);
  append_metadata(s.out, s, kMetaClock, 0,
                  "\"offset_ns\":" + std::to_string(c.offset_ns) + ",\"error_ns\":" +
                      std::to_string(c.error_ns) + ",\"rounds\":" + std::to_string(c.rounds));
}

}  // namespace backplane::trace::detail

namespace backplane::trace {

Session::Session(Options options) { detail::start(std::move(options)); }

Session::~Session() {
  try {
    stop();
  } catch (const std::exception& e) {
    log(LogLevel::error, e.what());
  }
}

void Session::stop() {
  if (stopped_) return;
  stopped_ = true;
  detail::stop();
}

bool active() noexcept { return detail::active(); }

int64_t now_ns() noexcept { return detail::now_ns(); }

void record(const Event& event) noexcept {
  if (!detail::active()) return;
  bp_trace_event e{};
  e.struct_size = BP_TRACE_EVENT_STRUCT_SIZE;
  e.category = event.category;
  e.name = event.name;
  e.start_ns = event.start_ns;
  e.end_ns = event.end_ns;
  e.bytes = event.bytes;
  e.number_key = event.number_key;
  e.number = event.number;
  e.text_key = event.text_key;
  e.text = event.text;
  e.flow = event.flow == Event::Flow::out  ? BP_TRACE_FLOW_OUT
           : event.flow == Event::Flow::in ? BP_TRACE_FLOW_IN
                                           : BP_TRACE_FLOW_NONE;
  e.flow_id = event.flow_id;
  detail::record_plugin_event(&e);
}

void set_process_label(std::string label) {
  std::lock_guard lock(detail::g_state_mutex);
  detail::g_process_label = std::move(label);
}

Range::Range(std::string_view name) {
  if (!detail::active()) return;
  name_ = detail::intern(name);
  start_ = detail::now_ns();
}

Range::~Range() {
  if (start_ < 0) return;
  detail::Event e;
  e.cat = detail::kCatRange;
  e.name_id = name_;
  e.t0 = start_;
  e.t1 = detail::now_ns();
  detail::record(e);
}

}  // namespace backplane::trace
