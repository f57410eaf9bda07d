// The shared-memory Link and Transport (see shm_transport.hpp).
//
// The segment: a header, one control block per rank (its doorbell, the
// futex word every event for that rank bumps; whether it sleeps on it; its
// state and process id), then the messages in one of two layouts.
//
// Pairs (groups of up to NetworkOptions::pair_rings_max_ranks): one ring per
// ordered pair of ranks. A ring is a byte stream: the sender advances `head`,
// the receiver `tail`, both counting bytes since the start. A message is a
// 16-byte header (tag, length) followed by its bytes; it may wrap and may be
// written and read in pieces, so a message longer than the ring streams
// through it while both ends make progress in their waits.
//
// Inboxes (larger groups, whose pair rings would grow with the square of the
// group): one ring per rank that all its peers write into. A sender reserves
// a record (a 32-byte header: tag, message length, offset of the piece; then
// up to a quarter of the inbox of the message's bytes) by compare-and-swap on
// `head`, writes it, and publishes it through the record's commit word, kept
// apart from the data so that old bytes never read as a commit. The owner
// takes records in order: into the receive posted for that sender when there
// is one, else into a queue of early pieces of its own memory, so an inbox
// never stays full while its owner waits and no sender blocks another. A
// send completes when the receiver acknowledges the whole message with a
// record of its own (as over the pair rings, only once a receive took it).
//
// There is no thread behind any of this: each rank moves data only inside
// its own sends and waits, and every wait moves everything it can, so two
// ranks sending to each other both progress.
#include "shm_transport.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <backplane/plugin.hpp>
#include <backplane_common/hex.hpp>
#include <backplane_common/unique_fd.hpp>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace backplane::cpu {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint64_t kMagic = 0x6270736861726564ULL;  // "bpshared"
constexpr uint32_t kVersion = 3;
enum Layout : uint32_t { kPairs = 1, kInboxes = 2 };
// The rings of a group share this budget (/dev/shm is often small: 64 MiB in
// a default container), each pair ring between 64 KiB and 1 MiB, each inbox
// between 64 KiB and 2 MiB.
constexpr uint64_t kRingBudget = uint64_t{32} << 20;
constexpr uint64_t kMinRing = uint64_t{64} << 10;
constexpr uint64_t kMaxRing = uint64_t{1} << 20;
constexpr uint64_t kMaxInbox = uint64_t{2} << 20;
constexpr uint64_t kHeaderBytes = 16;  // tag, length
// Inbox records start on a cell and fill whole cells; a commit word per cell.
constexpr uint64_t kCell = 64;
constexpr uint64_t kRecordHeader = 32;  // tag, length, offset, unused
// A sender waits for room rather than cut a message into pieces smaller than
// this (the rest of a message shorter than it goes whole).
constexpr uint64_t kMinPiece = uint64_t{4} << 10;
// The sender field of a commit word has 24 bits.
constexpr int32_t kMaxInboxRanks = (1 << 24) - 1;
enum RecordKind : uint64_t { kData = 1, kAck = 2 };
// A wait first spins this long (the peer is usually a few microseconds
// behind), then sleeps, waking at least every kSleepSlice to look for dead
// peers. It does not spin when the group has more ranks than this process
// may use cores: the peer it waits for may then need this very core.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kSleepSlice = milliseconds(10);

// A rank's state. Closed: its communicator was destroyed; what it sent
// before may still be read. Failed: it failed or aborted a collective;
// nothing more is read from it or written to it.
enum RankState : uint32_t { kUnattached = 0, kLive = 1, kClosed = 2, kFailed = 3 };

// A failed rank's error, kept for its peers on this host: the store's failure
// board may be gone with the rank that served it.
constexpr std::size_t kReasonBytes = 1000;

struct alignas(64) RankBlock {
  uint32_t doorbell;  // futex word
  uint32_t sleeping;
  uint32_t state;
  int32_t pid;
  uint32_t reason_bytes;  // published (release) before state becomes kFailed
  char reason[kReasonBytes];
};

struct alignas(64) RingControl {
  alignas(64) uint64_t head;  // bytes written, by the sender
  alignas(64) uint64_t tail;  // bytes consumed, by the receiver
};

// An inbox: this control, a commit word per cell, then the ring's bytes.
struct alignas(64) InboxControl {
  alignas(64) uint64_t head;         // bytes reserved, by the senders
  alignas(64) uint64_t tail;         // bytes consumed, by the owner
  alignas(64) uint32_t room_wanted;  // a sender found it full: wake the peers
};

struct RecordHeader {
  uint64_t tag;
  uint64_t length;  // of the whole message
  uint64_t offset;  // of this piece in it
  uint64_t unused;
};
static_assert(sizeof(RecordHeader) == kRecordHeader);

// A commit word: the record's piece length (an ack's count), kind and
// sender + 1; 0 while the cell starts no published record.
constexpr uint64_t commit_word(uint64_t piece, RecordKind kind, int32_t sender) noexcept {
  return (piece << 32) | (static_cast<uint64_t>(kind) << 24) | static_cast<uint64_t>(sender + 1);
}
constexpr uint64_t round_to_cell(uint64_t n) noexcept { return (n + kCell - 1) & ~(kCell - 1); }

// Atomics in memory shared between processes must not hide a lock.
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free &&
              std::atomic_ref<uint64_t>::is_always_lock_free);

template <class T>
std::atomic_ref<T> shared(T& value) noexcept {
  return std::atomic_ref<T>(value);
}

uint64_t rings_of(int32_t n, Layout layout) {
  return layout == kPairs ? static_cast<uint64_t>(n) * static_cast<uint64_t>(n - 1)
                          : static_cast<uint64_t>(n);
}

uint64_t ring_bytes_for(int32_t n, Layout layout) {
  uint64_t r = layout == kPairs ? kMaxRing : kMaxInbox;
  while (r > kMinRing && r * rings_of(n, layout) > kRingBudget) r /= 2;
  return r;
}

