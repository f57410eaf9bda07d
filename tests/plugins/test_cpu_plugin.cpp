// The cpu plugin's op side through its ABI table alone (dlopen + bp_plugin_entry,
// no core): lazy start (listing loads no kernel library), the device's flags and
// supports_op against execute, the options that narrow what the device claims,
// flush_denormals, DLPack import, data-dependent errors, and softmax of widely spread logits.
// Requests are the ones a host would send.
#include <backplane/abi.h>
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <link.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace {

const bp_host_api g_host{BP_HOST_API_STRUCT_SIZE,
                         BP_ABI_MAJOR,
                         BP_ABI_MINOR,
                         nullptr,
                         [](void*, int32_t, const char*) {},
                         nullptr,
                         nullptr};

// True when a library whose file name contains `part` is mapped in this process.
bool loaded(const char* part) {
  struct Search {
    const char* part;
    bool found;
  } search{part, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, s->part) != nullptr) s->found = true;
        return 0;
      },
      &search);
  return search.found;
}

// Takes a status: its code (BP_STATUS_OK for NULL) and message, freed.
struct Outcome {
  int32_t code = BP_STATUS_OK;
  std::string message;
};

// The plugin's ABI table (dlopen + bp_plugin_entry).
const bp_plugin_api* load_api() {
  const std::string path = std::string(BP_TEST_PLUGIN_DIR) + "/libbackplane_cpu.so";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(lib != nullptr, std::string(dlerror()));
  auto entry = reinterpret_cast<bp_plugin_entry_fn>(dlsym(lib, BP_PLUGIN_ENTRY_SYMBOL));
  const bool has_entry = entry != nullptr;  // doctest cannot print a function pointer
  REQUIRE_MESSAGE(has_entry, "no " BP_PLUGIN_ENTRY_SYMBOL);
  const bp_plugin_api* api = entry(&g_host);
  REQUIRE_MESSAGE(api != nullptr, "bp_plugin_entry returned NULL");
  return api;
}

class Plugin {
 public:
  explicit Plugin(const char* options = R"({"threads": 2})") : api(load_api()) {
    bp_create_args c{BP_CREATE_ARGS_STRUCT_SIZE, "cpu", options, &g_host, nullptr};
    REQUIRE(take(api->create(&c)).code == BP_STATUS_OK);
    plugin = c.plugin;
  }
  ~Plugin() {
    for (bp_buffer* b : buffers_) {
      bp_buffer_free_args f{BP_BUFFER_FREE_ARGS_STRUCT_SIZE, plugin, b};
      take(api->buffer_free(&f));
    }
    api->destroy(plugin);
  }

  Outcome take(bp_status* s) const {
    Outcome o;
    if (s != nullptr) {
      o.code = api->status_code(s);
      o.message = api->status_message(s);
      api->status_free(s);
    }
    return o;
  }

  bp_buffer* alloc(uint64_t bytes) {
    bp_buffer_alloc_args a{BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, plugin, 0, 0, bytes, nullptr};
    REQUIRE(take(api->buffer_alloc(&a)).code == BP_STATUS_OK);
    buffers_.push_back(a.buffer);
    return a.buffer;
  }
  template <class T>
  bp_buffer* upload(const std::vector<T>& values) {
    bp_buffer* b = alloc(values.size() * sizeof(T));
    bp_buffer_copy_args w{BP_BUFFER_COPY_ARGS_STRUCT_SIZE, plugin,        b,      0,
                          values.size() * sizeof(T),       values.data(), nullptr};
    REQUIRE(take(api->buffer_write(&w)).code == BP_STATUS_OK);
    return b;
  }
  template <class T>
  std::vector<T> download(bp_buffer* b, size_t count) {
    std::vector<T> out(count);
    bp_buffer_copy_args r{
        BP_BUFFER_COPY_ARGS_STRUCT_SIZE, plugin, b, 0, count * sizeof(T), nullptr, out.data()};
    REQUIRE(take(api->buffer_read(&r)).code == BP_STATUS_OK);
    return out;
  }
  Outcome execute(int32_t op, std::vector<bp_tensor> inputs, bp_tensor output, bp_op_attrs attrs = {}) {
    attrs.struct_size = BP_OP_ATTRS_STRUCT_SIZE;
    bp_execute_args e{BP_EXECUTE_ARGS_STRUCT_SIZE,         plugin, 0,     op, inputs.data(), &output,
                      static_cast<int32_t>(inputs.size()), 1,      &attrs};
    return take(api->execute(&e));
  }
  bp_device_info_args info() {
    bp_device_info_args i{BP_DEVICE_INFO_ARGS_STRUCT_SIZE, plugin, 0, 0, nullptr, 0, nullptr};
    REQUIRE(take(api->device_info(&i)).code == BP_STATUS_OK);
    return i;
  }
  // The value of device attribute `name`, "" when the device has none.
  std::string attribute(const char* name) {
    const bp_device_info_args i = info();
    for (int32_t a = 0; a < i.num_attributes; ++a)
      if (std::string(i.attributes[a].name) == name) return i.attributes[a].value;
    return {};
  }
  bool supports(int32_t op, int32_t dtype) {
    bp_supports_op_args s{BP_SUPPORTS_OP_ARGS_STRUCT_SIZE, plugin, 0, op, dtype, 0};
    REQUIRE(take(api->supports_op(&s)).code == BP_STATUS_OK);
    return s.supported != 0;
  }

