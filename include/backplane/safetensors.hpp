// Saving and loading named tensors in the safetensors format
// (https://github.com/huggingface/safetensors), the one PyTorch, JAX and
// NumPy users exchange weights in.
//
// Layout of a file:
//   [0, 8)          N, the header's length in bytes, an unsigned little-endian 64-bit integer
//   [8, 8 + N)      the header: a JSON object; trailing spaces pad it
//   [8 + N, end)    the byte buffer: every tensor's elements, little-endian, row-major, packed
// The header maps each tensor's name to
//   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// with offsets relative to the buffer, and may hold "__metadata__", an object
// of string values. The tensors' byte ranges cover the buffer exactly, with no
// gap and no overlap.
//
// dtypes (backplane <-> safetensors): f32 F32, f64 F64, i32 I32, i64 I64,
// bool BOOL (each byte 0 or 1), f16 F16, bf16 BF16, u8 U8, i8 I8. A file
// holding any other safetensors dtype (F8_E4M3, U16, ...) is refused.
//
// Thread-safety: both functions may run concurrently on different files;
// saving the same path from two threads leaves one complete file or the other.
#ifndef BACKPLANE_SAFETENSORS_HPP_
#define BACKPLANE_SAFETENSORS_HPP_

#include <backplane/export.hpp>

#include <backplane/registry.hpp>
#include <backplane/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace backplane {

// What a safetensors file holds: the tensors in the header's order, and the
// "__metadata__" strings.
struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes `tensors` (each read back from its device, any layout) and
// `metadata` to `path`, atomically: the file is written beside it and renamed
// over it only once complete and on disk, so `path` never holds a partial
// file. The header lists the tensors in the given order and their data
// follows in that order; the header is padded with spaces so the buffer
// starts at a multiple of 8 bytes.
// Throws Errc::invalid_argument for an undefined tensor, a repeated name, the
// name "__metadata__", or a name or metadata string that is not valid UTF-8;
// Errc::io_error when the file cannot be
// written (the message names it and the OS error); whatever reading a tensor
// from its device throws.
BACKPLANE_API void save_safetensors(const std::filesystem::path& path,
                                    const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata = {});

// What saving and reading do when `path` is a symbolic link.
enum class SafetensorsLink {
  // Saving keeps the link and replaces its target, as open(2) follows it;
  // except that a link in a sticky world-writable folder (/tmp) owned neither
  // by the folder's owner nor by this process's user is refused
  // (Errc::io_error, EACCES), as the kernel's protected_symlinks refuses it.
  // Reading follows it. What the overloads without this argument do.
  follow,
  // Saving replaces the link itself with the file; reading refuses a link
  // (Errc::invalid_argument naming it). For files in a folder the program owns,
  // where a link is somebody aiming the program at a file outside it.
  not_followed,
};

// save_safetensors as above, with `links` deciding what a link at `path` means.
BACKPLANE_API void save_safetensors(const std::filesystem::path& path,
                                    const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata,
                                    SafetensorsLink links);

// How load_safetensors makes its tensors. Copying is the default: a mapped
// tensor changes when another program rewrites the file in place (`cp`, any
// writer that opens it with O_TRUNC), and reading it after the file was
// truncated kills the process with SIGBUS. Map only files nothing rewrites.
enum class SafetensorsLoad {
  // On a host_visible device that takes host memory (from_dlpack's rule),
  // each tensor whose data in the file is aligned to its element size views
  // a private copy-on-write map of the file: nothing is copied or read until
  // used, and writing to the tensor copies the pages it writes, never
  // changing the file. The map lives as long as one such tensor does. The
  // file must not be truncated meanwhile (as with any map: reading a page
  // cut off the file is SIGBUS); writers that replace a file by rename, as
  // save_safetensors does, are safe. Anything else is copied.
  map_if_possible,
  copy,  // every tensor is read into memory of its own
};

// Reads the file at `path` and makes each tensor on `device`. The whole
// header is validated before any tensor is made.
// Throws Errc::io_error when the file cannot be opened or read (naming it and
// the OS error); Errc::invalid_argument, naming the file and what is wrong,
// when it is not a valid safetensors file: shorter than 8 bytes, a header
// length beyond the file (or above 100 MB), a header that is not JSON or not
// an object, an entry that is not an object of dtype, shape and
// data_offsets, an unknown dtype, a shape of rank above 8 or negative
// extents, offsets out of the buffer or disagreeing with shape and dtype,
// tensors overlapping or not covering the buffer, a repeated name,
// metadata that is not an object of strings, a BOOL byte other than 0 or 1;
// Errc::capability_missing when `device` does not hold a dtype of the file.
BACKPLANE_API SafetensorsFile load_safetensors(const std::filesystem::path& path, const Device& device,
                                               SafetensorsLoad mode);
// The same with SafetensorsLoad::copy (kept as its own function, so programs
// linked against the library before `mode` existed still run; before this
// release it mapped).
BACKPLANE_API SafetensorsFile load_safetensors(const std::filesystem::path& path, const Device& device);

// A safetensors file opened and its whole header validated (as
// load_safetensors validates it), with no tensor read yet: for a program
// that compares names, dtypes and shapes with what it expects, or checks the
// bytes, before it gives a tensor memory. The file stays open while the
// reader lives; a file replaced by rename meanwhile is not seen.
// Not thread-safe; movable.
class BACKPLANE_API SafetensorsReader {
 public:
  // One tensor of the header, in the header's order.
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t offset = 0;  // where its bytes begin, from the start of the file
    uint64_t size = 0;    // how many bytes it takes
  };

  // Throws as load_safetensors does for the file and its header.
  explicit SafetensorsReader(const std::filesystem::path& path,
                             SafetensorsLink links = SafetensorsLink::follow);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::filesystem::path& path() const;
  const std::vector<Entry>& entries() const;
  const std::map<std::string, std::string>& metadata() const;
  uint64_t file_size() const;  // as it was when opened
  // Reads `size` bytes of the file at `offset` into `dst` (Errc::io_error, or
  // Errc::invalid_argument when the file shrank).
  void read(uint64_t offset, void* dst, std::size_t size) const;
  // Makes every tensor on `device`, as load_safetensors does.
  SafetensorsFile load(const Device& device, SafetensorsLoad mode = SafetensorsLoad::copy) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace backplane

#endif  // BACKPLANE_SAFETENSORS_HPP_
