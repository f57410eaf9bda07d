// The gradient formula of every differentiable op, and the recording that
// attaches them to op outputs. Formulas are written with the public ops, so
// they run on the tensors' own device whatever its backend; two helpers
// (expand, embed) issue FILL/COPY directly where the op set has no
// equivalent (broadcast_to, a strided write into zeros).
#include "autograd/autograd.hpp"

#include "tensor/op_common.hpp"
#include "tensor/placement.hpp"

#include <backplane/ops.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace backplane::detail {
namespace {

// ---- helpers --------------------------------------------------------------------

// A 0-d tensor holding v with t's dtype and device: the scalar operand of a formula.
Tensor scalar_like(const Tensor& t, double v) { return full(t.device(), Shape{}, v, t.dtype()); }

std::vector<int64_t> with_unit_axis(const Shape& s, int axis) {
  std::vector<int64_t> v = s.to_vector();
  v.insert(v.begin() + axis, 1);
  return v;
}

// g (of a broadcast result's shape) summed back to `shape`: over the leading
// dims `shape` lacks and over the dims where it has extent 1.
Tensor unbroadcast(Tensor g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int lead = g.rank() - shape.rank();
  if (lead > 0) {
    std::vector<int64_t> folded{1};
    for (int d = 0; d < lead; ++d) folded[0] *= g.shape()[d];
    for (int d = lead; d < g.rank(); ++d) folded.push_back(g.shape()[d]);
    g = sum(reshape(g, folded), 0);
  }
  for (int d = 0; d < shape.rank(); ++d)
    if (shape[d] == 1 && g.shape()[d] != 1) g = sum(g, d, true);
  return g;
}

// g broadcast to `shape` (NumPy rules), materialised by one COPY whose input
// has stride 0 on the broadcast dims.
Tensor expand(const Tensor& g, const Shape& shape, const char* api) {
  const TensorImpl& x = *detail::Access::impl(g);
  if (x.shape == shape) return g;
  const TensorImpl* operands[1] = {&x};
  const Placement p(BP_OP_COPY, x.dtype, x.dtype, api, operands, 1);
  auto out = p.allocate(shape, x.dtype);
  if (shape.numel() == 0) return detail::Access::make_tensor(std::move(out));
  const Shape strides = broadcast_strides(x, shape);
  bp_tensor in = describe(p[0]);
  in.ndim = shape.rank();
  in.shape = out->shape.data();
  in.strides = strides.data();
  const bp_tensor o = describe(*out);
  p.execute(BP_OP_COPY, &in, 1, &o);
  return detail::Access::make_tensor(std::move(out));
}

// Zeros of `shape` holding src's elements at start[d] + i * step[d] along
// each dim d (src's extents fit): FILL, then one COPY into a strided view.
Tensor embed(const Tensor& src, const Shape& shape, const Shape& start, const Shape& step, const char* api) {
  Tensor out = zeros(src.device(), shape, src.dtype());
  const TensorImpl& s = *detail::Access::impl(src);
  if (s.shape.numel() == 0) return out;
  // The COPY writes into out's own bytes: placed with out as an operand, so
  // it runs where out's bytes are (zeros() placed them) or they move first.
  const TensorImpl* operands[2] = {detail::Access::impl(out).get(), &s};
  const Placement p(BP_OP_COPY, s.dtype, s.dtype, api, operands, 2);
  const TensorImpl& o = p[0];
  Shape strides = o.strides;
  uint64_t offset = o.byte_offset;
  for (int d = 0; d < shape.rank(); ++d) {
    strides[d] = o.strides[d] * step[d];
    offset += static_cast<uint64_t>(start[d] * o.strides[d]) * dtype_size(o.dtype);
  }
  bp_tensor dst = describe(o);
  dst.byte_offset = offset;
  dst.shape = s.shape.data();
  dst.strides = strides.data();
  const bp_tensor in = describe(p[1]);
  p.execute(BP_OP_COPY, &in, 1, &dst);
  // Written into a copy of out's bytes on another device: bring them back.
  const TensorImpl& home = *detail::Access::impl(out);
  if (o.storage != home.storage) copy_bytes(*o.storage, 0, *home.storage, 0, home.storage->nbytes, api);
  return out;
}

// [.., m, n, ..] (n inserted at axis + 1) in g's dtype: 1 where index (shape
// `index_shape`, i64) equals the position along the new dim, 0 elsewhere.
Tensor one_hot(const Tensor& index, int axis, int64_t n, const Tensor& like) {
  const Tensor iu = reshape(index, with_unit_axis(index.shape(), axis + 1));
  std::vector<int64_t> positions(static_cast<std::size_t>(iu.rank()), 1);
  positions[static_cast<std::size_t>(axis + 1)] = n;
  const Tensor ar = reshape(arange(index.device(), 0.0, static_cast<double>(n), 1.0, DType::i64), positions);
  return cast(eq(iu, ar), like.dtype());
}

std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& dims) {
  std::vector<int64_t> inv(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i)
    inv[static_cast<std::size_t>(dims[i])] = static_cast<int64_t>(i);
  return inv;
}

