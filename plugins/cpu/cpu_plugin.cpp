// The cpu backend plugin (libbackplane_cpu): one host device, buffers in host memory,
// OpenMP elementwise kernels, OpenBLAS GEMM, Gloo collectives (collectives.hpp). It
// runs every op synchronously, so it does not declare BP_CAP_ASYNC.
#include <backplane/abi.h>
#include <unistd.h>

#include <algorithm>
#include <backplane/plugin.hpp>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "collectives.hpp"
#include "dtypes.hpp"
#include "elementwise_ops.hpp"
#include "gemm.hpp"
#include "host_buffer.hpp"
#include "index.hpp"
#include "kernels.hpp"
#include "reduce.hpp"
#include "softmax.hpp"

namespace backplane::cpu {
namespace {

using plugin::fail;

// Upper bound of the "threads" option: more would only exhaust the process's threads.
constexpr int64_t kMaxThreadsOption = 1024;

std::string op_name(int32_t op) {
  if (const char* name = elementwise_op_name(op)) return name;
  switch (op) {
    case BP_OP_ADD:
      return "add";
    case BP_OP_SUB:
      return "sub";
    case BP_OP_MUL:
      return "mul";
    case BP_OP_DIV:
      return "div";
    case BP_OP_MATMUL:
      return "matmul";
    case BP_OP_COPY:
      return "copy";
    case BP_OP_SUM:
      return "sum";
    case BP_OP_MEAN:
      return "mean";
    case BP_OP_MAX:
      return "max";
    case BP_OP_MIN:
      return "min";
    case BP_OP_ARGMAX:
      return "argmax";
    case BP_OP_ARGMIN:
      return "argmin";
    case BP_OP_SOFTMAX:
      return "softmax";
    case BP_OP_LOG_SOFTMAX:
      return "log_softmax";
    case BP_OP_INDEX_SELECT:
      return "index_select";
    case BP_OP_GATHER:
      return "gather";
    default:
      return "op " + std::to_string(op);
  }
}


bool is_arithmetic_dtype(int32_t dtype) noexcept {
  return dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64 || dtype == BP_DTYPE_I32 || dtype == BP_DTYPE_I64;
}

bool is_float_dtype(int32_t dtype) noexcept { return dtype == BP_DTYPE_F32 || dtype == BP_DTYPE_F64; }

void check_device(int32_t device) {
  if (device != 0)
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: no device " + std::to_string(device) + " (the cpu backend has 1 device)");
}

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

struct PluginOptions {
  int64_t threads = 0;     // 0: OpenMP's default
  bool collective = true;  // false: no BP_CAP_COLLECTIVE (forces the host's collective_fallback)
  NetworkOptions network;  // where collectives listen
};

// A non-empty string option, or a clear error.
std::string string_option(const std::string& key, const nlohmann::json& value) {
  if (!value.is_string() || value.get<std::string>().empty())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: option " + nlohmann::json(key).dump() + " must be a non-empty string, got " + value.dump());
  return value.get<std::string>();
}

// Parses the options object (or null). Accepts "threads", "collective", "hostname", "interface".
PluginOptions parse_options(const std::string& text) {
  nlohmann::json options;
  try {
    options = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cpu: options are not valid JSON: ") + e.what());
  }
  PluginOptions parsed;
  if (options.is_null()) return parsed;
  if (!options.is_object())
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: options must be a JSON object, got " + options.dump());
  for (const auto& [key, value] : options.items()) {
    if (key == "hostname") {
      parsed.network.hostname = string_option(key, value);
      continue;
    }
    if (key == "interface") {
      parsed.network.interface = string_option(key, value);
      continue;
    }
    if (key == "collective") {
      if (!value.is_boolean())
        fail(BP_STATUS_INVALID_ARGUMENT,
             "cpu: option \"collective\" must be true or false, got " + value.dump());
      parsed.collective = value.get<bool>();
      continue;
    }
    if (key != "threads")
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cpu: unknown option " + nlohmann::json(key).dump() +
               " (accepted: \"threads\", \"collective\", \"hostname\", \"interface\")");
    // nlohmann stores non-negative integers as unsigned, negative ones as signed.
    if (!value.is_number_unsigned())
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cpu: option \"threads\" must be a non-negative integer, got " + value.dump());
    const uint64_t n = value.get<uint64_t>();
    if (n > static_cast<uint64_t>(kMaxThreadsOption))
      fail(BP_STATUS_INVALID_ARGUMENT, "cpu: option \"threads\" must be at most " +
                                           std::to_string(kMaxThreadsOption) + ", got " + value.dump());
    parsed.threads = static_cast<int64_t>(n);
  }
  if (!parsed.network.hostname.empty() && !parsed.network.interface.empty())
    fail(BP_STATUS_INVALID_ARGUMENT,
         "cpu: options \"hostname\" and \"interface\" both say where collectives listen; set one of them");
  return parsed;
}

// ---------------------------------------------------------------------------
// Tensor views: validated once per operand, then handed to kernels as raw data.
// ---------------------------------------------------------------------------

struct Role {
  const char* list;  // "inputs" or "outputs"
  int index;
};

struct View {
  unsigned char* data;  // element [0, ..., 0]; meaningful only when numel > 0
  int64_t numel;
  uintptr_t first;  // bytes touched: [first, last); both 0 when numel == 0
  uintptr_t last;
  int32_t ndim;
  int32_t element_size;
  const int64_t* shape;
  const int64_t* strides;
  bool contiguous;  // row-major dense (dimensions of extent 1 ignored)
  bool scalar;      // every stride 0 (or extent 1): one element broadcast
};

std::string describe(int32_t ndim, const int64_t* values) {
  std::string s = "[";
  for (int32_t d = 0; d < ndim; ++d) {
    if (d > 0) s += ",";
    s += std::to_string(values[d]);
  }
  return s + "]";
}

[[noreturn]] void tensor_fail(int32_t op, Role role, const std::string& what) {
  fail(BP_STATUS_INVALID_ARGUMENT,
       "cpu: " + op_name(op) + ": " + role.list + "[" + std::to_string(role.index) + "]: " + what);
}

enum class ViewError {
  kNone,
  kNullBuffer,
  kDeadBuffer,
  kDevice,
  kDtype,
  kNdim,
  kNullArrays,
  kMisaligned,
  kNegativeExtent,
  kCountOverflow,
  kOutOfBounds,
};

