// `backplane train`: data-parallel training of an MLP (64-128-10) on the
// digits data, the main job. Without RANK in the environment and with
// --nproc > 1 it starts itself --nproc times through the launcher (rank 0
// keeps the terminal for its progress bar); each rank trains on its shard of
// every global batch, and backward all-reduces the gradients of the
// registered parameters. With --checkpoint-dir, rank 0 saves checkpoints and
// every rank resumes from the newest valid one (checkpoint.hpp); with
// --max-restarts, the launcher starts the job again when a rank fails.
#include "checkpoint.hpp"
#include "cli.hpp"
#include "launcher.hpp"
#include "progress.hpp"
#include "svg_plot.hpp"

#include "digits.hpp"

#include <backplane/backplane.hpp>
#include <backplane/safetensors.hpp>
#include <backplane/trace.hpp>
#include <backplane_common/atomic_file.hpp>
#include <backplane_common/crypto.hpp>
#include <backplane_common/hex.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

namespace backplane::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct TrainOptions {
  int nproc = 2;
  int epochs = 20;
  int batch_size = 32;
  double lr = 0;  // 0: the optimizer's default (sgd 0.1, adam 0.001)
  double momentum = 0.9;
  std::string optimizer = "sgd";
  uint64_t seed = 0;
  std::string backend;
  std::string config;
  std::string data;
  std::string metrics_out;
  std::string plot;
  std::string plot_scale = "log";
  double bucket_mb = 25;
  double train_fraction = 0.8;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // 0: at the end of every epoch
  int keep = 2;
  std::string save_model;
  int max_restarts = 0;
  double restart_delay = 1.0;     // seconds before the first restart, doubling after each
  std::string trace;              // --trace: the job's trace file
  uint64_t trace_max_events = 0;  // 0: the default
  bool keep_given = false;
  bool nproc_given = false;
  std::vector<std::string> raw_args;  // as given, to start the ranks with
};

// This process's rank as its launcher or scheduler set it, if any did.
// Whether this process is a rank of a job a launcher or scheduler started
// (the rendezvous's own reading of the environment).
bool in_a_job() { return Rendezvous::env_rank().has_value(); }

// --data, else the copy beside the default config (share_dir(): the build
// tree's or the install tree's), wherever the tool is run from.
fs::path find_data(const std::string& flag) {
  if (!flag.empty()) return flag;
  const fs::path share = share_dir();
  std::error_code ec;
  if (!share.empty() && fs::is_regular_file(share / "digits.csv.gz", ec)) return share / "digits.csv.gz";
  throw CommandError(kExitFailed,
                     "cannot find the digits data: it belongs at " +
                         (share.empty() ? std::string("share/backplane") : share.string()) +
                         "/digits.csv.gz beside this program (the build and `cmake --install` put "
                         "it there); pass --data FILE");
}

// Each rank's rows of one epoch, like PyTorch's DistributedSampler: one
// permutation shared by all ranks (seeded by seed and epoch), padded by
// wrapping to a multiple of the world size, then every world-th row.
std::vector<int64_t> shard(int64_t rows, int rank, int world, uint64_t seed, int epoch) {
  std::vector<int64_t> order = digits::permutation(rows, seed * 1000003 + static_cast<uint64_t>(epoch));
  const std::size_t total = (order.size() + world - 1) / world * world;
  for (std::size_t i = 0; order.size() < total; ++i) order.push_back(order[i]);
  std::vector<int64_t> mine;
  for (std::size_t i = static_cast<std::size_t>(rank); i < total; i += static_cast<std::size_t>(world))
    mine.push_back(order[i]);
  return mine;
}

struct Batch {
  Tensor x, y;
};

Batch make_batch(const Device& d, const digits::Dataset& data, const std::vector<int64_t>& rows,
                 std::size_t begin, std::size_t end) {
  const digits::Dataset b = digits::rows(data, rows, begin, end);
  return {Tensor::from_vector<float>(d, {b.rows(), digits::kFeatures}, b.x),
          Tensor::from_vector<int64_t>(d, {b.rows()}, b.y)};
}

void progress(bool tty, int epoch, int epochs, std::size_t step, std::size_t steps, double loss, double rate,
              bool done) {
  if (tty) {
    constexpr int kWidth = 28;
    const int filled = static_cast<int>(kWidth * static_cast<double>(step) / static_cast<double>(steps));
    char bar[kWidth + 1];  // drawn every few steps: no allocation
    std::memset(bar, '#', static_cast<std::size_t>(filled));
    std::memset(bar + filled, '.', static_cast<std::size_t>(kWidth - filled));
    bar[kWidth] = '\0';
    std::printf("\repoch %2d/%d [%s] %3zu/%zu  loss %.4f  %8.0f samples/s%s", epoch, epochs, bar, step, steps,
                loss, rate, done ? "\n" : "");
    std::fflush(stdout);
  } else if (done) {
    std::printf("epoch %d/%d: %zu steps, loss %.4f, %.0f samples/s\n", epoch, epochs, steps, loss, rate);
    std::fflush(stdout);
  }
}

// The config's backend, loaded, or a CommandError with the exit code
// docs/cli.md documents (2 for a config problem, 1 for a backend that failed).
Backend chosen_backend(const Registry& registry, const std::string& name, const fs::path& config) {
  std::optional<Backend> found;
  try {
    found.emplace(name.empty() ? registry.default_backend() : find_backend(registry, name, kExitFailed));
  } catch (const Error& e) {
    throw CommandError(kExitFailed, e.message());
  }
  Backend backend = *found;
  if (backend.status() == Backend::Status::unavailable)
    throw CommandError(kExitFailed, "backend \"" + backend.name() + "\" is unavailable: " + backend.error() +
                                        "\n" + failure_hint(backend, config));
  if (backend.status() != Backend::Status::loaded)
    throw CommandError(kExitFailed, "backend \"" + backend.name() + "\" failed to load: " + backend.error() +
                                        "\n" + failure_hint(backend, config));
  if (backend.devices().empty())
    throw CommandError(kExitFailed, "backend \"" + backend.name() + "\" has no devices");
  return backend;
}

