// Tests of plugin.hpp, the C++ plugin SDK, without the core: guard() turns
// every exception into the right status, and PluginTable builds a table whose
// optional entries are NULL exactly when the class lacks them.
#include <backplane/plugin.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
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

template <class T>
Outcome take(bp_status* status) {
  using Table = bpp::PluginTable<T>;
  if (status == nullptr) return {};
  Outcome out{Table::status_code(status), Table::status_message(status)};
  Table::status_free(status);
  return out;
}

// The required members only: no host_ptr, no synchronize, no collectives.
class Minimal {
 public:
  explicit Minimal(const bpp::CreateArgs& args) : args_(args) {
    if (args.options_json == R"({"fail":true})") bpp::fail(BP_STATUS_INVALID_ARGUMENT, "minimal: asked to fail");
  }
  int32_t device_count() { return 2; }
  bpp::DeviceInfo device_info(int32_t device) {
    if (device == 1) throw std::runtime_error("minimal: device 1 is broken");
    return {"minimal:0 for " + args_.backend_name, BP_CAP_F64 | BP_CAP_INT64, {{"version", "7"}, {"limit", "9"}}, 1024};
  }
  bool supports_op(int32_t, int32_t op, int32_t dtype) {
    if (dtype == BP_DTYPE_I8) throw std::logic_error("supports_op must swallow this");
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

// Everything, including the collective set.
class Full : public Minimal {
 public:
  using Minimal::Minimal;
  void* buffer_host_ptr(bp_buffer*) { return nullptr; }
  void synchronize(int32_t) {}
  bp_comm* comm_create(const bp_comm_create_args&) { return nullptr; }
  void comm_destroy(bp_comm*) {}
  void all_reduce(bp_comm*, const bp_tensor&, const bp_tensor&, bp_reduce_op) {}
  void broadcast(bp_comm*, const bp_tensor&, int32_t) {}
  void all_gather(bp_comm*, const bp_tensor&, const bp_tensor&) {}
  void reduce_scatter(bp_comm*, const bp_tensor&, const bp_tensor&, bp_reduce_op) {}
  void barrier(bp_comm*) {}
};

bp_plugin* create(const bp_plugin_api* api, const char* options_json, Outcome* outcome = nullptr) {
  bp_create_args args{};
  args.struct_size = sizeof(args);
  args.backend_name = "sdk_test";
  args.options_json = options_json;
  bp_plugin* plugin = nullptr;
  Outcome o = take<Minimal>(api->create(&args, &plugin));
  if (outcome != nullptr) *outcome = o;
  return plugin;
}

}  // namespace

TEST_CASE("plugin sdk: guard returns NULL when nothing throws") {
  bool ran = false;
  CHECK(bpp::guard([&] { ran = true; }) == nullptr);
  CHECK(ran);
}

TEST_CASE("plugin sdk: guard maps Failure to its own code and message") {
  Outcome o = take<Minimal>(bpp::guard([] { bpp::fail(BP_STATUS_UNSUPPORTED, "no such op here"); }));
  CHECK(o.code == BP_STATUS_UNSUPPORTED);
  CHECK(o.message == "no such op here");
}

TEST_CASE("plugin sdk: guard maps bad_alloc to OUT_OF_MEMORY") {
  Outcome o = take<Minimal>(bpp::guard([] { throw std::bad_alloc(); }));
  CHECK(o.code == BP_STATUS_OUT_OF_MEMORY);
  CHECK(o.message.find("out of memory") != std::string::npos);
}

TEST_CASE("plugin sdk: guard maps std::exception to INTERNAL with what()") {
  Outcome o = take<Minimal>(bpp::guard([] { throw std::out_of_range("index 9 of 3"); }));
  CHECK(o.code == BP_STATUS_INTERNAL);
  CHECK(o.message == "index 9 of 3");
}

TEST_CASE("plugin sdk: guard maps an unknown exception to INTERNAL") {
  Outcome o = take<Minimal>(bpp::guard([] { throw 3.5; }));
  CHECK(o.code == BP_STATUS_INTERNAL);
  CHECK(o.message == "unknown exception inside plugin");
}

TEST_CASE("plugin sdk: the static out-of-memory status is never freed") {
  // status_free must leave a non-heap status alone (it is the OOM fallback).
  bp_status fallback{BP_STATUS_OUT_OF_MEMORY, std::string(), "static"};
  bpp::PluginTable<Minimal>::status_free(&fallback);
  CHECK(std::string(bpp::PluginTable<Minimal>::status_message(&fallback)) == "static");
  bpp::PluginTable<Minimal>::status_free(nullptr);
}

TEST_CASE("plugin sdk: a class without optional members gets NULL optional entries") {
  const bp_plugin_api* t = bpp::PluginTable<Minimal>::table("minimal", "1.0.0");
  REQUIRE(t != nullptr);
  CHECK(t->struct_size == sizeof(bp_plugin_api));
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
  // optional, absent from the class
  CHECK_FALSE(is_set(t->buffer_host_ptr));
  CHECK_FALSE(is_set(t->synchronize));
  CHECK_FALSE(is_set(t->comm_create));
  CHECK_FALSE(is_set(t->comm_destroy));
  CHECK_FALSE(is_set(t->all_reduce));
  CHECK_FALSE(is_set(t->broadcast));
  CHECK_FALSE(is_set(t->all_gather));
  CHECK_FALSE(is_set(t->reduce_scatter));
  CHECK_FALSE(is_set(t->barrier));
}

TEST_CASE("plugin sdk: a class with the collective set gets every collective entry") {
  const bp_plugin_api* t = bpp::PluginTable<Full>::table("full", "2.0.0");
  REQUIRE(t != nullptr);
  CHECK(is_set(t->buffer_host_ptr));
  CHECK(is_set(t->synchronize));
  CHECK(is_set(t->comm_create));
  CHECK(is_set(t->comm_destroy));
  CHECK(is_set(t->all_reduce));
  CHECK(is_set(t->broadcast));
  CHECK(is_set(t->all_gather));
  CHECK(is_set(t->reduce_scatter));
  CHECK(is_set(t->barrier));
  CHECK(std::string(t->plugin_name) == "full");
}

TEST_CASE("plugin sdk: entries called through the table turn exceptions into statuses") {
  const bp_plugin_api* t = bpp::PluginTable<Minimal>::table("minimal", "1.0.0");
  Outcome created;
  bp_plugin* p = create(t, "{}", &created);
  REQUIRE(created.code == BP_STATUS_OK);
  REQUIRE(p != nullptr);

  int32_t count = -1;
  CHECK(t->device_count(p, &count) == nullptr);
  CHECK(count == 2);

  bp_device_info info{};
  info.struct_size = sizeof(info);
  Outcome broken = take<Minimal>(t->device_info(p, 1, &info));
  CHECK(broken.code == BP_STATUS_INTERNAL);
  CHECK(broken.message == "minimal: device 1 is broken");

  bp_buffer* b = nullptr;
  CHECK(take<Minimal>(t->buffer_alloc(p, 0, 2000, &b)).code == BP_STATUS_OUT_OF_MEMORY);
  Outcome w = take<Minimal>(t->buffer_write(p, nullptr, 0, nullptr, 0));
  CHECK(w.code == BP_STATUS_INTERNAL);
  CHECK(w.message == "unknown exception inside plugin");
  Outcome r = take<Minimal>(t->buffer_read(p, nullptr, 0, nullptr, 0));
  CHECK(r.code == BP_STATUS_IO);
  CHECK(r.message == "minimal: read failed");

  CHECK(t->supports_op(p, 0, BP_OP_ADD, BP_DTYPE_F32) == 1);
  CHECK(t->supports_op(p, 0, BP_OP_MUL, BP_DTYPE_F32) == 0);
  CHECK(t->supports_op(p, 0, BP_OP_ADD, BP_DTYPE_I8) == 0);  // threw inside: "not supported"

  t->destroy(p);
}

TEST_CASE("plugin sdk: create passes options and reports a constructor failure") {
  const bp_plugin_api* t = bpp::PluginTable<Minimal>::table("minimal", "1.0.0");
  Outcome failed;
  bp_plugin* p = create(t, R"({"fail":true})", &failed);
  CHECK(p == nullptr);
  CHECK(failed.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(failed.message == "minimal: asked to fail");

  bp_plugin* out = nullptr;
  Outcome null_args = take<Minimal>(t->create(nullptr, &out));
  CHECK(null_args.code == BP_STATUS_INVALID_ARGUMENT);
  CHECK(out == nullptr);
}

TEST_CASE("plugin sdk: device_info fills only what the host's struct_size covers") {
  const bp_plugin_api* t = bpp::PluginTable<Minimal>::table("minimal", "1.0.0");
  bp_plugin* p = create(t, "{}");
  REQUIRE(p != nullptr);

  bp_device_info full{};
  full.struct_size = sizeof(full);
  REQUIRE(t->device_info(p, 0, &full) == nullptr);
  CHECK(std::string(full.name) == "minimal:0 for sdk_test");
  CHECK(full.capabilities == (BP_CAP_F64 | BP_CAP_INT64));
  REQUIRE(full.num_attributes == 2);
  CHECK(std::string(full.attributes[0].name) == "version");
  CHECK(std::string(full.attributes[0].value) == "7");
  CHECK(std::string(full.attributes[1].name) == "limit");
  CHECK(full.memory_bytes == 1024);

  // An older host whose struct ends before `capabilities`.
  bp_device_info old{};
  old.struct_size = offsetof(bp_device_info, capabilities);
  old.capabilities = 0xdead;
  old.memory_bytes = 77;
  REQUIRE(t->device_info(p, 0, &old) == nullptr);
  CHECK(std::string(old.name) == "minimal:0 for sdk_test");
  CHECK(old.capabilities == 0xdead);
  CHECK(old.memory_bytes == 77);

  // Strings from the first call stay valid until destroy().
  CHECK(std::string(full.name) == "minimal:0 for sdk_test");
  t->destroy(p);
}

TEST_CASE("plugin sdk: log forwards to the host only when one is set") {
  struct Captured {
    std::vector<std::pair<int32_t, std::string>> lines;
  } captured;
  bp_host_api host{};
  host.struct_size = sizeof(host);
  host.abi_major = BP_ABI_MAJOR;
  host.abi_minor = BP_ABI_MINOR;
  host.ctx = &captured;
  host.log = [](void* ctx, int32_t level, const char* message) {
    static_cast<Captured*>(ctx)->lines.emplace_back(level, message);
  };

  const bp_host_api* saved = bpp::host_api();
  bpp::host_api() = nullptr;
  bpp::log(BP_LOG_WARNING, "dropped: no host");
  bpp::host_api() = &host;
  bpp::log(BP_LOG_WARNING, "seen by the host");
  bpp::host_api() = saved;

  REQUIRE(captured.lines.size() == 1);
  CHECK(captured.lines[0].first == BP_LOG_WARNING);
  CHECK(captured.lines[0].second == "seen by the host");
}
