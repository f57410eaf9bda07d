// The cpu plugin's collectives over Gloo's TCP transport. Gloo provides the
// rendezvous (through the host's key-value store), the full mesh of TCP
// connections and unbound send/recv buffers; the algorithms are written here
// on top of those, so that every wait has the collective's deadline and knows
// which peer it waits for, counts are 64-bit, and any dtype and element count
// (including ones not divisible by the world size) work.
//
// Algorithms, chosen by the bytes each rank would exchange:
//  - small (<= kDirectMaxBytes per rank): one round, every rank sends its data
//    to every other rank and reduces locally in rank order (identical results
//    everywhere, latency of a single message);
//  - large: ring reduce-scatter then ring all-gather, both pipelined in
//    segments of kSegmentBytes with kRecvDepth receives in flight, so that
//    reducing one segment overlaps the transfer of the next.
#include "collectives.hpp"
#include "dtypes.hpp"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <backplane/plugin.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collective_math.hpp"
#include "host_buffer.hpp"

namespace backplane::cpu {
namespace {

using plugin::fail;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Tuning, measured with two processes on one 2-core machine (see the README):
// all_reduce of 64 MiB f32 and of 4 KiB against PyTorch's gloo all_reduce.
// Below kDirectMaxBytes of traffic per rank one direct round beats the ring's
// 2 (n - 1) steps; above it the ring moves 2 (n - 1) / n of the data per rank
// instead of (n - 1) times.
constexpr uint64_t kDirectMaxBytes = uint64_t{256} << 10;
// Ring segments: 1 MiB keeps the per-message overhead small and the receive
// scratch cache-resident; at least kMinSegments per chunk (when chunks are
// large enough) keeps mid-sized collectives pipelined.
constexpr uint64_t kSegmentBytes = uint64_t{1} << 20;
constexpr uint64_t kMinSegments = 4;
constexpr uint64_t kMinSegmentBytes = uint64_t{32} << 10;
// Receives posted ahead in a ring reduce-scatter (each a segment of scratch).
constexpr uint64_t kRecvDepth = 4;
// Scratch above this size is released after each collective instead of kept.
constexpr uint64_t kScratchKeepBytes = uint64_t{64} << 20;

constexpr uint64_t kCommLiveMagic = 0x636f6d6d6c697665ULL;  // arbitrary, non-zero
constexpr uint64_t kCommDeadMagic = 0x636f6d6d64656164ULL;



const char* reduce_op_name(int32_t op) noexcept {
  switch (op) {
    case BP_REDUCE_SUM:
      return "sum";
    case BP_REDUCE_MEAN:
      return "mean";
    case BP_REDUCE_MIN:
      return "min";
    case BP_REDUCE_MAX:
      return "max";
    case BP_REDUCE_PROD:
      return "prod";
    default:
      return nullptr;
  }
}

int mod(int64_t a, int n) noexcept { return static_cast<int>(((a % n) + n) % n); }

// splitmix64's finalizer: every input bit affects every output bit.
constexpr uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
constexpr uint64_t hash_with(uint64_t seed, uint64_t value) noexcept {
  return mix64(seed ^ mix64(value + 0x9e3779b97f4a7c15ULL));
}

// Gloo writes to sockets whose peer may have gone; on Linux that raises
// SIGPIPE, which kills a process that did not ignore it. The loop thread Gloo
// starts inherits the mask of the thread creating the device, and writes on the
// calling thread happen inside a collective: both run with SIGPIPE blocked, and
// a SIGPIPE raised meanwhile is consumed before the mask is restored. The
// process-wide disposition is left alone (it belongs to the application).
class SigpipeBlock {
 public:
  SigpipeBlock() noexcept {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t previous_;
  bool was_pending_ = false;
};

// Gloo prefixes its messages with "[file:line] "; the location means nothing to users.
std::string gloo_text(const std::exception& e) {
  std::string text = e.what();
  if (text.size() > 2 && text[0] == '[') {
    const auto close = text.find("] ");
    if (close != std::string::npos && text.find(':') < close) text.erase(0, close + 2);
  }
  return text;
}

bool contains(std::string_view text, std::string_view part) noexcept {
  return text.find(part) != std::string_view::npos;
}

// "[10.0.0.5]:41234" (Gloo's form) -> "10.0.0.5:41234"; IPv6 keeps its brackets.
std::string display_address(const std::string& gloo_address) {
  if (gloo_address.size() > 2 && gloo_address[0] == '[') {
    const auto close = gloo_address.find(']');
    if (close != std::string::npos) {
      const std::string host = gloo_address.substr(1, close - 1);
      if (host.find(':') == std::string::npos) return host + gloo_address.substr(close + 1);
    }
  }
  return gloo_address;
}

// Every "[host]:port" in a Gloo message, in order.
std::vector<std::string> addresses_in(const std::string& text) {
  std::vector<std::string> found;
  for (std::size_t open = text.find('['); open != std::string::npos; open = text.find('[', open + 1)) {
    const auto close = text.find(']', open);
    if (close == std::string::npos || close + 2 >= text.size() || text[close + 1] != ':') continue;
    std::size_t end = close + 2;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end > close + 2) found.push_back(text.substr(open, end - open));
  }
  return found;
}

// A collective's failure: the status to return and poison the comm with.
struct CommFailure {
  bp_status_code code;
  std::string message;
};

// ---------------------------------------------------------------------------
// The host's key-value store, as Gloo's rendezvous store
// ---------------------------------------------------------------------------

struct StoreFailure {
  bp_status_code code;
  std::string operation;          // "set", "get", "wait"
  std::vector<std::string> keys;  // as Gloo named them (without the prefix)
  std::string detail;             // the store's last_error
};

class KvStore final : public gloo::rendezvous::Store {
 public:
  KvStore(const bp_kv_store& kv, std::string prefix, Clock::time_point deadline)
      : kv_(kv), prefix_(std::move(prefix)), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const std::string full = prefix_ + key;
    check(kv_.set(kv_.ctx, full.c_str(), data.data(), data.size()), "set", {key});
  }

  std::vector<char> get(const std::string& key) override {
    const std::string full = prefix_ + key;
    bp_kv_bytes bytes{nullptr, 0};
    check(kv_.get(kv_.ctx, full.c_str(), remaining_ms("get", {key}), &bytes), "get", {key});
    std::vector<char> value;
    try {
      value.assign(reinterpret_cast<const char*>(bytes.data),
                   reinterpret_cast<const char*>(bytes.data) + bytes.size);
    } catch (...) {
      kv_.free_bytes(kv_.ctx, &bytes);
      throw;
    }
    kv_.free_bytes(kv_.ctx, &bytes);
    seen_[key] = value;
    return value;
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, milliseconds(0)); }

  // The timeout Gloo passes is ignored: every call shares comm_create's deadline.
  void wait(const std::vector<std::string>& keys, const milliseconds&) override {
    std::vector<std::string> full;
    std::vector<const char*> pointers;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    for (const auto& k : full) pointers.push_back(k.c_str());
    check(
        kv_.wait(kv_.ctx, pointers.data(), static_cast<int32_t>(pointers.size()), remaining_ms("wait", keys)),
        "wait", keys);
  }

  // Values read so far, by key (the address lists of ranks already joined).
  const std::map<std::string, std::vector<char>>& seen() const noexcept { return seen_; }

