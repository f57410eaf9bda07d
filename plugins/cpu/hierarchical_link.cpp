// The hierarchical Link (transport.hpp): for a group whose ranks run on
// several hosts, some with two or more of them. The ranks of each host share
// a shared-memory segment (shm_transport.hpp, set up under store keys of
// their own, "hier/<leader>/"), and the whole group keeps Gloo's TCP full
// mesh (gloo_transport.hpp). A collective with a two-level algorithm
// (begin_levels; all_reduce, collective_algorithms.hpp) runs on the host's
// shared memory and, between hosts, on the mesh among the ranks that have
// the same local rank on each host (the leaders, the lowest rank of each
// host, for local rank 0); every other collective runs on the mesh alone,
// as without this link.
//
// Failures read as on the other links: a leader that fails or is killed
// fails its peers on the mesh (Gloo sees the connection go) and on its host
// (shared memory sees it closed or exited), and each of those closes its own
// links when it fails, so every rank of the group fails within the timeout.
// Messages name ranks as the communicator numbers them.
#include <algorithm>
#include <atomic>
#include <backplane/plugin.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shm_transport.hpp"
#include "transport.hpp"

namespace backplane::cpu {
namespace {

std::string text_of(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }

// Keys under a prefix of their own, so that one host's shared-memory setup
// meets neither another host's nor the group's.
class PrefixedExchange final : public KeyValueExchange {
 public:
  PrefixedExchange(KeyValueExchange& inner, std::string prefix) : inner_(inner), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& value) override {
    inner_.set(prefix_ + key, value);
  }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    inner_.wait(full);
  }
  std::vector<char> get(const std::string& key) override { return inner_.get(prefix_ + key); }

 private:
  KeyValueExchange& inner_;
  const std::string prefix_;
};

// The host level of a host with one rank: the algorithms never send in it.
class Solo final : public Transport {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  Region& region(void*, uint64_t) override { unreachable(); }
  void send(Region&, int, uint64_t, uint64_t, uint64_t) override { unreachable(); }
  void recv(Region&, int, uint64_t, uint64_t, uint64_t) override { unreachable(); }
  int wait_recv(Region&, int) override { unreachable(); }
  int wait_send(Region&, int) override { unreachable(); }

 private:
  [[noreturn]] static void unreachable() {
    plugin::fail(BP_STATUS_INTERNAL, "a host with one rank has no peer on it to exchange messages with");
  }
};

// Some ranks of a transport as a group of their own: rank i here is
// members[i] there. What the inner transport reports (failures included)
// names its own ranks, which are the communicator's.
class Subset final : public Transport {
 public:
  Subset(std::unique_ptr<Transport> inner, const std::vector<int32_t>& members, int index)
      : inner_(std::move(inner)), members_(members), index_(index) {}

  int rank() const noexcept override { return index_; }
  int size() const noexcept override { return static_cast<int>(members_.size()); }
  Region& region(void* data, uint64_t bytes) override { return inner_->region(data, bytes); }
  void send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override {
    inner_->send(from, members_[peer], phase, offset, bytes);
  }
  void recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) override {
    inner_->recv(into, members_[peer], phase, offset, bytes);
  }
  int wait_recv(Region& region, int expected) override {
    return index_of(inner_->wait_recv(region, members_[expected]));
  }
  int wait_send(Region& region, int expected) override {
    return index_of(inner_->wait_send(region, members_[expected]));
  }

 private:
  int index_of(int member) const noexcept {
    const auto it = std::find(members_.begin(), members_.end(), member);
    return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
  }

  std::unique_ptr<Transport> inner_;
  const std::vector<int32_t>& members_;
  const int index_;
};

class LevelRun final : public Levels {
 public:
  LevelRun(std::unique_ptr<Transport> local, std::unique_ptr<Transport> across, Link& mesh, bool uniform,
           int world)
      : local_(std::move(local)), across_(std::move(across)), mesh_(mesh), uniform_(uniform), world_(world) {}
  Transport& local() override { return *local_; }
  Transport* across() override { return across_.get(); }
  bool uniform() const noexcept override { return uniform_; }
  int world() const noexcept override { return world_; }
  // The collective has failed: the mesh's next waits fail too, and the
  // communicator is poisoned (and the mesh closed) once it returns.
  void interrupt_across() noexcept override { mesh_.interrupt(); }

 private:
  std::unique_ptr<Transport> local_;
  std::unique_ptr<Transport> across_;
  Link& mesh_;
  const bool uniform_;
  const int world_;
};

class HierarchicalLink final : public Link {
 public:
  // `local`: NULL on a host with one rank. `across`: the ranks with this
  // rank's local rank on every host, in host order (empty when some host
  // has none), this rank at `across_index`.
  HierarchicalLink(std::unique_ptr<ShmGroup> local, std::unique_ptr<Link> mesh, std::vector<int32_t> across,
                   int across_index, bool uniform, int world)
      : local_(std::move(local)),
        mesh_(std::move(mesh)),
        across_(std::move(across)),
        across_index_(across_index),
        uniform_(uniform),
        world_(world) {}

  const char* name() const noexcept override { return "hierarchical"; }
  std::unique_ptr<Transport> begin(const FailureBoard& board, const CallContext& call) override {
    return mesh_->begin(board, call);
  }
  std::unique_ptr<Levels> begin_levels(const FailureBoard& board, const CallContext& call) override {
    std::unique_ptr<Transport> local =
        local_ != nullptr ? local_->begin(board, call) : std::unique_ptr<Transport>(new Solo);
    std::unique_ptr<Transport> across;
    if (!across_.empty())
      across = std::make_unique<Subset>(mesh_->begin(board, call), across_, across_index_);
    return std::make_unique<LevelRun>(std::move(local), std::move(across), *mesh_, uniform_, world_);
  }
  void interrupt() noexcept override {
    if (local_ != nullptr) local_->interrupt();
    mesh_->interrupt();
  }
  void close(std::string_view reason) noexcept override {
    if (local_ != nullptr) local_->close(reason);
    mesh_->close(reason);
  }

