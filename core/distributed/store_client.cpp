// The rendezvous store's client (see store.hpp): one connection, its own io
// thread, and callers that sleep until their reply or their deadline.
#include <backplane/error.hpp>

#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <cstring>

#include "distributed/store.hpp"

namespace backplane::store_detail {

using namespace store_wire;
using boost::system::error_code;
using std::chrono::milliseconds;

Client::Client(const std::string& host, uint16_t port, int32_t rank, int32_t world_size, milliseconds timeout,
               const std::string& secret)
    : address_(join_address(host, port)) {
  const Clock::time_point deadline = Clock::now() + std::min(timeout, kForever);
  connect(host, port, deadline);
  handshake(rank, world_size, timeout, secret);
  // The handshake left io_ out of work, which stops it: restart before running for good.
  io_.restart();
  work_.emplace(io_.get_executor());
  read_header();
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        fail("lost the connection to the store at " + address_ + " (" + e.what() + ")");
      }
    }
  });
}

Client::~Client() {
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

// Runs io_ on this thread until `done` or `deadline`; false on the deadline.
bool Client::run_until(const bool& done, Clock::time_point deadline) {
  io_.restart();
  while (!done) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    io_.run_one_for(deadline - now);
  }
  return true;
}

// Retries until the deadline: ranks start in any order, so the store may
// not be listening yet.
void Client::connect(const std::string& host, uint16_t port, Clock::time_point deadline) {
  const Clock::time_point started = Clock::now();
  tcp::resolver resolver(io_);
  milliseconds backoff(10);
  std::string last_error;
  for (;;) {
    error_code ec;
    auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
    if (!ec) {
      bool done = false;
      socket_ = tcp::socket(io_);
      asio::async_connect(socket_, endpoints, [&](const error_code& e, const tcp::endpoint&) {
        ec = e;
        done = true;
      });
      if (!run_until(done, deadline)) {
        error_code ignored;
        socket_.close(ignored);  // completes the connect with operation_aborted
        io_.restart();
        while (!done) io_.run_one();
        // An attempt cut short by the deadline says less than the one before it.
        if (last_error.empty()) last_error = "no answer to the connection attempt";
        break;
      }
      if (!ec) {
        error_code ignored;
        socket_.set_option(tcp::no_delay(true), ignored);
        return;
      }
      last_error = ec.message();
    } else {
      last_error = "cannot resolve '" + host + "': " + ec.message();
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
  const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
  throw Error(Errc::timeout,
              "could not connect to the rendezvous store at " + address_ + " within " + seconds_text(waited) +
                  " (last error: " + last_error +
                  "); check that rank 0 is running and that MASTER_ADDR/MASTER_PORT point at it "
                  "(and BACKPLANE_TIMEOUT if ranks start far apart)");
}

namespace {

// Runs one read or write of the handshake on io_ until it completes or the
// deadline passes; false on the deadline (the socket is then closed).
template <class Start>
bool handshake_step(asio::io_context& io, tcp::socket& socket, Clock::time_point deadline, error_code& ec,
                    Start start) {
  bool done = false;
  start([&](const error_code& e, std::size_t) {
    ec = e;
    done = true;
  });
  io.restart();
  while (!done) {
    const auto now = Clock::now();
    if (now >= deadline) {
      error_code ignored;
      socket.close(ignored);  // completes the operation with operation_aborted
      io.restart();
      while (!done) io.run_one();
      return false;
    }
    io.run_one_for(deadline - now);
  }
  return true;
}

}  // namespace

void Client::handshake(int32_t rank, int32_t world_size, milliseconds timeout, const std::string& secret) {
  // The server answers at once, or once a slot for an unauthenticated
  // connection frees up; allow a few seconds even when the connect used up
  // most of the timeout.
  const milliseconds allowed = std::min(std::max(timeout, milliseconds(1000)), milliseconds(30'000));
  const Clock::time_point started = Clock::now();
  const Clock::time_point deadline = started + allowed;
  const auto no_answer = [&] {
    return Error(Errc::timeout,
                 "connected to " + address_ + " but it did not answer the store handshake within " +
                     seconds_text(std::chrono::duration_cast<milliseconds>(Clock::now() - started)) +
                     "; is MASTER_PORT the port of another service rather than backplane's store?");
  };
  const auto closed = [&](const error_code& ec) {
    return Error(Errc::io_error, "the rendezvous store at " + address_ +
                                     " closed the connection during the handshake (" + ec.message() +
                                     "); check MASTER_ADDR/MASTER_PORT and the store's log");
  };
  const Nonce client_nonce = random_nonce();
  const auto hello = make_hello(client_nonce);
  std::array<uint8_t, kChallengeBytes> challenge{};
  error_code ec;
  if (!handshake_step(io_, socket_, deadline, ec,
                      [&](auto h) { asio::async_write(socket_, asio::buffer(hello), std::move(h)); }))
    throw no_answer();
  if (ec) throw closed(ec);
  if (!handshake_step(io_, socket_, deadline, ec, [&](auto h) {
        asio::async_read(socket_, asio::buffer(challenge.data(), kHelloPrefixBytes), std::move(h));
      }))
    throw no_answer();
  if (ec) throw closed(ec);
  const uint8_t* c = challenge.data();
  if (std::memcmp(c, kMagic.data(), 4) != 0) {
    throw Error(Errc::io_error,
                "the service at " + address_ +
                    " is not a backplane rendezvous store (bad handshake reply); check MASTER_PORT");
  }
  const uint16_t version = get_u16(c + 4);
  if (version != kProtocolVersion || get_u16(c + 6) != 0) {
    throw Error(Errc::invalid_argument, "the rendezvous store at " + address_ + " speaks protocol version " +
                                            std::to_string(version) + " but this process speaks version " +
                                            std::to_string(kProtocolVersion) +
                                            "; every rank must run the same backplane version");
  }
  if (!handshake_step(io_, socket_, deadline, ec, [&](auto h) {
        asio::async_read(socket_, asio::buffer(challenge.data() + kHelloPrefixBytes, kNonceBytes + kMacBytes),
                         std::move(h));
      }))
    throw no_answer();
  if (ec) throw closed(ec);
  Nonce server_nonce{};
  std::memcpy(server_nonce.data(), c + kHelloPrefixBytes, kNonceBytes);
  if (!same_mac(server_proof(secret, client_nonce, server_nonce), c + kHelloPrefixBytes + kNonceBytes)) {
    error_code ignored;
    socket_.close(ignored);
    throw Error(
        Errc::invalid_argument,
        "the store at " + address_ +
            " refused this process's job secret: ranks must share BACKPLANE_JOB_TOKEN (this process " +
            (secret.empty() ? "has none" : "has one, and it differs from the store's") +
            "); give every rank of the job the same BACKPLANE_JOB_TOKEN or BACKPLANE_JOB_TOKEN_FILE");
  }
  const auto proof =
      make_proof(client_proof(secret, client_nonce, server_nonce, rank, world_size), rank, world_size);
  std::array<uint8_t, kVerdictBytes> verdict_bytes{};
  if (!handshake_step(io_, socket_, deadline, ec,
                      [&](auto h) { asio::async_write(socket_, asio::buffer(proof), std::move(h)); }))
    throw no_answer();
  if (ec) throw closed(ec);
  if (!handshake_step(io_, socket_, deadline, ec,
                      [&](auto h) { asio::async_read(socket_, asio::buffer(verdict_bytes), std::move(h)); }))
    throw no_answer();
  if (ec) throw closed(ec);
  const uint8_t* w = verdict_bytes.data();
  const auto verdict = static_cast<Verdict>(get_u16(w + 6));
  const auto server_world = static_cast<int32_t>(get_u32(w + 8));
  const std::string r = std::to_string(rank), ws = std::to_string(world_size),
                    sws = std::to_string(server_world);
  if (std::memcmp(w, kMagic.data(), 4) == 0 && get_u16(w + 4) == kProtocolVersion) {
    switch (verdict) {
      case Verdict::accepted:
        if (server_world != world_size) break;
        return;
      case Verdict::version_mismatch:
        break;
      case Verdict::world_size_mismatch:
        throw Error(Errc::invalid_argument, "rank " + r + " says world_size " + ws + " but the store at " +
                                                address_ + " was started with world_size " + sws +
                                                "; every rank must be given the same world size");
      case Verdict::rank_out_of_range:
        throw Error(Errc::invalid_argument, "rank " + r + " is out of range for the store at " + address_ +
                                                ", which was started with world_size " + sws);
      case Verdict::duplicate_rank:
        throw Error(Errc::invalid_argument,
                    "rank " + r + " is already connected to the store at " + address_ + " (world_size " +
                        sws +
                        "): two processes were given the same rank; check RANK (or OMPI_COMM_WORLD_RANK, "
                        "SLURM_PROCID) of each process");
    }
  }
  throw Error(Errc::io_error, "the rendezvous store at " + address_ + " sent an invalid handshake verdict (" +
                                  std::to_string(static_cast<unsigned>(verdict)) + ", world_size " + sws +
                                  ")");
}

Client::Response Client::call(Op op, std::vector<uint8_t> payload, std::optional<Clock::time_point> deadline,
                              const std::string& what) {
  auto frame = std::make_shared<Frame>();
  frame->payload = std::move(payload);
  auto pending = std::make_shared<Pending>();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) throw Error(Errc::io_error, what + ": " + *broken_);
    id = next_id_++;
    pending_.emplace(id, pending);
  }
  frame->header = make_header(frame->payload.size(), static_cast<uint8_t>(op), id);
  asio::post(io_, [this, frame] {
    out_.push_back(frame);
    if (!writing_) write_next();
  });
  const Clock::time_point started = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  const auto ready = [&] { return pending->done; };
  if (deadline) {
    if (!pending->cv.wait_until(lock, *deadline, ready)) {
      pending_.erase(id);  // a late reply finds no one and is dropped
      const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
      throw Error(Errc::timeout, what + ": no reply from the rendezvous store at " + address_ + " after " +
                                     seconds_text(waited) +
                                     "; the host rank (rank 0) may be stalled or overloaded");
    }
  } else {
    pending->cv.wait(lock, ready);
  }
  if (pending->error) throw Error(Errc::io_error, what + ": " + *pending->error);
  return std::move(pending->response);
}

void Client::write_next() {
  writing_ = true;
  std::shared_ptr<Frame> f = out_.front();
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(f->header), asio::buffer(f->payload)};
  // The handler holds the frame: fail() may drop the queue while the write is in flight.
  asio::async_write(socket_, buffers, [this, f](const error_code& ec, std::size_t) {
    writing_ = false;
    if (ec) {
      fail("lost the connection to the rendezvous store at " + address_ + " (" + ec.message() +
           "); did rank 0 exit?");
      out_.clear();
      return;
    }
    out_.pop_front();
    if (!out_.empty()) write_next();
  });
}

void Client::read_header() {
  asio::async_read(socket_, asio::buffer(header_), [this](const error_code& ec, std::size_t) {
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      if (ec == asio::error::eof) {
        fail("the rendezvous store at " + address_ + " closed the connection; did rank 0 exit?");
      } else {
        fail("lost the connection to the rendezvous store at " + address_ + " (" + ec.message() +
             "); did rank 0 exit?");
      }
      return;
    }
    on_header();
  });
}

