// The buffer a Write's payload is read into on a server connection
// (connection.hpp): allocated without zero-filling, grown keeping its
// contents; its capacity is taken from the server's memory account while it
// lives. From kMappedBytes on the memory is mapped on its own: it grows
// without a copy (mremap) and goes back to the system when freed, where
// the heap would keep it (glibc's heaps, one per thread, grow their
// threshold for mapping with every large block freed).
//
// Not thread-safe: it has one owner at a time, and moves between them (the
// reader fills it, the worker runs its request and hands it back for reuse).
#ifndef BACKPLANE_REMOTE_SERVER_BYTE_BUFFER_HPP_
#define BACKPLANE_REMOTE_SERVER_BYTE_BUFFER_HPP_

#include "remote/server/account.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include <sys/mman.h>

namespace backplane::remote::server {

class ByteBuffer {
 public:
  ByteBuffer() = default;
  ByteBuffer(ByteBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        capacity_(std::exchange(o.capacity_, 0)),
        account_(o.account_) {}
  ByteBuffer& operator=(ByteBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      capacity_ = std::exchange(o.capacity_, 0);
      account_ = o.account_;
    }
    return *this;
  }
  ~ByteBuffer() { release(); }

  uint8_t* data() noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return capacity_; }
  void set_size(std::size_t n) noexcept { size_ = n; }
  // Grows to `n` bytes, taken from `account` (the old and the new block
  // both, while the contents are copied); false (nothing changed) when the
  // account would then hold more than `cap`. Throws std::bad_alloc.
  bool reserve(std::size_t n, MemoryAccount& account, uint64_t cap) {
    if (n <= capacity_) return true;
    if (!account.take(n, cap)) return false;
    uint8_t* bigger = nullptr;
    if (n >= kMappedBytes && capacity_ >= kMappedBytes) {
      void* p = ::mremap(data_, capacity_, n, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) {
        account.give(n);
        throw std::bad_alloc();
      }
      account.give(capacity_);
      data_ = static_cast<uint8_t*>(p);
      capacity_ = n;
      account_ = &account;
      return true;
    }
    if (n >= kMappedBytes) {
      void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      bigger = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    } else {
      bigger = new (std::nothrow) uint8_t[n];
    }
    if (bigger == nullptr) {
      account.give(n);
      throw std::bad_alloc();
    }
    const std::size_t size = size_;
    if (size != 0) std::memcpy(bigger, data_, size);
    release();
    data_ = bigger;
    size_ = size;
    capacity_ = n;
    account_ = &account;
    return true;
  }

 private:
  static constexpr std::size_t kMappedBytes = std::size_t{1} << 20;

  void release() noexcept {
    if (data_ != nullptr) {
      if (capacity_ >= kMappedBytes) {
        ::munmap(data_, capacity_);
      } else {
        delete[] data_;
      }
    }
    if (account_ != nullptr && capacity_ != 0) account_->give(capacity_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }

  uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  MemoryAccount* account_ = nullptr;  // where capacity_ was taken from
};

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_BYTE_BUFFER_HPP_
