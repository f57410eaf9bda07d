// `backplane train` against PyTorch DDP (gloo) on the same job, in the same
// run: MLP 64-128-10 on the digits data, SGD lr 0.1 momentum 0.9, batch 32
// per rank, 20 epochs, an 80/20 split.
//
//   bench_train [epochs] [repeats]        (default 20 and 3)
//
// Prints test accuracy and time per step for backplane at 1 and 2 ranks and
// for PyTorch DDP at 2 ranks (skipped with a note when python3-torch is
// missing), the ratio of the 2-rank step times, and the share of backplane's
// step time spent in the gradient all-reduce. Each job runs `repeats` times,
// the contenders alternating (backplane then PyTorch, then the other way
// round), so that a change in the machine's load falls on both; the figures
// are medians over the repeats, the ratio the median of each repeat's.
//
// What ms/step includes, on both sides: one training step per rank, from
// making the batch (backplane: gathering its rows and from_vector; PyTorch:
// indexing the data tensor) through forward, backward with the gradient
// all-reduce, the optimizer step, to the loss read back on the host
// (to_vector / loss.item()); averaged over every step of the run on rank 0.
// It excludes start-up, loading the data, the per-epoch loss all-reduce and
// the evaluation. backplane's figure is `backplane train`'s own: the
// seconds_per_step of its --metrics-out, which its last line prints as
// ms/step (this program checks that the two agree).
#include "bench_util.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <vector>

namespace {

namespace fs = std::filesystem;

const char* kTorchScript = R"(import gzip, os, sys, time
import numpy as np, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
data = np.loadtxt(gzip.open(sys.argv[1], "rt"), delimiter=",", dtype=np.int64)
x = torch.tensor(data[:, :64], dtype=torch.float32) / 16.0
y = torch.tensor(data[:, 64])
g = torch.Generator().manual_seed(0)
perm = torch.randperm(len(y), generator=g)
n_train = int(0.8 * len(y) + 0.5)
tr, te = perm[:n_train], perm[n_train:]
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
epochs = int(sys.argv[2])
steps, seconds = 0, 0.0
for epoch in range(epochs):
    order = tr[torch.randperm(len(tr), generator=torch.Generator().manual_seed(epoch))]
    total = (len(order) + world - 1) // world * world
    order = torch.cat([order, order[: total - len(order)]])
    mine = order[rank:total:world]
    for b in range(0, len(mine), 32):
        idx = mine[b:b + 32]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        loss.item()
        seconds += time.perf_counter() - t0
        steps += 1
with torch.no_grad():
    acc = (model(x[te]).argmax(1) == y[te]).float().mean().item()
if rank == 0:
    print("RESULT ms_per_step %f accuracy %f steps %d" % (seconds / steps * 1e3, acc, steps), flush=True)
dist.destroy_process_group()
)";

using bench::run_command;

struct Figures {
  bool ok = false;
  double ms_per_step = 0, accuracy = 0, allreduce_fraction = -1;
  long steps = 0;
};

// The ms/step of `backplane train`'s last line ("... | 0.297 ms/step | ..."), or -1.
double printed_ms_per_step(const std::string& out) {
  const auto at = out.rfind(" ms/step");
  if (at == std::string::npos) return -1;
  const auto bar = out.rfind("| ", at);
  return bar == std::string::npos ? -1 : std::atof(out.c_str() + bar + 2);
}

std::string train_command(const fs::path& config, int nproc, int epochs, const fs::path& metrics) {
  return std::string(BP_BENCH_CLI) + " train --nproc " + std::to_string(nproc) + " --epochs " +
         std::to_string(epochs) + " --config " + config.string() + " --data " + BP_BENCH_DATA +
         " --metrics-out " + metrics.string();
}

Figures backplane_train(const fs::path& config, int nproc, int epochs, const fs::path& dir) {
  const fs::path metrics = dir / ("metrics_" + std::to_string(nproc) + ".json");
  fs::remove(metrics);
  const std::string out = run_command(train_command(config, nproc, epochs, metrics));
  Figures f;
  std::ifstream in(metrics);
  if (!in) {
    std::cerr << "bench_train: backplane train --nproc " << nproc << " failed:\n" << out;
    return f;
  }
  const nlohmann::json m = nlohmann::json::parse(in);
  f.ok = true;
  f.ms_per_step = m["seconds_per_step"].get<double>() * 1e3;
  f.accuracy = m["test_accuracy"].get<double>();
  f.allreduce_fraction = m["allreduce_fraction"].get<double>();
  f.steps = m["steps"].get<long>();
  // The same figure, printed with 3 decimals.
  const double printed = printed_ms_per_step(out);
  if (std::abs(printed - f.ms_per_step) > 0.0005 + 1e-9)
    std::cerr << "bench_train: backplane train printed " << printed << " ms/step but wrote " << f.ms_per_step
              << " to --metrics-out\n";
  return f;
}