uint64_t blocks_offset() { return 64; }
uint64_t rings_offset(int32_t n) { return blocks_offset() + sizeof(RankBlock) * static_cast<uint64_t>(n); }
uint64_t ring_stride(uint64_t ring_bytes, Layout layout) {
  return layout == kPairs ? sizeof(RingControl) + ring_bytes
                          : sizeof(InboxControl) + ring_bytes / kCell * sizeof(uint64_t) + ring_bytes;
}
uint64_t segment_bytes(int32_t n, Layout layout, uint64_t ring_bytes) {
  return rings_offset(n) + ring_stride(ring_bytes, layout) * rings_of(n, layout);
}

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void futex_wait(uint32_t* word, uint32_t expected, milliseconds timeout) noexcept {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000) * 1000000);
  // Shared (not FUTEX_PRIVATE): the word is in memory other processes map.
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(uint32_t* word) noexcept {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void ring_bell(RankBlock& b) noexcept {
  shared(b.doorbell).fetch_add(1, std::memory_order_seq_cst);
  if (shared(b.sleeping).load(std::memory_order_seq_cst) != 0) futex_wake_all(&b.doorbell);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string namespace_id(const char* kind) {
  struct stat st {};
  const std::string path = std::string("/proc/self/ns/") + kind;
  if (::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

// `n` random bytes from the kernel, as hex; "" when the kernel has none.
std::string random_hex(std::size_t n) {
  std::vector<uint8_t> bytes(n);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::getrandom(bytes.data() + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return "";
    got += static_cast<std::size_t>(k);
  }
  return common::to_hex(bytes);
}

std::string text_of(const std::vector<char>& v) { return std::string(v.begin(), v.end()); }

// A mapping of the segment, owned until handed to a ShmGroup.
struct Mapping {
  void* base = MAP_FAILED;
  uint64_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
  void* release() noexcept { return std::exchange(base, MAP_FAILED); }
};

// Removes a segment's name when it goes out of scope (the mapping stays).
struct NameRemover {
  std::string name;
  ~NameRemover() {
    if (!name.empty()) shm_unlink(name.c_str());
  }
};

}  // namespace

struct ShmGroup::Segment {
  uint64_t magic;
  uint32_t version;
  uint32_t size;
  uint64_t ring_bytes;
  char nonce[32];
  uint32_t layout;

  RankBlock& block(int32_t r) noexcept {
    return reinterpret_cast<RankBlock*>(reinterpret_cast<unsigned char*>(this) + blocks_offset())[r];
  }
  // Rank r's RankState, as it last published it.
  uint32_t state(int32_t r) noexcept { return shared(block(r).state).load(std::memory_order_acquire); }
  // The ring carrying messages from `from` to `to`.
  RingControl& ring(int32_t from, int32_t to) noexcept {
    const int32_t n = static_cast<int32_t>(size);
    const uint64_t index = static_cast<uint64_t>(from) * static_cast<uint64_t>(n - 1) +
                           static_cast<uint64_t>(to < from ? to : to - 1);
    return *reinterpret_cast<RingControl*>(reinterpret_cast<unsigned char*>(this) + rings_offset(n) +
                                           index * ring_stride(ring_bytes, kPairs));
  }
  static unsigned char* data(RingControl& c) noexcept {
    return reinterpret_cast<unsigned char*>(&c) + sizeof(RingControl);
  }
  // The inbox of rank `r`, its commit words and its bytes.
  InboxControl& inbox(int32_t r) noexcept {
    return *reinterpret_cast<InboxControl*>(reinterpret_cast<unsigned char*>(this) +
                                            rings_offset(static_cast<int32_t>(size)) +
                                            static_cast<uint64_t>(r) * ring_stride(ring_bytes, kInboxes));
  }
  static uint64_t* commits(InboxControl& c) noexcept {
    return reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(&c) + sizeof(InboxControl));
  }
  unsigned char* data(InboxControl& c) const noexcept {
    return reinterpret_cast<unsigned char*>(&c) + sizeof(InboxControl) +
           ring_bytes / kCell * sizeof(uint64_t);
  }
};
static_assert(sizeof(ShmGroup::Segment) <= 64, "the header fits before the rank blocks");

std::string shared_memory_host_identity() {
  const std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  const std::string net = namespace_id("net");
  const std::string mnt = namespace_id("mnt");
  const std::string ipc = namespace_id("ipc");
  const std::string pid = namespace_id("pid");  // peers' process ids must mean the same here
  if (boot.empty() || net.empty() || mnt.empty() || ipc.empty() || pid.empty()) return "";
  return boot + "/" + net + "/" + mnt + "/" + ipc + "/" + pid;
}

namespace {

// The inode of this process's PID namespace, which segment names carry; 0
// when unknown.
uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// A decimal number of at most `digits` digits, or -1.
int64_t decimal(std::string_view text, std::size_t digits) {
  if (text.empty() || text.size() > digits || text.find_first_not_of("0123456789") != std::string_view::npos)
    return -1;
  int64_t v = 0;
  for (char c : text) v = v * 10 + (c - '0');
  return v;
}

// A name is "backplane-<pid namespace inode>-<pid>-<random>", its creator's.
// A process id means something only in its own namespace: a group in another
// one (a container sharing /dev/shm through --ipc=host) would find no such
// process and take a live job's segment for stale. So a name is removed only
// when it is this user's (the file's owner), from this PID namespace, and no
// process has that id here. Names of other forms are left alone.
void remove_stale_segments() {
  const uint64_t ns = pid_namespace();
  if (ns == 0) return;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    constexpr std::string_view prefix = "backplane-";
    if (file.rfind(prefix, 0) != 0) continue;
    const std::string_view rest = std::string_view(file).substr(prefix.size());
    const auto a = rest.find('-');
    const auto b = a == std::string_view::npos ? a : rest.find('-', a + 1);
    if (b == std::string_view::npos) continue;
    const int64_t their_ns = decimal(rest.substr(0, a), 18);
    const int64_t pid = decimal(rest.substr(a + 1, b - a - 1), 9);
    if (their_ns < 0 || static_cast<uint64_t>(their_ns) != ns || pid <= 0) continue;
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) shm_unlink(("/" + file).c_str());
  }
}

// Creates, sizes (with its pages reserved, so that a full /dev/shm is an
// error here rather than SIGBUS later) and maps a new segment. "" and a
// reason on failure.
std::string create_segment(const std::string& name, int32_t n, Layout layout, const std::string& nonce,
                           Mapping& map) {
  const common::UniqueFd f(shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!f.valid()) return std::string("shm_open: ") + std::strerror(errno);
  const uint64_t ring = ring_bytes_for(n, layout);
  const uint64_t bytes = segment_bytes(n, layout, ring);
  if (const int e = posix_fallocate(f.get(), 0, static_cast<off_t>(bytes)); e != 0) {
    shm_unlink(name.c_str());
    return "reserving " + std::to_string(bytes) + " bytes: " + std::strerror(e);
  }
  map.base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f.get(), 0);
  if (map.base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return std::string("mmap: ") + std::strerror(errno);
  }
  map.bytes = bytes;
  auto* s = static_cast<ShmGroup::Segment*>(map.base);
  s->version = kVersion;
  s->size = static_cast<uint32_t>(n);
  s->ring_bytes = ring;
  s->layout = layout;
  std::memcpy(s->nonce, nonce.data(), std::min(nonce.size(), sizeof(s->nonce)));
  shared(s->magic).store(kMagic, std::memory_order_release);
  return "";
}

