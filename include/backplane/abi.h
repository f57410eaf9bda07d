/* backplane plugin ABI: the only contract between the core (libbackplane)
 * and a backend plugin. Plain C99; no C++ type, exception or allocator
 * crosses it. Rules below are tagged with the in-tree plugin that needs them:
 * [cpu] host memory, synchronous, Gloo; [cuda] device memory, streams, NCCL;
 * [remote] every call crosses a network to `backplane serve`.
 *
 * ---------------------------------------------------------------------------
 * History
 * ---------------------------------------------------------------------------
 *  1.0  first release: positional entries, cpu plugin only.
 *  1.1  the full op set (ops 7-42), buffer_wrap_host.
 *  2.0  argument structs for every entry that can grow, statuses everywhere
 *       (the key-value store too), the execution model and the trust
 *       contract written down, DLPack export/import of device memory,
 *       free/total memory, comm_abort, dtype capability flags the host
 *       enforces (renumbered: bits 16+dtype; BP_CAP_INT64 became BP_CAP_I64),
 *       name tables here. A major bump was right: no plugin outside
 *       backplane's own tree had been built against 1.x.
 *  2.1  bp_kv_set_args.timeout_ms: a bounded set, for failure reports.
 *       An async device may defer buffer_alloc's failure to the next
 *       synchronising call when the plugin names its buffers itself (2.1,
 *       recorded here).
 *  2.2  struct_size is the end of the last field (BP_STRUCT_SIZE), not
 *       sizeof: trailing padding no longer reads as a field. BP_OP_TABLE:
 *       each op once, with its kind, dtype class, arity and attributes
 *       (bp_op_info_of); the op values are unchanged. Its name column is
 *       an identifier (add), so C++ can name enumerators from it; #name is
 *       the string.
 *  2.3  BP_OP_ERF (43), the Gauss error function. A host of 2.2 never asks
 *       for it; a plugin of 2.2 answers supports_op false.
 *  2.4  bp_host_api.trace_active and trace_event: a plugin adds events of
 *       its own (a collective's transport and its waits, a remote round
 *       trip) to the host's trace. NULL from a host of 2.3.
 *  2.5  BP_OP_AXPBY (44) of the new kind UPDATE: y = alpha*y + beta*x in
 *       place, an optimizer step as one call with no result to allocate.
 *       A host of 2.4 never asks for it; a plugin of 2.4 answers
 *       supports_op false and the host runs the same update as three ops.
 *
 * ---------------------------------------------------------------------------
 * Versioning
 * ---------------------------------------------------------------------------
 *  - A plugin exports exactly one symbol, BP_PLUGIN_ENTRY_SYMBOL
 *    ("bp_plugin_entry"), of type bp_plugin_entry_fn. It returns a pointer to
 *    a static bp_plugin_api table (or NULL on failure; the host reports it).
 *    It returns its table even to a host of another major, so that the host
 *    can name both versions when it refuses the plugin.
 *  - Every table and argument struct begins with `struct_size`, set by its
 *    producer to the offset plus size of the last field it knows: the
 *    struct's BP_<NAME>_STRUCT_SIZE, defined beside it with BP_STRUCT_SIZE.
 *    Never sizeof(): a struct that ends in padding (on LP64,
 *    bp_device_count_args and bp_synchronize_args end in 4 bytes) would
 *    declare the padding, and a field a later minor puts there would read as
 *    present. Appending a field means updating that one macro line.
 *  - Producers of 2.0 and 2.1 set sizeof(). A reader accepts both: sizeof is
 *    never smaller than the exact size, so every field they knew reads as
 *    present (BP_HAS_FIELD means what it always did). Because such a
 *    producer declared it, the trailing padding of 2.1 (after
 *    bp_device_count_args.num_devices and bp_synchronize_args.device) never
 *    gets a meaning: a later minor that appends to those structs first fills
 *    it with a `reserved_` field.
 *  - BP_ABI_MAJOR changes only when an existing field changes meaning, type or
 *    position. The host refuses a plugin whose major differs from its own and
 *    names both majors.
 *  - BP_ABI_MINOR grows when fields are appended. Structs are append-only:
 *    a field, once released, keeps its offset and meaning forever.
 *  - Each side reads only the fields that lie inside the other side's
 *    struct_size (BP_HAS_FIELD). A field outside it reads as zero / NULL.
 *    A plugin table covers at least every entry up to `execute` (the last
 *    required one); entries beyond its struct_size are NULL.
 *    So a plugin built against an older minor keeps working, and a plugin
 *    built against a newer minor works with an older host as long as it does
 *    not depend on what that host lacks.
 *  - Every entry that can grow takes one argument struct (the PJRT pattern):
 *    inputs first, then outputs the callee fills. Only status_code,
 *    status_message, status_free, destroy and bp_host_api.log are positional.
 *  - A NULL function pointer means "not supported" and is never called.
 *    Entries marked (required) must be non-NULL; the host rejects the plugin
 *    otherwise, naming them.
 *
 * ---------------------------------------------------------------------------
 * Errors: one convention
 * ---------------------------------------------------------------------------
 *  - Every call that can fail returns bp_status*: NULL means success. A
 *    non-NULL status is owned by the caller, who reads it with status_code /
 *    status_message and frees it with status_free of the table that made it
 *    (the plugin's table for plugin entries, the bp_kv_store for the host's
 *    store callbacks). The message lives until the status is freed.
 *  - Messages say what failed, where and what to do; the host prefixes the
 *    backend, device and op, so a plugin need not repeat them.
 *
 * ---------------------------------------------------------------------------
 * Capabilities
 * ---------------------------------------------------------------------------
 *  - Each device declares a uint64 flag set in device_info. Flags are
 *    constant for the life of a plugin instance [remote: fixed at connect].
 *  - Every flag decides something in the host:
 *      collective    ProcessGroup / set_distributed_params run collectives
 *                    through comm_*; without it the backend's
 *                    collective_fallback decides.                [cpu, cuda, remote]
 *      async         the host calls synchronize before it reads memory
 *                    through a pointer; errors may arrive late.  [cuda, remote]
 *      host_visible  buffer_pointer gives a host pointer (DLPack kDLCPU); the
 *                    host reads and writes tensors through it without
 *                    buffer_read/buffer_write.                   [cpu]
 *      remote        memory lives on another machine: the host refuses DLPack
 *                    export of it and never offers it imported memory. [remote]
 *      matmul        the device runs MATMUL; without it the host refuses
 *                    matmul with capability_missing before asking
 *                    supports_op (or places it on the backend's
 *                    op_fallback device, backends.json).         [cpu, cuda]
 *      dtype flags   BP_CAP_DTYPE(d): the device holds tensors of dtype d.
 *                    The host refuses to create, import or move a tensor of
 *                    a dtype whose flag the device lacks (capability_missing
 *                    naming flag, backend and device), unless the backend's
 *                    op_fallback holds such tensors for it: the plugin never
 *                    sees them. supports_op then answers per (op, dtype);
 *                    what it refuses may run on the op_fallback device. [all]
 *  - A flag implies the entries it needs are non-NULL (BP_CAP_COLLECTIVE ->
 *    comm_create, comm_destroy, comm_abort and the five collectives;
 *    BP_CAP_ASYNC -> synchronize; BP_CAP_HOST_VISIBLE -> buffer_pointer).
 *    The host checks this at load time and rejects a plugin that lies.
 *    Unknown flag bits are ignored.
 *
 * ---------------------------------------------------------------------------
 * Trust contract
 * ---------------------------------------------------------------------------
 *  - The host validates every request before it crosses the ABI: devices in
 *    range, known dtypes and ops that supports_op accepted, shapes and
 *    broadcasting, axes, views that lie inside their buffer, offsets and
 *    sizes of reads and writes inside the buffer, roots and ranks. It never
 *    passes an output that overlaps an input or another output (COPY's
 *    output is a view that never overlaps itself). The one exception is
 *    stated where it applies: all_reduce's input and output may be the very
 *    same view, broadcast works in place, and an UPDATE op's output is its
 *    first input; they never overlap partially.
 *    An in-process plugin may rely on all of this and need not check it
 *    again. [cpu, cuda]
 *  - What the host cannot know is the plugin's to check: data-dependent
 *    errors (an index out of range, an integer POW with a negative exponent)
 *    and everything a peer or a device reports.
 *  - A network server is a different boundary: it validates every field of
 *    everything it receives, as if from an attacker. [remote]
 *
 * ---------------------------------------------------------------------------
 * Execution model
 * ---------------------------------------------------------------------------
 *  - Each device behaves as one in-order queue. buffer_alloc, buffer_write,
 *    execute, the collectives, buffer_read and buffer_free on one device take
 *    effect in the order the host calls them (calls from several host threads
 *    are ordered as they enter the plugin). A plugin may overlap work
 *    internally (a copy stream, a communication stream, a network pipeline)
 *    only in ways that preserve that order as the host observes it.
 *  - A device without BP_CAP_ASYNC finishes each call before it returns. [cpu]
 *  - A device with BP_CAP_ASYNC may return from buffer_write (once src has
 *    been consumed), execute, the collectives and buffer_free before the work
 *    is done. buffer_read, synchronize and buffer_pointer's data are the
 *    synchronising points: they return after every earlier call on the
 *    device has taken effect. buffer_free must not reuse memory that queued
 *    work still reads (stream-ordered free). [cuda, remote]
 *    buffer_alloc may also return before the memory exists when the plugin
 *    names the buffer itself: a failed allocation then surfaces at the next
 *    synchronising call, naming buffer_alloc, like any failed queued work.
 *    [remote: a tiny op costs no round trip]
 *  - An error from asynchronous work is sticky on its device: the next
 *    synchronising call returns it, naming the op that failed, and clears it.
 *    A device that can no longer work (a CUDA fault that poisons its
 *    context) returns BP_STATUS_DEVICE from every later call instead. [cuda, remote]
 *  - Collectives are ordered in the device's queue like execute [cuda: on a
 *    communication stream that waits on the compute stream]. So the host may
 *    issue a bucket's all_reduce while backward still enqueues ops.
 *
 * ---------------------------------------------------------------------------
 * Threads (per entry; "any" = any thread, concurrently with any other call)
 * ---------------------------------------------------------------------------
 *  - status_*: any. bp_plugin_entry: once per library, before anything else.
 *  - create: any (each call makes an independent instance). destroy: never
 *    concurrent with another call on that instance; the host has freed every
 *    buffer and communicator first.
 *  - device_count, device_info, supports_op, device_memory: any.
 *  - buffer_alloc, buffer_free, buffer_write, buffer_read, buffer_pointer,
 *    buffer_import, execute, synchronize: any, from several threads at once;
 *    the host never writes one buffer from two threads at once, nor frees a
 *    buffer another call is using. The plugin serialises internally where it
 *    must.
 *  - comm_create: any; it blocks until every rank joined or timeout_ms.
 *    Collectives on one communicator: one thread at a time (the host
 *    serialises per communicator); different communicators: any.
 *    comm_abort: any, at any time, including while another thread is inside
 *    a collective on the same communicator. comm_destroy: never concurrent
 *    with another call on that communicator.
 *  - Host callbacks (log, the bp_kv_store entries): any.
 *
 * ---------------------------------------------------------------------------
 * Ownership and lifetime
 * ---------------------------------------------------------------------------
 *  - Strings and arrays a plugin returns inside out-fields (names, attributes)
 *    are owned by the plugin and stay valid until destroy().
 *  - bp_buffer is an opaque handle owned by whoever called buffer_alloc or
 *    buffer_import, who frees it exactly once with buffer_free. The host
 *    never dereferences a buffer handle. It may be device memory, or an id
 *    into memory on another machine.
 *  - bp_tensor descriptors, shape/stride arrays, argument structs and the
 *    memory behind src/dst pointers are borrowed for the duration of the
 *    call only.
 *  - Host callbacks (bp_host_api, bp_kv_store) stay valid while the plugin
 *    instance (or communicator) that received them lives.
 *  - The host loads each library once (RTLD_NOW | RTLD_LOCAL) and never
 *    unmaps it (RTLD_NODELETE): runtimes a plugin links, such as OpenMP or
 *    CUDA, keep threads inside their code after the last handle closes.
 *    destroy() is still called for every instance create() made.
 *
 * ---------------------------------------------------------------------------
 * When a plugin may block, touch a driver or the network
 * ---------------------------------------------------------------------------
 *  - bp_plugin_entry and create: cheap and local. Parse options, nothing
 *    more: no driver call that makes a context, no thread pool, no BLAS or
 *    communication library initialisation, no connection. [all]
 *  - device_count is where enumeration happens and may block: a driver query
 *    [cuda: cuDeviceGetCount, no context], a connection and handshake
 *    [remote], bounded by the plugin's own timeout option (remote:
 *    connect_timeout_ms). When the devices cannot be reached it returns
 *    BP_STATUS_UNAVAILABLE with the reason ("CUDA driver not found: ...",
 *    "cannot connect to 10.0.0.2:7070: ..."). The host then keeps the
 *    backend as `unavailable`: loaded, zero devices, the reason shown by
 *    `backplane list`; a required backend that is unavailable fails
 *    Registry::from_config and `backplane check`. Any other failure status
 *    fails the backend.
 *  - Thread pools, BLAS, streams and communication libraries start on a
 *    device's first use (buffer_alloc, execute, comm_create). [cpu, cuda]
 */
