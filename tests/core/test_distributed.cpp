// Tests of set_distributed_params: a runtime lookup of the device's
// `collective` capability. Without it (the good_c fixture) the backend's
// collective_fallback decides: a typed error by default, "local" with one
// warning per backend, or "host:<backend>"; with it (the collective_world1 fixture) the tensor is
// registered and shares its data.
#include "test_support.hpp"

#include <functional>
#include <map>
#include <mutex>

using namespace backplane;
using namespace bptest;

namespace {

Device cpu_device(const Registry& r, std::string_view name = "cpu") {
  Backend b = r.backend(name);
  expect_loaded(b);
  return b.device(0);
}

}  // namespace

TEST_CASE("distributed: without collective the default fallback throws capability_missing") {
  Registry r = load(config_json({backend_json("cpu", "good_c")}));
  Device d = cpu_device(r);
  REQUIRE_FALSE(d.capabilities().has(Capability::collective));
  CHECK(r.backend("cpu").collective_fallback().kind == CollectiveFallback::Kind::error);
  Tensor t = Tensor::from_vector<float>(d, {2}, {1, 2});
  Error e = error_from([&] { set_distributed_params(t, DistributedParamId{42}); });
  CHECK(e.code() == Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "cpu");                  // the backend, as configured
  BP_CHECK_CONTAINS(e.message(), "cpu:0");                // the device
  BP_CHECK_CONTAINS(e.message(), "collective");           // the capability
  BP_CHECK_CONTAINS(e.message(), "collective_fallback");  // the remedy
  CHECK_FALSE(is_distributed(t));
  CHECK_FALSE(distributed_params(t).has_value());
}

TEST_CASE("distributed: the error names the backend as configured") {
  Registry r = load(config_json({backend_json("trainer_host", "good_c")}));
  Tensor t = Tensor::from_vector<float>(cpu_device(r, "trainer_host"), {1}, {1});
  Error e = error_from([&] { set_distributed_params(t, DistributedParamId{7}); });
  CHECK(e.code() == Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "trainer_host");
  BP_CHECK_CONTAINS(e.message(), "trainer_host:0");
}

