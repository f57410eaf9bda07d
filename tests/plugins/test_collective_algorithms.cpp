// The cpu plugin's collective algorithms (cpu/collective_algorithms.hpp) alone,
// over an in-memory transport: ranks are threads, a message is copied from
// the sender's memory into the receiver's when both sides have posted it (as
// Gloo's unbound buffers do). Small tuning values reach the ring and the
// pipelined chain with small tensors; the in-memory transport checks every
// transfer against its region's bounds.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cpu/collective_algorithms.hpp"

using namespace backplane::cpu;
using namespace std::chrono_literals;

namespace {

// ---------------------------------------------------------------------------
// The in-memory transport
// ---------------------------------------------------------------------------

class MemoryRegion final : public Region {
 public:
  MemoryRegion(unsigned char* data, uint64_t size) : data(data), size(size) {}
  unsigned char* const data;
  const uint64_t size;
  std::deque<int> received_from;  // completions not yet waited for
  std::deque<int> sent_to;
};

// The messages of one group: posted sends and receives by (from, to, phase,
// bytes), matched in the order posted.
class Network {
 public:
  Network(int size, std::chrono::milliseconds timeout) : size(size), timeout(timeout), bytes_sent(size, 0) {}

  const int size;
  const std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<uint64_t> bytes_sent;  // per rank

  struct Posted {
    MemoryRegion* region;
    uint64_t offset;
    int rank;  // who posted it
  };
  using Key = std::tuple<int, int, uint64_t, uint64_t>;  // from, to, phase, bytes
  std::map<Key, std::deque<Posted>> sends;
  std::map<Key, std::deque<Posted>> receives;

  // Transport's ordering rule (the shared-memory transport matches strictly
  // in order): the k-th receive a rank posts for a peer must be for the k-th
  // message that peer sends it. Each posting's phase is logged per (from, to)
  // and checked against the other side's log (lengths may differ: ranks
  // that disagree on a count must fail by timing out here); the caller holds
  // the mutex.
  std::map<std::pair<int, int>, std::vector<uint64_t>> sent_log, received_log;
  void log_in_order(bool sending, int from, int to, uint64_t phase) {
    auto& mine = (sending ? sent_log : received_log)[{from, to}];
    const auto& theirs = (sending ? received_log : sent_log)[{from, to}];
    const std::size_t k = mine.size();
    mine.push_back(phase);
    if (k < theirs.size() && theirs[k] != phase)
      throw std::logic_error("rank " + std::to_string(to) + "'s receive #" + std::to_string(k) +
                             " from rank " + std::to_string(from) + " and that rank's send #" +
                             std::to_string(k) + " are of different phases: posted out of order");
  }
};

class MemoryTransport final : public Transport {
 public:
  MemoryTransport(Network& net, int rank) : net_(net), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return net_.size; }

  Region& region(void* data, uint64_t bytes) override {
    regions_.push_back(std::make_unique<MemoryRegion>(static_cast<unsigned char*>(data), bytes));
    return *regions_.back();
  }

  void send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override {
    auto& r = checked(from, peer, offset, bytes, "send");
    std::lock_guard<std::mutex> lock(net_.mutex);
    net_.log_in_order(true, rank_, peer, phase);
    net_.bytes_sent[rank_] += bytes;
    auto& waiting = net_.receives[{rank_, peer, phase, bytes}];
    if (waiting.empty()) {
      net_.sends[{rank_, peer, phase, bytes}].push_back({&r, offset, rank_});
      return;
    }
    const Network::Posted into = waiting.front();
    waiting.pop_front();
    deliver(r, offset, rank_, *into.region, into.offset, peer, bytes);
  }

  void recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override {
    auto& r = checked(into, peer, offset, bytes, "recv");
    std::lock_guard<std::mutex> lock(net_.mutex);
    net_.log_in_order(false, peer, rank_, phase);
    auto& waiting = net_.sends[{peer, rank_, phase, bytes}];
    if (waiting.empty()) {
      net_.receives[{peer, rank_, phase, bytes}].push_back({&r, offset, rank_});
      return;
    }
    const Network::Posted from = waiting.front();
    waiting.pop_front();
    deliver(*from.region, from.offset, peer, r, offset, rank_, bytes);
  }

