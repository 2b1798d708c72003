#include "topocoll/transport/oneshot.h"

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
}  // namespace

bool ShotBox::trySend(uint32_t sig, const void* data, size_t bytes, bool ring, bool prefetchNext) {
  uint64_t seq = seq_ + 1;
  if (seq > static_cast<uint64_t>(kShotSlots) && free_ < seq - kShotSlots) {
    // The slot's previous message (seq - kShotSlots) must have been taken: read the receiver's line only then.
    free_ = area_->consumed.load(std::memory_order_acquire);
    if (free_ < seq - kShotSlots) return false;
  }
  const uint32_t flag = static_cast<uint32_t>(seq);
  std::atomic<uint64_t>* w = area_->slot[seq % kShotSlots];
  const auto* src = static_cast<const unsigned char*>(data);
  size_t words = (bytes + 3) / 4;
  for (size_t i = 0; i < words; ++i) {
    uint32_t v = 0;
    std::memcpy(&v, src + i * 4, i * 4 + 4 <= bytes ? 4 : bytes - i * 4);
    w[2 + i].store(line(v, flag), std::memory_order_relaxed);
  }
  w[1].store(line(sig, flag), std::memory_order_relaxed);
  w[0].store(line(static_cast<uint32_t>(bytes), flag), std::memory_order_release);
  seq_ = seq;
  // A stream: ask for the next slot's lines for writing now (the receiver read it kShotSlots messages ago), so
  // that its ownership arrives while the caller goes on, instead of the next message's stores waiting for it in the
  // store buffer, where every later store of this thread (its stack too) queues behind them. With the receiver's
  // prefetch (tryRecv), the 8-byte Broadcast at 2 ranks went from 0.115 to 0.068 us per call (docs/performance.md,
  // session 26). Not in lockstep exchanges: there the stores drain while the caller waits for its peer anyway, and the
  // early request only adds traffic while the peer polls (AllReduce 3% slower).
  if (prefetchNext) {
    const auto* next = reinterpret_cast<const char*>(area_->slot[(seq + 1) % kShotSlots]);
    for (size_t at = 0; at < (2 + words) * 8; at += 64) prefetchForWrite(next + at);  // as many lines as this one
  }
  if (ring && wake_) wake_->ring();
  return true;
}

bool ShotBox::peek(ShotMessage* m) const {
  uint64_t seq = seq_ + 1;
  const uint32_t flag = static_cast<uint32_t>(seq);
  std::atomic<uint64_t>* w = area_->slot[seq % kShotSlots];
  uint64_t h = w[0].load(std::memory_order_acquire);
  if (static_cast<uint32_t>(h >> 32) != flag) return false;
  uint64_t s = w[1].load(std::memory_order_acquire);
  if (static_cast<uint32_t>(s >> 32) != flag) return false;
  m->sig = static_cast<uint32_t>(s);
  m->bytes = static_cast<uint32_t>(h);
  return true;
}

bool ShotBox::tryRecv(void* out, size_t maxBytes, ShotMessage* m, bool publish, bool prefetchNext) {
  ShotMessage head;
  if (!peek(&head)) return false;  // the header words (size, signature) have not arrived
  uint64_t seq = seq_ + 1;
  const uint32_t flag = static_cast<uint32_t>(seq);
  std::atomic<uint64_t>* w = area_->slot[seq % kShotSlots];
  size_t bytes = head.bytes;
  size_t take = bytes < maxBytes ? bytes : maxBytes;
  size_t words = (bytes + 3) / 4;
  if (words > kShotWords - 2) words = kShotWords - 2;  // a broken header never reads past the slot
  auto* dst = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < words; ++i) {  // every word carries its own flag: all of it must have arrived
    uint64_t v = w[2 + i].load(std::memory_order_acquire);
    if (static_cast<uint32_t>(v >> 32) != flag) return false;
    if (i * 4 < take) {
      uint32_t d = static_cast<uint32_t>(v);
      std::memcpy(dst + i * 4, &d, i * 4 + 4 <= take ? 4 : take - i * 4);
    }
  }
  m->sig = head.sig;
  m->bytes = bytes;
  seq_ = seq;
  if (publish) area_->consumed.store(seq, std::memory_order_release);
  // A stream (the sender runs ahead): fetch the next slot's lines now, so that its transfer overlaps the
  // caller's return instead of stalling the next poll. Not in lockstep exchanges, where it would take the line away
  // from the sender about to write it.
  if (prefetchNext) {
    const auto* next = reinterpret_cast<const char*>(area_->slot[(seq + 1) % kShotSlots]);
    for (size_t at = 0; at < (2 + words) * 8; at += 64) __builtin_prefetch(next + at, 0);  // as many as this one
  }
  return true;
}

}  // namespace topocoll::transport