 private:
  int64_t remaining_ms(const char* operation, const std::vector<std::string>& keys) const {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now()).count();
    if (left <= 0) throw StoreFailure{BP_STATUS_TIMEOUT, operation, keys, "no time left before the deadline"};
    return left;
  }

  void check(int32_t code, const char* operation, const std::vector<std::string>& keys) const {
    if (code == BP_STATUS_OK) return;
    const char* detail = kv_.last_error != nullptr ? kv_.last_error(kv_.ctx) : nullptr;
    const bp_status_code status =
        code == BP_STATUS_TIMEOUT
            ? BP_STATUS_TIMEOUT
            : (code == BP_STATUS_OUT_OF_MEMORY ? BP_STATUS_OUT_OF_MEMORY : BP_STATUS_IO);
    throw StoreFailure{status, operation, keys,
                       detail != nullptr && *detail != '\0' ? detail : "the store gave no reason"};
  }

  const bp_kv_store& kv_;
  const std::string prefix_;
  const Clock::time_point deadline_;
  std::map<std::string, std::vector<char>> seen_;
};

// ---------------------------------------------------------------------------
// Where to listen
// ---------------------------------------------------------------------------

// True when `host` resolves to an address this machine can bind (as PyTorch
// decides whether to use the hostname).
bool resolves_to_usable_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return false;
  bool usable = false;
  for (addrinfo* a = list; a != nullptr && !usable; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    usable = bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // the port in ai_addr is 0: any free one
    close(fd);
  }
  freeaddrinfo(list);
  return usable;
}

// Checks that interface `name` has an IPv4 or IPv6 address, as Gloo will look
// for one; otherwise fails naming the interfaces that do. (Checked here because
// Gloo's own lookup leaks its interface list when the name is unknown.)
void check_interface(const std::string& name, const std::string& source) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return;  // let Gloo report it
  bool found = false;
  std::vector<std::string> usable;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
      continue;
    if (name == i->ifa_name) found = true;
    if (std::find(usable.begin(), usable.end(), i->ifa_name) == usable.end())
      usable.emplace_back(i->ifa_name);
  }
  freeifaddrs(list);
  if (found) return;
  std::string names;
  for (const auto& u : usable) names += (names.empty() ? "" : ", ") + u;
  fail(BP_STATUS_INVALID_ARGUMENT,
       "cpu: comm_create: " + source + " names interface \"" + name +
           "\", which does not exist or has no IP address (interfaces with one: " +
           (names.empty() ? "none" : names) + ")");
}

struct ListenAddress {
  gloo::transport::tcp::attr attr;
  std::string description;  // for messages: what was chosen and why
};

ListenAddress choose_listen_address(const NetworkOptions& network) {
  ListenAddress out;
  if (const char* env = std::getenv("GLOO_SOCKET_IFNAME"); env != nullptr && *env != '\0') {
    const std::string name = env;
    if (name.find(',') != std::string::npos)
      fail(BP_STATUS_INVALID_ARGUMENT, "cpu: comm_create: GLOO_SOCKET_IFNAME=\"" + name +
                                           "\" names several interfaces; the cpu backend listens on one: "
                                           "set it to a single interface name");
    check_interface(name, "GLOO_SOCKET_IFNAME");
    out.attr.iface = name;
    out.description = "interface " + name + " (from GLOO_SOCKET_IFNAME)";
  } else if (!network.interface.empty()) {
    check_interface(network.interface, "the cpu option \"interface\"");
    out.attr.iface = network.interface;
    out.description = "interface " + network.interface + " (cpu option \"interface\")";
  } else if (!network.hostname.empty()) {
    out.attr.hostname = network.hostname;
    out.description = "hostname " + network.hostname + " (cpu option \"hostname\")";
  } else {
    // Resolved once per process: with no entry in /etc/hosts the lookup goes
    // to DNS, which can take seconds, and every communicator would pay it
    // inside its rendezvous timeout.
    static char name[256] = {};
    static bool named = false;
    static bool usable = false;
    static std::once_flag resolved;
    std::call_once(resolved, [] {
      named = gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0';
      usable = named && resolves_to_usable_address(name);
    });
    if (usable) {
      out.attr.hostname = name;
      out.description = std::string("hostname ") + name + " (this machine's name)";
    } else {
      out.attr.hostname = "127.0.0.1";
      out.description = std::string("127.0.0.1 (this machine's name") +
                        (named ? std::string(" '") + name + "'" : "") +
                        " does not resolve to an address it can listen on)";
      static std::once_flag warned;
      std::call_once(warned, [&] {
        plugin::log(BP_LOG_WARNING, "cpu: collectives listen on " + out.description +
                                        "; only ranks on this machine can connect. For jobs that span "
                                        "machines set GLOO_SOCKET_IFNAME or the cpu option \"interface\"");
      });
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------

// A validated contiguous tensor: `count` elements of `esize` bytes at `data`.
struct HostSpan {
  unsigned char* data;
  uint64_t count;
  uint64_t bytes;
};

HostSpan span_of(const bp_tensor& t, const std::string& where, int esize) {
  auto bad = [&](const std::string& what) { fail(BP_STATUS_INVALID_ARGUMENT, where + ": " + what); };
  if (t.buffer == nullptr) bad("buffer is NULL");
  if (!is_live(t.buffer)) bad("buffer is not a live cpu buffer (freed, or another backend's)");
  if (t.device != 0) bad("no device " + std::to_string(t.device) + " (the cpu backend has 1 device)");
  if (t.ndim < 0 || t.ndim > kMaxDims)
    bad("ndim " + std::to_string(t.ndim) + " is outside [0, " + std::to_string(kMaxDims) + "]");
  if (t.ndim > 0 && (t.shape == nullptr || t.strides == nullptr)) bad("shape or strides is NULL");
  uint64_t count = 1;
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0)
      bad("extent " + std::to_string(t.shape[d]) + " of dimension " + std::to_string(d) + " is negative");
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(t.shape[d]), &count))
      bad("element count overflows");
  }
  // Row-major: each stride is the product of the extents after it (extent-1
  // dimensions may carry any stride).
  uint64_t expected = 1;
  for (int32_t d = t.ndim - 1; d >= 0 && count > 1; --d) {
    if (t.shape[d] != 1 && static_cast<uint64_t>(t.strides[d]) != expected)
      bad("is not contiguous (stride " + std::to_string(t.strides[d]) + " of dimension " + std::to_string(d) +
          ", expected " + std::to_string(expected) + "); collectives take contiguous row-major tensors");
    expected *= static_cast<uint64_t>(t.shape[d]);
  }
  if (t.byte_offset % static_cast<uint64_t>(esize) != 0)
    bad("byte_offset " + std::to_string(t.byte_offset) + " is not a multiple of the element size (" +
        std::to_string(esize) + ")");
  uint64_t bytes = 0;
  uint64_t end = 0;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(esize), &bytes) ||
      __builtin_add_overflow(bytes, t.byte_offset, &end) || end > buffer_size(t.buffer))
    bad("view (byte_offset " + std::to_string(t.byte_offset) + ", " + std::to_string(count) +
        " elements) reaches outside its buffer of " + std::to_string(buffer_size(t.buffer)) + " bytes");
  return {buffer_data(t.buffer) + t.byte_offset, count, bytes};
}

