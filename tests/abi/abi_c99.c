/* Proves include/backplane/abi.h is a C99 header (built with -std=c99
 * -pedantic -Werror), checks the layout rules the versioning policy relies
 * on, and checks the name and size tables against the enums they describe.
 * Returns the number of failed checks. */
#include <backplane/abi.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* Compares a name helper's answer with the expected text (NULL for none). */
#define EXPECT_NAME(got, want) expect_name((got), (want), #got, __LINE__)

static void expect_name(const char* got, const char* want, const char* expr, int line) {
  const int same = (got == NULL || want == NULL) ? got == want : strcmp(got, want) == 0;
  if (!same) {
    fprintf(stderr, "%s:%d: %s gave \"%s\", expected \"%s\"\n", __FILE__, line, expr, got ? got : "(NULL)",
            want ? want : "(NULL)");
    ++failures;
  }
}

/* The version macros must be plain integer literals: plugins test them with
 * #if (`#if BP_ABI_MINOR >= 1`), where a cast or enum would not work. */
#if !defined(BP_ABI_MAJOR) || !defined(BP_ABI_MINOR) || BP_ABI_MAJOR != 2 || BP_ABI_MINOR < 0
#error "BP_ABI_MAJOR / BP_ABI_MINOR must be preprocessor integers, major 2"
#endif

/* A C entry point of the documented type, doing the version handshake the
 * way the rules ask: read the host's version only inside its struct_size,
 * refuse (NULL) another major, else return a static table. */
static const bp_plugin_api* entry_in_c(const bp_host_api* host) {
  static bp_plugin_api table;
  if (host == NULL || !BP_HAS_FIELD(bp_host_api, abi_major, host->struct_size)) return NULL;
  if (host->abi_major != BP_ABI_MAJOR) return NULL;
  memset(&table, 0, sizeof table);
  table.struct_size = BP_PLUGIN_API_STRUCT_SIZE;
  table.abi_major = BP_ABI_MAJOR;
  table.abi_minor = BP_ABI_MINOR;
  table.plugin_name = "abi_c99";
  table.plugin_version = "0.0.0";
  return &table;
}

/* Every entry that can grow takes one argument struct: these entry types
 * must accept exactly that (a mismatch is a compile error under -Werror). */
static bp_status* take_device_count(bp_device_count_args* args) {
  args->num_devices = 0;
  return NULL;
}
static bp_status* take_collective(bp_collective_args* args) {
  (void)args;
  return NULL;
}

static void check_table_and_handshake(void) {
  bp_plugin_entry_fn entry = entry_in_c;
  bp_host_api host;
  const bp_plugin_api* t;
  memset(&host, 0, sizeof host);
  host.struct_size = BP_HOST_API_STRUCT_SIZE;
  host.abi_major = BP_ABI_MAJOR;
  host.abi_minor = BP_ABI_MINOR;
  t = entry(&host);
  EXPECT(t != NULL);
  if (t != NULL) {
    EXPECT(t->struct_size == BP_PLUGIN_API_STRUCT_SIZE);
    EXPECT(t->abi_major == BP_ABI_MAJOR && t->abi_minor == BP_ABI_MINOR);
    EXPECT(BP_HAS_FIELD(bp_plugin_api, barrier, t->struct_size));
    EXPECT(strcmp(t->plugin_name, "abi_c99") == 0);
  }
  EXPECT(entry(NULL) == NULL);
  host.abi_major = BP_ABI_MAJOR - 1;
  EXPECT(entry(&host) == NULL);
  host.abi_major = BP_ABI_MAJOR + 1;
  EXPECT(entry(&host) == NULL);
  host.abi_major = BP_ABI_MAJOR;
  host.struct_size = offsetof(bp_host_api, abi_major); /* too small to carry the version */
  EXPECT(entry(&host) == NULL);

  /* One argument struct per growing entry; the five collectives share one. */
  {
    bp_plugin_api table;
    memset(&table, 0, sizeof table);
    table.device_count = take_device_count;
    table.all_reduce = take_collective;
    table.broadcast = take_collective;
    table.all_gather = take_collective;
    table.reduce_scatter = take_collective;
    table.barrier = take_collective;
    EXPECT(table.device_count != NULL && table.barrier != NULL);
  }
}

