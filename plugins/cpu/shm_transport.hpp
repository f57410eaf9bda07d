// The Link and Transport between ranks that share a host: one POSIX
// shared-memory segment per communicator holding, for every ordered pair of
// ranks, a byte ring that carries that pair's messages in order, or, in a
// group larger than NetworkOptions::pair_rings_max_ranks, one inbox per rank
// that every peer writes into (so its memory grows linearly with the group,
// not with its square). A wait spins
// briefly, then sleeps on a futex, so that on a loaded machine it gives the
// core away while on an idle one a message costs a copy and no wake-up.
//
// Used when every rank of a communicator runs on the same host, in the same
// network and mount namespaces (so "same host" means what the user means by
// it, and /dev/shm is one file system); otherwise the Gloo transport
// (gloo_transport.hpp) carries everything. The choice is made in comm_create
// (connect_shared_memory, transport.hpp), identically on every rank, from what
// each rank publishes in the store.
//
// Failure model, the same as Gloo's as seen by the caller: a peer that failed,
// aborted or was destroyed marks itself closed in the segment and wakes its
// peers; a peer that died without a word is seen through its process id;
// comm_abort ends this rank's waits at once; the collective's deadline bounds
// every wait. A message whose header disagrees with the receive it meets
// (other operation, arguments, sequence or length) fails the collective at
// once as "out of step" rather than after the timeout.
#ifndef BACKPLANE_PLUGINS_CPU_SHM_TRANSPORT_HPP_
#define BACKPLANE_PLUGINS_CPU_SHM_TRANSPORT_HPP_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "link_failures.hpp"
#include "transport.hpp"

namespace backplane::cpu {

// What names this process's host for the choice: the kernel's boot id and
// the network, mount and IPC namespaces. "" when any is unknown (no shared
// memory then).
std::string shared_memory_host_identity();

// One communicator's segment, mapped by this rank.
class ShmGroup final : public Link {
 public:
  // Sets the segment up through setup.exchange (keys "shm/..."), when
  // setup.network.shared_memory and every rank publishes the same host
  // identity. Returns NULL when the group is to use Gloo instead; why is
  // logged, at warning level (once per process) when every rank shares the
  // host but the setup failed, else at debug level. Throws StoreFailure when
  // the store fails or a rank does not take part before the deadline.
  static std::unique_ptr<ShmGroup> connect(const LinkSetup& setup);
  // Marks this rank closed (peers waiting on it fail at once) and unmaps.
  ~ShmGroup() override;
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int32_t rank() const noexcept { return rank_; }
  int32_t size() const noexcept { return size_; }

  const char* name() const noexcept override { return "shared_memory"; }
  std::unique_ptr<Transport> begin(const FailureBoard& board, const CallContext& call) override;
  // Ends this rank's waits (comm_abort): they report the abort. Any thread.
  void interrupt() noexcept override;
  bool interrupted() const noexcept { return interrupted_.load(std::memory_order_acquire); }
  // Marks this rank failed: its peers' waits on it fail now, and its unread
  // messages are dropped. `reason` goes into the segment first, for the
  // peers' messages (reason()).
  void close(std::string_view reason) noexcept override;

  // Ranks of this group as its communicator numbers them, when the group is
  // part of a larger one (one host's ranks under a hierarchical link):
  // messages and the failure board then name `ranks[peer]`.
  void name_ranks(std::vector<int32_t> ranks) { names_ = std::move(ranks); }
  int32_t named(int32_t peer) const noexcept {
    return peer >= 0 && static_cast<std::size_t>(peer) < names_.size() ? names_[peer] : peer;
  }
  // "peer rank 1 (pid 4242)".
  std::string describe(int32_t peer) const;
  // Whether `peer`'s process has exited (never for a rank of this process).
  bool exited(int32_t peer) const noexcept;
  // The error `peer` left in the segment when it failed; "" if none.
  std::string reason(int32_t peer) const;

  struct Segment;  // the shared layout (shm_transport.cpp)

 private:
  friend class ShmRun;
  ShmGroup(int32_t rank, int32_t size, void* base, uint64_t bytes);
  // Marks this rank closed (destroyed) or `failed` (a failed or aborted
  // collective), so that its peers' waits on it fail now rather than at
  // their timeout. Any thread; the first call decides.
  void mark_closed(bool failed) noexcept;