#ifndef BACKPLANE_ABI_H_
#define BACKPLANE_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_ABI_MAJOR 2
#define BP_ABI_MINOR 5

#define BP_PLUGIN_ENTRY_SYMBOL "bp_plugin_entry"

#if defined(_WIN32)
#define BP_EXPORT __declspec(dllexport)
#else
#define BP_EXPORT __attribute__((visibility("default")))
#endif

#if defined(__GNUC__) || defined(__clang__)
#define BP_MAYBE_UNUSED_ __attribute__((unused))
#else
#define BP_MAYBE_UNUSED_
#endif

/* The struct_size a producer sets: where `last_field`, the last field of
 * `type` it knows, ends (offset plus size; trailing padding excluded). */
#define BP_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/* True when `field` of struct type `type` lies inside a struct whose producer
 * declared `size` bytes. */
#define BP_HAS_FIELD(type, field, size) ((size_t)(size) >= BP_STRUCT_SIZE(type, field))

/* ------------------------------------------------------------------------ */
/* Status                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum bp_status_code {
  BP_STATUS_OK = 0,
  BP_STATUS_INVALID_ARGUMENT = 1, /* a request the plugin refuses          */
  BP_STATUS_UNSUPPORTED = 2,      /* op / dtype / feature not available    */
  BP_STATUS_OUT_OF_MEMORY = 3,
  BP_STATUS_INTERNAL = 4, /* a bug or an unexpected exception      */
  BP_STATUS_TIMEOUT = 5,
  BP_STATUS_COLLECTIVE = 6,  /* a peer failed or vanished; aborted    */
  BP_STATUS_UNAVAILABLE = 7, /* device / server / driver not present  */
  BP_STATUS_DEVICE = 8,      /* the device reported a fault           */
  BP_STATUS_IO = 9,          /* file or network I/O failed            */
  BP_STATUS_COUNT_           /* not a code: one past the last one     */
} bp_status_code;

