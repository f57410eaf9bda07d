// save_safetensors / load_safetensors on the cpu plugin: round trips of every
// dtype the device holds, the exact bytes of a small file, files other
// writers make (key order, padding), and each malformed file refused with
// Errc::invalid_argument naming the file and the problem.
#include <backplane/safetensors.hpp>

#include "test_support.hpp"

#include <dlpack/dlpack.h>
#include <backplane/dlpack.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace backplane;
using namespace bptest;

namespace {

Registry& registry() {
  static Registry r = load(config_json({backend_json("cpu", "backplane_cpu", true)}));
  return r;
}
Device cpu() { return registry().backend("cpu").device(0); }

constexpr DType kAllDTypes[] = {DType::f32, DType::f64,  DType::i32, DType::i64, DType::bool_,
                                DType::f16, DType::bf16, DType::u8,  DType::i8};

// The tensor's elements as bytes, row-major.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  std::vector<unsigned char> out(t.nbytes());
  t.read_into(t.dtype(), out.data(), static_cast<std::size_t>(t.numel()));
  return out;
}

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
  return out;
}

// A file: the header's length, the header, the buffer.
std::string file_of(const std::string& header, const std::string& buffer = {}) {
  return le64(header.size()) + header + buffer;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Loads `contents` from a file; checks it is refused with invalid_argument,
// naming the file and containing `problem`.
void expect_refused(const std::string& contents, const std::string& problem) {
  TempDir tmp;
  const fs::path p = tmp.write("bad.safetensors", contents);
  INFO("expecting: ", problem);
  const Error e = error_from([&] { (void)load_safetensors(p, cpu()); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), p.string());
  BP_CHECK_CONTAINS(e.message(), problem);
}

}  // namespace

