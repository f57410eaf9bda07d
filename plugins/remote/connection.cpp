// The remote plugin's connection to one server: the handshake on the caller's
// thread, then an io thread that owns the socket; callers queue frames under
// a mutex (small ones coalesce into one gathered write) and wait, bounded,
// for the replies of synchronising requests. A dead connection fails every
// waiting and later call at once.
#include "plugins/remote/connection.hpp"

#include <openssl/ssl.h>
#include <sys/socket.h>
#include <backplane/plugin.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>

#include <algorithm>
#include <cstring>

#include "remote/wire/auth.hpp"

namespace backplane::remote::client {

namespace {

using boost::system::error_code;
using plugin::fail;

// The most threads that answer the server's key-value requests at once (each
// may block in the job's store until the request's timeout); more wait in a queue.
constexpr std::size_t kMaxKvThreads = 8;
// A frame's payload when the server names no frame limit.
constexpr uint64_t kDefaultChunkBytes = uint64_t{1} << 30;
// Room left for the message when a frame limit may count it with the payload.
constexpr uint64_t kMessageRoom = uint64_t{64} << 10;
// The longest a key-value call may wait, whatever the server asks.
constexpr int64_t kMaxKvTimeoutMs = 24LL * 3600 * 1000;

std::string ms_text(milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

bool closed_by_peer(const error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::ssl::error::stream_truncated;
}

std::string lost(const error_code& ec) {
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated)
    return "connection lost (the server closed it)";
  return "connection lost (" + ec.message() + ")";
}

// Why a server closes a connection before the handshake is done, and what
// to change (built only on that failure path).
[[gnu::cold]] std::string closed_in_handshake_text(const std::string& endpoint, const error_code& ec,
                                                   milliseconds deadline, bool tls) {
  return "the server at " + endpoint + " closed the connection during the handshake (" + ec.message() +
         "): it may be at its handshake limits (many connections at once: `backplane serve` "
         "--max-handshakes, --max-handshakes-per-address) and have closed this one after it waited its "
         "--handshake-timeout-ms for a slot, or it refused this client (see the server's log)" +
         (tls ? std::string() : ", or it may require TLS (set \"tls_ca\")") + "; this client waits up to " +
         ms_text(deadline) + " (connect_timeout_ms)";
}

[[gnu::cold]] std::string no_handshake_answer_text(const std::string& endpoint, milliseconds deadline,
                                                   bool tls) {
  return "the server at " + endpoint + " did not answer the handshake within " + ms_text(deadline) +
         " (connect_timeout_ms): it may be busy with many connections at once (its --max-handshakes and "
         "--max-handshakes-per-address; raise connect_timeout_ms above its --handshake-timeout-ms), or " +
         endpoint + " is not a `backplane serve` endpoint" +
         (tls ? "" : ", or it requires TLS (set \"tls_ca\")");
}

}  // namespace

Connection::Connection(ConnectionSettings settings) : settings_(std::move(settings)), heartbeat_timer_(io_) {
  // The options checked the endpoint already; this cannot throw for one they accepted.
  auto [host, port] = wire::split_endpoint(settings_.endpoint);
  host_ = std::move(host);
  port_ = port;
}

Connection::~Connection() {
  if (thread_.joinable()) {
    {
      Lock lock(mu_);
      shutting_down_ = true;
      if (!dead_) {
        fbb_.Clear();
        push_locked(next_request_++, wire::Body::Goodbye, wire::CreateGoodbye(fbb_).Union(), nullptr, 0,
                    nullptr);
        // Let the Goodbye leave before the socket closes; a server that reads nothing gets 1 s.
        cv_.wait_for(lock, std::chrono::seconds(1),
                     [&] { return dead_ || (queue_.empty() && !write_scheduled_); });
      }
    }
    asio::post(io_, [this] { die("the remote backend was shut down"); });
    // die() closed the socket and cancelled the timer: their handlers end, and
    // with the guard gone the io thread runs out of work and returns.
    work_.reset();
    thread_.join();
  }
  {
    Lock lock(mu_);
    kv_stopping_ = true;
  }
  kv_cv_.notify_all();
  for (auto& t : kv_threads_) t.join();
}

std::optional<std::string> Connection::dead_reason() const {
  Lock lock(mu_);
  if (!dead_) return std::nullopt;
  return dead_reason_;
}

ConnectionStats Connection::stats() const {
  Lock lock(mu_);
  return stats_;
}

// ---- Handshake ---------------------------------------------------------------

void Connection::refuse(const std::string& message) const {
  throw plugin::Failure(BP_STATUS_UNAVAILABLE, message);
}

// Runs one asynchronous step on io_ (this thread) until it completes or the
// deadline passes; false on the deadline, after `cancel` made it complete.
template <class Start>
bool Connection::step(Clock::time_point deadline, error_code& ec, Start start) {
  bool done = false;
  start([&](const error_code& e, auto&&...) {
    ec = e;
    done = true;
  });
  io_.restart();
  while (!done) {
    const auto now = Clock::now();
    if (now >= deadline) {
      if (stream_ != nullptr) stream_->close();
      io_.restart();
      while (!done) io_.run_one();
      return false;
    }
    io_.run_one_for(deadline - now);
  }
  return true;
}

void Connection::connect(Clock::time_point deadline) {
  const std::string where = "cannot connect to " + settings_.endpoint + ": ";
  const std::string advice =
      "; start `backplane serve --listen " + settings_.endpoint + "` there, or remove it from \"endpoints\"";
  const std::string late = " within " + ms_text(settings_.connect_timeout) + " (connect_timeout_ms)";
  tcp::resolver resolver(io_);
  tcp::resolver::results_type results;
  error_code ec;
  bool in_time = step(deadline, ec, [&](auto handler) {
    resolver.async_resolve(
        host_, std::to_string(port_), tcp::resolver::numeric_service,
        [&results, h = std::move(handler)](const error_code& e, tcp::resolver::results_type r) mutable {
          results = std::move(r);
          h(e);
        });
  });
  if (!in_time) {
    resolver.cancel();
    refuse(where + "cannot resolve '" + host_ + "'" + late + advice);
  }
  if (ec) refuse(where + "cannot resolve '" + host_ + "': " + ec.message() + advice);

  tcp::socket socket(io_);
  bool done = false;
  asio::async_connect(socket, results, [&](const error_code& e, const tcp::endpoint&) {
    ec = e;
    done = true;
  });
  io_.restart();
  while (!done) {
    const auto now = Clock::now();
    if (now >= deadline) {
      error_code ignored;
      socket.close(ignored);  // completes the connect with operation_aborted
      io_.restart();
      while (!done) io_.run_one();
      refuse(where + "no answer" + late + advice);
    }
    io_.run_one_for(deadline - now);
  }
  if (ec) refuse(where + ec.message() + advice);
  error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);  // small requests must not wait for Nagle
  stream_ = std::make_unique<wire::Stream>(std::move(socket), settings_.tls);
  if (settings_.tls == nullptr) plain_fd_ = stream_->socket().native_handle();
}

