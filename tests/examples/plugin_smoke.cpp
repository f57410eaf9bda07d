// Runs a plugin through the host API, as an application would: loads a
// backends.json, then zeros/ones/full (FILL), a broadcast add (ADD),
// contiguous() of a transposed view and cat() (COPY), and checks every value.
// An op the plugin does not claim must be a typed unsupported_op error.
// Usage: plugin_smoke <backends.json> <backend name>; exit 0 when all hold.
#include <backplane/backplane.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace bp = backplane;

namespace {

int failures = 0;

void expect(const std::string& what, const bp::Tensor& t, const std::vector<int64_t>& shape,
            const std::vector<float>& want) {
  const std::vector<float> got = t.to_vector<float>();
  bool ok = t.shape().to_vector() == shape && got.size() == want.size();
  for (std::size_t i = 0; ok && i < got.size(); ++i) ok = got[i] == want[i];
  std::cout << (ok ? "ok   " : "FAIL ") << what << " " << t.shape().to_string() << ":";
  for (const float v : got) std::cout << ' ' << v;
  std::cout << '\n';
  if (!ok) ++failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: plugin_smoke <backends.json> <backend name>\n";
    return 2;
  }
  try {
    const bp::Registry registry = bp::Registry::from_config(argv[1]);
    const bp::Backend backend = registry.backend(argv[2]);
    if (!backend.loaded()) {
      std::cerr << "plugin_smoke: backend " << argv[2] << " did not load: " << backend.error() << '\n';
      return 1;
    }
    const bp::Device device = backend.device(0);
    std::cout << "device " << device.id() << " (" << device.name() << "), capabilities "
              << device.capabilities().to_string() << '\n';

    const bp::Tensor z = bp::zeros(device, bp::Shape({2, 3}));
    expect("zeros", z, {2, 3}, {0, 0, 0, 0, 0, 0});
    const bp::Tensor o = bp::ones(device, bp::Shape({3}));
    expect("ones", o, {3}, {1, 1, 1});
    expect("zeros + ones (broadcast)", z + o, {2, 3}, {1, 1, 1, 1, 1, 1});
    const bp::Tensor a = bp::Tensor::from_vector(device, {2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
    const bp::Tensor col = bp::Tensor::from_vector(device, {2, 1}, std::vector<float>{10, 20});
    expect("a + column (broadcast)", a + col, {2, 3}, {11, 12, 13, 24, 25, 26});
    expect("full(2.5) + a", bp::full(device, bp::Shape({2, 3}), 2.5) + a, {2, 3},
           {3.5, 4.5, 5.5, 6.5, 7.5, 8.5});
    expect("contiguous(transpose(a))", bp::contiguous(bp::transpose(a, 0, 1)), {3, 2}, {1, 4, 2, 5, 3, 6});
    expect("cat(a, a + a, axis 1)", bp::cat({a, a + a}, 1), {2, 6}, {1, 2, 3, 2, 4, 6, 4, 5, 6, 8, 10, 12});

    try {
      (void)bp::mul(a, a);
      std::cout << "FAIL mul: expected unsupported_op, it ran\n";
      ++failures;
    } catch (const bp::Error& e) {
      const bool ok = e.code() == bp::Errc::unsupported_op;
      std::cout << (ok ? "ok   " : "FAIL ") << "mul refused: " << bp::to_string(e.code()) << ": " << e.what()
                << '\n';
      if (!ok) ++failures;
    }
  } catch (const bp::Error& e) {
    std::cerr << "plugin_smoke: error: " << bp::to_string(e.code()) << ": " << e.what() << '\n';
    return 1;
  }
  std::cout << (failures == 0 ? "PASS" : "FAILED") << '\n';
  return failures == 0 ? 0 : 1;
}
