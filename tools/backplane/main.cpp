// The `backplane` command-line tool: parses the command line, runs the chosen
// subcommand, and turns every failure into "backplane: error: ..." plus a
// documented exit code. Subcommands live in cmd_*.cpp.
#include "cli.hpp"
#include "isolate.hpp"

#include <backplane/error.hpp>
#include <backplane/version.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

namespace backplane::cli {
namespace {

constexpr const char* kFooter =
    "Config: --config FILE, else $BACKPLANE_CONFIG, else ../share/backplane/backends.json\n"
    "relative to this program (<prefix>/share/backplane/backends.json once installed; the build\n"
    "generates <build>/share/backplane/backends.json), else the default beside libbackplane.\n"
    "A backends.json in the current folder is never read unless named.\n"
    "\n"
    "Exit codes:\n"
    "  0   success\n"
    "  1   a required backend failed to load or is unavailable (check), or the command failed\n"
    "  2   the config cannot be found, read, parsed or validated\n"
    "  64  bad command line\n"
    "  70  unexpected internal error (a bug; please report it)\n"
    "  127 launch: the command cannot be found or executed\n"
    "launch exits with the code of its first failing rank (see 'backplane launch --help').";

std::string version_text() {
  return std::string("backplane ") + kVersion + " (plugin ABI " + std::to_string(kAbiMajor) + "." +
         std::to_string(kAbiMinor) + ")";
}

int run(int argc, char** argv) {
  CLI::App app{"backplane: a tensor-backend registry; loads the backend plugins named in backends.json.",
               "backplane"};
  app.set_version_flag("--version", version_text(),
                       "Print the version and the plugin ABI version, then exit");
  app.require_subcommand(1);
  app.footer(kFooter);

  // One line per subcommand: each is in its cmd_*.cpp (the hidden one in isolate.cpp).
  const std::vector<Command> commands = {
      add_list_command(app),         add_check_command(app), add_conformance_command(app),
      add_launch_command(app),       add_train_command(app), add_serve_command(app),
      add_trace_command(app),
      add_load_backend_command(app),  // hidden: the child process of an isolated check
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (argc == 1) {
      std::cerr << app.help();
      return kExitUsage;
    }
    const std::string first = argv[1];
    const bool known = std::any_of(commands.begin(), commands.end(),
                                   [&](const Command& c) { return c.app->check_name(first); });
    if (!first.empty() && first[0] != '-' && !known) {
      print_error("unknown subcommand '" + first + "'");
    } else {
      print_error(e.what());
    }
    std::cerr << "Run 'backplane " << (known ? first + " " : std::string()) << "--help' for usage.\n";
    return kExitUsage;
  }

  for (const Command& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  print_error("no subcommand given; run 'backplane --help'");
  return kExitUsage;
}

}  // namespace
}  // namespace backplane::cli

int main(int argc, char** argv) {
  using namespace backplane::cli;
  try {
    return run(argc, argv);
  } catch (const CommandError& e) {
    print_error(e.what());
    return e.code();
  } catch (const backplane::Error& e) {
    print_error(std::string(e.message()) + " [" + backplane::to_string(e.code()) + "]");
    return e.code() == backplane::Errc::internal ? kExitInternal : kExitFailed;
  } catch (const std::exception& e) {
    print_error(std::string("unexpected: ") + e.what());
    return kExitInternal;
  } catch (...) {
    print_error("unexpected exception of unknown type");
    return kExitInternal;
  }
}
