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
  if (env == nullptr) return LogLevel::info;
  if (std::strcmp(env, "debug") == 0) return LogLevel::debug;
  if (std::strcmp(env, "warning") == 0) return LogLevel::warning;
  if (std::strcmp(env, "error") == 0) return LogLevel::error;
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

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
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