// Everything training needs of the device (ops, dtypes, 'collective' for more
// than one rank, sqrt only for adam), named at once before any rank starts or
// any data is read. What the backend's op_fallback covers is not refused: the
// result says what will fall back.
TrainingSupport check_training_support(const Device& device, int world_size, const std::string& optimizer) {
  TrainingSetup setup;
  setup.dtype = DType::f32;
  setup.optimizer = optimizer == "adam" ? TrainingOptimizer::adam : TrainingOptimizer::sgd;
  setup.world_size = world_size;
  TrainingSupport support;
  try {
    support = training_support(device, setup);
  } catch (const Error& e) {
    throw CommandError(kExitFailed, e.message());
  }
  if (!support.ok()) throw CommandError(kExitFailed, support.message);
  return support;
}

// "1.2 MiB", "0 bytes".
std::string moved_text(uint64_t bytes) { return bytes == 0 ? std::string("0 bytes") : format_bytes(bytes); }

// The end-of-run line on what ran on the backend's op_fallback device ("" when
// nothing fell back): pairs, calls, bytes moved, time, and the costliest pairs.
std::string fallback_report(const Backend& backend, const Device& device,
                            const std::vector<OpFallbackStats>& stats) {
  if (stats.empty()) return "";
  uint64_t calls = 0, bytes = 0;
  double seconds = 0;
  for (const OpFallbackStats& s : stats) {
    calls += s.calls;
    bytes += s.bytes_moved();
    seconds += s.seconds;
  }
  const OpFallback fallback = backend.op_fallback();
  const std::string host =
      fallback.kind == OpFallback::Kind::host ? fallback.host_backend + ":0" : "its fallback";
  char head[160];
  std::snprintf(head, sizeof head,
                ": %llu calls, %s moved, %.3f s (top: ", static_cast<unsigned long long>(calls),
                moved_text(bytes).c_str(), seconds);
  std::string line = "op_fallback: " + std::to_string(stats.size()) + " (op, dtype) pair" +
                     (stats.size() == 1 ? "" : "s") + " ran on " + host + " for " + device.id() + head;
  constexpr std::size_t kTop = 3;
  for (std::size_t i = 0; i < std::min(kTop, stats.size()); ++i) {
    char item[96];
    std::snprintf(item, sizeof item, "%s%s/%s %.3f s", i == 0 ? "" : ", ",
                  std::string(to_string(stats[i].op)).c_str(), std::string(to_string(stats[i].dtype)).c_str(),
                  stats[i].seconds);
    line += item;
  }
  if (stats.size() > kTop) line += ", ...";
  return line + ")";
}

std::pair<digits::Dataset, digits::Dataset> load_split(const TrainOptions& o, const fs::path& path) {
  auto [train, test] = digits::split(digits::load(path.string()), o.train_fraction, o.seed);
  if (train.rows() == 0 || test.rows() == 0)
    throw CommandError(kExitFailed, path.string() + ": " + std::to_string(train.rows() + test.rows()) +
                                        " rows are too few for a train/test split (need at least 2)");
  return {std::move(train), std::move(test)};
}

// Checks now that an output file can be written, so a bad path fails before
// training; the file itself is neither created nor truncated.
void check_writable(const std::string& path, const char* flag,
                    common::LinkPolicy links = common::LinkPolicy::follow_protected) {
  if (path.empty()) return;
  try {
    common::check_file_writable(path, links);
  } catch (const common::FileWriteError& e) {
    throw CommandError(kExitFailed, std::string(flag) + ": " + e.what());
  }
}

// Whether this process is rank 0 of its job (or not in a job at all): the
// one that writes the outputs.
bool is_lead_rank() {
  const std::optional<std::string> rank = Rendezvous::env_rank();
  return !rank || *rank == "0";
}

// Takes the checkpoint folder's lock (CheckpointFolderLock), as
// "--checkpoint-dir: ..." when another job holds it.
std::unique_ptr<CheckpointFolderLock> lock_checkpoint_dir(const std::string& dir) {
  try {
    return std::make_unique<CheckpointFolderLock>(dir);
  } catch (const Error& e) {
    throw CommandError(kExitFailed, "--checkpoint-dir: " + e.message());
  }
}

// Makes the checkpoint folder now and checks that a checkpoint can be
// written in it and that no other job trains in it, so a bad
// --checkpoint-dir fails before training.
void check_checkpoint_dir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CommandError(kExitFailed, "--checkpoint-dir: cannot make " + dir + ": " + ec.message());
  if (!fs::is_directory(dir, ec))
    throw CommandError(kExitFailed, "--checkpoint-dir: " + dir + " is not a folder");
  check_writable((fs::path(dir) / "step-0000000000.safetensors").string(), "--checkpoint-dir",
                 common::LinkPolicy::replace);
  lock_checkpoint_dir(dir);  // taken and let go: the lead rank holds it while it trains
}

// Every output a run writes, checked before it trains.
void check_outputs(const TrainOptions& o) {
  check_writable(o.metrics_out, "--metrics-out");
  check_writable(o.plot, "--plot");
  check_writable(o.save_model, "--save-model");
  check_writable(o.trace, "--trace");  // before any rank starts: one message, not one per rank
  check_checkpoint_dir(o.checkpoint_dir);
}

// Writes an output file whole or not at all (common::AtomicFileWriter): a
// failed write leaves no empty or partial file under its name.
void write_output(const std::string& path, const char* flag, std::string_view contents) {
  try {
    common::write_file_atomically(path, contents);
  } catch (const common::FileWriteError& e) {
    throw CommandError(kExitFailed, std::string(flag) + ": " + e.what());
  }
}

