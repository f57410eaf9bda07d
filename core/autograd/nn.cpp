// The training toolkit (nn.hpp): every piece is a handful of public ops.
#include <backplane/error.hpp>
#include <backplane/nn.hpp>
#include <backplane/ops.hpp>

#include "tensor/op_common.hpp"

#include <charconv>
#include <cmath>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace backplane::nn {

namespace {

// A 0-d tensor that broadcasts against `like`.
Tensor scalar(const Tensor& like, double value) { return full(like.device(), Shape{}, value, like.dtype()); }

void check_param(const Tensor& p, const char* who) {
  if (!p.defined()) throw Error(Errc::invalid_argument, std::string(who) + ": an undefined parameter");
  if (!p.requires_grad())
    throw Error(Errc::invalid_argument, std::string(who) + ": parameter " + p.to_string() +
                                            " does not require grad; call require_grad() on it first");
  if (!p.is_contiguous())
    throw Error(Errc::invalid_argument, std::string(who) + ": parameter " + p.to_string() +
                                            " is a strided view; it is updated in place");
}

void check_rate(double v, const char* who, const char* what, bool allow_zero = true) {
  if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0))
    throw Error(Errc::invalid_argument, std::string(who) + ": " + what + " must be a finite number " +
                                            (allow_zero ? ">= 0" : "> 0") + ", got " + std::to_string(v));
}

// An optimizer state entry "<kind>.<index>" split into its parts; false for
// any other form.
bool split_state_name(std::string_view name, std::string_view& kind, std::size_t& index) {
  const auto dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == name.size()) return false;
  kind = name.substr(0, dot);
  const char* first = name.data() + dot + 1;
  const char* last = name.data() + name.size();
  const auto [end, ec] = std::from_chars(first, last, index);
  return ec == std::errc() && end == last && (*first != '0' || last - first == 1);
}

[[noreturn]] [[gnu::cold]] void bad_state(const char* who, const std::string& what) {
  throw Error(Errc::invalid_argument, std::string(who) + "::load_state: " + what);
}

// The parameter index of state entry `name` when its kind is one of `kinds`;
// throws naming the entry otherwise.
std::size_t state_index(const char* who, const std::string& name,
                        std::initializer_list<std::string_view> kinds, std::size_t n_params,
                        std::string_view& kind) {
  std::size_t index = 0;
  bool known = split_state_name(name, kind, index);
  if (known) {
    known = false;
    for (std::string_view k : kinds) known = known || k == kind;
  }
  if (!known) {
    std::string list;
    for (std::string_view k : kinds) list += (list.empty() ? "" : ", ") + std::string(k) + ".<i>";
    bad_state(who, "unknown entry \"" + name + "\" (expected " + list + ")");
  }
  if (index >= n_params)
    bad_state(who, "entry \"" + name + "\" names parameter " + std::to_string(index) + ", but there are " +
                       std::to_string(n_params));
  return index;
}

// A tensor of its own with `t`'s values: one COPY on t's device.
Tensor copy_of(const Tensor& t) {
  return detail::Access::make_tensor(detail::copy_contiguous(*detail::Access::impl(t), "nn optimizer state"));
}

// A state entry that must match parameter `p` in shape, dtype and device.
void check_like(const char* who, const std::string& name, const Tensor& t, const Tensor& p) {
  if (!t.defined()) bad_state(who, "entry \"" + name + "\" is an undefined tensor");
  if (t.shape() != p.shape() || t.dtype() != p.dtype() || t.device() != p.device())
    bad_state(who, "entry \"" + name + "\" is " + t.to_string() + " but its parameter is " + p.to_string());
}

}  // namespace

Linear::Linear(const Device& device, int64_t in_features, int64_t out_features, uint64_t seed, DType dtype) {
  if (in_features <= 0 || out_features <= 0)
    throw Error(Errc::invalid_argument, "nn::Linear: features must be positive, got in " +
                                            std::to_string(in_features) + ", out " +
                                            std::to_string(out_features));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  // Two streams from one seed, so weight and bias are independent.
  weight_ =
      rand_uniform(device, {in_features, out_features}, seed * 2 + 0, -bound, bound, dtype).require_grad();
  bias_ = rand_uniform(device, {out_features}, seed * 2 + 1, -bound, bound, dtype).require_grad();
}

