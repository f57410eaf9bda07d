// Host tensors, the input generator, and the checks that compare a device
// result with the reference under a tolerance.
#include "suite.hpp"

#include "reference.hpp"

#include <backplane/ops.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace backplane::conformance {

bool is_float(DType dtype) noexcept { return dtype == DType::f32 || dtype == DType::f64; }

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

double HostTensor::at(int64_t k) const {
  const auto u = static_cast<std::size_t>(k);
  return is_float(dtype) ? f[u] : static_cast<double>(i[u]);
}

double round_to(DType dtype, double v) {
  switch (dtype) {
    case DType::f32:
      return static_cast<double>(static_cast<float>(v));
    case DType::f64:
      return v;
    case DType::bool_:
      return v != 0.0 ? 1.0 : 0.0;  // NaN != 0: true, as NumPy's astype(bool)
    default:
      return static_cast<double>(wrap_to(dtype, static_cast<int64_t>(v)));
  }
}

int64_t wrap_to(DType dtype, int64_t v) {
  switch (dtype) {
    case DType::i32:
      return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v)));
    case DType::bool_:
      return v != 0 ? 1 : 0;
    default:
      return v;
  }
}

HostTensor make_host(DType dtype, std::vector<int64_t> shape, const std::vector<double>& values) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  if (is_float(dtype)) {
    t.f.reserve(values.size());
    for (const double v : values) t.f.push_back(round_to(dtype, v));
  } else {
    t.i.reserve(values.size());
    for (const double v : values)
      t.i.push_back(dtype == DType::bool_ ? (v != 0.0) : wrap_to(dtype, static_cast<int64_t>(v)));
  }
  return t;
}

HostTensor make_host_int(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  if (is_float(dtype)) {
    for (const int64_t v : values) t.f.push_back(round_to(dtype, static_cast<double>(v)));
  } else {
    for (const int64_t v : values) t.i.push_back(wrap_to(dtype, v));
  }
  return t;
}

namespace {

template <class T, class Src>
std::vector<T> narrow(const std::vector<Src>& values) {
  std::vector<T> out;
  out.reserve(values.size());
  for (const Src v : values) out.push_back(static_cast<T>(v));
  return out;
}

template <class T>
std::vector<T> read(const Tensor& t) {
  std::vector<T> out(static_cast<std::size_t>(t.numel()));
  t.read_into(dtype_of_v<T>, out.data(), out.size());
  return out;
}

}  // namespace

Tensor upload(const Device& device, const HostTensor& t) {
  const Shape shape(t.shape);
  const auto n = static_cast<std::size_t>(t.numel());
  switch (t.dtype) {
    case DType::f32:
      return Tensor::from_bytes(device, shape, t.dtype, narrow<float>(t.f).data(), n);
    case DType::f64:
      return Tensor::from_bytes(device, shape, t.dtype, t.f.data(), n);
    case DType::i32:
      return Tensor::from_bytes(device, shape, t.dtype, narrow<int32_t>(t.i).data(), n);
    case DType::i64:
      return Tensor::from_bytes(device, shape, t.dtype, t.i.data(), n);
    case DType::bool_:
      return Tensor::from_bytes(device, shape, t.dtype, narrow<uint8_t>(t.i).data(), n);
    default:
      throw Error(Errc::internal,
                  "conformance: no host representation for " + std::string(to_string(t.dtype)));
  }
}

HostTensor download(const Tensor& t) {
  HostTensor h;
  h.dtype = t.dtype();
  h.shape = t.shape().to_vector();
  switch (h.dtype) {
    case DType::f32:
      h.f = narrow<double>(read<float>(t));
      break;
    case DType::f64:
      h.f = read<double>(t);
      break;
    case DType::i32:
      h.i = narrow<int64_t>(read<int32_t>(t));
      break;
    case DType::i64:
      h.i = read<int64_t>(t);
      break;
    case DType::bool_: {
      std::vector<uint8_t> bytes(static_cast<std::size_t>(t.numel()));
      t.read_into(DType::bool_, bytes.data(), bytes.size());
      h.i = narrow<int64_t>(bytes);
      break;
    }
    default:
      throw Error(Errc::internal, "conformance: cannot read back " + std::string(to_string(h.dtype)));
  }
  return h;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (k) s += ", ";
    s += std::to_string(shape[k]);
  }
  return s + "]";
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

