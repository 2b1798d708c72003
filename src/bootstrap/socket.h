// RAII TCP sockets with deadlines and an abort flag: the only place that touches the socket API.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <string>

namespace topocoll::bootstrap {

using Clock = std::chrono::steady_clock;

struct Address {
  sockaddr_storage storage{};
  socklen_t len = 0;
  std::string toString() const;
};

/// NCCL's interface choice. `ifname` follows NCCL_SOCKET_IFNAME: comma-separated name prefixes, `^` to exclude
/// them, `=` for exact names; empty means: InfiniBand IP interfaces (`ib*`) first, then any but docker*/lo, then
/// loopback. `family` is NCCL_SOCKET_FAMILY ("AF_INET", "AF_INET6" or empty for either). Throws when nothing
/// matches an explicit `ifname`.
Address chooseAddress(const std::string& ifname = "", const std::string& family = "");
Address defaultAddress();
/// Whether interface `name` matches an NCCL_SOCKET_IFNAME value.
bool matchInterface(const std::string& name, const std::string& spec);
/// "host:port" or "[v6]:port" (NCCL_COMM_ID syntax); throws naming the value on error.
Address parseHostPort(const std::string& hostPort);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  ~Socket();
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  /// Listens on `addr` (port 0: ephemeral); the bound address is returned.
  static Socket listen(const Address& addr, Address* bound);
  /// Connects, retrying refused connections until the deadline (the peer may not listen yet).
  static Socket connect(const Address& addr, Clock::time_point deadline, const std::atomic<bool>* abort,
                        const std::string& what);
  /// Accepts one connection before the deadline.
  Socket accept(Clock::time_point deadline, const std::atomic<bool>* abort, const std::string& what);
  void sendAll(const void* data, size_t size, Clock::time_point deadline, const std::atomic<bool>* abort,
               const std::string& what);
  void recvAll(void* data, size_t size, Clock::time_point deadline, const std::atomic<bool>* abort,
               const std::string& what);

 private:
  int fd_ = -1;
};

}  // namespace topocoll::bootstrap