std::string open_segment(const std::string& name, int32_t n, Layout layout, const std::string& nonce,
                         Mapping& map) {
  const common::UniqueFd f(shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!f.valid()) return std::string("shm_open: ") + std::strerror(errno);
  struct stat st {};
  if (fstat(f.get(), &st) != 0) return std::string("fstat: ") + std::strerror(errno);
  const uint64_t bytes = segment_bytes(n, layout, ring_bytes_for(n, layout));
  if (static_cast<uint64_t>(st.st_size) != bytes)
    return "the segment has " + std::to_string(st.st_size) + " bytes, not " + std::to_string(bytes);
  map.base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f.get(), 0);
  if (map.base == MAP_FAILED) return std::string("mmap: ") + std::strerror(errno);
  map.bytes = bytes;
  auto* s = static_cast<ShmGroup::Segment*>(map.base);
  if (shared(s->magic).load(std::memory_order_acquire) != kMagic || s->version != kVersion ||
      s->size != static_cast<uint32_t>(n) || s->layout != layout ||
      s->ring_bytes != ring_bytes_for(n, layout) ||
      std::memcmp(s->nonce, nonce.data(), std::min(nonce.size(), sizeof(s->nonce))) != 0)
    return "the segment is not the one rank 0 made";
  return "";
}

}  // namespace

std::unique_ptr<Link> connect_shared_memory(const LinkSetup& setup) {
  try {
    return ShmGroup::connect(setup);
  } catch (const StoreFailure& f) {
    throw setup.failure(f, "shared-memory setup");
  }
}

