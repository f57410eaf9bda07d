// The cpu plugin's collectives, through its ABI table (dlopen + bp_plugin_entry,
// no core): ranks are threads of this process, each with its own communicator,
// all sharing an in-memory key-value store. Every rank checks its own results
// against values computed here; the main thread asserts on what they report.
// The host validates shapes, ranks and roots before a call reaches a plugin
// (abi.h, "Trust contract"); these tests call the plugin directly, so they
// only pass what a host would, except where the plugin still guards memory.
#include <backplane/abi.h>
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <backplane/plugin/status.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu/collective_math.hpp"

namespace {

using namespace std::chrono_literals;

// ---------------------------------------------------------------------------
// The plugin, loaded through its one exported symbol
// ---------------------------------------------------------------------------

std::mutex g_log_mutex;
std::vector<std::string> g_log;
std::vector<int32_t> g_log_levels;  // g_log's levels, index for index

void host_log(void*, int32_t level, const char* message) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log.emplace_back(message);
  g_log_levels.push_back(level);
}

const bp_host_api g_host{
    BP_HOST_API_STRUCT_SIZE, BP_ABI_MAJOR, BP_ABI_MINOR, nullptr, &host_log, nullptr, nullptr};

struct Status {
  int32_t code = BP_STATUS_OK;
  std::string message;
  bool ok() const { return code == BP_STATUS_OK; }
};

class Plugin {
 public:
  // Loopback by default: these tests are about the collectives, and a
  // machine whose name needs a slow DNS lookup must not eat their short
  // timeouts (the address choice has its own tests with explicit options).
  explicit Plugin(const std::string& options = R"({"hostname": "127.0.0.1"})") {
    const std::string path = std::string(BP_TEST_PLUGIN_DIR) + "/libbackplane_cpu.so";
    lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) throw std::runtime_error("dlopen " + path + ": " + dlerror());
    auto entry = reinterpret_cast<bp_plugin_entry_fn>(dlsym(lib_, BP_PLUGIN_ENTRY_SYMBOL));
    if (entry == nullptr) throw std::runtime_error("no bp_plugin_entry in " + path);
    api_ = entry(&g_host);
    bp_create_args args{};
    args.struct_size = BP_CREATE_ARGS_STRUCT_SIZE;
    args.backend_name = "cpu";
    args.options_json = options.c_str();
    args.host = &g_host;
    create_status_ = take(api_->create(&args));
    plugin_ = args.plugin;
  }
  ~Plugin() {
    if (plugin_ != nullptr) api_->destroy(plugin_);
    // The library stays mapped (it is linked -z nodelete).
    dlclose(lib_);
  }
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const bp_plugin_api& api() const { return *api_; }
  bp_plugin* get() const { return plugin_; }
  const Status& create_status() const { return create_status_; }

  Status take(bp_status* s) const {
    if (s == nullptr) return {};
    Status out{api_->status_code(s), api_->status_message(s)};
    api_->status_free(s);
    return out;
  }

 private:
  void* lib_ = nullptr;
  const bp_plugin_api* api_ = nullptr;
  bp_plugin* plugin_ = nullptr;
  Status create_status_;
};

// The ways ranks on one host exchange data: shared memory (the default when
// every rank shares the host) in its two layouts (a ring per pair of ranks, and
// the inbox per rank that groups above "shared_memory_pair_rings" ranks use),
// and Gloo over loopback TCP (what ranks on different hosts use). The
// collectives' results and failures are tested on each.
struct TransportCase {
  const char* name;
  const char* options;
};
constexpr TransportCase kTransports[] = {
    {"shared memory", R"({"hostname": "127.0.0.1"})"},
    {"gloo", R"({"hostname": "127.0.0.1", "shared_memory": false})"},
    {"shared memory inboxes", R"({"hostname": "127.0.0.1", "shared_memory_pair_rings": 0})"},
};

// Runs `body` once with a plugin on each transport.
template <class Body>
void for_each_transport(Body&& body) {
  for (const TransportCase& transport : kTransports) {
    const std::string name = transport.name;
    CAPTURE(name);
    const Plugin p(transport.options);
    body(p);
  }
}

// A plugin buffer holding a 1-D tensor of `count` elements at `offset` bytes.
class Tensor {
 public:
  Tensor(const Plugin& p, int32_t dtype, int64_t count, uint64_t offset = 0, uint64_t extra = 0)
      : p_(&p), shape_(count), stride_(1) {
    const uint64_t bytes = offset + static_cast<uint64_t>(count) * esize(dtype) + extra;
    bp_buffer_alloc_args args{};
    args.struct_size = BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE;
    args.plugin = p.get();
    args.size = bytes;
    REQUIRE(p.take(p.api().buffer_alloc(&args)).ok());
    buffer_ = args.buffer;
    desc_ = bp_tensor{buffer_, offset, 0, dtype, 1, 0, &shape_, &stride_};
  }
  // A second view of another tensor's buffer (does not own it).
  Tensor(const Tensor& base, int32_t dtype, int64_t count, uint64_t offset)
      : p_(base.p_), shape_(count), stride_(1), owner_(false) {
    buffer_ = base.buffer_;
    desc_ = bp_tensor{buffer_, offset, 0, dtype, 1, 0, &shape_, &stride_};
  }
  ~Tensor() {
    if (owner_ && buffer_ != nullptr) {
      bp_buffer_free_args args{};
      args.struct_size = BP_BUFFER_FREE_ARGS_STRUCT_SIZE;
      args.plugin = p_->get();
      args.buffer = buffer_;
      p_->take(p_->api().buffer_free(&args));
    }
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Unknown dtypes (for the refusal tests) still get one byte per element.
  static int esize(int32_t dtype) { return std::max(1, static_cast<int>(bp_dtype_size(dtype))); }

  const bp_tensor* desc() {
    desc_.shape = &shape_;
    desc_.strides = &stride_;
    return &desc_;
  }
  bp_tensor& raw() { return desc_; }
  unsigned char* data() const {
    bp_buffer_pointer_args args{};
    args.struct_size = BP_BUFFER_POINTER_ARGS_STRUCT_SIZE;
    args.plugin = p_->get();
    args.buffer = buffer_;
    if (!p_->take(p_->api().buffer_pointer(&args)).ok()) throw std::runtime_error("buffer_pointer failed");
    return static_cast<unsigned char*>(args.data) + desc_.byte_offset;
  }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data());
  }
  int64_t count() const { return shape_; }

 private:
  const Plugin* p_;
  bp_buffer* buffer_ = nullptr;
  int64_t shape_;
  int64_t stride_;
  bool owner_ = true;
  bp_tensor desc_{};
};

// ---------------------------------------------------------------------------
// An in-memory key-value store shared by the rank threads
// ---------------------------------------------------------------------------

// Its statuses are the SDK's (any concrete bp_status will do: the plugin only
// reads them through this table's status_* entries).
class MemoryStore {
 public:
  MemoryStore() {
    table_.struct_size = BP_KV_STORE_STRUCT_SIZE;
    table_.ctx = this;
    table_.set = &set;
    table_.get = &get;
    table_.wait = &wait;
    table_.free_value = &free_value;
    table_.status_code = &backplane::plugin::status_code;
    table_.status_message = &backplane::plugin::status_message;
    table_.status_free = &backplane::plugin::status_free;
  }
  const bp_kv_store* table() const { return &table_; }
  // Makes every set fail with `message` (an IO status), to test error reporting.
  void fail_sets(std::string message) { fail_sets_ = std::move(message); }
  // Makes every get fail from now on, as when the rank that served the store
  // has exited. Thread-safe.
  void fail_gets() { fail_gets_.store(true); }
  // Stores `value` instead of what a set of a key ending in `suffix` carries,
  // to stand for a rank that publishes something else.
  void replace_sets(std::string suffix, std::string value) {
    replace_suffix_ = std::move(suffix);
    replace_value_ = std::move(value);
  }
  // Values freed so far (every get's value must be).
  int freed() const { return freed_.load(); }
  int handed_out() const { return handed_out_.load(); }

 private:
  static MemoryStore& self(void* ctx) { return *static_cast<MemoryStore*>(ctx); }
  static bp_status* error(int32_t code, const std::string& message) {
    return backplane::plugin::make_status(code, message.c_str());
  }
  static bp_status* set(bp_kv_set_args* a) {
    MemoryStore& s = self(a->ctx);
    if (!s.fail_sets_.empty()) return error(BP_STATUS_IO, s.fail_sets_);
    {
      std::lock_guard<std::mutex> lock(s.mutex_);
      const auto* p = static_cast<const uint8_t*>(a->value);
      const std::string key = a->key;
      const std::string& r = s.replace_suffix_;
      if (!r.empty() && key.size() >= r.size() && key.compare(key.size() - r.size(), r.size(), r) == 0)
        s.data_[key] = std::vector<uint8_t>(s.replace_value_.begin(), s.replace_value_.end());
      else
        s.data_[key] = std::vector<uint8_t>(p, p + a->size);
    }
    s.changed_.notify_all();
    return nullptr;
  }
  // Waits until every key exists; the missing key's name on timeout.
  std::string wait_for_keys(std::unique_lock<std::mutex>& lock, const char* const* keys, int32_t n,
                            int64_t timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int32_t i = 0; i < n; ++i)
      if (!changed_.wait_until(lock, deadline, [&] { return data_.count(keys[i]) != 0; }))
        return std::string("timed out after ") + std::to_string(timeout_ms) + " ms waiting for key " +
               keys[i];
    return "";
  }
  static bp_status* get(bp_kv_get_args* a) {
    MemoryStore& s = self(a->ctx);
    if (s.fail_gets_.load()) return error(BP_STATUS_IO, "the store's host closed the connection");
    std::unique_lock<std::mutex> lock(s.mutex_);
    if (std::string e = s.wait_for_keys(lock, &a->key, 1, a->timeout_ms); !e.empty())
      return error(BP_STATUS_TIMEOUT, e);
    const auto& v = s.data_[a->key];
    a->value = static_cast<uint8_t*>(std::malloc(v.empty() ? 1 : v.size()));
    if (!v.empty()) std::memcpy(a->value, v.data(), v.size());
    a->size = v.size();
    s.handed_out_.fetch_add(1);
    return nullptr;
  }
  static bp_status* wait(bp_kv_wait_args* a) {
    MemoryStore& s = self(a->ctx);
    std::unique_lock<std::mutex> lock(s.mutex_);
    if (std::string e = s.wait_for_keys(lock, a->keys, a->num_keys, a->timeout_ms); !e.empty())
      return error(BP_STATUS_TIMEOUT, e);
    return nullptr;
  }
  static void free_value(void* ctx, uint8_t* value) {
    std::free(value);
    self(ctx).freed_.fetch_add(1);
  }

  bp_kv_store table_{};
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> data_;
  std::string fail_sets_;
  std::atomic<bool> fail_gets_{false};
  std::string replace_suffix_;
  std::string replace_value_;
  std::atomic<int> freed_{0};
  std::atomic<int> handed_out_{0};
};