// The checks of view_of, without building any message (this runs for every operand
// of every op). dtype must be known: element_size(dtype) > 0.
ViewError check_view(const bp_tensor& t, int32_t dtype, View& v) noexcept {
  if (t.buffer == nullptr) return ViewError::kNullBuffer;
  if (!is_live(t.buffer)) return ViewError::kDeadBuffer;
  if (t.device != 0) return ViewError::kDevice;
  if (t.dtype != dtype) return ViewError::kDtype;
  if (t.ndim < 0 || t.ndim > kMaxDims) return ViewError::kNdim;
  if (t.ndim > 0 && (t.shape == nullptr || t.strides == nullptr)) return ViewError::kNullArrays;
  const int esize = element_size(dtype);  // a power of two
  if ((t.byte_offset & static_cast<uint64_t>(esize - 1)) != 0) return ViewError::kMisaligned;

  // numel, layout flags, and the lowest / highest element offsets the view reaches
  // (strides may be negative). Offset overflow matters only when there are elements.
  // Locals, not v's fields: stores through v could alias shape/strides and force reloads.
  int64_t numel = 1;
  int64_t low = 0;
  int64_t high = 0;
  bool contiguous = true;
  bool scalar = true;
  bool overflow = false;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    const int64_t n = t.shape[d];
    const int64_t stride = t.strides[d];
    if (n < 0) return ViewError::kNegativeExtent;
    if (n != 1) {
      contiguous = contiguous && stride == numel;
      scalar = scalar && stride == 0;
    }
    if (__builtin_mul_overflow(numel, n, &numel)) return ViewError::kCountOverflow;
    int64_t span = 0;
    overflow |= __builtin_mul_overflow(n > 0 ? n - 1 : 0, stride, &span);
    overflow |= __builtin_add_overflow(span < 0 ? low : high, span, span < 0 ? &low : &high);
  }
  unsigned char* base = buffer_data(t.buffer);
  v = View{base, numel, 0, 0, t.ndim, esize, t.shape, t.strides, contiguous, scalar};
  if (numel == 0) return ViewError::kNone;

  // Bytes [first, last) relative to the buffer start must lie inside it.
  int64_t first = 0;
  int64_t last = 0;
  overflow |=
      __builtin_mul_overflow(low, esize, &first) || __builtin_add_overflow(first, t.byte_offset, &first);
  overflow |= __builtin_add_overflow(high, 1, &last) || __builtin_mul_overflow(last, esize, &last) ||
              __builtin_add_overflow(last, t.byte_offset, &last);
  if (overflow || first < 0 || static_cast<uint64_t>(last) > buffer_size(t.buffer))
    return ViewError::kOutOfBounds;
  v.data = base + t.byte_offset;
  v.first = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(first);
  v.last = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(last);
  return ViewError::kNone;
}

[[noreturn, gnu::cold, gnu::noinline]] void view_fail(ViewError error, const bp_tensor& t, int32_t op,
                                                      Role role, int32_t dtype) {
  switch (error) {
    case ViewError::kNullBuffer:
      tensor_fail(op, role, "buffer is NULL");
    case ViewError::kDeadBuffer:
      tensor_fail(op, role, "buffer is not a live cpu buffer (freed, or another backend's)");
    case ViewError::kDevice:
      tensor_fail(op, role, "no device " + std::to_string(t.device) + " (the cpu backend has 1 device)");
    case ViewError::kDtype:
      tensor_fail(op, role, "dtype " + dtype_name(t.dtype) + " differs from " + dtype_name(dtype));
    case ViewError::kNdim:
      tensor_fail(op, role,
                  "ndim " + std::to_string(t.ndim) + " is outside [0, " + std::to_string(kMaxDims) + "]");
    case ViewError::kNullArrays:
      tensor_fail(op, role, "shape or strides is NULL");
    case ViewError::kMisaligned:
      tensor_fail(op, role,
                  "byte_offset " + std::to_string(t.byte_offset) +
                      " is not a multiple of the element size (" + std::to_string(element_size(dtype)) + ")");
    case ViewError::kNegativeExtent:
      tensor_fail(op, role, "shape " + describe(t.ndim, t.shape) + " has a negative extent");
    case ViewError::kCountOverflow:
      tensor_fail(op, role, "shape " + describe(t.ndim, t.shape) + ": element count overflows");
    case ViewError::kOutOfBounds:
      tensor_fail(op, role,
                  "view (byte_offset " + std::to_string(t.byte_offset) + ", shape " +
                      describe(t.ndim, t.shape) + ", strides " + describe(t.ndim, t.strides) +
                      ") reaches outside its buffer of " + std::to_string(buffer_size(t.buffer)) + " bytes");
    case ViewError::kNone:
      break;
  }
  fail(BP_STATUS_INTERNAL, "cpu: " + op_name(op) + ": unexpected view error");
}

// Checks that t is a well-formed view of `dtype` lying inside its buffer.
inline View view_of(const bp_tensor& t, int32_t op, Role role, int32_t dtype) {
  View v;
  const ViewError error = check_view(t, dtype, v);
  if (error != ViewError::kNone) [[unlikely]]
    view_fail(error, t, op, role, dtype);
  return v;
}

bool same_shape(const View& x, const View& y) noexcept {
  if (x.ndim != y.ndim) return false;
  for (int32_t d = 0; d < x.ndim; ++d)
    if (x.shape[d] != y.shape[d]) return false;
  return true;
}

[[noreturn, gnu::cold, gnu::noinline]] void shape_fail(int32_t op, const View& out, const View& in,
                                                       Role role) {
  tensor_fail(
      op, role,
      "shape " + describe(in.ndim, in.shape) + " differs from the output's " + describe(out.ndim, out.shape));
}

inline void expect_same_shape(int32_t op, const View& out, const View& in, Role role) {
  if (!same_shape(out, in)) [[unlikely]]
    shape_fail(op, out, in, role);
}

// Writing through v touches each element once: no two indices share an address.
// Sufficient test: sorted by stride, each stride exceeds the reach of the smaller ones.
bool writes_distinct_elements(const View& v) noexcept {
  if (v.contiguous || v.numel <= 1) return true;
  int64_t strides[kMaxDims];
  int64_t extents[kMaxDims];
  int n = 0;
  for (int32_t d = 0; d < v.ndim; ++d) {
    if (v.shape[d] == 1) continue;
    strides[n] = v.strides[d] < 0 ? -v.strides[d] : v.strides[d];
    extents[n] = v.shape[d];
    ++n;
  }
  for (int i = 1; i < n; ++i)  // insertion sort: n is tiny
    for (int j = i; j > 0 && strides[j - 1] > strides[j]; --j) {
      std::swap(strides[j - 1], strides[j]);
      std::swap(extents[j - 1], extents[j]);
    }
  __int128 reach = 0;
  for (int i = 0; i < n; ++i) {
    if (strides[i] <= reach) return false;
    reach += static_cast<__int128>(strides[i]) * (extents[i] - 1);
  }
  return true;
}

[[noreturn, gnu::cold, gnu::noinline]] void writable_fail(int32_t op, const View& out) {
  tensor_fail(op, {"outputs", 0},
              "strides " + describe(out.ndim, out.strides) +
                  " make elements share memory (an output cannot be broadcast)");
}

