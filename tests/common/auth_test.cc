// The authentication exchange of auth.h, on loopback connections: members of a job get through, strangers, squatters,
// replayed proofs and non-topocoll peers are refused on the side that can tell.
#include "topocoll/auth.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <thread>

namespace topocoll {
namespace {

using namespace std::chrono_literals;

SocketClock::time_point in(std::chrono::milliseconds ms) { return SocketClock::now() + ms; }
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Pair {
  Socket listener, client, server;
  SocketAddress bound;
};

Pair connectedPair() {
  Pair p;
  p.listener = Socket::listen(SocketAddress::parse("127.0.0.1:0"), &p.bound);
  p.client = Socket::connect(p.bound, in(5000ms), Interrupt{}, "connecting in a test");
  p.server = p.listener.accept(in(5000ms), Interrupt{}, "accepting in a test");
  return p;
}

// Runs an acceptor's exchange on `s` as an event loop would, until it ends; returns its last status.
IoStatus acceptorLoop(Handshake& h, Socket& s) {
  const auto until = in(5000ms);
  while (SocketClock::now() < until) {
    IoStatus st = h.step(s);
    if (!st.wouldBlock()) return st;
    pollfd p{s.fd(), POLLIN, 0};
    ::poll(&p, 1, 50);
  }
  return {IoStatus::kWouldBlock};
}

struct Outcome {
  IoStatus acceptor;
  std::string acceptorWhy, connectorError;
  bool refused = false;
};

Outcome run(const AuthKey& connectorKey, const AuthKey& acceptorKey, Pair& p) {
  Outcome o;
  Handshake h(acceptorKey, Handshake::Role::kAcceptor);
  std::thread t([&] {
    o.acceptor = acceptorLoop(h, p.server);
    o.acceptorWhy = h.why();
  });
  try {
    authenticate(p.client, connectorKey, in(5000ms), Interrupt{}, "reaching the test's peer");
  } catch (const AuthError& e) {
    o.connectorError = e.what();
    o.refused = e.refused();
  } catch (const Error& e) {
    o.connectorError = std::string("(not an AuthError) ") + e.what();
  }
  t.join();
  return o;
}

TEST(AuthKey, DerivedKeysDependOnLabelAndDataRandomOnesDiffer) {
  EXPECT_TRUE(AuthKey::derive("l", "secret").sameAs(AuthKey::derive("l", "secret")));
  EXPECT_FALSE(AuthKey::derive("l", "secret").sameAs(AuthKey::derive("l", "secreT")));
  EXPECT_FALSE(AuthKey::derive("ab", "c").sameAs(AuthKey::derive("a", "bc")));
  EXPECT_FALSE(AuthKey::random().sameAs(AuthKey::random()));
}

TEST(Handshake, MembersOfAJobGetThroughAndTheirDataFollows) {
  const AuthKey k = AuthKey::random();
  Pair p = connectedPair();
  Outcome o = run(k, k, p);
  EXPECT_EQ(o.connectorError, "");
  EXPECT_TRUE(o.acceptor.done()) << o.acceptorWhy;
  // The exchange consumed exactly its own bytes: what follows is the application's.
  const char msg[] = "after the handshake";
  p.client.sendAll(msg, sizeof(msg), in(5000ms), Interrupt{}, "sending");
  char got[sizeof(msg)] = {};
  p.server.recvAll(got, sizeof(got), in(5000ms), Interrupt{}, "receiving");
  EXPECT_STREQ(got, msg);
}

TEST(Handshake, AStrangerWithAnotherKeyIsRefusedAndToldSo) {
  Pair p = connectedPair();
  Outcome o = run(AuthKey::random(), AuthKey::random(), p);
  EXPECT_TRUE(o.acceptor.broken());
  EXPECT_TRUE(contains(o.acceptorWhy, "does not hold the job's secret")) << o.acceptorWhy;
  EXPECT_TRUE(o.refused) << o.connectorError;
  EXPECT_TRUE(contains(o.connectorError, "refused this side's proof")) << o.connectorError;
  EXPECT_TRUE(contains(o.connectorError, "127.0.0.1:")) << o.connectorError;  // names the peer
}

// A process listening on the job's address (a squatter) that plays along but does not hold the key: the connector
// refuses it before sending anything of its own.
TEST(Handshake, ASquatterThatCannotProveItselfIsRefusedByTheConnector) {
  Pair p = connectedPair();
  std::thread squatter([&] {
    uint8_t hello[Handshake::kHelloBytes] = {'t', 'c', 'o', 'l', 'l', 'A', 'U', '1'};
    p.server.sendAll(hello, sizeof(hello), in(5000ms), Interrupt{}, "squatter hello");
    uint8_t proof[Handshake::kProofBytes];
    p.server.recvAll(proof, sizeof(proof), in(5000ms), Interrupt{}, "squatter reading the proof");
    uint8_t verdict[Handshake::kVerdictBytes];
    std::memset(verdict, 0x33, sizeof(verdict));
    verdict[0] = 'Y';
    p.server.sendAll(verdict, sizeof(verdict), in(5000ms), Interrupt{}, "squatter verdict");
  });
  try {
    authenticate(p.client, AuthKey::random(), in(5000ms), Interrupt{}, "reaching rank 3");
    ADD_FAILURE() << "a squatter was accepted";
  } catch (const AuthError& e) {
    EXPECT_FALSE(e.refused());
    EXPECT_TRUE(contains(e.what(), "could not prove that it holds the job's secret")) << e.what();
    EXPECT_TRUE(contains(e.what(), "reaching rank 3")) << e.what();
  }
  squatter.join();
}

// A proof recorded from one connection is worthless on the next: the acceptor's nonce differs.
TEST(Handshake, AReplayedProofIsRefused) {
  const AuthKey k = AuthKey::random();
  uint8_t recorded[Handshake::kProofBytes];
  {
    Pair p = connectedPair();
    std::thread fakeAcceptor([&] {
      uint8_t hello[Handshake::kHelloBytes] = {'t', 'c', 'o', 'l', 'l', 'A', 'U', '1'};
      p.server.sendAll(hello, sizeof(hello), in(5000ms), Interrupt{}, "hello");
      p.server.recvAll(recorded, sizeof(recorded), in(5000ms), Interrupt{}, "recording the proof");
      p.server = Socket();
    });
    EXPECT_THROW(authenticate(p.client, k, in(5000ms), Interrupt{}, "being recorded"), Error);
    fakeAcceptor.join();
  }
  Pair p = connectedPair();
  Handshake h(k, Handshake::Role::kAcceptor);
  uint8_t hello[Handshake::kHelloBytes];
  std::thread replayer([&] {
    p.client.recvAll(hello, sizeof(hello), in(5000ms), Interrupt{}, "replayer reading the hello");
    p.client.sendAll(recorded, sizeof(recorded), in(5000ms), Interrupt{}, "replaying");
  });
  IoStatus st = acceptorLoop(h, p.server);
  replayer.join();
  EXPECT_TRUE(st.broken());
  EXPECT_TRUE(contains(h.why(), "does not hold the job's secret")) << h.why();
}

TEST(Handshake, PeersThatDoNotSpeakItAreNamed) {
  {  // the connector meets a server that sends something else first
    Pair p = connectedPair();
    const char banner[Handshake::kHelloBytes] = "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3";
    p.server.sendAll(banner, sizeof(banner), in(5000ms), Interrupt{}, "banner");
    try {
      authenticate(p.client, AuthKey::random(), in(5000ms), Interrupt{}, "reaching the root");
      ADD_FAILURE() << "accepted a banner";
    } catch (const AuthError& e) {
      EXPECT_TRUE(contains(e.what(), "did not start the authentication exchange")) << e.what();
    }
  }
  {  // the acceptor meets a client that sends garbage, and one that closes at once
    Pair p = connectedPair();
    Handshake h(AuthKey::random(), Handshake::Role::kAcceptor);
    std::vector<char> junk(Handshake::kProofBytes, 'G');
    p.client.sendAll(junk.data(), junk.size(), in(5000ms), Interrupt{}, "junk");
    IoStatus st = acceptorLoop(h, p.server);
    EXPECT_TRUE(st.broken());
    EXPECT_TRUE(contains(h.why(), "did not answer the authentication exchange")) << h.why();
    Pair q = connectedPair();
    Handshake h2(AuthKey::random(), Handshake::Role::kAcceptor);
    q.client = Socket();
    st = acceptorLoop(h2, q.server);
    EXPECT_TRUE(st.broken());
    EXPECT_TRUE(contains(h2.why(), "connection broke")) << h2.why();
  }
}

TEST(Handshake, AConnectorWaitsNoLongerThanItsDeadline) {
  Pair p = connectedPair();  // the acceptor never speaks
  const auto start = SocketClock::now();
  try {
    authenticate(p.client, AuthKey::random(), in(300ms), Interrupt{}, "reaching a silent peer");
    ADD_FAILURE() << "a silent peer was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kTimeout) << e.what();
    EXPECT_TRUE(contains(e.what(), "reaching a silent peer")) << e.what();
  }
  EXPECT_LT(SocketClock::now() - start, 3s);
}

// A sealed message checks out only under the sender's key, for the receiver it names, with its bytes unchanged.
TEST(Seal, BindsTheKeyTheReceiverAndEveryByte) {
  const AuthKey k = AuthKey::random();
  const std::string head = "header bytes", body = "the body of the message";
  const Seal s = sealMessage(k, "to rank 3", head, body);
  EXPECT_TRUE(sealMatches(k, "to rank 3", head, body, s));
  EXPECT_FALSE(sealMatches(AuthKey::random(), "to rank 3", head, body, s));  // a stranger's key
  EXPECT_FALSE(sealMatches(k, "to rank 4", head, body, s));                  // replayed to another rank
  EXPECT_FALSE(sealMatches(k, "to rank 3", head, "the body of the messagE", s));
  EXPECT_FALSE(sealMatches(k, "to rank 3", "Header bytes", body, s));
  Seal forged = s;
  forged.mac[31] ^= 1;
  EXPECT_FALSE(sealMatches(k, "to rank 3", head, body, forged));
  const Seal again = sealMessage(k, "to rank 3", head, body);
  EXPECT_NE(std::memcmp(again.nonce, s.nonce, sizeof(s.nonce)), 0);  // fresh every time
}

}  // namespace
}  // namespace topocoll
