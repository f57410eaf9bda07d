// The op front-end: every validation error of every op family (code and the
// key words of the message), views sharing storage, keepdim and 0-d result
// shapes, cat / index_select / gather values, and to() across two backends
// (cpu and the `opaque` fixture, whose memory the core cannot touch).
// The math of each kernel is the conformance suite's business.
#include "test_support.hpp"

#include "../../core/tensor/tensor_impl.hpp"  // storage identity of views

#include <cmath>
#include <limits>

using namespace backplane;
using namespace bptest;

namespace {

struct Env {
  Registry registry =
      load(config_json({backend_json("cpu", "backplane_cpu"), backend_json("opaque", "opaque")}));
  Device cpu = registry.backend("cpu").device(0);
  Device opaque = registry.backend("opaque").device(0);
};

Tensor f32(const Device& d, const Shape& s) {
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::from_vector<float>(d, s, v);
}
Tensor i64(const Device& d, const Shape& s, std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(d, s, v);
}

const detail::Storage* storage_of(const Tensor& t) { return detail::Access::impl(t)->storage; }

}  // namespace

// Runs expr, which must throw backplane::Error with code `errc` and a message
// containing every one of the strings that follow.
#define EXPECT_ERROR(expr, errc, ...)                                                \
  do {                                                                               \
    const Error e_ = error_from([&] { (void)(expr); });                              \
    CHECK_MESSAGE(e_.code() == (errc), e_.message());                                \
    for (const std::string& part_ : std::initializer_list<std::string>{__VA_ARGS__}) \
      BP_CHECK_CONTAINS(e_.message(), part_);                                        \
  } while (0)

// ---- elementwise --------------------------------------------------------------

TEST_CASE("ops: binary ops refuse mixed dtypes, non-arithmetic dtypes, bad shapes and devices") {
  Env env;
  Tensor a = f32(env.cpu, {2, 3});
  Tensor d = Tensor::from_vector<double>(env.cpu, {3}, {1, 2, 3});
  Tensor b = Tensor::from_vector<bool>(env.cpu, {3}, {true, false, true});
  EXPECT_ERROR(pow(a, d), Errc::dtype_mismatch, "pow", "f32", "f64", "cast");
  EXPECT_ERROR(maximum(b, b), Errc::dtype_mismatch, "maximum", "bool", "f32, f64, i32 or i64");
  EXPECT_ERROR(add(b, b), Errc::dtype_mismatch, "add", "bool");
  EXPECT_ERROR(minimum(a, f32(env.cpu, {4})), Errc::shape_mismatch, "minimum", "[2, 3]", "[4]", "broadcast");
  EXPECT_ERROR(sub(a, f32(env.opaque, {3})), Errc::device_mismatch, "sub", "cpu:0", "opaque:0");
  EXPECT_ERROR(mul(a, Tensor()), Errc::invalid_argument, "mul", "right", "undefined");
  EXPECT_ERROR(eq(a, d), Errc::dtype_mismatch, "eq", "f32", "f64");
  EXPECT_ERROR(gt(a, f32(env.cpu, {2, 2})), Errc::shape_mismatch, "gt", "[2, 3]", "[2, 2]");
}

TEST_CASE("ops: comparisons give bool of the broadcast shape, also on bool operands") {
  Env env;
  Tensor a = Tensor::from_vector<float>(env.cpu, {2, 2}, {1, 2, 3, 4});
  Tensor b = Tensor::from_vector<float>(env.cpu, {2}, {2, 2});
  Tensor c = lt(a, b);
  CHECK(c.dtype() == DType::bool_);
  CHECK(c.shape() == Shape{2, 2});
  CHECK(c.to_vector<bool>() == std::vector<bool>{true, false, false, false});
  Tensor t = Tensor::from_vector<bool>(env.cpu, {2}, {true, false});
  CHECK(eq(t, t).to_vector<bool>() == std::vector<bool>{true, true});
}