// What a checkpoint must share with the run that resumes from it: the model,
// the world size and every option that changes the numbers, and the data
// (the SHA-256 of the training split, so another file or split is refused).
RunIdentity run_identity(const TrainOptions& o, int world, const digits::Dataset& train) {
  common::Sha256Hasher hasher;
  hasher.update({reinterpret_cast<const uint8_t*>(train.x.data()), train.x.size() * sizeof(float)});
  hasher.update({reinterpret_cast<const uint8_t*>(train.y.data()), train.y.size() * sizeof(int64_t)});
  const std::optional<common::Sha256> data = hasher.finish();
  RunIdentity id;
  id["model"] = "MLP 64-128-10";
  id["world size"] = std::to_string(world);
  id["--batch-size"] = std::to_string(o.batch_size);
  id["--optimizer"] = o.optimizer;
  id["--lr"] = exact_text(o.lr);
  if (o.optimizer == "sgd") id["--momentum"] = exact_text(o.momentum);
  id["--seed"] = std::to_string(o.seed);
  id["training data"] = data ? "sha256:" + common::to_hex(*data) : std::string("unknown");
  return id;
}

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// Rank 0 locks the folder (into `folder_lock`) and chooses the checkpoint to resume from: the newest that
// reads back whole and matches its checksum (a damaged one is skipped with a warning naming it); one made for
// another run is refused. It tells the other ranks through the store, and each of them reads the same file.
std::optional<Checkpoint> agree_on_checkpoint(const TrainOptions& o, const Rendezvous& rdzv, bool distributed,
                                              const Device& device, const RunIdentity& identity,
                                              const CheckpointLayout& layout,
                                              std::unique_ptr<CheckpointFolderLock>& folder_lock) {
  constexpr const char* kKey = "train/checkpoint";
  const fs::path dir = o.checkpoint_dir;
  if (rdzv.rank() == 0) {
    std::optional<Checkpoint> found;
    try {
      // Rank 0 writes and prunes the checkpoints: it holds the folder while it trains.
      folder_lock = lock_checkpoint_dir(o.checkpoint_dir);
      if (const int removed = remove_interrupted_writes(dir); removed > 0)
        std::fprintf(stderr, "backplane train: removed %d unfinished checkpoint write%s in %s\n", removed,
                     removed == 1 ? "" : "s", dir.string().c_str());
      for (const auto& [step, file] : list_checkpoints(dir)) {
        std::optional<Checkpoint> c;
        try {
          c = load_checkpoint(file, device, layout);
        } catch (const Error& e) {
          // The message names the file first; the warning names it once.
          std::string why = e.message();
          if (const std::string named = file.string() + ": "; why.rfind(named, 0) == 0)
            why.erase(0, named.size());
          print_warning("skipping checkpoint " + file.string() + ": " + why);
          continue;
        }
        if (const std::string m = identity_mismatch(c->identity, identity); !m.empty())
          throw CommandError(kExitFailed,
                             "cannot resume from " + file.string() + ": it was made with " + m +
                                 "; train with the same options, or pass another --checkpoint-dir");
        found = std::move(c);
        break;
      }
    } catch (const std::exception& e) {
      // Whatever stops rank 0 here (a refused checkpoint, a file system
      // error, memory), the other ranks learn it now rather than at their
      // store timeout.
      if (distributed) rdzv.store()->set(kKey, bytes_of("!" + std::string(e.what())));
      throw;
    }
    if (distributed)
      rdzv.store()->set(kKey, bytes_of(found ? found->path.filename().string() : std::string()));
    return found;
  }
  const std::shared_ptr<Store> store = rdzv.store();
  const std::string chosen = text_of(store->get(kKey, store->timeout()));
  if (!chosen.empty() && chosen[0] == '!')
    throw CommandError(kExitFailed, "rank 0 cannot resume (it says why): " + chosen.substr(1));
  if (chosen.empty()) return std::nullopt;
  try {
    return load_checkpoint(dir / chosen, device, layout);
  } catch (const Error& e) {
    throw CommandError(kExitFailed, "rank " + std::to_string(rdzv.rank()) + " cannot read checkpoint " +
                                        chosen + ", which rank 0 chose: " + e.message() +
                                        "; every rank must see the same --checkpoint-dir (on several nodes, "
                                        "a shared file system)");
  }
}

// Every rank posts the SHA-256 of its model and optimizer state and checks
// that all agree, so training goes on only from one state everywhere.
void confirm_same_model(const Rendezvous& rdzv, const NamedTensors& model, const NamedTensors& optimizer,
                        const std::string& source) {
  const std::shared_ptr<Store> store = rdzv.store();
  const std::string prefix = "train/model_sha256/";
  store->set(prefix + std::to_string(rdzv.rank()), bytes_of(tensors_sha256({&model, &optimizer})));
  std::vector<std::string> keys;
  for (int r = 0; r < rdzv.world_size(); ++r) keys.push_back(prefix + std::to_string(r));
  store->wait(keys, store->timeout());
  std::vector<std::string> hashes;
  for (const std::string& key : keys) hashes.push_back(text_of(store->get(key, store->timeout())));
  std::string differ;
  for (std::size_t r = 1; r < hashes.size(); ++r)
    if (hashes[r] != hashes[0])
      differ += (differ.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " sha256 " +
                hashes[r].substr(0, 16);
  if (!differ.empty())
    throw CommandError(kExitFailed, "the ranks hold different models after " + source + ": rank 0 sha256 " +
                                        hashes[0].substr(0, 16) + ", " + differ +
                                        "; every rank must read the same --checkpoint-dir and --data, with "
                                        "the same backend and build");
}

// Every rank's partial loss sum of the running epoch, gathered on rank 0
// (exactly, as text) for a checkpoint taken mid-epoch; empty on the others.
std::vector<double> gather_loss_sums(const Rendezvous& rdzv, bool distributed, int64_t step, double mine) {
  if (!distributed) return {mine};
  const std::shared_ptr<Store> store = rdzv.store();
  const std::string prefix = "train/loss_sum/" + std::to_string(step) + "/";
  if (rdzv.rank() != 0) {
    store->set(prefix + std::to_string(rdzv.rank()), bytes_of(exact_text(mine)));
    return {};
  }
  std::vector<double> sums{mine};
  for (int r = 1; r < rdzv.world_size(); ++r) {
    const std::string key = prefix + std::to_string(r);
    const std::string text = text_of(store->get(key, store->timeout()));
    char* end = nullptr;
    const double sum = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size())
      throw CommandError(kExitFailed, "rank " + std::to_string(r) + " posted \"" + text +
                                          "\" as its loss sum (" + key +
                                          "), which is not a number: are all ranks the same backplane?");
    sums.push_back(sum);
    store->remove(key);
  }
  return sums;
}

