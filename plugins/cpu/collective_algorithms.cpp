// The collective algorithms (see collective_algorithms.hpp). Only the
// Transport is touched for communication, so these run unchanged over Gloo
// and over the tests' in-memory transport.
#include "collective_algorithms.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace backplane::cpu {

unsigned char* Scratch::bytes(uint64_t n) {
  if (memory_.size() < n) {
    memory_.clear();
    memory_.shrink_to_fit();
    memory_.resize(n);  // zero-filled: the pages are touched once, not on every use
  }
  return memory_.data();
}

void Scratch::trim(uint64_t keep) noexcept {
  if (memory_.size() > keep) {
    memory_.clear();
    memory_.shrink_to_fit();
  }
}

namespace {

int mod(int64_t a, int n) noexcept { return static_cast<int>(((a % n) + n) % n); }

bool overlap(const Elements& a, const Elements& b) noexcept {
  return a.count > 0 && b.count > 0 && a.data < b.data + b.bytes() && b.data < a.data + a.bytes();
}

bool use_direct_round(const Tuning& tuning, uint64_t bytes, int n) noexcept {
  return bytes <= tuning.direct_max_bytes / static_cast<uint64_t>(n - 1);
}

// `count` elements split into n chunks (near-equal, or of `block` each), each
// split into m segments. Identical on every rank for the same arguments, which
// is what keeps the ranks' sends and receives matched.
class Chunks {
 public:
  static Chunks balanced(const Tuning& t, uint64_t count, int n, int esize) {
    return Chunks(t, count / n, count % n, esize);
  }
  static Chunks blocks(const Tuning& t, uint64_t block, int esize) { return Chunks(t, block, 0, esize); }

  uint64_t begin(int c) const noexcept {
    return static_cast<uint64_t>(c) * base_ + std::min<uint64_t>(c, rem_);
  }
  uint64_t size(int c) const noexcept { return base_ + (static_cast<uint64_t>(c) < rem_ ? 1 : 0); }
  uint64_t segments() const noexcept { return m_; }
  uint64_t max_segment_bytes() const noexcept { return max_segment_bytes_; }
  // Segment k of chunk c: element offset within the chunk, and length.
  std::pair<uint64_t, uint64_t> segment(int c, uint64_t k) const noexcept {
    const unsigned __int128 length = size(c);
    const auto first = static_cast<uint64_t>(length * k / m_);
    const auto last = static_cast<uint64_t>(length * (k + 1) / m_);
    return {first, last - first};
  }

 private:
  Chunks(const Tuning& t, uint64_t base, uint64_t rem, int esize) : base_(base), rem_(rem) {
    const uint64_t largest_elements = base + (rem > 0 ? 1 : 0);
    const uint64_t largest = largest_elements * static_cast<uint64_t>(esize);
    m_ = std::max<uint64_t>(1, (largest + t.segment_bytes - 1) / t.segment_bytes);
    m_ = std::max(m_, std::min(t.min_segments, largest / std::max<uint64_t>(1, t.min_segment_bytes)));
    max_segment_bytes_ = (largest_elements + m_ - 1) / m_ * static_cast<uint64_t>(esize);
  }

  uint64_t base_;
  uint64_t rem_;
  uint64_t m_ = 1;
  uint64_t max_segment_bytes_ = 0;
};

// Where a chunk's bytes are: a region (for the transport) and the same bytes
// as a pointer (for the reduction).
struct Place {
  Region* region;
  uint64_t offset;  // bytes into region
  unsigned char* data;
};

// Sends still to be awaited (a collective awaits all before it returns).
class PendingSends {
 public:
  void add(Region* r, int peer) { pending_.emplace_back(r, peer); }
  void wait_all(Transport& t) {
    // Completions on one region are counted, not matched: wait as many times
    // as sends were posted; the peer named on a failure is the earliest one.
    for (const auto& [region, peer] : pending_) t.wait_send(*region, peer);
    pending_.clear();
  }

