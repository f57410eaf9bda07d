// Values of the cpu plugin's ops through the public API, against naive
// double-precision references: broadcasting, dtypes, scalars, empties, matmul.
#include <backplane/backplane.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

namespace bp = backplane;

namespace {

bp::Registry& cpu_registry() {
  static bp::Registry reg = bp::Registry::from_json(
      R"({"schema_version": 1, "backends": [{"name": "cpu", "library": "backplane_cpu", "required": true}]})",
      BP_TEST_PLUGIN_DIR, "test_ops");
  return reg;
}

bp::Device cpu() { return cpu_registry().backend("cpu").device(0); }

template <class T>
std::vector<T> iota_values(int64_t n, T start, T step) {
  std::vector<T> v(static_cast<std::size_t>(n));
  // Cycle so integer products stay far from overflow (wrapping is tested apart).
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<T>(start + step * static_cast<T>(i % 1000));
  return v;
}

// Naive NumPy-broadcast reference: out[idx] = f(a[idx'], b[idx'']).
template <class T>
std::vector<T> reference(const bp::Shape& as, const std::vector<T>& a, const bp::Shape& bs,
                         const std::vector<T>& b, const std::function<T(T, T)>& f) {
  const bp::Shape out = bp::broadcast_shapes(as, bs);
  std::vector<T> r(static_cast<std::size_t>(out.numel()));
  for (int64_t flat = 0; flat < out.numel(); ++flat) {
    int64_t rem = flat, ia = 0, ib = 0, sa = 1, sb = 1;
    for (int d = out.rank() - 1; d >= 0; --d) {
      const int64_t i = rem % out[d];
      rem /= out[d];
      const int da = d - (out.rank() - as.rank()), db = d - (out.rank() - bs.rank());
      if (da >= 0) {
        ia += (as[da] == 1 ? 0 : i) * sa;
        sa *= as[da];
      }
      if (db >= 0) {
        ib += (bs[db] == 1 ? 0 : i) * sb;
        sb *= bs[db];
      }
    }
    r[static_cast<std::size_t>(flat)] = f(a[static_cast<std::size_t>(ia)], b[static_cast<std::size_t>(ib)]);
  }
  return r;
}

template <class T>
void check_binary_cases() {
  const std::vector<std::pair<bp::Shape, bp::Shape>> cases = {
      {{2, 3}, {2, 3}},   {{2, 3}, {3}},          {{2, 1}, {1, 3}},    {{4, 1, 5}, {3, 1}},
      {{}, {2, 2}},       {{2, 2}, {}},           {{1}, {7}},          {{0, 3}, {3}},
      {{3, 0}, {1}},      {{5, 1, 1}, {1, 4, 6}}, {{300, 257}, {257}}, {{300, 257}, {300, 1}},
      {{70000}, {70000}}, {{1, 70000}, {3, 1}},
  };
  for (const auto& [as, bs] : cases) {
    CAPTURE(as.to_string());
    CAPTURE(bs.to_string());
    const auto av = iota_values<T>(as.numel(), T(1), T(1));
    const auto bvv = iota_values<T>(bs.numel(), T(2), T(1));
    bp::Tensor a = bp::Tensor::from_vector(cpu(), as, av);
    bp::Tensor b = bp::Tensor::from_vector(cpu(), bs, bvv);
    const bp::Shape expect_shape = bp::broadcast_shapes(as, bs);
    struct Case {
      const char* name;
      bp::Tensor (*op)(const bp::Tensor&, const bp::Tensor&);
      std::function<T(T, T)> ref;
    };
    const Case ops[] = {
        {"add", &bp::add, [](T x, T y) { return static_cast<T>(x + y); }},
        {"sub", &bp::sub, [](T x, T y) { return static_cast<T>(x - y); }},
        {"mul", &bp::mul, [](T x, T y) { return static_cast<T>(x * y); }},
        {"div", &bp::div, [](T x, T y) { return static_cast<T>(x / y); }},
    };
    for (const auto& c : ops) {
      CAPTURE(c.name);
      bp::Tensor out = c.op(a, b);
      CHECK(out.shape() == expect_shape);
      CHECK(out.dtype() == bp::dtype_of_v<T>);
      const auto got = out.template to_vector<T>();
      const auto want = reference<T>(as, av, bs, bvv, c.ref);
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        if constexpr (std::is_floating_point_v<T>) {
          if (std::abs(got[i] - want[i]) > 1e-5 * std::max(T(1), std::abs(want[i]))) {
            FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
            break;
          }
        } else if (got[i] != want[i]) {
          FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << want[i]);
          break;
        }
      }
    }
  }
}