std::unique_ptr<ShmGroup> ShmGroup::connect(const LinkSetup& setup) {
  KeyValueExchange& store = setup.exchange;
  const int32_t rank = setup.rank;
  const int32_t size = setup.size;
  const bool enabled = setup.network.shared_memory;
  const std::string& where = setup.where;
  // Ranks on other hosts, a rank with it switched off and groups too large
  // use TCP by design (debug). Anything else is a fault on a host where
  // shared memory should have worked, and costs every step several times
  // over: a warning, once per process, so that a job creating communicators
  // as it goes does not repeat it; later ones are logged at debug level.
  auto skip = [&](const std::string& why, bool fault = false) {
    static std::atomic<bool> warned{false};
    if (fault && !warned.exchange(true))
      plugin::log(BP_LOG_WARNING,
                  "cpu: " + where +
                      ": collectives fall back to TCP (Gloo) although every rank runs on this "
                      "host, because shared memory could not be set up: " +
                      why + " (logged once; later fallbacks at debug level)");
    else
      plugin::log(BP_LOG_DEBUG, "cpu: " + where + ": shared memory not used: " + why);
    return std::unique_ptr<ShmGroup>();
  };
  const std::string mine = enabled ? shared_memory_host_identity() : std::string();
  store.set("shm/host/" + std::to_string(rank), std::vector<char>(mine.begin(), mine.end()));
  // One key at a time, so that a rank which never comes is named. Every
  // rank reads the same values, so every rank decides the same.
  std::string elsewhere;  // why not, from the first rank that differs
  for (int32_t p = 0; p < size; ++p) {
    if (p == rank) continue;
    const std::string key = "shm/host/" + std::to_string(p);
    store.wait({key});
    const std::string theirs = text_of(store.get(key));
    if (theirs != mine && elsewhere.empty())
      elsewhere = theirs.empty()
                      ? "rank " + std::to_string(p) + " has it switched off or cannot tell its host"
                      : "rank " + std::to_string(p) + " runs on another host or in other namespaces";
  }
  if (mine.empty())
    return enabled
               ? skip("this host's identity cannot be read (/proc/sys/kernel/random/boot_id, /proc/self/ns)",
                      true)
               : skip("switched off (shared_memory)");
  if (!elsewhere.empty()) return skip(elsewhere);
  if (size > kMaxInboxRanks) return skip("more than " + std::to_string(kMaxInboxRanks) + " ranks");

  // Rank 0 makes the segment and names it; each rank maps it and says so;
  // once all have answered, rank 0 removes the name, so nothing is left in
  // /dev/shm whatever happens to the ranks later. Rank 0 also chooses the
  // layout, so that ranks whose options differ agree.
  Mapping map;
  std::string name;
  std::string nonce;
  std::string problem;
  NameRemover remover;  // rank 0: on every way out of here, the store failing included
  if (rank == 0) {
    remove_stale_segments();
    const Layout layout = size <= setup.network.pair_rings_max_ranks ? kPairs : kInboxes;
    nonce = random_hex(16);
    const std::string suffix = random_hex(8);
    name = "/backplane-" + std::to_string(pid_namespace()) + "-" + std::to_string(getpid()) + "-" + suffix;
    problem = nonce.empty() || suffix.empty() ? "no random bytes from the kernel (getrandom) for its name"
                                              : create_segment(name, size, layout, nonce, map);
    if (problem.empty()) remover.name = name;
    const std::string value =
        problem.empty() ? name + "\n" + nonce + "\n" + std::to_string(layout) : std::string();
    store.set("shm/segment", std::vector<char>(value.begin(), value.end()));
    if (!problem.empty()) return skip("rank 0 could not make the segment: " + problem, true);
  } else {
    store.wait({"shm/segment"});
    const std::string value = text_of(store.get("shm/segment"));
    const auto first = value.find('\n');
    const auto second = first == std::string::npos ? first : value.find('\n', first + 1);
    const std::string_view kind =
        second == std::string::npos ? std::string_view() : std::string_view(value).substr(second + 1);
    if (first == std::string::npos) return skip("rank 0 could not make the segment", true);
    const Layout layout = kind == std::to_string(kPairs) ? kPairs : kInboxes;
    name = value.substr(0, first);
    nonce = value.substr(first + 1, second - first - 1);
    problem = kind == std::to_string(kPairs) || kind == std::to_string(kInboxes)
                  ? open_segment(name, size, layout, nonce, map)
                  : "rank 0 named no layout (\"" + std::string(kind) + "\")";
  }
  auto* segment = static_cast<Segment*>(map.base);
  if (problem.empty()) {
    RankBlock& me = segment->block(rank);
    shared(me.pid).store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
    shared(me.state).store(kLive, std::memory_order_release);
  }
  const std::string answer = problem.empty() ? "1" : "0" + problem;
  bool all_ready = problem.empty();
  std::string refused;
  try {
    store.set("shm/ready/" + std::to_string(rank), std::vector<char>(answer.begin(), answer.end()));
    for (int32_t p = 0; p < size; ++p) {
      if (p == rank) continue;
      const std::string key = "shm/ready/" + std::to_string(p);
      store.wait({key});
      const std::string a = text_of(store.get(key));
      if (a != "1" && all_ready)
        refused = std::to_string(p) + ": " + a.substr(std::min<std::size_t>(1, a.size()));
      all_ready = all_ready && a == "1";
    }
  } catch (...) {
    // Peers that heard every answer before this rank gave up use the
    // segment: tell them this rank is gone, so that they fail at once.
    if (problem.empty()) {
      shared(segment->block(rank).state).store(kFailed, std::memory_order_release);
      for (int32_t p = 0; p < size; ++p)
        if (p != rank) ring_bell(segment->block(p));
    }
    throw;
  }
  if (!problem.empty()) return skip("mapping rank 0's segment: " + problem, true);
  if (!all_ready) return skip("rank " + refused, true);
  auto group = std::unique_ptr<ShmGroup>(new ShmGroup(rank, size, map.base, map.bytes));
  map.release();  // the group owns the mapping now
  const uint64_t kib = segment->ring_bytes >> 10;
  plugin::log(BP_LOG_DEBUG, "cpu: " + where + ": the shared-memory segment holds " +
                                (group->inboxes_ ? "an inbox per rank, " : "a ring per pair of ranks, ") +
                                std::to_string(kib) + " KiB each, " + std::to_string(group->bytes_ >> 10) +
                                " KiB in all");
  return group;
}

ShmGroup::ShmGroup(int32_t rank, int32_t size, void* base, uint64_t bytes)
    : rank_(rank),
      size_(size),
      base_(base),
      bytes_(bytes),
      segment_(static_cast<Segment*>(base)),
      inboxes_(segment_->layout == kInboxes) {
  if (inboxes_) mail_.resize(static_cast<std::size_t>(size));
  // A pidfd per peer in another process shows when it exits, even killed
  // by SIGKILL; ranks that are threads of this process need none.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  spin_ = size <= cores ? std::chrono::duration_cast<std::chrono::nanoseconds>(kSpin)
                        : std::chrono::nanoseconds(0);
  pidfds_.assign(size, -1);
  for (int32_t p = 0; p < size; ++p) {
    const int32_t pid = shared(segment_->block(p).pid).load(std::memory_order_relaxed);
    if (p != rank && pid != getpid()) pidfds_[p] = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  }
}

ShmGroup::~ShmGroup() {
  mark_closed(false);
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
  munmap(base_, bytes_);
}

void ShmGroup::interrupt() noexcept {
  interrupted_.store(true, std::memory_order_release);
  ring_bell(segment_->block(rank_));
}

std::unique_ptr<Transport> ShmGroup::begin(const FailureBoard& board, const CallContext& call) {
  return std::make_unique<ShmRun>(*this, board, call);
}

void ShmGroup::close(std::string_view reason) noexcept {
  if (!closed_.load(std::memory_order_acquire) && !reason_written_.exchange(true)) {
    RankBlock& b = segment_->block(rank_);
    const std::size_t n = std::min(reason.size(), kReasonBytes);
    std::memcpy(b.reason, reason.data(), n);
    shared(b.reason_bytes).store(static_cast<uint32_t>(n), std::memory_order_release);
  }
  mark_closed(true);
}

std::string ShmGroup::reason(int32_t peer) const {
  RankBlock& b = segment_->block(peer);
  if (segment_->state(peer) != kFailed) return "";
  const uint32_t n = shared(b.reason_bytes).load(std::memory_order_acquire);
  return std::string(b.reason, std::min<std::size_t>(n, kReasonBytes));
}

