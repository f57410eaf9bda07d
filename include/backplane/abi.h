/* backplane plugin ABI: the only contract between the core (libbackplane)
 * and a backend plugin. Plain C99; no C++ type, exception or allocator crosses it.
 *
 * ---------------------------------------------------------------------------
 * Versioning
 * ---------------------------------------------------------------------------
 *  - A plugin exports exactly one symbol, BP_PLUGIN_ENTRY_SYMBOL
 *    ("bp_plugin_entry"), of type bp_plugin_entry_fn. It returns a pointer to
 *    a static bp_plugin_api table (or NULL on failure; the host reports it).
 *  - Every table and argument struct begins with `struct_size`, set by its
 *    producer to sizeof() of the struct it was compiled against.
 *  - BP_ABI_MAJOR changes only when an existing field changes meaning, type or
 *    position. The host refuses a plugin whose major differs from its own.
 *  - BP_ABI_MINOR grows when fields are appended. Structs are append-only:
 *    a field, once released, keeps its offset and meaning forever.
 *  - Each side reads only the fields that lie inside the other side's
 *    struct_size (BP_HAS_FIELD). A field outside it reads as zero / NULL.
 *    So a plugin built against an older minor keeps working, and a plugin
 *    built against a newer minor works with an older host as long as it does
 *    not depend on what that host lacks.
 *  - A NULL function pointer means "not supported" and is never called.
 *    Entries marked (required) must be non-NULL; the host rejects the plugin
 *    otherwise.
 *  - A capability flag implies the entries it needs are non-NULL
 *    (BP_CAP_COLLECTIVE -> every bp_plugin_api.comm_* and collective entry;
 *    BP_CAP_ASYNC -> synchronize; BP_CAP_HOST_VISIBLE -> buffer_host_ptr).
 *    The host checks this at load time and rejects a plugin that lies.
 *    Unknown flag bits are ignored.
 *
 * ---------------------------------------------------------------------------
 * Ownership
 * ---------------------------------------------------------------------------
 *  - Functions that can fail return bp_status*: NULL means success. A
 *    non-NULL status is owned by the caller, who reads it with
 *    status_code/status_message and frees it with status_free of the same
 *    plugin table. The message string lives until the status is freed.
 *  - Strings and arrays a plugin returns inside info structs (names,
 *    attributes) are owned by the plugin and stay valid until destroy().
 *  - bp_buffer is an opaque handle owned by the caller of buffer_alloc, who
 *    frees it exactly once with buffer_free. The host never dereferences a
 *    buffer; it may read buffer_host_ptr only when the device declares
 *    BP_CAP_HOST_VISIBLE. A buffer may be device memory, or an id into
 *    memory that lives on another machine.
 *  - bp_tensor descriptors, shape/stride arrays and attribute structs passed
 *    to a plugin are borrowed for the duration of the call only.
 *  - Host callbacks (bp_host_api, bp_kv_store) stay valid while the plugin
 *    instance (or communicator) that received them lives.
 *
 * ---------------------------------------------------------------------------
 * Execution model
 * ---------------------------------------------------------------------------
 *  - The host validates every request (shapes, dtypes, broadcasting, axes)
 *    before it crosses the ABI. A plugin sees only well-formed requests; it
 *    still returns a status rather than crash on one it cannot serve.
 *  - A device with BP_CAP_ASYNC may return from execute before the work is
 *    done. An error discovered later is returned by the next synchronising
 *    call on that device: synchronize, buffer_read, or a collective. Its
 *    message should name the op that failed.
 *  - Entries may be called concurrently from several host threads on
 *    distinct buffers; a plugin serialises internally where it must.
 *  - Tensor descriptors: byte_offset is a multiple of the element size;
 *    outputs the host allocates for an op are contiguous row-major; the host
 *    does not pass an output that overlaps an input (a plugin that gets one
 *    anyway must still produce the result as if inputs were read first).
 *  - Input strides per op: elementwise binary, comparisons, WHERE, unary,
 *    CLAMP, CAST and COPY accept any strides (0 on broadcast dims); the
 *    reductions, SOFTMAX/LOG_SOFTMAX, INDEX_SELECT and GATHER get contiguous
 *    row-major inputs (the host copies a strided one first); MATMUL: 2-D
 *    operands any strides; batched ones stride 0 on broadcast batch dims and
 *    any strides on the last two. Outputs are contiguous, except COPY's,
 *    which may be a strided view of a larger buffer (how the host builds cat).
 *  - The host never calls execute for an op whose output has no elements
 *    (a reduction over an empty axis still runs: its output is not empty).
 *  - supports_op is asked with the dtype of the data operand: inputs[0]
 *    (WHERE: inputs[1], not the BOOL cond; comparisons: the inputs, not the
 *    BOOL output; ARGMAX/ARGMIN, INDEX_SELECT, GATHER: x, not the I64
 *    output or index); creation ops: the output's. CAST is asked for the
 *    source and for the target dtype, and runs only when both answer yes.
 *
 * ---------------------------------------------------------------------------
 * Lifetime of a library
 * ---------------------------------------------------------------------------
 *  - The host loads each library once (RTLD_NOW | RTLD_LOCAL) and never
 *    unmaps it (RTLD_NODELETE): runtimes a plugin links, such as OpenMP or
 *    CUDA, keep threads inside their code after the last handle closes.
 *    destroy() is still called for every instance create() made.
 */
