// Collectives of the cpu plugin: a Communicator joins the ranks of a group over
// one link, chosen when it is made (shared memory on one host; shared memory
// within each host and Gloo's TCP between hosts when the ranks span hosts and
// share some; else Gloo's TCP; transport.hpp), and runs all_reduce, broadcast, all_gather,
// reduce_scatter and barrier on host buffers of this plugin.
//
// Thread safety: one collective at a time per Communicator (the host
// serialises them; a second thread entering while one runs gets an error,
// never a race); abort() may be called from any thread at any time, also
// while a collective blocks. Distinct Communicators are independent and may
// run concurrently in one process.
//
// Failure model: any communication error (a peer that closed its end, a
// timeout, mismatched calls) fails the collective with a COLLECTIVE or TIMEOUT
// status naming the peer rank, leaves that error in the store for the peers,
// closes this rank's connections so that the other ranks fail promptly too
// (and report it as the root cause), and poisons the Communicator: every later
// call fails at once with the original error. Argument errors (an unsupported
// dtype, a view that would reach outside its buffer) are reported before
// anything is sent and do not poison. abort() poisons the same way: the
// collective in progress and every later one fail with COLLECTIVE "aborted".
#ifndef BACKPLANE_PLUGINS_CPU_COLLECTIVES_HPP_
#define BACKPLANE_PLUGINS_CPU_COLLECTIVES_HPP_

#include <backplane/abi.h>

#include <cstdint>
#include <memory>
#include <string>

namespace backplane::cpu {

// Where this rank listens for its peers (the plugin's "hostname" / "interface"
// options; at most one is set). GLOO_SOCKET_IFNAME, when set, wins over both.
struct NetworkOptions {
  std::string hostname;
  std::string interface;
  // Ranks that all share a host exchange data through shared memory
  // (shm_transport.hpp) unless this is false.
  bool shared_memory = true;
  // The largest group on one host whose shared memory holds a byte ring per
  // ordered pair of ranks (fastest; the memory grows with the square of the
  // group). Larger groups get one inbox per rank, which every peer writes
  // into (the memory grows linearly). Rank 0's value decides for the group.
  int32_t pair_rings_max_ranks = 16;
  // Groups whose ranks span hosts, some host with two or more, combine each
  // host's ranks through shared memory and only the hosts' leaders over TCP
  // (hierarchical_link.cpp) unless this or shared_memory is false.
  bool hierarchical = true;
};

class Communicator {
 public:
  // Rendezvouses through args.store and connects to every other rank; blocks
  // until all ranks arrive or args.timeout_ms passes. Throws plugin::Failure
  // (the ABI status) on any error.
  static std::unique_ptr<Communicator> create(const bp_comm_create_args& args, const NetworkOptions& network);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // The handle the host sees, and back. from_handle rejects NULL and handles
  // that are not live communicators of this plugin (INVALID_ARGUMENT).
  bp_comm* handle() noexcept { return reinterpret_cast<bp_comm*>(this); }
  static Communicator& from_handle(bp_comm* comm, const char* op);

  // Tensors are contiguous host buffers of this plugin (byte_offset may be
  // nonzero). all_reduce's input and output may alias. all_gather's output
  // holds world_size inputs back to back, in rank order; reduce_scatter's
  // input holds world_size blocks and rank r gets the reduction of block r.
  // broadcast works in place from root. reduce_op is a bp_reduce_op.
  void all_reduce(const bp_tensor& input, const bp_tensor& output, int32_t reduce_op);
  void broadcast(const bp_tensor& tensor, int32_t root);
  void all_gather(const bp_tensor& input, const bp_tensor& output);
  void reduce_scatter(const bp_tensor& input, const bp_tensor& output, int32_t reduce_op);
  void barrier();

  // Makes the collective in progress (on any thread) and every later one
  // fail promptly with COLLECTIVE "aborted", and closes the connections so
  // that peers waiting on this rank fail too. Idempotent; destroying the
  // Communicator afterwards is still required and clean.
  void abort() noexcept;

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);

  uint64_t magic_;  // a fixed value while alive (see from_handle)
  std::unique_ptr<Impl> impl_;
};

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_COLLECTIVES_HPP_
