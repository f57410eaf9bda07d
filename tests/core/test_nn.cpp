// The training toolkit (nn.hpp) against hand-computed values, and the
// single-process paths of gradient synchronisation (distributed.hpp).
#include "test_support.hpp"

#include <backplane/autograd.hpp>
#include <backplane/distributed.hpp>
#include <backplane/nn.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace backplane;
using namespace bptest;

namespace {

Device cpu(const Registry& r) {
  Backend b = r.backend("cpu");
  expect_loaded(b);
  return b.device(0);
}

Registry cpu_registry() { return load(config_json({backend_json("cpu", "backplane_cpu")})); }

}  // namespace

TEST_CASE("nn: Linear is seeded, bounded and requires grad") {
  Registry r = cpu_registry();
  Device d = cpu(r);
  nn::Linear a(d, 64, 10, 5), b(d, 64, 10, 5), c(d, 64, 10, 6);
  CHECK(a.weight().shape() == Shape{64, 10});
  CHECK(a.bias().shape() == Shape{10});
  CHECK(a.weight().requires_grad());
  CHECK(a.bias().requires_grad());
  CHECK(a.weight().to_vector<float>() == b.weight().to_vector<float>());
  CHECK(a.weight().to_vector<float>() != c.weight().to_vector<float>());
  CHECK(a.weight().to_vector<float>() != a.bias().to_vector<float>());
  for (float w : a.weight().to_vector<float>()) CHECK(std::abs(w) <= 1.0f / 8.0f);
  Tensor y = a(ones(d, {3, 64}));
  CHECK(y.shape() == Shape{3, 10});
  CHECK(error_from([&] { nn::Linear(d, 0, 3, 1); }).code() == Errc::invalid_argument);
}

TEST_CASE("nn: cross_entropy equals the mean negative log-softmax of the labels, with its gradient") {
  Registry r = cpu_registry();
  Device d = cpu(r);
  const std::vector<double> z{1.0, 2.0, 0.5, -1.0, 0.0, 3.0};  // 2 rows, 3 classes
  Tensor logits = Tensor::from_vector<double>(d, {2, 3}, z).require_grad();
  Tensor labels = Tensor::from_vector<int64_t>(d, {2}, {1, 2});
  Tensor loss = nn::cross_entropy(logits, labels);
  auto lse = [&](int row) {
    double s = 0;
    for (int k = 0; k < 3; ++k) s += std::exp(z[row * 3 + k]);
    return std::log(s);
  };
  const double want = ((lse(0) - z[1]) + (lse(1) - z[5])) / 2;
  CHECK(loss.to_vector<double>()[0] == doctest::Approx(want).epsilon(1e-12));
  // d loss / d z = (softmax - onehot) / N
  const std::vector<double> g = loss.backward().get(logits)->to_vector<double>();
  for (int row = 0; row < 2; ++row)
    for (int k = 0; k < 3; ++k) {
      const double p = std::exp(z[row * 3 + k] - lse(row));
      const double onehot = (k == (row == 0 ? 1 : 2)) ? 1 : 0;
      CHECK(g[row * 3 + k] == doctest::Approx((p - onehot) / 2).epsilon(1e-12));
    }
  CHECK(nn::accuracy(logits, labels) == doctest::Approx(1.0));  // argmax rows: 1 and 2
}

TEST_CASE("nn: cross_entropy rejects bad labels with a clear error") {
  Registry r = cpu_registry();
  Device d = cpu(r);
  Tensor logits = zeros(d, {2, 3});
  CHECK(error_from([&] { nn::cross_entropy(logits, zeros(d, {2})); }).code() == Errc::dtype_mismatch);
  CHECK(error_from([&] {
          nn::cross_entropy(logits, Tensor::from_vector<int64_t>(d, {3}, {0, 1, 2}));
        }).code() == Errc::shape_mismatch);
  const Error e = error_from([&] {
    nn::cross_entropy(logits, Tensor::from_vector<int64_t>(d, {2}, {0, 3}));
  });
  CHECK(e.code() == Errc::invalid_argument);
}