void Connection::send_now(Clock::time_point deadline, const wire::Encoded& frame) {
  error_code ec;
  if (!step(deadline, ec, [&](auto h) { stream_->async_write(asio::buffer(frame.bytes), std::move(h)); }))
    refuse("the server at " + settings_.endpoint + " did not take the handshake within " +
           ms_text(settings_.connect_timeout) + " (connect_timeout_ms)");
  if (ec) refuse(closed_in_handshake_text(settings_.endpoint, ec, settings_.connect_timeout, tls()));
}

const wire::Message* Connection::receive_now(Clock::time_point deadline, const char* expecting) {
  const std::string& ep = settings_.endpoint;
  const auto fail_read = [&](const error_code& ec, bool in_time) {
    if (!in_time) refuse(no_handshake_answer_text(ep, settings_.connect_timeout, tls()));
    if (closed_by_peer(ec)) refuse(closed_in_handshake_text(ep, ec, settings_.connect_timeout, tls()));
    refuse("the handshake with " + ep + " failed: " + ec.message());
  };
  error_code ec;
  bool in_time =
      step(deadline, ec, [&](auto h) { stream_->async_read(asio::buffer(header_), std::move(h)); });
  if (!in_time || ec) fail_read(ec, in_time);
  std::string why;
  const auto header = wire::decode_header(header_, wire::kDefaultMaxMessageBytes, 0, why);
  if (!header)
    refuse("the server at " + ep + " answered with something that is not a backplane remote frame (" + why +
           "): is " + ep + " a `backplane serve` endpoint" +
           (tls() ? "?" : ", or does it require TLS (set \"tls_ca\")?"));
  message_.resize(header->message_bytes);
  in_time = step(deadline, ec, [&](auto h) { stream_->async_read(asio::buffer(message_), std::move(h)); });
  if (!in_time || ec) fail_read(ec, in_time);
  const wire::Message* m = wire::verify_message(message_, why);
  if (m == nullptr) refuse("the server at " + ep + " sent a malformed handshake message: " + why);
  if (m->body_type() == wire::Body::Fatal) {
    const wire::Fatal* f = m->body_as_Fatal();
    refuse("the server at " + ep + " refused the session: " +
           (f->message() != nullptr ? f->message()->str() : std::string("no reason given")));
  }
  if (wire::EnumNameBody(m->body_type()) != std::string(expecting))
    refuse("the server at " + ep + " sent " + wire::body_name(m->body_type()) +
           " where the handshake expects " + expecting + "; is it a `backplane serve` of another version?");
  return m;
}

