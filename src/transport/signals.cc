// SignalBlock (signals.h): the counters of NCCL's one-sided signals in memory the ranks of a host share.
#include "topocoll/transport/signals.h"

#include "os.h"

namespace topocoll::transport {

struct SignalBlock::Header {
  std::atomic<uint32_t> epoch;     // bumped after every raise: the futex word
  std::atomic<uint32_t> sleepers;  // waiters asleep on it (a raise wakes them only then)
  uint8_t pad[56];
};
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
              "counters are shared between processes: lock-free 64-bit atomics");

size_t SignalBlock::bytes(int nRanks) { return sizeof(Header) + sizeof(uint64_t) * static_cast<size_t>(nRanks); }

SignalBlock::Header* SignalBlock::header() const { return reinterpret_cast<Header*>(base_); }
std::atomic<uint64_t>* SignalBlock::counters() const {
  return reinterpret_cast<std::atomic<uint64_t>*>(base_ + sizeof(Header));
}

void SignalBlock::raise(int from) {
  counters()[from].fetch_add(1, std::memory_order_release);
  header()->epoch.fetch_add(1, std::memory_order_seq_cst);
  if (header()->sleepers.load(std::memory_order_seq_cst) != 0) os::futexWakeAll(&header()->epoch);
}

uint64_t SignalBlock::count(int from) const { return counters()[from].load(std::memory_order_acquire); }

uint32_t SignalBlock::epoch() const { return header()->epoch.load(std::memory_order_seq_cst); }

bool SignalBlock::sleep(uint32_t epoch, std::chrono::microseconds timeout) {
  header()->sleepers.fetch_add(1, std::memory_order_seq_cst);
  // A raise between epoch() and here changed the word: the futex returns at once.
  const bool woken = os::futexWait(&header()->epoch, epoch, timeout);
  header()->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return woken;
}

}  // namespace topocoll::transport