/* Opaque; each producer (a plugin, the host's store) defines its own. */
typedef struct bp_status bp_status;

/* ------------------------------------------------------------------------ */
/* Data types (values match nothing else; DLPack codes live in the core)     */
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
  BP_DTYPE_I8 = 9,
  BP_DTYPE_COUNT_ /* not a dtype: one past the last value this header knows */
} bp_dtype;

/* ------------------------------------------------------------------------ */
/* Capabilities (per device; uint64 flag set; see "Capabilities" above)      */
/* ------------------------------------------------------------------------ */

#define BP_CAP_COLLECTIVE     (UINT64_C(1) << 0)
#define BP_CAP_ASYNC          (UINT64_C(1) << 1)
#define BP_CAP_HOST_VISIBLE   (UINT64_C(1) << 2)
#define BP_CAP_REMOTE         (UINT64_C(1) << 3)
#define BP_CAP_MATMUL         (UINT64_C(1) << 4)
#define BP_CAP_FEATURE_COUNT_ 5 /* bits 0..4 name features; keep bp_capability_name in step */
/* Bits 16..16+BP_DTYPE_COUNT_-1: one flag per dtype, at 16 + the dtype's value.
 * Defined for 0 < d < BP_DTYPE_COUNT_ only (d is a bp_dtype this header names). */
#define BP_CAP_DTYPE_SHIFT_ 16
#define BP_CAP_DTYPE(d)     (UINT64_C(1) << (BP_CAP_DTYPE_SHIFT_ + (d)))
#define BP_CAP_F32          BP_CAP_DTYPE(BP_DTYPE_F32)
#define BP_CAP_F64          BP_CAP_DTYPE(BP_DTYPE_F64)
#define BP_CAP_I32          BP_CAP_DTYPE(BP_DTYPE_I32)
#define BP_CAP_I64          BP_CAP_DTYPE(BP_DTYPE_I64)
#define BP_CAP_BOOL         BP_CAP_DTYPE(BP_DTYPE_BOOL)
#define BP_CAP_F16          BP_CAP_DTYPE(BP_DTYPE_F16)
#define BP_CAP_BF16         BP_CAP_DTYPE(BP_DTYPE_BF16)
#define BP_CAP_U8           BP_CAP_DTYPE(BP_DTYPE_U8)
#define BP_CAP_I8           BP_CAP_DTYPE(BP_DTYPE_I8)

/* ------------------------------------------------------------------------ */
/* Ops (append-only; the host validates shapes and dtypes before execute)    */
/* ------------------------------------------------------------------------ */

/* Every op, once: BP_OP_TABLE(X) calls X(NAME, value, name, kind, dtypes,
 * inputs, attrs) per op, in value order. `name` is the op's name as an
 * identifier (add, log_softmax): #name is its string, and C++ makes
 * backplane::Op's enumerators from it. The enum, bp_op_name and
 * bp_op_info below are made from it, and so are the host's arity and dtype
 * checks, the SDK's dtype families (plugin/dtype.hpp), the remote server's
 * validation and conformance's grouping: naming a new op is one line here,
 * at the end with the next value, and a BP_ABI_MINOR bump. What it computes
 * is written elsewhere: its cpu and cuda kernels, its front-end function,
 * its autograd rule, its conformance reference, cases and tolerance, its
 * Python binding and stubs, and its docs; docs/contributing.md ("Adding an
 * op") lists every file, and which tests fail while one is missing.
 *   kind    the operands' layout and the output's dtype (bp_op_kind below)
 *   dtypes  the dtype class of the data it computes on (bp_op_dtypes below)
 *   inputs  how many inputs; every op has exactly one output
 *   attrs   the bp_op_attrs fields it reads (BP_OP_ATTR_*; the rest are
 *           ignored)
 * Op notes the table cannot say:
 *   pow       an integer POW with a negative exponent cannot be refused by
 *             the host (it depends on the data): the plugin returns
 *             INVALID_ARGUMENT.
 *   maximum, minimum  NaN-propagating for floats.
 *   cast      float -> int truncates toward zero (NaN / out of range: an
 *             unspecified value, never a trap); to BOOL is (x != 0); int ->
 *             narrower int wraps.
 *   fill      every element = scalar0.   arange  out[i] = scalar0 + i * scalar1.
 *   rand_uniform  [scalar0, scalar1); randn  normal(mean scalar0, std
 *             scalar1). Both: the same seed gives the same values on the
 *             same backend (cpu: whatever the thread count).
 *   clamp     scalar0 = low, scalar1 = high.
 *   mean      an empty axis gives NaN; sum of an empty axis is 0.
 *   index_select, gather  an index out of range is an INVALID_ARGUMENT
 *             status naming it.
 *   axpby     y = scalar0 * y + scalar1 * x (inputs [y, x]), each product
 *             rounded to the dtype before the sum, as mul, mul and add
 *             would: the update must equal those three ops bit for bit
 *             (no fused multiply-add), so that a plugin without it and one
 *             with it train alike. Both scalars are first rounded to the
 *             dtype. */
