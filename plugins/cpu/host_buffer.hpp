// Host buffers of the cpu plugin: one allocation per buffer, data 64-byte aligned,
// with a small header in front of the data that remembers the size, so bounds
// checks need no lookup. Freed blocks of 1 KiB and more are kept for reuse by
// size (BlockCache), bounded, and given back when the process runs short.
// Wrapped buffers (DLPack import) adopt host memory the plugin does not own.
#ifndef BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_
#define BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_

#include <backplane/abi.h>
#include <malloc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <backplane_common/memory_room.hpp>
#include <bit>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>

namespace backplane::cpu {

// Layout of one malloc block (the data start rounded up to kAlignment):
//
//   raw ... padding | BufferHeader | data[0 .. size) | ...
//                                   ^ 64-byte aligned; == (bp_buffer*) == host pointer
//
// The handle the host sees is the data pointer itself, so buffer_host_ptr is free.
// Plain malloc rather than aligned_alloc: glibc serves small mallocs from its
// per-thread cache, while its memalign path splits chunks under the arena lock
// (about 4x slower for a small alloc + free, measured).
//
// A wrapped buffer (buffer_wrap_host) is a separate small block holding only the
// header; the handle is the address just after it, so header_of, is_live and
// buffer_size work unchanged, and header->data points at the foreign memory:
//
//   raw: BufferHeader | spare     foreign memory: data[0 .. size)  (never freed here)
//                     ^ handle
//
// buffer_data always reads header->data (same cache line as the magic that
// is_live already reads), so code never needs to know which kind it holds.
inline constexpr std::size_t kAlignment = 64;

struct BufferHeader {
  void* raw;                   // what malloc returned (the block holding this header)
  uint64_t size;               // bytes the host asked for, or the wrapped size
  uint64_t magic;              // kLiveMagic while allocated; kFreedMagic after free
  unsigned char* data;         // == the handle for an owned buffer; the foreign memory if wrapped
  void (*release)(void* ctx);  // wrapped only (may be NULL there): called once by free_buffer
  void* release_ctx;
  uint64_t block_bytes;  // owned only: the malloc size of `raw` (the block cache's key)
};
static_assert(sizeof(BufferHeader) <= kAlignment, "the header must fit in the cache line before the data");

// The magic cannot make a foreign or dangling handle safe to use, but it turns the
// common mistakes (a handle freed twice, a stale handle whose memory is still
// mapped) into a status instead of silent heap corruption.
inline constexpr uint64_t kLiveMagic = 0x6670756275666c76ULL;   // arbitrary, non-zero
inline constexpr uint64_t kFreedMagic = 0x6470756275666672ULL;  // differs from kLiveMagic

inline BufferHeader* header_of(bp_buffer* buffer) noexcept {
  return reinterpret_cast<BufferHeader*>(reinterpret_cast<unsigned char*>(buffer) - sizeof(BufferHeader));
}

inline bool is_live(bp_buffer* buffer) noexcept {
  return buffer != nullptr && header_of(buffer)->magic == kLiveMagic;
}

inline uint64_t buffer_size(bp_buffer* buffer) noexcept { return header_of(buffer)->size; }

inline unsigned char* buffer_data(bp_buffer* buffer) noexcept { return header_of(buffer)->data; }

// Sanitizer builds hand every block back to malloc, so AddressSanitizer still
// sees a use after free of a large buffer.
#ifdef BACKPLANE_CPU_NO_BLOCK_CACHE
inline constexpr bool kUseBlockCache = false;
#else
inline constexpr bool kUseBlockCache = true;
#endif

// What the process may still take before the kernel kills it, in bytes, or
// kUnknownRoom. The plugin reads its memory cgroup and /proc/meminfo
// (memory_room.hpp); tests give a cache a reader of their own.
inline constexpr uint64_t kUnknownRoom = common::kUnknownBytes;
using RoomReader = uint64_t (*)(void* ctx) noexcept;

inline uint64_t read_process_room(void*) noexcept {
  try {
    return common::memory_room().bytes;
  } catch (...) {  // no memory for the strings it builds: say unknown
    return kUnknownRoom;
  }
}

// Blocks of more than 1 KiB: where they come from, and where they go when freed.
//
// Kept after free and handed out again for the same (rounded) size. Large
// blocks (1 MiB and more): glibc serves them with a fresh mmap every time, and
// each first touch of a fresh page faults: an op writing a new 64 MiB output
// ran at ~40% of the speed of the same loop writing into warm memory
// (measured). Small blocks (above 1 KiB, below 1 MiB): every op result is
// one, and glibc serves these sizes from its sorted bins under the arena lock
// (no per-thread cache above 1 KiB), merging and splitting chunks on every
// malloc and free; here they round up to a size class (four to a power of
// two, so at most a quarter is wasted) and a freed one waits on its class's
// list. Blocks of 1 KiB and less never come here: glibc's per-thread cache
// serves them without a lock, faster than this cache could.
//
// Linux overcommits: malloc of more than the process can back succeeds, and
// the kernel kills the process (SIGKILL, in a memory cgroup at its limit)
// when the pages are first touched. So a block that is not in the cache is
// admitted against the room the process has left first, and refused (NULL:
// the plugin answers out_of_memory) when it does not fit. In that order: a
// cached block is already the process's memory, so taking it needs no room,
// while the room the kernel reports has the cached blocks in it as used, so
// they are dropped before any allocation is refused for want of room.
//
// Reading the room costs about 80 us (a few /proc and cgroup files), so only
// blocks of kAlwaysChecked and more read it every time (their first touch
// costs milliseconds). Smaller ones spend a credit, half of what the last
// reading left, and read again when it is spent: however they come, they
// cannot take more than half of the room between two readings.
//
// The cache holds at most a quarter of what the process may take (the room
// plus what the cache holds, at the last reading), and never more than
// kMaxCached: a process near its limit keeps little, a large machine 1 GiB.
// Small blocks take at most kMaxSmallHeld of that.
//
// A new small block is never refused (as glibc's would not be), but it spends
// the credit all the same, and when the credit is spent the room is read
// again: a process that only ever makes small buffers still gives the cached
// ones back when it runs short.
//
// Every member may be called from any thread.
class BlockCache {
 public:
  static constexpr uint64_t kMinBlock = uint64_t{1} << 20;        // 1 MiB and above come here
  static constexpr uint64_t kGranule = uint64_t{64} << 10;        // sizes round up to 64 KiB
  static constexpr uint64_t kMaxCached = uint64_t{1} << 30;       // the cap's ceiling
  static constexpr uint64_t kCapShare = 4;                        // the cap: room / kCapShare
  static constexpr uint64_t kAlwaysChecked = uint64_t{64} << 20;  // blocks that read the room every time
  // Left to the rest of the process (the interpreter, small buffers, stacks):
  // a block is refused unless this much would still be free after it, so the
  // process is not killed by its next small allocation instead.
  static constexpr uint64_t kReserve = uint64_t{32} << 20;
  // Small blocks: above kSmallMin, four size classes to each power of two.
  static constexpr uint64_t kSmallMin = 1024;
  static constexpr uint64_t kMaxSmallHeld = uint64_t{64} << 20;
  // A small block made while the room is short reads it again only after this
  // many bytes more: near the limit it is still made, so reading the room
  // before each one would only slow the process down.
  static constexpr int64_t kSmallRecheck = int64_t{1} << 20;

