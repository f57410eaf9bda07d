// A remote-protocol client for the server's tests, written on wire/ and plain
// blocking sockets (optionally TLS through OpenSSL): it can be well-behaved
// (the handshake, requests, replies) or send anything at all.
#ifndef BACKPLANE_TESTS_REMOTE_SERVER_RAW_CLIENT_HPP_
#define BACKPLANE_TESTS_REMOTE_SERVER_RAW_CLIENT_HPP_

#include "remote/wire/auth.hpp"
#include "remote/wire/frame.hpp"

#include <backplane/abi.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace rstest {

namespace wire = backplane::remote::wire;
using namespace std::chrono_literals;

// One received frame; message() is valid while the Frame lives.
struct Frame {
  wire::Header header;
  std::vector<uint8_t> message;
  std::vector<uint8_t> payload;
  const wire::Message* msg() const { return wire::GetMessage(message.data()); }
  wire::Body type() const { return msg()->body_type(); }
};

// The status and text of a Reply, ReadReply, MemoryReply or Fatal.
struct Answer {
  wire::Body type = wire::Body::NONE;
  int32_t status = -1;
  std::string message;
};

inline Answer answer_of(const Frame& f) {
  Answer a;
  const wire::Message* m = f.msg();
  a.type = m->body_type();
  auto text = [](const flatbuffers::String* s) { return s != nullptr ? s->str() : std::string(); };
  switch (a.type) {
    case wire::Body::Reply:
      a.status = m->body_as_Reply()->status();
      a.message = text(m->body_as_Reply()->message());
      break;
    case wire::Body::ReadReply:
      a.status = m->body_as_ReadReply()->status();
      a.message = text(m->body_as_ReadReply()->message());
      break;
    case wire::Body::MemoryReply:
      a.status = m->body_as_MemoryReply()->status();
      a.message = text(m->body_as_MemoryReply()->message());
      break;
    case wire::Body::Fatal:
      a.status = m->body_as_Fatal()->status();
      a.message = text(m->body_as_Fatal()->message());
      break;
    default:
      break;
  }
  return a;
}

// A frame (header + message) for any body: the caller builds the body in `b`.
template <class T>
std::vector<uint8_t> frame_of(flatbuffers::FlatBufferBuilder& b, uint64_t id, flatbuffers::Offset<T> body,
                              uint64_t payload_bytes = 0) {
  const auto m = wire::CreateMessage(b, id, wire::BodyTraits<T>::enum_value, body.Union());
  return wire::finish(b, m, payload_bytes).bytes;
}

// The frames of a well-behaved client.
namespace msg {

inline std::vector<uint8_t> hello(std::span<const uint8_t> nonce,
                                  uint32_t protocol = wire::kProtocolVersion) {
  flatbuffers::FlatBufferBuilder b;
  const auto version = b.CreateString("test");
  const auto n = b.CreateVector(nonce.data(), nonce.size());
  return frame_of(b, 0, wire::CreateHello(b, protocol, version, n));
}
inline std::vector<uint8_t> proof(std::span<const uint8_t> mac) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, 0, wire::CreateProof(b, b.CreateVector(mac.data(), mac.size())));
}
inline std::vector<uint8_t> alloc(uint64_t id, uint64_t buffer, int32_t device, uint64_t size) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateAlloc(b, buffer, device, size));
}
inline std::vector<uint8_t> free(uint64_t id, uint64_t buffer) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateFree(b, buffer));
}
inline std::vector<uint8_t> write(uint64_t id, uint64_t buffer, uint64_t offset, uint64_t size) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateWrite(b, buffer, offset, size), size);
}
inline std::vector<uint8_t> read(uint64_t id, uint64_t buffer, uint64_t offset, uint64_t size) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateRead(b, buffer, offset, size));
}
inline std::vector<uint8_t> synchronize(uint64_t id, int32_t device = 0) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateSynchronize(b, device));
}
inline std::vector<uint8_t> ping(uint64_t id) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreatePing(b));
}
inline std::vector<uint8_t> goodbye(uint64_t id) {
  flatbuffers::FlatBufferBuilder b;
  return frame_of(b, id, wire::CreateGoodbye(b));
}

