// The remote backend against raw loopback TCP, measured in the same run:
//   upload / download of 64 MiB through `remote` vs raw TCP moving the same
//   bytes (goal: at least 0.8 of raw throughput);
//   pipelined 16-element f32 adds followed by one synchronize (goal: at least
//   200,000 ops/s);
//   a small read round trip (64 bytes) vs a raw TCP ping-pong (goal: at most 2x).
// It starts its own `backplane serve` on an ephemeral loopback port.
//   bench_remote [--mib 64] [--adds 200000]
#include <backplane/backplane.hpp>

#include "bench_util.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace bp = backplane;

namespace {

// ---- `backplane serve` as a child process ---------------------------------

struct Server {
  pid_t pid = -1;
  int port = 0;
  ~Server() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
    }
  }
};

void start_server(Server& s, const std::string& config) {
  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe failed");
  s.pid = fork();
  if (s.pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execl(BP_BENCH_CLI, BP_BENCH_CLI, "serve", "--config", config.c_str(), "--backend", "cpu", "--listen",
          "127.0.0.1:0", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[512];
  ssize_t n;
  while (text.find("\nready") == std::string::npos && text.rfind("ready", 0) != 0 &&
         (n = read(out[0], buf, sizeof buf)) > 0)
    text.append(buf, static_cast<std::size_t>(n));
  close(out[0]);
  const auto at = text.find(" on 127.0.0.1:");
  if (at == std::string::npos) throw std::runtime_error("backplane serve did not start:\n" + text);
  s.port = std::stoi(text.substr(at + 14));
}

// ---- Raw loopback TCP: the reference ---------------------------------------

int listen_any(int& port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 1) != 0)
    throw std::runtime_error("raw reference: cannot listen on loopback");
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw std::runtime_error("raw reference: cannot connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void send_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0) throw std::runtime_error("raw reference: send failed");
    c += k;
    n -= static_cast<std::size_t>(k);
  }
}
void recv_all(int fd, void* p, std::size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = recv(fd, c, n, 0);
    if (k <= 0) throw std::runtime_error("raw reference: recv failed");
    c += k;
    n -= static_cast<std::size_t>(k);
  }
}

struct RawFigures {
  double upload_ns = 0, download_ns = 0, pingpong_ns = 0;
};

// A peer thread that echoes the protocol of the measurement below: receive
// `bytes` then ack 1 byte; send `bytes`; then answer 64-byte pings.
RawFigures measure_raw(std::size_t bytes, int reps, int pings) {
  int port = 0;
  const int lfd = listen_any(port);
  std::thread peer([&] {
    const int fd = accept(lfd, nullptr, nullptr);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<char> buf(bytes);
    char small[64];
    for (int r = 0; r < reps; ++r) {
      recv_all(fd, buf.data(), bytes);
      send_all(fd, "k", 1);
      char go;
      recv_all(fd, &go, 1);
      send_all(fd, buf.data(), bytes);
    }
    for (int i = 0; i < pings; ++i) {
      recv_all(fd, small, 8);  // the request (like a Read message)
      send_all(fd, small, 64);
    }
    close(fd);
  });
  const int fd = connect_to(port);
  std::vector<char> data(bytes, 1);
  std::vector<double> up, down;
  for (int r = 0; r < reps; ++r) {
    double t0 = bench::now_ns();
    send_all(fd, data.data(), bytes);
    char ack;
    recv_all(fd, &ack, 1);
    up.push_back(bench::now_ns() - t0);
    t0 = bench::now_ns();
    send_all(fd, "g", 1);
    recv_all(fd, data.data(), bytes);
    down.push_back(bench::now_ns() - t0);
  }
  char small[64] = {};
  const double t0 = bench::now_ns();
  for (int i = 0; i < pings; ++i) {
    send_all(fd, small, 8);
    recv_all(fd, small, 64);
  }
  RawFigures f;
  f.pingpong_ns = (bench::now_ns() - t0) / pings;
  peer.join();
  close(fd);
  close(lfd);
  f.upload_ns = bench::median(up);
  f.download_ns = bench::median(down);
  return f;
}

