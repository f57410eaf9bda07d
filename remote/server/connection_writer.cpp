// A connection's writer (connection.hpp): the Sender entries the session's
// worker and the hosted plugin's kv calls use, and the strand's own frames,
// queued and written in gathered writes; whoever sends waits while too many
// bytes are unsent.
#include "remote/server/connection.hpp"

#include "remote/server/messages.hpp"

#include <algorithm>
#include <future>
#include <vector>

namespace backplane::remote::server {

using wire::whole_transfer;

// ---- Sender: the session's worker and the hosted plugin's kv calls -------
void Connection::send(wire::Encoded frame) {
  const uint64_t n = frame.bytes.size();
  if (!reserve_unsent(n, n)) return;
  auto o = std::make_shared<Outgoing>(Outgoing{std::move(frame.bytes), {}, {}});
  asio::post(strand_, [self = shared_from_this(), o] { self->enqueue_out(std::move(*o)); });
}

bool Connection::send_with_payload(wire::Encoded frame, std::span<const uint8_t> payload) {
  // The payload is a buffer's memory or the session's staging, both counted already.
  const uint64_t n = frame.bytes.size() + payload.size();
  if (!reserve_unsent(n, frame.bytes.size())) return false;
  auto written = std::make_shared<std::promise<bool>>();
  std::future<bool> result = written->get_future();
  auto o = std::make_shared<Outgoing>(
      Outgoing{std::move(frame.bytes), payload, [written](bool ok) { written->set_value(ok); }});
  asio::post(strand_, [self = shared_from_this(), o] { self->enqueue_out(std::move(*o)); });
  return result.get();  // the payload is the caller's: wait until it is written
}

KvResult Connection::kv(const KvCall& call, milliseconds wait) {
  uint64_t id = 0;
  {
    std::lock_guard lock(kv_mutex_);
    if (kv_closed_) return KvResult{BP_STATUS_UNAVAILABLE, "the client's session has ended", {}};
    id = next_kv_id_++;
    kv_pending_[id];
  }
  ++kv_waiting_;
  send(encode_kv_request(id, call.kind, call.keys, call.value, call.timeout_ms));
  // The reader may be waiting for room in the queue; the reply must get through.
  asio::post(strand_, [self = shared_from_this()] { self->resume(); });
  std::unique_lock lock(kv_mutex_);
  kv_cv_.wait_for(lock, wait, [&] { return kv_closed_ || kv_pending_[id].has_value(); });
  std::optional<KvResult> result = std::move(kv_pending_[id]);
  kv_pending_.erase(id);
  const bool closed = kv_closed_;
  lock.unlock();
  --kv_waiting_;
  if (result) return std::move(*result);
  if (closed) return KvResult{BP_STATUS_UNAVAILABLE, "the client's session ended during the request", {}};
  return KvResult{BP_STATUS_TIMEOUT,
                  "the client did not answer the server's key-value request within " + ms_text(wait),
                  {}};
}

// ---- writing: queued frames leave in gathered writes -------------------
// Waits while too many bytes are unsent, or while the server's memory
// account has no room for the `held` bytes this frame makes the server hold
// and earlier frames are still unsent (with nothing unsent, one frame goes
// past the cap: replies must get out). False once the connection is gone.
bool Connection::reserve_unsent(uint64_t n, uint64_t held) {
  MemoryAccount& account = server_.counters.memory;
  const uint64_t cap = server_.options.limits.max_total_bytes;
  std::unique_lock lock(send_mutex_);
  bool taken = false;
  send_cv_.wait(lock, [&] {
    if (dead_) return true;
    if (unsent_ >= kMaxUnsentBytes) return false;
    taken = account.take(held, cap);
    return taken || unsent_ == 0;
  });
  if (dead_) {
    if (taken) account.give(held);
    return false;
  }
  if (!taken) account.force(held);
  unsent_ += n;
  unsent_held_ += held;
  return true;
}

// A frame the strand makes itself (the handshake, a ping's reply, a Fatal):
// counted, never waited for. Returns the bytes unsent now.
uint64_t Connection::send_now(wire::Encoded frame) {
  uint64_t unsent = 0;
  {
    std::lock_guard lock(send_mutex_);
    unsent_ += frame.bytes.size();
    unsent_held_ += frame.bytes.size();
    unsent = unsent_;
  }
  server_.counters.memory.force(frame.bytes.size());  // small, and bounded by kMaxUnsentBytes
  enqueue_out(Outgoing{std::move(frame.bytes), {}, {}});
  return unsent;
}

void Connection::enqueue_out(Outgoing o) {
  if (phase_ == Phase::closed) {
    if (o.done) o.done(false);
    return;
  }
  out_.push_back(std::move(o));
  if (!writing_) flush();
}

void Connection::flush() {
  writing_ = true;
  in_flight_ = std::min<std::size_t>(out_.size(), 64);
  std::vector<asio::const_buffer> buffers;
  buffers.reserve(2 * in_flight_);
  for (std::size_t i = 0; i < in_flight_; ++i) {
    buffers.push_back(asio::buffer(out_[i].head));
    if (!out_[i].payload.empty())
      buffers.push_back(asio::buffer(out_[i].payload.data(), out_[i].payload.size()));
  }
  const milliseconds timeout = server_.options.limits.idle_timeout;
  write_timer_.expires_after(timeout);
  write_timer_.async_wait([self = shared_from_this(), timeout](const error_code& ec) {
    if (ec || self->phase_ == Phase::closed) return;
    self->close(LogLevel::warning,
                "did not read what the server sent for " + ms_text(timeout) + " (--idle-timeout-ms); closed");
  });
  auto handler = [self = shared_from_this()](const error_code& ec, std::size_t) {
    self->write_timer_.cancel();
    self->writing_ = false;
    uint64_t written = 0;
    uint64_t heads = 0;
    for (std::size_t i = 0; i < self->in_flight_; ++i) {
      written += self->out_.front().bytes();
      heads += self->out_.front().head.size();
      if (self->out_.front().done) self->out_.front().done(!ec);
      self->out_.pop_front();
    }
    self->in_flight_ = 0;
    {
      std::lock_guard lock(self->send_mutex_);
      self->unsent_ -= std::min(self->unsent_, written);
      heads = std::min(self->unsent_held_, heads);
      self->unsent_held_ -= heads;
    }
    self->server_.counters.memory.give(heads);
    self->send_cv_.notify_all();
    if (ec) {
      self->close(LogLevel::info, "could not be written to (" + ec.message() + ")");
      return;
    }
    if (self->phase_ == Phase::closed) return;
    if (!self->out_.empty()) {
      self->flush();
    } else if (self->close_after_flush_) {
      self->close(self->fatal_level_, self->fatal_why_);
      return;
    }
    self->resume();
  };
  if (stream_.tls()) {
    asio::async_write(stream_.ssl(), buffers, whole_transfer, std::move(handler));
  } else {
    asio::async_write(stream_.socket(), buffers, whole_transfer, std::move(handler));
  }
}

}  // namespace backplane::remote::server