 private:
  std::vector<std::pair<Region*, int>> pending_;
};

// Ring reduce-scatter over the chunks of `ch`: at step s this rank sends chunk
// (rank - s + shift) to its right neighbour and receives chunk (rank - s - 1 +
// shift) from its left, reduced with its own part into dst(c). After n - 1
// steps dst(rank + 1 + shift) holds the reduction over all ranks; every chunk
// but (rank + shift) is written once. Step 0 sends local data; later steps
// forward what was just reduced, segment by segment.
template <class LocalFn, class DstFn>
void ring_reduce_scatter(Transport& t, const Tuning& tuning, const Chunks& ch, int shift, int esize,
                         CombineFn combine, LocalFn local, DstFn dst, unsigned char* recv_area,
                         uint64_t phase) {
  const int n = t.size();
  const int r = t.rank();
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  const uint64_t m = ch.segments();
  const uint64_t steps = static_cast<uint64_t>(n - 1) * m;
  const uint64_t depth = std::min(tuning.recv_depth, steps);
  const uint64_t stride = ch.max_segment_bytes();
  Region& recv_region = t.region(recv_area, depth * stride);
  auto recv_chunk = [&](uint64_t j) { return mod(r - static_cast<int64_t>(j / m) - 1 + shift, n); };
  auto post_recv = [&](uint64_t j) {
    const uint64_t length = ch.segment(recv_chunk(j), j % m).second;
    if (length > 0) t.recv(recv_region, left, phase, (j % depth) * stride, length * esize);
  };
  for (uint64_t j = 0; j < depth; ++j) post_recv(j);

  PendingSends sends;
  const int first_chunk = mod(r + shift, n);
  const Place start = local(first_chunk);
  for (uint64_t k = 0; k < m; ++k) {
    const auto [first, length] = ch.segment(first_chunk, k);
    if (length == 0) continue;
    t.send(*start.region, right, phase, start.offset + first * esize, length * esize);
    sends.add(start.region, right);
  }
  for (uint64_t j = 0; j < steps; ++j) {
    const int c = recv_chunk(j);
    const auto [first, length] = ch.segment(c, j % m);
    if (length > 0) {
      t.wait_recv(recv_region, left);
      const Place to = dst(c);
      combine(to.data + first * esize, local(c).data + first * esize, recv_area + (j % depth) * stride,
              length);
      if (j / m + 2 < static_cast<uint64_t>(n)) {  // not the last step: forward it
        t.send(*to.region, right, phase, to.offset + first * esize, length * esize);
        sends.add(to.region, right);
      }
    }
    if (j + depth < steps) post_recv(j + depth);
  }
  sends.wait_all(t);
}

// Ring all-gather over the chunks of `ch`: this rank holds chunk `have` in
// place(have); at step s it sends chunk (have - s) right and receives chunk
// (have - s - 1) from the left, straight into place (every receive is posted
// up front), forwarding each segment as it lands.
template <class PlaceFn>
void ring_all_gather(Transport& t, const Chunks& ch, int have, int esize, PlaceFn place, uint64_t phase) {
  const int n = t.size();
  const int r = t.rank();
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  const uint64_t m = ch.segments();
  for (int s = 0; s + 1 < n; ++s) {
    const int c = mod(have - s - 1, n);
    const Place p = place(c);
    for (uint64_t k = 0; k < m; ++k) {
      const auto [first, length] = ch.segment(c, k);
      if (length > 0) t.recv(*p.region, left, phase, p.offset + first * esize, length * esize);
    }
  }
  PendingSends sends;
  const Place own = place(have);
  for (uint64_t k = 0; k < m; ++k) {
    const auto [first, length] = ch.segment(have, k);
    if (length == 0) continue;
    t.send(*own.region, right, phase, own.offset + first * esize, length * esize);
    sends.add(own.region, right);
  }
  for (int s = 0; s + 1 < n; ++s) {
    const int c = mod(have - s - 1, n);
    const Place p = place(c);
    for (uint64_t k = 0; k < m; ++k) {
      const auto [first, length] = ch.segment(c, k);
      if (length == 0) continue;
      t.wait_recv(*p.region, left);
      if (s + 2 < n) {
        t.send(*p.region, right, phase, p.offset + first * esize, length * esize);
        sends.add(p.region, right);
      }
    }
  }
  sends.wait_all(t);
}

// One direct round: this rank sends `bytes` to every peer p, from `from` at
// send_offset(p); peer p's message lands in `into` at p * bytes. Receives
// complete in any order.
template <class SendOffsetFn>
void exchange_all(Transport& t, Region& from, SendOffsetFn send_offset, Region& into, uint64_t bytes,
                  uint64_t phase) {
  const int n = t.size();
  const int r = t.rank();
  for (int d = 1; d < n; ++d) {
    const int p = mod(r - d, n);
    t.recv(into, p, phase, static_cast<uint64_t>(p) * bytes, bytes);
  }
  for (int d = 1; d < n; ++d) {  // staggered, so that not every rank starts with rank 0
    const int p = mod(r + d, n);
    t.send(from, p, phase, send_offset(p), bytes);
  }
  // The peer named on a failure: the lowest one not yet heard from.
  std::vector<bool> arrived(n, false);
  arrived[r] = true;
  for (int i = 1; i < n; ++i) {
    const int expected = static_cast<int>(std::find(arrived.begin(), arrived.end(), false) - arrived.begin());
    const int source = t.wait_recv(into, expected);
    if (source >= 0 && source < n) arrived[source] = true;
  }
  std::vector<bool> taken(n, false);
  taken[r] = true;
  for (int i = 1; i < n; ++i) {
    const int expected = static_cast<int>(std::find(taken.begin(), taken.end(), false) - taken.begin());
    const int to = t.wait_send(from, expected);
    if (to >= 0 && to < n) taken[to] = true;
  }
}

// out = block(0) (op) block(1) (op) ... in rank order, so every rank computes
// bit-identical results; block(p) is rank p's `count` elements. out may be
// block(0) or block(1) (combine is elementwise), never a later one.
template <class BlockFn>
void reduce_in_rank_order(CombineFn combine, unsigned char* out, BlockFn block, uint64_t count, int n) {
  combine(out, block(0), block(1), count);
  for (int p = 2; p < n; ++p) combine(out, out, block(p), count);
}

}  // namespace

