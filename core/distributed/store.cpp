// The TCP rendezvous store behind make_tcp_store: the job secret, the
// hosting rank's server (store_server.cpp) and every rank's client
// (store_client.cpp) behind the Store interface. The wire format is in
// store_wire.hpp.
#include <backplane/error.hpp>
#include <backplane/log.hpp>
#include <backplane/rendezvous.hpp>

#include <backplane_common/secret_file.hpp>

#include <cstdlib>
#include <mutex>

#include "distributed/store.hpp"
#include "distributed/store_linger.hpp"
#include "trace/recorder.hpp"
#include "trace/trace_format.hpp"

namespace backplane {

Store::~Store() = default;

void Store::set_with_timeout(const std::string& key, const std::vector<uint8_t>& value,
                             std::chrono::milliseconds) {
  set(key, value);
}

namespace {

using namespace store_wire;
using std::chrono::milliseconds;
using store_detail::Client;
using store_detail::Clock;
using store_detail::Server;

// How much longer than a get/wait's own timeout a client waits for the
// server's timed_out reply before it gives up on the server.
constexpr milliseconds kReplyGrace{2000};

// The secret from BACKPLANE_JOB_TOKEN, else from the file BACKPLANE_JOB_TOKEN_FILE
// names (read_secret_file's rules); "" when neither is set.
std::string job_token_from_env() {
  if (const char* token = std::getenv("BACKPLANE_JOB_TOKEN"); token != nullptr) {
    if (*token == '\0') {
      throw Error(Errc::invalid_argument,
                  "environment variable BACKPLANE_JOB_TOKEN is set but empty; set it to the job's secret "
                  "(e.g. export BACKPLANE_JOB_TOKEN=$(openssl rand -hex 32)) or unset it");
    }
    return token;
  }
  const char* path = std::getenv("BACKPLANE_JOB_TOKEN_FILE");
  if (path == nullptr) return "";
  try {
    return common::read_secret_file(path, "the job secret file (BACKPLANE_JOB_TOKEN_FILE)");
  } catch (const common::SecretFileError& e) {
    throw Error(Errc::invalid_argument, e.what());
  }
}

class TcpStore final : public Store {
 public:
  TcpStore(const TcpStoreOptions& o, const std::string& secret) : timeout_(o.timeout) {
    if (o.is_server) {
      store_detail::ServerOptions so;
      so.host = o.host;
      so.port = o.port;
      so.world_size = o.world_size;
      so.secret = secret;
      so.limits = Limits::from_env();
      server_ = std::make_unique<Server>(std::move(so));
      address_ = join_address(o.host, server_->port());
      if (secret.empty()) {
        static std::once_flag warned;
        std::call_once(warned, [&] {
          log(LogLevel::warning,
              "rendezvous: the store on " + server_->bound() +
                  " runs without a job secret: any process on this machine can join the job. Set "
                  "BACKPLANE_JOB_TOKEN (e.g. export BACKPLANE_JOB_TOKEN=$(openssl rand -hex 32)); "
                  "`backplane launch` sets one for its ranks");
        });
      }
    } else {
      address_ = join_address(o.host, o.port);
    }
    client_ = std::make_unique<Client>(o.host, server_ ? server_->port() : o.port, o.rank, o.world_size,
                                       o.timeout, secret);
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    set_until(key, value, default_deadline());
  }

  void set_with_timeout(const std::string& key, const std::vector<uint8_t>& value,
                        milliseconds timeout) override {
    check_timeout(timeout, "store set(" + quote(key) + ")");
    std::optional<Clock::time_point> deadline = default_deadline();
    if (timeout < kForever && (!deadline || Clock::now() + timeout < *deadline))
      deadline = Clock::now() + timeout;
    set_until(key, value, deadline);
  }

  void set_until(const std::string& key, const std::vector<uint8_t>& value,
                 std::optional<Clock::time_point> deadline) {
    const std::string what = "store set(" + quote(key) + ")";
    check_key(key, what);
    if (value.size() > kMaxValueBytes) {
      throw Error(Errc::invalid_argument, what + ": the value has " + std::to_string(value.size()) +
                                              " bytes; the store carries at most " +
                                              std::to_string(kMaxValueBytes) + " bytes (1 GiB) per value");
    }
    expect(call(Op::set, encode_set(key, value.data(), value.size()), deadline, what), what, 0, 0);
  }

