// The reference implementation of every op, on host tensors, from the math.
// Deliberately naive: one multi-index walk per output element, double
// accumulators, no blocking, no vectorisation, nothing shared with a kernel.
#include "reference.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace backplane::conformance::ref {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

int64_t norm_axis(int64_t axis, std::size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) throw std::logic_error("conformance reference: axis out of range");
  return axis;
}

// The multi-index of flat row-major position `flat` in `shape`.
std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

HostTensor empty_like_shape(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const auto n = static_cast<std::size_t>(count(t.shape));
  if (is_float(dtype)) {
    t.f.assign(n, 0.0);
  } else {
    t.i.assign(n, 0);
  }
  return t;
}

// Copies element `from` of `src` to element `to` of `dst` (same dtype).
void copy_element(const HostTensor& src, int64_t from, HostTensor& dst, int64_t to) {
  if (is_float(src.dtype)) {
    dst.f[static_cast<std::size_t>(to)] = src.f[static_cast<std::size_t>(from)];
  } else {
    dst.i[static_cast<std::size_t>(to)] = src.i[static_cast<std::size_t>(from)];
  }
}

// Two's complement arithmetic on 64 bits, wrapped afterwards by the caller.
int64_t wadd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wsub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t wmul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
int64_t wneg(int64_t a) { return static_cast<int64_t>(0 - static_cast<uint64_t>(a)); }

// Truncating division; MIN / -1 wraps to MIN (the quotient's two's complement).
int64_t wdiv(int64_t a, int64_t b) {
  if (b == -1) return wneg(a);
  return a / b;
}

int64_t wpow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) result = wmul(result, base);
    base = wmul(base, base);
    exp >>= 1;
  }
  return result;
}

double fmaximum(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  return a > b ? a : b;
}
double fminimum(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  return a < b ? a : b;
}

}  // namespace

std::optional<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (std::size_t k = 0; k < rank; ++k) {
    const int64_t da = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
    const int64_t db = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[k] = da == 1 ? db : da;
  }
  return out;
}

HostTensor expand(const HostTensor& t, const std::vector<int64_t>& shape) {
  HostTensor out = empty_like_shape(t.dtype, shape);
  const std::size_t lead = shape.size() - t.shape.size();
  const int64_t n = count(shape);
  for (int64_t k = 0; k < n; ++k) {
    const std::vector<int64_t> idx = unravel(k, shape);
    std::vector<int64_t> src(t.shape.size());
    for (std::size_t d = 0; d < t.shape.size(); ++d) src[d] = t.shape[d] == 1 ? 0 : idx[d + lead];
    copy_element(t, ravel(src, t.shape), out, k);
  }
  return out;
}

HostTensor binary(Binary op, const HostTensor& a, const HostTensor& b) {
  const std::vector<int64_t> shape = *broadcast(a.shape, b.shape);
  const HostTensor x = expand(a, shape), y = expand(b, shape);
  HostTensor out = empty_like_shape(a.dtype, shape);
  const auto n = static_cast<std::size_t>(count(shape));
  for (std::size_t k = 0; k < n; ++k) {
    if (is_float(a.dtype)) {
      const double p = x.f[k], q = y.f[k];
      double r = 0;
      switch (op) {
        case Binary::add:
          r = p + q;
          break;
        case Binary::sub:
          r = p - q;
          break;
        case Binary::mul:
          r = p * q;
          break;
        case Binary::div:
          r = p / q;
          break;
        case Binary::pow:
          r = std::pow(p, q);
          break;
        case Binary::maximum:
          r = fmaximum(p, q);
          break;
        case Binary::minimum:
          r = fminimum(p, q);
          break;
      }
      out.f[k] = round_to(a.dtype, r);
    } else {
      const int64_t p = x.i[k], q = y.i[k];
      int64_t r = 0;
      switch (op) {
        case Binary::add:
          r = wadd(p, q);
          break;
        case Binary::sub:
          r = wsub(p, q);
          break;
        case Binary::mul:
          r = wmul(p, q);
          break;
        case Binary::div:
          r = wdiv(p, q);
          break;
        case Binary::pow:
          r = wpow(p, q);
          break;
        case Binary::maximum:
          r = std::max(p, q);
          break;
        case Binary::minimum:
          r = std::min(p, q);
          break;
      }
      out.i[k] = wrap_to(a.dtype, r);
    }
  }
  return out;
}

