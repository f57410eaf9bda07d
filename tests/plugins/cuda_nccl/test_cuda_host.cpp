// The cuda plugin's host-side logic, on the CPU (no GPU, no CUDA): option
// parsing, index maps, launch geometry, matmul plans, fill bits, data-error
// messages, the NCCL unique-id exchange over the key-value store with a fake
// communicator init, and the collectives' watchdog.
#include <doctest/doctest.h>

#include <atomic>
#include <backplane/plugin/status.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/comm_setup.hpp"
#include "host/layout.hpp"
#include "host/options.hpp"
#include "host/watchdog.hpp"

namespace {

using namespace backplane::cuda;
using backplane::plugin::Failure;
using namespace std::chrono_literals;

// The status a failing call threw, or BP_STATUS_OK.
template <class Fn>
bp_status_code code_of(Fn&& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Failure& f) {
    if (message != nullptr) *message = f.what();
    return f.code();
  }
  return BP_STATUS_OK;
}

TEST_CASE("cuda.host.options: defaults every key and clear refusals") {
  const Options d = parse_options("{}");
  CHECK_FALSE(d.tf32);
  CHECK(d.collective);
  CHECK(d.staging_mib == 16);
  CHECK(d.pool_keep_mib == -1);
  CHECK_FALSE(parse_options("null").tf32);
  const Options o =
      parse_options(R"({"tf32": true, "collective": false, "staging_mib": 0, "pool_keep_mib": 512})");
  CHECK(o.tf32);
  CHECK_FALSE(o.collective);
  CHECK(o.staging_mib == 0);
  CHECK(o.pool_keep_mib == 512);
  std::string m;
  CHECK(code_of([] { parse_options(R"({"tf32": 1})"); }, &m) == BP_STATUS_INVALID_ARGUMENT);
  CHECK(m.find("\"tf32\"") != std::string::npos);
  CHECK(code_of([] { parse_options(R"({"staging_mib": -1})"); }, &m) == BP_STATUS_INVALID_ARGUMENT);
  CHECK(m.find("staging_mib") != std::string::npos);
  CHECK(code_of([] { parse_options(R"({"staging_mib": 4096})"); }) == BP_STATUS_INVALID_ARGUMENT);
  CHECK(code_of([] { parse_options(R"({"tf23": true})"); }, &m) == BP_STATUS_INVALID_ARGUMENT);
  CHECK(m.find("accepted") != std::string::npos);
  CHECK(code_of([] { parse_options("[1]"); }) == BP_STATUS_INVALID_ARGUMENT);
  CHECK(code_of([] { parse_options("{"); }) == BP_STATUS_INVALID_ARGUMENT);
}

// Offsets by the definition: the row-major multi-index dotted with the strides.
std::vector<int64_t> naive_offsets(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  std::vector<int64_t> out;
  for (int64_t linear = 0; linear < n; ++linear) {
    int64_t rest = linear;
    int64_t off = 0;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      off += (rest % shape[d]) * strides[d];
      rest /= shape[d];
    }
    out.push_back(off);
  }
  return out;
}

void check_map(const std::vector<int64_t>& shape, const std::vector<int64_t>& s0,
               const std::vector<int64_t>& s1, int expect_ndim) {
  const int64_t* const strides[2] = {s0.data(), s1.data()};
  const IndexMap<2> m = make_index_map<2>(static_cast<int32_t>(shape.size()), shape.data(), strides);
  CHECK(m.ndim == expect_ndim);
  const auto want0 = naive_offsets(shape, s0);
  const auto want1 = naive_offsets(shape, s1);
  for (size_t i = 0; i < want0.size(); ++i) {
    int64_t off[2];
    map_offsets(m, static_cast<int64_t>(i), off);
    REQUIRE(off[0] == want0[i]);
    REQUIRE(off[1] == want1[i]);
  }
}

TEST_CASE("cuda.host.index_map: strided transposed and broadcast operands map to their elements") {
  check_map({2, 3, 4}, {12, 4, 1}, {12, 4, 1}, 1);  // dense: one dimension
  check_map({2, 3, 4}, {12, 4, 1}, {0, 4, 1}, 2);   // broadcast over the first dim
  check_map({3, 4}, {4, 1}, {1, 3}, 2);             // a transposed input
  check_map({2, 1, 5}, {5, 5, 1}, {0, 0, 0}, 1);    // a scalar broadcast; extent 1 dropped
  check_map({4, 3}, {3, 1}, {-3, 1}, 2);            // negative strides (a flipped view)
  check_map({2, 2, 2, 2, 2, 2, 2, 2}, {128, 64, 32, 16, 8, 4, 2, 1}, {1, 2, 4, 8, 16, 32, 64, 128}, 8);
  check_map({}, {}, {}, 1);  // a 0-d tensor: one element at offset 0
}

