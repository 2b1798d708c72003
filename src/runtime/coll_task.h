// A collective issued on a communicator (runtime private): what was asked, and how it ended.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "topocoll/collectives/algorithms.h"
#include "topocoll/status.h"

namespace topocoll::runtime {
class CommImpl;
}

namespace topocoll::runtime::detail {

struct CollTask {
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };
  CommImpl* comm = nullptr;
  collectives::Args args;
  bool byOwner = false;  // submitted by the thread that owns the communicator's fast collective lock (collectives.cc)
  std::atomic<int> state{kPending};
  StatusCode code = StatusCode::kOk;
  std::string error;  // written before state turns kFailed
  std::mutex mu;
  std::condition_variable cv;

  bool finished() const { return state.load(std::memory_order_acquire) != kPending; }
  void finish(StatusCode c, std::string why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      code = c;
      error = std::move(why);
      state.store(c == StatusCode::kOk ? kDone : kFailed, std::memory_order_release);
    }
    cv.notify_all();
  }
  /// Blocks until finished; throws its error.
  void wait() {
    if (!finished()) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return finished(); });
    }
    if (state.load(std::memory_order_acquire) == kFailed) throw Error(code, error);
  }
};

/// Adds a collective to this thread's open group (p2p.cc owns the group state).
void addToGroup(CommImpl* comm, std::shared_ptr<CollTask> t);
/// A communicator being destroyed: this thread's open group forgets its sends, receives and collectives (their
/// requests fail, kAborted) and groupEnd() reports them (kInvalidUsage; when the rest of the group fails too, that
/// failure's code, its message naming the dropped ones as well). Other threads' groups cannot be reached:
/// destroying a communicator that another thread's open group uses is undefined, as in NCCL.
void dropFromGroup(CommImpl* comm);

}  // namespace topocoll::runtime::detail