  const bp_plugin_api* api = nullptr;
  bp_plugin* plugin = nullptr;

 private:
  std::vector<bp_buffer*> buffers_;
};

// What create answers to `options` (the instance it made, if any, destroyed).
Outcome create(const char* options) {
  const bp_plugin_api* api = load_api();
  bp_create_args c{BP_CREATE_ARGS_STRUCT_SIZE, "cpu", options, &g_host, nullptr};
  bp_status* s = api->create(&c);
  Outcome o;
  if (s != nullptr) {
    o.code = api->status_code(s);
    o.message = api->status_message(s);
    api->status_free(s);
  } else {
    api->destroy(c.plugin);
  }
  return o;
}

// A dense tensor of `shape` over buffer b (the shape array must outlive it).
bp_tensor dense(bp_buffer* b, int32_t dtype, const std::vector<int64_t>& shape,
                std::vector<int64_t>& strides) {
  strides.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return bp_tensor{b, 0, 0, dtype, static_cast<int32_t>(shape.size()), 0, shape.data(), strides.data()};
}

}  // namespace

TEST_CASE("cpu: loading, creating and describing the device start no kernel library, the first buffer does") {
  Plugin p;
  bp_device_count_args count{BP_DEVICE_COUNT_ARGS_STRUCT_SIZE, p.plugin, 0};
  REQUIRE(p.take(p.api->device_count(&count)).code == BP_STATUS_OK);
  CHECK(count.num_devices == 1);
  bp_device_info_args info{BP_DEVICE_INFO_ARGS_STRUCT_SIZE, p.plugin, 0, 0, nullptr, 0, nullptr};
  REQUIRE(p.take(p.api->device_info(&info)).code == BP_STATUS_OK);
  // "host (2 threads)"; a build without OpenMP (ThreadSanitizer's) runs 1.
  const std::string name = info.name;
  CHECK_MESSAGE((name == "host (2 threads)" || name == "host (1 threads)"), name);
  bp_device_memory_args mem{BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE, p.plugin, 0, 0, 0, 0};
  REQUIRE(p.take(p.api->device_memory(&mem)).code == BP_STATUS_OK);
  CHECK(mem.total_bytes > 0);
  CHECK(mem.free_bytes <= mem.total_bytes);
  // This test binary links none of them, so only the plugin could have loaded them.
  CHECK_FALSE(loaded("libbackplane_cpu_engine"));
  CHECK_FALSE(loaded("libopenblas"));
  CHECK_FALSE(loaded("libgloo"));
  CHECK_FALSE(loaded("libgomp"));
  p.alloc(16);
  CHECK(loaded("libbackplane_cpu_engine"));
}

