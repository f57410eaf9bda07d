// A connection's worker and its queue (connection.hpp): the reader queues
// requests, the worker thread runs them on the session in arrival order, and
// the reader waits while the queue is full. Payload and message buffers the
// worker is done with go back to the reader for reuse.
#include "remote/server/connection.hpp"

#include <exception>
#include <string>

namespace backplane::remote::server {

namespace {

// Payload buffers kept for reuse (first-touching fresh pages is slow).
constexpr std::size_t kSpareBuffers = 2;
constexpr uint64_t kMaxSpareBytes = uint64_t{256} << 20;
// Message buffers the worker hands back for the reader to fill again: each
// request's message would otherwise be allocated on the reader's thread and
// freed on the worker's, which glibc serves slowly (no per-thread cache).
constexpr std::size_t kSpareMessages = 64;
constexpr std::size_t kMaxSpareMessageBytes = 64 * 1024;

}  // namespace

void Connection::queue(Request r) {
  bool wake = false;
  {
    std::lock_guard lock(queue_mutex_);
    queued_bytes_ += r.payload.size() + r.message.size();
    queue_.push_back(std::move(r));
    if (message_.capacity() == 0 && !spare_messages_.empty()) {  // the next message's buffer
      message_ = std::move(spare_messages_.back());
      spare_messages_.pop_back();
    }
    wake = worker_idle_;
    if (queue_full_locked()) {
      paused_ = true;
      reader_waits_ = true;
      idle_timer_.cancel();  // the client is waiting for us, not idle
    }
  }
  if (wake) queue_cv_.notify_one();
}

bool Connection::queue_full_locked() const {
  const uint64_t max = server_.options.limits.max_inflight;
  const uint64_t n = queue_.size();
  // While the backend waits on the client's store, the client's answer must
  // get through: up to twice the limit then.
  return (n >= max && kv_waiting_ == 0) || n >= 2 * max || queued_bytes_ >= kMaxQueuedPayloadBytes;
}

// Reading again once the queue and the unsent bytes have room (on the strand).
void Connection::resume() {
  if (!paused_ || phase_ != Phase::session) return;
  {
    std::lock_guard lock(queue_mutex_);
    if (queue_full_locked()) return;
    reader_waits_ = false;
  }
  {
    std::lock_guard lock(send_mutex_);
    if (unsent_ >= kMaxUnsentBytes) return;
  }
  paused_ = false;
  pump();
}

void Connection::work() {
  std::string goodbye;
  std::vector<uint8_t> handled;  // the last request's message, for the reader to reuse
  for (;;) {
    Request r;
    {
      std::unique_lock lock(queue_mutex_);
      if (handled.capacity() != 0 && handled.capacity() <= kMaxSpareMessageBytes &&
          spare_messages_.size() < kSpareMessages)
        spare_messages_.push_back(std::move(handled));
      if (memory_waits_) {  // the last request's payload is freed: the reader may find room now
        memory_waits_ = false;
        asio::post(strand_, [self = shared_from_this()] { self->resume(); });
      }
      worker_idle_ = true;
      if (queue_.empty() && large_spares_.load()) {
        // Nothing to do: large spare buffers go back (the next large write
        // is read straight into its buffer while the worker is idle).
        lock.unlock();
        drop_large_spares();
        lock.lock();
      }
      queue_cv_.wait(lock, [&] { return stop_worker_ || !queue_.empty(); });
      worker_idle_ = false;
      if (stop_worker_) break;
      r = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= r.payload.size() + r.message.size();
      if (reader_waits_ && !queue_full_locked()) {
        reader_waits_ = false;
        asio::post(strand_, [self = shared_from_this()] { self->resume(); });
      }
    }
    if (r.goodbye) {
      goodbye = "said goodbye";
      break;
    }
    try {
      const wire::Message* m = wire::GetMessage(r.message.data());  // verified by the reader
      if (!r.refusal.empty()) {
        session_->fail(*m, BP_STATUS_OUT_OF_MEMORY, r.refusal);
      } else {
        session_->handle(*m, std::span<const uint8_t>(r.payload.data(), r.payload.size()));
      }
    } catch (const std::exception& e) {
      log_line(LogLevel::error,
               "session " + std::to_string(session_->id()) + ": unexpected error: " + e.what());
    }
    give_spare(std::move(r.payload));
    handled = std::move(r.message);
  }
  {
    std::lock_guard lock(queue_mutex_);
    queue_.clear();
  }
  freed_buffers_ = session_->buffers();
  freed_bytes_ = session_->bytes();
  session_->release();
  asio::post(strand_, [self = shared_from_this(), goodbye] {
    self->release_slot();  // before the socket closes: a client that sees EOF sees a freed session
    if (!goodbye.empty()) self->close(LogLevel::info, goodbye);
    self->finish();
  });
}

ByteBuffer Connection::take_spare() {
  std::lock_guard lock(spare_mutex_);
  if (spares_.empty()) return {};
  ByteBuffer b = std::move(spares_.back());
  spares_.pop_back();
  return b;
}

void Connection::give_spare(ByteBuffer b) {
  if (b.capacity() == 0 || b.capacity() > kMaxSpareBytes) return;
  std::lock_guard lock(spare_mutex_);
  if (spares_.size() >= kSpareBuffers) return;
  if (b.capacity() > kDirectWriteBytes) large_spares_ = true;
  spares_.push_back(std::move(b));
}

// Sender: frees the spare payload buffers (the session's allocation found no room).
void Connection::release_spares() {
  std::vector<ByteBuffer> dropped;
  std::lock_guard lock(spare_mutex_);
  dropped.swap(spares_);
  large_spares_ = false;
}

void Connection::drop_large_spares() {
  std::vector<ByteBuffer> dropped;
  std::lock_guard lock(spare_mutex_);
  for (ByteBuffer& b : spares_)
    if (b.capacity() > kDirectWriteBytes) dropped.push_back(std::move(b));
  std::erase_if(spares_, [](const ByteBuffer& b) { return b.capacity() == 0; });
  large_spares_ = false;
}

}  // namespace backplane::remote::server