#define BP_OP_TABLE(X)                                                                                \
  X(ADD, 1, add, BINARY, ARITHMETIC, 2, 0)                                                            \
  X(SUB, 2, sub, BINARY, ARITHMETIC, 2, 0)                                                            \
  X(MUL, 3, mul, BINARY, ARITHMETIC, 2, 0)                                                            \
  X(DIV, 4, div, BINARY, ARITHMETIC, 2, 0)                                                            \
  X(MATMUL, 5, matmul, MATMUL, FLOATING, 2, 0)                                                        \
  X(COPY, 6, copy, COPY, MOVING, 1, 0)                                                                \
  X(POW, 7, pow, BINARY, ARITHMETIC, 2, 0)                                                            \
  X(MAXIMUM, 8, maximum, BINARY, ARITHMETIC, 2, 0)                                                    \
  X(MINIMUM, 9, minimum, BINARY, ARITHMETIC, 2, 0)                                                    \
  X(EQ, 10, eq, COMPARE, NUMERIC, 2, 0)                                                               \
  X(NE, 11, ne, COMPARE, NUMERIC, 2, 0)                                                               \
  X(LT, 12, lt, COMPARE, NUMERIC, 2, 0)                                                               \
  X(LE, 13, le, COMPARE, NUMERIC, 2, 0)                                                               \
  X(GT, 14, gt, COMPARE, NUMERIC, 2, 0)                                                               \
  X(GE, 15, ge, COMPARE, NUMERIC, 2, 0)                                                               \
  X(WHERE, 16, where, SELECT, MOVING, 3, 0)                                                           \
  X(NEG, 17, neg, UNARY, ARITHMETIC, 1, 0)                                                            \
  X(ABS, 18, abs, UNARY, ARITHMETIC, 1, 0)                                                            \
  X(EXP, 19, exp, UNARY, FLOATING, 1, 0)                                                              \
  X(LOG, 20, log, UNARY, FLOATING, 1, 0)                                                              \
  X(SQRT, 21, sqrt, UNARY, FLOATING, 1, 0)                                                            \
  X(TANH, 22, tanh, UNARY, FLOATING, 1, 0)                                                            \
  X(SIGMOID, 23, sigmoid, UNARY, FLOATING, 1, 0)                                                      \
  X(RELU, 24, relu, UNARY, ARITHMETIC, 1, 0)                                                          \
  X(SIN, 25, sin, UNARY, FLOATING, 1, 0)                                                              \
  X(COS, 26, cos, UNARY, FLOATING, 1, 0)                                                              \
  X(CLAMP, 27, clamp, UNARY, ARITHMETIC, 1, BP_OP_ATTR_SCALAR0 | BP_OP_ATTR_SCALAR1)                  \
  X(CAST, 28, cast, CAST, NUMERIC, 1, BP_OP_ATTR_DTYPE)                                               \
  X(FILL, 29, fill, CREATE, NUMERIC, 0, BP_OP_ATTR_SCALAR0)                                           \
  X(ARANGE, 30, arange, RANGE, ARITHMETIC, 0, BP_OP_ATTR_SCALAR0 | BP_OP_ATTR_SCALAR1)                \
  X(RAND_UNIFORM, 31, rand_uniform, CREATE, FLOATING, 0,                                              \
    BP_OP_ATTR_SCALAR0 | BP_OP_ATTR_SCALAR1 | BP_OP_ATTR_SEED)                                        \
  X(RANDN, 32, randn, CREATE, FLOATING, 0, BP_OP_ATTR_SCALAR0 | BP_OP_ATTR_SCALAR1 | BP_OP_ATTR_SEED) \
  X(SUM, 33, sum, REDUCE, ARITHMETIC, 1, BP_OP_ATTR_AXIS)                                             \
  X(MEAN, 34, mean, REDUCE, FLOATING, 1, BP_OP_ATTR_AXIS)                                             \
  X(MAX, 35, max, REDUCE, ARITHMETIC, 1, BP_OP_ATTR_AXIS)                                             \
  X(MIN, 36, min, REDUCE, ARITHMETIC, 1, BP_OP_ATTR_AXIS)                                             \
  X(ARGMAX, 37, argmax, ARG_REDUCE, ARITHMETIC, 1, BP_OP_ATTR_AXIS)                                   \
  X(ARGMIN, 38, argmin, ARG_REDUCE, ARITHMETIC, 1, BP_OP_ATTR_AXIS)                                   \
  X(SOFTMAX, 39, softmax, SOFTMAX, FLOATING, 1, BP_OP_ATTR_AXIS)                                      \
  X(LOG_SOFTMAX, 40, log_softmax, SOFTMAX, FLOATING, 1, BP_OP_ATTR_AXIS)                              \
  X(INDEX_SELECT, 41, index_select, INDEX_SELECT, MOVING, 2, BP_OP_ATTR_AXIS)                         \
  X(GATHER, 42, gather, GATHER, MOVING, 2, BP_OP_ATTR_AXIS)                                           \
  X(ERF, 43, erf, UNARY, FLOATING, 1, 0)                                                              \
  X(AXPBY, 44, axpby, UPDATE, FLOATING, 2, BP_OP_ATTR_SCALAR0 | BP_OP_ATTR_SCALAR1)

/* The bp_op_attrs fields an op reads (the table's last column). */
#define BP_OP_ATTR_AXIS    (1u << 0)
#define BP_OP_ATTR_DTYPE   (1u << 1)
#define BP_OP_ATTR_SCALAR0 (1u << 2)
#define BP_OP_ATTR_SCALAR1 (1u << 3)
#define BP_OP_ATTR_SEED    (1u << 4)