  int wait_recv(Region& region, int expected) override {
    return wait(static_cast<MemoryRegion&>(region).received_from, expected, "receive from");
  }
  int wait_send(Region& region, int expected) override {
    return wait(static_cast<MemoryRegion&>(region).sent_to, expected, "send to");
  }

 private:
  MemoryRegion& checked(Region& region, int peer, uint64_t offset, uint64_t bytes, const char* what) const {
    auto& r = static_cast<MemoryRegion&>(region);
    if (peer < 0 || peer >= net_.size || peer == rank_)
      throw std::logic_error(std::string(what) + " to/from rank " + std::to_string(peer));
    if (offset > r.size || bytes > r.size - offset)
      throw std::logic_error(std::string(what) + " of [" + std::to_string(offset) + ", +" +
                             std::to_string(bytes) + ") outside a region of " + std::to_string(r.size) +
                             " bytes");
    return r;
  }

  // Called with the network's mutex held.
  void deliver(MemoryRegion& from, uint64_t from_offset, int sender, MemoryRegion& into, uint64_t into_offset,
               int receiver, uint64_t bytes) {
    std::memcpy(into.data + into_offset, from.data + from_offset, bytes);
    into.received_from.push_back(sender);
    from.sent_to.push_back(receiver);
    net_.changed.notify_all();
  }

  int wait(std::deque<int>& done, int expected, const char* what) {
    std::unique_lock<std::mutex> lock(net_.mutex);
    if (!net_.changed.wait_for(lock, net_.timeout, [&] { return !done.empty(); }))
      throw std::runtime_error("rank " + std::to_string(rank_) + " timed out waiting to " + what + " rank " +
                               std::to_string(expected));
    const int peer = done.front();
    done.pop_front();
    return peer;
  }

  Network& net_;
  const int rank_;
  std::vector<std::unique_ptr<MemoryRegion>> regions_;
};