#ifndef BACKPLANE_ABI_H_
#define BACKPLANE_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_ABI_MAJOR 1
#define BP_ABI_MINOR 1

#define BP_PLUGIN_ENTRY_SYMBOL "bp_plugin_entry"

#if defined(_WIN32)
#define BP_EXPORT __declspec(dllexport)
#else
#define BP_EXPORT __attribute__((visibility("default")))
#endif

/* True when `field` of struct type `type` lies inside a struct whose producer
 * declared `size` bytes. */
#define BP_HAS_FIELD(type, field, size) \
  ((size_t)(size) >= offsetof(type, field) + sizeof(((type *)0)->field))

/* ------------------------------------------------------------------------ */
/* Status                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum bp_status_code {
  BP_STATUS_OK = 0,
  BP_STATUS_INVALID_ARGUMENT = 1, /* a request the plugin refuses          */
  BP_STATUS_UNSUPPORTED = 2,      /* op / dtype / feature not available    */
  BP_STATUS_OUT_OF_MEMORY = 3,
  BP_STATUS_INTERNAL = 4,         /* a bug or an unexpected exception      */
  BP_STATUS_TIMEOUT = 5,
  BP_STATUS_COLLECTIVE = 6,       /* a peer failed or vanished             */
  BP_STATUS_UNAVAILABLE = 7,      /* device / server / driver not present  */
  BP_STATUS_DEVICE = 8,           /* the device reported a fault           */
  BP_STATUS_IO = 9                /* file or network I/O failed            */
} bp_status_code;

/* Opaque; each plugin defines its own. */
typedef struct bp_status bp_status;

/* ------------------------------------------------------------------------ */
/* Capabilities (per device; uint64 flag set)                                */
/* ------------------------------------------------------------------------ */

#define BP_CAP_COLLECTIVE   (UINT64_C(1) << 0) /* comm_* + collectives      */
#define BP_CAP_ASYNC        (UINT64_C(1) << 1) /* execute may return early */
#define BP_CAP_HOST_VISIBLE (UINT64_C(1) << 2) /* buffers are host pointers */
#define BP_CAP_F64          (UINT64_C(1) << 3)
#define BP_CAP_F16          (UINT64_C(1) << 4)
#define BP_CAP_BF16         (UINT64_C(1) << 5)
#define BP_CAP_REMOTE       (UINT64_C(1) << 6) /* memory on another machine */
#define BP_CAP_INT64        (UINT64_C(1) << 7)
#define BP_CAP_MATMUL       (UINT64_C(1) << 8) /* has a tuned GEMM          */

/* ------------------------------------------------------------------------ */
/* Data types (values match nothing else; see dtype.hpp for DLPack codes)    */
/* ------------------------------------------------------------------------ */

typedef enum bp_dtype {
  BP_DTYPE_INVALID = 0,
  BP_DTYPE_F32 = 1,
  BP_DTYPE_F64 = 2,
  BP_DTYPE_I32 = 3,
  BP_DTYPE_I64 = 4,
  BP_DTYPE_BOOL = 5, /* one byte, 0 or 1 */
  BP_DTYPE_F16 = 6,
  BP_DTYPE_BF16 = 7,
  BP_DTYPE_U8 = 8,
  BP_DTYPE_I8 = 9
} bp_dtype;

/* ------------------------------------------------------------------------ */
/* Ops (append-only; the host validates shapes and dtypes before execute)    */
/* ------------------------------------------------------------------------ */

