// TCP sockets with one owner (the UniqueFd of unique_fd.h): addresses, listening, connecting and accepting, and
// moving bytes either without blocking (the caller's event loop or state machine waits) or blocking with a deadline
// and an abort flag. The one place the library speaks TCP: the bootstrap and the NET transport's socket plugin are
// built on it.
//
//   SocketAddress bound;
//   Socket l = Socket::listen(SocketAddress::parse("127.0.0.1:0"), &bound);
//   Socket c = Socket::connect(bound, SocketClock::now() + 5s, Interrupt{&abortFlag}, "reaching the peer");
//   Socket a = l.accept(SocketClock::now() + 5s, Interrupt{}, "waiting for the peer");
//   c.sendAll(buf, n, deadline, Interrupt{}, "sending the record");     // throws naming what it was doing
//
// Authentication is the owners' step, right after a connection is made or accepted (auth.h): the job's key is
// theirs, and acceptors run it inside their event loops.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "topocoll/status.h"
#include "topocoll/unique_fd.h"

namespace topocoll {

using SocketClock = std::chrono::steady_clock;

#pragma pack(push, 1)
/// A socket address as the wire formats carry it (the bootstrap's messages and unique id, NET's connect handles):
/// family, port (network order), IPv4 or IPv6 bytes. Packed, so no uninitialised padding goes on the wire.
struct WireAddr {
  uint16_t family = 0;
  uint16_t port = 0;
  uint8_t addr[16] = {};
};
#pragma pack(pop)
static_assert(sizeof(WireAddr) == 20 && std::has_unique_object_representations_v<WireAddr>);

/// An IPv4 or IPv6 address and port (or nothing: family 0).
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;

  /// "host:port" or "[v6]:port" (NCCL_COMM_ID syntax; a host name is resolved). Throws Error(kInvalidArgument)
  /// naming the value.
  static SocketAddress parse(const std::string& hostPort);
  /// 127.0.0.1, port 0.
  static SocketAddress loopback();
  /// The first `len` bytes of `s` (an interface's address, what getsockname gave).
  static SocketAddress from(const sockaddr_storage& s, socklen_t len);
  /// False when `w` is not an IPv4 or IPv6 address.
  static bool fromWire(const WireAddr& w, SocketAddress* out);
  WireAddr toWire() const;

  int family() const { return storage.ss_family; }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  /// "10.0.0.1", "fe80::1"; "?" for another family.
  std::string host() const;
  /// Host order; 0 for another family.
  int port() const;
  void setPort(int port);
  bool isLoopback() const;
  /// "10.0.0.1:29500", "[fe80::1]:29500"; "?" for another family.
  std::string toString() const;
};

/// What a blocking socket call watches besides its deadline: the caller's abort flag, and a check run on every
/// 100 ms tick that throws to end the wait (the TCP bootstrap's: an abort message from the root or a peer).
struct Interrupt {
  const std::atomic<bool>* flag = nullptr;
  std::function<void()> check{};
  /// Who gives up when the flag is set, for the message: "<who> aborted while <what>".
  const char* who = "socket";
  /// Throws Error(kAborted) when the flag is set, else whatever `check` throws.
  void poll(const std::string& what) const;
};

/// Milliseconds to the deadline, capped at 100 so that waits wake up to poll their Interrupt.
int pollSlice(SocketClock::time_point deadline);

/// How a non-blocking step ended.
struct IoStatus {
  enum Code : uint8_t { kDone, kWouldBlock, kClosed, kFailed };
  Code code = kDone;
  int error = 0;  // kFailed: the errno
  bool done() const { return code == kDone; }
  bool wouldBlock() const { return code == kWouldBlock; }
  /// The peer is gone (end of stream, or an error).
  bool broken() const { return code == kClosed || code == kFailed; }
  /// "closed by the peer", or the errno's text.
  std::string why() const;
};

/// A socket call failed: Error(kSystemError) with the errno and the call ("socket", "bind", "listen", "accept"),
/// for callers that word the failure their own way.
class SocketError : public Error {
 public:
  SocketError(const char* call, int err, const std::string& message)
      : Error(StatusCode::kSystemError, message), call_(call), errno_(err) {}
  const char* call() const { return call_; }
  int error() const { return errno_; }