// A tensor descriptor as the test means it, any value allowed.
struct Desc {
  uint64_t buffer = 0;
  uint64_t byte_offset = 0;
  int32_t dtype = BP_DTYPE_F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};
inline Desc contiguous(uint64_t buffer, std::vector<int64_t> shape, int32_t dtype = BP_DTYPE_F32) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return Desc{buffer, 0, dtype, std::move(shape), std::move(strides)};
}
inline flatbuffers::Offset<wire::TensorDesc> tensor(flatbuffers::FlatBufferBuilder& b, const Desc& d) {
  return wire::CreateTensorDesc(b, d.buffer, d.byte_offset, d.dtype, b.CreateVector(d.shape),
                                b.CreateVector(d.strides));
}
inline std::vector<uint8_t> execute(uint64_t id, int32_t op, const std::vector<Desc>& inputs,
                                    const std::vector<Desc>& outputs, int32_t device = 0, int64_t axis = 0,
                                    int32_t dtype = 0) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<wire::TensorDesc>> in, out;
  for (const Desc& d : inputs) in.push_back(tensor(b, d));
  for (const Desc& d : outputs) out.push_back(tensor(b, d));
  return frame_of(
      b, id,
      wire::CreateExecute(b, device, op, b.CreateVector(in), b.CreateVector(out), axis, dtype, 0.0, 0.0, 0));
}

}  // namespace msg

// A self-signed certificate and key (PEM files) for the TLS tests.
struct TlsFiles {
  std::string cert;
  std::string key;
};

