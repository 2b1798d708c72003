// The challenge-response of auth.h over OpenSSL's libcrypto: RAND_bytes for the nonces and keys, HMAC-SHA-256 for
// the proofs, SHA-256 to derive keys, CRYPTO_memcmp to compare MACs in constant time.
#include "topocoll/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>

#include <cstring>
#include <vector>

namespace topocoll {

namespace {

constexpr char kMagic[8] = {'t', 'c', 'o', 'l', 'l', 'A', 'U', '1'};
constexpr char kConnectorLabel[] = "topocoll-auth-v1 connector";
constexpr char kAcceptorLabel[] = "topocoll-auth-v1 acceptor";
constexpr char kBroke[] = "the connection broke: ";

void randomBytes(uint8_t* out, size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1)
    fail(StatusCode::kSystemError, "the operating system's random source failed (OpenSSL RAND_bytes)");
}

}  // namespace

AuthKey AuthKey::random() {
  AuthKey k;
  randomBytes(k.bytes.data(), k.bytes.size());
  return k;
}

AuthKey AuthKey::derive(std::string_view label, std::string_view data) {
  std::string input(label);
  input.push_back('\0');  // "ab"+"c" and "a"+"bc" differ
  input.append(data);
  AuthKey k;
  unsigned int len = 0;
  if (EVP_Digest(input.data(), input.size(), k.bytes.data(), &len, EVP_sha256(), nullptr) != 1 || len != k.bytes.size())
    fail(StatusCode::kInternal, "SHA-256 failed (OpenSSL EVP_Digest)");
  OPENSSL_cleanse(input.data(), input.size());
  return k;
}

AuthKey AuthKey::child(std::string_view context) const {
  AuthKey k;
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), bytes.data(), static_cast<int>(bytes.size()), reinterpret_cast<const uint8_t*>(context.data()),
            context.size(), k.bytes.data(), &len) ||
      len != k.bytes.size())
    fail(StatusCode::kInternal, "HMAC-SHA-256 failed (OpenSSL HMAC)");
  return k;
}

bool AuthKey::sameAs(const AuthKey& other) const {
  return CRYPTO_memcmp(bytes.data(), other.bytes.data(), bytes.size()) == 0;
}

Handshake::Handshake(const AuthKey& key, Role role) : key_(key) {
  if (role == Role::kAcceptor) {
    randomBytes(nonceA_, kNonceBytes);
    std::memcpy(out_, kMagic, sizeof(kMagic));
    std::memcpy(out_ + sizeof(kMagic), nonceA_, kNonceBytes);
    prepareSend(State::kSendHello, kHelloBytes);
  } else {
    randomBytes(nonceC_, kNonceBytes);
    expect(State::kReceiveHello, kHelloBytes);
  }
}

void Handshake::mac(bool acceptor, uint8_t* out) const {
  const char* label = acceptor ? kAcceptorLabel : kConnectorLabel;
  const size_t labelBytes = std::strlen(label);
  uint8_t input[sizeof(kConnectorLabel) + 2 * kNonceBytes];
  std::memcpy(input, label, labelBytes);
  std::memcpy(input + labelBytes, nonceA_, kNonceBytes);
  std::memcpy(input + labelBytes + kNonceBytes, nonceC_, kNonceBytes);
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key_.bytes.data(), static_cast<int>(key_.bytes.size()), input,
            labelBytes + 2 * kNonceBytes, out, &len) ||
      len != kMacBytes)
    fail(StatusCode::kInternal, "HMAC-SHA-256 failed (OpenSSL HMAC)");
}

void Handshake::expect(State next, size_t bytes) {
  state_ = next;
  inSize_ = bytes;
  inDone_ = 0;
}

void Handshake::prepareSend(State next, size_t bytes) {
  state_ = next;
  outSize_ = bytes;
  outDone_ = 0;
}

IoStatus Handshake::failWith(std::string why, IoStatus::Code code) {
  state_ = State::kFailed;
  why_ = std::move(why);
  return {code};
}

IoStatus Handshake::broke(const IoStatus& st) {
  broke_ = true;
  return failWith(kBroke + st.why(), st.code);
}

