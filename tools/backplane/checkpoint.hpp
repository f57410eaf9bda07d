// `backplane train`'s checkpoints: one safetensors file per checkpoint,
// "step-<10 digits>.safetensors" in the --checkpoint-dir folder, holding
//   model.<name>       the model's parameters
//   optimizer.<name>   the optimizer's state (nn::Optimizer::state())
// and in "__metadata__" where the run stands (step, epoch, the running
// epoch's partial loss sums of every rank, the loss histories), the seed
// from which every random choice derives, the job's arguments, and the
// SHA-256 of the tensors' bytes. Doubles are written in their shortest form
// that reads back to the same double, so a resumed run continues from
// exactly the same values.
//
// Only rank 0 writes (the ranks of a data-parallel job hold the same model);
// a checkpoint appears whole or not at all (save_safetensors writes a
// temporary file, fsyncs, renames and fsyncs the folder). Files in the
// folder are never followed as symbolic links: a link under a checkpoint's
// name is replaced when writing, refused when reading, and never pruned.
#ifndef BACKPLANE_TOOLS_CHECKPOINT_HPP_
#define BACKPLANE_TOOLS_CHECKPOINT_HPP_

#include <backplane/backplane.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace backplane::cli {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Where a run stands, besides its tensors.
struct TrainPosition {
  int64_t step = 0;                // steps done, over every epoch
  int32_t completed_epochs = 0;    // whole epochs done
  int64_t epoch_step = 0;          // steps done of epoch completed_epochs + 1
  std::vector<double> loss_sums;   // per rank: the running epoch's step losses so far (empty: all 0)
  std::vector<double> epoch_loss;  // every completed epoch's loss, over all ranks
  std::vector<double> step_loss;   // rank 0's step losses so far
};

// What must agree between a checkpoint and the run resuming from it, as
// option name -> value text ("--batch-size" -> "32").
using RunIdentity = std::map<std::string, std::string>;

struct Checkpoint {
  std::filesystem::path path;
  TrainPosition position;
  RunIdentity identity;
  NamedTensors model;      // names without "model."
  NamedTensors optimizer;  // names without "optimizer."
};

// One tensor a checkpoint may hold for this run ("model.l1.weight",
// "optimizer.m.0"), and whether it must.
struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  bool required = true;
};
using CheckpointLayout = std::vector<TensorSpec>;

// The lock a job holds on its checkpoint folder while it trains: flock(2)
// on "<dir>/.backplane-train.lock", which also says who holds it (PID, host,
// start time). The kernel drops it when the process ends, however it ends,
// so a killed job never leaves the folder locked. Two jobs on one folder
// would prune each other's checkpoints; the second is refused.
class CheckpointFolderLock {
 public:
  // Takes the lock (making the folder if absent). Throws backplane::Error
  // (Errc::io_error) naming the job that holds it, or saying why the lock
  // file cannot be made or locked.
  explicit CheckpointFolderLock(const std::filesystem::path& dir);
  ~CheckpointFolderLock();
  CheckpointFolderLock(const CheckpointFolderLock&) = delete;
  CheckpointFolderLock& operator=(const CheckpointFolderLock&) = delete;

 private:
  int fd_ = -1;
};

// "0.1": the shortest text that reads back (strtod) to exactly `value`.
std::string exact_text(double value);

// The checkpoint files of `dir` (step-*.safetensors), newest first; an
// absent folder has none. Temporary files of interrupted writes are not
// listed.
std::vector<std::pair<int64_t, std::filesystem::path>> list_checkpoints(const std::filesystem::path& dir);

// Removes the temporary files that writes interrupted by a crash left in
// `dir`; returns how many.
int remove_interrupted_writes(const std::filesystem::path& dir);

// Writes checkpoint `step-<position.step>` into `dir` (made if absent) and
// then removes the oldest checkpoints beyond the newest `keep`. Returns the
// file written. Throws backplane::Error (Errc::io_error naming the file) when
// it cannot be written.
std::filesystem::path save_checkpoint(const std::filesystem::path& dir, const TrainPosition& position,
                                      const RunIdentity& identity, const std::vector<std::string>& command,
                                      const NamedTensors& model, const NamedTensors& optimizer, int keep);

// Reads and verifies one checkpoint onto `device`: a valid safetensors file
// (not a symbolic link), this format, tensors named, typed and shaped as
// `layout` says -- compared before any tensor byte is read --, contents that
// match the recorded checksum -- hashed from the file a chunk at a time,
// before any tensor is made --, and complete metadata. Throws
// backplane::Error saying what is wrong (naming the file).
Checkpoint load_checkpoint(const std::filesystem::path& file, const Device& device,
                           const CheckpointLayout& layout);

// "" when `theirs` (a checkpoint's) agrees with `ours`; else a message
// naming each option that differs and both values.
std::string identity_mismatch(const RunIdentity& theirs, const RunIdentity& ours);

// SHA-256 (hex) of the tensors' bytes in order: a checkpoint's checksum, and
// what ranks compare to confirm they hold the same model.
std::string tensors_sha256(const std::vector<const NamedTensors*>& groups);

}  // namespace backplane::cli

#endif  // BACKPLANE_TOOLS_CHECKPOINT_HPP_