// Runs body(transport, scratch) on `world` threads; returns each rank's error ("" when none).
std::vector<std::string> run_ranks(int world, const std::function<void(Transport&, Scratch&)>& body,
                                   std::chrono::milliseconds timeout = 20s) {
  Network net(world, timeout);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      MemoryTransport t(net, r);
      Scratch scratch;
      try {
        body(t, scratch);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

#define CHECK_ALL_RANKS_OK(errors)                         \
  do {                                                     \
    for (std::size_t r_ = 0; r_ < (errors).size(); ++r_) { \
      CAPTURE(r_);                                         \
      CHECK((errors)[r_] == "");                           \
    }                                                      \
  } while (false)

// ---------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------

// Rank r's element i: small integers, exact in f32 and i64.
int64_t value(int rank, uint64_t i) {
  return static_cast<int64_t>((i * 7 + static_cast<uint64_t>(rank) * 13) % 23) - 11;
}

template <class T>
std::vector<T> rank_values(int rank, uint64_t count, uint64_t index_base = 0) {
  std::vector<T> v(count);
  for (uint64_t i = 0; i < count; ++i) v[i] = static_cast<T>(value(rank, index_base + i));
  return v;
}

enum class Op { sum, max, mean };

template <class T>
T expected(Op op, int world, uint64_t i) {
  int64_t acc = value(0, i);
  for (int r = 1; r < world; ++r) acc = op == Op::max ? std::max(acc, value(r, i)) : acc + value(r, i);
  if (op != Op::mean) return static_cast<T>(acc);
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(acc) / static_cast<T>(world);
  else
    return static_cast<T>(acc / world);  // truncates toward zero, as the plugin's mean
}

template <class T>
Reduction reduction(Op op) {
  constexpr int32_t dtype = std::is_same_v<T, float> ? BP_DTYPE_F32 : BP_DTYPE_I64;
  const int32_t rop = op == Op::sum ? BP_REDUCE_SUM : op == Op::max ? BP_REDUCE_MAX : BP_REDUCE_MEAN;
  return {combine_for(dtype, rop), op == Op::mean ? divide_for(dtype) : nullptr};
}

template <class T>
Elements elements(std::vector<T>& v, uint64_t offset = 0, uint64_t count = UINT64_MAX) {
  return {reinterpret_cast<unsigned char*>(v.data() + offset),
          count == UINT64_MAX ? v.size() - offset : count, static_cast<int>(sizeof(T))};
}

// Small values that reach every path with tensors of a few KiB.
Tuning small_tuning() {
  Tuning t;
  t.direct_max_bytes = 256;
  t.segment_bytes = 1024;
  t.min_segments = 3;
  t.min_segment_bytes = 64;
  t.recv_depth = 2;
  t.pipeline_bytes = 2048;
  return t;
}

const uint64_t kCounts[] = {0, 1, 5, 64, 1001, 4099};

template <class T>
std::string check_all_reduce_case(int world, const Tuning& tuning, uint64_t count, Op op) {
  std::vector<std::string> mismatches(world);
  const auto errors = run_ranks(world, [&](Transport& t, Scratch& scratch) {
    std::vector<T> in = rank_values<T>(t.rank(), count);
    const std::vector<T> before = in;
    std::vector<T> out(count, T(99));
    all_reduce(t, scratch, tuning, elements(in), elements(out), reduction<T>(op));
    for (uint64_t i = 0; i < count; ++i)
      if (out[i] != expected<T>(op, world, i)) {
        mismatches[t.rank()] = "element " + std::to_string(i) + " is " + std::to_string(out[i]);
        break;
      }
    if (in != before) mismatches[t.rank()] += " (the input changed)";
  });
  for (int r = 0; r < world; ++r) {
    if (!errors[r].empty()) return "rank " + std::to_string(r) + ": " + errors[r];
    if (!mismatches[r].empty()) return "rank " + std::to_string(r) + ": " + mismatches[r];
  }
  return "";
}

}  // namespace

// ---------------------------------------------------------------------------
// all_reduce
// ---------------------------------------------------------------------------

TEST_CASE("collective_algorithms: all_reduce of any count on 1 to 5 ranks, direct and ring") {
  for (int world = 1; world <= 5; ++world)
    for (const Tuning& tuning : {Tuning{}, small_tuning()})
      for (uint64_t count : kCounts)
        for (Op op : {Op::sum, Op::max, Op::mean}) {
          CAPTURE(world);
          CAPTURE(count);
          CAPTURE(static_cast<int>(op));
          CAPTURE(tuning.segment_bytes);
          CHECK(check_all_reduce_case<int64_t>(world, tuning, count, op) == "");
          CHECK(check_all_reduce_case<float>(world, tuning, count, op) == "");
        }
}

TEST_CASE("collective_algorithms: all_reduce in place and with overlapping input and output") {
  const Tuning tuning = small_tuning();
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    for (uint64_t count : {uint64_t{3}, uint64_t{2000}}) {
      CAPTURE(count);
      std::vector<std::string> problems(world);
      const auto errors = run_ranks(world, [&](Transport& t, Scratch& scratch) {
        std::vector<int64_t> same = rank_values<int64_t>(t.rank(), count);
        all_reduce(t, scratch, tuning, elements(same), elements(same), reduction<int64_t>(Op::sum));
        // The output starts 5 elements into the input.
        std::vector<int64_t> shared(count + 5);
        const std::vector<int64_t> mine = rank_values<int64_t>(t.rank(), count);
        std::copy(mine.begin(), mine.end(), shared.begin());
        all_reduce(t, scratch, tuning, elements(shared, 0, count), elements(shared, 5, count),
                   reduction<int64_t>(Op::sum));
        for (uint64_t i = 0; i < count; ++i) {
          if (same[i] != expected<int64_t>(Op::sum, world, i))
            problems[t.rank()] = "in place: element " + std::to_string(i);
          if (shared[5 + i] != expected<int64_t>(Op::sum, world, i))
            problems[t.rank()] = "overlapping: element " + std::to_string(i);
        }
      });
      CHECK_ALL_RANKS_OK(errors);
      CHECK_ALL_RANKS_OK(problems);
    }
  }
}

