// The server's validation of tensor descriptors, ops and collectives: the
// checks the core makes before a call crosses the ABI, made again here for
// requests that come from the network (abi.h, "Trust contract").
#include "remote/server/validate.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

namespace backplane::remote::server {

namespace {

[[noreturn]] void refuse(const std::string& message) { throw Refused(BP_STATUS_INVALID_ARGUMENT, message); }

std::string dims_to_string(const int64_t* v, int32_t n) {
  std::string s = "[";
  for (int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
std::string shape_of(const bp_tensor& t) { return dims_to_string(t.shape, t.ndim); }

std::string dtype_text(int32_t dtype) {
  const char* name = bp_dtype_name(dtype);
  return name != nullptr ? name : "dtype " + std::to_string(dtype);
}

bool same_shape(const bp_tensor& a, const bp_tensor& b) {
  return a.ndim == b.ndim && std::equal(a.shape, a.shape + a.ndim, b.shape);
}

uint64_t element_count(const bp_tensor& t) {
  uint64_t n = 1;
  for (int32_t d = 0; d < t.ndim; ++d) n *= static_cast<uint64_t>(t.shape[d]);  // bounded by decode_tensor
  return n;
}

// [first, last) bytes of the buffer the view can touch; empty for an empty view.
struct ByteRange {
  uint64_t first = 0;
  uint64_t last = 0;
};
ByteRange byte_range(const bp_tensor& t) {
  const uint64_t esize = bp_dtype_size(t.dtype);
  if (element_count(t) == 0) return {t.byte_offset, t.byte_offset};
  uint64_t span = 0;
  for (int32_t d = 0; d < t.ndim; ++d)
    span += static_cast<uint64_t>(t.shape[d] - 1) * static_cast<uint64_t>(t.strides[d]);
  return {t.byte_offset, t.byte_offset + (span + 1) * esize};
}

// True when no two indices of the view address the same element: dims sorted
// by stride, each stride at least the extent of everything inside it.
bool self_disjoint(const bp_tensor& t) {
  if (element_count(t) <= 1) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent) of dims with extent > 1
  for (int32_t d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1) dims.emplace_back(t.strides[d], t.shape[d]);
  std::sort(dims.begin(), dims.end());
  int64_t reach = 1;  // elements covered by the dims so far
  for (const auto& [stride, extent] : dims) {
    if (stride < reach) return false;
    reach = stride * extent;  // no overflow: every view lies inside its buffer
  }
  return true;
}

void require_operands(const char* op, std::span<const bp_tensor> in, std::span<const bp_tensor> out,
                      std::size_t n_in, std::size_t n_out) {
  if (in.size() != n_in || out.size() != n_out)
    refuse(std::string(op) + " takes " + std::to_string(n_in) + " input(s) and " + std::to_string(n_out) +
           " output(s); the request has " + std::to_string(in.size()) + " and " + std::to_string(out.size()));
}

void require_dtype(const char* op, const char* which, const bp_tensor& t, int32_t dtype) {
  if (t.dtype != dtype)
    refuse(std::string(op) + ": " + which + " is " + dtype_text(t.dtype) + ", expected " + dtype_text(dtype));
}

void require_shape(const char* op, const char* which, const bp_tensor& t, const bp_tensor& like,
                   const char* like_name) {
  if (!same_shape(t, like))
    refuse(std::string(op) + ": " + which + " has shape " + shape_of(t) + " but " + like_name +
           " has shape " + shape_of(like) + " (inputs arrive broadcast to the output's shape)");
}

int32_t require_axis(const char* op, const bp_op_attrs& attrs, const bp_tensor& t) {
  if (t.ndim < 1 || attrs.axis < 0 || attrs.axis >= t.ndim)
    refuse(std::string(op) + ": axis " + std::to_string(attrs.axis) + " is outside 0.." +
           std::to_string(t.ndim - 1) + " for an input of shape " + shape_of(t));
  return static_cast<int32_t>(attrs.axis);
}

// The input's shape with extent `extent` on `axis` must be the output's.
void require_shape_except(const char* op, const bp_tensor& in, const bp_tensor& out, int32_t axis,
                          int64_t extent) {
  bool ok = in.ndim == out.ndim;
  for (int32_t d = 0; ok && d < in.ndim; ++d) ok = out.shape[d] == (d == axis ? extent : in.shape[d]);
  if (!ok)
    refuse(std::string(op) + ": the output has shape " + shape_of(out) + "; for an input of shape " +
           shape_of(in) + " along axis " + std::to_string(axis) + " it must have extent " +
           std::to_string(extent) + " there and the input's elsewhere");
}

// Work must stay bounded by memory: an input dim that repeats one element
// (stride 0) must match the output's extent there, so a small buffer cannot
// stand for an unbounded amount of work.
void require_bounded_broadcast(const char* op, std::span<const bp_tensor> inputs, const bp_tensor& out) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const bp_tensor& t = inputs[i];
    for (int32_t d = 0; d < t.ndim; ++d) {
      if (t.strides[d] != 0 || t.shape[d] <= 1) continue;
      if (t.ndim != out.ndim || out.shape[d] != t.shape[d])
        refuse(std::string(op) + ": inputs[" + std::to_string(i) + "] repeats one element " +
               std::to_string(t.shape[d]) + " times on dim " + std::to_string(d) +
               " (stride 0) where the output has no matching extent; make it contiguous first");
    }
  }
}

bool is_float_dtype(int32_t d) {
  return d == BP_DTYPE_F32 || d == BP_DTYPE_F64 || d == BP_DTYPE_F16 || d == BP_DTYPE_BF16;
}

}  // namespace

