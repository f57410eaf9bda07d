// Helpers shared by the core's unit tests: where the fixtures are, unique
// temporary directories, scoped environment variables, log capture, and
// checks on backplane::Error codes and messages.
#ifndef BACKPLANE_TESTS_TEST_SUPPORT_HPP_
#define BACKPLANE_TESTS_TEST_SUPPORT_HPP_

#include <backplane/backplane.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

#ifndef BP_TEST_FIXTURE_DIR
#error "BP_TEST_FIXTURE_DIR must name the directory of the fixture plugins"
#endif
#ifndef BP_TEST_PLUGIN_DIR
#error "BP_TEST_PLUGIN_DIR must name the directory of the real plugins"
#endif

namespace doctest {
template <>
struct StringMaker<backplane::Errc> {
  static String convert(backplane::Errc code) { return backplane::to_string(code); }
};
template <>
struct StringMaker<backplane::Backend::Status> {
  static String convert(backplane::Backend::Status s) {
    switch (s) {
      case backplane::Backend::Status::loaded:
        return "loaded";
      case backplane::Backend::Status::unavailable:
        return "unavailable";
      case backplane::Backend::Status::failed:
        return "failed";
    }
    return "failed";
  }
};
template <>
struct StringMaker<backplane::Shape> {
  static String convert(const backplane::Shape& s) { return s.to_string().c_str(); }
};
template <>
struct StringMaker<backplane::DType> {
  static String convert(backplane::DType d) { return std::string(backplane::to_string(d)).c_str(); }
};
template <>
struct StringMaker<backplane::Capabilities> {
  static String convert(const backplane::Capabilities& c) { return c.to_string().c_str(); }
};
template <>
struct StringMaker<std::optional<backplane::Errc>> {
  static String convert(const std::optional<backplane::Errc>& c) {
    return c ? backplane::to_string(*c) : "nullopt";
  }
};
}  // namespace doctest

namespace bptest {

namespace fs = std::filesystem;

inline fs::path fixture_dir() { return fs::path(BP_TEST_FIXTURE_DIR); }
inline fs::path plugin_dir() { return fs::path(BP_TEST_PLUGIN_DIR); }
// "good_c" -> <fixture dir>/libgood_c.so
inline fs::path fixture(std::string_view name) { return fixture_dir() / ("lib" + std::string(name) + ".so"); }

// JSON string literal for a path or text (quotes and backslashes escaped).
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}
inline std::string json_path(const fs::path& p) { return json_string(p.string()); }

// A directory unique to this process and call, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<unsigned> counter{0};
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
      fs::path p =
          fs::temp_directory_path() / ("backplane-test-" + std::to_string(::getpid()) + "-" +
                                       std::to_string(counter++) + "-" + std::to_string(rd() % 1000000));
      if (fs::create_directory(p)) {
        path_ = p;
        return;
      }
    }
    FAIL("could not create a temporary directory");
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const fs::path& path() const { return path_; }
  fs::path operator/(std::string_view rel) const { return path_ / rel; }

  // Creates (with parents) the directory `rel` inside this one.
  fs::path mkdir(std::string_view rel) const {
    fs::path p = path_ / rel;
    fs::create_directories(p);
    return p;
  }
  // Writes text to `rel`, creating parents.
  fs::path write(std::string_view rel, std::string_view text) const {
    fs::path p = path_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary);
    out << text;
    REQUIRE(out.good());
    return p;
  }
  // Copies a fixture plugin to `rel` (a real copy, not a link: the loader may
  // canonicalise paths, and a copy keeps each location distinguishable).
  fs::path copy_fixture(std::string_view fixture_name, std::string_view rel) const {
    fs::path p = path_ / rel;
    fs::create_directories(p.parent_path());
    fs::copy_file(fixture(fixture_name), p, fs::copy_options::overwrite_existing);
    return p;
  }

 private:
  fs::path path_;
};

// Sets (or unsets, with nullopt) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value) {
      ::setenv(name_.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Captures log messages for a scope; restores the default handler and level.
class LogCapture {
 public:
  explicit LogCapture(backplane::LogLevel min_level = backplane::LogLevel::info) {
    backplane::set_log_level(min_level);
    backplane::set_log_handler([this](backplane::LogLevel level, std::string_view message) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.emplace_back(level, std::string(message));
    });
  }
  ~LogCapture() {
    backplane::set_log_handler({});
    backplane::set_log_level(backplane::LogLevel::info);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    lines_.clear();
  }
  // Messages at exactly `level` (all of them when substring is empty,
  // otherwise those containing it).
  std::vector<std::string> at(backplane::LogLevel level, std::string_view substring = {}) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [l, m] : lines_)
      if (l == level && m.find(substring) != std::string::npos) out.push_back(m);
    return out;
  }
  std::string all() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out;
    for (const auto& line : lines_) out += line.second + "\n";
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<backplane::LogLevel, std::string>> lines_;
};