TEST_CASE("safetensors: every dtype the cpu device holds round-trips with its metadata") {
  std::mt19937_64 rng(7);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType dtype : kAllDTypes) {
    if (!cpu().capabilities().has(capability_for(dtype))) continue;
    const Shape shape{2, 3, 5};
    std::vector<unsigned char> data(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
    for (auto& b : data) b = static_cast<unsigned char>(dtype == DType::bool_ ? rng() % 2 : rng() % 256);
    tensors.emplace_back(
        "t." + std::string(to_string(dtype)),
        Tensor::from_bytes(cpu(), shape, dtype, data.data(), static_cast<std::size_t>(shape.numel())));
  }
  REQUIRE(tensors.size() >= 5);  // f32, f64, i32, i64, bool at least
  // A scalar, an empty tensor, and a transposed view (saved row-major).
  tensors.emplace_back("scalar", Tensor::from_vector<double>(cpu(), {}, {2.5}));
  tensors.emplace_back("empty", Tensor::from_vector<float>(cpu(), {0, 4}, {}));
  const Tensor base = Tensor::from_vector<int32_t>(cpu(), {2, 3}, {1, 2, 3, 4, 5, 6});
  tensors.emplace_back("transposed", transpose(base, 0, 1));
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"note", "caf\xc3\xa9 \"quoted\""}};

  TempDir tmp;
  const fs::path p = tmp / "all.safetensors";
  save_safetensors(p, tensors, metadata);
  const SafetensorsFile file = load_safetensors(p, cpu());
  CHECK(file.metadata == metadata);
  REQUIRE(file.tensors.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    INFO("tensor ", name);
    CHECK(file.tensors[i].first == name);  // the order given
    CHECK(file.tensors[i].second.dtype() == t.dtype());
    CHECK(file.tensors[i].second.shape() == t.shape());
    CHECK(file.tensors[i].second.device().id() == "cpu:0");
    CHECK(bytes_of(file.tensors[i].second) == bytes_of(t));
  }
  CHECK(file.tensors.back().second.to_vector<int32_t>() == std::vector<int32_t>{1, 4, 2, 5, 3, 6});
  CHECK(file.tensors[file.tensors.size() - 3].second.to_vector<double>() == std::vector<double>{2.5});

  // Saving again replaces the file; no temporary file is left beside it.
  save_safetensors(p, {{"only", Tensor::from_vector<int64_t>(cpu(), {1}, {-9})}});
  const SafetensorsFile again = load_safetensors(p, cpu());
  CHECK(again.metadata.empty());
  REQUIRE(again.tensors.size() == 1);
  CHECK(again.tensors[0].second.to_vector<int64_t>() == std::vector<int64_t>{-9});
  CHECK(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("safetensors: a small file is written byte for byte as the format says") {
  TempDir tmp;
  const fs::path p = tmp / "tiny.safetensors";
  save_safetensors(p,
                   {{"a", Tensor::from_vector<float>(cpu(), {2}, {1.0f, -2.0f})},
                    {"b", Tensor::from_vector<uint8_t>(cpu(), {}, {7})}},
                   {{"k", "v"}});
  const std::string header =
      "{\"__metadata__\":{\"k\":\"v\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[8,9]}}"
      "      ";  // 130 bytes padded to 136, so the buffer starts at 144
  const std::string expected =
      std::string("\x88\0\0\0\0\0\0\0", 8) + header + std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x07", 9);
  CHECK(read_file(p) == expected);
}

TEST_CASE("safetensors: files from other writers load: any key order, padding, empty metadata") {
  TempDir tmp;
  // Keys in another order, the metadata last, spaces after the header.
  std::string buffer;
  const int32_t ints[2] = {-1, 70000};
  const double d = -0.5;
  buffer.append(reinterpret_cast<const char*>(&d), 8);
  buffer.append(reinterpret_cast<const char*>(ints), 8);
  buffer += std::string("\x01\x00\x01", 3);
  const std::string header =
      "{\"z\": {\"shape\": [2], \"data_offsets\": [8, 16], \"dtype\": \"I32\"},"
      " \"y\": {\"data_offsets\": [0, 8], \"dtype\": \"F64\", \"shape\": [1, 1]},"
      " \"flags\": {\"dtype\": \"BOOL\", \"shape\": [3], \"data_offsets\": [16, 19]},"
      " \"none\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [19, 19]},"
      " \"__metadata__\": {}}   ";
  const fs::path p = tmp.write("other.safetensors", file_of(header, buffer));
  const SafetensorsFile file = load_safetensors(p, cpu());
  CHECK(file.metadata.empty());
  REQUIRE(file.tensors.size() == 4);
  CHECK(file.tensors[0].first == "z");
  CHECK(file.tensors[0].second.to_vector<int32_t>() == std::vector<int32_t>{-1, 70000});
  CHECK(file.tensors[1].first == "y");
  CHECK(file.tensors[1].second.shape() == Shape{1, 1});
  CHECK(file.tensors[1].second.to_vector<double>() == std::vector<double>{-0.5});
  CHECK(file.tensors[2].second.to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(file.tensors[3].second.shape() == Shape{0});

  // No tensors at all.
  const SafetensorsFile empty = load_safetensors(tmp.write("empty.safetensors", file_of("{}")), cpu());
  CHECK(empty.tensors.empty());
}

TEST_CASE("safetensors: a header of a million entries loads, in the header's order") {
  // The parser once searched a list per key (quadratic: 100k entries took
  // 47 s). Not a timing assertion: with the quadratic parser this test runs
  // for hours and ctest's timeout fails it.
  constexpr int kEntries = 1'000'000;
  std::string header = "{";
  header.reserve(static_cast<std::size_t>(kEntries) * 64);
  for (int i = kEntries - 1; i >= 0; --i) {  // descending: not the sorted order
    header +=
        "\"t" + std::to_string(i) + "\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 0]}";
    if (i > 0) header += ",";
  }
  header += "}";
  TempDir tmp;
  const SafetensorsFile file = load_safetensors(tmp.write("wide.safetensors", file_of(header)), cpu());
  REQUIRE(file.tensors.size() == static_cast<std::size_t>(kEntries));
  CHECK(file.tensors.front().first == "t" + std::to_string(kEntries - 1));
  CHECK(file.tensors.back().first == "t0");
  CHECK(file.tensors[1].second.shape() == Shape{0});
}

TEST_CASE("safetensors: each malformed file is invalid_argument naming the file and the problem") {
  const std::string f32x2 = "{\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}";
  const std::string eight(8, '\0');
  SUBCASE("truncated") { expect_refused(std::string("\x05\0\0", 3), "truncated: 3 bytes"); }
  SUBCASE("header length beyond the file") {
    expect_refused(le64(1000) + "{}", "header length 1000 reaches beyond the end of the file (10 bytes");
  }
  SUBCASE("header length over the limit") {
    // A sparse file long enough for the length, so the limit is what refuses it.
    TempDir tmp;
    const fs::path p = tmp.write("big.safetensors", le64(100'000'001));
    fs::resize_file(p, 8 + 100'000'001);
    const Error e = error_from([&] { (void)load_safetensors(p, cpu()); });
    CHECK(e.code() == Errc::invalid_argument);
    BP_CHECK_CONTAINS(e.message(), p.string());
    BP_CHECK_CONTAINS(e.message(), "over the format's limit of 100000000 bytes");
  }
  SUBCASE("not JSON") { expect_refused(file_of("{\"a\": "), "the header is not JSON"); }
  SUBCASE("a name that is not UTF-8") {
    expect_refused(file_of("{\"w\xff\": " + f32x2 + "}", eight),
                   "the header is not valid UTF-8: the byte 0xFF at offset 11 of the file (3 of the header)");
  }
  SUBCASE("metadata that is not UTF-8") {
    expect_refused(file_of("{\"__metadata__\": {\"k\": \"\xed\xa0\x80\"}}"),  // an encoded surrogate
                   "the byte 0xED at offset 32 of the file (24 of the header)");
  }
  SUBCASE("empty header") { expect_refused(file_of(""), "the header is not JSON"); }
  SUBCASE("not an object") { expect_refused(file_of("[1, 2]"), "the header is not a JSON object but array"); }
  SUBCASE("tensor not an object") { expect_refused(file_of("{\"a\": 3}"), "tensor \"a\" is number"); }
  SUBCASE("missing field") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", eight),
                   "tensor \"a\" has no \"data_offsets\"");
  }
  SUBCASE("unknown field") {
    expect_refused(
        file_of("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8], \"x\": 1}}", eight),
        "unknown field \"x\"");
  }
  SUBCASE("unknown dtype") {
    expect_refused(
        file_of("{\"a\": {\"dtype\": \"F8_E4M3\", \"shape\": [2], \"data_offsets\": [0, 2]}}", "ab"),
        "tensor \"a\": unknown dtype \"F8_E4M3\"");
  }
  SUBCASE("negative extent") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", eight),
                   "extents are integers from 0");
  }
  SUBCASE("rank above 8") {
    expect_refused(
        file_of("{\"a\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}",
                "x"),
        "rank 9");
  }
  SUBCASE("shape and byte size disagree") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", eight),
                   "the shape [3] of F32 takes 12 bytes but data_offsets [0, 8] hold 8");
  }
  SUBCASE("shape whose size overflows") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296], "
                           "\"data_offsets\": [0, 8]}}",
                           eight),
                   "more than 2^64");
  }
  SUBCASE("offsets out of range") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", eight),
                   "data_offsets [4, 12] are out of range: the buffer after the header holds 8 bytes");
  }
  SUBCASE("offsets reversed") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [8, 0]}}", eight),
                   "end before they begin");
  }
  SUBCASE("offsets not two integers") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0]}}", eight),
                   "not [begin, end] of two non-negative integers");
  }
  SUBCASE("overlapping") {
    expect_refused(file_of("{\"a\": " + f32x2 +
                               ", \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                           std::string(12, '\0')),
                   "tensors \"a\" and \"b\" overlap: bytes [4, 8)");
  }
  SUBCASE("a gap") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
                           " \"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [8, 12]}}",
                           std::string(12, '\0')),
                   "do not cover the buffer: bytes [4, 8) belong to no tensor");
  }
  SUBCASE("bytes after the last tensor") {
    expect_refused(file_of("{\"a\": " + f32x2 + "}", std::string(10, '\0')),
                   "bytes [8, 10) at its end belong to no tensor");
  }
  SUBCASE("duplicate names") {
    expect_refused(file_of("{\"a\": " + f32x2 + ", \"a\": " + f32x2 + "}", eight),
                   "the header names \"a\" twice");
  }
  SUBCASE("non-string metadata") {
    expect_refused(file_of("{\"__metadata__\": {\"epoch\": 3}}"),
                   "\"__metadata__\" holds number under \"epoch\"");
  }
  SUBCASE("metadata not an object") {
    expect_refused(file_of("{\"__metadata__\": [\"x\"]}"), "\"__metadata__\" is array");
  }
  SUBCASE("nested too deep") {
    expect_refused(file_of("{\"a\": {\"shape\": [[1]]}}"), "nests deeper than 3");
  }
  SUBCASE("BOOL byte other than 0 or 1") {
    expect_refused(file_of("{\"a\": {\"dtype\": \"BOOL\", \"shape\": [3], \"data_offsets\": [0, 3]}}",
                           std::string("\x01\x00\x02", 3)),
                   "BOOL element 2 is the byte 2");
  }
}