// ---------------------------------------------------------------------------
// Groups of ranks as threads
// ---------------------------------------------------------------------------

// The five collectives' one argument struct.
bp_collective_args collective_args(const Plugin& p, bp_comm* comm, const bp_tensor* in, const bp_tensor* out,
                                   int32_t reduce_op = 0, int32_t root = 0) {
  bp_collective_args a{};
  a.struct_size = BP_COLLECTIVE_ARGS_STRUCT_SIZE;
  a.plugin = p.get();
  a.comm = comm;
  a.input = in;
  a.output = out;
  a.reduce_op = reduce_op;
  a.root = root;
  return a;
}

Status comm_call(const Plugin& p, bp_status* (*entry)(bp_comm_args*), bp_comm* comm) {
  bp_comm_args a{};
  a.struct_size = BP_COMM_ARGS_STRUCT_SIZE;
  a.plugin = p.get();
  a.comm = comm;
  return p.take(entry(&a));
}
Status destroy_comm(const Plugin& p, bp_comm* comm) { return comm_call(p, p.api().comm_destroy, comm); }
Status abort_comm(const Plugin& p, bp_comm* comm) { return comm_call(p, p.api().comm_abort, comm); }

struct Comm {
  const Plugin& p;
  bp_comm* comm;
  int rank;
  int world;

  Status all_reduce(Tensor& in, Tensor& out, int32_t op) { return raw_all_reduce(in.desc(), out.desc(), op); }
  Status raw_all_reduce(const bp_tensor* in, const bp_tensor* out, int32_t op) {
    bp_collective_args a = collective_args(p, comm, in, out, op);
    return p.take(p.api().all_reduce(&a));
  }
  Status broadcast(Tensor& t, int32_t root) {
    bp_collective_args a = collective_args(p, comm, nullptr, t.desc(), 0, root);
    return p.take(p.api().broadcast(&a));
  }
  Status all_gather(Tensor& in, Tensor& out) {
    bp_collective_args a = collective_args(p, comm, in.desc(), out.desc());
    return p.take(p.api().all_gather(&a));
  }
  Status reduce_scatter(Tensor& in, Tensor& out, int32_t op) {
    bp_collective_args a = collective_args(p, comm, in.desc(), out.desc(), op);
    return p.take(p.api().reduce_scatter(&a));
  }
  Status barrier() {
    bp_collective_args a = collective_args(p, comm, nullptr, nullptr);
    return p.take(p.api().barrier(&a));
  }
  Status abort() { return abort_comm(p, comm); }
};

Status create_comm(const Plugin& p, const MemoryStore* store, int rank, int world, int64_t timeout_ms,
                   const std::string& prefix, bp_comm** out) {
  bp_comm_create_args args{};
  args.struct_size = BP_COMM_CREATE_ARGS_STRUCT_SIZE;
  args.plugin = p.get();
  args.device = 0;
  args.rank = rank;
  args.world_size = world;
  args.timeout_ms = timeout_ms;
  args.store = store != nullptr ? store->table() : nullptr;
  args.key_prefix = prefix.c_str();
  const Status s = p.take(p.api().comm_create(&args));
  *out = s.ok() ? args.comm : nullptr;
  return s;
}

// What the ranks report back: problems found (empty when all is well).
class Report {
 public:
  void add(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    problems_.push_back("rank " + std::to_string(rank) + ": " + what);
  }
  std::vector<std::string> problems() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return problems_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> problems_;
};

#define CHECK_NO_PROBLEMS(report)                    \
  do {                                               \
    const auto problems = (report).problems();       \
    for (const auto& line : problems) MESSAGE(line); \
    CHECK(problems.empty());                         \
  } while (false)

// Runs body(comm, report) on `world` threads, one communicator each, then
// destroys the communicators. A failed comm_create is reported.
void run_group(const Plugin& p, int world, const std::function<void(Comm&, Report&)>& body, Report& report,
               int64_t timeout_ms = 30000, const std::string& prefix = "group/") {
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      bp_comm* handle = nullptr;
      const Status s = create_comm(p, &store, r, world, timeout_ms, prefix, &handle);
      if (!s.ok()) {
        report.add(r, "comm_create failed: " + s.message);
        return;
      }
      Comm comm{p, handle, r, world};
      try {
        body(comm, report);
      } catch (const std::exception& e) {
        report.add(r, std::string("exception: ") + e.what());
      }
      if (const Status d = destroy_comm(p, handle); !d.ok())
        report.add(r, "comm_destroy failed: " + d.message);
    });
  for (auto& t : threads) t.join();
}

// Two ranks, rank r on plugin r, each running `body` once on its
// communicator; returns each rank's comm_create failure or body's status.
std::vector<Status> run_two_ranks(const Plugin& p0, const Plugin& p1, int64_t timeout_ms,
                                  const std::string& prefix, const std::function<Status(Comm&)>& body) {
  MemoryStore store;
  std::vector<Status> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      const Plugin& p = r == 0 ? p0 : p1;
      bp_comm* comm = nullptr;
      results[r] = create_comm(p, &store, r, 2, timeout_ms, prefix, &comm);
      if (!results[r].ok()) return;
      Comm c{p, comm, r, 2};
      results[r] = body(c);
      destroy_comm(p, comm);
    });
  for (auto& t : ranks) t.join();
  return results;
}

// ---------------------------------------------------------------------------
// Values and expected results
// ---------------------------------------------------------------------------

// Names from abi.h's tables.
const char* dtype_text(int32_t dtype) { return bp_dtype_name(dtype) != nullptr ? bp_dtype_name(dtype) : "?"; }
const char* op_text(int32_t op) { return bp_reduce_op_name(op) != nullptr ? bp_reduce_op_name(op) : "?"; }

// Rank r's element i for a reduction with `op`: small integers, so that sums
// and products are exact in every dtype (products stay within +-27).
int64_t value(int32_t dtype, int32_t op, int rank, uint64_t i) {
  const bool is_unsigned = dtype == BP_DTYPE_U8;
  if (op == BP_REDUCE_PROD) {
    const int64_t magnitude = static_cast<int64_t>((i + rank) % 3) + 1;
    return !is_unsigned && (i + 2 * rank) % 4 == 0 ? -magnitude : magnitude;
  }
  const int64_t v = static_cast<int64_t>((i * 7 + static_cast<uint64_t>(rank) * 13) % 23);
  return is_unsigned ? v : v - 11;
}

// Stores integer v as element i of a `dtype` array.
void put(int32_t dtype, unsigned char* data, uint64_t i, int64_t v) {
  using namespace backplane::cpu;
  switch (dtype) {
    case BP_DTYPE_F32:
      reinterpret_cast<float*>(data)[i] = static_cast<float>(v);
      break;
    case BP_DTYPE_F64:
      reinterpret_cast<double*>(data)[i] = static_cast<double>(v);
      break;
    case BP_DTYPE_I32:
      reinterpret_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
      break;
    case BP_DTYPE_I64:
      reinterpret_cast<int64_t*>(data)[i] = v;
      break;
    case BP_DTYPE_I8:
      reinterpret_cast<int8_t*>(data)[i] = static_cast<int8_t>(v);
      break;
    case BP_DTYPE_U8:
      reinterpret_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      break;
    case BP_DTYPE_F16:
      reinterpret_cast<uint16_t*>(data)[i] = f32_to_f16(static_cast<float>(v));
      break;
    case BP_DTYPE_BF16:
      reinterpret_cast<uint16_t*>(data)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    default:
      break;
  }
}

// Element i of a `dtype` array, widened to double (exact for every value used here).
double get(int32_t dtype, const unsigned char* data, uint64_t i) {
  using namespace backplane::cpu;
  switch (dtype) {
    case BP_DTYPE_F32:
      return reinterpret_cast<const float*>(data)[i];
    case BP_DTYPE_F64:
      return reinterpret_cast<const double*>(data)[i];
    case BP_DTYPE_I32:
      return reinterpret_cast<const int32_t*>(data)[i];
    case BP_DTYPE_I64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(data)[i]);
    case BP_DTYPE_I8:
      return reinterpret_cast<const int8_t*>(data)[i];
    case BP_DTYPE_U8:
      return reinterpret_cast<const uint8_t*>(data)[i];
    case BP_DTYPE_F16:
      return f16_to_f32(reinterpret_cast<const uint16_t*>(data)[i]);
    case BP_DTYPE_BF16:
      return bf16_to_f32(reinterpret_cast<const uint16_t*>(data)[i]);
    default:
      return 0;
  }
}

