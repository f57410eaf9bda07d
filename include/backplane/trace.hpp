// Tracing: a timeline of what this process does (every op with its device,
// dtype and shapes; op placement's fallbacks and the copies they cause;
// collectives; the rendezvous; the host's own ranges) in the Trace Event
// Format, the JSON that Perfetto UI, chrome://tracing and speedscope open.
//
// Off by default. On for the life of a process with BACKPLANE_TRACE=FILE (the
// core reads it when it is loaded), or for a region with a trace::Session.
// Each rank of a job records into FILE.rank<R>.part (streamed: a rank that
// dies leaves what it recorded up to then) and rank 0 merges every rank's
// part into FILE when it stops, one process track per rank, each rank's clock
// aligned to rank 0's (measured through the job's store when a process group
// is made; the offset and its error are written into the file). Parts rank 0
// could not merge (it died first, or another host wrote them) are merged by
// `backplane trace merge`.
//
// Cost: off, one predictable branch per op. On, each event is a fixed-size
// record in a per-thread buffer, written out by a background thread; at most
// Options::max_events are kept and the rest are counted in the file.
//
// Thread-safety: one Session at a time per process; record from any thread.
#ifndef BACKPLANE_TRACE_HPP_
#define BACKPLANE_TRACE_HPP_

#include <backplane/export.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::trace {

// Enough for hours of the main job (about 70,000 events per epoch), a few
// hundred MB of JSON at most.
inline constexpr uint64_t kDefaultMaxEvents = 2'000'000;

struct Options {
  std::string path;                         // the job's trace file (FILE above)
  uint64_t max_events = kDefaultMaxEvents;  // kept by this process; later events are counted, not kept
};

// Records from construction until stop() or destruction. Throws
// Errc::invalid_argument when a session is already recording in this process
// (BACKPLANE_TRACE's included) or max_events is 0, Errc::io_error when the
// part file cannot be created (naming it).
class BACKPLANE_API Session {
 public:
  explicit Session(Options options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  // Stops recording and writes the part; rank 0 then merges the job's parts
  // into the trace file (waiting up to `BACKPLANE_TRACE_MERGE_WAIT` seconds,
  // default 10, for other ranks to finish theirs). Idempotent; the
  // destructor calls it and logs what fails instead of throwing.
  void stop();

 private:
  bool stopped_ = false;
};

// True while a session records in this process.
BACKPLANE_API bool active() noexcept;

// A region of the host application's own, drawn as a span on the calling
// thread around the ops it contains. Free when no session records.
class BACKPLANE_API Range {
 public:
  explicit Range(std::string_view name);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  int64_t start_ = -1;  // -1: not recording
  uint32_t name_ = 0;
};

// An event of the host's own, recorded on the calling thread's track: what
// a plugin adds through ABI 2.4's bp_trace_event, for code that is not a
// plugin (`backplane serve` draws each client request it runs as the end of
// the flow the client's plugin began). Text is copied; an event whose end is
// before its start is dropped. Nothing when no session records.
struct Event {
  enum class Flow { none, out, in };
  const char* category = "";  // "remote"; anything else is filed under "plugin"
  const char* name = "";
  int64_t start_ns = 0;  // now_ns()
  int64_t end_ns = 0;    // == start_ns: an instant
  int64_t bytes = -1;    // < 0: none
  const char* number_key = nullptr;
  int64_t number = 0;
  const char* text_key = nullptr;
  const char* text = nullptr;
  Flow flow = Flow::none;
  uint64_t flow_id = 0;
};
BACKPLANE_API void record(const Event& event) noexcept;
// The clock of every event: CLOCK_MONOTONIC in nanoseconds.
BACKPLANE_API int64_t now_ns() noexcept;
// The name of this process's track in traces started from now on ("serve
// 127.0.0.1:7000"); empty (the default): "rank <R>". The first device an op
// ran on follows it ("rank 1 · cpu:0").
BACKPLANE_API void set_process_label(std::string label);

// What merge() did, for the caller's report.
struct MergeResult {
  std::size_t ranks = 0;       // parts merged
  std::size_t incomplete = 0;  // parts that ended without their end record (a rank died)
  uint64_t events = 0;
  uint64_t dropped = 0;  // events the ranks counted but did not keep (max_events)
};

// Merges part files into one trace file (written atomically): each part's
// events shifted by its rank's clock offset, a torn last line skipped, a
// process track per rank. Throws Errc::io_error naming a part that cannot be
// read or the output that cannot be written, Errc::invalid_argument for a
// file that is not a backplane trace part.
BACKPLANE_API MergeResult merge(const std::vector<std::string>& parts, const std::string& output);

// The part files of `path` that exist now (path.rank<R>.part), by rank.
BACKPLANE_API std::vector<std::string> parts_of(const std::string& path);

}  // namespace backplane::trace

#endif  // BACKPLANE_TRACE_HPP_