// ---- recording helpers -----------------------------------------------------------

bool recordable(const Tensor& out) { return grad_enabled() && is_float(detail::Access::impl(out)->dtype); }

void attach(Tensor& out, std::shared_ptr<GradNode> node) {
  detail::Access::impl(out)->grad_node = std::move(node);
}

// `out` as a node may save it. The node will be owned by out's impl, so
// saving that impl would be a cycle: when out owns its buffer, the node
// saves it and `out` becomes a view of it, which carries the node.
Tensor save_output(Tensor& out) {
  const std::shared_ptr<TensorImpl> impl = detail::Access::impl(out);
  auto alias = make_view(impl, impl->shape, impl->strides, impl->byte_offset);
  if (impl->base != nullptr)
    return detail::Access::make_tensor(std::move(alias));  // a view: the alias shares only its root
  out = detail::Access::make_tensor(std::move(alias));
  return detail::Access::make_tensor(impl);
}

// ---- nodes: one per op family; inputs[k] describes input k -------------------------

struct BinaryNode final : GradNode {
  explicit BinaryNode(int32_t o) : GradNode(false), op(o) {}
  const char* name() const noexcept override { return op_name(op); }
  void release_saved() noexcept override { a = b = out = Tensor(); }

  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    const Shape& as = inputs[0].shape;
    const Shape& bs = inputs[1].shape;
    const bool na = needs_grad(0), nb = needs_grad(1);
    switch (op) {
      case BP_OP_ADD:
        if (na) gi[0] = unbroadcast(g, as);
        if (nb) gi[1] = unbroadcast(g, bs);
        break;
      case BP_OP_SUB:
        if (na) gi[0] = unbroadcast(g, as);
        if (nb) gi[1] = unbroadcast(neg(g), bs);
        break;
      case BP_OP_MUL:
        if (na) gi[0] = unbroadcast(mul(g, b), as);
        if (nb) gi[1] = unbroadcast(mul(g, a), bs);
        break;
      case BP_OP_DIV:  // d(a/b)/db = -a / b^2
        if (na) gi[0] = unbroadcast(div(g, b), as);
        if (nb) gi[1] = unbroadcast(neg(div(mul(g, a), mul(b, b))), bs);
        break;
      case BP_OP_POW: {  // d/da = b a^(b-1), 0 where b == 0; d/db = a^b log a, 0 where a == 0 and b >= 0
        const Tensor zero = scalar_like(g, 0.0);
        if (na) {
          const Tensor d = mul(mul(g, b), pow(a, sub(b, scalar_like(g, 1.0))));
          gi[0] = unbroadcast(where(eq(b, zero), zero, d), as);
        }
        if (nb) {
          const Tensor d = mul(mul(g, out), log(a));
          gi[1] = unbroadcast(where(eq(a, zero), where(ge(b, zero), zero, d), d), bs);
        }
        break;
      }
      case BP_OP_MAXIMUM:
      case BP_OP_MINIMUM: {  // the winner takes the gradient; a tie splits it
        const Tensor one = scalar_like(g, 1.0);
        const Tensor wins = op == BP_OP_MAXIMUM ? gt(a, b) : lt(a, b);
        const Tensor wa = where(wins, one, where(eq(a, b), scalar_like(g, 0.5), scalar_like(g, 0.0)));
        if (na) gi[0] = unbroadcast(mul(g, wa), as);
        if (nb) gi[1] = unbroadcast(mul(g, sub(one, wa)), bs);
        break;
      }
      default:
        break;
    }
  }

  const int32_t op;
  Tensor a, b, out;  // only those the formula needs
};

