// A connection's reader (connection.hpp): frames out of a buffer that many
// small frames share. Headers are checked against the phase's limits,
// messages verified and routed; a Write's payload is staged for the worker
// or read straight into the hosted buffer, and dropped (the Write failing)
// when the server's memory account has no room for it.
#include "remote/server/connection.hpp"

#include "remote/server/messages.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>

namespace backplane::remote::server {

namespace {

// A payload that is not in the reader's buffer yet is read straight into its
// own buffer, which grows as bytes arrive (64 KiB, then doubling): a frame
// that announces a gigabyte and sends a byte costs 64 KiB.
constexpr std::size_t kFirstPayloadChunk = 64 * 1024;

}  // namespace

using wire::whole_transfer;

// Runs every complete frame in inbuf_, then reads more (unless paused).
void Connection::pump() {
  try {
    while (phase_ != Phase::closed && phase_ != Phase::draining && phase_ != Phase::tls) {
      if (paused_) return;
      const std::size_t avail = in_end_ - in_begin_;
      if (part_ == Part::header) {
        if (avail < wire::kHeaderBytes) break;
        if (!on_header()) return;
        continue;
      }
      if (part_ == Part::message) {
        if (avail < header_.message_bytes) break;
        message_.assign(inbuf_.begin() + static_cast<std::ptrdiff_t>(in_begin_),
                        inbuf_.begin() + static_cast<std::ptrdiff_t>(in_begin_ + header_.message_bytes));
        in_begin_ += header_.message_bytes;
        if (!on_message()) return;
        continue;
      }
      if (part_ == Part::discard) {  // a Write refused for want of memory: its bytes are dropped
        const std::size_t drop = static_cast<std::size_t>(std::min<uint64_t>(avail, discard_left_));
        in_begin_ += drop;
        discard_left_ -= drop;
        if (discard_left_ != 0) break;
        part_ = Part::header;
        queue(Request{std::move(message_), {}, false, std::move(refusal_)});
        refusal_.clear();
        continue;
      }
      // Part::payload: what is buffered already, then straight into the payload buffer.
      const std::size_t take = std::min<std::size_t>(avail, header_.payload_bytes - payload_.size());
      if (take != 0) {  // an empty payload buffer has no storage yet
        if (!stage(payload_.size() + take)) {
          no_room();
          return;
        }
        std::memcpy(payload_.data() + payload_.size(), inbuf_.data() + in_begin_, take);
        payload_.set_size(payload_.size() + take);
      }
      in_begin_ += take;
      if (payload_.size() < header_.payload_bytes) {
        read_payload();
        return;
      }
      on_frame_done();
    }
    if (phase_ == Phase::closed || phase_ == Phase::draining || phase_ == Phase::tls || paused_) return;
    read_more();
  } catch (const std::bad_alloc&) {
    fatal(BP_STATUS_OUT_OF_MEMORY, "the server ran out of memory reading a frame");
  } catch (const std::exception& e) {
    fatal(BP_STATUS_INTERNAL, std::string("unexpected error in the server: ") + e.what());
  }
}

void Connection::read_more() {
  // Room for the next read, and for the whole message when its header is in.
  const std::size_t need =
      part_ == Part::message ? std::max<std::size_t>(header_.message_bytes, kReadChunk) : kReadChunk;
  if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  if (inbuf_.size() - in_begin_ < need) {
    std::memmove(inbuf_.data(), inbuf_.data() + in_begin_, in_end_ - in_begin_);
    in_end_ -= in_begin_;
    in_begin_ = 0;
    if (inbuf_.size() < need) inbuf_.resize(need);
  }
  arm_idle();
  auto handler = [self = shared_from_this()](const error_code& ec, std::size_t n) {
    if (self->phase_ == Phase::closed) return;
    if (ec) {
      self->on_read_error(ec);
      return;
    }
    self->in_end_ += n;
    self->pump();
  };
  const auto room = asio::buffer(inbuf_.data() + in_end_, inbuf_.size() - in_end_);
  if (stream_.tls()) {
    stream_.ssl().async_read_some(room, std::move(handler));
  } else {
    stream_.socket().async_read_some(room, std::move(handler));
  }
}

void Connection::read_payload() {
  const uint64_t total = header_.payload_bytes;
  const std::size_t got = payload_.size();
  if (direct_candidate_ && worker_waiting()) {
    // Every earlier request has run: the rest of the payload may go straight
    // into the buffer (or never will, if the Write cannot be done directly).
    direct_candidate_ = false;
    const wire::Message* m = wire::GetMessage(message_.data());  // verified in on_message
    if (const auto target = session_->direct_write(*m->body_as_Write())) {
      if (got != 0) std::memcpy(target->data(), payload_.data(), got);
      // Freed, not kept as a spare: the worker is idle, and an idle session
      // holds nothing but its buffers against --max-total-bytes.
      payload_ = ByteBuffer();
      if (read_direct(target->subspan(got))) pump();
      return;
    }
  }
  std::size_t target =
      payload_.capacity() >= total ? total : std::min<uint64_t>(total, std::max(kFirstPayloadChunk, got * 2));
  if (!stage(target)) {
    no_room();
    return;
  }
  // A step at a time while the worker may still free up for a direct read.
  if (direct_candidate_) target = std::min<uint64_t>(target, got + kStagingStep);
  arm_idle();
  auto handler = [self = shared_from_this(), target](const error_code& ec, std::size_t) {
    if (self->phase_ == Phase::closed) return;
    if (ec) {
      self->on_read_error(ec);
      return;
    }
    self->payload_.set_size(target);
    if (target < self->header_.payload_bytes) {
      self->read_payload();
      return;
    }
    self->on_frame_done();
    self->pump();
  };
  const auto room = asio::buffer(payload_.data() + got, target - got);
  if (stream_.tls()) {
    asio::async_read(stream_.ssl(), room, whole_transfer, std::move(handler));
  } else {
    asio::async_read(stream_.socket(), room, whole_transfer, std::move(handler));
  }
}

// Room in the server's memory account for `n` bytes of the payload being
// staged, after what this connection keeps for reuse if need be.
bool Connection::stage(std::size_t n) {
  MemoryAccount& account = server_.counters.memory;
  const uint64_t cap = server_.options.limits.max_total_bytes;
  if (payload_.reserve(n, account, cap)) return true;
  release_spares();
  return payload_.reserve(n, account, cap);
}

// No room to stage more of this Write's payload. While earlier requests
// hold staged payloads, reading waits for the worker to run them; once
// nothing else is held the payload goes straight into the buffer if it
// can, else (or while the worker waits on the client's store) its bytes
// are dropped and the Write fails with out_of_memory in its place: the
// session and the server go on.
void Connection::no_room() {
  bool idle = false;
  {
    std::lock_guard lock(queue_mutex_);
    idle = worker_idle_ && queue_.empty();
    // While the backend waits on the client's store, the client's answer,
    // behind this payload, must get through: then the Write fails instead.
    if (!idle && kv_waiting_ == 0) {
      memory_waits_ = true;
      paused_ = true;
      idle_timer_.cancel();  // the client is waiting for us, not idle
      return;
    }
  }
  direct_candidate_ = false;
  const std::size_t got = payload_.size();
  const wire::Message* m = wire::GetMessage(message_.data());  // verified in on_message
  if (idle) {
    if (const auto target = session_->direct_write(*m->body_as_Write())) {
      if (got != 0) std::memcpy(target->data(), payload_.data(), got);
      payload_ = ByteBuffer();
      if (read_direct(target->subspan(got))) pump();
      return;
    }
  }
  refusal_ = no_room_text(server_.counters, header_.payload_bytes, server_.options.limits.max_total_bytes,
                          "staging a write of");
  discard_left_ = header_.payload_bytes - got;
  payload_ = ByteBuffer();
  part_ = Part::discard;
  pump();
}

void Connection::on_read_error(const error_code& ec) {
  const bool mid_frame = part_ != Part::header || in_end_ != in_begin_;
  if (session_ == nullptr) {
    close(LogLevel::warning, "closed the connection during the handshake (" + ec.message() + ")");
  } else if (ec == asio::error::eof && !mid_frame) {
    close(LogLevel::info, "disconnected");
  } else {
    close(LogLevel::warning, std::string(mid_frame ? "sent a truncated frame" : "lost its connection") +
                                 " (" + ec.message() + ")");
  }
}

// Checks the header against the phase's limits; false when the connection is done.
bool Connection::on_header() {
  const bool handshake = phase_ != Phase::session;
  const uint64_t max_message = handshake ? kHandshakeMessageBytes : wire::kDefaultMaxMessageBytes;
  const uint64_t max_payload = handshake ? 0 : server_.options.limits.max_frame_bytes;
  std::string why;
  const std::span<const uint8_t, wire::kHeaderBytes> bytes(inbuf_.data() + in_begin_, wire::kHeaderBytes);
  const std::optional<wire::Header> h = wire::decode_header(bytes, max_message, max_payload, why);
  if (!h) {
    fatal(BP_STATUS_INVALID_ARGUMENT,
          "protocol error: " + why + (handshake && max_payload == 0 ? " (during the handshake)" : ""));
    return false;
  }
  in_begin_ += wire::kHeaderBytes;
  header_ = *h;
  part_ = Part::message;
  return true;
}

// A whole message is in message_; false when reading must stop here.
bool Connection::on_message() {
  std::string why;
  const wire::Message* m = wire::verify_message(message_, why);
  if (m == nullptr) {
    fatal(BP_STATUS_INVALID_ARGUMENT, "protocol error: " + why);
    return false;
  }
  if (phase_ == Phase::hello || phase_ == Phase::proof) {
    part_ = Part::header;
    if (phase_ == Phase::hello) {
      on_hello(*m);
    } else {
      on_proof(*m);
    }
    return phase_ == Phase::proof || phase_ == Phase::session;
  }
  const std::optional<Route> r = route(*m, header_.payload_bytes, why);
  if (!r) {
    fatal(BP_STATUS_INVALID_ARGUMENT, "protocol error: the client " + why);
    return false;
  }
  switch (*r) {
    case Route::worker:
      if (header_.payload_bytes == 0) {
        part_ = Part::header;
        queue(Request{std::move(message_), {}, false, {}});
        return !paused_;
      }
      direct_candidate_ = false;
      if (header_.payload_bytes >= kDirectWriteBytes) {
        if (!worker_waiting()) {
          direct_candidate_ = true;  // read_payload() asks again between steps
        } else if (const auto target = session_->direct_write(*m->body_as_Write())) {
          return read_direct(*target);
        }
      }
      payload_ = take_spare();
      payload_.set_size(0);
      part_ = Part::payload;
      return true;
    case Route::abort:
      part_ = Part::header;
      session_->abort(m->body_as_CommAbort()->comm());
      return true;
    case Route::ping:
      part_ = Part::header;
      // A client that pings without reading the replies stops being read.
      if (send_now(encode_reply(m->id(), BP_STATUS_OK, "")) >= kMaxUnsentBytes) {
        paused_ = true;
        idle_timer_.cancel();
        return false;
      }
      return true;
    case Route::kv_reply:
      part_ = Part::header;
      on_kv_reply(m->id(), *m->body_as_KvReply());
      return true;
    case Route::goodbye:
      part_ = Part::header;
      phase_ = Phase::draining;  // nothing more is read; the worker finishes what is queued
      queue(Request{{}, {}, true, {}});
      return false;
  }
  return true;
}

// True while the worker waits for work and none is queued: then nothing
// touches the session's buffers but this strand.
bool Connection::worker_waiting() {
  std::lock_guard lock(queue_mutex_);
  return worker_idle_ && queue_.empty();
}

// A Write's payload straight into the buffer's memory: the part already
// buffered, then the rest from the socket. The write is done when the bytes
// are in. The worker may not free the session's buffers until the read's
// handler has run (close() leaves that to the handler).
bool Connection::read_direct(std::span<uint8_t> target) {
  part_ = Part::header;
  const std::size_t take = std::min<std::size_t>(in_end_ - in_begin_, target.size());
  if (take != 0) std::memcpy(target.data(), inbuf_.data() + in_begin_, take);
  in_begin_ += take;
  if (take == target.size()) return true;
  direct_read_ = true;
  arm_idle();
  auto handler = [self = shared_from_this()](const error_code& ec, std::size_t) {
    self->direct_read_ = false;
    if (self->phase_ == Phase::closed) {
      self->stop_worker();
      return;
    }
    if (ec) {
      self->on_read_error(ec);
      return;
    }
    self->pump();
  };
  const auto room = asio::buffer(target.data() + take, target.size() - take);
  if (stream_.tls()) {
    asio::async_read(stream_.ssl(), room, whole_transfer, std::move(handler));
  } else {
    asio::async_read(stream_.socket(), room, whole_transfer, std::move(handler));
  }
  return false;
}

void Connection::on_frame_done() {
  part_ = Part::header;
  direct_candidate_ = false;
  queue(Request{std::move(message_), std::move(payload_), false, {}});
}

void Connection::on_kv_reply(uint64_t id, const wire::KvReply& r) {
  KvResult result;
  result.status = r.status();
  if (r.message() != nullptr) result.message = r.message()->str();
  if (r.value() != nullptr) result.value.assign(r.value()->begin(), r.value()->end());
  if (result.status != BP_STATUS_OK && result.message.empty()) result.message = "failed (no message)";
  {
    std::lock_guard lock(kv_mutex_);
    const auto it = kv_pending_.find(id);
    if (it == kv_pending_.end() || it->second.has_value()) return;  // late: the request timed out
    it->second = std::move(result);
  }
  kv_cv_.notify_all();
}

void Connection::arm_idle() {
  if (phase_ != Phase::session) return;  // the handshake timer bounds the handshake
  const milliseconds timeout = server_.options.limits.idle_timeout;
  idle_timer_.expires_after(timeout);
  idle_timer_.async_wait([self = shared_from_this(), timeout](const error_code& ec) {
    if (ec || self->phase_ != Phase::session || self->paused_) return;
    self->fatal(BP_STATUS_TIMEOUT, "the session sent nothing for " + ms_text(timeout) +
                                       " (the server's idle timeout, --idle-timeout-ms); closed");
  });
}

}  // namespace backplane::remote::server