NamedTensors model_tensors(const nn::Linear& l1, const nn::Linear& l2) {
  return {
      {"l1.weight", l1.weight()}, {"l1.bias", l1.bias()}, {"l2.weight", l2.weight()}, {"l2.bias", l2.bias()}};
}

// Every tensor a checkpoint of this run may hold: the model's, and the
// optimizer's state once every parameter has stepped (nn::SGD's and
// nn::Adam's state() names), so a checkpoint is checked against it before
// any tensor is read.
CheckpointLayout checkpoint_layout(const NamedTensors& model, const std::vector<Tensor>& params,
                                   const std::string& optimizer) {
  CheckpointLayout layout;
  for (const auto& [name, t] : model) layout.push_back({"model." + name, t.dtype(), t.shape(), true});
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string index = std::to_string(i);
    const Tensor& p = params[i];
    if (optimizer == "sgd") {
      layout.push_back({"optimizer.velocity." + index, p.dtype(), p.shape(), false});
    } else {
      layout.push_back({"optimizer.m." + index, p.dtype(), p.shape(), false});
      layout.push_back({"optimizer.v." + index, p.dtype(), p.shape(), false});
      layout.push_back({"optimizer.step." + index, DType::i64, Shape{1}, false});
    }
  }
  return layout;
}

// Ends the job's groups on every path out of a rank.
struct DistributedScope {
  DistributedScope(const Rendezvous& r, const GradSyncOptions& o) { init_distributed(r, o); }
  ~DistributedScope() { shutdown_distributed(); }
  DistributedScope(const DistributedScope&) = delete;
  DistributedScope& operator=(const DistributedScope&) = delete;
};

// The job's rendezvous from the environment the launcher or scheduler set.
// A malformed variable is a configuration error (exit 64): every start of
// the rank would fail the same way, so a launcher does not restart it.
Rendezvous rendezvous_from_env() {
  try {
    return Rendezvous::from_env();
  } catch (const Error& e) {
    if (e.code() != Errc::invalid_argument) throw;
    throw CommandError(kExitUsage, e.message());
  }
}

// One device per local rank, round robin (all on device 0 with one device).
Device rank_device(const Backend& backend, const Rendezvous& rdzv) {
  const std::size_t n_devices = backend.devices().size();
  return backend.device(static_cast<int32_t>(static_cast<std::size_t>(rdzv.local_rank()) % n_devices));
}

GradSyncOptions grad_sync_options(const TrainOptions& o) {
  GradSyncOptions sync;
  sync.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * 1024 * 1024);
  return sync;
}

// One rank's run of `train`, in its phases: the constructor sets up (the
// rendezvous, backend and device, the data, the model and optimizer);
// resume() starts from the newest valid checkpoint; train() runs the epochs
// and takes the checkpoints; report() prints the summary and writes the
// outputs; finish() waits for every rank. Each fact is a member, set once.
class TrainRun {
 public:
  explicit TrainRun(const TrainOptions& o)
      : o_(o),
        single_(!in_a_job()),
        rdzv_(single_ ? Rendezvous::single_process() : rendezvous_from_env()),
        rank_(rdzv_.rank()),
        world_(rdzv_.world_size()),
        lead_(rank_ == 0),
        distributed_(world_ > 1),
        config_(choose_config(o.config)),
        registry_(load_for_report(config_)),
        backend_(chosen_backend(registry_, o.backend, config_)),
        device_(rank_device(backend_, rdzv_)),
        support_(check_training_support(device_, world_, o.optimizer)),
        job_(rdzv_, grad_sync_options(o)),
        data_path_(find_data(o.data)),
        data_(load_split(o, data_path_)),
        l1_(device_, digits::kFeatures, 128, o.seed * 2 + 1),
        l2_(device_, 128, digits::kClasses, o.seed * 2 + 2),
        board_(ProgressReporter::from_env()),
        identity_(run_identity(o, world_, train_data())),
        tty_(lead_ && ::isatty(STDOUT_FILENO) != 0) {
    if (!single_ && o.nproc_given && o.nproc != world_ && lead_)
      print_warning("--nproc " + std::to_string(o.nproc) + " is ignored: this process is rank " +
                    std::to_string(rank_) + " of a job of " + std::to_string(world_) +
                    " started by a launcher");
    params_ = l1_.parameters();
    for (const Tensor& p : l2_.parameters()) params_.push_back(p);
    // The capability decides here: a device without 'collective' follows
    // its backend's collective_fallback (an error names the remedy). One
    // rank has nothing to synchronise: no parameter is registered, no group
    // is made, so it needs no collective at all.
    if (distributed_)
      for (std::size_t i = 0; i < params_.size(); ++i)
        set_distributed_params(params_[i], DistributedParamId{i});
    if (o.optimizer == "sgd")
      opt_ = std::make_unique<nn::SGD>(params_, o.lr, o.momentum);
    else
      opt_ = std::make_unique<nn::Adam>(params_, o.lr);  // --momentum does not apply
  }

  // Where training starts: the checkpoint every rank agrees on, or the beginning.
  void resume() {
    if (!o_.checkpoint_dir.empty()) {
      resumed_ = agree_on_checkpoint(o_, rdzv_, distributed_, device_, identity_,
                                     checkpoint_layout(model(), params_, o_.optimizer), folder_lock_);
      if (resumed_) load(*resumed_);
      if (distributed_)
        confirm_same_model(
            rdzv_, model(), opt_->state(),
            resumed_ ? "loading " + resumed_->path.filename().string() : std::string("initialisation"));
    }
    epoch_loss_ = start_.epoch_loss;
    step_loss_ = start_.step_loss;
    steps_ = start_.step;
    if (lead_) print_start();
  }

