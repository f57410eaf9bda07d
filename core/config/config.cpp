// backends.json parsing. Every error names the JSON path of the offending
// value ("backends[1].library: expected a string, got number 5"), and any
// error makes the whole file invalid.
#include "config/config.hpp"
#include "common/suggest.hpp"
#include "common/utf8.hpp"

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <set>
#include <unordered_map>

namespace backplane::detail {
namespace {

using nlohmann::json;

constexpr int kSchemaVersion = 1;

const std::initializer_list<std::string_view> kTopKeys = {"schema_version", "plugin_dirs", "default_backend",
                                                          "backends", "torch_devices"};
// The torch device types whose tensors the PyTorch bridge can hand a backend.
const std::initializer_list<std::string_view> kTorchDeviceKeys = {"cpu", "cuda"};
const std::initializer_list<std::string_view> kBackendKeys = {
    "name", "library", "required", "options", "collective_fallback", "op_fallback"};

std::string describe(const json& v) {
  if (v.is_null()) return "null";  // not "null null"
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + text;
}

// A string as JSON writes it: quoted, control characters escaped, so a value
// from the file cannot move the cursor or recolour a terminal.
std::string quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// "U+000A" for the code point starting at s[i] (UTF-8, valid after parsing);
// `len` receives its length in bytes.
std::string code_point_at(std::string_view s, std::size_t i, std::size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  uint32_t cp = c;
  len = 1;
  if (c >= 0xF0)
    len = 4, cp = c & 0x07;
  else if (c >= 0xE0)
    len = 3, cp = c & 0x0F;
  else if (c >= 0xC0)
    len = 2, cp = c & 0x1F;
  if (i + len > s.size()) len = 1;
  for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
  return buf;
}

class Checker {
 public:
  explicit Checker(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(Errc::config_error, source_ + ": " + path + ": " + what);
  }

  void known_keys(const json& obj, const std::string& prefix,
                  std::initializer_list<std::string_view> keys) const {
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
      const std::string shown = quote(key).substr(1, quote(key).size() - 2);
      fail(prefix.empty() ? shown : prefix + "." + shown, msg);
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
  // An integer in int64 range (JSON has one number type; nlohmann keeps
  // integers beyond int64 as unsigned or as double).
  int64_t int_at(const json& v, const std::string& path) const {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(path, "integer out of range: " + describe(v) + " does not fit in a signed 64-bit integer");
    if (!v.is_number_integer()) fail(path, "expected an integer, got " + describe(v));
    return v.get<int64_t>();
  }

  // [A-Za-z0-9_.-], 1..kMaxBackendName characters.
  void backend_name(const std::string& name, const std::string& path) const {
    if (name.empty()) fail(path, "must not be empty");
    if (name.size() > kMaxBackendName)
      fail(path, "is " + std::to_string(name.size()) + " bytes long; a backend name has at most " +
                     std::to_string(kMaxBackendName) + " characters");
    for (std::size_t i = 0; i < name.size();) {
      const char ch = name[i];
      if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '-') {
        ++i;
        continue;
      }
      std::size_t len = 1;
      const std::string cp = code_point_at(name, i, len);
      fail(path, "character " + cp + " at byte " + std::to_string(i) + " of " + quote(name) +
                     " is not allowed; a backend name uses only letters, digits, '_', '.' and '-' "
                     "(it appears in device ids such as \"cpu:0\")");
    }
  }