class RawClient {
 public:
  // Connects to 127.0.0.1:port, from the IPv4 address `source` when given
  // (any of 127.0.0.0/8 is loopback); with `tls`, runs the TLS handshake
  // first (tls_ok() says whether it succeeded).
  explicit RawClient(uint16_t port, SSL_CTX* tls = nullptr, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      if (::inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
          ::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
        const int e = errno;
        ::close(fd_);
        fd_ = -1;
        throw std::runtime_error(std::string("bind to ") + source + ": " + std::strerror(e));
      }
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      const int e = errno;
      ::close(fd_);
      fd_ = -1;
      throw std::runtime_error(std::string("connect: ") + std::strerror(e));
    }
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (tls != nullptr) {
      ssl_ = SSL_new(tls);
      SSL_set_fd(ssl_, fd_);
      tls_ok_ = SSL_connect(ssl_) == 1;
    }
  }
  ~RawClient() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  int fd() const { return fd_; }
  bool tls_ok() const { return tls_ok_; }

  // Closes with a reset (SO_LINGER 0), as a killed process's socket may.
  void reset() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(fd_);
    fd_ = -1;
  }

  bool send(std::span<const uint8_t> bytes) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const long n = ssl_ != nullptr
                         ? SSL_write(ssl_, bytes.data() + sent, static_cast<int>(bytes.size() - sent))
                         : ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) {
        if (ssl_ == nullptr && n < 0 && errno == EINTR) continue;
        return false;
      }
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }
  bool send(const std::vector<uint8_t>& bytes) { return send(std::span<const uint8_t>(bytes)); }

  // Reads exactly n bytes; false on EOF, error or timeout.
  bool read_exact(uint8_t* out, std::size_t n, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::size_t got = 0;
    while (got < n) {
      if (ssl_ == nullptr || SSL_pending(ssl_) == 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
        pollfd p{fd_, POLLIN, 0};
        const int r = ::poll(&p, 1, static_cast<int>(left.count()));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
      }
      const long k = ssl_ != nullptr ? SSL_read(ssl_, out + got, static_cast<int>(n - got))
                                     : ::recv(fd_, out + got, n - got, 0);
      if (k < 0 && ssl_ == nullptr && errno == EINTR) continue;
      if (k <= 0) return false;
      got += static_cast<std::size_t>(k);
    }
    return true;
  }

  // The next frame, or nullopt when the connection closed (or nothing came in time).
  std::optional<Frame> read_frame(std::chrono::milliseconds timeout = 20s) {
    std::array<uint8_t, wire::kHeaderBytes> h{};
    if (!read_exact(h.data(), h.size(), timeout)) return std::nullopt;
    std::string why;
    const auto header = wire::decode_header(h, wire::kDefaultMaxMessageBytes, uint64_t{1} << 40, why);
    if (!header) throw std::runtime_error("the server sent a bad frame header: " + why);
    Frame f;
    f.header = *header;
    f.message.resize(header->message_bytes);
    f.payload.resize(header->payload_bytes);
    if (!read_exact(f.message.data(), f.message.size(), timeout)) return std::nullopt;
    if (!f.payload.empty() && !read_exact(f.payload.data(), f.payload.size(), timeout)) return std::nullopt;
    if (wire::verify_message(f.message, why) == nullptr)
      throw std::runtime_error("the server sent a bad message: " + why);
    return f;
  }

  // Reads frames until the peer closes: true when it closed within `timeout`.
  // `last` receives the last frame that came (a Fatal, usually).
  bool closed_by_peer(std::chrono::milliseconds timeout = 20s, std::optional<Frame>* last = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      uint8_t peek = 0;
      const long k = ssl_ != nullptr ? SSL_peek(ssl_, &peek, 1) : ::recv(fd_, &peek, 1, MSG_PEEK);
      if (k <= 0) return true;
      try {
        auto f = read_frame(left);
        if (!f) return true;
        if (last != nullptr) *last = std::move(f);
      } catch (const std::exception&) {
        return true;  // not a frame: whatever it was, the peer must close next
      }
    }
  }

  // The Hello; returns the Challenge (nullopt when the server closed instead).
  std::optional<Frame> hello(uint32_t protocol = wire::kProtocolVersion) {
    client_nonce_ = wire::random_nonce();
    send(msg::hello(client_nonce_, protocol));
    return read_frame();
  }

  // Answers the Challenge with a proof of `token` (none when empty).
  void prove(const Frame& challenge, const std::string& token) {
    const wire::Challenge* c = challenge.msg()->body_as_Challenge();
    if (c == nullptr) throw std::runtime_error("expected a Challenge");
    server_nonce_.assign(c->nonce()->begin(), c->nonce()->end());
    if (token.empty()) {
      send(msg::proof({}));
      return;
    }
    const wire::Mac p = wire::client_proof(token, client_nonce_, server_nonce_);
    send(msg::proof(p));
  }

  // The whole handshake; returns the Welcome, or the frame the server sent
  // instead (a Fatal), or nullopt when it closed.
  std::optional<Frame> handshake(const std::string& token = "") {
    auto challenge = hello();
    if (!challenge || challenge->type() != wire::Body::Challenge) return challenge;
    prove(*challenge, token);
    return read_frame();
  }

  // A synchronising request's answer (Reply/ReadReply/...), skipping pings' replies of other ids.
  std::optional<Frame> request(const std::vector<uint8_t>& frame) {
    if (!send(frame)) return std::nullopt;
    return read_frame();
  }

  // Writes `bytes` into `buffer` at `offset` (pipelined: no reply).
  bool write(uint64_t id, uint64_t buffer, uint64_t offset, std::span<const uint8_t> bytes) {
    return send(msg::write(id, buffer, offset, bytes.size())) && send(bytes);
  }

  const wire::Nonce& client_nonce() const { return client_nonce_; }

 private:
  int fd_ = -1;
  SSL* ssl_ = nullptr;
  bool tls_ok_ = false;
  wire::Nonce client_nonce_{};
  std::vector<uint8_t> server_nonce_;
};

template <class T>
std::span<const uint8_t> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

template <class T>
std::vector<T> values_of(const std::vector<uint8_t>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace rstest

#endif  // BACKPLANE_TESTS_REMOTE_SERVER_RAW_CLIENT_HPP_
