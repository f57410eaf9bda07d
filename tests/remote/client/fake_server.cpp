// The in-test fake server of the remote protocol (see fake_server.hpp).
#include "fake_server.hpp"

#include <backplane/abi.h>
#include <sys/socket.h>
#include "../self_signed_cert.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>

#include "remote/wire/auth.hpp"

namespace backplane::remote::test {

namespace asio = wire::asio;
using boost::system::error_code;
using wire::tcp;

struct FakeServer::Conn {
  int fd = -1;
  std::unique_ptr<asio::ssl::stream<tcp::socket>> ssl;  // TLS
  std::unique_ptr<tcp::socket> plain;                   // or not
  std::vector<uint8_t> in;                              // received, not parsed yet
  std::map<uint64_t, std::vector<uint8_t>> buffers;
  std::optional<std::pair<int32_t, std::string>> sticky;
  bool stalled = false;

  std::size_t read_some(uint8_t* p, std::size_t n, error_code& ec) {
    return ssl ? ssl->read_some(asio::buffer(p, n), ec) : plain->read_some(asio::buffer(p, n), ec);
  }
  bool write_all(const std::vector<uint8_t>& bytes) {
    error_code ec;
    if (ssl)
      asio::write(*ssl, asio::buffer(bytes), ec);
    else
      asio::write(*plain, asio::buffer(bytes), ec);
    return !ec;
  }
};

namespace {

struct Frame {
  std::vector<uint8_t> message;
  std::vector<uint8_t> payload;
  const wire::Message* m = nullptr;
};

std::vector<uint8_t> frame_bytes(flatbuffers::FlatBufferBuilder& fbb, uint64_t id, wire::Body type,
                                 flatbuffers::Offset<void> body, const uint8_t* payload = nullptr,
                                 uint64_t payload_bytes = 0) {
  wire::Encoded e = wire::finish(fbb, wire::CreateMessage(fbb, id, type, body), payload_bytes);
  if (payload_bytes > 0) e.bytes.insert(e.bytes.end(), payload, payload + payload_bytes);
  return std::move(e.bytes);
}

std::vector<uint8_t> reply(uint64_t id, int32_t status, const std::string& message) {
  flatbuffers::FlatBufferBuilder fbb;
  const auto text = fbb.CreateString(message);
  return frame_bytes(fbb, id, wire::Body::Reply, wire::CreateReply(fbb, status, text).Union());
}

uint64_t numel(const wire::TensorDesc* t) {
  uint64_t n = 1;
  if (t->shape() != nullptr)
    for (int64_t e : *t->shape()) n *= static_cast<uint64_t>(e);
  return n;
}

}  // namespace

FakeServer::FakeServer(FakeOptions options)
    : options_(std::move(options)), acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
  port_ = acceptor_.local_endpoint().port();
  listen_fd_ = acceptor_.native_handle();
  acceptor_thread_ = std::thread([this] { accept_loop(); });
}

FakeServer::~FakeServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);  // wakes the blocked accept
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  acceptor_thread_.join();
  // No thread is added once stopping_ is set and the acceptor has returned.
  for (auto& t : threads_) t.join();
}

std::vector<std::string> FakeServer::bodies() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bodies_;
}

std::vector<std::pair<int32_t, std::string>> FakeServer::kv_replies() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_replies_;
}

void FakeServer::accept_loop() {
  for (;;) {
    tcp::socket socket(io_);
    error_code ec;
    acceptor_.accept(socket, ec);
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (ec) continue;
    auto conn = std::make_shared<Conn>();
    conn->fd = socket.native_handle();
    socket.set_option(tcp::no_delay(true), ec);
    if (options_.tls != nullptr)
      conn->ssl = std::make_unique<asio::ssl::stream<tcp::socket>>(std::move(socket), *options_.tls);
    else
      conn->plain = std::make_unique<tcp::socket>(std::move(socket));
    open_fds_.push_back(conn->fd);
    threads_.emplace_back([this, conn] { serve(conn); });
  }
}

void FakeServer::serve(std::shared_ptr<Conn> conn) {
  if (conn->ssl) {
    error_code ec;
    conn->ssl->handshake(asio::ssl::stream_base::server, ec);
    if (!ec && handshake(*conn)) session(*conn);
  } else if (handshake(*conn)) {
    session(*conn);
  }
  std::lock_guard<std::mutex> lock(mu_);
  open_fds_.erase(std::find(open_fds_.begin(), open_fds_.end(), conn->fd));
  // The socket closes when the last reference (this thread's) goes.
}

