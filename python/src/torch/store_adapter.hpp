// The c10d Store that torch hands a process-group backend, seen as a
// backplane::Store: the communicators' rendezvous rides on torch's own store
// (TCPStore, FileStore, a PrefixStore over either), so the bridge needs no
// second port and no variables of its own.
//
// Blocking reads poll check() instead of calling c10d's wait(): a TCPStore
// client holds one lock for the whole of a wait, so one communicator waiting
// for a key would stall every other thread's set, and two communicators made
// at once (send/recv channels) could each wait on a key the other must set.
// Thread-safe: c10d stores serialise their own calls.
#ifndef BACKPLANE_PYTHON_TORCH_STORE_ADAPTER_HPP_
#define BACKPLANE_PYTHON_TORCH_STORE_ADAPTER_HPP_

#include <backplane/rendezvous.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace backplane::torch_bridge {

class C10dStoreAdapter final : public backplane::Store {
 public:
  // Every key is stored as `prefix` + key (the send/recv channels each take
  // a namespace of their own). `timeout` is this store's default.
  C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store, std::string prefix,
                   std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::string address() const override { return "torch.distributed's store"; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;
  // Polls check(keys) with a growing pause until all exist or `timeout` ran out.
  void await(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, const char* op);

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace backplane::torch_bridge

#endif  // BACKPLANE_PYTHON_TORCH_STORE_ADAPTER_HPP_