TEST_CASE("distributed: fallback local returns the tensor unregistered and warns once") {
  Registry r = load(config_json({backend_json("cpu", "good_c", false, R"("collective_fallback": "local")")}));
  Device d = cpu_device(r);
  Tensor t = Tensor::from_vector<float>(d, {3}, {1, 2, 3});
  Tensor u = Tensor::from_vector<float>(d, {2}, {4, 5});

  LogCapture logs;
  Tensor t2 = set_distributed_params(t, DistributedParamId{42});
  Tensor u2 = set_distributed_params(u, DistributedParamId{43});
  const std::vector<std::string> warnings = logs.at(LogLevel::warning);
  INFO("log: " << logs.all());
  REQUIRE(warnings.size() == 1);
  BP_CHECK_CONTAINS(warnings[0], "collective");
  BP_CHECK_CONTAINS(warnings[0], "cpu");

  REQUIRE(t2.defined());
  CHECK_FALSE(is_distributed(t2));
  CHECK_FALSE(distributed_params(t2).has_value());
  CHECK(t2.shape() == Shape{3});
  CHECK(t2.device() == d);
  CHECK(t2.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK_FALSE(is_distributed(u2));
  CHECK(u2.to_vector<float>() == std::vector<float>{4, 5});
}

TEST_CASE("distributed: fallback local warns once per backend") {
  Registry r =
      load(config_json({backend_json("cpu_a", "good_c", false, R"("collective_fallback": "local")"),
                        backend_json("cpu_b", "good_c", false, R"("collective_fallback": "local")")}));
  Tensor a = Tensor::from_vector<float>(cpu_device(r, "cpu_a"), {1}, {1});
  Tensor b = Tensor::from_vector<float>(cpu_device(r, "cpu_b"), {1}, {2});
  LogCapture logs;
  for (int i = 0; i < 3; ++i) {
    set_distributed_params(a, DistributedParamId{1});
    set_distributed_params(b, DistributedParamId{2});
  }
  INFO("log: " << logs.all());
  CHECK(logs.at(LogLevel::warning).size() == 2);
  CHECK(logs.at(LogLevel::warning, "cpu_a").size() == 1);
  CHECK(logs.at(LogLevel::warning, "cpu_b").size() == 1);
}

TEST_CASE("distributed: a device with collective registers the parameter") {
  Registry r = load(config_json({backend_json("world", "collective_world1")}));
  Backend b = r.backend("world");
  expect_loaded(b);
  Device d = b.device(0);
  REQUIRE(d.capabilities().has(Capability::collective));
  CHECK(d.capabilities().has(Capability::host_visible));
  CHECK(d.capabilities().has(Capability::f64));
  CHECK(d.attributes().at("world_size_limit") == "1");

  Tensor t = Tensor::from_vector<double>(d, {2, 2}, {1, 2, 3, 4});
  CHECK_FALSE(is_distributed(t));
  Tensor p = set_distributed_params(t, DistributedParamId{42});
  REQUIRE(p.defined());
  CHECK(is_distributed(p));
  REQUIRE(distributed_params(p).has_value());
  CHECK(distributed_params(p)->param_id == DistributedParamId{42});
  CHECK(p.shape() == Shape{2, 2});
  CHECK(p.dtype() == DType::f64);
  CHECK(p.device() == d);
  CHECK(p.to_vector<double>() == std::vector<double>{1, 2, 3, 4});
  // The parameter computes like any tensor.
  CHECK(add(p, p).to_vector<double>() == std::vector<double>{2, 4, 6, 8});
}

TEST_CASE("distributed: registration shares the tensor's data instead of copying it") {
  Registry r = load(config_json({backend_json("world", "collective_world1")}));
  Device d = r.backend("world").device(0);
  Tensor t = Tensor::from_vector<float>(d, {4}, {1, 2, 3, 4});

  // collective_world1 logs every buffer_alloc at debug level.
  LogCapture logs(LogLevel::debug);
  Tensor probe = Tensor::from_vector<float>(d, {1}, {0});
  const std::size_t allocs_for_probe = logs.at(LogLevel::debug, "collective_world1: buffer_alloc").size();
  REQUIRE_MESSAGE(allocs_for_probe == 1, "plugin debug logs do not reach the handler; log: " << logs.all());
  logs.clear();
  Tensor p = set_distributed_params(t, DistributedParamId{42});
  CHECK(logs.at(LogLevel::debug, "collective_world1: buffer_alloc").empty());
  CHECK(is_distributed(p));
  CHECK(p.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("distributed: an undefined tensor throws invalid_argument") {
  Error e = error_from([] { set_distributed_params(Tensor{}, DistributedParamId{42}); });
  CHECK(e.code() == Errc::invalid_argument);
}

// ---- ProcessGroup: single-process paths (multi-process ones are in tests/integration)

TEST_CASE("process group: a device without collective refuses a group by default") {
  Registry r = load(config_json({backend_json("plain", "good_c")}));
  const Error e = error_from([&] {
    ProcessGroup::create(r.backend("plain").device(0), Rendezvous::single_process(std::chrono::seconds(5)));
  });
  CHECK(e.code() == Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "ProcessGroup::create");
  BP_CHECK_CONTAINS(e.message(), "plain:0");
  BP_CHECK_CONTAINS(e.message(), "collective_fallback");
}

TEST_CASE("process group: the local fallback is a world of one that synchronises nothing") {
  Registry r =
      load(config_json({backend_json("plain", "good_c", false, R"("collective_fallback": "local")")}));
  Device d = r.backend("plain").device(0);
  ProcessGroup pg = ProcessGroup::create(d, Rendezvous::single_process(std::chrono::seconds(5)));
  CHECK(pg.is_local());
  CHECK(pg.rank() == 0);
  CHECK(pg.world_size() == 1);
  Tensor t = Tensor::from_vector<float>(d, {3}, {1, 2, 3});
  CHECK(pg.all_reduce(t).to_vector<float>() == std::vector<float>{1, 2, 3});
  pg.all_reduce_(t, ReduceOp::prod);
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(pg.all_gather(t).shape() == Shape{1, 3});
  pg.barrier();
}

TEST_CASE("process group: collectives on a world of one, and their argument checks") {
  Registry r =
      load(config_json({backend_json("world", "collective_world1"), backend_json("plain", "good_c")}));
  Device d = r.backend("world").device(0);
  ProcessGroup pg = ProcessGroup::create(d, Rendezvous::single_process(std::chrono::seconds(5)));
  CHECK_FALSE(pg.is_local());
  CHECK(pg.collective_device() == d);
  Tensor t = Tensor::from_vector<float>(d, {2, 2}, {1, 2, 3, 4});
  CHECK(pg.all_reduce(t, ReduceOp::max).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK(pg.broadcast(t, 0).to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor g = pg.all_gather(t);
  CHECK(g.shape() == Shape{1, 2, 2});
  CHECK(g.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor rs = pg.reduce_scatter(reshape(t, {1, 4}));
  CHECK(rs.shape() == Shape{4});
  pg.barrier();

  CHECK(error_from([&] { pg.broadcast(t, 1); }).code() == Errc::invalid_argument);
  const Error shape = error_from([&] { pg.reduce_scatter(t); });
  CHECK(shape.code() == Errc::shape_mismatch);
  BP_CHECK_CONTAINS(shape.message(), "world_size");
  Tensor elsewhere = Tensor::from_vector<float>(r.backend("plain").device(0), {1}, {1});
  const Error dev = error_from([&] { pg.all_reduce(elsewhere); });
  CHECK(dev.code() == Errc::device_mismatch);
  BP_CHECK_CONTAINS(dev.message(), "plain:0");
  CHECK(error_from([&] { pg.all_reduce(Tensor()); }).code() == Errc::invalid_argument);
  Tensor strided = transpose(t, 0, 1);
  CHECK(error_from([&] { pg.all_reduce_(strided); }).code() == Errc::invalid_argument);
  CHECK(pg.all_reduce(strided).to_vector<float>() == std::vector<float>{1, 3, 2, 4});
  CHECK(error_from([&] { ProcessGroup().barrier(); }).code() == Errc::invalid_argument);
}

TEST_CASE("process group: abort makes every later collective fail promptly with collective_error") {
  Registry r = load(config_json({backend_json("world", "collective_world1")}));
  Device d = r.backend("world").device(0);
  ProcessGroup pg = ProcessGroup::create(d, Rendezvous::single_process(std::chrono::seconds(5)));
  Tensor t = Tensor::from_vector<float>(d, {2}, {1, 2});
  CHECK(pg.all_reduce(t).to_vector<float>() == std::vector<float>{1, 2});
  pg.abort();
  pg.abort();  // idempotent
  for (const auto& call :
       std::vector<std::function<void()>>{[&] { pg.all_reduce(t); }, [&] { pg.all_reduce_(t); },
                                          [&] { pg.broadcast(t, 0); }, [&] { pg.all_gather(t); },
                                          [&] {
                                            pg.reduce_scatter(reshape(t, {1, 2}));
                                          },
                                          [&] { pg.barrier(); }}) {
    const Error e = error_from(call);
    CHECK(e.code() == Errc::collective_error);
    BP_CHECK_CONTAINS(e.message(), "aborted");
  }
  // A local group has nothing to interrupt but refuses later calls the same way.
  Registry lr =
      load(config_json({backend_json("plain", "good_c", false, R"("collective_fallback": "local")")}));
  ProcessGroup local = ProcessGroup::create(lr.backend("plain").device(0), Rendezvous::single_process());
  local.abort();
  CHECK(error_from([&] { local.barrier(); }).code() == Errc::collective_error);
  CHECK(error_from([] { ProcessGroup().abort(); }).code() == Errc::invalid_argument);
}

TEST_CASE("process group: host fallback stages the tensor through the named backend and back") {
  Registry r =
      load(config_json({backend_json("staged", "good_c", false, R"("collective_fallback": "host:world")"),
                        backend_json("world", "collective_world1")}));
  Device d = r.backend("staged").device(0);
  ProcessGroup pg = ProcessGroup::create(d, Rendezvous::single_process(std::chrono::seconds(5)));
  CHECK(pg.device() == d);
  CHECK(pg.collective_device() == r.backend("world").device(0));
  Tensor t = Tensor::from_vector<float>(d, {3}, {1, 2, 3});
  Tensor reduced = pg.all_reduce(t);
  CHECK(reduced.device() == d);
  CHECK(reduced.to_vector<float>() == std::vector<float>{1, 2, 3});
  pg.all_reduce_(t);
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3});
  // Registration follows the same route: the parameter is registered.
  CHECK(is_distributed(set_distributed_params(t, DistributedParamId{9})));
}

TEST_CASE("process group: a host fallback whose backend lacks collective names both") {
  Registry r =
      load(config_json({backend_json("staged", "good_c", false, R"("collective_fallback": "host:other")"),
                        backend_json("other", "good_c")}));
  Device d = r.backend("staged").device(0);
  const Error e =
      error_from([&] { ProcessGroup::create(d, Rendezvous::single_process(std::chrono::seconds(5))); });
  CHECK(e.code() == Errc::capability_missing);
  BP_CHECK_CONTAINS(e.message(), "staged:0");
  BP_CHECK_CONTAINS(e.message(), "other:0");
  BP_CHECK_CONTAINS(e.message(), "host:other");
  const Error reg = error_from(
      [&] { set_distributed_params(Tensor::from_vector<float>(d, {1}, {1}), DistributedParamId{1}); });
  CHECK(reg.code() == Errc::capability_missing);
}

namespace {
// A store in this process, as a host's own store would be (the PyTorch
// bridge's is torch's c10d Store): for Rendezvous::with_store.
class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard lock(mutex_);
    values_[key] = value;
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds) override {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) throw Error(Errc::timeout, "no key " + key);
    return it->second;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    for (const auto& k : keys) get(k, t);
  }
  int64_t add(const std::string&, int64_t) override { throw Error(Errc::internal, "unused"); }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard lock(mutex_);
    for (const auto& k : keys)
      if (!values_.count(k)) return false;
    return true;
  }
  bool remove(const std::string& key) override {
    std::lock_guard lock(mutex_);
    return values_.erase(key) > 0;
  }
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(5); }
  std::string address() const override { return ""; }

 private:
  std::mutex mutex_;
  std::map<std::string, std::vector<uint8_t>> values_;
};
}  // namespace