TEST_CASE("ops: where needs a bool cond and operands of one dtype, and broadcasts all three") {
  Env env;
  Tensor cond = Tensor::from_vector<bool>(env.cpu, {2, 1}, {true, false});
  Tensor a = Tensor::from_vector<float>(env.cpu, {3}, {1, 2, 3});
  Tensor b = Tensor::from_vector<float>(env.cpu, {}, {-1});
  EXPECT_ERROR(where(a, a, b), Errc::dtype_mismatch, "where", "cond", "f32", "bool");
  EXPECT_ERROR(where(cond, a, Tensor::from_vector<double>(env.cpu, {3}, {1, 2, 3})), Errc::dtype_mismatch,
               "where", "f32", "f64");
  EXPECT_ERROR(where(cond, a, f32(env.cpu, {3, 2})), Errc::shape_mismatch, "where", "[3, 2]");
  EXPECT_ERROR(where(cond, a, f32(env.opaque, {3})), Errc::device_mismatch, "where", "opaque:0");
  Tensor w = where(cond, a, b);
  CHECK(w.shape() == Shape{2, 3});
  CHECK(w.dtype() == DType::f32);
  CHECK(w.to_vector<float>() == std::vector<float>{1, 2, 3, -1, -1, -1});
}

TEST_CASE("ops: unary math takes floats only, neg/abs/relu/clamp take integers too") {
  Env env;
  Tensor i = Tensor::from_vector<int32_t>(env.cpu, {3}, {-2, 0, 5});
  Tensor b = Tensor::from_vector<bool>(env.cpu, {1}, {true});
  EXPECT_ERROR(exp(i), Errc::dtype_mismatch, "exp", "i32", "f32 or f64");
  for (auto fn : {&backplane::log, &backplane::sqrt, &backplane::tanh, &backplane::sigmoid, &backplane::sin,
                  &backplane::cos})
    EXPECT_ERROR(fn(i), Errc::dtype_mismatch, "i32", "f32 or f64");
  EXPECT_ERROR(neg(b), Errc::dtype_mismatch, "neg", "bool");
  EXPECT_ERROR(relu(b), Errc::dtype_mismatch, "relu", "bool");
  EXPECT_ERROR(abs(Tensor()), Errc::invalid_argument, "abs", "undefined");
  CHECK(neg(i).to_vector<int32_t>() == std::vector<int32_t>{2, 0, -5});
  CHECK((-i).dtype() == DType::i32);
}

TEST_CASE("ops: clamp refuses lo > hi and NaN bounds") {
  Env env;
  Tensor t = f32(env.cpu, {4});
  EXPECT_ERROR(clamp(t, 3, 1), Errc::invalid_argument, "clamp", "lo 3", "hi 1");
  EXPECT_ERROR(clamp(t, std::nan(""), 1), Errc::invalid_argument, "clamp", "NaN");
  CHECK(clamp(t, 1, 2).to_vector<float>() == std::vector<float>{1, 1, 2, 2});
  CHECK(clamp(t, 1, 1).to_vector<float>() == std::vector<float>{1, 1, 1, 1});
}

TEST_CASE("ops: cast to an unknown dtype is invalid_argument, to its own dtype is the same tensor") {
  Env env;
  Tensor t = f32(env.cpu, {2, 2});
  EXPECT_ERROR(cast(t, static_cast<DType>(77)), Errc::invalid_argument, "cast", "77");
  Tensor same = cast(t, DType::f32);
  CHECK(storage_of(same) == storage_of(t));
  Tensor c = cast(transpose(t, 0, 1), DType::i64);  // a strided input
  CHECK(c.dtype() == DType::i64);
  CHECK(c.to_vector<int64_t>() == std::vector<int64_t>{0, 2, 1, 3});
}

TEST_CASE("ops: an op the device lacks is unsupported_op naming op, dtype and backend") {
  Env env;
  Tensor t = f32(env.opaque, {3});
  EXPECT_ERROR(exp(t), Errc::unsupported_op, "exp", "f32", "opaque");
  EXPECT_ERROR(sum(t), Errc::unsupported_op, "sum", "f32", "opaque");
  EXPECT_ERROR(zeros(env.opaque, {2}), Errc::unsupported_op, "fill", "f32", "opaque", "zeros");
  EXPECT_ERROR(sub(t, t), Errc::unsupported_op, "sub", "opaque:0");
}