uint64_t seed_of(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// ---- Rng -----------------------------------------------------------------------

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::uniform(double lo, double hi) {
  const double u = static_cast<double>(next() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}

int64_t Rng::integer(int64_t lo, int64_t hi) {
  const auto span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(next() % span);
}

double Rng::pick(std::initializer_list<double> values) { return values.begin()[next() % values.size()]; }

HostTensor random_host(Rng& rng, DType dtype, std::vector<int64_t> shape, double lo, double hi) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  std::vector<double> values(static_cast<std::size_t>(n));
  for (double& v : values) {
    if (is_float(dtype)) {
      v = rng.uniform(lo, hi);
    } else if (dtype == DType::bool_) {
      v = static_cast<double>(rng.next() & 1);
    } else {
      v = static_cast<double>(rng.integer(static_cast<int64_t>(lo), static_cast<int64_t>(hi)));
    }
  }
  return make_host(dtype, std::move(shape), values);
}

// ---- comparison ------------------------------------------------------------------

std::string Tolerance::to_string() const {
  if (exact) return "exact";
  char buf[64];
  std::snprintf(buf, sizeof buf, "rel %g abs %g", rel, abs);
  return buf;
}

namespace {

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

std::string where_text(int64_t flat, const std::vector<int64_t>* shape) {
  if (shape == nullptr || shape->empty()) return "element " + std::to_string(flat);
  std::vector<int64_t> idx(shape->size());
  int64_t rem = flat;
  for (std::size_t d = shape->size(); d-- > 0;) {
    idx[d] = (*shape)[d] == 0 ? 0 : rem % (*shape)[d];
    rem = (*shape)[d] == 0 ? 0 : rem / (*shape)[d];
  }
  return "element " + shape_text(idx);
}

struct Comparison {
  std::optional<std::string> mismatch;
  double worst = 0.0;  // the largest error / allowed error among matching elements
};

Comparison compare_floats(const std::vector<double>& got, const std::vector<double>& want,
                          const Tolerance& tol, const std::vector<double>* scale,
                          const std::vector<int64_t>* shape) {
  Comparison c;
  if (got.size() != want.size()) {
    c.mismatch = "got " + std::to_string(got.size()) + " elements, want " + std::to_string(want.size());
    return c;
  }
  int64_t bad = 0;
  std::string first;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double g = got[k], w = want[k];
    bool ok;
    double allowed = 0.0, err = 0.0;
    if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g)) {
      ok = g == w;
    } else if (tol.exact) {
      ok = g == w;
    } else {
      err = std::fabs(g - w);
      allowed = tol.abs + tol.rel * (scale ? (*scale)[k] : std::fabs(w));
      ok = err <= allowed;
      if (ok && allowed > 0) c.worst = std::max(c.worst, err / allowed);
    }
    if (!ok) {
      if (bad == 0) {
        first = where_text(static_cast<int64_t>(k), shape) + ": got " + num(g) + ", want " + num(w);
        if (!tol.exact && std::isfinite(g) && std::isfinite(w)) {
          first += " (error " + num(err) + " > allowed " + num(allowed) + ")";
        }
      }
      ++bad;
    }
  }
  if (bad > 0) {
    c.mismatch = first + "; " + std::to_string(bad) + " of " + std::to_string(got.size()) +
                 " elements differ (" + tol.to_string() + ")";
  }
  return c;
}

}  // namespace

std::optional<std::string> compare_values(const std::vector<double>& got, const std::vector<double>& want,
                                          const Tolerance& tolerance, const std::vector<double>* scale) {
  return compare_floats(got, want, tolerance, scale, nullptr).mismatch;
}