/* Op values are append-only: a released value keeps its op forever. */
typedef enum bp_op {
  BP_OP_INVALID = 0,
#define BP_OP_ENUM_(NAME, value, name, kind, dtypes, inputs, attrs) BP_OP_##NAME = value,
  BP_OP_TABLE(BP_OP_ENUM_)
#undef BP_OP_ENUM_
      BP_OP_COUNT_ /* not an op: one past the last value this header knows */
} bp_op;

/* The operands' layout of an op and its output's dtype. Every op has one
 * output; the host validates shapes and dtypes before execute, and a
 * non-copy output is contiguous.
 *   BINARY   inputs [a, b] arrive already broadcast to the output's shape
 *            (stride 0 on broadcast dims); a, b and the output share a dtype.
 *   COMPARE  as BINARY, but the output is BOOL.
 *   SELECT   where: inputs [cond (BOOL), a, b] broadcast to the output's
 *            shape; a, b and the output share a dtype; out = cond ? a : b.
 *   UNARY    inputs[0] has the output's shape and dtype (any strides).
 *   COPY     inputs[0] -> outputs[0], same shape and dtype, any strides on
 *            both sides: the output may be a strided view that never
 *            overlaps itself or the input. The host builds contiguous,
 *            strided to() and cat from it.
 *   CAST     inputs[0] -> outputs[0], same shape; attrs.dtype is the
 *            output's dtype.
 *   MATMUL   [...,M,K] x [...,K,N] -> [...,M,N], one dtype. With more than
 *            2 dims the leading (batch) dims of both inputs arrive already
 *            broadcast to the output's (stride 0 on broadcast ones).
 *   CREATE   no inputs, one contiguous output of any shape.
 *   RANGE    as CREATE, and the output is 1-D.
 *   REDUCE   over attrs.axis (0 <= axis < ndim): the output has the
 *            input's ndim with extent 1 on that axis (the host drops it for
 *            keepdim=false and flattens for an all-axes reduction); its
 *            dtype is the input's. Only SUM and MEAN take an empty axis
 *            (the host refuses the others).
 *   ARG_REDUCE  as REDUCE, but the output is I64: the first index of the
 *            extreme (NaN counts as the extreme); an empty axis is refused.
 *   SOFTMAX  along attrs.axis; the output has the input's shape and dtype.
 *   INDEX_SELECT  inputs [x, index (I64, 1-D)], attrs.axis; the output is
 *            x with extent len(index) on that axis.
 *   GATHER   inputs [x, index (I64, x's ndim)], attrs.axis; the output has
 *            the index's shape: out[i][j][k] = x[i][index[i][j][k]][k]
 *            (axis 1).
 *   UPDATE   in place: inputs [y, x], both contiguous, of one shape and
 *            dtype; outputs[0] is the very same view as inputs[0] (the
 *            trust contract's one other exception), and x never overlaps
 *            y. The op writes y. */
typedef enum bp_op_kind {
  BP_OP_KIND_NONE = 0, /* not an op this header knows */
  BP_OP_KIND_BINARY,
  BP_OP_KIND_COMPARE,
  BP_OP_KIND_SELECT,
  BP_OP_KIND_UNARY,
  BP_OP_KIND_COPY,
  BP_OP_KIND_CAST,
  BP_OP_KIND_MATMUL,
  BP_OP_KIND_CREATE,
  BP_OP_KIND_RANGE,
  BP_OP_KIND_REDUCE,
  BP_OP_KIND_ARG_REDUCE,
  BP_OP_KIND_SOFTMAX,
  BP_OP_KIND_INDEX_SELECT,
  BP_OP_KIND_GATHER,
  BP_OP_KIND_UPDATE,
  BP_OP_KIND_COUNT_
} bp_op_kind;

/* Which dtypes an op computes on: the dtype of its inputs (of the output
 * for creation ops; of each side for cast; of a and b for where).
 *   ARITHMETIC  numbers: f32 f64 i32 i64 (and the 16-bit and 8-bit numeric
 *               dtypes where a plugin offers them)
 *   FLOATING    floating point only: f32 f64 f16 bf16
 *   NUMERIC     any dtype with values: numbers and bool
 *   MOVING      any dtype: elements only move
 * A plugin keeps one dtype set per class and answers supports_op from it
 * (plugin/dtype.hpp's family_supports). */
typedef enum bp_op_dtypes {
  BP_OP_DTYPES_NONE = 0, /* not an op this header knows */
  BP_OP_DTYPES_ARITHMETIC,
  BP_OP_DTYPES_FLOATING,
  BP_OP_DTYPES_NUMERIC,
  BP_OP_DTYPES_MOVING
} bp_op_dtypes;

/* One row of BP_OP_TABLE. */
typedef struct bp_op_info {
  const char* name; /* "add"; NULL for an op this header does not know */
  int32_t kind;     /* bp_op_kind */
  int32_t dtypes;   /* bp_op_dtypes */
  int32_t inputs;   /* number of inputs; outputs: always 1 */
  uint32_t attrs;   /* BP_OP_ATTR_* it reads */
} bp_op_info;

/* Attributes of an op. Fields an op does not use are ignored. */
typedef struct bp_op_attrs {
  size_t struct_size;
  int64_t axis;      /* reductions, softmax, index_select, gather        */
  int32_t dtype;     /* bp_dtype: target of a cast                       */
  int32_t reserved_; /* zero                                             */
  double scalar0;    /* clamp low, fill value, arange start, rand low,
                      * axpby alpha                                     */
  double scalar1;    /* clamp high, arange step, rand high / std, axpby
                      * beta                                            */
  uint64_t seed;     /* rand_uniform, randn                              */
} bp_op_attrs;
#define BP_OP_ATTRS_STRUCT_SIZE BP_STRUCT_SIZE(bp_op_attrs, seed)

typedef enum bp_reduce_op {
  BP_REDUCE_SUM = 0,
  BP_REDUCE_MEAN = 1,
  BP_REDUCE_MIN = 2,
  BP_REDUCE_MAX = 3,
  BP_REDUCE_PROD = 4,
  BP_REDUCE_COUNT_ /* not a reduce op: one past the last value */
} bp_reduce_op;

/* ------------------------------------------------------------------------ */
/* Names and sizes: the one table of each, for core, plugins and tools       */
/* ------------------------------------------------------------------------ */

/* Bytes per element; 0 for a value this header does not know. */
static inline BP_MAYBE_UNUSED_ size_t bp_dtype_size(int32_t dtype) {
  static const unsigned char sizes[BP_DTYPE_COUNT_] = {0, 4, 8, 4, 8, 1, 2, 2, 1, 1};
  return (dtype > 0 && dtype < BP_DTYPE_COUNT_) ? sizes[dtype] : 0;
}