// The reduction over `world` ranks of element i, as the dtype represents it.
double expected(int32_t dtype, int32_t op, int world, uint64_t i) {
  using namespace backplane::cpu;
  int64_t acc = value(dtype, op, 0, i);
  for (int r = 1; r < world; ++r) {
    const int64_t v = value(dtype, op, r, i);
    switch (op) {
      case BP_REDUCE_SUM:
      case BP_REDUCE_MEAN:
        acc += v;
        break;
      case BP_REDUCE_PROD:
        acc *= v;
        break;
      case BP_REDUCE_MIN:
        acc = std::min(acc, v);
        break;
      case BP_REDUCE_MAX:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op != BP_REDUCE_MEAN) return static_cast<double>(acc);
  switch (dtype) {  // the sum, then one division in the dtype itself
    case BP_DTYPE_F32:
      return static_cast<float>(acc) / static_cast<float>(world);
    case BP_DTYPE_F64:
      return static_cast<double>(acc) / world;
    case BP_DTYPE_F16:
      return f16_to_f32(f32_to_f16(static_cast<float>(acc) / static_cast<float>(world)));
    case BP_DTYPE_BF16:
      return bf16_to_f32(f32_to_bf16(static_cast<float>(acc) / static_cast<float>(world)));
    default:
      return static_cast<double>(acc / world);  // C++ truncates toward zero, as the plugin must
  }
}

// value() and expected() repeat with this period in the element index (23 for
// the additive values, 12 for the multiplicative ones), so large tensors are
// filled and checked from one period's table.
constexpr uint64_t kPeriod = 23 * 12;

void fill(Tensor& t, int32_t dtype, int32_t op, int rank, uint64_t index_base = 0) {
  int64_t table[kPeriod];
  for (uint64_t k = 0; k < kPeriod; ++k) table[k] = value(dtype, op, rank, k);
  for (uint64_t i = 0; i < static_cast<uint64_t>(t.count()); ++i)
    put(dtype, t.data(), i, table[(index_base + i) % kPeriod]);
}

// First mismatch of t against expected(), or "" (element i of t is global element index_base + i).
std::string mismatch(const Tensor& t, int32_t dtype, int32_t op, int world, uint64_t index_base = 0) {
  double table[kPeriod];
  for (uint64_t k = 0; k < kPeriod; ++k) table[k] = expected(dtype, op, world, k);
  for (uint64_t i = 0; i < static_cast<uint64_t>(t.count()); ++i) {
    const double got = get(dtype, t.data(), i);
    const double want = table[(index_base + i) % kPeriod];
    if (got != want)
      return "element " + std::to_string(i) + " is " + std::to_string(got) + ", expected " +
             std::to_string(want);
  }
  return "";
}

std::string what(const char* op, int32_t dtype, int32_t rop, int64_t count) {
  return std::string(op) + " " + dtype_text(dtype) + " " + op_text(rop) + " of " + std::to_string(count) +
         " elements";
}

// Element counts: empty, one, odd, 4 KiB (f32), 1 MiB plus an odd tail.
std::vector<int64_t> sizes_for(int32_t dtype) {
  const int64_t mib = (int64_t{1} << 20) / Tensor::esize(dtype);
  return {0, 1, 7, 1024, mib + 3};
}

const int32_t kOps[] = {BP_REDUCE_SUM, BP_REDUCE_MEAN, BP_REDUCE_MIN, BP_REDUCE_MAX, BP_REDUCE_PROD};

// all_reduce of every op on each dtype and size; out of place.
void check_all_reduce(const Plugin& p, int world, const std::vector<int32_t>& dtypes,
                      const std::vector<int64_t>* sizes = nullptr) {
  Report report;
  run_group(
      p, world,
      [&](Comm& c, Report& rep) {
        for (int32_t dtype : dtypes)
          for (int64_t n : sizes != nullptr ? *sizes : sizes_for(dtype))
            for (int32_t op : kOps) {
              Tensor in(p, dtype, n, 8 * Tensor::esize(dtype));  // a nonzero byte_offset
              Tensor out(p, dtype, n);
              fill(in, dtype, op, c.rank);
              const std::vector<unsigned char> before(in.data(), in.data() + n * Tensor::esize(dtype));
              const Status s = c.all_reduce(in, out, op);
              if (!s.ok()) {
                rep.add(c.rank, what("all_reduce", dtype, op, n) + ": " + s.message);
                return;
              }
              if (auto m = mismatch(out, dtype, op, world); !m.empty())
                rep.add(c.rank, what("all_reduce", dtype, op, n) + ": " + m);
              if (n > 0 && std::memcmp(in.data(), before.data(), before.size()) != 0)  // input untouched
                rep.add(c.rank, what("all_reduce", dtype, op, n) + ": the input was modified");
            }
      },
      report);
  CHECK_NO_PROBLEMS(report);
}

}  // namespace

// ---------------------------------------------------------------------------
// Capabilities and creation
// ---------------------------------------------------------------------------

TEST_CASE("cpu_collectives: the cpu device declares collective and every collective entry") {
  Plugin p;
  REQUIRE(p.create_status().ok());
  bp_device_info_args info{};
  info.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE;
  info.plugin = p.get();
  REQUIRE(p.take(p.api().device_info(&info)).ok());
  CHECK((info.capabilities & BP_CAP_COLLECTIVE) != 0);
  CHECK(static_cast<bool>(p.api().comm_create));
  CHECK(static_cast<bool>(p.api().comm_destroy));
  CHECK(static_cast<bool>(p.api().comm_abort));
  CHECK(static_cast<bool>(p.api().all_reduce));
  CHECK(static_cast<bool>(p.api().broadcast));
  CHECK(static_cast<bool>(p.api().all_gather));
  CHECK(static_cast<bool>(p.api().reduce_scatter));
  CHECK(static_cast<bool>(p.api().barrier));
}