HostTensor compare(Compare op, const HostTensor& a, const HostTensor& b) {
  const std::vector<int64_t> shape = *broadcast(a.shape, b.shape);
  const HostTensor x = expand(a, shape), y = expand(b, shape);
  HostTensor out = empty_like_shape(DType::bool_, shape);
  const auto n = static_cast<std::size_t>(count(shape));
  for (std::size_t k = 0; k < n; ++k) {
    bool r = false;
    auto apply = [&](auto p, auto q) {
      switch (op) {
        case Compare::eq:
          r = p == q;
          break;
        case Compare::ne:
          r = p != q;
          break;
        case Compare::lt:
          r = p < q;
          break;
        case Compare::le:
          r = p <= q;
          break;
        case Compare::gt:
          r = p > q;
          break;
        case Compare::ge:
          r = p >= q;
          break;
      }
    };
    if (is_float(a.dtype)) {
      apply(x.f[k], y.f[k]);  // IEEE: every comparison with NaN is false except ne
    } else {
      apply(x.i[k], y.i[k]);
    }
    out.i[k] = r ? 1 : 0;
  }
  return out;
}

HostTensor where(const HostTensor& cond, const HostTensor& a, const HostTensor& b) {
  const std::vector<int64_t> shape = *broadcast(*broadcast(cond.shape, a.shape), b.shape);
  const HostTensor c = expand(cond, shape), x = expand(a, shape), y = expand(b, shape);
  HostTensor out = empty_like_shape(a.dtype, shape);
  const int64_t n = count(shape);
  for (int64_t k = 0; k < n; ++k) copy_element(c.i[static_cast<std::size_t>(k)] ? x : y, k, out, k);
  return out;
}

HostTensor unary(int32_t op, const HostTensor& t) {
  HostTensor out = empty_like_shape(t.dtype, t.shape);
  const auto n = static_cast<std::size_t>(t.numel());
  for (std::size_t k = 0; k < n; ++k) {
    if (is_float(t.dtype)) {
      const double x = t.f[k];
      double r = 0;
      switch (op) {
        default:
          throw std::logic_error(std::string("conformance reference: no float reference for unary op ") +
                                 (bp_op_name(op) != nullptr ? bp_op_name(op) : "?") +
                                 ": add it to ref::unary in conformance/src/reference.cpp");
        case BP_OP_NEG:
          r = -x;
          break;
        case BP_OP_ABS:
          r = std::fabs(x);
          break;
        case BP_OP_EXP:
          r = std::exp(x);
          break;
        case BP_OP_LOG:
          r = std::log(x);
          break;
        case BP_OP_SQRT:
          r = std::sqrt(x);
          break;
        case BP_OP_TANH:
          r = std::tanh(x);
          break;
        case BP_OP_SIGMOID:
          r = 1.0 / (1.0 + std::exp(-x));
          break;
        case BP_OP_RELU:
          r = std::isnan(x) ? x : (x > 0 ? x : 0.0);
          break;  // NaN propagates, as np.maximum(x, 0)
        case BP_OP_SIN:
          r = std::sin(x);
          break;
        case BP_OP_COS:
          r = std::cos(x);
          break;
        case BP_OP_ERF:
          r = std::erf(x);
          break;
      }
      out.f[k] = round_to(t.dtype, r);
    } else {
      const int64_t x = t.i[k];
      int64_t r = 0;
      switch (op) {
        case BP_OP_NEG:
          r = wneg(x);
          break;
        case BP_OP_ABS:
          r = x < 0 ? wneg(x) : x;
          break;  // abs(MIN) wraps to MIN
        case BP_OP_RELU:
          r = x > 0 ? x : 0;
          break;
        default:
          throw std::logic_error("conformance reference: float-only unary op on an integer dtype");
      }
      out.i[k] = wrap_to(t.dtype, r);
    }
  }
  return out;
}

HostTensor clamp(const HostTensor& t, double lo, double hi) {
  HostTensor out = empty_like_shape(t.dtype, t.shape);
  const auto n = static_cast<std::size_t>(t.numel());
  for (std::size_t k = 0; k < n; ++k) {
    if (is_float(t.dtype)) {
      const double x = t.f[k];
      out.f[k] = std::isnan(x) ? x : round_to(t.dtype, std::min(std::max(x, lo), hi));
    } else {
      const auto l = static_cast<int64_t>(std::ceil(lo)), h = static_cast<int64_t>(std::floor(hi));
      out.i[k] = std::min(std::max(t.i[k], l), h);
    }
  }
  return out;
}