  void train() {
    reset_grad_sync_stats();
    if (distributed_) group_ = distributed_group(device_);
    for (int epoch = start_.completed_epochs + 1; epoch <= o_.epochs; ++epoch) train_epoch(epoch);
  }

  void report();

  void finish() {
    if (group_) group_->barrier();
  }

 private:
  const digits::Dataset& train_data() const { return data_.first; }
  const digits::Dataset& test_data() const { return data_.second; }
  NamedTensors model() const { return model_tensors(l1_, l2_); }
  Tensor forward(const Tensor& x) const { return l2_(relu(l1_(x))); }
  bool checkpointing() const { return !o_.checkpoint_dir.empty(); }

  void load(const Checkpoint& c) {
    NoGradGuard no_grad;
    std::map<std::string, Tensor> saved(c.model.begin(), c.model.end());
    try {
      for (const auto& [name, p] : model()) {
        const auto it = saved.find(name);
        if (it == saved.end())
          throw CommandError(kExitFailed, c.path.string() + ": the model has no tensor " + name);
        p.copy_(it->second);
      }
      opt_->load_state(c.optimizer);
    } catch (const Error& e) {
      throw CommandError(kExitFailed, "cannot resume from " + c.path.string() + ": " + e.message() +
                                          "; remove that file to resume from an older checkpoint, or pass "
                                          "another --checkpoint-dir");
    }
    start_ = c.position;
    if (!start_.loss_sums.empty() && start_.loss_sums.size() != static_cast<std::size_t>(world_))
      throw CommandError(kExitFailed, c.path.string() + ": it holds the loss sums of " +
                                          std::to_string(start_.loss_sums.size()) + " ranks, this job has " +
                                          std::to_string(world_));
    board_.checkpoint(start_.step);
  }

  void print_start() const {
    std::printf(
        "backplane train: MLP 64-128-10 on %s (%lld train / %lld test rows), %d rank%s on %s, batch %d "
        "per rank, %s lr %g, %d epochs, seed %llu\n",
        data_path_.string().c_str(), static_cast<long long>(train_data().rows()),
        static_cast<long long>(test_data().rows()), world_, world_ == 1 ? "" : "s", device_.id().c_str(),
        o_.batch_size, o_.optimizer.c_str(), o_.lr, o_.epochs, static_cast<unsigned long long>(o_.seed));
    if (resumed_)
      std::printf(
          "resuming from %s: step %lld, epoch %d%s\n", resumed_->path.string().c_str(),
          static_cast<long long>(start_.step), start_.completed_epochs + (start_.epoch_step > 0 ? 1 : 0),
          start_.epoch_step > 0 ? (" (" + std::to_string(start_.epoch_step) + " of its steps done)").c_str()
                                : " done");
    if (support_.falls_back()) std::printf("%s\n", support_.fallback_summary().c_str());
    std::fflush(stdout);
  }

  void train_epoch(int epoch);