bool overlap(const HostSpan& a, const HostSpan& b) noexcept {
  return a.bytes > 0 && b.bytes > 0 && a.data < b.data + b.bytes && b.data < a.data + a.bytes;
}

// `count` elements split into n chunks (near-equal, or of `block` each), each
// split into m segments. Identical on every rank for the same arguments, which
// is what keeps the ranks' sends and receives matched.
class Chunks {
 public:
  static Chunks balanced(uint64_t count, int n, int esize) { return Chunks(count / n, count % n, n, esize); }
  static Chunks blocks(uint64_t block, int n, int esize) { return Chunks(block, 0, n, esize); }

  uint64_t begin(int c) const noexcept {
    return static_cast<uint64_t>(c) * base_ + std::min<uint64_t>(c, rem_);
  }
  uint64_t size(int c) const noexcept { return base_ + (static_cast<uint64_t>(c) < rem_ ? 1 : 0); }
  uint64_t segments() const noexcept { return m_; }
  uint64_t max_segment_bytes() const noexcept { return max_segment_bytes_; }
  // Segment k of chunk c: element offset within the chunk, and length.
  std::pair<uint64_t, uint64_t> segment(int c, uint64_t k) const noexcept {
    const unsigned __int128 length = size(c);
    const auto first = static_cast<uint64_t>(length * k / m_);
    const auto last = static_cast<uint64_t>(length * (k + 1) / m_);
    return {first, last - first};
  }

 private:
  Chunks(uint64_t base, uint64_t rem, int n, int esize) : base_(base), rem_(rem) {
    (void)n;
    const uint64_t largest = (base + (rem > 0 ? 1 : 0)) * static_cast<uint64_t>(esize);
    m_ = std::max<uint64_t>(1, (largest + kSegmentBytes - 1) / kSegmentBytes);
    m_ = std::max(m_, std::min(kMinSegments, largest / kMinSegmentBytes));
    const uint64_t largest_elems = base + (rem > 0 ? 1 : 0);
    max_segment_bytes_ = (largest_elems + m_ - 1) / m_ * static_cast<uint64_t>(esize);
  }

  uint64_t base_;
  uint64_t rem_;
  uint64_t m_ = 1;
  uint64_t max_segment_bytes_ = 0;
};

using UnboundBuffer = gloo::transport::UnboundBuffer;

// Where a chunk's bytes are: an unbound buffer (for Gloo) and the same bytes
// as a pointer (for the reduction).
struct Place {
  UnboundBuffer* buffer;
  uint64_t offset;  // bytes into buffer
  unsigned char* data;
};

}  // namespace

// ---------------------------------------------------------------------------
// The communicator
// ---------------------------------------------------------------------------

struct Communicator::Impl {
  int32_t rank = 0;
  int32_t size = 1;
  milliseconds timeout{0};
  std::string key_prefix;
  // Declared before context: the context's pairs refer to the device, so it
  // must go first.
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  // Buffers of collectives that failed. Gloo's I/O thread may still be
  // signalling them (it reports a peer's failure to every pending buffer), so
  // they live until the context and device are gone; a failed comm is
  // poisoned, so this only ever holds one collective's buffers.
  std::vector<std::shared_ptr<UnboundBuffer>> failed_buffers;
  // Gloo names a peer by its socket address ("[ip]:port"): the address each
  // peer listened on and the one each connection has at the peer's end.
  std::map<std::string, int32_t> rank_of_address;
  std::vector<std::string> address_of_rank;  // display form, for messages
  uint64_t sequence = 0;                     // collectives run so far (slot numbering)
  bool failed = false;
  CommFailure failure{BP_STATUS_OK, {}};
  // The host's store (NULL in a group of one) and this comm's keys in it.
  const bp_kv_store* store = nullptr;
  std::string store_prefix;
  std::mutex busy;
  std::vector<unsigned char> scratch;

  std::string where(const char* op) const {
    return std::string("cpu: ") + op + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
  }
  std::string peer_text(int32_t peer) const {
    if (peer < 0 || peer >= size) return "a peer";
    const std::string& a = address_of_rank.empty() ? std::string() : address_of_rank[peer];
    return "peer rank " + std::to_string(peer) + (a.empty() ? "" : " (" + a + ")");
  }
  // The rank Gloo's message names, -1 when it names none; `named` gets the
  // first address found (for an address no rank has).
  int32_t peer_in(const std::string& text, std::string& named) const {
    for (const auto& a : addresses_in(text)) {
      if (named.empty()) named = display_address(a);
      const auto it = rank_of_address.find(a);
      if (it != rank_of_address.end()) return it->second;
    }
    return -1;
  }

  // A failing rank leaves its error under "failed/<rank>" before it closes its
  // connections, so that a rank which sees it close can tell its peers why
  // (the root cause, not just "rank 2 closed"). Best effort, never blocking:
  // the store may be what failed.
  void publish_failure(const std::string& message) const noexcept {
    if (store == nullptr) return;
    try {
      const std::string key = store_prefix + "failed/" + std::to_string(rank);
      store->set(store->ctx, key.c_str(), message.data(), message.size());
    } catch (...) {
      // Nothing to do: the peers then report the closed connection alone.
    }
  }
  // The error `peer` published before closing, or "" (it exited, or the store is gone).
  std::string failure_of(int32_t peer) const noexcept {
    if (store == nullptr || peer < 0 || peer >= size) return "";
    try {
      const std::string key = store_prefix + "failed/" + std::to_string(peer);
      bp_kv_bytes bytes{nullptr, 0};
      // The peer wrote the key before closing, so it is there already or never.
      if (store->get(store->ctx, key.c_str(), 0, &bytes) != BP_STATUS_OK) return "";
      std::string text(reinterpret_cast<const char*>(bytes.data), bytes.size);
      store->free_bytes(store->ctx, &bytes);
      return text;
    } catch (...) {
      return "";
    }
  }

  unsigned char* scratch_bytes(uint64_t bytes) {
    if (scratch.size() < bytes) {
      scratch.clear();
      scratch.shrink_to_fit();
      scratch.resize(bytes);  // zero-filled: the pages are touched once, not on every use
    }
    return scratch.data();
  }
};

namespace {

enum class Direction { receive, send };

// One collective in progress: its deadline, slots, and Gloo calls that turn
// every exception into a CommFailure naming the peer.
//
// Gloo matches a receive with a send by slot, and a peer that sends more bytes
// than the receive was posted for makes Gloo's I/O thread terminate the
// process. So every message's slot is a hash of the collective's sequence
// number, its operation and arguments (`call`: dtype, counts, reduce op, root),
// the phase and the message's own length: ranks that disagree on any of them
// never match, and the collective times out with an error instead.
class Run {
 public:
  Run(Communicator::Impl& comm, const char* op, std::initializer_list<uint64_t> call)
      : c_(comm), op_(op), deadline_(Clock::now() + comm.timeout), signature_(mix64(comm.sequence++)) {
    for (const char* p = op; *p != '\0'; ++p)
      signature_ = hash_with(signature_, static_cast<unsigned char>(*p));
    for (uint64_t v : call) signature_ = hash_with(signature_, v);
  }

