// The cpu plugin's engine library (engine.hpp): routes each op to its family
// by its kind in abi.h's op table, runs large buffer copies and forwards the
// collectives to Communicator.
#include "engine.hpp"

#include <backplane/plugin.hpp>
#include <string>

#include "kernels.hpp"
#include "ops.hpp"

namespace backplane::cpu {
namespace {

[[noreturn, gnu::cold, gnu::noinline]] void unsupported(int32_t op) {
  plugin::fail(BP_STATUS_UNSUPPORTED, "cpu: " + plugin::op_name(op) + " is not supported");
}

bp_status* execute(const bp_execute_args* args, int threads) {
  return plugin::guard([&] {
    const OpCall call{*args, threads};
    switch (bp_op_info_of(args->op)->kind) {
      case BP_OP_KIND_BINARY:
      case BP_OP_KIND_COMPARE:
      case BP_OP_KIND_SELECT:
      case BP_OP_KIND_UNARY:
      case BP_OP_KIND_UPDATE:
        return run_elementwise(call);
      case BP_OP_KIND_COPY:
      case BP_OP_KIND_CAST:
      case BP_OP_KIND_CREATE:
      case BP_OP_KIND_RANGE:
        return run_copy(call);
      case BP_OP_KIND_REDUCE:
      case BP_OP_KIND_ARG_REDUCE:
        return run_reduce(call);
      case BP_OP_KIND_SOFTMAX:
        return run_softmax(call);
      case BP_OP_KIND_MATMUL:
        return run_matmul(call);
      case BP_OP_KIND_INDEX_SELECT:
      case BP_OP_KIND_GATHER:
        return run_take(call);
      default:
        unsupported(args->op);
    }
  });
}

bp_status* copy(void* dst, const void* src, uint64_t size, int threads) {
  return plugin::guard([&] { copy_bytes(dst, src, static_cast<int64_t>(size), threads); });
}

bp_status* comm_create(const bp_comm_create_args* args, const NetworkOptions* network, bp_comm** comm) {
  return plugin::guard([&] { *comm = Communicator::create(*args, *network).release()->handle(); });
}
bp_status* comm_destroy(bp_comm* comm) {
  return plugin::guard([&] {
    if (comm != nullptr) delete &Communicator::from_handle(comm, "comm_destroy");
  });
}
bp_status* comm_abort(bp_comm* comm) {
  return plugin::guard([&] { Communicator::from_handle(comm, "comm_abort").abort(); });
}
bp_status* all_reduce(bp_comm* comm, const bp_tensor* in, const bp_tensor* out, int32_t op) {
  return plugin::guard([&] { Communicator::from_handle(comm, "all_reduce").all_reduce(*in, *out, op); });
}
bp_status* broadcast(bp_comm* comm, const bp_tensor* tensor, int32_t root) {
  return plugin::guard([&] { Communicator::from_handle(comm, "broadcast").broadcast(*tensor, root); });
}
bp_status* all_gather(bp_comm* comm, const bp_tensor* in, const bp_tensor* out) {
  return plugin::guard([&] { Communicator::from_handle(comm, "all_gather").all_gather(*in, *out); });
}
bp_status* reduce_scatter(bp_comm* comm, const bp_tensor* in, const bp_tensor* out, int32_t op) {
  return plugin::guard(
      [&] { Communicator::from_handle(comm, "reduce_scatter").reduce_scatter(*in, *out, op); });
}
bp_status* barrier(bp_comm* comm) {
  return plugin::guard([&] { Communicator::from_handle(comm, "barrier").barrier(); });
}

constexpr EngineApi kApi = {kEngineMagic, sizeof(EngineApi), &execute,        &copy,
                            &comm_create, &comm_destroy,     &comm_abort,     &all_reduce,
                            &broadcast,   &all_gather,       &reduce_scatter, &barrier};

}  // namespace

// ---- shared by the families (ops.hpp) ----------------------------------------

void arity_fail(const OpCall& call, int32_t inputs) {
  const bp_execute_args& a = call.args;
  plugin::fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + plugin::op_name(a.op) + ": expects " +
                                               std::to_string(inputs) + " inputs and 1 output, got " +
                                               std::to_string(a.num_inputs) + " and " +
                                               std::to_string(a.num_outputs));
}

void dead_buffer_fail(const OpCall& call, Role role) {
  plugin::fail(BP_STATUS_INVALID_ARGUMENT, "cpu: " + plugin::op_name(call.op()) + ": " + role.to_string() +
                                               ": not a live cpu buffer (NULL, freed, or another backend's)");
}

AxisSplit split_at_axis(const OpCall& call, const TensorView& x) {
  const int64_t axis = call.attrs().axis;
  AxisSplit s{axis, 1, 1, 1};
  for (int32_t d = 0; d < x.ndim; ++d) {
    if (d < axis) s.outer *= x.shape[d];
    if (d == axis) s.n = x.shape[d];
    if (d > axis) s.inner *= x.shape[d];
  }
  return s;
}

const unsigned char* contiguous_copy(const TensorView& x, std::unique_ptr<unsigned char[]>& storage,
                                     int threads) {
  storage = std::make_unique_for_overwrite<unsigned char[]>(static_cast<size_t>(x.numel * x.element_size));
  StridedLayout<2> l;
  l.ndim = x.ndim;
  int64_t s = 1;
  for (int32_t d = x.ndim - 1; d >= 0; --d) {
    l.shape[d] = x.shape[d];
    l.strides[0][d] = s;
    l.strides[1][d] = x.strides[d];
    s *= x.shape[d];
  }
  coalesce(l);
  copy_strided_bytes(l, x.data, storage.get(), x.element_size, threads);
  return storage.get();
}

}  // namespace backplane::cpu

extern "C" __attribute__((visibility("default"))) const backplane::cpu::EngineApi* bp_cpu_engine_entry(
    const bp_host_api* host) {
  backplane::plugin::host_api().store(host, std::memory_order_release);
  return &backplane::cpu::kApi;
}
