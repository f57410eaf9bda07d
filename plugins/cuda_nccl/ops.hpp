// The cuda plugin's ops (engine library): the host side of execute, with
// the dtype sets of op_dtypes.hpp (those supports_op answers from):
// operand views, index maps, scratch, then one kernel launch (kernels.hpp) or
// one cuBLAS call (matmul.cpp). Requests arrive validated by the host (abi.h,
// "Trust contract"); what is checked is cheap and would otherwise corrupt
// memory: arity, live buffers, views inside their buffers. Data-dependent
// errors (an index out of range) are found by the kernels and reported at the
// next synchronising call.
#ifndef BACKPLANE_PLUGINS_CUDA_NCCL_OPS_HPP_
#define BACKPLANE_PLUGINS_CUDA_NCCL_OPS_HPP_

#include <backplane/plugin.hpp>

#include <cstdint>
#include <memory>

#include "device.hpp"
#include "op_dtypes.hpp"

namespace backplane::cuda {

using plugin::TensorView;

// One execute call as the op code sees it.
struct OpCall {
  Device& device;
  const bp_execute_args& args;

  int32_t op() const noexcept { return args.op; }
  const char* name() const noexcept { return bp_op_name(args.op); }
  const bp_tensor& input(int i) const noexcept { return args.inputs[i]; }
  const bp_tensor& output() const noexcept { return args.outputs[0]; }
  const bp_op_attrs& attrs() const noexcept { return *args.attrs; }
  KernelContext kernels() const noexcept { return device.kernels(args.op); }
};

// Runs one validated op on the device (under its queue, after enter()).
void run_op(const OpCall& call);
void run_matmul(const OpCall& call);  // matmul.cpp

// Shared by ops.cpp and matmul.cpp.
void expect_arity(const OpCall& call, int32_t inputs);
// A checked view of `t` (dtype `dtype`) in this plugin's device memory; orders
// the compute stream after collectives still using its buffer.
TensorView operand(const OpCall& call, const bp_tensor& t, int32_t dtype, plugin::Role role);

// Stream-ordered scratch, freed (stream-ordered) when it goes out of scope.
class Scratch {
 public:
  explicit Scratch(Device& device) : device_(device) {}
  ~Scratch() { device_.free_async(data_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* allocate(uint64_t size, const std::string& what) {
    data_ = device_.allocate(size, what);
    return data_;
  }

 private:
  Device& device_;
  void* data_ = nullptr;
};

// v's elements, row-major and dense: v.data itself when v is contiguous, else
// a copy in `scratch`.
const void* dense(const OpCall& call, const TensorView& v, Scratch& scratch);
// Copies a dense row-major `from` into the (strided) view `to`.
void scatter_dense(const OpCall& call, const void* from, const TensorView& to);

}  // namespace backplane::cuda

#endif  // BACKPLANE_PLUGINS_CUDA_NCCL_OPS_HPP_
