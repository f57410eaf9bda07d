// backends.json parsing. Every error names the JSON path of the offending
// value ("backends[1].library: expected a string, got number 5").
#include "config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <initializer_list>
#include <set>

namespace backplane::detail {
namespace {

using nlohmann::json;

constexpr int kSchemaVersion = 1;

const std::initializer_list<std::string_view> kTopKeys = {"schema_version", "plugin_dirs", "default_backend",
                                                           "backends"};
const std::initializer_list<std::string_view> kBackendKeys = {"name", "library", "required", "options",
                                                               "collective_fallback"};

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + text;
}

class Checker {
 public:
  explicit Checker(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(Errc::config_error, source_ + ": " + path + ": " + what);
  }

  void known_keys(const json& obj, const std::string& prefix, std::initializer_list<std::string_view> keys) const {
    for (const auto& [key, value] : obj.items()) {
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
      std::string msg = "unknown key";
      std::string_view best;
      std::size_t best_d = 3;
      for (auto k : keys) {
        std::size_t d = edit_distance(key, k);
        if (d < best_d) best_d = d, best = k;
      }
      if (!best.empty()) msg += " (did you mean \"" + std::string(best) + "\"?)";
      msg += "; expected one of:";
      for (auto k : keys) msg += " " + std::string(k);
      fail(prefix.empty() ? key : prefix + "." + key, msg);
    }
  }

  std::string string_at(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "expected a string, got " + describe(v));
    return v.get<std::string>();
  }
  bool bool_at(const json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "expected a boolean (true or false), got " + describe(v));
    return v.get<bool>();
  }

 private:
  std::string source_;
};

CollectiveFallback parse_fallback(const Checker& c, const json& v, const std::string& path) {
  const std::string s = c.string_at(v, path);
  CollectiveFallback f;
  if (s == "error") {
    f.kind = CollectiveFallback::Kind::error;
  } else if (s == "local") {
    f.kind = CollectiveFallback::Kind::local;
  } else if (s.rfind("host:", 0) == 0 && s.size() > 5) {
    // The named backend is checked once every entry is read (parse_config).
    f.kind = CollectiveFallback::Kind::host;
    f.host_backend = s.substr(5);
  } else {
    c.fail(path, "expected \"error\", \"local\" or \"host:<backend>\", got \"" + s + "\"");
  }
  return f;
}

BackendConfig parse_backend(const Checker& c, const json& entry, const std::string& path) {
  BackendConfig b;
  b.path = path;
  b.name = path;
  try {
    if (!entry.is_object()) c.fail(path, "expected an object, got " + describe(entry));
    // Read the name first so later errors are reported under it.
    if (entry.contains("name")) {
      b.name = c.string_at(entry["name"], path + ".name");
      if (b.name.empty()) c.fail(path + ".name", "must not be empty");
    } else {
      c.fail(path, "missing required key \"name\"");
    }
    // `required` next: an entry that fails validation still honours it.
    if (entry.contains("required")) b.required = c.bool_at(entry["required"], path + ".required");
    c.known_keys(entry, path, kBackendKeys);
    if (!entry.contains("library")) c.fail(path, "missing required key \"library\"");
    b.library = c.string_at(entry["library"], path + ".library");
    if (b.library.empty()) c.fail(path + ".library", "must not be empty");
    if (entry.contains("options")) {
      const json& o = entry["options"];
      if (!o.is_object()) c.fail(path + ".options", "expected an object, got " + describe(o));
      b.options_json = o.dump();
    }
    if (entry.contains("collective_fallback"))
      b.fallback = parse_fallback(c, entry["collective_fallback"], path + ".collective_fallback");
  } catch (const Error& e) {
    b.error = e;
  }
  return b;
}

// JSON allows an object to repeat a key and nlohmann keeps the last one, so a
// repeated key would pass silently; it is an error here, named by its path.
class DuplicateKeys {
 public:
  explicit DuplicateKeys(const std::string& source) : source_(source) {}

  bool on_event(json::parse_event_t event, const json& parsed) {
    using E = json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        next_element();
        stack_.push_back(Frame{event == E::array_start, {}, {}, 0});
        break;
      case E::key: {
        Frame& f = stack_.back();
        std::string key = parsed.get<std::string>();
        if (!f.keys.insert(key).second) {
          throw Error(Errc::config_error, source_ + ": " + path(key) + ": duplicate key (each key may appear once)");
        }
        f.current = std::move(key);
        break;
      }
      case E::value:
        next_element();
        break;
      case E::object_end:
      case E::array_end:
        stack_.pop_back();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool array;
    std::set<std::string> keys;
    std::string current;  // the key (objects) or index (arrays) being read
    std::size_t next;     // arrays: index of the next element
  };

  void next_element() {
    if (!stack_.empty() && stack_.back().array) stack_.back().current = std::to_string(stack_.back().next++);
  }