void ShmGroup::mark_closed(bool failed) noexcept {
  if (closed_.exchange(true)) return;
  shared(segment_->block(rank_).state).store(failed ? kFailed : kClosed, std::memory_order_release);
  for (int32_t p = 0; p < size_; ++p)
    if (p != rank_) ring_bell(segment_->block(p));
}

bool ShmGroup::exited(int32_t peer) const noexcept {
  if (pidfds_[peer] >= 0) {
    pollfd pfd{pidfds_[peer], POLLIN, 0};
    return ::poll(&pfd, 1, 0) > 0;
  }
  // No pidfd (a kernel before 5.3): a process that is gone, once reaped.
  const int32_t pid = shared(segment_->block(peer).pid).load(std::memory_order_relaxed);
  return pid != getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
}

std::string ShmGroup::describe(int32_t peer) const {
  if (peer < 0 || peer >= size_) return "a peer";
  const int32_t pid = shared(segment_->block(peer).pid).load(std::memory_order_relaxed);
  return "peer rank " + std::to_string(named(peer)) + " (pid " + std::to_string(pid) + ")";
}

// ---------------------------------------------------------------------------
// ShmRun
// ---------------------------------------------------------------------------

struct ShmRun::ShmRegion final : Region {
  unsigned char* data = nullptr;
  uint64_t bytes = 0;
  // Peers whose receives (sends) on this region completed, and how many of
  // those a wait has returned.
  std::vector<int> received, sent;
  std::size_t received_taken = 0, sent_taken = 0;
};

struct ShmRun::Transfer {
  ShmRegion* region;
  unsigned char* data;
  uint64_t bytes;
  uint64_t tag;
  uint64_t done;  // bytes moved, header included (inboxes: payload bytes only)
  uint64_t end;   // a send: the ring position after its last byte, once written
  uint64_t seq;   // a send over inboxes: its number among the messages to the peer
};

// A send is complete once the receiver has taken it out of the ring, not
// when it is in the ring: as over Gloo, a send completes only when its peer
// received it, so a rank that only sends cannot finish a collective its
// peer never joined, refused or died in.
struct ShmRun::Channel {
  std::vector<Transfer> sends, recvs;  // in posting order
  std::size_t send_at = 0;             // the next send to write
  std::size_t taken_at = 0;            // the next send to see taken (<= send_at)
  std::size_t recv_at = 0;
  bool owed() const noexcept { return taken_at < sends.size() || recv_at < recvs.size(); }
};

ShmRun::ShmRun(ShmGroup& group, const FailureBoard& board, const CallContext& call)
    : group_(group), board_(board), call_(call), channels_(static_cast<std::size_t>(group.size_)) {
  if (group_.interrupted()) fail_aborted();
}

ShmRun::~ShmRun() = default;

Region& ShmRun::region(void* data, uint64_t bytes) {
  auto r = std::make_unique<ShmRegion>();
  r->data = static_cast<unsigned char*>(data);
  r->bytes = bytes;
  regions_.push_back(std::move(r));
  return *regions_.back();
}

void ShmRun::send(Region& from, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) {
  if (group_.interrupted()) fail_aborted();
  auto& r = static_cast<ShmRegion&>(from);
  const uint64_t seq = group_.inboxes_ ? group_.mail_[peer].sent++ : 0;
  channels_[peer].sends.push_back({&r, r.data + offset, bytes, call_.tag(phase, bytes), 0, 0, seq});
  // As much as fits now; waits move the rest.
  if (group_.inboxes_)
    pump_to_inbox(peer);
  else
    pump_out(peer);
}

void ShmRun::recv(Region& into, int peer, uint64_t phase, uint64_t offset, uint64_t bytes) {
  if (group_.interrupted()) fail_aborted();
  auto& r = static_cast<ShmRegion&>(into);
  channels_[peer].recvs.push_back({&r, r.data + offset, bytes, call_.tag(phase, bytes), 0, 0, 0});
}

bool ShmRun::pump_out(int peer) {
  Channel& ch = channels_[peer];
  if (ch.send_at == ch.sends.size()) return false;
  ShmGroup::Segment& s = *group_.segment_;
  if (s.state(peer) != kLive) return false;  // none will read it
  RingControl& ring = s.ring(group_.rank_, peer);
  unsigned char* data = ShmGroup::Segment::data(ring);
  const uint64_t cap = s.ring_bytes;
  uint64_t head = shared(ring.head).load(std::memory_order_relaxed);
  const uint64_t tail = shared(ring.tail).load(std::memory_order_acquire);
  const uint64_t start = head;
  auto put = [&](const unsigned char* from, uint64_t n) {
    if (n == 0) return;  // (a zero-length message may have no memory at all)
    const uint64_t at = head & (cap - 1);
    const uint64_t first = std::min(n, cap - at);
    std::memcpy(data + at, from, first);
    std::memcpy(data, from + first, n - first);
    head += n;
  };
  while (ch.send_at < ch.sends.size()) {
    Transfer& t = ch.sends[ch.send_at];
    if (t.done < kHeaderBytes) {
      const uint64_t header[2] = {t.tag, t.bytes};
      const uint64_t n = std::min(kHeaderBytes - t.done, cap - (head - tail));
      put(reinterpret_cast<const unsigned char*>(header) + t.done, n);
      t.done += n;
    }
    if (t.done >= kHeaderBytes) {
      const uint64_t n = std::min(kHeaderBytes + t.bytes - t.done, cap - (head - tail));
      put(t.data + (t.done - kHeaderBytes), n);
      t.done += n;
    }
    if (t.done < kHeaderBytes + t.bytes) break;  // the ring is full
    t.end = head;
    ++ch.send_at;
  }
  if (head == start) return false;
  shared(ring.head).store(head, std::memory_order_release);
  ring_bell(s.block(peer));
  return true;
}