  // Rank 0 writes a checkpoint of where the run stands; the other ranks send
  // it their partial loss sums first when it is taken mid-epoch.
  void checkpoint(int32_t completed_epochs, int64_t epoch_step, double loss_sum) {
    const trace::Range span("checkpoint");
    const auto t0 = Clock::now();
    TrainPosition at;
    at.step = steps_;
    at.completed_epochs = completed_epochs;
    at.epoch_step = epoch_step;
    if (epoch_step > 0) at.loss_sums = gather_loss_sums(rdzv_, distributed_, steps_, loss_sum);
    if (!lead_) return;
    at.epoch_loss = epoch_loss_;
    at.step_loss = step_loss_;
    std::vector<std::string> command{"backplane", "train"};
    command.insert(command.end(), o_.raw_args.begin(), o_.raw_args.end());
    try {
      save_checkpoint(o_.checkpoint_dir, at, identity_, command, model(), opt_->state(), o_.keep);
    } catch (const Error& e) {
      throw CommandError(kExitFailed, "cannot write a checkpoint: " + e.message());
    }
    board_.checkpoint(steps_);
    ++checkpoints_;
    checkpoint_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  void write_metrics(double test_accuracy, double per_step, double sync_fraction,
                     const std::vector<OpFallbackStats>& fallbacks) const;
  void write_plot() const;

  // Set up once.
  const TrainOptions& o_;
  const bool single_;
  Rendezvous rdzv_;
  const int rank_;
  const int world_;
  const bool lead_;
  const bool distributed_;
  const fs::path config_;
  Registry registry_;
  Backend backend_;
  Device device_;
  const TrainingSupport support_;
  DistributedScope job_;  // the job's groups end with the run, after what is declared below
  const fs::path data_path_;
  const std::pair<digits::Dataset, digits::Dataset> data_;  // train, test
  nn::Linear l1_;
  nn::Linear l2_;
  std::vector<Tensor> params_;
  std::unique_ptr<nn::Optimizer> opt_;
  ProgressReporter board_;
  const RunIdentity identity_;
  const bool tty_;
  // Set by resume().
  TrainPosition start_;
  std::optional<Checkpoint> resumed_;
  std::unique_ptr<CheckpointFolderLock> folder_lock_;  // rank 0's, while it trains
  // Where the run stands.
  std::vector<double> epoch_loss_, step_loss_;
  int64_t steps_ = 0;        // over every run of this job
  int64_t timed_steps_ = 0;  // this run's
  double train_seconds_ = 0;
  int checkpoints_ = 0;
  double checkpoint_seconds_ = 0;
  std::optional<ProcessGroup> group_;
};

void TrainRun::train_epoch(int epoch) {
  const std::vector<int64_t> rows = shard(train_data().rows(), rank_, world_, o_.seed, epoch);
  const std::size_t n_steps = (rows.size() + o_.batch_size - 1) / static_cast<std::size_t>(o_.batch_size);
  // A resumed epoch goes on from its checkpoint's step and loss sum.
  const bool resuming = epoch == start_.completed_epochs + 1 && start_.epoch_step > 0;
  if (resuming &&
      (static_cast<std::size_t>(start_.epoch_step) >= n_steps ||
       start_.step !=
           static_cast<int64_t>(start_.completed_epochs) * static_cast<int64_t>(n_steps) + start_.epoch_step))
    throw CommandError(kExitFailed,
                       resumed_->path.string() + ": its position (step " + std::to_string(start_.step) +
                           ", step " + std::to_string(start_.epoch_step) + " of epoch " +
                           std::to_string(epoch) + ") does not fit this run's " + std::to_string(n_steps) +
                           " steps per epoch: the file is damaged; remove it to resume from an "
                           "older one");
  const std::size_t first = resuming ? static_cast<std::size_t>(start_.epoch_step) : 0;
  double loss_sum =
      resuming && !start_.loss_sums.empty() ? start_.loss_sums[static_cast<std::size_t>(rank_)] : 0;
  const auto t_epoch = Clock::now();
  for (std::size_t s = first; s < n_steps; ++s) {
    const trace::Range step_span("step");  // what `backplane trace summary` times steps by
    const std::size_t b = s * static_cast<std::size_t>(o_.batch_size);
    const auto t0 = Clock::now();
    Batch batch = make_batch(device_, train_data(), rows, b, std::min(rows.size(), b + o_.batch_size));
    Tensor loss = nn::cross_entropy(forward(batch.x), batch.y);
    Gradients grads = loss.backward();
    opt_->step(grads);
    float loss_value = 0;  // read back into a local, every step: no vector
    loss.read_into(DType::f32, &loss_value, 1);
    const double l = loss_value;
    train_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    ++steps_;
    ++timed_steps_;
    board_.step(steps_);
    loss_sum += l;
    step_loss_.push_back(l);
    const double elapsed = std::chrono::duration<double>(Clock::now() - t_epoch).count();
    if (tty_ && (s % 4 == 0 || s + 1 == n_steps))
      progress(true, epoch, o_.epochs, s + 1, n_steps, loss_sum / static_cast<double>(s + 1),
               static_cast<double>(std::min(rows.size(), (s + 1) * o_.batch_size) * world_) /
                   std::max(elapsed, 1e-9),
               false);
    // Mid-epoch checkpoints; one that falls on the epoch's last step is
    // taken after the epoch's loss below.
    if (checkpointing() && o_.checkpoint_every > 0 && steps_ % o_.checkpoint_every == 0 && s + 1 < n_steps)
      checkpoint(epoch - 1, static_cast<int64_t>(s + 1), loss_sum);
  }
  // The epoch's loss over every rank's shard.
  const float local_loss = static_cast<float>(loss_sum / static_cast<double>(n_steps));
  if (group_) {
    Tensor mean_loss =
        group_->all_reduce(Tensor::from_vector<float>(device_, {1}, {local_loss}), ReduceOp::mean);
    epoch_loss_.push_back(mean_loss.to_vector<float>()[0]);
  } else {
    epoch_loss_.push_back(local_loss);
  }
  if (lead_ && !std::isfinite(epoch_loss_.back()) &&
      std::all_of(epoch_loss_.begin(), epoch_loss_.end() - 1, [](double v) { return std::isfinite(v); }))
    print_warning("the loss is " + exact_text(epoch_loss_.back()) + " after epoch " + std::to_string(epoch) +
                  ": training diverged, and the model it ends with is not usable; lower --lr (" +
                  format_number(o_.lr) +
                  " now), or check the data (--metrics-out records \"diverged_at_epoch\")");
  const double elapsed = std::chrono::duration<double>(Clock::now() - t_epoch).count();
  if (lead_)
    progress(tty_, epoch, o_.epochs, n_steps, n_steps, epoch_loss_.back(),
             static_cast<double>((rows.size() - first * static_cast<std::size_t>(o_.batch_size)) * world_) /
                 std::max(elapsed, 1e-9),
             true);
  if (checkpointing() &&
      (o_.checkpoint_every == 0 || steps_ % o_.checkpoint_every == 0 || epoch == o_.epochs))
    checkpoint(epoch, 0, 0);
}

void TrainRun::report() {
  const GradSyncStats stats = grad_sync_stats();
  double test_accuracy = 0;
  {
    NoGradGuard no_grad;
    const digits::Dataset& test = test_data();
    const Tensor x = Tensor::from_vector<float>(device_, {test.rows(), digits::kFeatures}, test.x);
    test_accuracy = nn::accuracy(forward(x), Tensor::from_vector<int64_t>(device_, {test.rows()}, test.y));
  }
  // This run's steps only: a resumed run times what it trained itself.
  const double per_step = timed_steps_ > 0 ? train_seconds_ / static_cast<double>(timed_steps_) : 0.0;
  const double steps_per_second = per_step > 0 ? 1.0 / per_step : 0.0;
  const double sync_fraction = train_seconds_ > 0 ? stats.seconds / train_seconds_ : 0;
  // Most time first (Backend::op_fallback_stats), this rank's counts.
  const std::vector<OpFallbackStats> fallbacks = backend_.op_fallback_stats();
  if (!lead_) return;
  std::printf(
      "test accuracy %.4f | %lld steps | %.1f steps/s | %.3f ms/step | all_reduce %.0f%% of step time "
      "(%lld collectives, %.1f KiB each)\n",
      test_accuracy, static_cast<long long>(steps_), steps_per_second, per_step * 1e3, sync_fraction * 100,
      static_cast<long long>(stats.collectives),
      stats.collectives > 0 ? static_cast<double>(stats.bytes) / stats.collectives / 1024 : 0.0);
  if (const std::string line = fallback_report(backend_, device_, fallbacks); !line.empty())
    std::printf("%s\n", line.c_str());
  if (checkpoints_ > 0)
    std::printf("checkpoints: %d written to %s (%.1f ms each, not in ms/step), the newest %d kept\n",
                checkpoints_, o_.checkpoint_dir.c_str(), checkpoint_seconds_ * 1e3 / checkpoints_, o_.keep);
  std::fflush(stdout);
  if (!o_.save_model.empty()) {
    try {
      save_safetensors(o_.save_model, model(),
                       {{"backplane.model", "MLP 64-128-10"}, {"step", std::to_string(steps_)}});
    } catch (const Error& e) {
      throw CommandError(kExitFailed, "--save-model: " + e.message());
    }
  }
  if (!o_.metrics_out.empty()) write_metrics(test_accuracy, per_step, sync_fraction, fallbacks);
  if (!o_.plot.empty()) write_plot();
}

void TrainRun::write_metrics(double test_accuracy, double per_step, double sync_fraction,
                             const std::vector<OpFallbackStats>& fallbacks) const {
  // In this order; op_fallbacks by time, most first.
  nlohmann::ordered_json by_time = nlohmann::ordered_json::object();
  for (const OpFallbackStats& f : fallbacks)
    by_time[std::string(to_string(f.op)) + "/" + std::string(to_string(f.dtype))] = {
        {"calls", f.calls}, {"bytes_moved", f.bytes_moved()}, {"seconds", f.seconds}};
  // The first epoch (1-based) whose loss is nan or infinite; null when none.
  const auto bad =
      std::find_if(epoch_loss_.begin(), epoch_loss_.end(), [](double v) { return !std::isfinite(v); });
  const nlohmann::ordered_json diverged =
      bad == epoch_loss_.end() ? nlohmann::ordered_json(nullptr)
                               : nlohmann::ordered_json(static_cast<int64_t>(bad - epoch_loss_.begin()) + 1);
  nlohmann::ordered_json m{{"test_accuracy", test_accuracy},
                           {"diverged_at_epoch", diverged},
                           {"steps", steps_},
                           {"seconds_per_step", per_step},
                           {"steps_per_second", per_step > 0 ? 1.0 / per_step : 0.0},
                           {"resumed_from_step", resumed_ ? resumed_->position.step : int64_t{0}},
                           {"allreduce_fraction", sync_fraction},
                           {"epochs", o_.epochs},
                           {"nproc", world_},
                           {"batch_size_per_rank", o_.batch_size},
                           {"optimizer", o_.optimizer},
                           {"lr", o_.lr},
                           {"momentum", o_.optimizer == "sgd" ? o_.momentum : 0.0},
                           {"bucket_mb", o_.bucket_mb},
                           {"seed", o_.seed},
                           {"backend", backend_.name()},
                           {"device", device_.id()},
                           {"epoch_loss", epoch_loss_},
                           {"op_fallbacks", by_time}};
  write_output(o_.metrics_out, "--metrics-out", m.dump(2) + "\n");
}

void TrainRun::write_plot() const {
  // Step k of epoch e (1-based) sits at e - 1 + k / steps: the epoch spans
  // (e - 1, e], so its mean belongs at its middle, e - 0.5.
  std::vector<double> ex(epoch_loss_.size()), sx(step_loss_.size());
  for (std::size_t i = 0; i < ex.size(); ++i) ex[i] = static_cast<double>(i) + 0.5;
  const double steps_per_epoch = static_cast<double>(step_loss_.size()) / std::max(1, o_.epochs);
  for (std::size_t i = 0; i < sx.size(); ++i) sx[i] = static_cast<double>(i + 1) / steps_per_epoch;
  ChartOptions chart;
  chart.title = "backplane train: MLP 64-128-10 on digits, world size " + std::to_string(world_) + ", " +
                o_.optimizer + " lr " + format_number(o_.lr) + ", batch " + std::to_string(o_.batch_size) +
                " per rank";
  chart.x_label = "epoch";
  chart.y_label = "cross-entropy loss";
  chart.log_y = o_.plot_scale == "log";
  const std::string svg = svg_line_chart(
      chart, {Series{"rank 0 step loss", sx, step_loss_, "#9ecae1"},
              Series{"epoch mean over ranks (at mid-epoch)", ex, epoch_loss_, "#d62728", /*markers=*/true}});
  write_output(o_.plot, "--plot", svg);
}

int train_rank(const TrainOptions& o) {
  TrainRun run(o);
  run.resume();
  run.train();
  run.report();
  run.finish();
  return kExitOk;
}

int run_train(TrainOptions o) {
  if (o.optimizer != "sgd" && o.optimizer != "adam")
    throw CommandError(kExitUsage, "--optimizer must be sgd or adam, got " + o.optimizer);
  std::string ext = fs::path(o.plot).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (!o.plot.empty() && ext != ".svg")
    throw CommandError(kExitUsage, "--plot writes SVG: name the file *.svg (got " + o.plot + ")");
  if (o.lr == 0) o.lr = o.optimizer == "adam" ? 1e-3 : 0.1;
  if (o.checkpoint_dir.empty() && (o.checkpoint_every > 0 || o.keep_given))
    throw CommandError(kExitUsage, std::string(o.checkpoint_every > 0 ? "--checkpoint-every" : "--keep") +
                                       " needs --checkpoint-dir, the folder the checkpoints go to");
  // --trace is BACKPLANE_TRACE for this process, its ranks, and the core
  // (which starts recording with the first registry).
  set_trace_environment(o.trace, o.trace_max_events);
  // Under a launcher (or Slurm), each rank is one process: restarts are the
  // launcher's (or the scheduler's) to make.
  if (in_a_job() && o.max_restarts > 0 && is_lead_rank())
    print_warning(
        "--max-restarts is ignored: this process is a rank of a job started by a launcher or "
        "scheduler, which restarts it (backplane launch --max-restarts, sbatch --requeue)");
  if (in_a_job() || (o.nproc == 1 && o.max_restarts == 0)) {
    if (is_lead_rank()) check_outputs(o);
    return train_rank(o);
  }

  // The ranks record; this process merges their parts when they have ended.
  const std::string trace = take_trace_from_env();
  // Everything that can be checked once is checked here, before any rank
  // starts: a bad config, backend, data file or output path fails once.
  {
    try {
      Rendezvous::timeout_from_env();  // the one rendezvous variable the ranks inherit rather than get
    } catch (const Error& e) {
      throw CommandError(kExitUsage, e.message());
    }
    const fs::path config = choose_config(o.config);
    Registry registry = load_for_report(config);
    const Backend backend = chosen_backend(registry, o.backend, config);
    for (const Device& device : backend.devices()) check_training_support(device, o.nproc, o.optimizer);
    load_split(o, find_data(o.data));
    check_outputs(o);
    if (o.max_restarts > 0 && o.checkpoint_dir.empty())
      print_warning(
          "--max-restarts without --checkpoint-dir: a restarted job trains again from the first step");
  }

  // Start the ranks: this program again, with the same arguments, under the
  // launcher. One OpenMP/BLAS thread per core share, as torchrun does.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads = std::to_string(std::max(1u, cores / static_cast<unsigned>(o.nproc)));
  for (const char* v : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    if (std::getenv(v) == nullptr) ::setenv(v, threads.c_str(), 1);
  LaunchSpec spec;
  spec.program = fs::canonical("/proc/self/exe").string();
  spec.argv = {spec.program, "train"};
  spec.argv.insert(spec.argv.end(), o.raw_args.begin(), o.raw_args.end());
  spec.nproc = o.nproc;
  spec.master_addr = "127.0.0.1";
  spec.master_port = 0;  // a free one, chosen afresh for each start
  spec.rank0_passthrough = true;
  spec.max_restarts = o.max_restarts;
  spec.restart_delay = std::chrono::milliseconds(std::llround(o.restart_delay * 1000.0));
  spec.trace = trace;
  return run_ranks(spec);
}

}  // namespace

Command add_train_command(CLI::App& parent) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* app = parent.add_subcommand(
      "train", "Train an MLP (64-128-10) on the digits data with data-parallel ranks (the main job)");
  app->add_option("--nproc", o->nproc, "Ranks, started through the launcher (default 2)")
      ->check(CLI::Range(1, 256));
  app->add_option("--epochs", o->epochs, "Epochs (default 20)")->check(CLI::Range(1, 100000));
  app->add_option("--batch-size", o->batch_size, "Rows per rank per step (default 32)")
      ->check(CLI::Range(1, 1 << 20));
  app->add_option("--lr", o->lr, "Learning rate (default 0.1 for sgd, 0.001 for adam)")
      ->check(CLI::Range(1e-12, 1e6));
  app->add_option("--momentum", o->momentum, "SGD momentum (default 0.9)")->check(CLI::Range(0.0, 1.0));
  app->add_option("--optimizer", o->optimizer, "sgd (default) or adam");
  app->add_option("--seed", o->seed, "Seed of the split, the shuffles and the initialisation (default 0)");
  app->add_option("--backend", o->backend, "Backend to train on (default: the config's default_backend)");
  app->add_option("--config", o->config, "backends.json to use");
  app->add_option("--data", o->data,
                  "The digits CSV (default: digits.csv.gz in share/backplane beside this program)");
  app->add_option("--metrics-out", o->metrics_out, "Write a JSON summary here");
  app->add_option("--plot", o->plot, "Write the loss curve here (SVG)");
  app->add_option("--plot-scale", o->plot_scale, "The plot's loss axis: log (default) or linear")
      ->check(CLI::IsMember({"log", "linear"}));
  app->add_option("--bucket-mb", o->bucket_mb, "Gradient bucket size in MiB (default 25)")
      ->check(CLI::Range(1.0 / 1024, 1024.0 * 1024));
  app->add_option("--checkpoint-dir", o->checkpoint_dir,
                  "Save checkpoints in this folder and resume from the newest valid one in it")
      ->check(
          [](const std::string& v) {
            // An empty value is a script's unset variable, not "no checkpoints".
            return v.empty() ? std::string(
                                   "is empty (an unset variable in a script?); omit the option to "
                                   "train without checkpoints")
                             : std::string();
          },
          "FOLDER");
  app->add_option("--checkpoint-every", o->checkpoint_every,
                  "Steps between checkpoints (default: one at the end of every epoch)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app->add_option("--keep", o->keep, "Checkpoints kept, the newest (default 2)")
      ->check(CLI::Range(1, 1000000));
  app->add_option("--save-model", o->save_model, "Write the trained model's weights here (safetensors)");
  add_trace_options(*app, o->trace, o->trace_max_events);
  app->add_option("--max-restarts", o->max_restarts,
                  "With --nproc: when a rank fails, start every rank again, at most K times (default 0)")
      ->check(CLI::Range(0, 1000));
  app->add_option("--restart-delay", o->restart_delay,
                  "With --max-restarts: seconds before the first restart; each further one waits twice as "
                  "long, up to 60 s (default 1)")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 86400.0));
  Command c;
  c.app = app;
  c.run = [o, app] {
    o->nproc_given = app->get_option("--nproc")->count() > 0;
    o->keep_given = app->get_option("--keep")->count() > 0;
    // The ranks get exactly the options this process was given.
    for (const CLI::Option* opt : app->get_options()) {
      if (opt->get_name() == "--help" || opt->get_name() == "--nproc" ||
          opt->get_name() == "--max-restarts" || opt->count() == 0)
        continue;
      for (const std::string& v : opt->results()) {
        o->raw_args.push_back(opt->get_name());
        o->raw_args.push_back(v);
      }
    }
    try {
      return run_train(*o);
    } catch (const CommandError&) {
      throw;
    } catch (const std::runtime_error& e) {  // e.g. a malformed data file
      throw CommandError(kExitFailed, e.what());
    }
  };
  return c;
}

}  // namespace backplane::cli
