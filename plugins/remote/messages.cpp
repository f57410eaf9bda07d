// Encoding tensor descriptors, decoding the Welcome, and the wording of
// failures for the remote plugin.
#include "plugins/remote/messages.hpp"

#include <backplane/plugin/status.hpp>

namespace backplane::remote::client {

bool ServerDevice::supports(int32_t op, int32_t dtype) const noexcept {
  if (op < 0 || dtype < 0 || op >= op_count || dtype >= dtype_count) return false;
  const uint64_t bit =
      static_cast<uint64_t>(op) * static_cast<uint64_t>(dtype_count) + static_cast<uint64_t>(dtype);
  if (bit / 8 >= support.size()) return false;
  return ((support[bit / 8] >> (bit % 8)) & 1u) != 0;
}

std::string decode_welcome(const wire::Welcome& welcome, ServerInfo& out) {
  out.session = welcome.session();
  out.backend = welcome.backend() != nullptr ? welcome.backend()->str() : std::string();
  out.backend_version =
      welcome.backend_version() != nullptr ? welcome.backend_version()->str() : std::string();
  if (const wire::Limits* limits = welcome.limits(); limits != nullptr) {
    out.max_frame_bytes = limits->max_frame_bytes();
    out.max_session_bytes = limits->max_session_bytes();
    out.max_buffers = limits->max_buffers();
    out.max_inflight = limits->max_inflight();
    out.idle_timeout_ms = limits->idle_timeout_ms();
  }
  out.devices.clear();
  const auto* devices = welcome.devices();
  if (devices == nullptr) return "";
  if (devices->size() > kMaxServerDevices)
    return "it describes " + std::to_string(devices->size()) + " devices, more than the " +
           std::to_string(kMaxServerDevices) + " a backend may have";
  for (flatbuffers::uoffset_t i = 0; i < devices->size(); ++i) {
    const wire::DeviceDesc* d = devices->Get(i);
    const std::string where = "device " + std::to_string(i);
    if (d == nullptr || d->name() == nullptr || d->name()->size() == 0) return where + " has no name";
    ServerDevice dev;
    dev.name = d->name()->str();
    dev.capabilities = d->capabilities();
    if (const auto* attrs = d->attributes(); attrs != nullptr) {
      for (const wire::Attribute* a : *attrs) {
        if (a == nullptr || a->name() == nullptr || a->name()->size() == 0)
          return where + " has an attribute without a name";
        dev.attributes.emplace_back(a->name()->str(),
                                    a->value() != nullptr ? a->value()->str() : std::string());
      }
    }
    dev.op_count = d->op_count();
    dev.dtype_count = d->dtype_count();
    if (dev.op_count < 0 || dev.op_count > 4096 || dev.dtype_count < 0 || dev.dtype_count > 4096)
      return where + " has a support table of " + std::to_string(dev.op_count) + " ops x " +
             std::to_string(dev.dtype_count) + " dtypes (each must be 0..4096)";
    const uint64_t bits = static_cast<uint64_t>(dev.op_count) * static_cast<uint64_t>(dev.dtype_count);
    const uint64_t have = d->support() != nullptr ? d->support()->size() : 0;
    if (have * 8 < bits)
      return where + "'s support table holds " + std::to_string(have) + " bytes, fewer than the " +
             std::to_string((bits + 7) / 8) + " its " + std::to_string(dev.op_count) + " ops x " +
             std::to_string(dev.dtype_count) + " dtypes need";
    if (d->support() != nullptr) dev.support.assign(d->support()->begin(), d->support()->end());
    out.devices.push_back(std::move(dev));
  }
  return "";
}

flatbuffers::Offset<wire::TensorDesc> encode_tensor(flatbuffers::FlatBufferBuilder& fbb,
                                                    const bp_tensor& tensor, uint64_t buffer_id,
                                                    const char* field) {
  if (tensor.ndim < 0 || tensor.ndim > kMaxWireRank)
    plugin::fail(BP_STATUS_INVALID_ARGUMENT, std::string("remote: ") + field + " has " +
                                                 std::to_string(tensor.ndim) +
                                                 " dimensions; the remote backend "
                                                 "carries 0.." +
                                                 std::to_string(kMaxWireRank));
  if (tensor.ndim > 0 && (tensor.shape == nullptr || tensor.strides == nullptr))
    plugin::fail(BP_STATUS_INVALID_ARGUMENT, std::string("remote: ") + field + " has no shape or strides");
  const auto n = static_cast<std::size_t>(tensor.ndim);
  const auto shape = fbb.CreateVector(tensor.ndim > 0 ? tensor.shape : nullptr, n);
  const auto strides = fbb.CreateVector(tensor.ndim > 0 ? tensor.strides : nullptr, n);
  return wire::CreateTensorDesc(fbb, buffer_id, tensor.byte_offset, tensor.dtype, shape, strides);
}

int32_t server_status_code(int32_t code) noexcept {
  return (code > BP_STATUS_OK && code < BP_STATUS_COUNT_) ? code : BP_STATUS_INTERNAL;
}

std::string server_failure(const std::string& endpoint, int32_t code, const std::string& message) {
  std::string text = "server " + endpoint + ": " + (message.empty() ? "failed without a message" : message);
  if (code <= BP_STATUS_OK || code >= BP_STATUS_COUNT_)
    text += " (unknown status code " + std::to_string(code) + ")";
  return text;
}

std::string unreachable(const std::string& endpoint, const std::string& reason) {
  return "server " + endpoint + " is unreachable: " + reason +
         "; its tensors are gone; restart the server and the job";
}

}  // namespace backplane::remote::client
