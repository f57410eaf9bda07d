// A host application that embeds backplane for data-parallel training: the
// model for users. Each rank trains an MLP (64-128-10) on its shard of the
// digits data; backward all-reduces the gradients of the parameters
// registered with set_distributed_params. Start 2 ranks with:
//   backplane launch -n 2 -- ddp_host_app [backends.json] [digits.csv.gz] [epochs]
#include <backplane/backplane.hpp>

#include "../common/digits.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace bp = backplane;

int main(int argc, char** argv) try {
  const std::string config = argc > 1 ? argv[1] : "backends.json";
  const std::string data = argc > 2 ? argv[2] : "data/digits.csv.gz";
  const int epochs = argc > 3 ? std::stoi(argv[3]) : 20;
  constexpr int64_t kBatch = 32;

  // 1. The job (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or mpirun's, or Slurm's)
  //    and the device the JSON's default backend offers.
  bp::Rendezvous job = bp::Rendezvous::from_env();
  bp::Registry registry = bp::Registry::from_config(config);
  bp::Device device = registry.default_backend().device(0);
  bp::init_distributed(job);

  // 2. The same seeded model on every rank; its parameters are distributed.
  //    A device without 'collective' follows the backend's collective_fallback.
  bp::nn::Linear hidden(device, 64, 128, /*seed=*/1), out(device, 128, 10, /*seed=*/2);
  std::vector<bp::Tensor> params{hidden.weight(), hidden.bias(), out.weight(), out.bias()};
  for (std::size_t i = 0; i < params.size(); ++i) bp::set_distributed_params(params[i], bp::DistributedParamId{i});
  bp::nn::SGD sgd(params, /*lr=*/0.1, /*momentum=*/0.9);
  auto model = [&](const bp::Tensor& x) { return out(bp::relu(hidden(x))); };

  // 3. Data: an 80/20 split; rank r takes rows r, r+world, ... of each epoch's order.
  const auto [train, test] = digits::split(digits::load(data), 0.8, /*seed=*/0);
  auto tensors = [&](const digits::Dataset& d) {
    return std::pair{bp::Tensor::from_vector<float>(device, {d.rows(), 64}, d.x),
                     bp::Tensor::from_vector<int64_t>(device, {d.rows()}, d.y)};
  };

  for (int epoch = 0; epoch < epochs; ++epoch) {
    const std::vector<int64_t> order = digits::permutation(train.rows(), static_cast<uint64_t>(epoch));
    std::vector<int64_t> mine;  // every rank the same number of rows (wrap around)
    const std::size_t per_rank = (order.size() + job.world_size() - 1) / job.world_size();
    for (std::size_t k = 0; k < per_rank; ++k)
      mine.push_back(order[(k * job.world_size() + job.rank()) % order.size()]);

    double loss_sum = 0;
    int steps = 0;
    for (std::size_t b = 0; b < mine.size(); b += kBatch, ++steps) {
      auto [x, y] = tensors(digits::rows(train, mine, b, std::min(mine.size(), b + kBatch)));
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