TEST_CASE("cpu_collectives: a world of one needs no store and copies") {
  Plugin p;
  bp_comm* comm = nullptr;
  REQUIRE(create_comm(p, nullptr, 0, 1, 1000, "solo/", &comm).ok());
  Comm c{p, comm, 0, 1};
  Tensor in(p, BP_DTYPE_F32, 5);
  Tensor out(p, BP_DTYPE_F32, 5);
  fill(in, BP_DTYPE_F32, BP_REDUCE_MEAN, 0);
  CHECK(c.all_reduce(in, out, BP_REDUCE_MEAN).ok());
  CHECK(mismatch(out, BP_DTYPE_F32, BP_REDUCE_MEAN, 1).empty());
  Tensor gathered(p, BP_DTYPE_F32, 5);
  CHECK(c.all_gather(in, gathered).ok());
  CHECK(std::memcmp(gathered.data(), in.data(), 5 * sizeof(float)) == 0);
  CHECK(c.broadcast(in, 0).ok());
  CHECK(c.barrier().ok());
  const Status bad_root = c.broadcast(in, 1);
  CHECK(bad_root.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(bad_root.message.find("root 1") != std::string::npos);
  destroy_comm(p, comm);
}

TEST_CASE("cpu_collectives: comm_create refuses what would index out of range or call through NULL") {
  Plugin p;
  MemoryStore store;
  bp_comm* comm = nullptr;
  struct Case {
    int rank, world;
    bool with_store;
    const char* needle;
  };
  for (const Case& k : {Case{2, 2, true, "rank 2 is outside [0, world_size 2)"}, Case{-1, 2, true, "rank -1"},
                        Case{0, 2, false, "store is NULL"}}) {
    const std::string needle = k.needle;
    CAPTURE(needle);
    const Status s = create_comm(p, k.with_store ? &store : nullptr, k.rank, k.world, 1000, "bad/", &comm);
    CHECK(s.code == BP_STATUS_INVALID_ARGUMENT);
    CHECK(s.message.find(k.needle) != std::string::npos);
    CHECK(comm == nullptr);
  }
  bp_kv_store partial = *store.table();
  partial.status_free = nullptr;  // a store whose statuses could not be freed
  bp_comm_create_args args{};
  args.struct_size = BP_COMM_CREATE_ARGS_STRUCT_SIZE;
  args.plugin = p.get();
  args.rank = 0;
  args.world_size = 2;
  args.timeout_ms = 1000;
  args.store = &partial;
  args.key_prefix = "partial/";
  const Status s = p.take(p.api().comm_create(&args));
  CHECK(s.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(s.message.find("lacks status_free") != std::string::npos);
  bp_collective_args null_comm_args = collective_args(p, nullptr, nullptr, nullptr);
  const Status null_comm = p.take(p.api().barrier(&null_comm_args));
  CHECK(null_comm.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(null_comm.message.find("NULL") != std::string::npos);
}

TEST_CASE("cpu_collectives: a rank that never joins makes comm_create time out naming it") {
  Plugin p;
  MemoryStore store;
  bp_comm* comm = nullptr;
  const Status s = create_comm(p, &store, 0, 2, 300, "lonely/", &comm);
  CHECK(s.code == BP_STATUS_TIMEOUT);
  CHECK(s.message.find("rank 1 did not join within 300 ms") != std::string::npos);
  CHECK(s.message.find("comm_create on rank 0 of 2") != std::string::npos);
  CHECK(comm == nullptr);
}

TEST_CASE("cpu_collectives: a failing store's own message reaches the caller") {
  Plugin p;
  MemoryStore store;
  store.fail_sets("the store is read-only today");
  bp_comm* comm = nullptr;
  const Status s = create_comm(p, &store, 0, 2, 1000, "ro/", &comm);
  CHECK(s.code == BP_STATUS_IO);
  CHECK(s.message.find("the store is read-only today") != std::string::npos);
  CHECK(s.message.find("\"ro/cpu.gloo/") != std::string::npos);  // the key, under the caller's prefix
}

// ---------------------------------------------------------------------------
// all_reduce
// ---------------------------------------------------------------------------

TEST_CASE("cpu_collectives: all_reduce of every op on f32 f64 and i64 with 2 ranks") {
  for_each_transport([&](const Plugin& p) {
    check_all_reduce(p, 2, {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I64});
  });
}

TEST_CASE("cpu_collectives: all_reduce of every op on f32 f64 and i64 with 3 ranks") {
  for_each_transport([&](const Plugin& p) {
    check_all_reduce(p, 3, {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I64});
  });
}

TEST_CASE("cpu_collectives: all_reduce of every op on i32 i8 u8 f16 and bf16") {
  for_each_transport([&](const Plugin& p) {
    const std::vector<int64_t> sizes{1, 7, 70001};  // the last takes the ring with 3 ranks
    check_all_reduce(p, 2, {BP_DTYPE_I32, BP_DTYPE_I8, BP_DTYPE_U8, BP_DTYPE_F16, BP_DTYPE_BF16}, &sizes);
    check_all_reduce(p, 3, {BP_DTYPE_I32, BP_DTYPE_I8, BP_DTYPE_U8, BP_DTYPE_F16, BP_DTYPE_BF16}, &sizes);
  });
}

namespace {

// all_reduce of 16 MiB f32, sum then max on the same buffers: the ring path on
// large, reused buffers.
void check_large_all_reduce(const Plugin& p, int world) {
  const int64_t n = (int64_t{16} << 20) / 4;
  Report report;
  run_group(
      p, world,
      [&](Comm& c, Report& rep) {
        Tensor in(p, BP_DTYPE_F32, n);
        Tensor out(p, BP_DTYPE_F32, n);
        for (int32_t op : {BP_REDUCE_SUM, BP_REDUCE_MAX}) {
          fill(in, BP_DTYPE_F32, op, c.rank);
          std::memset(out.data(), 0xff, n * 4);
          const Status s = c.all_reduce(in, out, op);
          if (!s.ok()) return rep.add(c.rank, s.message);
          if (auto m = mismatch(out, BP_DTYPE_F32, op, world); !m.empty())
            rep.add(c.rank, what("all_reduce", BP_DTYPE_F32, op, n) + ": " + m);
        }
      },
      report);
  CHECK_NO_PROBLEMS(report);
}

}  // namespace

TEST_CASE("cpu_collectives: all_reduce of 16 MiB repeated on the same buffers with 2 ranks") {
  for_each_transport([](const Plugin& p) { check_large_all_reduce(p, 2); });
}

TEST_CASE("cpu_collectives: all_reduce of 16 MiB repeated on the same buffers with 3 ranks") {
  for_each_transport([](const Plugin& p) { check_large_all_reduce(p, 3); });
}

TEST_CASE("cpu_collectives: all_reduce in place with input and output aliased") {
  for_each_transport([&](const Plugin& p) {
    for (int world : {2, 3}) {
      CAPTURE(world);
      Report report;
      run_group(
          p, world,
          [&](Comm& c, Report& rep) {
            for (int64_t n : {int64_t{1}, int64_t{33}, int64_t{300001}}) {
              for (int32_t op : kOps) {
                Tensor t(p, BP_DTYPE_F64, n, 24);  // byte_offset 24
                fill(t, BP_DTYPE_F64, op, c.rank);
                const Status s = c.all_reduce(t, t, op);
                if (!s.ok()) return rep.add(c.rank, s.message);
                if (auto m = mismatch(t, BP_DTYPE_F64, op, world); !m.empty())
                  rep.add(c.rank, what("in place", BP_DTYPE_F64, op, n) + ": " + m);
              }
            }
            // Input and output overlapping without being the same elements.
            const int64_t n = 100000;
            Tensor base(p, BP_DTYPE_F32, n, 0, 64 * 4);
            Tensor shifted(base, BP_DTYPE_F32, n, 64 * 4);
            fill(base, BP_DTYPE_F32, BP_REDUCE_SUM, c.rank);
            const Status s = c.all_reduce(base, shifted, BP_REDUCE_SUM);
            if (!s.ok()) return rep.add(c.rank, s.message);
            if (auto m = mismatch(shifted, BP_DTYPE_F32, BP_REDUCE_SUM, world); !m.empty())
              rep.add(c.rank, "overlapping views: " + m);
          },
          report);
      CHECK_NO_PROBLEMS(report);
    }
  });
}

TEST_CASE("cpu_collectives: all_reduce of 0 elements on every rank is a no-op that keeps ranks in step") {
  for_each_transport([&](const Plugin& p) {
    Report report;
    run_group(
        p, 3,
        [&](Comm& c, Report& rep) {
          Tensor empty(p, BP_DTYPE_F32, 0);
          for (int i = 0; i < 3; ++i)
            if (const Status s = c.all_reduce(empty, empty, BP_REDUCE_SUM); !s.ok())
              rep.add(c.rank, s.message);
          Tensor empty_gathered(p, BP_DTYPE_F32, 0);
          if (const Status s = c.all_gather(empty, empty_gathered); !s.ok()) rep.add(c.rank, s.message);
          if (const Status s = c.reduce_scatter(empty_gathered, empty, BP_REDUCE_MAX); !s.ok())
            rep.add(c.rank, s.message);
          if (const Status s = c.broadcast(empty, 2); !s.ok()) rep.add(c.rank, s.message);
          Tensor t(p, BP_DTYPE_I64, 5);
          fill(t, BP_DTYPE_I64, BP_REDUCE_SUM, c.rank);
          if (const Status s = c.all_reduce(t, t, BP_REDUCE_SUM); !s.ok()) rep.add(c.rank, s.message);
          if (auto m = mismatch(t, BP_DTYPE_I64, BP_REDUCE_SUM, 3); !m.empty())
            rep.add(c.rank, "after the empty ones: " + m);
        },
        report);
    CHECK_NO_PROBLEMS(report);
  });
}

// ---------------------------------------------------------------------------
// broadcast, all_gather, reduce_scatter, barrier
// ---------------------------------------------------------------------------

TEST_CASE("cpu_collectives: broadcast from every root") {
  for_each_transport([&](const Plugin& p) {
    for (int world : {2, 3}) {
      CAPTURE(world);
      Report report;
      run_group(
          p, world,
          [&](Comm& c, Report& rep) {
            for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1024}, int64_t{(1 << 20) / 8 + 3},
                              int64_t{(4 << 20) / 8 + 1}})
              for (int root = 0; root < world; ++root) {
                Tensor t(p, BP_DTYPE_I64, n, 16);
                fill(t, BP_DTYPE_I64, BP_REDUCE_SUM, c.rank);  // differs per rank
                const Status s = c.broadcast(t, root);
                if (!s.ok()) return rep.add(c.rank, s.message);
                for (int64_t i = 0; i < n; ++i)
                  if (t.as<int64_t>()[i] != value(BP_DTYPE_I64, BP_REDUCE_SUM, root, i)) {
                    rep.add(c.rank, "broadcast of " + std::to_string(n) + " from root " +
                                        std::to_string(root) + ": element " + std::to_string(i) +
                                        " differs from the root's");
                    break;
                  }
              }
            // Any dtype moves as bytes, bool included.
            Tensor flags(p, BP_DTYPE_BOOL, 3);
            for (int i = 0; i < 3; ++i) flags.data()[i] = c.rank == 0 ? static_cast<unsigned char>(i % 2) : 1;
            if (const Status s = c.broadcast(flags, 0); !s.ok()) return rep.add(c.rank, s.message);
            if (flags.data()[0] != 0 || flags.data()[1] != 1 || flags.data()[2] != 0)
              rep.add(c.rank, "bool broadcast differs");
            Tensor t(p, BP_DTYPE_F32, 4);
            const Status bad = c.broadcast(t, world);
            if (bad.code != BP_STATUS_INVALID_ARGUMENT ||
                bad.message.find("root " + std::to_string(world)) == std::string::npos)
              rep.add(c.rank, "a root outside the group was not refused: " + bad.message);
          },
          report);
      CHECK_NO_PROBLEMS(report);
    }
  });
}

TEST_CASE("cpu_collectives: all_gather puts each rank's block in rank order") {
  for_each_transport([&](const Plugin& p) {
    for (int world : {2, 3}) {
      CAPTURE(world);
      Report report;
      run_group(
          p, world,
          [&](Comm& c, Report& rep) {
            for (int32_t dtype : {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I64})
              for (int64_t n : sizes_for(dtype))
                for (bool in_place : {false, true}) {
                  Tensor out(p, dtype, n * world, 8);
                  Tensor separate(p, dtype, n);
                  Tensor view(out, dtype, n, 8 + static_cast<uint64_t>(c.rank * n * Tensor::esize(dtype)));
                  Tensor& in = in_place ? view : separate;
                  fill(in, dtype, BP_REDUCE_SUM, c.rank);
                  const Status s = c.all_gather(in, out);
                  if (!s.ok())
                    return rep.add(c.rank, what("all_gather", dtype, BP_REDUCE_SUM, n) + ": " + s.message);
                  for (int r = 0; r < world; ++r)
                    for (int64_t i = 0; i < n; ++i)
                      if (get(dtype, out.data(), r * n + i) !=
                          static_cast<double>(value(dtype, BP_REDUCE_SUM, r, i))) {
                        rep.add(c.rank, what("all_gather", dtype, BP_REDUCE_SUM, n) +
                                            (in_place ? " in place" : "") + ": block " + std::to_string(r) +
                                            " element " + std::to_string(i) + " is wrong");
                        r = world;
                        break;
                      }
                }
            Tensor in(p, BP_DTYPE_F32, 4);
            Tensor wrong(p, BP_DTYPE_F32, 4 * world + 1);
            const Status bad = c.all_gather(in, wrong);
            if (bad.code != BP_STATUS_INVALID_ARGUMENT || bad.message.find("world_size") == std::string::npos)
              rep.add(c.rank, "a wrong output size was not refused: " + bad.message);
          },
          report);
      CHECK_NO_PROBLEMS(report);
    }
  });
}

