// Tracing (include/backplane/trace.hpp): what a session writes (ops with
// device, dtype and shapes; copies charged to the op that needed them;
// ranges around what they contain), per-thread order and nesting, the event
// cap, a killed process's part, and the merge.
#include "test_support.hpp"
#include "trace/trace_format.hpp"

#include <backplane/backplane.hpp>
#include <backplane/trace.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace bp = backplane;
namespace fs = std::filesystem;
using namespace bptest;
using nlohmann::json;

namespace {

std::string cpu_library() { return json_path(plugin_dir() / "libbackplane_cpu.so"); }

bp::Registry trace_registry() {
  const std::string text = R"({"schema_version": 1, "backends": [
    {"name": "cpu", "library": )" +
                           cpu_library() +
                           R"(, "options": {"threads": 1}},
    {"name": "opaque", "library": )" +
                           json_path(fixture("opaque")) + R"(, "op_fallback": "host:cpu"}]})";
  return bp::Registry::from_json(text, fixture_dir(), "trace test");
}

// A fresh folder for one test's trace files.
fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("bp_trace_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in);
  return json::parse(in);
}

std::vector<json> events(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == ph) out.push_back(e);
  return out;
}

}  // namespace

TEST_CASE(
    "trace: an event record's varints give back every field, extremes included, and a record cut short or "
    "with bytes left over is refused") {
  namespace d = bp::trace::detail;
  constexpr int64_t lo = std::numeric_limits<int64_t>::min();
  constexpr int64_t hi = std::numeric_limits<int64_t>::max();
  d::EventFields e;
  e.t0 = hi - 5;
  e.t1 = hi;
  e.bytes = hi;
  e.count = lo;
  e.count_key = 0xffffffffu;
  e.flow = std::numeric_limits<uint64_t>::max();
  e.tid = 4194304;
  e.cat = 65537;
  e.name = 0xfffffffeu;
  e.device = 3;
  e.peer = 7;
  e.text_key = 65600;
  e.text = 1;
  e.dtype = BP_DTYPE_BF16;
  e.kind = 0;
  e.nshapes = 4;
  e.shapes_cut = true;
  const uint8_t ndim[4] = {0, 1, 7, 8};
  int64_t dims[16];
  for (int i = 0; i < 16; ++i) dims[i] = i % 2 == 0 ? hi - i : lo + i;
  unsigned char buf[d::kMaxEventPayload];
  const int64_t prev = lo + 3;  // the chained time difference overflows both ways
  const std::size_t n = d::encode_event(buf, e, ndim, dims, prev);
  REQUIRE(n <= d::kMaxEventPayload);
  const std::string payload(reinterpret_cast<const char*>(buf), n);
  d::EventFields g;
  uint8_t gndim[4] = {};
  int64_t gdims[16] = {};
  REQUIRE(d::decode_event(payload, prev, g, gndim, gdims));
  CHECK(g.t0 == e.t0);
  CHECK(g.t1 == e.t1);
  CHECK(g.bytes == e.bytes);
  CHECK(g.count == e.count);
  CHECK(g.count_key == e.count_key);
  CHECK(g.flow == e.flow);
  CHECK(g.tid == e.tid);
  CHECK(g.cat == e.cat);
  CHECK(g.name == e.name);
  CHECK(g.device == e.device);
  CHECK(g.peer == e.peer);
  CHECK(g.text_key == e.text_key);
  CHECK(g.text == e.text);
  CHECK(g.dtype == e.dtype);
  CHECK(g.kind == e.kind);
  CHECK(g.nshapes == 4);
  CHECK(g.shapes_cut);
  CHECK(std::memcmp(gndim, ndim, sizeof ndim) == 0);
  CHECK(std::memcmp(gdims, dims, sizeof dims) == 0);
  for (std::size_t cut = 0; cut < n; ++cut) {
    CAPTURE(cut);
    CHECK_FALSE(d::decode_event(payload.substr(0, cut), prev, g, gndim, gdims));
  }
  CHECK_FALSE(d::decode_event(payload + '\0', prev, g, gndim, gdims));

  // The chained difference overflowing the other way.
  e.t0 = lo + 5;
  e.t1 = lo + 9;
  const std::size_t back = d::encode_event(buf, e, ndim, dims, hi - 3);
  REQUIRE(d::decode_event(std::string(reinterpret_cast<const char*>(buf), back), hi - 3, g, gndim, gdims));
  CHECK(g.t0 == lo + 5);
  CHECK(g.t1 == lo + 9);

  // Hostile records: a varint of 11 bytes, more than 4 shapes, dims counts past 16.
  const auto bytes = [](std::initializer_list<int> v) {
    std::string r;
    for (const int b : v) r += static_cast<char>(b);
    return r;
  };
  std::string long_varint = bytes({0, 1});  // flags, an instant with no shapes
  long_varint.append(10, static_cast<char>(0x80));
  long_varint += '\x01';
  CHECK_FALSE(d::decode_event(long_varint, 0, g, gndim, gdims));
  CHECK_FALSE(d::decode_event(bytes({0, (5 << 2) | 1, 0, 0, 0, 0, 0}), 0, g, gndim, gdims));
  CHECK_FALSE(d::decode_event(bytes({0, 4 << 2, 0, 0, 0, 0, 0, 0, 5, 5, 5, 5}), 0, g, gndim, gdims));

  // An instant with nothing optional: no duration, -1 and 0 for what is absent.
  d::EventFields i;
  i.t0 = 1000;
  i.kind = 1;
  const std::size_t m = d::encode_event(buf, i, nullptr, nullptr, 990);
  CHECK(m <= 8);
  REQUIRE(d::decode_event(std::string(reinterpret_cast<const char*>(buf), m), 990, g, gndim, gdims));
  CHECK(g.t0 == 1000);
  CHECK(g.t1 == 1000);
  CHECK(g.bytes == -1);
  CHECK(g.count == -1);
  CHECK(g.count_key == 0);
  CHECK(g.dtype == -1);
  CHECK(g.nshapes == 0);
  CHECK_FALSE(g.shapes_cut);
}

