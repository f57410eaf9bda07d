// all_reduce across 2 ranks on one host: backplane's cpu plugin over shared
// memory (its default there) and over Gloo's TCP, against PyTorch's gloo
// process group and the loopback TCP floor, all in the same run.
//
//   bench_collectives [iterations] [ranks]     (default 15, 2)
//
// Runs `backplane launch -n 2` three times: twice on this program in worker
// mode (shared memory, then TCP), once on a PyTorch script (skipped with a
// note when python3-torch is missing). The floor is the time to move the buffer both ways at once over
// one loopback TCP connection: a 2-rank ring all_reduce moves exactly that
// much per rank (half in reduce-scatter, half in all-gather).
//
// With more ranks it compares the two shared-memory layouts and Gloo's TCP
// on that group: the default (a ring per pair up to 16 ranks, an inbox per
// rank above), the other layout forced through "shared_memory_pair_rings"
// (pairs for up to 32 ranks, inboxes for any), and TCP.
#include "bench_util.hpp"

#include <backplane/backplane.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

namespace {

namespace fs = std::filesystem;
constexpr int64_t kLargeElems = 16 * 1024 * 1024;  // 64 MiB of f32
constexpr int64_t kSmallElems = 1024;              // 4 KiB of f32

// ---- worker: one rank -------------------------------------------------------

// `transport`: "shm" (the defaults: shared memory for ranks on one host,
// hierarchical across hosts), "tcp" (Gloo only), "flat" (shared memory on
// one host, but across hosts Gloo only: "hierarchical" off), "pairs" or
// "inboxes" (that shared-memory layout whatever the group's size). Any number of
// ranks; tests/integration/netns/run_netns_hosts.sh --phase bench runs it on
// two hosts of two.
int worker(int iters, const std::string& transport) {
  using namespace backplane;
  const std::string config =
      std::string(R"({"schema_version": 1, "plugin_dirs": [")") + BP_BENCH_PLUGIN_DIR +
      R"("], "backends": [{"name": "cpu", "library": "backplane_cpu", "required": true, "options": )" +
      (transport == "tcp"       ? R"({"shared_memory": false})"
       : transport == "flat"    ? R"({"hierarchical": false})"
       : transport == "pairs"   ? R"({"shared_memory_pair_rings": 32})"
       : transport == "inboxes" ? R"({"shared_memory_pair_rings": 0})"
                                : "{}") +
      "}]}";
  Registry reg = Registry::from_json(config, fs::current_path(), "bench_collectives");
  Rendezvous rdzv = Rendezvous::from_env();
  ProcessGroup pg = ProcessGroup::create(reg.backend("cpu").device(0), rdzv);
  Device d = pg.device();

  Tensor big = randn(d, {kLargeElems}, 1 + static_cast<uint64_t>(pg.rank()));
  std::vector<double> large_ms;
  for (int i = 0; i < iters + 2; ++i) {
    pg.barrier();
    const double t0 = bench::now_ns();
    pg.all_reduce_(big, ReduceOp::sum);
    if (i >= 2) large_ms.push_back((bench::now_ns() - t0) / 1e6);
  }

  Tensor small = randn(d, {kSmallElems}, 7);
  for (int i = 0; i < 50; ++i) pg.all_reduce_(small, ReduceOp::sum);
  pg.barrier();
  const double small_us = bench::ns_per_call([&] { pg.all_reduce_(small, ReduceOp::sum); }, 100, 9) / 1e3;

  if (pg.rank() == 0)
    std::cout << "RESULT large_ms " << bench::median(large_ms) << " small_us " << small_us << std::endl;
  return 0;
}

// ---- driver -----------------------------------------------------------------

const char* kTorchScript = R"(import os, time, statistics, torch, torch.distributed as dist
dist.init_process_group("gloo")
iters = int(os.environ["BP_BENCH_ITERS"])
x = torch.randn(16 * 1024 * 1024)
times = []
for i in range(iters + 2):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    if i >= 2:
        times.append((time.perf_counter() - t0) * 1e3)
s = torch.randn(1024)
for _ in range(50):
    dist.all_reduce(s)
dist.barrier()
per = []
for b in range(9):
    t0 = time.perf_counter()
    for _ in range(100):
        dist.all_reduce(s)
    per.append((time.perf_counter() - t0) / 100 * 1e6)
if dist.get_rank() == 0:
    print("RESULT large_ms %f small_us %f" % (statistics.median(times), statistics.median(per)), flush=True)
dist.destroy_process_group()
)";