struct WhereNode final : GradNode {
  WhereNode() : GradNode(false) {}
  const char* name() const noexcept override { return "where"; }
  void release_saved() noexcept override { cond = Tensor(); }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    const Tensor zero = scalar_like(g, 0.0);
    if (needs_grad(0)) gi[0] = unbroadcast(where(cond, g, zero), inputs[0].shape);
    if (needs_grad(1)) gi[1] = unbroadcast(where(cond, zero, g), inputs[1].shape);
  }
  Tensor cond;
};

struct UnaryNode final : GradNode {
  explicit UnaryNode(int32_t o) : GradNode(false), op(o) {}
  const char* name() const noexcept override { return op_name(op); }
  void release_saved() noexcept override { x = out = Tensor(); }

  // Which of x and out the formula of `op` reads.
  static bool saves_input(int32_t op) noexcept {
    return op == BP_OP_ABS || op == BP_OP_LOG || op == BP_OP_RELU || op == BP_OP_SIN || op == BP_OP_COS ||
           op == BP_OP_ERF;
  }
  static bool saves_output(int32_t op) noexcept {
    return op == BP_OP_EXP || op == BP_OP_SQRT || op == BP_OP_TANH || op == BP_OP_SIGMOID;
  }

  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    switch (op) {
      case BP_OP_NEG:
        gi[0] = neg(g);
        break;
      case BP_OP_ABS: {  // sign(x); 0 at 0
        const Tensor zero = scalar_like(g, 0.0);
        gi[0] = where(gt(x, zero), g, where(lt(x, zero), neg(g), zero));
        break;
      }
      case BP_OP_EXP:
        gi[0] = mul(g, out);
        break;
      case BP_OP_LOG:
        gi[0] = div(g, x);
        break;
      case BP_OP_SQRT:  // 1 / (2 sqrt x)
        gi[0] = div(g, mul(out, scalar_like(g, 2.0)));
        break;
      case BP_OP_TANH:  // 1 - tanh^2
        gi[0] = mul(g, sub(scalar_like(g, 1.0), mul(out, out)));
        break;
      case BP_OP_SIGMOID:  // s (1 - s)
        gi[0] = mul(mul(g, out), sub(scalar_like(g, 1.0), out));
        break;
      case BP_OP_RELU: {  // 0 at 0
        const Tensor zero = scalar_like(g, 0.0);
        gi[0] = where(gt(x, zero), g, zero);
        break;
      }
      case BP_OP_SIN:
        gi[0] = mul(g, cos(x));
        break;
      case BP_OP_COS:
        gi[0] = neg(mul(g, sin(x)));
        break;
      case BP_OP_ERF:  // 2/sqrt(pi) exp(-x^2)
        gi[0] = mul(g, mul(exp(neg(mul(x, x))), scalar_like(g, 1.1283791670955126)));
        break;
      default:
        break;
    }
  }

  const int32_t op;
  Tensor x, out;
};

struct ClampNode final : GradNode {
  ClampNode(double l, double h) : GradNode(false), lo(l), hi(h) {}
  const char* name() const noexcept override { return "clamp"; }
  void release_saved() noexcept override { x = Tensor(); }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {  // passes where lo <= x <= hi
    const Tensor zero = scalar_like(g, 0.0);
    gi[0] = where(lt(x, scalar_like(g, lo)), zero, where(gt(x, scalar_like(g, hi)), zero, g));
  }
  const double lo, hi;
  Tensor x;
};

// sum / mean / max / min, over one axis (all == false) or all axes.
struct ReduceNode final : GradNode {
  ReduceNode(int32_t o, bool all_axes, int ax, bool kd)
      : GradNode(false), op(o), all(all_axes), axis(ax), keepdim(kd) {}
  const char* name() const noexcept override { return op_name(op); }
  void release_saved() noexcept override { x = out = Tensor(); }

  // t (of the result's shape) with the reduced axis back as extent 1.
  Tensor kept(const Tensor& t) const {
    return all || keepdim ? t : reshape(t, with_unit_axis(t.shape(), axis));
  }

  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    const Shape& xs = inputs[0].shape;
    const Tensor gk = kept(g);
    switch (op) {
      case BP_OP_SUM:
        gi[0] = expand(gk, xs, "backward of sum");
        break;
      case BP_OP_MEAN: {
        const int64_t n = all ? xs.numel() : xs[axis];
        gi[0] = expand(div(gk, scalar_like(g, static_cast<double>(n))), xs, "backward of mean");
        break;
      }
      case BP_OP_MAX:
      case BP_OP_MIN: {  // split evenly among the elements equal to the result
        const Tensor mask = cast(eq(x, kept(out)), x.dtype());
        const Tensor count = all ? sum(mask) : sum(mask, axis, true);
        gi[0] = mul(mask, div(gk, count));
        break;
      }
      default:
        break;
    }
  }

  const int32_t op;
  const bool all;
  const int axis;
  const bool keepdim;
  Tensor x, out;  // max/min only
};