Reduced reduce(Reduce op, const HostTensor& t, std::optional<int64_t> axis_arg, bool keepdim) {
  // View t as [outer, n, inner] around the reduced axis (all axes: [1, numel, 1]).
  int64_t outer = 1, n = t.numel(), inner = 1;
  std::vector<int64_t> out_shape;
  if (axis_arg) {
    const int64_t axis = norm_axis(*axis_arg, t.shape.size());
    n = t.shape[static_cast<std::size_t>(axis)];
    for (int64_t d = 0; d < axis; ++d) outer *= t.shape[static_cast<std::size_t>(d)];
    for (auto d = static_cast<std::size_t>(axis) + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      if (static_cast<int64_t>(d) != axis) {
        out_shape.push_back(t.shape[d]);
      } else if (keepdim) {
        out_shape.push_back(1);
      }
    }
  } else if (keepdim) {
    out_shape.assign(t.shape.size(), 1);
  }
  const bool arg = op == Reduce::argmax || op == Reduce::argmin;
  const DType out_dtype = arg ? DType::i64 : t.dtype;
  Reduced r{empty_like_shape(out_dtype, out_shape),
            std::vector<double>(static_cast<std::size_t>(outer * inner), 0.0)};

  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t in = 0; in < inner; ++in) {
      const auto dst = static_cast<std::size_t>(o * inner + in);
      auto src = [&](int64_t j) { return static_cast<std::size_t>((o * n + j) * inner + in); };
      double abs_sum = 0;
      for (int64_t j = 0; j < n; ++j) abs_sum += std::fabs(t.at(static_cast<int64_t>(src(j))));
      r.scale[dst] = op == Reduce::mean && n > 0 ? abs_sum / static_cast<double>(n) : abs_sum;

      if (is_float(t.dtype)) {
        if (op == Reduce::sum || op == Reduce::mean) {
          double s = 0;
          for (int64_t j = 0; j < n; ++j) s += t.f[src(j)];
          r.value.f[dst] =
              round_to(t.dtype, op == Reduce::sum ? s : (n > 0 ? s / static_cast<double>(n) : kNaN));
          continue;
        }
        // max/min propagate NaN; argmax/argmin: the first NaN is the extreme.
        const bool want_max = op == Reduce::max || op == Reduce::argmax;
        int64_t best = 0;
        for (int64_t j = 1; j < n; ++j) {
          const double v = t.f[src(j)], b = t.f[src(best)];
          if (std::isnan(b)) break;
          if (std::isnan(v) || (want_max ? v > b : v < b)) best = j;
        }
        if (arg) {
          r.value.i[dst] = best;
        } else {
          r.value.f[dst] = t.f[src(best)];
        }
      } else {
        if (op == Reduce::sum) {
          int64_t s = 0;
          for (int64_t j = 0; j < n; ++j) s = wadd(s, t.i[src(j)]);
          r.value.i[dst] = wrap_to(t.dtype, s);
          continue;
        }
        if (op == Reduce::mean) throw std::logic_error("conformance reference: mean of an integer dtype");
        const bool want_max = op == Reduce::max || op == Reduce::argmax;
        int64_t best = 0;
        for (int64_t j = 1; j < n; ++j) {
          const int64_t v = t.i[src(j)], b = t.i[src(best)];
          if (want_max ? v > b : v < b) best = j;
        }
        r.value.i[dst] = arg ? best : t.i[src(best)];
      }
    }
  }
  return r;
}