  BlockCache(RoomReader read_room, void* ctx) noexcept : read_room_(read_room), ctx_(ctx) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache() { drop(UINT64_MAX); }

  // The plugin's: reads this process's room. Never destroyed: frees may come during exit.
  static BlockCache& instance() noexcept {
    static BlockCache* cache = new BlockCache(&read_process_room, nullptr);
    return *cache;
  }
  static BlockCache& or_instance(BlockCache* cache) noexcept {
    return cache != nullptr ? *cache : instance();
  }
  // The size a block of `bytes` is made with: large ones round up to kGranule,
  // small ones to their size class (which may reach kMinBlock: a large block
  // then), the rest stay as they are.
  static uint64_t rounded(uint64_t bytes) noexcept {
    if (bytes >= kMinBlock) return (bytes + kGranule - 1) / kGranule * kGranule;
    if (bytes <= kSmallMin) return bytes;
    const uint64_t step = uint64_t{1} << (power_below(bytes) - 2);
    return (bytes + step - 1) & ~(step - 1);
  }
  static bool is_small(uint64_t block) noexcept { return block > kSmallMin && block < kMinBlock; }

  // A block of `bytes` (a rounded size of kMinBlock or more): a cached one,
  // else a new one if the room allows. nullptr when refused or malloc fails;
  // `refused` then says which.
  [[gnu::noinline]] void* acquire(uint64_t bytes, bool& refused) noexcept {
    refused = false;
    if (kUseBlockCache)
      if (void* raw = take(bytes)) return raw;
    const int64_t want = static_cast<int64_t>(bytes);  // < 2^63: allocate_buffer bounds sizes
    if (bytes >= kAlwaysChecked || credit_.fetch_sub(want, std::memory_order_relaxed) < want) [[unlikely]] {
      if (!admit(bytes)) {
        refused = true;
        return nullptr;
      }
    }
    return std::malloc(static_cast<std::size_t>(bytes));
  }