  int rank() const noexcept { return c_.rank; }
  int size() const noexcept { return c_.size; }
  // The slot family of one phase; send and recv add the message length.
  uint64_t slot(uint64_t phase) const noexcept { return hash_with(signature_, phase); }

  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  ~Run() {
    // Leaving by an exception: Gloo may still touch this run's buffers.
    if (std::uncaught_exceptions() > exceptions_at_start_)
      for (auto& b : buffers_) c_.failed_buffers.push_back(std::move(b));
  }

  std::shared_ptr<UnboundBuffer> buffer(void* data, uint64_t bytes) {
    try {
      std::shared_ptr<UnboundBuffer> b = c_.context->createUnboundBuffer(data, bytes);
      buffers_.push_back(b);
      return b;
    } catch (const std::exception& e) {
      throw translate(e, -1, Direction::send);
    }
  }
  void send(UnboundBuffer& b, int peer, uint64_t slot, uint64_t offset, uint64_t bytes) {
    try {
      b.send(peer, hash_with(slot, bytes), offset, bytes);
    } catch (const std::exception& e) {
      throw translate(e, peer, Direction::send);
    }
  }
  void recv(UnboundBuffer& b, int peer, uint64_t slot, uint64_t offset, uint64_t bytes) {
    try {
      b.recv(peer, hash_with(slot, bytes), offset, bytes);
    } catch (const std::exception& e) {
      throw translate(e, peer, Direction::receive);
    }
  }
  // Waits for one receive (or send) on b to complete; `peer` is the rank this
  // most likely waits for (named in a timeout). Returns the rank it completed with.
  int wait_recv(UnboundBuffer& b, int peer) { return wait(b, peer, Direction::receive); }
  int wait_send(UnboundBuffer& b, int peer) { return wait(b, peer, Direction::send); }

  CommFailure translate(const std::exception& e, int expected, Direction direction) const {
    const std::string text = gloo_text(e);
    std::string named;
    int peer = c_.peer_in(text, named);
    const bool timed_out = contains(text, "Timed out") || contains(text, "timeout");
    std::string who =
        peer >= 0 ? c_.peer_text(peer)
                  : (!named.empty() ? "a peer at " + named + " (no rank of this group has that address)"
                                    : c_.peer_text(expected));
    const std::string base = c_.where(op_) + ": ";
    const std::string gloo = " [gloo: " + text + "]";
    if (timed_out)
      return {BP_STATUS_TIMEOUT,
              base + "timed out after " + std::to_string(c_.timeout.count()) + " ms waiting for " + who +
                  (direction == Direction::receive ? " to send its data" : " to receive our data") +
                  " (is that rank still running, and did every rank call " + op_ +
                  " with the same arguments in the same order?)" + gloo};
    if (contains(text, "doesn't match expected size"))
      return {BP_STATUS_COLLECTIVE, base + who +
                                        " sent more data than this rank expected: the ranks called " + op_ +
                                        " with different sizes, or collectives in a different order" + gloo};
    if (contains(text, "closed") || contains(text, "reset") || contains(text, "Read error") ||
        contains(text, "writev") || contains(text, "Broken pipe")) {
      const std::string cause = c_.failure_of(peer);
      if (!cause.empty())
        return {BP_STATUS_COLLECTIVE,
                base + who + " closed the connection after failing itself: " + cause + gloo};
      return {BP_STATUS_COLLECTIVE, base + who + " closed the connection (did it exit or fail?)" + gloo};
    }
    return {BP_STATUS_COLLECTIVE, base + "communication with " + who + " failed" + gloo};
  }

 private:
  int wait(UnboundBuffer& b, int peer, Direction direction) {
    const auto left = std::max<milliseconds::rep>(
        0, std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now()).count());
    int source = -1;
    bool done = false;
    try {
      done = direction == Direction::receive ? b.waitRecv(&source, milliseconds(left))
                                             : b.waitSend(&source, milliseconds(left));
    } catch (const std::exception& e) {
      throw translate(e, peer, direction);
    }
    if (!done)  // only an abort returns false, and nothing here aborts
      throw CommFailure{BP_STATUS_INTERNAL, c_.where(op_) + ": a Gloo wait was aborted unexpectedly"};
    return source;
  }

  Communicator::Impl& c_;
  const int exceptions_at_start_ = std::uncaught_exceptions();
  std::vector<std::shared_ptr<UnboundBuffer>> buffers_;
  const char* op_;
  const Clock::time_point deadline_;
  uint64_t signature_;
};

// Sends still to be awaited, per buffer (a collective awaits all before it returns).
class PendingSends {
 public:
  void add(UnboundBuffer* b, int peer) { pending_.emplace_back(b, peer); }
  void wait_all(Run& run) {
    // Completions on one buffer are counted, not matched: wait as many times
    // as sends were posted; the peer named on a timeout is the earliest one.
    for (std::size_t i = 0; i < pending_.size(); ++i) run.wait_send(*pending_[i].first, pending_[i].second);
    pending_.clear();
  }

 private:
  std::vector<std::pair<UnboundBuffer*, int>> pending_;
};

// Ring reduce-scatter over the chunks of `ch`: at step s this rank sends chunk
// (rank - s + shift) to its right neighbour and receives chunk (rank - s - 1 +
// shift) from its left, reduced with its own part into dst(c). After n - 1
// steps dst(rank + 1 + shift) holds the reduction over all ranks; every chunk
// but (rank + shift) is written once. Step 0 sends local data; later steps
// forward what was just reduced, segment by segment.
template <class LocalFn, class DstFn>
void ring_reduce_scatter(Run& run, const Chunks& ch, int shift, int esize, CombineFn combine, LocalFn local,
                         DstFn dst, unsigned char* recv_area, uint64_t slot) {
  const int n = run.size();
  const int r = run.rank();
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  const uint64_t m = ch.segments();
  const uint64_t steps = static_cast<uint64_t>(n - 1) * m;
  const uint64_t depth = std::min(kRecvDepth, steps);
  const uint64_t stride = ch.max_segment_bytes();
  auto recv_buffer = run.buffer(recv_area, depth * stride);
  auto recv_chunk = [&](uint64_t j) { return mod(r - static_cast<int64_t>(j / m) - 1 + shift, n); };
  auto post_recv = [&](uint64_t j) {
    const auto [first, length] = ch.segment(recv_chunk(j), j % m);
    (void)first;
    if (length > 0) run.recv(*recv_buffer, left, slot, (j % depth) * stride, length * esize);
  };
  for (uint64_t j = 0; j < depth; ++j) post_recv(j);

  PendingSends sends;
  const int first_chunk = mod(r + shift, n);
  const Place start = local(first_chunk);
  for (uint64_t k = 0; k < m; ++k) {
    const auto [first, length] = ch.segment(first_chunk, k);
    if (length == 0) continue;
    run.send(*start.buffer, right, slot, start.offset + first * esize, length * esize);
    sends.add(start.buffer, right);
  }
  for (uint64_t j = 0; j < steps; ++j) {
    const int c = recv_chunk(j);
    const auto [first, length] = ch.segment(c, j % m);
    if (length > 0) {
      run.wait_recv(*recv_buffer, left);
      const Place to = dst(c);
      combine(to.data + first * esize, local(c).data + first * esize, recv_area + (j % depth) * stride,
              length);
      if (j / m + 2 < static_cast<uint64_t>(n)) {  // not the last step: forward it
        run.send(*to.buffer, right, slot, to.offset + first * esize, length * esize);
        sends.add(to.buffer, right);
      }
    }
    if (j + depth < steps) post_recv(j + depth);
  }
  sends.wait_all(run);
}

