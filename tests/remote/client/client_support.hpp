// Helpers for the remote plugin's tests: the plugin loaded through its ABI
// alone (dlopen + bp_plugin_entry, no core), an in-memory bp_kv_store, and a
// private temporary folder.
#ifndef BACKPLANE_TESTS_REMOTE_CLIENT_CLIENT_SUPPORT_HPP_
#define BACKPLANE_TESTS_REMOTE_CLIENT_CLIENT_SUPPORT_HPP_

#include <backplane/abi.h>
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <unistd.h>
#include <backplane/plugin/status.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace backplane::remote::test {

inline const bp_host_api g_host{BP_HOST_API_STRUCT_SIZE,
                                BP_ABI_MAJOR,
                                BP_ABI_MINOR,
                                nullptr,
                                [](void*, int32_t, const char*) {},
                                nullptr,
                                nullptr};

// A status taken from the plugin: its code (BP_STATUS_OK for NULL) and message.
struct Outcome {
  int32_t code = BP_STATUS_OK;
  std::string message;
};

inline const bp_plugin_api* remote_api() {
  static const bp_plugin_api* api = [] {
    const std::string path = std::string(BP_TEST_PLUGIN_DIR) + "/libbackplane_remote.so";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(lib != nullptr, std::string(dlerror()));
    auto entry = reinterpret_cast<bp_plugin_entry_fn>(dlsym(lib, BP_PLUGIN_ENTRY_SYMBOL));
    const bool has_entry = entry != nullptr;  // doctest cannot print a function pointer
    REQUIRE_MESSAGE(has_entry, "no " BP_PLUGIN_ENTRY_SYMBOL);
    return entry(&g_host);
  }();
  return api;
}

// One instance of the remote plugin, driven as a host would.
class RemoteInstance {
 public:
  explicit RemoteInstance(const std::string& options) : api(remote_api()) {
    bp_create_args c{BP_CREATE_ARGS_STRUCT_SIZE, "remote", options.c_str(), &g_host, nullptr};
    create = take(api->create(&c));
    plugin = c.plugin;
  }
  ~RemoteInstance() {
    if (plugin != nullptr) api->destroy(plugin);
  }
  RemoteInstance(const RemoteInstance&) = delete;
  RemoteInstance& operator=(const RemoteInstance&) = delete;

  Outcome take(bp_status* s) const {
    Outcome o;
    if (s != nullptr) {
      o.code = api->status_code(s);
      o.message = api->status_message(s);
      api->status_free(s);
    }
    return o;
  }

  Outcome device_count(int32_t& n) {
    bp_device_count_args a{BP_DEVICE_COUNT_ARGS_STRUCT_SIZE, plugin, 0};
    Outcome o = take(api->device_count(&a));
    n = a.num_devices;
    return o;
  }
  bp_buffer* alloc(int32_t device, uint64_t size) {
    bp_buffer_alloc_args a{BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, plugin, device, 0, size, nullptr};
    const Outcome o = take(api->buffer_alloc(&a));
    REQUIRE_MESSAGE(o.code == BP_STATUS_OK, o.message);
    return a.buffer;
  }
  Outcome free(bp_buffer* b) {
    bp_buffer_free_args a{BP_BUFFER_FREE_ARGS_STRUCT_SIZE, plugin, b};
    return take(api->buffer_free(&a));
  }
  Outcome write(bp_buffer* b, uint64_t offset, const void* src, uint64_t size) {
    bp_buffer_copy_args a{BP_BUFFER_COPY_ARGS_STRUCT_SIZE, plugin, b, offset, size, src, nullptr};
    return take(api->buffer_write(&a));
  }
  Outcome read(bp_buffer* b, uint64_t offset, void* dst, uint64_t size) {
    bp_buffer_copy_args a{BP_BUFFER_COPY_ARGS_STRUCT_SIZE, plugin, b, offset, size, nullptr, dst};
    return take(api->buffer_read(&a));
  }
  Outcome synchronize(int32_t device) {
    bp_synchronize_args a{BP_SYNCHRONIZE_ARGS_STRUCT_SIZE, plugin, device};
    return take(api->synchronize(&a));
  }
  // out = a + b on contiguous 1-D f32 tensors of n elements.
  Outcome add(int32_t device, bp_buffer* a, bp_buffer* b, bp_buffer* out, int64_t n, int32_t op = BP_OP_ADD) {
    const int64_t shape[1] = {n};
    const int64_t strides[1] = {1};
    const bp_tensor in[2] = {{a, 0, device, BP_DTYPE_F32, 1, 0, shape, strides},
                             {b, 0, device, BP_DTYPE_F32, 1, 0, shape, strides}};
    const bp_tensor o{out, 0, device, BP_DTYPE_F32, 1, 0, shape, strides};
    const bp_op_attrs attrs{BP_OP_ATTRS_STRUCT_SIZE, 0, 0, 0, 0.0, 0.0, 0};
    bp_execute_args e{BP_EXECUTE_ARGS_STRUCT_SIZE, plugin, device, op, in, &o, 2, 1, &attrs};
    return take(api->execute(&e));
  }