namespace {

// Bytes each rank sent for one all_reduce of `count` f32 per rank.
std::vector<uint64_t> bytes_sent_by_all_reduce(int world, const Tuning& tuning, uint64_t count) {
  Network net(world, 20s);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      MemoryTransport t(net, r);
      Scratch scratch;
      std::vector<float> v = rank_values<float>(r, count);
      all_reduce(t, scratch, tuning, elements(v), elements(v), reduction<float>(Op::sum));
    });
  for (auto& th : threads) th.join();
  return net.bytes_sent;
}

}  // namespace

TEST_CASE(
    "collective_algorithms: the ring sends 2 (n - 1) / n of the data per rank, the direct round n - 1 "
    "times") {
  const Tuning tuning = small_tuning();
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    const uint64_t count = 1200 * static_cast<uint64_t>(world);  // chunks of equal size
    for (uint64_t sent : bytes_sent_by_all_reduce(world, tuning, count))
      CHECK(sent == 2 * (world - 1) * (count / world) * sizeof(float));
    for (uint64_t sent : bytes_sent_by_all_reduce(world, tuning, 8))
      CHECK(sent == (world - 1) * 8 * sizeof(float));
  }
}

// ---------------------------------------------------------------------------
// reduce_scatter, all_gather, broadcast, barrier
// ---------------------------------------------------------------------------

TEST_CASE("collective_algorithms: reduce_scatter gives rank r block r, also into its own input") {
  for (int world = 1; world <= 5; ++world)
    for (const Tuning& tuning : {Tuning{}, small_tuning()})
      for (uint64_t count : kCounts)
        // The output: separate (0), the input's first block (1), or this
        // rank's own block of the input (2: in place).
        for (int overlapping : {0, 1, 2}) {
          CAPTURE(world);
          CAPTURE(count);
          CAPTURE(overlapping);
          std::vector<std::string> problems(world);
          const auto errors = run_ranks(world, [&](Transport& t, Scratch& scratch) {
            std::vector<int64_t> in = rank_values<int64_t>(t.rank(), count * world);
            std::vector<int64_t> separate(count, -1);
            Elements out = overlapping == 0   ? elements(separate)
                           : overlapping == 1 ? elements(in, 0, count)
                                              : elements(in, t.rank() * count, count);
            reduce_scatter(t, scratch, tuning, elements(in), out, reduction<int64_t>(Op::sum));
            const int64_t* got = reinterpret_cast<const int64_t*>(out.data);
            for (uint64_t i = 0; i < count; ++i)
              if (got[i] != expected<int64_t>(Op::sum, world, t.rank() * count + i)) {
                problems[t.rank()] = "element " + std::to_string(i) + " is " + std::to_string(got[i]);
                break;
              }
          });
          CHECK_ALL_RANKS_OK(errors);
          CHECK_ALL_RANKS_OK(problems);
        }
}

