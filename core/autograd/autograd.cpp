// The autodiff engine: grad mode, leaves, Gradients, and the backward sweep
// (dependency counting over the recorded graph, run in a deterministic order).
#include "autograd/autograd.hpp"
#include "trace/recorder.hpp"
#include "trace/trace_format.hpp"

#include "tensor/op_common.hpp"

#include <backplane/ops.hpp>

#include <atomic>
#include <mutex>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>

namespace backplane {
namespace detail {
namespace {

thread_local bool t_grad_enabled = true;
// 0 is never used: Gradients reads it as "not a leaf".
std::atomic<uint64_t> g_next_seq{1};

// The factories add_backward_hooks installed, in installation order.
struct InstalledHooks {
  std::mutex mutex;
  uint64_t next_id = 1;
  std::vector<std::pair<uint64_t, std::shared_ptr<const BackwardHooksFactory>>> factories;
};

InstalledHooks& installed_hooks() {
  static InstalledHooks* hooks = new InstalledHooks();  // used from other libraries' static destructors
  return *hooks;
}

// One backward's hooks: the installed factories' fresh hooks, snapshotted at
// the start so that installing or removing during a backward affects only
// later ones.
std::vector<BackwardHooks> make_installed_hooks() {
  std::vector<std::shared_ptr<const BackwardHooksFactory>> factories;
  {
    InstalledHooks& h = installed_hooks();
    std::lock_guard lock(h.mutex);
    if (h.factories.empty()) return {};
    for (const auto& [id, factory] : h.factories) factories.push_back(factory);
  }
  std::vector<BackwardHooks> hooks;
  hooks.reserve(factories.size());
  for (const auto& factory : factories) hooks.push_back((*factory)());
  return hooks;
}

}  // namespace

GradNode::GradNode(bool leaf) : seq(g_next_seq.fetch_add(1, std::memory_order_relaxed)), is_leaf(leaf) {}

GradNode::~GradNode() {
  // Inputs owned by this node alone are moved to `pending` and taken apart
  // there, one at a time, instead of by a nested destructor each.
  std::vector<std::shared_ptr<GradNode>> pending;
  auto take_inputs = [&pending](GradNode& n) {
    for (GradEdge& e : n.inputs)
      if (e.node != nullptr && e.node.use_count() == 1) pending.push_back(std::move(e.node));
  };
  take_inputs(*this);
  while (!pending.empty()) {
    std::shared_ptr<GradNode> n = std::move(pending.back());
    pending.pop_back();
    // What n saved can hold its inputs' nodes (through their tensors): drop
    // it first so that n's edges become their last owners.
    n->release_saved();
    take_inputs(*n);
  }
}

void GradNode::add_input(const Tensor& t) {
  const TensorImpl& x = *detail::Access::impl(t);
  inputs.push_back(
      GradEdge{x.grad_node, x.shape, x.dtype, x.storage->home_backend(), x.storage->home_index()});
}

namespace {

// The leaf id of t (its node's seq), or 0 when t is not a leaf requiring grad.
uint64_t leaf_id(const Tensor& t) noexcept {
  if (!t.defined()) return 0;
  const auto& node = detail::Access::impl(t)->grad_node;
  return node != nullptr && node->is_leaf ? node->seq : 0;
}

std::string describe_tensor(const Tensor& t) { return t.defined() ? t.to_string() : "an undefined Tensor"; }

// The throwing half of require_matching, out of line and cold: the message
// (which prints `like`'s values) is built only when a check failed.
[[noreturn, gnu::cold, gnu::noinline]] void gradient_mismatch(const Tensor& like, const Tensor& gradient,
                                                              const char* caller) {
  const std::string what = std::string(caller) + " " + like.to_string();
  if (!gradient.defined())
    throw Error(Errc::invalid_argument, what +
                                            ": the gradient is an undefined Tensor; give one with the shape, "
                                            "dtype and device of " +
                                            like.to_string());
  if (!(gradient.shape() == like.shape()))
    throw Error(Errc::shape_mismatch, what + ": the gradient has shape " + gradient.shape().to_string() +
                                          " but the tensor has shape " + like.shape().to_string() +
                                          "; they must be equal");
  if (gradient.dtype() != like.dtype())
    throw Error(Errc::dtype_mismatch, what + ": the gradient is " + std::string(to_string(gradient.dtype())) +
                                          " but the tensor is " + std::string(to_string(like.dtype())) +
                                          "; cast the gradient to the tensor's dtype");
  const auto& g = *detail::Access::impl(gradient)->storage;
  const auto& t = *detail::Access::impl(like)->storage;
  throw Error(Errc::device_mismatch, what + ": the gradient lives on " +
                                         g.home_backend()->device_id(g.home_index()) + " but the tensor on " +
                                         t.home_backend()->device_id(t.home_index()) +
                                         "; move the gradient there with to()");
}

// Throws unless `gradient` can be the gradient of `like`: same shape, dtype
// and device. The message starts with `caller` and `like` ("Gradients::set
// for Tensor(...)"); nothing is formatted on success (this runs for every
// parameter of every backward).
void require_matching(const Tensor& like, const Tensor& gradient, const char* caller) {
  if (gradient.defined()) {
    const TensorImpl& g = *detail::Access::impl(gradient);
    const TensorImpl& t = *detail::Access::impl(like);
    if (g.shape == t.shape && g.dtype == t.dtype && g.storage->home_backend() == t.storage->home_backend() &&
        g.storage->home_index() == t.storage->home_index()) [[likely]]
      return;
  }
  gradient_mismatch(like, gradient, caller);
}

// A gradient a formula returned for input `k` of `node`: it must match the
// input exactly, or the formula has a bug.
void check_formula(const GradNode& node, std::size_t k, const Tensor& g) {
  const GradEdge& e = node.inputs[k];
  std::string problem;
  if (!g.defined()) {
    problem = "no gradient";
  } else {
    const TensorImpl& x = *detail::Access::impl(g);
    if (!(x.shape == e.shape) || x.dtype != e.dtype || x.storage->home_backend() != e.backend ||
        x.storage->home_index() != e.device)
      problem = "a gradient " + g.to_string();
  }
  if (problem.empty()) return;
  throw Error(Errc::internal, std::string("backward of ") + node.name() + ": input " + std::to_string(k) +
                                  " (shape " + e.shape.to_string() + ", " + std::string(to_string(e.dtype)) +
                                  ") received " + problem +
                                  "; this is a bug in backplane's gradient formulas: please report it");
}

Tensor seed_gradient(const Tensor& root, const Tensor& given) {
  if (given.defined()) {
    require_matching(root, given, "Tensor::backward: BackwardOptions::gradient for the root");
    return given;
  }
  if (root.numel() != 1)
    throw Error(Errc::shape_mismatch,
                "Tensor::backward: the root " + root.to_string() + " has " + std::to_string(root.numel()) +
                    " elements; backward() without a gradient needs a one-element tensor such as a loss: "
                    "reduce it first (sum or mean), or pass BackwardOptions::gradient of shape " +
                    root.shape().to_string());
  return ones(root.device(), root.shape(), root.dtype());
}

[[noreturn]] void throw_released(const GradNode& node) {
  throw Error(Errc::invalid_argument,
              std::string("Tensor::backward: the graph was freed by an earlier backward() (the node of '") +
                  node.name() +
                  "' already ran and dropped what it saved); to run backward through a graph more than once, "
                  "pass BackwardOptions{.retain_graph = true} to every backward() but the last");
}

// One node of the sweep: how many contributions it still waits for, and the
// sum of those received.
struct Item {
  std::shared_ptr<GradNode> node;
  uint32_t pending = 0;
  Tensor grad;
};

Gradients run_backward(const Tensor& root, const BackwardOptions& options) {
  const std::shared_ptr<GradNode>& root_node = detail::Access::impl(root)->grad_node;
  if (root_node == nullptr)
    throw Error(Errc::invalid_argument,
                "Tensor::backward: " + root.to_string() +
                    " does not require grad: no tensor it was computed from was marked with require_grad(), "
                    "or it was computed under a NoGradGuard, or detached; mark the parameters with "
                    "require_grad() before computing the loss");
  Tensor seed = seed_gradient(root, options.gradient);
  NoGradGuard no_grad;

  // 1. Every node reachable from the root, with the number of edges into it.
  std::vector<Item> items;
  std::unordered_map<const GradNode*, std::size_t> index;
  std::vector<std::size_t> stack;
  auto visit = [&](const std::shared_ptr<GradNode>& node) {
    const auto [it, fresh] = index.try_emplace(node.get(), items.size());
    if (fresh) {
      if (node->released) throw_released(*node);
      items.push_back(Item{node, 0, Tensor()});
      stack.push_back(it->second);
    }
    return it->second;
  };
  visit(root_node);
  while (!stack.empty()) {
    const GradNode& node = *items[stack.back()].node;
    stack.pop_back();
    for (const GradEdge& e : node.inputs)
      if (e.node != nullptr) ++items[visit(e.node)].pending;
  }

  // 2. Run nodes whose contributions are all in, latest-recorded first (the
  // seq order is deterministic); a leaf's gradient is final at that moment.
  Gradients grads;
  std::vector<BackwardHooks> installed = make_installed_hooks();
  std::priority_queue<std::pair<uint64_t, std::size_t>> ready;
  std::size_t done = 0;
  auto deliver = [&](std::size_t i) {
    Item& item = items[i];
    if (!item.node->is_leaf) {
      ready.emplace(item.node->seq, i);
      return;
    }
    ++done;
    Tensor gradient = std::move(item.grad);
    std::shared_ptr<TensorImpl> impl = static_cast<const LeafNode&>(*item.node).tensor.lock();
    if (impl == nullptr) return;  // no handle left to ask for it
    const Tensor param = detail::Access::make_tensor(std::move(impl));
    if (options.on_gradient_final) {
      options.on_gradient_final(param, gradient);
      require_matching(param, gradient, "Tensor::backward: the gradient on_gradient_final gave for");
    }
    for (const BackwardHooks& hooks : installed) {
      if (!hooks.on_gradient_final) continue;
      hooks.on_gradient_final(param, gradient);
      require_matching(param, gradient, "Tensor::backward: the gradient an installed backward hook gave for");
    }
    grads.set(param, std::move(gradient));
  };
  items[0].grad = std::move(seed);
  deliver(0);
  std::vector<Tensor> grad_inputs;
  while (!ready.empty()) {
    const std::size_t i = ready.top().second;
    ready.pop();
    ++done;
    GradNode& node = *items[i].node;
    const Tensor grad = std::move(items[i].grad);
    grad_inputs.assign(node.inputs.size(), Tensor());
    node.backward(grad, grad_inputs);
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const GradEdge& e = node.inputs[k];
      if (e.node == nullptr) continue;
      check_formula(node, k, grad_inputs[k]);
      Item& target = items[index.find(e.node.get())->second];
      target.grad = target.grad.defined() ? add(target.grad, grad_inputs[k]) : std::move(grad_inputs[k]);
      if (--target.pending == 0) deliver(static_cast<std::size_t>(&target - items.data()));
    }
    if (!options.retain_graph) {
      node.release_saved();
      node.inputs.clear();
      node.released = true;
    }
  }
  if (done != items.size())
    throw Error(Errc::internal, "Tensor::backward: " + std::to_string(items.size() - done) + " of " +
                                    std::to_string(items.size()) +
                                    " graph nodes never became ready; this is a bug in backplane: please "
                                    "report it");
  for (const BackwardHooks& hooks : installed)
    if (hooks.on_backward_end) hooks.on_backward_end(grads);
  if (options.on_backward_end) options.on_backward_end(grads);
  return grads;
}

}  // namespace
}  // namespace detail

