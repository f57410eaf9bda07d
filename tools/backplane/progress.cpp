// The launcher's progress board (see progress.hpp).
#include "progress.hpp"

#include "cli.hpp"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace backplane::cli {
namespace {

std::optional<int64_t> env_integer(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  const std::string_view text(value);
  int64_t out = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return out;
}

// The seals of a board: its size is fixed, and so are the seals.
constexpr int kBoardSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

std::optional<int64_t> known(int64_t value) {
  return value < 0 ? std::nullopt : std::optional<int64_t>(value);
}

}  // namespace

ProgressBoard::ProgressBoard(int32_t nproc) : nproc_(nproc) {
  bytes_ = sizeof(ProgressSlot) * static_cast<std::size_t>(nproc);
  // Not close-on-exec: the ranks inherit it.
  // Sealed at its size: a rank checks the seals before it writes, so a
  // descriptor number that means another file in the rank (the variable
  // survived, the descriptor did not) is never written to.
  fd_ = common::UniqueFd(::memfd_create("backplane-progress", MFD_ALLOW_SEALING));
  if (!fd_.valid() || ::ftruncate(fd_.get(), static_cast<off_t>(bytes_)) != 0 ||
      ::fcntl(fd_.get(), F_ADD_SEALS, kBoardSeals) != 0)
    throw CommandError(kExitFailed, std::string("launch: cannot make the progress board (memfd): ") +
                                        std::strerror(errno) +
                                        " (check the open-file limit, `ulimit -n`, and free memory)");
  void* map = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (map == MAP_FAILED)
    throw CommandError(kExitFailed,
                       std::string("launch: cannot map the progress board: ") + std::strerror(errno));
  slots_ = static_cast<ProgressSlot*>(map);
  for (int32_t i = 0; i < nproc; ++i) {
    ProgressSlot* slot = new (&slots_[i]) ProgressSlot;
    slot->step.store(-1, std::memory_order_relaxed);
    slot->checkpoint_step.store(-1, std::memory_order_relaxed);
  }
}

ProgressBoard::~ProgressBoard() {
  if (slots_ != nullptr) ::munmap(slots_, bytes_);
}

std::optional<int64_t> ProgressBoard::step(int32_t rank) const noexcept {
  if (rank < 0 || rank >= nproc_) return std::nullopt;
  return known(slots_[rank].step.load(std::memory_order_relaxed));
}

std::optional<int64_t> ProgressBoard::checkpoint_step(int32_t rank) const noexcept {
  if (rank < 0 || rank >= nproc_) return std::nullopt;
  return known(slots_[rank].checkpoint_step.load(std::memory_order_relaxed));
}

ProgressReporter ProgressReporter::from_env() noexcept {
  ProgressReporter r;
  const std::optional<int64_t> fd = env_integer(kProgressFdVariable);
  const std::optional<int64_t> rank = env_integer("RANK");
  if (!fd || !rank || *fd < 0 || *fd > 1'000'000 || *rank < 0) return r;
  struct stat st {};
  if (::fcntl(static_cast<int>(*fd), F_GET_SEALS) != kBoardSeals ||
      ::fstat(static_cast<int>(*fd), &st) != 0 || !S_ISREG(st.st_mode) ||
      *rank >= st.st_size / static_cast<off_t>(sizeof(ProgressSlot)))
    return r;  // not the launcher's board: report nothing
  const std::size_t need = sizeof(ProgressSlot) * static_cast<std::size_t>(*rank + 1);
  void* map = ::mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_SHARED, static_cast<int>(*fd), 0);
  if (map == MAP_FAILED) return r;
  r.map_ = map;
  r.bytes_ = need;
  r.slot_ = static_cast<ProgressSlot*>(map) + *rank;
  return r;
}

ProgressReporter::~ProgressReporter() {
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

ProgressReporter::ProgressReporter(ProgressReporter&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      slot_(std::exchange(other.slot_, nullptr)) {}

ProgressReporter& ProgressReporter::operator=(ProgressReporter&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, bytes_);
    map_ = std::exchange(other.map_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    slot_ = std::exchange(other.slot_, nullptr);
  }
  return *this;
}

}  // namespace backplane::cli