// ---- creation -------------------------------------------------------------------

TEST_CASE("ops: creation validates dtypes, scalars, shapes and the device") {
  Env env;
  EXPECT_ERROR(arange(env.cpu, 0, 5, 0), Errc::invalid_argument, "arange", "step", "non-zero");
  EXPECT_ERROR(arange(env.cpu, 0, 1e300, 1e-10), Errc::invalid_argument, "arange", "elements", "larger step");
  EXPECT_ERROR(arange(env.cpu, 0, std::numeric_limits<double>::infinity()), Errc::invalid_argument, "arange",
               "end", "finite");
  EXPECT_ERROR(arange(env.cpu, 0, 5, 1, DType::bool_), Errc::dtype_mismatch, "arange", "bool");
  EXPECT_ERROR(arange(env.cpu, 0, 4e9, 1e9, DType::i32), Errc::invalid_argument, "arange", "i32");
  EXPECT_ERROR(rand_uniform(env.cpu, {2}, 1, 0, 1, DType::i32), Errc::dtype_mismatch, "rand_uniform", "i32",
               "f32 or f64");
  EXPECT_ERROR(rand_uniform(env.cpu, {2}, 1, 2, 1), Errc::invalid_argument, "rand_uniform", "low 2",
               "high 1");
  EXPECT_ERROR(randn(env.cpu, {2}, 1, 0, -1), Errc::invalid_argument, "randn", "stddev");
  EXPECT_ERROR(randn(env.cpu, {2}, 1, 0, 1, DType::i64), Errc::dtype_mismatch, "randn", "i64");
  EXPECT_ERROR(full(env.cpu, {2}, 1e20, DType::i32), Errc::invalid_argument, "full", "i32");
  EXPECT_ERROR(full(env.cpu, {2}, std::nan(""), DType::i64), Errc::invalid_argument, "full", "i64");
  EXPECT_ERROR(zeros(env.cpu, {2, -3}), Errc::invalid_argument, "zeros", "negative");
  EXPECT_ERROR(ones(Device(), {2}), Errc::invalid_argument, "ones", "invalid");
  EXPECT_ERROR(ones(env.cpu, {2}, static_cast<DType>(0)), Errc::invalid_argument, "ones", "dtype");
}

TEST_CASE("ops: creation shapes and element counts") {
  Env env;
  CHECK(arange(env.cpu, 0, 5).shape() == Shape{5});
  CHECK(arange(env.cpu, 0, 1, 0.3).shape() == Shape{4});  // ceil(1 / 0.3)
  CHECK(arange(env.cpu, 5, 0, -2, DType::i64).to_vector<int64_t>() == std::vector<int64_t>{5, 3, 1});
  CHECK(arange(env.cpu, 5, 0).shape() == Shape{0});  // an empty range, not an error
  CHECK(zeros(env.cpu, {2, 3}, DType::f64).to_vector<double>() == std::vector<double>(6, 0.0));
  CHECK(ones(env.cpu, {}, DType::i32).to_vector<int32_t>() == std::vector<int32_t>{1});
  CHECK(full(env.cpu, {0, 4}, 7).shape() == Shape{0, 4});
  Tensor r = rand_uniform(env.cpu, {3, 2}, 42, -1, 1, DType::f64);
  CHECK(r.shape() == Shape{3, 2});
  CHECK(r.to_vector<double>() == rand_uniform(env.cpu, {3, 2}, 42, -1, 1, DType::f64).to_vector<double>());
  CHECK(randn(env.cpu, {5}, 7).shape() == Shape{5});
}

// ---- reductions -------------------------------------------------------------------

