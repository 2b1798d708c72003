#include "socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "topocoll/status.h"

namespace topocoll::bootstrap {

void Interrupt::poll(const std::string& what) const {
  if (flag && flag->load()) fail(StatusCode::kAborted, "bootstrap aborted while {}", what);
  if (check) check();
}

int pollSlice(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 100));
}

namespace {

// Waits until fd is ready for `events` or the deadline passes.
void waitFor(int fd, short events, Clock::time_point deadline, const Interrupt& intr, const std::string& what) {
  while (true) {
    intr.poll(what);
    if (Clock::now() >= deadline) fail(StatusCode::kTimeout, "timeout while {}", what);
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, pollSlice(deadline));
    if (r > 0) return;
    if (r < 0 && errno != EINTR) fail(StatusCode::kSystemError, "poll failed while {}: {}", what, std::strerror(errno));
  }
}

}  // namespace

std::string Address::toString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (storage.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (storage.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return "?";
}

WireAddr toWire(const Address& a) {
  WireAddr w;
  w.family = a.storage.ss_family;
  if (w.family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a.storage);
    w.port = s->sin_port;
    std::memcpy(w.addr, &s->sin_addr, 4);
  } else if (w.family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    w.port = s->sin6_port;
    std::memcpy(w.addr, &s->sin6_addr, 16);
  }
  return w;
}

bool fromWire(const WireAddr& w, Address* out) {
  Address a;
  if (w.family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&a.storage);
    s->sin_family = AF_INET;
    s->sin_port = w.port;
    std::memcpy(&s->sin_addr, w.addr, 4);
    a.len = sizeof(sockaddr_in);
  } else if (w.family == AF_INET6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a.storage);
    s->sin6_family = AF_INET6;
    s->sin6_port = w.port;
    std::memcpy(&s->sin6_addr, w.addr, 16);
    a.len = sizeof(sockaddr_in6);
  } else {
    return false;
  }
  *out = a;
  return true;
}

Address chooseAddress(const std::string& ifname, const std::string& family) {
  // The same list the socket transport and topology discovery use (NCCL's bootstrap also takes the first of
  // ncclFindInterfaces); with nothing up but an unset NCCL_SOCKET_IFNAME, 127.0.0.1.
  std::vector<netif::Interface> ifs = netif::findInterfaces(ifname, family, "", 1);
  Address out;
  if (ifs.empty()) {
    if (ifname.size() > 1) fail(StatusCode::kInvalidArgument, "NCCL_SOCKET_IFNAME={}: no up interface matches", ifname);
    auto* a = reinterpret_cast<sockaddr_in*>(&out.storage);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    out.len = sizeof(sockaddr_in);
    return out;
  }
  out.len = ifs[0].len;
  std::memcpy(&out.storage, &ifs[0].addr, out.len);
  return out;
}

Address defaultAddress() { return chooseAddress(); }

Address parseHostPort(const std::string& hp) {
  Address out;
  std::string host, port;
  if (!hp.empty() && hp[0] == '[') {
    auto close = hp.find(']');
    if (close == std::string::npos || close + 1 >= hp.size() || hp[close + 1] != ':')
      fail(StatusCode::kInvalidArgument, "'{}': expected [ipv6]:port", hp);
    host = hp.substr(1, close - 1);
    port = hp.substr(close + 2);
  } else {
    auto colon = hp.rfind(':');
    if (colon == std::string::npos) fail(StatusCode::kInvalidArgument, "'{}': expected host:port", hp);
    host = hp.substr(0, colon);
    port = hp.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || p < 0 || p > 65535) fail(StatusCode::kInvalidArgument, "'{}': bad port", hp);
  auto* a4 = reinterpret_cast<sockaddr_in*>(&out.storage);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
  if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(p));
    out.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(p));
    out.len = sizeof(sockaddr_in6);
  } else {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* raw = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &raw) != 0 || !raw)
      fail(StatusCode::kInvalidArgument, "'{}': cannot resolve host '{}'", hp, host);
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> res(raw, freeaddrinfo);
    std::memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
    out.len = res->ai_addrlen;
    if (out.storage.ss_family == AF_INET) a4->sin_port = htons(static_cast<uint16_t>(p));
    else a6->sin6_port = htons(static_cast<uint16_t>(p));
  }
  return out;
}


Socket Socket::listen(const Address& addr, Address* bound) {
  Socket s(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) fail(StatusCode::kSystemError, "socket(): {}", std::strerror(errno));
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0) {
    if (errno == EADDRINUSE)
      fail(StatusCode::kSystemError, "cannot listen at {}: the address is in use by another job or process", addr.toString());
    fail(StatusCode::kSystemError, "bind({}): {}", addr.toString(), std::strerror(errno));
  }
  if (::listen(s.fd(), 16384) != 0) fail(StatusCode::kSystemError, "listen(): {}", std::strerror(errno));
  if (bound) {
    bound->len = sizeof(bound->storage);
    getsockname(s.fd(), reinterpret_cast<sockaddr*>(&bound->storage), &bound->len);
  }
  fcntl(s.fd(), F_SETFL, fcntl(s.fd(), F_GETFL) | O_NONBLOCK);
  return s;
}

