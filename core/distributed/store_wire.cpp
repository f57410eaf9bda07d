// The rendezvous store's wire format (see store_wire.hpp).
#include "distributed/store_wire.hpp"

#include <backplane/error.hpp>
#include <backplane_common/crypto.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace backplane::store_wire {

using std::chrono::milliseconds;

const char* op_name(Op op) {
  switch (op) {
    case Op::set:
      return "set";
    case Op::get:
      return "get";
    case Op::wait:
      return "wait";
    case Op::add:
      return "add";
    case Op::check:
      return "check";
    case Op::remove:
      return "remove";
  }
  return "?";
}

std::optional<Op> to_op(uint8_t kind) {
  if (kind >= static_cast<uint8_t>(Op::set) && kind <= static_cast<uint8_t>(Op::remove)) return Op{kind};
  return std::nullopt;
}

std::optional<Reply> to_reply(uint8_t kind) {
  if (kind >= static_cast<uint8_t>(Reply::ok) && kind <= static_cast<uint8_t>(Reply::refused))
    return Reply{kind};
  return std::nullopt;
}

void put_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
}
uint16_t get_u16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

// ---- Limits ----------------------------------------------------------------

namespace {

uint64_t env_limit(const char* name, uint64_t fallback, uint64_t lo, uint64_t hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  uint64_t v = 0;
  const char* last = text + std::strlen(text);
  auto [end, ec] = std::from_chars(text, last, v);
  if (ec != std::errc() || end != last || v < lo || v > hi) {
    throw Error(Errc::invalid_argument, std::string("environment variable ") + name + "='" + text +
                                            "' is not a whole number in " + std::to_string(lo) + ".." +
                                            std::to_string(hi) + "; unset it for the default (" +
                                            std::to_string(fallback) + ")");
  }
  return v;
}

}  // namespace

Limits Limits::from_env() {
  Limits l;
  constexpr uint64_t kDay = uint64_t{24} * 3600 * 1000;
  l.max_value_bytes = env_limit("BACKPLANE_STORE_MAX_VALUE_BYTES", l.max_value_bytes, 0, kMaxValueBytes);
  l.max_client_bytes =
      env_limit("BACKPLANE_STORE_MAX_CLIENT_BYTES", l.max_client_bytes, 1 << 16, uint64_t{1} << 40);
  l.max_total_bytes =
      env_limit("BACKPLANE_STORE_MAX_TOTAL_BYTES", l.max_total_bytes, 1 << 16, uint64_t{1} << 40);
  l.max_unauthenticated = env_limit("BACKPLANE_STORE_MAX_UNAUTHENTICATED", l.max_unauthenticated, 1, 65536);
  l.handshake_timeout =
      milliseconds(env_limit("BACKPLANE_STORE_HANDSHAKE_TIMEOUT_MS", l.handshake_timeout.count(), 1, kDay));
  l.frame_idle_timeout =
      milliseconds(env_limit("BACKPLANE_STORE_FRAME_IDLE_TIMEOUT_MS", l.frame_idle_timeout.count(), 1, kDay));
  l.failed_linger =
      milliseconds(env_limit("BACKPLANE_STORE_FAILED_LINGER_MS", l.failed_linger.count(), 0, kDay));
  return l;
}

std::size_t Limits::max_payload(Op op) const {
  switch (op) {
    case Op::set:
      return 4 + kMaxKeyBytes + max_value_bytes;
    case Op::get:
    case Op::add:
      return 12 + kMaxKeyBytes;
    case Op::remove:
      return 4 + kMaxKeyBytes;
    case Op::wait:
      return 12 + kMaxKeyListBytes;
    case Op::check:
      return 4 + kMaxKeyListBytes;
  }
  return 0;
}

// ---- Handshake -------------------------------------------------------------

namespace {

constexpr std::string_view kServerLabel = "backplane store server";
constexpr std::string_view kClientLabel = "backplane store client";

Mac hmac(std::string_view secret, const std::vector<uint8_t>& message) {
  const std::optional<common::Sha256> mac = common::hmac_sha256(secret, {message});
  if (!mac) throw Error(Errc::internal, "rendezvous store: HMAC-SHA256 failed in OpenSSL's libcrypto");
  return *mac;
}

std::vector<uint8_t> transcript(std::string_view label, const Nonce& a, const Nonce& b) {
  std::vector<uint8_t> m(label.begin(), label.end());
  m.insert(m.end(), a.begin(), a.end());
  m.insert(m.end(), b.begin(), b.end());
  return m;
}

void put_prefix(uint8_t* p, uint16_t word) {
  std::memcpy(p, kMagic.data(), 4);
  put_u16(p + 4, kProtocolVersion);
  put_u16(p + 6, word);
}

}  // namespace

Nonce random_nonce() {
  Nonce n{};
  if (!common::random_bytes(n)) {
    throw Error(Errc::internal,
                "rendezvous store: OpenSSL's random generator (RAND_bytes) failed; cannot make a nonce");
  }
  return n;
}