bool is_contiguous(const bp_tensor& t) noexcept {
  int64_t expected = 1;
  for (int32_t d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

void decode_tensor(const wire::TensorDesc* desc, int32_t device, const BufferLookup& lookup,
                   const char* field, DecodedTensor& out) {
  const auto where = [field] { return std::string(field); };  // only when refusing
  if (desc == nullptr) refuse(where() + " is missing");
  const std::optional<OwnedBuffer> buffer = lookup(desc->buffer());
  if (!buffer)
    refuse(where() + ": buffer " + std::to_string(desc->buffer()) +
           " is not a buffer of this session (never allocated, already freed, or another session's)");
  if (buffer->device != device)
    refuse(where() + ": buffer " + std::to_string(desc->buffer()) + " lives on device " +
           std::to_string(buffer->device) + ", not on device " + std::to_string(device) +
           " where the op runs");
  const int32_t dtype = desc->dtype();
  const uint64_t esize = bp_dtype_size(dtype);
  if (esize == 0)
    refuse(where() + ": dtype " + std::to_string(dtype) + " is not a dtype this server knows (1.." +
           std::to_string(BP_DTYPE_COUNT_ - 1) + ")");
  const auto* shape = desc->shape();
  const auto* strides = desc->strides();
  const uint32_t ndim = shape != nullptr ? shape->size() : 0;
  const uint32_t nstrides = strides != nullptr ? strides->size() : 0;
  if (ndim > static_cast<uint32_t>(kMaxRank))
    refuse(where() + " has " + std::to_string(ndim) + " dimensions; at most " + std::to_string(kMaxRank) +
           " are allowed");
  if (nstrides != ndim)
    refuse(where() + " has " + std::to_string(ndim) + " extents but " + std::to_string(nstrides) +
           " strides");
  out.shape.assign(ndim, 0);
  out.strides.assign(ndim, 0);
  bool empty = false;
  for (uint32_t d = 0; d < ndim; ++d) {
    out.shape[d] = shape->Get(d);
    out.strides[d] = strides->Get(d);
    if (out.shape[d] < 0)
      refuse(where() + ".shape[" + std::to_string(d) + "] is " + std::to_string(out.shape[d]) +
             "; extents are >= 0");
    if (out.strides[d] < 0)
      refuse(where() + ".strides[" + std::to_string(d) + "] is " + std::to_string(out.strides[d]) +
             "; strides are >= 0 (in elements)");
    empty = empty || out.shape[d] == 0;
  }
  const uint64_t offset = desc->byte_offset();
  if (offset % esize != 0)
    refuse(where() + ": byte_offset " + std::to_string(offset) + " is not a multiple of the element size " +
           std::to_string(esize) + " of " + dtype_text(dtype));
  if (offset > buffer->size)
    refuse(where() + ": byte_offset " + std::to_string(offset) + " lies past the end of its " +
           std::to_string(buffer->size) + "-byte buffer");
  // The element count, and the farthest element, must stay below 2^56 (so
  // byte arithmetic below cannot overflow) and inside the buffer.
  constexpr uint64_t kLimit = uint64_t{1} << 56;
  uint64_t count = 1;
  uint64_t span = 0;  // elements from the first to the last addressable one
  if (!empty) {
    for (uint32_t d = 0; d < ndim; ++d) {
      const auto extent = static_cast<uint64_t>(out.shape[d]);
      const auto stride = static_cast<uint64_t>(out.strides[d]);
      if (count > kLimit / extent)
        refuse(where() + " has shape " + dims_to_string(out.shape.data(), static_cast<int32_t>(ndim)) +
               ": too many elements");
      count *= extent;
      if (stride != 0 && (extent - 1) > (kLimit - span - 1) / stride)
        refuse(where() + ": shape " + dims_to_string(out.shape.data(), static_cast<int32_t>(ndim)) +
               " with strides " + dims_to_string(out.strides.data(), static_cast<int32_t>(ndim)) +
               " reaches past any buffer");
      span += (extent - 1) * stride;
    }
    const uint64_t room = (buffer->size - offset) / esize;  // whole elements after the offset
    if (span >= room)
      refuse(where() + ": shape " + dims_to_string(out.shape.data(), static_cast<int32_t>(ndim)) +
             " with strides " + dims_to_string(out.strides.data(), static_cast<int32_t>(ndim)) +
             " at byte_offset " + std::to_string(offset) + " reaches byte " +
             std::to_string(offset + (span + 1) * esize) + " of a " + std::to_string(buffer->size) +
             "-byte buffer");
  }
  out.id = desc->buffer();
  out.tensor = bp_tensor{};
  out.tensor.buffer = buffer->handle;
  out.tensor.byte_offset = offset;
  out.tensor.device = device;
  out.tensor.dtype = dtype;
  out.tensor.ndim = static_cast<int32_t>(ndim);
  out.tensor.shape = out.shape.data();
  out.tensor.strides = out.strides.data();
}

void validate_execute(int32_t op, std::span<const bp_tensor> in, std::span<const bp_tensor> out,
                      const bp_op_attrs& attrs) {
  const char* name = bp_op_name(op);
  if (name == nullptr)
    refuse("op " + std::to_string(op) + " is not an op this server knows (1.." +
           std::to_string(BP_OP_COUNT_ - 1) + ")");
  if (in.size() > static_cast<std::size_t>(kMaxOperands) ||
      out.size() > static_cast<std::size_t>(kMaxOperands))
    refuse(std::string(name) + ": too many operands");

  const bp_op_info& info = *bp_op_info_of(op);
  require_operands(name, in, out, static_cast<std::size_t>(info.inputs), 1);
  // The dtype the op computes on must be in its class (abi.h's op table).
  if (info.dtypes == BP_OP_DTYPES_FLOATING) {
    const bp_tensor& data = in.empty() ? out[0] : in[0];
    if (!is_float_dtype(data.dtype))
      refuse(std::string(name) + ": " + (in.empty() ? "the output" : "the input") + " is " +
             dtype_text(data.dtype) + "; " + name + " is for float dtypes");
  }
  switch (info.kind) {
    case BP_OP_KIND_BINARY:
    case BP_OP_KIND_COMPARE:
      require_dtype(name, "inputs[1]", in[1], in[0].dtype);
      require_dtype(name, "the output", out[0],
                    info.kind == BP_OP_KIND_COMPARE ? BP_DTYPE_BOOL : in[0].dtype);
      require_shape(name, "inputs[0]", in[0], out[0], "the output");
      require_shape(name, "inputs[1]", in[1], out[0], "the output");
      break;
    case BP_OP_KIND_SELECT:
      require_dtype(name, "the condition (inputs[0])", in[0], BP_DTYPE_BOOL);
      require_dtype(name, "inputs[2]", in[2], in[1].dtype);
      require_dtype(name, "the output", out[0], in[1].dtype);
      require_shape(name, "inputs[0]", in[0], out[0], "the output");
      require_shape(name, "inputs[1]", in[1], out[0], "the output");
      require_shape(name, "inputs[2]", in[2], out[0], "the output");
      break;
    case BP_OP_KIND_UNARY:
    case BP_OP_KIND_COPY:
      require_dtype(name, "the output", out[0], in[0].dtype);
      require_shape(name, "the input", in[0], out[0], "the output");
      break;
    case BP_OP_KIND_CAST:
      require_shape(name, "the input", in[0], out[0], "the output");
      if (attrs.dtype != out[0].dtype)
        refuse(std::string(name) + ": the target dtype attribute is " + dtype_text(attrs.dtype) +
               " but the output is " + dtype_text(out[0].dtype));
      break;
    case BP_OP_KIND_MATMUL: {
      require_dtype(name, "inputs[1]", in[1], in[0].dtype);
      require_dtype(name, "the output", out[0], in[0].dtype);
      const bp_tensor &a = in[0], &b = in[1], &c = out[0];
      if (a.ndim < 2 || b.ndim != a.ndim || c.ndim != a.ndim)
        refuse(std::string(name) + ": operands of shapes " + shape_of(a) + " x " + shape_of(b) + " -> " +
               shape_of(c) + " must all have the same rank, at least 2 (batch dims arrive broadcast)");
      const int32_t n = a.ndim;
      bool ok = a.shape[n - 1] == b.shape[n - 2] && c.shape[n - 2] == a.shape[n - 2] &&
                c.shape[n - 1] == b.shape[n - 1];
      for (int32_t d = 0; ok && d < n - 2; ++d) ok = a.shape[d] == c.shape[d] && b.shape[d] == c.shape[d];
      if (!ok)
        refuse(std::string(name) + ": shapes " + shape_of(a) + " x " + shape_of(b) + " -> " + shape_of(c) +
               " do not fit [...,M,K] x [...,K,N] -> [...,M,N]");
      break;
    }
    case BP_OP_KIND_CREATE:
      break;
    case BP_OP_KIND_RANGE:
      if (out[0].ndim != 1)
        refuse(std::string(name) + ": the output has shape " + shape_of(out[0]) + "; it must be 1-D");
      break;
    case BP_OP_KIND_REDUCE:
    case BP_OP_KIND_ARG_REDUCE: {
      const int32_t axis = require_axis(name, attrs, in[0]);
      const bool arg = info.kind == BP_OP_KIND_ARG_REDUCE;
      require_dtype(name, "the output", out[0], arg ? BP_DTYPE_I64 : in[0].dtype);
      if (op != BP_OP_SUM && op != BP_OP_MEAN && in[0].shape[axis] == 0)
        refuse(std::string(name) + ": axis " + std::to_string(axis) + " of the input " + shape_of(in[0]) +
               " is empty; " + name + " of nothing is undefined");
      require_shape_except(name, in[0], out[0], axis, 1);
      break;
    }
    case BP_OP_KIND_SOFTMAX:
      require_axis(name, attrs, in[0]);
      require_dtype(name, "the output", out[0], in[0].dtype);
      require_shape(name, "the input", in[0], out[0], "the output");
      break;
    case BP_OP_KIND_INDEX_SELECT: {
      const int32_t axis = require_axis(name, attrs, in[0]);
      require_dtype(name, "the index (inputs[1])", in[1], BP_DTYPE_I64);
      if (in[1].ndim != 1)
        refuse(std::string(name) + ": the index has shape " + shape_of(in[1]) + "; it must be 1-D");
      require_dtype(name, "the output", out[0], in[0].dtype);
      require_shape_except(name, in[0], out[0], axis, in[1].shape[0]);
      break;
    }
    case BP_OP_KIND_GATHER: {
      const int32_t axis = require_axis(name, attrs, in[0]);
      require_dtype(name, "the index (inputs[1])", in[1], BP_DTYPE_I64);
      require_dtype(name, "the output", out[0], in[0].dtype);
      bool ok = in[1].ndim == in[0].ndim;
      for (int32_t d = 0; ok && d < in[0].ndim; ++d) ok = d == axis || in[1].shape[d] <= in[0].shape[d];
      if (!ok)
        refuse(std::string(name) + ": the index has shape " + shape_of(in[1]) + " for an input of shape " +
               shape_of(in[0]) +
               "; it needs the input's rank and extents no larger than the input's off the axis");
      require_shape(name, "the output", out[0], in[1], "the index");
      break;
    }
    case BP_OP_KIND_UPDATE: {
      // In place: outputs[0] is inputs[0] itself; x (inputs[1]) never overlaps it.
      require_dtype(name, "inputs[1]", in[1], in[0].dtype);
      require_dtype(name, "the output", out[0], in[0].dtype);
      require_shape(name, "inputs[1]", in[1], in[0], "inputs[0]");
      require_shape(name, "the output", out[0], in[0], "inputs[0]");
      if (out[0].buffer != in[0].buffer || out[0].byte_offset != in[0].byte_offset)
        refuse(std::string(name) + ": the output must be inputs[0] itself (an in-place update)");
      for (int i = 0; i < 2; ++i)
        if (!is_contiguous(in[static_cast<std::size_t>(i)]))
          refuse(std::string(name) + ": inputs[" + std::to_string(i) + "] (shape " +
                 shape_of(in[static_cast<std::size_t>(i)]) + ") must be contiguous");
      break;
    }
    default:
      refuse(std::string(name) + " is not an op this server can validate");
  }

  // Outputs: contiguous (the host allocates them), except COPY's, which may
  // be a strided view that never overlaps itself; none overlaps an input or
  // another output, except an UPDATE's, which is its first input.
  for (std::size_t o = 0; o < out.size(); ++o) {
    const bp_tensor& t = out[o];
    if (info.kind == BP_OP_KIND_COPY ? !self_disjoint(t) : !is_contiguous(t))
      refuse(std::string(name) + ": outputs[" + std::to_string(o) + "] (shape " + shape_of(t) + ") must be " +
             (info.kind == BP_OP_KIND_COPY ? "a view that never addresses one element twice" : "contiguous"));
    const ByteRange r = byte_range(t);
    auto overlaps = [&](const bp_tensor& u) {
      const ByteRange s = byte_range(u);
      return u.buffer == t.buffer && r.first < r.last && s.first < s.last && r.first < s.last &&
             s.first < r.last;
    };
    // An UPDATE's output is its first input (checked above); it may overlap no other.
    for (std::size_t i = info.kind == BP_OP_KIND_UPDATE && o == 0 ? 1 : 0; i < in.size(); ++i)
      if (overlaps(in[i]))
        refuse(std::string(name) + ": outputs[" + std::to_string(o) + "] overlaps inputs[" +
               std::to_string(i) + "] in the same buffer");
    for (std::size_t p = 0; p < o; ++p)
      if (overlaps(out[p]))
        refuse(std::string(name) + ": outputs[" + std::to_string(o) + "] overlaps outputs[" +
               std::to_string(p) + "]");
  }
  if (!out.empty()) require_bounded_broadcast(name, in, out[0]);
}

void validate_collective(wire::CollectiveKind kind, const bp_tensor* input, const bp_tensor* output,
                         int32_t reduce_op, int32_t root, int32_t world_size) {
  const char* name = wire::EnumNameCollectiveKind(kind);
  if (name == nullptr || name[0] == '\0')
    refuse("collective kind " + std::to_string(static_cast<int>(kind)) + " is not one this server knows");
  const std::string op = name;
  auto need = [&](const bp_tensor* t, const char* which) {
    if (t == nullptr) refuse(op + " needs " + which);
    if (!is_contiguous(*t)) refuse(op + ": " + which + " (shape " + shape_of(*t) + ") must be contiguous");
  };
  auto need_reduce = [&] {
    if (bp_reduce_op_name(reduce_op) == nullptr)
      refuse(op + ": reduce op " + std::to_string(reduce_op) + " is not one this server knows (0.." +
             std::to_string(BP_REDUCE_COUNT_ - 1) + ")");
  };
  switch (kind) {
    case wire::CollectiveKind::AllReduce:
      need(input, "an input");
      need(output, "an output");
      need_reduce();
      require_dtype("all_reduce", "the output", *output, input->dtype);
      require_shape("all_reduce", "the output", *output, *input, "the input");
      if (input->buffer == output->buffer && input->byte_offset != output->byte_offset) {
        const ByteRange a = byte_range(*input), b = byte_range(*output);
        if (a.first < b.last && b.first < a.last)
          refuse("all_reduce: the input and output overlap partially (they may only be the very same view)");
      }
      break;
    case wire::CollectiveKind::Broadcast:
      need(output, "a tensor");
      if (root < 0 || root >= world_size)
        refuse("broadcast: root " + std::to_string(root) + " is outside 0.." +
               std::to_string(world_size - 1));
      break;
    case wire::CollectiveKind::AllGather:
    case wire::CollectiveKind::ReduceScatter: {
      const bool gather = kind == wire::CollectiveKind::AllGather;
      need(input, "an input");
      need(output, "an output");
      if (!gather) need_reduce();
      require_dtype(op.c_str(), "the output", *output, input->dtype);
      const bp_tensor& small = gather ? *input : *output;
      const bp_tensor& big = gather ? *output : *input;
      if (element_count(big) != element_count(small) * static_cast<uint64_t>(world_size))
        refuse(op + ": the " + (gather ? "output" : "input") + " " + shape_of(big) + " must hold " +
               std::to_string(world_size) + " times the elements of the " + (gather ? "input" : "output") +
               " " + shape_of(small));
      if (input->buffer == output->buffer) {
        const ByteRange a = byte_range(*input), b = byte_range(*output);
        if (a.first < b.last && b.first < a.last) refuse(op + ": the input and output overlap");
      }
      break;
    }
    case wire::CollectiveKind::Barrier:
      break;
  }
}

}  // namespace backplane::remote::server
