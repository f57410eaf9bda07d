// The backend a server hosts: the plugin's table and instance, and each
// device's description and supports_op answers, asked once when the server
// starts (abi.h: they are constant for the instance). Immutable afterwards,
// so any thread may read it.
#ifndef BACKPLANE_REMOTE_SERVER_HOSTED_HPP_
#define BACKPLANE_REMOTE_SERVER_HOSTED_HPP_

#include <backplane/abi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace backplane::remote::server {

// A status the hosted plugin returned; freed with its table's status_free.
class PluginStatus {
 public:
  PluginStatus(const bp_plugin_api& api, bp_status* status) noexcept : api_(&api), status_(status) {}
  ~PluginStatus() {
    if (status_ != nullptr) api_->status_free(status_);
  }
  PluginStatus(const PluginStatus&) = delete;
  PluginStatus& operator=(const PluginStatus&) = delete;

  bool ok() const noexcept { return status_ == nullptr; }
  // A bp_status_code; one the ABI does not name reads as BP_STATUS_INTERNAL.
  int32_t code() const noexcept;
  std::string message() const;

 private:
  const bp_plugin_api* api_;
  bp_status* status_;
};

// The support bitmap's layout (remote.fbs, DeviceDesc.support).
inline constexpr int32_t kSupportOps = BP_OP_COUNT_;
inline constexpr int32_t kSupportDtypes = BP_DTYPE_COUNT_;

struct HostedDevice {
  std::string name;
  uint64_t capabilities = 0;
  std::vector<std::pair<std::string, std::string>> attributes;
  // Bit (op * kSupportDtypes + dtype): supports_op said yes.
  std::vector<uint8_t> support;

  bool supports(int32_t op, int32_t dtype) const noexcept;
  // The device holds tensors of `dtype` (its dtype capability flag).
  bool holds(int32_t dtype) const noexcept;
  bool has(uint64_t flag) const noexcept { return (capabilities & flag) == flag; }
};

class Hosted {
 public:
  // Asks the plugin for its devices, their descriptions and every supports_op
  // answer. `keepalive` keeps the plugin loaded while this object lives (a
  // Backend handle). Throws std::runtime_error naming the call that failed.
  Hosted(const bp_plugin_api* api, bp_plugin* plugin, std::string backend_name, std::string backend_version,
         std::shared_ptr<const void> keepalive = nullptr);

  const bp_plugin_api& api() const noexcept { return *api_; }
  bp_plugin* plugin() const noexcept { return plugin_; }
  const std::string& backend_name() const noexcept { return backend_name_; }
  const std::string& backend_version() const noexcept { return backend_version_; }
  const std::vector<HostedDevice>& devices() const noexcept { return devices_; }
  int32_t device_count() const noexcept { return static_cast<int32_t>(devices_.size()); }

 private:
  std::shared_ptr<const void> keepalive_;
  const bp_plugin_api* api_;
  bp_plugin* plugin_;
  std::string backend_name_;
  std::string backend_version_;
  std::vector<HostedDevice> devices_;
};

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_HOSTED_HPP_
