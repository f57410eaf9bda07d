// A small training toolkit over the op set and autodiff: a Linear layer with
// seeded initialisation, cross-entropy over logits, accuracy, and the SGD
// (with momentum) and Adam optimizers. Not a framework: each piece is a few
// ops, on whatever device the tensors live, and can be replaced by your own.
#ifndef BACKPLANE_NN_HPP_
#define BACKPLANE_NN_HPP_

#include <backplane/export.hpp>

#include <backplane/autograd.hpp>
#include <backplane/registry.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <vector>

namespace backplane::nn {

// y = x @ weight + bias, weight [in, out], bias [out]. Initialised like
// PyTorch's nn.Linear: both uniform in +-1/sqrt(in), from `seed` (the same
// seed gives the same values on every device and thread count). The
// parameters require grad.
class BACKPLANE_API Linear {
 public:
  Linear(const Device& device, int64_t in_features, int64_t out_features, uint64_t seed,
         DType dtype = DType::f32);

  // x: [..., in] -> [..., out].
  Tensor operator()(const Tensor& x) const;
  const Tensor& weight() const noexcept { return weight_; }
  const Tensor& bias() const noexcept { return bias_; }
  std::vector<Tensor> parameters() const { return {weight_, bias_}; }

 private:
  Tensor weight_;
  Tensor bias_;
};

// Mean over the batch of -log softmax(logits)[label]: logits [N, C] (f32 or
// f64), labels [N] of i64 in [0, C). An out-of-range label is an error
// (Errc::invalid_argument from gather), never a silent wrong loss.
BACKPLANE_API Tensor cross_entropy(const Tensor& logits, const Tensor& labels);
// The fraction of rows whose argmax equals the label (no grad).
BACKPLANE_API double accuracy(const Tensor& logits, const Tensor& labels);

// Updates parameters in place (axpby_) from a backward()'s
// Gradients; a parameter without a gradient is left as it is. Parameters
// must be contiguous leaves (require_grad()).
class BACKPLANE_API Optimizer {
 public:
  virtual ~Optimizer();
  virtual void step(const Gradients& gradients) = 0;
  const std::vector<Tensor>& parameters() const noexcept { return params_; }

  // What a checkpoint must hold to resume this optimizer bit-exactly, as
  // named tensors on the parameters' devices (the tensors themselves, not
  // copies: read or save them before the next step()). Names end in the
  // parameter's index: SGD "velocity.<i>"; Adam "m.<i>", "v.<i>" and
  // "step.<i>" (the step count, [1] i64). A parameter that has not taken a
  // step yet has no entries. Like PyTorch's Optimizer.state_dict().
  // The defaults of both throw Errc::invalid_argument naming what to
  // override: an optimizer written before these existed still builds, and
  // fails only when checkpointed.
  virtual std::vector<std::pair<std::string, Tensor>> state() const;
  // Replaces the whole state with `state` (as state() names it; every entry
  // is copied, so later changes to the given tensors do not reach this
  // optimizer): a parameter without entries starts afresh. Throws
  // Errc::invalid_argument, before changing anything, for an unknown name,
  // an index beyond the parameters, an entry missing its partners (Adam's
  // m, v and step come together), or a shape, dtype or device that differs
  // from the parameter's.
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state);

 protected:
  explicit Optimizer(std::vector<Tensor> params);
  std::vector<Tensor> params_;
};

// v = momentum * v + (g + weight_decay * p);  p -= lr * v   (PyTorch's SGD).
class BACKPLANE_API SGD final : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double lr, double momentum = 0.0, double weight_decay = 0.0);
  void step(const Gradients& gradients) override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state) override;

 private:
  double lr_, momentum_, weight_decay_;
  // Undefined until a parameter's first step; updated in place after it.
  std::vector<Tensor> velocity_;
};

// Adam (Kingma and Ba), with bias correction, as PyTorch's Adam.
class BACKPLANE_API Adam final : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
       double eps = 1e-8);
  void step(const Gradients& gradients) override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state) override;

 private:
  double lr_, beta1_, beta2_, eps_;
  std::vector<Tensor> m_, v_;  // updated in place
  std::vector<int64_t> t_;
  std::vector<Tensor> eps_tensors_;  // eps as a 0-d tensor of each parameter's device and dtype
};

}  // namespace backplane::nn

#endif  // BACKPLANE_NN_HPP_
