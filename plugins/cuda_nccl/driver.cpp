// The cuda plugin's device probing through the driver API and NVML, both
// loaded with dlopen (driver.hpp).
#include "driver.hpp"

// Headers only: the types and enums of the driver API, and the versions the
// engine is built with. Nothing of the runtime, cuBLAS or NCCL is linked here.
#include <cublas_api.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <type_traits>

#include "host/layout.hpp"  // kMaxMapDims

namespace backplane::cuda {
namespace {

using plugin::fail;

std::string version_text(int v) {  // 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string gib_text(uint64_t bytes) {
  const double gib = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  char text[64];
  std::snprintf(text, sizeof text, "%.1f GiB", gib);
  return text;
}

std::string dl_error() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown reason";
}

// The driver API (libcuda.so.1), loaded once and never unloaded (the runtime
// the engine links loads the same library).
struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDriverGetVersion) driver_version = nullptr;
  decltype(&::cuDeviceGetCount) device_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetName) device_name = nullptr;
  decltype(&::cuDeviceTotalMem_v2) total_mem = nullptr;
  decltype(&::cuDeviceGetAttribute) attribute = nullptr;
  decltype(&::cuDeviceGetPCIBusId) pci_bus_id = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  std::string error;  // non-empty: the driver cannot be used, and why

  static const Driver& instance() {
    static const Driver driver = [] {
      Driver d;
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (lib == nullptr) {
        d.error = "libcuda.so.1 (the NVIDIA driver) cannot be loaded: " + dl_error();
        return d;
      }
      const auto sym = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
        if (fn == nullptr && d.error.empty()) d.error = std::string("libcuda.so.1 lacks ") + name;
      };
      sym(d.init, "cuInit");
      sym(d.driver_version, "cuDriverGetVersion");
      sym(d.device_count, "cuDeviceGetCount");
      sym(d.device_get, "cuDeviceGet");
      sym(d.device_name, "cuDeviceGetName");
      sym(d.total_mem, "cuDeviceTotalMem_v2");
      sym(d.attribute, "cuDeviceGetAttribute");
      sym(d.pci_bus_id, "cuDeviceGetPCIBusId");
      sym(d.error_name, "cuGetErrorName");
      sym(d.error_string, "cuGetErrorString");
      return d;
    }();
    return driver;
  }

  // "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected (error 100)"
  std::string text(CUresult r) const {
    const char* name = nullptr;
    const char* what = nullptr;
    if (error_name == nullptr || error_name(r, &name) != CUDA_SUCCESS) name = nullptr;
    if (error_string == nullptr || error_string(r, &what) != CUDA_SUCCESS) what = nullptr;
    return std::string(name != nullptr ? name : "CUDA error") + ": " +
           (what != nullptr ? what : "unknown error") + " (error " + std::to_string(static_cast<int>(r)) +
           ")";
  }
};

// The device of an ordinal, or BP_STATUS_DEVICE naming the call.
CUdevice device_of(const Driver& d, int32_t ordinal) {
  CUdevice dev = 0;
  if (const CUresult r = d.device_get(&dev, ordinal); r != CUDA_SUCCESS)
    fail(BP_STATUS_DEVICE, "cuda: cuDeviceGet(" + std::to_string(ordinal) + "): " + d.text(r));
  return dev;
}

int attribute(const Driver& d, CUdevice dev, CUdevice_attribute which, const char* what) {
  int value = 0;
  if (const CUresult r = d.attribute(&value, which, dev); r != CUDA_SUCCESS)
    fail(BP_STATUS_DEVICE, std::string("cuda: cuDeviceGetAttribute(") + what + "): " + d.text(r));
  return value;
}

// NVML, loaded on demand from the driver's libnvidia-ml.so.1: free memory
// without a CUDA context (listing devices must not create one).
struct Nvml {
  using Init = int (*)();
  using ByBusId = int (*)(const char*, void**);
  struct Memory {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
  };
  using GetMemory = int (*)(void*, Memory*);
  Init init = nullptr;
  ByBusId by_bus_id = nullptr;
  GetMemory get_memory = nullptr;
  std::string error;
  bool ready = false;

  static Nvml& instance() {
    static Nvml nvml = [] {
      Nvml n;
      void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        n.error = "NVML (libnvidia-ml.so.1, part of the driver) cannot be loaded: " + dl_error();
        return n;
      }
      n.init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
      n.by_bus_id = reinterpret_cast<ByBusId>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
      n.get_memory = reinterpret_cast<GetMemory>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
      if (n.init == nullptr || n.by_bus_id == nullptr || n.get_memory == nullptr) {
        n.error = "NVML lacks nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 or nvmlDeviceGetMemoryInfo";
        return n;
      }
      if (const int r = n.init(); r != 0) {
        n.error = "nvmlInit_v2 failed (NVML error " + std::to_string(r) + ")";
        return n;
      }
      n.ready = true;
      return n;
    }();
    return nvml;
  }
};

}  // namespace

