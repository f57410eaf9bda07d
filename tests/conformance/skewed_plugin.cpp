// skewed: a fixture plugin that is deliberately wrong, so the conformance
// suite can be shown to fail. One host-visible device; ADD, MUL and COPY on
// F32. MUL and COPY are right; ADD is off by 0.1% (far beyond the f32
// tolerance), so every add case with elements must be reported as a failure.
#include <backplane/plugin.hpp>

#include "fixture_kernels.hpp"
#include "host_buffers.hpp"

#include <cmath>

namespace {

class Skewed {
 public:
  explicit Skewed(const backplane::plugin::CreateArgs&) {}

  int32_t device_count() { return 1; }
  backplane::plugin::DeviceInfo device_info(int32_t) { return {"skewed:0", BP_CAP_HOST_VISIBLE, {}, 0}; }
  bool supports_op(int32_t device, int32_t op, int32_t dtype) {
    return device == 0 && (op == BP_OP_ADD || op == BP_OP_MUL || op == BP_OP_COPY) && dtype == BP_DTYPE_F32;
  }
  bp_buffer* buffer_alloc(int32_t, uint64_t size) { return fixture::host_alloc(size); }
  void buffer_free(bp_buffer* b) noexcept { fixture::host_free(b); }
  void* buffer_host_ptr(bp_buffer* b) { return fixture::host_bytes(b); }
  void buffer_write(bp_buffer* b, uint64_t off, const void* src, uint64_t n) {
    fixture::host_write(b, off, src, n);
  }
  void buffer_read(bp_buffer* b, uint64_t off, void* dst, uint64_t n) { fixture::host_read(b, off, dst, n); }
  void execute(const bp_execute_args& args) {
    auto resolve = [](bp_buffer* b) { return fixture::host_bytes(b); };
    fixture::run_elementwise(args, resolve);
    if (args.op != BP_OP_ADD) return;
    const bp_tensor& out = args.outputs[0];  // contiguous: the host allocated it
    float* o = fixture::elements<float>(out, resolve);
    for (int64_t i = 0, n = fixture::numel(out); i < n; ++i) o[i] += 1e-3f * (std::fabs(o[i]) + 1.0f);
  }
};

}  // namespace

BP_DEFINE_PLUGIN(Skewed, "skewed", "0.1.0")
