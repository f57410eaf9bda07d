// skewed: a fixture plugin that is deliberately wrong, so the conformance
// suite can be shown to fail. One host-visible device; ADD, MUL and COPY on
// F32. MUL and COPY are right; ADD is off by 0.1% (far beyond the f32
// tolerance), so every add case with elements must be reported as a failure.
#include <backplane/plugin.hpp>

#include "fixture_kernels.hpp"
#include "host_buffers.hpp"

#include <cmath>

namespace {

namespace bpp = backplane::plugin;

class Skewed {
 public:
  using Features = bpp::Features<bpp::Feature::buffer_pointer>;

  explicit Skewed(const bpp::CreateArgs&) {}

  int32_t device_count() { return 1; }
  bpp::DeviceInfo device_info(int32_t) { return {"skewed:0", BP_CAP_HOST_VISIBLE | BP_CAP_F32, {}}; }
  bool supports_op(int32_t device, int32_t op, int32_t dtype) {
    return device == 0 && (op == BP_OP_ADD || op == BP_OP_MUL || op == BP_OP_COPY) && dtype == BP_DTYPE_F32;
  }
  bp_buffer* buffer_alloc(int32_t, uint64_t size) { return fixture::host_alloc(size); }
  void buffer_free(bp_buffer* b) noexcept { fixture::host_free(b); }
  bpp::BufferPointer buffer_pointer(bp_buffer* b) { return fixture::host_pointer(b); }
  void buffer_write(bp_buffer* b, uint64_t off, const void* src, uint64_t n) {
    fixture::host_write(b, off, src, n);
  }
  void buffer_read(bp_buffer* b, uint64_t off, void* dst, uint64_t n) { fixture::host_read(b, off, dst, n); }
  void execute(const bp_execute_args& args) {
    fixture::HostMemory memory;
    fixture::run_elementwise(args, memory);
    if (args.op != BP_OP_ADD) return;
    // The skew, applied through the output's own strides.
    const bpp::TensorView out =
        fixture::view_of(args.outputs[0], BP_DTYPE_F32, memory, "add", {"outputs", 0});
    fixture::elementwise<float>(
        out, [](float v) { return v + 1e-3f * (std::fabs(v) + 1.0f); }, out);
  }
};

}  // namespace

BP_DEFINE_PLUGIN(Skewed, "skewed", "0.1.0")