TEST_CASE("safetensors: I/O failures are io_error naming the file and the OS error") {
  TempDir tmp;
  const fs::path missing = tmp / "missing.safetensors";
  Error e = error_from([&] { (void)load_safetensors(missing, cpu()); });
  CHECK(e.code() == Errc::io_error);
  BP_CHECK_CONTAINS(e.message(), missing.string());
  BP_CHECK_CONTAINS(e.message(), std::strerror(ENOENT));

  e = error_from([&] { (void)load_safetensors(tmp.path(), cpu()); });
  CHECK(e.code() == Errc::io_error);
  BP_CHECK_CONTAINS(e.message(), std::strerror(EISDIR));

  const fs::path nowhere = tmp / "no_such_dir" / "w.safetensors";
  e = error_from([&] { save_safetensors(nowhere, {{"a", Tensor::from_vector<float>(cpu(), {1}, {1.0f})}}); });
  CHECK(e.code() == Errc::io_error);
  BP_CHECK_CONTAINS(e.message(), nowhere.string());
  BP_CHECK_CONTAINS(e.message(), std::strerror(ENOENT));
}

TEST_CASE(
    "safetensors: SafetensorsReader gives names, dtypes, shapes and offsets before any tensor is read") {
  TempDir tmp;
  const fs::path p = tmp / "w.safetensors";
  save_safetensors(p,
                   {{"b", Tensor::from_vector<float>(cpu(), {2, 3}, {1, 2, 3, 4, 5, 6})},
                    {"a", Tensor::from_vector<int64_t>(cpu(), {1}, {7})}},
                   {{"k", "v"}});
  const SafetensorsReader reader(p);
  CHECK(reader.path() == p);
  CHECK(reader.metadata() == std::map<std::string, std::string>{{"k", "v"}});
  REQUIRE(reader.entries().size() == 2);
  const SafetensorsReader::Entry& b = reader.entries()[0];
  const SafetensorsReader::Entry& a = reader.entries()[1];
  CHECK(b.name == "b");
  CHECK(b.dtype == DType::f32);
  CHECK(b.shape == Shape{2, 3});
  CHECK(b.size == 24);
  CHECK(a.name == "a");
  CHECK(a.offset == b.offset + 24);
  CHECK(a.offset + a.size == reader.file_size());
  float second = 0;
  reader.read(b.offset + 4, &second, sizeof second);
  CHECK(second == 2.0f);
  const Error e = error_from([&] { reader.read(reader.file_size() - 2, &second, sizeof second); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "beyond the end of");
  const SafetensorsFile loaded = reader.load(cpu());
  REQUIRE(loaded.tensors.size() == 2);
  CHECK(loaded.tensors[0].second.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(loaded.tensors[1].second.to_vector<int64_t>() == std::vector<int64_t>{7});
}

TEST_CASE("safetensors: SafetensorsLink::not_followed refuses to read a link and replaces one when saving") {
  TempDir tmp;
  const fs::path real = tmp / "real.safetensors";
  save_safetensors(real, {{"x", Tensor::from_vector<float>(cpu(), {1}, {1.0f})}});
  const std::string original = read_file(real);
  const fs::path link = tmp / "link.safetensors";
  fs::create_symlink(real, link);
  CHECK(load_safetensors(link, cpu()).tensors.size() == 1);  // followed by default
  const Error e = error_from([&] { (void)SafetensorsReader(link, SafetensorsLink::not_followed); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), link.string());
  BP_CHECK_CONTAINS(e.message(), "it is a symbolic link, which is not followed here");
  save_safetensors(link, {{"y", Tensor::from_vector<float>(cpu(), {1}, {2.0f})}}, {},
                   SafetensorsLink::not_followed);
  CHECK(fs::is_regular_file(fs::symlink_status(link)));
  CHECK(read_file(real) == original);
  CHECK(load_safetensors(link, cpu()).tensors.at(0).first == "y");
}

TEST_CASE("safetensors: save refuses bad names and undefined tensors and leaves the old file") {
  TempDir tmp;
  const fs::path p = tmp / "keep.safetensors";
  const Tensor a = Tensor::from_vector<float>(cpu(), {1}, {1.0f});
  save_safetensors(p, {{"a", a}});
  const std::string before = read_file(p);

  Error e = error_from([&] { save_safetensors(p, {{"a", a}, {"a", a}}); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), p.string());
  BP_CHECK_CONTAINS(e.message(), "\"a\" appears twice");
  e = error_from([&] { save_safetensors(p, {{"__metadata__", a}}); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "reserves that key");
  e = error_from([&] { save_safetensors(p, {{"u", Tensor()}}); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "\"u\" is undefined");
  e = error_from([&] { save_safetensors(p, {{"bad\xff", a}}); });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "not valid UTF-8");
  CHECK(read_file(p) == before);
}

namespace {

// Whether `p` lies in a mapping of `file` in this process (/proc/self/maps).
bool in_map_of(const void* p, const fs::path& file) {
  std::ifstream maps("/proc/self/maps");
  const std::string name = fs::canonical(file).string();
  const auto address = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    if (line.size() < name.size() || line.compare(line.size() - name.size(), name.size(), name) != 0)
      continue;
    unsigned long long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &begin, &end) == 2 && address >= begin && address < end)
      return true;
  }
  return false;
}

const void* data_of(const Tensor& t) {
  DLManagedTensor* m = to_dlpack(t);
  const void* p = static_cast<const char*>(m->dl_tensor.data) + m->dl_tensor.byte_offset;
  m->deleter(m);
  return p;
}

}  // namespace

