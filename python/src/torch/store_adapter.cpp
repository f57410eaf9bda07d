// C10dStoreAdapter: backplane::Store over a c10d::Store (see the header).
#include "store_adapter.hpp"

#include <backplane/error.hpp>

#include <algorithm>
#include <thread>
#include <utility>

namespace backplane::torch_bridge {
namespace {

// Runs f, turning what a c10d store throws (c10::Error, std::exception) into
// backplane::Error, so that the communicator reports it as a store failure.
template <class F>
auto guarded(const char* op, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(Errc::io_error,
                std::string("torch.distributed's store: ") + op + " \"" + key + "\": " + e.what());
  }
}

}  // namespace

C10dStoreAdapter::C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store, std::string prefix,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

std::vector<std::string> C10dStoreAdapter::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(prefix_ + k);
  return out;
}

void C10dStoreAdapter::set(const std::string& key, const std::vector<uint8_t>& value) {
  guarded("set", key, [&] { store_->set(prefix_ + key, value); });
}

std::vector<uint8_t> C10dStoreAdapter::get(const std::string& key, std::chrono::milliseconds timeout) {
  await({key}, timeout, "get");
  return guarded("get", key, [&] { return store_->get(prefix_ + key); });
}

void C10dStoreAdapter::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  await(keys, timeout, "wait");
}

int64_t C10dStoreAdapter::add(const std::string& key, int64_t delta) {
  return guarded("add", key, [&] { return store_->add(prefix_ + key, delta); });
}

bool C10dStoreAdapter::check(const std::vector<std::string>& keys) {
  return guarded("check", keys.empty() ? std::string() : keys.front(),
                 [&] { return store_->check(prefixed(keys)); });
}

bool C10dStoreAdapter::remove(const std::string& key) {
  return guarded("deleteKey", key, [&] { return store_->deleteKey(prefix_ + key); });
}

void C10dStoreAdapter::await(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                             const char* op) {
  if (keys.empty()) return;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  if (timeout.count() < 0)
    throw Error(Errc::invalid_argument, std::string("torch.distributed's store: ") + op +
                                            ": a negative timeout (" + std::to_string(timeout.count()) +
                                            " ms); pass 0 or more");
  // 0 looks once (as backplane's TCP store: a key that is there already or never).
  const auto limit = timeout;
  std::chrono::microseconds pause{50};
  const std::vector<std::string> full = prefixed(keys);
  for (;;) {
    if (guarded(op, keys.front(), [&] { return store_->check(full); })) return;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start);
    if (waited >= limit) {
      std::string missing;
      for (const std::string& k : keys) {
        if (guarded(op, k, [&] { return store_->check({prefix_ + k}); })) continue;
        missing += (missing.empty() ? "\"" : ", \"") + k + "\"";
      }
      throw Error(Errc::timeout, std::string("torch.distributed's store: ") + op + ": key " + missing +
                                     " did not appear within " + std::to_string(waited.count()) +
                                     " ms (a rank did not arrive: check that every rank makes the same "
                                     "process groups and collectives)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
  }
}

}  // namespace backplane::torch_bridge