 private:
  std::string source_;
};

// "host:<backend>" -> <backend> (non-empty); anything else -> nullopt. The
// named backend is checked once every entry is read (check_host_target).
std::optional<std::string> host_target(const std::string& s) {
  if (s.size() > 5 && s.compare(0, 5, "host:") == 0) return s.substr(5);
  return std::nullopt;
}

CollectiveFallback parse_fallback(const Checker& c, const json& v, const std::string& path) {
  const std::string s = c.string_at(v, path);
  CollectiveFallback f;
  if (s == "error") {
    f.kind = CollectiveFallback::Kind::error;
  } else if (s == "local") {
    f.kind = CollectiveFallback::Kind::local;
  } else if (auto host = host_target(s)) {
    f.kind = CollectiveFallback::Kind::host;
    f.host_backend = *host;
  } else {
    c.fail(path, "expected \"error\", \"local\" or \"host:<backend>\", got " + quote(s));
  }
  return f;
}

OpFallback parse_op_fallback(const Checker& c, const json& v, const std::string& path) {
  const std::string expected = "expected \"error\" or \"host:<backend>\", got ";
  if (!v.is_string()) c.fail(path, expected + describe(v));
  const std::string s = v.get<std::string>();
  OpFallback f;
  if (auto host = host_target(s)) {
    f.kind = OpFallback::Kind::host;
    f.host_backend = *host;
  } else if (s != "error") {
    c.fail(path, expected + quote(s));
  }
  return f;
}

BackendConfig parse_backend(const Checker& c, const json& entry, const std::string& path) {
  BackendConfig b;
  b.path = path;
  if (!entry.is_object()) c.fail(path, "expected an object, got " + describe(entry));
  c.known_keys(entry, path, kBackendKeys);
  if (!entry.contains("name")) c.fail(path, "missing required key \"name\"");
  b.name = c.string_at(entry["name"], path + ".name");
  c.backend_name(b.name, path + ".name");
  if (entry.contains("required")) b.required = c.bool_at(entry["required"], path + ".required");
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
  if (entry.contains("op_fallback"))
    b.op_fallback = parse_op_fallback(c, entry["op_fallback"], path + ".op_fallback");
  return b;
}

// A config that is not UTF-8, at `offset`: named by offset, line and column.
[[noreturn, gnu::cold]] void not_utf8(const std::string& source, std::string_view text, std::size_t offset) {
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < offset; ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[offset])));
  throw Error(Errc::config_error,
              source + ": not UTF-8: the byte " + byte + " at offset " + std::to_string(offset) + " (line " +
                  std::to_string(line) + ", column " + std::to_string(offset - line_start + 1) +
                  ") is not part of a UTF-8 character; a backends.json is UTF-8 text: save it "
                  "as UTF-8");
}

// Sees every parse event before the document is built. It refuses what the
// schema can never accept, with its path: a key repeated in one object (JSON
// allows it and nlohmann keeps the last one silently), nesting deeper than
// kMaxConfigDepth (refused before it is built, so nothing recurses on it),
// and a NUL in any key or string.
class ParseGuard {
 public:
  explicit ParseGuard(const std::string& source) : source_(source) {}

  bool on_event(json::parse_event_t event, const json& parsed) {
    using E = json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        next_element();
        if (stack_.size() >= kMaxConfigDepth) {
          fail(path(""), "nested deeper than " + std::to_string(kMaxConfigDepth) +
                             " arrays and objects, the limit (docs/configuration.md#validation); a "
                             "backends.json needs a few levels, so flatten this value");
        }
        stack_.push_back(Frame{event == E::array_start, {}, {}, 0});
        break;
      case E::key: {
        Frame& f = stack_.back();
        std::string key = parsed.get<std::string>();
        if (key.find('\0') != std::string::npos) fail(path(shown(key)), nul_message("key"));
        if (!f.keys.insert(key).second) fail(path(shown(key)), "duplicate key (each key may appear once)");
        f.current = shown(key);
        break;
      }
      case E::value:
        next_element();
        if (parsed.is_string() && parsed.get_ref<const std::string&>().find('\0') != std::string::npos)
          fail(path(""), nul_message("string"));
        break;
      case E::object_end:
      case E::array_end:
        stack_.pop_back();
        break;
    }
    return true;
  }

  // The path of the value the parser is reading now (for errors the parser
  // raises itself, such as a number out of range).
  std::string pending_path() const {
    if (stack_.empty()) return "(top level)";
    const Frame& f = stack_.back();
    return path(f.array ? "[" + std::to_string(f.next) + "]" : f.current);
  }

 private:
  struct Frame {
    bool array;
    std::set<std::string> keys;
    std::string current;  // the key (objects, as shown) or index (arrays) being read
    std::size_t next;     // arrays: index of the next element
  };

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw Error(Errc::config_error, source_ + ": " + (where.empty() ? "(top level)" : where) + ": " + what);
  }

  static std::string nul_message(const char* what) {
    return std::string("the ") + what +
           " contains a NUL character (U+0000, written \\u0000); C strings end there, so it is refused: "
           "remove it";
  }

  // A key as it appears in a path: control characters escaped, long keys cut.
  static std::string shown(const std::string& key) {
    if (key.empty()) return "\"\"";
    std::string q = quote(key);
    q = q.substr(1, q.size() - 2);
    if (q.size() > 64) q = q.substr(0, 61) + "...";
    return q;
  }

  void next_element() {
    if (!stack_.empty() && stack_.back().array) stack_.back().current = std::to_string(stack_.back().next++);
  }

  // The path of `key` inside the innermost container; with `key` empty, of
  // the element being read now. Deep paths keep their first and last levels.
  std::string path(const std::string& key) const {
    std::vector<std::string> parts;
    const std::size_t levels = key.empty() ? stack_.size() : stack_.size() - 1;
    for (std::size_t i = 0; i < levels; ++i)
      parts.push_back(stack_[i].array ? "[" + stack_[i].current + "]" : stack_[i].current);
    if (!key.empty()) parts.push_back(key);
    std::string out;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (parts.size() > 12 && i == 6) {
        out += "...";
        i = parts.size() - 4;
      }
      const std::string& p = parts[i];
      out += (p[0] == '[' || out.empty()) ? p : "." + p;
    }
    return out;
  }

  std::string source_;
  std::vector<Frame> stack_;
};

