// The server's validation of what a client asks: every tensor descriptor and
// every op, checked as the core checks them before a call crosses the ABI
// (abi.h, "Trust contract"), because a network peer is not the core. After
// these checks the hosted plugin may rely on everything the trust contract
// promises it. Pure functions: no sockets, no plugin calls.
#ifndef BACKPLANE_REMOTE_SERVER_VALIDATE_HPP_
#define BACKPLANE_REMOTE_SERVER_VALIDATE_HPP_

#include "remote_generated.h"

#include <backplane/abi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::remote::server {

// A refused request: `code` is the bp_status_code to answer with (almost
// always BP_STATUS_INVALID_ARGUMENT), `what()` says what is wrong, naming the
// field ("inputs[1].strides[2]") and the value.
class Refused : public std::runtime_error {
 public:
  Refused(int32_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int32_t code() const noexcept { return code_; }

 private:
  int32_t code_;
};

// The most dimensions a tensor may have on the wire.
inline constexpr int32_t kMaxRank = 64;
// The most inputs / outputs an Execute may name.
inline constexpr int32_t kMaxOperands = 8;

// A buffer this session owns, as the session's table knows it.
struct OwnedBuffer {
  bp_buffer* handle = nullptr;  // the hosted plugin's
  uint64_t size = 0;            // bytes
  int32_t device = 0;
};
// Finds a buffer id in the calling session's table; nullopt when the session
// does not own it (unknown, freed, or another session's).
using BufferLookup = std::function<std::optional<OwnedBuffer>(uint64_t id)>;

// A decoded tensor: `tensor` points into `shape` and `strides` (keep the
// object where it is while the tensor is used; it is not copyable).
struct DecodedTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  bp_tensor tensor{};
  uint64_t id = 0;  // the client's buffer id
  DecodedTensor() = default;
  DecodedTensor(const DecodedTensor&) = delete;
  DecodedTensor& operator=(const DecodedTensor&) = delete;
};

// Decodes and validates one descriptor for device `device`: present; a buffer
// this session owns, on `device`; a dtype abi.h names; 0 <= ndim <= kMaxRank,
// shape and strides of equal length; extents >= 0; strides >= 0; byte_offset
// a multiple of the element size; every element the view can address inside
// the buffer (all arithmetic overflow-checked). `field` names the descriptor
// in messages ("inputs[0]"). Throws Refused.
void decode_tensor(const wire::TensorDesc* desc, int32_t device, const BufferLookup& lookup,
                   const char* field, DecodedTensor& out);

// Validates an op's operands and attributes as abi.h defines each op (operand
// counts, dtypes, shapes, broadcast inputs already at the output's shape,
// matmul's dims, axes in range, cast targets, outputs contiguous where the ABI
// says so, outputs that never overlap an input or themselves). Throws Refused.
// Does not ask the plugin whether it supports the op (the caller does).
void validate_execute(int32_t op, std::span<const bp_tensor> inputs, std::span<const bp_tensor> outputs,
                      const bp_op_attrs& attrs);

// Validates a collective's tensors for a communicator of `world_size` ranks
// (contiguous; all_reduce same shape and dtype, input == output allowed;
// broadcast root in range; all_gather output = world_size x input;
// reduce_scatter input = world_size x output; reduce_op known). `input` and
// `output` may be null where the collective takes none. Throws Refused.
void validate_collective(wire::CollectiveKind kind, const bp_tensor* input, const bp_tensor* output,
                         int32_t reduce_op, int32_t root, int32_t world_size);

// True when the view's elements are laid out contiguously (row-major, dense).
bool is_contiguous(const bp_tensor& t) noexcept;

}  // namespace backplane::remote::server

#endif  // BACKPLANE_REMOTE_SERVER_VALIDATE_HPP_
