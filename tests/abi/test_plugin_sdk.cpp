// Tests of plugin.hpp, the C++ plugin SDK, without the core: guard() turns
// every exception into the right status; PluginTable builds a table whose
// optional entries are set exactly for the listed Features, reads argument
// structs through the host's struct_size, and refuses capabilities a class
// cannot back; make_view, dispatch and the byte arithmetic behave as
// documented. The compile-time checks are tested by compile_fail/ (ctest
// abi.compile_fail.*).
#include <backplane/plugin.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

namespace bpp = backplane::plugin;

// Whether a table entry is non-NULL (doctest cannot print function pointers).
template <class Fn>
bool is_set(Fn* fn) {
  return fn != nullptr;
}

// Reads a status and frees it; {OK, ""} for success.
struct Outcome {
  int32_t code = BP_STATUS_OK;
  std::string message;
};

Outcome take(bp_status* status) {
  if (status == nullptr) return {};
  Outcome out{bpp::status_code(status), bpp::status_message(status)};
  bpp::status_free(status);
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The required members only: no Features list, so every optional entry is NULL.
class Minimal {
 public:
  static constexpr const char* kName = "minimal";
  explicit Minimal(const bpp::CreateArgs& args) : args_(args) {
    if (args.options_json == R"({"fail":true})")
      bpp::fail(BP_STATUS_INVALID_ARGUMENT, "minimal: asked to fail");
  }
  int32_t device_count() { return 2; }
  bpp::DeviceInfo device_info(int32_t device) {
    if (device == 1) throw std::runtime_error("minimal: device 1 is broken");
    return {
        "minimal:0 for " + args_.backend_name, BP_CAP_F32 | BP_CAP_F64, {{"version", "7"}, {"limit", "9"}}};
  }
  bool supports_op(int32_t, int32_t op, int32_t dtype) {
    if (dtype == BP_DTYPE_I8) throw std::logic_error("minimal: supports_op threw");
    return op == BP_OP_ADD && dtype == BP_DTYPE_F32;
  }
  bp_buffer* buffer_alloc(int32_t, uint64_t size) {
    if (size > 1000) throw std::bad_alloc();
    return nullptr;
  }
  void buffer_free(bp_buffer*) noexcept {}
  void buffer_write(bp_buffer*, uint64_t, const void*, uint64_t) { throw 42; }
  void buffer_read(bp_buffer*, uint64_t, void*, uint64_t) { bpp::fail(BP_STATUS_IO, "minimal: read failed"); }
  void execute(const bp_execute_args&) {}

 private:
  bpp::CreateArgs args_;
};

// Every optional feature. The communicator remembers whether it was aborted.
struct FakeComm {
  bool aborted = false;
};

// A buffer made by Full::buffer_import: it owns the producer's `release` from
// the moment it exists and calls it once, when freed.
struct Imported {
  void* data;
  void (*release)(void*);
  void* release_ctx;
  Imported(void* d, void (*r)(void*), void* ctx) noexcept : data(d), release(r), release_ctx(ctx) {}
  Imported(const Imported&) = delete;
  Imported& operator=(const Imported&) = delete;
  ~Imported() {
    if (release != nullptr) release(release_ctx);
  }
};
class Full : public Minimal {
 public:
  static constexpr const char* kName = "full";
  using Features =
      bpp::Features<bpp::Feature::buffer_pointer, bpp::Feature::buffer_import, bpp::Feature::device_memory,
                    bpp::Feature::synchronize, bpp::Feature::collectives>;
  using Minimal::Minimal;
  bpp::DeviceInfo device_info(int32_t) {
    return {"full:0", BP_CAP_ASYNC | BP_CAP_HOST_VISIBLE | BP_CAP_COLLECTIVE | BP_CAP_F32, {}};
  }
  bpp::BufferPointer buffer_pointer(bp_buffer*) { return {&byte_, BP_DL_CUDA, 3}; }
  // Refuses 13 bytes, fails for 14 after its checks (as if a bookkeeping
  // allocation threw), and otherwise takes `release` only in the buffer it
  // builds last and returns.
  bp_buffer* buffer_import(const bp_buffer_import_args& a) {
    seen_release = a.release;
    if (a.size == 13) bpp::fail(BP_STATUS_UNSUPPORTED, "full: cannot import 13 bytes");
    if (a.size == 14) throw std::bad_alloc();
    return reinterpret_cast<bp_buffer*>(new Imported(a.data, a.release, a.release_ctx));
  }
  // Buffer handles of Full come only from buffer_import (Minimal's buffer_alloc
  // returns none).
  void buffer_free(bp_buffer* b) noexcept { delete reinterpret_cast<Imported*>(b); }
  bpp::MemoryInfo device_memory(int32_t) { return {5, 10}; }
  void synchronize(int32_t device) { last_synchronized = device; }
  void execute(const bp_execute_args& a) { last_attrs = a.attrs; }
  bp_comm* comm_create(const bp_comm_create_args& a) {
    last_timeout_ms = a.timeout_ms;
    last_key_prefix = a.key_prefix == nullptr ? "(null)" : a.key_prefix;
    return reinterpret_cast<bp_comm*>(&comm_);
  }
  void comm_destroy(bp_comm*) {}
  void comm_abort(bp_comm* c) { reinterpret_cast<FakeComm*>(c)->aborted = true; }
  void all_reduce(bp_comm*, const bp_tensor&, const bp_tensor&, bp_reduce_op op) { last_reduce = op; }
  void broadcast(bp_comm*, const bp_tensor&, int32_t root) { last_root = root; }
  void all_gather(bp_comm*, const bp_tensor&, const bp_tensor&) {}
  void reduce_scatter(bp_comm*, const bp_tensor&, const bp_tensor&, bp_reduce_op) {}
  void barrier(bp_comm* c) {
    if (reinterpret_cast<FakeComm*>(c)->aborted) bpp::fail(BP_STATUS_COLLECTIVE, "full: aborted");
  }

  int64_t last_timeout_ms = -1;
  std::string last_key_prefix;
  int32_t last_reduce = -1;
  int32_t last_root = -1;
  int32_t last_synchronized = -1;
  const bp_op_attrs* last_attrs = nullptr;
  void (*seen_release)(void*) = nullptr;

 private:
  unsigned char byte_ = 0;
  FakeComm comm_;
};

// Declares capabilities its class cannot back: async without synchronize on
// device 0, collective and host_visible without their features on device 1.
class Liar : public Minimal {
 public:
  static constexpr const char* kName = "liar";
  using Minimal::Minimal;
  bpp::DeviceInfo device_info(int32_t device) {
    if (device == 0) return {"liar:0", BP_CAP_ASYNC | BP_CAP_F32, {}};
    return {"liar:1", BP_CAP_COLLECTIVE | BP_CAP_HOST_VISIBLE | BP_CAP_F32, {}};
  }
};

// One table per class (a static in PluginTable<T>): the first call names it.
template <class T>
const bp_plugin_api* table_of() {
  return bpp::PluginTable<T>::table(T::kName, "1.0.0");
}

bp_plugin* create(const bp_plugin_api* api, const char* options_json, Outcome* outcome = nullptr) {
  bp_create_args args{};
  args.struct_size = BP_CREATE_ARGS_STRUCT_SIZE;
  args.backend_name = "sdk_test";
  args.options_json = options_json;
  Outcome o = take(api->create(&args));
  if (outcome != nullptr) *outcome = o;
  return args.plugin;
}

template <class T>
T& impl_of(bp_plugin* p) {
  return bpp::PluginTable<T>::impl(p);
}

// A bp_tensor over caller-owned shape/stride arrays.
struct Desc {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  bp_tensor t{};
  Desc(int32_t dtype, std::vector<int64_t> s, std::vector<int64_t> st, uint64_t byte_offset = 0)
      : shape(std::move(s)), strides(std::move(st)) {
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    t.shape = shape.data();
    t.strides = strides.data();
    t.byte_offset = byte_offset;
  }
};

// The message make_view fails with ("" when it accepts the view).
std::string view_error(const bp_tensor& t, int32_t dtype, unsigned char* base, uint64_t capacity,
                       bpp::Role role = {"inputs", 1}, bp_status_code want = BP_STATUS_INVALID_ARGUMENT) {
  try {
    (void)bpp::make_view(t, dtype, base, capacity, "add", role);
    return "";
  } catch (const bpp::Failure& f) {
    CHECK(f.code() == want);
    return f.what();
  }
}

}  // namespace

