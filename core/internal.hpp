// Private types shared by the core's translation units: the loaded backend,
// the registry, tensor storage, and status-to-Error conversion.
// Never installed; plugins and host applications cannot see it.
#ifndef BACKPLANE_CORE_INTERNAL_HPP_
#define BACKPLANE_CORE_INTERNAL_HPP_

#include <backplane/abi.h>
#include <backplane/distributed.hpp>
#include <backplane/error.hpp>
#include <backplane/registry.hpp>
#include <backplane/shape.hpp>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace boost::dll {
class shared_library;
}

namespace backplane::detail {

struct GradNode;  // core/autograd.hpp

struct DeviceRecord {
  std::string name;
  Capabilities capabilities;
  std::map<std::string, std::string> attributes;
  uint64_t memory_bytes = 0;
};

// Number of dtype values this core knows (bp_dtype 0..kDtypeSlots-1).
inline constexpr int kDtypeSlots = 10;

struct BackendImpl {
  // Declared first so it is destroyed last: the library stays mapped until
  // the plugin instance (destroyed in ~BackendImpl) is gone.
  std::shared_ptr<boost::dll::shared_library> library_handle;

  // From the config.
  std::string name;
  std::string config_entry;   // "backends[2]": where in the JSON it came from
  std::string config_source;  // the config file (or from_json's source name)
  std::string library;
  std::string library_path;
  bool required = false;
  CollectiveFallback fallback;
  // For a host:<backend> fallback: that backend (set when the registry is
  // built; the config forbids chains, so there are no ownership cycles).
  std::shared_ptr<BackendImpl> fallback_host;

  // Outcome of loading.
  Backend::Status status = Backend::Status::failed;
  std::string error;
  std::optional<Errc> error_code;

  // The plugin. `api` is the plugin's table copied into a zero-filled struct
  // of this core's size, so fields beyond the plugin's struct_size read NULL.
  bp_plugin_api api{};
  bp_plugin* plugin = nullptr;
  std::string plugin_version;
  std::optional<std::pair<uint32_t, uint32_t>> abi;
  std::vector<DeviceRecord> devices;
  Capabilities capabilities;  // union over devices

  std::atomic<bool> warned_local_fallback{false};
  // supports_op answers, cached per (device, op, dtype): 0 unknown, 1 yes, 2 no.
  std::unique_ptr<std::atomic<uint8_t>[]> op_support;

  BackendImpl() = default;
  BackendImpl(const BackendImpl&) = delete;
  BackendImpl& operator=(const BackendImpl&) = delete;
  ~BackendImpl();

  bool supports(int32_t device, int32_t op, int32_t dtype);
  // "cpu:0"
  std::string device_id(int32_t device) const { return name + ":" + std::to_string(device); }
  // Throws backplane::Error for a non-NULL status, freeing it. `what` says
  // which call failed ("execute add on cpu:0").
  void check(bp_status* status, std::string_view what) const;
  // Throws Errc::backend_unavailable unless loaded.
  void require_loaded() const;
};

// Where collectives for a device run, per its capability and its backend's
// collective_fallback.
struct CollectiveRoute {
  enum class Kind { direct, local, staged };
  Kind kind;
  std::shared_ptr<BackendImpl> backend;  // direct/local: the device's own; staged: the host backend
  int32_t device;
};
// Throws Errc::capability_missing (fallback "error", or a host backend that
// lacks 'collective') or Errc::backend_unavailable; warns once per backend for
// "local". `caller` starts every message ("set_distributed_params(param 3)").
CollectiveRoute resolve_collective(const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                   const std::string& caller);

struct RegistryImpl {
  std::filesystem::path config_path;
  std::string default_backend;
  std::vector<std::shared_ptr<BackendImpl>> backends;
};

// A plugin buffer; freed through its plugin when the last view goes away.
struct Storage {
  std::shared_ptr<BackendImpl> backend;
  bp_buffer* buffer = nullptr;
  uint64_t nbytes = 0;
  int32_t device = 0;

  Storage(std::shared_ptr<BackendImpl> b, int32_t dev, uint64_t size);
  // Takes ownership of `adopted`, a buffer the plugin already made (e.g. by
  // buffer_wrap_host for DLPack import); never allocates, never throws.
  Storage(std::shared_ptr<BackendImpl> b, int32_t dev, bp_buffer* adopted, uint64_t size) noexcept;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

// One allocation per fresh tensor: the storage lives inside the impl that
// created it, and `storage` points at it. A view (reshape, permute,
// transpose, slice) has no `owned`; `base` keeps the root owner alive (a view
// of a view points at the root, never at the intermediate view) and
// `storage` points at the root's storage.
struct TensorImpl {
  std::optional<Storage> owned;
  std::shared_ptr<const TensorImpl> base;  // the root owner of *storage; null for an owner
  Storage* storage = nullptr;              // &*owned, or &*base->owned
  Shape shape;
  Shape strides;  // in elements
  uint64_t byte_offset = 0;
  DType dtype = DType::f32;
  std::optional<DistributedParams> distributed;
  // Autodiff: the leaf node (require_grad) or the node of the op that made
  // this tensor; null when it does not require grad. Never copied to views.
  std::shared_ptr<GradNode> grad_node;
};

// Row-major strides for `shape`.
Shape contiguous_strides(const Shape& shape);
// Validates a user-given shape (non-negative extents, no overflow of the
// byte size) and returns its element count.
int64_t checked_numel(const Shape& shape, DType dtype, std::string_view what);
// Allocates an uninitialised contiguous tensor on (backend, device).
std::shared_ptr<TensorImpl> allocate_tensor(const std::shared_ptr<BackendImpl>& backend, int32_t device,
                                            const Shape& shape, DType dtype);
// A bp_tensor describing `t` (borrows t's shape and strides).
bp_tensor describe(const TensorImpl& t);
// True when t's elements lie densely in row-major order from byte_offset
// (strides of extent-1 dims are ignored; an empty tensor is contiguous).
bool is_contiguous(const TensorImpl& t) noexcept;
// A view of `t`'s storage with the given layout, keeping the root owner alive.
std::shared_ptr<TensorImpl> make_view(const std::shared_ptr<TensorImpl>& t, const Shape& shape, const Shape& strides,
                                      uint64_t byte_offset);

// Maps a plugin status code to Errc.
Errc errc_from_status(int32_t code) noexcept;

// The services every plugin receives (log forwarding).
const bp_host_api* host_api() noexcept;

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_INTERNAL_HPP_
