// Reverse-mode automatic differentiation, in the core, over any backend.
//
// Autodiff is part of every differentiable op of ops.hpp, not a wrapper
// around a backend (burn's Autodiff<B> is a decorator type): the op runs,
// then, only when an input requires grad and grad mode is on, records a node
// holding its gradient formula; Tensor::backward() walks the recorded graph
// from a scalar (a loss) back to the leaves. An op on tensors that need no
// gradient pays one test for it, which keeps a tiny op's cost down. The
// formulas are built from the public ops, so gradients run on the device of
// the tensors, whatever its backend; the plugins know nothing of autodiff.
//
//   Tensor w = randn(dev, {4, 3}, 1).require_grad();
//   Tensor loss = mean(relu(matmul(x, w)));
//   Gradients grads = loss.backward();
//   Tensor dw = *grads.get(w);
//
// Leaves and gradients:
//  - Tensor::require_grad() makes an f32 or f64 tensor a leaf: backward
//    computes the gradient of the root with respect to it. Copies of the
//    handle share the mark (as they share the data) and find the same
//    gradient in Gradients.
//  - An op output requires grad when an input does and grad mode is on,
//    unless it is neither f32 nor f64: integer and bool outputs
//    (comparisons, argmax/argmin, casts to integers) never do, and neither
//    do f16/bf16 ones (no arithmetic op takes them). Creation ops never do.
//  - The gradient of a leaf always has the leaf's shape, dtype and device.
//    Gradients are not stored on the tensors: each backward() returns its own.
//
// Differentiable ops: add sub mul div pow maximum minimum (broadcast
// operands get the sum of the gradient over their broadcast dims), where
// (a and b), neg abs exp log sqrt tanh sigmoid relu sin cos erf clamp, sum mean
// max min (over one axis or all), matmul (batched, broadcast batch dims),
// softmax log_softmax, reshape permute transpose slice cat index_select
// gather, cast (between f32 and f64), contiguous, to(device).
// Conventions at non-differentiable points (as in PyTorch):
//  - max/min reductions: the gradient is split evenly among the elements
//    equal to the result (ties share it); maximum/minimum: half to each
//    operand where they are equal.
//  - abs and relu have gradient 0 at 0; clamp passes the gradient where
//    lo <= x <= hi; pow: d/da is 0 where b == 0, d/db is 0 where a == 0 and
//    b >= 0.
// Costs: the backward of index_select is a one-hot matmul (index.numel() x
// extent elements); that of gather builds a one-hot tensor of
// index.numel() x extent elements. Both run on the tensors' device.
//
// Memory: a node keeps only what its formula needs (add keeps nothing; mul
// its operands; exp its output). backward() frees the graph as it goes
// unless retain_graph is set; dropping the last tensor of a graph frees it.
//
// Thread safety: grad mode (NoGradGuard) is per thread. Different threads
// may build and run backward on independent graphs concurrently, also when
// the graphs share leaves (parameters). One graph must not be run backward
// from two threads at once. Mark leaves with require_grad() before other
// threads use them (like set_distributed_params).
#ifndef BACKPLANE_AUTOGRAD_HPP_
#define BACKPLANE_AUTOGRAD_HPP_

#include <backplane/export.hpp>

#include <backplane/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <vector>

namespace backplane {

// The result of one backward(): the gradient of the root with respect to
// each leaf the root depends on, keyed by the leaf's identity (a copy of the
// leaf's handle finds the same entry; a detached or reshaped tensor is
// another tensor). Iteration yields the entries in the order their gradients
// became final. Gradients may share storage with each other and with
// BackwardOptions::gradient (add hands one tensor to both operands): copy
// one before writing into it in place. A plain value: not synchronised.
class BACKPLANE_API Gradients {
 public:
  struct Entry {
    Tensor param;     // the leaf (kept alive by this entry)
    Tensor gradient;  // its shape, dtype and device
  };
  using const_iterator = std::vector<Entry>::const_iterator;

  // The gradient of `param`; nullopt for an undefined tensor, a tensor that
  // is not a leaf requiring grad, or a leaf the root does not depend on.
  std::optional<Tensor> get(const Tensor& param) const;
  bool contains(const Tensor& param) const { return get(param).has_value(); }
  // Adds or replaces the gradient of `param`, a leaf (require_grad()).
  // Errc::invalid_argument for another tensor, Errc::shape_mismatch /
  // dtype_mismatch / device_mismatch when `gradient` differs from `param`.
  void set(const Tensor& param, Tensor gradient);
  // Removes and returns the gradient of `param` (nullopt when absent).
  std::optional<Tensor> remove(const Tensor& param);