TEST_CASE("nn: SGD with momentum follows v = m v + g, p -= lr v") {
  Registry r = cpu_registry();
  Device d = cpu(r);
  Tensor p = Tensor::from_vector<double>(d, {2}, {1.0, -2.0}).require_grad();
  nn::SGD sgd({p}, 0.1, 0.9);
  double p0 = 1.0, p1 = -2.0, v0 = 0, v1 = 0;
  for (int step = 0; step < 3; ++step) {
    // loss = sum(p^2) / 2 -> g = p
    Gradients g = mul(sum(mul(p, p)), full(d, {}, 0.5, DType::f64)).backward();
    sgd.step(g);
    v0 = step == 0 ? p0 : 0.9 * v0 + p0;
    v1 = step == 0 ? p1 : 0.9 * v1 + p1;
    p0 -= 0.1 * v0;
    p1 -= 0.1 * v1;
    const std::vector<double> got = p.to_vector<double>();
    CHECK(got[0] == doctest::Approx(p0).epsilon(1e-12));
    CHECK(got[1] == doctest::Approx(p1).epsilon(1e-12));
  }
  CHECK(p.requires_grad());  // updated in place: still the same leaf
  CHECK(error_from([&] { nn::SGD({p}, 0.0); }).code() == Errc::invalid_argument);
  CHECK(error_from([&] { nn::SGD({zeros(d, {2})}, 0.1); }).code() == Errc::invalid_argument);
}

TEST_CASE("nn: Adam's first steps match the bias-corrected formula") {
  Registry r = cpu_registry();
  Device d = cpu(r);
  Tensor p = Tensor::from_vector<double>(d, {2}, {0.5, -1.5}).require_grad();
  nn::Adam adam({p}, 0.01);
  double x[2] = {0.5, -1.5}, m[2] = {0, 0}, v[2] = {0, 0};
  for (int t = 1; t <= 3; ++t) {
    Gradients g = mul(sum(mul(p, p)), full(d, {}, 0.5, DType::f64)).backward();  // g = p
    adam.step(g);
    for (int i = 0; i < 2; ++i) {
      const double gi = x[i];
      m[i] = 0.9 * m[i] + 0.1 * gi;
      v[i] = 0.999 * v[i] + 0.001 * gi * gi;
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
      x[i] -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
    }
    const std::vector<double> got = p.to_vector<double>();
    CHECK(got[0] == doctest::Approx(x[0]).epsilon(1e-12));
    CHECK(got[1] == doctest::Approx(x[1]).epsilon(1e-12));
  }
}

namespace {

// Steps `opt` on loss = sum(p^2 * w) / 2 (w fixed, so g = p * w) `n` times.
void descend(nn::Optimizer& opt, const Tensor& p, const Tensor& w, int n) {
  for (int i = 0; i < n; ++i)
    opt.step(mul(sum(mul(mul(p, p), w)), full(p.device(), {}, 0.5, p.dtype())).backward());
}

// Two optimizers: `a` runs 5 steps; `b` runs 2, hands its state to a fresh
// optimizer `c` on a copy of its parameter, and `c` runs the other 3. The
// results must agree bit for bit.
template <typename Make>
void check_resume_is_exact(const Device& d, Make make) {
  const Tensor w = Tensor::from_vector<float>(d, {3}, {1.0f, 0.25f, 3.0f});
  Tensor pa = Tensor::from_vector<float>(d, {3}, {0.5f, -1.5f, 2.0f}).require_grad();
  Tensor pb = Tensor::from_vector<float>(d, {3}, {0.5f, -1.5f, 2.0f}).require_grad();
  auto a = make(pa);
  auto b = make(pb);
  descend(*a, pa, w, 5);
  CHECK(b->state().empty());  // no step taken: nothing to save
  descend(*b, pb, w, 2);
  std::vector<std::pair<std::string, Tensor>> saved;
  // As a checkpoint would: read back and remade.
  for (const std::pair<std::string, Tensor>& entry : b->state()) {
    const Tensor& t = entry.second;
    const std::string& name = entry.first;
    saved.emplace_back(name, t.dtype() == DType::i64
                                 ? Tensor::from_vector<int64_t>(d, t.shape(), t.to_vector<int64_t>())
                                 : Tensor::from_vector<float>(d, t.shape(), t.to_vector<float>()));
  }
  Tensor pc = Tensor::from_vector<float>(d, {3}, pb.to_vector<float>()).require_grad();
  auto c = make(pc);
  c->load_state(saved);
  descend(*b, pb, w, 1);  // b's later steps do not reach c's state
  descend(*c, pc, w, 3);
  CHECK(pc.to_vector<float>() == pa.to_vector<float>());
}

}  // namespace

