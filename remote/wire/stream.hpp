// One connection's byte stream, plain TCP or TLS (Boost.Asio's SSL stream
// over OpenSSL), behind one interface so the client and the server are written
// once. Not thread-safe: like every Asio object, use it from one strand (at
// most one read and one write outstanding at a time).
#ifndef BACKPLANE_REMOTE_WIRE_STREAM_HPP_
#define BACKPLANE_REMOTE_WIRE_STREAM_HPP_

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>

#include <memory>
#include <string>
#include <utility>

namespace backplane::remote::wire {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// A completion condition for asio::async_read / async_write that hands the
// socket everything left in one call. Asio's transfer_all offers at most
// 64 KiB per call: a payload of many megabytes would take a system call (and
// a trip through the io_context) per 64 KiB instead of as few as the kernel's
// socket buffers allow. Stream's writes use it (a client's large Write leaves
// straight from the caller's memory); its reads keep asio's default.
inline std::size_t whole_transfer(const boost::system::error_code& ec, std::size_t) noexcept {
  return ec ? 0 : std::size_t{1} << 30;
}

class Stream {
 public:
  // Plain TCP when `tls` is null; TLS with that context otherwise (the
  // context must outlive the stream).
  Stream(tcp::socket socket, asio::ssl::context* tls)
      : tls_(tls != nullptr), ssl_(std::move(socket), tls != nullptr ? *tls : plain_context()) {}

  bool tls() const noexcept { return tls_; }
  tcp::socket& socket() noexcept { return ssl_.next_layer(); }
  asio::ssl::stream<tcp::socket>& ssl() noexcept { return ssl_; }
  auto get_executor() { return ssl_.get_executor(); }

  // The TLS handshake; completes at once (posted) on a plain stream.
  template <class Handler>
  void async_handshake(asio::ssl::stream_base::handshake_type type, Handler&& handler) {
    if (tls_) {
      ssl_.async_handshake(type, std::forward<Handler>(handler));
    } else {
      asio::post(get_executor(),
                 [h = std::forward<Handler>(handler)]() mutable { h(boost::system::error_code{}); });
    }
  }
  // Reads until `buffers` are full.
  template <class Buffers, class Handler>
  void async_read(const Buffers& buffers, Handler&& handler) {
    if (tls_)
      asio::async_read(ssl_, buffers, std::forward<Handler>(handler));
    else
      asio::async_read(ssl_.next_layer(), buffers, std::forward<Handler>(handler));
  }
  // Writes all of `buffers` (a sequence: gathered into as few syscalls as the kernel allows).
  template <class Buffers, class Handler>
  void async_write(const Buffers& buffers, Handler&& handler) {
    if (tls_)
      asio::async_write(ssl_, buffers, whole_transfer, std::forward<Handler>(handler));
    else
      asio::async_write(ssl_.next_layer(), buffers, whole_transfer, std::forward<Handler>(handler));
  }
  // Closes the socket at once (no TLS close_notify: the peer may be gone);
  // outstanding operations complete with operation_aborted.
  void close() noexcept {
    boost::system::error_code ignored;
    ssl_.next_layer().shutdown(tcp::socket::shutdown_both, ignored);
    ssl_.next_layer().close(ignored);
  }

 private:
  // An ssl::stream needs a context even when TLS is off; this one is never used.
  static asio::ssl::context& plain_context() {
    static asio::ssl::context context(asio::ssl::context::tls);
    return context;
  }

  bool tls_;
  asio::ssl::stream<tcp::socket> ssl_;
};

// A server's TLS context from PEM files; throws std::runtime_error naming the
// file that could not be used. TLS 1.2 or newer.
std::unique_ptr<asio::ssl::context> server_tls_context(const std::string& cert_file,
                                                       const std::string& key_file);
// A client's TLS context trusting the CA certificates in `ca_file`, verifying
// the server's certificate chain (and, by the caller, its host name).
std::unique_ptr<asio::ssl::context> client_tls_context(const std::string& ca_file);

// "host:port" -> (host, port); throws std::invalid_argument saying what is wrong.
std::pair<std::string, uint16_t> split_endpoint(const std::string& endpoint);

}  // namespace backplane::remote::wire

#endif  // BACKPLANE_REMOTE_WIRE_STREAM_HPP_