typedef enum bp_op {
  BP_OP_INVALID = 0,
  /* elementwise binary: inputs[0..1], outputs[0]; inputs arrive already
   * broadcast to the output's shape (stride 0 on broadcast dims). */
  BP_OP_ADD = 1,
  BP_OP_SUB = 2,
  BP_OP_MUL = 3,
  BP_OP_DIV = 4,
  /* matmul: inputs [...,M,K] and [...,K,N], output [...,M,N], one dtype.
   * With more than 2 dims the leading (batch) dims of both inputs arrive
   * already broadcast to the output's (stride 0 on broadcast ones). */
  BP_OP_MATMUL = 5,
  /* copy: inputs[0] -> outputs[0], same shape and dtype, any strides on
   * both sides (the output may be a strided view; it never overlaps itself
   * or the input). The host builds reshape/permute/slice/cat from it. */
  BP_OP_COPY = 6,
  /* ---- ABI 1.1 ---------------------------------------------------------
   * Binary, as ADD: inputs broadcast to the output's shape, one dtype.
   * Integer POW with a negative exponent cannot be refused by the host (it
   * depends on the data): the plugin returns INVALID_ARGUMENT. */
  BP_OP_POW = 7,
  BP_OP_MAXIMUM = 8,      /* NaN-propagating for floats */
  BP_OP_MINIMUM = 9,
  /* Comparisons, as ADD but the output dtype is BP_DTYPE_BOOL. */
  BP_OP_EQ = 10,
  BP_OP_NE = 11,
  BP_OP_LT = 12,
  BP_OP_LE = 13,
  BP_OP_GT = 14,
  BP_OP_GE = 15,
  /* where: inputs [cond (BOOL), a, b] broadcast to the output's shape; a, b
   * and the output share one dtype. out = cond ? a : b. */
  BP_OP_WHERE = 16,
  /* Unary: inputs[0] has the output's shape and dtype. */
  BP_OP_NEG = 17,
  BP_OP_ABS = 18,
  BP_OP_EXP = 19,
  BP_OP_LOG = 20,
  BP_OP_SQRT = 21,
  BP_OP_TANH = 22,
  BP_OP_SIGMOID = 23,
  BP_OP_RELU = 24,
  BP_OP_SIN = 25,
  BP_OP_COS = 26,
  BP_OP_CLAMP = 27,       /* attrs: scalar0 = low, scalar1 = high */
  /* cast: inputs[0] -> outputs[0], same shape, the output's dtype differs.
   * Float -> int truncates toward zero (NaN/out of range: unspecified value,
   * never a trap); to BOOL is (x != 0); int -> narrower int wraps. */
  BP_OP_CAST = 28,
  /* Creation: no inputs, one contiguous output. */
  BP_OP_FILL = 29,        /* every element = scalar0 */
  BP_OP_ARANGE = 30,      /* 1-D: out[i] = scalar0 + i * scalar1 */
  BP_OP_RAND_UNIFORM = 31,/* [scalar0, scalar1); attrs.seed; same seed, same values
                           * on the same backend (cpu: whatever the thread count) */
  BP_OP_RANDN = 32,       /* normal(mean scalar0, std scalar1); attrs.seed */
  /* Reductions over one axis (attrs.axis, 0 <= axis < ndim). The output
   * has the input's ndim with extent 1 on that axis (the host drops it for
   * keepdim=false, and flattens for an all-axes reduction). ARGMAX/ARGMIN
   * write BP_DTYPE_I64 (the first index of the extreme; NaN counts as the
   * extreme); MEAN is for float dtypes. An empty axis: SUM 0, MEAN NaN;
   * MAX/MIN/ARGMAX/ARGMIN are refused by the host. */
  BP_OP_SUM = 33,
  BP_OP_MEAN = 34,
  BP_OP_MAX = 35,
  BP_OP_MIN = 36,
  BP_OP_ARGMAX = 37,
  BP_OP_ARGMIN = 38,
  /* softmax / log_softmax along attrs.axis; output has the input's shape. */
  BP_OP_SOFTMAX = 39,
  BP_OP_LOG_SOFTMAX = 40,
  /* index_select: inputs [x, index (I64, 1-D)], attrs.axis; the output is x
   * with extent len(index) on axis. gather: inputs [x, index (I64, same ndim
   * as x)], attrs.axis; out[i][j][k] = x[i][index[i][j][k]][k] (axis 1).
   * An index out of range is an INVALID_ARGUMENT status naming it. */
  BP_OP_INDEX_SELECT = 41,
  BP_OP_GATHER = 42,
  BP_OP_COUNT_ /* not an op: one past the last value this header knows */
} bp_op;

/* attrs.axis value meaning "no axis" where an op allows it. */
#define BP_AXIS_NONE INT64_MIN