MatmulResult matmul(const HostTensor& a, const HostTensor& b) {
  const std::size_t ra = a.shape.size(), rb = b.shape.size();
  const int64_t m = a.shape[ra - 2], k = a.shape[ra - 1], n = b.shape[rb - 1];
  const std::vector<int64_t> batch_a(a.shape.begin(), a.shape.end() - 2);
  const std::vector<int64_t> batch_b(b.shape.begin(), b.shape.end() - 2);
  const std::vector<int64_t> batch = *broadcast(batch_a, batch_b);
  std::vector<int64_t> out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);

  // Expand both operands' batch dims so batch index bi addresses them directly.
  std::vector<int64_t> a_full = batch, b_full = batch;
  a_full.insert(a_full.end(), {m, k});
  b_full.insert(b_full.end(), {k, n});
  const HostTensor x = expand(a, a_full), y = expand(b, b_full);

  MatmulResult r{empty_like_shape(a.dtype, out_shape),
                 std::vector<double>(static_cast<std::size_t>(count(out_shape))), k};
  const int64_t batches = count(batch);
  for (int64_t bi = 0; bi < batches; ++bi) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, abs_s = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double prod = x.f[static_cast<std::size_t>((bi * m + i) * k + p)] *
                              y.f[static_cast<std::size_t>((bi * k + p) * n + j)];
          s += prod;
          abs_s += std::fabs(prod);
        }
        const auto dst = static_cast<std::size_t>((bi * m + i) * n + j);
        r.value.f[dst] = round_to(a.dtype, s);
        r.scale[dst] = abs_s;
      }
    }
  }
  return r;
}

HostTensor softmax(const HostTensor& t, int64_t axis_arg, bool log) {
  const int64_t axis = norm_axis(axis_arg, t.shape.size());
  int64_t outer = 1, inner = 1;
  const int64_t n = t.shape[static_cast<std::size_t>(axis)];
  for (int64_t d = 0; d < axis; ++d) outer *= t.shape[static_cast<std::size_t>(d)];
  for (auto d = static_cast<std::size_t>(axis) + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  HostTensor out = empty_like_shape(t.dtype, t.shape);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t in = 0; in < inner; ++in) {
      auto at = [&](int64_t j) { return static_cast<std::size_t>((o * n + j) * inner + in); };
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j) m = fmaximum(m, t.f[at(j)]);
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(t.f[at(j)] - m);
      for (int64_t j = 0; j < n; ++j) {
        const double shifted = t.f[at(j)] - m;
        out.f[at(j)] = round_to(t.dtype, log ? shifted - std::log(s) : std::exp(shifted) / s);
      }
    }
  }
  return out;
}

HostTensor reshape(const HostTensor& t, std::vector<int64_t> shape) {
  int64_t known = 1;
  std::optional<std::size_t> infer;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      infer = d;
    } else {
      known *= shape[d];
    }
  }
  if (infer) shape[*infer] = known == 0 ? 0 : t.numel() / known;
  if (count(shape) != t.numel()) throw std::logic_error("conformance reference: bad reshape");
  HostTensor out = t;
  out.shape = std::move(shape);
  return out;
}

HostTensor permute(const HostTensor& t, const std::vector<int64_t>& dims_arg) {
  std::vector<int64_t> dims(dims_arg.size());
  for (std::size_t d = 0; d < dims.size(); ++d) dims[d] = norm_axis(dims_arg[d], t.shape.size());
  std::vector<int64_t> shape(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) shape[d] = t.shape[static_cast<std::size_t>(dims[d])];
  HostTensor out = empty_like_shape(t.dtype, shape);
  const int64_t n = count(shape);
  for (int64_t k = 0; k < n; ++k) {
    const std::vector<int64_t> idx = unravel(k, shape);
    std::vector<int64_t> src(t.shape.size());
    for (std::size_t d = 0; d < dims.size(); ++d) src[static_cast<std::size_t>(dims[d])] = idx[d];
    copy_element(t, ravel(src, t.shape), out, k);
  }
  return out;
}

