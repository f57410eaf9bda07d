// The fuzzer's fake backend: host memory, every capability, ops that touch
// the extremes of their operands (see fake_backend.hpp).
#include "fake_backend.hpp"

#include <cstring>
#include <memory>
#include <string>

namespace fuzzfake {

namespace {

struct Status {
  int32_t code;
  std::string message;
};
struct Buffer {
  std::unique_ptr<uint8_t[]> bytes;  // exactly `size` bytes: one past them is out of bounds
  uint64_t size;
};
struct Comm {
  int32_t world_size;
};

int64_t g_buffers = 0;
int64_t g_comms = 0;
volatile uint8_t g_sink = 0;  // keeps the touches from being optimised away
int g_instance = 0;

bp_status* fail(int32_t code, std::string message) {
  return reinterpret_cast<bp_status*>(std::make_unique<Status>(Status{code, std::move(message)}).release());
}

int32_t status_code(const bp_status* s) { return reinterpret_cast<const Status*>(s)->code; }
const char* status_message(const bp_status* s) { return reinterpret_cast<const Status*>(s)->message.c_str(); }
void status_free(bp_status* s) { std::unique_ptr<Status> owned(reinterpret_cast<Status*>(s)); }

bp_status* create(bp_create_args*) { return fail(BP_STATUS_INTERNAL, "the fake has one instance"); }
void destroy(bp_plugin*) {}

bp_status* device_count(bp_device_count_args* a) {
  a->num_devices = 1;
  return nullptr;
}

bp_status* device_info(bp_device_info_args* a) {
  static const bp_attribute attributes[] = {{"kind", "fake"}};
  a->name = "fake host memory";
  a->capabilities = BP_CAP_COLLECTIVE | BP_CAP_HOST_VISIBLE | BP_CAP_MATMUL;
  for (int32_t d = 1; d < BP_DTYPE_COUNT_; ++d) a->capabilities |= BP_CAP_DTYPE(d);
  a->attributes = attributes;
  a->num_attributes = 1;
  return nullptr;
}

bp_status* supports_op(bp_supports_op_args* a) {
  a->supported = a->op > 0 && a->op < BP_OP_COUNT_ && a->dtype > 0 && a->dtype < BP_DTYPE_COUNT_;
  return nullptr;
}

bp_status* device_memory(bp_device_memory_args* a) {
  a->free_bytes = 1 << 30;
  a->total_bytes = 1 << 30;
  return nullptr;
}

bp_status* buffer_alloc(bp_buffer_alloc_args* a) {
  auto b = std::make_unique<Buffer>(Buffer{std::make_unique<uint8_t[]>(a->size), a->size});
  a->buffer = reinterpret_cast<bp_buffer*>(b.release());
  ++g_buffers;
  return nullptr;
}

bp_status* buffer_free(bp_buffer_free_args* a) {
  std::unique_ptr<Buffer> owned(reinterpret_cast<Buffer*>(a->buffer));
  --g_buffers;
  return nullptr;
}

Buffer& of(bp_buffer* b) { return *reinterpret_cast<Buffer*>(b); }

bp_status* buffer_write(bp_buffer_copy_args* a) {
  if (a->size != 0) std::memcpy(of(a->buffer).bytes.get() + a->offset, a->src, a->size);
  return nullptr;
}

bp_status* buffer_read(bp_buffer_copy_args* a) {
  if (a->size != 0) std::memcpy(a->dst, of(a->buffer).bytes.get() + a->offset, a->size);
  return nullptr;
}

bp_status* buffer_pointer(bp_buffer_pointer_args* a) {
  a->data = of(a->buffer).bytes.get();
  a->dl_device_type = BP_DL_CPU;
  a->dl_device_id = 0;
  return nullptr;
}

// Reads (or writes) the first and last byte of every element at the two
// extremes of the view; strides are >= 0, so those are its lowest and highest addresses.
void touch(const bp_tensor& t, bool write) {
  const uint64_t esize = bp_dtype_size(t.dtype);
  uint64_t last = 0;
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return;  // no element at all
    last += static_cast<uint64_t>(t.shape[d] - 1) * static_cast<uint64_t>(t.strides[d]);
  }
  uint8_t* base = of(t.buffer).bytes.get() + t.byte_offset;
  for (const uint64_t byte : {uint64_t{0}, esize - 1, last * esize, last * esize + esize - 1}) {
    if (write) {
      base[byte] = 1;
    } else {
      g_sink = static_cast<uint8_t>(g_sink + base[byte]);
    }
  }
}

bp_status* execute(bp_execute_args* a) {
  for (int32_t i = 0; i < a->num_inputs; ++i) touch(a->inputs[i], false);
  for (int32_t i = 0; i < a->num_outputs; ++i) touch(a->outputs[i], true);
  return nullptr;
}

bp_status* synchronize(bp_synchronize_args*) { return nullptr; }

// One rank needs no peers; more ask the store, which the fuzzer's client never answers.
bp_status* comm_create(bp_comm_create_args* a) {
  if (a->world_size > 1) {
    bp_kv_get_args get{};
    get.struct_size = BP_KV_GET_ARGS_STRUCT_SIZE;
    get.ctx = a->store->ctx;
    const std::string key = std::string(a->key_prefix) + "rank0";
    get.key = key.c_str();
    get.timeout_ms = a->timeout_ms;
    bp_status* s = a->store->get(&get);
    if (s == nullptr) {
      a->store->free_value(a->store->ctx, get.value);
      return fail(BP_STATUS_INTERNAL, "the fuzzer's store answered");
    }
    std::string message = a->store->status_message(s);
    a->store->status_free(s);
    return fail(BP_STATUS_COLLECTIVE, "no peers: " + message);
  }
  a->comm = reinterpret_cast<bp_comm*>(std::make_unique<Comm>(Comm{a->world_size}).release());
  ++g_comms;
  return nullptr;
}

bp_status* comm_destroy(bp_comm_args* a) {
  std::unique_ptr<Comm> owned(reinterpret_cast<Comm*>(a->comm));
  --g_comms;
  return nullptr;
}

bp_status* comm_abort(bp_comm_args*) { return nullptr; }

bp_status* collective(bp_collective_args* a) {
  if (a->input != nullptr) touch(*a->input, false);
  if (a->output != nullptr) touch(*a->output, true);
  return nullptr;
}

const bp_plugin_api kApi = [] {
  bp_plugin_api t{};
  t.struct_size = BP_PLUGIN_API_STRUCT_SIZE;
  t.abi_major = BP_ABI_MAJOR;
  t.abi_minor = BP_ABI_MINOR;
  t.plugin_name = "fake";
  t.plugin_version = "0";
  t.status_code = status_code;
  t.status_message = status_message;
  t.status_free = status_free;
  t.create = create;
  t.destroy = destroy;
  t.device_count = device_count;
  t.device_info = device_info;
  t.supports_op = supports_op;
  t.device_memory = device_memory;
  t.buffer_alloc = buffer_alloc;
  t.buffer_free = buffer_free;
  t.buffer_write = buffer_write;
  t.buffer_read = buffer_read;
  t.buffer_pointer = buffer_pointer;
  t.execute = execute;
  t.synchronize = synchronize;
  t.comm_create = comm_create;
  t.comm_destroy = comm_destroy;
  t.comm_abort = comm_abort;
  t.all_reduce = collective;
  t.broadcast = collective;
  t.all_gather = collective;
  t.reduce_scatter = collective;
  t.barrier = collective;
  return t;
}();

}  // namespace

const bp_plugin_api* api() { return &kApi; }
bp_plugin* instance() { return reinterpret_cast<bp_plugin*>(&g_instance); }
int64_t live_buffers() { return g_buffers; }
int64_t live_comms() { return g_comms; }

}  // namespace fuzzfake