  const bp_plugin_api* api;
  bp_plugin* plugin = nullptr;
  Outcome create;
};

// An in-memory key-value store shared by threads (a job's rendezvous store).
class MemoryStore {
 public:
  MemoryStore() {
    kv.struct_size = BP_KV_STORE_STRUCT_SIZE;
    kv.ctx = this;
    kv.set = [](bp_kv_set_args* a) -> bp_status* {
      auto* self = static_cast<MemoryStore*>(a->ctx);
      std::lock_guard<std::mutex> lock(self->mu_);
      const auto* v = static_cast<const uint8_t*>(a->value);
      self->values_[a->key] = std::vector<uint8_t>(v, v + a->size);
      self->calls.push_back(std::string("set ") + a->key);
      self->cv_.notify_all();
      return nullptr;
    };
    kv.get = [](bp_kv_get_args* a) -> bp_status* {
      auto* self = static_cast<MemoryStore*>(a->ctx);
      std::unique_lock<std::mutex> lock(self->mu_);
      self->calls.push_back(std::string("get ") + a->key);
      if (!self->cv_.wait_for(lock, std::chrono::milliseconds(a->timeout_ms),
                              [&] { return self->values_.count(a->key) != 0; }))
        return plugin::make_status(BP_STATUS_TIMEOUT, "no key in time");
      const auto& v = self->values_[a->key];
      a->value = static_cast<uint8_t*>(std::malloc(v.size() + 1));
      std::copy(v.begin(), v.end(), a->value);
      a->size = v.size();
      return nullptr;
    };
    kv.wait = [](bp_kv_wait_args* a) -> bp_status* {
      auto* self = static_cast<MemoryStore*>(a->ctx);
      std::unique_lock<std::mutex> lock(self->mu_);
      const bool ok = self->cv_.wait_for(lock, std::chrono::milliseconds(a->timeout_ms), [&] {
        for (int32_t i = 0; i < a->num_keys; ++i)
          if (self->values_.count(a->keys[i]) == 0) return false;
        return true;
      });
      return ok ? nullptr : plugin::make_status(BP_STATUS_TIMEOUT, "keys missing");
    };
    kv.free_value = [](void*, uint8_t* v) { std::free(v); };
    kv.status_code = &plugin::status_code;
    kv.status_message = &plugin::status_message;
    kv.status_free = &plugin::status_free;
  }
  std::vector<std::string> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls;
  }

  bp_kv_store kv{};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> values_;
  std::vector<std::string> calls;
};

// A fresh private folder under the system's temporary folder, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "bp-remote-client-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace backplane::remote::test

#endif  // BACKPLANE_TESTS_REMOTE_CLIENT_CLIENT_SUPPORT_HPP_
