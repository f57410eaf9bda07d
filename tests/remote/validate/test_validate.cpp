// The server's validation of descriptors, ops and collectives: every kind of
// bad field a client can send is refused with a message that names it, and
// every request the core itself would make passes.
#include "remote/server/validate.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

namespace wire = backplane::remote::wire;
using backplane::remote::server::BufferLookup;
using backplane::remote::server::decode_tensor;
using backplane::remote::server::DecodedTensor;
using backplane::remote::server::OwnedBuffer;
using backplane::remote::server::Refused;
using backplane::remote::server::validate_collective;
using backplane::remote::server::validate_execute;

namespace {

// Fake plugin handles: distinct addresses, never dereferenced.
bp_buffer* handle(int i) { return reinterpret_cast<bp_buffer*>(static_cast<uintptr_t>(0x1000 * i)); }

struct Session {
  std::map<uint64_t, OwnedBuffer> buffers{
      {1, {handle(1), 64, 0}}, {2, {handle(2), 4096, 0}}, {3, {handle(3), 64, 1}}};
  BufferLookup lookup() {
    return [this](uint64_t id) -> std::optional<OwnedBuffer> {
      auto it = buffers.find(id);
      if (it == buffers.end()) return std::nullopt;
      return it->second;
    };
  }
};

// Builds a TensorDesc and decodes it; returns the refusal message, or "" when accepted.
std::string decode(Session& s, uint64_t buffer, uint64_t offset, int32_t dtype, std::vector<int64_t> shape,
                   std::vector<int64_t> strides, int32_t device = 0) {
  flatbuffers::FlatBufferBuilder b;
  auto desc = wire::CreateTensorDescDirect(b, buffer, offset, dtype, &shape, &strides);
  b.Finish(desc);
  const auto* t = flatbuffers::GetRoot<wire::TensorDesc>(b.GetBufferPointer());
  DecodedTensor out;
  try {
    decode_tensor(t, device, s.lookup(), "inputs[0]", out);
  } catch (const Refused& e) {
    CHECK(e.code() == BP_STATUS_INVALID_ARGUMENT);
    return e.what();
  }
  CHECK(out.tensor.buffer == s.buffers.at(buffer).handle);
  CHECK(out.tensor.ndim == static_cast<int32_t>(shape.size()));
  return "";
}

// A view descriptor for validate_execute (shape/strides kept alive by the caller).
struct View {
  std::vector<int64_t> shape, strides;
  bp_tensor t{};
  View(int buffer, int32_t dtype, std::vector<int64_t> s, std::vector<int64_t> st = {}, uint64_t offset = 0)
      : shape(std::move(s)), strides(std::move(st)) {
    if (strides.empty()) {  // contiguous
      strides.assign(shape.size(), 1);
      for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d)
        strides[static_cast<size_t>(d)] =
            strides[static_cast<size_t>(d) + 1] * shape[static_cast<size_t>(d) + 1];
    }
    t.buffer = handle(buffer);
    t.byte_offset = offset;
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    t.shape = shape.data();
    t.strides = strides.data();
  }
};

