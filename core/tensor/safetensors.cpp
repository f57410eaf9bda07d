// save_safetensors / load_safetensors: the safetensors file format (the layout
// is in include/backplane/safetensors.hpp). The reader trusts nothing in the
// file: every length and offset is checked against the file's size before it
// sizes an allocation or a read.
#include <backplane/safetensors.hpp>

#include "backplane_common/atomic_file.hpp"
#include "backplane_common/unique_fd.hpp"
#include "common/utf8.hpp"
#include "tensor/dlpack_dtype.hpp"

#include <backplane/dlpack.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace backplane {
namespace {

// The buffer's bytes are copied as they are: the host must be little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The header's upper bound, as the reference implementation's: a real header
// is a few kilobytes per thousand tensors.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A header is an object of objects holding one array: three levels.
constexpr std::size_t kMaxHeaderDepth = 3;
constexpr std::string_view kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::f32, "F32"},   {DType::f64, "F64"},    {DType::i32, "I32"},
    {DType::i64, "I64"},   {DType::bool_, "BOOL"}, {DType::f16, "F16"},
    {DType::bf16, "BF16"}, {DType::u8, "U8"},      {DType::i8, "I8"},
};

const char* safetensors_name(DType dtype) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == dtype) return d.name;
  return nullptr;
}

// A name or value as shown in messages: JSON-quoted, cut to 80 bytes.
std::string shown(std::string_view text) {
  std::string cut(text.substr(0, 80));
  std::string out = ordered_json(cut).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  if (text.size() > 80) out += "...";
  return out;
}

// ---- mapping a file ----------------------------------------------------------------

// A private, copy-on-write map of a whole file: tensors loaded from it read
// the page cache, and writing to one copies only the pages written, never
// reaching the file. Unmapped when the last tensor viewing it goes away.
struct FileMap {
  void* base = nullptr;
  std::size_t size = 0;
  FileMap(void* b, std::size_t n) : base(b), size(n) {}
  ~FileMap() { ::munmap(base, size); }
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;
};

// What a DLManagedTensor over a FileMap owns.
struct MappedTensor {
  DLManagedTensor managed{};
  std::shared_ptr<FileMap> map;
  std::vector<int64_t> shape;
};

void delete_mapped(DLManagedTensor* m) noexcept { delete static_cast<MappedTensor*>(m->manager_ctx); }

// ---- save ----------------------------------------------------------------------

[[noreturn]] void save_fail(const std::filesystem::path& path, const std::string& what) {
  throw Error(Errc::invalid_argument, "save_safetensors: '" + path.string() + "': " + what);
}

}  // namespace

void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, tensors, metadata, SafetensorsLink::follow);
}

void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata, SafetensorsLink links) {
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey)
      save_fail(path,
                "a tensor may not be named \"__metadata__\": the format reserves that key for metadata");
    if (!names.insert(name).second)
      save_fail(path, "the tensor name " + shown(name) + " appears twice; each name may appear once");
    if (!tensor.defined()) save_fail(path, "the tensor " + shown(name) + " is undefined");
    const uint64_t bytes = tensor.nbytes();
    header[name] = {{"dtype", safetensors_name(tensor.dtype())},
                    {"shape", tensor.shape().to_vector()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();  // strict: invalid UTF-8 throws
  } catch (const ordered_json::type_error& e) {
    save_fail(path, std::string("a tensor name or metadata string is not valid UTF-8 (") + e.what() + ")");
  }
  // Spaces so that the buffer starts at a multiple of 8 (aligned for readers
  // that map the file).
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes)
    save_fail(path, "the header takes " + std::to_string(text.size()) +
                        " bytes, over the format's limit of " + std::to_string(kMaxHeaderBytes) +
                        "; save fewer tensors or less metadata per file");

  try {
    common::AtomicFileWriter out(path.string(), links == SafetensorsLink::follow
                                                    ? common::LinkPolicy::follow_protected
                                                    : common::LinkPolicy::replace);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(uint64_t{text.size()} >> (8 * i));
    out.write(length, sizeof length);
    out.write(text);
    std::vector<unsigned char> data;
    for (const auto& [name, tensor] : tensors) {
      data.resize(tensor.nbytes());
      tensor.read_into(tensor.dtype(), data.data(), static_cast<std::size_t>(tensor.numel()));
      out.write(data.data(), data.size());
    }
    out.commit();
  } catch (const common::FileWriteError& e) {
    throw Error(Errc::io_error, std::string("save_safetensors: ") + e.what());
  }
}

