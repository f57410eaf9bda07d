/* The smallest useful backplane plugin in plain C99, against abi.h alone:
 * one device in host memory, f32 only, three ops. FILL gives zeros(), ones()
 * and full(); COPY gives contiguous(), cat() and strided to(); ADD gives
 * a + b with broadcasting. The same plugin as examples/minimal_plugin_cpp,
 * without the C++ SDK: this file is everything the ABI asks for.
 *
 * What the host guarantees (abi.h, "Trust contract"): every request is
 * validated before it arrives (devices, ops supports_op accepted, dtypes,
 * shapes, views and read/write ranges inside their buffers), so the code
 * below checks only what the host cannot know: its options and malloc. */
#include <backplane/abi.h>

#include <stdlib.h>
#include <string.h>

/* ---- statuses: NULL is success; a failure is a heap status the host frees
 * with status_free, or the static one when even that cannot be allocated. */
struct bp_status {
  int32_t code;
  char* message; /* NULL only in the static out-of-memory status */
};

static bp_status oom_status = {BP_STATUS_OUT_OF_MEMORY, NULL};

static bp_status* make_status(int32_t code, const char* message) {
  bp_status* s = (bp_status*)malloc(sizeof *s);
  size_t n = strlen(message) + 1;
  if (s == NULL) return &oom_status;
  s->message = (char*)malloc(n);
  if (s->message == NULL) {
    free(s);
    return &oom_status;
  }
  memcpy(s->message, message, n);
  s->code = code;
  return s;
}
static int32_t status_code(const bp_status* s) { return s->code; }
static const char* status_message(const bp_status* s) {
  return s->message != NULL ? s->message : "out of memory while reporting an error";
}
static void status_free(bp_status* s) {
  if (s == NULL || s == &oom_status) return;
  free(s->message);
  free(s);
}

/* ---- the instance and its buffers (opaque to the host) ------------------- */
struct bp_plugin {
  int unused; /* no state: one device, nothing to configure */
};
struct bp_buffer {
  uint64_t size;
  unsigned char bytes[]; /* C99 flexible array member */
};

/* Cheap, as abi.h asks: parse the options, start nothing. */
static bp_status* create(bp_create_args* args) {
  const char* options = "{}";
  bp_plugin* plugin;
  if (BP_HAS_FIELD(bp_create_args, options_json, args->struct_size) && args->options_json != NULL)
    options = args->options_json;
  if (options[strspn(options, "{} \t\r\n")] != '\0')
    return make_status(BP_STATUS_INVALID_ARGUMENT, "minimal_plugin_c takes no options");
  if (!BP_HAS_FIELD(bp_create_args, plugin, args->struct_size))
    return make_status(BP_STATUS_INVALID_ARGUMENT, "the host's bp_create_args has no room for the instance");
  plugin = (bp_plugin*)calloc(1, sizeof *plugin);
  if (plugin == NULL) return make_status(BP_STATUS_OUT_OF_MEMORY, "cannot allocate the plugin instance");
  args->plugin = plugin;
  return NULL;
}
static void destroy(bp_plugin* plugin) { free(plugin); }

/* ---- devices: out-fields are written only inside the host's struct_size -- */
static bp_status* device_count(bp_device_count_args* args) {
  if (BP_HAS_FIELD(bp_device_count_args, num_devices, args->struct_size)) args->num_devices = 1;
  return NULL;
}

static bp_status* device_info(bp_device_info_args* args) {
  if (BP_HAS_FIELD(bp_device_info_args, name, args->struct_size)) args->name = "minimal host memory";
  /* BP_CAP_F32: the host may create f32 tensors here. No host_visible: the
   * host reads and writes tensors through buffer_read/buffer_write. */
  if (BP_HAS_FIELD(bp_device_info_args, capabilities, args->struct_size)) args->capabilities = BP_CAP_F32;
  if (BP_HAS_FIELD(bp_device_info_args, num_attributes, args->struct_size)) args->num_attributes = 0;
  if (BP_HAS_FIELD(bp_device_info_args, attributes, args->struct_size)) args->attributes = NULL;
  return NULL;
}