  // Keeps a freed block for reuse, evicting others (largest first) to stay
  // under the cap, so that sizes no longer in use do not pin memory forever.
  // A block larger than the cap is freed at once.
  [[gnu::noinline]] void release(void* raw, uint64_t bytes) noexcept {
    if (!kUseBlockCache || bytes > cap_.load(std::memory_order_relaxed)) {
      std::free(raw);
      return;
    }
    for (;;) {
      void* victim = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (held_ + bytes <= cap_.load(std::memory_order_relaxed)) {
          try {
            free_.emplace(bytes, raw);
            held_ += bytes;
            return;
          } catch (...) {  // no memory for the map node: free the block instead
            break;
          }
        }
        if (free_.empty()) break;  // the cap shrank below this block meanwhile
        auto last = std::prev(free_.end());
        victim = last->second;
        held_ -= last->first;
        free_.erase(last);
      }
      std::free(victim);  // outside the lock
    }
    std::free(raw);
  }

  // A small block of `bytes` (a rounded size for which is_small holds): a
  // cached one, else a new one from malloc (nullptr when malloc fails). Never
  // refused for want of room.
  [[gnu::noinline]] void* acquire_small(uint64_t bytes) noexcept {
    if (kUseBlockCache) {
      std::lock_guard<std::mutex> lock(mutex_);
      void*& head = small_free_[small_class(bytes)];
      if (void* raw = head) {
        head = *static_cast<void**>(raw);
        held_ -= bytes;
        small_held_ -= bytes;
        return raw;
      }
    }
    const int64_t want = static_cast<int64_t>(bytes);
    if (credit_.fetch_sub(want, std::memory_order_relaxed) < want) [[unlikely]] {
      if (!admit(bytes)) credit_.store(kSmallRecheck, std::memory_order_relaxed);
    }
    return std::malloc(static_cast<std::size_t>(bytes));
  }