TEST_CASE("rendezvous: with_store joins through the host's store and checks its arguments") {
  auto store = std::make_shared<MemoryStore>();
  Rendezvous rv = Rendezvous::with_store(0, 1, store, std::chrono::seconds(5));
  CHECK(rv.store() == store);
  CHECK(rv.master_port() == 0);
  CHECK(rv.source() == "the host's store");
  CHECK_FALSE(rv.master_addr().empty());
  CHECK(rv.next_group_prefix() == "pg/0/");
  CHECK(error_from([] { Rendezvous::with_store(0, 1, nullptr); }).code() == Errc::invalid_argument);
  CHECK(error_from([&] { Rendezvous::with_store(2, 2, store); }).code() == Errc::invalid_argument);
  CHECK(error_from([&] { Rendezvous::with_store(0, 1, store, std::chrono::milliseconds(0)); }).code() ==
        Errc::invalid_argument);

  Registry r = load(config_json({backend_json("world", "collective_world1")}));
  Device d = r.backend("world").device(0);
  ProcessGroup pg = ProcessGroup::create(d, rv);
  Tensor t = Tensor::from_vector<float>(d, {2}, {3, 4});
  pg.all_reduce_(t);
  CHECK(t.to_vector<float>() == std::vector<float>{3, 4});
}