// Runs cmd, returns "large_ms"/"small_us" from its RESULT line (empty on failure).
std::map<std::string, double> run_job(const std::string& cmd) {
  std::map<std::string, double> out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((cmd + " 2>&1").c_str(), "r"), &pclose);
  if (!pipe) return out;
  char line[4096];
  std::string transcript;
  while (std::fgets(line, sizeof line, pipe.get()) != nullptr) {
    transcript += line;
    const char* r = std::strstr(line, "RESULT ");
    if (r == nullptr) continue;
    std::istringstream s(r + 7);
    std::string key;
    double v = 0;
    while (s >> key >> v) out[key] = v;
  }
  if (out.empty()) std::cerr << "bench_collectives: `" << cmd << "` gave no result:\n" << transcript;
  return out;
}

// Both directions at once over one loopback connection; returns ms.
double loopback_floor_ms(std::size_t bytes, int iters) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 1) != 0) return -1;
  socklen_t len = sizeof addr;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int a = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(a, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  const int b = ::accept(lfd, nullptr, nullptr);
  ::close(lfd);
  std::vector<char> sa(bytes, 1), sb(bytes, 2), ra(bytes), rb(bytes);
  auto send_all = [](int fd, const char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t k = ::send(fd, p, n, 0);
      if (k <= 0) return;
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  };
  auto recv_all = [](int fd, char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t k = ::recv(fd, p, n, 0);
      if (k <= 0) return;
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  };
  std::vector<double> ms;
  for (int i = 0; i < iters + 1; ++i) {
    const double t0 = bench::now_ns();
    std::thread t1([&] { send_all(a, sa.data(), bytes); });
    std::thread t2([&] { send_all(b, sb.data(), bytes); });
    std::thread t3([&] { recv_all(b, rb.data(), bytes); });
    recv_all(a, ra.data(), bytes);
    t1.join();
    t2.join();
    t3.join();
    if (i > 0) ms.push_back((bench::now_ns() - t0) / 1e6);
  }
  ::close(a);
  ::close(b);
  return bench::median(ms);
}