// The configured names other than `skip`, quoted ("\"cpu\", \"gpu\""), and
// the one closest to `wanted` when it is close enough to be a typo ("" else).
void names_near(const Config& cfg, const std::string& wanted, const std::string& skip, std::string& names,
                std::string& best) {
  std::size_t best_d = std::max<std::size_t>(3, wanted.size() / 3 + 1);
  for (const BackendConfig& b : cfg.backends) {
    if (b.name == skip) continue;
    names += (names.empty() ? "" : ", ") + quote(b.name);
    const std::size_t d = edit_distance(wanted, b.name);
    if (d < best_d) best_d = d, best = b.name;
  }
}

// One key whose value may be "host:<backend>" (collective_fallback,
// op_fallback), and the words its messages use.
struct HostKey {
  std::string key;                               // "op_fallback"
  std::string verb;                              // "fall back to"
  std::string verbs;                             // "falls back to"
  std::string self_fix;                          // the remedy when an entry names itself
  std::string chain_fix;                         // the remedy when the target itself names a host
  std::string (*host_of)(const BackendConfig&);  // an entry's host: target, "" when it has none
};

// The rules every host:<backend> shares: it names another entry of this file,
// and that entry's own `key` is not host: (no chains, hence no cycles).
void check_host_target(const Checker& c, const Config& cfg, const BackendConfig& b, const HostKey& k) {
  const std::string host = k.host_of(b);
  if (host.empty()) return;
  const std::string path = b.path + "." + k.key;
  const std::string what = quote("host:" + host) + ": ";
  if (host == b.name) c.fail(path, what + "a backend cannot " + k.verb + " itself; " + k.self_fix);
  auto target = std::find_if(cfg.backends.begin(), cfg.backends.end(),
                             [&](const BackendConfig& o) { return o.name == host; });
  if (target == cfg.backends.end()) {
    std::string names, best;
    names_near(cfg, host, b.name, names, best);
    c.fail(path, what + "no backend named " + quote(host) + " in this file" +
                     (best.empty() ? "" : " (did you mean " + quote("host:" + best) + "?)") +
                     (names.empty() ? "" : "; configured: " + names));
  }
  const std::string next = k.host_of(*target);
  if (!next.empty())
    c.fail(path, what + quote(target->name) + " (" + target->path + "." + k.key + ") itself " + k.verbs +
                     " " + quote(next) + "; " + k.chain_fix);
}

std::string collective_host(const BackendConfig& b) {
  return b.fallback.kind == CollectiveFallback::Kind::host ? b.fallback.host_backend : std::string();
}
std::string op_host(const BackendConfig& b) {
  return b.op_fallback.kind == OpFallback::Kind::host ? b.op_fallback.host_backend : std::string();
}

