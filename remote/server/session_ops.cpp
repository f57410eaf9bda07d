// The requests a session runs on a device rather than on one buffer:
// execute (an op, its operands decoded and checked against what the device
// can do), synchronize and device_memory.
#include "remote/server/messages.hpp"
#include "remote/server/session.hpp"
#include "remote/server/session_internal.hpp"
#include "remote/server/validate.hpp"

#include <array>
#include <span>
#include <utility>

namespace backplane::remote::server {

namespace {

// Operand names for messages, without building a string per request.
constexpr std::array<const char*, kMaxOperands> kInputFields{
    "inputs[0]", "inputs[1]", "inputs[2]", "inputs[3]", "inputs[4]", "inputs[5]", "inputs[6]", "inputs[7]"};
constexpr std::array<const char*, kMaxOperands> kOutputFields{"outputs[0]", "outputs[1]", "outputs[2]",
                                                              "outputs[3]", "outputs[4]", "outputs[5]",
                                                              "outputs[6]", "outputs[7]"};

}  // namespace

void Session::execute(const wire::Execute& r) {
  const HostedDevice& dev = device(r.device());
  const uint32_t ni = r.inputs() != nullptr ? r.inputs()->size() : 0;
  const uint32_t no = r.outputs() != nullptr ? r.outputs()->size() : 0;
  if (ni > static_cast<uint32_t>(kMaxOperands) || no > static_cast<uint32_t>(kMaxOperands))
    refuse(std::to_string(ni) + " inputs and " + std::to_string(no) + " outputs; an op takes at most " +
           std::to_string(kMaxOperands) + " of each");
  const BufferLookup lookup = [this](uint64_t id) -> std::optional<OwnedBuffer> {
    const auto it = buffers_.find(id);
    if (it == buffers_.end()) return std::nullopt;
    return OwnedBuffer{it->second.handle, it->second.size, it->second.device};
  };
  // The decoded operands live in the session (their shapes keep their
  // storage from one request to the next), so that no allocation is made here.
  std::array<bp_tensor, kMaxOperands> in_t{}, out_t{};
  for (uint32_t i = 0; i < ni; ++i) {
    decode_tensor(r.inputs()->Get(i), r.device(), lookup, kInputFields[i], decoded_inputs_[i]);
    in_t[i] = decoded_inputs_[i].tensor;
  }
  for (uint32_t i = 0; i < no; ++i) {
    decode_tensor(r.outputs()->Get(i), r.device(), lookup, kOutputFields[i], decoded_outputs_[i]);
    out_t[i] = decoded_outputs_[i].tensor;
  }
  const std::span<const bp_tensor> in(in_t.data(), ni);
  const std::span<const bp_tensor> out(out_t.data(), no);
  bp_op_attrs attrs{};
  attrs.struct_size = BP_OP_ATTRS_STRUCT_SIZE;
  attrs.axis = r.axis();
  attrs.dtype = r.dtype();
  attrs.scalar0 = r.scalar0();
  attrs.scalar1 = r.scalar1();
  attrs.seed = r.seed();
  validate_execute(r.op(), in, out, attrs);
  if (out.empty()) refuse(op_text(r.op()) + " has no output");

  // What the device can do: the dtypes it holds, matmul, then supports_op
  // asked as abi.h says (the data operand's dtype; a cast's both dtypes).
  const auto where = [&] {
    return "device " + std::to_string(r.device()) + " of backend '" + hosted_->backend_name() + "'";
  };
  for (const std::span<const bp_tensor> operands : {in, out})
    for (const bp_tensor& t : operands)
      if (!dev.holds(t.dtype))
        refuse(where() + " does not hold " + dtype_text(t.dtype) + " tensors (no '" + dtype_text(t.dtype) +
                   "' capability)",
               BP_STATUS_UNSUPPORTED);
  if (r.op() == BP_OP_MATMUL && !dev.has(BP_CAP_MATMUL))
    refuse(where() + " has no 'matmul' capability", BP_STATUS_UNSUPPORTED);
  const int32_t dtype = r.op() == BP_OP_WHERE ? in[1].dtype : in.empty() ? out[0].dtype : in[0].dtype;
  for (const int32_t d : {dtype, r.op() == BP_OP_CAST ? attrs.dtype : dtype})
    if (!dev.supports(r.op(), d))
      refuse(where() + " does not run " + op_text(r.op()) + " on " + dtype_text(d), BP_STATUS_UNSUPPORTED);

  bp_execute_args a{};
  a.struct_size = BP_EXECUTE_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.device = r.device();
  a.op = r.op();
  a.inputs = in.data();
  a.outputs = out.data();
  a.num_inputs = static_cast<int32_t>(in.size());
  a.num_outputs = static_cast<int32_t>(out.size());
  a.attrs = &attrs;
  check(PluginStatus(api_, api_.execute(&a)));
}

void Session::synchronize(uint64_t id, const wire::Synchronize& r) {
  device(r.device());
  int32_t code = BP_STATUS_OK;
  std::string text;
  if (api_.synchronize != nullptr) {  // without it every call finished before it returned
    bp_synchronize_args a{};
    a.struct_size = BP_SYNCHRONIZE_ARGS_STRUCT_SIZE;
    a.plugin = hosted_->plugin();
    a.device = r.device();
    PluginStatus s(api_, api_.synchronize(&a));
    if (!s.ok()) {
      code = s.code();
      text = "synchronize (request " + std::to_string(id) + ") of device " + std::to_string(r.device()) +
             ": " + s.message();
    }
  }
  auto [c, t] = outcome(code, std::move(text));
  sender_.send(encode_reply(id, c, t));
}

void Session::memory(uint64_t id, const wire::MemoryQuery& r) {
  device(r.device());
  if (api_.device_memory == nullptr)
    refuse("backend '" + hosted_->backend_name() + "' does not report device memory", BP_STATUS_UNSUPPORTED);
  bp_device_memory_args a{};
  a.struct_size = BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE;
  a.plugin = hosted_->plugin();
  a.device = r.device();
  check(PluginStatus(api_, api_.device_memory(&a)));
  auto [c, t] = outcome(BP_STATUS_OK, "");
  sender_.send(encode_memory_reply(id, c, t, a.free_bytes, a.total_bytes));
}

}  // namespace backplane::remote::server
