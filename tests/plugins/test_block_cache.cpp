// The cpu plugin's block cache (plugins/cpu/host_buffer.hpp), large blocks
// and small ones by size class, against a simulated process: a memory limit,
// what the rest of the process holds, and the blocks the cache handed out or
// keeps. The room it reads is that limit less all of these, as a memory
// cgroup would report it, so each case checks that the simulated process
// never goes past its limit (the kernel's kill) and is refused instead.
// Blocks are malloc'd but never touched past their header (except by the
// case of several threads, which fills small ones), so the sizes of a real
// 1 GiB cgroup cost no memory here.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "cpu/host_buffer.hpp"

namespace {

using backplane::cpu::allocate_buffer;
using backplane::cpu::BlockCache;
using backplane::cpu::free_buffer;
using backplane::cpu::kUnknownRoom;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// A process with a memory limit. Its usage is what others hold plus every
// block handed out and not yet given back to the system: live buffers and the
// cache's blocks alike, as the kernel counts them.
struct Process {
  uint64_t limit = kGiB;
  uint64_t others = 80 * kMiB;  // the interpreter, libraries, small buffers
  uint64_t live = 0;            // blocks of the buffers allocated and not freed
  int readings = 0;
  bool unknown = false;
  BlockCache cache{&Process::room_of, this};

  static uint64_t room_of(void* ctx) noexcept {
    auto* p = static_cast<Process*>(ctx);
    ++p->readings;
    if (p->unknown) return kUnknownRoom;
    const uint64_t used = p->used();
    return used >= p->limit ? 0 : p->limit - used;
  }
  uint64_t used() const { return others + live + cache.held(); }

  // A buffer of `size` bytes; nullptr when refused.
  bp_buffer* alloc(uint64_t size) {
    bool refused = false;
    bp_buffer* b = allocate_buffer(size, refused, &cache);
    if (b != nullptr) live += backplane::cpu::header_of(b)->block_bytes;
    CHECK((b == nullptr) == refused);  // these sizes never fail in malloc itself
    CHECK(used() <= limit);            // past it the kernel would have killed the process
    return b;
  }
  void free(bp_buffer* b) {
    live -= backplane::cpu::header_of(b)->block_bytes;
    free_buffer(b, &cache);
    CHECK(cache.held() <= cache.cap());
  }
};

}  // namespace

TEST_CASE("cpu block cache: a freed block is served again before the room is read, even with no room left") {
  Process p;
  bp_buffer* a = p.alloc(100 * kMiB);
  REQUIRE(a != nullptr);
  p.free(a);
  CHECK(p.cache.held() >= 100 * kMiB);  // kept: the cap is a quarter of about 944 MiB
  // Others take everything the limit leaves: the cached block is the only memory to be had.
  p.others = p.limit - p.cache.held();
  const int readings = p.readings;
  bp_buffer* again = p.alloc(100 * kMiB);
  REQUIRE(again != nullptr);
  CHECK(p.readings == readings);  // taken from the cache: no room was needed, none was read
  CHECK(p.cache.held() == 0);
  CHECK(p.alloc(64 * kMiB) == nullptr);  // a new block is refused (one this large reads the room every time)
  p.free(again);
}

TEST_CASE(
    "cpu block cache: free 800 MiB under a 1 GiB limit, then 800 MiB again, then 40 MiB until refused") {
  Process p;
  bp_buffer* big = p.alloc(800 * kMiB);
  REQUIRE(big != nullptr);
  p.free(big);
  // The cap is a quarter of what the process may take, so 800 MiB is not kept pinned.
  CHECK(p.cache.cap() < 800 * kMiB);
  CHECK(p.cache.held() == 0);
  big = p.alloc(800 * kMiB);
  REQUIRE(big != nullptr);

  std::vector<bp_buffer*> small;
  for (int i = 0; i < 100; ++i) {
    bp_buffer* b = p.alloc(40 * kMiB);
    if (b == nullptr) break;
    small.push_back(b);
  }
  CHECK(small.size() < 100);  // refused before the limit, not killed at it
  CHECK(p.limit - p.used() >= BlockCache::kReserve);
  MESSAGE(small.size(), " blocks of 40 MiB beside 800 MiB under a 1 GiB limit");
  for (bp_buffer* b : small) p.free(b);
  p.free(big);
}