namespace {

void check_reduce_scatter(const Plugin& p, int world) {
  Report report;
  run_group(
      p, world,
      [&](Comm& c, Report& rep) {
        for (int32_t dtype : {BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I64})
          for (int64_t n :
               {int64_t{1}, int64_t{7}, int64_t{1024}, (int64_t{1} << 20) / Tensor::esize(dtype) + 3})
            for (int32_t op : kOps) {
              // Rank r's input holds world blocks; element i of the whole input is value(r, i).
              Tensor in(p, dtype, n * world, 4 * Tensor::esize(dtype));
              Tensor out(p, dtype, n);
              fill(in, dtype, op, c.rank);
              const Status s = c.reduce_scatter(in, out, op);
              if (!s.ok()) return rep.add(c.rank, what("reduce_scatter", dtype, op, n) + ": " + s.message);
              if (auto m = mismatch(out, dtype, op, world, static_cast<uint64_t>(c.rank * n)); !m.empty())
                rep.add(c.rank, what("reduce_scatter", dtype, op, n) + ": " + m);
            }
        // The output overlapping the input (here: its first block), small and large.
        for (int64_t n : {int64_t{9}, int64_t{200003}}) {
          Tensor in(p, BP_DTYPE_F32, n * world);
          Tensor out(in, BP_DTYPE_F32, n, 0);
          fill(in, BP_DTYPE_F32, BP_REDUCE_SUM, c.rank);
          const Status s = c.reduce_scatter(in, out, BP_REDUCE_SUM);
          if (!s.ok()) return rep.add(c.rank, s.message);
          if (auto m = mismatch(out, BP_DTYPE_F32, BP_REDUCE_SUM, world, static_cast<uint64_t>(c.rank * n));
              !m.empty())
            rep.add(c.rank, "reduce_scatter into its own input: " + m);
        }
      },
      report);
  CHECK_NO_PROBLEMS(report);
}

}  // namespace

TEST_CASE("cpu_collectives: reduce_scatter gives rank r the reduction of block r with 2 ranks") {
  for_each_transport([](const Plugin& p) { check_reduce_scatter(p, 2); });
}

TEST_CASE("cpu_collectives: reduce_scatter gives rank r the reduction of block r with 3 ranks") {
  for_each_transport([](const Plugin& p) { check_reduce_scatter(p, 3); });
}

TEST_CASE("cpu_collectives: no rank leaves a barrier before every rank entered it") {
  for_each_transport([&](const Plugin& p) {
    for (int world : {2, 3, 5}) {
      CAPTURE(world);
      std::atomic<int> arrived{0};
      Report report;
      run_group(
          p, world,
          [&](Comm& c, Report& rep) {
            for (int round = 1; round <= 4; ++round) {
              // The last rank is late on purpose: the others must wait for it.
              if (c.rank == world - 1) std::this_thread::sleep_for(20ms);
              arrived.fetch_add(1);
              if (const Status s = c.barrier(); !s.ok()) return rep.add(c.rank, s.message);
              if (arrived.load() < round * world)
                rep.add(c.rank, "left barrier round " + std::to_string(round) + " with only " +
                                    std::to_string(arrived.load()) + " arrivals");
              // A second barrier so that no rank starts the next round before all checked.
              if (const Status s = c.barrier(); !s.ok()) return rep.add(c.rank, s.message);
            }
          },
          report);
      CHECK_NO_PROBLEMS(report);
    }
  });
}

TEST_CASE("cpu_collectives: two groups run at once in one process") {
  for_each_transport([&](const Plugin& p) {
    Report report;
    auto group = [&](const std::string& prefix, int32_t op) {
      run_group(
          p, 2,
          [&](Comm& c, Report& rep) {
            for (int i = 0; i < 5; ++i) {
              Tensor t(p, BP_DTYPE_F32, 100003);
              fill(t, BP_DTYPE_F32, op, c.rank);
              if (const Status s = c.all_reduce(t, t, op); !s.ok())
                return rep.add(c.rank, prefix + s.message);
              if (auto m = mismatch(t, BP_DTYPE_F32, op, 2); !m.empty()) rep.add(c.rank, prefix + m);
            }
          },
          report, 30000, prefix);
    };
    std::thread a(group, "first/", BP_REDUCE_SUM);
    std::thread b(group, "second/", BP_REDUCE_MAX);
    a.join();
    b.join();
    CHECK_NO_PROBLEMS(report);
  });
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

TEST_CASE("cpu_collectives: dtypes that cannot be reduced are unsupported and named") {
  Plugin p;
  Report report;
  run_group(
      p, 2,
      [&](Comm& c, Report& rep) {
        Tensor flags(p, BP_DTYPE_BOOL, 4);
        Tensor flags_out(p, BP_DTYPE_BOOL, 4);
        const Status s = c.all_reduce(flags, flags_out, BP_REDUCE_MAX);
        if (s.code != BP_STATUS_UNSUPPORTED || s.message.find("bool") == std::string::npos)
          rep.add(c.rank, "bool all_reduce: " + s.message);
        Tensor flags_blocks(p, BP_DTYPE_BOOL, 8);
        const Status rs = c.reduce_scatter(flags_blocks, flags, BP_REDUCE_SUM);
        if (rs.code != BP_STATUS_UNSUPPORTED || rs.message.find("bool") == std::string::npos)
          rep.add(c.rank, "bool reduce_scatter: " + rs.message);
        Tensor odd(p, BP_DTYPE_F32, 4);
        odd.raw().dtype = 77;
        const Status u = c.all_reduce(odd, odd, BP_REDUCE_SUM);
        if (u.code != BP_STATUS_UNSUPPORTED || u.message.find("dtype 77") == std::string::npos)
          rep.add(c.rank, "unknown dtype: " + u.message);
        // Refusals happen before anything is sent: the comm still works.
        Tensor t(p, BP_DTYPE_F32, 3);
        fill(t, BP_DTYPE_F32, BP_REDUCE_SUM, c.rank);
        if (const Status ok = c.all_reduce(t, t, BP_REDUCE_SUM); !ok.ok())
          rep.add(c.rank, "after refusals: " + ok.message);
        if (auto m = mismatch(t, BP_DTYPE_F32, BP_REDUCE_SUM, 2); !m.empty())
          rep.add(c.rank, "after refusals: " + m);
      },
      report);
  CHECK_NO_PROBLEMS(report);
}

TEST_CASE(
    "cpu_collectives: views that would reach outside their buffers are refused before anything is sent") {
  // The host never passes these; the plugin still refuses what would read or
  // write past a buffer (the SDK's make_view, and the element counts).
  for_each_transport([&](const Plugin& p) {
    bp_comm* comm = nullptr;
    REQUIRE(create_comm(p, nullptr, 0, 1, 1000, "args/", &comm).ok());
    Comm c{p, comm, 0, 1};
    Tensor a(p, BP_DTYPE_F32, 6);
    Tensor b(p, BP_DTYPE_F64, 6);
    Tensor shorter(p, BP_DTYPE_F32, 5);
    const Status dtypes = c.all_reduce(a, b, BP_REDUCE_SUM);
    CHECK(dtypes.code == BP_STATUS_INVALID_ARGUMENT);
    CHECK(dtypes.message.find("outputs[0]: dtype f64 differs from the expected f32") != std::string::npos);
    const Status counts = c.all_reduce(a, shorter, BP_REDUCE_SUM);
    CHECK(counts.code == BP_STATUS_INVALID_ARGUMENT);
    CHECK(counts.message.find("6 elements but output has 5") != std::string::npos);
    const Status op = c.all_reduce(a, a, 9);
    CHECK(op.code == BP_STATUS_INVALID_ARGUMENT);
    CHECK(op.message.find("unknown reduce op 9") != std::string::npos);
    // A transposed 2x3 view is not contiguous.
    const int64_t shape[2] = {2, 3};
    const int64_t strides[2] = {1, 2};
    bp_tensor strided = *a.desc();
    strided.ndim = 2;
    strided.shape = shape;
    strided.strides = strides;
    const Status s = c.raw_all_reduce(&strided, &strided, BP_REDUCE_SUM);
    CHECK(s.code == BP_STATUS_INVALID_ARGUMENT);
    CHECK(s.message.find("not contiguous") != std::string::npos);
    bp_tensor outside = *a.desc();
    outside.byte_offset = 8;  // 6 floats from byte 8 end past the 24-byte buffer
    const Status o = c.raw_all_reduce(&outside, &outside, BP_REDUCE_SUM);
    CHECK(o.code == BP_STATUS_INVALID_ARGUMENT);
    CHECK(o.message.find("reach outside the buffer of 24 bytes") != std::string::npos);
    // Refusals do not poison: the communicator still works.
    fill(a, BP_DTYPE_F32, BP_REDUCE_SUM, 0);
    CHECK(c.all_reduce(a, a, BP_REDUCE_SUM).ok());
    CHECK(mismatch(a, BP_DTYPE_F32, BP_REDUCE_SUM, 1).empty());
    destroy_comm(p, comm);
  });
}

namespace {

// World `world`: the last rank makes its communicator and destroys it at once;
// the others then all_reduce `n` floats. Returns each survivor's first and
// second status.
std::pair<std::vector<Status>, std::vector<Status>> run_with_vanishing_rank(const Plugin& p, int world,
                                                                            int64_t n) {
  MemoryStore store;
  std::vector<Status> first(world);
  std::vector<Status> second(world);
  std::promise<void> gone;
  std::shared_future<void> gone_future = gone.get_future().share();
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      bp_comm* comm = nullptr;
      const Status created = create_comm(p, &store, r, world, 5000, "vanish/", &comm);
      if (!created.ok()) {
        first[r] = created;
        if (r == world - 1) gone.set_value();
        return;
      }
      if (r == world - 1) {  // leaves without taking part
        destroy_comm(p, comm);
        gone.set_value();
        return;
      }
      gone_future.wait();
      Comm c{p, comm, r, world};
      Tensor t(p, BP_DTYPE_F32, n);
      first[r] = c.all_reduce(t, t, BP_REDUCE_SUM);
      second[r] = c.all_reduce(t, t, BP_REDUCE_SUM);
      destroy_comm(p, comm);
    });
  for (auto& t : ranks) t.join();
  first.pop_back();
  second.pop_back();
  return {first, second};
}