const HostKey kCollectiveHost{
    "collective_fallback",
    "stage through",
    "stages through",
    "name a backend whose devices have the 'collective' capability (e.g. \"host:cpu\")",
    "stage through a backend that has 'collective' directly",
    collective_host};
const HostKey kOpHost{"op_fallback",
                      "fall back to",
                      "falls back to",
                      "name another backend, whose device 0 runs the ops and holds the dtypes this one lacks "
                      "(e.g. \"host:cpu\")",
                      "op_fallback does not chain (so fallbacks cannot form a cycle): name a backend whose "
                      "op_fallback is \"error\"",
                      op_host};

std::string owner_fix(const std::filesystem::path& p) {
  return "(anyone who can write it could make this process load code of their choosing); fix it with "
         "`chmod go-w " +
         p.string() + "`";
}

}  // namespace

}  // namespace backplane::detail

namespace backplane {

// The spelling backends.json uses for each kind (parse_fallback reads it back).
std::string to_string(CollectiveFallback::Kind kind) {
  switch (kind) {
    case CollectiveFallback::Kind::error:
      return "error";
    case CollectiveFallback::Kind::local:
      return "local";
    case CollectiveFallback::Kind::host:
      return "host";
  }
  return "unknown";
}

std::string to_string(const CollectiveFallback& fallback) { return fallback.to_string(); }

std::ostream& operator<<(std::ostream& out, CollectiveFallback::Kind kind) { return out << to_string(kind); }

std::ostream& operator<<(std::ostream& out, const CollectiveFallback& fallback) {
  return out << to_string(fallback);
}

// "error" / "host:<backend>", as backends.json spells them (parse_op_fallback reads it back).
std::string OpFallback::to_string() const {
  switch (kind) {
    case Kind::error:
      return "error";
    case Kind::host:
      return "host:" + host_backend;
  }
  return "error";
}

std::string to_string(const OpFallback& fallback) { return fallback.to_string(); }

std::ostream& operator<<(std::ostream& out, const OpFallback& fallback) { return out << to_string(fallback); }

}  // namespace backplane

namespace backplane::detail {

void require_private_file(const std::filesystem::path& file, std::string_view what, Errc code) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path real = fs::canonical(file, ec);
  if (ec) real = fs::absolute(file, ec);
  const uid_t me = ::geteuid();
  auto check = [&](const fs::path& p, bool is_dir) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return;  // reading it will report the problem
    const std::string kind =
        is_dir ? "the folder holding " + std::string(what) + " " + file.string() + ", " : "";
    const std::string name = is_dir ? kind + p.string() + "," : std::string(what) + " " + p.string();
    if (st.st_uid != 0 && st.st_uid != me)
      throw Error(code, name + " is owned by another user (uid " + std::to_string(st.st_uid) +
                            "), who could change it; it is refused. Make it yours or root's (`chown` it) "
                            "and `chmod go-w " +
                            p.string() + "`");
    const bool sticky_dir = is_dir && (st.st_mode & S_ISVTX) != 0;
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !sticky_dir)
      throw Error(code, name + " is writable by " +
                            ((st.st_mode & S_IWOTH) != 0 ? std::string("anyone") : std::string("its group")) +
                            ", so it is refused " + owner_fix(p));
  };
  check(real, false);
  check(real.parent_path(), true);
}