  std::vector<uint8_t> get(const std::string& key, milliseconds timeout) override {
    const std::string what = "store get(" + quote(key) + ")";
    check_key(key, what);
    check_timeout(timeout, what);
    PayloadWriter out(12 + key.size());
    out.u64(wire_timeout(timeout));
    out.key(key);
    const Clock::time_point started = Clock::now();
    const trace::detail::Span span(trace::detail::kCatJob, "store get");  // a wait for another rank's value
    Client::Response r = call(Op::get, out.take(), parked_deadline(timeout), what);
    if (r.kind == Reply::timed_out) {
      throw Error(Errc::timeout, what + " timed out after " + waited_text(started, timeout) +
                                     ": no rank set " + quote(key) + " in the store at " + address_ +
                                     " (another rank may have failed before setting it)");
    }
    return expect(std::move(r), what, 0, kMaxValueBytes);
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const std::string what = keys.size() == 1 ? "store wait(" + quote(keys.front()) + ")"
                                              : "store wait(" + std::to_string(keys.size()) + " keys)";
    check_timeout(timeout, what);
    std::vector<uint8_t> payload = key_list(keys, what, /*prefix=*/wire_timeout(timeout));
    const Clock::time_point started = Clock::now();
    const trace::detail::Span span(trace::detail::kCatJob, "store wait");
    Client::Response r = call(Op::wait, std::move(payload), parked_deadline(timeout), what);
    if (r.kind == Reply::timed_out) {
      const std::string missing(r.payload.begin(), r.payload.end());
      throw Error(Errc::timeout, what + " timed out after " + waited_text(started, timeout) +
                                     "; still missing: " + missing + " (store at " + address_ +
                                     "; another rank may have failed before setting them)");
    }
    expect(std::move(r), what, 0, 0);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const std::string what = "store add(" + quote(key) + ", " + std::to_string(delta) + ")";
    check_key(key, what);
    PayloadWriter out(12 + key.size());
    out.u64(static_cast<uint64_t>(delta));
    out.key(key);
    std::vector<uint8_t> v = expect(call(Op::add, out.take(), default_deadline(), what), what, 8, 8);
    return static_cast<int64_t>(get_u64(v.data()));
  }

  bool check(const std::vector<std::string>& keys) override {
    const std::string what = "store check(" + std::to_string(keys.size()) + " keys)";
    std::vector<uint8_t> v =
        expect(call(Op::check, key_list(keys, what, std::nullopt), default_deadline(), what), what, 1, 1);
    return v[0] != 0;
  }

  bool remove(const std::string& key) override {
    const std::string what = "store remove(" + quote(key) + ")";
    check_key(key, what);
    PayloadWriter out(4 + key.size());
    out.key(key);
    std::vector<uint8_t> v = expect(call(Op::remove, out.take(), default_deadline(), what), what, 1, 1);
    return v[0] != 0;
  }

  milliseconds timeout() const override { return timeout_; }
  std::string address() const override { return address_; }

  void linger_on_close() noexcept {
    if (server_) server_->linger_on_close();
  }

