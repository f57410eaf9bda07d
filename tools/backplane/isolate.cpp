// Backend reports for list and check, in process or one child process per
// backend. The parent validates the config itself (every "library" replaced
// by a path that cannot load), so nothing of a plugin runs in it; child i gets
// the same document with only backend i's library left in place.
#include "isolate.hpp"

#include <backplane/error.hpp>
#include <backplane/registry.hpp>
#include <backplane_common/unique_fd.hpp>

#include <CLI/CLI.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace backplane::cli {
namespace fs = std::filesystem;
namespace {

// A "library" value no loader can resolve: a path below a character device.
constexpr const char* kNotLoaded = "/dev/null/not-loaded-here";
// What a child may write before its answer counts as garbage.
constexpr std::size_t kMaxAnswerBytes = std::size_t{16} << 20;
// After SIGTERM, how long a child has to end before SIGKILL.
constexpr auto kKillGrace = std::chrono::seconds(1);
// The limits the core applies (core/config/config.hpp); anything beyond them
// is handed to the core, which refuses it before loading anything.
constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;
constexpr std::size_t kMaxConfigDepth = 64;

Json or_null(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

const char* status_name(Backend::Status status) {
  switch (status) {
    case Backend::Status::loaded:
      return "loaded";
    case Backend::Status::unavailable:
      return "unavailable";
    case Backend::Status::failed:
      return "failed";
  }
  return "failed";
}

Json device_json(const Device& device) {
  Json attributes = Json::object();
  for (const auto& [key, value] : device.attributes()) attributes[key] = value;
  std::string error;
  std::optional<MemoryInfo> memory;
  try {
    memory = device.memory();
  } catch (const Error& e) {  // a listing shows the failure rather than failing
    error = e.message();
  }
  // null when the plugin does not report memory (or failed to: memory_error).
  Json j{{"index", device.index()},
         {"name", device.name()},
         {"capabilities", device.capabilities().names()},
         {"attributes", std::move(attributes)},
         {"memory_bytes", memory ? Json(memory->total_bytes) : Json(nullptr)},
         {"memory_free_bytes", memory ? Json(memory->free_bytes) : Json(nullptr)}};
  if (!error.empty()) j["memory_error"] = error;
  return j;
}

// The core's reader: a FIFO or a device named as the config is refused at
// once (an ifstream would block on it).
std::string read_config_text(const fs::path& config) {
  try {
    return Registry::read_config(config);
  } catch (const Error& e) {
    throw CommandError(kExitConfig, e.message());
  }
}

// The config as a document, or nullopt for anything the core refuses by
// itself before loading a plugin (too big, too deep, malformed, a key
// repeated): the caller then lets the core say why.
std::optional<Json> parse_config_document(const std::string& text) {
  if (text.size() > kMaxConfigBytes) return std::nullopt;
  std::vector<std::set<std::string>> keys;
  bool refused = false;
  auto guard = [&](int, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    if (refused) return false;
    if (event == E::object_start || event == E::array_start) {
      keys.emplace_back();
      if (keys.size() > kMaxConfigDepth) refused = true;
    } else if (event == E::object_end || event == E::array_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second) {
      refused = true;
    }
    return !refused;
  };
  try {
    Json doc = Json::parse(text, guard);
    if (refused || !doc.is_object() || !doc.contains("backends") || !doc["backends"].is_array())
      return std::nullopt;
    return doc;
  } catch (const Json::exception&) {
    return std::nullopt;
  }
}

// `doc` with every backend's library but `keep`'s (none when keep < 0) replaced by kNotLoaded.
std::string only_library(Json doc, std::ptrdiff_t keep) {
  Json& backends = doc["backends"];
  for (std::size_t i = 0; i < backends.size(); ++i)
    if (static_cast<std::ptrdiff_t>(i) != keep && backends[i].is_object() && backends[i].contains("library"))
      backends[i]["library"] = kNotLoaded;
  return doc.dump(-1, ' ', false, Json::error_handler_t::strict);
}

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return std::to_string(sig) + (abbrev != nullptr ? std::string(" (SIG") + abbrev + ")" : std::string());
}

using common::UniqueFd;

struct ChildOutcome {
  std::string answer;  // what it wrote on the pipe
  bool timed_out = false;
  int status = 0;  // waitpid's
  std::string spawn_error;
};

bool reap(pid_t pid, int& status, int options) {
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, options);
    if (r == pid) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // ECHILD: nothing left to wait for
  }
}