void Connection::handshake(Clock::time_point deadline) {
  const std::string& ep = settings_.endpoint;
  error_code ec;
  if (tls()) {
    const std::string name = settings_.tls_server_name.empty() ? host_ : settings_.tls_server_name;
    auto& ssl = stream_->ssl();
    error_code not_address;
    asio::ip::make_address(name, not_address);
    // SNI carries names only, never addresses (RFC 6066).
    if (not_address) SSL_set_tlsext_host_name(ssl.native_handle(), name.c_str());
    ssl.set_verify_callback(asio::ssl::host_name_verification(name));
    const bool in_time = step(deadline, ec, [&](auto h) {
      stream_->async_handshake(asio::ssl::stream_base::client, std::move(h));
    });
    if (!in_time)
      refuse("the server at " + ep + " did not complete the TLS handshake within " +
             ms_text(settings_.connect_timeout) + " (connect_timeout_ms)");
    if (ec)
      refuse("the TLS handshake with " + ep + " failed (" + ec.message() +
             "): the server may not use TLS (then remove \"tls_ca\"), or its certificate is not signed by "
             "the CA "
             "in \"tls_ca\" or not issued for \"" +
             name + "\" (set \"tls_server_name\")");
  }

  const wire::Nonce client_nonce = wire::random_nonce();
  {
    flatbuffers::FlatBufferBuilder fbb;
    const auto version = fbb.CreateString(settings_.client_version);
    const auto nonce = fbb.CreateVector(client_nonce.data(), client_nonce.size());
    const auto hello = wire::CreateHello(fbb, wire::kProtocolVersion, version, nonce);
    send_now(deadline, wire::finish(fbb, wire::CreateMessage(fbb, 0, wire::Body::Hello, hello.Union())));
  }

  const wire::Challenge* challenge = receive_now(deadline, "Challenge")->body_as_Challenge();
  info_.protocol = challenge->protocol();
  info_.server_version = challenge->server_version() != nullptr ? challenge->server_version()->str() : "";
  if (info_.protocol != wire::kProtocolVersion)
    refuse("the server at " + ep + " speaks remote protocol " + std::to_string(info_.protocol) +
           " (backplane " + info_.server_version + "); this client speaks " +
           std::to_string(wire::kProtocolVersion) + ": run the same backplane version on both sides");
  const bool has_token = !settings_.token.empty();
  if (challenge->auth_required() && !has_token)
    refuse("the server at " + ep + " requires a token and this client has none: " + settings_.token_source);
  if (!challenge->auth_required() && has_token)
    refuse(
        "the server at " + ep +
        " does not authenticate, but this client holds a token: it could be an impostor, so it is refused; "
        "start the server with the same token (`backplane serve --token-file FILE`), or give this client "
        "none");
  {
    const auto* ns = challenge->nonce();
    trace_flow_key_ =
        wire::trace_flow_key(client_nonce, ns != nullptr ? std::span<const uint8_t>(ns->data(), ns->size())
                                                         : std::span<const uint8_t>());
  }
  std::vector<uint8_t> proof;
  if (has_token) {
    const auto* server_nonce = challenge->nonce();
    const auto* server_proof = challenge->server_proof();
    if (server_nonce == nullptr || server_nonce->size() != wire::kNonceBytes || server_proof == nullptr)
      refuse("the server at " + ep + " sent a Challenge without a " + std::to_string(wire::kNonceBytes) +
             "-byte nonce and a proof; is it a `backplane serve` of another version?");
    const std::span<const uint8_t> ns(server_nonce->data(), server_nonce->size());
    const wire::Mac expected = wire::server_proof(settings_.token, client_nonce, ns);
    if (!wire::same_mac(expected, std::span<const uint8_t>(server_proof->data(), server_proof->size())))
      refuse(
          "the server at " + ep +
          " does not accept this token (its proof shows it holds a different one); give both sides the same "
          "token: " +
          settings_.token_source);
    const wire::Mac mine = wire::client_proof(settings_.token, client_nonce, ns);
    proof.assign(mine.begin(), mine.end());
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    const auto bytes = fbb.CreateVector(proof);
    const auto body = wire::CreateProof(fbb, bytes);
    send_now(deadline, wire::finish(fbb, wire::CreateMessage(fbb, 0, wire::Body::Proof, body.Union())));
  }
  const wire::Welcome* welcome = receive_now(deadline, "Welcome")->body_as_Welcome();
  if (const std::string why = decode_welcome(*welcome, info_); !why.empty())
    refuse("the server at " + ep + " sent a device list this client cannot use: " + why);
}

void Connection::open() {
  const auto deadline = Clock::now() + settings_.connect_timeout;
  connect(deadline);
  handshake(deadline);
  // The handshake left io_ without work, which stops it: restart before running for good.
  io_.restart();
  work_.emplace(io_.get_executor());
  last_send_ = Clock::now();
  read_header();
  if (settings_.heartbeat.count() > 0) arm_heartbeat();
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        die(std::string("internal error on the connection's io thread: ") + e.what());
      }
    }
  });
}

// ---- Queueing (callers) -----------------------------------------------------------

void Connection::check_alive_locked() const {
  if (dead_) [[unlikely]]
    throw plugin::Failure(BP_STATUS_UNAVAILABLE, unreachable(settings_.endpoint, dead_reason_));
}

// Appends one frame (and a payload: copied, or borrowed when `ticket` is
// given) to the queue, and wakes the io thread unless a flush is pending:
// frames queued meanwhile leave together in one gathered write.
void Connection::push_locked(uint64_t id, wire::Body type, flatbuffers::Offset<void> body,
                             const void* payload, uint64_t payload_bytes,
                             const std::shared_ptr<WriteTicket>& ticket, bool urgent) {
  fbb_.Finish(wire::CreateMessage(fbb_, id, type, body));
  if (plugin::trace_active() && type != wire::Body::KvReply) [[unlikely]]
    trace_sent(id, type, payload_bytes);
  const auto size = fbb_.GetSize();
  const auto header = wire::encode_header(wire::Header{static_cast<uint32_t>(size), payload_bytes});
  if (queue_.empty() || queue_.back().borrowed != nullptr) queue_.emplace_back();
  Segment& segment = queue_.back();
  segment.bytes.insert(segment.bytes.end(), header.begin(), header.end());
  segment.bytes.insert(segment.bytes.end(), fbb_.GetBufferPointer(), fbb_.GetBufferPointer() + size);
  const auto* bytes = static_cast<const uint8_t*>(payload);
  if (ticket != nullptr) {
    segment.borrowed = bytes;
    segment.borrowed_size = payload_bytes;
    segment.ticket = ticket;
  } else if (payload_bytes > 0) {
    segment.bytes.insert(segment.bytes.end(), bytes, bytes + payload_bytes);
  }
  ++stats_.frames_sent;
  if (write_scheduled_) return;  // the io thread will take it with whatever else is queued
  if (urgent && plain_fd_ >= 0 && queue_.size() == 1 && ticket == nullptr) {
    // A synchronising request with nothing else queued or being written: the
    // caller sends it itself (one thread handoff less on every round trip).
    // Plain TCP only (TLS allows one thread per stream); ordering holds
    // because no write is in flight and mu_ is held. What the kernel does
    // not take at once is left for the io thread.
    const ssize_t n =
        ::send(plain_fd_, segment.bytes.data(), segment.bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      ++stats_.writes;
      last_send_ = Clock::now();
      if (static_cast<std::size_t>(n) == segment.bytes.size()) {
        queue_.clear();
        return;
      }
      segment.bytes.erase(segment.bytes.begin(), segment.bytes.begin() + n);
    }
  }
  write_scheduled_ = true;
  asio::post(io_, [this] { flush(); });
}