TEST_CASE("safetensors: on a host-visible device aligned tensors view a private map of the file") {
  TempDir tmp;
  const fs::path file = tmp / "mapped.safetensors";
  std::vector<float> weights(1000);
  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<float>(i) * 0.5f;
  // The buffer starts 8-aligned; "odd" (3 bytes) puts "late" at offset 3, not 4-aligned.
  save_safetensors(file, {{"weights", Tensor::from_vector<float>(cpu(), {1000}, weights)},
                          {"flags", Tensor::from_vector<bool>(cpu(), {4}, {true, false, true, true})},
                          {"odd", Tensor::from_vector<uint8_t>(cpu(), {3}, {1, 2, 3})},
                          {"late", Tensor::from_vector<float>(cpu(), {2}, {7.0f, 8.0f})}});
  const std::string before = read_file(file);
  {
    SafetensorsFile loaded = load_safetensors(file, cpu(), SafetensorsLoad::map_if_possible);
    REQUIRE(loaded.tensors.size() == 4);
    const Tensor& w = loaded.tensors[0].second;
    CHECK(w.to_vector<float>() == weights);
    CHECK(in_map_of(data_of(w), file));
    CHECK_FALSE(in_map_of(data_of(loaded.tensors[1].second), file));  // BOOL: checked, so copied
    CHECK(in_map_of(data_of(loaded.tensors[2].second), file));        // u8 at offset 4000
    CHECK_FALSE(in_map_of(data_of(loaded.tensors[3].second), file));  // f32 at 4007: misaligned
    CHECK(loaded.tensors[3].second.to_vector<float>() == std::vector<float>{7.0f, 8.0f});
    // Writing to a mapped tensor changes the tensor, never the file.
    w.copy_(zeros(cpu(), {1000}));
    CHECK(w.to_vector<float>() == std::vector<float>(1000, 0.0f));
    CHECK(read_file(file) == before);
    CHECK(load_safetensors(file, cpu()).tensors[0].second.to_vector<float>() == weights);
    // The map outlives the file's name (a checkpoint pruned while in use).
    fs::remove(file);
    CHECK(loaded.tensors[2].second.to_vector<uint8_t>() == std::vector<uint8_t>{1, 2, 3});
  }
  std::ofstream(file, std::ios::binary) << before;
  const SafetensorsFile copied = load_safetensors(file, cpu(), SafetensorsLoad::copy);
  for (const auto& [name, t] : copied.tensors) {
    CAPTURE(name);
    CHECK_FALSE(in_map_of(data_of(t), file));
  }
  CHECK(copied.tensors[0].second.to_vector<float>() == weights);
}

TEST_CASE(
    "safetensors: by default tensors are copied: a file rewritten or truncated under them changes nothing") {
  TempDir tmp;
  const fs::path file = tmp / "weights.safetensors";
  const std::vector<float> ones(1024, 1.0f);
  save_safetensors(file, {{"w", Tensor::from_vector<float>(cpu(), {1024}, ones)}});
  const std::string original = read_file(file);
  const SafetensorsFile loaded = load_safetensors(file, cpu());
  const Tensor& w = loaded.tensors[0].second;
  CHECK_FALSE(in_map_of(data_of(w), file));
  // As `cp other file` does: the same inode, truncated, then written.
  std::string other = original;
  const std::size_t data = other.size() - 1024 * sizeof(float);
  const float two = 2.0f;
  for (std::size_t i = 0; i < 1024; ++i)
    std::memcpy(other.data() + data + i * sizeof(float), &two, sizeof two);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << other;
  CHECK(w.to_vector<float>() == ones);
  // Truncated to nothing: reading a mapped page past the end would be SIGBUS.
  fs::resize_file(file, 0);
  CHECK(w.to_vector<float>() == ones);
}