Figures torch_ddp(int epochs, const fs::path& dir) {
  const fs::path script = dir / "ddp.py";
  { std::ofstream(script) << kTorchScript; }
  const std::string out =
      run_command(std::string("OMP_NUM_THREADS=1 ") + BP_BENCH_CLI + " launch -n 2 -- /usr/bin/python3 " +
                  script.string() + " " + BP_BENCH_DATA + " " + std::to_string(epochs));
  Figures f;
  const auto at = out.find("RESULT ");
  if (at == std::string::npos) {
    std::cerr << "bench_train: PyTorch DDP gave no result (python3-torch missing?):\n" << out.substr(0, 2000);
    return f;
  }
  std::istringstream s(out.substr(at + 7));
  std::string key;
  double v = 0;
  while (s >> key >> v) {
    if (key == "ms_per_step")
      f.ms_per_step = v;
    else if (key == "accuracy")
      f.accuracy = v;
    else if (key == "steps")
      f.steps = static_cast<long>(v);
  }
  f.ok = f.ms_per_step > 0;
  return f;
}

// The medians of a contender's repeats (accuracy and steps are the same in every run).
struct Summary {
  std::vector<Figures> runs;
  bool ok() const {
    return !runs.empty() && std::all_of(runs.begin(), runs.end(), [](const Figures& f) { return f.ok; });
  }
  double ms() const { return median_of(&Figures::ms_per_step); }
  double lo() const { return extreme(false); }
  double hi() const { return extreme(true); }
  double median_of(double Figures::*field) const {
    std::vector<double> v;
    for (const Figures& f : runs) v.push_back(f.*field);
    return bench::median(v);
  }
  double extreme(bool max) const {
    double x = runs.front().ms_per_step;
    for (const Figures& f : runs) x = max ? std::max(x, f.ms_per_step) : std::min(x, f.ms_per_step);
    return x;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int epochs = argc >= 2 ? std::max(1, std::atoi(argv[1])) : 20;
  const int repeats = argc >= 3 ? std::max(1, std::atoi(argv[2])) : 3;
  const fs::path dir = fs::temp_directory_path() / ("bp_bench_train_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path config = dir / "backends.json";
  std::ofstream(config)
      << R"({"schema_version": 1, "plugin_dirs": [")" << BP_BENCH_PLUGIN_DIR
      << R"("], "backends": [{"name": "cpu", "library": "backplane_cpu", "required": true}]})";

  std::cout << "MLP 64-128-10 on digits, SGD lr 0.1 momentum 0.9, batch 32 per rank, " << epochs
            << " epochs, 80/20 split; " << repeats << " repeat" << (repeats == 1 ? "" : "s")
            << ", backplane and PyTorch alternating\n"
            << "backplane: " << train_command(config, 2, epochs, dir / "metrics_2.json")
            << " (and --nproc 1; the config holds the cpu backend alone)\n";
  Summary one, two, torch;
  std::vector<double> ratios;
  bool have_torch = true;
  for (int r = 0; r < repeats; ++r) {
    const bool torch_first = r % 2 == 1;
    if (torch_first && have_torch) torch.runs.push_back(torch_ddp(epochs, dir));
    two.runs.push_back(backplane_train(config, 2, epochs, dir));
    one.runs.push_back(backplane_train(config, 1, epochs, dir));
    if (!torch_first && have_torch) torch.runs.push_back(torch_ddp(epochs, dir));
    have_torch = have_torch && torch.runs.back().ok;
    if (have_torch && two.runs.back().ok)
      ratios.push_back(two.runs.back().ms_per_step / torch.runs.back().ms_per_step);
  }
  fs::remove_all(dir);
  if (!one.ok() || !two.ok()) return 1;

  std::printf("%-30s %8s %10s %17s %10s %9s %s\n", "", "steps", "ms/step", "(range)", "steps/s", "accuracy",
              "all_reduce share");
  auto row = [](const char* name, const Summary& s) {
    const Figures& f = s.runs.front();
    const double ms = s.ms();
    std::printf("%-30s %8ld %10.3f %8.3f-%-8.3f %10.0f %9.4f", name, f.steps, ms, s.lo(), s.hi(), 1e3 / ms,
                f.accuracy);
    if (f.allreduce_fraction >= 0) std::printf(" %5.0f%%", s.median_of(&Figures::allreduce_fraction) * 100);
    std::printf("\n");
  };
  row("backplane train, 1 rank", one);
  row("backplane train, 2 ranks", two);
  if (have_torch) {
    row("PyTorch DDP gloo, 2 ranks", torch);
    std::vector<double> sorted = ratios;
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "ratio ms/step backplane / PyTorch DDP (2 ranks): %.3f (median of the repeats' ratios, %.3f-%.3f; "
        "target <= 0.333)\n",
        bench::median(ratios), sorted.front(), sorted.back());
  } else {
    std::printf("PyTorch DDP: n/a (python3-torch not available)\n");
  }
  std::printf(
      "ms/step: per step on rank 0, from making the batch to the loss read back (forward, backward with the\n"
      "gradient all-reduce, optimizer step); not start-up, data loading, the per-epoch loss all-reduce or\n"
      "evaluation. backplane's is `backplane train`'s own figure (--metrics-out seconds_per_step).\n");
  return 0;
}