struct MatmulNode final : GradNode {
  MatmulNode() : GradNode(false) {}
  const char* name() const noexcept override { return "matmul"; }
  void release_saved() noexcept override { a = b = Tensor(); }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    // [..,M,K] x [..,K,N]: dA = dC B^T, dB = A^T dC, summed over broadcast batch dims.
    if (needs_grad(0)) gi[0] = unbroadcast(matmul(g, transpose(b, -1, -2)), inputs[0].shape);
    if (needs_grad(1)) gi[1] = unbroadcast(matmul(transpose(a, -1, -2), g), inputs[1].shape);
  }
  Tensor a, b;  // b for dA, a for dB
};

struct SoftmaxNode final : GradNode {
  SoftmaxNode(int32_t o, int ax) : GradNode(false), op(o), axis(ax) {}
  const char* name() const noexcept override { return op_name(op); }
  void release_saved() noexcept override { out = Tensor(); }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    if (op == BP_OP_SOFTMAX) {  // y (g - sum(g y))
      gi[0] = mul(out, sub(g, sum(mul(g, out), axis, true)));
    } else {  // g - exp(y) sum(g)
      gi[0] = sub(g, mul(exp(out), sum(g, axis, true)));
    }
  }
  const int32_t op;
  const int axis;
  Tensor out;
};

struct ReshapeNode final : GradNode {
  ReshapeNode() : GradNode(false) {}
  const char* name() const noexcept override { return "reshape"; }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    gi[0] = reshape(g, inputs[0].shape.to_vector());
  }
};

struct PermuteNode final : GradNode {
  explicit PermuteNode(std::vector<int64_t> d) : GradNode(false), inverse(inverse_permutation(d)) {}
  const char* name() const noexcept override { return "permute"; }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override { gi[0] = permute(g, inverse); }
  const std::vector<int64_t> inverse;
};

struct TransposeNode final : GradNode {
  TransposeNode(int d0, int d1) : GradNode(false), dim0(d0), dim1(d1) {}
  const char* name() const noexcept override { return "transpose"; }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override { gi[0] = transpose(g, dim0, dim1); }
  const int dim0, dim1;
};

struct SliceNode final : GradNode {
  SliceNode(int ax, int64_t s, int64_t st) : GradNode(false), axis(ax), start(s), step(st) {}
  const char* name() const noexcept override { return "slice"; }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    const Shape& xs = inputs[0].shape;
    Shape starts = xs, steps = xs;
    for (int d = 0; d < xs.rank(); ++d) {
      starts[d] = d == axis ? start : 0;
      steps[d] = d == axis ? step : 1;
    }
    gi[0] = embed(g, xs, starts, steps, "backward of slice");
  }
  const int axis;
  const int64_t start, step;  // the clamped start and the step the view used
};

struct CatNode final : GradNode {
  explicit CatNode(int ax) : GradNode(false), axis(ax) {}
  const char* name() const noexcept override { return "cat"; }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    int64_t at = 0;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const int64_t n = inputs[k].shape[axis];
      if (needs_grad(k)) gi[k] = slice(g, axis, at, at + n);
      at += n;
    }
  }
  const int axis;
};

struct IndexSelectNode final : GradNode {
  explicit IndexSelectNode(int ax) : GradNode(false), axis(ax) {}
  const char* name() const noexcept override { return "index_select"; }
  void release_saved() noexcept override { index = Tensor(); }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    // A scatter-add along axis, as a matmul with the [L, n] one-hot of the index.
    const Shape& xs = inputs[0].shape;
    const int64_t n = xs[axis], len = index.numel();
    if (len == 0 || xs.numel() == 0) {
      gi[0] = zeros(g.device(), xs, g.dtype());
      return;
    }
    const Tensor hot = one_hot(index, 0, n, g);  // [len, n]
    std::vector<int64_t> perm;                   // axis last
    for (int d = 0; d < xs.rank(); ++d)
      if (d != axis) perm.push_back(d);
    perm.push_back(axis);
    const Tensor moved = permute(g, perm);
    std::vector<int64_t> rest(moved.shape().begin(), moved.shape().end() - 1);
    int64_t rows = 1;
    for (const int64_t e : rest) rows *= e;
    const Tensor scattered = matmul(reshape(moved, {rows, len}), hot);  // [rows, n]
    rest.push_back(n);
    gi[0] = permute(reshape(scattered, rest), inverse_permutation(perm));
  }
  const int axis;
  Tensor index;
};