  // Keeps a freed small block on its class's list (the list's link is written
  // into the block itself), unless that would pass the cap or kMaxSmallHeld:
  // then it is freed.
  [[gnu::noinline]] void release_small(void* raw, uint64_t bytes) noexcept {
    if (kUseBlockCache) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (held_ + bytes <= cap_.load(std::memory_order_relaxed) && small_held_ + bytes <= kMaxSmallHeld) {
        void*& head = small_free_[small_class(bytes)];
        *static_cast<void**>(raw) = head;
        head = raw;
        held_ += bytes;
        small_held_ += bytes;
        return;
      }
    }
    std::free(raw);
  }

  // Bytes of freed blocks kept for reuse (small ones, of those), and the most
  // it may keep now.
  uint64_t held() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }
  uint64_t small_held() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return small_held_;
  }
  uint64_t cap() const noexcept { return cap_.load(std::memory_order_relaxed); }

  // Frees cached blocks, largest first (large ones, then small ones by class),
  // until at least `bytes` are freed or none is left; returns what it freed.
  // The pages go back to the kernel (malloc_trim for blocks glibc took from
  // its heap rather than mmap).
  uint64_t drop(uint64_t bytes) noexcept {
    uint64_t freed = 0;
    for (;;) {
      void* victim = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (freed >= bytes) break;
        if (!free_.empty()) {
          auto last = std::prev(free_.end());
          victim = last->second;
          freed += last->first;
          held_ -= last->first;
          free_.erase(last);
        } else if (small_held_ > 0) {
          int c = kSmallClasses - 1;
          while (small_free_[c] == nullptr) --c;  // small_held_ > 0: some list is not empty
          victim = small_free_[c];
          small_free_[c] = *static_cast<void**>(victim);
          const uint64_t size = small_class_size(c);
          freed += size;
          held_ -= size;
          small_held_ -= size;
        } else {
          break;
        }
      }
      std::free(victim);
    }
    if (freed > 0) ::malloc_trim(0);
    return freed;
  }

 private:
  // Size classes of small blocks: (2^p, 2^(p+1)] splits into four, for p from
  // log2(kSmallMin) up to log2(kMinBlock) - 1.
  static constexpr int kSmallMinLog = static_cast<int>(std::bit_width(kSmallMin)) - 1;
  static constexpr int kSmallClasses = 4 * (static_cast<int>(std::bit_width(kMinBlock)) - 1 - kSmallMinLog);
  // p with 2^p < bytes <= 2^(p+1), for bytes > 1.
  static int power_below(uint64_t bytes) noexcept { return static_cast<int>(std::bit_width(bytes - 1)) - 1; }
  // The class of a rounded small size, and the size of a class.
  static int small_class(uint64_t rounded_bytes) noexcept {
    const int p = power_below(rounded_bytes);
    return 4 * (p - kSmallMinLog) + static_cast<int>(rounded_bytes >> (p - 2)) - 5;
  }
  static uint64_t small_class_size(int c) noexcept {
    const int p = kSmallMinLog + c / 4;
    return static_cast<uint64_t>(5 + c % 4) << (p - 2);
  }

  // A cached block of exactly `bytes`, or nullptr.
  void* take(uint64_t bytes) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end()) return nullptr;
    void* raw = it->second;
    free_.erase(it);
    held_ -= bytes;
    return raw;
  }

  // Reads the room; when it is short, drops the cache and reads again. Sets
  // the credit and the cap from what it read. Whether `bytes` may be taken.
  [[gnu::cold]] bool admit(uint64_t bytes) noexcept {
    std::lock_guard<std::mutex> lock(room_mutex_);
    uint64_t room = read_room_(ctx_);
    if (room != kUnknownRoom && !fits(bytes, room) && held() > 0) {
      drop(UINT64_MAX);  // the room counts cached blocks as used: give them back, then look again
      room = read_room_(ctx_);
    }
    if (room == kUnknownRoom) {  // nothing to check against (no /proc, no cgroup files): allowed
      cap_.store(kMaxCached, std::memory_order_relaxed);
      credit_.store(static_cast<int64_t>(kMaxCached), std::memory_order_relaxed);
      return true;
    }
    const uint64_t potential = room + held();
    const uint64_t cap = std::min(kMaxCached, potential / kCapShare);
    cap_.store(cap, std::memory_order_relaxed);
    if (held() > cap) drop(held() - cap);
    if (!fits(bytes, room)) {
      credit_.store(0, std::memory_order_relaxed);
      return false;
    }
    credit_.store(static_cast<int64_t>((room - bytes - kReserve) / 2), std::memory_order_relaxed);
    return true;
  }
  static bool fits(uint64_t bytes, uint64_t room) noexcept {
    return room >= kReserve && bytes <= room - kReserve;
  }

  const RoomReader read_room_;
  void* const ctx_;
  mutable std::mutex mutex_;  // free_, small_free_, held_ and small_held_
  std::multimap<uint64_t, void*> free_;
  std::array<void*, kSmallClasses> small_free_{};  // heads of the small classes' lists
  uint64_t held_ = 0;                              // large and small
  uint64_t small_held_ = 0;
  std::mutex room_mutex_;           // one reading at a time
  std::atomic<int64_t> credit_{0};  // bytes that may be taken before the room is read again
  std::atomic<uint64_t> cap_{0};    // the most held_ may reach; 0 until the first reading
};