std::string arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::size_t mib = std::stoul(arg(argc, argv, "--mib", "64"));
  const int adds = std::stoi(arg(argc, argv, "--adds", "200000"));
  const std::size_t bytes = mib << 20;
  const int reps = 5, pings = 2000;

  const auto dir = std::filesystem::temp_directory_path() / ("bench_remote_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string server_json = (dir / "server.json").string(),
                    client_json = (dir / "client.json").string();
  std::ofstream(server_json)
      << R"({"schema_version": 1, "plugin_dirs": [")" << BP_BENCH_PLUGIN_DIR
      << R"("], "backends": [{"name": "cpu", "library": "backplane_cpu", "required": true}]})";
  Server server;
  start_server(server, server_json);
  std::ofstream(client_json)
      << R"({"schema_version": 1, "plugin_dirs": [")" << BP_BENCH_PLUGIN_DIR
      << R"("], "default_backend": "remote", "backends": [{"name": "remote", )"
      << R"("library": "backplane_remote", "required": true, "options": {"endpoints": )"
      << R"(["127.0.0.1:)" << server.port
      << R"("]}}, {"name": "cpu", "library": "backplane_cpu", "required": true}]})";

  const RawFigures raw = measure_raw(bytes, reps, pings);

  bp::Registry registry = bp::Registry::from_config(client_json);
  const bp::Device device = registry.backend("remote").device(0);
  const auto elements = static_cast<int64_t>(bytes / sizeof(float));
  std::vector<float> host(static_cast<std::size_t>(elements), 1.0f);

  // Like the raw reference, the bytes move between memory that exists on both
  // sides: upload = copy_ from a cpu tensor into a remote tensor (streamed
  // from the cpu tensor's memory) + synchronize; download = read_into host
  // memory. Then the same with fresh memory each time (from_vector /
  // to_vector: the server and the client allocate and fault in 64 MiB).
  const bp::Device cpu = registry.backend("cpu").device(0);
  const bp::Tensor source = bp::Tensor::from_vector(cpu, {elements}, host);
  bp::Tensor big = bp::Tensor::from_vector(device, {elements}, host);
  std::vector<float> back(host.size(), 0.0f);
  std::vector<double> up, down, up_fresh, down_fresh;
  for (int r = 0; r < reps; ++r) {
    double t0 = bench::now_ns();
    big.copy_(source);
    device.synchronize();
    up.push_back(bench::now_ns() - t0);
    t0 = bench::now_ns();
    big.read_into(bp::DType::f32, back.data(), back.size());
    down.push_back(bench::now_ns() - t0);
    if (back[back.size() - 1] != 1.0f) throw std::runtime_error("download mismatch");
    t0 = bench::now_ns();
    bp::Tensor fresh = bp::Tensor::from_vector(device, {elements}, host);
    device.synchronize();
    up_fresh.push_back(bench::now_ns() - t0);
    t0 = bench::now_ns();
    const std::vector<float> fresh_back = fresh.to_vector<float>();
    down_fresh.push_back(bench::now_ns() - t0);
  }
  const double upload_ns = bench::median(up), download_ns = bench::median(down);

  // Pipelined tiny adds, one synchronize at the end.
  const auto a = bp::Tensor::from_vector(device, {16}, std::vector<float>(16, 1.0f));
  const auto b = bp::Tensor::from_vector(device, {16}, std::vector<float>(16, 2.0f));
  device.synchronize();
  std::vector<double> rates;
  for (int batch = 0; batch < 3; ++batch) {
    const double t0 = bench::now_ns();
    bp::Tensor c;
    for (int i = 0; i < adds; ++i) c = bp::add(a, b);
    device.synchronize();
    rates.push_back(adds / ((bench::now_ns() - t0) * 1e-9));
    if (c.to_vector<float>()[15] != 3.0f) throw std::runtime_error("add mismatch");
  }
  const double adds_per_s = bench::median(rates);

  // A 64-byte read round trip.
  const double read_ns = bench::ns_per_call([&] { (void)a.to_vector<float>(); }, pings / 4, 5);

  const double gib = static_cast<double>(bytes) / (1 << 30);
  std::printf("remote backend vs raw loopback TCP (same run; %zu MiB transfers, median of %d)\n", mib, reps);
  std::printf(
      "  upload    remote %7.1f ms (%5.2f GiB/s)  raw %7.1f ms  throughput ratio %.2f (goal >= 0.80)\n",
      upload_ns * 1e-6, gib / (upload_ns * 1e-9), raw.upload_ns * 1e-6, raw.upload_ns / upload_ns);
  std::printf(
      "  download  remote %7.1f ms (%5.2f GiB/s)  raw %7.1f ms  throughput ratio %.2f (goal >= 0.80)\n",
      download_ns * 1e-6, gib / (download_ns * 1e-9), raw.download_ns * 1e-6, raw.download_ns / download_ns);
  std::printf("  with fresh memory each time (from_vector / to_vector): upload %.1f ms, download %.1f ms\n",
              bench::median(up_fresh) * 1e-6, bench::median(down_fresh) * 1e-6);
  std::printf("  pipelined 16-element f32 adds: %.0f ops/s (goal >= 200000)\n", adds_per_s);
  std::printf("  64-byte read round trip: remote %.1f us, raw ping-pong %.1f us, ratio %.2f (goal <= 2.0)\n",
              read_ns * 1e-3, raw.pingpong_ns * 1e-3, read_ns / raw.pingpong_ns);
  std::filesystem::remove_all(dir);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bench_remote: " << e.what() << '\n';
  return 1;
}
