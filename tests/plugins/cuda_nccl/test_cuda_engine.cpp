// The cuda plugin's engine library (plugins/cuda_nccl/engine.hpp) on any
// machine, GPU or not: it loads from the plugin folder with cuBLAS and NCCL
// found through its RUNPATH, exports the entry the front looks up with the
// front's interface, and makes and destroys an instance's devices without a
// GPU. Without this, a broken engine would only show on a GPU machine.
#include <doctest/doctest.h>

#include <dlfcn.h>

#include <string>

#include "engine.hpp"

namespace {

using namespace backplane::cuda;

const EngineApi& load() {
  const std::string path = std::string(BP_TEST_PLUGIN_DIR) + "/" + kEngineLibrary;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  INFO("dlopen " << path << ": " << (handle == nullptr ? dlerror() : "ok"));
  REQUIRE(handle != nullptr);
  auto entry = reinterpret_cast<EngineEntryFn>(dlsym(handle, kEngineEntrySymbol));
  REQUIRE(static_cast<bool>(entry));
  const EngineApi* api = entry(nullptr);
  REQUIRE(api != nullptr);
  return *api;
}

TEST_CASE("cuda.engine: the engine library loads beside the front and has the front's interface") {
  const EngineApi& api = load();
  CHECK(api.magic == kEngineMagic);
  CHECK(api.struct_size == sizeof(EngineApi));
  // No GPU is touched until a device's first use: zero devices make and
  // destroy an instance anywhere, and a device outside them is refused.
  const Options options;
  EngineDevices* devices = nullptr;
  REQUIRE(api.create(&options, 0, &devices) == nullptr);
  REQUIRE(devices != nullptr);
  bp_buffer* buffer = nullptr;
  bp_status* status = api.buffer_alloc(devices, 0, 16, &buffer);
  REQUIRE(status != nullptr);
  CHECK(backplane::plugin::status_code(status) == BP_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(backplane::plugin::status_message(status)).find("no device 0") != std::string::npos);
  backplane::plugin::status_free(status);
  api.destroy(devices);
}

}  // namespace