std::shared_ptr<Connection::Pending> Connection::call_locked(wire::Body type, flatbuffers::Offset<void> body,
                                                             int kind, const char* what, uint64_t comm) {
  auto p = std::make_shared<Pending>();
  p->kind = static_cast<Pending::Kind>(kind);
  p->id = next_request_++;
  p->what = what;
  p->comm = comm;
  pending_.emplace(p->id, p);
  push_locked(p->id, type, body, nullptr, 0, nullptr, /*urgent=*/kind != Pending::ping);
  return p;
}

// A request leaves: the start of its flow to the server's run of it (the
// server's trace holds the other end, with the same id).
void Connection::trace_sent(uint64_t id, wire::Body type, uint64_t payload_bytes) const noexcept {
  bp_trace_event e{};
  e.category = "remote";
  e.name = wire::EnumNameBody(type);
  e.start_ns = e.end_ns = plugin::trace_now_ns();
  e.bytes = static_cast<int64_t>(payload_bytes);
  e.number_key = "request";
  e.number = static_cast<int64_t>(id);
  e.text_key = "server";
  e.text = settings_.endpoint.c_str();
  e.flow = BP_TRACE_FLOW_OUT;
  e.flow_id = wire::trace_flow_id(trace_flow_key_, id);
  plugin::trace_event(e);
}

void Connection::wait_locked(Lock& lock, Pending& p, Clock::time_point deadline) {
  const int64_t t0 = plugin::trace_active() ? plugin::trace_now_ns() : -1;
  wait_for_reply_locked(lock, p, deadline);
  if (t0 >= 0 && p.status == BP_STATUS_OK) [[unlikely]] {  // the round trip, as the caller waited for it
    bp_trace_event e{};
    e.category = "remote";
    e.name = p.what;
    e.start_ns = t0;
    e.end_ns = plugin::trace_now_ns();
    e.bytes = p.kind == Pending::read ? static_cast<int64_t>(p.size) : -1;
    e.number_key = "request";
    e.number = static_cast<int64_t>(p.id);
    plugin::trace_event(e);
  }
}

void Connection::wait_for_reply_locked(Lock& lock, Pending& p, Clock::time_point deadline) {
  while (!p.done) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !p.done) {
      const auto waited = settings_.request_timeout;
      const std::string reason = std::string("no reply to ") + p.what + " (request " + std::to_string(p.id) +
                                 ") within " + ms_text(waited) + " (request_timeout_ms)";
      lock.unlock();
      kill(reason);
      lock.lock();
      // die() on the io thread completes every pending request, this one too.
      cv_.wait(lock, [&] { return p.done; });
    }
  }
}

void Connection::finish_or_throw(const Pending& p) const {
  if (p.status != BP_STATUS_OK) throw plugin::Failure(static_cast<bp_status_code>(p.status), p.message);
}

uint64_t Connection::chunk_limit() const noexcept {
  const uint64_t limit = info_.max_frame_bytes;
  if (limit == 0) return kDefaultChunkBytes;
  const uint64_t chunk = limit > 2 * kMessageRoom ? limit - kMessageRoom : limit / 2;
  return std::max<uint64_t>(std::min(chunk, kDefaultChunkBytes), 1);
}

void Connection::alloc(uint64_t buffer, int32_t device, uint64_t size) {
  Lock lock(mu_);
  check_alive_locked();
  fbb_.Clear();
  const auto body = wire::CreateAlloc(fbb_, buffer, device, size);
  push_locked(next_request_++, wire::Body::Alloc, body.Union(), nullptr, 0, nullptr);
}

void Connection::free(uint64_t buffer) {
  Lock lock(mu_);
  if (dead_) return;  // the server freed the session with everything in it
  fbb_.Clear();
  const auto body = wire::CreateFree(fbb_, buffer);
  push_locked(next_request_++, wire::Body::Free, body.Union(), nullptr, 0, nullptr);
}

void Connection::write(uint64_t buffer, uint64_t offset, const void* src, uint64_t size) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  Lock lock(mu_);
  check_alive_locked();
  if (size <= settings_.max_coalesce_bytes && size <= chunk_limit()) {
    fbb_.Clear();
    const auto body = wire::CreateWrite(fbb_, buffer, offset, size);
    push_locked(next_request_++, wire::Body::Write, body.Union(), bytes, size, nullptr);
    return;
  }
  // Large: the io thread sends straight from `src` (no copy); the ABI lets the
  // caller reuse src once this returns, so wait until it has been written.
  const uint64_t chunk = chunk_limit();
  std::vector<std::shared_ptr<WriteTicket>> tickets;
  for (uint64_t done = 0; done < size;) {
    const uint64_t n = std::min(chunk, size - done);
    auto ticket = std::make_shared<WriteTicket>();
    fbb_.Clear();
    const auto body = wire::CreateWrite(fbb_, buffer, offset + done, n);
    push_locked(next_request_++, wire::Body::Write, body.Union(), bytes + done, n, ticket);
    tickets.push_back(std::move(ticket));
    done += n;
  }
  for (const auto& ticket : tickets) {
    // Each chunk may take request_timeout to leave: a server that stops reading is dead.
    const auto deadline = Clock::now() + settings_.request_timeout;
    while (!ticket->done) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !ticket->done) {
        const std::string reason = "the server took no data of a " + std::to_string(size) +
                                   "-byte buffer_write within " + ms_text(settings_.request_timeout) +
                                   " (request_timeout_ms)";
        lock.unlock();
        kill(reason);
        lock.lock();
        cv_.wait(lock, [&] { return ticket->done; });
      }
    }
  }
  for (const auto& ticket : tickets)
    if (!ticket->written)
      throw plugin::Failure(BP_STATUS_UNAVAILABLE, unreachable(settings_.endpoint, dead_reason_));
}