TEST_CASE("trace: a part another version wrote is refused, naming both versions") {
  const fs::path dir = fs::temp_directory_path() / ("bp_trace_v2_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path part = dir / "old.json.rank0.part";
  std::ofstream(part, std::ios::binary) << "backplane trace part 2\n" << std::string(16, '\0');
  try {
    bp::trace::merge({part.string()}, (dir / "out.json").string());
    FAIL("merged a part of another version");
  } catch (const bp::Error& e) {
    CHECK(e.code() == bp::Errc::invalid_argument);
    CHECK_MESSAGE(std::string(e.what()).find("another version (\"backplane trace part 2\", this build reads "
                                             "\"backplane trace part 3\")") != std::string::npos,
                  e.what());
  }
  fs::remove_all(dir);
}

TEST_CASE("trace: ops are recorded with device, dtype and shapes, in order per thread, inside their ranges") {
  const bp::Registry r = trace_registry();
  const bp::Device d = r.backend("cpu").device();
  const fs::path dir = scratch("ops");
  const fs::path file = dir / "t.json";
  {
    bp::trace::Session session({file.string()});
    CHECK(bp::trace::active());
    auto work = [&] {
      const bp::trace::Range outer("outer");
      const bp::Tensor a = bp::Tensor::from_vector<float>(d, {2, 3}, {1, 2, 3, 4, 5, 6});
      const bp::Tensor b = bp::Tensor::from_vector<float>(d, {3, 2}, {1, 0, 0, 1, 1, 1});
      for (int i = 0; i < 50; ++i) {
        const bp::trace::Range inner("inner");
        (void)bp::matmul(a, b);
      }
    };
    std::thread other(work);
    work();
    other.join();
  }
  CHECK_FALSE(bp::trace::active());
  CHECK(fs::exists(file));
  CHECK(bp::trace::parts_of(file.string()).empty());  // merged and removed
  const json t = read_json(file);
  std::map<int64_t, std::vector<json>> by_thread;
  for (const json& e : events(t, "X")) by_thread[e["tid"].get<int64_t>()].push_back(e);
  REQUIRE(by_thread.size() == 2);
  for (auto& [tid, evs] : by_thread) {
    std::vector<json> matmuls, inners, outers;
    for (const json& e : evs) {
      if (e["name"] == "matmul") matmuls.push_back(e);
      if (e["name"] == "inner") inners.push_back(e);
      if (e["name"] == "outer") outers.push_back(e);
    }
    REQUIRE(matmuls.size() == 50);
    REQUIRE(inners.size() == 50);
    REQUIRE(outers.size() == 1);
    const json& m0 = matmuls[0];
    CHECK(m0["cat"] == "op");
    CHECK(m0["args"]["device"] == "cpu:0");
    CHECK(m0["args"]["dtype"] == "f32");
    CHECK(m0["args"]["shapes"] == json::array({{2, 3}, {3, 2}, {2, 2}}));
    const double o0 = outers[0]["ts"], o1 = o0 + outers[0]["dur"].get<double>();
    for (std::size_t i = 0; i < 50; ++i) {
      // Each matmul lies inside its own inner range, and inner ranges follow one another.
      const double i0 = inners[i]["ts"], i1 = i0 + inners[i]["dur"].get<double>();
      const double m_0 = matmuls[i]["ts"], m_1 = m_0 + matmuls[i]["dur"].get<double>();
      CHECK(m_0 >= i0);
      CHECK(m_1 <= i1 + 0.001);
      CHECK(i0 >= o0);
      CHECK(i1 <= o1 + 0.001);
      if (i > 0) CHECK(i0 >= inners[i - 1]["ts"].get<double>() + inners[i - 1]["dur"].get<double>() - 0.001);
    }
  }
  // Metadata: a name for each thread and for the process ("rank 0 · cpu:0").
  bool named = false;
  for (const json& m : events(t, "M"))
    if (m["name"] == "process_name") named = m["args"]["name"].get<std::string>().rfind("rank 0", 0) == 0;
  CHECK(named);
  const json& rank = t["otherData"]["backplane_trace"]["ranks"][0];
  CHECK(rank["complete"] == true);
  CHECK(rank["dropped"] == 0);
  fs::remove_all(dir);
}

TEST_CASE("trace: a copy is charged to the op that needed the bytes, not the one that made them") {
  const bp::Registry r = trace_registry();
  const bp::Device op = r.backend("opaque").device();
  const fs::path dir = scratch("copies");
  const fs::path file = dir / "t.json";
  {
    bp::trace::Session session({file.string()});
    const bp::Tensor x = bp::Tensor::from_vector<float>(op, {4}, {1, 2, 3, 4});  // 16 bytes on opaque:0
    const bp::Tensor y = bp::exp(bp::neg(x));  // opaque lacks both: x goes to cpu for neg
    (void)bp::add(y, x);                       // opaque runs add: y comes back, for add
  }
  const json t = read_json(file);
  std::vector<json> copies, fallbacks;
  for (const json& e : events(t, "X")) {
    if (e["cat"] == "copy") copies.push_back(e);
    if (e["cat"] == "fallback") fallbacks.push_back(e);
  }
  REQUIRE(copies.size() == 2);
  CHECK(copies[0]["args"]["device"] == "opaque:0");
  CHECK(copies[0]["args"]["to"] == "cpu:0");
  CHECK(copies[0]["args"]["needed_by"] == "neg");
  CHECK(copies[0]["args"]["bytes"] == 16);
  CHECK(copies[1]["args"]["device"] == "cpu:0");
  CHECK(copies[1]["args"]["to"] == "opaque:0");
  CHECK(copies[1]["args"]["needed_by"] == "add");
  // neg and exp ran on cpu:0 for opaque:0.
  REQUIRE(fallbacks.size() == 2);
  CHECK(fallbacks[0]["name"] == "neg");
  CHECK(fallbacks[0]["args"]["device"] == "cpu:0");
  CHECK(fallbacks[0]["args"]["for"] == "opaque:0");
  CHECK(fallbacks[1]["name"] == "exp");
  fs::remove_all(dir);
}

TEST_CASE("trace: max_events keeps the first events and counts the rest") {
  const bp::Registry r = trace_registry();
  const bp::Device d = r.backend("cpu").device();
  const fs::path dir = scratch("cap");
  const fs::path file = dir / "t.json";
  {
    bp::trace::Session session({file.string(), 10});
    const bp::Tensor a = bp::Tensor::from_vector<float>(d, {4}, {1, 2, 3, 4});
    for (int i = 0; i < 100; ++i) (void)bp::neg(a);
  }
  const json t = read_json(file);
  CHECK(events(t, "X").size() == 10);
  const json& rank = t["otherData"]["backplane_trace"]["ranks"][0];
  CHECK(rank["dropped"].get<uint64_t>() >= 100 - 10);  // 100 negs, and whatever from_vector ran
  fs::remove_all(dir);
}

TEST_CASE("trace: a long recording on several threads keeps every event in order as its chunks are reused") {
  // More events than the chunks made at the start hold (32768), on two
  // threads, with a pause halfway through in which the writer writes the
  // first half and hands its chunks back to their threads (up to 64 each; it
  // frees the rest): the second half fills chunks written once already, and
  // chunks made along the way.
  const fs::path dir = scratch("reuse");
  const fs::path file = dir / "t.json";
  constexpr int kThreads = 2;
  constexpr int64_t kEach = 70000;
  {
    bp::trace::Session session({file.string()});
    auto half = [](int64_t from, int64_t to) {
      for (int64_t i = from; i < to; ++i) {
        bp::trace::Event e;
        e.category = "test";
        e.name = "tick";
        e.start_ns = bp::trace::now_ns();
        e.end_ns = e.start_ns + 1;
        e.number_key = "i";
        e.number = i;
        bp::trace::record(e);
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        half(0, kEach / 2);
        std::this_thread::sleep_for(
            std::chrono::milliseconds(300));  // the writer's 100 ms tick, on an idle core
        half(kEach / 2, kEach);
      });
    for (std::thread& t : threads) t.join();
  }
  const json t = read_json(file);
  std::map<int64_t, std::vector<int64_t>> by_thread;
  for (const json& e : events(t, "X"))
    if (e["name"] == "tick") by_thread[e["tid"].get<int64_t>()].push_back(e["args"]["i"].get<int64_t>());
  REQUIRE(by_thread.size() == kThreads);
  for (const auto& [tid, seen] : by_thread) {
    INFO("thread " << tid);
    REQUIRE(seen.size() == static_cast<std::size_t>(kEach));
    int64_t wrong = -1;
    for (int64_t i = 0; i < kEach && wrong < 0; ++i)
      if (seen[static_cast<std::size_t>(i)] != i) wrong = i;
    CHECK(wrong == -1);
  }
  const json& rank = t["otherData"]["backplane_trace"]["ranks"][0];
  CHECK(rank["dropped"] == 0);
  CHECK(rank["complete"] == true);
  fs::remove_all(dir);
}

TEST_CASE("trace: one session at a time, and none unless asked") {
  const bp::Registry r = trace_registry();
  const fs::path dir = scratch("one");
  {
    bp::trace::Session session({(dir / "a.json").string()});
    try {
      bp::trace::Session second({(dir / "b.json").string()});
      FAIL("a second session started");
    } catch (const bp::Error& e) {
      CHECK(e.code() == bp::Errc::invalid_argument);
      CHECK(std::string(e.what()).find("already records into") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(bp::trace::Session({(dir / "c.json").string(), 0}), bp::Error);
  // Without a session, ops record nothing and no file appears.
  const bp::Tensor a = bp::Tensor::from_vector<float>(r.backend("cpu").device(), {2}, {1, 2});
  (void)bp::neg(a);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  CHECK(files == std::vector<std::string>{"a.json"});
  fs::remove_all(dir);
}

TEST_CASE("trace: a part file that is a symbolic link is refused, naming it") {
  const fs::path dir = scratch("link");
  const fs::path file = dir / "t.json";
  fs::create_symlink(dir / "elsewhere", fs::path(file.string() + ".rank0.part"));
  try {
    bp::trace::Session session({file.string()});
    FAIL("the session followed a link");
  } catch (const bp::Error& e) {
    CHECK(e.code() == bp::Errc::io_error);
    CHECK(std::string(e.what()).find("symbolic link") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir / "elsewhere"));
  fs::remove_all(dir);
}

TEST_CASE("trace: a process killed while recording leaves a part that merges, marked incomplete") {
  const fs::path dir = scratch("killed");
  const fs::path file = dir / "t.json";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      const bp::Registry r = trace_registry();
      const bp::Device d = r.backend("cpu").device();
      static bp::trace::Session* session = new bp::trace::Session({file.string()});  // never stopped
      (void)session;
      const bp::Tensor a = bp::Tensor::from_vector<float>(d, {4}, {1, 2, 3, 4});
      for (int i = 0; i < 20; ++i) (void)bp::neg(a);
      // The writer flushes every 100 ms, when the cores have time for it (it
      // runs at SCHED_IDLE): wait until the part holds the ops, then die.
      const std::string part = file.string() + ".rank0.part";
      const std::string peek = (dir / "peek.json").string();
      for (int waited = 0; waited < 30'000; waited += 10) {
        try {
          if (bp::trace::merge({part}, peek).events >= 20) break;
        } catch (const bp::Error&) {  // no metadata written yet
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::kill(::getpid(), SIGKILL);
    } catch (...) {
    }
    ::_exit(3);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  const std::vector<std::string> parts = bp::trace::parts_of(file.string());
  REQUIRE(parts.size() == 1);
  const bp::trace::MergeResult m = bp::trace::merge(parts, file.string());
  CHECK(m.ranks == 1);
  CHECK(m.incomplete == 1);
  const json t = read_json(file);
  int negs = 0;
  for (const json& e : events(t, "X")) negs += e["name"] == "neg";
  CHECK(negs == 20);
  CHECK(t["otherData"]["backplane_trace"]["ranks"][0]["complete"] == false);
  fs::remove_all(dir);
}

TEST_CASE(
    "trace: merge refuses a file that is not a part, aligns a part's clock and skips a torn last record") {
  const fs::path dir = scratch("merge");
  const fs::path bad = dir / "x.rank0.part";
  std::ofstream(bad) << "{\"not\": \"a part\"}\n";
  CHECK_THROWS_WITH_AS(bp::trace::merge({bad.string()}, (dir / "out.json").string()),
                       doctest::Contains("is neither a backplane trace part nor a trace backplane wrote"),
                       bp::Error);
  // A real part, whole (BACKPLANE_TRACE_MERGE=launcher: the session leaves
  // it for the launcher), then cut inside its last event record.
  const fs::path whole = dir / "y.json";
  {
    const ScopedEnv no_merge("BACKPLANE_TRACE_MERGE", std::string("launcher"));
    const bp::Registry r = trace_registry();
    const bp::Device d = r.backend("cpu").device();
    bp::trace::Session session({whole.string()});
    const bp::Tensor a = bp::Tensor::from_vector<float>(d, {4}, {1, 2, 3, 4});
    (void)bp::neg(a);
    (void)bp::exp(a);
  }
  const fs::path torn = dir / "y.json.rank0.part";
  REQUIRE(fs::exists(torn));
  const bp::trace::MergeResult m0 = bp::trace::merge({torn.string()}, (dir / "whole.json").string());
  CHECK(m0.events == 2);
  CHECK(m0.incomplete == 0);
  const double neg_ts = events(read_json(dir / "whole.json"), "X").at(0)["ts"].get<double>();
  std::string bytes;
  {
    std::ifstream in(torn, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // A clock record, as a rank's alignment writes it: 5 us behind rank 0.
  const std::string magic = "backplane trace part 3\n";
  const std::string clock =
      R"({"ph":"M","name":"backplane_clock","pid":0,"tid":0,"args":{"offset_ns":5000,"error_ns":100,"rounds":8}})";
  const auto clock_size = static_cast<uint32_t>(clock.size());
  bytes.insert(magic.size(), std::string(reinterpret_cast<const char*>(&clock_size), 4) + "M" + clock);
  // Walk the records (u32 size, u8 type, payload) to the last event's.
  std::size_t at = magic.size(), last_event = 0, last_size = 0;
  while (at + 5 <= bytes.size()) {
    uint32_t size = 0;
    std::memcpy(&size, bytes.data() + at, 4);
    if (bytes[at + 4] == 'E') {
      last_event = at;
      last_size = size;
    }
    if (bytes[at + 4] == 'Z') break;
    at += 5 + size;
  }
  REQUIRE(last_event > 0);
  REQUIRE(last_size > 2);
  bytes.resize(last_event + 5 + last_size / 2);  // the record cut in its middle
  std::ofstream(torn, std::ios::binary | std::ios::trunc) << bytes;
  const bp::trace::MergeResult m = bp::trace::merge({torn.string()}, (dir / "out.json").string());
  CHECK(m.events == 1);
  CHECK(m.incomplete == 1);
  const json t = read_json(dir / "out.json");
  const auto xs = events(t, "X");
  REQUIRE(xs.size() == 1);
  CHECK(xs[0]["name"] == "neg");
  // Shifted by the rank's 5 us offset (ts are microseconds of uptime: compare the difference).
  CHECK(xs[0]["ts"].get<double>() - neg_ts == doctest::Approx(5.0).epsilon(1e-3));
  CHECK(t["otherData"]["backplane_trace"]["ranks"][0]["torn_lines"] == 1);
  CHECK(t["otherData"]["backplane_trace"]["ranks"][0]["clock_error_us"].get<double>() ==
        doctest::Approx(0.1));
  fs::remove_all(dir);
}

TEST_CASE("trace: a child forked while recording records nothing and exits cleanly") {
  const bp::Registry r = trace_registry();
  const bp::Device d = r.backend("cpu").device();
  const fs::path dir = scratch("fork");
  const fs::path file = dir / "t.json";
  const bp::Tensor a = bp::Tensor::from_vector<float>(d, {4}, {1, 2, 3, 4});
  {
    bp::trace::Session session({file.string()});
    (void)bp::neg(a);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      const bool active = bp::trace::active();
      for (int i = 0; i < 10; ++i) (void)bp::exp(a);
      ::_exit(active ? 1 : 0);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);  // the child saw no session
  }
  const json t = read_json(file);
  int negs = 0, exps = 0;
  for (const json& e : events(t, "X")) {
    negs += e["name"] == "neg";
    exps += e["name"] == "exp";
  }
  CHECK(negs == 1);
  CHECK(exps == 0);
  fs::remove_all(dir);
}

TEST_CASE("trace: a plugin's events (ABI 2.4) are copied, checked, and joined by flows") {
  // The trace_events fixture adds its events in execute (tests/fixtures/trace_events.c).
  const bp::Registry r =
      bp::Registry::from_json(R"({"schema_version": 1, "backends": [{"name": "tracer", "library": )" +
                                  json_path(fixture("trace_events")) + "}]}",
                              fixture_dir(), "trace test");
  const bp::Device d = r.backend("tracer").device();
  const bp::Tensor a = bp::Tensor::from_vector<float>(d, {2}, {1, 2});
  (void)bp::add(a, a);  // no trace: the fixture adds nothing
  const fs::path dir = scratch("plugin");
  const fs::path file = dir / "t.json";
  {
    bp::trace::Session session({file.string()});
    CHECK(bp::add(a, a).to_vector<float>() == std::vector<float>{2, 4});
  }
  const json t = read_json(file);
  std::vector<json> mine;
  for (const json& e : events(t, "X"))
    if (e["cat"] == "remote") mine.push_back(e);
  REQUIRE(mine.size() == 1);
  CHECK(mine[0]["name"] == "request");
  CHECK(mine[0]["ts"].get<double>() == doctest::Approx(1.0));
  CHECK(mine[0]["dur"].get<double>() == doctest::Approx(2.0));
  CHECK(mine[0]["args"]["bytes"] == 64);
  CHECK(mine[0]["args"]["wait_ns"] == 7);
  CHECK(mine[0]["args"]["peer"] == "server \"a\"");
  const auto flows = events(t, "s");
  REQUIRE(flows.size() == 1);
  CHECK(flows[0]["id"] == 42);
  CHECK(flows[0]["cat"] == "remote");
  fs::remove_all(dir);
}

TEST_CASE("trace: a second process on the same part is refused and leaves the first one's part whole") {
  const fs::path dir = scratch("locked");
  const fs::path file = dir / "t.json";
  {
    bp::trace::Session session({file.string()});
    const pid_t child = ::fork();  // as a worker that inherited BACKPLANE_TRACE and RANK would
    REQUIRE(child >= 0);
    if (child == 0) {
      int code = 1;
      try {
        bp::trace::Session second({file.string()});
      } catch (const bp::Error& e) {
        code = e.code() == bp::Errc::io_error &&
                       std::string(e.what()).find("another process is writing") != std::string::npos
                   ? 0
                   : 2;
      }
      ::_exit(code);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const json t = read_json(file);  // the first session's file, whole
  CHECK(t["otherData"]["backplane_trace"]["ranks"][0]["complete"] == true);
  fs::remove_all(dir);
}