/* "f32", "f64", "i32", "i64", "bool", "f16", "bf16", "u8", "i8"; NULL for a
 * value this header does not know. */
static inline BP_MAYBE_UNUSED_ const char* bp_dtype_name(int32_t dtype) {
  static const char* const names[BP_DTYPE_COUNT_] = {NULL,   "f32", "f64",  "i32", "i64",
                                                     "bool", "f16", "bf16", "u8",  "i8"};
  return (dtype > 0 && dtype < BP_DTYPE_COUNT_) ? names[dtype] : NULL;
}

/* The BP_OP_TABLE row of `op`; an all-zero row (name NULL, kind
 * BP_OP_KIND_NONE) for a value this header does not know. */
static inline BP_MAYBE_UNUSED_ const bp_op_info* bp_op_info_of(int32_t op) {
  static const bp_op_info rows[BP_OP_COUNT_] = {{NULL, BP_OP_KIND_NONE, BP_OP_DTYPES_NONE, 0, 0},
#define BP_OP_ROW_(NAME, value, name, kind, dtypes, inputs, attrs) \
  {#name, BP_OP_KIND_##kind, BP_OP_DTYPES_##dtypes, inputs, attrs},
                                                BP_OP_TABLE(BP_OP_ROW_)
#undef BP_OP_ROW_
  };
  return (op > 0 && op < BP_OP_COUNT_) ? &rows[op] : &rows[0];
}

/* "add", "log_softmax", ...; NULL for a value this header does not know. */
static inline BP_MAYBE_UNUSED_ const char* bp_op_name(int32_t op) { return bp_op_info_of(op)->name; }

/* "sum", "mean", "min", "max", "prod"; NULL for an unknown value. */
static inline BP_MAYBE_UNUSED_ const char* bp_reduce_op_name(int32_t op) {
  static const char* const names[BP_REDUCE_COUNT_] = {"sum", "mean", "min", "max", "prod"};
  return (op >= 0 && op < BP_REDUCE_COUNT_) ? names[op] : NULL;
}

/* "ok", "invalid_argument", ...; NULL for an unknown value. */
static inline BP_MAYBE_UNUSED_ const char* bp_status_code_name(int32_t code) {
  static const char* const names[BP_STATUS_COUNT_] = {
      "ok",      "invalid_argument", "unsupported", "out_of_memory", "internal",
      "timeout", "collective",       "unavailable", "device",        "io"};
  return (code >= 0 && code < BP_STATUS_COUNT_) ? names[code] : NULL;
}

/* The name of one capability bit: "collective", "async", "host_visible",
 * "remote", "matmul", or a dtype's name for a dtype flag ("f64"); NULL for a
 * bit this header does not name (or a value that is not one bit). */
static inline BP_MAYBE_UNUSED_ const char* bp_capability_name(uint64_t flag) {
  static const char* const names[BP_CAP_FEATURE_COUNT_] = {"collective", "async", "host_visible", "remote",
                                                           "matmul"};
  int bit = 0;
  if (flag == 0 || (flag & (flag - 1)) != 0) return NULL;
  while ((flag >> bit) != 1) ++bit;
  if (bit < BP_CAP_FEATURE_COUNT_) return names[bit];
  if (bit >= BP_CAP_DTYPE_SHIFT_) return bp_dtype_name(bit - BP_CAP_DTYPE_SHIFT_);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Memory and tensors                                                        */
/* ------------------------------------------------------------------------ */

typedef struct bp_plugin bp_plugin; /* a plugin instance (from create)      */
typedef struct bp_buffer bp_buffer; /* opaque device allocation            */
typedef struct bp_comm bp_comm;     /* a collective communicator           */

/* A view of a buffer, shaped like DLPack's DLTensor. Strides are in
 * elements (never NULL; 0 on a broadcast dimension). byte_offset is where
 * element [0,...,0] lies within the buffer and is a multiple of the element
 * size. Every element the view can address lies inside the buffer. */
typedef struct bp_tensor {
  bp_buffer* buffer;
  uint64_t byte_offset;
  int32_t device;    /* device index within the plugin                   */
  int32_t dtype;     /* bp_dtype                                          */
  int32_t ndim;      /* 0 for a scalar                                    */
  int32_t reserved_; /* zero                                              */
  const int64_t* shape;
  const int64_t* strides;
} bp_tensor;

/* DLPack device types (DLDeviceType values) used in buffer_pointer and
 * buffer_import. Others keep DLPack's numbering. */
#define BP_DL_CPU       1
#define BP_DL_CUDA      2
#define BP_DL_CUDA_HOST 3

/* ------------------------------------------------------------------------ */
/* Host services handed to the plugin                                        */
/* ------------------------------------------------------------------------ */

typedef enum bp_log_level {
  BP_LOG_DEBUG = 0,
  BP_LOG_INFO = 1,
  BP_LOG_WARNING = 2,
  BP_LOG_ERROR = 3
} bp_log_level;

/* 2.4: one event of a plugin's for the host's trace (trace_event below).
 * The host copies what it keeps before trace_event returns. */
typedef struct bp_trace_event {
  size_t struct_size;
  const char* category;   /* what the host groups it by: "transport", "remote"  */
  const char* name;       /* "shared_memory", "execute", ...                     */
  int64_t start_ns;       /* CLOCK_MONOTONIC                                     */
  int64_t end_ns;         /* >= start_ns; == start_ns for an instant             */
  int64_t bytes;          /* < 0: none                                           */
  const char* number_key; /* NULL: none; else a count of the plugin's ("wait_ns") */
  int64_t number;
  const char* text_key; /* NULL: none; else a short text ("peer")              */
  const char* text;
  /* A flow joins events of two threads or processes (a request and its
   * execution on a server): BP_TRACE_FLOW_OUT where it leaves,
   * BP_TRACE_FLOW_IN where it arrives, both with the same flow_id. */
  int32_t flow;
  int32_t reserved_;
  uint64_t flow_id;
} bp_trace_event;
#define BP_TRACE_EVENT_STRUCT_SIZE BP_STRUCT_SIZE(bp_trace_event, flow_id)
#define BP_TRACE_FLOW_NONE         0
#define BP_TRACE_FLOW_OUT          1
#define BP_TRACE_FLOW_IN           2

typedef struct bp_host_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  void* ctx;
  /* (required) Log a NUL-terminated message; any thread; never fails. */
  void (*log)(void* ctx, int32_t level, const char* message);
  /* 2.4 (NULL from an older host): non-zero while the host records a trace.
   * Cheap; ask before measuring anything for trace_event. Any thread. */
  int32_t (*trace_active)(void* ctx);
  /* 2.4: adds one event to the trace, on the calling thread's track; a no-op
   * when no trace records or the event is malformed. Any thread; never fails. */
  void (*trace_event)(void* ctx, const bp_trace_event* event);
} bp_host_api;
#define BP_HOST_API_STRUCT_SIZE BP_STRUCT_SIZE(bp_host_api, trace_event)

/* A key-value store shared by all ranks of a group, backed by the host's
 * rendezvous store. Every entry returns a status owned by the store (read
 * and free it with this struct's status_* entries). Keys are NUL-terminated;
 * values are bytes. [cpu: Gloo's rendezvous; cuda: the NCCL unique id;
 * remote: the servers' group] */
typedef struct bp_kv_set_args {
  size_t struct_size;
  void* ctx; /* bp_kv_store.ctx */
  const char* key;
  const void* value;
  uint64_t size;
  /* 2.1: the longest the set may wait for the store to take the value, in
   * ms; <= 0 means the store's own timeout. For failure paths, which must
   * not stall on a hung store host. [cpu] A host reads it only when
   * struct_size covers it. */
  int64_t timeout_ms;
} bp_kv_set_args;
#define BP_KV_SET_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_kv_set_args, timeout_ms)

typedef struct bp_kv_get_args {
  size_t struct_size;
  void* ctx;
  const char* key;
  int64_t timeout_ms; /* blocks until key exists; BP_STATUS_TIMEOUT after */
  uint8_t* value;     /* out: owned by the caller, freed with free_value */
  uint64_t size;      /* out */
} bp_kv_get_args;
#define BP_KV_GET_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_kv_get_args, size)

typedef struct bp_kv_wait_args {
  size_t struct_size;
  void* ctx;
  const char* const* keys;
  int32_t num_keys;
  int32_t reserved_;
  int64_t timeout_ms; /* until every key exists; BP_STATUS_TIMEOUT after */
} bp_kv_wait_args;
#define BP_KV_WAIT_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_kv_wait_args, timeout_ms)

typedef struct bp_kv_store {
  size_t struct_size;
  void* ctx;
  bp_status* (*set)(bp_kv_set_args* args);
  bp_status* (*get)(bp_kv_get_args* args);
  bp_status* (*wait)(bp_kv_wait_args* args);
  void (*free_value)(void* ctx, uint8_t* value);
  int32_t (*status_code)(const bp_status* status);
  const char* (*status_message)(const bp_status* status);
  void (*status_free)(bp_status* status);
} bp_kv_store;
#define BP_KV_STORE_STRUCT_SIZE BP_STRUCT_SIZE(bp_kv_store, status_free)

/* ------------------------------------------------------------------------ */
/* Argument structs (inputs first; "out" fields are filled by the callee)    */
/* ------------------------------------------------------------------------ */

typedef struct bp_create_args {
  size_t struct_size;
  const char* backend_name; /* the name given in backends.json             */
  const char* options_json; /* the backend's "options" object, as JSON text */
  const bp_host_api* host;  /* the same table the entry received          */
  bp_plugin* plugin;        /* out */
} bp_create_args;
#define BP_CREATE_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_create_args, plugin)

typedef struct bp_device_count_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t num_devices; /* out: 0..4096 */
} bp_device_count_args;
#define BP_DEVICE_COUNT_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_device_count_args, num_devices)