Socket Socket::connect(const Address& addr, Clock::time_point deadline, const Interrupt& intr, const std::string& what,
                       bool retryRefused) {
  int lastErr = 0;
  auto timeout = [&] {
    fail(StatusCode::kTimeout, "timeout while {} (connecting to {}{}{})", what, addr.toString(), lastErr ? ": " : "",
         lastErr ? std::strerror(lastErr) : "");
  };
  while (true) {
    intr.poll(what);
    if (Clock::now() >= deadline) timeout();
    Socket s(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) fail(StatusCode::kSystemError, "socket(): {}", std::strerror(errno));
    int r = ::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len);
    if (r != 0 && errno == EINPROGRESS) {
      try {
        waitFor(s.fd(), POLLOUT, deadline, intr, what);
      } catch (const Error& e) {
        if (e.code() == StatusCode::kTimeout) timeout();
        throw;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      r = err == 0 ? 0 : -1;
      errno = err;
    }
    if (r == 0) {
      int one = 1;
      setsockopt(s.fd(), IPPROTO_TCP, 1 /*TCP_NODELAY*/, &one, sizeof(one));
      return s;
    }
    lastErr = errno;
    if (errno == ECONNREFUSED && !retryRefused)
      fail(StatusCode::kRemoteError, "connection to {} refused while {}", addr.toString(), what);
    // A listener that closes (its process exited) while the handshake is under way resets it: the peer is gone, as
    // for a refusal (comm_test's dies-after-register saw it when rank 1 reached rank 2's listener as rank 2 exited).
    if (errno == ECONNRESET)
      fail(StatusCode::kRemoteError, "connection to {} reset while {}", addr.toString(), what);
    if (errno != ECONNREFUSED && errno != ETIMEDOUT && errno != EAGAIN)
      fail(StatusCode::kSystemError, "connect to {} failed while {}: {}", addr.toString(), what, std::strerror(errno));
    ::poll(nullptr, 0, 20);
  }
}

Socket Socket::acceptNow() {
  while (true) {
    int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c >= 0) return Socket(c);
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN) return Socket();
    fail(StatusCode::kSystemError, "accept failed: {}", std::strerror(errno));
  }
}

namespace {
// Moves `size` bytes with `io` (a send or a recv on a non-blocking socket), waiting for `events` when it would block.
template <typename Io>
void transferAll(int fd, char* p, size_t size, short events, Io io, Clock::time_point deadline, const Interrupt& intr,
                 const std::string& what) {
  while (size > 0) {
    ssize_t n = io(fd, p, size);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      waitFor(fd, events, deadline, intr, what);
      continue;
    }
    fail(StatusCode::kRemoteError, "connection lost while {}: {}", what, n < 0 ? std::strerror(errno) : "closed by the peer");
  }
}
}  // namespace

void Socket::sendAll(const void* data, size_t size, Clock::time_point deadline, const Interrupt& intr,
                     const std::string& what) {
  transferAll(fd_.get(), const_cast<char*>(static_cast<const char*>(data)), size, POLLOUT,
              [](int fd, char* p, size_t n) { return ::send(fd, p, n, MSG_NOSIGNAL); }, deadline, intr, what);
}

void Socket::recvAll(void* data, size_t size, Clock::time_point deadline, const Interrupt& intr,
                     const std::string& what) {
  transferAll(fd_.get(), static_cast<char*>(data), size, POLLIN,
              [](int fd, char* p, size_t n) { return ::recv(fd, p, n, 0); }, deadline, intr, what);
}

Socket::ReadStatus Socket::readInto(MessageParser& parser) {
  uint8_t buf[64 << 10];
  while (!parser.done() && !parser.rejected()) {
    size_t want = std::min(parser.wanted(), sizeof(buf));
    ssize_t n = ::recv(fd_.get(), buf, want, 0);
    if (n > 0) {
      parser.feed(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return ReadStatus::kWaiting;
    return ReadStatus::kClosed;
  }
  return parser.done() ? ReadStatus::kMessage : ReadStatus::kRejected;
}

bool Socket::trySend(const Header& h, const void* body, Clock::time_point deadline) {
  try {
    sendAll(&h, sizeof(h), deadline, Interrupt{}, "sending a bootstrap message");
    if (h.size) sendAll(body, h.size, deadline, Interrupt{}, "sending a bootstrap message");
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string Socket::peerName() const {
  Address a;
  a.len = sizeof(a.storage);
  if (getpeername(fd_.get(), reinterpret_cast<sockaddr*>(&a.storage), &a.len) != 0) return "?";
  return a.toString();
}

}  // namespace topocoll::bootstrap
