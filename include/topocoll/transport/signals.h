// One rank's signal counters for NCCL's one-sided operations (ncclPutSignal, ncclSignal, ncclWaitSignal) between
// ranks of one host: a block of shareable memory (allocShareable) that every peer of the host maps. Counter q counts
// the signals rank q sent this rank; q raises it with release order after its data was stored, so a waiter that
// reads the count with acquire order sees the data. A 32-bit epoch word, bumped after every raise, is the futex a
// waiter sleeps on (woken only when it says it sleeps).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace topocoll::transport {

class SignalBlock {
 public:
  /// The bytes a block for `nRanks` senders needs.
  static size_t bytes(int nRanks);
  /// A view of a block at `base` (this rank's, or a peer's mapping of it); the memory starts zeroed.
  explicit SignalBlock(void* base) : base_(static_cast<char*>(base)) {}

  /// Rank `from` signals the block's owner once (release: what `from` stored before is visible to the waiter).
  void raise(int from);
  /// Signals rank `from` raised so far (acquire).
  uint64_t count(int from) const;
  /// The epoch now: read it before checking the counts, then sleep(epoch) until a raise changes it.
  uint32_t epoch() const;
  /// Sleeps until a raise after `epoch`, or `timeout` (false).
  bool sleep(uint32_t epoch, std::chrono::microseconds timeout);

 private:
  struct Header;
  Header* header() const;
  std::atomic<uint64_t>* counters() const;
  char* base_;
};

}  // namespace topocoll::transport
