// Interface choice with NCCL's rules (NCCL 2.30.7 src/misc/socket.cc, src/os/linux.cc; Apache-2.0, see NOTICE).
#include "topocoll/netif.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "topocoll/socket.h"
#include "topocoll/status.h"

namespace topocoll::netif {

namespace {

struct IfAddrsDeleter {
  void operator()(ifaddrs* p) const { freeifaddrs(p); }
};
using IfAddrs = std::unique_ptr<ifaddrs, IfAddrsDeleter>;

IfAddrs listInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) fail(StatusCode::kSystemError, "getifaddrs: {}", std::strerror(errno));
  return IfAddrs(list);
}

int familyOf(const std::string& family) {
  if (family.empty()) return AF_UNSPEC;
  if (family == "AF_INET") return AF_INET;
  if (family == "AF_INET6") return AF_INET6;
  fail(StatusCode::kInvalidArgument, "NCCL_SOCKET_FAMILY={}: expected AF_INET or AF_INET6", family);
}

bool usable(const ifaddrs* i, int fam) {
  if (!i->ifa_addr) return false;
  int f = i->ifa_addr->sa_family;
  if (f != AF_INET && f != AF_INET6) return false;
  if (!(i->ifa_flags & IFF_RUNNING)) return false;
  if (fam != AF_UNSPEC && f != fam) return false;
  // IPv6 loopback as NCCL; also link-local (fe80::/10), which NCCL keeps: another host reaches it only through a
  // scope (its own interface index) that a peer's address cannot carry, so a bridge or veth with nothing else (an
  // emulated cluster's, a container runtime's) would become a NET device no peer can connect to.
  const in6_addr* a6 = f == AF_INET6 ? &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr : nullptr;
  if (a6 && (IN6_IS_ADDR_LOOPBACK(a6) || IN6_IS_ADDR_LINKLOCAL(a6))) return false;
  return true;
}

Interface make(const ifaddrs* i) {
  Interface out;
  out.name = i->ifa_name;
  out.len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memcpy(&out.addr, i->ifa_addr, out.len);
  return out;
}

void add(std::vector<Interface>& out, const ifaddrs* i, int maxIfs) {
  if (static_cast<int>(out.size()) >= maxIfs) return;
  for (auto& o : out)
    if (o.name == i->ifa_name) return;  // one address per interface: the kernel lists IPv4 first
  out.push_back(make(i));
}

std::vector<Interface> matching(const ifaddrs* list, const std::string& spec, int fam, int maxIfs) {
  std::vector<Interface> out;
  for (const ifaddrs* i = list; i; i = i->ifa_next)
    if (usable(i, fam) && matchInterface(i->ifa_name, spec)) add(out, i, maxIfs);
  return out;
}

// The interface whose subnet holds the address of `commId` ("host:port" or "[v6]:port"), as NCCL tries next.
std::vector<Interface> sameSubnet(const ifaddrs* list, const std::string& commId) {
  std::string host = commId;
  if (!host.empty() && host[0] == '[') host = host.substr(1, host.find(']') - 1);
  else if (auto c = host.rfind(':'); c != std::string::npos) host.resize(c);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (host.empty() || getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return {};
  sockaddr_storage target{};
  std::memcpy(&target, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!usable(i, target.ss_family) || !i->ifa_netmask) continue;
    bool same = true;
    if (target.ss_family == AF_INET) {
      auto a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      auto m = reinterpret_cast<const sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr;
      auto t = reinterpret_cast<const sockaddr_in*>(&target)->sin_addr.s_addr;
      same = (a & m) == (t & m);
    } else {
      auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr.s6_addr;
      auto* m = reinterpret_cast<const sockaddr_in6*>(i->ifa_netmask)->sin6_addr.s6_addr;
      auto* t = reinterpret_cast<const sockaddr_in6*>(&target)->sin6_addr.s6_addr;
      for (int b = 0; b < 16; ++b) same &= (a[b] & m[b]) == (t[b] & m[b]);
    }
    if (same) return {make(i)};
  }
  return {};
}

}  // namespace

std::string Interface::host() const { return SocketAddress::from(addr, sizeof(addr)).host(); }

bool matchInterface(const std::string& name, const std::string& specIn) {
  std::string spec = specIn;
  bool exclude = !spec.empty() && spec[0] == '^';
  if (exclude) spec.erase(0, 1);
  bool exact = !spec.empty() && spec[0] == '=';
  if (exact) spec.erase(0, 1);
  bool found = false;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string tok = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (auto colon = tok.find(':'); colon != std::string::npos) tok.resize(colon);
    if (tok.empty()) continue;
    if (exact ? name == tok : name.rfind(tok, 0) == 0) found = true;
  }
  return exclude ? !found : found;
}

std::vector<Interface> findInterfaces(const std::string& ifname, const std::string& family, const std::string& commId,
                                      int maxIfs) {
  int fam = familyOf(family);
  IfAddrs list = listInterfaces();
  if (ifname.size() > 1) return matching(list.get(), ifname, fam, maxIfs);
  std::vector<Interface> out = matching(list.get(), "ib", fam, maxIfs);
  if (out.empty() && commId.size() > 1) out = sameSubnet(list.get(), commId);
  for (const char* spec : {"^docker,lo,virbr", "docker", "lo", "virbr"})
    if (out.empty()) out = matching(list.get(), spec, fam, maxIfs);
  return out;
}

int statedSpeedMbps(const std::string& name) {
  int mbps = 0;
  const std::string path = "/sys/class/net/" + name + "/speed";
  if (std::FILE* f = std::fopen(path.c_str(), "r")) {
    int s = 0;
    if (std::fscanf(f, "%d", &s) == 1 && s > 0) mbps = s;
    std::fclose(f);
  }
  return mbps;
}

int speedMbps(const std::string& name) {
  const int s = statedSpeedMbps(name);
  return s > 0 ? s : 10000;
}

}  // namespace topocoll::netif