  // The inbox layout's state of one peer, kept from one collective to the
  // next (a peer may run ahead into the next one).
  struct Piece {
    uint64_t tag, length, offset;
    std::vector<unsigned char> bytes;
  };
  struct PeerMail {
    std::deque<Piece> early;  // its pieces that came before their receive, in order
    uint64_t sent = 0;        // messages sent to it
    uint64_t acked = 0;       // of those, how many it has received
    uint64_t acks_owed = 0;   // its messages received here, not yet acknowledged
  };

  const int32_t rank_;
  const int32_t size_;
  void* base_;
  const uint64_t bytes_;
  Segment* segment_;
  const bool inboxes_;                // the layout: inboxes, else pair rings
  std::vector<PeerMail> mail_;        // per peer, inboxes only
  uint64_t acks_owed_ = 0;            // the sum of mail_[].acks_owed
  uint64_t early_pieces_ = 0;         // the sum of mail_[].early.size()
  std::vector<int32_t> names_;        // see name_ranks; empty: the ranks themselves
  std::vector<int> pidfds_;           // per peer: a pidfd to see it exit, -1 where none
  std::chrono::nanoseconds spin_{0};  // how long a wait spins before it sleeps
  std::atomic<bool> interrupted_{false};
  std::atomic<bool> closed_{false};
  std::atomic<bool> reason_written_{false};
};

// One collective on a group, the counterpart of GlooRun. Every exception it
// throws is a CommFailure.
class ShmRun final : public Transport {
 public:
  // `call`'s tags go into every message's header, as into Gloo's slots.
  ShmRun(ShmGroup& group, const FailureBoard& board, const CallContext& call);
  ~ShmRun() override;
  ShmRun(const ShmRun&) = delete;
  ShmRun& operator=(const ShmRun&) = delete;

  int rank() const noexcept override { return group_.rank_; }
  int size() const noexcept override { return group_.size_; }
  Region& region(void* data, uint64_t bytes) override;
  void send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override;
  void recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override;
  int wait_recv(Region& region, int expected) override;
  int wait_send(Region& region, int expected) override;

 private:
  struct ShmRegion;
  struct Transfer;
  struct Channel;

  // Moves every message it can; true when anything moved.
  bool progress();
  bool pump_out(int peer);
  bool pump_in(int peer);
  // The inbox layout's progress: early pieces into receives posted since,
  // this rank's inbox, acknowledgements owed, then sends.
  bool progress_inboxes();
  bool deliver_early();
  bool drain_inbox();
  bool flush_acks();
  bool pump_to_inbox(int peer);
  // Writes one record into `peer`'s inbox: a piece of at most `want` bytes
  // of a message from `from` (its length put into `piece`), or an ack of
  // `want` messages. False when the inbox has no room now.
  bool post(int peer, uint64_t kind, uint64_t tag, uint64_t length, uint64_t offset,
            const unsigned char* from, uint64_t want, uint64_t& piece);
  // A piece from `sender` (its bytes in two parts, where the ring wraps):
  // into the receive posted for it, else queued as early.
  void accept(int sender, uint64_t tag, uint64_t length, uint64_t offset, const unsigned char* a, uint64_t na,
              const unsigned char* b, uint64_t nb);
  // The same into the receive posted for it (there is one).
  void deliver(int sender, uint64_t tag, uint64_t length, uint64_t offset, const unsigned char* a,
               uint64_t na, const unsigned char* b, uint64_t nb);
  // Peers gone while owed acknowledgements (dropped), or while writing into
  // this rank's inbox (the collective fails).
  void check_inbox_peers();
  // Whether a record in this rank's inbox is reserved but not yet written
  // (after a drain: the one at its tail).
  bool inbox_behind() const noexcept;
  int wait(ShmRegion& region, bool receiving, int expected);
  void check_peers(bool exits);
  [[noreturn]] void fail_out_of_step(int peer) const;
  [[noreturn]] void fail_peer_gone(int peer, const char* how) const;
  [[noreturn]] void fail_timed_out(int expected, bool receiving) const;
  [[noreturn]] void fail_aborted() const;

  ShmGroup& group_;
  const FailureBoard& board_;
  const CallContext call_;
  std::vector<std::unique_ptr<ShmRegion>> regions_;
  std::vector<Channel> channels_;  // per peer
  // Where this rank's inbox was stalled at the last look (inboxes only).
  static constexpr uint64_t kNotStalled = ~uint64_t{0};
  uint64_t stalled_at_ = kNotStalled;
};

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_SHM_TRANSPORT_HPP_