DeviceCount probe_device_count() {
  const Driver& d = Driver::instance();
  if (!d.error.empty()) return {0, "CUDA driver not found: " + d.error + " (check nvidia-smi)"};
  if (const CUresult r = d.init(0); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_NO_DEVICE)
      return {0, "no CUDA GPU found: " + d.text(r) + " (check nvidia-smi and CUDA_VISIBLE_DEVICES)"};
    if (r == CUDA_ERROR_STUB_LIBRARY || r == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)
      return {0, "CUDA driver not found: " + d.text(r) + " (check nvidia-smi)"};
    return {0, "CUDA initialisation failed: " + d.text(r)};
  }
  // The engine's runtime is linked statically and runs on a driver of its
  // major version or newer (minor version compatibility).
  int driver = 0;
  if (const CUresult r = d.driver_version(&driver); r != CUDA_SUCCESS)
    return {0, "CUDA initialisation failed: cuDriverGetVersion: " + d.text(r)};
  if (driver / 1000 < CUDART_VERSION / 1000)
    return {0, "CUDA driver not found: the NVIDIA driver supports CUDA " + version_text(driver) +
                   "; this plugin's CUDA runtime " + version_text(CUDART_VERSION) +
                   " needs an NVIDIA driver that supports it (check nvidia-smi)"};
  int count = 0;
  if (const CUresult r = d.device_count(&count); r != CUDA_SUCCESS)
    return {0, "CUDA initialisation failed: cuDeviceGetCount: " + d.text(r)};
  if (count <= 0)
    return {0, "no CUDA GPU found: the driver reports 0 devices (check nvidia-smi and CUDA_VISIBLE_DEVICES)"};
  return {count, {}};
}

uint64_t device_capabilities(const Options& options) {
  uint64_t caps = BP_CAP_ASYNC | BP_CAP_MATMUL | BP_CAP_F32 | BP_CAP_F64 | BP_CAP_I32 | BP_CAP_I64 |
                  BP_CAP_BOOL | BP_CAP_F16 | BP_CAP_BF16 | BP_CAP_U8 | BP_CAP_I8;
  if (options.collective) caps |= BP_CAP_COLLECTIVE;
  return caps;
}

plugin::DeviceInfo probe_device(int32_t ordinal, const Options& options) {
  const Driver& d = Driver::instance();
  const CUdevice dev = device_of(d, ordinal);
  char name[256] = {};
  if (const CUresult r = d.device_name(name, sizeof name, dev); r != CUDA_SUCCESS)
    fail(BP_STATUS_DEVICE, "cuda: cuDeviceGetName(" + std::to_string(ordinal) + "): " + d.text(r));
  size_t total = 0;
  if (const CUresult r = d.total_mem(&total, dev); r != CUDA_SUCCESS)
    fail(BP_STATUS_DEVICE, "cuda: cuDeviceTotalMem(" + std::to_string(ordinal) + "): " + d.text(r));
  const int major = attribute(d, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability");
  const int minor = attribute(d, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability");
  const int sms = attribute(d, dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessors");
  const int domain = attribute(d, dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, "PCI domain");
  const int bus_id = attribute(d, dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, "PCI bus");
  const int device_id = attribute(d, dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, "PCI device");
  int driver = 0;
  d.driver_version(&driver);
  plugin::DeviceInfo info;
  info.name = name;
  info.capabilities = device_capabilities(options);
  char bus[32] = {};
  std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", domain, bus_id, device_id);
  info.attributes = {
      {"compute_capability", std::to_string(major) + "." + std::to_string(minor)},
      {"memory", gib_text(total)},
      {"memory_bytes", std::to_string(total)},
      {"multiprocessors", std::to_string(sms)},
      {"pci_bus_id", bus},
      {"driver_version", version_text(driver)},
      {"runtime_version", version_text(CUDART_VERSION) + " (static)"},
      {"nccl_version", std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                           std::to_string(NCCL_PATCH) + " (built with)"},
      {"cublas_version",
       std::to_string(CUBLAS_VER_MAJOR) + "." + std::to_string(CUBLAS_VER_MINOR) + " (built with)"},
      {"tf32", options.tf32 ? "on (option \"tf32\")" : "off"},
      {"memory_pool", "cudaMallocAsync, stream-ordered"},
      {"rng", "philox4x32-10; element i of seed s draws counter i under key s"},
      {"collectives", options.collective ? "nccl" : "off (option \"collective\")"},
      {"max_ndim", std::to_string(kMaxMapDims)},
  };
  return info;
}

std::optional<plugin::MemoryInfo> memory_without_context(int32_t ordinal, std::string& why) {
  Nvml& nvml = Nvml::instance();
  if (!nvml.ready) {
    why = nvml.error;
    return std::nullopt;
  }
  const Driver& d = Driver::instance();
  char bus[64] = {};
  CUdevice dev = 0;
  CUresult r = d.device_get(&dev, ordinal);
  if (r == CUDA_SUCCESS) r = d.pci_bus_id(bus, sizeof bus, dev);
  if (r != CUDA_SUCCESS) {
    why = "cuDeviceGetPCIBusId: " + d.text(r);
    return std::nullopt;
  }
  void* handle = nullptr;
  Nvml::Memory m{};
  if (const int e = nvml.by_bus_id(bus, &handle); e != 0) {
    why = "NVML does not know the device at " + std::string(bus) + " (NVML error " + std::to_string(e) + ")";
    return std::nullopt;
  }
  if (const int e = nvml.get_memory(handle, &m); e != 0) {
    why = "nvmlDeviceGetMemoryInfo failed (NVML error " + std::to_string(e) + ")";
    return std::nullopt;
  }
  return plugin::MemoryInfo{m.free, m.total};
}

}  // namespace backplane::cuda
