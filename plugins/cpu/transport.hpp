// How ranks reach each other, in two layers. A Link is one communicator's
// connections, chosen once when the communicator is made: shared memory
// (shm_transport.hpp) when every rank runs on this host, else Gloo's TCP
// (gloo_transport.hpp), or both in two levels when the ranks span hosts
// (hierarchical_link.cpp). A Transport is one collective's point-to-point
// messaging over a Link, which the collective algorithms run on; the tests'
// in-memory one implements it too. A new way of moving bytes is one new file
// holding a Link, its Transport and its connect function, which is declared
// at the end here and tried in Communicator::create.
#ifndef BACKPLANE_PLUGINS_CPU_TRANSPORT_HPP_
#define BACKPLANE_PLUGINS_CPU_TRANSPORT_HPP_

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "collectives.hpp"
#include "kv_store.hpp"
#include "link_failures.hpp"

namespace backplane::cpu {

// Memory registered for messages. Made by a Transport, which owns it; valid
// until the Transport is destroyed.
class Region {
 public:
  virtual ~Region() = default;
};

// Matching: a message from rank a to rank b matches a receive that b posted
// for a with the same phase and the same length, and the receives b posts
// for a must come in the order a sends: the shared-memory transport matches
// strictly in order (Gloo matches by tag). Ranks that disagree on the call
// fail instead of receiving wrong data (over Gloo by timing out, over shared
// memory at once). A send completes once the peer has received it.
//
// Every member throws on failure (a peer that vanished, a timeout, an
// abort); the exception type is the implementation's.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;

  virtual Region& region(void* data, uint64_t bytes) = 0;
  // Posts a send of [offset, offset + bytes) of `from` to `peer`. Those bytes
  // must not change until a wait_send on `from` has accounted for it.
  virtual void send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) = 0;
  // Posts a receive from `peer` into [offset, offset + bytes) of `into`.
  virtual void recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) = 0;
  // Waits until one more receive (send) posted on the region has completed
  // and returns the peer it completed with. Completions are counted, not
  // matched: `expected` is only the peer named if the wait fails.
  virtual int wait_recv(Region& region, int expected) = 0;
  virtual int wait_send(Region& region, int expected) = 0;
};

namespace tags {
// splitmix64's finalizer: every input bit affects every output bit.
constexpr uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
constexpr uint64_t hash_with(uint64_t seed, uint64_t value) noexcept {
  return mix64(seed ^ mix64(value + 0x9e3779b97f4a7c15ULL));
}
}  // namespace tags

// What identifies one collective call on every rank: the communicator's
// sequence number, the operation and its arguments (`call`: dtype, counts,
// reduce op, root). Transports put it into every message, so that ranks
// which disagree on any of it never exchange data.
inline uint64_t call_signature(uint64_t sequence, const char* op,
                               std::initializer_list<uint64_t> call) noexcept {
  uint64_t s = tags::mix64(sequence);
  for (const char* p = op; *p != '\0'; ++p) s = tags::hash_with(s, static_cast<unsigned char>(*p));
  for (uint64_t v : call) s = tags::hash_with(s, v);
  return s;
}
// One message of a call: its phase and length as well.
constexpr uint64_t message_tag(uint64_t signature, uint64_t phase, uint64_t bytes) noexcept {
  return tags::hash_with(tags::hash_with(signature, phase), bytes);
}

// One collective call as a transport sees it: where it runs (for messages),
// its deadline, and the signature every message's tag derives from.
struct CallContext {
  CallContext(std::chrono::milliseconds limit, uint64_t sequence, std::initializer_list<uint64_t> call,
              CallSite at) noexcept
      : site(at),
        timeout(limit),
        deadline(std::chrono::steady_clock::now() + limit),
        signature(call_signature(sequence, at.op, call)) {}

  uint64_t tag(uint64_t phase, uint64_t bytes) const noexcept { return message_tag(signature, phase, bytes); }
  bool past_deadline() const noexcept { return std::chrono::steady_clock::now() >= deadline; }
  // The time since the call began: what a timeout reports as waited.
  std::chrono::milliseconds waited() const noexcept {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 (deadline - timeout));
  }

  CallSite site;
  std::chrono::milliseconds timeout;
  std::chrono::steady_clock::time_point deadline;
  uint64_t signature;
};

