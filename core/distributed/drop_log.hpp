// The rendezvous store's log of connections dropped before they proved the
// job secret, rate-limited: a flood of them (a scanner, a misconfigured
// launcher retrying) must not write one line each. The first few of an
// interval are logged as they happen; the rest are counted and summed up in
// one line when the interval ends: "N more unauthenticated connections
// dropped in the last 10 s (the last: ...)". Plain logic over the time it is
// given, so that tests need no clock; the server drives it from a timer.
// Not thread-safe: the server's thread alone uses it.
#ifndef BACKPLANE_CORE_DISTRIBUTED_DROP_LOG_HPP_
#define BACKPLANE_CORE_DISTRIBUTED_DROP_LOG_HPP_

#include <backplane/log.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "distributed/store_wire.hpp"

namespace backplane::store_detail {

class DropLog {
 public:
  using Clock = std::chrono::steady_clock;
  struct Line {
    LogLevel level;
    std::string text;
  };

  // Up to `burst` lines of their own per `interval`, then one summary line.
  DropLog(std::chrono::milliseconds interval, std::size_t burst) : interval_(interval), burst_(burst) {}

  // A connection dropped at `now`, with the line it would have been logged
  // with: that line while the interval's burst lasts, else nothing (it is
  // counted for the summary, and pending() turns true).
  std::optional<Line> drop(Clock::time_point now, LogLevel level, std::string text) {
    if (!window_ || now - *window_ >= interval_) {
      window_ = now;
      shown_ = 0;
    }
    if (shown_ < burst_ && counted_ == 0) {
      ++shown_;
      return Line{level, std::move(text)};
    }
    ++counted_;
    level_ = std::max(level_, level);
    last_ = std::move(text);
    return std::nullopt;
  }

  // Whether drops were counted and not yet summed up.
  bool pending() const { return counted_ > 0; }
  // When the summary of the counted drops is due: the end of the interval.
  Clock::time_point due() const { return window_.value_or(Clock::time_point{}) + interval_; }

  // The line that sums up the counted drops, if any; called when due() comes
  // and at shutdown. A summary starts a new interval without a burst, so a
  // flood that goes on is one line per interval; the next drop after a quiet
  // interval is logged in full again.
  std::optional<Line> summary(Clock::time_point now) {
    if (counted_ == 0) return std::nullopt;
    // To a tenth of a second: "in the last 10 s", not "10.002 s".
    const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(now - *window_ +
                                                                             std::chrono::milliseconds(50)) /
                       100 * 100;
    Line line{level_, std::to_string(counted_) + " more unauthenticated connection" +
                          (counted_ == 1 ? "" : "s") + " dropped in the last " +
                          store_wire::seconds_text(since) + " (logged " + std::to_string(burst_) + " per " +
                          store_wire::seconds_text(interval_) + " at most; the last: " + last_ + ")"};
    counted_ = 0;
    level_ = LogLevel::debug;
    last_.clear();
    window_ = now;
    shown_ = burst_;
    return line;
  }

 private:
  std::chrono::milliseconds interval_;
  std::size_t burst_;
  std::optional<Clock::time_point> window_;  // when the current interval began
  std::size_t shown_ = 0;                    // lines of their own in this interval
  std::size_t counted_ = 0;                  // drops since the last summary, not logged
  LogLevel level_ = LogLevel::debug;         // the highest level among them
  std::string last_;                         // the line of the latest of them
};

}  // namespace backplane::store_detail

#endif  // BACKPLANE_CORE_DISTRIBUTED_DROP_LOG_HPP_