/* Attributes of an op. Fields an op does not use are ignored. */
typedef struct bp_op_attrs {
  size_t struct_size;
  int64_t axis;
  int32_t keepdim;
  int32_t dtype;        /* bp_dtype: target of a cast                       */
  double scalar0;       /* e.g. clamp low, fill value                       */
  double scalar1;       /* e.g. clamp high                                  */
  uint64_t seed;
  const int64_t *ints;  /* e.g. a permutation, slice bounds                 */
  int32_t num_ints;
} bp_op_attrs;

/* ------------------------------------------------------------------------ */
/* Memory and tensors                                                        */
/* ------------------------------------------------------------------------ */

typedef struct bp_plugin bp_plugin; /* a plugin instance (from create)      */
typedef struct bp_buffer bp_buffer; /* opaque device allocation            */
typedef struct bp_comm bp_comm;     /* a collective communicator           */

/* A view of a buffer, shaped like DLPack's DLTensor. Strides are in
 * elements (never NULL; 0 on a broadcast dimension). byte_offset is where
 * element [0,...,0] lies within the buffer. */
typedef struct bp_tensor {
  bp_buffer *buffer;
  uint64_t byte_offset;
  int32_t device;      /* device index within the plugin                   */
  int32_t dtype;       /* bp_dtype                                          */
  int32_t ndim;        /* 0 for a scalar                                    */
  int32_t reserved_;   /* zero                                              */
  const int64_t *shape;
  const int64_t *strides;
} bp_tensor;

/* ------------------------------------------------------------------------ */
/* Host services handed to the plugin                                        */
/* ------------------------------------------------------------------------ */

typedef enum bp_log_level {
  BP_LOG_DEBUG = 0,
  BP_LOG_INFO = 1,
  BP_LOG_WARNING = 2,
  BP_LOG_ERROR = 3
} bp_log_level;

typedef struct bp_host_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  void *ctx;
  /* (required) Log a NUL-terminated message; thread-safe. */
  void (*log)(void *ctx, int32_t level, const char *message);
} bp_host_api;

/* A key-value store shared by all ranks of a group, backed by the host's
 * rendezvous. Keys are NUL-terminated; values are bytes. Every call returns
 * a bp_status_code; on failure last_error() describes it (thread-local,
 * valid until the next call on the same thread). */
typedef struct bp_kv_bytes {
  uint8_t *data;
  uint64_t size;
} bp_kv_bytes;

typedef struct bp_kv_store {
  size_t struct_size;
  void *ctx;
  int32_t (*set)(void *ctx, const char *key, const void *value, uint64_t size);
  /* Blocks until key exists or timeout_ms elapses (BP_STATUS_TIMEOUT).
   * On success *out is owned by the plugin and freed with free_bytes. */
  int32_t (*get)(void *ctx, const char *key, int64_t timeout_ms, bp_kv_bytes *out);
  int32_t (*wait)(void *ctx, const char *const *keys, int32_t num_keys, int64_t timeout_ms);
  void (*free_bytes)(void *ctx, bp_kv_bytes *bytes);
  const char *(*last_error)(void *ctx);
} bp_kv_store;

/* ------------------------------------------------------------------------ */
/* Arguments and info structs                                                */
/* ------------------------------------------------------------------------ */

typedef struct bp_create_args {
  size_t struct_size;
  const char *backend_name;  /* the name given in backends.json             */
  const char *options_json;  /* the backend's "options" object, as JSON text */
  const bp_host_api *host;   /* the same table the entry received          */
} bp_create_args;

typedef struct bp_attribute {
  const char *name;
  const char *value;
} bp_attribute;

typedef struct bp_device_info {
  size_t struct_size;       /* set by the host; the plugin fills what fits */
  const char *name;         /* e.g. "cpu:0", "NVIDIA H200"                 */
  uint64_t capabilities;    /* BP_CAP_* */
  const bp_attribute *attributes; /* named attributes (version, limits)     */
  int32_t num_attributes;
  int32_t reserved_;
  uint64_t memory_bytes;    /* 0 if unknown                                  */
} bp_device_info;

typedef struct bp_execute_args {
  size_t struct_size;
  int32_t device;
  int32_t op;               /* bp_op */
  const bp_tensor *inputs;
  int32_t num_inputs;
  int32_t num_outputs;
  const bp_tensor *outputs; /* allocated by the host through buffer_alloc */
  const bp_op_attrs *attrs; /* never NULL */
} bp_execute_args;

typedef enum bp_reduce_op {
  BP_REDUCE_SUM = 0,
  BP_REDUCE_MEAN = 1,
  BP_REDUCE_MIN = 2,
  BP_REDUCE_MAX = 3,
  BP_REDUCE_PROD = 4
} bp_reduce_op;