void Connection::execute(int32_t device, int32_t op, std::span<const Operand> inputs,
                         std::span<const Operand> outputs, const bp_op_attrs& attrs) {
  Lock lock(mu_);
  check_alive_locked();
  fbb_.Clear();
  std::vector<flatbuffers::Offset<wire::TensorDesc>> ins, outs;
  ins.reserve(inputs.size());
  outs.reserve(outputs.size());
  char field[32];
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::snprintf(field, sizeof field, "inputs[%zu]", i);
    ins.push_back(encode_tensor(fbb_, *inputs[i].tensor, inputs[i].buffer, field));
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    std::snprintf(field, sizeof field, "outputs[%zu]", i);
    outs.push_back(encode_tensor(fbb_, *outputs[i].tensor, outputs[i].buffer, field));
  }
  const auto in_vec = fbb_.CreateVector(ins);
  const auto out_vec = fbb_.CreateVector(outs);
  const auto body = wire::CreateExecute(fbb_, device, op, in_vec, out_vec, attrs.axis, attrs.dtype,
                                        attrs.scalar0, attrs.scalar1, attrs.seed);
  push_locked(next_request_++, wire::Body::Execute, body.Union(), nullptr, 0, nullptr);
}

void Connection::read(uint64_t buffer, uint64_t offset, void* dst, uint64_t size) {
  Lock lock(mu_);
  check_alive_locked();
  const uint64_t chunk = chunk_limit();
  std::vector<std::shared_ptr<Pending>> parts;
  uint64_t done = 0;
  do {
    const uint64_t n = std::min(chunk, size - done);
    fbb_.Clear();
    const auto body = wire::CreateRead(fbb_, buffer, offset + done, n);
    auto p = call_locked(wire::Body::Read, body.Union(), Pending::read, "buffer_read");
    // The io thread reads the reply's payload straight into dst (it takes mu_ to find p first).
    p->dst = static_cast<uint8_t*>(dst) + done;
    p->size = n;
    parts.push_back(std::move(p));
    done += n;
  } while (done < size);
  for (const auto& p : parts) wait_locked(lock, *p, Clock::now() + settings_.request_timeout);
  for (const auto& p : parts) finish_or_throw(*p);
}

void Connection::synchronize(int32_t device) {
  Lock lock(mu_);
  check_alive_locked();
  fbb_.Clear();
  const auto body = wire::CreateSynchronize(fbb_, device);
  const auto p = call_locked(wire::Body::Synchronize, body.Union(), Pending::reply, "synchronize");
  wait_locked(lock, *p, Clock::now() + settings_.request_timeout);
  finish_or_throw(*p);
}

std::pair<uint64_t, uint64_t> Connection::memory(int32_t device) {
  Lock lock(mu_);
  check_alive_locked();
  fbb_.Clear();
  const auto body = wire::CreateMemoryQuery(fbb_, device);
  const auto p = call_locked(wire::Body::MemoryQuery, body.Union(), Pending::memory, "device_memory");
  wait_locked(lock, *p, Clock::now() + settings_.request_timeout);
  finish_or_throw(*p);
  return {p->free_bytes, p->total_bytes};
}

// ---- Collectives ----------------------------------------------------------------

void Connection::comm_create(uint64_t comm, int32_t device, int32_t rank, int32_t world_size,
                             int64_t timeout_ms, const std::string& key_prefix, const bp_kv_store* store) {
  auto entry = std::make_shared<CommEntry>();
  entry->id = comm;
  entry->key_prefix = key_prefix;
  entry->store = store;
  Lock lock(mu_);
  check_alive_locked();
  comms_[comm] = entry;
  fbb_.Clear();
  const auto prefix = fbb_.CreateString(key_prefix);
  const auto body = wire::CreateCommCreate(fbb_, comm, device, rank, world_size, timeout_ms, prefix);
  const auto p = call_locked(wire::Body::CommCreate, body.Union(), Pending::reply, "comm_create");
  const milliseconds extra(timeout_ms > 0 ? timeout_ms : 0);
  wait_locked(lock, *p, Clock::now() + settings_.request_timeout + extra);
  if (p->status != BP_STATUS_OK) {
    // No communicator: forget it once the store calls made for it are over
    // (the store is the caller's only until this returns).
    cv_.wait(lock, [&] { return entry->active_tasks == 0; });
    comms_.erase(comm);
    finish_or_throw(*p);
  }
}

void Connection::comm_destroy(uint64_t comm) {
  Lock lock(mu_);
  const auto it = comms_.find(comm);
  if (it == comms_.end()) return;
  const std::shared_ptr<CommEntry> entry = it->second;
  std::shared_ptr<Pending> p;
  if (!dead_) {
    fbb_.Clear();
    const auto body = wire::CreateCommDestroy(fbb_, comm);
    p = call_locked(wire::Body::CommDestroy, body.Union(), Pending::reply, "comm_destroy");
    wait_locked(lock, *p, Clock::now() + settings_.request_timeout);
  }
  // The store is valid only until this returns: wait for the calls still using it.
  cv_.wait(lock, [&] { return entry->active_tasks == 0; });
  comms_.erase(comm);
  // A connection that died meanwhile freed the communicator with the session.
  if (p != nullptr && !dead_) finish_or_throw(*p);
}

void Connection::comm_abort(uint64_t comm) {
  Lock lock(mu_);
  if (const auto it = comms_.find(comm); it != comms_.end()) it->second->aborted = true;
  // Every collective waiting on the communicator fails now; its reply, when it
  // comes, is dropped.
  for (auto& [id, p] : pending_) {
    if (p->comm == comm && !p->done) {
      p->abandoned = true;
      p->done = true;
      p->status = BP_STATUS_COLLECTIVE;
      p->message = std::string(p->what) + " on a communicator of server " + settings_.endpoint +
                   ": the communicator was aborted (comm_abort)";
    }
  }
  cv_.notify_all();
  if (dead_) return;
  fbb_.Clear();
  const auto body = wire::CreateCommAbort(fbb_, comm);
  push_locked(next_request_++, wire::Body::CommAbort, body.Union(), nullptr, 0, nullptr);
}

