// A host application on backplane: loads the backends, computes on the default
// backend, and shows that a missing capability is a typed error, not a crash.
// Usage: host_app [backends.json]
// Without an argument, Registry::from_env(): BACKPLANE_CONFIG, else the default
// found relative to libbackplane (<prefix>/share/backplane/backends.json once
// installed; in a build tree, the <build>/share/backplane/backends.json the
// build generates). A backends.json in the current folder is never read
// unless named.
#include <backplane/backplane.hpp>

#include <iostream>
#include <vector>

namespace bp = backplane;

namespace {

void print(const char* label, const bp::Tensor& t) {
  std::cout << label << ' ' << t.shape().to_string() << ':';
  for (const float v : t.to_vector<float>()) std::cout << ' ' << v;
  std::cout << '\n';
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const bp::Registry registry = argc > 1 ? bp::Registry::from_config(argv[1]) : bp::Registry::from_env();
    for (const bp::Backend& backend : registry.backends()) {
      // In `backplane check`'s words: unavailable (the plugin loaded, its devices cannot be used here,
      // e.g. cuda without a driver) or failed (it did not load).
      const bool unavailable = backend.status() == bp::Backend::Status::unavailable;
      std::cout << "backend " << backend.name() << ": "
                << (backend.loaded() ? "loaded, capabilities: " + backend.capabilities().to_string()
                                     : (unavailable ? "unavailable: " : "failed: ") + backend.error())
                << '\n';
    }

    const bp::Device device = registry.default_backend().device(0);
    std::cout << "device " << device.id() << " (" << device.name() << ")\n";

    const auto a = bp::Tensor::from_vector(device, {2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
    const auto row = bp::Tensor::from_vector(device, {3}, std::vector<float>{10, 20, 30});
    const auto w = bp::Tensor::from_vector(device, {3, 2}, std::vector<float>{1, 0, 0, 1, 1, 1});
    print("a + row", a + row);  // [2,3] + [3] broadcasts
    print("a * a", a * a);
    print("a @ w", bp::matmul(a, w));

    // The reason backplane exists: asking for data-parallel training on a
    // backend is a capability lookup. With `collective` the parameter is
    // registered; without it (and with the default collective_fallback
    // "error") it is a typed error that names the remedy.
    for (const bp::Backend& backend : registry.backends()) {
      if (backend.status() != bp::Backend::Status::loaded) continue;
      const bp::Device d = backend.device(0);
      try {
        bp::set_distributed_params(bp::Tensor::from_vector(d, {2}, std::vector<float>{1, 2}),
                                   bp::DistributedParamId{42});
        std::cout << "set_distributed_params on " << d.id() << ": registered\n";
      } catch (const bp::Error& e) {
        std::cout << "set_distributed_params on " << d.id() << ": error " << bp::to_string(e.code()) << ": "
                  << e.what() << '\n';
      }
    }
    return 0;
  } catch (const bp::Error& e) {
    std::cerr << "host_app: error: " << bp::to_string(e.code()) << ": " << e.what() << '\n';
    return 1;
  }
}
