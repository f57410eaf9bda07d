// `backplane serve`: hosts the devices of one backend of its own config for
// remote clients (the `remote` plugin), until SIGINT or SIGTERM. The server
// itself is remote/server (server.hpp); this file is the command line.
#include "cli.hpp"

#include <backplane/error.hpp>
#include <backplane/hosting.hpp>
#include <backplane/registry.hpp>
#include <backplane/trace.hpp>
#include <backplane/version.hpp>
#include <backplane_common/memory_room.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include <pthread.h>

#include "remote/server/server.hpp"
#include "remote/server/token.hpp"

namespace backplane::cli {
namespace {

namespace rs = backplane::remote::server;

struct ServeOptions {
  std::string config;
  std::string backend;
  std::string listen = "127.0.0.1:7070";
  std::string token_file;
  std::string tls_cert;
  std::string tls_key;
  int64_t handshake_timeout_ms = 0;
  int64_t idle_timeout_ms = 0;
  uint64_t max_total_bytes = 0;  // 0: 90% of what this process may take
  bool max_session_bytes_given = false;
  rs::ServerLimits limits;
};

// --max-total-bytes when not given: 90% of what the process may still take
// (the lower of its memory cgroup's room and MemAvailable), so that the last
// allocations are refused before the kernel kills the server. `why` says
// where the figure came from.
uint64_t default_total_bytes(std::string& why) {
  const common::MemoryRoom room = common::memory_room();
  if (room.bytes == common::kUnknownBytes) {
    why = "no limit: the memory this process may take is unknown";
    return UINT64_MAX;
  }
  why = "90% of " + room.describe();
  return room.bytes / 10 * 9;
}

int run_serve(ServeOptions& options) {
  if (options.handshake_timeout_ms > 0)
    options.limits.handshake_timeout = std::chrono::milliseconds(options.handshake_timeout_ms);
  if (options.idle_timeout_ms > 0)
    options.limits.idle_timeout = std::chrono::milliseconds(options.idle_timeout_ms);
  std::string total_why = "--max-total-bytes";
  options.limits.max_total_bytes =
      options.max_total_bytes != 0 ? options.max_total_bytes : default_total_bytes(total_why);
  // A session's default share never exceeds the whole; a given one is kept
  // (the total still holds).
  if (!options.max_session_bytes_given)
    options.limits.max_session_bytes =
        std::min(options.limits.max_session_bytes, options.limits.max_total_bytes);

  const std::filesystem::path config = choose_config(options.config);
  // BACKPLANE_TRACE: the server's track says what it is (its trace starts with the registry).
  trace::set_process_label("serve " + options.listen);
  const Registry registry = load_for_report(config);
  const Backend backend = options.backend.empty() ? registry.default_backend()
                                                  : find_backend(registry, options.backend, kExitFailed);
  if (!backend.loaded())
    throw CommandError(kExitFailed, "serve: backend '" + backend.name() +
                                        "' cannot be served: " + indent_continuation(backend.error(), 2) +
                                        "\n" + failure_hint(backend, shown_config_path(registry, config)));
  if (backend.device_count() == 0)
    throw CommandError(kExitFailed, "serve: backend '" + backend.name() + "' has no devices to serve");

  rs::ServerOptions server_options;
  server_options.listen = options.listen;
  server_options.tls_cert = options.tls_cert;
  server_options.tls_key = options.tls_key;
  server_options.server_version = kVersion;
  server_options.limits = options.limits;
  try {
    server_options.token = rs::server_token(options.token_file);
  } catch (const std::exception& e) {
    throw CommandError(kExitUsage, std::string("serve: ") + e.what());
  }

  // SIGINT and SIGTERM are taken by sigwait below: blocked here, before the
  // server's threads start, so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const HostedPlugin plugin = hosted_plugin(backend);
  std::unique_ptr<rs::Server> server;
  try {
    auto hosted =
        std::make_shared<const rs::Hosted>(plugin.api, plugin.plugin, backend.name(), backend.version(),
                                           std::make_shared<const Backend>(backend));
    server = std::make_unique<rs::Server>(hosted, server_options);
  } catch (const std::exception& e) {
    throw CommandError(kExitFailed, std::string("serve: ") + e.what());
  }

  const int32_t n = backend.device_count();
  std::cout << "serving " << backend.name() << " (" << n << (n == 1 ? " device" : " devices") << ") on "
            << server->address() << ", " << (server_options.token.empty() ? "no token" : "token required")
            << ", " << (server->tls() ? "TLS" : "no TLS") << '\n';
  for (int32_t d = 0; d < n; ++d) {
    const Device device = backend.device(d);
    std::cout << "  device " << d << ": " << device.name() << " [" << device.capabilities().to_string()
              << "]\n";
  }
  std::cout << "  memory: all sessions together up to "
            << (options.limits.max_total_bytes == UINT64_MAX
                    ? std::string("any size")
                    : common::byte_size_text(options.limits.max_total_bytes))
            << " (" << total_why << "; buffers, and writes and replies in transit), "
            << common::byte_size_text(options.limits.max_session_bytes) << " of buffers per session\n";
  if (server_options.token.empty())
    std::cout
        << "  (loopback only, no token: any local user can use these devices; give --token-file to require "
           "one)\n";
  std::cout << "ready" << std::endl;

  int signal = 0;
  while (sigwait(&stop_signals, &signal) != 0) {
  }
  std::cout << "stopping (" << (signal == SIGINT ? "SIGINT" : "SIGTERM") << "): closing every session"
            << std::endl;
  const rs::ServerStats before = server->stats();
  server->stop();
  std::cout << "stopped: closed " << before.sessions << (before.sessions == 1 ? " session" : " sessions")
            << " and freed what they held" << std::endl;
  return kExitOk;
}

}  // namespace

Command add_serve_command(CLI::App& parent) {
  auto options = std::make_shared<ServeOptions>();
  const rs::ServerLimits defaults;
  CLI::App* sub = parent.add_subcommand(
      "serve", "Host the devices of one backend of the config for remote clients (the `remote` backend)");
  sub->add_option("--config", options->config,
                  "The backends.json to load (see the footer of 'backplane --help')")
      ->type_name("FILE");
  sub->add_option("--backend", options->backend,
                  "The backend to serve (default: the config's default_backend)")
      ->type_name("NAME");
  sub->add_option(
         "--listen", options->listen,
         "HOST:PORT to listen on (default 127.0.0.1:7070; port 0 picks a free one). Any address that is "
         "not loopback needs a token")
      ->type_name("HOST:PORT");
  sub->add_option(
         "--token-file", options->token_file,
         "A file holding the token clients must prove (first line; private to its owner: chmod 600). "
         "Default: the BACKPLANE_REMOTE_TOKEN environment variable, else no token (loopback only)")
      ->type_name("FILE");
  sub->add_option("--tls-cert", options->tls_cert, "PEM certificate chain: serve over TLS (with --tls-key)")
      ->type_name("FILE");
  sub->add_option("--tls-key", options->tls_key, "PEM private key of --tls-cert")->type_name("FILE");
  sub->add_option("--max-sessions", options->limits.max_sessions,
                  "Authenticated sessions at once (default " + std::to_string(defaults.max_sessions) + ")")
      ->type_name("N")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option(
         "--max-handshakes", options->limits.max_handshakes,
         "Connections still in their handshake; more wait for a slot, those that sent something first "
         "(default " +
             std::to_string(defaults.max_handshakes) + ")")
      ->type_name("N")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-handshakes-per-address", options->limits.max_handshakes_per_address,
                  "Connections in their handshake from one source address; more from it wait for a slot, "
                  "never closed for the limit (default " +
                      std::to_string(defaults.max_handshakes_per_address) + ")")
      ->type_name("N")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--handshake-timeout-ms", options->handshake_timeout_ms,
                  "Time a connection may wait for a handshake slot, then time for TLS and the handshake "
                  "(default " +
                      std::to_string(defaults.handshake_timeout.count()) + ")")
      ->type_name("MS")
      ->check(CLI::Range(int64_t{1}, int64_t{24} * 3600 * 1000));
  sub->add_option("--idle-timeout-ms", options->idle_timeout_ms,
                  "A session that sends nothing (or reads nothing) for this long is closed (default " +
                      std::to_string(defaults.idle_timeout.count()) + ")")
      ->type_name("MS")
      ->check(CLI::Range(int64_t{1}, int64_t{365} * 24 * 3600 * 1000));
  sub->add_option("--max-total-bytes", options->max_total_bytes,
                  "Bytes all sessions together may make the server hold: buffers, write payloads and "
                  "replies in transit, spare payload buffers (default: 90% of what this process may take, "
                  "the lower of its memory cgroup's room and MemAvailable)")
      ->type_name("BYTES")
      ->check(CLI::Range(uint64_t{1}, UINT64_MAX));
  sub->add_option("--max-session-bytes", options->limits.max_session_bytes,
                  "Bytes of buffers one session may hold (default " +
                      std::to_string(defaults.max_session_bytes) + ", at most --max-total-bytes)")
      ->type_name("BYTES")
      ->check(CLI::Range(uint64_t{1}, UINT64_MAX))
      ->each([options](const std::string&) { options->max_session_bytes_given = true; });
  sub->add_option("--max-buffers", options->limits.max_buffers,
                  "Buffers one session may hold (default " + std::to_string(defaults.max_buffers) + ")")
      ->type_name("N")
      ->check(CLI::Range(uint32_t{1}, UINT32_MAX));
  sub->add_option("--max-inflight", options->limits.max_inflight,
                  "Requests queued per session before the server stops reading it (default " +
                      std::to_string(defaults.max_inflight) + ")")
      ->type_name("N")
      ->check(CLI::Range(uint32_t{1}, uint32_t{1} << 24));
  sub->add_option("--max-frame-bytes", options->limits.max_frame_bytes,
                  "Payload bytes of one frame, one write or read (default " +
                      std::to_string(defaults.max_frame_bytes) + ")")
      ->type_name("BYTES")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  sub->footer(
      "Prints 'serving NAME (N devices) on HOST:PORT', one line per device, then 'ready', and serves until\n"
      "SIGINT or SIGTERM; then it tells every client the server is shutting down, frees everything the\n"
      "sessions held and exits 0. Session starts and ends are logged to stderr.\n"
      "Clients configure the `remote` backend with this address as an endpoint (docs/remote.md). Every\n"
      "limit, TLS and the token are described in docs/remote-server.md.");
  return {sub, [options] { return run_serve(*options); }};
}

}  // namespace backplane::cli
