// A host application that embeds backplane for data-parallel training: the
// model for users. Each rank trains an MLP (64-128-10) on its shard of a small
// synthetic data set (10 classes of 64 features, noisy copies of one prototype
// per class, made here so the example needs no data file); backward
// all-reduces the gradients of the parameters registered with
// set_distributed_params. Start 2 ranks with:
//   backplane launch -n 2 -- ddp_host_app [backends.json] [epochs]
#include <backplane/backplane.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace bp = backplane;

namespace {

constexpr int64_t kFeatures = 64;
constexpr int64_t kClasses = 10;

// splitmix64: the same data on every rank and platform.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {                                                           // Box-Muller
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
};

struct Dataset {
  std::vector<float> x;  // rows x kFeatures, row-major
  std::vector<int64_t> y;
  int64_t rows() const { return static_cast<int64_t>(y.size()); }
};

// `rows` samples: class c is prototype c (uniform in [0, 1)) plus N(0, noise^2).
Dataset synthetic(int64_t rows, uint64_t seed, double noise) {
  Rng prototypes{1234};
  std::vector<double> proto(static_cast<std::size_t>(kClasses * kFeatures));
  for (double& p : proto) p = prototypes.uniform();
  Rng rng{seed};
  Dataset d;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = static_cast<int64_t>(rng.next() % kClasses);
    d.y.push_back(c);
    for (int64_t f = 0; f < kFeatures; ++f)
      d.x.push_back(
          static_cast<float>(proto[static_cast<std::size_t>(c * kFeatures + f)] + noise * rng.normal()));
  }
  return d;
}

// Rows rows[begin, end) of d.
Dataset select(const Dataset& d, const std::vector<int64_t>& rows, std::size_t begin, std::size_t end) {
  Dataset out;
  for (std::size_t k = begin; k < end; ++k) {
    const auto r = static_cast<std::size_t>(rows[k]);
    out.y.push_back(d.y[r]);
    out.x.insert(out.x.end(), d.x.begin() + static_cast<std::ptrdiff_t>(r * kFeatures),
                 d.x.begin() + static_cast<std::ptrdiff_t>((r + 1) * kFeatures));
  }
  return out;
}

// A permutation of 0..n-1, the same on every rank for a given seed (Fisher-Yates).
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  Rng rng{seed};
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.next() % i]);
  return order;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string config = argc > 1 ? argv[1] : "backends.json";
  const int epochs = argc > 2 ? std::stoi(argv[2]) : 20;
  constexpr int64_t kBatch = 32;

  // 1. The job (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or mpirun's, or Slurm's)
  //    and a device of the JSON's default backend: one per local rank, round
  //    robin (torchrun's convention: rank r on device LOCAL_RANK mod count).
  bp::Rendezvous job = bp::Rendezvous::from_env();
  bp::Registry registry = bp::Registry::from_config(config);
  const bp::Backend backend = registry.default_backend();
  bp::Device device =
      backend.device(backend.device_count() > 0 ? job.local_rank() % backend.device_count() : 0);
  bp::init_distributed(job);

  // 2. The same seeded model on every rank; its parameters are distributed.
  //    A device without 'collective' follows the backend's collective_fallback.
  bp::nn::Linear hidden(device, kFeatures, 128, /*seed=*/1), out(device, 128, kClasses, /*seed=*/2);
  std::vector<bp::Tensor> params{hidden.weight(), hidden.bias(), out.weight(), out.bias()};
  for (std::size_t i = 0; i < params.size(); ++i)
    bp::set_distributed_params(params[i], bp::DistributedParamId{i});
  bp::nn::SGD sgd(params, /*lr=*/0.1, /*momentum=*/0.9);
  auto model = [&](const bp::Tensor& x) { return out(bp::relu(hidden(x))); };

  // 3. Data: 1600 training and 400 test rows; rank r takes rows r, r+world, ... of each epoch's order.
  const Dataset train = synthetic(1600, /*seed=*/1, /*noise=*/0.7);
  const Dataset test = synthetic(400, /*seed=*/2, /*noise=*/0.7);
  auto tensors = [&](const Dataset& d) {
    return std::pair{bp::Tensor::from_vector<float>(device, {d.rows(), kFeatures}, d.x),
                     bp::Tensor::from_vector<int64_t>(device, {d.rows()}, d.y)};
  };

  for (int epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<int64_t> order = permutation(train.rows(), static_cast<uint64_t>(epoch));
    std::vector<int64_t> mine;  // every rank the same number of rows (wrap around)
    const std::size_t per_rank = (order.size() + job.world_size() - 1) / job.world_size();
    for (std::size_t k = 0; k < per_rank; ++k)
      mine.push_back(order[(k * job.world_size() + job.rank()) % order.size()]);

    double loss_sum = 0;
    int steps = 0;
    for (std::size_t b = 0; b < mine.size(); b += kBatch, ++steps) {
      auto [x, y] = tensors(select(train, mine, b, std::min(mine.size(), b + kBatch)));
      bp::Tensor loss = bp::nn::cross_entropy(model(x), y);
      bp::Gradients grads = loss.backward();  // all-reduced (mean) across ranks
      sgd.step(grads);
      loss_sum += loss.to_vector<float>()[0];
    }
    if (job.rank() == 0) std::printf("epoch %d: loss %.4f\n", epoch + 1, loss_sum / steps);
  }

  // 4. Every rank holds the same parameters; rank 0 reports.
  auto [x, y] = tensors(test);
  bp::NoGradGuard no_grad;
  if (job.rank() == 0) std::printf("test accuracy %.4f\n", bp::nn::accuracy(model(x), y));
  bp::shutdown_distributed();
  return 0;
} catch (const bp::Error& e) {
  std::cerr << "ddp_host_app: " << bp::to_string(e.code()) << ": " << e.message() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "ddp_host_app: " << e.what() << "\n";
  return 1;
}