// Runs `this executable __load-backend ...` for backend `index`, reads its
// answer until EOF, and waits for it, all within `timeout`.
ChildOutcome run_child(const fs::path& config, std::size_t index, std::chrono::seconds timeout) {
  ChildOutcome out;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    out.spawn_error = std::string("cannot create a pipe: ") + std::strerror(errno);
    return out;
  }
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  constexpr int kChildFd = 3;

  std::vector<std::string> args = {
      "backplane", "__load-backend",          "--config",    config.string(),
      "--index",   std::to_string(index),     "--report-fd", std::to_string(kChildFd),
      "--parent",  std::to_string(::getpid())};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  // fd 3 is the answer; stdout goes to stderr, so a chatty plugin cannot mix into the listing.
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), kChildFd);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: a deadline kills what it started too
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  write_end.reset();
  if (rc != 0) {
    out.spawn_error = std::string("cannot start a child process: ") + std::strerror(rc);
    return out;
  }

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left_ms = [&] {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return static_cast<int>(std::max<std::chrono::milliseconds::rep>(0, left.count()));
  };
  bool eof = false;
  char buf[65536];
  while (!eof && left_ms() > 0) {
    pollfd p{read_end.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, std::min(left_ms(), 1000));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    const ssize_t got = ::read(read_end.get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      eof = true;
      break;
    }
    if (out.answer.size() < kMaxAnswerBytes) out.answer.append(buf, static_cast<std::size_t>(got));
  }
  read_end.reset();
  // The answer is in; the child still has to unload and exit within the deadline.
  bool reaped = reap(pid, out.status, WNOHANG);
  while (!reaped && left_ms() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(left_ms(), 10)));
    reaped = reap(pid, out.status, WNOHANG);
  }
  if (!reaped) {
    out.timed_out = true;
    ::kill(-pid, SIGTERM);
    const auto grace_end = std::chrono::steady_clock::now() + kKillGrace;
    while (!(reaped = reap(pid, out.status, WNOHANG)) && std::chrono::steady_clock::now() < grace_end)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::kill(-pid, SIGKILL);  // the rest of its group too, even when it ended at SIGTERM
    if (!reaped) reap(pid, out.status, 0);
  }
  return out;
}