  std::size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }
  const_iterator begin() const noexcept { return entries_.begin(); }
  const_iterator end() const noexcept { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
  std::unordered_map<uint64_t, std::size_t> index_;  // leaf id -> position in entries_
};

// Options of Tensor::backward.
//
// The hooks exist for gradient synchronisation in data-parallel training
// (all-reduce each gradient as soon as it is final, overlapped with the rest
// of backward), and for anything else that consumes gradients as they come.
// Contract:
//  - on_gradient_final(param, gradient) runs once for every leaf the root
//    depends on, on the calling thread, at the moment the leaf's gradient is
//    final: every node of the graph that contributes to it has run and its
//    contributions are summed. Backward continues after it returns, so work
//    it starts asynchronously overlaps the rest of backward.
//  - The order of those calls depends only on the graph and on the order in
//    which its ops were recorded, so processes that build the same graph the
//    same way (the ranks of a data-parallel job) see the same order. Nodes
//    run latest-recorded first, so the leaves used last in the forward pass
//    (the last layers) usually come first.
//  - The callback may replace `gradient` (e.g. with the all-reduced one):
//    the replacement must have the leaf's shape, dtype and device
//    (Errc::shape_mismatch / dtype_mismatch / device_mismatch otherwise) and
//    is what Gradients holds. The gradient is final: nothing else in
//    backward reads it afterwards.
//  - on_backward_end(gradients) runs once, after the last node and the last
//    on_gradient_final call, before backward() returns `gradients`; it may
//    change them (Gradients::set), e.g. once in-flight reductions finish.
//  - Both run with grad mode off. An exception from either propagates out of
//    backward(); the nodes that already ran are then freed (unless
//    retain_graph), the others are kept.
//  - A leaf whose every handle is gone by the time backward reaches it has
//    no one to receive its gradient: it gets no call and no entry.
struct BackwardOptions {
  // The gradient of the root (its shape, dtype and device). Undefined: ones,
  // which needs a one-element root (a loss).
  Tensor gradient{};
  // Keep the graph (and what its nodes saved) for another backward().
  bool retain_graph = false;
  std::function<void(const Tensor& param, Tensor& gradient)> on_gradient_final{};
  std::function<void(Gradients& gradients)> on_backward_end{};
};

// Hooks every backward() in the process runs, for a layer that consumes
// gradients whenever they are made rather than at one call site (data-parallel
// gradient synchronisation, <backplane/distributed.hpp>, is built on this).
// A layer installs a factory once; each backward() asks every installed
// factory for a fresh BackwardHooks (per-backward state lives in what the
// functions capture) and runs them with the contract of BackwardOptions'
// hooks, in this order: the call's own on_gradient_final, then each
// installed on_gradient_final in installation order; each installed
// on_backward_end in installation order, then the call's own. So the call's
// on_gradient_final sees the local gradient, and its on_backward_end and the
// returned Gradients see what the installed hooks made of it.
struct BackwardHooks {
  std::function<void(const Tensor& param, Tensor& gradient)> on_gradient_final{};
  std::function<void(Gradients& gradients)> on_backward_end{};
};
using BackwardHooksFactory = std::function<BackwardHooks()>;
// Installs `factory` for every later backward() in the process (thread-safe;
// a backward already running keeps the hooks it started with). Returns an
// id for remove_backward_hooks. Throws Errc::invalid_argument for an empty
// factory.
BACKPLANE_API uint64_t add_backward_hooks(BackwardHooksFactory factory);
// Uninstalls the factory `id` names; false if none is installed under it.
BACKPLANE_API bool remove_backward_hooks(uint64_t id) noexcept;

// Turns recording off on this thread for its lifetime (inference, optimizer
// updates): ops then record nothing and their outputs do not require grad.
// Nestable; restores the previous mode when it ends.
class BACKPLANE_API NoGradGuard {
 public:
  NoGradGuard() noexcept;
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Whether ops record on this thread (true unless a NoGradGuard is alive).
BACKPLANE_API bool grad_enabled() noexcept;

}  // namespace backplane

#endif  // BACKPLANE_AUTOGRAD_HPP_