TEST_CASE("cpu: the device holds all nine dtypes, and supports_op agrees with execute") {
  Plugin p;
  bp_device_info_args info{BP_DEVICE_INFO_ARGS_STRUCT_SIZE, p.plugin, 0, 0, nullptr, 0, nullptr};
  REQUIRE(p.take(p.api->device_info(&info)).code == BP_STATUS_OK);
  for (int32_t d = BP_DTYPE_F32; d < BP_DTYPE_COUNT_; ++d) CHECK((info.capabilities & BP_CAP_DTYPE(d)) != 0);
  CHECK((info.capabilities & (BP_CAP_HOST_VISIBLE | BP_CAP_MATMUL | BP_CAP_COLLECTIVE)) ==
        (BP_CAP_HOST_VISIBLE | BP_CAP_MATMUL | BP_CAP_COLLECTIVE));
  CHECK((info.capabilities & BP_CAP_ASYNC) == 0);

  CHECK(p.supports(BP_OP_ADD, BP_DTYPE_I64));
  CHECK_FALSE(p.supports(BP_OP_ADD, BP_DTYPE_F16));
  CHECK(p.supports(BP_OP_COPY, BP_DTYPE_BF16));
  CHECK(p.supports(BP_OP_EQ, BP_DTYPE_BOOL));
  CHECK_FALSE(p.supports(BP_OP_SOFTMAX, BP_DTYPE_I32));
  CHECK_FALSE(p.supports(BP_OP_COUNT_, BP_DTYPE_F32));
  CHECK_FALSE(p.supports(BP_OP_ADD, BP_DTYPE_COUNT_));

  // What supports_op refuses, execute refuses with UNSUPPORTED naming the dtypes it takes.
  std::vector<int64_t> shape{4}, s1, s2, s3;
  bp_buffer* a = p.alloc(8);
  bp_buffer* b = p.alloc(8);
  bp_buffer* o = p.alloc(8);
  const Outcome r =
      p.execute(BP_OP_ADD, {dense(a, BP_DTYPE_F16, shape, s1), dense(b, BP_DTYPE_F16, shape, s2)},
                dense(o, BP_DTYPE_F16, shape, s3));
  CHECK(r.code == BP_STATUS_UNSUPPORTED);
  CHECK(r.message.find("add: dtype f16 is not supported (f32, f64, i32, i64)") != std::string::npos);

  SUBCASE("option collective=false drops the flag") {
    Plugin q(R"({"collective": false})");
    bp_device_info_args qi{BP_DEVICE_INFO_ARGS_STRUCT_SIZE, q.plugin, 0, 0, nullptr, 0, nullptr};
    REQUIRE(q.take(q.api->device_info(&qi)).code == BP_STATUS_OK);
    CHECK((qi.capabilities & BP_CAP_COLLECTIVE) == 0);
  }
}

TEST_CASE(
    "cpu: binary ops: integer div truncates, a broadcast comparison writes bool, a zero divisor is refused") {
  Plugin p;
  std::vector<int64_t> shape{2, 3}, sa, sb, so;
  bp_buffer* a = p.upload(std::vector<int32_t>{7, -7, 9, 1, 2, 3});
  bp_buffer* b = p.upload(std::vector<int32_t>{2, 2, -3, 1, 1, 1});
  bp_buffer* o = p.alloc(6 * sizeof(int32_t));
  bp_buffer* ob = p.alloc(6);
  REQUIRE(p.execute(BP_OP_DIV, {dense(a, BP_DTYPE_I32, shape, sa), dense(b, BP_DTYPE_I32, shape, sb)},
                    dense(o, BP_DTYPE_I32, shape, so))
              .code == BP_STATUS_OK);
  CHECK(p.download<int32_t>(o, 6) == std::vector<int32_t>{3, -3, -3, 1, 2, 3});  // truncates toward zero

  // b row 0 broadcast over both rows (stride 0): gt into bool.
  std::vector<int64_t> bcast{0, 1};
  bp_tensor tb = dense(b, BP_DTYPE_I32, shape, sb);
  tb.strides = bcast.data();
  REQUIRE(p.execute(BP_OP_GT, {dense(a, BP_DTYPE_I32, shape, sa), tb}, dense(ob, BP_DTYPE_BOOL, shape, so))
              .code == BP_STATUS_OK);
  CHECK(p.download<uint8_t>(ob, 6) == std::vector<uint8_t>{1, 0, 1, 0, 0, 1});

  // A zero divisor is data the host cannot see: INVALID_ARGUMENT naming the op.
  bp_buffer* z = p.upload(std::vector<int32_t>{1, 1, 0, 1, 1, 1});
  const Outcome r =
      p.execute(BP_OP_DIV, {dense(a, BP_DTYPE_I32, shape, sa), dense(z, BP_DTYPE_I32, shape, sb)},
                dense(o, BP_DTYPE_I32, shape, so));
  CHECK(r.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(r.message.find("div: inputs[1] holds a zero") != std::string::npos);
}

TEST_CASE("cpu ops: softmax of logits spread over 0..500 matches the double-precision reference") {
  Plugin p;
  const int64_t rows = 3, n = 1000;
  std::vector<float> x(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) x[i] = static_cast<float>((i * 7) % n) * 0.5f;
  std::vector<int64_t> shape{rows, n}, sx, so;
  bp_buffer* in = p.upload(x);
  bp_buffer* out = p.alloc(x.size() * sizeof(float));
  bp_op_attrs attrs{};
  attrs.axis = 1;
  for (const int32_t op : {BP_OP_SOFTMAX, BP_OP_LOG_SOFTMAX}) {
    CAPTURE(op);
    REQUIRE(p.execute(op, {dense(in, BP_DTYPE_F32, shape, sx)}, dense(out, BP_DTYPE_F32, shape, so), attrs)
                .code == BP_STATUS_OK);
    const std::vector<float> y = p.download<float>(out, x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY, total = 0;
      for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(x[r * n + i]));
      for (int64_t i = 0; i < n; ++i) total += std::exp(x[r * n + i] - m);
      for (int64_t i = 0; i < n; ++i) {
        const double d = x[r * n + i] - m;
        const double want = op == BP_OP_SOFTMAX ? std::exp(d) / total : d - std::log(total);
        REQUIRE(std::isfinite(y[r * n + i]));
        CHECK(std::fabs(y[r * n + i] - want) <= 1e-6 + 1e-5 * std::fabs(want));
      }
    }
  }
}

