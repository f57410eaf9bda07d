// Loads the cuda plugin's engine library (engine.hpp) from the folder the
// front library itself was loaded from, once, at the first use of a device.
#include <dlfcn.h>

#include <atomic>
#include <backplane/plugin.hpp>
#include <mutex>
#include <string>

#include "engine.hpp"

namespace backplane::cuda {
namespace {

// The folder of this library, with a trailing '/', or "" when unknown (then the
// loader's search path decides).
std::string own_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&own_folder), &info) == 0 || info.dli_fname == nullptr) return {};
  const std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

const EngineApi* load() {
  const std::string path = own_folder() + kEngineLibrary;
  // Never unloaded (NODELETE): the CUDA runtime and NCCL keep threads inside
  // their code until the process exits.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    plugin::fail(BP_STATUS_UNAVAILABLE,
                 "cuda: cannot load the engine library " + path + ": " +
                     (why != nullptr ? why : "unknown error") +
                     "; install it next to libbackplane_cuda_nccl.so (both come from one build), and "
                     "make cuBLAS and NCCL findable (the toolkit's lib folder, or LD_LIBRARY_PATH)");
  }
  auto entry = reinterpret_cast<EngineEntryFn>(dlsym(handle, kEngineEntrySymbol));
  const EngineApi* api =
      entry != nullptr ? entry(plugin::host_api().load(std::memory_order_acquire)) : nullptr;
  if (api == nullptr || api->magic != kEngineMagic || api->struct_size != sizeof(EngineApi))
    plugin::fail(BP_STATUS_UNAVAILABLE, "cuda: " + path +
                                            " is not the engine library of this build of the cuda plugin (" +
                                            (entry == nullptr ? std::string("no ") + kEngineEntrySymbol
                                                              : std::string("its interface differs")) +
                                            "); reinstall both libraries from one build");
  return api;
}

}  // namespace

std::atomic<const EngineApi*> loaded_engine{nullptr};

const EngineApi& load_engine() {
  // A failure leaves loaded_engine null, so the next call tries again and
  // reports its own reason.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded_engine.load(std::memory_order_relaxed) == nullptr)
    loaded_engine.store(load(), std::memory_order_release);
  return *loaded_engine.load(std::memory_order_relaxed);
}

}  // namespace backplane::cuda
