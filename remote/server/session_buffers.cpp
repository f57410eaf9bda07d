// A session's buffers: buffer_alloc, buffer_free, buffer_write (and the
// write straight from the socket into a host-visible buffer) and
// buffer_read, with the session's and the server's accounts of their bytes.
#include "remote/server/messages.hpp"
#include "remote/server/session.hpp"
#include "remote/server/session_internal.hpp"

#include <utility>

namespace backplane::remote::server {

namespace {

// [offset, offset + size) inside a buffer of `capacity` bytes, without overflow.
bool inside(uint64_t offset, uint64_t size, uint64_t capacity) {
  return offset <= capacity && size <= capacity - offset;
}

std::string range_text(uint64_t offset, uint64_t size, uint64_t id, uint64_t capacity) {
  return "bytes at offset " + std::to_string(offset) + " (" + std::to_string(size) +
         " of them) lie outside buffer " + std::to_string(id) + " of " + std::to_string(capacity) + " bytes";
}

}  // namespace

const Session::Buffer& Session::buffer(uint64_t id) const {
  const auto it = buffers_.find(id);
  if (it == buffers_.end())
    refuse("buffer " + std::to_string(id) +
           " is not a buffer of this session (never allocated, already freed, or another session's)");
  return it->second;
}

void Session::alloc(const wire::Alloc& r) {
  device(r.device());
  const uint64_t id = r.buffer();
  if (id == 0) refuse("buffer id 0 is not valid (the client's buffer ids are nonzero)");
  if (buffers_.count(id) != 0)
    refuse("buffer id " + std::to_string(id) + " is already in use in this session");
  if (buffers_.size() >= limits_.max_buffers)
    refuse("this session already holds " + std::to_string(buffers_.size()) +
               " buffers, the server's limit (backplane serve --max-buffers); free some first",
           BP_STATUS_OUT_OF_MEMORY);
  if (r.size() > limits_.max_session_bytes - bytes_)
    refuse("this session holds " + std::to_string(bytes_) + " bytes; " + std::to_string(r.size()) +
               " more would pass the server's limit of " + std::to_string(limits_.max_session_bytes) +
               " bytes per session (backplane serve --max-session-bytes)",
           BP_STATUS_OUT_OF_MEMORY);
  // The server-wide account, reserved before the backend allocates so that
  // concurrent sessions can never pass it together. What the connection
  // keeps for reuse goes first.
  if (!counters_.memory.take(r.size(), limits_.max_total_bytes)) {
    sender_.release_spares();
    if (!counters_.memory.take(r.size(), limits_.max_total_bytes))
      refuse(no_room_text(counters_, r.size(), limits_.max_total_bytes, "allocating"),
             BP_STATUS_OUT_OF_MEMORY);
  }
  struct Reservation {  // given back unless the allocation is kept
    MemoryAccount& account;
    uint64_t size;
    bool kept = false;
    ~Reservation() {
      if (!kept) account.give(size);
    }
  } reserved{counters_.memory, r.size()};
  // The slot first, so that a failure to record it cannot leak the allocation.
  auto [slot, inserted] = buffers_.try_emplace(id);
  bp_buffer_alloc_args a{};
  a.struct_size = BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.device = r.device();
  a.size = r.size();
  PluginStatus s(api_, api_.buffer_alloc(&a));
  if (!s.ok()) {
    buffers_.erase(slot);
    check(s);
  }
  slot->second = Buffer{a.buffer, r.size(), r.device()};
  reserved.kept = true;
  bytes_ += r.size();
  counters_.bytes += static_cast<int64_t>(r.size());
  ++counters_.buffers;
}

// Takes `b` off the session's accounts and frees it on the backend; the
// backend's status says whether that worked (nothing can be retried).
PluginStatus Session::free_buffer(const Buffer& b) noexcept {
  bytes_ -= b.size;
  counters_.bytes -= static_cast<int64_t>(b.size);
  counters_.memory.give(b.size);
  --counters_.buffers;
  bp_buffer_free_args a{};
  a.struct_size = BP_BUFFER_FREE_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.buffer = b.handle;
  return PluginStatus(api_, api_.buffer_free(&a));
}

void Session::free(const wire::Free& r) {
  const Buffer b = buffer(r.buffer());
  buffers_.erase(r.buffer());
  check(free_buffer(b));
}

void Session::write(const wire::Write& r, std::span<const uint8_t> payload) {
  const Buffer& b = buffer(r.buffer());
  if (!inside(r.offset(), r.size(), b.size)) refuse(range_text(r.offset(), r.size(), r.buffer(), b.size));
  if (payload.size() != r.size())
    refuse("the frame carries " + std::to_string(payload.size()) + " bytes, not " + std::to_string(r.size()));
  bp_buffer_copy_args a{};
  a.struct_size = BP_BUFFER_COPY_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.buffer = b.handle;
  a.offset = r.offset();
  a.size = r.size();
  a.src = payload.data();
  check(PluginStatus(api_, api_.buffer_write(&a)));
}

std::optional<std::span<uint8_t>> Session::direct_write(const wire::Write& r) noexcept {
  const auto it = buffers_.find(r.buffer());
  if (released_ || it == buffers_.end() || api_.buffer_pointer == nullptr) return std::nullopt;
  const Buffer& b = it->second;
  if (!hosted_->devices()[static_cast<std::size_t>(b.device)].has(BP_CAP_HOST_VISIBLE) ||
      !inside(r.offset(), r.size(), b.size))
    return std::nullopt;
  bp_buffer_pointer_args p{};
  p.struct_size = BP_BUFFER_POINTER_ARGS_STRUCT_SIZE;
  p.plugin = hosted_->plugin();
  p.buffer = b.handle;
  if (!PluginStatus(api_, api_.buffer_pointer(&p)).ok() || p.data == nullptr) return std::nullopt;
  return std::span<uint8_t>(static_cast<uint8_t*>(p.data) + r.offset(), r.size());
}

void Session::read(uint64_t id, const wire::Read& r) {
  if (sticky_) {  // the read would be of data the failed work should have made: report instead
    auto [c, t] = outcome(BP_STATUS_OK, "");
    sender_.send(encode_read_reply(id, c, t, 0));
    return;
  }
  const Buffer& b = buffer(r.buffer());
  if (!inside(r.offset(), r.size(), b.size)) refuse(range_text(r.offset(), r.size(), r.buffer(), b.size));
  if (r.size() > limits_.max_frame_bytes)
    refuse("a read of " + std::to_string(r.size()) + " bytes is larger than the server's frame limit of " +
           std::to_string(limits_.max_frame_bytes) +
           " bytes (backplane serve --max-frame-bytes); read in parts");
  const HostedDevice& dev = hosted_->devices()[static_cast<std::size_t>(b.device)];
  // A host-visible buffer is sent straight from its memory: buffer_pointer is
  // a synchronising point, and the send completes before the next request runs.
  if (dev.has(BP_CAP_HOST_VISIBLE) && api_.buffer_pointer != nullptr) {
    bp_buffer_pointer_args p{};
    p.struct_size = BP_BUFFER_POINTER_ARGS_STRUCT_SIZE;
    p.plugin = hosted_->plugin();
    p.buffer = b.handle;
    check(PluginStatus(api_, api_.buffer_pointer(&p)));
    if (p.data != nullptr || r.size() == 0) {
      const auto* base = static_cast<const uint8_t*>(p.data);
      sender_.send_with_payload(
          encode_read_reply(id, BP_STATUS_OK, "", r.size()),
          std::span<const uint8_t>(base == nullptr ? base : base + r.offset(), r.size()));
      return;
    }
  }
  if (staging_.size() < r.size()) {
    const uint64_t more = r.size() - staging_held_;
    if (!counters_.memory.take(more, limits_.max_total_bytes)) {
      sender_.release_spares();
      if (!counters_.memory.take(more, limits_.max_total_bytes))
        refuse(no_room_text(counters_, more, limits_.max_total_bytes, "staging a read of"),
               BP_STATUS_OUT_OF_MEMORY);
    }
    staging_held_ += more;
    staging_.resize(r.size());
  }
  bp_buffer_copy_args a{};
  a.struct_size = BP_BUFFER_COPY_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.buffer = b.handle;
  a.offset = r.offset();
  a.size = r.size();
  a.dst = staging_.data();
  check(PluginStatus(api_, api_.buffer_read(&a)));
  sender_.send_with_payload(encode_read_reply(id, BP_STATUS_OK, "", r.size()),
                            std::span<const uint8_t>(staging_.data(), r.size()));
}

}  // namespace backplane::remote::server
