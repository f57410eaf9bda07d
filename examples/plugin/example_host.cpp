// example_host: a backplane plugin that builds out of tree against an
// installed backplane (and in the tree). One host-visible device that adds
// f32 tensors (with the broadcasting strides the host hands it).
// Everything plugin.hpp needs is here: the class, its buffers, one macro.
#include <backplane/plugin.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

// The plugin's buffer type; the host only ever sees the opaque pointer.
struct bp_buffer {
  std::vector<unsigned char> bytes;
};

namespace {

using backplane::plugin::fail;

class ExampleHost {
 public:
  // Optional members this class implements: buffer_pointer, which
  // BP_CAP_HOST_VISIBLE requires (the host then reads tensors in place).
  using Features = backplane::plugin::Features<backplane::plugin::Feature::buffer_pointer>;

  explicit ExampleHost(const backplane::plugin::CreateArgs& args) {
    if (args.options_json.find_first_not_of("{} \t\n") != std::string::npos) {
      fail(BP_STATUS_INVALID_ARGUMENT, "example_host takes no options, got " + args.options_json);
    }
  }

  int32_t device_count() { return 1; }

  backplane::plugin::DeviceInfo device_info(int32_t device) {
    check_device(device);
    return {"example host", BP_CAP_HOST_VISIBLE | BP_CAP_F32, {{"example", "yes"}}};
  }

  bool supports_op(int32_t device, int32_t op, int32_t dtype) {
    return device == 0 && op == BP_OP_ADD && dtype == BP_DTYPE_F32;
  }

  bp_buffer* buffer_alloc(int32_t device, uint64_t size) {
    check_device(device);
    return std::make_unique<bp_buffer>(bp_buffer{std::vector<unsigned char>(size)}).release();
  }
  void buffer_free(bp_buffer* buffer) noexcept { std::unique_ptr<bp_buffer> owned(buffer); }
  backplane::plugin::BufferPointer buffer_pointer(bp_buffer* buffer) {
    return {buffer->bytes.data(), BP_DL_CPU, 0};
  }

  void buffer_write(bp_buffer* b, uint64_t offset, const void* src, uint64_t size) {
    check_range(b, offset, size);
    std::memcpy(b->bytes.data() + offset, src, size);
  }
  void buffer_read(bp_buffer* b, uint64_t offset, void* dst, uint64_t size) {
    check_range(b, offset, size);
    std::memcpy(dst, b->bytes.data() + offset, size);
  }

  // Inputs arrive broadcast to the output's shape (stride 0 on broadcast dims).
  void execute(const bp_execute_args& args) {
    if (args.op != BP_OP_ADD || args.num_inputs != 2 || args.num_outputs != 1) {
      fail(BP_STATUS_UNSUPPORTED, "example_host runs only add (op " + std::to_string(args.op) + ")");
    }
    const bp_tensor& out = args.outputs[0];
    int64_t count = 1;
    for (int32_t d = 0; d < out.ndim; ++d) count *= out.shape[d];
    std::vector<int64_t> index(static_cast<size_t>(out.ndim), 0);
    for (int64_t i = 0; i < count; ++i) {
      at(out, index) = at(args.inputs[0], index) + at(args.inputs[1], index);
      for (int32_t d = out.ndim - 1; d >= 0 && ++index[d] == out.shape[d]; --d) index[d] = 0;
    }
  }

 private:
  static void check_device(int32_t device) {
    if (device != 0) fail(BP_STATUS_INVALID_ARGUMENT, "no device " + std::to_string(device));
  }
  static void check_range(const bp_buffer* b, uint64_t offset, uint64_t size) {
    if (offset > b->bytes.size() || size > b->bytes.size() - offset) {
      fail(BP_STATUS_INVALID_ARGUMENT, "access past the end of a buffer");
    }
  }
  static float& at(const bp_tensor& t, const std::vector<int64_t>& index) {
    int64_t element = 0;
    for (int32_t d = 0; d < t.ndim; ++d) element += index[d] * t.strides[d];
    return reinterpret_cast<float*>(t.buffer->bytes.data() + t.byte_offset)[element];
  }
};

}  // namespace

BP_DEFINE_PLUGIN(ExampleHost, "example_host", "0.1.0")