// Returns nullptr when the allocation fails, is refused for want of room (then
// `refused` is set) or the size is absurd. A size-0 buffer still owns a block,
// so every handle is distinct and freeable. `cache` (null: the plugin's,
// BlockCache::instance) is reached only for the sizes it keeps, through its
// out-of-line entries, so a small buffer's path is malloc and the header.
inline bp_buffer* allocate_buffer(uint64_t size, bool& refused, BlockCache* cache = nullptr) noexcept {
  refused = false;
  constexpr uint64_t kMax = UINT64_MAX / 2;
  if (size > kMax) return nullptr;
  // Room for the header and for rounding the data start up to kAlignment (malloc
  // aligns to at least 16, so at most kAlignment - 16 bytes are skipped).
  const uint64_t block = BlockCache::rounded(size + sizeof(BufferHeader) + kAlignment - 1);
  void* raw = block >= BlockCache::kMinBlock ? BlockCache::or_instance(cache).acquire(block, refused)
              : BlockCache::is_small(block)  ? BlockCache::or_instance(cache).acquire_small(block)
                                             : std::malloc(static_cast<std::size_t>(block));
  if (raw == nullptr) return nullptr;
  const uintptr_t data =
      (reinterpret_cast<uintptr_t>(raw) + sizeof(BufferHeader) + kAlignment - 1) & ~uintptr_t{kAlignment - 1};
  auto* buffer = reinterpret_cast<bp_buffer*>(data);
  *header_of(buffer) =
      BufferHeader{raw, size, kLiveMagic, reinterpret_cast<unsigned char*>(data), nullptr, nullptr, block};
  return buffer;
}

// Adopts `size` bytes at `data` (owned by someone else) as a buffer. Returns nullptr
// when the header block cannot be allocated; release is then NOT called.
inline bp_buffer* wrap_buffer(void* data, uint64_t size, void (*release)(void*), void* release_ctx) noexcept {
  // A few spare bytes after the header, so the handle points inside this block
  // and cannot equal any other live handle.
  void* raw = std::malloc(sizeof(BufferHeader) + 16);
  if (raw == nullptr) return nullptr;
  auto* buffer = reinterpret_cast<bp_buffer*>(static_cast<unsigned char*>(raw) + sizeof(BufferHeader));
  *header_of(buffer) =
      BufferHeader{raw, size, kLiveMagic, static_cast<unsigned char*>(data), release, release_ctx, 0};
  return buffer;
}

// Frees an owned buffer's block (one of more than 1 KiB back to `cache`, null:
// the plugin's), or a wrapped buffer's header block after calling its release
// callback (exactly once: the magic is cleared first).
inline void free_buffer(bp_buffer* buffer, BlockCache* cache = nullptr) noexcept {
  BufferHeader* header = header_of(buffer);
  header->magic = kFreedMagic;
  if (header->release != nullptr) [[unlikely]]
    header->release(header->release_ctx);
  if (BlockCache::is_small(header->block_bytes)) {
    BlockCache::or_instance(cache).release_small(header->raw, header->block_bytes);
    return;
  }
  if (header->block_bytes >= BlockCache::kMinBlock) [[unlikely]] {
    BlockCache::or_instance(cache).release(header->raw, header->block_bytes);
    return;
  }
  std::free(header->raw);
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_