Tensor Linear::operator()(const Tensor& x) const { return add(matmul(x, weight_), bias_); }

Tensor cross_entropy(const Tensor& logits, const Tensor& labels) {
  if (!logits.defined() || !labels.defined())
    throw Error(Errc::invalid_argument, "nn::cross_entropy: undefined logits or labels");
  if (logits.rank() != 2)
    throw Error(Errc::shape_mismatch,
                "nn::cross_entropy: logits must be [batch, classes], got " + logits.shape().to_string());
  if (labels.rank() != 1 || labels.shape()[0] != logits.shape()[0])
    throw Error(Errc::shape_mismatch, "nn::cross_entropy: labels must be [" +
                                          std::to_string(logits.shape()[0]) + "] to match logits " +
                                          logits.shape().to_string() + ", got " + labels.shape().to_string());
  if (labels.dtype() != DType::i64)
    throw Error(Errc::dtype_mismatch, "nn::cross_entropy: labels must be i64 class indices, got " +
                                          std::string(to_string(labels.dtype())));
  const Tensor picked = gather(log_softmax(logits, 1), 1, reshape(labels, {labels.shape()[0], 1}));
  return neg(mean(picked));
}

double accuracy(const Tensor& logits, const Tensor& labels) {
  NoGradGuard no_grad;
  if (logits.rank() != 2 || labels.rank() != 1 || labels.shape()[0] != logits.shape()[0])
    throw Error(Errc::shape_mismatch, "nn::accuracy: expected logits [N, C] and labels [N], got " +
                                          logits.shape().to_string() + " and " + labels.shape().to_string());
  if (labels.numel() == 0) return 0.0;
  const Tensor hits = cast(eq(argmax(logits, 1), labels), DType::f64);
  return sum(hits).to_vector<double>()[0] / static_cast<double>(labels.numel());
}

Optimizer::~Optimizer() = default;

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  throw Error(Errc::invalid_argument,
              "nn::Optimizer::state: this optimizer does not say what its state is; override state() and "
              "load_state() to save and resume it (checkpoints need both)");
}

void Optimizer::load_state(const std::vector<std::pair<std::string, Tensor>>&) {
  throw Error(Errc::invalid_argument,
              "nn::Optimizer::load_state: this optimizer cannot take a saved state; override state() and "
              "load_state() to save and resume it (checkpoints need both)");
}

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  for (const Tensor& p : params_) check_param(p, "nn::Optimizer");
}

SGD::SGD(std::vector<Tensor> params, double lr, double momentum, double weight_decay)
    : Optimizer(std::move(params)), lr_(lr), momentum_(momentum), weight_decay_(weight_decay) {
  check_rate(lr, "nn::SGD", "lr", false);
  check_rate(momentum, "nn::SGD", "momentum");
  check_rate(weight_decay, "nn::SGD", "weight_decay");
  velocity_.resize(params_.size());
}

void SGD::step(const Gradients& gradients) {
  NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    std::optional<Tensor> g0 = gradients.get(p);
    if (!g0) continue;
    // In place (axpby_: one call per update where the device has it, no
    // buffer allocated), rounding as PyTorch's SGD:
    //   g' = g + wd p;  v = momentum v + g';  p = p - lr v
    Tensor g = *g0;
    if (weight_decay_ != 0) {
      g = copy_of(g);
      axpby_(g, 1.0, p, weight_decay_);
    }
    if (momentum_ != 0) {
      Tensor& v = velocity_[i];
      if (v.defined())
        axpby_(v, momentum_, g, 1.0);
      else
        v = weight_decay_ != 0 ? g : copy_of(g);  // the first step: v = g', a buffer of its own
      g = v;
    }
    axpby_(p, 1.0, g, -lr_);
  }
}

std::vector<std::pair<std::string, Tensor>> SGD::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < velocity_.size(); ++i)
    if (velocity_[i].defined()) out.emplace_back("velocity." + std::to_string(i), velocity_[i]);
  return out;
}

void SGD::load_state(const std::vector<std::pair<std::string, Tensor>>& state) {
  std::vector<Tensor> velocity(params_.size());
  for (const auto& [name, t] : state) {
    std::string_view kind;
    const std::size_t i = state_index("nn::SGD", name, {"velocity"}, params_.size(), kind);
    check_like("nn::SGD", name, t, params_[i]);
    if (velocity[i].defined()) bad_state("nn::SGD", "entry \"" + name + "\" is given twice");
    velocity[i] = t;
  }
  NoGradGuard no_grad;
  for (Tensor& v : velocity)
    if (v.defined()) v = copy_of(v);
  velocity_ = std::move(velocity);
}