TEST_CASE("nn: an optimizer's state() loaded into a fresh one resumes bit-exactly") {
  Registry r = cpu_registry();
  Device d = cpu(r);
  SUBCASE("SGD with momentum") {
    check_resume_is_exact(
        d, [](const Tensor& p) { return std::make_unique<nn::SGD>(std::vector<Tensor>{p}, 0.1, 0.9); });
  }
  SUBCASE("Adam") {
    check_resume_is_exact(
        d, [](const Tensor& p) { return std::make_unique<nn::Adam>(std::vector<Tensor>{p}, 0.01); });
  }
}

TEST_CASE("nn: an optimizer that does not override state() says so when asked for it") {
  // Written before state() and load_state() existed: it still builds.
  class Plain final : public nn::Optimizer {
   public:
    explicit Plain(std::vector<Tensor> params) : Optimizer(std::move(params)) {}
    void step(const Gradients&) override {}
  };
  Registry r = cpu_registry();
  Device d = cpu(r);
  Plain plain({Tensor::from_vector<float>(d, {2}, {1.0f, 2.0f}).require_grad()});
  const Error saving = bptest::error_from([&] { (void)plain.state(); });
  CHECK(saving.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(saving.message(), "override state() and load_state()");
  const Error loading = bptest::error_from([&] { plain.load_state({}); });
  CHECK(loading.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(loading.message(), "nn::Optimizer::load_state");
}

TEST_CASE("nn: load_state refuses a state that does not fit, naming the entry, and changes nothing") {
  Registry r = cpu_registry();
  Device d = cpu(r);
  Tensor p = Tensor::from_vector<float>(d, {2}, {1.0f, 2.0f}).require_grad();
  const Tensor v2 = Tensor::from_vector<float>(d, {2}, {0.5f, 0.5f});
  nn::SGD sgd({p}, 0.1, 0.9);
  auto refused = [&](nn::Optimizer& opt, std::vector<std::pair<std::string, Tensor>> state,
                     const char* says) {
    const Error e = error_from([&] { opt.load_state(state); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK_MESSAGE(e.message().find(says) != std::string::npos, e.message());
  };
  refused(sgd, {{"momentum.0", v2}}, "unknown entry \"momentum.0\"");
  refused(sgd, {{"velocity.1", v2}}, "names parameter 1, but there are 1");
  refused(sgd, {{"velocity.01", v2}}, "unknown entry");
  refused(sgd, {{"velocity.0", Tensor::from_vector<float>(d, {3}, {1, 2, 3})}}, "but its parameter is");
  refused(sgd, {{"velocity.0", Tensor::from_vector<double>(d, {2}, {1, 2})}}, "but its parameter is");
  refused(sgd, {{"velocity.0", v2}, {"velocity.0", v2}}, "given twice");
  CHECK(sgd.state().empty());
  sgd.load_state({{"velocity.0", v2}});
  REQUIRE(sgd.state().size() == 1);
  CHECK(sgd.state()[0].second.to_vector<float>() == std::vector<float>{0.5f, 0.5f});

  nn::Adam adam({p}, 0.01);
  refused(adam, {{"m.0", v2}, {"v.0", v2}}, "has 2 of its entries m, v and step");
  refused(adam, {{"m.0", v2}, {"v.0", v2}, {"step.0", Tensor::from_vector<int64_t>(d, {1}, {0})}},
          "at least one step");
  refused(adam, {{"m.0", v2}, {"v.0", v2}, {"step.0", Tensor::from_vector<float>(d, {1}, {1})}},
          "must be one i64");
  CHECK(adam.state().empty());
}

TEST_CASE("nn: Tensor::copy_ overwrites in place and checks shape, dtype and layout") {
  Registry r = cpu_registry();
  Device d = cpu(r);
  Tensor a = zeros(d, {2, 2});
  Tensor view = reshape(a, {4});
  a.copy_(Tensor::from_vector<float>(d, {2, 2}, {1, 2, 3, 4}));
  CHECK(view.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  a.copy_(transpose(Tensor::from_vector<float>(d, {2, 2}, {1, 2, 3, 4}), 0, 1));  // a strided source
  CHECK(a.to_vector<float>() == std::vector<float>{1, 3, 2, 4});
  CHECK(error_from([&] { a.copy_(zeros(d, {4})); }).code() == Errc::shape_mismatch);
  CHECK(error_from([&] { a.copy_(zeros(d, {2, 2}, DType::f64)); }).code() == Errc::dtype_mismatch);
  CHECK(error_from([&] { transpose(a, 0, 1).copy_(zeros(d, {2, 2})); }).code() == Errc::invalid_argument);
}

TEST_CASE("grad sync: backward reaching a registered parameter without init_distributed says what to do") {
  Registry r = load(config_json({backend_json("world", "collective_world1")}));
  Device d = r.backend("world").device(0);
  REQUIRE_FALSE(distributed_initialized());
  Tensor p = set_distributed_params(Tensor::from_vector<float>(d, {2}, {1, 2}).require_grad(),
                                    DistributedParamId{3});
  const Error e = error_from([&] {
    mul(p, p).backward(BackwardOptions{Tensor::from_vector<float>(d, {2}, {1, 1}), false, {}, {}});
  });
  CHECK(e.code() == Errc::invalid_argument);
  BP_CHECK_CONTAINS(e.message(), "init_distributed");
  BP_CHECK_CONTAINS(e.message(), "parameter 3");
}

TEST_CASE("grad sync: a world of one reduces registered gradients and leaves the others alone") {
  Registry r = load(config_json({backend_json("world", "collective_world1")}));
  Device d = r.backend("world").device(0);
  init_distributed(Rendezvous::single_process(std::chrono::seconds(10)));
  CHECK(distributed_initialized());
  CHECK(error_from([&] { init_distributed(Rendezvous::single_process()); }).code() == Errc::invalid_argument);
  Tensor p = set_distributed_params(Tensor::from_vector<float>(d, {2}, {1, 2}).require_grad(),
                                    DistributedParamId{1});
  Tensor q = Tensor::from_vector<float>(d, {2}, {3, 4}).require_grad();
  reset_grad_sync_stats();
  Gradients g =
      add(mul(p, p), q).backward(BackwardOptions{Tensor::from_vector<float>(d, {2}, {1, 1}), false, {}, {}});
  CHECK(g.get(p)->to_vector<float>() == std::vector<float>{2, 4});
  CHECK(g.get(q)->to_vector<float>() == std::vector<float>{1, 1});
  const GradSyncStats s = grad_sync_stats();
  CHECK(s.collectives == 1);
  CHECK(s.gradients == 1);
  CHECK(s.bytes == 8);
  CHECK(distributed_group(d).world_size() == 1);
  shutdown_distributed();
  CHECK_FALSE(distributed_initialized());
}