bool ShmRun::pump_in(int peer) {
  Channel& ch = channels_[peer];
  if (ch.recv_at == ch.recvs.size()) return false;
  ShmGroup::Segment& s = *group_.segment_;
  // A failed peer's last messages belong to the collective it gave up.
  if (s.state(peer) == kFailed) return false;
  RingControl& ring = s.ring(peer, group_.rank_);
  const unsigned char* data = ShmGroup::Segment::data(ring);
  const uint64_t cap = s.ring_bytes;
  uint64_t tail = shared(ring.tail).load(std::memory_order_relaxed);
  const uint64_t head = shared(ring.head).load(std::memory_order_acquire);
  const uint64_t start = tail;
  auto take = [&](unsigned char* into, uint64_t n) {
    if (n == 0) return;
    const uint64_t at = tail & (cap - 1);
    const uint64_t first = std::min(n, cap - at);
    std::memcpy(into, data + at, first);
    std::memcpy(into + first, data, n - first);
    tail += n;
  };
  while (ch.recv_at < ch.recvs.size()) {
    Transfer& t = ch.recvs[ch.recv_at];
    if (t.done == 0) {
      if (head - tail < kHeaderBytes) break;
      uint64_t header[2];
      take(reinterpret_cast<unsigned char*>(header), kHeaderBytes);
      if (header[0] != t.tag || header[1] != t.bytes) fail_out_of_step(peer);
      t.done = kHeaderBytes;
    }
    const uint64_t n = std::min(kHeaderBytes + t.bytes - t.done, head - tail);
    take(t.data + (t.done - kHeaderBytes), n);
    t.done += n;
    if (t.done < kHeaderBytes + t.bytes) break;  // the rest is not written yet
    t.region->received.push_back(peer);
    ++ch.recv_at;
  }
  if (tail == start) return false;
  shared(ring.tail).store(tail, std::memory_order_release);
  ring_bell(s.block(peer));  // its sends may be waiting for the room
  return true;
}

bool ShmRun::progress() {
  if (group_.inboxes_) return progress_inboxes();
  bool moved = false;
  for (int p = 0; p < group_.size_; ++p) {
    if (p == group_.rank_) continue;
    moved = pump_in(p) || moved;
    moved = pump_out(p) || moved;
    Channel& ch = channels_[p];
    if (ch.taken_at == ch.send_at) continue;
    const uint64_t tail = shared(group_.segment_->ring(group_.rank_, p).tail).load(std::memory_order_acquire);
    for (; ch.taken_at < ch.send_at && ch.sends[ch.taken_at].end <= tail; ++ch.taken_at)
      ch.sends[ch.taken_at].region->sent.push_back(p);
  }
  return moved;
}

int ShmRun::wait_recv(Region& region, int expected) {
  return wait(static_cast<ShmRegion&>(region), true, expected);
}
int ShmRun::wait_send(Region& region, int expected) {
  return wait(static_cast<ShmRegion&>(region), false, expected);
}

int ShmRun::wait(ShmRegion& r, bool receiving, int expected) {
  std::vector<int>& done = receiving ? r.received : r.sent;
  std::size_t& taken = receiving ? r.received_taken : r.sent_taken;
  uint32_t& bell = group_.segment_->block(group_.rank_).doorbell;
  uint32_t& sleeping = group_.segment_->block(group_.rank_).sleeping;
  if (group_.interrupted()) fail_aborted();  // as Gloo's waits: an abort wins over what has arrived
  bool spun = false;
  auto next_exit_check = Clock::now();
  for (;;) {
    const uint32_t rung = shared(bell).load(std::memory_order_acquire);
    progress();
    // Over inboxes, not before the peers' messages received here are
    // acknowledged: they wait for that to complete their sends.
    if (taken < done.size() && group_.acks_owed_ == 0) return done[taken++];
    if (group_.interrupted()) fail_aborted();
    check_peers(false);
    if (!spun) {
      spun = true;
      const auto until = Clock::now() + group_.spin_;
      while (shared(bell).load(std::memory_order_acquire) == rung && Clock::now() < until) cpu_relax();
      continue;
    }
    const auto now = Clock::now();
    // Looking for exited peers costs system calls: once per sleep slice.
    const bool look_for_exits = now >= next_exit_check;
    if (look_for_exits) next_exit_check = now + kSleepSlice;
    check_peers(look_for_exits);
    if (now >= call_.deadline) fail_timed_out(expected, receiving);
    const auto left = std::chrono::ceil<milliseconds>(call_.deadline - now);
    shared(sleeping).store(1, std::memory_order_seq_cst);
    if (shared(bell).load(std::memory_order_seq_cst) == rung)
      futex_wait(&bell, rung, std::min(left, kSleepSlice));
    shared(sleeping).store(0, std::memory_order_relaxed);
  }
}

// Fails the collective when a peer it still needs has failed, closed or
// (looked for only when `exits`: it costs a system call) exited.
void ShmRun::check_peers(bool exits) {
  ShmGroup::Segment& s = *group_.segment_;
  if (exits && group_.inboxes_) check_inbox_peers();
  for (int p = 0; p < group_.size_; ++p) {
    if (p == group_.rank_) continue;
    const Channel& ch = channels_[p];
    if (!ch.owed()) continue;
    const uint32_t state = s.state(p);
    if (state == kFailed) fail_peer_gone(p, "closed the connection");
    const bool exited = state != kClosed && exits && group_.exited(p);
    if (state != kClosed && !exited) continue;
    // What it wrote before it went may still complete the collective. Over
    // inboxes, it may sit behind a record another peer is still writing
    // (a dead writer is found by check_inbox_peers).
    progress();
    if (!ch.owed()) continue;
    if (group_.inboxes_ && inbox_behind()) continue;
    fail_peer_gone(p, state == kClosed ? "closed the connection" : "exited without closing the connection");
  }
}

// ---------------------------------------------------------------------------
// The inbox layout
// ---------------------------------------------------------------------------