// ---- guard and statuses ---------------------------------------------------------

TEST_CASE("plugin sdk: guard returns NULL when nothing throws") {
  bool ran = false;
  CHECK(bpp::guard([&] { ran = true; }) == nullptr);
  CHECK(ran);
}

TEST_CASE("plugin sdk: guard maps Failure to its own code and message") {
  Outcome o = take(bpp::guard([] { bpp::fail(BP_STATUS_UNSUPPORTED, "no such op here"); }));
  CHECK(o.code == BP_STATUS_UNSUPPORTED);
  CHECK(o.message == "no such op here");
}

TEST_CASE("plugin sdk: guard maps bad_alloc to OUT_OF_MEMORY") {
  Outcome o = take(bpp::guard([] { throw std::bad_alloc(); }));
  CHECK(o.code == BP_STATUS_OUT_OF_MEMORY);
  CHECK(contains(o.message, "out of memory"));
}

TEST_CASE("plugin sdk: guard maps std::exception to INTERNAL with what()") {
  Outcome o = take(bpp::guard([] { throw std::out_of_range("index 9 of 3"); }));
  CHECK(o.code == BP_STATUS_INTERNAL);
  CHECK(o.message == "index 9 of 3");
}

TEST_CASE("plugin sdk: guard maps an unknown exception to INTERNAL") {
  Outcome o = take(bpp::guard([] { throw 3.5; }));
  CHECK(o.code == BP_STATUS_INTERNAL);
  CHECK(o.message == "unknown exception inside plugin");
}

TEST_CASE("plugin sdk: the static out-of-memory status is never freed") {
  // status_free must leave a non-heap status alone (it is the OOM fallback).
  bp_status fallback{BP_STATUS_OUT_OF_MEMORY, std::string(), "static"};
  table_of<Minimal>()->status_free(&fallback);
  CHECK(std::string(table_of<Minimal>()->status_message(&fallback)) == "static");
  table_of<Minimal>()->status_free(nullptr);
}

// ---- the table ------------------------------------------------------------------

TEST_CASE("plugin sdk: a class without a Features list gets NULL optional entries") {
  const bp_plugin_api* t = table_of<Minimal>();
  REQUIRE(t != nullptr);
  CHECK(t->struct_size == BP_PLUGIN_API_STRUCT_SIZE);
  CHECK(t->abi_major == BP_ABI_MAJOR);
  CHECK(t->abi_minor == BP_ABI_MINOR);
  CHECK(std::string(t->plugin_name) == "minimal");
  CHECK(std::string(t->plugin_version) == "1.0.0");
  // required
  CHECK(is_set(t->status_code));
  CHECK(is_set(t->status_message));
  CHECK(is_set(t->status_free));
  CHECK(is_set(t->create));
  CHECK(is_set(t->destroy));
  CHECK(is_set(t->device_count));
  CHECK(is_set(t->device_info));
  CHECK(is_set(t->supports_op));
  CHECK(is_set(t->buffer_alloc));
  CHECK(is_set(t->buffer_free));
  CHECK(is_set(t->buffer_write));
  CHECK(is_set(t->buffer_read));
  CHECK(is_set(t->execute));
  // optional, not listed
  CHECK_FALSE(is_set(t->device_memory));
  CHECK_FALSE(is_set(t->buffer_pointer));
  CHECK_FALSE(is_set(t->buffer_import));
  CHECK_FALSE(is_set(t->synchronize));
  CHECK_FALSE(is_set(t->comm_create));
  CHECK_FALSE(is_set(t->comm_destroy));
  CHECK_FALSE(is_set(t->comm_abort));
  CHECK_FALSE(is_set(t->all_reduce));
  CHECK_FALSE(is_set(t->broadcast));
  CHECK_FALSE(is_set(t->all_gather));
  CHECK_FALSE(is_set(t->reduce_scatter));
  CHECK_FALSE(is_set(t->barrier));
}

TEST_CASE("plugin sdk: every listed feature gets its entries, comm_abort included") {
  const bp_plugin_api* t = table_of<Full>();
  REQUIRE(t != nullptr);
  CHECK(std::string(t->plugin_name) == "full");
  CHECK(is_set(t->device_memory));
  CHECK(is_set(t->buffer_pointer));
  CHECK(is_set(t->buffer_import));
  CHECK(is_set(t->synchronize));
  CHECK(is_set(t->comm_create));
  CHECK(is_set(t->comm_destroy));
  CHECK(is_set(t->comm_abort));
  CHECK(is_set(t->all_reduce));
  CHECK(is_set(t->broadcast));
  CHECK(is_set(t->all_gather));
  CHECK(is_set(t->reduce_scatter));
  CHECK(is_set(t->barrier));
}