TEST_CASE("collective_algorithms: all_gather puts every rank's block in rank order, also in place") {
  for (int world = 1; world <= 5; ++world)
    for (const Tuning& tuning : {Tuning{}, small_tuning()})
      for (uint64_t count : kCounts)
        for (bool in_place : {false, true}) {
          CAPTURE(world);
          CAPTURE(count);
          CAPTURE(in_place);
          std::vector<std::string> problems(world);
          const auto errors = run_ranks(world, [&](Transport& t, Scratch&) {
            std::vector<float> out(count * world, -1.0f);
            std::vector<float> separate = rank_values<float>(t.rank(), count);
            if (in_place) std::copy(separate.begin(), separate.end(), out.begin() + t.rank() * count);
            const Elements in = in_place ? elements(out, t.rank() * count, count) : elements(separate);
            all_gather(t, tuning, in, elements(out));
            for (int r = 0; r < world; ++r)
              for (uint64_t i = 0; i < count; ++i)
                if (out[r * count + i] != static_cast<float>(value(r, i))) {
                  problems[t.rank()] = "block " + std::to_string(r) + " element " + std::to_string(i);
                  r = world;
                  break;
                }
          });
          CHECK_ALL_RANKS_OK(errors);
          CHECK_ALL_RANKS_OK(problems);
        }
}

TEST_CASE("collective_algorithms: broadcast from every root, direct and as a pipelined chain") {
  for (int world = 1; world <= 5; ++world)
    for (const Tuning& tuning : {Tuning{}, small_tuning()})
      for (uint64_t count : kCounts)
        for (int root = 0; root < world; ++root) {
          CAPTURE(world);
          CAPTURE(count);
          CAPTURE(root);
          std::vector<std::string> problems(world);
          const auto errors = run_ranks(world, [&](Transport& t, Scratch&) {
            std::vector<int64_t> data = rank_values<int64_t>(t.rank(), count);
            broadcast(t, tuning, elements(data), root);
            if (data != rank_values<int64_t>(root, count))
              problems[t.rank()] = "differs from the root's data";
          });
          CHECK_ALL_RANKS_OK(errors);
          CHECK_ALL_RANKS_OK(problems);
        }
}

TEST_CASE("collective_algorithms: no rank leaves a barrier before every rank entered it") {
  for (int world : {1, 2, 3, 5, 8}) {
    CAPTURE(world);
    std::atomic<int> entered{0};
    std::vector<std::string> problems(world);
    const auto errors = run_ranks(world, [&](Transport& t, Scratch& scratch) {
      if (t.rank() == world - 1) std::this_thread::sleep_for(20ms);  // late on purpose
      entered.fetch_add(1);
      barrier(t, scratch);
      if (entered.load() < world)
        problems[t.rank()] = "left with " + std::to_string(entered.load()) + " entered";
    });
    CHECK_ALL_RANKS_OK(errors);
    CHECK_ALL_RANKS_OK(problems);
  }
}

TEST_CASE(
    "collective_algorithms: the in-memory transport catches receives posted out of the senders' order") {
  // What the algorithms must never do, done on purpose: the check that keeps
  // them runnable on the shared-memory transport can fail.
  const auto errors = run_ranks(
      2,
      [&](Transport& t, Scratch&) {
        std::vector<float> a(4), b(4);
        Region& ra = t.region(a.data(), 16);
        Region& rb = t.region(b.data(), 16);
        if (t.rank() == 0) {
          t.send(ra, 1, 0, 0, 16);
          t.send(rb, 1, 1, 0, 16);
        } else {
          t.recv(rb, 0, 1, 0, 16);
          t.recv(ra, 0, 0, 0, 16);
        }
      },
      300ms);
  const std::string both = errors[0] + errors[1];
  CHECK(both.find("posted out of order") != std::string::npos);
}

TEST_CASE("collective_algorithms: ranks that disagree on the count wait and fail instead of mixing data") {
  // Every message's length is part of its match: a rank that expects a
  // different count never receives a message of the wrong size.
  for (uint64_t big : {uint64_t{40}, uint64_t{3000}}) {
    CAPTURE(big);
    const auto errors = run_ranks(
        2,
        [&](Transport& t, Scratch& scratch) {
          const uint64_t count = t.rank() == 0 ? big : big + 1;
          std::vector<float> v = rank_values<float>(t.rank(), count);
          all_reduce(t, scratch, small_tuning(), elements(v), elements(v), reduction<float>(Op::sum));
        },
        300ms);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(errors[r].find("timed out waiting") != std::string::npos);
    }
  }
}

