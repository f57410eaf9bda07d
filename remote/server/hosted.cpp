// The hosted backend's devices, described once at server start.
#include "remote/server/hosted.hpp"

#include <stdexcept>

namespace backplane::remote::server {

int32_t PluginStatus::code() const noexcept {
  if (status_ == nullptr) return BP_STATUS_OK;
  const int32_t c = api_->status_code(status_);
  return bp_status_code_name(c) != nullptr && c != BP_STATUS_OK ? c : BP_STATUS_INTERNAL;
}

std::string PluginStatus::message() const {
  if (status_ == nullptr) return {};
  const char* m = api_->status_message(status_);
  return (m != nullptr && m[0] != '\0') ? std::string(m) : std::string("(the backend gave no message)");
}

bool HostedDevice::supports(int32_t op, int32_t dtype) const noexcept {
  if (op <= 0 || op >= kSupportOps || dtype <= 0 || dtype >= kSupportDtypes) return false;
  const auto bit = static_cast<std::size_t>(op * kSupportDtypes + dtype);
  return bit / 8 < support.size() && (support[bit / 8] >> (bit % 8) & 1) != 0;
}

bool HostedDevice::holds(int32_t dtype) const noexcept {
  return dtype > 0 && dtype < BP_DTYPE_COUNT_ && has(BP_CAP_DTYPE(dtype));
}

Hosted::Hosted(const bp_plugin_api* api, bp_plugin* plugin, std::string backend_name,
               std::string backend_version, std::shared_ptr<const void> keepalive)
    : keepalive_(std::move(keepalive)),
      api_(api),
      plugin_(plugin),
      backend_name_(std::move(backend_name)),
      backend_version_(std::move(backend_version)) {
  if (api_ == nullptr || plugin_ == nullptr)
    throw std::runtime_error("no backend to host (a null plugin table)");
  const std::string who = "backend '" + backend_name_ + "'";
  bp_device_count_args count{};
  count.struct_size = BP_DEVICE_COUNT_ARGS_STRUCT_SIZE;
  count.plugin = plugin_;
  if (PluginStatus s(*api_, api_->device_count(&count)); !s.ok())
    throw std::runtime_error(who + ": device_count failed: " + s.message());
  if (count.num_devices < 0 || count.num_devices > 4096)
    throw std::runtime_error(who + " reports " + std::to_string(count.num_devices) +
                             " devices (0..4096 expected)");
  for (int32_t d = 0; d < count.num_devices; ++d) {
    bp_device_info_args info{};
    info.struct_size = BP_DEVICE_INFO_ARGS_STRUCT_SIZE;
    info.plugin = plugin_;
    info.device = d;
    if (PluginStatus s(*api_, api_->device_info(&info)); !s.ok())
      throw std::runtime_error(who + ": device_info of device " + std::to_string(d) +
                               " failed: " + s.message());
    HostedDevice dev;
    dev.name = info.name != nullptr ? info.name : "";
    dev.capabilities = info.capabilities;
    for (int32_t a = 0; info.attributes != nullptr && a < info.num_attributes; ++a) {
      const bp_attribute& attr = info.attributes[a];
      if (attr.name != nullptr)
        dev.attributes.emplace_back(attr.name, attr.value != nullptr ? attr.value : "");
    }
    dev.support.assign((kSupportOps * kSupportDtypes + 7) / 8, 0);
    for (int32_t op = 1; op < kSupportOps; ++op) {
      for (int32_t dtype = 1; dtype < kSupportDtypes; ++dtype) {
        bp_supports_op_args q{};
        q.struct_size = BP_SUPPORTS_OP_ARGS_STRUCT_SIZE;
        q.plugin = plugin_;
        q.device = d;
        q.op = op;
        q.dtype = dtype;
        // A failed query counts as "no", as the core treats it.
        if (PluginStatus s(*api_, api_->supports_op(&q)); s.ok() && q.supported != 0) {
          const auto bit = static_cast<std::size_t>(op * kSupportDtypes + dtype);
          dev.support[bit / 8] = static_cast<uint8_t>(dev.support[bit / 8] | (1u << (bit % 8)));
        }
      }
    }
    devices_.push_back(std::move(dev));
  }
}

}  // namespace backplane::remote::server