bool ShmRun::progress_inboxes() {
  bool moved = deliver_early();
  moved = drain_inbox() || moved;
  moved = flush_acks() || moved;
  for (int p = 0; p < group_.size_; ++p) {
    if (p == group_.rank_) continue;
    moved = pump_to_inbox(p) || moved;
    Channel& ch = channels_[p];
    const uint64_t acked = group_.mail_[p].acked;
    for (; ch.taken_at < ch.send_at && ch.sends[ch.taken_at].seq < acked; ++ch.taken_at)
      ch.sends[ch.taken_at].region->sent.push_back(p);
  }
  return moved;
}

bool ShmRun::post(int peer, uint64_t kind, uint64_t tag, uint64_t length, uint64_t offset,
                  const unsigned char* from, uint64_t want, uint64_t& piece) {
  ShmGroup::Segment& s = *group_.segment_;
  InboxControl& box = s.inbox(peer);
  const uint64_t cap = s.ring_bytes;
  const uint64_t most = kind == kAck ? 0 : std::min(want, cap / 4 - kRecordHeader);
  const uint64_t least = std::min(most, kMinPiece);
  // The tail is read before the head, so that head - tail never underflows,
  // and the room is measured from a tail no later than the owner's. But the
  // owner and other senders may go round the ring more than once between
  // the two loads (or before a failed exchange refreshes the head): then
  // head - tail exceeds the ring and both are read again.
  uint64_t tail = shared(box.tail).load(std::memory_order_acquire);
  uint64_t head = shared(box.head).load(std::memory_order_relaxed);
  bool asked = false;
  uint64_t n = 0;
  for (;;) {
    if (head - tail > cap) {
      tail = shared(box.tail).load(std::memory_order_acquire);
      head = shared(box.head).load(std::memory_order_relaxed);
      continue;
    }
    const uint64_t room = cap - (head - tail);
    n = room >= kRecordHeader ? std::min(most, room - kRecordHeader) : 0;
    if (room < kRecordHeader || n < least) {
      if (asked) return false;
      // Ask the owner to wake its peers when it makes room, then look again
      // (the owner reads the flag after it moves the tail).
      shared(box.room_wanted).store(1, std::memory_order_seq_cst);
      asked = true;
      tail = shared(box.tail).load(std::memory_order_seq_cst);
      head = shared(box.head).load(std::memory_order_relaxed);
      continue;
    }
    if (shared(box.head).compare_exchange_weak(head, head + round_to_cell(kRecordHeader + n),
                                               std::memory_order_relaxed, std::memory_order_relaxed))
      break;
  }
  unsigned char* data = s.data(box);
  const uint64_t at = head & (cap - 1);  // a cell: the header never wraps
  const RecordHeader header{tag, length, offset, 0};
  std::memcpy(data + at, &header, sizeof header);
  const uint64_t body = at + kRecordHeader;
  const uint64_t first = std::min(n, cap - body);
  if (n != 0) {
    std::memcpy(data + body, from, first);
    std::memcpy(data, from + first, n - first);
  }
  const uint64_t count = kind == kAck ? want : n;
  shared(ShmGroup::Segment::commits(box)[at / kCell])
      .store(commit_word(count, static_cast<RecordKind>(kind), group_.rank_), std::memory_order_release);
  ring_bell(s.block(peer));
  piece = n;
  return true;
}

bool ShmRun::pump_to_inbox(int peer) {
  Channel& ch = channels_[peer];
  if (ch.send_at == ch.sends.size()) return false;
  if (group_.segment_->state(peer) != kLive) return false;  // none will read it
  bool moved = false;
  while (ch.send_at < ch.sends.size()) {
    Transfer& t = ch.sends[ch.send_at];
    uint64_t piece = 0;
    if (!post(peer, kData, t.tag, t.bytes, t.done, t.data + t.done, t.bytes - t.done, piece)) break;
    moved = true;
    t.done += piece;
    if (t.done == t.bytes) ++ch.send_at;  // (a zero-length message is its header alone)
  }
  return moved;
}

bool ShmRun::drain_inbox() {
  ShmGroup::Segment& s = *group_.segment_;
  InboxControl& box = s.inbox(group_.rank_);
  uint64_t* commits = ShmGroup::Segment::commits(box);
  const unsigned char* data = s.data(box);
  const uint64_t cap = s.ring_bytes;
  uint64_t tail = shared(box.tail).load(std::memory_order_relaxed);
  const uint64_t start = tail;
  for (;;) {
    const uint64_t at = tail & (cap - 1);
    uint64_t& commit = commits[at / kCell];
    const uint64_t word = shared(commit).load(std::memory_order_acquire);
    if (word == 0) break;
    const int sender = static_cast<int>(word & 0xffffff) - 1;
    const uint64_t kind = (word >> 24) & 0xff;
    const uint64_t n = word >> 32;
    if (sender < 0 || sender >= group_.size_ || sender == group_.rank_ || (kind != kData && kind != kAck) ||
        (kind == kData && n > cap / 4 - kRecordHeader))
      throw out_of_step_failure(call_.site.text(), "a peer", call_.site.op,
                                " [shared memory: a record in this rank's inbox is corrupt]");
    if (kind == kAck) {
      group_.mail_[sender].acked += n;
    } else if (s.state(sender) != kFailed) {
      // (A failed peer's last messages belong to the collective it gave up.)
      RecordHeader header;
      std::memcpy(&header, data + at, sizeof header);
      const uint64_t body = at + kRecordHeader;
      const uint64_t first = std::min(n, cap - body);
      accept(sender, header.tag, header.length, header.offset, data + body, first, data, n - first);
    }
    shared(commit).store(0, std::memory_order_relaxed);
    tail += kind == kAck ? kCell : round_to_cell(kRecordHeader + n);
    shared(box.tail).store(tail, std::memory_order_release);  // room for the senders at once
  }
  if (tail == start) return false;
  // Senders that found the inbox full wait for this (see post).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (shared(box.room_wanted).load(std::memory_order_seq_cst) != 0 &&
      shared(box.room_wanted).exchange(0, std::memory_order_seq_cst) != 0)
    for (int32_t p = 0; p < group_.size_; ++p)
      if (p != group_.rank_) ring_bell(s.block(p));
  return true;
}