TEST_CASE("ops: reductions validate axes and dtypes") {
  Env env;
  Tensor t = f32(env.cpu, {2, 3});
  EXPECT_ERROR(sum(t, 3), Errc::invalid_argument,
               "sum: axis 3 is out of range for a tensor of rank 2 (valid: -2..1)");
  EXPECT_ERROR(argmin(t, -3, true), Errc::invalid_argument, "argmin", "axis -3", "rank 2");
  EXPECT_ERROR(sum(Tensor::from_vector<float>(env.cpu, {}, {1}), 0), Errc::invalid_argument, "sum", "rank 0");
  EXPECT_ERROR(mean(i64(env.cpu, {2}, {1, 2})), Errc::dtype_mismatch, "mean", "i64", "f32 or f64");
  EXPECT_ERROR(mean(i64(env.cpu, {2}, {1, 2}), 0), Errc::dtype_mismatch, "mean", "i64");
  EXPECT_ERROR(sum(Tensor::from_vector<bool>(env.cpu, {1}, {true})), Errc::dtype_mismatch, "sum", "bool");
  EXPECT_ERROR(argmax(Tensor::from_vector<bool>(env.cpu, {1}, {true}), 0), Errc::dtype_mismatch, "argmax",
               "bool");
  Tensor empty = f32(env.cpu, {2, 0});
  EXPECT_ERROR(max(empty, 1), Errc::invalid_argument, "max", "axis 1", "[2, 0]", "empty");
  EXPECT_ERROR(argmax(empty), Errc::invalid_argument, "argmax", "[2, 0]", "empty");
  EXPECT_ERROR(min(empty), Errc::invalid_argument, "min", "empty");
  EXPECT_ERROR(argmin(empty, -1), Errc::invalid_argument, "argmin", "empty");
  EXPECT_ERROR(softmax(i64(env.cpu, {2}, {1, 2}), 0), Errc::dtype_mismatch, "softmax", "i64", "f32 or f64");
  EXPECT_ERROR(log_softmax(t, 2), Errc::invalid_argument, "log_softmax", "axis 2", "rank 2");
}

TEST_CASE("ops: reduction shapes: keepdim, dropped axis, 0-d over all axes") {
  Env env;
  Tensor t = f32(env.cpu, {2, 3, 4});
  CHECK(sum(t, 1, true).shape() == Shape{2, 1, 4});
  CHECK(sum(t, 1).shape() == Shape{2, 4});
  CHECK(sum(t, 1).is_contiguous());
  CHECK(mean(t, -1, true).shape() == Shape{2, 3, 1});
  CHECK(max(t, 0).shape() == Shape{3, 4});
  Tensor am = argmax(t, 2);
  CHECK(am.shape() == Shape{2, 3});
  CHECK(am.dtype() == DType::i64);
  CHECK(am.to_vector<int64_t>() == std::vector<int64_t>(6, 3));
  Tensor s = sum(t);
  CHECK(s.rank() == 0);
  CHECK(s.to_vector<float>() == std::vector<float>{276});  // 0 + 1 + ... + 23
  Tensor flat = argmax(transpose(t, 0, 2));  // strided input: copied first, flat index of the copy
  CHECK(flat.rank() == 0);
  CHECK(flat.dtype() == DType::i64);
  CHECK(flat.to_vector<int64_t>() == std::vector<int64_t>{23});
  CHECK(argmin(t).to_vector<int64_t>() == std::vector<int64_t>{0});
  // Empty axes: sum gives 0, mean NaN; an empty result has no elements.
  Tensor e = f32(env.cpu, {2, 0});
  CHECK(sum(e, 1).to_vector<float>() == std::vector<float>{0, 0});
  CHECK(std::isnan(mean(e).to_vector<float>()[0]));
  CHECK(sum(e, 0).shape() == Shape{0});
  CHECK(softmax(t, 1).shape() == Shape{2, 3, 4});
}

// ---- matmul -----------------------------------------------------------------------

