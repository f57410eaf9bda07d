// A bounded fuzzer for backends.json: mutated valid configs and random bytes
// (deep nesting, huge numbers, NUL, bad UTF-8, truncation, duplicate keys,
// wrong types) fed to Registry::from_json and from_config. The only outcomes
// allowed are a registry or a backplane::Error with Errc::config_error: no
// other exception, no crash, no hang. The seed is fixed, so a failure repeats;
// BP_FUZZ_SEED=<n> tries another one, and every failure prints its seed.
// BP_FUZZ_SECONDS=<n> runs for n seconds instead of 3 (a long run; no
// iteration cap then).
#include "test_support.hpp"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>

using namespace backplane;
using namespace bptest;

namespace {

constexpr uint64_t kDefaultSeed = 0x6261636b706c616eULL;  // "backplan"
constexpr auto kTimeBudget = std::chrono::seconds(3);
constexpr int kMaxIterations = 200000;

// The time budget, and whether BP_FUZZ_SECONDS asked for a long run.
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

// Valid configs the mutations start from. Their libraries never load plugin
// code that misbehaves: good_c, or a name that resolves nowhere.
std::vector<std::string> seeds() {
  return {
      config_json({backend_json("good", "good_c")}),
      config_json({backend_json("a", "good_c", true, "\"options\": {\"x\": [1, 2.5, -3e7, null, true]}"),
                   backend_json("b", "no_such_library_anywhere", false,
                                "\"collective_fallback\": \"host:a\", \"op_fallback\": \"host:a\"")},
                  "\"default_backend\": \"a\""),
      "{\"schema_version\": 1, \"backends\": []}",
      "{\"schema_version\": 1, \"plugin_dirs\": [\"lib\", \"/nowhere\"], \"backends\": [{\"name\": "
      "\"n.1-x_\", "
      "\"library\": \"no_such_library_anywhere\", \"collective_fallback\": \"local\"}]}",
  };
}

// Fragments spliced into documents: JSON's structure, hostile numbers and
// strings, and values of every type.
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
    "false",
    "0",
    "-0",
    "1e400",
    "-1e400",
    "1e-400",
    "18446744073709551616",
    "-9223372036854775809",
    "99999999999999999999999999999",
    "0.1e99999",
    "NaN",
    "Infinity",
    "\"name\"",
    "\"library\"",
    "\"required\"",
    "\"options\"",
    "\"backends\"",
    "\"schema_version\"",
    "\"default_backend\"",
    "\"plugin_dirs\"",
    "\"collective_fallback\"",
    "\"op_fallback\"",
    "\"host:\"",
    "\"host:good\"",
    "\"requird\"",
    "\"\\u0000\"",
    std::string("\"a\0b\"", 5),
    "\"\xff\xfe\"",
    "\"\xc0\x80\"",
    "\"\\ud800\"",
    "\"\\udc00\\ud800\"",
    "\"\xed\xa0\x80\"",
    "\"\x1b[31m\"",
    "\"a\nb\"",
    "[]",
    "{}",
    "[[[[[[[[",
    "]]]]]]]]",
    "{\"a\":{\"a\":{\"a\":",
    "\"good\"",
    "\"good_c\"",
    "2",
    "\"1\"",
    "[\"x\"]",
    "{\"name\": 1}",
};

std::string random_bytes(std::mt19937_64& rng, std::size_t max) {
  std::string out(std::uniform_int_distribution<std::size_t>(0, max)(rng), '\0');
  for (char& c : out) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
  return out;
}

std::string deep_nesting(std::mt19937_64& rng) {
  static const std::size_t kDepths[] = {63, 64, 65, 100, 1000, 100000};
  const std::size_t depth =
      kDepths[std::uniform_int_distribution<std::size_t>(0, std::size(kDepths) - 1)(rng)];
  const bool arrays = rng() % 2 == 0;
  const bool closed = rng() % 2 == 0;
  std::string inner;
  for (std::size_t i = 0; i < depth; ++i) inner += arrays ? "[" : "{\"k\":";
  inner += "1";
  if (closed)
    for (std::size_t i = 0; i < depth; ++i) inner += arrays ? "]" : "}";
  switch (rng() % 3) {
    case 0:
      return inner;
    case 1:
      return "{\"schema_version\": 1, \"backends\": " + inner + "}";
    default:
      return "{\"schema_version\": 1, \"backends\": [{\"name\": \"x\", \"library\": \"good_c\", "
             "\"options\": " +
             inner + "}]}";
  }
}

