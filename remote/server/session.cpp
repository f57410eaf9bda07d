// A client's session: its requests run on the hosted backend after every field
// was validated; pipelined failures are kept (sticky) for the next
// synchronising request; everything the client held is freed at the end.
#include "remote/server/session.hpp"

#include "remote/server/messages.hpp"
#include "remote/server/validate.hpp"

#include <array>
#include <new>
#include <utility>

namespace backplane::remote::server {

namespace {

[[noreturn]] void refuse(const std::string& message, int32_t code = BP_STATUS_INVALID_ARGUMENT) {
  throw Refused(code, message);
}

void check(const PluginStatus& s) {
  if (!s.ok()) throw Refused(s.code(), s.message());
}

std::string op_text(int32_t op) {
  const char* name = bp_op_name(op);
  return name != nullptr ? std::string(name) : "op " + std::to_string(op);
}

std::string dtype_text(int32_t dtype) {
  const char* name = bp_dtype_name(dtype);
  return name != nullptr ? std::string(name) : "dtype " + std::to_string(dtype);
}

std::string collective_text(wire::CollectiveKind kind) {
  switch (kind) {
    case wire::CollectiveKind::AllReduce:
      return "all_reduce";
    case wire::CollectiveKind::Broadcast:
      return "broadcast";
    case wire::CollectiveKind::AllGather:
      return "all_gather";
    case wire::CollectiveKind::ReduceScatter:
      return "reduce_scatter";
    case wire::CollectiveKind::Barrier:
      return "barrier";
  }
  return "collective " + std::to_string(static_cast<int>(kind));
}

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

// Operand names for messages, without building a string per request.
constexpr std::array<const char*, kMaxOperands> kInputFields{
    "inputs[0]", "inputs[1]", "inputs[2]", "inputs[3]", "inputs[4]", "inputs[5]", "inputs[6]", "inputs[7]"};
constexpr std::array<const char*, kMaxOperands> kOutputFields{"outputs[0]", "outputs[1]", "outputs[2]",
                                                              "outputs[3]", "outputs[4]", "outputs[5]",
                                                              "outputs[6]", "outputs[7]"};

bool pipelined(wire::Body type) {
  return type == wire::Body::Alloc || type == wire::Body::Free || type == wire::Body::Write ||
         type == wire::Body::Execute;
}

// [offset, offset + size) inside a buffer of `capacity` bytes, without overflow.
bool inside(uint64_t offset, uint64_t size, uint64_t capacity) {
  return offset <= capacity && size <= capacity - offset;
}

std::string range_text(uint64_t offset, uint64_t size, uint64_t id, uint64_t capacity) {
  return "bytes at offset " + std::to_string(offset) + " (" + std::to_string(size) +
         " of them) lie outside buffer " + std::to_string(id) + " of " + std::to_string(capacity) + " bytes";
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

const Session::Buffer& Session::buffer(uint64_t id) const {
  const auto it = buffers_.find(id);
  if (it == buffers_.end())
    refuse("buffer " + std::to_string(id) +
           " is not a buffer of this session (never allocated, already freed, or another session's)");
  return it->second;
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

void Session::execute(const wire::Execute& r) {
  const HostedDevice& dev = device(r.device());
  const uint32_t ni = r.inputs() != nullptr ? r.inputs()->size() : 0;
  const uint32_t no = r.outputs() != nullptr ? r.outputs()->size() : 0;
  if (ni > static_cast<uint32_t>(kMaxOperands) || no > static_cast<uint32_t>(kMaxOperands))
    refuse(std::to_string(ni) + " inputs and " + std::to_string(no) + " outputs; an op takes at most " +
           std::to_string(kMaxOperands) + " of each");
  const BufferLookup lookup = [this](uint64_t id) -> std::optional<OwnedBuffer> {
    const auto it = buffers_.find(id);
    if (it == buffers_.end()) return std::nullopt;
    return OwnedBuffer{it->second.handle, it->second.size, it->second.device};
  };
  // The decoded operands live in the session (their shapes keep their
  // storage from one request to the next), so that no allocation is made here.
  std::array<bp_tensor, kMaxOperands> in_t{}, out_t{};
  for (uint32_t i = 0; i < ni; ++i) {
    decode_tensor(r.inputs()->Get(i), r.device(), lookup, kInputFields[i], decoded_inputs_[i]);
    in_t[i] = decoded_inputs_[i].tensor;
  }
  for (uint32_t i = 0; i < no; ++i) {
    decode_tensor(r.outputs()->Get(i), r.device(), lookup, kOutputFields[i], decoded_outputs_[i]);
    out_t[i] = decoded_outputs_[i].tensor;
  }
  const std::span<const bp_tensor> in(in_t.data(), ni);
  const std::span<const bp_tensor> out(out_t.data(), no);
  bp_op_attrs attrs{};
  attrs.struct_size = BP_OP_ATTRS_STRUCT_SIZE;
  attrs.axis = r.axis();
  attrs.dtype = r.dtype();
  attrs.scalar0 = r.scalar0();
  attrs.scalar1 = r.scalar1();
  attrs.seed = r.seed();
  validate_execute(r.op(), in, out, attrs);
  if (out.empty()) refuse(op_text(r.op()) + " has no output");

  // What the device can do: the dtypes it holds, matmul, then supports_op
  // asked as abi.h says (the data operand's dtype; a cast's both dtypes).
  const auto where = [&] {
    return "device " + std::to_string(r.device()) + " of backend '" + hosted_->backend_name() + "'";
  };
  for (const std::span<const bp_tensor> operands : {in, out})
    for (const bp_tensor& t : operands)
      if (!dev.holds(t.dtype))
        refuse(where() + " does not hold " + dtype_text(t.dtype) + " tensors (no '" + dtype_text(t.dtype) +
                   "' capability)",
               BP_STATUS_UNSUPPORTED);
  if (r.op() == BP_OP_MATMUL && !dev.has(BP_CAP_MATMUL))
    refuse(where() + " has no 'matmul' capability", BP_STATUS_UNSUPPORTED);
  const int32_t dtype = r.op() == BP_OP_WHERE ? in[1].dtype : in.empty() ? out[0].dtype : in[0].dtype;
  for (const int32_t d : {dtype, r.op() == BP_OP_CAST ? attrs.dtype : dtype})
    if (!dev.supports(r.op(), d))
      refuse(where() + " does not run " + op_text(r.op()) + " on " + dtype_text(d), BP_STATUS_UNSUPPORTED);

  bp_execute_args a{};
  a.struct_size = BP_EXECUTE_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.device = r.device();
  a.op = r.op();
  a.inputs = in.data();
  a.outputs = out.data();
  a.num_inputs = static_cast<int32_t>(in.size());
  a.num_outputs = static_cast<int32_t>(out.size());
  a.attrs = &attrs;
  check(PluginStatus(api_, api_.execute(&a)));
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

void Session::synchronize(uint64_t id, const wire::Synchronize& r) {
  device(r.device());
  int32_t code = BP_STATUS_OK;
  std::string text;
  if (api_.synchronize != nullptr) {  // without it every call finished before it returned
    bp_synchronize_args a{};
    a.struct_size = BP_SYNCHRONIZE_ARGS_STRUCT_SIZE;
    a.plugin = hosted_->plugin();
    a.device = r.device();
    PluginStatus s(api_, api_.synchronize(&a));
    if (!s.ok()) {
      code = s.code();
      text = "synchronize (request " + std::to_string(id) + ") of device " + std::to_string(r.device()) +
             ": " + s.message();
    }
  }
  auto [c, t] = outcome(code, std::move(text));
  sender_.send(encode_reply(id, c, t));
}

void Session::memory(uint64_t id, const wire::MemoryQuery& r) {
  device(r.device());
  if (api_.device_memory == nullptr)
    refuse("backend '" + hosted_->backend_name() + "' does not report device memory", BP_STATUS_UNSUPPORTED);
  bp_device_memory_args a{};
  a.struct_size = BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.device = r.device();
  check(PluginStatus(api_, api_.device_memory(&a)));
  auto [c, t] = outcome(BP_STATUS_OK, "");
  sender_.send(encode_memory_reply(id, c, t, a.free_bytes, a.total_bytes));
}

std::shared_ptr<Session::Comm> Session::find_comm(uint64_t id) {
  std::lock_guard lock(comms_mutex_);
  const auto it = comms_.find(id);
  return it == comms_.end() ? nullptr : it->second;
}

void Session::comm_create(uint64_t id, const wire::CommCreate& r) {
  if (sticky_) {  // the job's earlier work failed: say so instead of joining a group
    auto [c, t] = outcome(BP_STATUS_OK, "");
    sender_.send(encode_reply(id, c, t));
    return;
  }
  const HostedDevice& dev = device(r.device());
  if (!dev.has(BP_CAP_COLLECTIVE) || api_.comm_create == nullptr)
    refuse("device " + std::to_string(r.device()) + " of backend '" + hosted_->backend_name() +
               "' has no 'collective' capability",
           BP_STATUS_UNSUPPORTED);
  if (r.comm() == 0) refuse("communicator id 0 is not valid (the client's ids are nonzero)");
  if (find_comm(r.comm()) != nullptr)
    refuse("communicator id " + std::to_string(r.comm()) + " is already in use in this session");
  {
    std::lock_guard lock(comms_mutex_);
    if (comms_.size() >= kMaxCommsPerSession)
      refuse(
          "this session already has " + std::to_string(comms_.size()) + " communicators, the server's limit",
          BP_STATUS_OUT_OF_MEMORY);
  }
  if (r.world_size() < 1 || r.world_size() > kMaxWorldSize)
    refuse("world_size " + std::to_string(r.world_size()) + " is outside 1.." +
           std::to_string(kMaxWorldSize));
  if (r.rank() < 0 || r.rank() >= r.world_size())
    refuse("rank " + std::to_string(r.rank()) + " is outside 0.." + std::to_string(r.world_size() - 1));
  constexpr int64_t kMaxTimeoutMs = int64_t{365} * 24 * 3600 * 1000;
  if (r.timeout_ms() <= 0 || r.timeout_ms() > kMaxTimeoutMs)
    refuse("timeout_ms " + std::to_string(r.timeout_ms()) + " is outside 1.." +
           std::to_string(kMaxTimeoutMs));
  const flatbuffers::String* prefix = r.key_prefix();
  if (prefix == nullptr) refuse("key_prefix is missing");
  if (prefix->size() > kMaxKeyPrefixBytes || prefix->string_view().find('\0') != std::string_view::npos)
    refuse("key_prefix is longer than " + std::to_string(kMaxKeyPrefixBytes) + " bytes or holds a NUL byte");

  auto comm = std::make_shared<Comm>();
  comm->device = r.device();
  comm->world_size = r.world_size();
  comm->kv = std::make_unique<KvBridge>(sender_, std::chrono::milliseconds(r.timeout_ms()));
  bp_comm_create_args a{};
  a.struct_size = BP_COMM_CREATE_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.device = r.device();
  a.rank = r.rank();
  a.world_size = r.world_size();
  a.timeout_ms = r.timeout_ms();
  a.store = comm->kv->store();
  a.key_prefix = prefix->c_str();
  check(PluginStatus(api_, api_.comm_create(&a)));  // blocks until every rank joined
  comm->handle = a.comm;
  {
    std::lock_guard lock(comms_mutex_);
    comms_.emplace(r.comm(), comm);
  }
  ++counters_.comms;
  auto [c, t] = outcome(BP_STATUS_OK, "");
  sender_.send(encode_reply(id, c, t));
}

// The communicator is out of the table already, so no new abort can start;
// the ones running finish before comm_destroy (abi.h: never concurrent).
void Session::destroy_comm(const std::shared_ptr<Comm>& comm) noexcept {
  {
    std::unique_lock lock(comms_mutex_);
    comms_idle_.wait(lock, [&] { return comm->aborting == 0; });
  }
  --counters_.comms;
  bp_comm_args a{};
  a.struct_size = BP_COMM_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.comm = comm->handle;
  PluginStatus s(api_, api_.comm_destroy(&a));
}

void Session::comm_destroy(uint64_t id, const wire::CommDestroy& r) {
  std::shared_ptr<Comm> comm;
  {
    std::lock_guard lock(comms_mutex_);
    const auto it = comms_.find(r.comm());
    if (it != comms_.end()) {
      comm = std::move(it->second);
      comms_.erase(it);
    }
  }
  if (!comm) refuse("communicator " + std::to_string(r.comm()) + " is not a communicator of this session");
  destroy_comm(comm);
  auto [c, t] = outcome(BP_STATUS_OK, "");
  sender_.send(encode_reply(id, c, t));
}

void Session::collective(uint64_t id, const wire::Collective& r) {
  const std::shared_ptr<Comm> comm = find_comm(r.comm());
  if (!comm) refuse("communicator " + std::to_string(r.comm()) + " is not a communicator of this session");
  const BufferLookup lookup = [this](uint64_t buffer) -> std::optional<OwnedBuffer> {
    const auto it = buffers_.find(buffer);
    if (it == buffers_.end()) return std::nullopt;
    return OwnedBuffer{it->second.handle, it->second.size, it->second.device};
  };
  DecodedTensor in_d, out_d;
  const bp_tensor* in = nullptr;
  const bp_tensor* out = nullptr;
  if (r.input() != nullptr) {
    decode_tensor(r.input(), comm->device, lookup, "input", in_d);
    in = &in_d.tensor;
  }
  if (r.output() != nullptr) {
    decode_tensor(r.output(), comm->device, lookup, "output", out_d);
    out = &out_d.tensor;
  }
  validate_collective(r.kind(), in, out, r.reduce_op(), r.root(), comm->world_size);
  const HostedDevice& dev = hosted_->devices()[static_cast<std::size_t>(comm->device)];
  for (const bp_tensor* t : {in, out})
    if (t != nullptr && !dev.holds(t->dtype))
      refuse("device " + std::to_string(comm->device) + " does not hold " + dtype_text(t->dtype) + " tensors",
             BP_STATUS_UNSUPPORTED);
  bp_status* (*entry)(bp_collective_args*) = nullptr;
  switch (r.kind()) {
    case wire::CollectiveKind::AllReduce:
      entry = api_.all_reduce;
      break;
    case wire::CollectiveKind::Broadcast:
      entry = api_.broadcast;
      break;
    case wire::CollectiveKind::AllGather:
      entry = api_.all_gather;
      break;
    case wire::CollectiveKind::ReduceScatter:
      entry = api_.reduce_scatter;
      break;
    case wire::CollectiveKind::Barrier:
      entry = api_.barrier;
      break;
  }
  if (entry == nullptr)
    refuse("backend '" + hosted_->backend_name() + "' has no " + collective_text(r.kind()),
           BP_STATUS_UNSUPPORTED);
  bp_collective_args a{};
  a.struct_size = BP_COLLECTIVE_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.comm = comm->handle;
  a.input = in;
  a.output = out;
  a.reduce_op = r.reduce_op();
  a.root = r.root();
  check(PluginStatus(api_, entry(&a)));
  auto [c, t] = outcome(BP_STATUS_OK, "");
  sender_.send(encode_reply(id, c, t));
}

void Session::abort(uint64_t comm_id) noexcept {
  std::shared_ptr<Comm> comm;
  {
    std::lock_guard lock(comms_mutex_);
    const auto it = comms_.find(comm_id);
    if (it == comms_.end()) return;
    comm = it->second;
    ++comm->aborting;
  }
  bp_comm_args a{};
  a.struct_size = BP_COMM_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.comm = comm->handle;
  PluginStatus s(api_, api_.comm_abort(&a));
  {
    std::lock_guard lock(comms_mutex_);
    --comm->aborting;
  }
  comms_idle_.notify_all();
}

void Session::abort_all() noexcept {
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(comms_mutex_);
    for (const auto& [id, comm] : comms_) ids.push_back(id);
  }
  for (const uint64_t id : ids) abort(id);
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
