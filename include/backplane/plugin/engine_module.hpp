// A plugin in two libraries: a light front (options, device enumeration,
// capabilities), which the core loads, and an engine holding everything heavy
// (kernels, BLAS, vendor runtimes), which the front loads from its own folder
// at the first real use of a device. The cpu and cuda plugins are built so;
// this is the loading both share. Include from plugin code only.
//
//   // the front, once, under its own lock:
//   const auto* api = backplane::plugin::load_engine<EngineApi>(
//       {"cpu", "kernel library", kEngineLibrary, kEngineEntrySymbol,
//        "install it next to libbackplane_cpu.so (both come from one build)", kEngineMagic},
//       [](void* entry) { return reinterpret_cast<EngineEntryFn>(entry)(host); });
//
// The engine exports one C function (the entry) that returns its table, a
// struct whose first members are `uint64_t magic` and `size_t struct_size`:
// a table of another build (another magic or size) is refused, naming both
// files, rather than called. The entry takes the host's bp_host_api, so that
// plugin::log in the engine (a separate library, with its own copy of the
// SDK's state) reaches the host.
#ifndef BACKPLANE_PLUGIN_ENGINE_MODULE_HPP_
#define BACKPLANE_PLUGIN_ENGINE_MODULE_HPP_

#include <backplane/plugin/status.hpp>

#include <dlfcn.h>

#include <cstdint>
#include <string>

namespace backplane::plugin {

struct EngineModule {
  const char* plugin;   // "cpu", first in every message
  const char* what;     // "kernel library", "engine library"
  const char* library;  // its file name, looked for beside the front
  const char* entry;    // the exported function returning the table
  const char* hint;     // the remedy when it cannot be loaded
  uint64_t magic;       // what the table's magic must be
};

namespace detail {

// The folder of the library holding this code (the front: the SDK is
// compiled into each plugin), with a trailing '/', or "" when unknown (then
// the loader's search path decides).
inline std::string front_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&front_folder), &info) == 0 || info.dli_fname == nullptr)
    return {};
  const std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

}  // namespace detail

// Loads the engine beside the front and returns its table: `call(entry)`
// calls the entry function (whatever its signature) and returns the table.
// The engine is never unloaded (RTLD_NODELETE): runtimes such as OpenMP,
// OpenBLAS, CUDA's and NCCL keep threads inside it until the process exits.
// Throws Failure(BP_STATUS_UNAVAILABLE) naming the file and the reason.
template <class Api, class Call>
const Api* load_engine(const EngineModule& m, Call call) {
  const std::string path = detail::front_folder() + m.library;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    fail(BP_STATUS_UNAVAILABLE, std::string(m.plugin) + ": cannot load the " + m.what + " " + path + ": " +
                                    (why != nullptr ? why : "unknown error") + "; " + m.hint);
  }
  void* entry = dlsym(handle, m.entry);
  const Api* api = entry != nullptr ? call(entry) : nullptr;
  if (api == nullptr || api->magic != m.magic || api->struct_size != sizeof(Api))
    fail(BP_STATUS_UNAVAILABLE,
         std::string(m.plugin) + ": " + path + " is not the " + m.what + " of this build of the " + m.plugin +
             " plugin (" +
             (entry == nullptr ? std::string("no ") + m.entry : std::string("its interface differs")) +
             "); reinstall both libraries from one build");
  return api;
}

}  // namespace backplane::plugin

#endif  // BACKPLANE_PLUGIN_ENGINE_MODULE_HPP_
