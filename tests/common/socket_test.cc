#include "topocoll/socket.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "topocoll/status.h"

namespace topocoll {
namespace {

using namespace std::chrono_literals;

SocketClock::time_point in(std::chrono::milliseconds ms) { return SocketClock::now() + ms; }

// What a call threw, with its code; empty text when it threw nothing.
template <typename F>
std::pair<StatusCode, std::string> thrown(F f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {StatusCode::kOk, ""};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A loopback port nothing listens on (it was bound a moment ago, then closed).
SocketAddress deadPort() {
  SocketAddress bound;
  Socket::listen(SocketAddress::parse("127.0.0.1:0"), &bound);
  return bound;
}

struct Pair {
  Socket listener, client, server;
  SocketAddress bound;
};

Pair connectedPair(const std::string& where) {
  Pair p;
  p.listener = Socket::listen(SocketAddress::parse(where), &p.bound);
  p.client = Socket::connect(p.bound, in(5000ms), Interrupt{}, "connecting in a test");
  p.server = p.listener.accept(in(5000ms), Interrupt{}, "accepting in a test");
  return p;
}

// Both directions at once (a thread each way), larger than the socket buffers.
void exchange(Pair& p) {
  std::vector<uint8_t> a(4 << 20), b(4 << 20), ra(a.size()), rb(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<uint8_t>(i * 7);
    b[i] = static_cast<uint8_t>(i * 13 + 1);
  }
  std::thread t([&] {
    p.client.sendAll(a.data(), a.size(), in(10000ms), Interrupt{}, "sending a");
    p.client.recvAll(rb.data(), rb.size(), in(10000ms), Interrupt{}, "receiving b");
  });
  p.server.recvAll(ra.data(), ra.size(), in(10000ms), Interrupt{}, "receiving a");
  p.server.sendAll(b.data(), b.size(), in(10000ms), Interrupt{}, "sending b");
  t.join();
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
}

TEST(SocketAddress, ParsesAndWritesBothFamilies) {
  SocketAddress v4 = SocketAddress::parse("10.1.2.3:29500");
  EXPECT_EQ(v4.family(), AF_INET);
  EXPECT_EQ(v4.host(), "10.1.2.3");
  EXPECT_EQ(v4.port(), 29500);
  EXPECT_EQ(v4.toString(), "10.1.2.3:29500");
  EXPECT_FALSE(v4.isLoopback());
  SocketAddress v6 = SocketAddress::parse("[fe80::1]:80");
  EXPECT_EQ(v6.family(), AF_INET6);
  EXPECT_EQ(v6.toString(), "[fe80::1]:80");
  EXPECT_TRUE(SocketAddress::parse("[::1]:1").isLoopback());
  EXPECT_TRUE(SocketAddress::parse("127.0.0.5:1").isLoopback());
  EXPECT_EQ(SocketAddress::parse("localhost:7").port(), 7);
  SocketAddress none;
  EXPECT_EQ(none.toString(), "?");
  EXPECT_EQ(none.host(), "?");
  EXPECT_EQ(none.port(), 0);
  v4.setPort(0);
  EXPECT_EQ(v4.toString(), "10.1.2.3:0");
  EXPECT_EQ(SocketAddress::loopback().toString(), "127.0.0.1:0");
}

TEST(SocketAddress, BadValuesAreNamed) {
  EXPECT_EQ(thrown([] { SocketAddress::parse("nocolon"); }).second, "'nocolon': expected host:port");
  EXPECT_EQ(thrown([] { SocketAddress::parse("[::1]80"); }).second, "'[::1]80': expected [ipv6]:port");
  EXPECT_EQ(thrown([] { SocketAddress::parse("1.2.3.4:70000"); }).second, "'1.2.3.4:70000': bad port");
  EXPECT_EQ(thrown([] { SocketAddress::parse("1.2.3.4:"); }).second, "'1.2.3.4:': bad port");
  auto [code, text] = thrown([] { SocketAddress::parse("no.such.host.invalid:1"); });
  EXPECT_EQ(code, StatusCode::kInvalidArgument);
  EXPECT_EQ(text, "'no.such.host.invalid:1': cannot resolve host 'no.such.host.invalid'");
}

TEST(SocketAddress, WireFormRoundTrips) {
  for (const char* s : {"192.168.7.9:4000", "[2001:db8::5]:65535"}) {
    SocketAddress a = SocketAddress::parse(s);
    WireAddr w = a.toWire();
    EXPECT_EQ(w.family, a.family());
    EXPECT_EQ(ntohs(w.port), a.port());  // network order on the wire
    SocketAddress b;
    ASSERT_TRUE(SocketAddress::fromWire(w, &b));
    EXPECT_EQ(b.toString(), s);
    EXPECT_EQ(b.len, a.len);
  }
  WireAddr junk;
  junk.family = AF_UNIX;
  SocketAddress out;
  EXPECT_FALSE(SocketAddress::fromWire(junk, &out));
}

TEST(Socket, ConnectAcceptAndMoveBytesOverIpv4Loopback) {
  Pair p = connectedPair("127.0.0.1:0");
  EXPECT_NE(p.bound.port(), 0);
  EXPECT_EQ(p.client.peerAddress().toString(), p.bound.toString());
  EXPECT_EQ(p.server.peerName().rfind("127.0.0.1:", 0), 0u) << p.server.peerName();
  exchange(p);
}

TEST(Socket, ConnectAcceptAndMoveBytesOverIpv6Loopback) {
  Pair p;
  try {
    p.listener = Socket::listen(SocketAddress::parse("[::1]:0"), &p.bound);
  } catch (const SocketError& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  p.client = Socket::connect(p.bound, in(5000ms), Interrupt{}, "connecting in a test");
  p.server = p.listener.accept(in(5000ms), Interrupt{}, "accepting in a test");
  EXPECT_EQ(p.server.peerName().rfind("[::1]:", 0), 0u) << p.server.peerName();
  exchange(p);
}

TEST(Socket, AnAddressInUseIsNamed) {
  SocketAddress bound;
  Socket first = Socket::listen(SocketAddress::parse("127.0.0.1:0"), &bound);
  try {
    Socket::listen(bound, nullptr);
    FAIL() << "a second listener on one address";
  } catch (const SocketError& e) {
    EXPECT_EQ(e.code(), StatusCode::kSystemError);
    EXPECT_EQ(e.error(), EADDRINUSE);
    EXPECT_STREQ(e.call(), "bind");
    EXPECT_EQ(std::string(e.what()),
              "cannot listen at " + bound.toString() + ": the address is in use by another job or process");
  }
  // A given port binds again once its listener is gone, even while its closed connections linger (SO_REUSEADDR).
  first = Socket();
  {
    Pair p = connectedPair(bound.toString());
    EXPECT_EQ(p.bound.toString(), bound.toString());
  }  // the accepted end closes first: its side of the connection waits in TIME_WAIT on the port
  SocketAddress again;
  Socket l = Socket::listen(bound, &again);
  EXPECT_EQ(again.toString(), bound.toString());
}

TEST(Socket, ConnectTimeoutsAndRefusalsNameThePeer) {
  SocketAddress dead = deadPort();
  auto [code, text] = thrown([&] { Socket::connect(dead, in(300ms), Interrupt{}, "reaching a test peer"); });
  EXPECT_EQ(code, StatusCode::kTimeout);
  EXPECT_EQ(text, "timeout while reaching a test peer (connecting to " + dead.toString() + ": " +
                      std::strerror(ECONNREFUSED) + ")");
  std::tie(code, text) =
      thrown([&] { Socket::connect(dead, in(5000ms), Interrupt{}, "reaching a test peer", /*retryRefused=*/false); });
  EXPECT_EQ(code, StatusCode::kRemoteError);
  EXPECT_EQ(text, "connection to " + dead.toString() + " refused while reaching a test peer");
}

TEST(Socket, AcceptAndReceiveTimeouts) {
  Pair p = connectedPair("127.0.0.1:0");
  auto [code, text] = thrown([&] { p.listener.accept(in(100ms), Interrupt{}, "waiting for a second peer"); });
  EXPECT_EQ(code, StatusCode::kTimeout);
  EXPECT_EQ(text, "timeout while waiting for a second peer (accepting at " + p.bound.toString() + ")");
  char buf[8];
  auto start = SocketClock::now();
  std::tie(code, text) =
      thrown([&] { p.server.recvAll(buf, sizeof(buf), in(150ms), Interrupt{}, "reading a record"); });
  EXPECT_EQ(code, StatusCode::kTimeout);
  EXPECT_EQ(text, "timeout while reading a record");
  EXPECT_LT(SocketClock::now() - start, 3s);
}

TEST(Socket, APeerClosingMidMessageIsAClearError) {
  Pair p = connectedPair("127.0.0.1:0");
  char part[10] = "123456789";
  p.client.sendAll(part, sizeof(part), in(1000ms), Interrupt{}, "sending part of a record");
  p.client = Socket();
  char buf[100];
  auto [code, text] = thrown([&] { p.server.recvAll(buf, sizeof(buf), in(5000ms), Interrupt{}, "reading a record"); });
  EXPECT_EQ(code, StatusCode::kRemoteError);
  EXPECT_EQ(text, "connection lost while reading a record: closed by the peer");
  // Sending to a peer that left fails too (a reset, or the pipe), never with SIGPIPE.
  std::vector<char> big(8 << 20);
  std::tie(code, text) =
      thrown([&] { p.server.sendAll(big.data(), big.size(), in(5000ms), Interrupt{}, "answering a gone peer"); });
  EXPECT_EQ(code, StatusCode::kRemoteError);
  EXPECT_TRUE(contains(text, "connection lost while answering a gone peer: ")) << text;
}

TEST(Socket, TheAbortFlagEndsABlockingWait) {
  Pair p = connectedPair("127.0.0.1:0");
  std::atomic<bool> abort{false};
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    abort = true;
  });
  char buf[8];
  auto start = SocketClock::now();
  auto [code, text] = thrown([&] {
    p.server.recvAll(buf, sizeof(buf), in(30000ms), Interrupt{&abort, nullptr, "bootstrap"}, "waiting for a record");
  });
  t.join();
  EXPECT_EQ(code, StatusCode::kAborted);
  EXPECT_EQ(text, "bootstrap aborted while waiting for a record");
  EXPECT_LT(SocketClock::now() - start, 5s);
  // Also while connecting, and an Interrupt's check ends a wait the same way.
  std::tie(code, text) = thrown([&] {
    Socket::connect(deadPort(), in(30000ms), Interrupt{&abort}, "connecting");
  });
  EXPECT_EQ(code, StatusCode::kAborted);
  EXPECT_EQ(text, "socket aborted while connecting");
  std::tie(code, text) = thrown([&] {
    p.server.recvAll(buf, sizeof(buf), in(30000ms),
                     Interrupt{nullptr, [] { fail(StatusCode::kRemoteError, "the job failed elsewhere"); }}, "waiting");
  });
  EXPECT_EQ(code, StatusCode::kRemoteError);
  EXPECT_EQ(text, "the job failed elsewhere");
}

TEST(Socket, NonBlockingConnectAcceptAndTransfer) {
  SocketAddress bound;
  Socket l = Socket::listen(SocketAddress::parse("127.0.0.1:0"), &bound, {.backlog = 128, .reuseAddr = false});
  EXPECT_FALSE(l.acceptNow().valid());  // nothing pending
  int err = -1;
  Socket c = Socket::connectStart(bound, &err);
  ASSERT_TRUE(err == 0 || err == EINPROGRESS) << std::strerror(err);
  Socket s;
  IoStatus st;
  for (auto until = in(5000ms); SocketClock::now() < until && (!s.valid() || !st.done());) {
    st = c.connectProgress();
    ASSERT_FALSE(st.broken()) << st.why();
    if (!s.valid()) s = l.acceptNow();
  }
  ASSERT_TRUE(st.done());
  ASSERT_TRUE(s.valid());
  EXPECT_TRUE(c.connectProgress().done());  // established once: later calls have nothing to do
  uint64_t hello = 0x1234, got = 0;
  size_t sent = 0, recvd = 0;
  EXPECT_TRUE(s.recvSome(&got, sizeof(got), &recvd).wouldBlock());
  EXPECT_TRUE(c.sendSome(&hello, sizeof(hello), &sent).done());
  for (auto until = in(5000ms); SocketClock::now() < until && recvd < sizeof(got);) {
    IoStatus r = s.recvSome(&got, sizeof(got), &recvd);
    ASSERT_FALSE(r.broken()) << r.why();
  }
  EXPECT_EQ(got, hello);
  c = Socket();
  recvd = 0;
  IoStatus r;
  for (auto until = in(5000ms); SocketClock::now() < until && !r.broken();) r = s.recvSome(&got, sizeof(got), &recvd);
  EXPECT_EQ(r.code, IoStatus::kClosed);
  EXPECT_EQ(r.why(), "closed by the peer");
  // A refused non-blocking connect reports the errno, at once or on a later step.
  Socket d = Socket::connectStart(deadPort(), &err);
  if (err == EINPROGRESS) {
    for (auto until = in(5000ms); SocketClock::now() < until;) {
      st = d.connectProgress();
      if (!st.wouldBlock()) break;
    }
    EXPECT_EQ(st.code, IoStatus::kFailed);
    err = st.error;
  }
  EXPECT_EQ(err, ECONNREFUSED);
}

}  // namespace
}  // namespace topocoll
