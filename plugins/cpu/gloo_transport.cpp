// The Link and Transport over Gloo (see gloo_transport.hpp): connecting
// the full mesh through the store, and running collectives on it.
#include "gloo_transport.hpp"

#include <gloo/rendezvous/store.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <backplane/plugin.hpp>
#include <cstring>
#include <exception>
#include <utility>

#include "gloo_errors.hpp"
#include "listen_address.hpp"
#include "sigpipe_block.hpp"

namespace backplane::cpu {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using UnboundBuffer = gloo::transport::UnboundBuffer;

// Gloo's full-mesh connect publishes, under key "<rank>", its tcp::Address
// objects back to back: a sockaddr_storage (filled by getsockname only as
// far as the address family needs, the rest uninitialised stack memory)
// and a sequence number.
constexpr std::size_t kGlooAddressBytes = sizeof(sockaddr_storage) + sizeof(ssize_t);

bool is_address_list_key(const std::string& key) {
  return !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
}

// Zeroes the unused bytes of each address in such a list, so that no stray
// memory reaches the store; leaves a value of another shape as it is.
void zero_address_padding(std::vector<char>& value) {
  if (value.empty() || value.size() % kGlooAddressBytes != 0) return;
  for (std::size_t at = 0; at < value.size(); at += kGlooAddressBytes) {
    sa_family_t family = 0;
    std::memcpy(&family, value.data() + at, sizeof family);
    const std::size_t used = family == AF_INET    ? sizeof(sockaddr_in)
                             : family == AF_INET6 ? sizeof(sockaddr_in6)
                                                  : sizeof(sa_family_t);
    std::fill(value.begin() + static_cast<std::ptrdiff_t>(at + used),
              value.begin() + static_cast<std::ptrdiff_t>(at + sizeof(sockaddr_storage)), 0);
  }
}

// Gloo's rendezvous store over the exchange. The exchange's one deadline
// bounds every call (the timeouts Gloo passes are ignored); throws
// StoreFailure.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(KeyValueExchange& exchange) : exchange_(exchange) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    if (!is_address_list_key(key)) return exchange_.set(key, data);
    std::vector<char> clean = data;
    zero_address_padding(clean);
    exchange_.set(key, clean);
  }
  std::vector<char> get(const std::string& key) override {
    std::vector<char> value = exchange_.get(key);
    seen_[key] = value;
    return value;
  }
  void wait(const std::vector<std::string>& keys) override { exchange_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const milliseconds&) override { exchange_.wait(keys); }

  // Values read so far, by key (the address lists of ranks already joined).
  const std::map<std::string, std::vector<char>>& seen() const noexcept { return seen_; }

 private:
  KeyValueExchange& exchange_;
  std::map<std::string, std::vector<char>> seen_;
};

// The address lists Gloo's full-mesh connect publishes: key "<rank>" holds, for
// each other rank q in order, the address rank <rank> listens on for q.
void learn_published_addresses(GlooMesh& mesh, const std::map<std::string, std::vector<char>>& seen) {
  for (const auto& [key, bytes] : seen) {
    const int32_t p = rank_of_key(key, mesh.size);
    if (p < 0 || p == mesh.rank || !is_address_list_key(key)) continue;
    const std::size_t others = static_cast<std::size_t>(mesh.size - 1);
    const std::size_t each = bytes.size() / others;
    const std::size_t index = static_cast<std::size_t>(mesh.rank < p ? mesh.rank : mesh.rank - 1);
    if (each == 0 || bytes.size() % others != 0) continue;
    try {
      const gloo::transport::tcp::Address a(
          std::vector<char>(bytes.begin() + index * each, bytes.begin() + (index + 1) * each));
      mesh.peers.rank_of_address[a.str()] = p;
      mesh.peers.address_of_rank[p] = display_address(a.str());
    } catch (const std::exception&) {
      // An address this Gloo cannot parse only makes messages less specific.
    }
  }
}

