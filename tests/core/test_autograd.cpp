// Reverse-mode autodiff: every differentiable op's gradient against central
// finite differences in f64 (fixed-seed random inputs, broadcasting, keepdim
// both ways), the API's behaviour and errors, the final-gradient hooks, the
// graph's memory, and independent graphs on several threads.
#include "test_support.hpp"

#include "../../core/tensor/tensor_impl.hpp"  // weak references into the graph, storage identity

#include <backplane/backplane.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace bp = backplane;

namespace {

bp::Registry& registry() {
  // cpu2 is a second instance of the cpu plugin: a real cross-backend to().
  static bp::Registry reg =
      bptest::load(bptest::config_json({bptest::backend_json("cpu", "backplane_cpu", true),
                                        bptest::backend_json("cpu2", "backplane_cpu", true),
                                        bptest::backend_json("opaque", "opaque", true)}),
                   bp::RequiredPolicy::throw_on_failure);
  return reg;
}
bp::Device cpu() { return registry().backend("cpu").device(0); }
bp::Device cpu2() { return registry().backend("cpu2").device(0); }
bp::Device opaque() { return registry().backend("opaque").device(0); }

bp::Tensor f64(const bp::Shape& shape, const std::vector<double>& values) {
  return bp::Tensor::from_vector(cpu(), shape, values);
}
bp::Tensor i64(const bp::Shape& shape, const std::vector<int64_t>& values) {
  return bp::Tensor::from_vector(cpu(), shape, values);
}

std::size_t count(const bp::Shape& s) { return static_cast<std::size_t>(s.numel()); }

// Uniform values in [lo, hi) from a fixed seed.
std::vector<double> uniform(const bp::Shape& shape, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(count(shape));
  for (double& x : v) x = dist(rng);
  return v;
}

// Uniform values kept at least `margin` from every kink (where the function
// is not differentiable), so central differences never straddle one.
std::vector<double> avoiding(std::vector<double> v, std::initializer_list<double> kinks,
                             double margin = 0.02) {
  for (double& x : v)
    for (const double k : kinks)
      if (std::abs(x - k) < margin) x = x < k ? k - margin : k + margin;
  return v;
}

// Distinct values (a shuffled grid on [lo, hi), spacing (hi - lo) / n, offset
// by `phase` grid steps): no ties for max/min.
std::vector<double> distinct(const bp::Shape& shape, double lo, double hi, uint64_t seed,
                             double phase = 0.25) {
  const std::size_t n = count(shape);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = lo + (hi - lo) * (static_cast<double>(i) + phase) / static_cast<double>(n);
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

struct Input {
  bp::Shape shape;
  std::vector<double> values;
  bool grad = true;  // require_grad on this input
};

using Fn = std::function<bp::Tensor(const std::vector<bp::Tensor>&)>;

// Backward of f (seeded with fixed random weights w, so the loss is
// sum(w * f(inputs))) against central differences of that loss, element by
// element, in f64. Inputs that do not require grad must get no gradient.
void check_fd(const std::string& what, const Fn& f, const std::vector<Input>& inputs, double h = 1e-6,
              double tol = 1e-6) {
  INFO(what);
  std::vector<bp::Tensor> leaves;
  for (const Input& in : inputs) {
    bp::Tensor t = f64(in.shape, in.values);
    if (in.grad) t.require_grad();
    leaves.push_back(t);
  }
  const bp::Tensor out = f(leaves);
  REQUIRE(out.requires_grad());
  REQUIRE(out.dtype() == bp::DType::f64);
  const std::vector<double> w = uniform(out.shape(), -1.0, 1.0, 99);
  bp::BackwardOptions options;
  options.gradient = f64(out.shape(), w);
  const bp::Gradients grads = out.backward(options);

  auto loss = [&](std::size_t input, std::size_t element, double delta) {
    bp::NoGradGuard no_grad;
    std::vector<bp::Tensor> xs;
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      std::vector<double> v = inputs[j].values;
      if (j == input) v[element] += delta;
      xs.push_back(f64(inputs[j].shape, v));
    }
    const std::vector<double> o = f(xs).to_vector<double>();
    double s = 0.0;
    for (std::size_t m = 0; m < o.size(); ++m) s += o[m] * w[m];
    return s;
  };

  for (std::size_t i = 0; i < inputs.size(); ++i) {
    INFO("input " << i);
    const std::optional<bp::Tensor> g = grads.get(leaves[i]);
    if (!inputs[i].grad) {
      CHECK_FALSE(g.has_value());
      continue;
    }
    REQUIRE(g.has_value());
    CHECK(g->shape() == inputs[i].shape);
    REQUIRE(g->dtype() == bp::DType::f64);
    CHECK_FALSE(g->requires_grad());
    const std::vector<double> got = g->to_vector<double>();
    for (std::size_t k = 0; k < got.size(); ++k) {
      const double numeric = (loss(i, k, h) - loss(i, k, -h)) / (2.0 * h);
      CHECK_MESSAGE(std::abs(got[k] - numeric) <= tol * (1.0 + std::abs(numeric)),
                    "element " << k << ": backward " << got[k] << ", finite differences " << numeric);
    }
  }
}

// The broadcasting pairs every binary op is checked on.
const std::vector<std::pair<bp::Shape, bp::Shape>>& broadcast_pairs() {
  static const std::vector<std::pair<bp::Shape, bp::Shape>> pairs = {
      {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{4, 1, 5}, {3, 1}}, {{}, {2, 3}}, {{2, 1}, {1, 3}}, {{3}, {2, 1, 3}}};
  return pairs;
}

using Binary = bp::Tensor (*)(const bp::Tensor&, const bp::Tensor&);

void check_binary(const std::string& name, Binary op, double alo, double ahi, double blo, double bhi,
                  bool distinct_values = false) {
  uint64_t seed = 1;
  for (const auto& [as, bs] : broadcast_pairs()) {
    const std::string what = name + " " + as.to_string() + " with " + bs.to_string();
    // Interleaved grids never tie (for maximum/minimum).
    const std::vector<double> a =
        distinct_values ? distinct(as, alo, ahi, seed, 0.25) : uniform(as, alo, ahi, seed);
    const std::vector<double> b =
        distinct_values ? distinct(bs, blo, bhi, seed + 1, 0.75) : uniform(bs, blo, bhi, seed + 1);
    seed += 2;
    const Fn f = [op](const std::vector<bp::Tensor>& x) { return op(x[0], x[1]); };
    check_fd(what, f, {{as, a}, {bs, b}});
    check_fd(what + " (left only)", f, {{as, a}, {bs, b, false}});
    check_fd(what + " (right only)", f, {{as, a, false}, {bs, b}});
  }
}

}  // namespace

// ---- finite differences, one test per op family -----------------------------------

