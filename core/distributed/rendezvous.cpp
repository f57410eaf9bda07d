// Rendezvous: rank, world size and master address from the arguments or the
// launcher's environment (backplane launch / torchrun, Open MPI, Slurm), and
// the job's store, made once and shared by every copy.
#include "distributed/slurm_hostlist.hpp"
#include "distributed/store_wire.hpp"
#include "trace/recorder.hpp"
#include "trace/trace_format.hpp"

#include <backplane/error.hpp>
#include <backplane/rendezvous.hpp>
#include <backplane_common/hex.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <string>

namespace backplane {

struct Rendezvous::Shared {
  std::mutex mutex;
  std::shared_ptr<Store> store;  // guarded by mutex; made on first store()
  // The store's secret when this process chose it (single_process); unset:
  // the job's, from BACKPLANE_JOB_TOKEN or BACKPLANE_JOB_TOKEN_FILE.
  std::optional<std::string> job_token;
  std::atomic<uint64_t> next_group{0};
};

namespace {

constexpr uint16_t kDefaultPort = 29500;
constexpr const char* kDefaultAddr = "127.0.0.1";
// Under Slurm without MASTER_PORT: kSlurmPortBase + (SLURM_JOB_ID + 4001 x SLURM_STEP_ID) %
// kSlurmPortSpan, i.e. 10000..29999, below Linux's ephemeral ports
// (32768..60999) so that no outgoing connection holds it by chance; jobs
// sharing a node get different ports unless their ids differ by a multiple
// of 20000.
constexpr int64_t kSlurmPortBase = 10000;
constexpr int64_t kSlurmPortSpan = 20000;
// BACKPLANE_TIMEOUT above this is refused: it would not be a timeout.
constexpr double kMaxTimeoutSeconds = 10.0 * 365 * 24 * 3600;

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// A whole decimal integer in [lo, hi]; anything else names the variable.
int64_t parse_int(const char* name, const std::string& value, int64_t lo, int64_t hi,
                  const std::string& expected) {
  int64_t v = 0;
  const char* first = value.data();
  const char* last = first + value.size();
  auto [end, ec] = std::from_chars(first, last, v);
  if (value.empty() || ec != std::errc() || end != last) {
    throw Error(Errc::invalid_argument, std::string("environment variable ") + name + "='" + value +
                                            "' is not a whole number; expected " + expected);
  }
  if (v < lo || v > hi) {
    throw Error(Errc::invalid_argument, std::string("environment variable ") + name + "=" + value +
                                            " is out of range; expected " + expected);
  }
  return v;
}

struct Family {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
};

constexpr Family kFamilies[] = {
    {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

// Whether every rank runs on this node, so that MASTER_ADDR may default to
// loopback; `why_not` says what was seen otherwise.
bool single_node(const Family& family, int64_t world_size, std::string& why_not) {
  const std::string source = family.source;
  if (source == "RANK/WORLD_SIZE") return true;  // backplane launch starts every rank here
  if (source == "Open MPI") {
    auto local = env("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local) {
      why_not = "OMPI_COMM_WORLD_LOCAL_SIZE is not set, so the ranks may span nodes";
      return false;
    }
    const int64_t n = parse_int("OMPI_COMM_WORLD_LOCAL_SIZE", *local, 1, std::numeric_limits<int32_t>::max(),
                                "the number of ranks on this node (1 or more)");
    if (n == world_size) return true;
    why_not = "OMPI_COMM_WORLD_LOCAL_SIZE=" + *local +
              " of OMPI_COMM_WORLD_SIZE=" + std::to_string(world_size) + " ranks run on this node";
    return false;
  }
  // The step's nodes first: a one-node step of a larger allocation has every
  // rank on this node.
  for (const char* name : {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"}) {
    if (auto nodes = env(name)) {
      const int64_t n =
          parse_int(name, *nodes, 1, std::numeric_limits<int32_t>::max(), "the number of nodes (1 or more)");
      if (n == 1) return true;
      why_not = std::string(name) + "=" + *nodes + ": the job spans several nodes";
      return false;
    }
  }
  why_not =
      "none of SLURM_STEP_NUM_NODES, SLURM_JOB_NUM_NODES and SLURM_NNODES is set, so the ranks may span "
      "nodes";
  return false;
}

// Under Slurm, the first node of the step (where task 0, rank 0, runs with
// srun's block and cyclic distributions), else of the job; nullopt when no
// node list is set.
std::optional<std::string> slurm_first_node() {
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (auto list = env(name)) return slurm::first_host(name, *list);
  }
  return std::nullopt;
}

std::string master_addr_hint(const Family& family) {
  const std::string source = family.source;
  if (source == "Slurm") {
    return "start the job with srun (which sets SLURM_STEP_NODELIST), or export MASTER_ADDR=<rank 0's host> "
           "before srun";
  }
  return "export MASTER_ADDR=<the address of rank 0's node> and pass it to every rank (mpirun -x "
         "MASTER_ADDR)";
}

uint16_t port_from_store(const Store& store) {
  const std::string address = store.address();
  const auto colon = address.rfind(':');
  int port = 0;
  if (colon != std::string::npos) {
    std::from_chars(address.data() + colon + 1, address.data() + address.size(), port);
  }
  return static_cast<uint16_t>(port);
}

}  // namespace

Rendezvous::Rendezvous(int32_t rank, int32_t world_size, std::string master_addr, uint16_t master_port,
                       std::chrono::milliseconds timeout, int32_t local_rank)
    : rank_(rank),
      world_size_(world_size),
      local_rank_(local_rank < 0 ? rank : local_rank),
      master_addr_(std::move(master_addr)),
      master_port_(master_port),
      timeout_(timeout),
      shared_(std::make_shared<Shared>()) {
  if (world_size_ < 1) {
    throw Error(Errc::invalid_argument,
                "Rendezvous: world_size " + std::to_string(world_size_) + " is not positive");
  }
  if (rank_ < 0 || rank_ >= world_size_) {
    throw Error(Errc::invalid_argument, "Rendezvous: rank " + std::to_string(rank_) +
                                            " is out of range for world_size " + std::to_string(world_size_) +
                                            " (ranks are 0.." + std::to_string(world_size_ - 1) + ")");
  }
  if (local_rank >= world_size_) {
    throw Error(Errc::invalid_argument, "Rendezvous: local_rank " + std::to_string(local_rank) +
                                            " is out of range for world_size " + std::to_string(world_size_));
  }
  if (master_addr_.empty()) {
    throw Error(Errc::invalid_argument,
                "Rendezvous: the master address is empty; give rank 0's host (MASTER_ADDR)");
  }
  if (master_port_ == 0 && world_size_ > 1) {
    throw Error(
        Errc::invalid_argument,
        "Rendezvous: master port 0 (any free port) only works for a world of one; give every rank the "
        "same port (MASTER_PORT)");
  }
  if (timeout_.count() <= 0) {
    throw Error(Errc::invalid_argument,
                "Rendezvous: the timeout must be positive, got " + std::to_string(timeout_.count()) + " ms");
  }
}

namespace {

// The launcher family the environment names: the first whose rank or size
// variable is set; null for none.
const Family* family_in_env() {
  for (const Family& f : kFamilies)
    if (env(f.rank) || env(f.size)) return &f;
  return nullptr;
}

}  // namespace

std::optional<std::string> Rendezvous::env_rank() {
  const Family* family = family_in_env();
  if (family == nullptr) return std::nullopt;
  return env(family->rank).value_or(std::string());
}

Rendezvous Rendezvous::from_env() {
  const Family* family = family_in_env();
  if (family == nullptr) {
    throw Error(Errc::invalid_argument,
                "no rank in the environment: set RANK and WORLD_SIZE (backplane launch and torchrun do), or "
                "start the job with mpirun or srun; Rendezvous::single_process() makes a world of one");
  }
  const auto rank_text = env(family->rank);
  const auto size_text = env(family->size);
  if (!rank_text || !size_text) {
    const char* missing = rank_text ? family->size : family->rank;
    const char* present = rank_text ? family->rank : family->size;
    throw Error(Errc::invalid_argument, std::string("environment variable ") + missing + " is not set but " +
                                            present + " is (" + family->source + "); set both");
  }
  const int64_t world_size = parse_int(family->size, *size_text, 1, std::numeric_limits<int32_t>::max(),
                                       "the number of ranks (1 or more)");
  const int64_t rank = parse_int(family->rank, *rank_text, 0, std::numeric_limits<int32_t>::max(),
                                 "this process's rank (0 or more)");
  if (rank >= world_size) {
    throw Error(Errc::invalid_argument, std::string("environment variable ") + family->rank + "=" +
                                            *rank_text + " is out of range for " + family->size + "=" +
                                            *size_text + " (ranks are 0.." + std::to_string(world_size - 1) +
                                            ")");
  }
  int64_t local_rank = rank;
  if (auto local = env(family->local_rank)) {
    local_rank = parse_int(family->local_rank, *local, 0, world_size - 1,
                           "this process's rank on its node, 0.." + std::to_string(world_size - 1));
  }

  std::string master_addr;
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) {
      throw Error(Errc::invalid_argument,
                  "environment variable MASTER_ADDR is set but empty; set it to rank 0's "
                  "host name or IP address, or unset it on a single node");
    }
    master_addr = *addr;
  } else {
    std::string why_not;
    const bool slurm = std::string(family->source) == "Slurm";
    if (single_node(*family, world_size, why_not)) {
      master_addr = kDefaultAddr;
    } else if (auto first = slurm ? slurm_first_node() : std::nullopt) {
      master_addr = *first;
    } else {
      if (slurm) why_not += ", and none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST and SLURM_NODELIST is set";
      throw Error(Errc::invalid_argument, std::string("environment variable MASTER_ADDR is not set and ") +
                                              why_not + " (" + family->source + "); " +
                                              master_addr_hint(*family));
    }
  }

