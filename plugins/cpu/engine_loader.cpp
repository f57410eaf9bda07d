// Loads the cpu plugin's engine library (engine.hpp) from the folder the front
// library itself was loaded from, once, on the first device use.
#include <atomic>
#include <backplane/plugin.hpp>
#include <backplane/plugin/engine_module.hpp>
#include <mutex>
#include <string>

#include "engine.hpp"

namespace backplane::cpu {
namespace {

const EngineApi* load() {
  return plugin::load_engine<EngineApi>(
      {"cpu", "kernel library", kEngineLibrary, kEngineEntrySymbol,
       "install it next to libbackplane_cpu.so (both come from one build)", kEngineMagic},
      [](void* entry) {
        return reinterpret_cast<EngineEntryFn>(entry)(plugin::host_api().load(std::memory_order_acquire));
      });
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

}  // namespace backplane::cpu