void Connection::collective(uint64_t comm, wire::CollectiveKind kind, const Operand* input,
                            const Operand* output, int32_t reduce_op, int32_t root, int64_t timeout_ms) {
  const char* what = wire::EnumNameCollectiveKind(kind);
  Lock lock(mu_);
  check_alive_locked();
  const auto it = comms_.find(comm);
  if (it == comms_.end())
    fail(BP_STATUS_INVALID_ARGUMENT, "remote: not a live communicator of server " + settings_.endpoint);
  if (it->second->aborted)
    fail(BP_STATUS_COLLECTIVE,
         std::string("remote: ") + what + ": the communicator was aborted (comm_abort)");
  fbb_.Clear();
  flatbuffers::Offset<wire::TensorDesc> in, out;
  if (input != nullptr) in = encode_tensor(fbb_, *input->tensor, input->buffer, "input");
  if (output != nullptr) out = encode_tensor(fbb_, *output->tensor, output->buffer, "output");
  const auto body = wire::CreateCollective(fbb_, comm, kind, in, out, reduce_op, root);
  const auto p = call_locked(wire::Body::Collective, body.Union(), Pending::reply, what, comm);
  const milliseconds extra(timeout_ms > 0 ? timeout_ms : 0);
  wait_locked(lock, *p, Clock::now() + settings_.request_timeout + extra);
  finish_or_throw(*p);
}

// ---- The io thread ---------------------------------------------------------------

void Connection::flush() {
  {
    Lock lock(mu_);
    if (dead_ || !writing_.empty()) return;  // dead: die() released everything; writing: on_written continues
    if (queue_.empty()) {
      write_scheduled_ = false;
      cv_.notify_all();  // the destructor waits for the Goodbye to leave
      return;
    }
    for (auto& segment : queue_) writing_.push_back(std::move(segment));
    queue_.clear();
    ++stats_.writes;
    last_send_ = Clock::now();
  }
  std::vector<asio::const_buffer> buffers;
  buffers.reserve(writing_.size() * 2);
  for (const auto& segment : writing_) {
    buffers.emplace_back(segment.bytes.data(), segment.bytes.size());
    if (segment.borrowed_size > 0) buffers.emplace_back(segment.borrowed, segment.borrowed_size);
  }
  stream_->async_write(buffers, [this](const error_code& ec, std::size_t) { on_written(ec); });
}

void Connection::on_written(const error_code& ec) {
  if (ec) {
    die(lost(ec));
    writing_.clear();
    return;
  }
  {
    Lock lock(mu_);
    bool any = false;
    for (auto& segment : writing_) {
      if (segment.ticket != nullptr) {
        segment.ticket->done = true;
        segment.ticket->written = true;
        any = true;
      }
    }
    if (any) cv_.notify_all();
  }
  writing_.clear();
  flush();
}

void Connection::read_header() {
  stream_->async_read(asio::buffer(header_), [this](const error_code& ec, std::size_t) { on_header(ec); });
}

void Connection::on_header(const error_code& ec) {
  if (ec) return die(lost(ec));
  std::string why;
  // A payload comes only with a ReadReply, whose size is checked against its
  // request (and goes straight into the caller's memory): no limit here.
  const auto header = wire::decode_header(header_, wire::kDefaultMaxMessageBytes, UINT64_MAX, why);
  if (!header) return die("protocol violation by the server: " + why);
  frame_ = *header;
  message_.resize(frame_.message_bytes);
  stream_->async_read(asio::buffer(message_), [this](const error_code& e, std::size_t) { on_message(e); });
}

void Connection::complete(const std::shared_ptr<Pending>& p, int32_t status, std::string message) {
  Lock lock(mu_);
  if (dead_) return;  // die() completed it
  pending_.erase(p->id);
  if (!p->abandoned) {
    p->status = status;
    p->message = std::move(message);
    p->done = true;
    cv_.notify_all();
  }
}