// Runs fn, which must throw backplane::Error; returns it. Any other outcome
// fails the test (and returns an Error with code internal and an empty message).
template <class Fn>
backplane::Error error_from(Fn&& fn) {
  try {
    fn();
  } catch (const backplane::Error& e) {
    return e;
  } catch (const std::exception& e) {
    FAIL_CHECK("expected backplane::Error, got std::exception: " << std::string(e.what()));
    return backplane::Error(backplane::Errc::internal, "");
  }
  FAIL_CHECK("expected backplane::Error, nothing was thrown");
  return backplane::Error(backplane::Errc::internal, "");
}

// CHECKs that `text` contains `part`, printing both when it does not.
#define BP_CHECK_CONTAINS(text, part)                                          \
  do {                                                                         \
    const std::string bp_text_ = (text);                                       \
    const std::string bp_part_ = (part);                                       \
    CHECK_MESSAGE(bp_text_.find(bp_part_) != std::string::npos,                \
                  "expected to find \"" << bp_part_ << "\" in: " << bp_text_); \
  } while (0)

// One backend entry of a config.
inline std::string backend_json(std::string_view name, std::string_view library, bool required = false,
                                std::string_view extra = {}) {
  std::string out = "{\"name\": " + json_string(name) + ", \"library\": " + json_string(library) +
                    ", \"required\": " + (required ? "true" : "false");
  if (!extra.empty()) out += ", " + std::string(extra);
  return out + "}";
}

// A whole config: plugin_dirs = [fixture dir, plugin dir] plus `backends`.
inline std::string config_json(const std::vector<std::string>& backends,
                               std::string_view extra_top_level = {}) {
  std::string out = "{\n  \"schema_version\": 1,\n  \"plugin_dirs\": [" + json_path(fixture_dir()) + ", " +
                    json_path(plugin_dir()) + "],\n";
  if (!extra_top_level.empty()) out += "  " + std::string(extra_top_level) + ",\n";
  out += "  \"backends\": [\n";
  for (std::size_t i = 0; i < backends.size(); ++i)
    out += "    " + backends[i] + (i + 1 < backends.size() ? ",\n" : "\n");
  return out + "  ]\n}\n";
}

// Loads `json` with from_json, base_dir = the fixture dir, policy = report
// unless told otherwise.
inline backplane::Registry load(const std::string& json,
                                backplane::RequiredPolicy policy = backplane::RequiredPolicy::report) {
  return backplane::Registry::from_json(json, fixture_dir(), "test", policy);
}

// A backend's row for messages: name, status, code and reason.
inline std::string describe(const backplane::Backend& b) {
  std::ostringstream out;
  out << b.name() << ": " << doctest::StringMaker<backplane::Backend::Status>::convert(b.status());
  if (b.error_code()) out << " [" << backplane::to_string(*b.error_code()) << "] " << b.error();
  return out.str();
}

// Asserts `b` failed with `code`; returns its message for further checks.
inline std::string expect_failed(const backplane::Backend& b, backplane::Errc code) {
  INFO(describe(b));
  CHECK(b.status() == backplane::Backend::Status::failed);
  CHECK(!b.loaded());
  CHECK(b.error_code() == std::optional<backplane::Errc>(code));
  CHECK(!b.error().empty());
  return b.error();
}

// Asserts `b` loaded cleanly.
inline void expect_loaded(const backplane::Backend& b) {
  INFO(describe(b));
  REQUIRE(b.status() == backplane::Backend::Status::loaded);
  CHECK(b.error().empty());
  CHECK(!b.error_code().has_value());
}

// Proves a device computes: [2,3] + [3] (broadcast) on f32, read back.
inline void expect_adds(const backplane::Device& device) {
  using backplane::Tensor;
  Tensor a = Tensor::from_vector<float>(device, {2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from_vector<float>(device, {3}, {10, 20, 30});
  Tensor c = backplane::add(a, b);
  CHECK(c.shape() == backplane::Shape{2, 3});
  CHECK(c.to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
}

}  // namespace bptest

#endif  // BACKPLANE_TESTS_TEST_SUPPORT_HPP_