// ---- installed backward hooks ----------------------------------------------------

uint64_t add_backward_hooks(BackwardHooksFactory factory) {
  if (!factory) throw Error(Errc::invalid_argument, "add_backward_hooks: an empty factory");
  detail::InstalledHooks& h = detail::installed_hooks();
  auto shared = std::make_shared<const BackwardHooksFactory>(std::move(factory));
  std::lock_guard lock(h.mutex);
  const uint64_t id = h.next_id++;
  h.factories.emplace_back(id, std::move(shared));
  return id;
}

bool remove_backward_hooks(uint64_t id) noexcept {
  detail::InstalledHooks& h = detail::installed_hooks();
  std::lock_guard lock(h.mutex);
  for (auto it = h.factories.begin(); it != h.factories.end(); ++it) {
    if (it->first != id) continue;
    h.factories.erase(it);
    return true;
  }
  return false;
}

// ---- grad mode -----------------------------------------------------------------

bool grad_enabled() noexcept { return detail::t_grad_enabled; }

NoGradGuard::NoGradGuard() noexcept : previous_(detail::t_grad_enabled) { detail::t_grad_enabled = false; }

NoGradGuard::~NoGradGuard() { detail::t_grad_enabled = previous_; }

// ---- Tensor members ------------------------------------------------------------