struct GatherNode final : GradNode {
  explicit GatherNode(int ax) : GradNode(false), axis(ax) {}
  const char* name() const noexcept override { return "gather"; }
  void release_saved() noexcept override { index = Tensor(); }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override {
    // A scatter-add along axis: g against the one-hot of the index
    // ([.., m, n, ..]), summed over the m gathered positions.
    const Shape& xs = inputs[0].shape;
    const int64_t n = xs[axis];
    if (index.numel() == 0 || xs.numel() == 0) {
      gi[0] = zeros(g.device(), xs, g.dtype());
      return;
    }
    const Tensor hot = one_hot(index, axis, n, g);
    const Tensor gu = reshape(g, with_unit_axis(g.shape(), axis + 1));
    const Tensor part = sum(mul(gu, hot), axis);  // index's extents, n along axis
    if (part.shape() == xs) {
      gi[0] = part;
      return;
    }
    Shape starts = xs, steps = xs;
    for (int d = 0; d < xs.rank(); ++d) {
      starts[d] = 0;
      steps[d] = 1;
    }
    gi[0] = embed(part, xs, starts, steps, "backward of gather");
  }
  const int axis;
  Tensor index;
};

struct CastNode final : GradNode {
  CastNode() : GradNode(false) {}
  const char* name() const noexcept override { return "cast"; }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override { gi[0] = cast(g, inputs[0].dtype); }
};

struct ContiguousNode final : GradNode {
  ContiguousNode() : GradNode(false) {}
  const char* name() const noexcept override { return "contiguous"; }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override { gi[0] = g; }
};

struct ToNode final : GradNode {
  explicit ToNode(Device d) : GradNode(false), source(std::move(d)) {}
  const char* name() const noexcept override { return "to"; }
  void backward(const Tensor& g, std::vector<Tensor>& gi) override { gi[0] = to(g, source); }
  const Device source;
};

template <class Node, class... Args>
std::shared_ptr<Node> node_for(const Tensor& input, Args&&... args) {
  auto node = std::make_shared<Node>(std::forward<Args>(args)...);
  node->add_input(input);
  return node;
}

}  // namespace

// ---- recording entry points ------------------------------------------------------

void record_binary(int32_t op, const Tensor& a, const Tensor& b, Tensor& out) {
  if (!recordable(out)) return;
  auto node = std::make_shared<BinaryNode>(op);
  node->inputs.reserve(2);  // one allocation, not two
  node->add_input(a);
  node->add_input(b);
  const bool na = node->needs_grad(0), nb = node->needs_grad(1);
  switch (op) {
    case BP_OP_MUL:
      if (na) node->b = b;
      if (nb) node->a = a;
      break;
    case BP_OP_DIV:
      node->b = b;
      if (nb) node->a = a;
      break;
    case BP_OP_POW:
      node->a = a;
      node->b = b;
      if (nb) node->out = save_output(out);
      break;
    case BP_OP_MAXIMUM:
    case BP_OP_MINIMUM:
      node->a = a;
      node->b = b;
      break;
    default:  // add, sub: nothing
      break;
  }
  attach(out, std::move(node));
}

void record_where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  if (!recordable(out)) return;
  auto node = std::make_shared<WhereNode>();
  node->inputs.reserve(2);  // one allocation, not two
  node->add_input(a);
  node->add_input(b);
  node->cond = cond;
  attach(out, std::move(node));
}

void record_unary(int32_t op, const Tensor& x, Tensor& out) {
  if (!recordable(out)) return;
  auto node = node_for<UnaryNode>(x, op);
  if (UnaryNode::saves_input(op)) node->x = x;
  if (UnaryNode::saves_output(op)) node->out = save_output(out);
  attach(out, std::move(node));
}

void record_clamp(const Tensor& x, double lo, double hi, Tensor& out) {
  if (!recordable(out)) return;
  auto node = node_for<ClampNode>(x, lo, hi);
  node->x = x;
  attach(out, std::move(node));
}

namespace {

void record_reduction(int32_t op, const Tensor& x, bool all, int axis, bool keepdim, Tensor& out) {
  if (!recordable(out)) return;
  auto node = node_for<ReduceNode>(x, op, all, axis, keepdim);
  if (op == BP_OP_MAX || op == BP_OP_MIN) {
    node->x = x;
    node->out = save_output(out);
  }
  attach(out, std::move(node));
}

}  // namespace

