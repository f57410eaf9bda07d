// The smallest useful backplane plugin written with the C++ SDK: one device
// in host memory, f32 only, three ops. FILL gives zeros(), ones() and full();
// COPY gives contiguous(), reshape() of a view, cat() and strided to(); ADD
// gives a + b with broadcasting. Everything else the host refuses with a
// typed unsupported_op error, because supports_op says no.
//
// The SDK (backplane/plugin.hpp) turns this class into the ABI's table: it
// catches every exception, reads argument structs through their struct_size,
// and leaves every optional entry NULL because the class lists no Features.
#include <backplane/plugin.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

// The plugin defines the ABI's opaque buffer type; the host only ever holds
// the pointer and hands it back.
struct bp_buffer {
  std::vector<unsigned char> bytes;
};

namespace {

namespace bpp = backplane::plugin;

class MinimalPlugin {
 public:
  // Cheap, as abi.h asks of create: parse the options, start nothing.
  explicit MinimalPlugin(const bpp::CreateArgs& args) {
    if (args.options_json.find_first_not_of("{} \t\r\n") != std::string::npos)
      bpp::fail(BP_STATUS_INVALID_ARGUMENT, "minimal_plugin_cpp takes no options, got " + args.options_json);
  }

  int32_t device_count() { return 1; }

  // Flags are what the host decides with: BP_CAP_F32 lets it create f32
  // tensors here; without BP_CAP_HOST_VISIBLE it reads them with buffer_read.
  bpp::DeviceInfo device_info(int32_t) { return {"minimal host memory", BP_CAP_F32, {}}; }

  // Raw values from the host, possibly from a newer header: answer no to
  // anything unknown. The answers must never change.
  bool supports_op(int32_t, int32_t op, int32_t dtype) {
    return dtype == BP_DTYPE_F32 && (op == BP_OP_FILL || op == BP_OP_COPY || op == BP_OP_ADD);
  }

  bp_buffer* buffer_alloc(int32_t, uint64_t size) {
    return std::make_unique<bp_buffer>(bp_buffer{std::vector<unsigned char>(size)}).release();
  }
  void buffer_free(bp_buffer* buffer) { std::unique_ptr<bp_buffer> owned(buffer); }

  // The host checked that [offset, offset + size) lies inside the buffer.
  void buffer_write(bp_buffer* b, uint64_t offset, const void* src, uint64_t size) {
    if (size > 0) std::memcpy(b->bytes.data() + offset, src, size);
  }
  void buffer_read(bp_buffer* b, uint64_t offset, void* dst, uint64_t size) {
    if (size > 0) std::memcpy(dst, b->bytes.data() + offset, size);
  }

  // Only ops supports_op accepted arrive, with shapes and dtypes checked and
  // inputs broadcast to the output's shape (stride 0 on broadcast dims).
  void execute(const bp_execute_args& args) {
    const char* op = bp_op_name(args.op);
    auto view = [&](const bp_tensor& t, bpp::Role role) {
      return bpp::make_view(t, BP_DTYPE_F32, t.buffer->bytes.data(), t.buffer->bytes.size(), op, role);
    };
    const bpp::TensorView out = view(args.outputs[0], {"outputs", 0});
    switch (args.op) {
      case BP_OP_FILL: {  // the output of a creation op is contiguous
        const float value = static_cast<float>(args.attrs->scalar0);
        float* o = out.as<float>();
        for (int64_t i = 0; i < out.numel; ++i) o[i] = value;
        return;
      }
      case BP_OP_COPY:
        copy(out, view(args.inputs[0], {"inputs", 0}));
        return;
      case BP_OP_ADD:
        add(out, view(args.inputs[0], {"inputs", 0}), view(args.inputs[1], {"inputs", 1}));
        return;
      default:
        bpp::fail(BP_STATUS_UNSUPPORTED,
                  bpp::op_name(args.op) + " is not supported here (supports_op answers no for it)");
    }
  }

 private:
  // Both loops walk the output's shape row by row; StridedLayout merges
  // dimensions that are dense in every operand, so a contiguous add is one row.
  static void copy(const bpp::TensorView& out, const bpp::TensorView& in) {
    if (out.numel == 0) return;
    bpp::StridedLayout<2> l = bpp::layout_of<2>(out, {&out, &in});
    bpp::coalesce(l);
    const int d = l.ndim - 1;
    float* o = out.as<float>();
    const float* x = in.as<const float>();
    bpp::for_each_row(l, 0, bpp::rows(l), [&](const int64_t* off) {
      for (int64_t j = 0; j < l.shape[d]; ++j)
        o[off[0] + j * l.strides[0][d]] = x[off[1] + j * l.strides[1][d]];
    });
  }
  static void add(const bpp::TensorView& out, const bpp::TensorView& a, const bpp::TensorView& b) {
    if (out.numel == 0) return;
    bpp::StridedLayout<3> l = bpp::layout_of<3>(out, {&out, &a, &b});
    bpp::coalesce(l);
    const int d = l.ndim - 1;
    float* o = out.as<float>();
    const float* x = a.as<const float>();
    const float* y = b.as<const float>();
    bpp::for_each_row(l, 0, bpp::rows(l), [&](const int64_t* off) {
      for (int64_t j = 0; j < l.shape[d]; ++j)
        o[off[0] + j * l.strides[0][d]] = x[off[1] + j * l.strides[1][d]] + y[off[2] + j * l.strides[2][d]];
    });
  }
};

}  // namespace

// The one exported symbol, bp_plugin_entry.
BP_DEFINE_PLUGIN(MinimalPlugin, "minimal_plugin_cpp", "0.1.0")
