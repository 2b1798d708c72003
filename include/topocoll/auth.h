// Authentication of TCP peers (docs/security.md): before anything else crosses a connection of the bootstrap or of
// the NET transport, each side proves that it holds the job's secret, without sending it. A challenge-response over
// HMAC-SHA-256 (OpenSSL's libcrypto):
//
//   acceptor  -> connector : "tcollAU1" nonceA                                   40 bytes, as soon as it accepts
//   connector -> acceptor  : "tcollAU1" nonceC HMAC(K, "connector" nonceA nonceC) 72 bytes
//   acceptor  -> connector : verdict 'Y' or 'N', HMAC(K, "acceptor" nonceA nonceC) 33 bytes
//
// Both nonces are fresh (32 random bytes each), so a recorded exchange proves nothing on a later connection, and the
// role in each MAC keeps one side's proof from being reflected back as the other's. The connector sends its own data
// only after it has checked the acceptor's MAC, so a process that squats on a job's address learns nothing from it.
// Acceptors run the exchange without blocking (their event loops serve many connections at once: a stranger who
// stops halfway costs them nothing); connectors block with a deadline.
//
//   Socket c = Socket::connect(addr, deadline, intr, "reaching rank 3");
//   authenticate(c, key, deadline, intr, "reaching rank 3");   // throws AuthError when the peer is not of the job
//
//   Handshake h(key, Handshake::Role::kAcceptor);                // per accepted socket, in the event loop
//   IoStatus st = h.step(sock);                                  // kDone: authenticated; broken(): drop, h.why()
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "topocoll/socket.h"
#include "topocoll/status.h"

namespace topocoll {

/// A job's secret: 32 bytes that every rank of the job holds and nobody else does.
struct AuthKey {
  std::array<uint8_t, 32> bytes{};
  /// 32 bytes from the operating system's random source (OpenSSL's RAND_bytes).
  static AuthKey random();
  /// SHA-256 over `label` and `data`: a key from a passphrase or a key file's contents, or (for jobs that were given
  /// no secret) from public facts about the job.
  static AuthKey derive(std::string_view label, std::string_view data);
  /// HMAC-SHA-256(this key, `context`): the secret of a communicator made from this job's (ncclCommSplit,
  /// ncclCommShrink). Every rank that holds this key computes it alone, so the new secret never travels.
  AuthKey child(std::string_view context) const;
  /// Constant-time comparison (CRYPTO_memcmp).
  bool sameAs(const AuthKey& other) const;
};

/// A connector's authentication failed. `refused()`: the acceptor refused this side's proof (it holds another key:
/// another job, or ranks given different secrets); otherwise the acceptor could not prove itself or broke the
/// exchange.
class AuthError : public Error {
 public:
  AuthError(bool refused, const std::string& message) : Error(StatusCode::kRemoteError, message), refused_(refused) {}
  bool refused() const { return refused_; }

 private:
  bool refused_;
};

/// One side of the exchange on one connection.
class Handshake {
 public:
  enum class Role : uint8_t { kConnector, kAcceptor };
  static constexpr size_t kNonceBytes = 32, kMacBytes = 32;
  static constexpr size_t kHelloBytes = 8 + kNonceBytes;             // acceptor's first message
  static constexpr size_t kProofBytes = 8 + kNonceBytes + kMacBytes;  // connector's
  static constexpr size_t kVerdictBytes = 1 + kMacBytes;              // acceptor's answer

  Handshake(const AuthKey& key, Role role);
  /// Moves the exchange on over `s` as far as it goes without blocking. kDone: the peer proved that it holds the key
  /// (and, for an acceptor, was told so); kWouldBlock: call again when `s` is readable; kClosed or kFailed: the
  /// exchange failed (why() says how), and the socket is of no further use. The messages are a few dozen bytes, far
  /// below any socket buffer, so a send never has to wait for the peer to read.
  IoStatus step(Socket& s);
  bool done() const { return state_ == State::kDone; }
  /// The acceptor refused this connector's proof.
  bool refusedByPeer() const { return refused_; }
  /// The connection broke during the exchange (the peer left, or an I/O error), rather than a proof failing.
  bool connectionBroke() const { return broke_; }
  /// Why the exchange failed, for the WARN or the error ("the peer does not hold the job's secret", ...).
  const std::string& why() const { return why_; }

 private:
  // Acceptor: kSendHello, kReceiveProof, kSendVerdict. Connector: kReceiveHello, kSendProof, kReceiveVerdict.
  enum class State : uint8_t { kSendHello, kReceiveProof, kSendVerdict, kReceiveHello, kSendProof, kReceiveVerdict,
                               kDone, kFailed };
  IoStatus failWith(std::string why, IoStatus::Code code = IoStatus::kFailed);
  IoStatus broke(const IoStatus& st);
  void expect(State next, size_t bytes);
  void prepareSend(State next, size_t bytes);
  IoStatus received();
  void mac(bool acceptor, uint8_t* out) const;

  AuthKey key_;
  State state_;
  bool refused_ = false;
  bool broke_ = false;
  bool failAfterSend_ = false;  // an acceptor that refused tells the connector, then fails
  uint8_t nonceA_[kNonceBytes] = {}, nonceC_[kNonceBytes] = {};
  uint8_t out_[kProofBytes] = {}, in_[kProofBytes] = {};
  size_t outSize_ = 0, outDone_ = 0, inSize_ = 0, inDone_ = 0;
  std::string why_;
};

/// One-way authentication, for messages sent without waiting for the receiver (the bootstrap's point-to-point
/// messages and abort notices go out fire-and-forget: the exchange above would need the receiver's event loop to
/// answer, which it does only while it waits in a bootstrap call). The sender appends a seal: a fresh nonce and
/// HMAC(K, label, context, nonce, head, body); the receiver checks it before it acts on the message and remembers
/// the nonce, so a message cannot be played twice. `context` names the receiver ("bootstrap message to rank 3"), so a
/// message for one rank is worth nothing at another.
struct Seal {
  uint8_t nonce[32];
  uint8_t mac[32];
};
static_assert(sizeof(Seal) == 64);
Seal sealMessage(const AuthKey& key, std::string_view context, std::string_view head, std::string_view body);
/// Whether `seal` is `key`'s over this message (constant-time comparison).
bool sealMatches(const AuthKey& key, std::string_view context, std::string_view head, std::string_view body,
                 const Seal& seal);

/// Blocking connector side: the whole exchange over `s` before `deadline`. Throws AuthError (naming `what` and the
/// peer's address) when the peer is not of the job, and the socket errors of sendAll/recvAll (kTimeout, kAborted,
/// kRemoteError) when the connection fails meanwhile.
void authenticate(Socket& s, const AuthKey& key, SocketClock::time_point deadline, const Interrupt& intr,
                  const std::string& what);

}  // namespace topocoll