// Each connection's address at the far end, for naming peers in errors: the
// side that accepted a connection knows the peer only by its ephemeral port.
void exchange_connection_addresses(GlooMesh& mesh, KeyValueExchange& store) {
  std::string mine;
  for (int32_t q = 0; q < mesh.size; ++q)
    if (q != mesh.rank) mine += std::to_string(q) + "=" + mesh.context->getPair(q)->address().str() + "\n";
  store.set("conn/" + std::to_string(mesh.rank), std::vector<char>(mine.begin(), mine.end()));
  for (int32_t p = 0; p < mesh.size; ++p) {
    if (p == mesh.rank) continue;
    const std::string key = "conn/" + std::to_string(p);
    store.wait({key});
    const std::vector<char> theirs = store.get(key);
    const std::string text(theirs.begin(), theirs.end());
    const std::string tag = std::to_string(mesh.rank) + "=";
    for (std::size_t at = 0; at < text.size();) {
      const auto end = std::min(text.find('\n', at), text.size());
      if (text.compare(at, tag.size(), tag) == 0)
        mesh.peers.rank_of_address[text.substr(at + tag.size(), end - at - tag.size())] = p;
      at = end + 1;
    }
  }
}

}  // namespace

std::unique_ptr<Link> connect_gloo(const LinkSetup& setup) {
  using plugin::fail;
  const std::string& where = setup.where;
  const ListenAddress listen = choose_listen_address(setup.network);
  const SigpipeBlock block;  // Gloo's loop thread starts here and inherits the mask
  auto link = std::make_unique<GlooMesh>(setup.rank, setup.size);
  GlooMesh& mesh = *link;
  try {
    mesh.device = gloo::transport::tcp::CreateDevice(listen.attr);
  } catch (const std::exception& e) {
    fail(BP_STATUS_INVALID_ARGUMENT, where + ": cannot listen on " + listen.description + ": " +
                                         gloo_text(e) +
                                         " (check the interface name with `ip link`, or the hostname)");
  }

  // Gloo waits up to 5x the context timeout for one pair to connect; a fifth
  // keeps connecting within the caller's timeout. Collectives pass their own
  // timeouts to every wait, so this setting matters only here.
  const milliseconds connect_timeout = std::max(milliseconds(1), setup.timeout / 5);
  mesh.context = std::make_shared<gloo::rendezvous::Context>(setup.rank, setup.size);
  mesh.context->setTimeout(connect_timeout);
  GlooStore store(setup.exchange);
  const Clock::time_point connect_start = Clock::now();
  try {
    mesh.context->connectFullMesh(store, mesh.device);
  } catch (const StoreFailure& f) {
    throw setup.failure(f, "rendezvous");
  } catch (const std::exception& e) {
    learn_published_addresses(mesh, store.seen());
    const std::string text = gloo_text(e);
    std::string named;
    const int32_t peer = mesh.peers.rank_in(text, named);
    // Gloo's connect timeouts are IoExceptions like any other: the clock
    // tells them apart.
    const bool timed_out =
        classify(e, false, Clock::now() - connect_start >= connect_timeout) == LinkError::timed_out;
    fail(timed_out ? BP_STATUS_TIMEOUT : BP_STATUS_COLLECTIVE,
         where + ": connecting to " +
             (peer >= 0 ? mesh.peers.describe(peer)
                        : (named.empty() ? std::string("the other ranks") : named)) +
             (timed_out ? " timed out" : " failed") + " (listening on " + listen.description +
             "; is that rank running, and can it reach this address?) [gloo: " + text + "]");
  }
  mesh.context->setTimeout(setup.timeout);
  learn_published_addresses(mesh, store.seen());
  try {
    exchange_connection_addresses(mesh, setup.exchange);
  } catch (const StoreFailure& f) {
    throw setup.failure(f, "exchanging connection addresses");
  }
  plugin::log(BP_LOG_DEBUG, "cpu: " + where + ": connected to " + std::to_string(setup.size - 1) +
                                " peers, listening on " + listen.description);
  return link;
}

