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

/* The version macros must be plain integer literals: plugins test them with
 * #if (`#if BP_ABI_MINOR >= 1`), where a cast or enum would not work. */
#if !defined(BP_ABI_MAJOR) || !defined(BP_ABI_MINOR) || BP_ABI_MAJOR != 1 || BP_ABI_MINOR < 0
#error "BP_ABI_MAJOR / BP_ABI_MINOR must be preprocessor integers, major 1"
#endif

/* A C entry point of the documented type, doing the version handshake the
 * way the rules ask: read the host's version only inside its struct_size,
 * refuse (NULL) another major, else return a static table. */
static const bp_plugin_api *entry_in_c(const bp_host_api *host) {
  static bp_plugin_api table;
  if (host == NULL || !BP_HAS_FIELD(bp_host_api, abi_major, host->struct_size)) return NULL;
  if (host->abi_major != BP_ABI_MAJOR) return NULL;
  memset(&table, 0, sizeof table);
  table.struct_size = sizeof table;
  table.abi_major = BP_ABI_MAJOR;
  table.abi_minor = BP_ABI_MINOR;
  table.plugin_name = "abi_c99";
  table.plugin_version = "0.0.0";
  return &table;
}

int main(void) {
  bp_plugin_entry_fn entry = entry_in_c;
  const size_t before_create = offsetof(bp_plugin_api, create);
  const uint64_t caps[] = {BP_CAP_COLLECTIVE, BP_CAP_ASYNC, BP_CAP_HOST_VISIBLE, BP_CAP_F64, BP_CAP_F16,
                           BP_CAP_BF16, BP_CAP_REMOTE, BP_CAP_INT64, BP_CAP_MATMUL};
  size_t i, j;

  EXPECT(strcmp(BP_PLUGIN_ENTRY_SYMBOL, "bp_plugin_entry") == 0);
  EXPECT(BP_ABI_MAJOR == 1);

  /* The handshake through a bp_plugin_entry_fn pointer. */
  {
    bp_host_api host;
    const bp_plugin_api *t;
    memset(&host, 0, sizeof host);
    host.struct_size = sizeof host;
    host.abi_major = BP_ABI_MAJOR;
    host.abi_minor = BP_ABI_MINOR;
    t = entry(&host);
    EXPECT(t != NULL);
    if (t != NULL) {
      EXPECT(t->struct_size == sizeof(bp_plugin_api));
      EXPECT(t->abi_major == BP_ABI_MAJOR && t->abi_minor == BP_ABI_MINOR);
      EXPECT(BP_HAS_FIELD(bp_plugin_api, barrier, t->struct_size));
      EXPECT(strcmp(t->plugin_name, "abi_c99") == 0);
    }
    EXPECT(entry(NULL) == NULL);
    host.abi_major = BP_ABI_MAJOR + 1;
    EXPECT(entry(&host) == NULL);
    host.abi_major = BP_ABI_MAJOR;
    host.struct_size = offsetof(bp_host_api, abi_major); /* too small to carry the version */
    EXPECT(entry(&host) == NULL);
  }

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
#if BP_ABI_MINOR == 0
  /* In 1.0 nothing follows barrier: a field appended without a minor bump
   * would break BP_HAS_FIELD checks against 1.0 plugins' struct_size. */
  EXPECT(sizeof(bp_plugin_api) == offsetof(bp_plugin_api, barrier) + sizeof(void (*)(void)));
#endif

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
  EXPECT(BP_OP_ADD == 1 && BP_OP_COPY == 6 && BP_OP_POW == 7 && BP_OP_GATHER == 42 && BP_OP_COUNT_ == 43);
  EXPECT(BP_DTYPE_INVALID == 0 && BP_DTYPE_F32 == 1);

  if (failures == 0) printf("abi.h: C99 layout checks passed\n");
  return failures;
}