TEST_CASE("ops: matmul validates rank, inner dims, batch dims and dtype") {
  Env env;
  EXPECT_ERROR(matmul(f32(env.cpu, {3}), f32(env.cpu, {3, 1})), Errc::shape_mismatch, "matmul", "[3]",
               "rank >= 2");
  EXPECT_ERROR(matmul(f32(env.cpu, {2, 3}), f32(env.cpu, {2, 3})), Errc::shape_mismatch, "matmul", "inner",
               "3 != 2");
  EXPECT_ERROR(matmul(f32(env.cpu, {2, 2, 3}), f32(env.cpu, {3, 3, 4})), Errc::shape_mismatch, "matmul",
               "batch", "[2]", "[3]");
  Tensor i = Tensor::from_vector<int32_t>(env.cpu, {2, 2}, {1, 2, 3, 4});
  EXPECT_ERROR(matmul(i, i), Errc::dtype_mismatch, "matmul", "i32", "f32 or f64");
  EXPECT_ERROR(matmul(f32(env.cpu, {2, 2}), Tensor::from_vector<double>(env.cpu, {2, 2}, {1, 2, 3, 4})),
               Errc::dtype_mismatch, "matmul", "f32", "f64");
  EXPECT_ERROR(matmul(f32(env.cpu, {2, 2}), f32(env.opaque, {2, 2})), Errc::device_mismatch, "matmul");
}

TEST_CASE("ops: batched matmul broadcasts batch dims and reads strided operands") {
  Env env;
  Tensor a = f32(env.cpu, {2, 1, 2, 3});
  Tensor b = f32(env.cpu, {3, 3, 2});
  Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 3, 2, 2});
  CHECK(matmul(f32(env.cpu, {4, 2, 3}), f32(env.cpu, {3, 5})).shape() == Shape{4, 2, 5});
  // Batch [0, 0]: [[0,1,2],[3,4,5]] x [[0,1],[2,3],[4,5]] = [[10,13],[28,40]].
  const auto v = c.to_vector<float>();
  CHECK(std::vector<float>(v.begin(), v.begin() + 4) == std::vector<float>{10, 13, 28, 40});
  // A transposed (strided) right operand gives the same as its contiguous copy.
  Tensor bt = transpose(f32(env.cpu, {2, 3}), 0, 1);
  CHECK(matmul(f32(env.cpu, {2, 2, 3}), bt).to_vector<float>() ==
        matmul(f32(env.cpu, {2, 2, 3}), contiguous(bt)).to_vector<float>());
}

// ---- shape ops ---------------------------------------------------------------------

TEST_CASE("ops: reshape validates the element count and -1") {
  Env env;
  Tensor t = f32(env.cpu, {2, 3});
  EXPECT_ERROR(reshape(t, {4}), Errc::invalid_argument, "reshape", "[2, 3]", "6 elements", "[4]");
  EXPECT_ERROR(reshape(t, {-1, -1}), Errc::invalid_argument, "reshape", "more than one -1");
  EXPECT_ERROR(reshape(t, {-2, -3}), Errc::invalid_argument, "reshape", "negative extent -2");
  EXPECT_ERROR(reshape(t, {4, -1}), Errc::invalid_argument, "reshape", "[4, -1]", "divide");
  EXPECT_ERROR(reshape(f32(env.cpu, {0, 3}), {0, -1}), Errc::invalid_argument, "reshape", "ambiguous");
  EXPECT_ERROR(reshape(t, {1, 1, 1, 1, 1, 1, 1, 1, 6}), Errc::invalid_argument, "reshape", "at most 8");
  EXPECT_ERROR(reshape(t, {INT64_MAX, INT64_MAX, 2}), Errc::invalid_argument, "reshape", "element count");
  CHECK(reshape(t, {3, -1}).shape() == Shape{3, 2});
  CHECK(reshape(t, {-1}).shape() == Shape{6});
  EXPECT_ERROR(reshape(t, {}), Errc::invalid_argument, "reshape", "into []");
}