TEST_CASE("autograd: finite differences: add sub mul div with broadcasting") {
  check_binary("add", bp::add, -1, 1, -1, 1);
  check_binary("sub", bp::sub, -1, 1, -1, 1);
  check_binary("mul", bp::mul, -1, 1, -1, 1);
  check_binary("div", bp::div, -1, 1, 0.5, 1.5);
  // A negative divisor too.
  check_fd("div by negatives", [](const auto& x) { return bp::div(x[0], x[1]); },
           {{{2, 3}, uniform({2, 3}, -1, 1, 5)}, {{3}, uniform({3}, -1.5, -0.5, 6)}});
}

TEST_CASE("autograd: finite differences: pow maximum minimum with broadcasting") {
  check_binary("pow", bp::pow, 0.5, 2.0, -1.5, 1.5);
  check_binary("maximum", bp::maximum, -1, 1, -1, 1, true);
  check_binary("minimum", bp::minimum, -1, 1, -1, 1, true);
}

TEST_CASE("autograd: finite differences: where") {
  const bp::Tensor cond =
      bp::Tensor::from_vector<bool>(cpu(), {2, 3}, {true, false, true, false, false, true});
  const Fn f = [cond](const auto& x) { return bp::where(cond, x[0], x[1]); };
  check_fd("where [2, 3] cond, [3] a, [2, 1] b", f,
           {{{3}, uniform({3}, -1, 1, 7)}, {{2, 1}, uniform({2, 1}, -1, 1, 8)}});
  check_fd("where, a only", f, {{{3}, uniform({3}, -1, 1, 9)}, {{2, 1}, uniform({2, 1}, -1, 1, 10), false}});
  const bp::Tensor row = bp::Tensor::from_vector<bool>(cpu(), {3}, {false, true, true});
  check_fd("where [3] cond broadcast over [2, 3]",
           [row](const auto& x) { return bp::where(row, x[0], x[1]); },
           {{{2, 3}, uniform({2, 3}, -1, 1, 11)}, {{2, 3}, uniform({2, 3}, -1, 1, 12)}});
}

TEST_CASE("autograd: finite differences: unary math") {
  const bp::Shape s{2, 3};
  struct Case {
    const char* name;
    bp::Tensor (*op)(const bp::Tensor&);
    std::vector<double> values;
  };
  const std::vector<Case> cases = {
      {"neg", bp::neg, uniform(s, -1, 1, 20)},
      {"abs", bp::abs, avoiding(uniform(s, -1, 1, 21), {0.0})},
      {"exp", bp::exp, uniform(s, -2, 2, 22)},
      {"log", bp::log, uniform(s, 0.2, 3, 23)},
      {"sqrt", bp::sqrt, uniform(s, 0.2, 3, 24)},
      {"tanh", bp::tanh, uniform(s, -2, 2, 25)},
      {"sigmoid", bp::sigmoid, uniform(s, -3, 3, 26)},
      {"relu", bp::relu, avoiding(uniform(s, -1, 1, 27), {0.0})},
      {"sin", bp::sin, uniform(s, -3, 3, 28)},
      {"cos", bp::cos, uniform(s, -3, 3, 29)},
      {"erf", bp::erf, uniform(s, -2, 2, 30)},
  };
  for (const Case& c : cases) {
    const auto op = c.op;
    check_fd(c.name, [op](const auto& x) { return op(x[0]); }, {{s, c.values}});
    // On a strided (transposed) input as well.
    check_fd(std::string(c.name) + " of a transposed view",
             [op](const auto& x) { return op(bp::transpose(x[0], 0, 1)); }, {{s, c.values}});
  }
}

TEST_CASE("autograd: finite differences: clamp") {
  const bp::Shape s{3, 4};
  check_fd("clamp [-0.5, 0.5]", [](const auto& x) { return bp::clamp(x[0], -0.5, 0.5); },
           {{s, avoiding(uniform(s, -1, 1, 30), {-0.5, 0.5})}});
  const double inf = std::numeric_limits<double>::infinity();
  check_fd("clamp [0.1, inf]", [inf](const auto& x) { return bp::clamp(x[0], 0.1, inf); },
           {{s, avoiding(uniform(s, -1, 1, 31), {0.1})}});
}

TEST_CASE("autograd: finite differences: sum and mean over an axis, keepdim both ways, and over all") {
  for (const bp::Shape& s : {bp::Shape{3, 4}, bp::Shape{2, 3, 4}}) {
    const std::vector<double> v = uniform(s, -1, 1, 40 + static_cast<uint64_t>(s.rank()));
    for (int64_t axis = -s.rank(); axis < s.rank(); ++axis) {
      for (const bool keepdim : {false, true}) {
        const std::string where =
            s.to_string() + " axis " + std::to_string(axis) + (keepdim ? " keepdim" : "");
        check_fd("sum " + where, [=](const auto& x) { return bp::sum(x[0], axis, keepdim); }, {{s, v}});
        check_fd("mean " + where, [=](const auto& x) { return bp::mean(x[0], axis, keepdim); }, {{s, v}});
      }
    }
    check_fd("sum all " + s.to_string(), [](const auto& x) { return bp::sum(x[0]); }, {{s, v}});
    check_fd("mean all " + s.to_string(), [](const auto& x) { return bp::mean(x[0]); }, {{s, v}});
  }
}

TEST_CASE("autograd: finite differences: max and min over an axis, keepdim both ways, and over all") {
  for (const bp::Shape& s : {bp::Shape{3, 4}, bp::Shape{2, 3, 4}}) {
    const std::vector<double> v = distinct(s, -1, 1, 50 + static_cast<uint64_t>(s.rank()));
    for (int64_t axis = -s.rank(); axis < s.rank(); ++axis) {
      for (const bool keepdim : {false, true}) {
        const std::string where =
            s.to_string() + " axis " + std::to_string(axis) + (keepdim ? " keepdim" : "");
        check_fd("max " + where, [=](const auto& x) { return bp::max(x[0], axis, keepdim); }, {{s, v}});
        check_fd("min " + where, [=](const auto& x) { return bp::min(x[0], axis, keepdim); }, {{s, v}});
      }
    }
    check_fd("max all " + s.to_string(), [](const auto& x) { return bp::max(x[0]); }, {{s, v}});
    check_fd("min all " + s.to_string(), [](const auto& x) { return bp::min(x[0]); }, {{s, v}});
  }
}

TEST_CASE("autograd: finite differences: matmul, batched and with broadcast batch dims") {
  const std::vector<std::pair<bp::Shape, bp::Shape>> cases = {{{3, 4}, {4, 2}},
                                                              {{2, 3, 4}, {4, 5}},
                                                              {{4, 3}, {2, 3, 2}},
                                                              {{5, 3, 4}, {5, 4, 2}},
                                                              {{2, 1, 3, 4}, {3, 4, 2}}};
  uint64_t seed = 60;
  for (const auto& [as, bs] : cases) {
    const std::string what = "matmul " + as.to_string() + " x " + bs.to_string();
    const Fn f = [](const auto& x) { return bp::matmul(x[0], x[1]); };
    const std::vector<double> a = uniform(as, -1, 1, seed++), b = uniform(bs, -1, 1, seed++);
    check_fd(what, f, {{as, a}, {bs, b}});
    check_fd(what + " (left only)", f, {{as, a}, {bs, b, false}});
    check_fd(what + " (right only)", f, {{as, a, false}, {bs, b}});
  }
  // A transposed (strided) operand.
  check_fd("matmul of a transposed operand",
           [](const auto& x) { return bp::matmul(bp::transpose(x[0], 0, 1), x[1]); },
           {{{4, 3}, uniform({4, 3}, -1, 1, 70)}, {{4, 2}, uniform({4, 2}, -1, 1, 71)}});
}