/* Raw values, possibly from a newer host: unknown ones answer no. */
static bp_status* supports_op(bp_supports_op_args* args) {
  const int32_t op = args->op;
  const int yes = args->dtype == BP_DTYPE_F32 && (op == BP_OP_FILL || op == BP_OP_COPY || op == BP_OP_ADD);
  if (BP_HAS_FIELD(bp_supports_op_args, supported, args->struct_size)) args->supported = yes;
  return NULL;
}

/* ---- buffers --------------------------------------------------------------- */
static bp_status* buffer_alloc(bp_buffer_alloc_args* args) {
  bp_buffer* b = (bp_buffer*)calloc(1, sizeof(bp_buffer) + (size_t)args->size);
  if (b == NULL) return make_status(BP_STATUS_OUT_OF_MEMORY, "cannot allocate the buffer");
  b->size = args->size;
  args->buffer = b;
  return NULL;
}
static bp_status* buffer_free(bp_buffer_free_args* args) {
  free(args->buffer);
  return NULL;
}
static bp_status* buffer_write(bp_buffer_copy_args* args) {
  if (args->size > 0) memcpy(args->buffer->bytes + args->offset, args->src, (size_t)args->size);
  return NULL;
}
static bp_status* buffer_read(bp_buffer_copy_args* args) {
  if (args->size > 0) memcpy(args->dst, args->buffer->bytes + args->offset, (size_t)args->size);
  return NULL;
}

/* ---- execute ----------------------------------------------------------------- */
#define MAX_DIMS 64 /* at least the host's limit on ndim */

/* Element k of a view, k given as a multi-index over the output's shape
 * (inputs arrive broadcast to it: stride 0 on broadcast dimensions). */
static float* element(const bp_tensor* t, const int64_t* index) {
  int64_t offset = 0;
  int32_t d;
  for (d = 0; d < t->ndim; ++d) offset += index[d] * t->strides[d];
  return (float*)(t->buffer->bytes + t->byte_offset) + offset;
}

static bp_status* execute(bp_execute_args* args) {
  const bp_tensor* out = &args->outputs[0];
  const float fill = (float)args->attrs->scalar0;
  int64_t index[MAX_DIMS] = {0};
  int64_t count = 1;
  int64_t i;
  int32_t d;
  if (args->op != BP_OP_FILL && args->op != BP_OP_COPY && args->op != BP_OP_ADD)
    return make_status(BP_STATUS_UNSUPPORTED, "minimal_plugin_c runs only fill, copy and add");
  for (d = 0; d < out->ndim; ++d) count *= out->shape[d];
  for (i = 0; i < count; ++i) {
    float* o = element(out, index);
    switch (args->op) {
      case BP_OP_FILL:
        *o = fill;
        break;
      case BP_OP_COPY:
        *o = *element(&args->inputs[0], index);
        break;
      default:
        *o = *element(&args->inputs[0], index) + *element(&args->inputs[1], index);
        break;
    }
    /* The next multi-index, last dimension fastest. */
    for (d = out->ndim - 1; d >= 0; --d) {
      if (++index[d] < out->shape[d]) break;
      index[d] = 0;
    }
  }
  return NULL;
}

/* ---- the one exported symbol ---------------------------------------------- */
BP_EXPORT const bp_plugin_api* bp_plugin_entry(const bp_host_api* host) {
  /* Every optional entry stays NULL ("not supported"); so do the collectives,
   * which is why the device must not declare BP_CAP_COLLECTIVE. */
  static bp_plugin_api table;
  (void)host; /* a plugin that logs keeps it: host->log(host->ctx, level, text) */
  table.struct_size = BP_PLUGIN_API_STRUCT_SIZE;
  table.abi_major = BP_ABI_MAJOR;
  table.abi_minor = BP_ABI_MINOR;
  table.plugin_name = "minimal_plugin_c";
  table.plugin_version = "0.1.0";
  table.status_code = status_code;
  table.status_message = status_message;
  table.status_free = status_free;
  table.create = create;
  table.destroy = destroy;
  table.device_count = device_count;
  table.device_info = device_info;
  table.supports_op = supports_op;
  table.buffer_alloc = buffer_alloc;
  table.buffer_free = buffer_free;
  table.buffer_write = buffer_write;
  table.buffer_read = buffer_read;
  table.execute = execute;
  return &table;
}