// The answer of a child, validated: {"report": <backend_json>, "hint": string}.
std::optional<BackendReport> parse_answer(const std::string& answer, std::string& config_error) {
  Json j = Json::parse(answer, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  if (j.contains("config_error") && j["config_error"].is_string()) {
    config_error = j["config_error"].get<std::string>();
    return std::nullopt;
  }
  if (!j.contains("report") || !j.contains("hint") || !j["hint"].is_string()) return std::nullopt;
  const Json& r = j["report"];
  auto is = [&](const char* key, auto pred) { return r.contains(key) && pred(r[key]); };
  auto string_or_null = [](const Json& v) { return v.is_string() || v.is_null(); };
  auto is_string = [](const Json& v) { return v.is_string(); };
  if (!r.is_object() || !is("name", is_string) || !is("library", is_string) ||
      !is("library_path", string_or_null) || !is("version", string_or_null) ||
      !is("abi_version", string_or_null) || !is("error", string_or_null) ||
      !is("error_code", string_or_null) || !is("collective_fallback", is_string) ||
      !is("op_fallback", is_string) || !is("required", [](const Json& v) { return v.is_boolean(); }) ||
      !is("capabilities", [](const Json& v) { return v.is_array(); }) ||
      !is("devices", [](const Json& v) { return v.is_array(); }) || !is("status", [](const Json& v) {
        return v.is_string() && (v == "loaded" || v == "failed" || v == "unavailable");
      }))
    return std::nullopt;
  for (const Json& c : r["capabilities"])
    if (!c.is_string()) return std::nullopt;
  for (const Json& d : r["devices"]) {
    if (!d.is_object() || !d.contains("index") || !d["index"].is_number_integer() || !d.contains("name") ||
        !d["name"].is_string() || !d.contains("capabilities") || !d["capabilities"].is_array() ||
        !d.contains("attributes") || !d["attributes"].is_object() || !d.contains("memory_bytes") ||
        !d.contains("memory_free_bytes"))
      return std::nullopt;
    for (const Json& c : d["capabilities"])
      if (!c.is_string()) return std::nullopt;
    for (const auto& [k, v] : d["attributes"].items())
      if (!v.is_string()) return std::nullopt;
    for (const char* key : {"memory_bytes", "memory_free_bytes"})
      if (!d[key].is_null() && !d[key].is_number_unsigned()) return std::nullopt;
    if (d.contains("memory_error") && !d["memory_error"].is_string()) return std::nullopt;
  }
  return BackendReport{r, j["hint"].get<std::string>()};
}

// A backend that failed in its child: what the parent knows from the config, plus why.
BackendReport failed_in_child(const Backend& validated, const std::string& library, const std::string& why,
                              const std::string& hint) {
  Json j = backend_json(validated);
  j["library"] = library;
  j["library_path"] = nullptr;
  j["status"] = "failed";
  j["error"] = "backend \"" + validated.name() + "\" (" + library + "): " + why;
  j["error_code"] = std::string(to_string(Errc::plugin_load_failed));
  return {j, hint};
}

struct LoadBackendOptions {
  std::string config;
  std::size_t index = 0;
  int report_fd = -1;
  long parent = 0;
};

int run_load_backend(const LoadBackendOptions& options) {
  // Dies with the command that started it, however that one ends.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (options.parent != 0 && ::getppid() != static_cast<pid_t>(options.parent)) return kExitFailed;
  auto answer = [&](const Json& j) {
    const std::string text = j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(options.report_fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<std::size_t>(n);
    }
  };
  const fs::path config = options.config;
  std::optional<Json> doc;
  try {
    doc = parse_config_document(read_config_text(config));
  } catch (const CommandError&) {  // replaced by something else since the parent read it
  }
  if (!doc || options.index >= (*doc)["backends"].size()) {
    answer({{"config_error", "the config changed while it was being checked; run the command again"}});
    return kExitConfig;
  }
  try {
    const Registry registry =
        Registry::from_json(only_library(*doc, static_cast<std::ptrdiff_t>(options.index)),
                            fs::absolute(config).parent_path(), config.string(), RequiredPolicy::report);
    const Backend backend = registry.backends().at(options.index);
    const BackendReport report = backend_report(backend, config);
    answer({{"report", report.info}, {"hint", report.hint}});
    ::close(options.report_fd);
    return kExitOk;  // the registry unloads the plugin now; a crash there is reported too
  } catch (const Error& e) {
    answer({{"config_error", e.message()}});
    return kExitConfig;
  }
}

}  // namespace

Json backend_json(const Backend& backend) {
  Json j;
  j["name"] = backend.name();
  j["library"] = backend.library();
  j["library_path"] = or_null(backend.library_path());
  j["version"] = or_null(backend.version());
  j["abi_version"] = or_null(backend.abi_version());
  j["status"] = status_name(backend.status());
  j["error"] = backend.loaded() ? Json(nullptr) : Json(backend.error());
  const std::optional<Errc> code = backend.error_code();
  j["error_code"] = code ? Json(to_string(*code)) : Json(nullptr);
  j["required"] = backend.required();
  j["collective_fallback"] = backend.collective_fallback().to_string();
  j["op_fallback"] = backend.op_fallback().to_string();
  Json devices = Json::array();
  if (backend.loaded()) {
    j["capabilities"] = backend.capabilities().names();
    for (const Device& device : backend.devices()) devices.push_back(device_json(device));
  } else {
    j["capabilities"] = Json::array();
  }
  j["devices"] = std::move(devices);
  return j;
}

BackendReport backend_report(const Backend& backend, const fs::path& config) {
  return {backend_json(backend), backend.loaded() ? std::string() : failure_hint(backend, config)};
}

RegistryReport report_in_process(const fs::path& config) {
  const Registry registry = load_for_report(config);
  RegistryReport out;
  out.config = shown_config_path(registry, config);
  try {
    out.default_backend = registry.default_backend().name();
  } catch (const Error&) {  // no default and nothing loaded
  }
  for (const Backend& backend : registry.backends()) out.backends.push_back(backend_report(backend, config));
  return out;
}

