// ProcessGroupBackplane: a c10d::ProcessGroup (torch 1.13) that runs
// torch.distributed's collectives on backplane's communicators: shared
// memory between ranks on one host, Gloo between hosts (cpu), NCCL (cuda),
// a remote server's group (remote), whichever backend backends.json's
// "torch_devices" names for the tensors' torch device type.
//
// Calls return at once with a Work; the group's one worker thread runs them
// in call order (every rank issues the same sequence, so no tags are needed),
// each send/recv channel on a thread of its own. What can be checked without
// the other ranks (tensor counts, dtypes, reduce ops, sizes) is checked on
// the calling thread, so a refusal is a RuntimeError raised on every rank
// alike and the group stays usable. A failure in flight (a dead peer, a
// timeout) aborts the backplane group: its Work raises, naming the peer, and
// so does every later call.
//
// Thread-safety: every public member may be called from any thread.
#ifndef BACKPLANE_PYTHON_TORCH_PROCESS_GROUP_HPP_
#define BACKPLANE_PYTHON_TORCH_PROCESS_GROUP_HPP_

#include <backplane/process_group.hpp>
#include <backplane/registry.hpp>
#include <backplane/rendezvous.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace backplane::torch_bridge {

// One thread running posted tasks in order. The destructor runs what is
// queued, then joins.
class Executor {
 public:
  Executor();
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  void post(std::function<void()> task);
  // True while a task runs or waits.
  bool busy();
  // Runs what is queued, then joins the thread; idempotent.
  void shutdown();

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;  // a task is running
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest exists
};

// Where a torch device's tensors go: a backplane device and, once the first
// collective needs it, the backplane group on it.
struct Target {
  Device device;
  bool zero_copy = false;  // host_visible, not remote: torch's memory is imported, not copied
  std::string label;       // "cpu:0 (backend cpu)", for messages
  std::unique_ptr<backplane::ProcessGroup> group;  // made on the worker thread
};

class ProcessGroupBackplane final : public c10d::ProcessGroup {
 public:
  // Joins the group through `store` (the store torch hands the creator):
  // blocks until every rank arrived or `timeout`. The group for torch's cpu
  // device is made here, so a backend without 'collective' (and whose
  // collective_fallback is "error") fails init_process_group itself.
  ProcessGroupBackplane(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                        std::chrono::milliseconds timeout, Registry registry);
  ~ProcessGroupBackplane() override;

  const std::string getBackendName() const override { return "backplane"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // "cpu:0 (backend cpu)": where tensors of a torch device go, for Python's repr.
  std::string describe_target(const std::string& torch_device_type);

 private:
  // A send/recv channel: one direction between two ranks, one tag, one
  // device; a 2-rank backplane group of its own, made on first use.
  struct Channel {
    std::unique_ptr<backplane::ProcessGroup> group;
    Executor executor;  // last: drains before the group goes
  };

  Target& target(const at::Tensor& t, const char* op);
  backplane::ProcessGroup& group(Target& tg);
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title,
                                         std::vector<at::Tensor> outputs, std::function<void()> body,
                                         Executor* on = nullptr, int source_rank = -1);
  Channel& channel(int src, int dst, int tag, const Target& tg);
  // send (sending) or recv: a broadcast from the sender on the channel's pair group.
  c10::intrusive_ptr<c10d::Work> point_to_point(std::vector<at::Tensor>& tensors, int peer, int tag,
                                                bool sending);

  // The reductions: in place on `t` (any layout), with the bitwise and
  // bool rules; used by allreduce, allreduce_coalesced and reduce.
  void allreduce_now(Target& tg, const at::Tensor& t, c10d::ReduceOp op);
  // Block r of `blocks` (world_size blocks along dim 0) reduced over all
  // ranks into `out` on rank r.
  void reduce_scatter_now(Target& tg, const at::Tensor& blocks, const at::Tensor& out, c10d::ReduceOp op);

  Registry registry_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  Rendezvous rendezvous_;
  std::mutex targets_mutex_;  // guards the maps, not the groups (the worker owns those)
  std::map<std::string, std::unique_ptr<Target>> targets_;
  Target* cpu_target_ = nullptr;  // set by the constructor, then constant
  std::mutex channels_mutex_;
  std::map<std::tuple<int, int, int, std::string>, std::unique_ptr<Channel>> channels_;
  Executor executor_;  // last: drains before the groups and channels go
};

}  // namespace backplane::torch_bridge

#endif  // BACKPLANE_PYTHON_TORCH_PROCESS_GROUP_HPP_