// ---------------------------------------------------------------------------
// PeerBook
// ---------------------------------------------------------------------------

std::string PeerBook::describe(int32_t peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= address_of_rank.size()) return "a peer";
  const std::string& a = address_of_rank[peer];
  return "peer rank " + std::to_string(peer) + (a.empty() ? "" : " (" + a + ")");
}

int32_t PeerBook::rank_in(const std::string& text, std::string& named) const {
  for (const auto& a : addresses_in(text)) {
    if (named.empty()) named = display_address(a);
    const auto it = rank_of_address.find(a);
    if (it != rank_of_address.end()) return it->second;
  }
  return -1;
}

// ---------------------------------------------------------------------------
// GlooMesh
// ---------------------------------------------------------------------------

GlooMesh::GlooMesh(int32_t r, int32_t n) : rank(r), size(n) {
  peers.address_of_rank.assign(n, std::string());
}

GlooMesh::~GlooMesh() {
  const SigpipeBlock block;  // a racing write on the loop thread may still fail
  context.reset();
  device.reset();
  failed_buffers_.clear();
}

void GlooMesh::interrupt() noexcept {
  interrupted_.store(true, std::memory_order_release);
  // A run registers a buffer, then checks the flag, under this mutex; here
  // the flag is set first. So every buffer is either seen here or refused
  // there. Gloo's abort flags are sticky: a wait that starts after this
  // still returns at once.
  std::lock_guard<std::mutex> lock(watch_mutex_);
  for (UnboundBuffer* b : watched_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

std::unique_ptr<Transport> GlooMesh::begin(const FailureBoard& board, const CallContext& call) {
  return std::make_unique<GlooRun>(*this, board, call);
}

void GlooMesh::close(std::string_view /*reason*/) noexcept {
  if (context == nullptr) return;
  const SigpipeBlock block;
  for (int32_t p = 0; p < size; ++p) {
    if (p == rank) continue;
    try {
      context->getPair(p)->close();  // locks the pair: safe beside a collective on another thread
    } catch (const std::exception&) {
      // Already closed or broken: nothing more to do.
    }
  }
}

void GlooMesh::watch(UnboundBuffer* buffer) {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  watched_.push_back(buffer);
}

void GlooMesh::unwatch(UnboundBuffer* buffer) noexcept {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  watched_.erase(std::remove(watched_.begin(), watched_.end(), buffer), watched_.end());
}

// ---------------------------------------------------------------------------
// GlooRun
// ---------------------------------------------------------------------------

struct GlooRun::GlooRegion final : Region {
  std::shared_ptr<UnboundBuffer> buffer;
};

GlooRun::GlooRun(GlooMesh& mesh, const FailureBoard& board, const CallContext& call)
    : mesh_(mesh), board_(board), call_(call), exceptions_at_start_(std::uncaught_exceptions()) {
  check_not_interrupted();
}

GlooRun::~GlooRun() {
  const bool failed = std::uncaught_exceptions() > exceptions_at_start_;
  for (auto& r : regions_) {
    mesh_.unwatch(r->buffer.get());
    // Leaving by an exception: Gloo may still touch this run's buffers.
    if (failed) mesh_.failed_buffers_.push_back(std::move(r->buffer));
  }
}

CommFailure GlooRun::aborted() const { return aborted_failure(call_.site.text()); }

void GlooRun::check_not_interrupted() const {
  if (mesh_.interrupted()) throw aborted();
}

Region& GlooRun::region(void* data, uint64_t bytes) {
  auto r = std::make_unique<GlooRegion>();
  try {
    r->buffer = mesh_.context->createUnboundBuffer(data, bytes);
  } catch (const std::exception& e) {
    throw translate(e, -1, Direction::send);
  }
  regions_.push_back(std::move(r));
  // Room to keep every buffer of this run if it fails, so that the
  // destructor moves them without allocating. (A failed mesh runs nothing
  // more, so the kept list is empty while a run is live.)
  mesh_.failed_buffers_.reserve(regions_.size());
  mesh_.watch(regions_.back()->buffer.get());
  check_not_interrupted();  // after watch: an interrupt either sees the buffer or is seen here
  return *regions_.back();
}

void GlooRun::send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) {
  check_not_interrupted();
  try {
    static_cast<GlooRegion&>(from).buffer->send(peer, call_.tag(phase, bytes), offset, bytes);
  } catch (const std::exception& e) {
    throw translate(e, peer, Direction::send);
  }
}

void GlooRun::recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) {
  check_not_interrupted();
  try {
    static_cast<GlooRegion&>(into).buffer->recv(peer, call_.tag(phase, bytes), offset, bytes);
  } catch (const std::exception& e) {
    throw translate(e, peer, Direction::receive);
  }
}