TEST_CASE("autograd: finite differences: softmax and log_softmax") {
  for (const bp::Shape& s : {bp::Shape{3, 4}, bp::Shape{2, 3, 4}}) {
    const std::vector<double> v = uniform(s, -2, 2, 80 + static_cast<uint64_t>(s.rank()));
    for (int64_t axis = -s.rank(); axis < s.rank(); ++axis) {
      const std::string where = s.to_string() + " axis " + std::to_string(axis);
      check_fd("softmax " + where, [=](const auto& x) { return bp::softmax(x[0], axis); }, {{s, v}});
      check_fd("log_softmax " + where, [=](const auto& x) { return bp::log_softmax(x[0], axis); }, {{s, v}});
    }
  }
}

TEST_CASE("autograd: finite differences: reshape permute transpose contiguous") {
  const bp::Shape s{2, 3, 4};
  const std::vector<double> v = uniform(s, -1, 1, 90);
  check_fd("reshape to [6, 4]", [](const auto& x) { return bp::reshape(x[0], {6, 4}); }, {{s, v}});
  check_fd("reshape to [-1]", [](const auto& x) { return bp::reshape(x[0], {-1}); }, {{s, v}});
  check_fd("reshape of a permuted view (a copy)",
           [](const auto& x) {
             return bp::reshape(bp::permute(x[0], {2, 0, 1}), {4, 6});
           },
           {{s, v}});
  check_fd("permute {2, 0, 1}", [](const auto& x) { return bp::permute(x[0], {2, 0, 1}); }, {{s, v}});
  check_fd("permute {-1, 0, 1}", [](const auto& x) { return bp::permute(x[0], {-1, 0, 1}); }, {{s, v}});
  check_fd("transpose 0 2", [](const auto& x) { return bp::transpose(x[0], 0, 2); }, {{s, v}});
  check_fd("transpose -1 -2", [](const auto& x) { return bp::transpose(x[0], -1, -2); }, {{s, v}});
  check_fd("contiguous of a transposed view",
           [](const auto& x) { return bp::contiguous(bp::transpose(x[0], 1, 2)); }, {{s, v}});
}

TEST_CASE("autograd: finite differences: slice with steps and negative bounds") {
  const bp::Shape s{4, 6};
  const std::vector<double> v = uniform(s, -1, 1, 100);
  struct Case {
    int64_t axis, start, end, step;
  };
  for (const Case c : {Case{1, 1, 5, 1}, Case{1, 0, 6, 2}, Case{1, 1, 6, 4}, Case{1, -3, 100, 1},
                       Case{0, 1, 4, 2}, Case{-1, 2, 3, 10}, Case{0, 3, 1, 1}, Case{1, -100, -2, 3}}) {
    const std::string what = "slice axis " + std::to_string(c.axis) + " " + std::to_string(c.start) + ":" +
                             std::to_string(c.end) + ":" + std::to_string(c.step);
    check_fd(what, [c](const auto& x) { return bp::slice(x[0], c.axis, c.start, c.end, c.step); }, {{s, v}});
  }
  check_fd("slice of a slice", [](const auto& x) { return bp::slice(bp::slice(x[0], 1, 1, 6, 2), 0, 1, 3); },
           {{s, v}});
}

TEST_CASE("autograd: finite differences: cat") {
  const Fn f1 = [](const auto& x) { return bp::cat({x[0], x[1], x[2]}, 1); };
  const std::vector<Input> in1 = {{{2, 3}, uniform({2, 3}, -1, 1, 110)},
                                  {{2, 1}, uniform({2, 1}, -1, 1, 111), false},
                                  {{2, 2}, uniform({2, 2}, -1, 1, 112)}};
  check_fd("cat axis 1, middle without grad", f1, in1);
  check_fd("cat axis 0 of one tensor twice",
           [](const auto& x) {
             return bp::cat({x[0], x[0]}, 0);
           },
           {{{2, 3}, uniform({2, 3}, -1, 1, 113)}});
  check_fd("cat axis -2",
           [](const auto& x) {
             return bp::cat({x[0], x[1]}, -2);
           },
           {{{1, 3}, uniform({1, 3}, -1, 1, 114)}, {{2, 3}, uniform({2, 3}, -1, 1, 115)}});
}

TEST_CASE("autograd: finite differences: index_select and gather, with repeated indices") {
  const bp::Shape s{4, 3};
  const std::vector<double> v = uniform(s, -1, 1, 120);
  const bp::Tensor rows = i64({5}, {3, 0, 3, 1, 3});
  const bp::Tensor cols = i64({3}, {2, 2, 0});
  const bp::Tensor none = i64({0}, {});
  check_fd("index_select axis 0", [rows](const auto& x) { return bp::index_select(x[0], 0, rows); },
           {{s, v}});
  check_fd("index_select axis -1", [cols](const auto& x) { return bp::index_select(x[0], -1, cols); },
           {{s, v}});
  check_fd("index_select of nothing", [none](const auto& x) { return bp::index_select(x[0], 0, none); },
           {{s, v}});
  const bp::Shape s3{2, 3, 4};
  check_fd("index_select axis 1 of rank 3", [cols](const auto& x) { return bp::index_select(x[0], 1, cols); },
           {{s3, uniform(s3, -1, 1, 121)}});

  // gather: the index has the input's rank; extents no larger off the axis.
  const bp::Tensor g1 = i64({4, 2}, {0, 2, 2, 2, 1, 0, 0, 0});
  check_fd("gather axis 1", [g1](const auto& x) { return bp::gather(x[0], 1, g1); }, {{s, v}});
  const bp::Tensor g0 = i64({6, 3}, {3, 0, 1, 3, 3, 1, 0, 0, 2, 1, 2, 3, 2, 1, 0, 3, 3, 3});
  check_fd("gather axis 0, more rows than the input", [g0](const auto& x) { return bp::gather(x[0], 0, g0); },
           {{s, v}});
  const bp::Tensor small = i64({2, 2}, {1, 3, 0, 1});
  check_fd("gather axis 0, smaller off the axis",
           [small](const auto& x) { return bp::gather(x[0], 0, small); }, {{s, v}});
  const bp::Tensor g3 = i64({2, 2, 2}, {3, 0, 1, 1, 2, 2, 0, 3});
  check_fd("gather axis -1 of rank 3", [g3](const auto& x) { return bp::gather(x[0], -1, g3); },
           {{s3, uniform(s3, -1, 1, 122)}});
}

