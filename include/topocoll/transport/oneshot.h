// One-shot mailboxes of a shared-memory connection: the small-message path of the collectives (docs/transport.md,
// "One-shot mailboxes"). Next to the FIFO, the receiver's control block holds kShotSlots slots, written by the sender
// and polled by the receiver: two header words that carry the message's sequence number as their flag (size and
// signature), then the payload's bytes; the payload and the signature are stored first, the size word last with
// release. A message is one trip through shared memory, no counter, no fence, no reset (the next sequence number
// tells a new message from an old one). (Not NCCL's LL lines, where every 8-byte word carries a flag: that takes
// twice the lines for the same payload, and host memory orders the stores, so the header's release covers it.) The
// receiver publishes the last sequence number it consumed (its own memory, a line of its own) so that a sender
// running kShotSlots messages ahead waits for a free slot. Independent of the FIFO's steps: both sides must use the
// mailbox for the same messages, in the same order.
//
//   transport::ShotBox box(sendConnector.conn);           // sender
//   while (!box.trySend(sig, data, bytes)) ...;            // false only while the peer is kShotSlots behind
//   transport::ShotBox in(recvConnector.conn);             // receiver
//   transport::ShotMessage m;
//   while (!in.tryRecv(buf, sizeof buf, &m)) ...;          // m.sig and m.bytes tell what the sender sent
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "topocoll/transport/transport.h"