Tensor Tensor::require_grad() const {
  if (!impl_)
    throw Error(Errc::invalid_argument,
                "Tensor::require_grad: undefined Tensor (default-constructed or moved-from)");
  if (!detail::is_float(impl_->dtype))
    throw Error(Errc::dtype_mismatch,
                "Tensor::require_grad: " + to_string() +
                    " cannot require grad: only f32 and f64 tensors have gradients (integer and bool values "
                    "are not differentiable, and no arithmetic op takes f16 or bf16); cast it to f32 or f64 "
                    "first");
  if (impl_->grad_node != nullptr) return *this;  // a leaf already, or an op's output
  auto leaf = std::make_shared<detail::LeafNode>();
  leaf->tensor = impl_;
  impl_->grad_node = std::move(leaf);
  return *this;
}

bool Tensor::requires_grad() const noexcept { return impl_ != nullptr && impl_->grad_node != nullptr; }

Tensor Tensor::detach() const {
  const detail::TensorImpl& t = checked();
  return detail::Access::make_tensor(detail::make_view(impl_, t.shape, t.strides, t.byte_offset));
}

Gradients Tensor::backward() const { return backward(BackwardOptions{}); }

Gradients Tensor::backward(const BackwardOptions& options) const {
  if (!impl_)
    throw Error(Errc::invalid_argument,
                "Tensor::backward: undefined Tensor (default-constructed or moved-from)");
  const trace::detail::Span span(trace::detail::kCatAutograd, "backward");
  return detail::run_backward(*this, options);
}