typedef struct bp_comm_create_args {
  size_t struct_size;
  int32_t device;
  int32_t rank;
  int32_t world_size;
  int32_t reserved_;
  int64_t timeout_ms;       /* every collective on the comm obeys it       */
  const bp_kv_store *store; /* valid until comm_destroy                     */
  const char *key_prefix;   /* namespace for this comm's keys in the store */
} bp_comm_create_args;

/* ------------------------------------------------------------------------ */
/* The plugin table                                                          */
/* ------------------------------------------------------------------------ */

typedef struct bp_plugin_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char *plugin_name;     /* (required) e.g. "cpu"                        */
  const char *plugin_version;  /* (required) e.g. "0.1.0"                      */

  /* status (required) */
  int32_t     (*status_code)   (const bp_status *status);
  const char *(*status_message)(const bp_status *status);
  void        (*status_free)   (bp_status *status);

  /* lifetime (required). create() must be cheap: no device context or
   * network connection until a device is first used. */
  bp_status *(*create) (const bp_create_args *args, bp_plugin **out);
  void       (*destroy)(bp_plugin *plugin);

  /* devices (required) */
  bp_status *(*device_count)(bp_plugin *plugin, int32_t *out);
  bp_status *(*device_info) (bp_plugin *plugin, int32_t device, bp_device_info *out);
  /* (required) nonzero when the device can run op on dtype */
  int32_t    (*supports_op) (bp_plugin *plugin, int32_t device, int32_t op, int32_t dtype);

  /* buffers (required, except buffer_host_ptr) */
  bp_status *(*buffer_alloc)   (bp_plugin *plugin, int32_t device, uint64_t size, bp_buffer **out);
  void       (*buffer_free)    (bp_plugin *plugin, bp_buffer *buffer);
  bp_status *(*buffer_write)   (bp_plugin *plugin, bp_buffer *buffer, uint64_t offset, const void *src, uint64_t size);
  bp_status *(*buffer_read)    (bp_plugin *plugin, bp_buffer *buffer, uint64_t offset, void *dst, uint64_t size);
  /* (optional; required with BP_CAP_HOST_VISIBLE) */
  void      *(*buffer_host_ptr)(bp_plugin *plugin, bp_buffer *buffer);

  /* execution */
  bp_status *(*execute)    (bp_plugin *plugin, const bp_execute_args *args); /* (required) */
  bp_status *(*synchronize)(bp_plugin *plugin, int32_t device); /* (optional; required with BP_CAP_ASYNC) */

  /* collectives (all optional; all required with BP_CAP_COLLECTIVE).
   * Input and output may alias for all_reduce. all_gather's output holds
   * world_size inputs back to back; reduce_scatter's input holds world_size
   * outputs back to back. */
  bp_status *(*comm_create)   (bp_plugin *plugin, const bp_comm_create_args *args, bp_comm **out);
  void       (*comm_destroy)  (bp_plugin *plugin, bp_comm *comm);
  bp_status *(*all_reduce)    (bp_plugin *plugin, bp_comm *comm, const bp_tensor *input, const bp_tensor *output, int32_t reduce_op);
  bp_status *(*broadcast)     (bp_plugin *plugin, bp_comm *comm, const bp_tensor *tensor, int32_t root);
  bp_status *(*all_gather)    (bp_plugin *plugin, bp_comm *comm, const bp_tensor *input, const bp_tensor *output);
  bp_status *(*reduce_scatter)(bp_plugin *plugin, bp_comm *comm, const bp_tensor *input, const bp_tensor *output, int32_t reduce_op);
  bp_status *(*barrier)       (bp_plugin *plugin, bp_comm *comm);

  /* ---- ABI 1.1 ---------------------------------------------------------- */
  /* (optional; only on BP_CAP_HOST_VISIBLE devices) Adopts `size` bytes of
   * host memory at `data` as a buffer without copying (DLPack import). The
   * plugin calls release(release_ctx) exactly once, when the buffer is freed
   * (or before returning a failure status); it never frees `data` itself. */
  bp_status *(*buffer_wrap_host)(bp_plugin *plugin, int32_t device, void *data, uint64_t size,
                                 void (*release)(void *release_ctx), void *release_ctx, bp_buffer **out);
} bp_plugin_api;

/* The one exported symbol. `host` stays valid for the life of the library.
 * Returns a table with static storage duration, or NULL. */
typedef const bp_plugin_api *(*bp_plugin_entry_fn)(const bp_host_api *host);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_ABI_H_ */