typedef struct bp_attribute {
  const char* name;
  const char* value;
} bp_attribute;

typedef struct bp_device_info_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t device;
  int32_t num_attributes;         /* out */
  const char* name;               /* out: e.g. "host (2 threads)", "NVIDIA H200" */
  uint64_t capabilities;          /* out: BP_CAP_*, constant for the instance */
  const bp_attribute* attributes; /* out: named attributes (versions, limits) */
} bp_device_info_args;
#define BP_DEVICE_INFO_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_device_info_args, attributes)

typedef struct bp_device_memory_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t device;
  int32_t reserved_;
  uint64_t free_bytes;  /* out: now; may change at any time */
  uint64_t total_bytes; /* out */
} bp_device_memory_args;
#define BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_device_memory_args, total_bytes)

typedef struct bp_supports_op_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t device;
  int32_t op;        /* bp_op; may be one this plugin does not know */
  int32_t dtype;     /* see below */
  int32_t supported; /* out: nonzero when the device runs op on dtype */
} bp_supports_op_args;
#define BP_SUPPORTS_OP_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_supports_op_args, supported)
/* supports_op is asked with the dtype of the data operand: inputs[0]
 * (WHERE: inputs[1], not the BOOL cond; comparisons: the inputs, not the
 * BOOL output; ARGMAX/ARGMIN, INDEX_SELECT, GATHER: x, not the I64 output
 * or index); creation ops: the output's. CAST is asked for the source and
 * for the target dtype, and runs only when both answer yes. The host caches
 * answers: they must be constant for the instance. */

typedef struct bp_buffer_alloc_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t device;
  int32_t reserved_;
  uint64_t size;     /* bytes; may be 0 */
  bp_buffer* buffer; /* out */
} bp_buffer_alloc_args;
#define BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_buffer_alloc_args, buffer)

typedef struct bp_buffer_free_args {
  size_t struct_size;
  bp_plugin* plugin;
  bp_buffer* buffer; /* queue-ordered; the host logs a failure */
} bp_buffer_free_args;
#define BP_BUFFER_FREE_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_buffer_free_args, buffer)

/* buffer_write copies host memory into the buffer, buffer_read the reverse.
 * [offset, offset + size) lies inside the buffer (host-checked). */
typedef struct bp_buffer_copy_args {
  size_t struct_size;
  bp_plugin* plugin;
  bp_buffer* buffer;
  uint64_t offset;
  uint64_t size;
  const void* src; /* buffer_write: consumed before the call returns */
  void* dst;       /* buffer_read: filled before the call returns */
} bp_buffer_copy_args;
#define BP_BUFFER_COPY_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_buffer_copy_args, dst)

/* buffer_pointer: where a buffer lives, for DLPack export. Synchronising on
 * an async device: when it returns, earlier work on the buffer is done. */