// ---- load ----------------------------------------------------------------------

namespace {

using Entry = SafetensorsReader::Entry;

}  // namespace

struct SafetensorsReader::Impl {
  Impl(const std::filesystem::path& path, SafetensorsLink links) : path_(path) {
    open(links);
    if (size_ < 8)
      fail("the file is truncated: " + std::to_string(size_) +
           " bytes, fewer than the 8 that hold the header's length");
    unsigned char length_bytes[8];
    read_at(0, length_bytes, 8);
    uint64_t header_length = 0;
    for (int i = 0; i < 8; ++i) header_length |= uint64_t{length_bytes[i]} << (8 * i);
    if (header_length > size_ - 8)
      fail("the header length " + std::to_string(header_length) + " reaches beyond the end of the file (" +
           std::to_string(size_) + " bytes: 8 for the length, so at most " + std::to_string(size_ - 8) +
           " for the header); the file is truncated or not a safetensors file");
    if (header_length > kMaxHeaderBytes)
      fail("the header length " + std::to_string(header_length) + " is over the format's limit of " +
           std::to_string(kMaxHeaderBytes) + " bytes");
    std::string text(static_cast<std::size_t>(header_length), '\0');
    read_at(8, text.data(), text.size());
    buffer_start_ = 8 + header_length;
    buffer_size_ = size_ - buffer_start_;
    entries_ = parse_header(text, metadata_);
    check_coverage(entries_);
  }

  SafetensorsFile load(const Device& device, SafetensorsLoad mode) const {
    SafetensorsFile file;
    file.metadata = metadata_;
    // On a host-visible device the tensors view a map of the file where the
    // device takes host memory and the element is aligned (from_dlpack
    // copies otherwise); BOOL bytes are copied, as they must be checked.
    std::shared_ptr<FileMap> map;
    if (mode == SafetensorsLoad::map_if_possible && device.capabilities().has(Capability::host_visible) &&
        !device.capabilities().has(Capability::remote) && size_ > 0) {
      void* base =
          ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_.get(), 0);
      if (base != MAP_FAILED) map = std::make_shared<FileMap>(base, static_cast<std::size_t>(size_));
    }