// The same all_reduce on `ranks` ranks over each shared-memory layout and TCP.
int compare_layouts(const std::string& self, int iters, int ranks) {
  std::cout << "all_reduce f32, " << ranks << " ranks on one host, median of " << iters
            << " (64 MiB) / 9x100 (4 KiB)\n";
  auto job = [&](const char* transport) {
    return run_job(std::string(BP_BENCH_CLI) + " launch -n " + std::to_string(ranks) + " -- " + self +
                   " --worker " + std::to_string(iters) + " " + transport);
  };
  const bool inboxes = ranks > 16;  // the default layout for this group
  const bool can_pair = ranks <= 32;
  auto chosen = job("shm");
  auto other = inboxes ? (can_pair ? job("pairs") : std::map<std::string, double>()) : job("inboxes");
  auto tcp = job("tcp");
  if (chosen.empty() || tcp.empty()) return 1;
  const char* chosen_name = inboxes ? "shared memory, inboxes (default)" : "shared memory, pairs (default)";
  const char* other_name = inboxes ? "shared memory, pairs (forced)" : "shared memory, inboxes (forced)";
  std::printf("%-36s %12s %12s\n", "", "64 MiB (ms)", "4 KiB (us)");
  std::printf("%-36s %12.1f %12.1f\n", chosen_name, chosen["large_ms"], chosen["small_us"]);
  if (!other.empty()) std::printf("%-36s %12.1f %12.1f\n", other_name, other["large_ms"], other["small_us"]);
  std::printf("%-36s %12.1f %12.1f\n", "Gloo TCP (same run)", tcp["large_ms"], tcp["small_us"]);
  std::printf("ratio 64 MiB default / Gloo TCP: %.2f\nratio 4 KiB  default / Gloo TCP: %.3f\n",
              chosen["large_ms"] / tcp["large_ms"], chosen["small_us"] / tcp["small_us"]);
  if (!other.empty())
    std::printf("ratio 64 MiB inboxes / pairs:    %.2f\nratio 4 KiB  inboxes / pairs:    %.3f\n",
                (inboxes ? chosen : other)["large_ms"] / (inboxes ? other : chosen)["large_ms"],
                (inboxes ? chosen : other)["small_us"] / (inboxes ? other : chosen)["small_us"]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--worker")
    return worker(argc >= 3 ? std::atoi(argv[2]) : 15, argc >= 4 ? argv[3] : "shm");
  const int iters = argc >= 2 ? std::max(3, std::atoi(argv[1])) : 15;
  const int ranks = argc >= 3 ? std::max(2, std::atoi(argv[2])) : 2;
  const std::string self = fs::canonical("/proc/self/exe").string();
  if (ranks != 2) return compare_layouts(self, iters, ranks);

  std::cout << "all_reduce f32, 2 ranks on one host, median of " << iters << " (64 MiB) / 9x100 (4 KiB)\n";
  const double floor_ms = loopback_floor_ms(static_cast<std::size_t>(kLargeElems) * 4, 5);
  auto job = [&](const char* transport) {
    return run_job(std::string(BP_BENCH_CLI) + " launch -n 2 -- " + self + " --worker " +
                   std::to_string(iters) + " " + transport);
  };
  auto ours = job("shm");
  auto tcp = job("tcp");
  const fs::path script =
      fs::temp_directory_path() / ("bp_bench_allreduce_" + std::to_string(::getpid()) + ".py");
  { std::ofstream(script) << kTorchScript; }
  auto torch = run_job("BP_BENCH_ITERS=" + std::to_string(iters) + " " + BP_BENCH_CLI +
                       " launch -n 2 -- /usr/bin/python3 " + script.string());
  fs::remove(script);

  if (ours.empty() || tcp.empty()) return 1;
  std::printf("%-34s %12s %12s\n", "", "64 MiB (ms)", "4 KiB (us)");
  std::printf("%-34s %12.1f %12.1f\n", "backplane (shared memory)", ours["large_ms"], ours["small_us"]);
  std::printf("%-34s %12.1f %12.1f\n", "backplane (Gloo TCP)", tcp["large_ms"], tcp["small_us"]);
  if (!torch.empty())
    std::printf("%-34s %12.1f %12.1f\n", "PyTorch gloo (same run)", torch["large_ms"], torch["small_us"]);
  else
    std::printf("%-34s %12s %12s\n", "PyTorch gloo", "n/a", "n/a");
  std::printf("%-34s %12.1f %12s\n", "loopback floor (64 MiB each way)", floor_ms, "");
  for (const auto& [name, r] : {std::pair{"shared memory", &ours}, std::pair{"Gloo TCP", &tcp}}) {
    if (!torch.empty()) {
      std::printf("ratio 64 MiB backplane (%s) / PyTorch: %.2f (target <= 1)\n", name,
                  (*r)["large_ms"] / torch["large_ms"]);
      std::printf("ratio 4 KiB  backplane (%s) / PyTorch: %.3f (target <= 1)\n", name,
                  (*r)["small_us"] / torch["small_us"]);
    }
    if (floor_ms > 0)
      std::printf("ratio 64 MiB backplane (%s) / floor:   %.2f (target <= 2)\n", name,
                  (*r)["large_ms"] / floor_ms);
  }
  return 0;
}