/* Every struct that carries struct_size, its BP_<NAME>_STRUCT_SIZE, its last
 * field and that field's size, written out here (not taken from the field)
 * so that a renamed, retyped or appended last field fails below. */
typedef void (*fn_ptr)(void);
#define STRUCTS(X)                                                                             \
  X(bp_op_attrs, BP_OP_ATTRS_STRUCT_SIZE, seed, sizeof(uint64_t))                              \
  X(bp_host_api, BP_HOST_API_STRUCT_SIZE, trace_event, sizeof(fn_ptr))                         \
  X(bp_trace_event, BP_TRACE_EVENT_STRUCT_SIZE, flow_id, sizeof(uint64_t))                     \
  X(bp_kv_set_args, BP_KV_SET_ARGS_STRUCT_SIZE, timeout_ms, sizeof(int64_t))                   \
  X(bp_kv_get_args, BP_KV_GET_ARGS_STRUCT_SIZE, size, sizeof(uint64_t))                        \
  X(bp_kv_wait_args, BP_KV_WAIT_ARGS_STRUCT_SIZE, timeout_ms, sizeof(int64_t))                 \
  X(bp_kv_store, BP_KV_STORE_STRUCT_SIZE, status_free, sizeof(fn_ptr))                         \
  X(bp_create_args, BP_CREATE_ARGS_STRUCT_SIZE, plugin, sizeof(void*))                         \
  X(bp_device_count_args, BP_DEVICE_COUNT_ARGS_STRUCT_SIZE, num_devices, sizeof(int32_t))      \
  X(bp_device_info_args, BP_DEVICE_INFO_ARGS_STRUCT_SIZE, attributes, sizeof(void*))           \
  X(bp_device_memory_args, BP_DEVICE_MEMORY_ARGS_STRUCT_SIZE, total_bytes, sizeof(uint64_t))   \
  X(bp_supports_op_args, BP_SUPPORTS_OP_ARGS_STRUCT_SIZE, supported, sizeof(int32_t))          \
  X(bp_buffer_alloc_args, BP_BUFFER_ALLOC_ARGS_STRUCT_SIZE, buffer, sizeof(void*))             \
  X(bp_buffer_free_args, BP_BUFFER_FREE_ARGS_STRUCT_SIZE, buffer, sizeof(void*))               \
  X(bp_buffer_copy_args, BP_BUFFER_COPY_ARGS_STRUCT_SIZE, dst, sizeof(void*))                  \
  X(bp_buffer_pointer_args, BP_BUFFER_POINTER_ARGS_STRUCT_SIZE, dl_device_id, sizeof(int32_t)) \
  X(bp_buffer_import_args, BP_BUFFER_IMPORT_ARGS_STRUCT_SIZE, buffer, sizeof(void*))           \
  X(bp_execute_args, BP_EXECUTE_ARGS_STRUCT_SIZE, attrs, sizeof(void*))                        \
  X(bp_synchronize_args, BP_SYNCHRONIZE_ARGS_STRUCT_SIZE, device, sizeof(int32_t))             \
  X(bp_comm_create_args, BP_COMM_CREATE_ARGS_STRUCT_SIZE, comm, sizeof(void*))                 \
  X(bp_comm_args, BP_COMM_ARGS_STRUCT_SIZE, comm, sizeof(void*))                               \
  X(bp_collective_args, BP_COLLECTIVE_ARGS_STRUCT_SIZE, root, sizeof(int32_t))                 \
  X(bp_plugin_api, BP_PLUGIN_API_STRUCT_SIZE, barrier, sizeof(fn_ptr))