TEST_CASE("cuda.host.launch: grid-stride and row geometry") {
  CHECK(launch_1d(0, 132).blocks == 0);
  CHECK(launch_1d(1, 132).blocks == 1);
  CHECK(launch_1d(1, 132).threads == kBlockThreads);
  CHECK(launch_1d(kBlockThreads + 1, 132).blocks == 2);
  CHECK(launch_1d(int64_t{1} << 40, 132).blocks == 132 * 8);  // capped: the kernel loops
  CHECK(launch_1d(1000, 0).blocks >= 1);                      // an unknown SM count still launches
  CHECK(launch_rows(0, 132).blocks == 0);
  CHECK(launch_rows(7, 132).blocks == 7);
  CHECK(launch_rows(int64_t{1} << 30, 132).blocks == 132 * 32);
}

TEST_CASE("cuda.host.gemm: row-major transposed batched and broadcast operands") {
  // [2,3] @ [3,4] -> [2,4], all dense.
  const int64_t a_shape[] = {2, 3}, a_str[] = {3, 1};
  const int64_t b_shape[] = {3, 4}, b_str[] = {4, 1};
  const int64_t c_shape[] = {2, 4}, c_str[] = {4, 1};
  GemmPlan p = plan_gemm({2, a_shape, a_str}, {2, b_shape, b_str}, {2, c_shape, c_str});
  CHECK(p.m == 4);
  CHECK(p.n == 2);
  CHECK(p.k == 3);
  CHECK(p.batch == 1);
  CHECK_FALSE(p.a.transpose);
  CHECK(p.a.ld == 4);
  CHECK_FALSE(p.b.transpose);
  CHECK(p.b.ld == 3);
  CHECK(p.ldc == 4);
  CHECK_FALSE(p.a.needs_copy);
  CHECK_FALSE(p.out_needs_copy);

  // b given transposed (a view of a [4,3] matrix): read in place with op T.
  const int64_t bt_str[] = {1, 3};
  p = plan_gemm({2, a_shape, a_str}, {2, b_shape, bt_str}, {2, c_shape, c_str});
  CHECK(p.a.transpose);
  CHECK(p.a.ld == 3);
  CHECK_FALSE(p.a.needs_copy);

  // A batch of 5 on the left, the right broadcast over it (stride 0).
  const int64_t la_shape[] = {5, 2, 3}, la_str[] = {6, 3, 1};
  const int64_t rb_shape[] = {5, 3, 4}, rb_str[] = {0, 4, 1};
  const int64_t lc_shape[] = {5, 2, 4}, lc_str[] = {8, 4, 1};
  p = plan_gemm({3, la_shape, la_str}, {3, rb_shape, rb_str}, {3, lc_shape, lc_str});
  CHECK(p.batch == 5);
  CHECK(p.b.batch_stride == 6);
  CHECK(p.a.batch_stride == 0);
  CHECK(p.stride_c == 8);

  // Two batch dims that do not collapse to one stride (a broadcast in the
  // middle): that operand is copied dense.
  const int64_t x_shape[] = {2, 3, 2, 3}, x_str[] = {6, 0, 3, 1};
  const int64_t y_shape[] = {2, 3, 3, 4}, y_str[] = {36, 12, 4, 1};
  const int64_t z_shape[] = {2, 3, 2, 4}, z_str[] = {24, 8, 4, 1};
  p = plan_gemm({4, x_shape, x_str}, {4, y_shape, y_str}, {4, z_shape, z_str});
  CHECK(p.batch == 6);
  CHECK(p.b.needs_copy);
  CHECK(p.b.batch_stride == 6);
  CHECK_FALSE(p.a.needs_copy);
  CHECK(p.a.batch_stride == 12);

  // A matrix with no unit stride (every other column) is copied.
  const int64_t s_str[] = {8, 2};
  p = plan_gemm({2, a_shape, s_str}, {2, b_shape, b_str}, {2, c_shape, c_str});
  CHECK(p.b.needs_copy);
  CHECK(p.b.ld == 3);
}

