// Network interfaces as NCCL chooses them (src/misc/socket.cc ncclFindInterfaces, src/os/linux.cc): the one list the
// bootstrap, the socket transport and topology discovery (the socket plugin's NICs) all draw from.
//
//   auto ifs = topocoll::netif::findInterfaces(cfg.socketIfname, cfg.socketFamily, cfg.commId);
//   // ifs[0] is what NCCL's bootstrap would use; all of them are the socket plugin's devices
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

namespace topocoll::netif {

struct Interface {
  std::string name;            // "eth0"
  sockaddr_storage addr{};     // its first address of the chosen family (port 0)
  socklen_t len = 0;
  /// "10.0.0.1" or "fe80::1" (no port).
  std::string host() const;
};

/// NCCL_SOCKET_IFNAME matching: a comma-separated list of name prefixes; a leading '^' excludes them, '=' makes the
/// match exact; a ":port" suffix of an entry is ignored.
bool matchInterface(const std::string& name, const std::string& spec);

/// Up to `maxIfs` running interfaces with an IPv4/IPv6 address (IPv6 loopback excluded), each once, in the order
/// the kernel lists them. With `ifname` (NCCL_SOCKET_IFNAME) set, the ones it matches (possibly none); otherwise
/// NCCL's order of preference: ib*, else the one in the subnet of `commId`'s address (NCCL_COMM_ID), else anything
/// but docker*, lo*, virbr*, else docker*, else lo*, else virbr*. `family` is "", "AF_INET" or "AF_INET6"
/// (NCCL_SOCKET_FAMILY). Throws Error(kInvalidArgument) on an unknown family.
std::vector<Interface> findInterfaces(const std::string& ifname, const std::string& family,
                                      const std::string& commId = "", int maxIfs = 16);

/// An interface's speed in Mbit/s as the kernel states it (/sys/class/net/NAME/speed), 0 where it states none
/// (loopback, most virtual NICs, a link that is down).
int statedSpeedMbps(const std::string& name);

/// An interface's speed in Mbit/s as the kernel states it, 10000 where it states none (NCCL's socket plugin's
/// default).
int speedMbps(const std::string& name);

}  // namespace topocoll::netif