// A whole message of the peer is in in_.
IoStatus Handshake::received() {
  switch (state_) {
    case State::kReceiveHello:  // connector: the acceptor's nonce; answer with ours and our proof
      if (std::memcmp(in_, kMagic, sizeof(kMagic)) != 0)
        return failWith("the peer did not start the authentication exchange (not a topocoll peer of this version)");
      std::memcpy(nonceA_, in_ + sizeof(kMagic), kNonceBytes);
      std::memcpy(out_, kMagic, sizeof(kMagic));
      std::memcpy(out_ + sizeof(kMagic), nonceC_, kNonceBytes);
      mac(false, out_ + sizeof(kMagic) + kNonceBytes);
      prepareSend(State::kSendProof, kProofBytes);
      return {IoStatus::kWouldBlock};
    case State::kReceiveProof: {  // acceptor: the connector's proof; answer with the verdict and our own proof
      uint8_t want[kMacBytes];
      const bool magicOk = std::memcmp(in_, kMagic, sizeof(kMagic)) == 0;
      if (magicOk) {
        std::memcpy(nonceC_, in_ + sizeof(kMagic), kNonceBytes);
        mac(false, want);
      }
      const bool ok = magicOk && CRYPTO_memcmp(want, in_ + sizeof(kMagic) + kNonceBytes, kMacBytes) == 0;
      std::memset(out_, 0, kVerdictBytes);
      out_[0] = ok ? 'Y' : 'N';
      if (ok) mac(true, out_ + 1);
      failAfterSend_ = !ok;
      if (!ok)
        why_ = magicOk ? "it does not hold the job's secret (another job, or ranks given different secrets)"
                       : "it did not answer the authentication exchange (not a topocoll peer of this version)";
      prepareSend(State::kSendVerdict, kVerdictBytes);
      return {IoStatus::kWouldBlock};
    }
    case State::kReceiveVerdict: {  // connector: the acceptor's verdict on our proof, and its own proof
      if (in_[0] == 'N') {
        refused_ = true;
        return failWith("it refused this side's proof of the job's secret (it belongs to another job, or the ranks "
                        "were given different secrets)");
      }
      uint8_t want[kMacBytes];
      mac(true, want);
      if (in_[0] != 'Y' || CRYPTO_memcmp(want, in_ + 1, kMacBytes) != 0)
        return failWith("it could not prove that it holds the job's secret (a process squatting on the address?)");
      state_ = State::kDone;
      return {};
    }
    default:
      return failWith("internal: a message in an unexpected state");
  }
}

IoStatus Handshake::step(Socket& s) {
  while (true) {
    switch (state_) {
      case State::kDone:
        return {};
      case State::kFailed:
        return {IoStatus::kFailed};
      case State::kSendHello:
      case State::kSendProof:
      case State::kSendVerdict: {
        IoStatus st = s.sendSome(out_, outSize_, &outDone_);
        if (st.wouldBlock()) return st;
        if (failAfterSend_) return failWith(why_);  // told the connector, whatever became of the send
        if (st.broken()) return broke(st);
        if (state_ == State::kSendHello) expect(State::kReceiveProof, kProofBytes);
        else if (state_ == State::kSendProof) expect(State::kReceiveVerdict, kVerdictBytes);
        else state_ = State::kDone;
        break;
      }
      case State::kReceiveHello:
      case State::kReceiveProof:
      case State::kReceiveVerdict: {
        IoStatus st = s.recvSome(in_, inSize_, &inDone_);
        if (st.wouldBlock()) return st;
        if (st.broken()) return broke(st);
        IoStatus r = received();
        if (r.broken()) return r;
        break;
      }
    }
  }
}

namespace {

void sealMac(const AuthKey& key, std::string_view context, const uint8_t* nonce, std::string_view head,
             std::string_view body, uint8_t* out) {
  std::string input = "topocoll-seal-v1";
  input.push_back('\0');
  input.append(context);
  input.push_back('\0');
  input.append(reinterpret_cast<const char*>(nonce), Handshake::kNonceBytes);
  input.append(head);
  input.append(body);
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.bytes.data(), static_cast<int>(key.bytes.size()),
            reinterpret_cast<const uint8_t*>(input.data()), input.size(), out, &len) ||
      len != Handshake::kMacBytes)
    fail(StatusCode::kInternal, "HMAC-SHA-256 failed (OpenSSL HMAC)");
}

}  // namespace

Seal sealMessage(const AuthKey& key, std::string_view context, std::string_view head, std::string_view body) {
  Seal s;
  randomBytes(s.nonce, sizeof(s.nonce));
  sealMac(key, context, s.nonce, head, body, s.mac);
  return s;
}

bool sealMatches(const AuthKey& key, std::string_view context, std::string_view head, std::string_view body,
                 const Seal& seal) {
  uint8_t want[Handshake::kMacBytes];
  sealMac(key, context, seal.nonce, head, body, want);
  return CRYPTO_memcmp(want, seal.mac, sizeof(want)) == 0;
}

void authenticate(Socket& s, const AuthKey& key, SocketClock::time_point deadline, const Interrupt& intr,
                  const std::string& what) {
  Handshake h(key, Handshake::Role::kConnector);
  while (true) {
    IoStatus st = h.step(s);
    if (st.done()) return;
    if (st.broken()) {
      const std::string peer = s.peerName();
      if (!h.connectionBroke())
        throw AuthError(h.refusedByPeer(), fmt::format("authentication failed while {}: the peer at {}: {}", what,
                                                       peer, h.why()));
      fail(StatusCode::kRemoteError, "connection lost while {} (authenticating the peer at {}): {}", what, peer,
           h.why().substr(std::strlen(kBroke)));
    }
    s.waitFor(POLLIN, deadline, intr, what);
  }
}

}  // namespace topocoll