TEST_CASE("autograd: finite differences: cast and to") {
  const bp::Shape s{2, 3};
  // Through f32 and back: the derivative is 1; differences use a step that f32 resolves.
  check_fd(
      "cast f64 -> f32 -> f64",
      [](const auto& x) {
        return bp::cast(bp::mul(bp::cast(x[0], bp::DType::f32), bp::cast(x[0], bp::DType::f32)),
                        bp::DType::f64);
      },
      {{s, uniform(s, 0.5, 1.5, 130)}}, 1e-2, 1e-4);
  check_fd("cast to its own dtype", [](const auto& x) { return bp::cast(x[0], bp::DType::f64); },
           {{s, uniform(s, -1, 1, 131)}});
  check_fd("to its own device", [](const auto& x) { return bp::to(x[0], cpu()); },
           {{s, uniform(s, -1, 1, 132)}});
  check_fd("to another backend and back",
           [](const auto& x) { return bp::to(bp::mul(bp::to(x[0], cpu2()), bp::to(x[0], cpu2())), cpu()); },
           {{s, uniform(s, -1, 1, 133)}});
}

TEST_CASE("autograd: finite differences: a small network with a cross-entropy loss") {
  // logits = relu(x W1 + b1) W2; loss = -mean(gather(log_softmax(logits), labels)).
  const bp::Tensor x = f64({4, 3}, uniform({4, 3}, -1, 1, 140));
  const bp::Tensor labels = i64({4, 1}, {0, 2, 1, 2});
  const Fn net = [=](const auto& p) {
    const bp::Tensor h = bp::relu(bp::add(bp::matmul(x, p[0]), p[1]));
    const bp::Tensor logp = bp::log_softmax(bp::matmul(h, p[2]), 1);
    return bp::neg(bp::mean(bp::gather(logp, 1, labels)));
  };
  check_fd("mlp cross-entropy", net,
           {{{3, 5}, uniform({3, 5}, -1, 1, 141)},
            {{5}, uniform({5}, -0.5, 0.5, 142)},
            {{5, 3}, uniform({5, 3}, -1, 1, 143)}});
}

// ---- documented conventions ------------------------------------------------------------

TEST_CASE("autograd: max and min split the gradient evenly among ties") {
  const bp::Tensor x = f64({2, 4}, {1, 3, 3, 2, 5, 5, 5, 0}).require_grad();
  CHECK(bp::max(x, 1).backward(bp::BackwardOptions{f64({2}, {1, 1})}).get(x)->to_vector<double>() ==
        std::vector<double>{0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0});
  CHECK(bp::max(x).backward().get(x)->to_vector<double>() ==
        std::vector<double>{0, 0, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0});
  CHECK(bp::min(x, 0, true)
            .backward(bp::BackwardOptions{f64({1, 4}, {1, 2, 3, 4})})
            .get(x)
            ->to_vector<double>() == std::vector<double>{1, 2, 3, 0, 0, 0, 0, 4});

  const bp::Tensor a = f64({3}, {1, 2, 3}).require_grad();
  const bp::Tensor b = f64({3}, {3, 2, 1}).require_grad();
  const bp::Gradients g = bp::sum(bp::maximum(a, b)).backward();
  CHECK(g.get(a)->to_vector<double>() == std::vector<double>{0, 0.5, 1});
  CHECK(g.get(b)->to_vector<double>() == std::vector<double>{1, 0.5, 0});
  const bp::Gradients m = bp::sum(bp::minimum(a, b)).backward();
  CHECK(m.get(a)->to_vector<double>() == std::vector<double>{1, 0.5, 0});
}

TEST_CASE("autograd: abs relu clamp and pow at their special points") {
  const bp::Tensor x = f64({3}, {-1, 0, 2}).require_grad();
  CHECK(bp::sum(bp::abs(x)).backward().get(x)->to_vector<double>() == std::vector<double>{-1, 0, 1});
  CHECK(bp::sum(bp::relu(x)).backward().get(x)->to_vector<double>() == std::vector<double>{0, 0, 1});
  // clamp passes the gradient on the bounds themselves.
  CHECK(bp::sum(bp::clamp(x, 0, 2)).backward().get(x)->to_vector<double>() == std::vector<double>{0, 1, 1});
  const bp::Tensor a = f64({2}, {0, 0}).require_grad();
  const bp::Tensor e = f64({2}, {0, 2}).require_grad();
  const bp::Gradients g = bp::sum(bp::pow(a, e)).backward();
  CHECK(g.get(a)->to_vector<double>() == std::vector<double>{0, 0});  // 0 where b == 0; 2 * 0^1 = 0
  CHECK(g.get(e)->to_vector<double>() == std::vector<double>{0, 0});  // 0 where a == 0 and b >= 0
}

TEST_CASE("autograd: f32 gradients and an explicit seed") {
  const bp::Tensor x = bp::Tensor::from_vector<float>(cpu(), {3}, {1, -2, 3}).require_grad();
  const bp::Tensor y = bp::mul(x, x);
  bp::BackwardOptions options;
  options.gradient = bp::Tensor::from_vector<float>(cpu(), {3}, {1, 10, 100});
  const bp::Gradients g = y.backward(options);
  REQUIRE(g.get(x).has_value());
  CHECK(g.get(x)->dtype() == bp::DType::f32);
  CHECK(g.get(x)->to_vector<float>() == std::vector<float>{2, -40, 600});
  // cast between float dtypes carries the gradient back in the leaf's dtype.
  const bp::Tensor z = bp::Tensor::from_vector<float>(cpu(), {2}, {1.5f, 2.5f}).require_grad();
  const bp::Gradients gz = bp::sum(bp::mul(bp::cast(z, bp::DType::f64), f64({2}, {3, 4}))).backward();
  CHECK(gz.get(z)->dtype() == bp::DType::f32);
  CHECK(gz.get(z)->to_vector<float>() == std::vector<float>{3, 4});
}

// ---- API behaviour ---------------------------------------------------------------------

TEST_CASE("autograd: require_grad accepts only f32 and f64") {
  for (const bp::DType d : {bp::DType::i32, bp::DType::i64, bp::DType::bool_, bp::DType::u8}) {
    const bp::Tensor t = bp::zeros(cpu(), {2}, d);
    const bp::Error e = bptest::error_from([&] { t.require_grad(); });
    CHECK(e.code() == bp::Errc::dtype_mismatch);
    BP_CHECK_CONTAINS(e.message(), "Tensor::require_grad");
    BP_CHECK_CONTAINS(e.message(), std::string(bp::to_string(d)));
    BP_CHECK_CONTAINS(e.message(), "cast it to f32 or f64");
    CHECK_FALSE(t.requires_grad());
  }
  CHECK(bptest::error_from([] { bp::Tensor().require_grad(); }).code() == bp::Errc::invalid_argument);
  CHECK_FALSE(bp::Tensor().requires_grad());
  const bp::Tensor x = bp::zeros(cpu(), {2}, bp::DType::f64);
  CHECK_FALSE(x.requires_grad());
  const bp::Tensor same = x.require_grad();
  CHECK(x.requires_grad());
  CHECK(bp::detail::Access::impl(same) == bp::detail::Access::impl(x));
  // Marking twice keeps the leaf's identity: gradients still find it.
  const bp::Tensor y = bp::sum(x);
  x.require_grad();
  CHECK(y.backward().get(x).has_value());
}

