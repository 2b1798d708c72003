#include "stream.h"

#include <algorithm>
#include <vector>

#include "topocoll/status.h"

namespace topocoll::bootstrap {

SocketAddress chooseAddress(const std::string& ifname, const std::string& family) {
  // The same list the socket transport and topology discovery use (NCCL's bootstrap also takes the first of
  // ncclFindInterfaces); with nothing up but an unset NCCL_SOCKET_IFNAME, 127.0.0.1.
  std::vector<netif::Interface> ifs = netif::findInterfaces(ifname, family, "", 1);
  if (ifs.empty()) {
    if (ifname.size() > 1) fail(StatusCode::kInvalidArgument, "NCCL_SOCKET_IFNAME={}: no up interface matches", ifname);
    return SocketAddress::loopback();
  }
  return SocketAddress::from(ifs[0].addr, ifs[0].len);
}

SocketAddress defaultAddress() { return chooseAddress(); }

ReadStatus readMessage(Socket& s, MessageParser& parser) {
  uint8_t buf[64 << 10];
  while (!parser.done() && !parser.rejected()) {
    size_t got = 0;
    IoStatus st = s.recvSome(buf, std::min(parser.wanted(), sizeof(buf)), &got);
    if (got) parser.feed(buf, got);
    if (st.wouldBlock()) return ReadStatus::kWaiting;
    if (st.broken()) return ReadStatus::kClosed;
  }
  return parser.done() ? ReadStatus::kMessage : ReadStatus::kRejected;
}

bool trySend(Socket& s, const Header& h, const void* body, Clock::time_point deadline) {
  try {
    s.sendAll(&h, sizeof(h), deadline, Interrupt{}, "sending a bootstrap message");
    if (h.size) s.sendAll(body, h.size, deadline, Interrupt{}, "sending a bootstrap message");
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace topocoll::bootstrap
