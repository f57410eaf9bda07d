// The Transport over Gloo (see gloo_transport.hpp).
#include "gloo_transport.hpp"

#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "gloo_errors.hpp"
#include "sigpipe_block.hpp"

namespace backplane::cpu {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using UnboundBuffer = gloo::transport::UnboundBuffer;

}  // namespace

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

void GlooMesh::close_connections() noexcept {
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
