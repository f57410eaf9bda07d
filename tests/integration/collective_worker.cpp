// One rank of the multi-process collective tests. Started by
// `backplane launch`, by mpirun, or directly by test_multiprocess.cpp with
// RANK/WORLD_SIZE/MASTER_* set; joins the job through Rendezvous::from_env().
//
//   collective_worker --config FILE [--backend NAME] --mode MODE [--large [--large-elements N]]
//
// Modes:
//   all      every collective, every reduce op, f32/f64/i64, sizes from 0
//            elements up (64 MiB f32 with --large, or --large-elements N);
//            exits 0 when every value matches the reference computed locally.
//   die      all_reduce (of --elements f32, default 1024) in a loop; the
//            rank named by --die-rank kills itself
//            (SIGKILL) after the first round. Survivors must fail with
//            Errc::timeout or Errc::collective_error within the timeout:
//            exits 0 and prints the error then, 3 if no error came. With
//            --late-rank R --late-ms N, rank R waits N ms before its next
//            round (so the others may have failed and exited by then).
//   staged   like a short `all` on a backend whose collectives go through
//            a host:<backend> fallback; checks the staging device.
// Every failure prints "rank R: FAIL ..." and exits 1.
#include <backplane/backplane.hpp>

#include "worker_support.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace backplane;
using worker::fail;
using worker::g_rank;

namespace {

// Small integers, exact in every dtype and under every reduce op for the
// world sizes tested (products stay far below 2^24).
double value_for(int rank, int64_t i) { return static_cast<double>(((i + rank) % 3) + 1); }

double reduce_ref(ReduceOp op, int world, int64_t i, bool integer) {
  double acc = value_for(0, i);
  for (int r = 1; r < world; ++r) {
    const double v = value_for(r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::mean) {
    acc /= world;
    if (integer) acc = static_cast<double>(static_cast<int64_t>(acc));  // truncation toward zero
  }
  return acc;
}

template <class T>
Tensor make(const Device& d, const Shape& shape, int rank, int64_t offset = 0) {
  std::vector<T> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<T>(value_for(rank, static_cast<int64_t>(i) + offset));
  return Tensor::from_vector<T>(d, shape, v);
}

template <class T>
void expect_values(const Tensor& t, const Shape& shape, const std::string& what,
                   const std::function<double(int64_t)>& ref) {
  if (!(t.shape() == shape))
    fail(what + ": shape " + t.shape().to_string() + ", expected " + shape.to_string());
  const std::vector<T> got = t.to_vector<T>();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double want = ref(static_cast<int64_t>(i));
    const double g = static_cast<double>(got[i]);
    const double tol = std::is_integral_v<T> ? 0.0 : 1e-6 * std::max(1.0, std::abs(want));
    if (std::abs(g - want) > tol) {
      std::ostringstream s;
      s << what << ": element " << i << " is " << g << ", expected " << want;
      fail(s.str());
    }
  }
}

template <class T>
int run_dtype(ProcessGroup& pg, const Device& d, const std::vector<Shape>& shapes) {
  const int rank = pg.rank();
  const int world = pg.world_size();
  const bool integer = std::is_integral_v<T>;
  const std::string dt(to_string(dtype_of_v<T>));
  int checks = 0;
  for (const Shape& shape : shapes) {
    const std::string sz = dt + " " + shape.to_string();
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::min, ReduceOp::max, ReduceOp::prod}) {
      const std::string what = std::string("all_reduce(") + to_string(op) + ") " + sz;
      Tensor x = make<T>(d, shape, rank);
      Tensor r = pg.all_reduce(x, op);
      expect_values<T>(r, shape, what, [&](int64_t i) { return reduce_ref(op, world, i, integer); });
      // The input is untouched.
      expect_values<T>(x, shape, what + " (input)", [&](int64_t i) { return value_for(rank, i); });
      ++checks;
      pg.all_reduce_(x, op);
      expect_values<T>(x, shape, "in-place " + what,
                       [&](int64_t i) { return reduce_ref(op, world, i, integer); });
      ++checks;
    }
    for (int root = 0; root < world; ++root) {
      Tensor b = pg.broadcast(make<T>(d, shape, rank), root);
      expect_values<T>(b, shape, "broadcast(root " + std::to_string(root) + ") " + sz,
                       [&](int64_t i) { return value_for(root, i); });
      Tensor own = make<T>(d, shape, rank);
      pg.broadcast_(own, root);
      expect_values<T>(own, shape, "broadcast_(root " + std::to_string(root) + ") " + sz,
                       [&](int64_t i) { return value_for(root, i); });
      checks += 2;
    }
    {
      // Into caller memory: flat outputs, any shape of the right count.
      const int64_t n = shape.numel();
      Tensor gathered = Tensor::empty(d, Shape{world * n}, dtype_of_v<T>);
      pg.all_gather_into(make<T>(d, shape, rank), gathered);
      expect_values<T>(gathered, Shape{world * n}, "all_gather_into " + sz, [&](int64_t i) {
        return value_for(static_cast<int>(n == 0 ? 0 : i / n), n == 0 ? 0 : i % n);
      });
      Tensor block = Tensor::empty(d, Shape{n}, dtype_of_v<T>);
      pg.reduce_scatter_into(make<T>(d, Shape{world * n}, rank), block, ReduceOp::sum);
      expect_values<T>(block, Shape{n}, "reduce_scatter_into(sum) " + sz, [&](int64_t i) {
        return reduce_ref(ReduceOp::sum, world, static_cast<int64_t>(rank) * n + i, integer);
      });
      checks += 2;
    }
    if (shape.rank() < Shape::kMaxRank) {
      std::vector<int64_t> gdims{world};
      for (int i = 0; i < shape.rank(); ++i) gdims.push_back(shape[i]);
      const int64_t n = shape.numel();
      Tensor g = pg.all_gather(make<T>(d, shape, rank));
      expect_values<T>(g, Shape(gdims), "all_gather " + sz, [&](int64_t i) {
        return value_for(static_cast<int>(n == 0 ? 0 : i / n), n == 0 ? 0 : i % n);
      });
      ++checks;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::mean}) {
        // Block r of every rank's input holds value_for(rank, offset + i) with offset r*n.
        Tensor in = make<T>(d, Shape(gdims), rank);
        Tensor rs = pg.reduce_scatter(in, op);
        expect_values<T>(
            rs, shape, std::string("reduce_scatter(") + to_string(op) + ") " + sz,
            [&](int64_t i) { return reduce_ref(op, world, static_cast<int64_t>(rank) * n + i, integer); });
        ++checks;
      }
    }
  }
  return checks;
}

