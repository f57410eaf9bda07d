// The rendezvous store's wire format: the authenticated handshake, frame
// headers, request payloads and their limits. No sockets here: the server
// (store_server.cpp), the client (store_client.cpp) and the tests share
// this codec, so what one side writes is what the other side checks.
#ifndef BACKPLANE_CORE_DISTRIBUTED_STORE_WIRE_HPP_
#define BACKPLANE_CORE_DISTRIBUTED_STORE_WIRE_HPP_

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::store_wire {

// ---- Protocol --------------------------------------------------------------
// Integers are big-endian. A connection opens with an exchange that proves
// both sides hold the job secret K (HMAC-SHA256, fresh 32-byte nonces), and
// only then says anything about the job:
//   hello     (client, 40 bytes): "BPST" | u16 version | u16 0 | nonce Nc
//   challenge (server, 72 bytes): "BPST" | u16 version | u16 0 | nonce Ns | Ps
//             Ps = HMAC(K, "backplane store server" | Nc | Ns)
//   proof     (client, 40 bytes): Pc | i32 rank | i32 world_size
//             Pc = HMAC(K, "backplane store client" | Nc | Ns | rank | world_size)
//   verdict   (server, 16 bytes): "BPST" | u16 version | u16 verdict | i32 world_size | u32 0
// A client that cannot verify Ps holds another secret and stops there; a
// proof the server cannot verify closes the connection without a word.
// A hello of another version is answered with a verdict (version_mismatch,
// world_size 0) instead of the challenge. With no secret K is empty: the
// exchange still runs, so a rank with a secret and one without disagree.
// Then frames flow both ways, a 16-byte header and a payload:
//   u32 payload bytes | u8 kind | u8[3] 0 | u64 request id
// Requests (kind = Op) and their payloads:
//   set     u32 klen, key, value (the rest of the payload)
//   get     u64 timeout_ms, u32 klen, key
//   wait    u64 timeout_ms, u32 count, count x (u32 klen, key)
//   add     i64 delta, u32 klen, key
//   check   u32 count, count x (u32 klen, key)
//   remove  u32 klen, key
// Replies (kind = Reply) carry their request's id: get and wait park on the
// server without blocking the connection, so replies may come out of order.
//   ok        set, wait: empty; get: the value; add: i64; check, remove: u8 0|1
//   timed_out the missing keys, as text
//   refused   why, as text (add on a value that is not an integer)
// A timeout_ms of kNoTimeout waits forever. Anything else that does not fit
// this grammar or the limits closes the connection.
inline constexpr std::array<uint8_t, 4> kMagic{'B', 'P', 'S', 'T'};
inline constexpr uint16_t kProtocolVersion = 2;
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;
inline constexpr std::size_t kHelloPrefixBytes = 8;  // magic, version, word
inline constexpr std::size_t kHelloBytes = kHelloPrefixBytes + kNonceBytes;
inline constexpr std::size_t kChallengeBytes = kHelloPrefixBytes + kNonceBytes + kMacBytes;
inline constexpr std::size_t kProofBytes = kMacBytes + 8;
inline constexpr std::size_t kVerdictBytes = 16;
inline constexpr std::size_t kHeaderBytes = 16;
inline constexpr std::size_t kMaxKeyBytes = 4096;
inline constexpr std::size_t kMaxValueBytes = std::size_t{1} << 30;
inline constexpr std::size_t kMaxKeysPerCall = 65536;
inline constexpr std::size_t kMaxKeyListBytes = std::size_t{16} << 20;
inline constexpr std::size_t kMaxReplyTextBytes = std::size_t{64} << 10;
inline constexpr uint64_t kNoTimeout = UINT64_MAX;
// Longer timeouts mean "forever"; also keeps deadline arithmetic in range.
inline constexpr std::chrono::milliseconds kForever{std::chrono::milliseconds::rep{10} * 365 * 24 * 3600 *
                                                    1000};

enum class Op : uint8_t { set = 1, get = 2, wait = 3, add = 4, check = 5, remove = 6 };
enum class Reply : uint8_t { ok = 0x80, timed_out = 0x81, refused = 0x82 };
enum class Verdict : uint16_t {
  accepted = 0,
  version_mismatch = 1,
  world_size_mismatch = 2,
  rank_out_of_range = 3,
  duplicate_rank = 4,
};

const char* op_name(Op op);
std::optional<Op> to_op(uint8_t kind);
std::optional<Reply> to_reply(uint8_t kind);

void put_u16(uint8_t* p, uint16_t v);
void put_u32(uint8_t* p, uint32_t v);
void put_u64(uint8_t* p, uint64_t v);
uint16_t get_u16(const uint8_t* p);
uint32_t get_u32(const uint8_t* p);
uint64_t get_u64(const uint8_t* p);

// ---- Limits ----------------------------------------------------------------

// What one server accepts. Each has a default and an environment variable
// (docs/security.md lists them); from_env throws Errc::invalid_argument
// naming a malformed variable. max_client_bytes bounds what one rank holds,
// across its reconnections: the values it set (with their keys) and its
// parked get/wait requests (with their key lists); max_total_bytes bounds
// the same for all ranks together.
struct Limits {
  std::size_t max_value_bytes = kMaxValueBytes;          // BACKPLANE_STORE_MAX_VALUE_BYTES
  std::size_t max_client_bytes = std::size_t{2} << 30;   // BACKPLANE_STORE_MAX_CLIENT_BYTES
  std::size_t max_total_bytes = std::size_t{8} << 30;    // BACKPLANE_STORE_MAX_TOTAL_BYTES
  std::size_t max_unauthenticated = 64;                  // BACKPLANE_STORE_MAX_UNAUTHENTICATED
  std::chrono::milliseconds handshake_timeout{5000};     // BACKPLANE_STORE_HANDSHAKE_TIMEOUT_MS
  std::chrono::milliseconds frame_idle_timeout{30'000};  // BACKPLANE_STORE_FRAME_IDLE_TIMEOUT_MS
  // How long a store whose rank failed a collective keeps serving ranks
  // still connected when it closes (Server::linger_on_close).
  std::chrono::milliseconds failed_linger{2000};  // BACKPLANE_STORE_FAILED_LINGER_MS

  static Limits from_env();
  // The largest payload a request of `op` may announce.
  std::size_t max_payload(Op op) const;
};

// ---- Handshake -------------------------------------------------------------

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;
using Header = std::array<uint8_t, kHeaderBytes>;

// A fresh random nonce (OpenSSL's RAND_bytes); throws when the generator fails.
Nonce random_nonce();
Mac server_proof(std::string_view secret, const Nonce& client_nonce, const Nonce& server_nonce);
Mac client_proof(std::string_view secret, const Nonce& client_nonce, const Nonce& server_nonce, int32_t rank,
                 int32_t world_size);
// Constant-time comparison (CRYPTO_memcmp).
bool same_mac(const Mac& a, const uint8_t* b);

std::array<uint8_t, kHelloBytes> make_hello(const Nonce& client_nonce);
std::array<uint8_t, kChallengeBytes> make_challenge(const Nonce& server_nonce, const Mac& proof);
std::array<uint8_t, kProofBytes> make_proof(const Mac& proof, int32_t rank, int32_t world_size);
std::array<uint8_t, kVerdictBytes> make_verdict(Verdict verdict, int32_t world_size);

// ---- Frames ----------------------------------------------------------------

Header make_header(std::size_t payload_bytes, uint8_t kind, uint64_t id);

struct FrameHeader {
  uint32_t payload_bytes = 0;
  uint8_t kind = 0;
  uint64_t id = 0;
};
// The header's fields, or why it is malformed: nonzero reserved bytes, an
// unknown request kind, or a payload over `limits` for that kind.
struct DecodedHeader {
  std::optional<FrameHeader> header;
  std::string error;
};
DecodedHeader decode_request_header(const uint8_t* bytes, const Limits& limits);

// Appends big-endian fields to a payload.
class PayloadWriter {
 public:
  explicit PayloadWriter(std::size_t reserve = 0) { bytes_.reserve(reserve); }
  void u8(uint8_t v) { bytes_.push_back(v); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void key(std::string_view k);
  void raw(const void* data, std::size_t n);
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

// A request's payload, decoded. For set, the value is payload[value_offset..].
struct Request {
  Op op = Op::set;
  std::vector<std::string> keys;  // one for set/get/add/remove
  uint64_t timeout_ms = 0;        // get, wait
  int64_t delta = 0;              // add
  std::size_t value_offset = 0;   // set
};
struct DecodedRequest {
  std::optional<Request> request;
  std::string error;  // why the payload does not fit the grammar
};
DecodedRequest decode_request(Op op, const std::vector<uint8_t>& payload);

// Request payloads, as the client sends them.
std::vector<uint8_t> encode_set(std::string_view key, const void* value, std::size_t size);
std::vector<uint8_t> encode_get(std::string_view key, uint64_t timeout_ms);
std::vector<uint8_t> encode_wait(const std::vector<std::string>& keys, uint64_t timeout_ms);
std::vector<uint8_t> encode_add(std::string_view key, int64_t delta);
std::vector<uint8_t> encode_check(const std::vector<std::string>& keys);
std::vector<uint8_t> encode_remove(std::string_view key);

// ---- Text ------------------------------------------------------------------

// "0.2 s", "1.25 s", "300 s"
std::string seconds_text(std::chrono::milliseconds ms);
// A key for messages: quoted, non-printable bytes escaped, long keys cut.
std::string quote(std::string_view key);
// "host:port", "[v6]:port"
std::string join_address(const std::string& host, uint16_t port);
// Timeouts on the wire: milliseconds, or kNoTimeout for "forever".
uint64_t wire_timeout(std::chrono::milliseconds timeout);

}  // namespace backplane::store_wire

#endif  // BACKPLANE_CORE_DISTRIBUTED_STORE_WIRE_HPP_