Config parse_config(std::string_view text, const std::filesystem::path& base_dir, std::string_view source) {
  Config cfg;
  cfg.source = std::string(source);
  cfg.base_dir = base_dir;
  Checker c(cfg.source);

  if (text.size() > kMaxConfigBytes) {
    throw Error(Errc::config_error,
                cfg.source + ": " + std::to_string(text.size()) + " bytes is larger than the " +
                    std::to_string(kMaxConfigBytes) +
                    "-byte limit (1 MiB; docs/configuration.md#validation); a backends.json "
                    "is a few kilobytes: remove what it does not need");
  }

  json root;
  ParseGuard guard(cfg.source);
  try {
    root = json::parse(text.begin(), text.end(), [&guard](int, json::parse_event_t event, json& parsed) {
      return guard.on_event(event, parsed);
    });
  } catch (const json::parse_error& e) {
    // JSON text is UTF-8: a byte that is not is named by its offset, never quoted raw.
    if (const std::size_t bad = first_invalid_utf8(text); bad != std::string::npos)
      not_utf8(cfg.source, text, bad);
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line 3, column 17: ...".
    std::string what = e.what();
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    throw Error(Errc::config_error, cfg.source + ": malformed JSON: " + escape_invalid_utf8(what));
  } catch (const json::exception& e) {
    // out_of_range.406: "number overflow parsing '1e400'".
    std::string detail = e.what();
    if (auto pos = detail.find("] "); pos != std::string::npos) detail = detail.substr(pos + 2);
    throw Error(Errc::config_error, cfg.source + ": " + guard.pending_path() + ": number out of range (" +
                                        detail + "); use a number a 64-bit double or integer can hold");
  }

  if (!root.is_object()) c.fail("(top level)", "expected a JSON object, got " + describe(root));
  c.known_keys(root, "", kTopKeys);

  if (!root.contains("schema_version"))
    c.fail("schema_version", "missing (this version reads schema_version 1)");
  const json& sv = root["schema_version"];
  if (c.int_at(sv, "schema_version") != kSchemaVersion)
    c.fail("schema_version",
           "expected 1, got " + describe(sv) + " (this version of backplane reads schema 1)");

  if (root.contains("plugin_dirs")) {
    const json& dirs = root["plugin_dirs"];
    if (!dirs.is_array()) c.fail("plugin_dirs", "expected an array of strings, got " + describe(dirs));
    cfg.plugin_dirs.reserve(dirs.size());
    for (std::size_t i = 0; i < dirs.size(); ++i) {
      const std::string at = "plugin_dirs[" + std::to_string(i) + "]";
      std::filesystem::path p = c.string_at(dirs[i], at);
      if (p.empty()) c.fail(at, "must not be empty");
      cfg.plugin_dirs.push_back(p.is_absolute() ? p : base_dir / p);
    }
  }

  if (!root.contains("backends")) c.fail("backends", "missing (an array of backend objects)");
  const json& backends = root["backends"];
  if (!backends.is_array()) c.fail("backends", "expected an array of objects, got " + describe(backends));

  std::unordered_map<std::string, std::string> first_seen;  // name -> path
  for (std::size_t i = 0; i < backends.size(); ++i) {
    BackendConfig b = parse_backend(c, backends[i], "backends[" + std::to_string(i) + "]");
    auto [it, inserted] = first_seen.emplace(b.name, b.path);
    if (!inserted)
      c.fail(b.path + ".name", "duplicate backend name \"" + b.name + "\" (first defined at " + it->second +
                                   "); backend names must be unique");
    cfg.backends.push_back(std::move(b));
  }

  // host:<backend> must name another entry that does not itself name a host
  // (chains would hide a missing capability behind another one, and cycle).
  for (const BackendConfig& b : cfg.backends) {
    check_host_target(c, cfg, b, kCollectiveHost);
    check_host_target(c, cfg, b, kOpHost);
  }

  const auto require_backend = [&](const std::string& name, const std::string& at) {
    if (first_seen.find(name) != first_seen.end()) return;
    std::string names, best;
    names_near(cfg, name, std::string(), names, best);
    c.fail(at, quote(name) + " is not the name of any entry in backends" +
                   (best.empty() ? "" : " (did you mean " + quote(best) + "?)") +
                   (names.empty() ? "" : "; configured: " + names));
  };
  if (root.contains("default_backend")) {
    cfg.default_backend = c.string_at(root["default_backend"], "default_backend");
    require_backend(cfg.default_backend, "default_backend");
  }
  if (root.contains("torch_devices")) {
    const json& td = root["torch_devices"];
    if (!td.is_object())
      c.fail("torch_devices",
             "expected an object mapping torch device types to backend names, got " + describe(td));
    c.known_keys(td, "torch_devices", kTorchDeviceKeys);
    for (const auto& [type, name] : td.items()) {
      const std::string at = "torch_devices." + type;
      cfg.torch_devices.emplace_back(type, c.string_at(name, at));
      require_backend(cfg.torch_devices.back().second, at);
    }
  }
  return cfg;
}

}  // namespace backplane::detail