  uint16_t master_port = kDefaultPort;
  if (auto port = env("MASTER_PORT")) {
    master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", *port, 1, 65535, "a TCP port, 1..65535"));
  } else if (auto job = std::string(family->source) == "Slurm" ? env("SLURM_JOB_ID") : std::nullopt) {
    const int64_t id =
        parse_int("SLURM_JOB_ID", *job, 0, std::numeric_limits<int64_t>::max(), "Slurm's job id (0 or more)");
    // Steps of one job running at once on a node need stores of their own:
    // the step id moves the port by a stride coprime to the span, so no two
    // of a job's first 20000 steps share one (step 0 keeps the job's port).
    int64_t step = 0;
    if (auto text = env("SLURM_STEP_ID"))
      step = parse_int("SLURM_STEP_ID", *text, 0, std::numeric_limits<uint32_t>::max(),
                       "Slurm's step id (0 or more)");
    constexpr int64_t kStepStride = 4001;
    master_port = static_cast<uint16_t>(
        kSlurmPortBase + (id % kSlurmPortSpan + (step % kSlurmPortSpan) * kStepStride) % kSlurmPortSpan);
  }

  const std::chrono::milliseconds timeout = timeout_from_env();

  Rendezvous r(static_cast<int32_t>(rank), static_cast<int32_t>(world_size), std::move(master_addr),
               master_port, timeout, static_cast<int32_t>(local_rank));
  r.source_ = family->source;
  return r;
}

std::chrono::milliseconds Rendezvous::timeout_from_env() {
  std::chrono::milliseconds timeout = kDefaultTimeout;
  if (auto text = env("BACKPLANE_TIMEOUT")) {
    double seconds = 0;
    const char* first = text->data();
    const char* last = first + text->size();
    auto [end, ec] = std::from_chars(first, last, seconds);
    if (text->empty() || ec != std::errc() || end != last || !std::isfinite(seconds)) {
      throw Error(Errc::invalid_argument, "environment variable BACKPLANE_TIMEOUT='" + *text +
                                              "' is not a number of seconds; expected e.g. 300 or 0.5");
    }
    if (seconds <= 0 || seconds > kMaxTimeoutSeconds) {
      throw Error(Errc::invalid_argument, "environment variable BACKPLANE_TIMEOUT=" + *text +
                                              " is out of range; expected seconds above 0 (e.g. 300 or 0.5)");
    }
    timeout = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000.0)));
  }
  return timeout;
}