void all_reduce(Transport& t, Scratch& scratch, const Tuning& tuning, Elements in, Elements out,
                const Reduction& red) {
  if (out.count == 0) return;  // every rank has the same count, so every rank skips
  const uint64_t bytes = out.bytes();
  if (in.data != out.data && overlap(in, out)) {  // partial overlap: reduce in place instead
    std::memmove(out.data, in.data, bytes);
    in = out;
  }
  const int n = t.size();
  const int r = t.rank();
  const int esize = out.esize;
  if (n == 1) {
    if (in.data != out.data) std::memcpy(out.data, in.data, bytes);
    return;
  }
  if (use_direct_round(tuning, bytes, n)) {
    unsigned char* blocks = scratch.bytes(bytes * n);
    // This rank's block is sent and reduced where it is, unless the result
    // overwrites it before the reduction reads it (in place on rank 2 and up).
    const bool copy_own = in.data == out.data && r >= 2;
    if (copy_own) std::memcpy(blocks + r * bytes, in.data, bytes);
    Region& b = t.region(blocks, bytes * n);
    Region& own = copy_own ? b : t.region(in.data, bytes);
    const uint64_t own_offset = copy_own ? r * bytes : 0;
    exchange_all(
        t, own, [&](int) { return own_offset; }, b, bytes, 0);
    auto block = [&](int p) -> const unsigned char* {
      return p == r && !copy_own ? in.data : blocks + p * bytes;
    };
    reduce_in_rank_order(red.combine, out.data, block, out.count, n);
    if (red.divide != nullptr) red.divide(out.data, out.count, n);
    return;
  }
  const Chunks ch = Chunks::balanced(tuning, out.count, n, esize);
  unsigned char* recv_area = scratch.bytes(tuning.recv_depth * ch.max_segment_bytes());
  Region& out_region = t.region(out.data, bytes);
  Region& in_region = in.data != out.data ? t.region(in.data, bytes) : out_region;
  auto local = [&](int k) { return Place{&in_region, ch.begin(k) * esize, in.data + ch.begin(k) * esize}; };
  auto place = [&](int k) { return Place{&out_region, ch.begin(k) * esize, out.data + ch.begin(k) * esize}; };
  ring_reduce_scatter(t, tuning, ch, 0, esize, red.combine, local, place, recv_area, 0);
  const int owned = mod(r + 1, n);
  if (red.divide != nullptr) red.divide(out.data + ch.begin(owned) * esize, ch.size(owned), n);
  ring_all_gather(t, ch, owned, esize, place, 1);
}

