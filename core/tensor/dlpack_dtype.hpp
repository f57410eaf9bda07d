// The DLPack dtype of a backplane dtype, for code that makes DLPack tensors
// (to_dlpack, and load_safetensors mapping a file).
#ifndef BACKPLANE_CORE_TENSOR_DLPACK_DTYPE_HPP_
#define BACKPLANE_CORE_TENSOR_DLPACK_DTYPE_HPP_

#include <backplane/dtype.hpp>

#include <dlpack/dlpack.h>

namespace backplane::detail {

// bool is {kDLUInt, 8, 1}: the DLPack 0.6 this builds against has no boolean
// code. Throws Errc::internal for a value outside DType.
DLDataType to_dl_dtype(DType dtype);

}  // namespace backplane::detail

#endif  // BACKPLANE_CORE_TENSOR_DLPACK_DTYPE_HPP_