void Client::on_header() {
  const uint8_t* h = header_.data();
  const uint32_t bytes = get_u32(h);
  const std::optional<Reply> kind = to_reply(h[4]);
  const uint64_t id = get_u64(h + 8);
  const std::size_t limit = kind == Reply::ok ? kMaxValueBytes : kMaxReplyTextBytes;
  if (!kind || h[5] != 0 || h[6] != 0 || h[7] != 0 || bytes > limit) {
    fail("the rendezvous store at " + address_ + " sent a malformed reply frame; closed the connection");
    return;
  }
  payload_.clear();
  async_read_growing(
      socket_, payload_, bytes, [] {},
      [this, kind, id](const error_code& ec) {
        if (ec) {
          if (ec == asio::error::operation_aborted) return;
          fail("the rendezvous store at " + address_ + " closed the connection in the middle of a reply (" +
               ec.message() + "); did rank 0 exit?");
          return;
        }
        {
          std::lock_guard<std::mutex> lock(mutex_);
          auto it = pending_.find(id);
          if (it != pending_.end()) {
            it->second->response = Response{*kind, std::move(payload_)};
            it->second->done = true;
            it->second->cv.notify_one();
            pending_.erase(it);
          }
        }
        payload_ = {};
        read_header();
      });
}

// Fails every pending and future call with `message`.
void Client::fail(std::string message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) return;
    broken_ = message;
    for (auto& [id, p] : pending_) {
      p->error = message;
      p->done = true;
      p->cv.notify_one();
    }
    pending_.clear();
  }
  error_code ignored;
  socket_.close(ignored);
}

}  // namespace backplane::store_detail