// Ring all-gather over the chunks of `ch`: this rank holds chunk `have` in
// place(have); at step s it sends chunk (have - s) right and receives chunk
// (have - s - 1) from the left, straight into place (every receive is posted
// up front), forwarding each segment as it lands.
template <class PlaceFn>
void ring_all_gather(Run& run, const Chunks& ch, int have, int esize, PlaceFn place, uint64_t slot) {
  const int n = run.size();
  const int r = run.rank();
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  const uint64_t m = ch.segments();
  for (int s = 0; s + 1 < n; ++s) {
    const int c = mod(have - s - 1, n);
    const Place p = place(c);
    for (uint64_t k = 0; k < m; ++k) {
      const auto [first, length] = ch.segment(c, k);
      if (length > 0) run.recv(*p.buffer, left, slot, p.offset + first * esize, length * esize);
    }
  }
  PendingSends sends;
  const Place own = place(have);
  for (uint64_t k = 0; k < m; ++k) {
    const auto [first, length] = ch.segment(have, k);
    if (length == 0) continue;
    run.send(*own.buffer, right, slot, own.offset + first * esize, length * esize);
    sends.add(own.buffer, right);
  }
  for (int s = 0; s + 1 < n; ++s) {
    const int c = mod(have - s - 1, n);
    const Place p = place(c);
    for (uint64_t k = 0; k < m; ++k) {
      const auto [first, length] = ch.segment(c, k);
      if (length == 0) continue;
      run.wait_recv(*p.buffer, left);
      if (s + 2 < n) {
        run.send(*p.buffer, right, slot, p.offset + first * esize, length * esize);
        sends.add(p.buffer, right);
      }
    }
  }
  sends.wait_all(run);
}

// One direct round: `mine` (bytes at this rank) goes to every peer; peer p's
// reply lands in `into` at p * bytes. Receives complete in any order.
void exchange_all(Run& run, UnboundBuffer& send_from, uint64_t send_offset, UnboundBuffer& into,
                  const std::vector<uint64_t>& recv_offsets, uint64_t bytes, uint64_t slot,
                  const std::vector<uint64_t>* send_offsets = nullptr) {
  const int n = run.size();
  const int r = run.rank();
  for (int d = 1; d < n; ++d) {
    const int p = mod(r - d, n);
    run.recv(into, p, slot, recv_offsets[p], bytes);
  }
  for (int d = 1; d < n; ++d) {  // staggered, so that not every rank starts with rank 0
    const int p = mod(r + d, n);
    run.send(send_from, p, slot, send_offsets != nullptr ? (*send_offsets)[p] : send_offset, bytes);
  }
  std::vector<bool> arrived(n, false);
  arrived[r] = true;
  for (int i = 1; i < n; ++i) {
    const int expected = static_cast<int>(std::find(arrived.begin(), arrived.end(), false) - arrived.begin());
    const int from = run.wait_recv(into, expected);
    if (from >= 0 && from < n) arrived[from] = true;
  }
  std::vector<bool> taken(n, false);
  taken[r] = true;
  for (int i = 1; i < n; ++i) {
    const int expected = static_cast<int>(std::find(taken.begin(), taken.end(), false) - taken.begin());
    const int to = run.wait_send(send_from, expected);
    if (to >= 0 && to < n) taken[to] = true;
  }
}

// out = blocks[0] (op) blocks[1] (op) ... in rank order, so every rank computes
// bit-identical results. `blocks` holds n blocks of `count` elements.
void reduce_in_rank_order(CombineFn combine, unsigned char* out, const unsigned char* blocks, uint64_t count,
                          int esize, int n) {
  const uint64_t bytes = count * esize;
  combine(out, blocks, blocks + bytes, count);
  for (int p = 2; p < n; ++p) combine(out, out, blocks + p * bytes, count);
}

}  // namespace

// ---------------------------------------------------------------------------
// Creation
// ---------------------------------------------------------------------------

Communicator::Communicator(std::unique_ptr<Impl> impl) : magic_(kCommLiveMagic), impl_(std::move(impl)) {}

Communicator::~Communicator() {
  magic_ = kCommDeadMagic;
  if (impl_ != nullptr && impl_->context != nullptr) {
    const SigpipeBlock
        block;  // closing flushes nothing, but a racing write on the loop thread may still fail
    impl_->context.reset();
    impl_->device.reset();
    impl_->failed_buffers.clear();
  }
}

Communicator& Communicator::from_handle(bp_comm* comm, const char* op) {
  if (comm == nullptr)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cpu: ") + op + ": the communicator is NULL");
  auto* c = reinterpret_cast<Communicator*>(comm);
  if (c->magic_ != kCommLiveMagic)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cpu: ") + op +
                                         ": the handle is not a live cpu communicator (destroyed, or another "
                                         "backend's)");
  return *c;
}

