// Plugin classes the SDK must refuse at compile time, one per BP_SDK_DEFECT
// value (see tests/abi/CMakeLists.txt: each is compiled with -fsyntax-only and
// must fail with its static_assert's text). Without BP_SDK_DEFECT the file is
// a correct plugin and must compile: the failures come from the defects, not
// from the include path or the flags.
#include <backplane/plugin.hpp>

namespace bpp = backplane::plugin;

// The required members, shared by every case.
class Required {
 public:
  explicit Required(const bpp::CreateArgs&) {}
  int32_t device_count() { return 1; }
  bpp::DeviceInfo device_info(int32_t) { return {"check:0", BP_CAP_F32, {}}; }
  bool supports_op(int32_t, int32_t, int32_t) { return false; }
  bp_buffer* buffer_alloc(int32_t, uint64_t) { return nullptr; }
  void buffer_free(bp_buffer*) {}
  void buffer_write(bp_buffer*, uint64_t, const void*, uint64_t) {}
  void buffer_read(bp_buffer*, uint64_t, void*, uint64_t) {}
  void execute(const bp_execute_args&) {}
};

// Every collective member but comm_abort.
class CollectivesButAbort : public Required {
 public:
  using Required::Required;
  bp_comm* comm_create(const bp_comm_create_args&) { return nullptr; }
  void comm_destroy(bp_comm*) {}
  void all_reduce(bp_comm*, const bp_tensor&, const bp_tensor&, bp_reduce_op) {}
  void broadcast(bp_comm*, const bp_tensor&, int32_t) {}
  void all_gather(bp_comm*, const bp_tensor&, const bp_tensor&) {}
  void reduce_scatter(bp_comm*, const bp_tensor&, const bp_tensor&, bp_reduce_op) {}
  void barrier(bp_comm*) {}
};

#if !defined(BP_SDK_DEFECT)
// Correct: lists what it defines.
class Plugin : public CollectivesButAbort {
 public:
  using Features = bpp::Features<bpp::Feature::synchronize, bpp::Feature::collectives>;
  using CollectivesButAbort::CollectivesButAbort;
  void synchronize(int32_t) {}
  void comm_abort(bp_comm*) {}
};
#elif BP_SDK_DEFECT == 1
// Lists a feature whose member it lacks.
class Plugin : public Required {
 public:
  using Features = bpp::Features<bpp::Feature::device_memory>;
  using Required::Required;
};
#elif BP_SDK_DEFECT == 2
// A misspelt optional member: `synchronise` can never become the synchronize entry.
class Plugin : public Required {
 public:
  using Features = bpp::Features<bpp::Feature::synchronize>;
  using Required::Required;
  void synchronise(int32_t) {}
};
#elif BP_SDK_DEFECT == 3
// An optional member with the wrong signature (ABI 1's host pointer shape).
class Plugin : public Required {
 public:
  using Features = bpp::Features<bpp::Feature::buffer_pointer>;
  using Required::Required;
  void* buffer_pointer(bp_buffer*) { return nullptr; }
};
#elif BP_SDK_DEFECT == 4
// Defines an optional member without listing it.
class Plugin : public Required {
 public:
  using Required::Required;
  void synchronize(int32_t) {}
};
#elif BP_SDK_DEFECT == 5
// Declares collectives without comm_abort.
class Plugin : public CollectivesButAbort {
 public:
  using Features = bpp::Features<bpp::Feature::collectives>;
  using CollectivesButAbort::CollectivesButAbort;
};
#elif BP_SDK_DEFECT == 6
// Defines collectives without listing Feature::collectives.
class Plugin : public CollectivesButAbort {
 public:
  using CollectivesButAbort::CollectivesButAbort;
  void comm_abort(bp_comm*) {}
};
#elif BP_SDK_DEFECT == 7
// Misses a required member.
class Plugin {
 public:
  explicit Plugin(const bpp::CreateArgs&) {}
  int32_t device_count() { return 1; }
};
#elif BP_SDK_DEFECT == 8
// buffer_import with a `handed_over` flag: ownership of `release` passes
// only with the returned buffer, so the member takes the arguments alone.
class Plugin : public Required {
 public:
  using Features = bpp::Features<bpp::Feature::buffer_import>;
  using Required::Required;
  bp_buffer* buffer_import(const bp_buffer_import_args&, bool& handed_over) {
    handed_over = false;
    return nullptr;
  }
};
#endif

BP_DEFINE_PLUGIN(Plugin, "check", "0.1.0")