void check_failed_and_poisoned(const Status& first, const Status& second, int rank, int world) {
  CAPTURE(rank);
  MESSAGE(first.message);
  CHECK((first.code == BP_STATUS_COLLECTIVE || first.code == BP_STATUS_TIMEOUT));
  CHECK(first.message.find("all_reduce on rank " + std::to_string(rank) + " of " + std::to_string(world)) !=
        std::string::npos);
  CHECK(first.message.find("peer rank ") != std::string::npos);
  // Poisoned: the next call fails at once with the first error.
  CHECK(second.code == first.code);
  CHECK(second.message.find("failed earlier") != std::string::npos);
  CHECK(second.message.find(first.message) != std::string::npos);
}

}  // namespace

TEST_CASE("cpu_collectives: a rank that disappears fails its peer naming it and poisons the comm") {
  for_each_transport([&](const Plugin& p) {
    for (int64_t n : {int64_t{16}, int64_t{1} << 20}) {  // the direct round and the ring
      CAPTURE(n);
      const auto [first, second] = run_with_vanishing_rank(p, 2, n);
      check_failed_and_poisoned(first[0], second[0], 0, 2);
      CHECK(first[0].code == BP_STATUS_COLLECTIVE);
      CHECK(first[0].message.find("peer rank 1") != std::string::npos);
      CHECK(first[0].message.find("closed the connection") != std::string::npos);
    }
  });
}

TEST_CASE("cpu_collectives: a rank that disappears from three fails both others") {
  for_each_transport([&](const Plugin& p) {
    for (int64_t n : {int64_t{16}, int64_t{1} << 20}) {
      CAPTURE(n);
      const auto [first, second] = run_with_vanishing_rank(p, 3, n);
      for (int r = 0; r < 2; ++r) {
        check_failed_and_poisoned(first[r], second[r], r, 3);
        // Either it saw rank 2 go, or it saw the other survivor close after
        // failing, and passes on that survivor's error, which names rank 2.
        CHECK(first[r].message.find("peer rank 2") != std::string::npos);
      }
    }
  });
}

// Rank 0 calls all_reduce alone and times out (timeout 1500 ms); rank 1,
// connected all along, calls only then, after `between` has run.
struct LateCall {
  Status created;  // rank 0's comm_create
  Status result;   // rank 0's all_reduce
  Status late;     // rank 1's
};
template <class Between>
LateCall call_late(const Plugin& p, MemoryStore& store, const char* prefix, Between between) {
  LateCall out;
  std::promise<void> done;
  std::shared_future<void> done_future = done.get_future().share();
  std::thread rank1([&] {
    bp_comm* comm = nullptr;
    if (!create_comm(p, &store, 1, 2, 1500, prefix, &comm).ok()) return;
    done_future.wait();
    Comm c{p, comm, 1, 2};
    Tensor t(p, BP_DTYPE_F32, 1000);
    out.late = c.all_reduce(t, t, BP_REDUCE_SUM);
    destroy_comm(p, comm);
  });
  bp_comm* comm = nullptr;
  out.created = create_comm(p, &store, 0, 2, 1500, prefix, &comm);
  if (out.created.ok()) {
    Comm c{p, comm, 0, 2};
    Tensor t(p, BP_DTYPE_F32, 1000);
    out.result = c.all_reduce(t, t, BP_REDUCE_SUM);
  }
  between();
  done.set_value();
  rank1.join();
  if (out.created.ok()) destroy_comm(p, comm);
  return out;
}

TEST_CASE("cpu_collectives: a rank that never calls makes the others time out naming it") {
  for_each_transport([&](const Plugin& p) {
    MemoryStore store;
    const LateCall r = call_late(p, store, "silent/", [] {});
    REQUIRE(r.created.ok());
    MESSAGE(r.result.message);
    CHECK(r.result.code == BP_STATUS_TIMEOUT);
    // The time really waited, then the configured timeout.
    CHECK(r.result.message.find("timed out after ") != std::string::npos);
    CHECK(r.result.message.find(" ms (timeout 1500 ms) waiting for peer rank 1") != std::string::npos);
    // The late rank learns why its peer is gone: rank 0's own error.
    MESSAGE(r.late.message);
    CHECK(r.late.code == BP_STATUS_COLLECTIVE);
    CHECK(r.late.message.find("peer rank 0") != std::string::npos);
    CHECK(r.late.message.find("after failing itself") != std::string::npos);
    CHECK(r.late.message.find("(timeout 1500 ms) waiting for peer rank 1") != std::string::npos);
  });
}

TEST_CASE("cpu_collectives: a late rank on the same host learns its peer's error once the store is gone") {
  // The rank that served the store fails and exits before its peer calls: on
  // shared memory the peer reads the error from the segment; Gloo's peers have
  // only the store's failure board, so they say the connection closed.
  for (const TransportCase& transport : kTransports) {
    const std::string name = transport.name;
    CAPTURE(name);
    const Plugin p(transport.options);
    const bool shared_memory = name != "gloo";
    MemoryStore store;
    const LateCall r = call_late(p, store, "gone/", [&] { store.fail_gets(); });  // gone with rank 0
    REQUIRE(r.created.ok());
    CHECK(r.result.code == BP_STATUS_TIMEOUT);
    MESSAGE(r.late.message);
    CHECK(r.late.code == BP_STATUS_COLLECTIVE);
    CHECK(r.late.message.find("peer rank 0") != std::string::npos);
    const bool has_reason =
        r.late.message.find("(timeout 1500 ms) waiting for peer rank 1") != std::string::npos;
    CHECK(has_reason == shared_memory);
  }
}

TEST_CASE("cpu_collectives: ranks that disagree on a call fail instead of crashing") {
  // Gloo's I/O thread aborts the process when a message is longer than the
  // receive posted for it; each case below would send one.
  struct Case {
    const char* name;
    int64_t count0, count1;
    int32_t op0, op1;
  };
  for_each_transport([&](const Plugin& p) {
    for (const Case& k : {Case{"small counts", 1000, 2000, BP_REDUCE_SUM, BP_REDUCE_SUM},
                          Case{"large counts", 300000, 400000, BP_REDUCE_SUM, BP_REDUCE_SUM},
                          Case{"reduce ops", 1000, 1000, BP_REDUCE_SUM, BP_REDUCE_MAX}}) {
      const std::string name = k.name;
      CAPTURE(name);
      const std::vector<Status> results = run_two_ranks(p, p, 1000, "disagree/", [&](Comm& c) {
        Tensor t(p, BP_DTYPE_F32, c.rank == 0 ? k.count0 : k.count1);
        return c.all_reduce(t, t, c.rank == 0 ? k.op0 : k.op1);
      });
      bool one_says_why = false;
      for (int r = 0; r < 2; ++r) {
        CAPTURE(r);
        MESSAGE(results[r].message);
        CHECK((results[r].code == BP_STATUS_TIMEOUT || results[r].code == BP_STATUS_COLLECTIVE));
        CHECK(results[r].message.find("peer rank " + std::to_string(1 - r)) != std::string::npos);
        one_says_why =
            one_says_why || results[r].message.find("with the same arguments") != std::string::npos;
      }
      CHECK(one_says_why);
    }
  });
}

TEST_CASE("cpu_collectives: ranks that disagree on the broadcast root fail instead of succeeding") {
  // Each rank only sends: a transport that completed a send before its peer
  // received it would let both return OK with different data.
  for_each_transport([&](const Plugin& p) {
    const std::vector<Status> results = run_two_ranks(p, p, 1000, "roots/", [&](Comm& c) {
      Tensor t(p, BP_DTYPE_F32, 256);
      return c.broadcast(t, c.rank);  // each names itself the root
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      MESSAGE(results[r].message);
      CHECK((results[r].code == BP_STATUS_TIMEOUT || results[r].code == BP_STATUS_COLLECTIVE));
      CHECK(results[r].message.find("peer rank " + std::to_string(1 - r)) != std::string::npos);
    }
  });
}

// ---------------------------------------------------------------------------
// comm_abort
// ---------------------------------------------------------------------------

namespace {

// A pair of communicators of a 2-rank group (rank 0 made on this thread,
// rank 1 on a helper), with a long timeout: whatever returns early below
// returns because of the abort.
constexpr int64_t kLongTimeoutMs = 60000;

struct Pair {
  bp_comm* rank0 = nullptr;
  bp_comm* rank1 = nullptr;
};

Pair make_pair(const Plugin& p, MemoryStore& store, const std::string& prefix) {
  Pair pair;
  Status s1;
  std::thread helper([&] { s1 = create_comm(p, &store, 1, 2, kLongTimeoutMs, prefix, &pair.rank1); });
  const Status s0 = create_comm(p, &store, 0, 2, kLongTimeoutMs, prefix, &pair.rank0);
  helper.join();
  REQUIRE(s0.ok());
  REQUIRE(s1.ok());
  return pair;
}

}  // namespace

TEST_CASE("cpu_collectives: comm_abort from another thread ends a collective waiting for a silent peer") {
  for_each_transport([&](const Plugin& p) {
    for (int64_t n : {int64_t{16}, int64_t{1} << 20}) {  // the direct round and the ring
      CAPTURE(n);
      MemoryStore store;
      const Pair pair = make_pair(p, store, "abort-busy/");
      Comm c0{p, pair.rank0, 0, 2};
      Comm c1{p, pair.rank1, 1, 2};
      // Rank 0 enters an all_reduce that rank 1 never joins.
      std::promise<Status> result;
      std::future<Status> waited = result.get_future();
      std::atomic<bool> entered{false};
      const auto start = std::chrono::steady_clock::now();
      std::thread rank0([&] {
        Tensor t(p, BP_DTYPE_F32, n);
        entered = true;
        result.set_value(c0.all_reduce(t, t, BP_REDUCE_SUM));
      });
      while (!entered) std::this_thread::yield();
      std::this_thread::sleep_for(100ms);  // most likely blocked inside by now; either way it must fail
      CHECK(c0.abort().ok());
      REQUIRE(waited.wait_for(std::chrono::milliseconds(kLongTimeoutMs / 2)) == std::future_status::ready);
      rank0.join();
      const Status first = waited.get();
      MESSAGE(first.message);
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(kLongTimeoutMs));
      CHECK(first.code == BP_STATUS_COLLECTIVE);
      CHECK(first.message.find("all_reduce on rank 0 of 2: aborted") != std::string::npos);
      // Later calls fail at once; a second abort is harmless.
      Tensor t(p, BP_DTYPE_F32, 4);
      const Status later = c0.all_reduce(t, t, BP_REDUCE_SUM);
      CHECK(later.code == BP_STATUS_COLLECTIVE);
      CHECK(later.message.find("aborted") != std::string::npos);
      CHECK(c0.barrier().code == BP_STATUS_COLLECTIVE);
      CHECK(c0.abort().ok());
      // The peer learns why the connection went.
      const Status peer = c1.all_reduce(t, t, BP_REDUCE_SUM);
      MESSAGE(peer.message);
      CHECK(peer.code == BP_STATUS_COLLECTIVE);
      CHECK(peer.message.find("peer rank 0") != std::string::npos);
      CHECK(peer.message.find("rank 0 of 2 aborted its communicator") != std::string::npos);
      CHECK(destroy_comm(p, pair.rank0).ok());
      CHECK(destroy_comm(p, pair.rank1).ok());
      CHECK(store.freed() == store.handed_out());  // every value the store gave was freed
    }
  });
}