namespace {

void validate_create_args(const bp_comm_create_args& a) {
  auto bad = [](const std::string& what) { fail(BP_STATUS_INVALID_ARGUMENT, "cpu: comm_create: " + what); };
  if (!BP_HAS_FIELD(bp_comm_create_args, key_prefix, a.struct_size))
    bad("bp_comm_create_args.struct_size " + std::to_string(a.struct_size) + " is too small (need " +
        std::to_string(sizeof(bp_comm_create_args)) + ")");
  if (a.device != 0) bad("no device " + std::to_string(a.device) + " (the cpu backend has 1 device)");
  if (a.world_size < 1) bad("world_size must be at least 1, got " + std::to_string(a.world_size));
  if (a.rank < 0 || a.rank >= a.world_size)
    bad("rank " + std::to_string(a.rank) + " is outside [0, " + std::to_string(a.world_size) + ")");
  if (a.timeout_ms <= 0) bad("timeout_ms must be positive, got " + std::to_string(a.timeout_ms));
  if (a.world_size == 1) return;  // a group of one never talks to the store
  if (a.store == nullptr) bad("the key-value store is NULL (a group of more than one rank needs it)");
  const bp_kv_store& s = *a.store;
  if (!BP_HAS_FIELD(bp_kv_store, last_error, s.struct_size) || s.set == nullptr || s.get == nullptr ||
      s.wait == nullptr || s.free_bytes == nullptr)
    bad("the key-value store lacks set, get, wait or free_bytes (struct_size " +
        std::to_string(s.struct_size) + ")");
}

// The rank a rendezvous key belongs to, or -1. Gloo's full-mesh connect uses
// "rank_<r>" (the rank's host name) and "<r>" (its addresses); this file adds
// "conn/<r>".
int32_t rank_of_key(const std::string& key, int32_t size) {
  std::string digits = key;
  for (const char* prefix : {"rank_", "conn/"})
    if (key.rfind(prefix, 0) == 0) digits = key.substr(std::strlen(prefix));
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  const int32_t r = std::stoi(digits);
  return r < size ? r : -1;
}

// The address lists gloo's full-mesh connect publishes: key "<rank>" holds, for
// each other rank q in order, the address rank <rank> listens on for q.
void learn_published_addresses(Communicator::Impl& c, const std::map<std::string, std::vector<char>>& seen) {
  for (const auto& [key, bytes] : seen) {
    const int32_t p = rank_of_key(key, c.size);
    if (p < 0 || p == c.rank || key.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::size_t each = bytes.size() / static_cast<std::size_t>(c.size - 1);
    const std::size_t index = static_cast<std::size_t>(c.rank < p ? c.rank : c.rank - 1);
    if (each == 0 || bytes.size() % static_cast<std::size_t>(c.size - 1) != 0) continue;
    try {
      const gloo::transport::tcp::Address a(
          std::vector<char>(bytes.begin() + index * each, bytes.begin() + (index + 1) * each));
      c.rank_of_address[a.str()] = p;
      c.address_of_rank[p] = display_address(a.str());
    } catch (const std::exception&) {
      // An address this Gloo cannot parse only makes messages less specific.
    }
  }
}

}  // namespace

std::unique_ptr<Communicator> Communicator::create(const bp_comm_create_args& args,
                                                   const NetworkOptions& network) {
  validate_create_args(args);
  auto impl = std::make_unique<Impl>();
  Impl& c = *impl;
  c.rank = args.rank;
  c.size = args.world_size;
  c.timeout = milliseconds(args.timeout_ms);
  c.key_prefix = args.key_prefix != nullptr ? args.key_prefix : "";
  c.address_of_rank.assign(c.size, std::string());
  if (c.size == 1) return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));

  const SigpipeBlock block;  // Gloo's loop thread starts here and inherits the mask
  const std::string where = c.where("comm_create");
  const Clock::time_point deadline = Clock::now() + c.timeout;
  const ListenAddress listen = choose_listen_address(network);
  try {
    c.device = gloo::transport::tcp::CreateDevice(listen.attr);
  } catch (const std::exception& e) {
    fail(BP_STATUS_INVALID_ARGUMENT, where + ": cannot listen on " + listen.description + ": " +
                                         gloo_text(e) +
                                         " (check the interface name with `ip link`, or the hostname)");
  }

  c.store = args.store;
  c.store_prefix = c.key_prefix + "cpu.gloo/";
  KvStore store(*args.store, c.store_prefix, deadline);
  auto store_failure = [&](const StoreFailure& f, const char* stage) -> plugin::Failure {
    std::string keys;
    for (const auto& k : f.keys)
      keys += (keys.empty() ? "" : ", ") + ("\"" + c.key_prefix + "cpu.gloo/" + k + "\"");
    std::string why;
    // A wait on another rank's key that times out: that rank never joined.
    const int32_t missing = f.keys.size() == 1 ? rank_of_key(f.keys[0], c.size) : -1;
    if (f.code == BP_STATUS_TIMEOUT && f.operation != "set" && missing >= 0) {
      why = "rank " + std::to_string(missing) + " did not " +
            (f.keys[0].rfind("conn/", 0) == 0 ? "finish connecting" : "join") + " within " +
            std::to_string(c.timeout.count()) +
            " ms (did it start, and call comm_create with the same world size and key prefix?)";
    } else {
      why = "the key-value store failed to " + f.operation + " " + keys;
    }
    return plugin::Failure(f.code, where + ": " + stage + ": " + why + " [store: " + f.detail + "]");
  };

  // Gloo waits up to 5x the context timeout for one pair to connect; a fifth
  // keeps connecting within the caller's timeout. Collectives pass their own
  // timeouts to every wait, so this setting matters only here.
  c.context = std::make_shared<gloo::rendezvous::Context>(c.rank, c.size);
  c.context->setTimeout(std::max(milliseconds(1), c.timeout / 5));
  try {
    c.context->connectFullMesh(store, c.device);
  } catch (const StoreFailure& f) {
    throw store_failure(f, "rendezvous");
  } catch (const std::exception& e) {
    learn_published_addresses(c, store.seen());
    const std::string text = gloo_text(e);
    std::string named;
    const int32_t peer = c.peer_in(text, named);
    const bool timed_out = contains(text, "timeout") || contains(text, "Timed out");
    fail(timed_out ? BP_STATUS_TIMEOUT : BP_STATUS_COLLECTIVE,
         where + ": connecting to " +
             (peer >= 0 ? c.peer_text(peer) : (named.empty() ? std::string("the other ranks") : named)) +
             (timed_out ? " timed out" : " failed") + " (listening on " + listen.description +
             "; is that rank running, and can it reach this address?) [gloo: " + text + "]");
  }
  c.context->setTimeout(c.timeout);
  learn_published_addresses(c, store.seen());

  // Each connection's address at the far end, for naming peers in errors: the
  // side that accepted a connection knows the peer only by its ephemeral port.
  try {
    std::string mine;
    for (int32_t q = 0; q < c.size; ++q)
      if (q != c.rank) mine += std::to_string(q) + "=" + c.context->getPair(q)->address().str() + "\n";
    store.set("conn/" + std::to_string(c.rank), std::vector<char>(mine.begin(), mine.end()));
    for (int32_t p = 0; p < c.size; ++p) {
      if (p == c.rank) continue;
      const std::string key = "conn/" + std::to_string(p);
      store.wait({key}, c.timeout);
      const std::vector<char> theirs = store.get(key);
      const std::string text(theirs.begin(), theirs.end());
      const std::string tag = std::to_string(c.rank) + "=";
      for (std::size_t at = 0; at < text.size();) {
        const auto end = std::min(text.find('\n', at), text.size());
        if (text.compare(at, tag.size(), tag) == 0)
          c.rank_of_address[text.substr(at + tag.size(), end - at - tag.size())] = p;
        at = end + 1;
      }
    }
  } catch (const StoreFailure& f) {
    throw store_failure(f, "exchanging connection addresses");
  }
  plugin::log(BP_LOG_DEBUG, where + ": connected to " + std::to_string(c.size - 1) + " peers, listening on " +
                                listen.description);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

// ---------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------