Verdict check(const Context& ctx, const Tensor& got, const HostTensor& want, const Tolerance& tolerance,
              const std::vector<double>* scale) {
  if (!got.defined()) return Verdict::fail("the op returned an undefined tensor");
  if (got.dtype() != want.dtype) {
    return Verdict::fail("dtype: got " + std::string(to_string(got.dtype())) + ", want " +
                         std::string(to_string(want.dtype)));
  }
  if (got.shape().to_vector() != want.shape) {
    return Verdict::fail("shape: got " + shape_text(got.shape().to_vector()) + ", want " +
                         shape_text(want.shape));
  }
  if (!(got.device() == ctx.device)) return Verdict::fail("the result lives on " + got.device().id());
  const HostTensor g = download(got);
  if (is_float(want.dtype)) {
    const Comparison c = compare_floats(g.f, want.f, tolerance, scale, &want.shape);
    if (c.mismatch) return Verdict::fail(*c.mismatch);
    if (ctx.verbose && !tolerance.exact) {
      return Verdict::pass("largest error " + num(c.worst) + " x the allowed (" + tolerance.to_string() +
                           ")");
    }
    return Verdict::pass();
  }
  int64_t bad = 0;
  std::string first;
  for (std::size_t k = 0; k < g.i.size(); ++k) {
    if (g.i[k] == want.i[k]) continue;
    if (bad++ == 0) {
      first = where_text(static_cast<int64_t>(k), &want.shape) + ": got " + std::to_string(g.i[k]) +
              ", want " + std::to_string(want.i[k]);
    }
  }
  if (bad > 0) {
    return Verdict::fail(first + "; " + std::to_string(bad) + " of " + std::to_string(g.i.size()) +
                         " elements differ (exact)");
  }
  return Verdict::pass();
}

Verdict expect_error(const std::function<void()>& fn, std::initializer_list<Errc> codes) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() == Errc::unsupported_op) throw;
    if (e.code() == Errc::capability_missing &&
        std::find(codes.begin(), codes.end(), e.code()) == codes.end())
      throw;
    const bool allowed = codes.size() == 0 ? e.code() != Errc::internal
                                           : std::find(codes.begin(), codes.end(), e.code()) != codes.end();
    if (allowed) return Verdict::pass();
    std::string want;
    for (const Errc c : codes) want += std::string(want.empty() ? "" : " or ") + to_string(c);
    return Verdict::fail("threw " + std::string(to_string(e.code())) + " (want " +
                         (want.empty() ? std::string("an error other than internal") : want) +
                         "): " + e.message());
  }
  return Verdict::fail("no error was raised");
}

// ---- operands --------------------------------------------------------------------

HostTensor Operand::logical() const {
  switch (view) {
    case View::none:
      return base;
    case View::transpose:
      return ref::transpose(base, args[0], args[1]);
    case View::slice:
      return ref::slice(base, args[0], args[1], args[2], args[3]);
    case View::permute:
      return ref::permute(base, args);
  }
  return base;
}

Tensor Operand::on(const Device& device) const {
  const Tensor t = upload(device, base);
  switch (view) {
    case View::none:
      return t;
    case View::transpose:
      return backplane::transpose(t, args[0], args[1]);
    case View::slice:
      return backplane::slice(t, args[0], args[1], args[2], args[3]);
    case View::permute:
      return backplane::permute(t, args);
  }
  return t;
}

std::string Operand::describe() const {
  const std::string s = shape_text(base.shape);
  switch (view) {
    case View::none:
      return s;
    case View::transpose:
      return s + ".T(" + std::to_string(args[0]) + ", " + std::to_string(args[1]) + ")";
    case View::slice:
      return s + "[" + std::to_string(args[1]) + ":" + std::to_string(args[2]) + ":" +
             std::to_string(args[3]) + " on " + std::to_string(args[0]) + "]";
    case View::permute:
      return s + ".permute" + shape_text(args);
  }
  return s;
}

Operand plain(HostTensor t) { return Operand{std::move(t), Operand::View::none, {}}; }
Operand transposed(HostTensor base, int64_t dim0, int64_t dim1) {
  return Operand{std::move(base), Operand::View::transpose, {dim0, dim1}};
}
Operand sliced(HostTensor base, int64_t axis, int64_t start, int64_t end, int64_t step) {
  return Operand{std::move(base), Operand::View::slice, {axis, start, end, step}};
}
Operand permuted(HostTensor base, std::vector<int64_t> dims) {
  return Operand{std::move(base), Operand::View::permute, std::move(dims)};
}

}  // namespace backplane::conformance