/* Compile-time, one per struct (C99 has no _Static_assert: a negative array
 * size stops the build): the macro is the end of the named last field, lies
 * within the struct, and is a constant expression a static initialiser can
 * use. */
#define STATIC_STRUCT_SIZE(type, macro, last, last_size)                                 \
  typedef char static_check_##type[((macro) == offsetof(type, last) + (last_size) &&     \
                                    (macro) <= sizeof(type) && (macro) > sizeof(size_t)) \
                                       ? 1                                               \
                                       : -1];
STRUCTS(STATIC_STRUCT_SIZE)
static const size_t static_sizes[] = {
#define STATIC_INITIALISER(type, macro, last, last_size) macro,
    STRUCTS(STATIC_INITIALISER)};

/* The struct_size rule at run time, per struct: the exact size and 2.1's
 * sizeof both hold the last field; one byte less does not. */
static void check_struct_sizes(void) {
  size_t i, padded = 0;
#define RUNTIME_STRUCT_SIZE(type, macro, last, last_size) \
  EXPECT(BP_HAS_FIELD(type, last, macro));                \
  EXPECT(BP_HAS_FIELD(type, last, sizeof(type)));         \
  EXPECT(!BP_HAS_FIELD(type, last, (macro)-1));           \
  EXPECT(BP_HAS_FIELD(type, struct_size, (macro)-1));     \
  if ((macro) != sizeof(type)) ++padded;
  STRUCTS(RUNTIME_STRUCT_SIZE)
  for (i = 0; i < sizeof(static_sizes) / sizeof(static_sizes[0]); ++i) EXPECT(static_sizes[i] > 0);
  /* On LP64 exactly two structs end in padding, the reason for 2.2. */
  if (sizeof(void*) == 8 && sizeof(size_t) == 8) {
    EXPECT(padded == 2);
    EXPECT(BP_DEVICE_COUNT_ARGS_STRUCT_SIZE == 20 && sizeof(bp_device_count_args) == 24);
    EXPECT(BP_SYNCHRONIZE_ARGS_STRUCT_SIZE == 20 && sizeof(bp_synchronize_args) == 24);
  }
}

