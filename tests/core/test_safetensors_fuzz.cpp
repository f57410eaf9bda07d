// A bounded fuzzer for load_safetensors: valid files (from save_safetensors
// and by hand) mutated in their length field, header and buffer, and random
// bytes. The only outcomes allowed are a loaded file or a backplane::Error
// with Errc::invalid_argument: no other exception, no crash, no hang. The
// seed is fixed, so a failure repeats; BP_FUZZ_SEED=<n> tries another one, and
// every failure prints its seed. BP_FUZZ_SECONDS=<n> runs for n seconds
// instead of 2 (a long run; no iteration cap then).
#include <backplane/safetensors.hpp>

#include "test_support.hpp"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>

using namespace backplane;
using namespace bptest;

namespace {

constexpr uint64_t kDefaultSeed = 0x7361666574656e73ULL;  // "safetens"
constexpr auto kTimeBudget = std::chrono::seconds(2);
constexpr int kMaxIterations = 100000;

Registry& registry() {
  static Registry r = load(config_json({backend_json("cpu", "backplane_cpu", true)}));
  return r;
}
Device cpu() { return registry().backend("cpu").device(0); }

std::chrono::seconds fuzz_budget(bool& long_run) {
  long_run = false;
  if (const char* env = std::getenv("BP_FUZZ_SECONDS"); env != nullptr && *env != '\0') {
    long_run = true;
    return std::chrono::seconds(std::strtoll(env, nullptr, 10));
  }
  return kTimeBudget;
}

uint64_t fuzz_seed() {
  if (const char* env = std::getenv("BP_FUZZ_SEED"); env != nullptr && *env != '\0')
    return std::strtoull(env, nullptr, 0);
  return kDefaultSeed;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
  return out;
}

// Valid files the mutations start from: save_safetensors' own (every dtype
// the cpu device holds, metadata, a scalar, an empty tensor) and by hand.
std::vector<std::string> seeds(const TempDir& tmp) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  const DType dtypes[] = {DType::f32, DType::f64,  DType::i32, DType::i64, DType::bool_,
                          DType::f16, DType::bf16, DType::u8,  DType::i8};
  for (DType dtype : dtypes) {
    if (!cpu().capabilities().has(capability_for(dtype))) continue;
    const std::vector<unsigned char> zeros(6 * dtype_size(dtype), 0);
    tensors.emplace_back(std::string(to_string(dtype)),
                         Tensor::from_bytes(cpu(), {2, 3}, dtype, zeros.data(), 6));
  }
  tensors.emplace_back("s", Tensor::from_vector<float>(cpu(), {}, {1.5f}));
  tensors.emplace_back("e", Tensor::from_vector<int64_t>(cpu(), {3, 0}, {}));
  const fs::path p = tmp / "seed.safetensors";
  save_safetensors(p, tensors, {{"format", "pt"}, {"k", "v"}});
  std::vector<std::string> out{read_file(p)};
  save_safetensors(p, {{"w", Tensor::from_vector<float>(cpu(), {2}, {1.0f, 2.0f})}});
  out.push_back(read_file(p));
  const std::string header =
      "{\"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]}, "
      "\"a\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"__metadata__\": {\"x\": "
      "\"y\"}}  ";
  out.push_back(le64(header.size()) + header + std::string("\x01\x02\x03\x04\x05\x06", 6));
  out.push_back(le64(2) + "{}");
  return out;
}

// Fragments spliced into headers: JSON's structure, the format's words and
// hostile numbers.
const std::vector<std::string> kFragments = {
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "null",
    "true",
    "0",
    "-1",
    "1e400",
    "2.5",
    "8",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "\"F32\"",
    "\"BOOL\"",
    "\"F8_E4M3\"",
    "\"U8\"",
    "\"F64\"",
    "\"dtype\"",
    "\"shape\"",
    "\"data_offsets\"",
    "\"__metadata__\"",
    "[0, 0]",
    "[0, 4]",
    "[4, 0]",
    "[1,1,1,1,1,1,1,1,1]",
    "{}",
    "[]",
    "\"\\u0000\"",
    "\"\xff\"",
    "   ",
};

std::string random_bytes(std::mt19937_64& rng, std::size_t max) {
  std::string out(std::uniform_int_distribution<std::size_t>(0, max)(rng), '\0');
  for (char& c : out) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
  return out;
}