// One collective over a hierarchical link (hierarchical_link.cpp), in two
// levels. local() joins the ranks of this rank's host, lowest rank first
// (local rank 0 is the host's leader). across() joins the ranks that have
// this rank's local rank on every host, in host order (the leaders, for
// local rank 0); NULL when some host has no such rank. uniform(): every host
// has as many ranks (so every rank has across()). world(): ranks in all.
class Levels {
 public:
  virtual ~Levels() = default;
  virtual Transport& local() = 0;
  virtual Transport* across() = 0;
  virtual bool uniform() const noexcept = 0;
  virtual int world() const noexcept = 0;
  // Ends the waits of across() now, from any thread (the algorithm failed on
  // the host level while another thread waits across): they fail as aborted.
  virtual void interrupt_across() noexcept = 0;
};

// One communicator's connections to its peers. begin() and the Transports it
// makes are used by one thread at a time (the communicator's); interrupt()
// and close() may run on any thread, also while a collective waits.
class Link {
 public:
  virtual ~Link() = default;

  // What moves the bytes, for traces: "shared_memory", "gloo", "none".
  virtual const char* name() const noexcept = 0;
  // The messaging of one collective; `board` and `call` outlive it. Throws
  // CommFailure (an abort already happened, say).
  virtual std::unique_ptr<Transport> begin(const FailureBoard& board, const CallContext& call) = 0;
  // The two-level messaging of one collective, for the collectives that have
  // a hierarchical algorithm; NULL on links that are not hierarchical (then
  // begin() carries everything). Throws as begin() does.
  virtual std::unique_ptr<Levels> begin_levels(const FailureBoard& /*board*/, const CallContext& /*call*/) {
    return nullptr;
  }
  // Ends this rank's waits now and makes every later one fail as aborted
  // (comm_abort). Never blocks on the peers.
  virtual void interrupt() noexcept = 0;
  // Closes this rank's end as failed, so that peers waiting on it fail now
  // rather than at their timeout, and this rank's memory is no longer read
  // or written on their behalf. `reason` is this rank's error: links whose
  // peers can read it without the store (shared memory) keep it for them, as
  // the store may be gone with the rank that served it. Idempotent.
  virtual void close(std::string_view reason) noexcept = 0;
};

// What connecting a Link needs. Each connect function sets up through
// `exchange` (keys of its own) and is called by every rank alike.
struct LinkSetup {
  KeyValueExchange& exchange;
  std::string store_prefix;  // what `exchange` puts before its keys, for messages
  int32_t rank;
  int32_t size;
  std::chrono::milliseconds timeout;
  const NetworkOptions& network;
  std::string where;  // "comm_create on rank 0 of 2"

  // A StoreFailure during `stage`, as the status comm_create returns.
  plugin::Failure failure(const StoreFailure& f, const char* stage) const {
    return setup_failure(f, where, stage, store_prefix, size, timeout);
  }
};

// The links comm_create tries, in order. Each throws plugin::Failure on an
// error every rank sees alike (the store failed, a rank never came).
//
// Shared memory: NULL when the group is to use another link (some rank is
// elsewhere or has it switched off, or setup failed: that is logged, at
// warning level when every rank shares this host).
std::unique_ptr<Link> connect_shared_memory(const LinkSetup& setup);
// Ranks on several hosts, some host with two or more: shared memory among
// each host's ranks, Gloo among the hosts' leaders (and for the collectives
// without a hierarchical algorithm, Gloo's full mesh). NULL when the group
// is to use Gloo alone (switched off, one rank per host, a host where shared
// memory could not be set up: logged like connect_shared_memory's fallback).
std::unique_ptr<Link> connect_hierarchical(const LinkSetup& setup);
// Gloo's TCP full mesh: never NULL.
std::unique_ptr<Link> connect_gloo(const LinkSetup& setup);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_TRANSPORT_HPP_