  std::string path(const std::string& key) const {
    std::string out;
    for (std::size_t i = 0; i + 1 < stack_.size(); ++i) {
      if (stack_[i].array) out += "[" + stack_[i].current + "]";
      else out += (out.empty() ? "" : ".") + stack_[i].current;
    }
    return out + (out.empty() ? "" : ".") + key;
  }

  std::string source_;
  std::vector<Frame> stack_;
};

}  // namespace

Config parse_config(std::string_view text, const std::filesystem::path& base_dir, std::string_view source) {
  Config cfg;
  cfg.source = std::string(source);
  cfg.base_dir = base_dir;
  Checker c(cfg.source);

  json root;
  try {
    DuplicateKeys dup(cfg.source);
    root = json::parse(text.begin(), text.end(),
                       [&dup](int, json::parse_event_t event, json& parsed) { return dup.on_event(event, parsed); });
  } catch (const json::parse_error& e) {
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line 3, column 17: ...".
    std::string detail = e.what();
    if (auto pos = detail.find("] "); pos != std::string::npos) detail = detail.substr(pos + 2);
    throw Error(Errc::config_error, cfg.source + ": malformed JSON: " + detail);
  }

  if (!root.is_object()) c.fail("(top level)", "expected a JSON object, got " + describe(root));
  c.known_keys(root, "", kTopKeys);

  if (!root.contains("schema_version")) c.fail("schema_version", "missing (this version reads schema_version 1)");
  const json& sv = root["schema_version"];
  if (!sv.is_number_integer() || sv.get<int64_t>() != kSchemaVersion)
    c.fail("schema_version", "expected 1, got " + describe(sv) + " (this version of backplane reads schema 1)");

  if (root.contains("plugin_dirs")) {
    const json& dirs = root["plugin_dirs"];
    if (!dirs.is_array()) c.fail("plugin_dirs", "expected an array of strings, got " + describe(dirs));
    for (std::size_t i = 0; i < dirs.size(); ++i) {
      std::filesystem::path p = c.string_at(dirs[i], "plugin_dirs[" + std::to_string(i) + "]");
      cfg.plugin_dirs.push_back(p.is_absolute() ? p : base_dir / p);
    }
  }

  if (!root.contains("backends")) c.fail("backends", "missing (an array of backend objects)");
  const json& backends = root["backends"];
  if (!backends.is_array()) c.fail("backends", "expected an array of objects, got " + describe(backends));

  std::map<std::string, std::string> first_seen;  // name -> path
  for (std::size_t i = 0; i < backends.size(); ++i) {
    BackendConfig b = parse_backend(c, backends[i], "backends[" + std::to_string(i) + "]");
    if (!b.error) {
      auto [it, inserted] = first_seen.emplace(b.name, b.path);
      if (!inserted) {
        b.error = Error(Errc::config_error, cfg.source + ": " + b.path + ".name: duplicate backend name \"" + b.name +
                                                "\" (first defined at " + it->second +
                                                "); backend names must be unique");
      }
    }
    cfg.backends.push_back(std::move(b));
  }

  // host:<backend> must name another entry that does not itself stage
  // (staging chains would hide a missing capability behind another one).
  for (BackendConfig& b : cfg.backends) {
    if (b.error || b.fallback.kind != CollectiveFallback::Kind::host) continue;
    const std::string where = cfg.source + ": " + b.path + ".collective_fallback: \"host:" + b.fallback.host_backend + "\": ";
    auto target = std::find_if(cfg.backends.begin(), cfg.backends.end(),
                               [&](const BackendConfig& o) { return o.name == b.fallback.host_backend; });
    if (b.fallback.host_backend == b.name) {
      b.error = Error(Errc::config_error, where + "a backend cannot stage through itself; name a backend whose devices "
                                                  "have the 'collective' capability (e.g. \"host:cpu\")");
    } else if (target == cfg.backends.end()) {
      std::string names;
      for (const BackendConfig& o : cfg.backends)
        if (o.name != b.name) names += (names.empty() ? "" : ", ") + ("\"" + o.name + "\"");
      b.error = Error(Errc::config_error, where + "no backend named \"" + b.fallback.host_backend +
                                              "\" in this file" + (names.empty() ? "" : " (configured: " + names + ")"));
    } else if (target->fallback.kind == CollectiveFallback::Kind::host) {
      b.error = Error(Errc::config_error, where + "\"" + target->name + "\" (" + target->path +
                                              ") itself stages through \"" + target->fallback.host_backend +
                                              "\"; stage through a backend that has 'collective' directly");
    }
  }

  if (root.contains("default_backend")) {
    cfg.default_backend = c.string_at(root["default_backend"], "default_backend");
    bool known = std::any_of(cfg.backends.begin(), cfg.backends.end(),
                             [&](const BackendConfig& b) { return b.name == cfg.default_backend; });
    if (!known) c.fail("default_backend", "\"" + cfg.default_backend + "\" is not the name of any entry in backends");
  }
  return cfg;
}

}  // namespace backplane::detail