namespace {

// Serialises a collective on its communicator, fails fast once poisoned, and
// poisons (closing every connection, so peers fail promptly) on a CommFailure.
template <class Fn>
void guarded(Communicator::Impl& c, const char* op, Fn&& body) {
  std::unique_lock<std::mutex> lock(c.busy, std::try_to_lock);
  if (!lock.owns_lock())
    fail(BP_STATUS_INVALID_ARGUMENT, c.where(op) +
                                         ": another thread is running a collective on this communicator; a "
                                         "communicator runs one collective at a time (serialise the calls)");
  if (c.failed)
    fail(c.failure.code, c.where(op) +
                             ": this communicator failed earlier and can no longer be used (destroy "
                             "it and create a new one); the first error was: " +
                             c.failure.message);
  const SigpipeBlock block;
  // Any failure once the collective has begun leaves the peers out of step
  // with this rank: poison, and close the connections so they notice now
  // rather than at their timeout.
  auto poison = [&](CommFailure f) {
    c.failed = true;
    c.failure = f;
    c.publish_failure(f.message);
    if (c.context != nullptr)
      for (int32_t p = 0; p < c.size; ++p) {
        if (p == c.rank) continue;
        try {
          c.context->getPair(p)->close();
        } catch (const std::exception&) {
          // Already closed or broken: nothing more to do.
        }
      }
    fail(f.code, f.message);
  };
  try {
    body();
  } catch (const CommFailure& f) {
    poison(f);
  } catch (const std::bad_alloc&) {
    poison({BP_STATUS_OUT_OF_MEMORY, c.where(op) + ": out of memory for the collective's scratch space"});
  } catch (const plugin::Failure& f) {
    poison({f.code(), f.what()});
  } catch (const std::exception& e) {
    poison({BP_STATUS_INTERNAL, c.where(op) + ": unexpected error: " + e.what()});
  }
  if (c.scratch.size() > kScratchKeepBytes) {
    c.scratch.clear();
    c.scratch.shrink_to_fit();
  }
}

// True when `bytes` per peer is small enough for one direct round (see kDirectMaxBytes).
bool use_direct_round(uint64_t bytes, int n) noexcept {
  return bytes <= kDirectMaxBytes / static_cast<uint64_t>(n - 1);
}

struct Reduction {
  CombineFn combine;
  DivideFn divide;  // set for mean only
};

Reduction reduction_for(const char* op, int32_t dtype, int32_t reduce_op) {
  const char* name = reduce_op_name(reduce_op);
  if (name == nullptr)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cpu: ") + op + ": unknown reduce op " +
                                         std::to_string(reduce_op) +
                                         " (expected sum 0, mean 1, min 2, max 3 or prod 4)");
  const CombineFn combine = combine_for(dtype, reduce_op);
  if (combine == nullptr)
    fail(BP_STATUS_UNSUPPORTED,
         std::string("cpu: ") + op + " (" + name + "): " + dtype_name(dtype) +
             " tensors cannot be reduced (supported: f32, f64, f16, bf16, i64, i32, i8, "
             "u8); cast first");
  return {combine, reduce_op == BP_REDUCE_MEAN ? divide_for(dtype) : nullptr};
}

int dtype_size_or_fail(const char* op, int32_t dtype) {
  const int esize = element_size(dtype);
  if (esize == 0)
    fail(BP_STATUS_UNSUPPORTED,
         std::string("cpu: ") + op + ": " + dtype_name(dtype) + " is not a dtype the cpu backend knows");
  return esize;
}

void check_same_dtype(const char* op, const bp_tensor& input, const bp_tensor& output) {
  if (input.dtype != output.dtype)
    fail(BP_STATUS_INVALID_ARGUMENT, std::string("cpu: ") + op + ": input is " + dtype_name(input.dtype) +
                                         " but output is " + dtype_name(output.dtype) + "; they must match");
}

}  // namespace

void Communicator::all_reduce(const bp_tensor& input, const bp_tensor& output, int32_t reduce_op) {
  constexpr const char* op = "all_reduce";
  check_same_dtype(op, input, output);
  const int esize = dtype_size_or_fail(op, input.dtype);
  const Reduction red = reduction_for(op, input.dtype, reduce_op);
  HostSpan in = span_of(input, "cpu: all_reduce: input", esize);
  const HostSpan out = span_of(output, "cpu: all_reduce: output", esize);
  if (in.count != out.count)
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: all_reduce: input has " + std::to_string(in.count) +
                                         " elements but output has " + std::to_string(out.count) +
                                         "; they must match");
  Impl& c = *impl_;
  guarded(c, op, [&] {
    if (out.count == 0) return;                     // every rank agrees on the count, so every rank skips
    if (in.data != out.data && overlap(in, out)) {  // partial overlap: reduce in place instead
      std::memmove(out.data, in.data, out.bytes);
      in = out;
    }
    if (c.size == 1) {
      if (in.data != out.data) std::memcpy(out.data, in.data, out.bytes);
      return;
    }
    Run run(c, op, {static_cast<uint64_t>(input.dtype), static_cast<uint64_t>(reduce_op), out.count});
    const int n = c.size;
    const int r = c.rank;
    if (use_direct_round(out.bytes, n)) {
      unsigned char* blocks = c.scratch_bytes(out.bytes * n);
      std::memcpy(blocks + r * out.bytes, in.data, out.bytes);
      auto b = run.buffer(blocks, out.bytes * n);
      std::vector<uint64_t> offsets(n);
      for (int p = 0; p < n; ++p) offsets[p] = p * out.bytes;
      exchange_all(run, *b, r * out.bytes, *b, offsets, out.bytes, run.slot(0));
      reduce_in_rank_order(red.combine, out.data, blocks, out.count, esize, n);
      if (red.divide != nullptr) red.divide(out.data, out.count, n);
      return;
    }
    const Chunks ch = Chunks::balanced(out.count, n, esize);
    unsigned char* recv_area = c.scratch_bytes(kRecvDepth * ch.max_segment_bytes());
    auto out_buffer = run.buffer(out.data, out.bytes);
    std::shared_ptr<UnboundBuffer> in_buffer;
    if (in.data != out.data) in_buffer = run.buffer(in.data, in.bytes);
    UnboundBuffer* in_ub = in_buffer != nullptr ? in_buffer.get() : out_buffer.get();
    auto local = [&](int k) { return Place{in_ub, ch.begin(k) * esize, in.data + ch.begin(k) * esize}; };
    auto place = [&](int k) {
      return Place{out_buffer.get(), ch.begin(k) * esize, out.data + ch.begin(k) * esize};
    };
    ring_reduce_scatter(run, ch, 0, esize, red.combine, local, place, recv_area, run.slot(0));
    const int owned = mod(r + 1, n);
    if (red.divide != nullptr) red.divide(out.data + ch.begin(owned) * esize, ch.size(owned), n);
    ring_all_gather(run, ch, owned, esize, place, run.slot(1));
  });
}

void Communicator::broadcast(const bp_tensor& tensor, int32_t root) {
  constexpr const char* op = "broadcast";
  const int esize = dtype_size_or_fail(op, tensor.dtype);
  const HostSpan t = span_of(tensor, "cpu: broadcast: tensor", esize);
  Impl& c = *impl_;
  if (root < 0 || root >= c.size)
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: broadcast: root " + std::to_string(root) +
                                         " is not a rank of this group (world_size " +
                                         std::to_string(c.size) + ")");
  guarded(c, op, [&] {
    if (t.count == 0 || c.size == 1) return;
    Run run(c, op, {static_cast<uint64_t>(tensor.dtype), t.count, static_cast<uint64_t>(root)});
    const int n = c.size;
    const int r = c.rank;
    auto b = run.buffer(t.data, t.bytes);
    if (n == 2 || t.bytes <= kDirectMaxBytes) {
      if (r == root) {
        PendingSends sends;
        for (int d = 1; d < n; ++d) {
          const int p = mod(r + d, n);
          run.send(*b, p, run.slot(0), 0, t.bytes);
          sends.add(b.get(), p);
        }
        sends.wait_all(run);
      } else {
        run.recv(*b, root, run.slot(0), 0, t.bytes);
        run.wait_recv(*b, root);
      }
      return;
    }
    // A pipelined chain root -> root+1 -> ...: each rank forwards a segment as
    // soon as it has it, so the root uploads the data once, not n - 1 times.
    const Chunks ch = Chunks::blocks(t.count, 1, esize);
    const int position = mod(r - root, n);
    const int next = mod(r + 1, n);
    const int prev = mod(r - 1, n);
    if (position > 0)
      for (uint64_t k = 0; k < ch.segments(); ++k) {
        const auto [first, length] = ch.segment(0, k);
        if (length > 0) run.recv(*b, prev, run.slot(0), first * esize, length * esize);
      }
    PendingSends sends;
    for (uint64_t k = 0; k < ch.segments(); ++k) {
      const auto [first, length] = ch.segment(0, k);
      if (length == 0) continue;
      if (position > 0) run.wait_recv(*b, prev);
      if (position + 1 < n) {
        run.send(*b, next, run.slot(0), first * esize, length * esize);
        sends.add(b.get(), next);
      }
    }
    sends.wait_all(run);
  });
}

