// The digits data set (data/digits.csv.gz: 8x8 images of handwritten digits,
// 64 pixels 0..16 then the label 0..9 per row; see data/README.md for its
// source and license): reading, checking and a seeded train/test split.
// Header-only; needs zlib. Shared by `backplane train` and
// examples/ddp_host_app.
#ifndef BACKPLANE_EXAMPLES_DIGITS_HPP_
#define BACKPLANE_EXAMPLES_DIGITS_HPP_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace digits {

inline constexpr int kFeatures = 64;
inline constexpr int kClasses = 10;

struct Dataset {
  std::vector<float> x;    // rows * 64, scaled to [0, 1]
  std::vector<int64_t> y;  // rows labels
  int64_t rows() const { return static_cast<int64_t>(y.size()); }
};

// Reads a gzip'd (or plain) CSV. Throws std::runtime_error naming the file,
// line and column of the first malformed value.
inline Dataset load(const std::string& path) {
  // Opened without blocking and checked on the descriptor: a FIFO or a device
  // is refused at once instead of stalling the job on its first read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    throw std::runtime_error(path + ": cannot open (" + std::strerror(errno) +
                             "; pass the digits CSV with --data; the repository ships data/digits.csv.gz)");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || ::fcntl(fd, F_SETFL, O_RDONLY) != 0) {
    ::close(fd);
    throw std::runtime_error(path +
                             ": not a regular file (a FIFO, a device or a folder?); pass the digits CSV "
                             "file itself with --data");
  }
  gzFile f = gzdopen(fd, "rb");
  if (f == nullptr) {
    ::close(fd);
    throw std::runtime_error(path + ": cannot read it (out of memory)");
  }
  std::string text;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  // A truncated .gz ends with partial data and Z_BUF_ERROR, not a negative count.
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  const std::string gz_error = msg != nullptr ? msg : "";
  gzclose(f);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END))
    throw std::runtime_error(path +
                             ": read error: " + (gz_error.empty() ? "truncated or corrupt" : gz_error) +
                             " (is the file complete?)");

  Dataset d;
  std::size_t pos = 0;
  int64_t line = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string row = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (!row.empty() && row.back() == '\r') row.pop_back();
    if (row.empty()) continue;
    std::size_t p = 0;
    for (int col = 0; col <= kFeatures; ++col) {
      const std::size_t comma = row.find(',', p);
      const std::string cell = row.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
      const std::string where = path + ":" + std::to_string(line) + ": column " + std::to_string(col + 1);
      if ((comma == std::string::npos) != (col == kFeatures))
        throw std::runtime_error(where + ": expected " + std::to_string(kFeatures + 1) +
                                 " comma-separated values");
      std::size_t used = 0;
      long v = 0;
      try {
        v = std::stol(cell, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != cell.size())
        throw std::runtime_error(where + ": \"" + cell + "\" is not an integer");
      if (col < kFeatures) {
        if (v < 0 || v > 16) throw std::runtime_error(where + ": pixel " + cell + " is outside 0..16");
        d.x.push_back(static_cast<float>(v) / 16.0f);
      } else {
        if (v < 0 || v >= kClasses) throw std::runtime_error(where + ": label " + cell + " is outside 0..9");
        d.y.push_back(v);
      }
      p = comma + 1;
    }
  }
  if (d.y.empty()) throw std::runtime_error(path + ": no rows");
  return d;
}

// 0..n-1 in an order fixed by `seed`: Fisher-Yates over std::mt19937_64
// (whose sequence the standard fixes), so it is the same everywhere.
inline std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return order;
}

// The rows idx[begin, end) of `d`, in that order.
inline Dataset rows(const Dataset& d, const std::vector<int64_t>& idx, std::size_t begin, std::size_t end) {
  Dataset out;
  out.x.reserve((end - begin) * kFeatures);
  out.y.reserve(end - begin);
  for (std::size_t k = begin; k < end; ++k) {
    const auto r = static_cast<std::size_t>(idx[k]);
    out.x.insert(out.x.end(), d.x.begin() + static_cast<std::ptrdiff_t>(r * kFeatures),
                 d.x.begin() + static_cast<std::ptrdiff_t>((r + 1) * kFeatures));
    out.y.push_back(d.y[r]);
  }
  return out;
}

// A shuffled split: the first round(train_fraction * rows) rows of the
// seeded permutation train, the rest test.
inline std::pair<Dataset, Dataset> split(const Dataset& all, double train_fraction, uint64_t seed) {
  const std::vector<int64_t> order = permutation(all.rows(), seed);
  const auto n_train = static_cast<std::size_t>(train_fraction * static_cast<double>(order.size()) + 0.5);
  return {rows(all, order, 0, n_train), rows(all, order, n_train, order.size())};
}

}  // namespace digits

#endif  // BACKPLANE_EXAMPLES_DIGITS_HPP_