TEST_CASE("cpu_collectives: comm_abort on an idle rank ends its peer's wait for it") {
  for_each_transport([&](const Plugin& p) {
    MemoryStore store;
    const Pair pair = make_pair(p, store, "abort-idle/");
    Comm c1{p, pair.rank1, 1, 2};
    std::promise<Status> result;
    std::future<Status> waited = result.get_future();
    std::thread rank1([&] {
      Tensor t(p, BP_DTYPE_I64, 1000);
      result.set_value(c1.barrier());
    });
    std::this_thread::sleep_for(100ms);
    CHECK(abort_comm(p, pair.rank0).ok());
    REQUIRE(waited.wait_for(std::chrono::milliseconds(kLongTimeoutMs / 2)) == std::future_status::ready);
    rank1.join();
    const Status s = waited.get();
    MESSAGE(s.message);
    CHECK(s.code == BP_STATUS_COLLECTIVE);
    CHECK(s.message.find("barrier on rank 1 of 2: peer rank 0") != std::string::npos);
    CHECK(s.message.find("aborted its communicator") != std::string::npos);
    CHECK(destroy_comm(p, pair.rank0).ok());
    CHECK(destroy_comm(p, pair.rank1).ok());
  });
}

TEST_CASE("cpu_collectives: an aborted group of one refuses collectives and destroys cleanly") {
  Plugin p;
  bp_comm* comm = nullptr;
  REQUIRE(create_comm(p, nullptr, 0, 1, 1000, "solo-abort/", &comm).ok());
  Comm c{p, comm, 0, 1};
  Tensor t(p, BP_DTYPE_F64, 3);
  CHECK(c.all_reduce(t, t, BP_REDUCE_SUM).ok());
  CHECK(c.abort().ok());
  const Status s = c.all_reduce(t, t, BP_REDUCE_SUM);
  CHECK(s.code == BP_STATUS_COLLECTIVE);
  CHECK(s.message.find("aborted") != std::string::npos);
  CHECK(destroy_comm(p, comm).ok());
}

// ---------------------------------------------------------------------------
// Where collectives listen
// ---------------------------------------------------------------------------

namespace {

// A 2-rank all_reduce with the plugin created from `options`; "" when it worked.
std::string two_rank_sum(const Plugin& p) {
  Report report;
  run_group(
      p, 2,
      [&](Comm& c, Report& rep) {
        Tensor t(p, BP_DTYPE_F32, 10);
        fill(t, BP_DTYPE_F32, BP_REDUCE_SUM, c.rank);
        if (const Status s = c.all_reduce(t, t, BP_REDUCE_SUM); !s.ok()) return rep.add(c.rank, s.message);
        if (auto m = mismatch(t, BP_DTYPE_F32, BP_REDUCE_SUM, 2); !m.empty()) rep.add(c.rank, m);
      },
      report, 5000);
  const auto problems = report.problems();
  return problems.empty() ? "" : problems.front();
}

// A 2-rank sum with rank r on plugin r (options that differ between ranks).
void check_mixed_sum(const Plugin& p0, const Plugin& p1, const std::string& prefix) {
  const std::vector<Status> results = run_two_ranks(p0, p1, 10000, prefix, [&](Comm& c) {
    Tensor t(c.p, BP_DTYPE_F32, 1000);
    fill(t, BP_DTYPE_F32, BP_REDUCE_SUM, c.rank);
    Status s = c.all_reduce(t, t, BP_REDUCE_SUM);
    if (auto m = s.ok() ? mismatch(t, BP_DTYPE_F32, BP_REDUCE_SUM, 2) : std::string(); !m.empty())
      s = {BP_STATUS_INTERNAL, m};
    return s;
  });
  for (const Status& r : results) {
    MESSAGE(r.message);
    CHECK(r.ok());
  }
}

}  // namespace