TEST_CASE("cpu block cache: cached blocks are released when the room is short, before anything is refused") {
  Process p;
  std::vector<bp_buffer*> held;
  for (uint64_t mib : {30, 40, 50, 60}) held.push_back(p.alloc(mib * kMiB));
  for (bp_buffer* b : held) {
    REQUIRE(b != nullptr);
    p.free(b);
  }
  const uint64_t cached = p.cache.held();
  CHECK(cached >= 180 * kMiB);  // all four kept: the cap is about 236 MiB
  // 750 MiB fits only if the cache gives its blocks back: it does, and the allocation is made.
  bp_buffer* big = p.alloc(750 * kMiB);
  REQUIRE(big != nullptr);
  CHECK(p.cache.held() == 0);
  // With nothing cached left to give, what does not fit is refused.
  CHECK(p.alloc(300 * kMiB) == nullptr);
  p.free(big);
}

TEST_CASE("cpu block cache: the cap is a quarter of the room, up to 1 GiB") {
  Process small;
  small.limit = 400 * kMiB;
  small.others = 0;
  bp_buffer* b = small.alloc(2 * kMiB);
  REQUIRE(b != nullptr);
  CHECK(small.cache.cap() <= 100 * kMiB);
  CHECK(small.cache.cap() >= 99 * kMiB);
  bp_buffer* large = small.alloc(120 * kMiB);
  REQUIRE(large != nullptr);
  small.free(large);
  CHECK(small.cache.held() == 0);  // more than the cap: freed at once
  small.free(b);

  Process big;
  big.limit = 64 * kGiB;
  bp_buffer* c = big.alloc(2 * kMiB);
  REQUIRE(c != nullptr);
  CHECK(big.cache.cap() == BlockCache::kMaxCached);
  big.free(c);
}

TEST_CASE("cpu block cache: blocks below 64 MiB spend a credit and read the room again when it is spent") {
  Process p;
  p.limit = 2 * kGiB;
  std::vector<bp_buffer*> live;
  // Distinct sizes, so none is served from the cache.
  int refused_at = -1;
  for (int i = 0; i < 1000; ++i) {
    bp_buffer* b = p.alloc((2 + i % 7) * kMiB + static_cast<uint64_t>(i) * 64 * 1024);
    if (b == nullptr) {
      refused_at = i;
      break;
    }
    live.push_back(b);
  }
  CHECK(refused_at > 0);  // refused near the limit, never past it
  CHECK(p.limit - p.used() >= BlockCache::kReserve);
  // Far fewer readings than allocations: each reading lets half the room go unchecked.
  CHECK(p.readings < refused_at / 4);
  MESSAGE(refused_at, " allocations, ", p.readings, " readings of the room");
  for (bp_buffer* b : live) p.free(b);
}

TEST_CASE("cpu block cache: a room that cannot be read refuses nothing") {
  Process p;
  p.unknown = true;
  p.limit = UINT64_MAX;
  bp_buffer* b = p.alloc(200 * kMiB);
  REQUIRE(b != nullptr);
  CHECK(p.cache.cap() == BlockCache::kMaxCached);
  p.free(b);
  CHECK(p.cache.held() >= 200 * kMiB);
}

TEST_CASE("cpu block cache: small blocks round up to four size classes a power of two") {
  uint64_t previous = 0;
  int classes = 0;
  int64_t wrong = 0;
  for (uint64_t bytes = BlockCache::kSmallMin + 1; bytes < BlockCache::kMinBlock; ++bytes) {
    const uint64_t block = BlockCache::rounded(bytes);
    wrong += block < bytes || block - bytes >= bytes / 4 || block < previous;  // at most a quarter wasted
    if (block != previous && BlockCache::is_small(block)) ++classes;
    previous = block;
  }
  CHECK(wrong == 0);
  CHECK(classes == 39);  // four to each power of two from 1 KiB to 1 MiB, less 1 MiB itself (a large block)
  CHECK(BlockCache::rounded(BlockCache::kSmallMin) == BlockCache::kSmallMin);  // left to glibc
  CHECK(!BlockCache::is_small(BlockCache::kSmallMin));
  CHECK(BlockCache::rounded(BlockCache::kMinBlock - 1) == BlockCache::kMinBlock);
  CHECK(BlockCache::rounded(1025) == 1280);
  CHECK(BlockCache::rounded(16 * 1024 + 100) == 20 * 1024);
}