namespace {

// A transport whose messages carry their phases shifted by `shift`, so that
// the pieces of a pipelined collective never share a tag.
class PhaseShift final : public Transport {
 public:
  PhaseShift(Transport& inner, uint64_t shift) : inner_(inner), shift_(shift) {}
  int rank() const noexcept override { return inner_.rank(); }
  int size() const noexcept override { return inner_.size(); }
  Region& region(void* data, uint64_t bytes) override { return inner_.region(data, bytes); }
  void send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override {
    inner_.send(from, peer, phase + shift_, offset, bytes);
  }
  void recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override {
    inner_.recv(into, peer, phase + shift_, offset, bytes);
  }
  int wait_recv(Region& region, int expected) override { return inner_.wait_recv(region, expected); }
  int wait_send(Region& region, int expected) override { return inner_.wait_send(region, expected); }

 private:
  Transport& inner_;
  const uint64_t shift_;
};

// At most this many pieces in a pipelined two-level all_reduce.
constexpr uint64_t kMaxPieces = 64;

// hierarchical_all_reduce of ring-sized data on hosts of equal size, in
// pieces of about tuning.pipeline_bytes: this thread reduce-scatters every
// piece within the host, then all-gathers each as soon as it has crossed;
// a second thread all-reduces each reduced piece's chunk across hosts as
// soon as it is scattered. The two levels use different transports (shared
// memory, TCP), so each is used by one thread; a failure on either stops the
// other (an interrupt of the TCP level) before it is rethrown here.
void all_reduce_in_rails(Levels& levels, Scratch& scratch, Scratch& across_scratch, const Tuning& tuning,
                         Elements in, Elements out, const Reduction& red) {
  Transport& local = levels.local();
  const int n = local.size();
  const int esize = out.esize;
  const uint64_t bytes = out.bytes();
  const uint64_t pieces =
      std::clamp<uint64_t>(bytes / std::max<uint64_t>(1, tuning.pipeline_bytes), 1, kMaxPieces);
  auto piece_begin = [&](uint64_t p) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(out.count) * p / pieces);
  };
  std::vector<Chunks> chunks;
  uint64_t largest_segment = 0;
  for (uint64_t p = 0; p < pieces; ++p) {
    chunks.push_back(Chunks::balanced(tuning, piece_begin(p + 1) - piece_begin(p), n, esize));
    largest_segment = std::max(largest_segment, chunks.back().max_segment_bytes());
  }
  unsigned char* recv_area = scratch.bytes(tuning.recv_depth * largest_segment);
  Region& out_region = local.region(out.data, bytes);
  Region& in_region = in.data != out.data ? local.region(in.data, bytes) : out_region;
  const int owned = mod(local.rank() + 1, n);
  auto at = [&](uint64_t p, int k) { return (piece_begin(p) + chunks[p].begin(k)) * esize; };
  auto reduce_scatter_piece = [&](uint64_t p) {
    auto own = [&](int k) { return Place{&in_region, at(p, k), in.data + at(p, k)}; };
    auto place = [&](int k) { return Place{&out_region, at(p, k), out.data + at(p, k)}; };
    ring_reduce_scatter(local, tuning, chunks[p], 0, esize, red.combine, own, place, recv_area, 0);
  };
  auto all_gather_piece = [&](uint64_t p) {
    auto place = [&](int k) { return Place{&out_region, at(p, k), out.data + at(p, k)}; };
    ring_all_gather(local, chunks[p], owned, esize, place, 1);
  };
  const Reduction combine_only{red.combine, nullptr};
  auto cross = [&](uint64_t p, Scratch& space) {
    PhaseShift shifted(*levels.across(), 2 * p);
    const Elements chunk{out.data + at(p, owned), chunks[p].size(owned), esize};
    all_reduce(shifted, space, tuning, chunk, chunk, combine_only);
    if (red.divide != nullptr) red.divide(chunk.data, chunk.count, levels.world());
  };
  if (pieces == 1) {
    reduce_scatter_piece(0);
    cross(0, scratch);
    all_gather_piece(0);
    return;
  }

  std::mutex mutex;
  std::condition_variable changed;
  uint64_t scattered = 0;  // pieces reduced within the host
  uint64_t crossed = 0;    // pieces reduced across hosts
  bool stop = false;
  std::exception_ptr failure;  // the across thread's
  std::thread across_thread([&] {
    Scratch& space = across_scratch;  // the caller's: a failed call's posted receives may still land in it
    try {
      for (uint64_t p = 0; p < pieces; ++p) {
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] { return scattered > p || stop; });
          if (stop) return;
        }
        cross(p, space);
        {
          const std::lock_guard<std::mutex> lock(mutex);
          crossed = p + 1;
        }
        changed.notify_all();
      }
    } catch (...) {
      {
        const std::lock_guard<std::mutex> lock(mutex);
        failure = std::current_exception();
      }
      changed.notify_all();
    }
  });
  auto join = [&] {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    changed.notify_all();
    across_thread.join();
  };
  try {
    for (uint64_t p = 0; p < pieces; ++p) {
      reduce_scatter_piece(p);
      {
        const std::lock_guard<std::mutex> lock(mutex);
        scattered = p + 1;
      }
      changed.notify_all();
    }
    for (uint64_t p = 0; p < pieces; ++p) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return crossed > p || failure != nullptr; });
        if (crossed <= p) std::rethrow_exception(failure);
      }
      all_gather_piece(p);
    }
  } catch (...) {
    levels.interrupt_across();  // the across thread may be waiting on the network
    join();
    throw;
  }
  join();
}

}  // namespace