namespace {

// Reads the next whole frame from `c` (buffering what arrives); false on EOF or a bad frame.
template <class More>
bool next_frame(std::vector<uint8_t>& in, Frame& f, More&& more) {
  while (in.size() < wire::kHeaderBytes)
    if (!more()) return false;
  std::string why;
  const auto h =
      wire::decode_header(std::span<const uint8_t, wire::kHeaderBytes>(in.data(), wire::kHeaderBytes),
                          wire::kDefaultMaxMessageBytes, uint64_t{1} << 32, why);
  if (!h) return false;
  const std::size_t total = wire::kHeaderBytes + h->message_bytes + h->payload_bytes;
  while (in.size() < total)
    if (!more()) return false;
  f.message.assign(in.begin() + wire::kHeaderBytes, in.begin() + wire::kHeaderBytes + h->message_bytes);
  f.payload.assign(in.begin() + wire::kHeaderBytes + h->message_bytes, in.begin() + total);
  in.erase(in.begin(), in.begin() + total);
  f.m = wire::verify_message(f.message, why);
  return f.m != nullptr;
}

}  // namespace

bool FakeServer::handshake(Conn& c) {
  std::vector<uint8_t> chunk(4096);
  const auto more = [&] {
    error_code ec;
    const std::size_t n = c.read_some(chunk.data(), chunk.size(), ec);
    if (ec || n == 0) return false;
    c.in.insert(c.in.end(), chunk.begin(), chunk.begin() + n);
    return true;
  };
  Frame hello;
  if (!next_frame(c.in, hello, more) || hello.m->body_type() != wire::Body::Hello) return false;
  const auto* nc = hello.m->body_as_Hello()->nonce();
  if (nc == nullptr) return false;
  const std::vector<uint8_t> client_nonce(nc->begin(), nc->end());
  const wire::Nonce ns = wire::random_nonce();
  const bool auth = !options_.token.empty();
  {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<uint8_t> proof;
    if (auth) {
      const wire::Mac mac = wire::server_proof(options_.token, client_nonce, ns);
      proof.assign(mac.begin(), mac.end());
    }
    const auto version = fbb.CreateString(options_.server_version);
    const auto nonce = fbb.CreateVector(ns.data(), ns.size());
    const auto proof_vec = fbb.CreateVector(proof);
    const auto body = wire::CreateChallenge(fbb, wire::kProtocolVersion, version, auth, nonce, proof_vec);
    if (!c.write_all(frame_bytes(fbb, 0, wire::Body::Challenge, body.Union()))) return false;
  }
  Frame proof;
  if (!next_frame(c.in, proof, more) || proof.m->body_type() != wire::Body::Proof) return false;
  if (auth) {
    const auto* p = proof.m->body_as_Proof()->client_proof();
    const wire::Mac expected = wire::client_proof(options_.token, client_nonce, ns);
    if (p == nullptr || !wire::same_mac(expected, std::span<const uint8_t>(p->data(), p->size()))) {
      flatbuffers::FlatBufferBuilder fbb;
      const auto text = fbb.CreateString("the client's proof does not match this server's token");
      c.write_all(frame_bytes(fbb, 0, wire::Body::Fatal,
                              wire::CreateFatal(fbb, BP_STATUS_UNAVAILABLE, text).Union()));
      return false;
    }
  }
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::DeviceDesc>> devices;
  const int32_t ops = BP_OP_COUNT_, dtypes = BP_DTYPE_COUNT_;
  for (const FakeDevice& d : options_.devices) {
    std::vector<uint8_t> support((ops * dtypes + 7) / 8, 0);
    for (int32_t op : d.ops)
      for (int32_t dt = 1; dt < dtypes; ++dt) {
        const int32_t bit = op * dtypes + dt;
        support[bit / 8] = static_cast<uint8_t>(support[bit / 8] | (1u << (bit % 8)));
      }
    std::vector<flatbuffers::Offset<wire::Attribute>> attrs;
    for (const auto& [k, v] : d.attributes)
      attrs.push_back(wire::CreateAttribute(fbb, fbb.CreateString(k), fbb.CreateString(v)));
    const auto name = fbb.CreateString(d.name);
    const auto attr_vec = fbb.CreateVector(attrs);
    const auto support_vec = fbb.CreateVector(support);
    devices.push_back(wire::CreateDeviceDesc(fbb, name, d.capabilities, attr_vec, ops, dtypes, support_vec));
  }
  const auto backend = fbb.CreateString("fake");
  const auto backend_version = fbb.CreateString("0.0.1");
  const auto device_vec = fbb.CreateVector(devices);
  const auto limits = wire::CreateLimits(fbb, options_.max_frame_bytes, uint64_t{1} << 30, 1000, 100, 60000);
  const auto welcome = wire::CreateWelcome(fbb, ++sessions_, backend, backend_version, device_vec, limits);
  return c.write_all(frame_bytes(fbb, 0, wire::Body::Welcome, welcome.Union()));
}

