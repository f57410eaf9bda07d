// A connection's handshake (connection.hpp): the connection is made for an
// accepted socket, then comes TLS (when the server has a certificate), the
// client's Hello, the server's Challenge, the client's Proof and the Welcome
// that begins the session and its worker; all within --handshake-timeout-ms.
#include "remote/server/connection.hpp"

#include "remote/server/messages.hpp"
#include "remote/wire/auth.hpp"

#include <algorithm>
#include <string>
#include <string_view>

namespace backplane::remote::server {

namespace {

// What a client says about itself, fit for one log line: at most 64
// characters, anything not printable ASCII shown as '?'.
std::string printable(std::string_view text) {
  std::string out(text.substr(0, 64));
  for (char& c : out)
    if (c < 0x20 || c > 0x7e) c = '?';
  return out;
}

}  // namespace

Connection::Connection(Server::Impl& server, tcp::socket socket, asio::ip::address address)
    : server_(server),
      address_(std::move(address)),
      strand_(socket.get_executor()),
      stream_(std::move(socket), server.tls.get()),
      handshake_timer_(strand_),
      idle_timer_(strand_),
      write_timer_(strand_),
      linger_timer_(strand_) {
  error_code ec;
  const tcp::endpoint ep = stream_.socket().remote_endpoint(ec);
  peer_ = ec ? std::string("an unknown peer") : join_host_port(ep.address().to_string(), ep.port());
  inbuf_.resize(kReadChunk);
}

void Connection::begin() {
  handshake_timer_.expires_after(server_.options.limits.handshake_timeout);
  handshake_timer_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (ec || self->phase_ == Phase::closed || self->phase_ >= Phase::session) return;
    self->close(LogLevel::warning, "did not finish its handshake within " +
                                       ms_text(self->server_.options.limits.handshake_timeout) +
                                       " (--handshake-timeout-ms); closed");
  });
  if (!stream_.tls()) {
    phase_ = Phase::hello;
    pump();
    return;
  }
  phase_ = Phase::tls;
  stream_.async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](const error_code& ec) {
    if (self->phase_ == Phase::closed) return;
    if (ec) {
      self->close(LogLevel::warning, "failed the TLS handshake (" + ec.message() +
                                         "; a client without TLS, or one that does "
                                         "not trust this server's certificate); closed");
      return;
    }
    self->phase_ = Phase::hello;
    self->pump();
  });
}

void Connection::on_hello(const wire::Message& m) {
  const wire::Hello* hello = m.body_as_Hello();
  if (hello == nullptr) {
    fatal(BP_STATUS_INVALID_ARGUMENT,
          std::string("protocol error: the first message must be a Hello, not a ") +
              wire::body_name(m.body_type()));
    return;
  }
  if (hello->protocol() != wire::kProtocolVersion) {
    fatal(BP_STATUS_UNAVAILABLE,
          "this server speaks remote protocol version " + std::to_string(wire::kProtocolVersion) +
              " and the client version " + std::to_string(hello->protocol()) + " (server backplane " +
              server_.options.server_version + "); run the same backplane version on both sides");
    return;
  }
  if (hello->nonce() == nullptr || hello->nonce()->size() != wire::kNonceBytes) {
    fatal(BP_STATUS_INVALID_ARGUMENT,
          "protocol error: the Hello's nonce must be " + std::to_string(wire::kNonceBytes) + " bytes");
    return;
  }
  std::copy(hello->nonce()->begin(), hello->nonce()->end(), client_nonce_.begin());
  if (hello->client_version() != nullptr) client_version_ = printable(hello->client_version()->string_view());
  server_nonce_ = wire::random_nonce();
  const bool auth = !server_.options.token.empty();
  wire::Mac proof{};
  if (auth) proof = wire::server_proof(server_.options.token, client_nonce_, server_nonce_);
  send_now(encode_challenge(server_.options.server_version, auth, server_nonce_,
                            auth ? std::span<const uint8_t>(proof) : std::span<const uint8_t>()));
  phase_ = Phase::proof;
}

void Connection::on_proof(const wire::Message& m) {
  const wire::Proof* proof = m.body_as_Proof();
  if (proof == nullptr) {
    fatal(BP_STATUS_INVALID_ARGUMENT,
          std::string("protocol error: expected a Proof after the Challenge, not a ") +
              wire::body_name(m.body_type()));
    return;
  }
  if (!server_.options.token.empty()) {
    const auto* p = proof->client_proof();
    const wire::Mac expected = wire::client_proof(server_.options.token, client_nonce_, server_nonce_);
    if (p == nullptr || !wire::same_mac(expected, std::span<const uint8_t>(p->data(), p->size()))) {
      fatal(BP_STATUS_INVALID_ARGUMENT,
            "authentication failed: the client did not prove this server's token (give the client the token "
            "the server was started with)");
      return;
    }
  }
  // A session slot, if one is free.
  const int32_t max = server_.options.limits.max_sessions;
  int64_t n = server_.counters.sessions.load();
  do {
    if (n >= max) {
      fatal(BP_STATUS_UNAVAILABLE,
            "the server has " + std::to_string(n) + " sessions, its limit (--max-sessions); try later");
      return;
    }
  } while (!server_.counters.sessions.compare_exchange_weak(n, n + 1));
  has_session_slot_ = true;
  end_handshake();
  const uint64_t id = server_.next_session++;
  session_ = std::make_unique<Session>(id, server_.hosted, server_.options.limits, server_.counters, *this);
  session_->set_trace_flow_key(wire::trace_flow_key(client_nonce_, server_nonce_));
  send_now(encode_welcome(id, *server_.hosted, server_.options.limits));
  phase_ = Phase::session;
  log_line(LogLevel::info,
           "session " + std::to_string(id) + " from " + peer_ + " began" +
               (client_version_.empty() ? "" : " (client backplane " + client_version_ + ")") +
               (stream_.tls() ? ", over TLS" : ""));
  worker_ = std::thread([self = shared_from_this()] { self->work(); });
}

void Connection::end_handshake() {
  if (in_handshake_) {
    in_handshake_ = false;
    server_.handshake_ended(address_);
  }
  handshake_timer_.cancel();
}

}  // namespace backplane::remote::server
