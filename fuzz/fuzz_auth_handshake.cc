// libFuzzer target: one side of the authentication exchange (auth.h) fed whatever a stranger sends. Input:
// [role: 1 byte, even = acceptor, odd = connector][the peer's bytes...]. The exchange must end (done, failed or
// waiting for more) without a crash, and a peer that does not hold the key, which the fuzzer cannot know (it is
// random per run), must never be authenticated.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "topocoll/auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace topocoll;
  if (size < 1) return 0;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  Socket mine{UniqueFd(fds[0])};
  UniqueFd peer(fds[1]);
  static const AuthKey key = AuthKey::random();
  Handshake h(key, data[0] % 2 ? Handshake::Role::kConnector : Handshake::Role::kAcceptor);
  size_t at = 1;
  IoStatus st = h.step(mine);
  // The peer's bytes in small pieces, stepping after each (as readiness would wake the event loop).
  while (at < size && st.wouldBlock()) {
    const size_t piece = std::min<size_t>(size - at, 1 + data[at] % 48);
    if (::write(peer.get(), data + at, piece) != static_cast<ssize_t>(piece)) break;
    at += piece;
    st = h.step(mine);
  }
  if (st.wouldBlock()) {
    ::shutdown(peer.get(), SHUT_WR);  // the stranger leaves
    st = h.step(mine);
    if (!st.broken()) __builtin_trap();
  }
  if (st.done() || h.done()) __builtin_trap();  // authenticated without the key
  if (st.broken() && h.why().empty()) __builtin_trap();
  return 0;
}