Mac server_proof(std::string_view secret, const Nonce& client_nonce, const Nonce& server_nonce) {
  return hmac(secret, transcript(kServerLabel, client_nonce, server_nonce));
}

Mac client_proof(std::string_view secret, const Nonce& client_nonce, const Nonce& server_nonce, int32_t rank,
                 int32_t world_size) {
  std::vector<uint8_t> m = transcript(kClientLabel, client_nonce, server_nonce);
  uint8_t tail[8];
  put_u32(tail, static_cast<uint32_t>(rank));
  put_u32(tail + 4, static_cast<uint32_t>(world_size));
  m.insert(m.end(), tail, tail + 8);
  return hmac(secret, m);
}

bool same_mac(const Mac& a, const uint8_t* b) { return common::equal_constant_time(a, {b, kMacBytes}); }

std::array<uint8_t, kHelloBytes> make_hello(const Nonce& client_nonce) {
  std::array<uint8_t, kHelloBytes> h{};
  put_prefix(h.data(), 0);
  std::memcpy(h.data() + kHelloPrefixBytes, client_nonce.data(), kNonceBytes);
  return h;
}

std::array<uint8_t, kChallengeBytes> make_challenge(const Nonce& server_nonce, const Mac& proof) {
  std::array<uint8_t, kChallengeBytes> c{};
  put_prefix(c.data(), 0);
  std::memcpy(c.data() + kHelloPrefixBytes, server_nonce.data(), kNonceBytes);
  std::memcpy(c.data() + kHelloPrefixBytes + kNonceBytes, proof.data(), kMacBytes);
  return c;
}

std::array<uint8_t, kProofBytes> make_proof(const Mac& proof, int32_t rank, int32_t world_size) {
  std::array<uint8_t, kProofBytes> p{};
  std::memcpy(p.data(), proof.data(), kMacBytes);
  put_u32(p.data() + kMacBytes, static_cast<uint32_t>(rank));
  put_u32(p.data() + kMacBytes + 4, static_cast<uint32_t>(world_size));
  return p;
}

std::array<uint8_t, kVerdictBytes> make_verdict(Verdict verdict, int32_t world_size) {
  std::array<uint8_t, kVerdictBytes> v{};
  put_prefix(v.data(), static_cast<uint16_t>(verdict));
  put_u32(v.data() + 8, static_cast<uint32_t>(world_size));
  return v;
}

// ---- Frames ----------------------------------------------------------------

Header make_header(std::size_t payload_bytes, uint8_t kind, uint64_t id) {
  Header h{};
  put_u32(h.data(), static_cast<uint32_t>(payload_bytes));
  h[4] = kind;
  put_u64(h.data() + 8, id);
  return h;
}

DecodedHeader decode_request_header(const uint8_t* h, const Limits& limits) {
  DecodedHeader out;
  const uint32_t bytes = get_u32(h);
  const std::optional<Op> op = to_op(h[4]);
  if (!op) {
    char kind[8];
    std::snprintf(kind, sizeof kind, "0x%02x", h[4]);
    out.error = std::string("an unknown opcode ") + kind;
    return out;
  }
  if (h[5] != 0 || h[6] != 0 || h[7] != 0) {
    out.error = "a frame header with nonzero reserved bytes";
    return out;
  }
  if (bytes > limits.max_payload(*op)) {
    out.error = std::string("a ") + op_name(*op) + " frame of " + std::to_string(bytes) +
                " bytes (the limit is " + std::to_string(limits.max_payload(*op)) +
                (*op == Op::set ? "; BACKPLANE_STORE_MAX_VALUE_BYTES raises it" : "") + ")";
    return out;
  }
  out.header = FrameHeader{bytes, h[4], get_u64(h + 8)};
  return out;
}

void PayloadWriter::u32(uint32_t v) {
  uint8_t b[4];
  put_u32(b, v);
  bytes_.insert(bytes_.end(), b, b + 4);
}
void PayloadWriter::u64(uint64_t v) {
  uint8_t b[8];
  put_u64(b, v);
  bytes_.insert(bytes_.end(), b, b + 8);
}
void PayloadWriter::key(std::string_view k) {
  u32(static_cast<uint32_t>(k.size()));
  raw(k.data(), k.size());
}
void PayloadWriter::raw(const void* data, std::size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_.insert(bytes_.end(), p, p + n);
}

namespace {

// Reads big-endian fields from a payload; any read past the end, or a key
// outside 1..kMaxKeyBytes, marks it failed with the reason.
class PayloadReader {
 public:
  explicit PayloadReader(const std::vector<uint8_t>& bytes) : p_(bytes.data()), n_(bytes.size()) {}
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::size_t position() const { return pos_; }