// ---------------------------------------------------------------------------
// all_reduce in two levels (hosts of shared memory, leaders over TCP)
// ---------------------------------------------------------------------------

namespace {

// One rank's view of a group in hosts: its host's network and, where every
// host has its local rank, the network of that local rank across hosts.
class MemoryLevels final : public Levels {
 public:
  MemoryLevels(Network& host, int local_rank, Network* across, int host_index, bool uniform, int world)
      : local_(host, local_rank), uniform_(uniform), world_(world) {
    if (across != nullptr) across_ = std::make_unique<MemoryTransport>(*across, host_index);
  }
  Transport& local() override { return local_; }
  Transport* across() override { return across_.get(); }
  bool uniform() const noexcept override { return uniform_; }
  int world() const noexcept override { return world_; }
  // The in-memory transport's waits end at its timeout.
  void interrupt_across() noexcept override {}

 private:
  MemoryTransport local_;
  std::unique_ptr<MemoryTransport> across_;
  const bool uniform_;
  const int world_;
};

struct LevelsRun {
  std::vector<std::string> errors;                  // per rank, "" when none
  std::vector<std::vector<uint64_t>> across_bytes;  // [local rank][host]: sent to the other hosts
};

// Runs body(levels, rank, scratch) on the ranks of `hosts` (each a count of
// ranks, numbered host by host), each rank a thread.
LevelsRun run_levels(const std::vector<int>& hosts, const std::function<void(Levels&, int, Scratch&)>& body,
                     std::chrono::milliseconds timeout = 20s) {
  const int fewest = *std::min_element(hosts.begin(), hosts.end());
  const int most = *std::max_element(hosts.begin(), hosts.end());
  int world = 0;
  for (int n : hosts) world += n;
  std::vector<std::unique_ptr<Network>> host_nets;
  for (int n : hosts) host_nets.push_back(std::make_unique<Network>(n, timeout));
  std::vector<std::unique_ptr<Network>> across_nets;
  for (int l = 0; l < fewest; ++l)
    across_nets.push_back(std::make_unique<Network>(static_cast<int>(hosts.size()), timeout));
  LevelsRun run{std::vector<std::string>(world), {}};
  std::vector<std::thread> threads;
  int rank = 0;
  for (std::size_t h = 0; h < hosts.size(); ++h)
    for (int local = 0; local < hosts[h]; ++local, ++rank)
      threads.emplace_back([&, h, local, rank] {
        MemoryLevels levels(*host_nets[h], local, local < fewest ? across_nets[local].get() : nullptr,
                            static_cast<int>(h), fewest == most, world);
        Scratch scratch;
        try {
          body(levels, rank, scratch);
        } catch (const std::exception& e) {
          run.errors[rank] = e.what();
        }
      });
  for (auto& t : threads) t.join();
  for (const auto& net : across_nets) run.across_bytes.push_back(net->bytes_sent);
  return run;
}

template <class T>
std::string check_levels_case(const std::vector<int>& hosts, const Tuning& tuning, uint64_t count, Op op,
                              bool in_place) {
  int world = 0;
  for (int n : hosts) world += n;
  std::vector<std::vector<T>> results(world);
  std::vector<std::string> mismatches(world);
  const LevelsRun run = run_levels(hosts, [&](Levels& levels, int rank, Scratch& scratch) {
    std::vector<T> in = rank_values<T>(rank, count);
    const std::vector<T> before = in;
    std::vector<T> out(count, T(99));
    std::vector<T>& result = in_place ? in : out;
    Scratch across;  // the communicator's second scratch
    hierarchical_all_reduce(levels, scratch, across, tuning, elements(in), elements(result),
                            reduction<T>(op));
    for (uint64_t i = 0; i < count; ++i)
      if (result[i] != expected<T>(op, world, i)) {
        mismatches[rank] = "element " + std::to_string(i) + " is " + std::to_string(result[i]);
        break;
      }
    if (!in_place && in != before) mismatches[rank] += " (the input changed)";
    results[rank] = result;
  });
  for (int r = 0; r < world; ++r) {
    if (!run.errors[r].empty()) return "rank " + std::to_string(r) + ": " + run.errors[r];
    if (!mismatches[r].empty()) return "rank " + std::to_string(r) + ": " + mismatches[r];
    if (count > 0 && std::memcmp(results[r].data(), results[0].data(), count * sizeof(T)) != 0)
      return "rank " + std::to_string(r) + "'s bytes differ from rank 0's";
  }
  return "";
}

}  // namespace

