// Autodiff internals: the graph node, and the recording entry points each
// differentiable op of the front-end (core/tensor/ops_*.cpp) calls after it
// ran, when an input requires grad (the op pays only that test otherwise;
// include/backplane/autograd.hpp). The formulas live in
// core/autograd/autograd_ops.cpp; the backward sweep in
// core/autograd/autograd.cpp.
//
// Ownership: a tensor's impl owns its node (TensorImpl::grad_node); a node
// owns the nodes of its inputs (GradEdge::node) and what its formula saved.
// Edges point only at older nodes, and a node never saves an impl that owns
// it (see save_output in autograd_ops.cpp), so there are no cycles.
#ifndef BACKPLANE_CORE_AUTOGRAD_HPP_
#define BACKPLANE_CORE_AUTOGRAD_HPP_

#include "tensor/tensor_impl.hpp"

#include <backplane/autograd.hpp>
#include <backplane/tensor.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace backplane::detail {

// One input of a node: the node that gives it its gradient and, to check
// what a formula returns, the input's shape, dtype and device.
struct GradEdge {
  std::shared_ptr<GradNode> node;  // null: the input does not require grad
  Shape shape;
  DType dtype = DType::f32;
  const BackendImpl* backend = nullptr;
  int32_t device = 0;
};

// A recorded op (or a leaf). Not synchronised: a graph is built and run by
// one thread at a time; leaf nodes, which graphs may share, are read-only.
struct GradNode {
  explicit GradNode(bool leaf);
  // Frees the chain of inputs iteratively, so dropping a graph of any depth
  // (an unrolled loop of 10^5 steps) cannot overflow the stack.
  virtual ~GradNode();
  GradNode(const GradNode&) = delete;
  GradNode& operator=(const GradNode&) = delete;

  // The gradients of the inputs from `grad`, the gradient of the output:
  // grad_inputs has one slot per input, left undefined where the input does
  // not require grad. Runs with grad mode off.
  virtual void backward(const Tensor& grad, std::vector<Tensor>& grad_inputs) = 0;
  // Drops what the formula saved (after backward without retain_graph).
  virtual void release_saved() noexcept {}
  // The op's name, for messages ("mul").
  virtual const char* name() const noexcept = 0;

  bool needs_grad(std::size_t input) const noexcept { return inputs[input].node != nullptr; }
  // Records an input (its node, or null when it does not require grad).
  void add_input(const Tensor& t);

  // Unique and increasing in recording order across the process: orders the
  // sweep deterministically and identifies a leaf in Gradients.
  const uint64_t seq;
  const bool is_leaf;
  // Set when backward without retain_graph ran this node: its inputs and
  // saved tensors are gone.
  bool released = false;
  std::vector<GradEdge> inputs;
};

// A leaf: the end of every path. Its gradient goes to Gradients.
struct LeafNode final : GradNode {
  LeafNode() : GradNode(true) {}
  void backward(const Tensor&, std::vector<Tensor>&) override {}
  const char* name() const noexcept override { return "leaf"; }
  // Not owning: the impl owns this node.
  std::weak_ptr<TensorImpl> tensor;
};

// The per-op test of the front-end: the only autodiff cost of an op whose
// inputs do not require grad. Operands are already validated (defined).
inline bool any_requires_grad(const Tensor& a) noexcept {
  return detail::Access::impl(a)->grad_node != nullptr;
}
inline bool any_requires_grad(const Tensor& a, const Tensor& b) noexcept {
  return detail::Access::impl(a)->grad_node != nullptr || detail::Access::impl(b)->grad_node != nullptr;
}

// Recording, called only when an input requires grad. Each attaches a node
// to `out` when grad mode is on and out is f32/f64; it may rebind `out` to a
// view of the same data (when the node saves the output). Arguments are the
// op's own, already validated by the op.
void record_binary(int32_t op, const Tensor& a, const Tensor& b, Tensor& out);
void record_where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out);
void record_unary(int32_t op, const Tensor& x, Tensor& out);
void record_clamp(const Tensor& x, double lo, double hi, Tensor& out);
void record_reduce(int32_t op, const Tensor& x, int64_t axis, bool keepdim, Tensor& out);
void record_reduce_all(int32_t op, const Tensor& x, Tensor& out);
void record_matmul(const Tensor& a, const Tensor& b, Tensor& out);
void record_softmax(int32_t op, const Tensor& x, int64_t axis, Tensor& out);
void record_reshape(const Tensor& x, Tensor& out);
void record_permute(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out);
void record_transpose(const Tensor& x, int64_t dim0, int64_t dim1, Tensor& out);
void record_slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step, Tensor& out);
void record_cat(const std::vector<Tensor>& xs, int64_t axis, Tensor& out);
void record_index_select(const Tensor& x, int64_t axis, const Tensor& index, Tensor& out);
void record_gather(const Tensor& x, int64_t axis, const Tensor& index, Tensor& out);
void record_cast(const Tensor& x, Tensor& out);
void record_contiguous(const Tensor& x, Tensor& out);
void record_to(const Tensor& x, Tensor& out);

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_AUTOGRAD_HPP_