TEST_CASE("plugin sdk: Features lists only what it names") {
  using F = bpp::Features<bpp::Feature::synchronize, bpp::Feature::device_memory>;
  static_assert(F::has(bpp::Feature::synchronize));
  static_assert(F::has(bpp::Feature::device_memory));
  static_assert(!F::has(bpp::Feature::collectives));
  static_assert(!bpp::Features<>::has(bpp::Feature::buffer_pointer));
  CHECK(F::has(bpp::Feature::synchronize));
}

TEST_CASE("plugin sdk: entries called through the table turn exceptions into statuses") {
  const bp_plugin_api* t = table_of<Minimal>();
  Outcome created;
  bp_plugin* p = create(t, "{}", &created);
  REQUIRE(created.code == BP_STATUS_OK);
  REQUIRE(p != nullptr);

  bp_device_count_args count{BP_DEVICE_COUNT_ARGS_STRUCT_SIZE, p, -1};
  CHECK(t->device_count(&count) == nullptr);
  CHECK(count.num_devices == 2);

  bp_device_info_args info{};
  info.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE;
  info.plugin = p;
  info.device = 1;
  Outcome broken = take(t->device_info(&info));
  CHECK(broken.code == BP_STATUS_INTERNAL);
  CHECK(broken.message == "minimal: device 1 is broken");

  bp_buffer_alloc_args alloc{};
  alloc.struct_size = BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE;
  alloc.plugin = p;
  alloc.size = 2000;
  CHECK(take(t->buffer_alloc(&alloc)).code == BP_STATUS_OUT_OF_MEMORY);

  bp_buffer_copy_args copy{};
  copy.struct_size = BP_BUFFER_COPY_ARGS_STRUCT_SIZE;
  copy.plugin = p;
  Outcome w = take(t->buffer_write(&copy));
  CHECK(w.code == BP_STATUS_INTERNAL);
  CHECK(w.message == "unknown exception inside plugin");
  Outcome r = take(t->buffer_read(&copy));
  CHECK(r.code == BP_STATUS_IO);
  CHECK(r.message == "minimal: read failed");

  auto supports = [&](int32_t op, int32_t dtype, Outcome* o = nullptr) {
    bp_supports_op_args a{BP_SUPPORTS_OP_ARGS_STRUCT_SIZE, p, 0, op, dtype, -1};
    Outcome got = take(t->supports_op(&a));
    if (o != nullptr) *o = got;
    return a.supported;
  };
  CHECK(supports(BP_OP_ADD, BP_DTYPE_F32) == 1);
  CHECK(supports(BP_OP_MUL, BP_DTYPE_F32) == 0);
  CHECK(supports(BP_OP_COUNT_ + 7, BP_DTYPE_F32) == 0);  // an op from a newer host
  Outcome threw;
  supports(BP_OP_ADD, BP_DTYPE_I8, &threw);  // the class threw: a status, not a crash
  CHECK(threw.code == BP_STATUS_INTERNAL);
  CHECK(threw.message == "minimal: supports_op threw");

  t->destroy(p);
}