    std::vector<unsigned char> data;
    file.tensors.reserve(entries_.size());
    for (const Entry& e : entries_) {
      if (map && e.dtype != DType::bool_ && e.size > 0 && e.offset % dtype_size(e.dtype) == 0) {
        auto owner = std::make_unique<MappedTensor>();
        owner->map = map;
        owner->shape = e.shape.to_vector();
        DLTensor& dl = owner->managed.dl_tensor;
        dl.data = static_cast<unsigned char*>(map->base) + e.offset;
        dl.device = {kDLCPU, 0};
        dl.ndim = static_cast<int32_t>(owner->shape.size());
        dl.dtype = detail::to_dl_dtype(e.dtype);
        dl.shape = owner->shape.data();
        dl.strides = nullptr;
        dl.byte_offset = 0;
        owner->managed.manager_ctx = owner.get();
        owner->managed.deleter = &delete_mapped;
        DLManagedTensor* managed = &owner.release()->managed;  // from_dlpack runs its deleter, always
        file.tensors.emplace_back(e.name, from_dlpack(managed, device));
        continue;
      }
      data.resize(static_cast<std::size_t>(e.size));
      read_at(e.offset, data.data(), data.size());
      if (e.dtype == DType::bool_) {
        const auto bad = std::find_if(data.begin(), data.end(), [](unsigned char b) { return b > 1; });
        if (bad != data.end())
          fail("tensor " + shown(e.name) + ": BOOL element " + std::to_string(bad - data.begin()) +
               " is the byte " + std::to_string(*bad) + "; a BOOL element is 0 or 1");
      }
      file.tensors.emplace_back(e.name, Tensor::from_bytes(device, e.shape, e.dtype, data.data(),
                                                           static_cast<std::size_t>(e.shape.numel())));
    }
    return file;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(Errc::invalid_argument, "load_safetensors: '" + path_.string() + "': " + what);
  }
  [[noreturn]] void io_fail(const std::string& step, int error_number) const {
    throw Error(Errc::io_error,
                "load_safetensors: '" + path_.string() + "': " + step + ": " + std::strerror(error_number));
  }

  void open(SafetensorsLink links) {
    const int no_follow = links == SafetensorsLink::not_followed ? O_NOFOLLOW : 0;
    fd_.reset(::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | no_follow));
    if (!fd_ && errno == ELOOP && no_follow != 0)
      fail(
          "it is a symbolic link, which is not followed here: a file in this folder is read only as itself; "
          "remove the link or replace it with the file");
    if (!fd_) io_fail("cannot open it", errno);
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) io_fail("cannot stat it", errno);
    if (S_ISDIR(st.st_mode)) io_fail("cannot read it", EISDIR);
    if (!S_ISREG(st.st_mode)) fail("not a regular file; a safetensors file is read from a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
  }

  void read_at(uint64_t offset, void* dst, std::size_t count) const {
    auto* p = static_cast<unsigned char*>(dst);
    while (count > 0) {
      const ssize_t n = ::pread(fd_.get(), p, count, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        io_fail("cannot read it", errno);
      }
      if (n == 0) fail("the file shrank while it was read; it is being written by another process");
      p += n;
      offset += static_cast<uint64_t>(n);
      count -= static_cast<std::size_t>(n);
    }
  }

  // One tensor as the header spells it, its structure checked: a name, a
  // dtype string, extents (each at most 2^63-1, or `rank` over kMaxRank),
  // and data_offsets.
  struct RawEntry {
    std::string name;
    std::string dtype;
    std::vector<uint64_t> dims;
    std::size_t rank = 0;
    uint64_t begin = 0;
    uint64_t end = 0;
  };

  // Parses and validates the header; the entries come in the header's order.
  std::vector<Entry> parse_header(const std::string& text,
                                  std::map<std::string, std::string>& metadata) const {
    if (std::optional<std::vector<RawEntry>> raw = read_strict_header(text, metadata)) {
      std::vector<Entry> entries;
      entries.reserve(raw->size());
      for (const RawEntry& r : *raw) entries.push_back(make_entry(r));
      return entries;
    }
    metadata.clear();
    return parse_header_exactly(text, metadata);
  }

  // The header of every file a writer makes, in one SAX pass that builds the
  // entries directly: a top-level object of tensor objects (each exactly
  // dtype as a string, shape as an array of extents up to 2^63-1 and
  // data_offsets as two non-negative integers) and at most one
  // "__metadata__" object of strings, no key twice in one object. nullopt
  // for anything else -- malformed or merely unusual (a negative extent, a
  // field in another type) --, which parse_header_exactly then reads and
  // names. A million tensors take about a second; building the document
  // took four.
  std::optional<std::vector<RawEntry>> read_strict_header(
      const std::string& text, std::map<std::string, std::string>& metadata) const {
    struct Strict final : json::json_sax_t {
      enum class Field { none, dtype, shape, offsets };
      std::map<std::string, std::string>& metadata;
      std::vector<RawEntry> entries;
      int depth = 0;                   // objects and arrays open
      bool object_value_next = false;  // a top-level key was read: its object comes next
      bool in_metadata = false;        // inside "__metadata__"
      bool seen_metadata = false;
      Field field = Field::none;  // the open tensor's field whose value comes next
      unsigned fields_seen = 0;   // of the open tensor, one bit each
      int offsets_seen = 0;
      std::string meta_key;
      explicit Strict(std::map<std::string, std::string>& m) : metadata(m) {}

      bool null() override { return false; }
      bool boolean(bool) override { return false; }
      bool number_integer(number_integer_t) override { return false; }  // a negative number
      bool number_float(number_float_t, const string_t&) override { return false; }
      bool binary(binary_t&) override { return false; }
      bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
        return false;
      }
      bool number_unsigned(number_unsigned_t v) override {
        if (depth != 3) return false;
        RawEntry& e = entries.back();
        if (field == Field::shape) {
          if (v > uint64_t{INT64_MAX} || e.dims.size() == static_cast<std::size_t>(Shape::kMaxRank))
            return false;
          e.dims.push_back(v);
          e.rank = e.dims.size();
          return true;
        }
        if (field != Field::offsets || offsets_seen == 2) return false;
        (offsets_seen++ == 0 ? e.begin : e.end) = v;
        return true;
      }
      bool string(string_t& v) override {
        if (depth != 2) return false;
        if (in_metadata) return metadata.emplace(std::move(meta_key), std::move(v)).second;
        if (field != Field::dtype) return false;
        entries.back().dtype = std::move(v);
        return true;
      }
      bool start_object(std::size_t) override {
        if (depth == 0 || (depth == 1 && object_value_next)) {
          object_value_next = false;
          ++depth;
          return true;
        }
        return false;
      }
      bool end_object() override {
        if (depth == 2 && !in_metadata && (fields_seen != 7 || offsets_seen != 2)) return false;
        in_metadata = false;
        --depth;
        return true;
      }
      bool start_array(std::size_t) override {
        if (depth != 2 || in_metadata || (field != Field::shape && field != Field::offsets)) return false;
        ++depth;
        return true;
      }
      bool end_array() override {
        --depth;
        return field != Field::offsets || offsets_seen == 2;
      }
      bool key(string_t& k) override {
        if (depth == 1) {
          if (k == kMetadataKey) {
            if (seen_metadata) return false;
            seen_metadata = in_metadata = true;
          } else {
            entries.emplace_back().name = std::move(k);
            fields_seen = 0;
            offsets_seen = 0;
          }
          object_value_next = true;
          return true;
        }
        if (depth != 2) return false;
        if (in_metadata) {
          meta_key = std::move(k);
          return true;
        }
        unsigned bit = 0;
        if (k == "dtype") {
          field = Field::dtype;
          bit = 1;
        } else if (k == "shape") {
          field = Field::shape;
          bit = 2;
        } else if (k == "data_offsets") {
          field = Field::offsets;
          bit = 4;
        }
        if (bit == 0 || (fields_seen & bit) != 0) return false;
        fields_seen |= bit;
        return true;
      }
    };
    Strict strict(metadata);
    if (!json::sax_parse(text, &strict) || strict.depth != 0) return std::nullopt;
    // A name twice is the exact reader's to name.
    std::vector<const std::string*> names;
    names.reserve(strict.entries.size());
    for (const RawEntry& e : strict.entries) names.push_back(&e.name);
    std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    for (std::size_t i = 1; i < names.size(); ++i)
      if (*names[i] == *names[i - 1]) return std::nullopt;
    return std::move(strict.entries);
  }

  std::vector<Entry> parse_header_exactly(const std::string& text,
                                          std::map<std::string, std::string>& metadata) const {
    // Two linear passes. First a SAX pass refuses what the document parse
    // would accept silently (a key repeated in one object: nlohmann keeps one)
    // or should not build (nesting deeper than a header has), and records the
    // top level's keys in the header's order. Then the document parse, into
    // nlohmann::json's sorted maps. (ordered_json searches a list per insert,
    // and the callback parser walks the parent object after each child: both
    // quadratic, 47 s for a header of 100k tensors.)
    struct Checker final : json::json_sax_t {
      const Impl& reader;
      const std::string& text;
      std::vector<std::set<std::string>> keys;  // one set per open object or array
      std::vector<std::string> order;           // the top level's keys, as they came
      Checker(const Impl& r, const std::string& t) : reader(r), text(t) {}
      bool open() {
        if (keys.size() >= kMaxHeaderDepth)
          reader.fail("the header nests deeper than " + std::to_string(kMaxHeaderDepth) +
                      " levels; a header is an object of tensor objects holding arrays of integers");
        keys.emplace_back();
        return true;
      }
      bool close() {
        keys.pop_back();
        return true;
      }
      bool null() override { return true; }
      bool boolean(bool) override { return true; }
      bool number_integer(number_integer_t) override { return true; }
      bool number_unsigned(number_unsigned_t) override { return true; }
      bool number_float(number_float_t, const string_t&) override { return true; }
      bool string(string_t&) override { return true; }
      bool binary(binary_t&) override { return true; }
      bool start_object(std::size_t) override { return open(); }
      bool end_object() override { return close(); }
      bool start_array(std::size_t) override { return open(); }
      bool end_array() override { return close(); }
      bool key(string_t& key) override {
        if (!keys.back().insert(key).second)
          reader.fail(keys.size() == 1
                          ? "the header names " + shown(key) + " twice; each name may appear once"
                          : "the header repeats the key " + shown(key) + " inside one object");
        if (keys.size() == 1) order.push_back(key);
        return true;
      }
      bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        // JSON text is UTF-8: a byte that is not is named by its offset, never quoted raw.
        if (const std::size_t bad = backplane::detail::first_invalid_utf8(text); bad != std::string::npos) {
          char byte[8];
          std::snprintf(byte, sizeof byte, "0x%02X",
                        static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
          reader.fail("the header is not valid UTF-8: the byte " + std::string(byte) + " at offset " +
                      std::to_string(8 + bad) + " of the file (" + std::to_string(bad) +
                      " of the header) is not part of a UTF-8 character; tensor names and metadata are UTF-8 "
                      "text (the file is damaged, or its writer did not encode them)");
        }
        std::string detail = e.what();  // "[json.exception.parse_error.101] parse error at ..."
        if (auto pos = detail.find("] "); pos != std::string::npos) detail = detail.substr(pos + 2);
        reader.fail("the header is not JSON: " + detail);
      }
    };
    Checker checker(*this, text);
    json::sax_parse(text, &checker);
    const std::vector<std::string>& order = checker.order;
    json root;
    try {
      root = json::parse(text);
    } catch (const json::exception& e) {  // the SAX pass refused every malformed text already
      fail(std::string("the header is not JSON: ") + e.what());
    }
    if (!root.is_object()) fail(std::string("the header is not a JSON object but ") + root.type_name());

    std::vector<Entry> entries;
    entries.reserve(order.size());
    for (const std::string& name : order) {
      const json& value = root.at(name);
      if (name == kMetadataKey) {
        if (!value.is_object())
          fail(std::string("\"__metadata__\" is ") + value.type_name() + ", not an object of strings");
        for (const auto& [key, v] : value.items()) {
          if (!v.is_string())
            fail("\"__metadata__\" holds " + std::string(v.type_name()) + " under " + shown(key) +
                 "; metadata values are strings");
          metadata.emplace(key, v.get<std::string>());
        }
        continue;
      }
      entries.push_back(parse_entry(name, value));
    }
    return entries;
  }

  Entry parse_entry(const std::string& name, const json& value) const {
    const std::string what = "tensor " + shown(name);
    if (!value.is_object())
      fail(what + " is " + value.type_name() + ", not an object of dtype, shape and data_offsets");
    for (const auto& [key, v] : value.items())
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        fail(what + " has the unknown field " + shown(key) + "; a tensor has dtype, shape and data_offsets");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!value.contains(field)) fail(what + " has no \"" + field + "\"");

    RawEntry raw;
    raw.name = name;
    const auto& dtype = value["dtype"];
    if (!dtype.is_string()) fail(what + ": \"dtype\" is " + dtype.type_name() + ", not a string");
    raw.dtype = dtype.get<std::string>();
    known_dtype(raw);  // each check in the order make_entry makes them, between the structure's
    const auto& shape = value["shape"];
    if (!shape.is_array()) fail(what + ": \"shape\" is " + shape.type_name() + ", not an array of integers");
    raw.rank = shape.size();
    check_rank(raw);
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX})
        fail(what + ": the shape " + shown(shape.dump()) + " holds " + shown(d.dump()) +
             "; extents are integers from 0 to 2^63-1");
      raw.dims.push_back(d.get<uint64_t>());
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(what + ": \"data_offsets\" is " + shown(offsets.dump()) +
           ", not [begin, end] of two non-negative integers");
    raw.begin = offsets[0].get<uint64_t>();
    raw.end = offsets[1].get<uint64_t>();
    return make_entry(raw);
  }

  // The checks of what a structurally valid entry says, in the order a
  // reader meets them: the dtype, the rank, the offsets against the buffer
  // and against the shape.
  DType known_dtype(const RawEntry& raw) const {
    for (const DTypeName& d : kDTypeNames)
      if (raw.dtype == d.name) return d.dtype;
    fail("tensor " + shown(raw.name) + ": unknown dtype " + shown(raw.dtype) +
         "; backplane reads F32, F64, I32, I64, BOOL, F16, BF16, U8 and I8");
  }

  void check_rank(const RawEntry& raw) const {
    if (raw.rank > static_cast<std::size_t>(Shape::kMaxRank))
      fail("tensor " + shown(raw.name) + ": the shape has rank " + std::to_string(raw.rank) +
           "; backplane holds at most " + std::to_string(Shape::kMaxRank) + " dimensions");
  }

  Entry make_entry(const RawEntry& raw) const {
    Entry e;
    e.name = raw.name;
    e.dtype = known_dtype(raw);
    check_rank(raw);
    int64_t dims[Shape::kMaxRank];
    uint64_t bytes = dtype_size(e.dtype);
    bool overflow = false;
    for (std::size_t i = 0; i < raw.dims.size(); ++i) {
      dims[i] = static_cast<int64_t>(raw.dims[i]);
      overflow = overflow || __builtin_mul_overflow(bytes, raw.dims[i], &bytes);
    }
    e.shape = Shape(std::span<const int64_t>(dims, raw.dims.size()));
    const uint64_t begin = raw.begin;
    const uint64_t end = raw.end;
    if (begin > end || end > buffer_size_ || overflow || bytes != end - begin) [[unlikely]]
      bad_offsets(raw, e, bytes, overflow);
    e.offset = buffer_start_ + begin;
    e.size = end - begin;
    return e;
  }

  [[noreturn, gnu::cold]] void bad_offsets(const RawEntry& raw, const Entry& e, uint64_t bytes,
                                           bool overflow) const {
    const std::string what = "tensor " + shown(raw.name);
    const std::string range = "[" + std::to_string(raw.begin) + ", " + std::to_string(raw.end) + "]";
    if (raw.begin > raw.end) fail(what + ": data_offsets " + range + " end before they begin");
    if (raw.end > buffer_size_)
      fail(what + ": data_offsets " + range + " are out of range: the buffer after the header holds " +
           std::to_string(buffer_size_) + " bytes");
    fail(what + ": the shape " + e.shape.to_string() + " of " + raw.dtype + " takes " +
         (overflow ? std::string("more than 2^64") : std::to_string(bytes)) + " bytes but data_offsets " +
         range + " hold " + std::to_string(raw.end - raw.begin));
  }

  // The tensors' byte ranges tile the buffer: no gap, no overlap, nothing
  // after. (Offsets in messages are the header's, from the buffer's start.)
  void check_coverage(const std::vector<Entry>& entries) const {
    std::vector<const Entry*> order;
    for (const Entry& e : entries) order.push_back(&e);
    std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
      return a->offset != b->offset ? a->offset < b->offset : a->size < b->size;
    });
    uint64_t covered = 0;  // [0, covered) belongs to the tensors seen so far
    const Entry* last = nullptr;
    for (const Entry* e : order) {
      const uint64_t begin = e->offset - buffer_start_;
      const uint64_t end = begin + e->size;
      if (begin < covered)
        fail("tensors " + shown(last->name) + " and " + shown(e->name) + " overlap: bytes [" +
             std::to_string(begin) + ", " + std::to_string(std::min(covered, end)) +
             ") of the buffer are in both");
      if (begin > covered)
        fail("the tensors do not cover the buffer: bytes [" + std::to_string(covered) + ", " +
             std::to_string(begin) + ") belong to no tensor");
      if (end > covered) {
        covered = end;
        last = e;
      }
    }
    if (covered != buffer_size_)
      fail("the tensors do not cover the buffer: bytes [" + std::to_string(covered) + ", " +
           std::to_string(buffer_size_) + ") at its end belong to no tensor");
  }

  std::filesystem::path path_;
  common::UniqueFd fd_;
  uint64_t size_ = 0;
  uint64_t buffer_start_ = 0;
  uint64_t buffer_size_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