static void check_layout(void) {
  const size_t before_create = offsetof(bp_plugin_api, create);

  EXPECT(strcmp(BP_PLUGIN_ENTRY_SYMBOL, "bp_plugin_entry") == 0);
  EXPECT(BP_ABI_MAJOR == 2);

  /* Every versioned struct begins with struct_size; the table's version
   * fields follow it, so any host can read them from any plugin, of any
   * major (a 1.x table put them at the same offsets). */
  EXPECT(offsetof(bp_plugin_api, struct_size) == 0);
  EXPECT(offsetof(bp_plugin_api, abi_major) == sizeof(size_t));
  EXPECT(offsetof(bp_plugin_api, abi_minor) == sizeof(size_t) + sizeof(uint32_t));
  EXPECT(offsetof(bp_host_api, struct_size) == 0);
  EXPECT(offsetof(bp_host_api, abi_major) == sizeof(size_t));
  EXPECT(offsetof(bp_host_api, abi_minor) == sizeof(size_t) + sizeof(uint32_t));
  EXPECT(offsetof(bp_kv_set_args, struct_size) == 0);
  EXPECT(offsetof(bp_kv_get_args, struct_size) == 0);
  EXPECT(offsetof(bp_kv_wait_args, struct_size) == 0);
  EXPECT(offsetof(bp_kv_store, struct_size) == 0);
  EXPECT(offsetof(bp_create_args, struct_size) == 0);
  EXPECT(offsetof(bp_device_count_args, struct_size) == 0);
  EXPECT(offsetof(bp_device_info_args, struct_size) == 0);
  EXPECT(offsetof(bp_device_memory_args, struct_size) == 0);
  EXPECT(offsetof(bp_supports_op_args, struct_size) == 0);
  EXPECT(offsetof(bp_buffer_alloc_args, struct_size) == 0);
  EXPECT(offsetof(bp_buffer_free_args, struct_size) == 0);
  EXPECT(offsetof(bp_buffer_copy_args, struct_size) == 0);
  EXPECT(offsetof(bp_buffer_pointer_args, struct_size) == 0);
  EXPECT(offsetof(bp_buffer_import_args, struct_size) == 0);
  EXPECT(offsetof(bp_execute_args, struct_size) == 0);
  EXPECT(offsetof(bp_synchronize_args, struct_size) == 0);
  EXPECT(offsetof(bp_comm_create_args, struct_size) == 0);
  EXPECT(offsetof(bp_comm_args, struct_size) == 0);
  EXPECT(offsetof(bp_collective_args, struct_size) == 0);
  EXPECT(offsetof(bp_op_attrs, struct_size) == 0);

  /* Argument structs put the plugin instance right after struct_size. */
  EXPECT(offsetof(bp_device_count_args, plugin) == sizeof(size_t));
  EXPECT(offsetof(bp_execute_args, plugin) == sizeof(size_t));
  EXPECT(offsetof(bp_collective_args, plugin) == sizeof(size_t));

  /* Append-only: the last entry ends the table; fields keep their order. */
  EXPECT(offsetof(bp_plugin_api, barrier) + sizeof(void (*)(void)) <= sizeof(bp_plugin_api));
  EXPECT(offsetof(bp_plugin_api, status_code) < offsetof(bp_plugin_api, create));
  EXPECT(offsetof(bp_plugin_api, create) < offsetof(bp_plugin_api, device_count));
  EXPECT(offsetof(bp_plugin_api, device_count) < offsetof(bp_plugin_api, device_memory));
  EXPECT(offsetof(bp_plugin_api, device_memory) < offsetof(bp_plugin_api, buffer_alloc));
  EXPECT(offsetof(bp_plugin_api, buffer_read) < offsetof(bp_plugin_api, buffer_pointer));
  EXPECT(offsetof(bp_plugin_api, buffer_pointer) < offsetof(bp_plugin_api, buffer_import));
  EXPECT(offsetof(bp_plugin_api, buffer_import) < offsetof(bp_plugin_api, execute));
  EXPECT(offsetof(bp_plugin_api, execute) < offsetof(bp_plugin_api, synchronize));
  EXPECT(offsetof(bp_plugin_api, synchronize) < offsetof(bp_plugin_api, comm_create));
  EXPECT(offsetof(bp_plugin_api, comm_destroy) < offsetof(bp_plugin_api, comm_abort));
  EXPECT(offsetof(bp_plugin_api, comm_abort) < offsetof(bp_plugin_api, all_reduce));
  EXPECT(offsetof(bp_plugin_api, comm_create) < offsetof(bp_plugin_api, barrier));
  /* Every required entry lies before the first optional one that follows
   * execute: a table cut right after execute still holds all of them. */
  EXPECT(offsetof(bp_plugin_api, execute) + sizeof(void (*)(void)) <= offsetof(bp_plugin_api, synchronize));
#if BP_ABI_MINOR <= 2
  /* Up to 2.2 nothing follows barrier: a field appended without a minor bump
   * would break BP_HAS_FIELD checks against older plugins' struct_size. */
  EXPECT(sizeof(bp_plugin_api) == offsetof(bp_plugin_api, barrier) + sizeof(void (*)(void)));
#endif
#if BP_ABI_MINOR >= 1 && BP_ABI_MINOR <= 2
  /* 2.1 appended timeout_ms to bp_kv_set_args, and 2.2 nothing. */
  EXPECT(sizeof(bp_kv_set_args) == offsetof(bp_kv_set_args, timeout_ms) + sizeof(int64_t));
  EXPECT(!BP_HAS_FIELD(bp_kv_set_args, timeout_ms, offsetof(bp_kv_set_args, timeout_ms)));
#endif

  /* BP_HAS_FIELD: a field is visible only when it lies wholly inside size. */
  EXPECT(BP_HAS_FIELD(bp_plugin_api, struct_size, sizeof(size_t)));
  EXPECT(!BP_HAS_FIELD(bp_plugin_api, abi_major, sizeof(size_t)));
  EXPECT(!BP_HAS_FIELD(bp_plugin_api, create, before_create));
  EXPECT(!BP_HAS_FIELD(bp_plugin_api, create, before_create + sizeof(void*) - 1));
  EXPECT(BP_HAS_FIELD(bp_plugin_api, create, before_create + sizeof(void*)));
  EXPECT(BP_HAS_FIELD(bp_plugin_api, barrier, sizeof(bp_plugin_api)));
  EXPECT(!BP_HAS_FIELD(bp_plugin_api, barrier, 0));
  EXPECT(BP_HAS_FIELD(bp_device_info_args, attributes, sizeof(bp_device_info_args)));
  EXPECT(!BP_HAS_FIELD(bp_device_info_args, attributes, offsetof(bp_device_info_args, attributes)));
  EXPECT(!BP_HAS_FIELD(bp_create_args, plugin, offsetof(bp_create_args, plugin)));

  /* bp_tensor mirrors DLTensor's order: the data handle first, then offset. */
  EXPECT(offsetof(bp_tensor, buffer) == 0);
  EXPECT(offsetof(bp_tensor, byte_offset) == sizeof(void*));
  EXPECT(sizeof(((bp_tensor*)0)->dtype) == 4);
  EXPECT(sizeof(((bp_tensor*)0)->ndim) == 4);
}