HostTensor transpose(const HostTensor& t, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(t.shape.size());
  for (std::size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<int64_t>(d);
  std::swap(dims[static_cast<std::size_t>(norm_axis(dim0, dims.size()))],
            dims[static_cast<std::size_t>(norm_axis(dim1, dims.size()))]);
  return permute(t, dims);
}

HostTensor slice(const HostTensor& t, int64_t axis_arg, int64_t start, int64_t end, int64_t step) {
  const auto axis = static_cast<std::size_t>(norm_axis(axis_arg, t.shape.size()));
  const int64_t extent = t.shape[axis];
  // Python: negative bounds count from the end; then clamp to [0, extent].
  auto bound = [&](int64_t v) { return std::clamp(v < 0 ? v + extent : v, int64_t{0}, extent); };
  const int64_t s = bound(start), e = bound(end);
  const int64_t len = e > s ? (e - s + step - 1) / step : 0;
  std::vector<int64_t> shape = t.shape;
  shape[axis] = len;
  HostTensor out = empty_like_shape(t.dtype, shape);
  const int64_t n = count(shape);
  for (int64_t k = 0; k < n; ++k) {
    std::vector<int64_t> idx = unravel(k, shape);
    idx[axis] = s + idx[axis] * step;
    copy_element(t, ravel(idx, t.shape), out, k);
  }
  return out;
}

HostTensor cat(const std::vector<HostTensor>& tensors, int64_t axis_arg) {
  const auto axis = static_cast<std::size_t>(norm_axis(axis_arg, tensors.front().shape.size()));
  std::vector<int64_t> shape = tensors.front().shape;
  shape[axis] = 0;
  for (const HostTensor& t : tensors) shape[axis] += t.shape[axis];
  HostTensor out = empty_like_shape(tensors.front().dtype, shape);
  const int64_t n = count(shape);
  for (int64_t k = 0; k < n; ++k) {
    std::vector<int64_t> idx = unravel(k, shape);
    std::size_t which = 0;
    while (idx[axis] >= tensors[which].shape[axis]) idx[axis] -= tensors[which++].shape[axis];
    copy_element(tensors[which], ravel(idx, tensors[which].shape), out, k);
  }
  return out;
}

HostTensor index_select(const HostTensor& t, int64_t axis_arg, const std::vector<int64_t>& index) {
  const auto axis = static_cast<std::size_t>(norm_axis(axis_arg, t.shape.size()));
  std::vector<int64_t> shape = t.shape;
  shape[axis] = static_cast<int64_t>(index.size());
  HostTensor out = empty_like_shape(t.dtype, shape);
  const int64_t n = count(shape);
  for (int64_t k = 0; k < n; ++k) {
    std::vector<int64_t> idx = unravel(k, shape);
    idx[axis] = index[static_cast<std::size_t>(idx[axis])];
    copy_element(t, ravel(idx, t.shape), out, k);
  }
  return out;
}

HostTensor gather(const HostTensor& t, int64_t axis_arg, const HostTensor& index) {
  const auto axis = static_cast<std::size_t>(norm_axis(axis_arg, t.shape.size()));
  HostTensor out = empty_like_shape(t.dtype, index.shape);
  const int64_t n = index.numel();
  for (int64_t k = 0; k < n; ++k) {
    std::vector<int64_t> idx = unravel(k, index.shape);
    idx[axis] = index.i[static_cast<std::size_t>(k)];
    copy_element(t, ravel(idx, t.shape), out, k);
  }
  return out;
}

HostTensor cast(const HostTensor& t, DType dtype) {
  HostTensor out = empty_like_shape(dtype, t.shape);
  const auto n = static_cast<std::size_t>(t.numel());
  for (std::size_t k = 0; k < n; ++k) {
    if (is_float(t.dtype)) {
      const double x = t.f[k];
      if (is_float(dtype)) {
        out.f[k] = round_to(dtype, x);
      } else if (dtype == DType::bool_) {
        out.i[k] = x != 0.0 ? 1 : 0;  // NaN is true
      } else {
        out.i[k] =
            wrap_to(dtype, static_cast<int64_t>(std::trunc(x)));  // toward zero; callers keep x in range
      }
    } else {
      const int64_t x = t.i[k];
      if (is_float(dtype)) {
        out.f[k] = round_to(dtype, static_cast<double>(x));  // callers keep |x| < 2^53: one rounding
      } else {
        out.i[k] = wrap_to(dtype, x);
      }
    }
  }
  return out;
}

HostTensor arange(double start, double end, double step, DType dtype) {
  const double len = std::ceil((end - start) / step);
  const int64_t n = len > 0 ? static_cast<int64_t>(len) : 0;
  HostTensor out = empty_like_shape(dtype, {n});
  for (int64_t k = 0; k < n; ++k) {
    const double v = start + static_cast<double>(k) * step;
    if (is_float(dtype)) {
      out.f[static_cast<std::size_t>(k)] = round_to(dtype, v);
    } else {
      out.i[static_cast<std::size_t>(k)] = wrap_to(dtype, static_cast<int64_t>(v));
    }
  }
  return out;
}

}  // namespace backplane::conformance::ref