Rendezvous Rendezvous::single_process(std::chrono::milliseconds timeout) {
  Rendezvous r(0, 1, kDefaultAddr, 0, timeout, 0);
  r.source_ = "single process";
  // No other rank ever joins a world of one: its store proves a secret only
  // this process knows, so no process can join it, and there is no job
  // secret to ask the user for (nor a warning that there is none).
  r.shared_->job_token = common::to_hex(store_wire::random_nonce());
  // Made now, so that master_port() reports the port the server bound.
  r.master_port_ = port_from_store(*r.store());
  return r;
}

Rendezvous Rendezvous::with_store(int32_t rank, int32_t world_size, std::shared_ptr<Store> store,
                                  std::chrono::milliseconds timeout, int32_t local_rank) {
  if (!store) throw Error(Errc::invalid_argument, "Rendezvous::with_store: the store is null");
  // The constructor validates rank, world and timeout; the address and port
  // only name the store in messages (port 1: never used to connect).
  std::string address = store->address();
  if (address.empty()) address = "the host's store";
  Rendezvous r(rank, world_size, std::move(address), 1, timeout, local_rank);
  r.master_port_ = 0;
  r.source_ = "the host's store";
  r.shared_->store = std::move(store);
  return r;
}

std::shared_ptr<Store> Rendezvous::store() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (!shared_->store) {
    TcpStoreOptions options;
    options.host = master_addr_;
    options.port = master_port_;
    options.is_server = rank_ == 0;
    options.rank = rank_;
    options.world_size = world_size_;
    options.timeout = timeout_;
    options.job_token = shared_->job_token;
    // Every rank connected and proved the job secret: the rendezvous proper.
    const trace::detail::Span span(trace::detail::kCatJob, "rendezvous");
    shared_->store = make_tcp_store(options);
  }
  return shared_->store;
}

std::string Rendezvous::next_group_prefix() const {
  return "pg/" + std::to_string(shared_->next_group.fetch_add(1)) + "/";
}

}  // namespace backplane
