// Rendezvous: how the ranks of a job find each other.
//
// A TCP key-value store, like PyTorch's TCPStore: rank 0 hosts it on
// MASTER_ADDR:MASTER_PORT and every rank (rank 0 included) is a client.
// Ranks may arrive in any order; a client retries the connection until its
// timeout. Collective communicators exchange their addresses through it
// (the plugin sees it as bp_kv_store callbacks).
//
// Every blocking call has a timeout (default 300 s). Failures are
// backplane::Error: Errc::timeout (names the key and the waited time),
// Errc::io_error (names the address; e.g. the host rank exited), or
// Errc::invalid_argument (a wrong world size or a duplicate rank, caught at
// the handshake and named on both sides).
#ifndef BACKPLANE_RENDEZVOUS_HPP_
#define BACKPLANE_RENDEZVOUS_HPP_

#include <backplane/export.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane {

inline constexpr std::chrono::milliseconds kDefaultTimeout{300'000};

// A key-value store shared by the ranks of one job. Thread-safe: one Store
// may be used from many threads at once.
class BACKPLANE_API Store {
 public:
  virtual ~Store();
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // set, waiting at most `timeout` (and never longer than timeout()) for the
  // store to take the value: for failure paths, which must not stall on a
  // hung store host. Errc::timeout says the time actually waited. The
  // default implementation is set().
  virtual void set_with_timeout(const std::string& key, const std::vector<uint8_t>& value,
                                std::chrono::milliseconds timeout);
  // Blocks until `key` exists, then returns its value.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Blocks until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer at `key` (missing keys count as 0)
  // and returns the new value. The value is stored as decimal text.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists; never blocks on the keys.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes `key`; true when it existed.
  virtual bool remove(const std::string& key) = 0;
  // The default timeout this store was made with.
  virtual std::chrono::milliseconds timeout() const = 0;
  // "host:port" of the server, for messages (the bound port when 0 was asked).
  virtual std::string address() const = 0;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // the address of the hosting rank
  uint16_t port = 29500;           // 0 on the server: any free port (see address())
  bool is_server = false;          // true on the rank that hosts the store
  int32_t rank = 0;                // this rank, checked at the handshake
  int32_t world_size = 1;          // must agree across ranks
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // The job secret every rank proves at the handshake. Unset: read from
  // BACKPLANE_JOB_TOKEN, else from the file BACKPLANE_JOB_TOKEN_FILE names
  // (which only its owner may read or write). Empty: no secret.
  std::optional<std::string> job_token;
};

// The TCP store. The server side (is_server) listens on `port` (on loopback
// only when `host` resolves to a loopback address, in any spelling: "127.1",
// "LOCALHOST", "::ffff:127.0.0.1"; else on every interface) and serves on its
// own thread until the TcpStore is destroyed; both sides connect as a client.
// Every connection proves the job secret (HMAC-SHA256 challenge-response,
// both ways) before it is told anything; a server beyond loopback refuses to
// start without a secret (Errc::invalid_argument saying how to give one).
// Construction returns once the client is connected and its handshake
// (secret, rank, world size) was accepted; until then it retries for
// `timeout` (Errc::timeout naming the address). A rank with another secret
// gets Errc::invalid_argument. Limits: keys 1..4096 bytes, values up to
// 1 GiB; the server's limits per connection are in docs/security.md.
// Timeouts of 10 years or more wait forever.
BACKPLANE_API std::shared_ptr<Store> make_tcp_store(const TcpStoreOptions& options);

// Where this process sits in a job, and the store that joins the job.
class BACKPLANE_API Rendezvous {
 public:
  // Throws Errc::invalid_argument for a rank outside the world, an empty
  // address, a non-positive timeout, or port 0 (any free port) in a world
  // of more than one. local_rank -1 means "the same as rank".
  Rendezvous(int32_t rank, int32_t world_size, std::string master_addr, uint16_t master_port,
             std::chrono::milliseconds timeout = kDefaultTimeout, int32_t local_rank = -1);

  // Reads, in order of preference:
  //   RANK, WORLD_SIZE, LOCAL_RANK                 (backplane launch, torchrun)
  //   OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK       (Open MPI's mpirun)
  //   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID    (Slurm's srun)
  // and MASTER_ADDR (default 127.0.0.1 when every rank is on this node,
  // required otherwise), MASTER_PORT (default 29500), BACKPLANE_TIMEOUT
  // (seconds, default 300). Under Slurm (SLURM_PROCID), without MASTER_ADDR
  // the store is on 127.0.0.1 when the step runs on one node
  // (SLURM_STEP_NUM_NODES, else SLURM_JOB_NUM_NODES or SLURM_NNODES, is 1),
  // else on the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST,
  // else SLURM_NODELIST; Slurm's compressed lists: "node[07-09,12],gpu1"
  // gives node07), where task 0 runs; without MASTER_PORT its port is
  // 10000 + SLURM_JOB_ID % 20000. So srun needs only the job secret
  // (BACKPLANE_JOB_TOKEN or BACKPLANE_JOB_TOKEN_FILE). Throws
  // Errc::invalid_argument naming the variable for a missing or malformed
  // value (a node list that is not one included).
  static Rendezvous from_env();
  // Whether the environment names a job, and this process's rank in it: the
  // text of the rank variable of the launcher family from_env() would read
  // (RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID; "" when only that family's
  // size variable is set); nullopt when none is set, i.e. not a rank of a
  // job. Unparsed: from_env() says what is wrong with it.
  static std::optional<std::string> env_rank();
  // BACKPLANE_TIMEOUT as from_env() reads it (kDefaultTimeout when unset),
  // for a launcher that checks its ranks' environment before it starts them.
  // Throws Errc::invalid_argument naming the variable and its value.
  static std::chrono::milliseconds timeout_from_env();
  // A world of one on this process (rank 0, an ephemeral loopback port).
  static Rendezvous single_process(std::chrono::milliseconds timeout = kDefaultTimeout);
  // A rendezvous over a store the host already has, shared by every rank of
  // the job (a framework's own store: the PyTorch bridge wraps the c10d Store
  // that torch hands a process-group backend). No second port, no second
  // store: store() returns `store`, master_addr() its address(), master_port()
  // 0. Groups made from it take their key prefixes in order as usual; keys
  // are the store owner's to namespace (torch hands each group a prefixed
  // store). Throws Errc::invalid_argument for a null store, a rank outside
  // the world or a non-positive timeout.
  static Rendezvous with_store(int32_t rank, int32_t world_size, std::shared_ptr<Store> store,
                               std::chrono::milliseconds timeout = kDefaultTimeout, int32_t local_rank = -1);

  int32_t rank() const noexcept { return rank_; }
  int32_t world_size() const noexcept { return world_size_; }
  int32_t local_rank() const noexcept { return local_rank_; }
  const std::string& master_addr() const noexcept { return master_addr_; }
  uint16_t master_port() const noexcept { return master_port_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  // Where the values came from, for messages: "RANK/WORLD_SIZE", "Open MPI", ...
  const std::string& source() const noexcept { return source_; }

  // The job's store, made on first use (rank 0 starts the server) and shared
  // by copies of this Rendezvous.
  std::shared_ptr<Store> store() const;
  // A fresh, job-wide unique prefix for a group's keys ("pg/0/", "pg/1/", ...):
  // groups made in the same order on every rank get the same prefix.
  std::string next_group_prefix() const;

 private:
  struct Shared;
  int32_t rank_ = 0;
  int32_t world_size_ = 1;
  int32_t local_rank_ = 0;
  std::string master_addr_;
  uint16_t master_port_ = 0;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  std::string source_ = "explicit";
  std::shared_ptr<Shared> shared_;
};

}  // namespace backplane

#endif  // BACKPLANE_RENDEZVOUS_HPP_
