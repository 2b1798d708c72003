#include "topocoll/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace topocoll {

// ---------------------------------------------------------------------------------------------------------------
// Addresses

SocketAddress SocketAddress::parse(const std::string& hp) {
  SocketAddress out;
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
    out.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
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
  }
  out.setPort(static_cast<int>(p));
  return out;
}

SocketAddress SocketAddress::loopback() {
  SocketAddress out;
  auto* a = reinterpret_cast<sockaddr_in*>(&out.storage);
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  out.len = sizeof(sockaddr_in);
  return out;
}

SocketAddress SocketAddress::from(const sockaddr_storage& s, socklen_t len) {
  SocketAddress out;
  out.len = std::min<socklen_t>(len, sizeof(out.storage));
  std::memcpy(&out.storage, &s, out.len);
  return out;
}

WireAddr SocketAddress::toWire() const {
  WireAddr w;
  w.family = storage.ss_family;
  if (w.family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&storage);
    w.port = s->sin_port;
    std::memcpy(w.addr, &s->sin_addr, 4);
  } else if (w.family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&storage);
    w.port = s->sin6_port;
    std::memcpy(w.addr, &s->sin6_addr, 16);
  }
  return w;
}

bool SocketAddress::fromWire(const WireAddr& w, SocketAddress* out) {
  SocketAddress a;
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

std::string SocketAddress::host() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof(buf));
  else if (storage.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf, sizeof(buf));
  return buf;
}

int SocketAddress::port() const {
  if (storage.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SocketAddress::setPort(int port) {
  if (storage.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(static_cast<uint16_t>(port));
  else if (storage.ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(static_cast<uint16_t>(port));
}

bool SocketAddress::isLoopback() const {
  if (storage.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  return storage.ss_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
}

std::string SocketAddress::toString() const {
  if (storage.ss_family == AF_INET) return fmt::format("{}:{}", host(), port());
  if (storage.ss_family == AF_INET6) return fmt::format("[{}]:{}", host(), port());
  return "?";
}

// ---------------------------------------------------------------------------------------------------------------
// Waiting

void Interrupt::poll(const std::string& what) const {
  if (flag && flag->load()) fail(StatusCode::kAborted, "{} aborted while {}", who, what);
  if (check) check();
}

int pollSlice(SocketClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SocketClock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 100));
}

std::string IoStatus::why() const { return code == kFailed ? std::strerror(error) : "closed by the peer"; }

void Socket::waitFor(short events, SocketClock::time_point deadline, const Interrupt& intr,
                     const std::string& what) const {
  while (true) {
    intr.poll(what);
    if (SocketClock::now() >= deadline) fail(StatusCode::kTimeout, "timeout while {}", what);
    pollfd p{fd_.get(), events, 0};
    int r = ::poll(&p, 1, pollSlice(deadline));
    if (r > 0) return;
    if (r < 0 && errno != EINTR) fail(StatusCode::kSystemError, "poll failed while {}: {}", what, std::strerror(errno));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Connections

namespace {

Socket newSocket(int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    int err = errno;
    throw SocketError("socket", err, fmt::format("socket(): {}", std::strerror(err)));
  }
  return Socket(UniqueFd(fd));
}

}  // namespace

// Every connection passes here once, on both ends, before its user sees it. Authentication is not done here: the
// job's key belongs to the owner, and accepting owners run it inside event loops that must not stall on a stranger
// (auth.h).
void Socket::established(Side side) {
  connecting_ = false;
  // Both ends: the bootstrap writes a header and then a small body; with Nagle on, the body waits for the header's
  // ACK, which the peer delays by 40 ms once the connection left quick-ACK mode (a few segments in: the
  // authentication exchange's). Every small message would pay it.
  (void)side;
  setNoDelay();
}

Socket Socket::listen(const SocketAddress& addr, SocketAddress* bound, const ListenOptions& opts) {
  Socket s = newSocket(addr.family());
  int one = 1;
  if (opts.reuseAddr) setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd(), addr.sa(), addr.len) != 0) {
    int err = errno;
    if (err == EADDRINUSE)
      throw SocketError(
          "bind", err,
          fmt::format("cannot listen at {}: the address is in use by another job or process", addr.toString()));
    throw SocketError("bind", err, fmt::format("bind({}): {}", addr.toString(), std::strerror(err)));
  }
  if (::listen(s.fd(), opts.backlog) != 0) {
    int err = errno;
    throw SocketError("listen", err, fmt::format("listen(): {}", std::strerror(err)));
  }
  if (bound) {
    bound->len = sizeof(bound->storage);
    getsockname(s.fd(), reinterpret_cast<sockaddr*>(&bound->storage), &bound->len);
  }
  return s;
}

Socket Socket::connectStart(const SocketAddress& addr, int* err) {
  Socket s = newSocket(addr.family());
  *err = ::connect(s.fd(), addr.sa(), addr.len) == 0 ? 0 : errno;
  if (*err == 0)
    s.established(Side::kConnecting);
  else
    s.connecting_ = *err == EINPROGRESS;
  return s;
}

IoStatus Socket::connectProgress() {
  if (!connecting_) return {};
  pollfd p{fd_.get(), POLLOUT, 0};
  if (::poll(&p, 1, 0) <= 0) return {IoStatus::kWouldBlock};
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    connecting_ = false;
    return {IoStatus::kFailed, err};
  }
  established(Side::kConnecting);
  return {};
}

Socket Socket::connect(const SocketAddress& addr, SocketClock::time_point deadline, const Interrupt& intr,
                       const std::string& what, bool retryRefused) {
  int lastErr = 0;
  auto timeout = [&] {
    fail(StatusCode::kTimeout, "timeout while {} (connecting to {}{}{})", what, addr.toString(), lastErr ? ": " : "",
         lastErr ? std::strerror(lastErr) : "");
  };
  while (true) {
    intr.poll(what);
    if (SocketClock::now() >= deadline) timeout();
    int err = 0;
    Socket s = connectStart(addr, &err);
    while (err == EINPROGRESS) {
      try {
        s.waitFor(POLLOUT, deadline, intr, what);
      } catch (const Error& e) {
        if (e.code() == StatusCode::kTimeout) timeout();
        throw;
      }
      IoStatus st = s.connectProgress();
      if (!st.wouldBlock()) err = st.code == IoStatus::kFailed ? st.error : 0;
    }
    if (err == 0) return s;
    lastErr = err;
    if (err == ECONNREFUSED && !retryRefused)
      fail(StatusCode::kRemoteError, "connection to {} refused while {}", addr.toString(), what);
    // A listener that closes (its process exited) while the handshake is under way resets it: the peer is gone, as
    // for a refusal (comm_test's dies-after-register saw it when rank 1 reached rank 2's listener as rank 2 exited).
    if (err == ECONNRESET) fail(StatusCode::kRemoteError, "connection to {} reset while {}", addr.toString(), what);
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != EAGAIN)
      fail(StatusCode::kSystemError, "connect to {} failed while {}: {}", addr.toString(), what, std::strerror(err));
    ::poll(nullptr, 0, 20);
  }
}