TEST_CASE("cpu: DLPack import adopts host memory and releases it once, a failed import never") {
  Plugin p;
  int released = 0;
  float data[4] = {1, 2, 3, 4};
  bp_buffer_import_args cuda{
      sizeof cuda, p.plugin, 0, BP_DL_CUDA, 0, 0, data, sizeof data, [](void* c) { ++*static_cast<int*>(c); },
      &released,   nullptr};
  // Refused: the caller keeps the memory, so release is never called.
  const Outcome refused = p.take(p.api->buffer_import(&cuda));
  CHECK(refused.code == BP_STATUS_UNSUPPORTED);
  CHECK(refused.message.find("kDLCPU") != std::string::npos);
  CHECK(cuda.buffer == nullptr);
  CHECK(released == 0);

  // Any other failure keeps it with the caller too.
  bp_buffer_import_args null_data = cuda;
  null_data.dl_device_type = BP_DL_CPU;
  null_data.data = nullptr;
  const Outcome invalid = p.take(p.api->buffer_import(&null_data));
  CHECK(invalid.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(invalid.message.find("data is NULL") != std::string::npos);
  CHECK(null_data.buffer == nullptr);
  CHECK(released == 0);

  bp_buffer_import_args host = cuda;
  host.dl_device_type = BP_DL_CPU;
  REQUIRE(p.take(p.api->buffer_import(&host)).code == BP_STATUS_OK);
  REQUIRE(host.buffer != nullptr);
  bp_buffer_pointer_args ptr{BP_BUFFER_POINTER_ARGS_STRUCT_SIZE, p.plugin, host.buffer, nullptr, 0, 0};
  REQUIRE(p.take(p.api->buffer_pointer(&ptr)).code == BP_STATUS_OK);
  CHECK(ptr.data == data);
  CHECK(ptr.dl_device_type == BP_DL_CPU);
  CHECK(p.download<float>(host.buffer, 4) == std::vector<float>{1, 2, 3, 4});
  CHECK(released == 0);  // the buffer owns the memory until it is freed
  bp_buffer_free_args f{BP_BUFFER_FREE_ARGS_STRUCT_SIZE, p.plugin, host.buffer};
  REQUIRE(p.take(p.api->buffer_free(&f)).code == BP_STATUS_OK);
  CHECK(released == 1);
}

// Options "ops" and "dtypes" model a partial backend (for the host's op_fallback)
// with the real kernels: the device claims only what they list.
TEST_CASE("cpu: option ops narrows supports_op to the listed ops, and drops matmul's flag unless listed") {
  Plugin p(R"({"threads": 2, "ops": ["fill", "copy", "add"]})");
  CHECK(p.supports(BP_OP_ADD, BP_DTYPE_F32));
  CHECK(p.supports(BP_OP_FILL, BP_DTYPE_I64));
  CHECK(p.supports(BP_OP_COPY, BP_DTYPE_BF16));
  CHECK_FALSE(p.supports(BP_OP_ADD, BP_DTYPE_F16));  // a listed op still takes only its dtypes
  for (const int32_t op : {BP_OP_MUL, BP_OP_MATMUL, BP_OP_CAST, BP_OP_SOFTMAX, BP_OP_GATHER}) {
    CAPTURE(op);
    CHECK_FALSE(p.supports(op, BP_DTYPE_F32));
  }
  const bp_device_info_args info = p.info();
  CHECK((info.capabilities & BP_CAP_MATMUL) == 0);
  // The rest is as without the option: every dtype, host_visible, collective.
  const uint64_t kept = BP_CAP_HOST_VISIBLE | BP_CAP_COLLECTIVE;
  CHECK((info.capabilities & kept) == kept);
  for (int32_t d = BP_DTYPE_F32; d < BP_DTYPE_COUNT_; ++d) CHECK((info.capabilities & BP_CAP_DTYPE(d)) != 0);
  CHECK(p.attribute("ops") == "add, copy, fill (option \"ops\")");
  CHECK(p.attribute("dtypes").empty());

  // A listed op runs the real kernel; an unlisted one is refused rather than run.
  std::vector<int64_t> shape{3}, sa, sb, so;
  bp_buffer* a = p.upload(std::vector<float>{1, 2, 3});
  bp_buffer* b = p.upload(std::vector<float>{10, 20, 30});
  bp_buffer* o = p.alloc(3 * sizeof(float));
  const std::vector<bp_tensor> inputs{dense(a, BP_DTYPE_F32, shape, sa), dense(b, BP_DTYPE_F32, shape, sb)};
  REQUIRE(p.execute(BP_OP_ADD, inputs, dense(o, BP_DTYPE_F32, shape, so)).code == BP_STATUS_OK);
  CHECK(p.download<float>(o, 3) == std::vector<float>{11, 22, 33});
  const Outcome r = p.execute(BP_OP_MUL, inputs, dense(o, BP_DTYPE_F32, shape, so));
  CHECK(r.code == BP_STATUS_UNSUPPORTED);
  CHECK(r.message.find("mul is left out by the cpu option \"ops\"") != std::string::npos);

  SUBCASE("matmul listed keeps the flag") {
    Plugin q(R"({"ops": ["matmul"]})");
    CHECK((q.info().capabilities & BP_CAP_MATMUL) != 0);
    CHECK(q.supports(BP_OP_MATMUL, BP_DTYPE_F64));
    CHECK_FALSE(q.supports(BP_OP_ADD, BP_DTYPE_F32));
  }
  SUBCASE("an empty list claims no op: a backend that only holds memory") {
    Plugin q(R"({"ops": []})");
    CHECK_FALSE(q.supports(BP_OP_COPY, BP_DTYPE_F32));
    CHECK((q.info().capabilities & BP_CAP_MATMUL) == 0);
    CHECK(q.attribute("ops") == "none (option \"ops\")");
  }
  SUBCASE("with collective=false") {
    Plugin q(R"({"collective": false, "ops": ["add"]})");
    CHECK((q.info().capabilities & (BP_CAP_COLLECTIVE | BP_CAP_MATMUL)) == 0);
    CHECK(q.supports(BP_OP_ADD, BP_DTYPE_I32));
  }
}

TEST_CASE("cpu: option dtypes narrows the dtype flags and supports_op to the listed dtypes") {
  Plugin p(R"({"threads": 2, "dtypes": ["i64", "f32"]})");
  const bp_device_info_args info = p.info();
  for (int32_t d = BP_DTYPE_F32; d < BP_DTYPE_COUNT_; ++d) {
    CAPTURE(d);
    CHECK(((info.capabilities & BP_CAP_DTYPE(d)) != 0) == (d == BP_DTYPE_F32 || d == BP_DTYPE_I64));
  }
  const uint64_t kept = BP_CAP_HOST_VISIBLE | BP_CAP_COLLECTIVE | BP_CAP_MATMUL;  // f32 runs matmul
  CHECK((info.capabilities & kept) == kept);
  CHECK(p.attribute("dtypes") == "f32, i64 (option \"dtypes\")");
  CHECK(p.supports(BP_OP_ADD, BP_DTYPE_F32));
  CHECK(p.supports(BP_OP_ADD, BP_DTYPE_I64));
  CHECK(p.supports(BP_OP_MATMUL, BP_DTYPE_F32));
  CHECK_FALSE(p.supports(BP_OP_ADD, BP_DTYPE_F64));
  CHECK_FALSE(p.supports(BP_OP_COPY, BP_DTYPE_BF16));
  CHECK_FALSE(p.supports(BP_OP_CAST, BP_DTYPE_BOOL));
  CHECK_FALSE(p.supports(BP_OP_MATMUL, BP_DTYPE_F64));

  // A tensor of a dtype the device lacks is refused rather than computed with.
  std::vector<int64_t> shape{2}, sa, so;
  bp_buffer* a = p.upload(std::vector<double>{1, 2});
  bp_buffer* o = p.alloc(2 * sizeof(double));
  const Outcome r =
      p.execute(BP_OP_NEG, {dense(a, BP_DTYPE_F64, shape, sa)}, dense(o, BP_DTYPE_F64, shape, so));
  CHECK(r.code == BP_STATUS_UNSUPPORTED);
  CHECK(r.message.find("neg: dtype f64 is left out by the cpu option \"dtypes\"") != std::string::npos);

  SUBCASE("no dtype matmul takes drops the matmul flag") {
    Plugin q(R"({"dtypes": ["i32", "bool"]})");
    CHECK((q.info().capabilities & BP_CAP_MATMUL) == 0);
  }
}

#if defined(__x86_64__)
// MXCSR's flush-to-zero and denormals-are-zero bits of the calling thread.
unsigned flush_bits() { return _mm_getcsr() & 0x8040u; }

// n subnormal f32 values (1e-40) through mul by 1, sum, and sum over the rows
// of the values as a matrix of `cols` columns (the reduction's tiled path).
struct Subnormals {
  int64_t kept = 0;          // elements of the product still 1e-40
  float sum = 0;             // of all
  int64_t zero_columns = 0;  // column sums that came out as zero
};
Subnormals subnormal_results(Plugin& p, int64_t n, int64_t cols) {
  const float tiny = 1e-40f;
  std::vector<int64_t> shape{n}, one{1}, matrix{n / cols, cols}, row{cols}, sa, sb, so, ss, sm, sc;
  bp_buffer* a = p.upload(std::vector<float>(static_cast<size_t>(n), tiny));
  bp_buffer* b = p.upload(std::vector<float>(static_cast<size_t>(n), 1.0f));
  bp_buffer* o = p.alloc(static_cast<uint64_t>(n) * sizeof(float));
  bp_buffer* s = p.alloc(sizeof(float));
  bp_buffer* c = p.alloc(static_cast<uint64_t>(cols) * sizeof(float));
  const bp_tensor x = dense(a, BP_DTYPE_F32, shape, sa);
  REQUIRE(
      p.execute(BP_OP_MUL, {x, dense(b, BP_DTYPE_F32, shape, sb)}, dense(o, BP_DTYPE_F32, shape, so)).code ==
      BP_STATUS_OK);
  bp_op_attrs attrs{};
  attrs.axis = 0;
  Outcome r = p.execute(BP_OP_SUM, {x}, dense(s, BP_DTYPE_F32, one, ss), attrs);
  REQUIRE_MESSAGE(r.code == BP_STATUS_OK, r.message);
  r = p.execute(BP_OP_SUM, {dense(a, BP_DTYPE_F32, matrix, sm)}, dense(c, BP_DTYPE_F32, row, sc), attrs);
  REQUIRE_MESSAGE(r.code == BP_STATUS_OK, r.message);
  // Compared as bits: a caller with denormals-are-zero set would see 1e-40 == 0.
  Subnormals got;
  const std::vector<uint32_t> out = p.download<uint32_t>(o, static_cast<size_t>(n));
  got.kept = std::count(out.begin(), out.end(), std::bit_cast<uint32_t>(tiny));
  got.sum = p.download<float>(s, 1)[0];
  const std::vector<uint32_t> columns = p.download<uint32_t>(c, static_cast<size_t>(cols));
  got.zero_columns = std::count(columns.begin(), columns.end(), 0u);
  return got;
}

TEST_CASE(
    "cpu: option flush_denormals makes subnormal floats zero, on every thread of a team, and leaves the "
    "caller's mode as it was") {
  REQUIRE(std::fpclassify(1e-40f) == FP_SUBNORMAL);
  // 3 elements run on the calling thread; 2^17 on a team of two (over the team threshold).
  for (const int64_t n : {int64_t{3}, int64_t{1} << 17}) {
    CAPTURE(n);
    const int64_t cols = n == 3 ? 3 : 64;
    const unsigned before = flush_bits();
    for (const bool flush : {false, true}) {
      CAPTURE(flush);
      Plugin p(flush ? R"({"threads": 2, "flush_denormals": true})" : R"({"threads": 2})");
      const Subnormals got = subnormal_results(p, n, cols);
      if (flush) {
        CHECK(got.kept == 0);  // every element, whichever thread ran it
        CHECK(got.sum == 0.0f);
        CHECK(got.zero_columns == cols);
      } else {
        CHECK(got.kept == n);
        CHECK(got.sum == doctest::Approx(1e-40 * static_cast<double>(n)).epsilon(1e-3));
        CHECK(got.zero_columns == 0);
      }
      CHECK(flush_bits() == before);  // the host's mode is untouched
      CHECK(p.attribute("flush_denormals").empty() == !flush);
    }
  }
  // A caller that flushes already keeps flushing with the option off (the team follows it too).
  {
    struct Flushing {  // the caller's mode for this block, restored however it ends
      unsigned saved = _mm_getcsr();
      Flushing() { _mm_setcsr(saved | 0x8040u); }
      ~Flushing() { _mm_setcsr(saved); }
    } flushing;
    Plugin p;
    const Subnormals got = subnormal_results(p, int64_t{1} << 17, 64);
    CHECK(got.kept == 0);
    CHECK(std::bit_cast<uint32_t>(got.sum) == 0u);
    CHECK(got.zero_columns == 64);
  }

  const Outcome r = create(R"({"flush_denormals": "yes"})");
  CHECK(r.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(r.message.find("option \"flush_denormals\" must be true or false, got \"yes\"") != std::string::npos);
}
#endif

TEST_CASE(
    "cpu: options ops and dtypes reject bad values, naming the option, the value and the names accepted") {
  struct Bad {
    const char* options;
    std::vector<std::string> says;
  };
  const std::vector<Bad> cases{
      {R"({"ops": ["matmull"]})",
       {"option \"ops\" names an unknown op, \"matmull\"", "\"add\"", "\"gather\""}},
      {R"({"ops": ["add", 5]})", {"option \"ops\" must list op names as strings, got 5", "\"matmul\""}},
      {R"({"ops": ["add", "copy", "add"]})", {"option \"ops\" lists \"add\" twice", "\"log_softmax\""}},
      {R"({"ops": "add"})", {"option \"ops\" must be an array of op names, got \"add\"", "\"fill\""}},
      {R"({"dtypes": ["f128"]})",
       {"option \"dtypes\" names an unknown dtype, \"f128\"", "\"f32\"", "\"bf16\""}},
      {R"({"dtypes": [true]})", {"option \"dtypes\" must list dtype names as strings, got true", "\"i8\""}},
      {R"({"dtypes": ["f32", "f32"]})", {"option \"dtypes\" lists \"f32\" twice", "\"u8\""}},
      {R"({"dtypes": []})", {"option \"dtypes\" must list at least one dtype", "\"bool\""}},
      {R"({"dtypes": null})", {"option \"dtypes\" must be an array of dtype names, got null"}},
  };
  for (const Bad& bad : cases) {
    CAPTURE(bad.options);
    const Outcome r = create(bad.options);
    CHECK(r.code == BP_STATUS_INVALID_ARGUMENT);
    for (const std::string& part : bad.says) {
      CAPTURE(part);
      CHECK(r.message.find(part) != std::string::npos);
    }
  }
  // The message a typo in the key itself gets lists the new options too.
  const Outcome r = create(R"({"op": ["add"]})");
  CHECK(r.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(r.message.find("unknown option \"op\" (accepted: \"threads\", \"collective\", \"ops\", \"dtypes\"") !=
        std::string::npos);
}
