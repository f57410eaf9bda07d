// A host application on a remote device: the same code as on a local one.
// Usage: remote_host_app backends.json
// The config names a "remote" backend whose endpoints run `backplane serve`
// (docs/remote.md). The program lists the remote devices and what they can
// do, computes on one, moves a tensor between the remote device and the local
// cpu, and shows that an error in pipelined work arrives at the next
// synchronising call as a typed backplane::Error naming the op.
#include <backplane/backplane.hpp>

#include <iostream>
#include <vector>

namespace bp = backplane;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: remote_host_app backends.json (with a \"remote\" backend)\n";
    return 2;
  }
  try {
    const bp::Registry registry = bp::Registry::from_config(argv[1]);
    const bp::Backend remote = registry.backend("remote");
    for (const bp::Device& d : remote.devices()) {
      std::cout << d.id() << ": " << d.name() << "\n  capabilities: " << d.capabilities().to_string() << '\n';
      for (const auto& [key, value] : d.attributes())
        if (key == "endpoint" || key == "server_device") std::cout << "  " << key << " = " << value << '\n';
    }
    const bp::Device device = remote.device(0);

    // Computing: every op is sent without waiting; reading the result waits.
    const auto x = bp::Tensor::from_vector(device, {2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
    const auto w = bp::Tensor::from_vector(device, {3, 2}, std::vector<float>{1, 0, 0, 1, 1, 1});
    const bp::Tensor y = bp::relu(bp::matmul(x, w) - bp::full(device, {1}, 5.0));
    std::cout << "relu(x @ w - 5) on " << device.id() << ": " << y.to_string() << '\n';

    // Moving: remote -> local cpu -> remote.
    const bp::Device cpu = registry.backend("cpu").device(0);
    const bp::Tensor local = y.to(cpu);
    std::cout << "copied to " << cpu.id() << ": " << local.to_string() << '\n';
    const bp::Tensor back = (local * bp::full(cpu, {1}, 2.0)).to(device);
    std::cout << "doubled and sent back: " << back.to_string() << '\n';

    // A device-side error (an index out of range only the data shows) is a
    // typed error at the next read, not a crash of either side.
    const auto index = bp::Tensor::from_vector(device, {1}, std::vector<int64_t>{7});
    try {
      const bp::Tensor picked = bp::index_select(x, 0, index);
      (void)picked.to_vector<float>();
      std::cout << "FAIL: an out-of-range index was accepted\n";
      return 1;
    } catch (const bp::Error& e) {
      std::cout << "an out-of-range index: " << bp::to_string(e.code()) << '\n';
    }
    std::cout << "done: " << device.id() << " served by " << device.attributes().at("endpoint") << '\n';
    return 0;
  } catch (const bp::Error& e) {
    std::cerr << "remote_host_app: " << e.what() << '\n';
    return 1;
  }
}
