// The Link and Transport over Gloo's TCP full mesh. A GlooMesh is one
// communicator's connections (and what comm_abort needs to stop them), made
// by connect_gloo (transport.hpp) through a rendezvous in the store; a
// GlooRun is one collective on it: its deadline, the tags its messages carry
// and the translation of every Gloo exception into a CommFailure that names
// the peer.
#ifndef BACKPLANE_PLUGINS_CPU_GLOO_TRANSPORT_HPP_
#define BACKPLANE_PLUGINS_CPU_GLOO_TRANSPORT_HPP_

#include <backplane/abi.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "link_failures.hpp"
#include "transport.hpp"

namespace backplane::cpu {

// Who is who: Gloo names a peer by its socket address ("[ip]:port"), both the
// address each peer listened on and the one each connection has at the
// peer's end.
struct PeerBook {
  std::map<std::string, int32_t> rank_of_address;  // Gloo's form
  std::vector<std::string> address_of_rank;        // display form, for messages

  // "peer rank 1 (10.0.0.5:41234)"; "a peer" for -1.
  std::string describe(int32_t peer) const;
  // The rank a Gloo message names, -1 when it names none; `named` gets the
  // first address found (for an address no rank has).
  int32_t rank_in(const std::string& text, std::string& named) const;
};

// One communicator's connections. abort() may run on any thread while a
// collective runs on another; everything else is called by one thread at a
// time (the communicator's).
class GlooMesh final : public Link {
 public:
  GlooMesh(int32_t rank, int32_t size);
  ~GlooMesh() override;
  GlooMesh(const GlooMesh&) = delete;
  GlooMesh& operator=(const GlooMesh&) = delete;

  const int32_t rank;
  const int32_t size;
  // The device before the context: the context's pairs refer to it, so it
  // must go after them.
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  PeerBook peers;

  const char* name() const noexcept override { return "gloo"; }
  std::unique_ptr<Transport> begin(const FailureBoard& board, const CallContext& call) override;
  // Interrupts every wait of the collective in progress and makes every
  // later wait or post fail: those report BP_STATUS_COLLECTIVE "aborted".
  // Thread-safe, never blocks on the network.
  void interrupt() noexcept override;
  bool interrupted() const noexcept { return interrupted_.load(std::memory_order_acquire); }
  // Closes every connection, so that peers waiting on this rank fail now
  // rather than at their timeout (they read `reason` from the store's
  // failure board). Thread-safe; idempotent.
  void close(std::string_view reason) noexcept override;

 private:
  friend class GlooRun;
  // The buffers a run has made: interrupt() aborts their waits.
  void watch(gloo::transport::UnboundBuffer* buffer);
  void unwatch(gloo::transport::UnboundBuffer* buffer) noexcept;

  std::atomic<bool> interrupted_{false};
  std::mutex watch_mutex_;
  std::vector<gloo::transport::UnboundBuffer*> watched_;
  // Buffers of collectives that failed. Gloo's I/O thread may still signal
  // them (it reports a peer's failure to every pending buffer), so they live
  // until the context and device are gone; a failed comm is poisoned, so
  // this only ever holds one collective's buffers.
  std::vector<std::shared_ptr<gloo::transport::UnboundBuffer>> failed_buffers_;
};

// One collective on a mesh. Every exception it throws is a CommFailure.
//
// Gloo matches a receive with a send by slot, and a peer that sends more bytes
// than the receive was posted for makes Gloo's I/O thread terminate the
// process. So every message's slot is a hash of the collective's sequence
// number, its operation and arguments (`call`: dtype, counts, reduce op, root),
// the phase and the message's own length: ranks that disagree on any of them
// never match, and the collective times out with an error instead.
class GlooRun final : public Transport {
 public:
  // `call.site` starts every message ("all_reduce on rank 0 of 2").
  GlooRun(GlooMesh& mesh, const FailureBoard& board, const CallContext& call);
  ~GlooRun() override;
  GlooRun(const GlooRun&) = delete;
  GlooRun& operator=(const GlooRun&) = delete;

  int rank() const noexcept override { return mesh_.rank; }
  int size() const noexcept override { return mesh_.size; }
  Region& region(void* data, uint64_t bytes) override;
  void send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override;
  void recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override;
  int wait_recv(Region& region, int expected) override;
  int wait_send(Region& region, int expected) override;

  // The failure an abort makes of this collective.
  CommFailure aborted() const;

 private:
  enum class Direction { receive, send };
  struct GlooRegion;

  void check_not_interrupted() const;
  int wait(Region& region, int expected, Direction direction);
  CommFailure translate(const std::exception& e, int expected, Direction direction) const;

  GlooMesh& mesh_;
  const FailureBoard& board_;
  const CallContext call_;
  const int exceptions_at_start_;
  std::vector<std::unique_ptr<GlooRegion>> regions_;
};

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_GLOO_TRANSPORT_HPP_