typedef struct bp_buffer_pointer_args {
  size_t struct_size;
  bp_plugin* plugin;
  bp_buffer* buffer;
  void* data;             /* out: address of byte 0 of the buffer */
  int32_t dl_device_type; /* out: BP_DL_CPU, BP_DL_CUDA, ...            */
  int32_t dl_device_id;   /* out: e.g. the CUDA ordinal                 */
} bp_buffer_pointer_args;
#define BP_BUFFER_POINTER_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_buffer_pointer_args, dl_device_id)

/* buffer_import adopts `size` bytes at `data` (DLPack import) without
 * copying. Ownership of the memory passes to the plugin only on success:
 * then the plugin calls release(release_ctx) exactly once, when the buffer
 * is freed. On any failure status the plugin never calls release and the
 * caller keeps the memory (so it can fall back to copying it), as DLPack
 * consumers do. It refuses memory it cannot use with BP_STATUS_UNSUPPORTED. */
typedef struct bp_buffer_import_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t device;
  int32_t dl_device_type; /* where `data` lives: BP_DL_CPU, BP_DL_CUDA, ... */
  int32_t dl_device_id;
  int32_t reserved_;
  void* data;
  uint64_t size;
  void (*release)(void* release_ctx);
  void* release_ctx;
  bp_buffer* buffer; /* out */
} bp_buffer_import_args;
#define BP_BUFFER_IMPORT_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_buffer_import_args, buffer)

typedef struct bp_execute_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t device;
  int32_t op; /* bp_op, accepted by supports_op */
  const bp_tensor* inputs;
  const bp_tensor* outputs; /* allocated by the host; never overlap inputs */
  int32_t num_inputs;
  int32_t num_outputs;
  const bp_op_attrs* attrs; /* never NULL */
} bp_execute_args;
#define BP_EXECUTE_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_execute_args, attrs)

typedef struct bp_synchronize_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t device;
} bp_synchronize_args;
#define BP_SYNCHRONIZE_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_synchronize_args, device)

typedef struct bp_comm_create_args {
  size_t struct_size;
  bp_plugin* plugin;
  int32_t device;
  int32_t rank;
  int32_t world_size;
  int32_t reserved_;
  int64_t timeout_ms;       /* every collective on the comm obeys it       */
  const bp_kv_store* store; /* valid until comm_destroy                     */
  const char* key_prefix;   /* namespace for this comm's keys in the store */
  bp_comm* comm;            /* out */
} bp_comm_create_args;
#define BP_COMM_CREATE_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_comm_create_args, comm)

/* comm_destroy and comm_abort. After comm_abort every pending and later
 * collective on the communicator fails promptly (BP_STATUS_COLLECTIVE);
 * the host still calls comm_destroy. [cuda: ncclCommAbort; cpu: closes the
 * peers' connections; remote: tells the servers] */
typedef struct bp_comm_args {
  size_t struct_size;
  bp_plugin* plugin;
  bp_comm* comm;
} bp_comm_args;
#define BP_COMM_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_comm_args, comm)

/* One struct for the five collectives; fields an entry does not use are
 * ignored. all_reduce: input -> output (same shape; they may be the same
 * view). broadcast: output in place from `root`. all_gather: output holds
 * world_size inputs back to back. reduce_scatter: input holds world_size
 * outputs back to back. barrier: no tensors. Inputs and outputs are
 * contiguous. A collective that returns BP_STATUS_UNSUPPORTED (a dtype or
 * reduce op the device cannot reduce) has moved nothing and refused alike on
 * every rank: the host keeps using the communicator. Any other failure
 * leaves it in an unknown state: the host aborts it. */
typedef struct bp_collective_args {
  size_t struct_size;
  bp_plugin* plugin;
  bp_comm* comm;
  const bp_tensor* input;
  const bp_tensor* output;
  int32_t reduce_op; /* bp_reduce_op */
  int32_t root;
} bp_collective_args;
#define BP_COLLECTIVE_ARGS_STRUCT_SIZE BP_STRUCT_SIZE(bp_collective_args, root)

/* ------------------------------------------------------------------------ */
/* The plugin table                                                          */
/* ------------------------------------------------------------------------ */

typedef struct bp_plugin_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* plugin_name;    /* (required) e.g. "cpu"                        */
  const char* plugin_version; /* (required) e.g. "0.2.0"                      */

  /* status (required) */
  int32_t (*status_code)(const bp_status* status);
  const char* (*status_message)(const bp_status* status);
  void (*status_free)(bp_status* status);

  /* lifetime (required) */
  bp_status* (*create)(bp_create_args* args);
  void (*destroy)(bp_plugin* plugin);

  /* devices */
  bp_status* (*device_count)(bp_device_count_args* args);   /* (required) may block: see above */
  bp_status* (*device_info)(bp_device_info_args* args);     /* (required) */
  bp_status* (*supports_op)(bp_supports_op_args* args);     /* (required) */
  bp_status* (*device_memory)(bp_device_memory_args* args); /* (optional) free/total bytes */

  /* buffers */
  bp_status* (*buffer_alloc)(bp_buffer_alloc_args* args);     /* (required) */
  bp_status* (*buffer_free)(bp_buffer_free_args* args);       /* (required) */
  bp_status* (*buffer_write)(bp_buffer_copy_args* args);      /* (required) */
  bp_status* (*buffer_read)(bp_buffer_copy_args* args);       /* (required) synchronising */
  bp_status* (*buffer_pointer)(bp_buffer_pointer_args* args); /* (optional; required with host_visible) */
  bp_status* (*buffer_import)(bp_buffer_import_args* args);   /* (optional) DLPack import */

  /* execution */
  bp_status* (*execute)(bp_execute_args* args);         /* (required) */
  bp_status* (*synchronize)(bp_synchronize_args* args); /* (optional; required with async) */

  /* collectives (all optional; all required with collective) */
  bp_status* (*comm_create)(bp_comm_create_args* args);
  bp_status* (*comm_destroy)(bp_comm_args* args);
  bp_status* (*comm_abort)(bp_comm_args* args);
  bp_status* (*all_reduce)(bp_collective_args* args);
  bp_status* (*broadcast)(bp_collective_args* args);
  bp_status* (*all_gather)(bp_collective_args* args);
  bp_status* (*reduce_scatter)(bp_collective_args* args);
  bp_status* (*barrier)(bp_collective_args* args);
} bp_plugin_api;
#define BP_PLUGIN_API_STRUCT_SIZE BP_STRUCT_SIZE(bp_plugin_api, barrier)

/* The one exported symbol. `host` stays valid for the life of the library.
 * Returns a table with static storage duration, or NULL. */
typedef const bp_plugin_api* (*bp_plugin_entry_fn)(const bp_host_api* host);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BACKPLANE_ABI_H_ */