TEST_CASE("cpu block cache: a freed small buffer is served again to a buffer of its size class") {
  Process p;
  bp_buffer* a = p.alloc(16000);
  REQUIRE(a != nullptr);
  void* const block = backplane::cpu::header_of(a)->raw;
  const uint64_t bytes = backplane::cpu::header_of(a)->block_bytes;
  p.free(a);
  CHECK(p.cache.held() == bytes);
  CHECK(p.cache.small_held() == bytes);
  const int readings = p.readings;
  bp_buffer* b = p.alloc(15000);  // another size, the same class (14 KiB < block <= 16 KiB)
  REQUIRE(b != nullptr);
  CHECK(backplane::cpu::header_of(b)->raw == block);
  CHECK(backplane::cpu::buffer_size(b) == 15000);
  CHECK(p.cache.held() == 0);
  CHECK(p.readings == readings);
  bp_buffer* c = p.alloc(30000);  // another class: a new block
  REQUIRE(c != nullptr);
  CHECK(backplane::cpu::header_of(c)->raw != block);
  p.free(b);
  p.free(c);
  CHECK(p.cache.small_held() == p.cache.held());
  CHECK(p.cache.drop(UINT64_MAX) > 0);
  CHECK(p.cache.held() == 0);
}

TEST_CASE("cpu block cache: small blocks kept stay under their own ceiling") {
  Process p;
  p.limit = 64 * kGiB;
  std::vector<bp_buffer*> live;
  for (int i = 0; i < 200; ++i) live.push_back(p.alloc(600 * 1024));  // 200 x 640 KiB: 125 MiB
  for (bp_buffer* b : live) {
    REQUIRE(b != nullptr);
    p.free(b);
  }
  CHECK(p.cache.small_held() <= BlockCache::kMaxSmallHeld);
  CHECK(p.cache.small_held() > BlockCache::kMaxSmallHeld - 1 * kMiB);
}

TEST_CASE("cpu block cache: small blocks kept are given back when the room runs short, and none is refused") {
  Process p;
  p.limit = 100 * kMiB;
  p.others = 40 * kMiB;
  std::vector<bp_buffer*> live;
  for (int i = 0; i < 10; ++i) live.push_back(p.alloc(700 * 1024));  // the 768 KiB class
  for (bp_buffer* b : live) {
    REQUIRE(b != nullptr);
    p.free(b);
  }
  live.clear();
  CHECK(p.cache.small_held() == 10 * 768 * 1024);  // under the cap: a quarter of 60 MiB
  // The rest of the process grows until the room is short (less than the reserve).
  p.others = p.limit - p.cache.held() - 15 * kMiB;
  const int readings = p.readings;
  // New small buffers of another class keep being made, spending the credit;
  // once it is spent the room is read again, and the cache gives its blocks back.
  for (int i = 0; i < 24 && p.cache.held() > 0; ++i) live.push_back(p.alloc(400 * 1024));
  CHECK(p.cache.held() == 0);
  CHECK(p.readings > readings);
  for (bp_buffer* b : live) CHECK(b != nullptr);
  for (bp_buffer* b : live) p.free(b);
  CHECK(p.cache.held() <= p.cache.cap());
}

TEST_CASE("cpu block cache: threads allocating and freeing small buffers each keep their own bytes") {
  BlockCache cache(
      +[](void*) noexcept { return uint64_t{1} << 36; }, nullptr);
  std::atomic<int64_t> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<bp_buffer*> mine;
      uint64_t s = static_cast<uint64_t>(t) + 1;
      for (int i = 0; i < 4000; ++i) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        if (mine.size() < 16 && (s >> 63) == 0) {
          bool refused = false;
          bp_buffer* b = allocate_buffer(1100 + (s >> 40) % 60000, refused, &cache);
          if (b == nullptr) continue;
          std::memset(backplane::cpu::buffer_data(b), t + 1, backplane::cpu::buffer_size(b));
          mine.push_back(b);
        } else if (!mine.empty()) {
          bp_buffer* b = mine.back();
          mine.pop_back();
          const unsigned char* d = backplane::cpu::buffer_data(b);
          int64_t wrong = 0;
          for (uint64_t k = 0; k < backplane::cpu::buffer_size(b); ++k) wrong += d[k] != t + 1;
          corrupted += wrong;
          free_buffer(b, &cache);
        }
      }
      for (bp_buffer* b : mine) free_buffer(b, &cache);
    });
  for (std::thread& th : threads) th.join();
  CHECK(corrupted.load() == 0);
  CHECK(cache.held() == cache.small_held());
  CHECK(cache.held() <= BlockCache::kMaxSmallHeld);
}