std::string execute(int32_t op, std::vector<const View*> in, std::vector<const View*> out,
                    bp_op_attrs attrs = bp_op_attrs{BP_OP_ATTRS_STRUCT_SIZE, 0, 0, 0, 0, 0, 0}) {
  std::vector<bp_tensor> i, o;
  for (auto* v : in) i.push_back(v->t);
  for (auto* v : out) o.push_back(v->t);
  try {
    validate_execute(op, i, o, attrs);
  } catch (const Refused& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("decode_tensor accepts views inside their buffer, broadcast and scalar views") {
  Session s;
  CHECK(decode(s, 1, 0, BP_DTYPE_F32, {4, 4}, {4, 1}) == "");        // 64 bytes exactly
  CHECK(decode(s, 1, 60, BP_DTYPE_F32, {}, {}) == "");               // a scalar at the last element
  CHECK(decode(s, 1, 0, BP_DTYPE_F32, {1000, 16}, {0, 1}) == "");    // broadcast rows
  CHECK(decode(s, 1, 0, BP_DTYPE_F32, {0, 1000}, {1000, 1}) == "");  // empty: addresses nothing
  CHECK(decode(s, 3, 0, BP_DTYPE_F64, {8}, {1}, 1) == "");
}

TEST_CASE("decode_tensor refuses ids the session does not own and views outside the buffer") {
  Session s;
  CHECK(contains(decode(s, 99, 0, BP_DTYPE_F32, {1}, {1}), "buffer 99 is not a buffer of this session"));
  CHECK(contains(decode(s, 3, 0, BP_DTYPE_F32, {1}, {1}, 0), "lives on device 1, not on device 0"));
  CHECK(contains(decode(s, 1, 0, 0, {1}, {1}), "dtype 0 is not a dtype"));
  CHECK(contains(decode(s, 1, 0, 77, {1}, {1}), "dtype 77 is not a dtype"));
  CHECK(contains(decode(s, 1, 0, BP_DTYPE_F32, {4, 5}, {5, 1}), "reaches byte 80 of a 64-byte buffer"));
  CHECK(contains(decode(s, 1, 4, BP_DTYPE_F32, {16}, {1}), "reaches byte 68"));
  CHECK(contains(decode(s, 1, 2, BP_DTYPE_F32, {1}, {1}), "not a multiple of the element size 4"));
  CHECK(contains(decode(s, 1, 1 << 20, BP_DTYPE_U8, {1}, {1}), "past the end"));
  CHECK(contains(decode(s, 1, 64, BP_DTYPE_F32, {}, {}), "reaches byte 68"));
  CHECK(contains(decode(s, 1, 0, BP_DTYPE_F32, {-1}, {1}), "shape[0] is -1"));
  CHECK(contains(decode(s, 1, 0, BP_DTYPE_F32, {2}, {-1}), "strides[0] is -1"));
  CHECK(contains(decode(s, 1, 0, BP_DTYPE_F32, {2, 2}, {1}), "2 extents but 1 strides"));
  std::vector<int64_t> many(65, 1);
  CHECK(contains(decode(s, 1, 0, BP_DTYPE_F32, many, many), "65 dimensions"));
  // Overflow attempts: huge extents, huge strides.
  CHECK(contains(decode(s, 1, 0, BP_DTYPE_F32, {int64_t{1} << 40, int64_t{1} << 40}, {0, 0}),
                 "too many elements"));
  CHECK(contains(decode(s, 1, 0, BP_DTYPE_F32, {2}, {int64_t{1} << 56}), "reaches past any buffer"));
  CHECK(contains(decode(s, 1, 0, BP_DTYPE_F32, {3, 2}, {int64_t{1} << 55, 1}), "reaches past any buffer"));
}

TEST_CASE("validate_execute accepts what the core sends") {
  const View a(1, BP_DTYPE_F32, {4}), b(2, BP_DTYPE_F32, {4}), c(2, BP_DTYPE_F32, {4}, {1}, 64);
  CHECK(execute(BP_OP_ADD, {&a, &b}, {&c}) == "");
  const View scalar_row(1, BP_DTYPE_F32, {3, 4}, {0, 1}), out(2, BP_DTYPE_F32, {3, 4});
  CHECK(execute(BP_OP_MUL, {&scalar_row, &scalar_row}, {&out}) == "");  // broadcast input
  const View m1(1, BP_DTYPE_F32, {2, 3}), m2(2, BP_DTYPE_F32, {3, 5}), m3(2, BP_DTYPE_F32, {2, 5}, {}, 1024);
  CHECK(execute(BP_OP_MATMUL, {&m1, &m2}, {&m3}) == "");
  const View x(1, BP_DTYPE_F32, {2, 3}), r(2, BP_DTYPE_F32, {2, 1}), ri(2, BP_DTYPE_I64, {1, 3});
  bp_op_attrs attrs{BP_OP_ATTRS_STRUCT_SIZE, 1, 0, 0, 0, 0, 0};
  CHECK(execute(BP_OP_SUM, {&x}, {&r}, attrs) == "");
  attrs.axis = 0;
  CHECK(execute(BP_OP_ARGMAX, {&x}, {&ri}, attrs) == "");
  const View strided_out(2, BP_DTYPE_F32, {2, 3}, {1, 2});  // a transposed, non-overlapping COPY target
  CHECK(execute(BP_OP_COPY, {&x}, {&strided_out}) == "");
  attrs.dtype = BP_DTYPE_I32;
  const View xi(2, BP_DTYPE_I32, {2, 3});
  CHECK(execute(BP_OP_CAST, {&x}, {&xi}, attrs) == "");
}

TEST_CASE("validate_execute refuses malformed ops with a message naming the problem") {
  const View a(1, BP_DTYPE_F32, {4}), b(2, BP_DTYPE_F32, {5}), c(2, BP_DTYPE_F32, {4}, {1}, 64);
  CHECK(contains(execute(0, {&a}, {&c}), "op 0 is not an op"));
  CHECK(contains(execute(BP_OP_COUNT_ + 3, {&a}, {&c}), "is not an op"));
  CHECK(
      contains(execute(BP_OP_ADD, {&a}, {&c}), "takes 2 input(s) and 1 output(s); the request has 1 and 1"));
  CHECK(contains(execute(BP_OP_ADD, {&a, &b}, {&c}), "inputs[1] has shape [5] but the output has shape [4]"));
  const View ai(1, BP_DTYPE_I32, {4});
  CHECK(contains(execute(BP_OP_ADD, {&a, &ai}, {&c}), "inputs[1] is i32, expected f32"));
  CHECK(contains(execute(BP_OP_EQ, {&a, &a}, {&c}), "the output is f32, expected bool"));
  const View m1(1, BP_DTYPE_F32, {2, 3}), m2(2, BP_DTYPE_F32, {4, 5}), m3(2, BP_DTYPE_F32, {2, 5}, {}, 1024);
  CHECK(contains(execute(BP_OP_MATMUL, {&m1, &m2}, {&m3}), "do not fit"));
  bp_op_attrs attrs{BP_OP_ATTRS_STRUCT_SIZE, 5, 0, 0, 0, 0, 0};
  const View r(2, BP_DTYPE_F32, {2, 1});
  CHECK(contains(execute(BP_OP_SUM, {&m1}, {&r}, attrs), "axis 5 is outside 0..1"));
  attrs.axis = -1;
  CHECK(contains(execute(BP_OP_SOFTMAX, {&m1}, {&m1}, attrs), "axis -1 is outside"));
  attrs.axis = 0;
  const View wrong(2, BP_DTYPE_F32, {1, 4});
  CHECK(contains(execute(BP_OP_SUM, {&m1}, {&wrong}, attrs), "must have extent 1 there"));
  const View empty_axis(1, BP_DTYPE_F32, {0, 3}), r1(2, BP_DTYPE_F32, {1, 3});
  CHECK(contains(execute(BP_OP_MAX, {&empty_axis}, {&r1}, attrs), "is empty"));
  const View ints(1, BP_DTYPE_I64, {4}), ints_out(2, BP_DTYPE_I64, {1});
  CHECK(contains(execute(BP_OP_MEAN, {&ints}, {&ints_out}, attrs), "mean is for float dtypes"));
  // Every op of the table's floating class, not only mean: the input, or a creation's output.
  const View ints4(2, BP_DTYPE_I64, {4});
  CHECK(contains(execute(BP_OP_EXP, {&ints}, {&ints4}), "exp: the input is i64; exp is for float dtypes"));
  CHECK(contains(execute(BP_OP_RANDN, {}, {&ints4}), "randn: the output is i64; randn is for float dtypes"));
  attrs.dtype = BP_DTYPE_I32;
  CHECK(contains(execute(BP_OP_CAST, {&a}, {&c}, attrs),
                 "target dtype attribute is i32 but the output is f32"));
  const View two_d(2, BP_DTYPE_F32, {2, 2});
  CHECK(contains(execute(BP_OP_ARANGE, {}, {&two_d}), "must be 1-D"));
  // Gather whose index is wider than the input off the axis would read outside it.
  const View x(1, BP_DTYPE_F32, {2, 2}), idx(2, BP_DTYPE_I64, {2, 3}), g(2, BP_DTYPE_F32, {2, 3}, {}, 512);
  attrs.axis = 0;
  CHECK(contains(execute(BP_OP_GATHER, {&x, &idx}, {&g}, attrs), "extents no larger than the input's"));
}

TEST_CASE("validate_execute refuses outputs that overlap, alias themselves, are strided, or unbounded work") {
  const View a(2, BP_DTYPE_F32, {4}), b(2, BP_DTYPE_F32, {4}, {1}, 8);
  CHECK(contains(execute(BP_OP_ADD, {&a, &a}, {&b}), "outputs[0] overlaps inputs[0]"));
  const View self_alias(2, BP_DTYPE_F32, {4, 4}, {1, 1}, 512), src(1, BP_DTYPE_F32, {4, 4});
  CHECK(contains(execute(BP_OP_COPY, {&src}, {&self_alias}), "never addresses one element twice"));
  const View strided(2, BP_DTYPE_F32, {2, 3}, {1, 2}, 512), x(1, BP_DTYPE_F32, {2, 3});
  CHECK(contains(execute(BP_OP_RELU, {&x}, {&strided}), "must be contiguous"));
  // One element repeated a million times along a reduced axis: work unbounded by memory.
  const View repeated(1, BP_DTYPE_F32, {1, 1000000}, {0, 0}), r(2, BP_DTYPE_F32, {1, 1});
  bp_op_attrs attrs{BP_OP_ATTRS_STRUCT_SIZE, 1, 0, 0, 0, 0, 0};
  CHECK(contains(execute(BP_OP_SUM, {&repeated}, {&r}, attrs), "repeats one element 1000000 times"));
}

TEST_CASE("validate_execute: axpby's output is its first input itself, and x lies apart from it") {
  const View y(1, BP_DTYPE_F32, {4}), x(2, BP_DTYPE_F32, {4});
  CHECK(execute(BP_OP_AXPBY, {&y, &x}, {&y}) == "");
  const View other(3, BP_DTYPE_F32, {4}), shifted(1, BP_DTYPE_F32, {4}, {1}, 16);
  CHECK(contains(execute(BP_OP_AXPBY, {&y, &x}, {&other}), "the output must be inputs[0] itself"));
  CHECK(contains(execute(BP_OP_AXPBY, {&y, &x}, {&shifted}), "the output must be inputs[0] itself"));
  const View x_in_y(1, BP_DTYPE_F32, {4}, {1}, 8);  // y's buffer, half over y
  CHECK(contains(execute(BP_OP_AXPBY, {&y, &x_in_y}, {&y}), "outputs[0] overlaps inputs[1]"));
  const View ys(1, BP_DTYPE_F32, {2, 2}, {1, 2}), xs(2, BP_DTYPE_F32, {2, 2});
  CHECK(contains(execute(BP_OP_AXPBY, {&ys, &xs}, {&ys}), "must be contiguous"));
  const View xi(2, BP_DTYPE_I32, {4});
  CHECK(contains(execute(BP_OP_AXPBY, {&y, &xi}, {&y}), "inputs[1] is i32, expected f32"));
  const View yi(1, BP_DTYPE_I32, {4});
  CHECK(contains(execute(BP_OP_AXPBY, {&yi, &xi}, {&yi}), "axpby is for float dtypes"));
}

TEST_CASE("validate_collective checks tensors, roots and reduce ops") {
  const View in(1, BP_DTYPE_F32, {4}), out(2, BP_DTYPE_F32, {4}), big(2, BP_DTYPE_F32, {8}, {1}, 64);
  auto run = [](wire::CollectiveKind k, const View* i, const View* o, int32_t reduce, int32_t root) {
    try {
      validate_collective(k, i ? &i->t : nullptr, o ? &o->t : nullptr, reduce, root, 2);
    } catch (const Refused& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(run(wire::CollectiveKind::AllReduce, &in, &out, BP_REDUCE_SUM, 0) == "");
  CHECK(run(wire::CollectiveKind::AllReduce, &in, &in, BP_REDUCE_MAX, 0) == "");  // in place
  CHECK(contains(run(wire::CollectiveKind::AllReduce, &in, &out, 9, 0), "reduce op 9"));
  CHECK(contains(run(wire::CollectiveKind::AllReduce, &in, &big, BP_REDUCE_SUM, 0), "shape"));
  CHECK(run(wire::CollectiveKind::AllGather, &in, &big, 0, 0) == "");
  CHECK(contains(run(wire::CollectiveKind::AllGather, &in, &out, 0, 0), "2 times the elements"));
  CHECK(run(wire::CollectiveKind::ReduceScatter, &big, &in, BP_REDUCE_SUM, 0) == "");
  CHECK(contains(run(wire::CollectiveKind::Broadcast, nullptr, &out, 0, 2), "root 2 is outside 0..1"));
  CHECK(contains(run(wire::CollectiveKind::Broadcast, nullptr, nullptr, 0, 0), "needs a tensor"));
  CHECK(run(wire::CollectiveKind::Barrier, nullptr, nullptr, 0, 0) == "");
  CHECK(contains(run(static_cast<wire::CollectiveKind>(42), nullptr, nullptr, 0, 0), "kind 42"));
}