void record_reduce(int32_t op, const Tensor& x, int64_t axis, bool keepdim, Tensor& out) {
  record_reduction(op, x, false, normalize_axis(axis, x.rank(), op_name(op)), keepdim, out);
}

void record_reduce_all(int32_t op, const Tensor& x, Tensor& out) {
  record_reduction(op, x, true, 0, false, out);
}

void record_matmul(const Tensor& a, const Tensor& b, Tensor& out) {
  if (!recordable(out)) return;
  auto node = std::make_shared<MatmulNode>();
  node->inputs.reserve(2);  // one allocation, not two
  node->add_input(a);
  node->add_input(b);
  if (node->needs_grad(0)) node->b = b;
  if (node->needs_grad(1)) node->a = a;
  attach(out, std::move(node));
}

void record_softmax(int32_t op, const Tensor& x, int64_t axis, Tensor& out) {
  if (!recordable(out)) return;
  auto node = node_for<SoftmaxNode>(x, op, normalize_axis(axis, x.rank(), op_name(op)));
  node->out = save_output(out);
  attach(out, std::move(node));
}

void record_reshape(const Tensor& x, Tensor& out) {
  if (!recordable(out)) return;
  attach(out, node_for<ReshapeNode>(x));
}

void record_permute(const Tensor& x, const std::vector<int64_t>& dims, Tensor& out) {
  if (!recordable(out)) return;
  std::vector<int64_t> normalized(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i)
    normalized[i] = normalize_axis(dims[i], x.rank(), "permute", "dim");
  attach(out, node_for<PermuteNode>(x, std::move(normalized)));
}

void record_transpose(const Tensor& x, int64_t dim0, int64_t dim1, Tensor& out) {
  if (!recordable(out)) return;
  attach(out, node_for<TransposeNode>(x, normalize_axis(dim0, x.rank(), "transpose", "dim0"),
                                      normalize_axis(dim1, x.rank(), "transpose", "dim1")));
}

void record_slice(const Tensor& x, int64_t axis_arg, int64_t start, int64_t /*end*/, int64_t step,
                  Tensor& out) {
  if (!recordable(out)) return;
  const int axis = normalize_axis(axis_arg, x.rank(), "slice");
  // As slice computes them: Python's clamping of the start, and the step
  // capped at the extent (a larger one selects one element).
  const int64_t n = x.shape()[axis];
  const int64_t lo = start < 0 ? std::max<int64_t>(start + n, 0) : std::min(start, n);
  const int64_t capped = std::min<int64_t>(step, std::max<int64_t>(n, 1));
  attach(out, node_for<SliceNode>(x, axis, lo, capped));
}

void record_cat(const std::vector<Tensor>& xs, int64_t axis, Tensor& out) {
  if (!recordable(out)) return;
  auto node = std::make_shared<CatNode>(normalize_axis(axis, xs.front().rank(), "cat"));
  node->inputs.reserve(xs.size());
  for (const Tensor& x : xs) node->add_input(x);
  attach(out, std::move(node));
}

void record_index_select(const Tensor& x, int64_t axis, const Tensor& index, Tensor& out) {
  if (!recordable(out)) return;
  auto node = node_for<IndexSelectNode>(x, normalize_axis(axis, x.rank(), "index_select"));
  node->index = index;
  attach(out, std::move(node));
}

void record_gather(const Tensor& x, int64_t axis, const Tensor& index, Tensor& out) {
  if (!recordable(out)) return;
  auto node = node_for<GatherNode>(x, normalize_axis(axis, x.rank(), "gather"));
  node->index = index;
  attach(out, std::move(node));
}

void record_cast(const Tensor& x, Tensor& out) {
  if (detail::Access::impl(out) == detail::Access::impl(x) || !recordable(out))
    return;  // cast to its own dtype returns x itself
  attach(out, node_for<CastNode>(x));
}

void record_contiguous(const Tensor& x, Tensor& out) {
  if (!recordable(out)) return;
  attach(out, node_for<ContiguousNode>(x));
}

void record_to(const Tensor& x, Tensor& out) {
  if (detail::Access::impl(out) == detail::Access::impl(x) || !recordable(out))
    return;  // to its own device returns x itself
  attach(out, node_for<ToNode>(x, x.device()));
}

}  // namespace backplane::detail