TEST_CASE("cuda.host.scalars: fill bits follow the cast rules") {
  float f = 0;
  const uint64_t fb = scalar_bits(BP_DTYPE_F32, 2.5);
  std::memcpy(&f, &fb, 4);
  CHECK(f == 2.5f);
  CHECK(scalar_bits(BP_DTYPE_I32, -7.9) == static_cast<uint32_t>(-7));
  CHECK(scalar_bits(BP_DTYPE_I32, 1e20) == 0x7fffffffu);  // saturates
  CHECK(scalar_bits(BP_DTYPE_I64, std::nan("")) == 0);
  CHECK(scalar_bits(BP_DTYPE_BOOL, 0.25) == 1);
  CHECK(scalar_bits(BP_DTYPE_U8, 300.0) == 255);
  CHECK(scalar_bits(BP_DTYPE_F16, 1.0) == 0x3c00);
  CHECK(scalar_bits(BP_DTYPE_BF16, 1.0) == 0x3f80);
  CHECK(float_to_half_bits(65504.0f) == 0x7bff);
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);                  // rounds to infinity
  CHECK(float_to_half_bits(5.960464477539063e-08f) == 0x0001);    // the smallest subnormal
  CHECK(float_to_half_bits(2.98023223876953125e-08f) == 0x0000);  // half of it: ties to even (zero)
  CHECK(float_to_half_bits(-2.0f) == 0xc000);
  CHECK((float_to_half_bits(std::nanf("")) & 0x7c00) == 0x7c00);
  CHECK(half_bits_to_float(0x3555) == doctest::Approx(0.333251953125));
  CHECK(float_to_bf16_bits(1.00390625f) == 0x3f80);  // a tie rounds to even
  CHECK(bf16_bits_to_float(0x4049) == doctest::Approx(3.140625));
  for (uint32_t h = 0; h < 0x7c00; h += 7)
    REQUIRE(float_to_half_bits(half_bits_to_float(static_cast<uint16_t>(h))) == h);
}

TEST_CASE("cuda.host.data_errors: messages name the op the value and what to do") {
  const std::string m = describe_data_error(ErrorSlot{kIndexOutOfRange, BP_OP_GATHER, 7, 5});
  CHECK(m.rfind("gather:", 0) == 0);
  CHECK(m.find("index 7") != std::string::npos);
  CHECK(m.find("extent 5") != std::string::npos);
  CHECK(describe_data_error(ErrorSlot{kIntegerDivByZero, BP_OP_DIV, 0, 0}).rfind("div:", 0) == 0);
  CHECK(describe_data_error(ErrorSlot{kNegativeIntegerPower, BP_OP_POW, -2, 0}).find("-2") !=
        std::string::npos);
}

// ---- the unique-id exchange ----------------------------------------------------

// An in-memory bp_kv_store shared by threads (ranks).
struct MemoryStore {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, std::vector<uint8_t>> values;
  bp_kv_store api{};

  MemoryStore() {
    api.struct_size = BP_KV_STORE_STRUCT_SIZE;
    api.ctx = this;
    api.set = [](bp_kv_set_args* a) -> bp_status* {
      auto* s = static_cast<MemoryStore*>(a->ctx);
      {
        std::lock_guard<std::mutex> lock(s->mutex);
        const auto* p = static_cast<const uint8_t*>(a->value);
        s->values[a->key] = std::vector<uint8_t>(p, p + a->size);
      }
      s->cv.notify_all();
      return nullptr;
    };
    api.get = [](bp_kv_get_args* a) -> bp_status* {
      auto* s = static_cast<MemoryStore*>(a->ctx);
      std::unique_lock<std::mutex> lock(s->mutex);
      if (!s->cv.wait_for(lock, std::chrono::milliseconds(a->timeout_ms),
                          [&] { return s->values.count(a->key) > 0; }))
        return backplane::plugin::make_status(BP_STATUS_TIMEOUT, "no such key yet");
      const auto& v = s->values[a->key];
      a->value = static_cast<uint8_t*>(std::malloc(v.size() + 1));
      std::memcpy(a->value, v.data(), v.size());
      a->size = v.size();
      return nullptr;
    };
    api.wait = [](bp_kv_wait_args*) -> bp_status* { return nullptr; };
    api.free_value = [](void*, uint8_t* v) { std::free(v); };
    api.status_code = &backplane::plugin::status_code;
    api.status_message = &backplane::plugin::status_message;
    api.status_free = &backplane::plugin::status_free;
  }
};

// A communicator init that "joins" after `polls` polls, or fails, or never does.
struct FakeInit final : CommInit {
  int polls_to_join = 2;
  bool fail_join = false;
  std::vector<uint8_t> started_with;
  int aborted = 0;
  int polled = 0;
  uint8_t seed = 1;
  std::size_t id_bytes() const override { return 128; }
  std::vector<uint8_t> make_id() override { return std::vector<uint8_t>(128, seed); }
  void start(const std::vector<uint8_t>& id, int32_t, int32_t) override { started_with = id; }
  Progress poll(std::string& error) override {
    ++polled;
    if (fail_join) {
      error = "remote error";
      return Progress::failed;
    }
    return polled >= polls_to_join && polls_to_join >= 0 ? Progress::done : Progress::pending;
  }
  void abort() noexcept override { ++aborted; }
};