  uint64_t u64() { return need(8, "an 8-byte field") ? advance(8) : 0; }
  uint32_t u32() { return need(4, "a 4-byte field") ? static_cast<uint32_t>(advance(4)) : 0; }
  std::string key() {
    const uint32_t len = u32();
    if (!ok()) return {};
    if (len == 0 || len > kMaxKeyBytes) {
      fail("a key of " + std::to_string(len) + " bytes (keys are 1.." + std::to_string(kMaxKeyBytes) +
           " bytes)");
      return {};
    }
    if (!need(len, "a key")) return {};
    std::string k(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return k;
  }
  std::vector<std::string> key_list() {
    const uint32_t count = u32();
    if (!ok()) return {};
    if (count > kMaxKeysPerCall) {
      fail("a list of " + std::to_string(count) + " keys (at most " + std::to_string(kMaxKeysPerCall) + ")");
      return {};
    }
    std::vector<std::string> keys;
    // Never reserve more than the payload can hold: the count is the peer's word.
    keys.reserve(std::min<std::size_t>(count, (n_ - pos_) / 5 + 1));
    for (uint32_t i = 0; i < count && ok(); ++i) keys.push_back(key());
    return keys;
  }
  void expect_end() {
    if (ok() && pos_ != n_) fail(std::to_string(n_ - pos_) + " unexpected trailing bytes");
  }

 private:
  bool need(std::size_t bytes, const char* what) {
    if (!ok()) return false;
    if (n_ - pos_ < bytes) {
      fail(std::string("truncated payload: ") + what + " needs " + std::to_string(bytes) + " bytes, " +
           std::to_string(n_ - pos_) + " left");
      return false;
    }
    return true;
  }
  uint64_t advance(int bytes) {
    const uint64_t v = bytes == 8 ? get_u64(p_ + pos_) : get_u32(p_ + pos_);
    pos_ += static_cast<std::size_t>(bytes);
    return v;
  }
  void fail(std::string why) {
    if (ok()) error_ = std::move(why);
  }

  const uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
  std::string error_;
};

}  // namespace

DecodedRequest decode_request(Op op, const std::vector<uint8_t>& payload) {
  PayloadReader in(payload);
  Request r;
  r.op = op;
  switch (op) {
    case Op::set:
      r.keys.push_back(in.key());
      r.value_offset = in.position();
      break;
    case Op::get:
      r.timeout_ms = in.u64();
      r.keys.push_back(in.key());
      in.expect_end();
      break;
    case Op::wait:
      r.timeout_ms = in.u64();
      r.keys = in.key_list();
      in.expect_end();
      break;
    case Op::add:
      r.delta = static_cast<int64_t>(in.u64());
      r.keys.push_back(in.key());
      in.expect_end();
      break;
    case Op::check:
      r.keys = in.key_list();
      in.expect_end();
      break;
    case Op::remove:
      r.keys.push_back(in.key());
      in.expect_end();
      break;
  }
  DecodedRequest out;
  if (in.ok()) {
    out.request = std::move(r);
  } else {
    out.error = in.error();
  }
  return out;
}

std::vector<uint8_t> encode_set(std::string_view key, const void* value, std::size_t size) {
  PayloadWriter out(4 + key.size() + size);
  out.key(key);
  out.raw(value, size);
  return out.take();
}

std::vector<uint8_t> encode_get(std::string_view key, uint64_t timeout_ms) {
  PayloadWriter out(12 + key.size());
  out.u64(timeout_ms);
  out.key(key);
  return out.take();
}

namespace {

std::vector<uint8_t> key_list(const std::vector<std::string>& keys, std::optional<uint64_t> timeout_ms) {
  std::size_t bytes = 12;
  for (const auto& k : keys) bytes += 4 + k.size();
  PayloadWriter out(bytes);
  if (timeout_ms) out.u64(*timeout_ms);
  out.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) out.key(k);
  return out.take();
}

}  // namespace

std::vector<uint8_t> encode_wait(const std::vector<std::string>& keys, uint64_t timeout_ms) {
  return key_list(keys, timeout_ms);
}

std::vector<uint8_t> encode_add(std::string_view key, int64_t delta) {
  PayloadWriter out(12 + key.size());
  out.u64(static_cast<uint64_t>(delta));
  out.key(key);
  return out.take();
}

std::vector<uint8_t> encode_check(const std::vector<std::string>& keys) {
  return key_list(keys, std::nullopt);
}

std::vector<uint8_t> encode_remove(std::string_view key) {
  PayloadWriter out(4 + key.size());
  out.key(key);
  return out.take();
}

// ---- Text ------------------------------------------------------------------

std::string seconds_text(milliseconds ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ms.count()) / 1000.0);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s + " s";
}

std::string quote(std::string_view key) {
  constexpr std::size_t kShown = 120;
  std::string out = "'";
  for (std::size_t i = 0; i < key.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  if (key.size() > kShown) out += "...(" + std::to_string(key.size()) + " bytes)";
  return out + "'";
}

std::string join_address(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

uint64_t wire_timeout(milliseconds timeout) {
  return timeout >= kForever ? kNoTimeout : static_cast<uint64_t>(timeout.count());
}

}  // namespace backplane::store_wire
