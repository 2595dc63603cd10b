#include "distributed/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace precis::distributed {

namespace {

// Sent by each connecting rank before its rank, so a stray connection to the port is told apart.
constexpr uint32_t kMagic = 0x50524353;  // "PRCS"

using Clock = std::chrono::steady_clock;

std::string where(const TcpEndpoint& endpoint) { return endpoint.address + ":" + std::to_string(endpoint.port); }

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

int milliseconds_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits until `fd` is readable (or writable), at most until `deadline`.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    int ready = ::poll(&p, 1, milliseconds_left(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Sends or receives exactly `n` bytes before `deadline`; false on a closed connection, error or timeout.
bool send_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_for(fd, POLLOUT, deadline)) return false;
    ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

bool receive_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_for(fd, POLLIN, deadline)) return false;
    ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

std::vector<uint8_t> serve(const TcpEndpoint& endpoint, int world_size, const std::vector<uint8_t>& bytes,
                           Clock::time_point deadline, std::chrono::milliseconds timeout) {
  Socket listener(::socket(AF_INET6, SOCK_STREAM, 0));
  bool ipv6 = listener.fd() >= 0;
  if (!ipv6) listener = Socket(::socket(AF_INET, SOCK_STREAM, 0));
  PRECIS_CHECK(listener.fd() >= 0, "rendezvous: cannot open a socket: ", std::strerror(errno));
  int on = 1, off = 0;
  ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  int bound;
  if (ipv6) {
    // Both IPv4 and IPv6 peers, on every interface.
    ::setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(static_cast<uint16_t>(endpoint.port));
    bound = ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address);
  } else {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(endpoint.port));
    bound = ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address);
  }
  PRECIS_CHECK(bound == 0, "rendezvous: rank 0 cannot listen on port ", endpoint.port,
               " (MASTER_PORT): ", std::strerror(errno), "; pick a free port");
  PRECIS_CHECK(::listen(listener.fd(), world_size) == 0, "rendezvous: listen on port ", endpoint.port, ": ",
               std::strerror(errno));

  std::vector<bool> served(world_size, false);
  int remaining = world_size - 1;
  const uint32_t length = htonl(static_cast<uint32_t>(bytes.size()));
  while (remaining > 0) {
    PRECIS_CHECK(wait_for(listener.fd(), POLLIN, deadline), "rendezvous: ", world_size - 1 - remaining, " of ",
                 world_size - 1, " ranks reached rank 0 on port ", endpoint.port, " within ", timeout.count(),
                 " ms; check that every rank started and has the same MASTER_ADDR/MASTER_PORT");
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (peer.fd() < 0) continue;
    uint32_t hello[2];
    if (!receive_all(peer.fd(), hello, sizeof hello, deadline) || ntohl(hello[0]) != kMagic) continue;
    const int rank = static_cast<int>(ntohl(hello[1]));
    PRECIS_CHECK(rank > 0 && rank < world_size, "rendezvous: a process says it is rank ", rank, ", outside 1..",
                 world_size - 1, " (WORLD_SIZE ", world_size, "); check every rank's RANK and WORLD_SIZE");
    PRECIS_CHECK(!served[rank], "rendezvous: two processes say they are rank ", rank, "; check every rank's RANK");
    if (!send_all(peer.fd(), &length, sizeof length, deadline) ||
        !send_all(peer.fd(), bytes.data(), bytes.size(), deadline))
      continue;  // that rank went away; it fails on its side
    served[rank] = true;
    --remaining;
  }
  return bytes;
}

Socket connect_once(const TcpEndpoint& endpoint, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  int status = ::getaddrinfo(endpoint.address.c_str(), port.c_str(), &hints, &found);
  PRECIS_CHECK(status == 0, "rendezvous: cannot resolve MASTER_ADDR ", endpoint.address, ": ", ::gai_strerror(status));
  Socket connected;
  for (addrinfo* a = found; a && connected.fd() < 0; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (s.fd() < 0) continue;
    // On Linux the send timeout bounds connect() too: an unreachable host does not outlast the deadline.
    const int ms = std::max(1, milliseconds_left(deadline));  // 0 would mean no limit
    timeval limit{ms / 1000, (ms % 1000) * 1000};
    ::setsockopt(s.fd(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) == 0) connected = std::move(s);
  }
  ::freeaddrinfo(found);
  return connected;
}

std::vector<uint8_t> fetch(const TcpEndpoint& endpoint, int rank, Clock::time_point deadline,
                           std::chrono::milliseconds timeout) {
  const auto fail = [&](const char* what) {
    PRECIS_FAIL("rendezvous: rank ", rank, " ", what, " rank 0 at ", where(endpoint),
                " (MASTER_ADDR:MASTER_PORT) within ", timeout.count(),
                " ms; check that rank 0 runs and that the address is reachable from this host");
  };
  // Rank 0 may not listen yet: retry until the deadline.
  Socket s;
  while (true) {
    s = connect_once(endpoint, deadline);
    if (s.fd() >= 0) break;
    if (Clock::now() >= deadline) fail("could not connect to");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const uint32_t hello[2] = {htonl(kMagic), htonl(static_cast<uint32_t>(rank))};
  uint32_t length = 0;
  if (!send_all(s.fd(), hello, sizeof hello, deadline) || !receive_all(s.fd(), &length, sizeof length, deadline))
    fail("got no answer from");
  std::vector<uint8_t> bytes(ntohl(length));
  if (!receive_all(s.fd(), bytes.data(), bytes.size(), deadline)) fail("got no answer from");
  return bytes;
}

}  // namespace

std::vector<uint8_t> tcp_broadcast_bytes(const TcpEndpoint& endpoint, int rank, int world_size,
                                         const std::vector<uint8_t>& bytes, std::chrono::milliseconds timeout) {
  PRECIS_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rendezvous: rank ", rank, " is not in a world of ",
               world_size);
  PRECIS_CHECK(endpoint.port > 0 && endpoint.port < 65536, "rendezvous: MASTER_PORT ", endpoint.port,
               " is not a TCP port (1..65535)");
  if (world_size == 1) return bytes;
  const Clock::time_point deadline = Clock::now() + timeout;
  return rank == 0 ? serve(endpoint, world_size, bytes, deadline, timeout) : fetch(endpoint, rank, deadline, timeout);
}

}  // namespace precis::distributed