void Connection::on_message(const error_code& ec) {
  if (ec) return die(lost(ec));
  std::string why;
  const wire::Message* m = wire::verify_message(message_, why);
  if (m == nullptr) return die("protocol violation by the server: " + why);
  const uint64_t id = m->id();
  const wire::Body type = m->body_type();
  const auto violation = [&](const std::string& what) { die("protocol violation by the server: " + what); };
  switch (type) {
    case wire::Body::Reply:
    case wire::Body::ReadReply:
    case wire::Body::MemoryReply: {
      std::shared_ptr<Pending> p;
      {
        Lock lock(mu_);
        if (dead_) return;
        if (const auto it = pending_.find(id); it != pending_.end()) p = it->second;
        if (p == nullptr && (id == 0 || id >= next_request_))
          return violation(std::string("a ") + wire::body_name(type) + " to request " + std::to_string(id) +
                           ", which this client never sent");
      }
      if (p == nullptr) {
        // A reply to a request nobody waits for (a pipelined one the server
        // answered anyway): nothing to deliver.
        if (frame_.payload_bytes != 0)
          return violation(std::string("a ") + wire::body_name(type) + " with payload to request " +
                           std::to_string(id) + ", which waits for none");
        plugin::log(BP_LOG_DEBUG, "remote: server " + settings_.endpoint + " answered request " +
                                      std::to_string(id) + ", which waits for no reply; ignored");
        break;
      }
      const bool fits = (type == wire::Body::ReadReply) == (p->kind == Pending::read) &&
                        (type == wire::Body::MemoryReply) == (p->kind == Pending::memory);
      if (!fits)
        return violation(std::string("a ") + wire::body_name(type) + " to " + p->what + " (request " +
                         std::to_string(id) + ")");
      int32_t status = 0;
      const flatbuffers::String* text = nullptr;
      if (type == wire::Body::Reply) {
        status = m->body_as_Reply()->status();
        text = m->body_as_Reply()->message();
      } else if (type == wire::Body::MemoryReply) {
        const wire::MemoryReply* r = m->body_as_MemoryReply();
        status = r->status();
        text = r->message();
        Lock lock(mu_);
        p->free_bytes = r->free_bytes();
        p->total_bytes = r->total_bytes();
      } else {
        const wire::ReadReply* r = m->body_as_ReadReply();
        status = r->status();
        text = r->message();
        if (status == BP_STATUS_OK) {
          if (r->size() != p->size || frame_.payload_bytes != p->size)
            return violation("a ReadReply to request " + std::to_string(id) + " that carries " +
                             std::to_string(frame_.payload_bytes) + " bytes (says " +
                             std::to_string(r->size()) + "); " + std::to_string(p->size) + " were asked");
          if (p->size > 0) {
            reading_into_ = p;
            stream_->async_read(asio::buffer(p->dst, p->size),
                                [this](const error_code& e, std::size_t) { on_payload(e); });
            return;
          }
        }
      }
      if (status != BP_STATUS_OK && frame_.payload_bytes != 0)
        return violation("a failed " + std::string(wire::body_name(type)) + " that carries payload");
      if (status == BP_STATUS_OK && type != wire::Body::ReadReply && frame_.payload_bytes != 0)
        return violation(std::string("a ") + wire::body_name(type) + " that carries payload");
      if (p->kind == Pending::ping) ping_.reset();
      if (status == BP_STATUS_OK)
        complete(p, BP_STATUS_OK, "");
      else
        complete(p, server_status_code(status),
                 server_failure(settings_.endpoint, status, text != nullptr ? text->str() : std::string()));
      break;
    }
    case wire::Body::KvRequest:
      if (frame_.payload_bytes != 0) return violation("a KvRequest that carries payload");
      handle_kv_request(id, *m->body_as_KvRequest());
      break;
    case wire::Body::Fatal: {
      const wire::Fatal* f = m->body_as_Fatal();
      return die("the server ended the session: " +
                 (f->message() != nullptr ? f->message()->str() : std::string("no reason given")));
    }
    default:
      return violation(std::string("it sent ") + wire::body_name(type) +
                       ", which a server never sends once the session has begun");
  }
  read_header();
}

void Connection::on_payload(const error_code& ec) {
  std::shared_ptr<Pending> p = std::move(reading_into_);
  if (ec) return die(lost(ec));  // completes p with the reason
  complete(p, BP_STATUS_OK, "");
  read_header();
}

void Connection::arm_heartbeat() {
  const auto tick = std::clamp<milliseconds>(settings_.heartbeat / 2, milliseconds(5), milliseconds(1000));
  heartbeat_timer_.expires_after(tick);
  heartbeat_timer_.async_wait([this](const error_code& ec) {
    if (!ec) on_heartbeat();
  });
}

// A Ping after heartbeat_ms without sending keeps the session alive (the
// server closes idle ones) and proves the server alive: no reply within
// request_timeout_ms and the connection is dead.
void Connection::on_heartbeat() {
  const auto now = Clock::now();
  {
    Lock lock(mu_);
    if (dead_) return;
    if (ping_ != nullptr) {
      if (now - ping_sent_ > settings_.request_timeout) {
        lock.unlock();
        return die("no reply to a heartbeat within " + ms_text(settings_.request_timeout) +
                   " (request_timeout_ms)");
      }
    } else if (now - last_send_ >= settings_.heartbeat) {
      fbb_.Clear();
      const auto body = wire::CreatePing(fbb_);
      ping_ = call_locked(wire::Body::Ping, body.Union(), Pending::ping, "heartbeat");
      ping_sent_ = now;
    }
  }
  arm_heartbeat();
}

void Connection::die(const std::string& reason) {
  bool expected = false;
  {
    Lock lock(mu_);
    if (dead_) return;
    expected = shutting_down_;
    dead_ = true;
    dead_reason_ = reason;
    const std::string message = unreachable(settings_.endpoint, reason);
    for (auto& [id, p] : pending_) {
      if (p->done) continue;
      p->done = true;
      p->status = BP_STATUS_UNAVAILABLE;
      p->message = message;
    }
    pending_.clear();
    // Nothing is written any more: release every caller whose bytes were queued or in flight.
    for (auto& segment : queue_)
      if (segment.ticket != nullptr) segment.ticket->done = true;
    queue_.clear();
    for (auto& segment : writing_)
      if (segment.ticket != nullptr) segment.ticket->done = true;
    // Key-value requests not started yet: the server that asked is gone.
    for (auto& task : kv_queue_) --task.comm->active_tasks;
    kv_queue_.clear();
    // Closed before the callers wake: once they return, no I/O touches their memory.
    if (stream_ != nullptr) stream_->close();
    cv_.notify_all();
  }
  heartbeat_timer_.cancel();
  ping_.reset();
  reading_into_.reset();
  if (!expected) plugin::log(BP_LOG_WARNING, "remote: " + unreachable(settings_.endpoint, reason));
}

void Connection::kill(const std::string& reason) {
  asio::post(io_, [this, reason] { die(reason); });
}

// ---- The key-value bridge ---------------------------------------------------------------

