// DLPack interop: hand a Tensor to another framework as a DLManagedTensor, and
// adopt one from it, without copying where the memory allows.
//
// Built against DLPack 0.6 (Debian's libdlpack-dev). This header only
// forward-declares DLManagedTensor, so including it (or backplane.hpp) does
// not need dlpack.h; include <dlpack/dlpack.h> to read the struct's fields.
//
// dtypes (backplane <-> DLPack {code, bits}, lanes always 1):
//   f16 / f32 / f64  <-> {kDLFloat, 16 / 32 / 64}
//   bf16             <-> {kDLBfloat, 16}
//   i8 / i32 / i64   <-> {kDLInt, 8 / 32 / 64}
//   u8               <-> {kDLUInt, 8}
//   bool              -> {kDLUInt, 8}: DLPack 0.6 has no boolean code. from_dlpack
//                        gives u8 for it, except for a tensor that to_dlpack made,
//                        which comes back as bool. {6 (kDLBool of DLPack >= 0.8), 8}
//                        is accepted as bool.
// Any other dtype (other widths, complex, lanes != 1) is Errc::dtype_mismatch.
//
// Thread-safety: both functions may be called concurrently on distinct
// tensors. A DLManagedTensor's deleter may run on any thread.
#ifndef BACKPLANE_DLPACK_HPP_
#define BACKPLANE_DLPACK_HPP_

#include <backplane/export.hpp>

#include <backplane/registry.hpp>
#include <backplane/tensor.hpp>

extern "C" {
struct DLManagedTensor;  // <dlpack/dlpack.h>
}

namespace backplane {

// Exports `t` for a DLPack consumer; the caller owns the result and frees it
// with its deleter (result->deleter(result)) exactly once.
//
// - a device whose plugin has buffer_pointer (every host_visible device; a
//   CUDA device too): zero-copy. dl_tensor.device is where the plugin says
//   the buffer lives ({kDLCPU, 0} for host memory, {kDLCUDA, ordinal} for
//   CUDA memory); dl_tensor.data points at element [0,...,0] inside the
//   tensor's own buffer (byte_offset is always 0, as NumPy and PyTorch
//   expect), shape and strides (in elements, never NULL) are t's. The result
//   keeps the storage alive until the deleter runs, so writes on either side
//   are seen by the other. An async device is synchronised first.
// - any other device (and an empty tensor): a host copy. The tensor is read
//   back (synchronising the device) into a fresh compact row-major host array
//   owned by the result, dl_tensor.device {kDLCPU, 0}; later writes on either
//   side are not seen by the other.
//
// Throws Errc::invalid_argument for an undefined tensor and for a tensor on a
// 'remote' device (its memory is on another machine: copy it to a local
// device with to() first), and what the plugin or reading the device throws.
BACKPLANE_API DLManagedTensor* to_dlpack(const Tensor& t);

// Adopts `m` as a tensor on `device`. Takes ownership of `m` in every case,
// including when it throws: m->deleter(m) (when non-NULL) runs exactly once.
//
// - Zero-copy when `device`'s plugin implements buffer_import and accepts the
//   memory (host memory: kDLCPU, kDLCUDAHost, kDLROCMHost; or CUDA memory,
//   kDLCUDA, where the plugin takes it), the device is not 'remote', and
//   data + byte_offset is aligned to the element size. The tensor then views
//   the producer's memory with the producer's strides (possibly not
//   contiguous); writes on either side are seen by the other. The deleter
//   runs when the last tensor sharing that memory (copies and views
//   included) goes away, on that thread.
// - Otherwise, for host memory (a plugin without buffer_import or that
//   refuses it as unsupported, a 'remote' device, misaligned data, or an
//   empty tensor) the elements are copied into a new contiguous tensor on
//   `device` and the deleter runs before from_dlpack returns. CUDA memory
//   that cannot be imported is Errc::invalid_argument: the host never reads
//   device memory.
//
// Validates m before touching its data: NULL m, ndim outside [0, 8], NULL
// shape or a negative extent, NULL data with elements, a device type that is
// neither host nor CUDA memory, and a layout whose byte range overflows are
// Errc::invalid_argument; an unrepresentable dtype is Errc::dtype_mismatch;
// a dtype whose capability flag `device` lacks is Errc::capability_missing.
// The message names the DLTensor field. DLPack carries no allocation size:
// a layout whose lowest element lies before `data` (negative strides from
// data + byte_offset) is refused as invalid_argument naming dl_tensor.strides;
// a tensor to_dlpack made is also held to its known allocation. Beyond that,
// strides are trusted to stay inside the producer's allocation.
BACKPLANE_API Tensor from_dlpack(DLManagedTensor* m, const Device& device);

}  // namespace backplane

#endif  // BACKPLANE_DLPACK_HPP_