TEST_CASE("cuda.host.comm_setup: rank 0 publishes the unique id and every rank joins with it") {
  MemoryStore store;
  constexpr int kRanks = 3;
  FakeInit inits[kRanks];
  inits[0].seed = 42;
  std::vector<std::thread> ranks;
  std::atomic<int> failures{0};
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      try {
        establish_comm(store.api, CommSetup{r, kRanks, 5000, "pg/0/"}, inits[r]);
      } catch (...) {
        ++failures;
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(failures == 0);
  for (int r = 0; r < kRanks; ++r) {
    CHECK(inits[r].started_with == std::vector<uint8_t>(128, 42));
    CHECK(inits[r].aborted == 0);
  }
  CHECK(store.values.count(unique_id_key("pg/0/")) == 1);
}

TEST_CASE("cuda.host.comm_setup: a missing rank 0 a failed join and a hung join fail clearly and abort") {
  MemoryStore store;
  FakeInit lonely;
  std::string m;
  CHECK(code_of(
            [&] {
              establish_comm(store.api, CommSetup{1, 2, 50, "pg/1/"}, lonely);
            },
            &m) == BP_STATUS_TIMEOUT);
  CHECK(m.find("rank 1 of 2") != std::string::npos);
  CHECK(m.find("unique id") != std::string::npos);
  CHECK(lonely.aborted == 1);

  FakeInit failing;
  failing.fail_join = true;
  CHECK(code_of(
            [&] {
              establish_comm(store.api, CommSetup{0, 1, 5000, "pg/2/"}, failing);
            },
            &m) == BP_STATUS_COLLECTIVE);
  CHECK(m.find("remote error") != std::string::npos);
  CHECK(failing.aborted == 1);

  FakeInit hung;
  hung.polls_to_join = -1;  // never joins
  CHECK(code_of(
            [&] {
              establish_comm(store.api, CommSetup{0, 2, 30, "pg/3/"}, hung);
            },
            &m) == BP_STATUS_TIMEOUT);
  CHECK(m.find("did not finish within 30 ms") != std::string::npos);
  CHECK(hung.aborted == 1);

  // An id of the wrong size under the key (another program shares the prefix).
  const std::string key = unique_id_key("pg/4/");
  store.values[key] = std::vector<uint8_t>(16, 0);
  FakeInit confused;
  CHECK(code_of(
            [&] {
              establish_comm(store.api, CommSetup{1, 2, 1000, "pg/4/"}, confused);
            },
            &m) == BP_STATUS_COLLECTIVE);
  CHECK(m.find("16 bytes") != std::string::npos);
}

// ---- the watchdog ----------------------------------------------------------------

struct Failures {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::pair<bp_status_code, std::string>> seen;
  Watchdog::OnFailure sink() {
    return [this](bp_status_code code, const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.emplace_back(code, m);
      cv.notify_all();
    };
  }
  bool wait_for_one() {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, 60s, [&] { return !seen.empty(); });
  }
};

TEST_CASE("cuda.host.watchdog: a collective past its deadline is reported once naming op and rank") {
  Failures failures;
  Watchdog dog(1ms, failures.sink());
  dog.watch("all_reduce on rank 1 of 2 (cuda:0)", Watchdog::Clock::now() + 20ms, 20ms,
            [](std::string&) { return Progress::pending; });
  REQUIRE(failures.wait_for_one());
  std::lock_guard<std::mutex> lock(failures.mutex);
  REQUIRE(failures.seen.size() == 1);
  CHECK(failures.seen[0].first == BP_STATUS_TIMEOUT);
  CHECK(failures.seen[0].second.find("all_reduce on rank 1 of 2") != std::string::npos);
  CHECK(failures.seen[0].second.find("20 ms") != std::string::npos);
  CHECK(dog.failed());
  CHECK(dog.pending() == 0);
}

TEST_CASE("cuda.host.watchdog: finished work is dropped in order - a failed poll is reported as collective") {
  Failures failures;
  Watchdog dog(1ms, failures.sink());
  std::atomic<bool> finish{false};
  const auto far = Watchdog::Clock::now() + 600s;
  dog.watch("broadcast on rank 0 of 2", far, 600000ms,
            [&](std::string&) { return finish.load() ? Progress::done : Progress::pending; });
  dog.watch("all_gather on rank 0 of 2", far, 600000ms, [](std::string&) { return Progress::done; });
  CHECK(dog.pending() >= 1);
  finish = true;
  CHECK(dog.drain(Watchdog::Clock::now() + 60s));
  CHECK_FALSE(dog.failed());
  dog.watch("barrier on rank 0 of 2", far, 600000ms, [](std::string& e) {
    e = "unhandled cuda error";
    return Progress::failed;
  });
  REQUIRE(failures.wait_for_one());
  std::lock_guard<std::mutex> lock(failures.mutex);
  CHECK(failures.seen[0].first == BP_STATUS_COLLECTIVE);
  CHECK(failures.seen[0].second.find("barrier on rank 0 of 2 failed: unhandled cuda error") !=
        std::string::npos);
}

}  // namespace
