// One-shot mailboxes of a shared-memory connection: the small-message path of the collectives (docs/transport.md,
// "One-shot mailboxes"). Next to the FIFO, the receiver's control block holds kShotSlots slots of LL lines (8-byte
// words: 4 bytes of data, 4 bytes of flag = the message's sequence number), written by the sender and polled by the
// receiver: a message is one trip through shared memory, no counter, no fence, no reset (the next sequence number
// tells a new message from an old one). The receiver publishes the last sequence number it consumed (its own
// memory, a line of its own) so that a sender running kShotSlots messages ahead waits for a free slot.
// Independent of the FIFO's steps: both sides must use the mailbox for the same messages, in the same order.
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
constexpr int kShotSlots = 16;
/// Words of one slot: 2 header words (bytes, signature) then 4 data bytes per word, padded to whole cache lines.
constexpr size_t kShotWords = ((2 + kShotMaxBytes / 4) + 7) / 8 * 8;

/// In the receiver's control block (fifo.h RecvMem).
struct alignas(64) ShotArea {
  std::atomic<uint64_t> slot[kShotSlots][kShotWords];
  alignas(64) std::atomic<uint64_t> consumed{0};  // written by the receiver: the last sequence number it took
  char pad[56];
};

/// What tryRecv found.
struct ShotMessage {
  uint32_t sig = 0;   // the sender's signature (what it called)
  size_t bytes = 0;   // the sender's size (copied: min(bytes, maxBytes))
};

/// A connection's mailbox, one side's view. Only one thread uses a side at a time (the collectives run one at once).
class ShotBox {
 public:
  explicit ShotBox(ConnInfo& ci) : ci_(ci) {}
  /// Whether the connection has a mailbox (shared memory and same-process P2P; not NET).
  static bool available(const ConnInfo& ci) { return ci.shot != nullptr; }
  /// Sender: writes the next message if its slot is free (false: the receiver is kShotSlots messages behind).
  /// `bytes` <= kShotMaxBytes. `ring`: wake the receiver (otherwise the caller issues a seq_cst fence, then
  /// ringFenced() on the connection's waker: one fence for the messages to several peers).
  bool trySend(uint32_t sig, const void* data, size_t bytes, bool ring = true);
  /// Receiver: takes the next message if all of it arrived; copies at most `maxBytes` into `out`.
  bool tryRecv(void* out, size_t maxBytes, ShotMessage* m);

 private:
  ConnInfo& ci_;
};

}  // namespace topocoll::transport
