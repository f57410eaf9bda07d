/* Proves include/backplane/abi.h is a C99 header (built with -std=c99
 * -pedantic -Werror) and checks the layout rules the versioning policy relies
 * on. Returns the number of failed checks. */
#include <backplane/abi.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                  \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

/* A C entry point of the documented type must compile. */
static const bp_plugin_api *entry_in_c(const bp_host_api *host) {
  (void)host;
  return NULL;
}

int main(void) {
  bp_plugin_entry_fn entry = entry_in_c;
  const size_t before_create = offsetof(bp_plugin_api, create);
  const uint64_t caps[] = {BP_CAP_COLLECTIVE, BP_CAP_ASYNC, BP_CAP_HOST_VISIBLE, BP_CAP_F64, BP_CAP_F16,
                           BP_CAP_BF16, BP_CAP_REMOTE, BP_CAP_INT64, BP_CAP_MATMUL};
  size_t i, j;

  EXPECT(entry(NULL) == NULL);
  EXPECT(strcmp(BP_PLUGIN_ENTRY_SYMBOL, "bp_plugin_entry") == 0);
  EXPECT(BP_ABI_MAJOR == 1);
  EXPECT(BP_ABI_MINOR >= 0);

  /* Every versioned struct begins with struct_size; the table's version
   * fields follow it, so any host can read them from any plugin. */
  EXPECT(offsetof(bp_plugin_api, struct_size) == 0);
  EXPECT(offsetof(bp_plugin_api, abi_major) == sizeof(size_t));
  EXPECT(offsetof(bp_plugin_api, abi_minor) == sizeof(size_t) + sizeof(uint32_t));
  EXPECT(offsetof(bp_host_api, struct_size) == 0);
  EXPECT(offsetof(bp_host_api, abi_major) == sizeof(size_t));
  EXPECT(offsetof(bp_kv_store, struct_size) == 0);
  EXPECT(offsetof(bp_create_args, struct_size) == 0);
  EXPECT(offsetof(bp_device_info, struct_size) == 0);
  EXPECT(offsetof(bp_execute_args, struct_size) == 0);
  EXPECT(offsetof(bp_comm_create_args, struct_size) == 0);
  EXPECT(offsetof(bp_op_attrs, struct_size) == 0);

  /* Append-only: the last entry ends the table; fields keep their order. */
  EXPECT(offsetof(bp_plugin_api, barrier) + sizeof(void (*)(void)) <= sizeof(bp_plugin_api));
  EXPECT(offsetof(bp_plugin_api, status_code) < offsetof(bp_plugin_api, create));
  EXPECT(offsetof(bp_plugin_api, create) < offsetof(bp_plugin_api, execute));
  EXPECT(offsetof(bp_plugin_api, execute) < offsetof(bp_plugin_api, comm_create));
  EXPECT(offsetof(bp_plugin_api, comm_create) < offsetof(bp_plugin_api, barrier));

  /* BP_HAS_FIELD: a field is visible only when it lies wholly inside size. */
  EXPECT(BP_HAS_FIELD(bp_plugin_api, struct_size, sizeof(size_t)));
  EXPECT(!BP_HAS_FIELD(bp_plugin_api, abi_major, sizeof(size_t)));
  EXPECT(!BP_HAS_FIELD(bp_plugin_api, create, before_create));
  EXPECT(!BP_HAS_FIELD(bp_plugin_api, create, before_create + sizeof(void *) - 1));
  EXPECT(BP_HAS_FIELD(bp_plugin_api, create, before_create + sizeof(void *)));
  EXPECT(BP_HAS_FIELD(bp_plugin_api, barrier, sizeof(bp_plugin_api)));
  EXPECT(!BP_HAS_FIELD(bp_plugin_api, barrier, 0));
  EXPECT(BP_HAS_FIELD(bp_device_info, memory_bytes, sizeof(bp_device_info)));
  EXPECT(!BP_HAS_FIELD(bp_device_info, memory_bytes, offsetof(bp_device_info, memory_bytes)));

  /* bp_tensor mirrors DLTensor's order: the data handle first, then offset. */
  EXPECT(offsetof(bp_tensor, buffer) == 0);
  EXPECT(offsetof(bp_tensor, byte_offset) == sizeof(void *));
  EXPECT(sizeof(((bp_tensor *)0)->dtype) == 4);
  EXPECT(sizeof(((bp_tensor *)0)->ndim) == 4);

  /* Capability flags are distinct single bits. */
  for (i = 0; i < sizeof(caps) / sizeof(caps[0]); ++i) {
    EXPECT(caps[i] != 0 && (caps[i] & (caps[i] - 1)) == 0);
    for (j = i + 1; j < sizeof(caps) / sizeof(caps[0]); ++j) EXPECT(caps[i] != caps[j]);
  }

  /* Status codes and enum values the table relies on. */
  EXPECT(BP_STATUS_OK == 0);
  EXPECT(BP_OP_ADD == 1 && BP_OP_COPY == 6 && BP_OP_COUNT_ == 7);
  EXPECT(BP_DTYPE_INVALID == 0 && BP_DTYPE_F32 == 1);

  if (failures == 0) printf("abi.h: C99 layout checks passed\n");
  return failures;
}