 private:
  std::unique_ptr<ShmGroup> local_;
  std::unique_ptr<Link> mesh_;
  const std::vector<int32_t> across_;
  const int across_index_;
  const bool uniform_;
  const int world_;
};

std::unique_ptr<Link> connect_levels(const LinkSetup& setup) {
  KeyValueExchange& store = setup.exchange;
  const int32_t rank = setup.rank;
  const int32_t size = setup.size;
  auto skip = [&](const std::string& why, bool fault = false) {
    static std::atomic<bool> warned{false};
    if (fault && !warned.exchange(true))
      plugin::log(BP_LOG_WARNING, "cpu: " + setup.where +
                                      ": collectives between ranks of one host go over TCP (Gloo) because "
                                      "shared memory could not be set up: " +
                                      why + " (logged once; later fallbacks at debug level)");
    else
      plugin::log(BP_LOG_DEBUG, "cpu: " + setup.where + ": hierarchical collectives not used: " + why);
    return std::unique_ptr<Link>();
  };
  // Every rank publishes its host, or "" when it has either option off, and
  // reads every other's: all decide alike.
  const bool enabled = setup.network.shared_memory && setup.network.hierarchical;
  const std::string mine = enabled ? shared_memory_host_identity() : std::string();
  store.set("hier/host/" + std::to_string(rank), std::vector<char>(mine.begin(), mine.end()));
  std::vector<std::string> host_of(size);
  host_of[rank] = mine;
  std::string off;  // why not, from the first rank that cannot take part
  for (int32_t p = 0; p < size; ++p) {
    if (p == rank) continue;
    const std::string key = "hier/host/" + std::to_string(p);
    store.wait({key});
    host_of[p] = text_of(store.get(key));
    if (host_of[p].empty() && off.empty())
      off = "rank " + std::to_string(p) + " has shared_memory or hierarchical off, or cannot tell its host";
  }
  if (mine.empty()) return skip(enabled ? "this host's identity cannot be read" : "switched off");
  if (!off.empty()) return skip(off);
  // Hosts in the order of their lowest rank, each with its ranks ascending.
  std::map<std::string, std::size_t> index_of;
  std::vector<std::vector<int32_t>> hosts;
  for (int32_t p = 0; p < size; ++p) {
    const auto [at, added] = index_of.emplace(host_of[p], hosts.size());
    if (added) hosts.emplace_back();
    hosts[at->second].push_back(p);
  }
  std::size_t fewest = hosts.front().size();
  std::size_t most = fewest;
  for (const auto& h : hosts) {
    fewest = std::min(fewest, h.size());
    most = std::max(most, h.size());
  }
  if (hosts.size() < 2) return skip("every rank runs on one host");
  if (most < 2) return skip("one rank per host");

  const std::size_t host = index_of[mine];
  const std::vector<int32_t>& local_ranks = hosts[host];
  const int32_t leader = local_ranks.front();
  const int32_t local_rank =
      static_cast<int32_t>(std::find(local_ranks.begin(), local_ranks.end(), rank) - local_ranks.begin());
  std::unique_ptr<ShmGroup> local;
  if (local_ranks.size() > 1) {
    const std::string prefix = "hier/" + std::to_string(leader) + "/";
    PrefixedExchange host_store(store, prefix);
    const LinkSetup host_setup{host_store,    setup.store_prefix + prefix,
                               local_rank,    static_cast<int32_t>(local_ranks.size()),
                               setup.timeout, setup.network,
                               setup.where};
    local = ShmGroup::connect(host_setup);  // logs why when it cannot
    if (local != nullptr) local->name_ranks(local_ranks);
  }
  // Every host must have its shared memory, or no rank uses the levels.
  const bool ready = local_ranks.size() == 1 || local != nullptr;
  store.set("hier/ready/" + std::to_string(rank), std::vector<char>{ready ? '1' : '0'});
  std::string refused;
  for (int32_t p = 0; p < size; ++p) {
    if (p == rank) continue;
    const std::string key = "hier/ready/" + std::to_string(p);
    store.wait({key});
    if (text_of(store.get(key)) != "1" && refused.empty())
      refused = "the ranks on the host of rank " + std::to_string(p) +
                " could not share memory (see that host's log)";
  }
  if (!ready) return skip("the ranks on this host could not share memory (see above)");
  if (!refused.empty()) return skip(refused);

  std::vector<int32_t> across;  // local rank `local_rank` of every host
  if (static_cast<std::size_t>(local_rank) < fewest)
    for (const auto& h : hosts) across.push_back(h[local_rank]);
  std::unique_ptr<Link> mesh = connect_gloo(setup);
  plugin::log(BP_LOG_DEBUG, "cpu: " + setup.where + ": hierarchical collectives: " +
                                std::to_string(local_ranks.size()) + " ranks on this host (leader rank " +
                                std::to_string(leader) + "), " + std::to_string(hosts.size()) + " hosts");
  return std::make_unique<HierarchicalLink>(std::move(local), std::move(mesh), std::move(across),
                                            static_cast<int>(host), fewest == most, size);
}

}  // namespace

std::unique_ptr<Link> connect_hierarchical(const LinkSetup& setup) {
  try {
    return connect_levels(setup);
  } catch (const StoreFailure& f) {
    throw setup.failure(f, "hierarchical setup");
  }
}

}  // namespace backplane::cpu
