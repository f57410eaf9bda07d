// Diagnostics from the core and from plugins. By default they go to stderr
// as "backplane: warning: ..."; a host application may route them.
// Thread-safety: log() and set_log_handler() may be called from any thread;
// a handler may be called from several threads at once and may itself log.
#ifndef BACKPLANE_LOG_HPP_
#define BACKPLANE_LOG_HPP_

#include <backplane/export.hpp>

#include <functional>
#include <string_view>

namespace backplane {

enum class LogLevel { debug = 0, info = 1, warning = 2, error = 3 };

using LogHandler = std::function<void(LogLevel, std::string_view)>;

// Replaces the handler; an empty handler restores the stderr default.
// Messages below the minimum level (default: info; BACKPLANE_LOG_LEVEL=debug
// lowers it) are dropped before reaching the handler.
BACKPLANE_API void set_log_handler(LogHandler handler);
BACKPLANE_API void set_log_level(LogLevel min_level);
BACKPLANE_API void log(LogLevel level, std::string_view message);

}  // namespace backplane

#endif  // BACKPLANE_LOG_HPP_