std::string mutate(std::string file, std::mt19937_64& rng) {
  const int rounds = 1 + static_cast<int>(rng() % 3);
  for (int r = 0; r < rounds; ++r) {
    // Mostly inside the header (past the 8 length bytes), where the structure is.
    const std::size_t at = file.empty() ? 0 : rng() % (file.size() + 1);
    const std::string& fragment = kFragments[rng() % kFragments.size()];
    switch (rng() % 8) {
      case 0:  // truncate
        file.resize(at);
        break;
      case 1:  // a new header length: near the right one, or anything
        if (file.size() >= 8) {
          uint64_t n = 0;
          for (int i = 0; i < 8; ++i)
            n |= uint64_t{static_cast<unsigned char>(file[static_cast<std::size_t>(i)])} << (8 * i);
          n = rng() % 2 == 0 ? n + (rng() % 9) - 4 : rng();
          file.replace(0, 8, le64(n));
        }
        break;
      case 2:  // insert a fragment
        file.insert(at, fragment);
        break;
      case 3:  // replace a span by a fragment
        file.replace(at, std::min<std::size_t>(rng() % 10, file.size() - at), fragment);
        break;
      case 4:  // flip a bit
        if (at < file.size()) file[at] = static_cast<char>(file[at] ^ (1 << (rng() % 8)));
        break;
      case 5:  // a digit changed (shapes and offsets)
        if (at < file.size() && file[at] >= '0' && file[at] <= '9')
          file[at] = static_cast<char>('0' + rng() % 10);
        break;
      case 6: {  // duplicate a span (repeated names, keys)
        const std::size_t len = std::min<std::size_t>(rng() % 60, file.size() - at);
        file.insert(at, file.substr(at, len));
        break;
      }
      default:  // delete a span
        file.erase(at, std::min<std::size_t>(rng() % 8, file.size() - at));
        break;
    }
  }
  return file;
}

std::string printable(const std::string& text, std::size_t max = 400) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && out.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (out.size() >= max) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// Loads `file`; returns "" when the outcome is allowed (setting `loaded` when
// it loaded), else what happened.
std::string outcome_error(const fs::path& file, bool& loaded) {
  loaded = false;
  try {
    (void)load_safetensors(file, cpu());
    loaded = true;
    return "";
  } catch (const Error& e) {
    if (e.code() == Errc::invalid_argument) return "";
    return "backplane::Error with code " + std::string(to_string(e.code())) + ": " + e.message();
  } catch (const std::exception& e) {
    return std::string("an exception that is not a backplane::Error: ") + typeid(e).name() + ": " + e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

}  // namespace

TEST_CASE("safetensors_fuzz: mutated files and random bytes load or give invalid_argument, nothing else") {
  const uint64_t seed = fuzz_seed();
  std::mt19937_64 rng(seed);
  TempDir tmp;
  const std::vector<std::string> corpus = seeds(tmp);
  const fs::path file = tmp / "fuzz.safetensors";
  for (const std::string& s : corpus) {
    write_file(file, s);
    REQUIRE_NOTHROW((void)load_safetensors(file, cpu()));
  }

  int iteration = 0;
  int loaded = 0;
  std::string input;
  INFO("seed ", seed, " (rerun with BP_FUZZ_SEED=", seed, "), iteration ", iteration,
       ", input: ", printable(input));
  bool long_run = false;
  const auto deadline = std::chrono::steady_clock::now() + fuzz_budget(long_run);
  int failures = 0;
  for (; (long_run || iteration < kMaxIterations) && std::chrono::steady_clock::now() < deadline &&
         failures < 5;
       ++iteration) {
    if (rng() % 8 == 0) {
      input = random_bytes(rng, 64);
      if (rng() % 2 == 0 && input.size() >= 8) input.replace(0, 8, le64(input.size() - 8 - rng() % 4));
    } else {
      input = mutate(corpus[rng() % corpus.size()], rng);
    }
    write_file(file, input);
    bool ok = false;
    const std::string error = outcome_error(file, ok);
    loaded += ok ? 1 : 0;
    if (!error.empty()) {
      ++failures;
      FAIL_CHECK("seed " << seed << " (rerun with BP_FUZZ_SEED=" << seed << "), iteration " << iteration
                         << ": " << error << "\n  input: " << printable(input));
    }
  }
  MESSAGE("safetensors fuzz: " << iteration << " inputs, " << loaded << " loaded, seed " << seed);
  CHECK(iteration > 0);
  CHECK(loaded > 0);  // some mutations keep a valid file: the whole reader runs, not only its first checks
}