TEST_CASE("autograd: which outputs require grad") {
  const bp::Tensor x = f64({2, 3}, uniform({2, 3}, -1, 1, 200)).require_grad();
  const bp::Tensor c = f64({2, 3}, uniform({2, 3}, -1, 1, 201));
  CHECK(bp::add(x, c).requires_grad());
  CHECK(bp::add(c, x).requires_grad());
  CHECK_FALSE(bp::add(c, c).requires_grad());
  CHECK_FALSE(bp::gt(x, c).requires_grad());
  CHECK_FALSE(bp::eq(x, x).requires_grad());
  CHECK_FALSE(bp::argmax(x, 1).requires_grad());
  CHECK_FALSE(bp::argmin(x).requires_grad());
  CHECK_FALSE(bp::cast(x, bp::DType::i64).requires_grad());
  CHECK_FALSE(bp::cast(x, bp::DType::bool_).requires_grad());
  CHECK(bp::cast(x, bp::DType::f32).requires_grad());
  CHECK_FALSE(bp::zeros(cpu(), {2}, bp::DType::f64).requires_grad());
  CHECK_FALSE(bp::randn(cpu(), {2}, 1, 0, 1, bp::DType::f64).requires_grad());
  CHECK(bp::reshape(x, {-1}).requires_grad());
  CHECK(x.to(cpu2()).requires_grad());
  CHECK_FALSE(x.detach().requires_grad());
  // Integer ops of integer tensors never do, whatever else is marked.
  const bp::Tensor idx = bp::argmax(x, 1);
  CHECK_FALSE(bp::add(idx, idx).requires_grad());
}

TEST_CASE("autograd: Gradients finds leaves by identity only") {
  const bp::Tensor x = f64({2}, {1, 2}).require_grad();
  const bp::Tensor unused = f64({2}, {1, 2}).require_grad();
  const bp::Tensor plain = f64({2}, {1, 2});
  const bp::Tensor h = bp::mul(x, x);
  const bp::Gradients g = bp::sum(h).backward();
  CHECK(g.size() == 1);
  CHECK_FALSE(g.empty());
  const bp::Tensor copy = x;  // another handle of the same tensor
  REQUIRE(g.get(copy).has_value());
  CHECK(g.get(copy)->to_vector<double>() == std::vector<double>{2, 4});
  CHECK(g.contains(x));
  CHECK_FALSE(g.get(h).has_value());             // not a leaf
  CHECK_FALSE(g.get(unused).has_value());        // a leaf the root does not depend on
  CHECK_FALSE(g.get(plain).has_value());         // does not require grad
  CHECK_FALSE(g.get(bp::Tensor()).has_value());  // undefined
  CHECK_FALSE(g.get(x.detach()).has_value());    // the same data, another tensor
  CHECK_FALSE(g.get(bp::reshape(x, {2})).has_value());
  int seen = 0;
  for (const bp::Gradients::Entry& e : g) {
    CHECK(bp::detail::Access::impl(e.param) == bp::detail::Access::impl(x));
    CHECK(e.gradient.to_vector<double>() == std::vector<double>{2, 4});
    ++seen;
  }
  CHECK(seen == 1);
}

TEST_CASE("autograd: Gradients set and remove") {
  const bp::Tensor x = f64({2}, {1, 2}).require_grad();
  const bp::Tensor w = f64({2}, {3, 4}).require_grad();
  bp::Gradients g = bp::sum(bp::mul(x, w)).backward();
  CHECK(g.size() == 2);
  g.set(x, f64({2}, {7, 7}));
  CHECK(g.get(x)->to_vector<double>() == std::vector<double>{7, 7});
  CHECK(g.size() == 2);
  const std::optional<bp::Tensor> removed = g.remove(x);
  REQUIRE(removed.has_value());
  CHECK(removed->to_vector<double>() == std::vector<double>{7, 7});
  CHECK(g.size() == 1);
  CHECK_FALSE(g.get(x).has_value());
  CHECK(g.get(w)->to_vector<double>() == std::vector<double>{1, 2});
  CHECK_FALSE(g.remove(x).has_value());
  CHECK(bptest::error_from([&] {
          g.set(f64({2}, {1, 2}), f64({2}, {1, 2}));
        }).code() == bp::Errc::invalid_argument);
  CHECK(bptest::error_from([&] { g.set(x, f64({3}, {1, 2, 3})); }).code() == bp::Errc::shape_mismatch);
  CHECK(bptest::error_from([&] { g.set(x, bp::zeros(cpu(), {2}, bp::DType::f32)); }).code() ==
        bp::Errc::dtype_mismatch);
  CHECK(bptest::error_from([&] { g.set(x, bp::zeros(cpu2(), {2}, bp::DType::f64)); }).code() ==
        bp::Errc::device_mismatch);
  CHECK(bptest::error_from([&] { g.set(x, bp::Tensor()); }).code() == bp::Errc::invalid_argument);
}

TEST_CASE("autograd: NoGradGuard records nothing, nests, and is per thread") {
  const bp::Tensor x = f64({2}, {1, 2}).require_grad();
  CHECK(bp::grad_enabled());
  {
    bp::NoGradGuard outer;
    CHECK_FALSE(bp::grad_enabled());
    const bp::Tensor y = bp::mul(x, x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.to_vector<double>() == std::vector<double>{1, 4});
    CHECK(bptest::error_from([&] {
            y.backward(bp::BackwardOptions{f64({2}, {1, 1})});
          }).code() == bp::Errc::invalid_argument);
    {
      bp::NoGradGuard inner;
      CHECK_FALSE(bp::exp(x).requires_grad());
    }
    CHECK_FALSE(bp::grad_enabled());  // the inner guard restored "off"
    // Another thread records as usual.
    bool other_enabled = false, other_records = false;
    std::thread([&] {
      other_enabled = bp::grad_enabled();
      other_records = bp::mul(x, x).requires_grad();
    }).join();
    CHECK(other_enabled);
    CHECK(other_records);
    // require_grad still marks leaves.
    CHECK(f64({1}, {1}).require_grad().requires_grad());
  }
  CHECK(bp::grad_enabled());
  CHECK(bp::mul(x, x).requires_grad());
}