TEST_CASE("cpu_collectives: the hostname and interface options choose where to listen") {
  {
    // The default: this machine's name, or loopback when it does not resolve.
    Plugin p(R"({"shared_memory": false})");
    REQUIRE(p.create_status().ok());
    CHECK(two_rank_sum(p) == "");
  }
  {
    Plugin p(R"({"hostname": "127.0.0.1", "shared_memory": false})");
    REQUIRE(p.create_status().ok());
    CHECK(two_rank_sum(p) == "");
  }
  {
    Plugin p(R"({"interface": "lo", "threads": 1, "shared_memory": false})");
    REQUIRE(p.create_status().ok());
    CHECK(two_rank_sum(p) == "");
  }
  {
    // Ranks on shared memory listen nowhere: the option is not read.
    Plugin p(R"({"interface": "no-such-if0"})");
    REQUIRE(p.create_status().ok());
    CHECK(two_rank_sum(p) == "");
  }
  {
    Plugin p(R"({"interface": "no-such-if0", "shared_memory": false})");
    REQUIRE(p.create_status().ok());  // checked when a comm is made, not at load
    const std::string problem = two_rank_sum(p);
    CHECK(problem.find("no-such-if0") != std::string::npos);
    CHECK(problem.find("option \"interface\"") != std::string::npos);
    CHECK(problem.find("interfaces with one: ") != std::string::npos);  // what would work instead
  }
  Plugin both(R"({"interface": "lo", "hostname": "localhost"})");
  CHECK(both.create_status().code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(both.create_status().message.find("set one of them") != std::string::npos);
  Plugin empty(R"({"hostname": ""})");
  CHECK(empty.create_status().code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(empty.create_status().message.find("non-empty string") != std::string::npos);
  Plugin unknown(R"({"host": "x"})");
  CHECK(unknown.create_status().code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(unknown.create_status().message.find("\"interface\"") != std::string::npos);
  CHECK(unknown.create_status().message.find("\"hierarchical\"") != std::string::npos);
}

TEST_CASE("cpu_collectives: the hierarchical option is a boolean, and off changes nothing on one host") {
  // Across hosts it keeps groups on Gloo alone (integration.netns: 2 hosts of 2 ranks).
  Plugin off(R"({"hierarchical": false})");
  REQUIRE(off.create_status().ok());
  CHECK(two_rank_sum(off) == "");
  Plugin wrong(R"({"hierarchical": "no"})");
  CHECK(wrong.create_status().code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(wrong.create_status().message.find("hierarchical") != std::string::npos);
}

TEST_CASE("cpu_collectives: the collective option switches collectives off") {
  Plugin off(R"({"collective": false})");
  REQUIRE(off.create_status().ok());
  bp_device_info_args info{};
  info.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE;
  info.plugin = off.get();
  REQUIRE(off.take(off.api().device_info(&info)).ok());
  CHECK((info.capabilities & BP_CAP_COLLECTIVE) == 0);
  CHECK((info.capabilities & BP_CAP_HOST_VISIBLE) != 0);
  bp_comm* comm = nullptr;
  const Status s = create_comm(off, nullptr, 0, 1, 1000, "off/", &comm);
  CHECK(s.code == BP_STATUS_UNSUPPORTED);
  CHECK(s.message.find("\"collective\": false") != std::string::npos);
  Plugin bad(R"({"collective": "no"})");
  CHECK(bad.create_status().code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(bad.create_status().message.find("true or false") != std::string::npos);
}

TEST_CASE("cpu_collectives: GLOO_SOCKET_IFNAME wins over the options") {
  Plugin p(R"({"interface": "no-such-if0", "shared_memory": false})");
  REQUIRE(p.create_status().ok());
  setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  CHECK(two_rank_sum(p) == "");
  setenv("GLOO_SOCKET_IFNAME", "no-such-if1", 1);
  const std::string problem = two_rank_sum(p);
  CHECK(problem.find("no-such-if1") != std::string::npos);
  CHECK(problem.find("GLOO_SOCKET_IFNAME") != std::string::npos);
  setenv("GLOO_SOCKET_IFNAME", "lo,eth0", 1);
  CHECK(two_rank_sum(p).find("several interfaces") != std::string::npos);
  unsetenv("GLOO_SOCKET_IFNAME");
}

namespace {

// How many lines logged since `from` contain `text` (at `level`, or any).
std::size_t logged_since(std::size_t from, const std::string& text, int32_t level = -1) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::size_t n = 0;
  for (std::size_t i = from; i < g_log.size(); ++i)
    n += g_log[i].find(text) != std::string::npos && (level < 0 || g_log_levels[i] == level) ? 1 : 0;
  return n;
}

std::size_t log_size() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  return g_log.size();
}

}  // namespace

TEST_CASE("cpu_collectives: ranks on one host use shared memory unless a rank switches it off") {
  Plugin shm(kTransports[0].options);
  Plugin tcp(kTransports[1].options);
  const std::size_t before = log_size();
  CHECK(two_rank_sum(shm) == "");
  CHECK(logged_since(before, "connected to 1 peers through shared memory") == 2);

  const std::size_t off = log_size();
  CHECK(two_rank_sum(tcp) == "");
  CHECK(logged_since(off, "through shared memory") == 0);
  CHECK(logged_since(off, "shared memory not used: switched off (shared_memory)") == 2);

  // One rank with it off: both use Gloo, and the other says why.
  const std::size_t mixed = log_size();
  check_mixed_sum(shm, tcp, "mixed/");
  CHECK(logged_since(mixed, "through shared memory") == 0);
  CHECK(logged_since(mixed, "rank 1 has it switched off or cannot tell its host") == 1);
}

TEST_CASE("cpu_collectives: a group of 20 ranks on one host shares memory through an inbox per rank") {
  // Above 16 ranks a ring per pair would take 380 rings; an inbox per rank
  // keeps the segment linear in the group: 20 inboxes of 1 MiB.
  constexpr int kWorld = 20;
  Plugin p(kTransports[0].options);
  const std::size_t before = log_size();
  Report report;
  run_group(
      p, kWorld,
      [&](Comm& c, Report& rep) {
        // The direct round (every rank sends to every other), then the ring.
        for (int64_t n : {int64_t{5}, int64_t{70001}}) {
          Tensor t(p, BP_DTYPE_F32, n);
          fill(t, BP_DTYPE_F32, BP_REDUCE_SUM, c.rank);
          if (const Status s = c.all_reduce(t, t, BP_REDUCE_SUM); !s.ok()) return rep.add(c.rank, s.message);
          if (auto m = mismatch(t, BP_DTYPE_F32, BP_REDUCE_SUM, kWorld); !m.empty())
            rep.add(c.rank, what("all_reduce", BP_DTYPE_F32, BP_REDUCE_SUM, n) + ": " + m);
        }
        Tensor root_data(p, BP_DTYPE_I64, 3000);
        fill(root_data, BP_DTYPE_I64, BP_REDUCE_SUM, c.rank);
        if (const Status s = c.broadcast(root_data, 13); !s.ok()) return rep.add(c.rank, s.message);
        for (int64_t i = 0; i < 3000; ++i)
          if (root_data.as<int64_t>()[i] != value(BP_DTYPE_I64, BP_REDUCE_SUM, 13, i))
            return rep.add(c.rank, "broadcast from rank 13: element " + std::to_string(i) + " differs");
        Tensor mine(p, BP_DTYPE_F64, 100);
        Tensor all(p, BP_DTYPE_F64, 100 * kWorld);
        fill(mine, BP_DTYPE_F64, BP_REDUCE_SUM, c.rank);
        if (const Status s = c.all_gather(mine, all); !s.ok()) return rep.add(c.rank, s.message);
        for (int r = 0; r < kWorld; ++r)
          if (get(BP_DTYPE_F64, all.data(), r * 100 + 7) !=
              static_cast<double>(value(BP_DTYPE_F64, BP_REDUCE_SUM, r, 7)))
            return rep.add(c.rank, "all_gather: block " + std::to_string(r) + " is wrong");
        Tensor blocks(p, BP_DTYPE_F32, 64 * kWorld);
        Tensor block(p, BP_DTYPE_F32, 64);
        fill(blocks, BP_DTYPE_F32, BP_REDUCE_MAX, c.rank);
        if (const Status s = c.reduce_scatter(blocks, block, BP_REDUCE_MAX); !s.ok())
          return rep.add(c.rank, s.message);
        if (auto m = mismatch(block, BP_DTYPE_F32, BP_REDUCE_MAX, kWorld, static_cast<uint64_t>(c.rank * 64));
            !m.empty())
          rep.add(c.rank, "reduce_scatter: " + m);
        if (const Status s = c.barrier(); !s.ok()) rep.add(c.rank, s.message);
      },
      report, 60000, "twenty/");
  CHECK_NO_PROBLEMS(report);
  CHECK(logged_since(before, "connected to 19 peers through shared memory") == kWorld);
  CHECK(logged_since(before, "holds an inbox per rank, 1024 KiB each") == kWorld);
}

TEST_CASE("cpu_collectives: rank 0's shared_memory_pair_rings chooses the layout for the whole group") {
  Plugin pairs(kTransports[0].options);
  Plugin inboxes(kTransports[2].options);
  for (bool rank0_inboxes : {false, true}) {
    CAPTURE(rank0_inboxes);
    const std::size_t before = log_size();
    check_mixed_sum(rank0_inboxes ? inboxes : pairs, rank0_inboxes ? pairs : inboxes, "layout/");
    CHECK(logged_since(before, rank0_inboxes ? "holds an inbox per rank, 2048 KiB each"
                                             : "holds a ring per pair of ranks, 1024 KiB each") == 2);
  }
  Plugin bad(R"({"shared_memory_pair_rings": 33})");
  CHECK(bad.create_status().code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(bad.create_status().message.find("\"shared_memory_pair_rings\" must be an integer from 0 to 32") !=
        std::string::npos);
}

namespace {

// A segment's name: "/backplane-<pid namespace inode>-<pid>-<random>".
std::string segment_name(uint64_t ns, pid_t pid, const char* suffix) {
  return "/backplane-" + std::to_string(ns) + "-" + std::to_string(pid) + "-" + suffix;
}

uint64_t own_pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

bool segment_exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

void make_segment(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  close(fd);
}

}  // namespace

TEST_CASE("cpu_collectives: a segment name left by a killed rank 0 is removed by the next group, no other") {
  const uint64_t ns = own_pid_namespace();
  REQUIRE(ns != 0);
  // A process that has exited: its id names a segment nobody will remove.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  const std::string stale = segment_name(ns, child, "0123456789abcdef");
  make_segment(stale);
  // This process's own names stay: it is alive.
  const std::string mine = segment_name(ns, getpid(), "fedcba9876543210");
  make_segment(mine);
  // The same dead id in another PID namespace may be a live process there
  // (a container sharing /dev/shm): its name stays.
  const std::string elsewhere = segment_name(ns + 1, child, "00112233445566aa");
  make_segment(elsewhere);
  // Names of the form before the namespace was in them say nothing of it: they stay.
  const std::string old_form = "/backplane-" + std::to_string(child) + "-8899aabbccddeeff";
  make_segment(old_form);
  // Another user's name stays, whatever its process id (root can tell: it can give a file away).
  const std::string theirs = segment_name(ns, child, "a1b2c3d4e5f60718");
  make_segment(theirs);
  const bool chowned = geteuid() == 0 && chown(("/dev/shm" + theirs).c_str(), 65534, 65534) == 0;

  Plugin p(kTransports[0].options);
  CHECK(two_rank_sum(p) == "");
  CHECK_FALSE(segment_exists(stale));
  CHECK(segment_exists(mine));
  CHECK(segment_exists(elsewhere));
  CHECK(segment_exists(old_form));
  if (chowned)
    CHECK(segment_exists(theirs));
  else
    MESSAGE("not root: another user's segment cannot be made, that case is not checked");
  for (const std::string& name : {stale, mine, elsewhere, old_form, theirs}) shm_unlink(name.c_str());
}

TEST_CASE(
    "cpu_collectives: a failed shared-memory setup on one host falls back to TCP with a warning, once") {
  std::size_t warned_before = 0;
  {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    for (std::size_t i = 0; i < g_log.size(); ++i)
      warned_before += g_log[i].find("collectives fall back to TCP") != std::string::npos ? 1 : 0;
  }
  Plugin p(kTransports[0].options);
  const auto run = [&](const std::string& prefix) {
    // Rank 0 publishes a segment that does not exist, as if its name had been
    // removed before rank 1 mapped it.
    MemoryStore store;
    store.replace_sets("shm/segment", "/backplane-0-0-missing\n0123456789abcdef0123456789abcdef\n1");
    std::vector<Status> results(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        bp_comm* comm = nullptr;
        results[r] = create_comm(p, &store, r, 2, 10000, prefix, &comm);
        if (!results[r].ok()) return;
        Comm c{p, comm, r, 2};
        Tensor t(p, BP_DTYPE_F32, 100);
        fill(t, BP_DTYPE_F32, BP_REDUCE_SUM, r);
        results[r] = c.all_reduce(t, t, BP_REDUCE_SUM);
        if (auto m = results[r].ok() ? mismatch(t, BP_DTYPE_F32, BP_REDUCE_SUM, 2) : std::string();
            !m.empty())
          results[r] = {BP_STATUS_INTERNAL, m};
        destroy_comm(p, comm);
      });
    for (auto& t : ranks) t.join();
    for (const Status& r : results) CHECK_MESSAGE(r.ok(), r.message);  // over TCP the collective works
  };
  const std::size_t first = log_size();
  run("fallback-1/");
  CHECK(logged_since(first, "through shared memory") == 0);
  // Rank 1 cannot map the segment; rank 0 hears so from it. Both say why.
  CHECK(logged_since(first, "shm_open: No such file or directory") == 2);
  if (warned_before == 0) CHECK(logged_since(first, "collectives fall back to TCP", BP_LOG_WARNING) == 1);
  const std::size_t second = log_size();
  run("fallback-2/");
  CHECK(logged_since(second, "collectives fall back to TCP") == 0);  // at debug level now
  CHECK(logged_since(second, "shared memory not used: ", BP_LOG_DEBUG) == 2);
}