std::vector<double> naive_matmul(int64_t m, int64_t k, int64_t n, const std::vector<double>& a,
                                 const std::vector<double>& b) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j)
        c[static_cast<std::size_t>(i * n + j)] +=
            a[static_cast<std::size_t>(i * k + p)] * b[static_cast<std::size_t>(p * n + j)];
  return c;
}

}  // namespace

TEST_CASE("elementwise ops broadcast like NumPy: f32") { check_binary_cases<float>(); }
TEST_CASE("elementwise ops broadcast like NumPy: f64") { check_binary_cases<double>(); }
TEST_CASE("elementwise ops broadcast like NumPy: i32") { check_binary_cases<int32_t>(); }
TEST_CASE("elementwise ops broadcast like NumPy: i64") { check_binary_cases<int64_t>(); }

TEST_CASE("operators + - * / match the named ops") {
  bp::Tensor a = bp::Tensor::from_vector(cpu(), {2, 2}, std::vector<float>{1, 2, 3, 4});
  bp::Tensor b = bp::Tensor::from_vector(cpu(), {2}, std::vector<float>{10, 20});
  CHECK((a + b).to_vector<float>() == std::vector<float>{11, 22, 13, 24});
  CHECK((a - b).to_vector<float>() == std::vector<float>{-9, -18, -7, -16});
  CHECK((a * b).to_vector<float>() == std::vector<float>{10, 40, 30, 80});
  CHECK((b / a).to_vector<float>() == std::vector<float>{10, 10, 10.0f / 3.0f, 5});
}

TEST_CASE("scalars (0-d) combine with scalars and with tensors") {
  bp::Tensor s = bp::Tensor::from_vector(cpu(), {}, std::vector<double>{2.5});
  CHECK(s.rank() == 0);
  CHECK(s.numel() == 1);
  bp::Tensor ss = s * s;
  CHECK(ss.rank() == 0);
  CHECK(ss.to_vector<double>() == std::vector<double>{6.25});
}

TEST_CASE("float division by zero follows IEEE and NaN propagates") {
  bp::Tensor a = bp::Tensor::from_vector(cpu(), {3}, std::vector<float>{1, -1, 0});
  bp::Tensor z = bp::Tensor::from_vector(cpu(), {3}, std::vector<float>{0, 0, 0});
  const auto q = (a / z).to_vector<float>();
  CHECK(std::isinf(q[0]));
  CHECK(q[0] > 0);
  CHECK(std::isinf(q[1]));
  CHECK(q[1] < 0);
  CHECK(std::isnan(q[2]));
  bp::Tensor n = bp::Tensor::from_vector(cpu(), {1}, std::vector<float>{NAN});
  CHECK(std::isnan((a + n).to_vector<float>()[1]));
}

TEST_CASE("integer division by zero is an error, not a crash") {
  bp::Tensor a = bp::Tensor::from_vector(cpu(), {3}, std::vector<int32_t>{1, 2, 3});
  bp::Tensor z = bp::Tensor::from_vector(cpu(), {3}, std::vector<int32_t>{1, 0, 1});
  try {
    (void)bp::div(a, z);
    FAIL("expected an error");
  } catch (const bp::Error& e) {
    CHECK(e.code() == bp::Errc::invalid_argument);
    INFO(std::string(e.what()));
    CHECK(std::string(e.what()).find("division") != std::string::npos);
    CHECK(std::string(e.what()).find("by zero") != std::string::npos);
  }
  // The backend keeps working afterwards.
  CHECK((a + a).to_vector<int32_t>() == std::vector<int32_t>{2, 4, 6});
}

