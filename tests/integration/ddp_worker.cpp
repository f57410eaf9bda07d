// One rank of the data-parallel gradient tests, started by `backplane launch`.
//
//   ddp_worker --config FILE --backend NAME --expect synced|local|error [--bucket-bytes N]
//
// Every rank builds the same seeded MLP, registers its parameters with
// set_distributed_params and runs backward on its 1/world shard of one
// global batch. Then it checks the gradients backward returned against
// gradients it computes itself, without any synchronisation, on detached
// copies of the parameters:
//   synced  they equal the gradients of the whole batch (the mean over ranks
//           of per-shard means is the mean over the batch), to fp tolerance;
//   local   they equal this rank's shard gradients (collective_fallback
//           "local": nothing is synchronised);
//   error   set_distributed_params throws Errc::capability_missing naming
//           the backend, the capability and the remedy;
//   mismatch rank 1 registers other parameter ids: backward fails on every
//           rank with Errc::collective_error instead of mixing gradients.
// Prints "rank R: ok ..." and exits 0, or "rank R: FAIL ..." and exits 1.
#include <backplane/backplane.hpp>

#include "worker_support.hpp"

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

using namespace backplane;
using worker::arg;
using worker::fail;
using worker::g_rank;

namespace {

struct Model {
  std::vector<Tensor> params;  // w1 [8,16], b1 [16], w2 [16,4], b2 [4]
  Tensor operator()(const Tensor& x) const {
    return add(matmul(tanh(add(matmul(x, params[0]), params[1])), params[2]), params[3]);
  }
};

Model make_model(const Device& d) {
  Model m;
  m.params = {randn(d, {8, 16}, 11, 0, 0.5, DType::f64).require_grad(),
              randn(d, {16}, 12, 0, 0.1, DType::f64).require_grad(),
              randn(d, {16, 4}, 13, 0, 0.5, DType::f64).require_grad(),
              randn(d, {4}, 14, 0, 0.1, DType::f64).require_grad()};
  return m;
}

// Fresh leaves over the same values, never registered: their gradients are
// computed locally whatever the job does.
Model detached(const Model& m) {
  Model c;
  for (const Tensor& p : m.params) c.params.push_back(contiguous(p.detach()).require_grad());
  return c;
}

std::vector<Tensor> grads_of(const Model& m, const Tensor& x, const Tensor& y) {
  Tensor loss = nn::cross_entropy(m(x), y);
  Gradients g = loss.backward();
  std::vector<Tensor> out;
  for (const Tensor& p : m.params) {
    std::optional<Tensor> gp = g.get(p);
    if (!gp) fail("no gradient for a parameter");
    out.push_back(*gp);
  }
  return out;
}

void compare(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::vector<double> a = got[i].to_vector<double>();
    const std::vector<double> b = want[i].to_vector<double>();
    if (a.size() != b.size()) fail(what + ": parameter " + std::to_string(i) + " gradient has another size");
    for (std::size_t k = 0; k < a.size(); ++k) {
      const double err = std::abs(a[k] - b[k]) / std::max(1.0, std::abs(b[k]));
      worst = std::max(worst, err);
      if (err > 1e-10)
        fail(what + ": parameter " + std::to_string(i) + " element " + std::to_string(k) + ": " +
             std::to_string(a[k]) + " vs " + std::to_string(b[k]));
    }
  }
  std::cout << "rank " << g_rank << ": ok " << what << " (worst relative difference " << worst << ")"
            << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string config = arg(argc, argv, "--config");
  const std::string backend = arg(argc, argv, "--backend", "cpu");
  const std::string expect = arg(argc, argv, "--expect", "synced");
  try {
    Rendezvous rdzv = Rendezvous::from_env();
    g_rank = rdzv.rank();
    const int world = rdzv.world_size();
    Registry registry = Registry::from_config(config);
    // One device per local rank, round robin (torchrun's convention): with a
    // remote backend of two endpoints, rank 0 runs on one server and rank 1 on the other.
    const Backend b = registry.backend(backend);
    Device d = b.device(b.device_count() > 0 ? rdzv.local_rank() % b.device_count() : 0);
    GradSyncOptions sync;
    sync.bucket_bytes = std::stoull(arg(argc, argv, "--bucket-bytes", std::to_string(sync.bucket_bytes)));
    init_distributed(rdzv, sync);

    // One global batch of 12 rows per rank; rank r owns rows [12r, 12r+12).
    const int64_t per_rank = 12;
    const int64_t n = per_rank * world;
    Tensor x_all = randn(d, {n, 8}, 99, 0, 1, DType::f64);
    std::vector<int64_t> labels(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = (i * 7 + 3) % 4;
    Tensor y_all = Tensor::from_vector<int64_t>(d, {n}, labels);
    Tensor x_mine = slice(x_all, 0, g_rank * per_rank, (g_rank + 1) * per_rank);
    Tensor y_mine = slice(y_all, 0, g_rank * per_rank, (g_rank + 1) * per_rank);

    Model model = make_model(d);
    const Model reference = detached(model);
    try {
      // "mismatch": rank 1 numbers its parameters differently, as a rank
      // whose graph differs would.
      const uint64_t shift = expect == "mismatch" && g_rank == 1 ? 100 : 0;
      for (std::size_t i = 0; i < model.params.size(); ++i)
        set_distributed_params(model.params[i], DistributedParamId{i + shift});
    } catch (const Error& e) {
      if (expect != "error")
        fail(std::string("set_distributed_params: ") + to_string(e.code()) + ": " + e.message());
      const std::string m = e.message();
      if (e.code() != Errc::capability_missing || m.find(backend) == std::string::npos ||
          m.find("collective") == std::string::npos || m.find("collective_fallback") == std::string::npos)
        fail("unexpected error: " + std::string(to_string(e.code())) + ": " + m);
      std::cout << "rank " << g_rank << ": ok error: " << m << std::endl;
      return 0;
    }
    if (expect == "error") fail("set_distributed_params did not throw");

    reset_grad_sync_stats();
    if (expect == "mismatch") {
      try {
        grads_of(model, x_mine, y_mine);
      } catch (const Error& e) {
        if (e.code() != Errc::collective_error || e.message().find("disagree") == std::string::npos)
          fail("unexpected error: " + std::string(to_string(e.code())) + ": " + e.message());
        std::cout << "rank " << g_rank << ": ok mismatch: " << e.message() << std::endl;
        return 0;
      }
      fail("ranks with different parameters reduced their gradients together without an error");
    }
    const std::vector<Tensor> synced = grads_of(model, x_mine, y_mine);
    const GradSyncStats stats = grad_sync_stats();
    if (expect == "synced") {
      if (stats.gradients != 4) fail("expected 4 reduced gradients, got " + std::to_string(stats.gradients));
      compare(synced, grads_of(reference, x_all, y_all), "synced gradients equal the whole batch's");
      std::cout << "rank " << g_rank << ": " << stats.collectives << " bucket collective(s)" << std::endl;
    } else if (expect == "local") {
      if (stats.collectives != 0) fail("a local fallback issued collectives");
      compare(synced, grads_of(detached(model), x_mine, y_mine), "local gradients equal this shard's");
    } else {
      fail("unknown --expect " + expect);
    }
    shutdown_distributed();
    return 0;
  } catch (const Error& e) {
    fail(std::string(to_string(e.code())) + ": " + e.message());
  }
}