TEST_CASE("autograd: detach cuts the graph and shares the data") {
  const bp::Tensor x = f64({3}, {1, 2, 3}).require_grad();
  const bp::Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.to_vector<double>() == std::vector<double>{1, 2, 3});
  CHECK(bp::detail::Access::impl(d)->storage == bp::detail::Access::impl(x)->storage);  // no copy
  // d(x * stop(x))/dx = stop(x), not 2x.
  const bp::Gradients g = bp::sum(bp::mul(x, x.detach())).backward();
  CHECK(g.get(x)->to_vector<double>() == std::vector<double>{1, 2, 3});
  CHECK(bptest::error_from([] { bp::Tensor().detach(); }).code() == bp::Errc::invalid_argument);
}

TEST_CASE("autograd: a tensor used several times accumulates its gradient") {
  const bp::Tensor x = f64({3}, {1, 2, 3}).require_grad();
  // y = x*x + x + sum over a broadcast x: dy/dx = 2x + 1 + 2 (x appears in [2, 3] twice per column).
  const bp::Tensor twice = bp::add(bp::zeros(cpu(), {2, 3}, bp::DType::f64), x);
  const bp::Tensor loss = bp::add(bp::sum(bp::add(bp::mul(x, x), x)), bp::sum(twice));
  const bp::Gradients g = loss.backward();
  CHECK(g.get(x)->to_vector<double>() == std::vector<double>{5, 7, 9});
  // The same node reached through two paths.
  const bp::Tensor h = bp::exp(x);
  const bp::Gradients gh = bp::sum(bp::add(h, h)).backward();
  const std::vector<double> got = gh.get(x)->to_vector<double>();
  for (std::size_t i = 0; i < 3; ++i)
    CHECK(got[i] == doctest::Approx(2 * std::exp(1.0 + static_cast<double>(i))));
}