TEST_CASE("process group: collectives into caller memory, and their argument checks") {
  Registry r =
      load(config_json({backend_json("world", "collective_world1"), backend_json("plain", "good_c")}));
  Device d = r.backend("world").device(0);
  ProcessGroup pg = ProcessGroup::create(d, Rendezvous::single_process(std::chrono::seconds(5)));
  Tensor t = Tensor::from_vector<float>(d, {2, 2}, {1, 2, 3, 4});
  pg.broadcast_(t, 0);
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor out = Tensor::from_vector<float>(d, {4}, {0, 0, 0, 0});
  pg.all_gather_into(t, out);
  CHECK(out.to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  Tensor block = Tensor::from_vector<float>(d, {2, 2}, {0, 0, 0, 0});
  pg.reduce_scatter_into(t, block, ReduceOp::max);
  CHECK(block.to_vector<float>() == std::vector<float>{1, 2, 3, 4});

  const Error count = error_from([&] {
    Tensor small = Tensor::from_vector<float>(d, {3}, {0, 0, 0});
    pg.all_gather_into(t, small);
  });
  CHECK(count.code() == Errc::shape_mismatch);
  BP_CHECK_CONTAINS(count.message(), "world_size (1) x 4");
  CHECK(error_from([&] {
          Tensor small = Tensor::from_vector<float>(d, {3}, {0, 0, 0});
          pg.reduce_scatter_into(t, small);
        }).code() == Errc::shape_mismatch);
  const Error dtype = error_from([&] {
    Tensor wrong = Tensor::from_vector<double>(d, {4}, {0, 0, 0, 0});
    pg.all_gather_into(t, wrong);
  });
  CHECK(dtype.code() == Errc::dtype_mismatch);
  Tensor strided = transpose(Tensor::from_vector<float>(d, {2, 2}, {1, 2, 3, 4}), 0, 1);
  CHECK(error_from([&] { pg.broadcast_(strided, 0); }).code() == Errc::invalid_argument);
  CHECK(error_from([&] { pg.all_gather_into(t, strided); }).code() == Errc::invalid_argument);
  CHECK(error_from([&] { pg.broadcast_(t, 1); }).code() == Errc::invalid_argument);
  Tensor elsewhere = Tensor::from_vector<float>(r.backend("plain").device(0), {4}, {0, 0, 0, 0});
  CHECK(error_from([&] { pg.all_gather_into(t, elsewhere); }).code() == Errc::device_mismatch);
}

TEST_CASE("process group: into-collectives through a host fallback copy back to the caller's device") {
  Registry r =
      load(config_json({backend_json("staged", "good_c", false, R"("collective_fallback": "host:world")"),
                        backend_json("world", "collective_world1")}));
  Device d = r.backend("staged").device(0);
  ProcessGroup pg = ProcessGroup::create(d, Rendezvous::single_process(std::chrono::seconds(5)));
  Tensor t = Tensor::from_vector<float>(d, {3}, {1, 2, 3});
  Tensor out = Tensor::from_vector<float>(d, {3}, {0, 0, 0});
  pg.all_gather_into(t, out);
  CHECK(out.device() == d);
  CHECK(out.to_vector<float>() == std::vector<float>{1, 2, 3});
  Tensor rs = Tensor::from_vector<float>(d, {3}, {0, 0, 0});
  pg.reduce_scatter_into(t, rs);
  CHECK(rs.to_vector<float>() == std::vector<float>{1, 2, 3});
  pg.broadcast_(t, 0);
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3});
}