inline void expect_writable(int32_t op, const View& out) {
  if (!writes_distinct_elements(out)) [[unlikely]]
    writable_fail(op, out);
}

[[noreturn, gnu::cold, gnu::noinline]] void arity_fail(const bp_execute_args& args, int32_t inputs,
                                                       int32_t outputs) {
  fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + op_name(args.op) + ": expects " + std::to_string(inputs) +
                                       " inputs and " + std::to_string(outputs) + " output, got " +
                                       std::to_string(args.num_inputs) + " and " +
                                       std::to_string(args.num_outputs));
}

inline void expect_arity(const bp_execute_args& args, int32_t inputs, int32_t outputs) {
  if (args.num_inputs != inputs || args.num_outputs != outputs || (inputs > 0 && args.inputs == nullptr) ||
      (outputs > 0 && args.outputs == nullptr)) [[unlikely]]
    arity_fail(args, inputs, outputs);
}

bool overlaps(const View& x, const View& y) noexcept {
  return x.numel > 0 && y.numel > 0 && x.first < y.last && y.first < x.last;
}

// x and y address the very same elements in the same order (an in-place op).
bool same_elements(const View& x, const View& y) noexcept {
  if (x.data != y.data || !same_shape(x, y)) return false;
  for (int32_t d = 0; d < x.ndim; ++d)
    if (x.shape[d] != 1 && x.strides[d] != y.strides[d]) return false;
  return true;
}

void row_major_strides(int32_t ndim, const int64_t* shape, int64_t* strides) noexcept {
  int64_t s = 1;
  for (int32_t d = ndim - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
}

// Copies x into fresh contiguous row-major storage; writes its strides to `strides`.
// Used when an input overlaps the output, so the kernel never reads what it wrote.
const unsigned char* materialize(const View& x, std::unique_ptr<unsigned char[]>& storage, int64_t* strides,
                                 int threads) {
  storage =
      std::make_unique_for_overwrite<unsigned char[]>(static_cast<std::size_t>(x.numel * x.element_size));
  StridedLayout<2> l;
  l.ndim = x.ndim;
  for (int32_t d = 0; d < x.ndim; ++d) {
    l.shape[d] = x.shape[d];
    l.strides[1][d] = x.strides[d];
  }
  row_major_strides(x.ndim, x.shape, l.strides[0]);
  row_major_strides(x.ndim, x.shape, strides);
  coalesce(l);
  copy_strided_bytes(l, x.data, storage.get(), x.element_size, threads);
  return storage.get();
}

template <class T>
bool binary_typed(int32_t op, const StridedLayout<3>& l, const void* a, const void* b, void* out,
                  int threads) {
  const T* ta = static_cast<const T*>(a);
  const T* tb = static_cast<const T*>(b);
  T* to = static_cast<T*>(out);
  switch (op) {
    case BP_OP_ADD:
      return binary<BinaryOp::add, T>(l, ta, tb, to, threads);
    case BP_OP_SUB:
      return binary<BinaryOp::sub, T>(l, ta, tb, to, threads);
    case BP_OP_MUL:
      return binary<BinaryOp::mul, T>(l, ta, tb, to, threads);
    default:
      return binary<BinaryOp::div, T>(l, ta, tb, to, threads);
  }
}

// Dense operands (each input may be a single broadcast element); see binary().
template <BinaryOp Op, class T>
bool binary_flat_op(const View& a, const View& b, const View& out, int threads) {
  const T* pa = reinterpret_cast<const T*>(a.data);
  const T* pb = reinterpret_cast<const T*>(b.data);
  T* po = reinterpret_cast<T*>(out.data);
  if (a.contiguous && b.contiguous) return binary_contiguous<Op, T>(pa, pb, po, out.numel, threads);
  if (b.contiguous) return binary_scalar_lhs<Op, T>(*pa, pb, po, out.numel, threads);
  if (a.contiguous) return binary_scalar_rhs<Op, T>(pa, *pb, po, out.numel, threads);
  // Both inputs are one broadcast element: compute it once, then fill.
  if (!binary_scalar_rhs<Op, T>(pa, *pb, po, 1, threads)) return false;
  std::fill(po + 1, po + out.numel, *po);
  return true;
}

template <class T>
bool binary_flat(int32_t op, const View& a, const View& b, const View& out, int threads) {
  switch (op) {
    case BP_OP_ADD:
      return binary_flat_op<BinaryOp::add, T>(a, b, out, threads);
    case BP_OP_SUB:
      return binary_flat_op<BinaryOp::sub, T>(a, b, out, threads);
    case BP_OP_MUL:
      return binary_flat_op<BinaryOp::mul, T>(a, b, out, threads);
    default:
      return binary_flat_op<BinaryOp::div, T>(a, b, out, threads);
  }
}

[[noreturn, gnu::cold, gnu::noinline]] void division_by_zero(int32_t dtype) {
  fail(BP_STATUS_INVALID_ARGUMENT, "cpu: integer division by zero in div (" + dtype_name(dtype) + ")");
}

template <class T>
void gemm_views(const View& a, const unsigned char* a_data, const int64_t* a_strides, const View& b,
                const unsigned char* b_data, const int64_t* b_strides, const View& out) {
  // The last two dims are the matrices; any before them are batch dims (same extents on
  // all three, already broadcast by the host).
  const int32_t r = out.ndim - 2;
  const MatrixView<const T> ma{reinterpret_cast<const T*>(a_data), a.shape[r], a.shape[r + 1], a_strides[r],
                               a_strides[r + 1]};
  const MatrixView<const T> mb{reinterpret_cast<const T*>(b_data), b.shape[r], b.shape[r + 1], b_strides[r],
                               b_strides[r + 1]};
  const MatrixView<T> mc{reinterpret_cast<T*>(out.data), out.shape[r], out.shape[r + 1], out.strides[r],
                         out.strides[r + 1]};
  if (r == 0)
    gemm<T>(ma, mb, mc);
  else
    gemm_batched<T>(ma, a_strides, mb, b_strides, mc, out.strides, r, out.shape);
}

// ---------------------------------------------------------------------------
// Reductions, softmax, index_select / gather: typed entry points
// ---------------------------------------------------------------------------

// A contiguous tensor around an axis: [outer, n, inner].
struct AxisSplit {
  int64_t axis;
  int64_t outer;
  int64_t n;
  int64_t inner;
};

// attrs.axis of args, checked against x (0 <= axis < ndim; a 0-d x takes axis 0 as n = 1).
AxisSplit split_at_axis(const bp_execute_args& args, const View& x) {
  if (args.attrs == nullptr || !BP_HAS_FIELD(bp_op_attrs, axis, args.attrs->struct_size))
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + op_name(args.op) + ": attrs (with axis) are missing");
  const int64_t axis = args.attrs->axis;
  if (!(axis >= 0 && (axis < x.ndim || (x.ndim == 0 && axis == 0))))
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + op_name(args.op) + ": axis " +
                                         (axis == BP_AXIS_NONE ? std::string("NONE") : std::to_string(axis)) +
                                         " is outside [0, " + std::to_string(x.ndim) +
                                         ") for inputs[0] of shape " + describe(x.ndim, x.shape));
  AxisSplit s{axis, 1, 1, 1};
  for (int32_t d = 0; d < x.ndim; ++d) {
    if (d < axis) s.outer *= x.shape[d];
    if (d == axis) s.n = x.shape[d];
    if (d > axis) s.inner *= x.shape[d];
  }
  return s;
}

