#include "topocoll/transport/oneshot.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "topocoll/transport/doorbell.h"

namespace topocoll::transport {

namespace {
// Asks for a line in exclusive state ahead of the stores to it. GCC emits PREFETCHW for __builtin_prefetch(p, 1) only
// with -mprfchw; the instruction decodes on every x86-64 (a no-op on CPUs without it), so it is written out here.
inline void prefetchForWrite(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1);
#endif
}
inline uint64_t line(uint32_t data, uint32_t flag) { return static_cast<uint64_t>(flag) << 32 | data; }
constexpr size_t kHeaderBytes = offsetof(ShotSlot, data);
// memcpy for the mailbox's sizes: inline 8-byte moves below a line (most one-shot messages are a few words; a call
// into the library's memcpy cost the 8-byte Broadcast a third of its time), the library's above.
inline void copySmall(void* dst, const void* src, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (n >= 64) {
    std::memcpy(d, s, n);
    return;
  }
  size_t i = 0;
  for (; i + 8 <= n; i += 8) std::memcpy(d + i, s + i, 8);
  if (n & 4) std::memcpy(d + i, s + i, 4), i += 4;
  if (n & 2) std::memcpy(d + i, s + i, 2), i += 2;
  if (n & 1) d[i] = s[i];
}
}  // namespace

bool ShotBox::trySend(uint32_t sig, const void* data, size_t bytes, bool ring, bool prefetchNext, uint64_t post) {
  uint64_t seq = seq_ + 1;
  if (seq > static_cast<uint64_t>(kShotSlots) && free_ < seq - kShotSlots) {
    // The slot's previous message (seq - kShotSlots) must have been taken: read the receiver's line only then.
    free_ = area_->consumed.load(std::memory_order_acquire);
    if (free_ < seq - kShotSlots) return false;
  }
  const uint32_t flag = static_cast<uint32_t>(seq);
  ShotSlot& s = area_->slot[seq % kShotSlots];
  // The receiver reads the payload only after it saw this message's flag in `head` (acquire), and this side writes
  // the slot again only after the receiver published it took it: the payload needs no flag of its own.
  copySmall(s.data, data, bytes);
  s.post.store(post, std::memory_order_relaxed);  // ordered by `head` as the payload is
  s.sig.store(line(sig, flag), std::memory_order_relaxed);
  s.head.store(line(static_cast<uint32_t>(bytes), flag), std::memory_order_release);
  seq_ = seq;
  // A stream: ask for the next slot's lines for writing now (the receiver read it kShotSlots messages ago), so
  // that its ownership arrives while the caller goes on, instead of the next message's stores waiting for it in the
  // store buffer, where every later store of this thread (its stack too) queues behind them. With the receiver's
  // prefetch (tryRecv), the 8-byte Broadcast at 2 ranks takes 0.068 us per call instead of 0.115 (docs/transport.md,
  // "One-shot mailboxes"). Not in lockstep exchanges: there the stores drain while the caller waits for its peer
  // anyway, and the early request only adds traffic while the peer polls (AllReduce 3% slower).
  if (prefetchNext) {
    const auto* next = reinterpret_cast<const char*>(&area_->slot[(seq + 1) % kShotSlots]);
    for (size_t at = 0; at < kHeaderBytes + bytes; at += 64) prefetchForWrite(next + at);  // as many as this one
  }
  if (ring && wake_) wake_->ring();
  return true;
}

bool ShotBox::peek(ShotMessage* m) const {
  uint64_t seq = seq_ + 1;
  const uint32_t flag = static_cast<uint32_t>(seq);
  const ShotSlot& s = area_->slot[seq % kShotSlots];
  uint64_t h = s.head.load(std::memory_order_acquire);
  if (static_cast<uint32_t>(h >> 32) != flag) return false;
  uint64_t g = s.sig.load(std::memory_order_relaxed);  // stored before `head`: visible once `head` is
  if (static_cast<uint32_t>(g >> 32) != flag) return false;
  m->sig = static_cast<uint32_t>(g);
  m->bytes = static_cast<uint32_t>(h);
  return true;
}

bool ShotBox::tryRecv(void* out, size_t maxBytes, ShotMessage* m, bool publish, bool prefetchNext) {
  ShotMessage head;
  if (!peek(&head)) return false;  // the header words (size, signature) have not arrived
  uint64_t seq = seq_ + 1;
  const ShotSlot& s = area_->slot[seq % kShotSlots];
  size_t bytes = head.bytes;
  // A broken header never reads past the slot.
  size_t take = std::min(std::min(bytes, maxBytes), kShotMaxBytes);
  copySmall(out, s.data, take);
  m->sig = head.sig;
  m->bytes = bytes;
  m->post = s.post.load(std::memory_order_relaxed);  // stored before `head`, as the payload
  seq_ = seq;
  if (publish) area_->consumed.store(seq, std::memory_order_release);
  // A stream (the sender runs ahead): fetch the next slot's lines now, so that their transfer overlaps the caller's
  // return instead of stalling the next poll. Not in lockstep exchanges, where it would take the lines away from the
  // sender about to write them.
  if (prefetchNext) {
    const auto* next = reinterpret_cast<const char*>(&area_->slot[(seq + 1) % kShotSlots]);
    for (size_t at = 0; at < kHeaderBytes + std::min(bytes, kShotMaxBytes); at += 64) __builtin_prefetch(next + at, 0);
  }
  return true;
}

}  // namespace topocoll::transport
