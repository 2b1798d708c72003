// The bootstrap's side of the TCP socket layer (topocoll/socket.h): the address a rank listens at, and its messages
// (wire.h) read from and written to a socket.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "topocoll/netif.h"
#include "topocoll/socket.h"
#include "wire.h"

namespace topocoll::bootstrap {

using Clock = SocketClock;

/// NCCL's interface choice. `ifname` follows NCCL_SOCKET_IFNAME: comma-separated name prefixes, `^` to exclude
/// them, `=` for exact names; empty means netif::findInterfaces's order (ib*, then any but docker*/lo*/virbr*,
/// then docker*, lo*, virbr*), and 127.0.0.1 when nothing is up. `family` is NCCL_SOCKET_FAMILY ("AF_INET",
/// "AF_INET6" or empty for either). Throws when nothing matches an explicit `ifname`.
SocketAddress chooseAddress(const std::string& ifname = "", const std::string& family = "");
SocketAddress defaultAddress();
/// Whether interface `name` matches an NCCL_SOCKET_IFNAME value (netif's rule, shared with the transports).
using netif::matchInterface;

/// An Interrupt whose flag ends the wait with "bootstrap aborted while ...".
inline Interrupt abortable(const std::atomic<bool>* flag, std::function<void()> check = {}) {
  return Interrupt{flag, std::move(check), "bootstrap"};
}

enum class ReadStatus { kWaiting, kMessage, kRejected, kClosed };
/// Feeds `parser` what the socket has, never reading past the parser's message: kMessage when the message is
/// complete, kRejected when its header was refused, kClosed on end of stream or an error, kWaiting when more bytes
/// are to come.
ReadStatus readMessage(Socket& s, MessageParser& parser);
/// Sends a whole message (header and body) before the deadline; false when the peer is gone or too slow.
bool trySend(Socket& s, const Header& h, const void* body, Clock::time_point deadline);

}  // namespace topocoll::bootstrap