void ShmRun::accept(int sender, uint64_t tag, uint64_t length, uint64_t offset, const unsigned char* a,
                    uint64_t na, const unsigned char* b, uint64_t nb) {
  ShmGroup::PeerMail& mail = group_.mail_[sender];
  Channel& ch = channels_[sender];
  if (!mail.early.empty() || ch.recv_at == ch.recvs.size()) {
    ShmGroup::Piece early{tag, length, offset, std::vector<unsigned char>(na + nb)};
    if (na != 0) std::memcpy(early.bytes.data(), a, na);
    if (nb != 0) std::memcpy(early.bytes.data() + na, b, nb);
    mail.early.push_back(std::move(early));
    ++group_.early_pieces_;
    return;
  }
  deliver(sender, tag, length, offset, a, na, b, nb);
}

void ShmRun::deliver(int sender, uint64_t tag, uint64_t length, uint64_t offset, const unsigned char* a,
                     uint64_t na, const unsigned char* b, uint64_t nb) {
  ShmGroup::PeerMail& mail = group_.mail_[sender];
  Channel& ch = channels_[sender];
  Transfer& t = ch.recvs[ch.recv_at];
  if (tag != t.tag || length != t.bytes || offset != t.done || na + nb > t.bytes - t.done)
    fail_out_of_step(sender);
  if (na != 0) std::memcpy(t.data + t.done, a, na);
  if (nb != 0) std::memcpy(t.data + t.done + na, b, nb);
  t.done += na + nb;
  if (t.done < t.bytes) return;
  t.region->received.push_back(sender);
  ++ch.recv_at;
  ++mail.acks_owed;
  ++group_.acks_owed_;
}

bool ShmRun::deliver_early() {
  if (group_.early_pieces_ == 0) return false;
  bool moved = false;
  for (int p = 0; p < group_.size_; ++p) {
    std::deque<ShmGroup::Piece>& early = group_.mail_[p].early;
    Channel& ch = channels_[p];
    if (early.empty() || ch.recv_at == ch.recvs.size()) continue;
    if (group_.segment_->state(p) == kFailed) continue;
    while (!early.empty() && ch.recv_at < ch.recvs.size()) {
      ShmGroup::Piece piece = std::move(early.front());
      early.pop_front();
      --group_.early_pieces_;
      deliver(p, piece.tag, piece.length, piece.offset, piece.bytes.data(), piece.bytes.size(), nullptr, 0);
      moved = true;
    }
  }
  return moved;
}

bool ShmRun::flush_acks() {
  if (group_.acks_owed_ == 0) return false;
  bool moved = false;
  for (int p = 0; p < group_.size_; ++p) {
    ShmGroup::PeerMail& mail = group_.mail_[p];
    if (mail.acks_owed == 0) continue;
    uint64_t unused = 0;
    // A peer that closed or failed waits for nothing more.
    const bool live = group_.segment_->state(p) == kLive;
    if (live && !post(p, kAck, 0, 0, 0, nullptr, mail.acks_owed, unused)) continue;
    group_.acks_owed_ -= mail.acks_owed;
    mail.acks_owed = 0;
    moved = true;
  }
  return moved;
}

bool ShmRun::inbox_behind() const noexcept {
  InboxControl& box = group_.segment_->inbox(group_.rank_);
  return shared(box.head).load(std::memory_order_acquire) != shared(box.tail).load(std::memory_order_relaxed);
}

// Once per sleep slice, over inboxes, what the channels do not show.
void ShmRun::check_inbox_peers() {
  ShmGroup::Segment& s = *group_.segment_;
  // Acknowledgements owed to a peer that closed, failed or died: nobody
  // waits for them (and its inbox may stay full forever).
  for (int p = 0; p < group_.size_; ++p) {
    ShmGroup::PeerMail& mail = group_.mail_[p];
    if (mail.acks_owed == 0) continue;
    if (s.state(p) == kLive && !group_.exited(p)) continue;
    group_.acks_owed_ -= mail.acks_owed;
    mail.acks_owed = 0;
  }
  // A record reserved but still unwritten at the same place a whole slice
  // later, while a live peer's process has exited: it died writing it, and
  // every later message to this rank is behind it.
  InboxControl& box = s.inbox(group_.rank_);
  const uint64_t tail = shared(box.tail).load(std::memory_order_relaxed);
  const bool stalled =
      inbox_behind() && shared(ShmGroup::Segment::commits(box)[(tail & (s.ring_bytes - 1)) / kCell])
                                .load(std::memory_order_acquire) == 0;
  const bool still = stalled && stalled_at_ == tail;
  stalled_at_ = stalled ? tail : kNotStalled;
  if (!still) return;
  for (int p = 0; p < group_.size_; ++p)
    if (p != group_.rank_ && s.state(p) == kLive && group_.exited(p))
      fail_peer_gone(p, "exited while writing to this rank");
}

void ShmRun::fail_out_of_step(int peer) const {
  throw out_of_step_failure(
      call_.site.text(), group_.describe(peer), call_.site.op,
      " [shared memory: its next message belongs to another call or has another length]");
}

void ShmRun::fail_peer_gone(int peer, const char* how) const {
  std::string cause = board_.read(group_.named(peer));
  if (cause.empty()) cause = group_.reason(peer);
  throw peer_lost_failure(call_.site.text(), group_.describe(peer), how, cause,
                          "did it exit, fail or get killed?", " [shared memory]");
}

void ShmRun::fail_timed_out(int expected, bool receiving) const {
  throw timed_out_failure(call_.site.text(), call_.waited(), call_.timeout, group_.describe(expected),
                          receiving, call_.site.op, " [shared memory]");
}

void ShmRun::fail_aborted() const { throw aborted_failure(call_.site.text()); }

}  // namespace backplane::cpu