RegistryReport report_isolated(const fs::path& config, int timeout_seconds) {
  try {
    Registry::check_config_permissions(config);  // before reading it, as from_config does
  } catch (const Error& e) {
    throw CommandError(kExitConfig, e.message());
  }
  const std::optional<Json> doc = parse_config_document(read_config_text(config));
  // Not a document this side can take apart: the core refuses it, loading nothing, and says why.
  if (!doc) return report_in_process(config);
  std::optional<Registry> validated;
  try {
    validated = Registry::from_json(only_library(*doc, -1), fs::absolute(config).parent_path(),
                                    config.string(), RequiredPolicy::report);
  } catch (const Error& e) {
    if (e.code() == Errc::config_error) throw CommandError(kExitConfig, e.message());
    throw;
  }
  RegistryReport out;
  out.config = fs::absolute(config).lexically_normal();
  try {
    out.default_backend = validated->default_backend().name();  // set in the config (nothing is loaded here)
  } catch (const Error&) {
  }
  const std::vector<Backend> backends = validated->backends();
  const std::string cfg = config.string();
  for (std::size_t i = 0; i < backends.size(); ++i) {
    const Backend& b = backends[i];
    const Json& entry = (*doc)["backends"][i];
    const std::string library = entry["library"].get<std::string>();  // validated: a string
    const ChildOutcome child = run_child(config, i, std::chrono::seconds(timeout_seconds));
    const std::string crashed_hint =
        "the plugin ended the process that loaded it (here a child process, so the other backends could "
        "still "
        "be checked); a program that loads it would end the same way: fix or update the plugin, or remove "
        "backend \"" +
        b.name() + "\" from " + cfg;
    if (!child.spawn_error.empty()) {
      out.backends.push_back(failed_in_child(b, library, "could not be checked: " + child.spawn_error,
                                             "BACKPLANE_LOG_LEVEL=debug shows more detail"));
      continue;
    }
    if (child.timed_out) {
      out.backends.push_back(failed_in_child(
          b, library, "did not return within " + std::to_string(timeout_seconds) + " s; killed",
          "the plugin hangs while loading (a device, driver or server that does not answer?); if it is only "
          "slow, raise --timeout"));
      continue;
    }
    std::string config_error;
    std::optional<BackendReport> report = parse_answer(child.answer, config_error);
    const bool exited = WIFEXITED(child.status);
    const int code = exited ? WEXITSTATUS(child.status) : -1;
    if (!config_error.empty()) throw CommandError(kExitConfig, config_error);
    if (report && exited && code == kExitOk) {
      out.backends.push_back(std::move(*report));
      continue;
    }
    const std::string phase = report ? "after loading, while unloading it" : "while loading";
    std::string why;
    if (WIFSIGNALED(child.status)) {
      why = "killed by signal " + signal_text(WTERMSIG(child.status)) + " " + phase;
    } else if (!report && !child.answer.empty() && exited && code == kExitOk) {
      why = "the process loading it answered with something that is not a backend report (" +
            std::to_string(child.answer.size()) + " bytes)";
    } else {
      why = "called exit(" + std::to_string(code) + ") " + phase;
    }
    out.backends.push_back(failed_in_child(b, library, why, crashed_hint));
  }
  if (!out.default_backend)
    for (const BackendReport& r : out.backends)
      if (r.info["status"] == "loaded") {
        out.default_backend = r.info["name"].get<std::string>();
        break;
      }
  return out;
}

Command add_load_backend_command(CLI::App& parent) {
  auto options = std::make_shared<LoadBackendOptions>();
  CLI::App* sub =
      parent.add_subcommand("__load-backend", "Internal: load one backend for `check` (isolated)");
  sub->group("");  // hidden from --help
  sub->add_option("--config", options->config)->required();
  sub->add_option("--index", options->index)->required();
  sub->add_option("--report-fd", options->report_fd)->required();
  sub->add_option("--parent", options->parent);
  return {sub, [options] { return run_load_backend(*options); }};
}

}  // namespace backplane::cli