void hierarchical_all_reduce(Levels& levels, Scratch& scratch, Scratch& across_scratch, const Tuning& tuning,
                             Elements in, Elements out, const Reduction& red) {
  if (out.count == 0) return;  // every rank has the same count, so every rank skips
  const uint64_t bytes = out.bytes();
  if (in.data != out.data && overlap(in, out)) {  // partial overlap: reduce in place instead
    std::memmove(out.data, in.data, bytes);
    in = out;
  }
  Transport& local = levels.local();
  const int n = local.size();
  // Every rank of a host decides alike (same size and tuning), and every
  // host alike (uniform() is the group's).
  if (n > 1 && levels.uniform() && !use_direct_round(tuning, bytes, n)) {
    all_reduce_in_rails(levels, scratch, across_scratch, tuning, in, out, red);
    return;
  }
  const Reduction combine_only{red.combine, nullptr};
  all_reduce(local, scratch, tuning, in, out, combine_only);
  if (local.rank() == 0) {
    all_reduce(*levels.across(), scratch, tuning, out, out, combine_only);
    if (red.divide != nullptr) red.divide(out.data, out.count, levels.world());
  }
  broadcast(local, tuning, out, 0);
}

void broadcast(Transport& t, const Tuning& tuning, Elements data, int root) {
  const int n = t.size();
  if (data.count == 0 || n == 1) return;
  const int r = t.rank();
  const int esize = data.esize;
  const uint64_t bytes = data.bytes();
  Region& b = t.region(data.data, bytes);
  if (n == 2 || bytes <= tuning.direct_max_bytes) {
    if (r == root) {
      PendingSends sends;
      for (int d = 1; d < n; ++d) {
        const int p = mod(r + d, n);
        t.send(b, p, 0, 0, bytes);
        sends.add(&b, p);
      }
      sends.wait_all(t);
    } else {
      t.recv(b, root, 0, 0, bytes);
      t.wait_recv(b, root);
    }
    return;
  }
  // A pipelined chain root -> root+1 -> ...: each rank forwards a segment as
  // soon as it has it, so the root uploads the data once, not n - 1 times.
  const Chunks ch = Chunks::blocks(tuning, data.count, esize);
  const int position = mod(r - root, n);
  const int next = mod(r + 1, n);
  const int prev = mod(r - 1, n);
  if (position > 0)
    for (uint64_t k = 0; k < ch.segments(); ++k) {
      const auto [first, length] = ch.segment(0, k);
      if (length > 0) t.recv(b, prev, 0, first * esize, length * esize);
    }
  PendingSends sends;
  for (uint64_t k = 0; k < ch.segments(); ++k) {
    const auto [first, length] = ch.segment(0, k);
    if (length == 0) continue;
    if (position > 0) t.wait_recv(b, prev);
    if (position + 1 < n) {
      t.send(b, next, 0, first * esize, length * esize);
      sends.add(&b, next);
    }
  }
  sends.wait_all(t);
}