TEST_CASE("plugin sdk: create passes options and reports a constructor failure") {
  const bp_plugin_api* t = table_of<Minimal>();
  Outcome failed;
  bp_plugin* p = create(t, R"({"fail":true})", &failed);
  CHECK(p == nullptr);
  CHECK(failed.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(failed.message == "minimal: asked to fail");

  Outcome null_args = take(t->create(nullptr));
  CHECK(null_args.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(contains(null_args.message, "NULL"));
}

TEST_CASE("plugin sdk: create refuses a host struct with no room for the instance") {
  const bp_plugin_api* t = table_of<Minimal>();
  bp_create_args tiny{};
  tiny.struct_size = offsetof(bp_create_args, options_json);
  tiny.backend_name = "old";
  Outcome refused = take(t->create(&tiny));
  CHECK(refused.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(contains(refused.message, "no room for the instance"));
  CHECK(tiny.plugin == nullptr);
}

TEST_CASE("plugin sdk: device_info fills only what the host's struct_size covers") {
  const bp_plugin_api* t = table_of<Minimal>();
  bp_plugin* p = create(t, "{}");
  REQUIRE(p != nullptr);

  bp_device_info_args full{};
  full.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE;
  full.plugin = p;
  REQUIRE(t->device_info(&full) == nullptr);
  CHECK(std::string(full.name) == "minimal:0 for sdk_test");
  CHECK(full.capabilities == (BP_CAP_F32 | BP_CAP_F64));
  REQUIRE(full.num_attributes == 2);
  CHECK(std::string(full.attributes[0].name) == "version");
  CHECK(std::string(full.attributes[0].value) == "7");
  CHECK(std::string(full.attributes[1].name) == "limit");
  CHECK(std::string(full.attributes[1].value) == "9");

  // An older host whose struct ends before `capabilities`.
  bp_device_info_args old{};
  old.struct_size = offsetof(bp_device_info_args, capabilities);
  old.plugin = p;
  old.capabilities = 0xdead;
  old.attributes = nullptr;
  REQUIRE(t->device_info(&old) == nullptr);
  CHECK(std::string(old.name) == "minimal:0 for sdk_test");
  CHECK(old.num_attributes == 2);
  CHECK(old.capabilities == 0xdead);
  CHECK(old.attributes == nullptr);

  // Strings from the first call stay valid, and are reused, until destroy().
  CHECK(std::string(full.name) == "minimal:0 for sdk_test");
  CHECK(old.name == full.name);
  t->destroy(p);
}

TEST_CASE("plugin sdk: a device declaring async without Feature::synchronize fails with a clear status") {
  const bp_plugin_api* t = table_of<Liar>();
  bp_plugin* p = create(t, "{}");
  REQUIRE(p != nullptr);

  bp_device_info_args info{};
  info.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE;
  info.plugin = p;
  info.device = 0;
  Outcome async = take(t->device_info(&info));
  CHECK(async.code == BP_STATUS_INTERNAL);
  CHECK(async.message == "device 0 declares 'async' but its class does not implement Feature::synchronize");
  CHECK(info.name == nullptr);  // nothing was filled in

  info.device = 1;
  Outcome both = take(t->device_info(&info));
  CHECK(both.code == BP_STATUS_INTERNAL);
  CHECK(
      contains(both.message,
               "device 1 declares 'host_visible' but its class does not implement Feature::buffer_pointer"));
  CHECK(
      contains(both.message, "declares 'collective' but its class does not implement Feature::collectives"));
  t->destroy(p);

  // The same flags with the features behind them are accepted.
  const bp_plugin_api* ft = table_of<Full>();
  bp_plugin* fp = create(ft, "{}");
  REQUIRE(fp != nullptr);
  bp_device_info_args ok{};
  ok.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE;
  ok.plugin = fp;
  CHECK(take(ft->device_info(&ok)).code == BP_STATUS_OK);
  CHECK(ok.capabilities == (BP_CAP_ASYNC | BP_CAP_HOST_VISIBLE | BP_CAP_COLLECTIVE | BP_CAP_F32));
  ft->destroy(fp);
}

TEST_CASE("plugin sdk: optional entries reach the class with their arguments") {
  const bp_plugin_api* t = table_of<Full>();
  bp_plugin* p = create(t, "{}");
  REQUIRE(p != nullptr);

  bp_device_memory_args mem{};
  mem.struct_size = BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE;
  mem.plugin = p;
  REQUIRE(t->device_memory(&mem) == nullptr);
  CHECK(mem.free_bytes == 5);
  CHECK(mem.total_bytes == 10);

  bp_buffer_pointer_args ptr{};
  ptr.struct_size = BP_BUFFER_POINTER_ARGS_STRUCT_SIZE;
  ptr.plugin = p;
  REQUIRE(t->buffer_pointer(&ptr) == nullptr);
  CHECK(ptr.data != nullptr);
  CHECK(ptr.dl_device_type == BP_DL_CUDA);
  CHECK(ptr.dl_device_id == 3);

  bp_comm_create_args cc{};
  cc.struct_size = BP_COMM_CREATE_ARGS_STRUCT_SIZE;
  cc.plugin = p;
  cc.world_size = 1;
  cc.timeout_ms = 1234;
  cc.key_prefix = "grp/";
  REQUIRE(t->comm_create(&cc) == nullptr);
  REQUIRE(cc.comm != nullptr);
  CHECK(impl_of<Full>(p).last_timeout_ms == 1234);
  CHECK(impl_of<Full>(p).last_key_prefix == "grp/");

  bp_collective_args coll{};
  coll.struct_size = BP_COLLECTIVE_ARGS_STRUCT_SIZE;
  coll.plugin = p;
  coll.comm = cc.comm;
  bp_tensor tensor{};
  coll.input = &tensor;
  coll.output = &tensor;
  coll.reduce_op = BP_REDUCE_MAX;
  coll.root = 0;
  REQUIRE(t->all_reduce(&coll) == nullptr);
  CHECK(impl_of<Full>(p).last_reduce == BP_REDUCE_MAX);
  REQUIRE(t->broadcast(&coll) == nullptr);
  CHECK(impl_of<Full>(p).last_root == 0);
  REQUIRE(t->barrier(&coll) == nullptr);

  // comm_abort makes the next collective fail; comm_destroy still succeeds.
  bp_comm_args ca{BP_COMM_ARGS_STRUCT_SIZE, p, cc.comm};
  REQUIRE(t->comm_abort(&ca) == nullptr);
  Outcome after = take(t->barrier(&coll));
  CHECK(after.code == BP_STATUS_COLLECTIVE);
  CHECK(t->comm_destroy(&ca) == nullptr);
  t->destroy(p);
}

TEST_CASE("plugin sdk: buffer_import passes ownership only on success, and the SDK never calls release") {
  const bp_plugin_api* t = table_of<Full>();
  bp_plugin* p = create(t, "{}");
  REQUIRE(p != nullptr);
  int released = 0;
  unsigned char memory[16] = {};
  auto import = [&](uint64_t size) {
    bp_buffer_import_args a{};
    a.struct_size = BP_BUFFER_IMPORT_ARGS_STRUCT_SIZE;
    a.plugin = p;
    a.dl_device_type = BP_DL_CPU;
    a.data = memory;
    a.size = size;
    a.release = [](void* ctx) { ++*static_cast<int*>(ctx); };
    a.release_ctx = &released;
    Outcome o = take(t->buffer_import(&a));
    return std::make_pair(o, a.buffer);
  };

  auto [ok, buffer] = import(8);
  CHECK(ok.code == BP_STATUS_OK);
  REQUIRE(buffer != nullptr);
  CHECK(reinterpret_cast<Imported*>(buffer)->data == memory);
  CHECK(released == 0);  // the buffer owns it now, until it is freed

  // Failures, before or after the class's checks: the caller keeps the
  // memory, so release is never called and no buffer comes back.
  auto [refused, none] = import(13);
  CHECK(refused.code == BP_STATUS_UNSUPPORTED);
  CHECK(contains(refused.message, "cannot import 13 bytes"));
  CHECK(none == nullptr);
  CHECK(released == 0);

  auto [late, none2] = import(14);
  CHECK(late.code == BP_STATUS_OUT_OF_MEMORY);
  CHECK(none2 == nullptr);
  CHECK(released == 0);

  // Freeing the imported buffer releases the memory, exactly once.
  bp_buffer_free_args f{};
  f.struct_size = BP_BUFFER_FREE_ARGS_STRUCT_SIZE;
  f.plugin = p;
  f.buffer = buffer;
  REQUIRE(t->buffer_free(&f) == nullptr);
  CHECK(released == 1);

  t->destroy(p);
  CHECK(released == 1);
}

// ---- read_args: argument structs from an older minor ------------------------------

TEST_CASE("plugin sdk: read_args reads a shorter struct and zeroes what lies beyond it") {
  // A host of an older minor whose bp_comm_create_args ends after timeout_ms:
  // the fields past it are garbage in its memory and must read as zero.
  bp_comm_create_args in;
  std::memset(&in, 0xAB, sizeof(in));
  in.struct_size = offsetof(bp_comm_create_args, store);
  in.rank = 1;
  in.world_size = 4;
  in.timeout_ms = 99;
  const bp_comm_create_args a = bpp::detail::read_args(&in);
  CHECK(a.struct_size == offsetof(bp_comm_create_args, store));
  CHECK(a.rank == 1);
  CHECK(a.world_size == 4);
  CHECK(a.timeout_ms == 99);
  CHECK(a.store == nullptr);
  CHECK(a.key_prefix == nullptr);
  CHECK(a.comm == nullptr);
  CHECK_FALSE(BP_HAS_FIELD(bp_comm_create_args, store, a.struct_size));
  CHECK(BP_HAS_FIELD(bp_comm_create_args, timeout_ms, a.struct_size));

  // A struct from a newer minor is larger: only this build's size is copied.
  struct Newer {
    bp_comm_create_args base;
    uint64_t appended;
  } newer{};
  newer.base.struct_size = BP_STRUCT_SIZE(Newer, appended);
  newer.base.world_size = 2;
  newer.appended = 7;
  const bp_comm_create_args b = bpp::detail::read_args(&newer.base);
  CHECK(b.struct_size == sizeof(bp_comm_create_args));
  CHECK(b.world_size == 2);
}

// ---- struct_size: the 2.2 rule, and 2.1's sizeof ----------------------------------

// Each BP_<NAME>_STRUCT_SIZE ends at its named field, and less than the
// struct's alignment lies beyond it (padding only): a field appended without
// moving the macro leaves at least its own size.
#define BP_CHECK_STRUCT_SIZE(type, macro, last)                                \
  static_assert((macro) == offsetof(type, last) + sizeof(type::last), #macro); \
  static_assert(sizeof(type) - (macro) < alignof(type), #macro " names the last field")
BP_CHECK_STRUCT_SIZE(bp_op_attrs, BP_OP_ATTRS_STRUCT_SIZE, seed);
BP_CHECK_STRUCT_SIZE(bp_host_api, BP_HOST_API_STRUCT_SIZE, trace_event);
BP_CHECK_STRUCT_SIZE(bp_trace_event, BP_TRACE_EVENT_STRUCT_SIZE, flow_id);
BP_CHECK_STRUCT_SIZE(bp_kv_set_args, BP_KV_SET_ARGS_STRUCT_SIZE, timeout_ms);
BP_CHECK_STRUCT_SIZE(bp_kv_get_args, BP_KV_GET_ARGS_STRUCT_SIZE, size);
BP_CHECK_STRUCT_SIZE(bp_kv_wait_args, BP_KV_WAIT_ARGS_STRUCT_SIZE, timeout_ms);
BP_CHECK_STRUCT_SIZE(bp_kv_store, BP_KV_STORE_STRUCT_SIZE, status_free);
BP_CHECK_STRUCT_SIZE(bp_create_args, BP_CREATE_ARGS_STRUCT_SIZE, plugin);
BP_CHECK_STRUCT_SIZE(bp_device_count_args, BP_DEVICE_COUNT_ARGS_STRUCT_SIZE, num_devices);
BP_CHECK_STRUCT_SIZE(bp_device_info_args, BP_DEVICE_INFO_ARGS_STRUCT_SIZE, attributes);
BP_CHECK_STRUCT_SIZE(bp_device_memory_args, BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE, total_bytes);
BP_CHECK_STRUCT_SIZE(bp_supports_op_args, BP_SUPPORTS_OP_ARGS_STRUCT_SIZE, supported);
BP_CHECK_STRUCT_SIZE(bp_buffer_alloc_args, BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, buffer);
BP_CHECK_STRUCT_SIZE(bp_buffer_free_args, BP_BUFFER_FREE_ARGS_STRUCT_SIZE, buffer);
BP_CHECK_STRUCT_SIZE(bp_buffer_copy_args, BP_BUFFER_COPY_ARGS_STRUCT_SIZE, dst);
BP_CHECK_STRUCT_SIZE(bp_buffer_pointer_args, BP_BUFFER_POINTER_ARGS_STRUCT_SIZE, dl_device_id);
BP_CHECK_STRUCT_SIZE(bp_buffer_import_args, BP_BUFFER_IMPORT_ARGS_STRUCT_SIZE, buffer);
BP_CHECK_STRUCT_SIZE(bp_execute_args, BP_EXECUTE_ARGS_STRUCT_SIZE, attrs);
BP_CHECK_STRUCT_SIZE(bp_synchronize_args, BP_SYNCHRONIZE_ARGS_STRUCT_SIZE, device);
BP_CHECK_STRUCT_SIZE(bp_comm_create_args, BP_COMM_CREATE_ARGS_STRUCT_SIZE, comm);
BP_CHECK_STRUCT_SIZE(bp_comm_args, BP_COMM_ARGS_STRUCT_SIZE, comm);
BP_CHECK_STRUCT_SIZE(bp_collective_args, BP_COLLECTIVE_ARGS_STRUCT_SIZE, root);
BP_CHECK_STRUCT_SIZE(bp_plugin_api, BP_PLUGIN_API_STRUCT_SIZE, barrier);
#undef BP_CHECK_STRUCT_SIZE

TEST_CASE("plugin sdk: the table's struct_size ends at its last entry") {
  CHECK(table_of<Minimal>()->struct_size == BP_PLUGIN_API_STRUCT_SIZE);
  CHECK(table_of<Full>()->struct_size == BP_PLUGIN_API_STRUCT_SIZE);
}

TEST_CASE("plugin sdk: argument structs sized by sizeof (2.1) or exactly (2.2) are read whole") {
  const bp_plugin_api* t = table_of<Full>();
  bp_plugin* p = create(t, "{}");
  REQUIRE(p != nullptr);
  Full& full = impl_of<Full>(p);
  // sizeof covers trailing padding where a struct has it (device_count and
  // synchronize on LP64); the exact size ends at the last field.
  for (const std::size_t size :
       {sizeof(bp_device_count_args), std::size_t{BP_DEVICE_COUNT_ARGS_STRUCT_SIZE}}) {
    CAPTURE(size);
    bp_device_count_args count{size, p, -1};
    CHECK(take(t->device_count(&count)).code == BP_STATUS_OK);
    CHECK(count.num_devices == 2);
  }
  for (const std::size_t size : {sizeof(bp_synchronize_args), std::size_t{BP_SYNCHRONIZE_ARGS_STRUCT_SIZE}}) {
    CAPTURE(size);
    full.last_synchronized = -1;
    bp_synchronize_args sync{size, p, 1};
    CHECK(take(t->synchronize(&sync)).code == BP_STATUS_OK);
    CHECK(full.last_synchronized == 1);
  }
  const bp_op_attrs attrs{BP_OP_ATTRS_STRUCT_SIZE, 0, 0, 0, 0.0, 0.0, 0};
  for (const std::size_t size : {sizeof(bp_execute_args), std::size_t{BP_EXECUTE_ARGS_STRUCT_SIZE}}) {
    CAPTURE(size);
    full.last_attrs = nullptr;
    bp_execute_args e{size, p, 0, BP_OP_ADD, nullptr, nullptr, 0, 0, &attrs};
    CHECK(take(t->execute(&e)).code == BP_STATUS_OK);
    CHECK(full.last_attrs == &attrs);
  }
  for (const std::size_t size : {sizeof(bp_comm_create_args), std::size_t{BP_COMM_CREATE_ARGS_STRUCT_SIZE}}) {
    CAPTURE(size);
    bp_comm_create_args in{};
    in.struct_size = size;
    in.key_prefix = "job/";
    const bp_comm_create_args a = bpp::detail::read_args(&in);
    CHECK(std::string(a.key_prefix) == "job/");
  }
  t->destroy(p);
}

TEST_CASE("plugin sdk: one byte short of a field, the field is absent") {
  const bp_plugin_api* t = table_of<Full>();
  bp_plugin* p = create(t, "{}");
  REQUIRE(p != nullptr);

  // Out-fields the host's struct does not hold are not written.
  bp_device_count_args count{BP_DEVICE_COUNT_ARGS_STRUCT_SIZE - 1, p, -1};
  CHECK(take(t->device_count(&count)).code == BP_STATUS_OK);
  CHECK(count.num_devices == -1);

  bp_device_info_args info{};
  info.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE - 1;
  info.plugin = p;
  info.attributes = reinterpret_cast<const bp_attribute*>(&info);  // must stay as it is
  CHECK(take(t->device_info(&info)).code == BP_STATUS_OK);
  CHECK(std::string(info.name) == "full:0");
  CHECK(info.attributes == reinterpret_cast<const bp_attribute*>(&info));

  bp_device_memory_args mem{BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE - 1, p, 0, 0, 0, 99};
  CHECK(take(t->device_memory(&mem)).code == BP_STATUS_OK);
  CHECK(mem.free_bytes == 5);
  CHECK(mem.total_bytes == 99);

  bp_buffer_pointer_args ptr{BP_BUFFER_POINTER_ARGS_STRUCT_SIZE - 1, p, nullptr, nullptr, 0, -7};
  CHECK(take(t->buffer_pointer(&ptr)).code == BP_STATUS_OK);
  CHECK(ptr.dl_device_type == BP_DL_CUDA);
  CHECK(ptr.dl_device_id == -7);
  t->destroy(p);
}

TEST_CASE("plugin sdk: buffer_import from an older host reads the missing release as NULL") {
  const bp_plugin_api* t = table_of<Full>();
  bp_plugin* p = create(t, "{}");
  REQUIRE(p != nullptr);
  // A host whose struct ends before `release`: the class sees release == NULL,
  // never the garbage beyond struct_size.
  bp_buffer_import_args a;
  std::memset(&a, 0xCD, sizeof(a));
  a.struct_size = offsetof(bp_buffer_import_args, release);
  a.plugin = p;
  a.size = 13;  // the class refuses it
  unsigned char memory[16];
  a.data = memory;
  impl_of<Full>(p).seen_release = [](void*) {};  // overwritten by the call
  Outcome refused = take(t->buffer_import(&a));
  CHECK(refused.code == BP_STATUS_UNSUPPORTED);
  CHECK_FALSE(is_set(impl_of<Full>(p).seen_release));
  t->destroy(p);
}

// ---- make_view ----------------------------------------------------------------------

TEST_CASE("plugin sdk: make_view accepts views inside the buffer and describes their layout") {
  std::vector<unsigned char> storage(64);  // heap memory: malloc's alignment covers every dtype
  unsigned char* buffer = storage.data();
  SUBCASE("contiguous [2, 3] f32") {
    Desc d(BP_DTYPE_F32, {2, 3}, {3, 1});
    const bpp::TensorView v = bpp::make_view(d.t, BP_DTYPE_F32, buffer, 24, "add", {"inputs", 0});
    CHECK(v.numel == 6);
    CHECK(v.element_size == 4);
    CHECK(v.contiguous);
    CHECK_FALSE(v.scalar);
    CHECK(v.data == buffer);
    CHECK(v.last - v.first == 24);
    CHECK(v.shape_string() == "[2,3]");
  }
  SUBCASE("a transposed view at an offset") {
    Desc d(BP_DTYPE_F32, {3, 2}, {1, 3}, 8);
    const bpp::TensorView v = bpp::make_view(d.t, BP_DTYPE_F32, buffer, 32, "add", {"inputs", 0});
    CHECK(v.numel == 6);
    CHECK_FALSE(v.contiguous);
    CHECK(v.data == buffer + 8);
  }
  SUBCASE("a broadcast scalar (stride 0)") {
    Desc d(BP_DTYPE_F64, {4, 5}, {0, 0});
    const bpp::TensorView v = bpp::make_view(d.t, BP_DTYPE_F64, buffer, 8, "add", {"inputs", 1});
    CHECK(v.numel == 20);
    CHECK(v.scalar);
    CHECK(v.last - v.first == 8);
  }
  SUBCASE("an empty view needs no memory") {
    Desc d(BP_DTYPE_F32, {0, 1000}, {1000, 1}, 4000);
    const bpp::TensorView v = bpp::make_view(d.t, BP_DTYPE_F32, buffer, 0, "add", {"inputs", 0});
    CHECK(v.numel == 0);
  }
  SUBCASE("a 0-d scalar") {
    Desc d(BP_DTYPE_I64, {}, {}, 8);
    const bpp::TensorView v = bpp::make_view(d.t, BP_DTYPE_I64, buffer, 16, "add", {"inputs", 0});
    CHECK(v.numel == 1);
    CHECK(v.data == buffer + 8);
  }
  SUBCASE("a negative stride that stays inside") {
    Desc d(BP_DTYPE_F32, {3}, {-1}, 8);
    const bpp::TensorView v = bpp::make_view(d.t, BP_DTYPE_F32, buffer, 12, "add", {"inputs", 0});
    CHECK(v.first == reinterpret_cast<uintptr_t>(buffer));
    CHECK(v.last == reinterpret_cast<uintptr_t>(buffer) + 12);
  }
}

TEST_CASE("plugin sdk: make_view refuses bad views with messages that name the op and the operand") {
  std::vector<unsigned char> storage(64);  // heap memory: malloc's alignment covers every dtype
  unsigned char* buffer = storage.data();
  SUBCASE("out of bounds") {
    Desc d(BP_DTYPE_F32, {2, 3}, {3, 1}, 4);
    const std::string m = view_error(d.t, BP_DTYPE_F32, buffer, 24);
    CHECK(contains(m, "add: inputs[1]: "));
    CHECK(contains(m, "shape [2,3], strides [3,1] at byte_offset 4 reach outside the buffer of 24 bytes"));
  }
  SUBCASE("a stride that reaches past the end") {
    Desc d(BP_DTYPE_F32, {2, 3}, {4, 1});
    CHECK(contains(view_error(d.t, BP_DTYPE_F32, buffer, 24), "reach outside the buffer of 24 bytes"));
  }
  SUBCASE("a negative stride that reaches before the start") {
    Desc d(BP_DTYPE_F32, {3}, {-1}, 4);
    CHECK(contains(view_error(d.t, BP_DTYPE_F32, buffer, 64), "reach outside the buffer"));
  }
  SUBCASE("misaligned") {
    Desc d(BP_DTYPE_F32, {2}, {1}, 2);
    const std::string m = view_error(d.t, BP_DTYPE_F32, buffer, 64, {"outputs", 0});
    CHECK(m == "add: outputs[0]: byte_offset 2 is not a multiple of the element size");
  }
  SUBCASE("negative extent") {
    Desc d(BP_DTYPE_F32, {2, -3}, {3, 1});
    CHECK(view_error(d.t, BP_DTYPE_F32, buffer, 64) == "add: inputs[1]: shape [2,-3] has a negative extent");
  }
  SUBCASE("dtype mismatch") {
    Desc d(BP_DTYPE_F64, {2}, {1});
    CHECK(view_error(d.t, BP_DTYPE_F32, buffer, 64) ==
          "add: inputs[1]: dtype f64 differs from the expected f32");
  }
  SUBCASE("an unknown dtype") {
    Desc d(77, {2}, {1});
    // Unsupported (this build knows no element size for it), naming the operand and the value.
    const std::string m = view_error(d.t, 77, buffer, 64, {"inputs", 1}, BP_STATUS_UNSUPPORTED);
    CHECK(contains(m, "add: inputs[1]: "));
    CHECK(contains(m, "dtype 77 is not one this plugin was built with"));
  }
  SUBCASE("too many dimensions") {
    Desc d(BP_DTYPE_F32, {}, {});
    d.t.ndim = bpp::kMaxDims + 1;
    CHECK(contains(view_error(d.t, BP_DTYPE_F32, buffer, 64), "ndim 65 is outside 0..64"));
  }
  SUBCASE("NULL shape") {
    Desc d(BP_DTYPE_F32, {2}, {1});
    d.t.shape = nullptr;
    CHECK(contains(view_error(d.t, BP_DTYPE_F32, buffer, 64), "shape or strides is NULL"));
  }
  SUBCASE("an element count that overflows") {
    const int64_t big = int64_t{1} << 40;
    Desc d(BP_DTYPE_F32, {big, big}, {0, 0});
    CHECK(contains(view_error(d.t, BP_DTYPE_F32, buffer, 64), "element count overflows"));
  }
  SUBCASE("a span that overflows is out of bounds, not a wrap-around") {
    Desc d(BP_DTYPE_F32, {3}, {std::numeric_limits<int64_t>::max() / 2});
    CHECK(contains(view_error(d.t, BP_DTYPE_F32, buffer, 64), "reach outside the buffer"));
  }
}

TEST_CASE("plugin sdk: TensorView overlap and same_elements") {
  std::vector<unsigned char> storage(64);  // heap memory: malloc's alignment covers every dtype
  unsigned char* buffer = storage.data();
  Desc a(BP_DTYPE_F32, {4}, {1});
  Desc b(BP_DTYPE_F32, {4}, {1}, 8);
  Desc c(BP_DTYPE_F32, {2}, {1}, 16);
  const auto va = bpp::make_view(a.t, BP_DTYPE_F32, buffer, 64, "x", {"inputs", 0});
  const auto vb = bpp::make_view(b.t, BP_DTYPE_F32, buffer, 64, "x", {"inputs", 1});
  const auto vc = bpp::make_view(c.t, BP_DTYPE_F32, buffer, 64, "x", {"outputs", 0});
  CHECK(va.overlaps(vb));
  CHECK_FALSE(va.overlaps(vc));
  CHECK(va.same_elements(va));
  CHECK_FALSE(va.same_elements(vb));
  CHECK(va.same_shape(vb));
  CHECK_FALSE(va.same_shape(vc));
}

// ---- byte arithmetic ----------------------------------------------------------------

TEST_CASE("plugin sdk: byte arithmetic refuses overflow and unknown dtypes") {
  const int64_t shape[] = {2, 3, 4};
  CHECK(bpp::element_count(3, shape) == 24);
  CHECK(bpp::dense_bytes(3, shape, BP_DTYPE_F64) == 192);
  CHECK(bpp::dense_bytes(0, nullptr, BP_DTYPE_BOOL) == 1);
  CHECK_FALSE(bpp::dense_bytes(3, shape, BP_DTYPE_INVALID).has_value());
  CHECK_FALSE(bpp::dense_bytes(3, shape, 99).has_value());
  const int64_t negative[] = {2, -1};
  CHECK_FALSE(bpp::element_count(2, negative).has_value());
  const int64_t huge[] = {int64_t{1} << 62, 4};
  CHECK_FALSE(bpp::element_count(2, huge).has_value());
  const int64_t fits[] = {int64_t{1} << 61};
  CHECK_FALSE(bpp::dense_bytes(1, fits, BP_DTYPE_I64).has_value());  // 2^64 bytes
  CHECK(bpp::checked_mul(uint64_t{1} << 32, uint64_t{1} << 31) == uint64_t{1} << 63);
  CHECK_FALSE(bpp::checked_mul(uint64_t{1} << 32, uint64_t{1} << 32).has_value());
  CHECK_FALSE(bpp::checked_add(~uint64_t{0}, 1).has_value());
  CHECK(bpp::range_inside(0, 10, 10));
  CHECK(bpp::range_inside(10, 0, 10));
  CHECK_FALSE(bpp::range_inside(11, 0, 10));
  CHECK_FALSE(bpp::range_inside(4, 7, 10));
  CHECK_FALSE(bpp::range_inside(1, ~uint64_t{0}, 10));  // offset + size wraps
  CHECK(bpp::describe_shape(0, nullptr) == "[]");
}

// ---- dtype dispatch -------------------------------------------------------------------

TEST_CASE("plugin sdk: dispatch runs the kernel for the dtype's C++ type") {
  using Set = bpp::DTypes<BP_DTYPE_F32, BP_DTYPE_F64, BP_DTYPE_I32, BP_DTYPE_I64, BP_DTYPE_BOOL, BP_DTYPE_I8>;
  auto size_of = [](int32_t dtype) {
    return bpp::dispatch<Set>(dtype, "probe", []<class T>() { return sizeof(T); });
  };
  CHECK(size_of(BP_DTYPE_F32) == 4);
  CHECK(size_of(BP_DTYPE_F64) == 8);
  CHECK(size_of(BP_DTYPE_I64) == 8);
  CHECK(size_of(BP_DTYPE_BOOL) == 1);

  std::string picked;
  auto name_of = [&](int32_t dtype) {
    bpp::dispatch<Set>(dtype, "probe", [&]<class T>() {
      if constexpr (std::is_same_v<T, float>)
        picked = "float";
      else if constexpr (std::is_same_v<T, double>)
        picked = "double";
      else if constexpr (std::is_same_v<T, int32_t>)
        picked = "int32_t";
      else if constexpr (std::is_same_v<T, int64_t>)
        picked = "int64_t";
      else if constexpr (std::is_same_v<T, uint8_t>)
        picked = "uint8_t";
      else if constexpr (std::is_same_v<T, int8_t>)
        picked = "int8_t";
      else
        picked = "other";
    });
    return picked;
  };
  CHECK(name_of(BP_DTYPE_F32) == "float");
  CHECK(name_of(BP_DTYPE_F64) == "double");
  CHECK(name_of(BP_DTYPE_I32) == "int32_t");
  CHECK(name_of(BP_DTYPE_I64) == "int64_t");
  CHECK(name_of(BP_DTYPE_BOOL) == "uint8_t");
  CHECK(name_of(BP_DTYPE_I8) == "int8_t");
  static_assert(std::is_same_v<bpp::cpp_type_t<BP_DTYPE_F16>, bpp::f16_bits>);
  static_assert(sizeof(bpp::cpp_type_t<BP_DTYPE_BF16>) == 2);
}

TEST_CASE("plugin sdk: dispatch refuses a dtype outside its set with UNSUPPORTED") {
  bool ran = false;
  auto kernel = [&]<class T>() { ran = true; };
  Outcome o = take(bpp::guard([&] { bpp::dispatch<bpp::FloatDTypes>(BP_DTYPE_I32, "exp", kernel); }));
  CHECK_FALSE(ran);
  CHECK(o.code == BP_STATUS_UNSUPPORTED);
  CHECK(o.message == "exp: dtype i32 is not supported (f32, f64)");

  Outcome unknown = take(bpp::guard([&] { bpp::dispatch<bpp::FloatDTypes>(42, "exp", kernel); }));
  CHECK(unknown.code == BP_STATUS_UNSUPPORTED);
  CHECK(unknown.message == "exp: dtype dtype 42 is not supported (f32, f64)");
  CHECK_FALSE(ran);
}

TEST_CASE("plugin sdk: a dtype set answers contains and capabilities consistently") {
  using Set = bpp::ArithmeticDTypes;
  CHECK(bpp::contains<Set>(BP_DTYPE_I64));
  CHECK_FALSE(bpp::contains<Set>(BP_DTYPE_BOOL));
  CHECK_FALSE(bpp::contains<Set>(BP_DTYPE_INVALID));
  CHECK(Set::capabilities() == (BP_CAP_F32 | BP_CAP_F64 | BP_CAP_I32 | BP_CAP_I64));
  CHECK(Set::names() == "f32, f64, i32, i64");
  CHECK(bpp::AllDTypes::capabilities() == (BP_CAP_F32 | BP_CAP_F64 | BP_CAP_I32 | BP_CAP_I64 | BP_CAP_BOOL |
                                           BP_CAP_F16 | BP_CAP_BF16 | BP_CAP_U8 | BP_CAP_I8));
  for (int32_t d = 1; d < BP_DTYPE_COUNT_; ++d) {
    CAPTURE(d);
    CHECK(bpp::contains<bpp::AllDTypes>(d));
    CHECK(bpp::dtype_name(d) == bp_dtype_name(d));
    CHECK(bpp::dispatch<bpp::AllDTypes>(d, "size", []<class T>() { return sizeof(T); }) == bp_dtype_size(d));
  }
  CHECK(bpp::op_name(BP_OP_LOG_SOFTMAX) == "log_softmax");
  CHECK(bpp::op_name(1000) == "op 1000");
  CHECK(bpp::reduce_op_name(BP_REDUCE_PROD) == "prod");
}

// ---- strided iteration ----------------------------------------------------------------

TEST_CASE("plugin sdk: coalesce merges dense dimensions and keeps broadcast ones apart") {
  std::vector<unsigned char> storage(256);
  unsigned char* buffer = storage.data();
  Desc out(BP_DTYPE_F32, {4, 1, 8}, {8, 8, 1});
  Desc row(BP_DTYPE_F32, {4, 1, 8}, {0, 0, 1});  // a row broadcast over the first axis
  const auto vo = bpp::make_view(out.t, BP_DTYPE_F32, buffer, 128, "add", {"outputs", 0});
  const auto vr = bpp::make_view(row.t, BP_DTYPE_F32, buffer + 128, 32, "add", {"inputs", 0});

  auto dense = bpp::layout_of<1>(vo, {&vo});
  bpp::coalesce(dense);
  CHECK(dense.ndim == 1);
  CHECK(dense.shape[0] == 32);

  auto l = bpp::layout_of<2>(vo, {&vo, &vr});
  bpp::coalesce(l);
  REQUIRE(l.ndim == 2);
  CHECK(l.shape[0] == 4);
  CHECK(l.shape[1] == 8);
  CHECK(l.strides[1][0] == 0);
  CHECK(bpp::rows(l) == 4);

  std::vector<std::pair<int64_t, int64_t>> starts;
  bpp::for_each_row(l, 1, 3, [&](const int64_t* off) { starts.emplace_back(off[0], off[1]); });
  REQUIRE(starts.size() == 2);
  CHECK(starts[0] == std::make_pair(int64_t{8}, int64_t{0}));
  CHECK(starts[1] == std::make_pair(int64_t{16}, int64_t{0}));
}

TEST_CASE("op_family: every op abi.h names has a family, unknown values none, and family_supports uses it") {
  using namespace backplane::plugin;
  for (int32_t op = 1; op < BP_OP_COUNT_; ++op) {
    INFO(bp_op_name(op));
    CHECK(op_family(op) != OpFamily::none);
  }
  CHECK(op_family(BP_OP_INVALID) == OpFamily::none);
  CHECK(op_family(BP_OP_COUNT_) == OpFamily::none);
  CHECK(op_family(-3) == OpFamily::none);
  CHECK(op_family(BP_OP_MATMUL) == OpFamily::floating);
  CHECK(op_family(BP_OP_ADD) == OpFamily::arithmetic);
  CHECK(op_family(BP_OP_CAST) == OpFamily::numeric);
  CHECK(op_family(BP_OP_GATHER) == OpFamily::moving);
  using F = DTypes<BP_DTYPE_F32>;
  using I = DTypes<BP_DTYPE_I64>;
  using B = DTypes<BP_DTYPE_BOOL>;
  using U = DTypes<BP_DTYPE_U8>;
  CHECK(family_supports<I, F, B, U>(BP_OP_ADD, BP_DTYPE_I64));
  CHECK_FALSE(family_supports<I, F, B, U>(BP_OP_ADD, BP_DTYPE_F32));
  CHECK(family_supports<I, F, B, U>(BP_OP_EXP, BP_DTYPE_F32));
  CHECK(family_supports<I, F, B, U>(BP_OP_EQ, BP_DTYPE_BOOL));
  CHECK(family_supports<I, F, B, U>(BP_OP_COPY, BP_DTYPE_U8));
  CHECK_FALSE(family_supports<I, F, B, U>(BP_OP_COUNT_ + 1, BP_DTYPE_U8));
}
