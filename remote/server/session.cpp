// A client's session: its requests run on the hosted backend after every field
// was validated; pipelined failures are kept (sticky) for the next
// synchronising request; everything the client held is freed at the end.
// This file routes and dispatches the requests and keeps the sticky failure;
// the requests themselves are in session_buffers.cpp (buffers),
// session_ops.cpp (execute, synchronize, device memory) and session_comms.cpp
// (communicators and collectives).
#include "remote/server/session.hpp"
#include <backplane/trace.hpp>
#include "remote/wire/auth.hpp"

#include "remote/server/messages.hpp"
#include "remote/server/session_internal.hpp"
#include "remote/server/validate.hpp"

#include <new>
#include <utility>

namespace backplane::remote::server {

namespace {

// How a request is named in failures: "execute add (request 17) on device 0".
std::string label(const wire::Message& m) {
  const std::string req = " (request " + std::to_string(m.id()) + ")";
  switch (m.body_type()) {
    case wire::Body::Alloc: {
      const auto* r = m.body_as_Alloc();
      return "buffer_alloc" + req + " of " + std::to_string(r->size()) + " bytes for buffer " +
             std::to_string(r->buffer()) + " on device " + std::to_string(r->device());
    }
    case wire::Body::Free:
      return "buffer_free" + req + " of buffer " + std::to_string(m.body_as_Free()->buffer());
    case wire::Body::Write: {
      const auto* r = m.body_as_Write();
      return "buffer_write" + req + " of " + std::to_string(r->size()) + " bytes at offset " +
             std::to_string(r->offset()) + " into buffer " + std::to_string(r->buffer());
    }
    case wire::Body::Read: {
      const auto* r = m.body_as_Read();
      return "buffer_read" + req + " of " + std::to_string(r->size()) + " bytes at offset " +
             std::to_string(r->offset()) + " from buffer " + std::to_string(r->buffer());
    }
    case wire::Body::Execute: {
      const auto* r = m.body_as_Execute();
      return "execute " + op_text(r->op()) + req + " on device " + std::to_string(r->device());
    }
    case wire::Body::Synchronize:
      return "synchronize" + req + " of device " + std::to_string(m.body_as_Synchronize()->device());
    case wire::Body::MemoryQuery:
      return "device_memory" + req + " of device " + std::to_string(m.body_as_MemoryQuery()->device());
    case wire::Body::CommCreate: {
      const auto* r = m.body_as_CommCreate();
      return "comm_create" + req + " of communicator " + std::to_string(r->comm()) + " (rank " +
             std::to_string(r->rank()) + " of " + std::to_string(r->world_size()) + ") on device " +
             std::to_string(r->device());
    }
    case wire::Body::CommDestroy:
      return "comm_destroy" + req + " of communicator " + std::to_string(m.body_as_CommDestroy()->comm());
    case wire::Body::Collective: {
      const auto* r = m.body_as_Collective();
      return collective_text(r->kind()) + req + " on communicator " + std::to_string(r->comm());
    }
    default:
      return std::string(wire::body_name(m.body_type())) + req;
  }
}

bool pipelined(wire::Body type) {
  return type == wire::Body::Alloc || type == wire::Body::Free || type == wire::Body::Write ||
         type == wire::Body::Execute;
}

// FlatBuffers' Verifier (2.0.8) checks a vector's length field for alignment
// but not its elements: an int64 vector can sit 4 bytes off its alignment,
// and reading it is undefined behaviour. A builder never writes that; only a
// forged message does.
bool aligned(const wire::TensorDesc* t) {
  auto ok = [](const flatbuffers::Vector<int64_t>* v) {
    // An empty vector's data pointer need not be aligned (FlatBuffers aligns
    // only vectors with elements); nothing is read through it.
    return v == nullptr || v->size() == 0 || reinterpret_cast<uintptr_t>(v->data()) % alignof(int64_t) == 0;
  };
  return t == nullptr || (ok(t->shape()) && ok(t->strides()));
}

bool aligned(const flatbuffers::Vector<flatbuffers::Offset<wire::TensorDesc>>* v) {
  if (v == nullptr) return true;
  for (const wire::TensorDesc* t : *v)
    if (!aligned(t)) return false;
  return true;
}

bool aligned(const wire::Message& m) {
  if (const auto* e = m.body_as_Execute()) return aligned(e->inputs()) && aligned(e->outputs());
  if (const auto* c = m.body_as_Collective()) return aligned(c->input()) && aligned(c->output());
  return true;
}

}  // namespace

std::string no_room_text(const Counters& c, uint64_t wanted, uint64_t cap, const char* doing) {
  const uint64_t held = c.memory.held();
  const auto buffers = static_cast<uint64_t>(std::max<int64_t>(0, c.bytes.load()));
  return std::string(doing) + " " + std::to_string(wanted) + " bytes would pass the server's limit of " +
         std::to_string(cap) +
         " bytes for all sessions together (backplane serve --max-total-bytes): it holds " +
         std::to_string(held) + " (" + std::to_string(buffers) + " in buffers, " +
         std::to_string(held > buffers ? held - buffers : 0) +
         " in writes, replies and reads in transit); free buffers, move less at once, or try later";
}

std::optional<Route> route(const wire::Message& m, uint64_t payload_bytes, std::string& why) {
  const wire::Body type = m.body_type();
  const char* name = wire::body_name(type);  // a std::string only when refusing (every message comes here)
  const uint64_t expected_payload = type == wire::Body::Write ? m.body_as_Write()->size() : 0;
  std::optional<Route> r;
  switch (type) {
    case wire::Body::Alloc:
    case wire::Body::Free:
    case wire::Body::Write:
    case wire::Body::Read:
    case wire::Body::Execute:
    case wire::Body::Synchronize:
    case wire::Body::MemoryQuery:
    case wire::Body::CommCreate:
    case wire::Body::CommDestroy:
    case wire::Body::Collective:
      r = Route::worker;
      break;
    case wire::Body::CommAbort:
      r = Route::abort;
      break;
    case wire::Body::Ping:
      r = Route::ping;
      break;
    case wire::Body::KvReply:
      r = Route::kv_reply;
      break;
    case wire::Body::Goodbye:
      r = Route::goodbye;
      break;
    case wire::Body::Hello:
    case wire::Body::Proof:
      why = std::string("sent a ") + name + " after its handshake had finished";
      return std::nullopt;
    case wire::Body::Challenge:
    case wire::Body::Welcome:
    case wire::Body::Reply:
    case wire::Body::ReadReply:
    case wire::Body::MemoryReply:
    case wire::Body::Fatal:
    case wire::Body::KvRequest:
      why = std::string("sent a ") + name + ", which only a server sends";
      return std::nullopt;
    default:
      why = "sent a message of unknown type " + std::to_string(static_cast<int>(type)) +
            " (a newer protocol? this server speaks version " + std::to_string(wire::kProtocolVersion) + ")";
      return std::nullopt;
  }
  if (!aligned(m)) {
    why = std::string("sent a ") + name + " whose shape or strides are not 8-byte aligned (a forged message)";
    return std::nullopt;
  }
  if (payload_bytes != expected_payload) {
    why = std::string("sent a ") + name + " whose frame carries " + std::to_string(payload_bytes) +
          " payload bytes" +
          (type == wire::Body::Write ? " but whose size field says " + std::to_string(expected_payload)
                                     : std::string(" (only a Write carries a payload)"));
    return std::nullopt;
  }
  return r;
}

Session::Session(uint64_t id, std::shared_ptr<const Hosted> hosted, const ServerLimits& limits,
                 Counters& counters, Sender& sender)
    : id_(id),
      hosted_(std::move(hosted)),
      api_(hosted_->api()),
      limits_(limits),
      counters_(counters),
      sender_(sender) {}

Session::~Session() { release(); }

void Session::handle(const wire::Message& m, std::span<const uint8_t> payload) {
  if (released_) return;
  if (trace::active()) [[unlikely]] {
    handle_traced(m, payload);
    return;
  }
  handle_now(m, payload);
}

// The request's run as a span, and the end of the flow its client began.
void Session::handle_traced(const wire::Message& m, std::span<const uint8_t> payload) {
  trace::Event e;
  e.category = "remote";
  e.name = wire::EnumNameBody(m.body_type());
  e.start_ns = trace::now_ns();
  handle_now(m, payload);
  e.end_ns = trace::now_ns();
  e.bytes = payload.empty() ? -1 : static_cast<int64_t>(payload.size());
  e.number_key = "request";
  e.number = static_cast<int64_t>(m.id());
  e.flow = trace::Event::Flow::in;
  e.flow_id = wire::trace_flow_id(trace_flow_key_, m.id());
  trace::record(e);
}

void Session::handle_now(const wire::Message& m, std::span<const uint8_t> payload) {
  if (!pipelined(m.body_type())) {
    run(m, payload);  // answers on its own
    return;
  }
  try {
    run(m, payload);
  } catch (const Refused& e) {
    fail_pipelined(e.code(), label(m) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    fail_pipelined(BP_STATUS_OUT_OF_MEMORY, label(m) + ": the server ran out of memory");
  } catch (const std::exception& e) {
    fail_pipelined(BP_STATUS_INTERNAL, label(m) + ": unexpected error in the server: " + e.what());
  }
}

void Session::run(const wire::Message& m, std::span<const uint8_t> payload) {
  const uint64_t id = m.id();
  switch (m.body_type()) {
    case wire::Body::Alloc:
      return alloc(*m.body_as_Alloc());
    case wire::Body::Free:
      return free(*m.body_as_Free());
    case wire::Body::Write:
      return write(*m.body_as_Write(), payload);
    case wire::Body::Execute:
      return execute(*m.body_as_Execute());
    default:
      break;
  }
  // Synchronising: the reply carries the sticky failure first, else this request's result.
  int32_t code = BP_STATUS_OK;
  std::string text;
  auto fail = [&](int32_t c, const std::string& why) {  // the request's label only when it fails
    code = c;
    text = label(m) + ": " + why;
  };
  try {
    switch (m.body_type()) {
      case wire::Body::Read:
        return read(id, *m.body_as_Read());
      case wire::Body::Synchronize:
        return synchronize(id, *m.body_as_Synchronize());
      case wire::Body::MemoryQuery:
        return memory(id, *m.body_as_MemoryQuery());
      case wire::Body::CommCreate:
        return comm_create(id, *m.body_as_CommCreate());
      case wire::Body::CommDestroy:
        return comm_destroy(id, *m.body_as_CommDestroy());
      case wire::Body::Collective:
        return collective(id, *m.body_as_Collective());
      default:
        fail(BP_STATUS_INVALID_ARGUMENT, "not a request the session runs");
    }
  } catch (const Refused& e) {
    fail(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    fail(BP_STATUS_OUT_OF_MEMORY, "the server ran out of memory");
  } catch (const std::exception& e) {
    fail(BP_STATUS_INTERNAL, std::string("unexpected error in the server: ") + e.what());
  }
  auto [c, t] = outcome(code, std::move(text));
  switch (m.body_type()) {
    case wire::Body::Read:
      sender_.send(encode_read_reply(id, c, t, 0));
      break;
    case wire::Body::MemoryQuery:
      sender_.send(encode_memory_reply(id, c, t, 0, 0));
      break;
    default:
      sender_.send(encode_reply(id, c, t));
  }
}

const HostedDevice& Session::device(int32_t index) const {
  if (index < 0 || index >= hosted_->device_count())
    refuse("device " + std::to_string(index) + " does not exist: this server hosts " +
           std::to_string(hosted_->device_count()) + " device(s) of backend '" + hosted_->backend_name() +
           "'");
  return hosted_->devices()[static_cast<std::size_t>(index)];
}

void Session::fail_pipelined(int32_t code, std::string text) {
  if (sticky_) {
    ++sticky_->later;
    return;
  }
  sticky_ = Sticky{code, std::move(text), 0};
}

std::pair<int32_t, std::string> Session::outcome(int32_t code, std::string text) {
  if (!sticky_) return {code, std::move(text)};
  Sticky s = std::move(*sticky_);
  sticky_.reset();
  std::string out = std::move(s.text);
  if (s.later > 0) out += " (and " + std::to_string(s.later) + " later pipelined request(s) failed too)";
  if (code != BP_STATUS_OK) out += "; then " + text;
  return {s.code, std::move(out)};
}

void Session::release() noexcept {
  if (released_) return;
  released_ = true;
  abort_all();
  std::map<uint64_t, std::shared_ptr<Comm>> comms;
  {
    std::lock_guard lock(comms_mutex_);
    comms.swap(comms_);
  }
  for (const auto& [id, comm] : comms) destroy_comm(comm);
  for (const auto& [id, b] : buffers_) {
    const PluginStatus freed = free_buffer(b);  // a backend that cannot free: nothing to retry
  }
  buffers_.clear();
  std::vector<uint8_t>().swap(staging_);
  counters_.memory.give(staging_held_);
  staging_held_ = 0;
}

void Session::fail(const wire::Message& m, int32_t code, const std::string& why) {
  if (released_) return;
  fail_pipelined(code, label(m) + ": " + why);
}

}  // namespace backplane::remote::server