Socket Socket::acceptNow() {
  while (true) {
    int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c >= 0) {
      Socket s{UniqueFd(c)};
      s.established(Side::kAccepting);
      return s;
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err == EAGAIN) return Socket();
    throw SocketError("accept", err, fmt::format("accept failed: {}", std::strerror(err)));
  }
}

Socket Socket::accept(SocketClock::time_point deadline, const Interrupt& intr, const std::string& what) {
  while (true) {
    if (Socket s = acceptNow(); s.valid()) return s;
    try {
      waitFor(POLLIN, deadline, intr, what);
    } catch (const Error& e) {
      if (e.code() != StatusCode::kTimeout) throw;
      SocketAddress at;
      at.len = sizeof(at.storage);
      getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&at.storage), &at.len);
      fail(StatusCode::kTimeout, "timeout while {} (accepting at {})", what, at.toString());
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Moving bytes

namespace {

// Sends or receives (`io`, one non-blocking call) what it can of [p + *offset, p + size).
template <typename Io>
IoStatus moveSome(char* p, size_t size, size_t* offset, Io io) {
  while (*offset < size) {
    ssize_t n = io(p + *offset, size - *offset);
    if (n > 0) {
      *offset += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return {IoStatus::kWouldBlock};
    return n < 0 ? IoStatus{IoStatus::kFailed, errno} : IoStatus{IoStatus::kClosed};
  }
  return {};
}

}  // namespace

IoStatus Socket::sendSome(const void* data, size_t size, size_t* offset, bool more) {
  const int fd = fd_.get(), flags = MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0);
  return moveSome(const_cast<char*>(static_cast<const char*>(data)), size, offset,
                  [&](char* p, size_t n) { return ::send(fd, p, n, flags); });
}

IoStatus Socket::recvSome(void* data, size_t size, size_t* offset) {
  const int fd = fd_.get();
  return moveSome(static_cast<char*>(data), size, offset,
                  [&](char* p, size_t n) { return ::recv(fd, p, n, MSG_DONTWAIT); });
}

void Socket::moveAll(bool send, void* data, size_t size, SocketClock::time_point deadline, const Interrupt& intr,
                     const std::string& what) {
  size_t off = 0;
  while (true) {
    IoStatus st = send ? sendSome(data, size, &off) : recvSome(data, size, &off);
    if (st.done()) return;
    if (st.broken()) fail(StatusCode::kRemoteError, "connection lost while {}: {}", what, st.why());
    waitFor(send ? POLLOUT : POLLIN, deadline, intr, what);
  }
}

void Socket::setNoDelay() {
  int one = 1;
  setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

SocketAddress Socket::peerAddress() const {
  SocketAddress a;
  a.len = sizeof(a.storage);
  if (getpeername(fd_.get(), reinterpret_cast<sockaddr*>(&a.storage), &a.len) != 0) return SocketAddress();
  return a;
}

}  // namespace topocoll
