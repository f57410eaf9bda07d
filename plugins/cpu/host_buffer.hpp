// Host buffers of the cpu plugin: one allocation per buffer, data 64-byte aligned,
// with a small header in front of the data that remembers the size, so bounds
// checks need no lookup and alloc/free need no registry or lock of their own.
#ifndef BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_
#define BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_

#include <backplane/abi.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

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
inline constexpr std::size_t kAlignment = 64;

struct BufferHeader {
  void* raw;       // what malloc returned
  uint64_t size;   // bytes the host asked for
  uint64_t magic;  // kLiveMagic while allocated; kFreedMagic after free
};

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

inline unsigned char* buffer_data(bp_buffer* buffer) noexcept {
  return reinterpret_cast<unsigned char*>(buffer);
}

// Returns nullptr when the allocation fails or the size is absurd. A size-0 buffer
// still owns a block, so every handle is distinct and freeable.
inline bp_buffer* allocate_buffer(uint64_t size) noexcept {
  constexpr uint64_t kMax = UINT64_MAX / 2;
  if (size > kMax) return nullptr;
  // Room for the header and for rounding the data start up to kAlignment (malloc
  // aligns to at least 16, so at most kAlignment - 16 bytes are skipped).
  void* raw = std::malloc(static_cast<std::size_t>(size + sizeof(BufferHeader) + kAlignment - 1));
  if (raw == nullptr) return nullptr;
  const uintptr_t data =
      (reinterpret_cast<uintptr_t>(raw) + sizeof(BufferHeader) + kAlignment - 1) & ~uintptr_t{kAlignment - 1};
  auto* buffer = reinterpret_cast<bp_buffer*>(data);
  BufferHeader* header = header_of(buffer);
  header->raw = raw;
  header->size = size;
  header->magic = kLiveMagic;
  return buffer;
}

inline void free_buffer(bp_buffer* buffer) noexcept {
  BufferHeader* header = header_of(buffer);
  header->magic = kFreedMagic;
  std::free(header->raw);
}

}  // namespace backplane::cpu

#endif  // BACKPLANE_PLUGINS_CPU_HOST_BUFFER_HPP_