 private:
  const char* call_;
  int errno_;
};

/// A TCP socket, always non-blocking underneath (blocking calls poll with their deadline).
class Socket {
 public:
  Socket() = default;
  explicit Socket(UniqueFd fd) : fd_(std::move(fd)) {}
  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }

  struct ListenOptions {
    int backlog = 16384;
    bool reuseAddr = true;  // SO_REUSEADDR: a port given in NCCL_COMM_ID binds again while old connections linger
  };
  /// Listens on `addr` (port 0: ephemeral); the bound address goes to `bound`. Throws SocketError: "socket(): ...",
  /// "cannot listen at ADDR: the address is in use by another job or process", "bind(ADDR): ...", "listen(): ...".
  static Socket listen(const SocketAddress& addr, SocketAddress* bound, const ListenOptions& opts);
  static Socket listen(const SocketAddress& addr, SocketAddress* bound) { return listen(addr, bound, {}); }

  /// Connects before the deadline, TCP_NODELAY set. `retryRefused`: a refused connection is retried (the peer may
  /// not listen yet); otherwise it fails with Error(kRemoteError) at once (the peer listened before, so it is gone);
  /// a reset fails so too. Timeouts name the address and the last error.
  static Socket connect(const SocketAddress& addr, SocketClock::time_point deadline, const Interrupt& intr,
                        const std::string& what, bool retryRefused = true);
  /// Non-blocking connect, first step: a socket connecting to `addr`. Throws SocketError ("socket(): ...") when
  /// none can be made; *err is 0 (connected), EINPROGRESS (under way: connectProgress) or why it failed at once.
  static Socket connectStart(const SocketAddress& addr, int* err);
  /// Non-blocking connect, next steps: kWouldBlock while under way, kDone once connected (TCP_NODELAY set), kFailed
  /// with the errno when it failed.
  IoStatus connectProgress();

  /// Accepts one pending connection of a listener (TCP_NODELAY set): an invalid Socket when none is pending. Throws SocketError
  /// ("accept failed: ...") on errors other than a connection aborted before it was accepted.
  Socket acceptNow();
  /// Waits for a connection before the deadline; a timeout names the listening address.
  Socket accept(SocketClock::time_point deadline, const Interrupt& intr, const std::string& what);

  /// Non-blocking: moves what it can of [data + *offset, data + size), advancing *offset. kDone once all of it
  /// moved, kWouldBlock when the socket is full (send) or empty (recv), kClosed (recv: end of stream) or kFailed
  /// when the peer is gone. `more`: more bytes follow at once (MSG_MORE: one segment for both).
  IoStatus sendSome(const void* data, size_t size, size_t* offset, bool more = false);
  IoStatus recvSome(void* data, size_t size, size_t* offset);

  /// Blocking: exactly `size` bytes before the deadline. Throws Error naming `what`: kTimeout ("timeout while
  /// WHAT"), kAborted (the Interrupt's flag), kRemoteError ("connection lost while WHAT: closed by the peer").
  void sendAll(const void* data, size_t size, SocketClock::time_point deadline, const Interrupt& intr,
               const std::string& what) {
    moveAll(true, const_cast<void*>(data), size, deadline, intr, what);
  }
  void recvAll(void* data, size_t size, SocketClock::time_point deadline, const Interrupt& intr,
               const std::string& what) {
    moveAll(false, data, size, deadline, intr, what);
  }

  void setNoDelay();
  /// The peer's address; family 0 when the socket has none.
  SocketAddress peerAddress() const;
  /// The peer's address as text ("?" when unknown), for log lines.
  std::string peerName() const { return peerAddress().toString(); }
  /// Until the socket is ready for `events` (POLLIN, POLLOUT); throws as the blocking calls do.
  void waitFor(short events, SocketClock::time_point deadline, const Interrupt& intr, const std::string& what) const;

 private:
  enum class Side { kConnecting, kAccepting };
  void established(Side side);
  void moveAll(bool send, void* data, size_t size, SocketClock::time_point deadline, const Interrupt& intr,
               const std::string& what);

  UniqueFd fd_;
  bool connecting_ = false;  // connectStart's connect is under way
};

}  // namespace topocoll
