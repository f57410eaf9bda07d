// A connection's end (connection.hpp): a Fatal that says why, then the close;
// the session's worker is stopped, everything the session held is freed and
// one line says so, and the server forgets the connection.
#include "remote/server/connection.hpp"

#include "remote/server/messages.hpp"

#include <string>
#include <thread>

namespace backplane::remote::server {

namespace {

// How long a Fatal may take to reach the client before the socket closes anyway.
constexpr milliseconds kFatalLinger{2000};

}  // namespace

Connection::~Connection() {
  if (in_handshake_) server_.handshake_ended(address_);
  server_.counters.memory.give(unsent_held_);  // frames that were never written
  if (worker_.joinable()) {
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();
    } else {
      worker_.join();
    }
  }
}

// Sends a Fatal saying why, then closes (after it is written, or after kFatalLinger).
void Connection::fatal(int32_t status, const std::string& why) {
  if (phase_ == Phase::closed || close_after_flush_) return;
  close_after_flush_ = true;
  fatal_level_ =
      status == BP_STATUS_UNAVAILABLE || status == BP_STATUS_TIMEOUT ? LogLevel::info : LogLevel::warning;
  fatal_why_ = "was told: " + why;
  if (phase_ == Phase::tls) {  // no frame can go out before TLS is up
    close(fatal_level_, fatal_why_);
    return;
  }
  phase_ = Phase::draining;  // nothing more is read
  send_now(encode_fatal(status, why));
  linger_timer_.expires_after(kFatalLinger);
  linger_timer_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (!ec) self->close(self->fatal_level_, self->fatal_why_);
  });
}

void Connection::close(LogLevel level, const std::string& why) {
  if (phase_ == Phase::closed) return;
  const bool had_session = session_ != nullptr;
  phase_ = Phase::closed;
  close_level_ = level;
  close_why_ = why;
  end_handshake();
  idle_timer_.cancel();
  linger_timer_.cancel();
  stream_.close();  // pending reads and the write in flight complete with operation_aborted
  // Frames not yet handed to the socket will never be written.
  while (out_.size() > in_flight_) {
    if (out_.back().done) out_.back().done(false);
    out_.pop_back();
  }
  {
    std::lock_guard lock(send_mutex_);
    dead_ = true;
  }
  send_cv_.notify_all();
  {
    std::lock_guard lock(kv_mutex_);
    kv_closed_ = true;
  }
  kv_cv_.notify_all();
  if (!had_session) {
    finish();
    return;
  }
  session_->abort_all();  // a collective blocked on a peer returns
  // The worker frees what the session held and then calls finish(); while a
  // read goes straight into a buffer, its handler tells the worker instead.
  if (!direct_read_) stop_worker();
}

void Connection::stop_worker() {
  {
    std::lock_guard lock(queue_mutex_);
    stop_worker_ = true;
  }
  queue_cv_.notify_all();
}

// The last step, on the strand: everything is freed; one line says so.
void Connection::finish() {
  if (finished_) return;
  finished_ = true;
  if (worker_.joinable()) worker_.join();
  if (session_) {
    log_line(close_level_, "session " + std::to_string(session_->id()) + " from " + peer_ +
                               " ended: " + close_why_ + "; freed " + std::to_string(freed_buffers_) +
                               " buffer(s), " + std::to_string(freed_bytes_) + " bytes");
    session_.reset();
  } else {
    server_.log_limited(close_level_ == LogLevel::info ? LogLevel::debug : close_level_,
                        peer_ + " " + close_why_);
  }
  release_slot();
  server_.remove(shared_from_this());
}

void Connection::release_slot() {
  if (has_session_slot_) {
    has_session_slot_ = false;
    --server_.counters.sessions;
  }
}

}  // namespace backplane::remote::server