TEST_CASE("autograd: backward errors") {
  const bp::Tensor x = f64({2, 3}, uniform({2, 3}, -1, 1, 210)).require_grad();
  const bp::Tensor y = bp::mul(x, x);

  bp::Error e = bptest::error_from([&] { y.backward(); });
  CHECK(e.code() == bp::Errc::shape_mismatch);
  BP_CHECK_CONTAINS(e.message(), "6 elements");
  BP_CHECK_CONTAINS(e.message(), "BackwardOptions::gradient");

  e = bptest::error_from([&] { y.backward(bp::BackwardOptions{f64({3}, {1, 1, 1})}); });
  CHECK(e.code() == bp::Errc::shape_mismatch);
  e = bptest::error_from([&] { y.backward(bp::BackwardOptions{bp::ones(cpu(), {2, 3}, bp::DType::f32)}); });
  CHECK(e.code() == bp::Errc::dtype_mismatch);
  e = bptest::error_from([&] { y.backward(bp::BackwardOptions{bp::ones(cpu2(), {2, 3}, bp::DType::f64)}); });
  CHECK(e.code() == bp::Errc::device_mismatch);

  e = bptest::error_from([&] { bp::sum(f64({2}, {1, 2})).backward(); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "does not require grad");
  CHECK(bptest::error_from([] { bp::Tensor().backward(); }).code() == bp::Errc::invalid_argument);

  // A second backward through a freed graph.
  const bp::Tensor loss = bp::sum(bp::exp(x));
  CHECK(loss.backward().size() == 1);
  e = bptest::error_from([&] { loss.backward(); });
  CHECK(e.code() == bp::Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "freed by an earlier backward()");
  BP_CHECK_CONTAINS(e.message(), "retain_graph");
  // ... also from another root that shares the freed part.
  const bp::Tensor h = bp::exp(x);
  const bp::Tensor l1 = bp::sum(h), l2 = bp::mean(h);
  l1.backward();
  CHECK(bptest::error_from([&] { l2.backward(); }).code() == bp::Errc::invalid_argument);
}

TEST_CASE("autograd: retain_graph allows backward again with the same result") {
  const bp::Tensor x = f64({3}, {0.5, 1, 2}).require_grad();
  const bp::Tensor loss = bp::sum(bp::mul(bp::exp(x), x));
  bp::BackwardOptions keep;
  keep.retain_graph = true;
  const std::vector<double> first = loss.backward(keep).get(x)->to_vector<double>();
  const std::vector<double> second = loss.backward(keep).get(x)->to_vector<double>();
  const std::vector<double> third = loss.backward().get(x)->to_vector<double>();
  CHECK(first == second);
  CHECK(first == third);
  for (std::size_t i = 0; i < 3; ++i) {
    const double v = x.to_vector<double>()[i];
    CHECK(first[i] == doctest::Approx(std::exp(v) * (v + 1)));
  }
}

TEST_CASE("autograd: backward of a leaf and of a one-element non-scalar") {
  const bp::Tensor x = f64({}, {3}).require_grad();
  const bp::Gradients g = x.backward();
  CHECK(g.get(x)->to_vector<double>() == std::vector<double>{1});
  const bp::Tensor v = f64({1, 1}, {2}).require_grad();
  const bp::Tensor y = bp::mul(v, v);
  CHECK(y.backward().get(v)->to_vector<double>() == std::vector<double>{4});
}

// ---- hooks -------------------------------------------------------------------------------

namespace {

struct Mlp {
  bp::Tensor w1, b1, w2, b2;
  static Mlp make(uint64_t seed) {
    return {f64({3, 4}, uniform({3, 4}, -1, 1, seed)).require_grad(),
            f64({4}, uniform({4}, -1, 1, seed + 1)).require_grad(),
            f64({4, 2}, uniform({4, 2}, -1, 1, seed + 2)).require_grad(),
            f64({2}, uniform({2}, -1, 1, seed + 3)).require_grad()};
  }
  bp::Tensor loss(const bp::Tensor& x) const {
    const bp::Tensor h = bp::tanh(bp::add(bp::matmul(x, w1), b1));
    return bp::mean(bp::add(bp::matmul(h, w2), b2));
  }
  // "w1", ... for a leaf of this net.
  std::string name_of(const bp::Tensor& t) const {
    if (bp::detail::Access::impl(t) == bp::detail::Access::impl(w1)) return "w1";
    if (bp::detail::Access::impl(t) == bp::detail::Access::impl(b1)) return "b1";
    if (bp::detail::Access::impl(t) == bp::detail::Access::impl(w2)) return "w2";
    if (bp::detail::Access::impl(t) == bp::detail::Access::impl(b2)) return "b2";
    return "?";
  }
};

// The order in which on_gradient_final saw the leaves of one backward.
std::vector<std::string> hook_order(const Mlp& net, const bp::Tensor& x) {
  std::vector<std::string> order;
  bp::BackwardOptions options;
  options.on_gradient_final = [&](const bp::Tensor& param, bp::Tensor&) {
    order.push_back(net.name_of(param));
  };
  net.loss(x).backward(options);
  return order;
}

}  // namespace

TEST_CASE("autograd: on_gradient_final fires once per leaf with its final gradient, then on_backward_end") {
  const Mlp net = Mlp::make(300);
  const bp::Tensor x = f64({5, 3}, uniform({5, 3}, -1, 1, 310));
  bp::BackwardOptions keep;
  keep.retain_graph = true;
  const bp::Tensor loss = net.loss(x);
  const bp::Gradients reference = loss.backward(keep);

  std::map<std::string, int> calls;
  std::vector<std::string> order;
  bool ended = false;
  bp::BackwardOptions options;
  options.on_gradient_final = [&](const bp::Tensor& param, bp::Tensor& gradient) {
    CHECK_FALSE(ended);
    CHECK_FALSE(bp::grad_enabled());
    const std::string name = net.name_of(param);
    ++calls[name];
    order.push_back(name);
    // Final: already the complete sum of its contributions.
    CHECK(gradient.to_vector<double>() == reference.get(param)->to_vector<double>());
  };
  options.on_backward_end = [&](bp::Gradients& g) {
    CHECK_FALSE(ended);
    ended = true;
    CHECK(g.size() == 4);
    CHECK(order.size() == 4);
  };
  const bp::Gradients g = loss.backward(options);
  CHECK(ended);
  CHECK(calls == std::map<std::string, int>{{"b1", 1}, {"b2", 1}, {"w1", 1}, {"w2", 1}});
  // The last layer's leaves are final before the first layer's nodes run.
  CHECK(order == std::vector<std::string>{"b2", "w2", "b1", "w1"});
  // Gradients iterate in the same order.
  std::vector<std::string> listed;
  for (const auto& e : g) listed.push_back(net.name_of(e.param));
  CHECK(listed == order);
}

TEST_CASE("autograd: on_gradient_final order is the same for the same graph") {
  const bp::Tensor x = f64({5, 3}, uniform({5, 3}, -1, 1, 320));
  const Mlp a = Mlp::make(330), b = Mlp::make(340);
  const std::vector<std::string> first = hook_order(a, x);
  CHECK(first.size() == 4);
  CHECK(hook_order(a, x) == first);  // a fresh graph over the same leaves
  CHECK(hook_order(b, x) == first);  // another set of leaves, the same structure
  // A graph that uses a leaf twice: it is final only after its last use ran.
  const bp::Tensor w = f64({3}, {1, 2, 3}).require_grad();
  const bp::Tensor v = f64({3}, {4, 5, 6}).require_grad();
  std::vector<std::string> order;
  bp::BackwardOptions options;
  options.on_gradient_final = [&](const bp::Tensor& p, bp::Tensor& grad) {
    order.push_back(bp::detail::Access::impl(p) == bp::detail::Access::impl(w) ? "w" : "v");
    if (bp::detail::Access::impl(p) == bp::detail::Access::impl(w))
      CHECK(grad.to_vector<double>() == std::vector<double>{5, 6, 7});  // v + 1 from both uses
  };
  bp::sum(bp::add(bp::mul(w, v), w)).backward(options);
  CHECK(order.size() == 2);
}

TEST_CASE("autograd: on_gradient_final can replace a gradient") {
  const Mlp net = Mlp::make(350);
  const bp::Tensor x = f64({5, 3}, uniform({5, 3}, -1, 1, 360));
  bp::BackwardOptions options;
  options.on_gradient_final = [&](const bp::Tensor& param, bp::Tensor& gradient) {
    if (bp::detail::Access::impl(param) == bp::detail::Access::impl(net.w2))
      gradient = bp::full(cpu(), {4, 2}, 7.0, bp::DType::f64);
  };
  bp::Gradients g = net.loss(x).backward(options);
  CHECK(g.get(net.w2)->to_vector<double>() == std::vector<double>(8, 7.0));
  // on_backward_end sees the replacements and may change the result too.
  options.on_backward_end = [&](bp::Gradients& grads) {
    CHECK(grads.get(net.w2)->to_vector<double>() == std::vector<double>(8, 7.0));
    grads.set(net.b2, bp::zeros(cpu(), {2}, bp::DType::f64));
  };
  g = net.loss(x).backward(options);
  CHECK(g.get(net.b2)->to_vector<double>() == std::vector<double>{0, 0});

  bp::BackwardOptions bad;
  bad.on_gradient_final = [](const bp::Tensor&, bp::Tensor& gradient) {
    gradient = bp::zeros(cpu(), {1}, bp::DType::f64);
  };
  const bp::Error e = bptest::error_from([&] { net.loss(x).backward(bad); });
  CHECK(e.code() == bp::Errc::shape_mismatch);
  BP_CHECK_CONTAINS(e.message(), "on_gradient_final");
}

TEST_CASE("autograd: installed backward hooks run in every backward, after the call's own, until removed") {
  const Mlp net = Mlp::make(370);
  const bp::Tensor x = f64({5, 3}, uniform({5, 3}, -1, 1, 380));
  std::vector<std::string> events;
  int factories_made = 0;
  const uint64_t id = bp::add_backward_hooks([&] {
    ++factories_made;
    auto seen = std::make_shared<int>(0);  // per-backward state lives in the hooks
    return bp::BackwardHooks{
        .on_gradient_final =
            [&, seen](const bp::Tensor& param, bp::Tensor& gradient) {
              ++*seen;
              events.push_back("installed final");
              if (bp::detail::Access::impl(param) == bp::detail::Access::impl(net.w2))
                gradient = bp::full(cpu(), {4, 2}, 3.0, bp::DType::f64);
            },
        .on_backward_end =
            [&, seen](bp::Gradients& grads) {
              events.push_back("installed end " + std::to_string(*seen));
              CHECK(grads.get(net.w2)->to_vector<double>() == std::vector<double>(8, 3.0));
            },
    };
  });
  bp::BackwardOptions options;
  options.on_gradient_final = [&](const bp::Tensor& param, bp::Tensor& gradient) {
    events.push_back("call final");
    // The call's own hook runs first: it sees the local gradient.
    if (bp::detail::Access::impl(param) == bp::detail::Access::impl(net.w2))
      CHECK(gradient.to_vector<double>() != std::vector<double>(8, 3.0));
  };
  options.on_backward_end = [&](bp::Gradients& grads) {
    events.push_back("call end");
    CHECK(grads.get(net.w2)->to_vector<double>() == std::vector<double>(8, 3.0));
  };
  bp::Gradients g = net.loss(x).backward(options);
  CHECK(g.get(net.w2)->to_vector<double>() == std::vector<double>(8, 3.0));
  REQUIRE(events.size() == 2 * 4 + 2);  // four leaves, then the two ends
  for (std::size_t i = 0; i < 8; i += 2) {
    CHECK(events[i] == "call final");
    CHECK(events[i + 1] == "installed final");
  }
  CHECK(events[8] == "installed end 4");
  CHECK(events[9] == "call end");

  (void)net.loss(x).backward();
  CHECK(factories_made == 2);  // a fresh set for each backward
  CHECK(events.back() == "installed end 4");

  // A replacement of the wrong shape is refused, naming the installed hook.
  const uint64_t bad = bp::add_backward_hooks([] {
    return bp::BackwardHooks{.on_gradient_final = [](const bp::Tensor&, bp::Tensor& gradient) {
      gradient = bp::zeros(cpu(), {1}, bp::DType::f64);
    }};
  });
  const bp::Error e = bptest::error_from([&] { net.loss(x).backward(); });
  CHECK(e.code() == bp::Errc::shape_mismatch);
  BP_CHECK_CONTAINS(e.message(), "installed backward hook");
  CHECK(bp::remove_backward_hooks(bad));

  CHECK(bp::remove_backward_hooks(id));
  CHECK_FALSE(bp::remove_backward_hooks(id));
  events.clear();
  (void)net.loss(x).backward();
  CHECK(events.empty());
  CHECK(factories_made == 3);  // the failed backward made one; none since removal

  const bp::Error empty =
      bptest::error_from([] { (void)bp::add_backward_hooks(bp::BackwardHooksFactory{}); });
  CHECK(empty.code() == bp::Errc::invalid_argument);
}

TEST_CASE("autograd: a leaf with no handle left gets no gradient and no call") {
  const bp::Tensor kept = f64({2}, {1, 2}).require_grad();
  bp::Tensor loss;
  {
    const bp::Tensor dropped = f64({2}, {3, 4}).require_grad();
    loss = bp::sum(bp::add(kept, dropped));  // add saves neither operand
  }
  int calls = 0;
  bp::BackwardOptions options;
  options.on_gradient_final = [&](const bp::Tensor&, bp::Tensor&) { ++calls; };
  const bp::Gradients g = loss.backward(options);
  CHECK(calls == 1);
  CHECK(g.size() == 1);
  CHECK(g.get(kept)->to_vector<double>() == std::vector<double>{1, 1});
}

// ---- memory ------------------------------------------------------------------------------

TEST_CASE("autograd: backward frees what nodes saved, retain_graph keeps it") {
  const bp::Tensor x = f64({3}, {1, 2, 3}).require_grad();
  for (const bool retain : {false, true}) {
    std::weak_ptr<bp::detail::TensorImpl> saved;
    bp::Tensor loss;
    {
      const bp::Tensor h = bp::sin(x);
      saved = bp::detail::Access::impl(h);
      loss = bp::sum(bp::mul(h, h));  // mul saves h
    }
    CHECK_FALSE(saved.expired());
    bp::BackwardOptions options;
    options.retain_graph = retain;
    loss.backward(options);
    CHECK(saved.expired() == !retain);
  }
}

TEST_CASE("autograd: dropping the root frees the graph") {
  const bp::Tensor x = f64({3}, {1, 2, 3}).require_grad();
  std::weak_ptr<bp::detail::TensorImpl> inner;
  std::weak_ptr<bp::detail::GradNode> node;
  {
    const bp::Tensor h = bp::exp(x);  // exp saves its own output
    inner = bp::detail::Access::impl(h);
    node = bp::detail::Access::impl(h)->grad_node;
    const bp::Tensor loss = bp::sum(bp::mul(h, x));
    CHECK_FALSE(inner.expired());
  }
  CHECK(inner.expired());
  CHECK(node.expired());
  // The leaf's own node lives as long as the leaf.
  CHECK(x.requires_grad());
}

TEST_CASE("autograd: very deep graphs are built, run and freed without recursion") {
  // Deep enough that freeing one node per stack frame overflows an 8 MiB stack.
  constexpr int kDepth = 300000;
  constexpr int kRunDepth = 20000;
  const bp::Tensor x = f64({1}, {0.5}).require_grad();
  const bp::Tensor step = f64({1}, {1.0});
  {
    bp::Tensor y = x;
    for (int i = 0; i < kDepth; ++i) y = bp::add(y, step);
    // dropped here without backward
  }
  {
    bp::Tensor y = x;  // each sin node saves its input, which holds the previous node
    for (int i = 0; i < kDepth; ++i) y = bp::sin(y);
  }
  bp::Tensor y = x;
  for (int i = 0; i < kRunDepth; ++i) y = bp::mul(bp::add(y, step), bp::ones(cpu(), {1}, bp::DType::f64));
  const bp::Gradients g = y.backward();
  CHECK(g.get(x)->to_vector<double>() == std::vector<double>{1.0});
  CHECK(y.to_vector<double>() == std::vector<double>{0.5 + kRunDepth});
}

// ---- backends and threads ------------------------------------------------------------------

TEST_CASE("autograd: gradients run on the tensors' own backend") {
  // opaque runs only ADD, MUL and COPY on f32, and its memory is not host-visible.
  const bp::Tensor x = bp::Tensor::from_vector<float>(cpu(), {3}, {1, 2, 3}).require_grad();
  const bp::Tensor w = bp::Tensor::from_vector<float>(opaque(), {3}, {4, 5, 6}).require_grad();
  const bp::Tensor on_opaque = bp::add(bp::mul(bp::to(x, opaque()), w), w);
  const bp::Tensor loss = bp::sum(bp::to(on_opaque, cpu()));
  const bp::Gradients g = loss.backward();
  REQUIRE(g.get(x).has_value());
  REQUIRE(g.get(w).has_value());
  CHECK(g.get(x)->device() == cpu());
  CHECK(g.get(w)->device() == opaque());
  CHECK(g.get(x)->to_vector<float>() == std::vector<float>{4, 5, 6});
  CHECK(g.get(w)->to_vector<float>() == std::vector<float>{2, 3, 4});
}

TEST_CASE("autograd: independent graphs on several threads, sharing leaves") {
  const bp::Tensor w = f64({4}, {1, 2, 3, 4}).require_grad();
  constexpr int kThreads = 4;
  constexpr int kRounds = 50;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < kRounds; ++i) {
          const double c = t * 100 + i;
          const bp::Tensor x = f64({4}, {c, c + 1, c + 2, c + 3}).require_grad();
          if (t == 0 && i % 2 == 0) {
            bp::NoGradGuard off;  // must not leak into the other threads
            if (bp::mul(w, x).requires_grad()) ++wrong;
          }
          int hooks = 0;
          bp::BackwardOptions options;
          options.on_gradient_final = [&](const bp::Tensor&, bp::Tensor&) { ++hooks; };
          const bp::Gradients g = bp::sum(bp::mul(bp::mul(w, x), w)).backward(options);  // w^2 x
          const std::vector<double> gw = g.get(w)->to_vector<double>();
          const std::vector<double> gx = g.get(x)->to_vector<double>();
          for (int k = 0; k < 4; ++k) {
            const double wk = k + 1, xk = c + k;
            if (gw[static_cast<std::size_t>(k)] != 2 * wk * xk || gx[static_cast<std::size_t>(k)] != wk * wk)
              ++wrong;
          }
          if (hooks != 2) ++wrong;
        }
      } catch (...) {
        ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
}