void Communicator::all_gather(const bp_tensor& input, const bp_tensor& output) {
  constexpr const char* op = "all_gather";
  check_same_dtype(op, input, output);
  const int esize = dtype_size_or_fail(op, input.dtype);
  const HostSpan in = span_of(input, "cpu: all_gather: input", esize);
  const HostSpan out = span_of(output, "cpu: all_gather: output", esize);
  Impl& c = *impl_;
  const int n = c.size;
  if (out.count / n != in.count || out.count % n != 0)
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: all_gather: output has " + std::to_string(out.count) +
                                         " elements; it must hold world_size (" + std::to_string(n) + ") x " +
                                         std::to_string(in.count) + " (the input's count)");
  guarded(c, op, [&] {
    if (in.count == 0) return;
    const int r = c.rank;
    // The input may overlap the output anywhere: after this move it is not read again.
    if (out.data + r * in.bytes != in.data) std::memmove(out.data + r * in.bytes, in.data, in.bytes);
    if (n == 1) return;
    Run run(c, op, {static_cast<uint64_t>(input.dtype), in.count});
    auto b = run.buffer(out.data, out.bytes);
    if (use_direct_round(in.bytes, n)) {
      std::vector<uint64_t> offsets(n);
      for (int p = 0; p < n; ++p) offsets[p] = p * in.bytes;
      exchange_all(run, *b, r * in.bytes, *b, offsets, in.bytes, run.slot(0));
      return;
    }
    const Chunks ch = Chunks::blocks(in.count, n, esize);
    auto place = [&](int k) { return Place{b.get(), ch.begin(k) * esize, out.data + ch.begin(k) * esize}; };
    ring_all_gather(run, ch, r, esize, place, run.slot(0));
  });
}

void Communicator::reduce_scatter(const bp_tensor& input, const bp_tensor& output, int32_t reduce_op) {
  constexpr const char* op = "reduce_scatter";
  check_same_dtype(op, input, output);
  const int esize = dtype_size_or_fail(op, input.dtype);
  const Reduction red = reduction_for(op, input.dtype, reduce_op);
  const HostSpan in = span_of(input, "cpu: reduce_scatter: input", esize);
  const HostSpan out = span_of(output, "cpu: reduce_scatter: output", esize);
  Impl& c = *impl_;
  const int n = c.size;
  if (in.count / n != out.count || in.count % n != 0)
    fail(BP_STATUS_INVALID_ARGUMENT, "cpu: reduce_scatter: input has " + std::to_string(in.count) +
                                         " elements; it must hold world_size (" + std::to_string(n) + ") x " +
                                         std::to_string(out.count) + " (the output's count)");
  guarded(c, op, [&] {
    if (out.count == 0) return;
    const int r = c.rank;
    const uint64_t block = out.bytes;
    if (n == 1) {
      if (in.data != out.data) std::memmove(out.data, in.data, block);
      return;
    }
    Run run(c, op, {static_cast<uint64_t>(input.dtype), static_cast<uint64_t>(reduce_op), out.count});
    auto in_buffer = run.buffer(in.data, in.bytes);
    if (use_direct_round(block, n)) {
      unsigned char* blocks = c.scratch_bytes(block * n);
      std::memcpy(blocks + r * block, in.data + r * block, block);
      auto b = run.buffer(blocks, block * n);
      std::vector<uint64_t> recv_offsets(n);
      std::vector<uint64_t> send_offsets(n);
      for (int p = 0; p < n; ++p) {
        recv_offsets[p] = p * block;
        send_offsets[p] = p * block;  // peer p gets block p of the input
      }
      exchange_all(run, *in_buffer, 0, *b, recv_offsets, block, run.slot(0), &send_offsets);
      // Every send has completed, so writing the output cannot disturb one even
      // if the output overlaps the input.
      reduce_in_rank_order(red.combine, out.data, blocks, out.count, esize, n);
      if (red.divide != nullptr) red.divide(out.data, out.count, n);
      return;
    }
    // shift -1: this rank ends with chunk r. Partial sums of chunks r-2 ...
    // r-(n-1) live in scratch until forwarded; chunk r goes straight to the
    // output unless the output overlaps the input (then through scratch too).
    const Chunks ch = Chunks::blocks(out.count, n, esize);
    const bool staged = overlap(in, out);
    const uint64_t recv_bytes = kRecvDepth * ch.max_segment_bytes();
    const uint64_t partials = static_cast<uint64_t>(n - 2) + (staged ? 1 : 0);
    unsigned char* area = c.scratch_bytes(recv_bytes + partials * block);
    unsigned char* partial = area + recv_bytes;
    std::shared_ptr<UnboundBuffer> partial_buffer;
    if (partials > 0) partial_buffer = run.buffer(partial, partials * block);
    std::shared_ptr<UnboundBuffer> out_buffer;
    if (!staged) out_buffer = run.buffer(out.data, out.bytes);
    auto local = [&](int k) { return Place{in_buffer.get(), k * block, in.data + k * block}; };
    auto dst = [&](int k) {
      if (k == r && !staged) return Place{out_buffer.get(), 0, out.data};
      const uint64_t index = k == r ? static_cast<uint64_t>(n - 2) : static_cast<uint64_t>(mod(r - 2 - k, n));
      return Place{partial_buffer.get(), index * block, partial + index * block};
    };
    ring_reduce_scatter(run, ch, -1, esize, red.combine, local, dst, area, run.slot(0));
    unsigned char* result = dst(r).data;
    if (red.divide != nullptr) red.divide(result, out.count, n);
    if (staged) std::memcpy(out.data, result, block);
  });
}

void Communicator::barrier() {
  Impl& c = *impl_;
  guarded(c, "barrier", [&] {
    if (c.size == 1) return;
    // Dissemination: in round k every rank signals rank + 2^k and waits for
    // rank - 2^k; after ceil(log2 n) rounds each rank has heard from all.
    Run run(c, "barrier", {});
    const int n = c.size;
    const int r = c.rank;
    unsigned char* bytes = c.scratch_bytes(2);
    bytes[0] = 1;
    auto token = run.buffer(bytes, 1);
    auto inbox = run.buffer(bytes + 1, 1);
    uint64_t round = 0;
    for (int d = 1; d < n; d *= 2, ++round) {
      const int to = mod(r + d, n);
      const int from = mod(r - d, n);
      run.recv(*inbox, from, run.slot(round), 0, 1);
      run.send(*token, to, run.slot(round), 0, 1);
      run.wait_recv(*inbox, from);
      run.wait_send(*token, to);
    }
  });
}

}  // namespace backplane::cpu