void Connection::handle_kv_request(uint64_t id, const wire::KvRequest& request) {
  KvTask task;
  task.id = id;
  task.kind = request.kind();
  if (request.keys() != nullptr)
    for (const flatbuffers::String* key : *request.keys())
      task.keys.push_back(key != nullptr ? key->str() : "");
  if (request.value() != nullptr) task.value.assign(request.value()->begin(), request.value()->end());
  task.timeout_ms = request.timeout_ms();
  const bool one_key = task.kind == wire::KvKind::Set || task.kind == wire::KvKind::Get;
  std::string refused;
  if (task.kind != wire::KvKind::Set && task.kind != wire::KvKind::Get && task.kind != wire::KvKind::Wait)
    refused = "unknown key-value request kind " + std::to_string(static_cast<int>(task.kind));
  else if (task.keys.empty() || (one_key && task.keys.size() != 1))
    refused = std::string("a key-value ") + wire::EnumNameKvKind(task.kind) + " with " +
              std::to_string(task.keys.size()) + " keys";
  Lock lock(mu_);
  if (dead_) return;
  if (refused.empty()) {
    // The communicator whose key prefix the keys carry (the longest one: prefixes may nest).
    for (const auto& [comm_id, entry] : comms_) {
      const bool all = std::all_of(task.keys.begin(), task.keys.end(), [&](const std::string& k) {
        return k.compare(0, entry->key_prefix.size(), entry->key_prefix) == 0;
      });
      if (all && (task.comm == nullptr || entry->key_prefix.size() > task.comm->key_prefix.size()))
        task.comm = entry;
    }
    if (task.comm == nullptr)
      refused =
          "key \"" + task.keys.front() + "\" belongs to no communicator this client created on the server";
    else if (task.comm->store == nullptr)
      refused = "the communicator has no key-value store";
  }
  if (!refused.empty()) {
    lock.unlock();
    return send_kv_reply(id, BP_STATUS_INVALID_ARGUMENT, "remote client: " + refused, {});
  }
  ++task.comm->active_tasks;
  kv_queue_.push_back(std::move(task));
  if (kv_idle_ == 0 && kv_threads_.size() < kMaxKvThreads) kv_threads_.emplace_back([this] { kv_worker(); });
  kv_cv_.notify_one();
}

void Connection::kv_worker() {
  Lock lock(mu_);
  for (;;) {
    ++kv_idle_;
    kv_cv_.wait(lock, [&] { return kv_stopping_ || !kv_queue_.empty(); });
    --kv_idle_;
    if (kv_queue_.empty()) return;  // stopping
    KvTask task = std::move(kv_queue_.front());
    kv_queue_.pop_front();
    lock.unlock();
    run_kv_task(task);
    lock.lock();
    --task.comm->active_tasks;
    cv_.notify_all();  // comm_destroy waits for the calls on its store
  }
}

// Calls the job's store as the server's plugin asked and answers with the
// same id. Statuses and values are freed with the store's own entries.
void Connection::run_kv_task(KvTask& task) {
  const bp_kv_store& kv = *task.comm->store;
  int64_t timeout = task.timeout_ms > 0 ? task.timeout_ms : settings_.request_timeout.count();
  timeout = std::min(timeout, kMaxKvTimeoutMs);
  int32_t code = BP_STATUS_OK;
  std::string message;
  std::vector<uint8_t> value;
  const auto take = [&](bp_status* s) {
    if (s == nullptr) return;
    code = kv.status_code != nullptr ? kv.status_code(s) : BP_STATUS_INTERNAL;
    if (code == BP_STATUS_OK) code = BP_STATUS_INTERNAL;
    message = kv.status_message != nullptr ? kv.status_message(s) : "the store failed";
    if (kv.status_free != nullptr) kv.status_free(s);
  };
  switch (task.kind) {
    case wire::KvKind::Set: {
      if (kv.set == nullptr) {
        code = BP_STATUS_UNSUPPORTED;
        message = "the job's store has no set";
        break;
      }
      bp_kv_set_args a{BP_KV_SET_ARGS_STRUCT_SIZE, kv.ctx, task.keys[0].c_str(), task.value.data(),
                       task.value.size(),          timeout};
      take(kv.set(&a));
      break;
    }
    case wire::KvKind::Get: {
      if (kv.get == nullptr) {
        code = BP_STATUS_UNSUPPORTED;
        message = "the job's store has no get";
        break;
      }
      bp_kv_get_args a{BP_KV_GET_ARGS_STRUCT_SIZE, kv.ctx, task.keys[0].c_str(), timeout, nullptr, 0};
      take(kv.get(&a));
      if (code == BP_STATUS_OK && a.value != nullptr) value.assign(a.value, a.value + a.size);
      if (a.value != nullptr && kv.free_value != nullptr) kv.free_value(kv.ctx, a.value);
      break;
    }
    case wire::KvKind::Wait: {
      if (kv.wait == nullptr) {
        code = BP_STATUS_UNSUPPORTED;
        message = "the job's store has no wait";
        break;
      }
      std::vector<const char*> keys;
      for (const auto& k : task.keys) keys.push_back(k.c_str());
      bp_kv_wait_args a{BP_KV_WAIT_ARGS_STRUCT_SIZE,       kv.ctx, keys.data(),
                        static_cast<int32_t>(keys.size()), 0,      timeout};
      take(kv.wait(&a));
      break;
    }
  }
  send_kv_reply(task.id, code, message, value);
}

void Connection::send_kv_reply(uint64_t id, int32_t status, const std::string& message,
                               const std::vector<uint8_t>& value) {
  Lock lock(mu_);
  if (dead_) return;
  fbb_.Clear();
  const auto text = fbb_.CreateString(message);
  const auto bytes = fbb_.CreateVector(value);
  const auto body = wire::CreateKvReply(fbb_, status, text, bytes);
  push_locked(id, wire::Body::KvReply, body.Union(), nullptr, 0, nullptr);
}

}  // namespace backplane::remote::client