TEST_CASE("matmul matches a naive reference, f32 and f64, including empty dims") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  const std::vector<std::array<int64_t, 3>> sizes = {{1, 1, 1},    {2, 3, 4}, {17, 31, 5},
                                                     {64, 64, 64}, {3, 0, 2}, {0, 4, 2}};
  for (const auto& [m, k, n] : sizes) {
    CAPTURE(m);
    CAPTURE(k);
    CAPTURE(n);
    std::vector<double> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
    for (auto& x : a) x = dist(rng);
    for (auto& x : b) x = dist(rng);
    const auto want = naive_matmul(m, k, n, a, b);

    const auto got64 =
        bp::matmul(bp::Tensor::from_vector(cpu(), {m, k}, a), bp::Tensor::from_vector(cpu(), {k, n}, b))
            .to_vector<double>();
    REQUIRE(got64.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(got64[i] == doctest::Approx(want[i]).epsilon(1e-12));

    const std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());
    bp::Tensor c =
        bp::matmul(bp::Tensor::from_vector(cpu(), {m, k}, af), bp::Tensor::from_vector(cpu(), {k, n}, bf));
    CHECK(c.shape() == bp::Shape{m, n});
    const auto got32 = c.to_vector<float>();
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(got32[i] == doctest::Approx(want[i]).epsilon(1e-4));
  }
}

TEST_CASE("matmul on integers is refused by the core (dtype_mismatch: matmul is f32/f64)") {
  bp::Tensor a = bp::Tensor::from_vector(cpu(), {2, 2}, std::vector<int32_t>{1, 2, 3, 4});
  try {
    (void)bp::matmul(a, a);
    FAIL("expected dtype_mismatch");
  } catch (const bp::Error& e) {
    CHECK(e.code() == bp::Errc::dtype_mismatch);
    const std::string msg = e.what();
    CHECK(msg.find("matmul") != std::string::npos);
    CHECK(msg.find("i32") != std::string::npos);
  }
}

TEST_CASE("results are independent tensors and inputs are unchanged") {
  bp::Tensor a = bp::Tensor::from_vector(cpu(), {3}, std::vector<int64_t>{1, 2, 3});
  bp::Tensor b = a + a;
  bp::Tensor c = b * a;
  CHECK(a.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3});
  CHECK(b.to_vector<int64_t>() == std::vector<int64_t>{2, 4, 6});
  CHECK(c.to_vector<int64_t>() == std::vector<int64_t>{2, 8, 18});
}

TEST_CASE("bool and u8 tensors round-trip through the host") {
  bp::Tensor t = bp::Tensor::from_vector(cpu(), {4}, std::vector<uint8_t>{1, 0, 0, 1});
  CHECK(t.dtype() == bp::DType::u8);
  CHECK(t.to_vector<uint8_t>() == std::vector<uint8_t>{1, 0, 0, 1});
  bp::Tensor b = bp::Tensor::from_vector(cpu(), {2, 2}, std::vector<bool>{true, false, false, true});
  CHECK(b.dtype() == bp::DType::bool_);
  CHECK(b.nbytes() == 4);
  CHECK(b.to_vector<bool>() == std::vector<bool>{true, false, false, true});
}

TEST_CASE("integer overflow wraps (two's complement) instead of trapping") {
  const int32_t big = std::numeric_limits<int32_t>::max();
  const int32_t small = std::numeric_limits<int32_t>::min();
  bp::Tensor a = bp::Tensor::from_vector(cpu(), {3}, std::vector<int32_t>{big, small, small});
  bp::Tensor b = bp::Tensor::from_vector(cpu(), {3}, std::vector<int32_t>{1, -1, -1});
  CHECK((a + b).to_vector<int32_t>() == std::vector<int32_t>{small, big, big});
  CHECK(bp::div(a, b).to_vector<int32_t>() == std::vector<int32_t>{big, small, small});
}