SafetensorsReader::SafetensorsReader(const std::filesystem::path& path, SafetensorsLink links)
    : impl_(std::make_unique<Impl>(path, links)) {}
SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const std::filesystem::path& SafetensorsReader::path() const { return impl_->path_; }
const std::vector<SafetensorsReader::Entry>& SafetensorsReader::entries() const { return impl_->entries_; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return impl_->metadata_; }
uint64_t SafetensorsReader::file_size() const { return impl_->size_; }
void SafetensorsReader::read(uint64_t offset, void* dst, std::size_t size) const {
  if (offset > impl_->size_ || size > impl_->size_ - offset)
    throw Error(Errc::invalid_argument, "SafetensorsReader::read: bytes [" + std::to_string(offset) + ", +" +
                                            std::to_string(size) + ") are beyond the end of '" +
                                            impl_->path_.string() + "' (" + std::to_string(impl_->size_) +
                                            " bytes)");
  impl_->read_at(offset, dst, size);
}
SafetensorsFile SafetensorsReader::load(const Device& device, SafetensorsLoad mode) const {
  return impl_->load(device, mode);
}

SafetensorsFile load_safetensors(const std::filesystem::path& path, const Device& device,
                                 SafetensorsLoad mode) {
  return SafetensorsReader(path).load(device, mode);
}

SafetensorsFile load_safetensors(const std::filesystem::path& path, const Device& device) {
  return load_safetensors(path, device, SafetensorsLoad::copy);
}

}  // namespace backplane