TEST_CASE("ops: reshape of a contiguous tensor is a view, of a strided one, a copy") {
  Env env;
  Tensor t = f32(env.cpu, {2, 3});
  Tensor v = reshape(t, {3, -1});
  CHECK(v.shape() == Shape{3, 2});
  CHECK(storage_of(v) == storage_of(t));
  CHECK(v.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  Tensor s = reshape(Tensor::from_vector<float>(env.cpu, {1}, {5}), {});
  CHECK(s.rank() == 0);
  CHECK(s.to_vector<float>() == std::vector<float>{5});
  Tensor p = transpose(t, 0, 1);  // [[0,3],[1,4],[2,5]]
  Tensor r = reshape(p, {6});
  CHECK(storage_of(r) != storage_of(t));
  CHECK(r.to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("ops: permute and transpose are views, contiguous gives the permuted values") {
  Env env;
  Tensor t = f32(env.cpu, {2, 3, 4});
  Tensor p = permute(t, {2, 0, -2});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK_FALSE(p.is_contiguous());
  CHECK(storage_of(p) == storage_of(t));
  Tensor c = contiguous(p);
  CHECK(c.is_contiguous());
  CHECK(storage_of(c) != storage_of(t));
  const auto v = c.to_vector<float>();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k)
        CHECK(v[static_cast<std::size_t>(i * 6 + j * 3 + k)] == static_cast<float>(j * 12 + k * 4 + i));
  Tensor tt = transpose(t, -1, 0);
  CHECK(tt.shape() == Shape{4, 3, 2});
  CHECK(storage_of(tt) == storage_of(t));
  // A view of a view keeps the root owner, which outlives the original handle.
  Tensor vv;
  {
    Tensor owner = f32(env.cpu, {2, 2});
    Tensor view = transpose(transpose(owner, 0, 1), 0, 1);
    vv = reshape(slice(view, 0, 1, 2), {2});  // row 1, still contiguous: a view
    CHECK(detail::Access::impl(vv)->base == detail::Access::impl(owner));
  }
  CHECK(vv.to_vector<float>() == std::vector<float>{2, 3});

  EXPECT_ERROR(permute(t, {0, 1}), Errc::invalid_argument, "permute", "2 dims", "rank 3");
  EXPECT_ERROR(permute(t, {0, 1, 1}), Errc::invalid_argument, "permute", "twice");
  EXPECT_ERROR(permute(t, {0, 1, 3}), Errc::invalid_argument, "permute", "dim 3", "rank 3", "-3..2");
  EXPECT_ERROR(transpose(t, 0, 5), Errc::invalid_argument, "transpose", "dim1 5");
  EXPECT_ERROR(transpose(Tensor(), 0, 1), Errc::invalid_argument, "transpose", "undefined");
}

TEST_CASE("ops: slice is a view with Python bounds") {
  Env env;
  Tensor t = f32(env.cpu, {2, 5});
  Tensor s = slice(t, 1, -3, -1);
  CHECK(s.shape() == Shape{2, 2});
  CHECK(storage_of(s) == storage_of(t));
  CHECK(s.to_vector<float>() == std::vector<float>{2, 3, 7, 8});
  CHECK(slice(t, -1, 0, 100, 2).to_vector<float>() == std::vector<float>{0, 2, 4, 5, 7, 9});
  CHECK(slice(t, 1, -100, 2).to_vector<float>() == std::vector<float>{0, 1, 5, 6});
  CHECK(slice(t, 1, 4, 2).shape() == Shape{2, 0});
  CHECK(slice(t, 0, 1, 2).to_vector<float>() == std::vector<float>{5, 6, 7, 8, 9});
  // Ops read strided views directly.
  CHECK(add(s, s).to_vector<float>() == std::vector<float>{4, 6, 14, 16});
  EXPECT_ERROR(slice(t, 1, 0, 3, 0), Errc::invalid_argument, "slice", "step", "positive", "0");
  EXPECT_ERROR(slice(t, 1, 0, 3, -1), Errc::invalid_argument, "slice", "step");
  EXPECT_ERROR(slice(t, 2, 0, 1), Errc::invalid_argument, "slice", "axis 2", "rank 2");
}

TEST_CASE("ops: cat joins along an axis and validates its inputs") {
  Env env;
  Tensor a = f32(env.cpu, {2, 2});
  Tensor b = Tensor::from_vector<float>(env.cpu, {2, 1}, {10, 11});
  Tensor c = cat({a, b, f32(env.cpu, {2, 0})}, -1);
  CHECK(c.shape() == Shape{2, 3});
  CHECK(c.to_vector<float>() == std::vector<float>{0, 1, 10, 2, 3, 11});
  // Strided inputs, rows.
  Tensor r = cat({transpose(a, 0, 1), a}, 0);
  CHECK(r.to_vector<float>() == std::vector<float>{0, 2, 1, 3, 0, 1, 2, 3});
  CHECK(cat({a}, 0).to_vector<float>() == std::vector<float>{0, 1, 2, 3});

  EXPECT_ERROR(cat({}, 0), Errc::invalid_argument, "cat", "empty");
  EXPECT_ERROR(cat({a, b}, 0), Errc::shape_mismatch, "cat", "tensor 1", "[2, 1]", "[2, 2]", "axis 0");
  EXPECT_ERROR(cat({a, f32(env.cpu, {4})}, 0), Errc::shape_mismatch, "cat", "[4]");
  EXPECT_ERROR(cat({a, Tensor::from_vector<double>(env.cpu, {2, 2}, {1, 2, 3, 4})}, 0), Errc::dtype_mismatch,
               "cat", "f64");
  EXPECT_ERROR(cat({a, f32(env.opaque, {2, 2})}, 0), Errc::device_mismatch, "cat", "opaque:0");
  EXPECT_ERROR(cat({a, Tensor()}, 0), Errc::invalid_argument, "cat", "tensor 1", "undefined");
  EXPECT_ERROR(cat({a, a}, 2), Errc::invalid_argument, "cat", "axis 2", "rank 2");
  // cat needs only COPY: it runs on the opaque backend too.
  Tensor o = cat({f32(env.opaque, {1, 2}), f32(env.opaque, {1, 2})}, 0);
  CHECK(o.to_vector<float>() == std::vector<float>{0, 1, 0, 1});
}

TEST_CASE("ops: index_select and gather validate the index and pick values") {
  Env env;
  Tensor t = f32(env.cpu, {3, 4});  // rows [0..3], [4..7], [8..11]
  Tensor idx = i64(env.cpu, {2}, {2, 0});
  Tensor rows = index_select(t, 0, idx);
  CHECK(rows.shape() == Shape{2, 4});
  CHECK(rows.to_vector<float>() == std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3});
  CHECK(index_select(t, -1, idx).to_vector<float>() == std::vector<float>{2, 0, 6, 4, 10, 8});
  CHECK(index_select(transpose(t, 0, 1), 1, idx).to_vector<float>() ==
        std::vector<float>{8, 0, 9, 1, 10, 2, 11, 3});
  Tensor g = gather(t, 1, i64(env.cpu, {2, 2}, {3, 0, 1, 1}));
  CHECK(g.shape() == Shape{2, 2});
  CHECK(g.to_vector<float>() == std::vector<float>{3, 0, 5, 5});
  CHECK(gather(t, 0, i64(env.cpu, {1, 3}, {2, 1, 0})).to_vector<float>() == std::vector<float>{8, 5, 2});

  EXPECT_ERROR(index_select(t, 0, Tensor::from_vector<int32_t>(env.cpu, {1}, {0})), Errc::dtype_mismatch,
               "index_select", "i32", "i64");
  EXPECT_ERROR(index_select(t, 0, i64(env.cpu, {1, 1}, {0})), Errc::shape_mismatch, "index_select", "1-D");
  EXPECT_ERROR(index_select(t, 2, idx), Errc::invalid_argument, "index_select", "axis 2");
  EXPECT_ERROR(index_select(t, 0, i64(env.cpu, {1}, {3})), Errc::invalid_argument, "3");
  EXPECT_ERROR(gather(t, 1, i64(env.cpu, {2}, {0, 1})), Errc::shape_mismatch, "gather", "[2]", "[3, 4]");
  EXPECT_ERROR(gather(t, 1, i64(env.cpu, {4, 1}, {0, 0, 0, 0})), Errc::shape_mismatch, "gather", "[4, 1]");
  EXPECT_ERROR(gather(t, 1, Tensor::from_vector<float>(env.cpu, {1, 1}, {0})), Errc::dtype_mismatch, "gather",
               "f32");
  EXPECT_ERROR(gather(t, -3, i64(env.cpu, {1, 1}, {0})), Errc::invalid_argument, "gather", "axis -3");
  EXPECT_ERROR(gather(f32(env.opaque, {3, 4}), 1, i64(env.cpu, {1, 1}, {0})), Errc::device_mismatch,
               "gather");
  // The opaque fixture holds f32 only: an i64 index cannot even be made there.
  EXPECT_ERROR(i64(env.opaque, {1, 1}, {0}), Errc::capability_missing, "'i64'", "opaque:0");
}

// ---- to(device) --------------------------------------------------------------------

TEST_CASE("ops: to() copies across backends through the ABI and returns the same tensor on its device") {
  Env env;
  Tensor t = f32(env.cpu, {2, 3});
  Tensor same = t.to(env.cpu);
  CHECK(storage_of(same) == storage_of(t));

  Tensor o = t.to(env.opaque);
  CHECK(o.device() == env.opaque);
  CHECK(o.shape() == Shape{2, 3});
  CHECK(o.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  // Compute there, come back.
  Tensor back = to(add(o, o), env.cpu);
  CHECK(back.device() == env.cpu);
  CHECK(back.to_vector<float>() == std::vector<float>{0, 2, 4, 6, 8, 10});
  // A strided source is made contiguous first, on either side.
  CHECK(transpose(t, 0, 1).to(env.opaque).to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor ot = transpose(o, 0, 1);
  CHECK(ot.to(env.cpu).to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK(slice(o, 1, 1, 3).to(env.cpu).to_vector<float>() == std::vector<float>{1, 2, 4, 5});
  // Empty and 0-d tensors.
  CHECK(f32(env.cpu, {0, 3}).to(env.opaque).shape() == Shape{0, 3});
  CHECK(Tensor::from_vector<float>(env.opaque, {}, {2.5f}).to(env.cpu).to_vector<float>() ==
        std::vector<float>{2.5f});

  EXPECT_ERROR(t.to(Device()), Errc::invalid_argument, "to", "invalid");
  EXPECT_ERROR(Tensor().to(env.cpu), Errc::invalid_argument, "undefined");
}

TEST_CASE("validation: slice with a huge step selects one element, without overflow") {
  backplane::Registry reg =
      bptest::load(bptest::config_json({bptest::backend_json("cpu", "backplane_cpu", true)}),
                   backplane::RequiredPolicy::throw_on_failure);
  const backplane::Device cpu = reg.backend("cpu").device(0);
  backplane::Tensor t = backplane::arange(cpu, 0, 10, 1, backplane::DType::i64);
  backplane::Tensor s = backplane::slice(t, 0, 3, 10, std::numeric_limits<int64_t>::max());
  CHECK(s.shape() == backplane::Shape{1});
  CHECK(s.to_vector<int64_t>() == std::vector<int64_t>{3});
}

TEST_CASE("validation: clamp on an integer tensor takes integer bounds the dtype can hold") {
  backplane::Registry reg =
      bptest::load(bptest::config_json({bptest::backend_json("cpu", "backplane_cpu", true)}),
                   backplane::RequiredPolicy::throw_on_failure);
  const backplane::Device cpu = reg.backend("cpu").device(0);
  backplane::Tensor t = backplane::Tensor::from_vector(cpu, {4}, std::vector<int32_t>{-5, 0, 5, 10});
  CHECK(backplane::clamp(t, 0, 6).to_vector<int32_t>() == std::vector<int32_t>{0, 0, 5, 6});
  const backplane::Error frac = bptest::error_from([&] { (void)backplane::clamp(t, 0.5, 0.7); });
  CHECK(frac.code() == backplane::Errc::invalid_argument);
  BP_CHECK_CONTAINS(frac.message(), "not an integer");
  const backplane::Error wide = bptest::error_from([&] { (void)backplane::clamp(t, 0, 1e12); });
  CHECK(wide.code() == backplane::Errc::invalid_argument);
  BP_CHECK_CONTAINS(wide.message(), "cannot be represented in i32");
}
