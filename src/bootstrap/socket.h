// RAII TCP sockets with deadlines and an abort flag: the only place that touches the socket API.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "topocoll/netif.h"
#include "topocoll/unique_fd.h"
#include "wire.h"

namespace topocoll::bootstrap {

using Clock = std::chrono::steady_clock;

struct Address {
  sockaddr_storage storage{};
  socklen_t len = 0;
  std::string toString() const;
};

WireAddr toWire(const Address& a);
/// False when `w` is not an IPv4 or IPv6 address.
bool fromWire(const WireAddr& w, Address* out);

/// NCCL's interface choice. `ifname` follows NCCL_SOCKET_IFNAME: comma-separated name prefixes, `^` to exclude
/// them, `=` for exact names; empty means netif::findInterfaces's order (ib*, then any but docker*/lo*/virbr*,
/// then docker*, lo*, virbr*), and 127.0.0.1 when nothing is up. `family` is NCCL_SOCKET_FAMILY ("AF_INET",
/// "AF_INET6" or empty for either). Throws when nothing matches an explicit `ifname`.
Address chooseAddress(const std::string& ifname = "", const std::string& family = "");
Address defaultAddress();
/// Whether interface `name` matches an NCCL_SOCKET_IFNAME value (netif's rule, shared with the transports).
using netif::matchInterface;
/// "host:port" or "[v6]:port" (NCCL_COMM_ID syntax); throws naming the value on error.
Address parseHostPort(const std::string& hostPort);

/// What a blocking socket call watches besides its deadline: the caller's abort flag, and a check run on every
/// 100 ms tick that throws to end the wait (the TCP bootstrap's: an abort message from the root or a peer).
struct Interrupt {
  const std::atomic<bool>* flag = nullptr;
  std::function<void()> check;
  /// Throws Error(kAborted) when the flag is set, else whatever `check` throws.
  void poll(const std::string& what) const;
};

/// Milliseconds to the deadline, capped at 100 so that waits wake up to poll their Interrupt.
int pollSlice(Clock::time_point deadline);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }

  /// Listens on `addr` (port 0: ephemeral); the bound address is returned. An address in use fails naming it.
  static Socket listen(const Address& addr, Address* bound);
  /// Connects before the deadline. `retryRefused`: a refused connection is retried (the peer may not listen
  /// yet); otherwise it fails with Error(kRemoteError) at once (the peer listened before, so it is gone).
  static Socket connect(const Address& addr, Clock::time_point deadline, const Interrupt& intr,
                        const std::string& what, bool retryRefused = true);
  /// Accepts one pending connection; an invalid Socket when none is pending (the listener is non-blocking).
  Socket acceptNow();
  void sendAll(const void* data, size_t size, Clock::time_point deadline, const Interrupt& intr,
               const std::string& what);
  void recvAll(void* data, size_t size, Clock::time_point deadline, const Interrupt& intr, const std::string& what);

  enum class ReadStatus { kWaiting, kMessage, kRejected, kClosed };
  /// Feeds `parser` what the (non-blocking) socket has, never reading past the parser's message: kMessage when
  /// the message is complete, kRejected when its header was refused, kClosed on end of stream or an error,
  /// kWaiting when more bytes are to come.
  ReadStatus readInto(MessageParser& parser);
  /// Sends a whole message (header and body) before the deadline; false when the peer is gone or too slow.
  bool trySend(const Header& h, const void* body, Clock::time_point deadline);
  /// The peer's address, for log lines.
  std::string peerName() const;

 private:
  UniqueFd fd_;
};

}  // namespace topocoll::bootstrap
