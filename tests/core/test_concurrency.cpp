// The documented thread-safety contracts, exercised for ThreadSanitizer: a
// registry and its devices shared by many threads, ops and transfers running
// concurrently, and the log sink swapped while plugins and the core log.
#include "test_support.hpp"

#include <backplane/backplane.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <thread>

namespace bp = backplane;

TEST_CASE("concurrency: threads share a registry and run ops on one device") {
  bp::Registry reg = bptest::load(bptest::config_json({bptest::backend_json("cpu", "backplane_cpu", true),
                                                       bptest::backend_json("fx", "opaque", true)}),
                                  bp::RequiredPolicy::throw_on_failure);
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        // Each thread looks the device up itself: lookups are const and shared.
        const bp::Device cpu = reg.backend("cpu").device(0);
        const bp::Device opaque = reg.backend("fx").device(0);
        for (int i = 0; i < kRounds; ++i) {
          const float v = static_cast<float>(t * 1000 + i);
          bp::Tensor a = bp::Tensor::from_vector(cpu, {2, 2}, std::vector<float>{v, v, v, v});
          bp::Tensor b = bp::Tensor::from_vector(cpu, {2}, std::vector<float>{1, 2});
          bp::Tensor c = bp::matmul(a + b, a);  // rows [v+1, v+2] times a
          const float want = (v + 1) * v + (v + 2) * v;
          const auto got = c.to_vector<float>();
          if (got[0] != want || got[3] != want) ++wrong;
          bp::Tensor x = bp::Tensor::from_vector(opaque, {3}, std::vector<float>{v, 1, 2});
          if ((x + x).to_vector<float>() != std::vector<float>{2 * v, 2, 4}) ++wrong;
          if (!cpu.supports(backplane::Op::add, bp::DType::f32) ||
              cpu.supports(backplane::Op::matmul, bp::DType::i32))
            ++wrong;
        }
      } catch (...) {
        ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("concurrency: the log handler can be swapped while threads log") {
  std::atomic<int> seen{0};
  std::atomic<bool> stop{false};
  bp::set_log_handler([&](bp::LogLevel, std::string_view) { ++seen; });  // counted from the first message
  std::thread swapper([&] {
    while (!stop.load()) {
      bp::set_log_handler([&](bp::LogLevel, std::string_view) { ++seen; });
      bp::set_log_handler([&](bp::LogLevel, std::string_view) { ++seen; });
    }
  });
  std::vector<std::thread> loggers;
  for (int t = 0; t < 3; ++t) {
    loggers.emplace_back([] {
      for (int i = 0; i < 2000; ++i) bp::log(bp::LogLevel::warning, "concurrent message");
    });
  }
  for (auto& th : loggers) th.join();
  stop = true;
  swapper.join();
  bp::set_log_handler(nullptr);
  CHECK(seen.load() == 3 * 2000);
}

TEST_CASE("concurrency: large buffers are recycled correctly across threads and sizes") {
  // Blocks of 1 MiB and more go through the cpu plugin's block cache (reused
  // by size, evicted beyond 1 GiB): values must never leak between tensors.
  bp::Registry reg = bptest::load(bptest::config_json({bptest::backend_json("cpu", "backplane_cpu", true)}),
                                  bp::RequiredPolicy::throw_on_failure);
  const bp::Device cpu = reg.backend("cpu").device(0);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < 40; ++i) {
          // 40 distinct sizes of 4..12 MiB per thread, so the cache fills and evicts.
          const int64_t n = (int64_t{1} << 20) + (i * 2 + t) * 49157;
          const int32_t v = t * 100 + i;
          bp::Tensor a = bp::full(cpu, {n}, v, bp::DType::i32);
          bp::Tensor b = bp::ones(cpu, {n}, bp::DType::i32);
          bp::Tensor c = a + b;  // a fresh output, often a recycled block
          if (bp::sum(c).to_vector<int32_t>()[0] != static_cast<int32_t>(n * (v + 1))) ++wrong;
          if (bp::max(c).to_vector<int32_t>()[0] != v + 1 || bp::min(c).to_vector<int32_t>()[0] != v + 1)
            ++wrong;
        }
      } catch (...) {
        ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("concurrency: tensors made on one thread and freed on another keep their values") {
  // The core keeps freed tensor blocks in a list per thread: a block freed on
  // another thread joins that thread's list, and is handed out again there
  // (or freed when that thread ends). Values must never leak between tensors.
  bp::Registry reg = bptest::load(bptest::config_json({bptest::backend_json("cpu", "backplane_cpu", true)}),
                                  bp::RequiredPolicy::throw_on_failure);
  const bp::Device cpu = reg.backend("cpu").device(0);
  std::atomic<int> wrong{0};
  for (int round = 0; round < 3; ++round) {
    std::vector<bp::Tensor> made;
    std::thread maker([&] {
      for (int i = 0; i < 600; ++i) made.push_back(bp::full(cpu, {4}, static_cast<float>(round * 1000 + i)));
    });
    maker.join();  // its list is gone; the tensors live on
    std::thread user([&] {
      for (int i = 0; i < 600; ++i) {
        const bp::Tensor t = made[static_cast<std::size_t>(i)] + bp::zeros(cpu, {4});
        if (t.to_vector<float>() != std::vector<float>(4, static_cast<float>(round * 1000 + i))) ++wrong;
      }
      made.clear();  // freed here: this thread's list takes up to its bound, the rest is freed
      for (int i = 0; i < 600; ++i) {
        const bp::Tensor t = bp::full(cpu, {4}, static_cast<float>(-i)) * bp::ones(cpu, {4});
        if (t.to_vector<float>() != std::vector<float>(4, static_cast<float>(-i))) ++wrong;
      }
    });
    user.join();
  }
  CHECK(wrong.load() == 0);
}
