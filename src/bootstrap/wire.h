// The bootstrap's wire format and the parsers production runs on every byte it receives (the fuzz targets drive
// these same classes): every message is a fixed header {magic, rank, tag, size} and `size` bytes of body. Records
// are packed, with static_asserted layouts, so no uninitialised padding ever goes on the wire.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "topocoll/socket.h"

namespace topocoll::bootstrap {

#pragma pack(push, 1)
struct Header {
  uint64_t magic = 0;
  int32_t rank = 0;  // sender; -1 for the root
  int32_t tag = 0;
  uint64_t size = 0;
};
/// What a rank tells the root: where it listens, the job size it was started with and its timeout (the root names
/// missing ranks a little before the ranks give up).
struct Registration {
  WireAddr listen;
  int32_t nRanks = 0;
  int64_t timeoutMs = 0;
};
#pragma pack(pop)
/// A socket address as sent: family, port (network order), IPv4 or IPv6 bytes (common's, NET's handles carry it too).
using topocoll::WireAddr;
static_assert(sizeof(Header) == 24 && std::has_unique_object_representations_v<Header>);
static_assert(sizeof(WireAddr) == 20 && std::has_unique_object_representations_v<WireAddr>);
static_assert(sizeof(Registration) == 32 && std::has_unique_object_representations_v<Registration>);

// Tags below zero are the bootstrap's own; users' point-to-point tags are >= 0.
constexpr int32_t kTagRegister = -1;  // rank -> root: Registration; root -> rank: the next rank's WireAddr
constexpr int32_t kTagRing = -2;      // rank -> next rank: "I am your previous rank" (then ring allgather bytes)
constexpr int32_t kTagError = -3;     // root -> rank: the job fails; body: one StatusCode byte, then the text
constexpr int32_t kTagBcast = -5;     // Bootstrap::broadcast
constexpr int32_t kTagReady = -6;     // rank -> root: this rank's bootstrap is complete
constexpr int32_t kTagAbort = -7;     // rank -> root or rank -> rank: the job fails; body: the text
constexpr int32_t kTagRefused = -8;   // root -> a rank of another job (its magic echoed); body: the text

constexpr int kMaxRanks = 1 << 24;
constexpr size_t kMaxControlBytes = 64 << 10;  // error and abort texts

bool isIpFamily(uint16_t family);

/// One incoming message, parsed as its bytes arrive (any split). The header is checked as soon as it is
/// complete: the job's magic, the sender's rank (when `nRanks` > 0; -1 is the root), the size limit.
class MessageParser {
 public:
  struct Rules {
    uint64_t magic = 0;
    int nRanks = 0;        // senders must be ranks 0..nRanks-1; 0: the root (-1) or any rank
    size_t maxBytes = 0;   // body limit
  };
  MessageParser() = default;
  explicit MessageParser(const Rules& rules) : rules_(rules) {}
  /// Consumes bytes of this message and returns how many (the rest belong to the stream's next message). Once
  /// done() or rejected(), consumes nothing.
  size_t feed(const uint8_t* data, size_t n);
  /// Bytes still needed to complete the header or the body: read no more than this from a stream.
  size_t wanted() const;
  bool done() const { return state_ == State::kDone; }
  bool rejected() const { return state_ == State::kRejected; }
  /// The header was complete and carried another magic (a different job, or a stranger).
  bool foreignMagic() const { return foreign_; }
  bool headerComplete() const { return got_ >= sizeof(Header); }
  const Header& header() const { return header_; }
  const std::vector<uint8_t>& body() const { return body_; }
  std::vector<uint8_t> takeBody() { return std::move(body_); }
  /// Why the message was rejected.
  const std::string& why() const { return why_; }
  /// Ready for the stream's next message.
  void reset();

 private:
  enum class State { kHeader, kBody, kDone, kRejected };
  Rules rules_;
  State state_ = State::kHeader;
  Header header_;
  size_t got_ = 0;  // header bytes so far
  std::vector<uint8_t> body_;
  bool foreign_ = false;
  std::string why_;
};

/// The root's book of registrations: pure logic that the root's event loop and the fuzzer drive. `nRanks` 0
/// learns the job size from the first registration.
class RegistrationBook {
 public:
  enum class Verdict {
    kAccepted,  // a new rank of this job
    kDropped,   // not a well-formed registration: the connection is dropped, the job goes on
    kJobFails,  // a rank of this job that cannot join it (registered twice, another job size): everyone is told
  };
  explicit RegistrationBook(int nRanks = 0) : nRanks_(nRanks), rootKnowsSize_(nRanks > 0) {}
  /// A complete message whose magic the parser checked. `why` says what was wrong when not accepted.
  Verdict add(const Header& h, const std::vector<uint8_t>& body, std::string* why);
  int nRanks() const { return nRanks_; }
  int registered() const { return static_cast<int>(regs_.size()); }
  bool complete() const { return nRanks_ > 0 && registered() == nRanks_; }
  const Registration& of(int rank) const { return regs_.at(rank); }
  bool has(int rank) const { return regs_.count(rank) > 0; }
  /// The timeout the first rank came with (ms), 0 before any.
  int64_t timeoutMs() const { return timeoutMs_; }
  /// "rank(s) 2, 5 of 8 never registered with the root".
  std::string missingText() const;

 private:
  int nRanks_;
  bool rootKnowsSize_;
  int firstRank_ = -1;
  int64_t timeoutMs_ = 0;
  std::unordered_map<int, Registration> regs_;  // what came, not what the job size promises
};

}  // namespace topocoll::bootstrap