static void check_capabilities(void) {
  const uint64_t named[] = {BP_CAP_COLLECTIVE, BP_CAP_ASYNC, BP_CAP_HOST_VISIBLE, BP_CAP_REMOTE,
                            BP_CAP_MATMUL,     BP_CAP_F32,   BP_CAP_F64,          BP_CAP_I32,
                            BP_CAP_I64,        BP_CAP_BOOL,  BP_CAP_F16,          BP_CAP_BF16,
                            BP_CAP_U8,         BP_CAP_I8};
  const size_t n = sizeof(named) / sizeof(named[0]);
  uint64_t all = 0;
  size_t i, j;
  int d;

  /* Flags are distinct single bits. */
  for (i = 0; i < n; ++i) {
    EXPECT(named[i] != 0 && (named[i] & (named[i] - 1)) == 0);
    for (j = i + 1; j < n; ++j) EXPECT(named[i] != named[j]);
    all |= named[i];
  }
  /* Dtype flags sit at 16 + the dtype's value, all inside 64 bits, clear of
   * the feature flags (bits 0..15). */
  EXPECT(BP_CAP_DTYPE_SHIFT_ + BP_DTYPE_COUNT_ <= 64);
  for (d = BP_DTYPE_F32; d < BP_DTYPE_COUNT_; ++d) {
    EXPECT(BP_CAP_DTYPE(d) == (UINT64_C(1) << (16 + d)));
    EXPECT((BP_CAP_DTYPE(d) & UINT64_C(0xFFFF)) == 0);
    EXPECT((all & BP_CAP_DTYPE(d)) != 0); /* each dtype has its named flag */
  }
  EXPECT(BP_CAP_F64 == BP_CAP_DTYPE(BP_DTYPE_F64));
  EXPECT(BP_CAP_BOOL == BP_CAP_DTYPE(BP_DTYPE_BOOL));

  /* Names of single bits; NULL for no bit, several bits or an unnamed bit. */
  EXPECT_NAME(bp_capability_name(BP_CAP_COLLECTIVE), "collective");
  EXPECT_NAME(bp_capability_name(BP_CAP_ASYNC), "async");
  EXPECT_NAME(bp_capability_name(BP_CAP_HOST_VISIBLE), "host_visible");
  EXPECT_NAME(bp_capability_name(BP_CAP_REMOTE), "remote");
  EXPECT_NAME(bp_capability_name(BP_CAP_MATMUL), "matmul");
  EXPECT_NAME(bp_capability_name(BP_CAP_F32), "f32");
  EXPECT_NAME(bp_capability_name(BP_CAP_F64), "f64");
  EXPECT_NAME(bp_capability_name(BP_CAP_I64), "i64");
  EXPECT_NAME(bp_capability_name(BP_CAP_BOOL), "bool");
  EXPECT_NAME(bp_capability_name(BP_CAP_BF16), "bf16");
  EXPECT_NAME(bp_capability_name(BP_CAP_I8), "i8");
  for (d = BP_DTYPE_F32; d < BP_DTYPE_COUNT_; ++d)
    EXPECT_NAME(bp_capability_name(BP_CAP_DTYPE(d)), bp_dtype_name(d));
  EXPECT_NAME(bp_capability_name(0), NULL);
  EXPECT_NAME(bp_capability_name(BP_CAP_COLLECTIVE | BP_CAP_ASYNC), NULL);
  EXPECT_NAME(bp_capability_name(BP_CAP_F32 | BP_CAP_F64), NULL);
  EXPECT_NAME(bp_capability_name(UINT64_C(1) << 5), NULL);               /* unnamed feature bit */
  EXPECT_NAME(bp_capability_name(UINT64_C(1) << 15), NULL);              /* last feature bit    */
  EXPECT_NAME(bp_capability_name(BP_CAP_DTYPE(BP_DTYPE_INVALID)), NULL); /* bit 16: no dtype    */
  EXPECT_NAME(bp_capability_name(BP_CAP_DTYPE(BP_DTYPE_COUNT_)), NULL);  /* a future dtype      */
  EXPECT_NAME(bp_capability_name(UINT64_C(1) << 63), NULL);
}