[[noreturn, gnu::cold, gnu::noinline]] void contiguous_fail(int32_t op, const View& out) {
  tensor_fail(op, {"outputs", 0},
              "strides " + describe(out.ndim, out.strides) + " of shape " + describe(out.ndim, out.shape) +
                  " are not contiguous row-major (the host allocates outputs so)");
}

inline void expect_contiguous(int32_t op, const View& out) {
  if (!out.contiguous) [[unlikely]]
    contiguous_fail(op, out);
}

template <ReduceOp Op, class T>
bool reduce_as(const unsigned char* in, unsigned char* out, const AxisSplit& s, int threads) {
  return reduce<Op, T>(reinterpret_cast<const T*>(in), reinterpret_cast<ReduceOut<Op, T>*>(out), s.outer, s.n,
                       s.inner, threads);
}

template <ReduceOp Op>
bool reduce_dtype(int32_t dtype, const unsigned char* in, unsigned char* out, const AxisSplit& s,
                  int threads) {
  switch (dtype) {
    case BP_DTYPE_F32:
      return reduce_as<Op, float>(in, out, s, threads);
    case BP_DTYPE_F64:
      return reduce_as<Op, double>(in, out, s, threads);
    case BP_DTYPE_I32:
      if constexpr (Op != ReduceOp::mean) return reduce_as<Op, int32_t>(in, out, s, threads);
      break;
    case BP_DTYPE_I64:
      if constexpr (Op != ReduceOp::mean) return reduce_as<Op, int64_t>(in, out, s, threads);
      break;
    default:
      break;
  }
  fail(BP_STATUS_UNSUPPORTED, "cpu: reduction on " + dtype_name(dtype) + " is not supported");
}

// Returns false for an empty axis of an op that has no value there (max, min, arg*).
bool reduce_op(int32_t op, int32_t dtype, const unsigned char* in, unsigned char* out, const AxisSplit& s,
               int threads) {
  switch (op) {
    case BP_OP_SUM:
      return reduce_dtype<ReduceOp::sum>(dtype, in, out, s, threads);
    case BP_OP_MEAN:
      return reduce_dtype<ReduceOp::mean>(dtype, in, out, s, threads);
    case BP_OP_MAX:
      return reduce_dtype<ReduceOp::max>(dtype, in, out, s, threads);
    case BP_OP_MIN:
      return reduce_dtype<ReduceOp::min>(dtype, in, out, s, threads);
    case BP_OP_ARGMAX:
      return reduce_dtype<ReduceOp::argmax>(dtype, in, out, s, threads);
    default:
      return reduce_dtype<ReduceOp::argmin>(dtype, in, out, s, threads);
  }
}

void softmax_op(int32_t op, int32_t dtype, const unsigned char* in, unsigned char* out, const AxisSplit& s,
                int threads) {
  const bool log = op == BP_OP_LOG_SOFTMAX;
  const auto run = [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    const auto* x = reinterpret_cast<const T*>(in);
    auto* y = reinterpret_cast<T*>(out);
    if (log)
      softmax<true>(x, y, s.outer, s.n, s.inner, threads);
    else
      softmax<false>(x, y, s.outer, s.n, s.inner, threads);
  };
  if (dtype == BP_DTYPE_F32)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<double*>(nullptr));
}

