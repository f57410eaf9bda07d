// The process-wide log sink shared by the core and (through bp_host_api) plugins.
#include <backplane/log.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace backplane {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("BACKPLANE_LOG_LEVEL");
  if (env == nullptr || env[0] == '\0') return LogLevel::info;
  if (std::strcmp(env, "debug") == 0) return LogLevel::debug;
  if (std::strcmp(env, "warning") == 0) return LogLevel::warning;
  if (std::strcmp(env, "error") == 0) return LogLevel::error;
  if (std::strcmp(env, "info") != 0) {
    // Straight to stderr: the sink is being built, and a typo must not pass silently.
    std::string value(env);
    if (value.size() > 64) value = value.substr(0, 61) + "...";
    for (char& c : value)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    const std::string line = "backplane: warning: BACKPLANE_LOG_LEVEL=\"" + value +
                             "\" is not a log level; using info (valid: debug, info, warning, error)\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  return LogLevel::info;
}

struct Sink {
  std::mutex mutex;
  std::shared_ptr<const LogHandler> handler;  // swapped whole; called outside the lock
  std::atomic<int> min_level{static_cast<int>(initial_level())};
};

Sink& sink() {
  // Deliberately never destroyed: plugins may log from destructors that run
  // during static destruction (a static Registry going away).
  static Sink* s = new Sink;
  return *s;
}

// Built when the library loads, so an invalid BACKPLANE_LOG_LEVEL is reported
// once, up front, even by a process that never logs.
[[maybe_unused]] const bool kSinkBuilt = (sink(), true);

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warning:
      return "warning";
    case LogLevel::error:
      return "error";
  }
  return "log";
}

}  // namespace

void set_log_handler(LogHandler handler) {
  auto next = handler ? std::make_shared<const LogHandler>(std::move(handler)) : nullptr;
  std::lock_guard<std::mutex> lock(sink().mutex);
  sink().handler = std::move(next);
}

void set_log_level(LogLevel min_level) { sink().min_level.store(static_cast<int>(min_level)); }

void log(LogLevel level, std::string_view message) {
  Sink& s = sink();
  if (static_cast<int>(level) < s.min_level.load(std::memory_order_relaxed)) return;
  std::shared_ptr<const LogHandler> handler;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    handler = s.handler;
  }
  // Outside the lock: a handler may itself log or call into backplane.
  if (handler) {
    (*handler)(level, message);
    return;
  }
  std::string line = std::string("backplane: ") + level_name(level) + ": ";
  line.append(message);
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines from threads do not interleave
}

}  // namespace backplane