static void check_dtypes(void) {
  static const struct {
    int32_t dtype;
    const char* name;
    size_t size;
  } expected[] = {{BP_DTYPE_F32, "f32", 4},   {BP_DTYPE_F64, "f64", 8},   {BP_DTYPE_I32, "i32", 4},
                  {BP_DTYPE_I64, "i64", 8},   {BP_DTYPE_BOOL, "bool", 1}, {BP_DTYPE_F16, "f16", 2},
                  {BP_DTYPE_BF16, "bf16", 2}, {BP_DTYPE_U8, "u8", 1},     {BP_DTYPE_I8, "i8", 1}};
  const size_t n = sizeof(expected) / sizeof(expected[0]);
  size_t i;

  EXPECT(BP_DTYPE_INVALID == 0 && BP_DTYPE_F32 == 1 && BP_DTYPE_I8 == 9);
  EXPECT((size_t)BP_DTYPE_COUNT_ == n + 1); /* every dtype is listed above */
  for (i = 0; i < n; ++i) {
    EXPECT_NAME(bp_dtype_name(expected[i].dtype), expected[i].name);
    EXPECT(bp_dtype_size(expected[i].dtype) == expected[i].size);
  }
  EXPECT_NAME(bp_dtype_name(BP_DTYPE_INVALID), NULL);
  EXPECT_NAME(bp_dtype_name(BP_DTYPE_COUNT_), NULL);
  EXPECT_NAME(bp_dtype_name(-1), NULL);
  EXPECT_NAME(bp_dtype_name(INT32_MAX), NULL);
  EXPECT(bp_dtype_size(BP_DTYPE_INVALID) == 0);
  EXPECT(bp_dtype_size(BP_DTYPE_COUNT_) == 0);
  EXPECT(bp_dtype_size(-1) == 0);
  EXPECT(bp_dtype_size(INT32_MIN) == 0);
}

