// Device probing of the cpu plugin (device.hpp).
#include "device.hpp"

#include <cblas.h>  // macros only (OPENBLAS_VERSION): nothing here calls into OpenBLAS
#include <sched.h>
#include <sys/sysinfo.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels.hpp"  // BP_CPU_HAS_CLONES
#include "op_dtypes.hpp"
#include "vector_math.hpp"  // BP_CPU_VECTOR_MATH

namespace backplane::cpu {
namespace {

std::string simd_description() {
#if defined(__AVX512F__)
  const std::string baseline = "avx512f";
#elif defined(__AVX2__)
  const std::string baseline = "avx2";
#elif defined(__AVX__)
  const std::string baseline = "avx";
#elif defined(__SSE4_2__)
  const std::string baseline = "sse4.2";
#elif defined(__x86_64__)
  const std::string baseline = "sse2";
#else
  const std::string baseline = "generic";
#endif
#if BP_CPU_HAS_CLONES
  if (__builtin_cpu_supports("avx2")) return "avx2 (runtime dispatch; baseline " + baseline + ")";
  return baseline + " (runtime dispatch; avx2 not available)";
#else
  return baseline;
#endif
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

// The BLAS the kernel library links, from its header: asking OpenBLAS at run time
// (openblas_get_config) would load it, and its constructor starts a thread pool.
std::string blas_description() {
#ifdef OPENBLAS_VERSION
  std::string v = OPENBLAS_VERSION;  // " OpenBLAS 0.3.21 "
  const auto first = v.find_first_not_of(' ');
  const auto last = v.find_last_not_of(' ');
  return first == std::string::npos ? "OpenBLAS" : v.substr(first, last - first + 1);
#else
  return "OpenBLAS";
#endif
}

// kB value of one /proc/meminfo line ("MemTotal:  16318792 kB"), or -1.
int64_t meminfo_kb(const std::string& line, const char* key) {
  if (line.rfind(key, 0) != 0) return -1;
  return std::strtoll(line.c_str() + std::char_traits<char>::length(key), nullptr, 10);
}

// "fill, copy, matmul (option \"ops\")": what a narrowing option left, so that
// `backplane list` shows why the device claims less than the cpu backend runs.
std::string restricted_ops(const OpSet& ops) {
  std::string out;
  for (int32_t op = 1; op < BP_OP_COUNT_; ++op)
    if (ops.test(op)) out += (out.empty() ? "" : ", ") + plugin::op_name(op);
  return (out.empty() ? "none" : out) + " (option \"ops\")";
}

std::string restricted_dtypes(uint64_t dtypes) {
  std::string out;
  for (int32_t d = 1; d < BP_DTYPE_COUNT_; ++d)
    if ((dtypes & BP_CAP_DTYPE(d)) != 0) out += (out.empty() ? "" : ", ") + plugin::dtype_name(d);
  return out + " (option \"dtypes\")";
}

}  // namespace

int default_thread_count() noexcept {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const long n = std::strtol(env, nullptr, 10);  // the first entry of a nested list
    if (n > 0) return static_cast<int>(n);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const int online = get_nprocs();
  return online > 0 ? online : 1;
}

plugin::DeviceInfo probe_device(int threads, bool collective, bool shared_memory, const OpSet& ops,
                                uint64_t dtypes, bool flush_denormals) {
  plugin::DeviceInfo info;
  info.name = "host (" + std::to_string(threads) + " threads)";
  info.capabilities = BP_CAP_HOST_VISIBLE | (dtypes & HeldDTypes::capabilities());
  // The flag says the device runs matmul (abi.h): not when "ops" leaves it out, nor
  // when "dtypes" leaves no dtype it takes (supports_op would refuse every one).
  if (ops.test(BP_OP_MATMUL) && (dtypes & FloatDTypes::capabilities()) != 0)
    info.capabilities |= BP_CAP_MATMUL;
  if (collective) info.capabilities |= BP_CAP_COLLECTIVE;
  const std::string n = std::to_string(threads);
  info.attributes = {
      {"threads", n},
      {"blas", blas_description()},
      {"blas_threads", n},  // the engine hands OpenBLAS the same count before each gemm
      {"simd", simd_description()},
      {"vector_math",
       BP_CPU_VECTOR_MATH ? "glibc libmvec (vectorised exp, log, sin, cos, tanh, pow)" : "scalar libm"},
      {"rng", "philox4x32-10; element i of seed s draws counter i under key s"},
      {"collectives", !collective     ? "off (option \"collective\")"
                      : shared_memory ? "shared memory between ranks of one host, else gloo (tcp)"
                                      : "gloo (tcp); shared memory off (option \"shared_memory\")"},
#ifdef BACKPLANE_CPU_OPENMP_SPEC
      {"openmp", std::to_string(BACKPLANE_CPU_OPENMP_SPEC)},
#endif
      {"max_ndim", std::to_string(plugin::kMaxDims)},
  };
  if (std::string model = cpu_model(); !model.empty())
    info.attributes.emplace_back("cpu_model", std::move(model));
  if (!ops.all()) info.attributes.emplace_back("ops", restricted_ops(ops));
  if (dtypes != HeldDTypes::capabilities()) info.attributes.emplace_back("dtypes", restricted_dtypes(dtypes));
  if (flush_denormals)
    info.attributes.emplace_back(
        "flush_denormals",
        "f32/f64 arithmetic reads and gives subnormals as zero (option \"flush_denormals\")");
  return info;
}

plugin::MemoryInfo host_memory() {
  int64_t total_kb = -1;
  int64_t available_kb = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while ((total_kb < 0 || available_kb < 0) && std::getline(meminfo, line)) {
    if (const int64_t v = meminfo_kb(line, "MemTotal:"); v >= 0) total_kb = v;
    if (const int64_t v = meminfo_kb(line, "MemAvailable:"); v >= 0) available_kb = v;
  }
  if (total_kb >= 0 && available_kb >= 0)
    return {static_cast<uint64_t>(available_kb) * 1024, static_cast<uint64_t>(total_kb) * 1024};
  struct sysinfo s {};
  if (sysinfo(&s) != 0)
    plugin::fail(BP_STATUS_INTERNAL, "cpu: device_memory: neither /proc/meminfo nor sysinfo() could be read");
  const uint64_t unit = s.mem_unit != 0 ? s.mem_unit : 1;
  return {(static_cast<uint64_t>(s.freeram) + s.bufferram) * unit, static_cast<uint64_t>(s.totalram) * unit};
}

}  // namespace backplane::cpu
