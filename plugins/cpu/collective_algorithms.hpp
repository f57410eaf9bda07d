// The cpu plugin's collective algorithms over an abstract Transport
// (transport.hpp): every rank calls the same function with the same counts,
// and the ranks' sends and receives match by construction. Counts are 64-bit;
// any element count works, including ones the world size does not divide.
//
// Algorithms, chosen by the bytes each rank would exchange:
//  - small (<= Tuning::direct_max_bytes per rank): one round, every rank sends
//    its data to every other rank and reduces locally in rank order
//    (identical results everywhere, latency of a single message);
//  - large: ring reduce-scatter then ring all-gather, both pipelined in
//    segments with Tuning::recv_depth receives in flight, so that reducing
//    one segment overlaps the transfer of the next.
// Broadcast is direct for two ranks or small data, else a pipelined chain;
// barrier is a dissemination barrier. Over a hierarchical link all_reduce
// runs in two levels (hierarchical_all_reduce).
#ifndef BACKPLANE_PLUGINS_CPU_COLLECTIVE_ALGORITHMS_HPP_
#define BACKPLANE_PLUGINS_CPU_COLLECTIVE_ALGORITHMS_HPP_

#include <cstdint>
#include <vector>

#include "collective_math.hpp"
#include "transport.hpp"

namespace backplane::cpu {

// Measured with two processes on one 2-core machine: all_reduce of 64 MiB
// f32 and of 4 KiB against PyTorch's gloo all_reduce. Tests shrink these to
// reach every path with small tensors. Every rank must use the same values.
struct Tuning {
  // Below this much traffic per rank one direct round beats the ring's
  // 2 (n - 1) steps; above it the ring moves 2 (n - 1) / n of the data per
  // rank instead of (n - 1) times.
  uint64_t direct_max_bytes = uint64_t{256} << 10;
  // Ring segments: 1 MiB keeps the per-message overhead small and the
  // receive scratch cache-resident; at least min_segments per chunk (when
  // chunks hold min_segment_bytes each) keeps mid-sized collectives pipelined.
  uint64_t segment_bytes = uint64_t{1} << 20;
  uint64_t min_segments = 4;
  uint64_t min_segment_bytes = uint64_t{32} << 10;
  // Receives posted ahead in a ring reduce-scatter (each a segment of scratch).
  uint64_t recv_depth = 4;
  // Pieces of a two-level all_reduce between hosts (hierarchical_all_reduce):
  // one piece crosses between hosts while the next is reduced within them.
  uint64_t pipeline_bytes = uint64_t{8} << 20;
};

// Contiguous elements in host memory.
struct Elements {
  unsigned char* data = nullptr;
  uint64_t count = 0;
  int esize = 1;  // bytes per element
  uint64_t bytes() const noexcept { return count * static_cast<uint64_t>(esize); }
};

struct Reduction {
  CombineFn combine = nullptr;
  DivideFn divide = nullptr;  // set for mean only
};

// Scratch memory kept between collectives (receive staging, partial sums).
class Scratch {
 public:
  unsigned char* bytes(uint64_t n);
  // Releases the memory when it grew past `keep` bytes.
  void trim(uint64_t keep) noexcept;

 private:
  std::vector<unsigned char> memory_;
};

// out = the reduction of every rank's in. in and out may be the same
// elements or overlap; in is left unchanged when they do not.
void all_reduce(Transport& t, Scratch& scratch, const Tuning& tuning, Elements in, Elements out,
                const Reduction& reduction);
// Every rank's data = root's data, in place.
void broadcast(Transport& t, const Tuning& tuning, Elements data, int root);
// out holds size() blocks of in.count elements; block r = rank r's in. in may
// lie anywhere in out (it is read before out is written).
void all_gather(Transport& t, const Tuning& tuning, Elements in, Elements out);
// in holds size() blocks of out.count elements; rank r's out = the reduction
// of block r over every rank. out may overlap in.
void reduce_scatter(Transport& t, Scratch& scratch, const Tuning& tuning, Elements in, Elements out,
                    const Reduction& reduction);
// Returns once every rank has entered.
void barrier(Transport& t, Scratch& scratch);

// all_reduce over a group in two levels (transport.hpp's Levels), so that
// only one copy of each host's data crosses between hosts: for two hosts,
// the data's size each way instead of the flat ring's 2 (n - 1) / n of it.
//  - ring-sized data on hosts of equal size (as NCCL does): a ring
//    reduce-scatter within the host leaves local rank i one chunk reduced
//    over its host; it all-reduces that chunk with local rank i of every
//    other host (across(); all local ranks at once, sharing the work); a
//    ring all-gather within the host completes every rank's result. In
//    pieces of Tuning::pipeline_bytes, the transfer between hosts on a
//    second thread, so that one piece crosses while the next is reduced
//    within the host and the one before is gathered;
//  - else (small data, or hosts of different sizes): all-reduce within the
//    host, all-reduce between the hosts' leaders, broadcast from each leader
//    to its host: one message each way between hosts for a small bucket.
// Every chunk of the result is computed once and copied, so the result is
// identical on every rank; for floats it may differ from the flat
// all_reduce's in the last bits (the sums are grouped by host), for integers
// and integer-valued floats within range it is the same. A mean divides by
// the whole group's size once, after the last sum.
// `across_scratch` is the staging of the transfer across hosts when it runs
// on its own thread; like `scratch`, it must outlive the link (a failed
// call's receives may still be posted into it).
void hierarchical_all_reduce(Levels& levels, Scratch& scratch, Scratch& across_scratch, const Tuning& tuning,
                             Elements in, Elements out, const Reduction& reduction);

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_COLLECTIVE_ALGORITHMS_HPP_