Adam::Adam(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps)
    : Optimizer(std::move(params)), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps) {
  check_rate(lr, "nn::Adam", "lr", false);
  check_rate(eps, "nn::Adam", "eps", false);
  for (double b : {beta1, beta2})
    if (!(b >= 0 && b < 1))
      throw Error(Errc::invalid_argument, "nn::Adam: betas must lie in [0, 1), got " + std::to_string(b));
  m_.resize(params_.size());
  v_.resize(params_.size());
  t_.assign(params_.size(), 0);
  eps_tensors_.resize(params_.size());
}

void Adam::step(const Gradients& gradients) {
  NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    std::optional<Tensor> g0 = gradients.get(p);
    if (!g0) continue;
    const Tensor& g = *g0;
    if (!m_[i].defined()) {
      m_[i] = zeros(p.device(), p.shape(), p.dtype());
      v_[i] = zeros(p.device(), p.shape(), p.dtype());
    }
    Tensor& eps = eps_tensors_[i];
    if (!eps.defined()) eps = scalar(p, eps_);
    const int64_t t = ++t_[i];
    // m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2, in place (axpby_).
    axpby_(m_[i], beta1_, g, 1 - beta1_);
    axpby_(v_[i], beta2_, mul(g, g), 1 - beta2_);
    const double c1 = 1 - std::pow(beta1_, static_cast<double>(t));
    const double c2 = 1 - std::pow(beta2_, static_cast<double>(t));
    // p -= lr / c1 * m / (sqrt(v / c2) + eps)
    const Tensor denom = add(sqrt(div(v_[i], scalar(p, c2))), eps);
    axpby_(p, 1.0, div(m_[i], denom), -(lr_ / c1));
  }
}

std::vector<std::pair<std::string, Tensor>> Adam::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!m_[i].defined()) continue;
    const std::string index = std::to_string(i);
    out.emplace_back("m." + index, m_[i]);
    out.emplace_back("v." + index, v_[i]);
    out.emplace_back("step." + index, Tensor::from_vector<int64_t>(params_[i].device(), {1}, {t_[i]}));
  }
  return out;
}

void Adam::load_state(const std::vector<std::pair<std::string, Tensor>>& state) {
  const std::size_t n = params_.size();
  std::vector<Tensor> m(n), v(n), step(n);
  for (const auto& [name, t] : state) {
    std::string_view kind;
    const std::size_t i = state_index("nn::Adam", name, {"m", "v", "step"}, n, kind);
    Tensor& slot = kind == "m" ? m[i] : kind == "v" ? v[i] : step[i];
    if (slot.defined()) bad_state("nn::Adam", "entry \"" + name + "\" is given twice");
    if (kind == "step") {
      if (!t.defined() || t.dtype() != DType::i64 || t.numel() != 1)
        bad_state("nn::Adam", "entry \"" + name + "\" must be one i64 (the step count), got " +
                                  (t.defined() ? t.to_string() : std::string("an undefined tensor")));
    } else {
      check_like("nn::Adam", name, t, params_[i]);
    }
    slot = t;
  }
  std::vector<int64_t> steps(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const int present = int{m[i].defined()} + int{v[i].defined()} + int{step[i].defined()};
    if (present != 0 && present != 3)
      bad_state("nn::Adam", "parameter " + std::to_string(i) + " has " + std::to_string(present) +
                                " of its entries m, v and step; give all three or none");
    if (present == 0) continue;
    steps[i] = step[i].to_vector<int64_t>()[0];
    if (steps[i] < 1)
      bad_state("nn::Adam", "entry \"step." + std::to_string(i) + "\" is " + std::to_string(steps[i]) +
                                "; a parameter with state has taken at least one step");
  }
  NoGradGuard no_grad;
  for (std::size_t i = 0; i < n; ++i) {
    if (!m[i].defined()) continue;
    m[i] = copy_of(m[i]);
    v[i] = copy_of(v[i]);
  }
  m_ = std::move(m);
  v_ = std::move(v);
  t_ = std::move(steps);
}

}  // namespace backplane::nn