void all_gather(Transport& t, const Tuning& tuning, Elements in, Elements out) {
  if (in.count == 0) return;
  const int n = t.size();
  const int r = t.rank();
  const int esize = in.esize;
  const uint64_t block = in.bytes();
  // The input may overlap the output anywhere: after this move it is not read again.
  if (out.data + r * block != in.data) std::memmove(out.data + r * block, in.data, block);
  if (n == 1) return;
  Region& b = t.region(out.data, out.bytes());
  if (use_direct_round(tuning, block, n)) {
    exchange_all(
        t, b, [&](int) { return r * block; }, b, block, 0);
    return;
  }
  const Chunks ch = Chunks::blocks(tuning, in.count, esize);
  auto place = [&](int k) { return Place{&b, k * block, out.data + k * block}; };
  ring_all_gather(t, ch, r, esize, place, 0);
}

void reduce_scatter(Transport& t, Scratch& scratch, const Tuning& tuning, Elements in, Elements out,
                    const Reduction& red) {
  if (out.count == 0) return;
  const int n = t.size();
  const int r = t.rank();
  const int esize = out.esize;
  const uint64_t block = out.bytes();
  if (n == 1) {
    if (in.data != out.data) std::memmove(out.data, in.data, block);
    return;
  }
  Region& in_region = t.region(in.data, in.bytes());
  if (use_direct_round(tuning, block, n)) {
    unsigned char* blocks = scratch.bytes(block * n);
    // This rank's own block is reduced where it is, unless the output
    // overlaps the input (the reduction would overwrite it before reading).
    const bool copy_own = overlap(in, out);
    if (copy_own) std::memcpy(blocks + r * block, in.data + r * block, block);
    Region& b = t.region(blocks, block * n);
    // Peer p gets block p of the input.
    exchange_all(
        t, in_region, [&](int p) { return p * block; }, b, block, 0);
    // Every send has completed, so writing the output cannot disturb one even
    // if the output overlaps the input.
    auto own_or_received = [&](int p) -> const unsigned char* {
      return p == r && !copy_own ? in.data + r * block : blocks + p * block;
    };
    reduce_in_rank_order(red.combine, out.data, own_or_received, out.count, n);
    if (red.divide != nullptr) red.divide(out.data, out.count, n);
    return;
  }
  // shift -1: this rank ends with chunk r. Partial sums of chunks r-2 ...
  // r-(n-1) live in scratch until forwarded; chunk r goes straight to the
  // output unless the output overlaps the input (then through scratch too).
  const Chunks ch = Chunks::blocks(tuning, out.count, esize);
  const bool staged = overlap(in, out);
  const uint64_t recv_bytes = tuning.recv_depth * ch.max_segment_bytes();
  const uint64_t partials = static_cast<uint64_t>(n - 2) + (staged ? 1 : 0);
  unsigned char* area = scratch.bytes(recv_bytes + partials * block);
  unsigned char* partial = area + recv_bytes;
  Region* partial_region = partials > 0 ? &t.region(partial, partials * block) : nullptr;
  Region* out_region = staged ? nullptr : &t.region(out.data, block);
  auto local = [&](int k) { return Place{&in_region, k * block, in.data + k * block}; };
  auto dst = [&](int k) {
    if (k == r && !staged) return Place{out_region, 0, out.data};
    const uint64_t index = k == r ? static_cast<uint64_t>(n - 2) : static_cast<uint64_t>(mod(r - 2 - k, n));
    return Place{partial_region, index * block, partial + index * block};
  };
  ring_reduce_scatter(t, tuning, ch, -1, esize, red.combine, local, dst, area, 0);
  unsigned char* result = dst(r).data;
  if (red.divide != nullptr) red.divide(result, out.count, n);
  if (staged) std::memcpy(out.data, result, block);
}

void barrier(Transport& t, Scratch& scratch) {
  const int n = t.size();
  if (n == 1) return;
  const int r = t.rank();
  // Dissemination: in round k every rank signals rank + 2^k and waits for
  // rank - 2^k; after ceil(log2 n) rounds each rank has heard from all.
  unsigned char* bytes = scratch.bytes(2);
  bytes[0] = 1;
  Region& token = t.region(bytes, 1);
  Region& inbox = t.region(bytes + 1, 1);
  uint64_t round = 0;
  for (int d = 1; d < n; d *= 2, ++round) {
    const int to = mod(r + d, n);
    const int from = mod(r - d, n);
    t.recv(inbox, from, round, 0, 1);
    t.send(token, to, round, 0, 1);
    t.wait_recv(inbox, from);
    t.wait_send(token, to);
  }
}

}  // namespace backplane::cpu