static void check_ops(void) {
  /* Every op, by its enum value: the name table must agree with the enum. */
  static const struct {
    int32_t op;
    const char* name;
  } expected[] = {{BP_OP_ADD, "add"},
                  {BP_OP_SUB, "sub"},
                  {BP_OP_MUL, "mul"},
                  {BP_OP_DIV, "div"},
                  {BP_OP_MATMUL, "matmul"},
                  {BP_OP_COPY, "copy"},
                  {BP_OP_POW, "pow"},
                  {BP_OP_MAXIMUM, "maximum"},
                  {BP_OP_MINIMUM, "minimum"},
                  {BP_OP_EQ, "eq"},
                  {BP_OP_NE, "ne"},
                  {BP_OP_LT, "lt"},
                  {BP_OP_LE, "le"},
                  {BP_OP_GT, "gt"},
                  {BP_OP_GE, "ge"},
                  {BP_OP_WHERE, "where"},
                  {BP_OP_NEG, "neg"},
                  {BP_OP_ABS, "abs"},
                  {BP_OP_EXP, "exp"},
                  {BP_OP_LOG, "log"},
                  {BP_OP_SQRT, "sqrt"},
                  {BP_OP_TANH, "tanh"},
                  {BP_OP_SIGMOID, "sigmoid"},
                  {BP_OP_RELU, "relu"},
                  {BP_OP_SIN, "sin"},
                  {BP_OP_COS, "cos"},
                  {BP_OP_CLAMP, "clamp"},
                  {BP_OP_CAST, "cast"},
                  {BP_OP_FILL, "fill"},
                  {BP_OP_ARANGE, "arange"},
                  {BP_OP_RAND_UNIFORM, "rand_uniform"},
                  {BP_OP_RANDN, "randn"},
                  {BP_OP_SUM, "sum"},
                  {BP_OP_MEAN, "mean"},
                  {BP_OP_MAX, "max"},
                  {BP_OP_MIN, "min"},
                  {BP_OP_ARGMAX, "argmax"},
                  {BP_OP_ARGMIN, "argmin"},
                  {BP_OP_SOFTMAX, "softmax"},
                  {BP_OP_LOG_SOFTMAX, "log_softmax"},
                  {BP_OP_INDEX_SELECT, "index_select"},
                  {BP_OP_GATHER, "gather"},
                  {BP_OP_ERF, "erf"},
                  {BP_OP_AXPBY, "axpby"}};
  const size_t n = sizeof(expected) / sizeof(expected[0]);
  size_t i;
  int32_t a, b;

  EXPECT(BP_OP_INVALID == 0 && BP_OP_ADD == 1 && BP_OP_COPY == 6 && BP_OP_POW == 7 && BP_OP_GATHER == 42);
  EXPECT(BP_OP_COUNT_ == 45);
  EXPECT((size_t)BP_OP_COUNT_ == n + 1); /* every op is listed above */
  for (i = 0; i < n; ++i) EXPECT_NAME(bp_op_name(expected[i].op), expected[i].name);
  /* Names are distinct, so they can be parsed back. */
  for (a = 1; a < BP_OP_COUNT_; ++a)
    for (b = a + 1; b < BP_OP_COUNT_; ++b)
      if (bp_op_name(a) != NULL && bp_op_name(b) != NULL) EXPECT(strcmp(bp_op_name(a), bp_op_name(b)) != 0);
  EXPECT_NAME(bp_op_name(BP_OP_INVALID), NULL);
  EXPECT_NAME(bp_op_name(BP_OP_COUNT_), NULL);
  EXPECT_NAME(bp_op_name(-1), NULL);
  EXPECT_NAME(bp_op_name(INT32_MAX), NULL);

  /* BP_OP_TABLE: each row sits at its own value (the rows are in value
   * order), its arity is its kind's, the ops that read an axis are the
   * axis kinds, and any other value gets the empty row. */
  {
    static const int32_t kind_inputs[BP_OP_KIND_COUNT_] = {-1, 2, 2, 3, 1, 1, 1, 2, 0, 0, 1, 1, 1, 2, 2, 2};
    int32_t op;
#define CHECK_ROW_(N, v, s, k, d, in, at)                                                           \
  EXPECT(BP_OP_##N == (v));                                                                         \
  EXPECT(bp_op_info_of(v)->name != NULL && strcmp(bp_op_info_of(v)->name, #s) == 0);                \
  EXPECT(bp_op_info_of(v)->kind == BP_OP_KIND_##k && bp_op_info_of(v)->dtypes == BP_OP_DTYPES_##d); \
  EXPECT(bp_op_info_of(v)->inputs == (in) && bp_op_info_of(v)->attrs == (uint32_t)(at));
    BP_OP_TABLE(CHECK_ROW_)
#undef CHECK_ROW_
    for (op = 1; op < BP_OP_COUNT_; ++op) {
      const bp_op_info* info = bp_op_info_of(op);
      const int axis_kind = info->kind == BP_OP_KIND_REDUCE || info->kind == BP_OP_KIND_ARG_REDUCE ||
                            info->kind == BP_OP_KIND_SOFTMAX || info->kind == BP_OP_KIND_INDEX_SELECT ||
                            info->kind == BP_OP_KIND_GATHER;
      EXPECT(info->kind > BP_OP_KIND_NONE && info->kind < BP_OP_KIND_COUNT_);
      EXPECT(info->dtypes != BP_OP_DTYPES_NONE);
      EXPECT(info->inputs == kind_inputs[info->kind]);
      EXPECT(((info->attrs & BP_OP_ATTR_AXIS) != 0) == axis_kind);
      EXPECT(((info->attrs & BP_OP_ATTR_DTYPE) != 0) == (info->kind == BP_OP_KIND_CAST));
    }
    EXPECT(bp_op_info_of(BP_OP_INVALID)->kind == BP_OP_KIND_NONE &&
           bp_op_info_of(BP_OP_INVALID)->name == NULL);
    EXPECT(bp_op_info_of(BP_OP_COUNT_)->kind == BP_OP_KIND_NONE && bp_op_info_of(-7)->inputs == 0);
  }

  EXPECT(BP_REDUCE_SUM == 0 && BP_REDUCE_COUNT_ == 5);
  EXPECT_NAME(bp_reduce_op_name(BP_REDUCE_SUM), "sum");
  EXPECT_NAME(bp_reduce_op_name(BP_REDUCE_MEAN), "mean");
  EXPECT_NAME(bp_reduce_op_name(BP_REDUCE_MIN), "min");
  EXPECT_NAME(bp_reduce_op_name(BP_REDUCE_MAX), "max");
  EXPECT_NAME(bp_reduce_op_name(BP_REDUCE_PROD), "prod");
  EXPECT_NAME(bp_reduce_op_name(BP_REDUCE_COUNT_), NULL);
  EXPECT_NAME(bp_reduce_op_name(-1), NULL);
}

static void check_statuses(void) {
  EXPECT(BP_STATUS_OK == 0 && BP_STATUS_UNAVAILABLE == 7 && BP_STATUS_COUNT_ == 10);
  EXPECT_NAME(bp_status_code_name(BP_STATUS_OK), "ok");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_INVALID_ARGUMENT), "invalid_argument");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_UNSUPPORTED), "unsupported");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_OUT_OF_MEMORY), "out_of_memory");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_INTERNAL), "internal");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_TIMEOUT), "timeout");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_COLLECTIVE), "collective");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_UNAVAILABLE), "unavailable");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_DEVICE), "device");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_IO), "io");
  EXPECT_NAME(bp_status_code_name(BP_STATUS_COUNT_), NULL);
  EXPECT_NAME(bp_status_code_name(-1), NULL);
}

int main(void) {
  check_table_and_handshake();
  check_layout();
  check_struct_sizes();
  check_capabilities();
  check_dtypes();
  check_ops();
  check_statuses();
  if (failures == 0) printf("abi.h: C99 layout and name checks passed\n");
  return failures;
}