// ---- Gradients -----------------------------------------------------------------

std::optional<Tensor> Gradients::get(const Tensor& param) const {
  const uint64_t id = detail::leaf_id(param);
  if (id == 0) return std::nullopt;
  const auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return entries_[it->second].gradient;
}

void Gradients::set(const Tensor& param, Tensor gradient) {
  const uint64_t id = detail::leaf_id(param);
  if (id == 0)
    throw Error(
        Errc::invalid_argument,
        "Gradients::set: " + detail::describe_tensor(param) +
            " is not a leaf that requires grad; gradients belong to tensors marked with require_grad()");
  detail::require_matching(param, gradient, "Gradients::set for");
  const auto [it, fresh] = index_.try_emplace(id, entries_.size());
  if (fresh) {
    entries_.push_back(Entry{param, std::move(gradient)});
  } else {
    entries_[it->second].gradient = std::move(gradient);
  }
}

std::optional<Tensor> Gradients::remove(const Tensor& param) {
  const uint64_t id = detail::leaf_id(param);
  const auto it = id == 0 ? index_.end() : index_.find(id);
  if (it == index_.end()) return std::nullopt;
  const std::size_t pos = it->second;
  Tensor gradient = std::move(entries_[pos].gradient);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(pos));
  index_.erase(it);
  for (auto& [key, at] : index_)
    if (at > pos) --at;
  return gradient;
}

}  // namespace backplane