// The multi-index of row-major position `flat` within shape, as "[i,j,...]".
std::string unravel(int64_t flat, int32_t ndim, const int64_t* shape) {
  int64_t index[kMaxDims];
  for (int32_t d = ndim - 1; d >= 0; --d) {
    index[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return describe(ndim, index);
}

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

// ---------------------------------------------------------------------------
// The plugin
// ---------------------------------------------------------------------------

// Immutable after construction, so every entry may run concurrently.
class CpuPlugin {
 public:
  explicit CpuPlugin(const plugin::CreateArgs& args) {
    PluginOptions options = parse_options(args.options_json);
    network_ = std::move(options.network);
    collective_ = options.collective;
    const int64_t requested = options.threads;
#ifdef _OPENMP
    threads_ = requested > 0 ? static_cast<int>(requested) : omp_get_max_threads();
#else
    (void)requested;  // built without OpenMP (e.g. the TSan build): kernels run on the calling thread
    threads_ = 1;
#endif
    if (threads_ < 1) threads_ = 1;
    plugin::log(BP_LOG_DEBUG, "cpu: created with " + std::to_string(threads_) + " threads");
  }

  int32_t device_count() { return 1; }

  plugin::DeviceInfo device_info(int32_t device) {
    check_device(device);
    plugin::DeviceInfo info;
    info.name = "host (" + std::to_string(threads_) + " threads)";
    info.capabilities = BP_CAP_HOST_VISIBLE | BP_CAP_F64 | BP_CAP_INT64 | BP_CAP_MATMUL;
    if (collective_) info.capabilities |= BP_CAP_COLLECTIVE;
    info.attributes.emplace_back("threads", std::to_string(threads_));
    const char* blas = openblas_get_config();
    info.attributes.emplace_back("blas", blas != nullptr ? blas : "OpenBLAS");
    info.attributes.emplace_back("blas_threads", std::to_string(openblas_get_num_threads()));
    info.attributes.emplace_back("simd", simd_description());
    info.attributes.emplace_back("vector_math", elementwise_vector_math());
    info.attributes.emplace_back("rng", elementwise_rng());
    info.attributes.emplace_back("collectives", collective_ ? "gloo (tcp)" : "off (option \"collective\")");
#ifdef _OPENMP
    info.attributes.emplace_back("openmp", std::to_string(_OPENMP));
#endif
    info.attributes.emplace_back("max_ndim", std::to_string(kMaxDims));
    if (std::string model = cpu_model(); !model.empty())
      info.attributes.emplace_back("cpu_model", std::move(model));
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0)
      info.memory_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
    return info;
  }

  // op and dtype arrive as the host's raw values: a newer host may send ones this
  // build does not know, which simply answer false.
  bool supports_op(int32_t device, int32_t op, int32_t dtype) {
    if (device != 0) return false;
    if (is_elementwise_op(op)) return elementwise_supports(op, dtype);
    switch (op) {
      case BP_OP_ADD:
      case BP_OP_SUB:
      case BP_OP_MUL:
      case BP_OP_DIV:
        return is_arithmetic_dtype(dtype);
      case BP_OP_MATMUL:
        return is_float_dtype(dtype);
      case BP_OP_COPY:
        return element_size(dtype) != 0;
      case BP_OP_SUM:
      case BP_OP_MAX:
      case BP_OP_MIN:
      case BP_OP_ARGMAX:  // dtype is the input's; the output is I64
      case BP_OP_ARGMIN:
        return is_arithmetic_dtype(dtype);
      case BP_OP_MEAN:
      case BP_OP_SOFTMAX:
      case BP_OP_LOG_SOFTMAX:
        return is_float_dtype(dtype);
      case BP_OP_INDEX_SELECT:  // dtype is x's; the index is I64
      case BP_OP_GATHER:
        return element_size(dtype) != 0;
      default:
        return false;
    }
  }

  bp_buffer* buffer_alloc(int32_t device, uint64_t size) {
    check_device(device);
    bp_buffer* buffer = allocate_buffer(size);
    if (buffer == nullptr)
      fail(BP_STATUS_OUT_OF_MEMORY, "cpu: cannot allocate " + std::to_string(size) + " bytes");
    return buffer;
  }

  void buffer_free(bp_buffer* buffer) noexcept {
    if (buffer == nullptr) return;
    if (!is_live(buffer)) {
      // Leaking beats corrupting the heap on a double free.
      plugin::log(BP_LOG_ERROR, "cpu: buffer_free: not a live cpu buffer (freed twice?); ignored");
      return;
    }
    free_buffer(buffer);
  }

  // DLPack import: adopts host memory without copying. Once the buffer exists it owns
  // `release` (handed_over), which free_buffer calls exactly once; `data` is never freed.
  bp_buffer* buffer_wrap_host(int32_t device, void* data, uint64_t size, void (*release)(void*),
                              void* release_ctx, bool& handed_over) {
    check_device(device);
    if (data == nullptr && size > 0)
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cpu: buffer_wrap_host: data is NULL but size is " + std::to_string(size) + " bytes");
    if (size > UINT64_MAX / 2 || reinterpret_cast<uintptr_t>(data) > UINTPTR_MAX - size)
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cpu: buffer_wrap_host: " + std::to_string(size) + " bytes at the given address wrap around memory");
    bp_buffer* buffer = wrap_buffer(data, size, release, release_ctx);
    if (buffer == nullptr) fail(BP_STATUS_OUT_OF_MEMORY, "cpu: buffer_wrap_host: cannot allocate a buffer header");
    handed_over = true;
    return buffer;
  }

  void buffer_write(bp_buffer* buffer, uint64_t offset, const void* src, uint64_t size) {
    check_range("buffer_write", buffer, offset, size);
    if (size == 0) return;
    if (src == nullptr) fail(BP_STATUS_INVALID_ARGUMENT, "cpu: buffer_write: src is NULL");
    copy_bytes(buffer_data(buffer) + offset, src, static_cast<int64_t>(size), threads_);
  }

  void buffer_read(bp_buffer* buffer, uint64_t offset, void* dst, uint64_t size) {
    check_range("buffer_read", buffer, offset, size);
    if (size == 0) return;
    if (dst == nullptr) fail(BP_STATUS_INVALID_ARGUMENT, "cpu: buffer_read: dst is NULL");
    copy_bytes(dst, buffer_data(buffer) + offset, static_cast<int64_t>(size), threads_);
  }

  void* buffer_host_ptr(bp_buffer* buffer) { return is_live(buffer) ? buffer_data(buffer) : nullptr; }

  void execute(const bp_execute_args& args) {
    if (!BP_HAS_FIELD(bp_execute_args, outputs, args.struct_size))
      fail(BP_STATUS_INVALID_ARGUMENT, "cpu: execute: args.struct_size " + std::to_string(args.struct_size) +
                                           " is too small for ABI 1.0");
    check_device(args.device);
    if (is_elementwise_op(args.op)) return execute_elementwise(args);
    switch (args.op) {
      case BP_OP_ADD:
      case BP_OP_SUB:
      case BP_OP_MUL:
      case BP_OP_DIV:
        return execute_binary(args);
      case BP_OP_MATMUL:
        return execute_matmul(args);
      case BP_OP_COPY:
        return execute_copy(args);
      case BP_OP_SUM:
      case BP_OP_MEAN:
      case BP_OP_MAX:
      case BP_OP_MIN:
      case BP_OP_ARGMAX:
      case BP_OP_ARGMIN:
        return execute_reduce(args);
      case BP_OP_SOFTMAX:
      case BP_OP_LOG_SOFTMAX:
        return execute_softmax(args);
      case BP_OP_INDEX_SELECT:
      case BP_OP_GATHER:
        return execute_take(args);
      default:
        fail(BP_STATUS_UNSUPPORTED, "cpu: " + op_name(args.op) + " is not supported");
    }
  }

  // Collectives (collectives.hpp). A comm handle is the Communicator itself.
  bp_comm* comm_create(const bp_comm_create_args& args) {
    if (!collective_)
      fail(BP_STATUS_UNSUPPORTED,
           "cpu: comm_create: collectives are switched off by the cpu option \"collective\": false");
    return Communicator::create(args, network_).release()->handle();
  }
  void comm_destroy(bp_comm* comm) {
    if (comm != nullptr) delete &Communicator::from_handle(comm, "comm_destroy");
  }
  void all_reduce(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    Communicator::from_handle(comm, "all_reduce").all_reduce(in, out, op);
  }
  void broadcast(bp_comm* comm, const bp_tensor& tensor, int32_t root) {
    Communicator::from_handle(comm, "broadcast").broadcast(tensor, root);
  }
  void all_gather(bp_comm* comm, const bp_tensor& in, const bp_tensor& out) {
    Communicator::from_handle(comm, "all_gather").all_gather(in, out);
  }
  void reduce_scatter(bp_comm* comm, const bp_tensor& in, const bp_tensor& out, bp_reduce_op op) {
    Communicator::from_handle(comm, "reduce_scatter").reduce_scatter(in, out, op);
  }
  void barrier(bp_comm* comm) { Communicator::from_handle(comm, "barrier").barrier(); }

 private:
  void check_range(const char* what, bp_buffer* buffer, uint64_t offset, uint64_t size) const {
    if (!is_live(buffer))
      fail(BP_STATUS_INVALID_ARGUMENT,
           std::string("cpu: ") + what + ": not a live cpu buffer (NULL, freed, or another backend's)");
    const uint64_t capacity = buffer_size(buffer);
    if (offset > capacity || size > capacity - offset)
      fail(BP_STATUS_INVALID_ARGUMENT, std::string("cpu: ") + what + ": offset " + std::to_string(offset) +
                                           " + size " + std::to_string(size) + " exceeds the buffer size " +
                                           std::to_string(capacity));
  }

  void execute_binary(const bp_execute_args& args) {
    const int32_t op = args.op;
    expect_arity(args, 2, 1);
    const int32_t dtype = args.outputs[0].dtype;
    if (!is_arithmetic_dtype(dtype))
      fail(BP_STATUS_UNSUPPORTED,
           "cpu: " + op_name(op) + ": dtype " + dtype_name(dtype) + " is not supported (f32, f64, i32, i64)");
    const View out = view_of(args.outputs[0], op, {"outputs", 0}, dtype);
    const View a = view_of(args.inputs[0], op, {"inputs", 0}, dtype);
    const View b = view_of(args.inputs[1], op, {"inputs", 1}, dtype);
    expect_same_shape(op, out, a, {"inputs", 0});
    expect_same_shape(op, out, b, {"inputs", 1});
    expect_writable(op, out);
    if (out.numel == 0) return;

    bool ok = true;
    // Fast path, no layout work: dense output, each input dense or one broadcast
    // element, none overlapping the output except as the very same elements.
    if (out.contiguous && (a.contiguous || a.scalar) && (b.contiguous || b.scalar) &&
        (!overlaps(a, out) || (a.contiguous && a.data == out.data)) &&
        (!overlaps(b, out) || (b.contiguous && b.data == out.data))) {
      switch (dtype) {
        case BP_DTYPE_F32:
          ok = binary_flat<float>(op, a, b, out, threads_);
          break;
        case BP_DTYPE_F64:
          ok = binary_flat<double>(op, a, b, out, threads_);
          break;
        case BP_DTYPE_I32:
          ok = binary_flat<int32_t>(op, a, b, out, threads_);
          break;
        case BP_DTYPE_I64:
          ok = binary_flat<int64_t>(op, a, b, out, threads_);
          break;
        default:
          break;
      }
      if (!ok) division_by_zero(dtype);
      return;
    }

    StridedLayout<3> l;
    l.ndim = out.ndim;
    for (int32_t d = 0; d < out.ndim; ++d) {
      l.shape[d] = out.shape[d];
      l.strides[0][d] = out.strides[d];
      l.strides[1][d] = a.strides[d];
      l.strides[2][d] = b.strides[d];
    }
    const unsigned char* a_data = a.data;
    const unsigned char* b_data = b.data;
    std::unique_ptr<unsigned char[]> a_copy, b_copy;
    if (overlaps(a, out) && !same_elements(a, out)) a_data = materialize(a, a_copy, l.strides[1], threads_);
    if (overlaps(b, out) && !same_elements(b, out)) b_data = materialize(b, b_copy, l.strides[2], threads_);
    coalesce(l);
    switch (dtype) {
      case BP_DTYPE_F32:
        ok = binary_typed<float>(op, l, a_data, b_data, out.data, threads_);
        break;
      case BP_DTYPE_F64:
        ok = binary_typed<double>(op, l, a_data, b_data, out.data, threads_);
        break;
      case BP_DTYPE_I32:
        ok = binary_typed<int32_t>(op, l, a_data, b_data, out.data, threads_);
        break;
      case BP_DTYPE_I64:
        ok = binary_typed<int64_t>(op, l, a_data, b_data, out.data, threads_);
        break;
      default:
        break;
    }
    if (!ok) division_by_zero(dtype);
  }

  // pow ... randn (elementwise_ops.hpp): inputs arrive broadcast to the output's shape.
  void execute_elementwise(const bp_execute_args& args) {
    const int32_t op = args.op;
    const int arity = elementwise_arity(op);
    expect_arity(args, arity, 1);
    const int32_t out_dtype = args.outputs[0].dtype;
    const int32_t in_dtype = arity > 0 ? args.inputs[0].dtype : out_dtype;
    // A data dtype the op does not take here is unsupported (what supports_op answers);
    // dtypes that break the op's own rules (where's cond not bool, ...) are invalid.
    const int32_t data_dtype = op == BP_OP_WHERE ? out_dtype : in_dtype;
    const bool known =
        elementwise_supports(op, data_dtype) && (op != BP_OP_CAST || elementwise_supports(op, out_dtype));
    if (!known || !elementwise_supports(op, out_dtype, in_dtype)) {
      std::string dtypes;
      for (int i = 0; i < arity; ++i) dtypes += (i > 0 ? ", " : "") + dtype_name(args.inputs[i].dtype);
      fail(known ? BP_STATUS_INVALID_ARGUMENT : BP_STATUS_UNSUPPORTED,
           "cpu: " + op_name(op) + ": dtypes " + (arity > 0 ? "(" + dtypes + ") -> " : std::string()) +
               dtype_name(out_dtype) + (known ? " do not fit the op" : " are not supported") + " (" +
               elementwise_dtypes(op) + ")");
    }
    const bool uses_attrs = op == BP_OP_CLAMP || op >= BP_OP_FILL;  // scalar0/1, seed
    if (uses_attrs && args.attrs == nullptr)
      fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + op_name(op) + ": attrs are NULL");
    const View out = view_of(args.outputs[0], op, {"outputs", 0}, out_dtype);
    expect_writable(op, out);
    if (op == BP_OP_ARANGE && out.ndim != 1)
      tensor_fail(op, {"outputs", 0}, "shape " + describe(out.ndim, out.shape) + " is not 1-D");
    View in[3];
    for (int i = 0; i < arity; ++i) {
      in[i] = view_of(args.inputs[i], op, {"inputs", i}, elementwise_input_dtype(op, i, out_dtype, in_dtype));
      expect_same_shape(op, out, in[i], {"inputs", i});
    }
    if (out.numel == 0) return;

    ElementwiseCall call{};
    call.op = op;
    call.out_dtype = out_dtype;
    call.in_dtype = in_dtype;
    call.ndim = out.ndim;
    call.shape = out.shape;
    call.out = out.data;
    call.out_strides = out.strides;
    call.threads = threads_;
    if (uses_attrs) {
      const bp_op_attrs& attrs = *args.attrs;  // fields beyond its struct_size read as 0
      if (BP_HAS_FIELD(bp_op_attrs, scalar0, attrs.struct_size)) call.scalar0 = attrs.scalar0;
      if (BP_HAS_FIELD(bp_op_attrs, scalar1, attrs.struct_size)) call.scalar1 = attrs.scalar1;
      if (BP_HAS_FIELD(bp_op_attrs, seed, attrs.struct_size)) call.seed = attrs.seed;
    }
    // An input sharing memory with the output is read from a copy, unless it is the
    // very same elements of the same size (in place: each element is read, then written).
    std::unique_ptr<unsigned char[]> copies[3];
    int64_t copy_strides[3][kMaxDims];
    for (int i = 0; i < arity; ++i) {
      call.inputs[i] = {in[i].data, in[i].strides};
      if (overlaps(in[i], out) && !(same_elements(in[i], out) && in[i].element_size == out.element_size))
        call.inputs[i] = {materialize(in[i], copies[i], copy_strides[i], threads_), copy_strides[i]};
    }
    switch (run_elementwise(call)) {
      case ElementwiseResult::ok:
        return;
      case ElementwiseResult::negative_exponent:
        fail(BP_STATUS_INVALID_ARGUMENT, "cpu: pow: inputs[1] holds a negative exponent, which integer pow (" +
                                             dtype_name(out_dtype) + ") does not take; use a float dtype");
      case ElementwiseResult::unsupported:
        break;
    }
    fail(BP_STATUS_INTERNAL, "cpu: " + op_name(op) + ": no kernel for output dtype " + dtype_name(out_dtype));
  }

  void execute_matmul(const bp_execute_args& args) {
    const int32_t op = args.op;
    expect_arity(args, 2, 1);
    const int32_t dtype = args.outputs[0].dtype;
    if (!is_float_dtype(dtype))
      fail(BP_STATUS_UNSUPPORTED, "cpu: matmul: dtype " + dtype_name(dtype) + " is not supported (f32, f64)");
    const View out = view_of(args.outputs[0], op, {"outputs", 0}, dtype);
    const View a = view_of(args.inputs[0], op, {"inputs", 0}, dtype);
    const View b = view_of(args.inputs[1], op, {"inputs", 1}, dtype);
    // [...,M,K] x [...,K,N] -> [...,M,N]; batch dims (before the last two) arrive
    // broadcast: the same extents on all three.
    const int32_t nd = out.ndim;
    bool shapes_ok = nd >= 2 && a.ndim == nd && b.ndim == nd;
    for (int32_t d = 0; shapes_ok && d < nd - 2; ++d)
      shapes_ok = a.shape[d] == out.shape[d] && b.shape[d] == out.shape[d];
    if (!shapes_ok || a.shape[nd - 1] != b.shape[nd - 2] || out.shape[nd - 2] != a.shape[nd - 2] ||
        out.shape[nd - 1] != b.shape[nd - 1])
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cpu: matmul: shapes " + describe(a.ndim, a.shape) + " x " + describe(b.ndim, b.shape) + " -> " +
               describe(out.ndim, out.shape) +
               " are not [...,M,K] x [...,K,N] -> [...,M,N] with equal batch dims");
    expect_writable(op, out);
    if (!gemm_fits_blas(a.shape[nd - 2], b.shape[nd - 1], a.shape[nd - 1]))
      fail(BP_STATUS_UNSUPPORTED, "cpu: matmul: a dimension of " + describe(a.ndim, a.shape) + " x " +
                                      describe(b.ndim, b.shape) + " exceeds OpenBLAS's 32-bit limit");
    if (out.numel == 0) return;

    // BLAS must not read what it writes: an input sharing memory with the output
    // is copied first.
    int64_t a_strides[kMaxDims];
    int64_t b_strides[kMaxDims];
    std::copy(a.strides, a.strides + nd, a_strides);
    std::copy(b.strides, b.strides + nd, b_strides);
    const unsigned char* a_data = a.data;
    const unsigned char* b_data = b.data;
    std::unique_ptr<unsigned char[]> a_copy, b_copy;
    if (overlaps(a, out)) a_data = materialize(a, a_copy, a_strides, threads_);
    if (overlaps(b, out)) b_data = materialize(b, b_copy, b_strides, threads_);
    if (dtype == BP_DTYPE_F32)
      gemm_views<float>(a, a_data, a_strides, b, b_data, b_strides, out);
    else
      gemm_views<double>(a, a_data, a_strides, b, b_data, b_strides, out);
  }

  void execute_copy(const bp_execute_args& args) {
    const int32_t op = args.op;
    expect_arity(args, 1, 1);
    const int32_t dtype = args.outputs[0].dtype;
    if (element_size(dtype) == 0)
      fail(BP_STATUS_UNSUPPORTED, "cpu: copy: " + dtype_name(dtype) + " has no known element size");
    const View out = view_of(args.outputs[0], op, {"outputs", 0}, dtype);
    const View in = view_of(args.inputs[0], op, {"inputs", 0}, dtype);
    expect_same_shape(op, out, in, {"inputs", 0});
    expect_writable(op, out);
    if (out.numel == 0 || same_elements(in, out)) return;

    StridedLayout<2> l;
    l.ndim = out.ndim;
    for (int32_t d = 0; d < out.ndim; ++d) {
      l.shape[d] = out.shape[d];
      l.strides[0][d] = out.strides[d];
      l.strides[1][d] = in.strides[d];
    }
    const unsigned char* in_data = in.data;
    std::unique_ptr<unsigned char[]> in_copy;
    if (overlaps(in, out)) in_data = materialize(in, in_copy, l.strides[1], threads_);
    coalesce(l);
    copy_strided_bytes(l, in_data, out.data, out.element_size, threads_);
  }

  // sum, mean, max, min, argmax, argmin over attrs.axis. The output holds the
  // outer * inner results contiguously (its shape is the input's with the axis at 1,
  // or that with the axis dropped: only the count is checked).
  void execute_reduce(const bp_execute_args& args) {
    const int32_t op = args.op;
    expect_arity(args, 1, 1);
    const int32_t dtype = args.inputs[0].dtype;
    if (!supports_op(0, op, dtype))
      fail(BP_STATUS_UNSUPPORTED, "cpu: " + op_name(op) + ": dtype " + dtype_name(dtype) +
                                      " is not supported (" +
                                      (op == BP_OP_MEAN ? "f32, f64" : "f32, f64, i32, i64") + ")");
    const bool arg = op == BP_OP_ARGMAX || op == BP_OP_ARGMIN;
    const View in = view_of(args.inputs[0], op, {"inputs", 0}, dtype);
    const View out = view_of(args.outputs[0], op, {"outputs", 0}, arg ? int32_t{BP_DTYPE_I64} : dtype);
    const AxisSplit s = split_at_axis(args, in);
    if (out.numel != s.outer * s.inner)
      tensor_fail(op, {"outputs", 0},
                  "shape " + describe(out.ndim, out.shape) + " does not hold the " +
                      std::to_string(s.outer * s.inner) + " results of reducing " +
                      describe(in.ndim, in.shape) + " over axis " + std::to_string(s.axis));
    expect_contiguous(op, out);
    if (out.numel == 0) return;
    const unsigned char* data = in.data;
    std::unique_ptr<unsigned char[]> copy;
    int64_t strides[kMaxDims];
    if (!in.contiguous || overlaps(in, out)) data = materialize(in, copy, strides, threads_);
    if (!reduce_op(op, dtype, data, out.data, s, threads_))
      fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + op_name(op) + ": axis " + std::to_string(s.axis) +
                                           " of shape " + describe(in.ndim, in.shape) + " is empty, and " +
                                           op_name(op) + " of no elements has no value");
  }

  // softmax / log_softmax along attrs.axis; the output has the input's shape.
  void execute_softmax(const bp_execute_args& args) {
    const int32_t op = args.op;
    expect_arity(args, 1, 1);
    const int32_t dtype = args.outputs[0].dtype;
    if (!is_float_dtype(dtype))
      fail(BP_STATUS_UNSUPPORTED,
           "cpu: " + op_name(op) + ": dtype " + dtype_name(dtype) + " is not supported (f32, f64)");
    const View out = view_of(args.outputs[0], op, {"outputs", 0}, dtype);
    const View in = view_of(args.inputs[0], op, {"inputs", 0}, dtype);
    expect_same_shape(op, out, in, {"inputs", 0});
    expect_contiguous(op, out);
    const AxisSplit s = split_at_axis(args, in);
    if (out.numel == 0) return;
    const unsigned char* data = in.data;
    std::unique_ptr<unsigned char[]> copy;
    int64_t strides[kMaxDims];
    if (!in.contiguous || (overlaps(in, out) && in.data != out.data))
      data = materialize(in, copy, strides, threads_);
    softmax_op(op, dtype, data, out.data, s, threads_);
  }

  // index_select: inputs [x, index (I64, 1-D)], out = x with extent len(index) on axis.
  // gather: inputs [x, index (I64, x's ndim, extents <= x's off the axis)], out has the
  // index's shape. Every index is checked before x is read.
  void execute_take(const bp_execute_args& args) {
    const int32_t op = args.op;
    const bool gather = op == BP_OP_GATHER;
    expect_arity(args, 2, 1);
    const int32_t dtype = args.inputs[0].dtype;
    if (element_size(dtype) == 0)
      fail(BP_STATUS_UNSUPPORTED,
           "cpu: " + op_name(op) + ": " + dtype_name(dtype) + " has no known element size");
    const View x = view_of(args.inputs[0], op, {"inputs", 0}, dtype);
    const View index = view_of(args.inputs[1], op, {"inputs", 1}, BP_DTYPE_I64);
    const View out = view_of(args.outputs[0], op, {"outputs", 0}, dtype);
    const AxisSplit s = split_at_axis(args, x);
    const int32_t axis = static_cast<int32_t>(s.axis);
    if (x.ndim == 0) tensor_fail(op, {"inputs", 0}, "is 0-d; " + op_name(op) + " needs an axis");
    bool shapes_ok = out.ndim == x.ndim && index.ndim == (gather ? x.ndim : 1);
    for (int32_t d = 0; shapes_ok && d < x.ndim; ++d) {
      if (gather)
        shapes_ok = out.shape[d] == index.shape[d] && (d == axis || index.shape[d] <= x.shape[d]);
      else
        shapes_ok = out.shape[d] == (d == axis ? index.shape[0] : x.shape[d]);
    }
    if (!shapes_ok)
      fail(BP_STATUS_INVALID_ARGUMENT,
           "cpu: " + op_name(op) + ": shapes x " + describe(x.ndim, x.shape) + ", index " +
               describe(index.ndim, index.shape) + " -> " + describe(out.ndim, out.shape) + " along axis " +
               std::to_string(axis) +
               (gather
                    ? " are not those of gather (index has x's ndim and extents <= x's off the axis; out has "
                      "index's shape)"
                    : " are not those of index_select (index 1-D; out is x with len(index) on the axis)"));
    expect_writable(op, out);

    int64_t x_strides[kMaxDims];
    int64_t index_strides[kMaxDims];
    std::copy(x.strides, x.strides + x.ndim, x_strides);
    std::copy(index.strides, index.strides + index.ndim, index_strides);
    const unsigned char* x_data = x.data;
    const unsigned char* index_data = index.data;
    std::unique_ptr<unsigned char[]> x_copy, index_copy;
    if (overlaps(x, out)) x_data = materialize(x, x_copy, x_strides, threads_);
    if (overlaps(index, out)) index_data = materialize(index, index_copy, index_strides, threads_);
    const auto* indices = reinterpret_cast<const int64_t*>(index_data);

    // Indices first: one out of range is an error even when the output is empty.
    if (index.numel > 0) {
      StridedLayout<1> il;
      il.ndim = index.ndim;
      std::copy(index.shape, index.shape + index.ndim, il.shape);
      std::copy(index_strides, index_strides + index.ndim, il.strides[0]);
      coalesce(il);
      const int64_t bad = first_bad_index(il, indices, s.n, threads_);
      if (bad >= 0) {
        int64_t at = 0;  // element offset of row-major position `bad`
        int64_t flat = bad;
        for (int32_t d = index.ndim - 1; d >= 0; --d) {
          at += (flat % index.shape[d]) * index_strides[d];
          flat /= index.shape[d];
        }
        fail(BP_STATUS_INVALID_ARGUMENT,
             "cpu: " + op_name(op) + ": index " + std::to_string(indices[at]) + " at position " +
                 unravel(bad, index.ndim, index.shape) + " of the index is out of range for axis " +
                 std::to_string(axis) + " of x, of extent " + std::to_string(s.n) + " (valid: 0 to " +
                 std::to_string(s.n - 1) + ")");
      }
    }
    if (out.numel == 0) return;

    StridedLayout<3> l;  // operands: 0 = out, 1 = index, 2 = x without its axis stride
    l.ndim = out.ndim;
    for (int32_t d = 0; d < out.ndim; ++d) {
      l.shape[d] = out.shape[d];
      l.strides[0][d] = out.strides[d];
      l.strides[1][d] = gather ? index_strides[d] : (d == axis ? index_strides[0] : 0);
      l.strides[2][d] = d == axis ? 0 : x_strides[d];
    }
    coalesce(l);
    take_bytes(l, x_data, indices, x_strides[axis], out.data, x.element_size, threads_);
  }

  int threads_ = 1;  // OpenMP team size for large ops (>= 1)
  bool collective_ = true;  // option "collective": declare BP_CAP_COLLECTIVE
  NetworkOptions network_;  // where collectives listen (options "hostname" / "interface")
};

}  // namespace
}  // namespace backplane::cpu

BP_DEFINE_PLUGIN(backplane::cpu::CpuPlugin, "cpu", "0.1.0")