void FakeServer::session(Conn& c) {
  std::vector<uint8_t> chunk(256 * 1024);
  const auto more = [&] {
    error_code ec;
    const std::size_t n = c.read_some(chunk.data(), chunk.size(), ec);
    if (ec || n == 0) return false;
    ++reads_;
    c.in.insert(c.in.end(), chunk.begin(), chunk.begin() + n);
    return true;
  };
  const auto sticky = [&](const std::string& text) {
    if (!c.sticky) c.sticky = std::make_pair(static_cast<int32_t>(BP_STATUS_INVALID_ARGUMENT), text);
  };
  // The next frame, with its accounting; false when the connection ends.
  const auto receive = [&](Frame& f) {
    if (!next_frame(c.in, f, more)) return false;
    ++frames_;
    std::lock_guard<std::mutex> lock(mu_);
    bodies_.push_back(wire::body_name(f.m->body_type()));
    return true;
  };
  for (;;) {
    Frame f;
    if (!receive(f)) return;
    const wire::Message& m = *f.m;
    const uint64_t id = m.id();
    const wire::Body type = m.body_type();
    if (type == options_.close_on) return;
    if (type == options_.stall_on) c.stalled = true;
    switch (type) {
      case wire::Body::Alloc: {
        const auto* r = m.body_as_Alloc();
        c.buffers[r->buffer()] = std::vector<uint8_t>(r->size());
        break;
      }
      case wire::Body::Free:
        c.buffers.erase(m.body_as_Free()->buffer());
        break;
      case wire::Body::Write: {
        const auto* r = m.body_as_Write();
        auto it = c.buffers.find(r->buffer());
        if (it == c.buffers.end() || r->offset() + r->size() > it->second.size() ||
            f.payload.size() != r->size()) {
          sticky("buffer_write (request " + std::to_string(id) + "): buffer id " +
                 std::to_string(r->buffer()) + " is not owned by this session or too small");
          break;
        }
        std::copy(f.payload.begin(), f.payload.end(),
                  it->second.begin() + static_cast<std::ptrdiff_t>(r->offset()));
        break;
      }
      case wire::Body::Execute: {
        const auto* r = m.body_as_Execute();
        const char* name = bp_op_name(r->op()) != nullptr ? bp_op_name(r->op()) : "unknown";
        const std::string where = std::string("execute ") + name + " (request " + std::to_string(id) +
                                  ") on device " + std::to_string(r->device()) + ": ";
        // The toy device adds contiguous f32 tensors; everything else is refused.
        if (r->op() != BP_OP_ADD || r->inputs() == nullptr || r->inputs()->size() != 2 ||
            r->outputs() == nullptr || r->outputs()->size() != 1) {
          sticky(where + "the fake server only adds");
          break;
        }
        const wire::TensorDesc* a = r->inputs()->Get(0);
        const wire::TensorDesc* b = r->inputs()->Get(1);
        const wire::TensorDesc* o = r->outputs()->Get(0);
        auto ia = c.buffers.find(a->buffer()), ib = c.buffers.find(b->buffer()),
             io = c.buffers.find(o->buffer());
        if (ia == c.buffers.end() || ib == c.buffers.end() || io == c.buffers.end()) {
          sticky(where + "a buffer id is not owned by this session");
          break;
        }
        const uint64_t n = numel(o);
        for (uint64_t i = 0; i < n; ++i) {
          float x, y;
          std::memcpy(&x, ia->second.data() + a->byte_offset() + 4 * i, 4);
          std::memcpy(&y, ib->second.data() + b->byte_offset() + 4 * i, 4);
          const float z = x + y;
          std::memcpy(io->second.data() + o->byte_offset() + 4 * i, &z, 4);
        }
        break;
      }
      case wire::Body::Read: {
        if (c.stalled) break;
        const auto* r = m.body_as_Read();
        flatbuffers::FlatBufferBuilder fbb;
        int32_t status = BP_STATUS_OK;
        std::string text;
        auto it = c.buffers.find(r->buffer());
        if (c.sticky) {
          std::tie(status, text) = *c.sticky;
          c.sticky.reset();
        } else if (it == c.buffers.end() || r->offset() + r->size() > it->second.size()) {
          status = BP_STATUS_INVALID_ARGUMENT;
          text = "buffer_read (request " + std::to_string(id) + "): no such buffer";
        }
        const auto t = fbb.CreateString(text);
        const uint64_t size = status == BP_STATUS_OK ? r->size() : 0;
        const auto body = wire::CreateReadReply(fbb, status, t, size);
        const uint8_t* data = size > 0 ? it->second.data() + r->offset() : nullptr;
        if (!c.write_all(frame_bytes(fbb, id, wire::Body::ReadReply, body.Union(), data, size))) return;
        break;
      }
      case wire::Body::Synchronize:
      case wire::Body::Ping:
      case wire::Body::CommDestroy:
      case wire::Body::Collective: {
        if (c.stalled) break;
        int32_t status = BP_STATUS_OK;
        std::string text;
        if (type != wire::Body::Ping && c.sticky) {
          std::tie(status, text) = *c.sticky;
          c.sticky.reset();
        }
        if (!c.write_all(reply(id, status, text))) return;
        break;
      }
      case wire::Body::MemoryQuery: {
        if (c.stalled) break;
        flatbuffers::FlatBufferBuilder fbb;
        const auto body = wire::CreateMemoryReply(fbb, 0, fbb.CreateString(""), 1000, 4000);
        if (!c.write_all(frame_bytes(fbb, id, wire::Body::MemoryReply, body.Union()))) return;
        break;
      }
      case wire::Body::CommCreate: {
        const auto* r = m.body_as_CommCreate();
        const std::string key = (r->key_prefix() != nullptr ? r->key_prefix()->str() : "") + "probe";
        // Ask the client's store to set, then get the key, as a hosted plugin's rendezvous would.
        std::string got;
        int32_t status = BP_STATUS_OK;
        for (const wire::KvKind kind : {wire::KvKind::Set, wire::KvKind::Get}) {
          flatbuffers::FlatBufferBuilder fbb;
          const auto keys = fbb.CreateVectorOfStrings(std::vector<std::string>{key});
          const auto value = fbb.CreateVector(reinterpret_cast<const uint8_t*>(options_.kv_value.data()),
                                              kind == wire::KvKind::Set ? options_.kv_value.size() : 0);
          const uint64_t kv_id = 900000 + static_cast<uint64_t>(kind);
          const auto body = wire::CreateKvRequest(fbb, kind, keys, value, 5000);
          if (!c.write_all(frame_bytes(fbb, kv_id, wire::Body::KvRequest, body.Union()))) return;
          for (;;) {
            Frame k;
            if (!receive(k)) return;
            if (k.m->body_type() == wire::Body::Ping) {
              if (!c.write_all(reply(k.m->id(), 0, ""))) return;
              continue;
            }
            if (k.m->body_type() != wire::Body::KvReply || k.m->id() != kv_id)
              return;  // a protocol violation
            const auto* kr = k.m->body_as_KvReply();
            const std::string v =
                kr->value() != nullptr ? std::string(kr->value()->begin(), kr->value()->end()) : "";
            {
              std::lock_guard<std::mutex> lock(mu_);
              kv_replies_.emplace_back(kr->status(), v);
            }
            if (kr->status() != 0) status = BP_STATUS_COLLECTIVE;
            if (kind == wire::KvKind::Get) got = v;
            break;
          }
        }
        if (status == BP_STATUS_OK && got != options_.kv_value) status = BP_STATUS_COLLECTIVE;
        if (!c.write_all(
                reply(id, status, status == 0 ? "" : "comm_create: the store gave back '" + got + "'")))
          return;
        break;
      }
      case wire::Body::Goodbye:
        ++goodbyes_;
        return;
      default:
        break;  // CommAbort and anything else: nothing to do
    }
  }
}

void make_self_signed(const std::string& dir) { testing::write_self_signed(dir); }

}  // namespace backplane::remote::test