// `large` elements (0: none) join the small shapes as one more.
std::vector<Shape> test_shapes(int64_t large) {
  std::vector<Shape> s{Shape{0}, Shape{}, Shape{1}, Shape{7}, Shape{3, 5}, Shape{1024}, Shape{257, 129}};
  if (large > 0) s.push_back(Shape{large});
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string config = worker::arg(argc, argv, "--config");
  const std::string backend = worker::arg(argc, argv, "--backend", "cpu");
  const std::string mode = worker::arg(argc, argv, "--mode", "all");
  if (config.empty()) {
    std::cerr << "usage: collective_worker --config FILE [--backend NAME] --mode all|die|staged [--large "
                 "[--large-elements N]]\n";
    return 64;
  }
  try {
    Rendezvous rdzv = Rendezvous::from_env();
    g_rank = rdzv.rank();
    Registry registry = Registry::from_config(config);
    Device device = registry.backend(backend).device(0);
    ProcessGroup pg = ProcessGroup::create(device, rdzv);
    // Where the job met, for the tests that check what the launcher's
    // variables made of it (the Slurm test).
    if (rdzv.rank() == 0)
      std::cout << "rank 0: rendezvous from " << rdzv.source() << ", store at " << rdzv.master_addr() << ":"
                << rdzv.master_port() << std::endl;
    if (pg.rank() != rdzv.rank() || pg.world_size() != rdzv.world_size())
      fail("the group says rank " + std::to_string(pg.rank()) + " of " + std::to_string(pg.world_size()));

    if (mode == "all" || mode == "staged") {
      if (mode == "staged" && pg.collective_device() == device) fail("expected a staged group");
      // 16 Mi f32 elements (64 MiB) by default; the ThreadSanitizer build
      // passes fewer, since instrumented reductions of 64 MiB take minutes.
      const int64_t large = worker::has_flag(argc, argv, "--large")
                                ? std::stoll(worker::arg(argc, argv, "--large-elements", "16777216"))
                                : 0;
      int checks = run_dtype<float>(pg, device, test_shapes(large));
      if (mode == "all") {
        checks += run_dtype<double>(pg, device, test_shapes(0));
        checks += run_dtype<int64_t>(pg, device, test_shapes(0));
      }
      pg.barrier();
      std::cout << "rank " << pg.rank() << " of " << pg.world_size() << ": " << checks << " checks passed on "
                << pg.collective_device().id() << std::endl;
      return 0;
    }
    if (mode == "die") {
      const int die_rank = std::stoi(worker::arg(argc, argv, "--die-rank", "1"));
      const int late_rank = std::stoi(worker::arg(argc, argv, "--late-rank", "-1"));
      const int late_ms = std::stoi(worker::arg(argc, argv, "--late-ms", "0"));
      const int64_t elements = std::stoll(worker::arg(argc, argv, "--elements", "1024"));
      Tensor x = make<float>(device, Shape{elements}, pg.rank());
      for (int round = 0; round < 1000; ++round) {
        try {
          x = pg.all_reduce(x, ReduceOp::max);
        } catch (const Error& e) {
          std::cout << "rank " << pg.rank() << ": caught " << to_string(e.code()) << " in round " << round
                    << ": " << e.message() << std::endl;
          const bool expected = e.code() == Errc::timeout || e.code() == Errc::collective_error;
          return expected ? 0 : 4;
        }
        if (round == 0) {
          pg.barrier();
          if (pg.rank() == die_rank) {
            std::cout << "rank " << pg.rank() << ": dying now" << std::endl;
            std::raise(SIGKILL);
          }
          if (pg.rank() == late_rank) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
        }
      }
      std::cout << "rank " << pg.rank() << ": no error after 1000 rounds" << std::endl;
      return 3;
    }
    fail("unknown --mode " + mode);
  } catch (const Error& e) {
    fail(std::string(to_string(e.code())) + ": " + e.message());
  }
}