int GlooRun::wait_recv(Region& region, int expected) { return wait(region, expected, Direction::receive); }
int GlooRun::wait_send(Region& region, int expected) { return wait(region, expected, Direction::send); }

int GlooRun::wait(Region& region, int expected, Direction direction) {
  check_not_interrupted();
  UnboundBuffer& b = *static_cast<GlooRegion&>(region).buffer;
  // Rounded up, and at least 1 ms (Gloo reads 0 as "no timeout" in places):
  // when Gloo gives up, the deadline has passed by this clock too, which is
  // how a timeout is told from a lost peer.
  const auto left = std::chrono::ceil<milliseconds>(call_.deadline - Clock::now());
  const milliseconds budget = std::max(left, milliseconds(1));
  int source = -1;
  bool done = false;
  try {
    done = direction == Direction::receive ? b.waitRecv(&source, budget) : b.waitSend(&source, budget);
  } catch (const std::exception& e) {
    throw translate(e, expected, direction);
  }
  if (!done) {  // Gloo returns false only for a wait aborted by interrupt()
    if (mesh_.interrupted()) throw aborted();
    throw CommFailure{BP_STATUS_INTERNAL, call_.site.text() + ": a Gloo wait was aborted unexpectedly"};
  }
  return source;
}

CommFailure GlooRun::translate(const std::exception& e, int expected, Direction direction) const {
  const std::string text = gloo_text(e);
  std::string named;
  const int32_t found = mesh_.peers.rank_in(text, named);
  const int32_t peer = found >= 0 ? found : expected;
  const std::string who = found >= 0 || named.empty()
                              ? mesh_.peers.describe(peer)
                              : "a peer at " + named + " (no rank of this group has that address)";
  const std::string gloo = " [gloo: " + text + "]";
  const bool receiving = direction == Direction::receive;
  switch (classify(e, mesh_.interrupted(), call_.past_deadline())) {
    case LinkError::aborted:
      return aborted();
    case LinkError::timed_out:
      // The time really waited, measured from the collective's start: not
      // the configured timeout restated.
      return timed_out_failure(call_.site.text(), call_.waited(), call_.timeout, who, receiving,
                               call_.site.op, gloo);
    case LinkError::peer_lost:
      return peer_lost_failure(call_.site.text(), who, "closed the connection", board_.read(peer),
                               "did it exit or fail?", gloo);
    case LinkError::mismatch:
      return out_of_step_failure(call_.site.text(), who, call_.site.op, gloo);
    case LinkError::misuse:  // a call Gloo refuses: a bug in this plugin
      return {BP_STATUS_INTERNAL, call_.site.text() + ": Gloo refused a call for " + who + gloo};
    case LinkError::other:
      break;
  }
  return {BP_STATUS_COLLECTIVE, call_.site.text() + ": communication with " + who + " failed" + gloo};
}

}  // namespace backplane::cpu