std::string mutate(std::string doc, std::mt19937_64& rng) {
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    const std::size_t at = doc.empty() ? 0 : rng() % (doc.size() + 1);
    const std::string& fragment = kFragments[rng() % kFragments.size()];
    switch (rng() % 7) {
      case 0:  // truncate
        doc.resize(at);
        break;
      case 1:  // insert a fragment
        doc.insert(at, fragment);
        break;
      case 2:  // replace a span by a fragment (a value of another type, a huge number, ...)
        doc.replace(at, std::min<std::size_t>(rng() % 12, doc.size() - at), fragment);
        break;
      case 3:  // flip a byte
        if (at < doc.size()) doc[at] = static_cast<char>(doc[at] ^ (1 << (rng() % 8)));
        break;
      case 4:  // a raw NUL or a bad UTF-8 byte
        doc.insert(at, 1, rng() % 2 == 0 ? '\0' : static_cast<char>(0x80 + rng() % 0x80));
        break;
      case 5: {  // duplicate a span (duplicate keys, entries, brackets)
        const std::size_t len = std::min<std::size_t>(rng() % 40, doc.size() - at);
        doc.insert(at, doc.substr(at, len));
        break;
      }
      default:  // delete a span
        doc.erase(at, std::min<std::size_t>(rng() % 8, doc.size() - at));
        break;
    }
  }
  return doc;
}

// The input, printable: escapes for control bytes and non-ASCII, cut to `max`.
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

// Feeds `doc` to the API; returns "" when the outcome is allowed, else what happened.
std::string outcome_error(const std::function<void()>& feed) {
  try {
    feed();
    return "";
  } catch (const Error& e) {
    if (e.code() == Errc::config_error) return "";
    return "backplane::Error with code " + std::string(to_string(e.code())) + ": " + e.message();
  } catch (const std::exception& e) {
    return std::string("an exception that is not a backplane::Error: ") + typeid(e).name() + ": " + e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

}  // namespace

TEST_CASE("config_fuzz: mutated configs and random bytes yield a registry or config_error, nothing else") {
  const uint64_t seed = fuzz_seed();
  std::mt19937_64 rng(seed);
  const std::vector<std::string> corpus = seeds();
  TempDir tmp;
  const fs::path file = tmp / "backends.json";

  int iteration = 0;
  std::string input;
  // Shown with any failure, a crash included (doctest prints the context then).
  INFO("seed ", seed, " (rerun with BP_FUZZ_SEED=", seed, "), iteration ", iteration,
       ", input: ", printable(input));
  bool long_run = false;
  const auto deadline = std::chrono::steady_clock::now() + fuzz_budget(long_run);
  int failures = 0;
  for (; (long_run || iteration < kMaxIterations) && std::chrono::steady_clock::now() < deadline &&
         failures < 5;
       ++iteration) {
    switch (rng() % 8) {
      case 0:
        input = random_bytes(rng, 256);
        break;
      case 1:
        input = deep_nesting(rng);
        break;
      default:
        input = mutate(corpus[rng() % corpus.size()], rng);
        break;
    }
    std::string error;
    if (rng() % 16 == 0) {
      // Through a file: the same parser behind from_config's own checks.
      {
        std::ofstream out(file, std::ios::binary | std::ios::trunc);
        out.write(input.data(), static_cast<std::streamsize>(input.size()));
      }
      error = outcome_error([&] { (void)Registry::from_config(file, RequiredPolicy::report); });
    } else {
      error = outcome_error(
          [&] { (void)Registry::from_json(input, fixture_dir(), "fuzz", RequiredPolicy::report); });
    }
    if (!error.empty()) {
      ++failures;
      FAIL_CHECK("seed " << seed << " (rerun with BP_FUZZ_SEED=" << seed << "), iteration " << iteration
                         << ": " << error << "\n  input: " << printable(input));
    }
  }
  MESSAGE("config fuzz: " << iteration << " inputs, seed " << seed);
  CHECK(iteration > 0);
}
