// The one-shot exchange of the small collectives (docs/collectives.md, OneShot): every message a rank sends in a call
// goes at once into the receiving peer's mailbox of the point-to-point connection (transport/oneshot.h), and the rank
// polls the mailboxes it expects until every message moved. The collective algorithm (collectives/oneshot.cc) says
// what goes where and finishes locally; this primitive moves the messages, wakes the peers, waits, and fails on a
// mismatched call, a dead peer, the timeout or abort.
//
//   progress::Mailboxes mb(conns, spinUs, yieldUs);
//   if (mb.ready()) {                                  // collective the first time: every rank agrees
//     progress::Mailboxes::Exchange x{...};            // signature, size, who to send to and receive from
//     mb.exchange(x);                                  // throws the first failure, naming the peer
//   }
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "topocoll/status.h"


namespace topocoll::transport {
struct Connector;
}  // namespace topocoll::transport

namespace topocoll::progress {

class Connections;

class Mailboxes {
 public:
  /// The most ranks an exchange holds (bits of its masks; the Direct algorithms' limit).
  static constexpr int kMaxRanks = 8;
  /// The largest message (transport::kShotMaxBytes).
  static constexpr size_t kMaxBytes = 256;
  /// Bits 16-31 of a signature number the calls (every rank counts the same calls): a message a mismatched call
  /// left unread carries an older number, so a later call skips it instead of taking its data.
  static constexpr uint32_t kCallShift = 16;

  /// `spinUs` / `yieldUs`: how waits spin and yield before sleeping (the engine's).
  /// `onStall`: asked while an exchange waits, as the engine's (Engine::Options::onStall).
  using OnStall =
      std::function<bool(std::chrono::steady_clock::duration stalled, int peer, StatusCode* code, std::string* why)>;
  Mailboxes(Connections& conns, int spinUs, int yieldUs, OnStall onStall = {})
      : conns_(conns), spinUs_(spinUs), yieldUs_(yieldUs), onStall_(std::move(onStall)) {}

  /// Whether every rank's connections have mailboxes. The first call connects every peer and agrees over the
  /// bootstrap (collective: every rank calls it at the same call); false from then on when some rank lacks them
  /// (NET between ranks of one host, shared memory the peers cannot map).
  bool ready() { return ready_ || setUp(); }
  /// The ranks agreed that some connection has no mailbox: the small collectives run on the engine.
  bool off() const { return off_.load(std::memory_order_relaxed); }
  /// The next call's number (bits 0-15; a signature carries it from kCallShift).
  uint32_t nextCall() { return ++calls_ & 0xffff; }

  struct Exchange {
    uint32_t sig = 0;                // what this rank called, with the call's number from kCallShift
    size_t bytes = 0;                // of each message (at most transport::kShotMaxBytes)
    uint32_t toSend = 0, toRecv = 0;  // bit q: a message to / from rank q
    // Read only where the masks say (left uninitialised: the smallest collectives take ~130 ns in all).
    const void* send[kMaxRanks];  // [q] the message to rank q
    void* recv[kMaxRanks];        // [q] where rank q's message goes
    /// Words a signature for the errors ("AllReduce with 8 bytes per peer of float32, sum").
    std::string (*describe)(uint32_t sig, size_t bytes) = nullptr;
  };
  /// Moves every message of `x` (after ready()). Throws kInvalidUsage when a peer's message has another signature
  /// or size (after every message moved, so both sides fail alike), kRemoteError for a broken connection or a dead
  /// peer, kTimeout (the mailboxes are out of step from then on: marked broken), kAborted.
  void exchange(Exchange& x);

 private:
  bool setUp();
  bool poll(Exchange& x, std::string* mismatch);

  Connections& conns_;
  int spinUs_, yieldUs_;
  OnStall onStall_;
  std::chrono::steady_clock::time_point polled_{};
  bool ready_ = false;
  std::atomic<bool> off_{false};
  uint32_t calls_ = 0;
  uint32_t call_ = 0;    // the exchange's call number
  bool stream_ = false;  // the exchange's rank only sends or only receives
  std::vector<transport::Connector*> send_, recv_;  // [peer]: the connectors whose mailboxes it uses
};

}  // namespace topocoll::progress