namespace topocoll::transport {

/// Largest payload of one mailbox message.
constexpr size_t kShotMaxBytes = 256;
/// Messages a sender may run ahead of its receiver.
constexpr int kShotSlots = 128;

/// One message: the header words (flag = the sequence number's low 32 bits in the high half of each) and the
/// payload, in whole cache lines (5 for 256 bytes).
struct alignas(64) ShotSlot {
  std::atomic<uint64_t> head{0};  // flag << 32 | bytes: stored last, with release
  std::atomic<uint64_t> sig{0};   // flag << 32 | the sender's signature
  // What the sender's own next receive from this side expects (signature << 32 | bytes; 0: not said), as a
  // ShotArea::posted of the other direction would say it: a point-to-point exchange's reply carries it, so that
  // the side that reads it needs no look at the sender's post line (Engine::runShotGroup).
  std::atomic<uint64_t> post{0};
  unsigned char data[kShotMaxBytes];
};

/// In the receiver's control block (fifo.h RecvMem).
struct alignas(64) ShotArea {
  ShotSlot slot[kShotSlots];
  alignas(64) std::atomic<uint64_t> consumed{0};  // written by the receiver: the last sequence number it took
  char pad[56];
  // Written by the receiver when it starts waiting: what it expects next (signature << 32 | bytes). A sender whose
  // message matches it needs no verdict (point-to-point lanes; the collectives do not use it).
  alignas(64) std::atomic<uint64_t> posted{0};
  char pad2[56];
  // The receiver's refusals (size or type differ), one per slot: message `seq` was refused if refusal[seq %
  // kShotSlots].seq == seq; `expected` is what the receiver expected instead (its signature << 32 | its bytes). One
  // entry per slot, not one word, so that a sender with several messages in flight (a group's sends to one peer)
  // reads the verdict of each: an entry is written again only for the message kShotSlots later, which the sender
  // writes only once the verdict here was read.
  struct Refusal {
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> expected{0};
  };
  Refusal refusal[kShotSlots];
};


/// What tryRecv found.
struct ShotMessage {
  uint32_t sig = 0;   // the sender's signature (what it called)
  size_t bytes = 0;   // the sender's size (copied: min(bytes, maxBytes))
  uint64_t post = 0;  // tryRecv: what the sender's next receive from this side expects (ShotSlot::post; 0: not said)
};

/// A connection's mailbox, one side's view. Only one thread uses a side at a time (the collectives run one at once).
class ShotBox {
 public:
  /// The collectives' mailbox of the connection.
  explicit ShotBox(ConnInfo& ci) : area_(ci.shot), seq_(ci.shotSeq), free_(ci.shotFree), wake_(ci.wake) {}
  /// Another lane of the connection (ConnInfo::p2pShot); `wake`: the peer's doorbell (ConnInfo::wake).
  ShotBox(ShotLane& lane, Waker* wake) : area_(lane.area), seq_(lane.seq), free_(lane.free), wake_(wake) {}
  /// Whether the connection has a mailbox (shared memory and same-process P2P; not NET).
  static bool available(const ConnInfo& ci) { return ci.shot != nullptr; }
  /// Sender: writes the next message if its slot is free (false: the receiver is kShotSlots messages behind).
  /// `bytes` <= kShotMaxBytes. `ring`: wake the receiver (otherwise the caller issues a seq_cst fence, then
  /// ringFenced() on the connection's waker: one fence for the messages to several peers). `prefetchNext`: this side
  /// streams messages (it only sends), ask for the next slot's line early. `post`: what this side's next receive
  /// from the peer expects (ShotSlot::post; 0: nothing said).
  bool trySend(uint32_t sig, const void* data, size_t bytes, bool ring = true, bool prefetchNext = false,
               uint64_t post = 0);
  /// Receiver: takes the next message if all of it arrived; copies at most `maxBytes` into `out`. `prefetchNext`:
  /// the sender streams ahead of this side (this side only receives), fetch the next slot's line early.
  bool tryRecv(void* out, size_t maxBytes, ShotMessage* m, bool publish = true, bool prefetchNext = false);
  /// Receiver: the next message's header if it arrived (nothing taken): lets a receiver look before it takes.
  bool peek(ShotMessage* m) const;
  /// Receiver: refuses the message just taken (its size or type differ from `expected`, this side's signature << 32
  /// | bytes), before it publishes `consumed` (tryRecv(..., publish = false), then consume()).
  void refuse(uint64_t expected) {
    ShotArea::Refusal& r = area_->refusal[seq_ % kShotSlots];
    r.expected.store(expected, std::memory_order_relaxed);
    r.seq.store(seq_, std::memory_order_release);
  }
  /// Receiver: publishes the message just taken as consumed (tryRecv with publish = false).
  void consume() { area_->consumed.store(seq_, std::memory_order_release); }
  /// Receiver: whether it took messages it has not published yet (its own line: a local load).
  bool unpublished() const { return area_->consumed.load(std::memory_order_relaxed) != seq_; }
  /// Receiver: what it waits for (signature << 32 | bytes).
  void post(uint64_t expected) { area_->posted.store(expected, std::memory_order_release); }
  /// Sender: whether the receiver waits for exactly this message.
  bool posted(uint64_t expected) const { return area_->posted.load(std::memory_order_acquire) == expected; }
  /// Sender: the verdict on message `seq`: 0 not taken yet, 1 taken, -1 refused (`*expected`: what the receiver
  /// expected).
  int verdict(uint64_t seq, uint64_t* expected) const {
    if (area_->consumed.load(std::memory_order_acquire) < seq) return 0;
    const ShotArea::Refusal& r = area_->refusal[seq % kShotSlots];
    if (r.seq.load(std::memory_order_acquire) != seq) return 1;
    *expected = r.expected.load(std::memory_order_relaxed);
    return -1;
  }
  /// Receiver: whether the sender had filled every slot when this side took its last message (it may wait for one).
  bool full() const {
    uint64_t last = seq_ + kShotSlots - 1;
    uint64_t h = area_->slot[last % kShotSlots].head.load(std::memory_order_relaxed);
    return static_cast<uint32_t>(h >> 32) == static_cast<uint32_t>(last);
  }
  /// The sequence number of this side's last message.
  uint64_t seq() const { return seq_; }

 private:
  ShotArea* area_;
  uint64_t& seq_;
  uint64_t& free_;
  Waker* wake_;
};

}  // namespace topocoll::transport
