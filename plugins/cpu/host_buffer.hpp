// Host buffers of the cpu plugin: one allocation per buffer, data 64-byte aligned,
// with a small header in front of the data that remembers the size, so bounds
// checks need no lookup and alloc/free need no registry or lock of their own.
// Wrapped buffers (DLPack import) adopt host memory the plugin does not own.
#ifndef BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_
#define BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_

#include <backplane/abi.h>

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

// Large blocks are kept after free and handed out again for the same (rounded)
// size. glibc serves blocks this large with a fresh mmap every time, and each
// first touch of a fresh page faults: an op writing a new 64 MiB output ran at
// ~40% of the speed of the same loop writing into warm memory (measured). Small
// blocks never come here (glibc's own caches serve them, with no lock).
class BlockCache {
 public:
  static constexpr uint64_t kMinBlock = uint64_t{1} << 20;   // 1 MiB and above are cached
  static constexpr uint64_t kGranule = uint64_t{64} << 10;   // sizes round up to 64 KiB
  static constexpr uint64_t kMaxCached = uint64_t{1} << 30;  // at most 1 GiB held while unused

  static BlockCache& instance() noexcept {
    static BlockCache* cache = new BlockCache;  // never destroyed: frees may come during exit
    return *cache;
  }
  static uint64_t rounded(uint64_t bytes) noexcept {
    return bytes >= kMinBlock ? (bytes + kGranule - 1) / kGranule * kGranule : bytes;
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
  // Keeps the block, evicting older ones (largest first) to stay under the
  // cap, so sizes no longer in use do not pin memory forever. A block larger
  // than the cap is freed at once.
  void give(void* raw, uint64_t bytes) noexcept {
    if (bytes > kMaxCached) {
      std::free(raw);
      return;
    }
    for (;;) {
      void* victim = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (held_ + bytes <= kMaxCached) {
          try {
            free_.emplace(bytes, raw);
            held_ += bytes;
            return;
          } catch (...) {  // no memory for the map node: free the block instead
            break;
          }
        }
        auto last = std::prev(free_.end());  // non-empty: held_ > 0 here
        victim = last->second;
        held_ -= last->first;
        free_.erase(last);
      }
      std::free(victim);  // outside the lock
    }
    std::free(raw);
  }

 private:
  std::mutex mutex_;
  std::multimap<uint64_t, void*> free_;
  uint64_t held_ = 0;
};

// Sanitizer builds hand every block back to malloc, so AddressSanitizer still
// sees a use after free of a large buffer.
#ifdef BACKPLANE_CPU_NO_BLOCK_CACHE
inline constexpr bool kUseBlockCache = false;
#else
inline constexpr bool kUseBlockCache = true;
#endif

// Returns nullptr when the allocation fails or the size is absurd. A size-0 buffer
// still owns a block, so every handle is distinct and freeable.
inline bp_buffer* allocate_buffer(uint64_t size) noexcept {
  constexpr uint64_t kMax = UINT64_MAX / 2;
  if (size > kMax) return nullptr;
  // Room for the header and for rounding the data start up to kAlignment (malloc
  // aligns to at least 16, so at most kAlignment - 16 bytes are skipped).
  const uint64_t block = BlockCache::rounded(size + sizeof(BufferHeader) + kAlignment - 1);
  void* raw = kUseBlockCache && block >= BlockCache::kMinBlock ? BlockCache::instance().take(block) : nullptr;
  if (raw == nullptr) raw = std::malloc(static_cast<std::size_t>(block));
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

// Frees an owned buffer's block, or a wrapped buffer's header block after calling
// its release callback (exactly once: the magic is cleared first).
inline void free_buffer(bp_buffer* buffer) noexcept {
  BufferHeader* header = header_of(buffer);
  header->magic = kFreedMagic;
  if (header->release != nullptr) [[unlikely]]
    header->release(header->release_ctx);
  if (kUseBlockCache && header->block_bytes >= BlockCache::kMinBlock) [[unlikely]] {
    BlockCache::instance().give(header->raw, header->block_bytes);
    return;
  }
  std::free(header->raw);
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_