TEST_CASE("collective_algorithms: all_reduce in levels equals the flat one, on every layout of hosts") {
  const std::vector<std::vector<int>> layouts = {{2, 2}, {1, 2}, {2, 1}, {3, 1, 2}, {1, 1}, {4, 4}};
  for (const auto& hosts : layouts)
    for (const Tuning& tuning : {Tuning{}, small_tuning()})
      for (uint64_t count : kCounts)
        for (Op op : {Op::sum, Op::max, Op::mean})
          for (bool in_place : {false, true}) {
            CAPTURE(hosts.size());
            CAPTURE(hosts[0]);
            CAPTURE(hosts[1]);
            CAPTURE(count);
            CAPTURE(static_cast<int>(op));
            CAPTURE(tuning.segment_bytes);
            CAPTURE(in_place);
            CHECK(check_levels_case<int64_t>(hosts, tuning, count, op, in_place) == "");
            CHECK(check_levels_case<float>(hosts, tuning, count, op, in_place) == "");
          }
}

TEST_CASE("collective_algorithms: in levels, each host sends its data once to the other") {
  // Two hosts of two: the flat ring would send 2 (n - 1) / n = 1.5 times the
  // data from one host to the other. In levels, a small bucket goes between
  // the leaders alone; ring-sized data is split between the local ranks,
  // each sending its half across.
  for (uint64_t count : {uint64_t{16}, uint64_t{4096}}) {
    CAPTURE(count);
    const LevelsRun run = run_levels({2, 2}, [&](Levels& levels, int rank, Scratch& scratch) {
      std::vector<float> v = rank_values<float>(rank, count);
      Scratch across;  // the communicator's second scratch
      hierarchical_all_reduce(levels, scratch, across, small_tuning(), elements(v), elements(v),
                              reduction<float>(Op::sum));
    });
    CHECK_ALL_RANKS_OK(run.errors);
    REQUIRE(run.across_bytes.size() == 2);
    const uint64_t bytes = count * sizeof(float);
    for (int host = 0; host < 2; ++host) {
      CAPTURE(host);
      CHECK(run.across_bytes[0][host] + run.across_bytes[1][host] == bytes);
      CHECK(run.across_bytes[1][host] == (count == 16 ? 0 : bytes / 2));
    }
  }
}

TEST_CASE("collective_algorithms: in levels, a host whose leader never comes fails every rank") {
  // Rank 2 leads the second host and skips the call: its host's other rank
  // waits for it within the host, the first host's ranks for it (or for
  // rank 3) across hosts; all fail at the timeout, also when the transfer
  // across runs on its own thread (ring-sized data, in pieces).
  for (uint64_t count : {uint64_t{100}, uint64_t{4099}}) {
    CAPTURE(count);
    const LevelsRun run = run_levels(
        {2, 2},
        [&](Levels& levels, int rank, Scratch& scratch) {
          if (rank == 2) return;
          std::vector<float> v = rank_values<float>(rank, count);
          Scratch across;  // the communicator's second scratch
          hierarchical_all_reduce(levels, scratch, across, small_tuning(), elements(v), elements(v),
                                  reduction<float>(Op::sum));
        },
        300ms);
    for (int r : {0, 1, 3}) {
      CAPTURE(r);
      CHECK(run.errors[r].find("timed out waiting") != std::string::npos);
    }
  }
}