 private:
  // "0.203 s (timeout 0.2 s)": what was waited, measured, and what was asked.
  static std::string waited_text(Clock::time_point started, milliseconds timeout) {
    const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
    return seconds_text(waited) + " (timeout " + seconds_text(timeout) + ")";
  }
  static void check_key(const std::string& key, const std::string& what) {
    if (key.empty() || key.size() > kMaxKeyBytes) {
      throw Error(Errc::invalid_argument, what + ": a key must have 1 to " + std::to_string(kMaxKeyBytes) +
                                              " bytes, this one has " + std::to_string(key.size()));
    }
  }
  static void check_timeout(milliseconds timeout, const std::string& what) {
    if (timeout.count() < 0) {
      throw Error(Errc::invalid_argument, what + ": the timeout is negative (" +
                                              std::to_string(timeout.count()) + " ms); pass 0 or more");
    }
  }
  static std::vector<uint8_t> key_list(const std::vector<std::string>& keys, const std::string& what,
                                       std::optional<uint64_t> timeout_prefix) {
    if (keys.size() > kMaxKeysPerCall) {
      throw Error(Errc::invalid_argument, what + ": at most " + std::to_string(kMaxKeysPerCall) +
                                              " keys per call, got " + std::to_string(keys.size()));
    }
    std::size_t bytes = 4;
    for (const auto& k : keys) {
      check_key(k, what + " key " + quote(k));
      bytes += 4 + k.size();
    }
    if (bytes > kMaxKeyListBytes) {
      throw Error(Errc::invalid_argument, what + ": the keys take " + std::to_string(bytes) +
                                              " bytes; at most " + std::to_string(kMaxKeyListBytes) +
                                              " per call; split the call");
    }
    PayloadWriter out(bytes + 8);
    if (timeout_prefix) out.u64(*timeout_prefix);
    out.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) out.key(k);
    return out.take();
  }

  std::optional<Clock::time_point> default_deadline() const {
    if (timeout_ >= kForever) return std::nullopt;
    return Clock::now() + timeout_;
  }
  // get/wait: the server answers timed_out at `timeout`; the grace covers
  // the trip back before the client concludes the server is stuck.
  static std::optional<Clock::time_point> parked_deadline(milliseconds timeout) {
    if (timeout >= kForever) return std::nullopt;
    return Clock::now() + timeout + kReplyGrace;
  }

  Client::Response call(Op op, std::vector<uint8_t> payload, std::optional<Clock::time_point> deadline,
                        const std::string& what) {
    return client_->call(op, std::move(payload), deadline, what);
  }

  // Checks an ok reply's payload size; turns refused into invalid_argument.
  std::vector<uint8_t> expect(Client::Response r, const std::string& what, std::size_t min_bytes,
                              std::size_t max_bytes) const {
    if (r.kind == Reply::refused) {
      throw Error(Errc::invalid_argument, what + ": " + std::string(r.payload.begin(), r.payload.end()));
    }
    if (r.kind != Reply::ok || r.payload.size() < min_bytes || r.payload.size() > max_bytes) {
      throw Error(Errc::io_error,
                  what + ": the rendezvous store at " + address_ +
                      " sent a reply that does not fit the request; are all ranks running the "
                      "same backplane version?");
    }
    return std::move(r.payload);
  }

  milliseconds timeout_;
  std::string address_;
  // Declared before client_, so the client disconnects before the server stops.
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace

std::shared_ptr<Store> make_tcp_store(const TcpStoreOptions& options) {
  const std::string where = "make_tcp_store(" + join_address(options.host, options.port) + ")";
  if (options.host.empty()) {
    throw Error(Errc::invalid_argument,
                where + ": the host is empty; give the hosting rank's address (MASTER_ADDR)");
  }
  if (options.world_size < 1) {
    throw Error(Errc::invalid_argument,
                where + ": world_size " + std::to_string(options.world_size) + " is not positive");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    throw Error(Errc::invalid_argument, where + ": rank " + std::to_string(options.rank) +
                                            " is out of range for world_size " +
                                            std::to_string(options.world_size) + " (ranks are 0.." +
                                            std::to_string(options.world_size - 1) + ")");
  }
  if (options.port == 0 && !options.is_server) {
    throw Error(Errc::invalid_argument,
                where +
                    ": port 0 means \"any free port\" and is only valid on the server; "
                    "clients need the port the server reports in address()");
  }
  if (options.timeout.count() <= 0) {
    throw Error(Errc::invalid_argument, where + ": the timeout must be positive, got " +
                                            std::to_string(options.timeout.count()) + " ms");
  }
  const std::string secret = options.job_token ? *options.job_token : job_token_from_env();
  return std::make_shared<TcpStore>(options, secret);
}

void store_detail::linger_on_close(Store& store) noexcept {
  if (auto* tcp = dynamic_cast<TcpStore*>(&store)) tcp->linger_on_close();
}

}  // namespace backplane
