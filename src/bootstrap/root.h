// The bootstrap root: the listener every rank registers with (NCCL's bootstrapRoot, our design). One thread runs
// an event loop over every connection at once, so an idle or garbage connection costs the job nothing.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "stream.h"
#include "topocoll/auth.h"
#include "wire.h"

namespace topocoll::bootstrap {

class Root {
 public:
  /// Listens at `bindAddr`; `nRanks` 0 learns the job size from the first registration. Throws when the address
  /// cannot be bound (naming another job when it is in use).
  /// Every connection must prove that it holds `key` (auth.h) before its registration is read.
  Root(const SocketAddress& bindAddr, uint64_t magic, int nRanks, const AuthKey& key);
  ~Root();
  Root(const Root&) = delete;
  Root& operator=(const Root&) = delete;
  SocketAddress address() const { return addr_; }
  uint64_t magic() const { return magic_; }
  /// The process hosting the root gives up: unless the job already failed for another reason, every rank is told
  /// `reason`. Returns once every rank of the job has been told (those registering meanwhile included), when no
  /// connection has come for a few seconds, or at `until`.
  void abort(const std::string& reason, Clock::time_point until);
  /// Its thread has ended (the job is bootstrapped, or failed and every rank was told): destroying it now costs a
  /// join of an ended thread.
  bool ended() const { return ended_.load(std::memory_order_acquire); }

 private:
  struct Impl;
  void run();
  std::mutex ctlMu_;
  std::string abortRequest_;          // from abort(), for the root's thread
  std::atomic<bool> everyoneTold_{false};
  std::atomic<Clock::rep> lastArrival_{0};  // when the last connection came (Clock ticks)
  Socket listener_;
  SocketAddress addr_;
  uint64_t magic_ = 0;
  AuthKey key_;
  int nRanks_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> ended_{false};
  std::thread thread_;
};

}  // namespace topocoll::bootstrap
