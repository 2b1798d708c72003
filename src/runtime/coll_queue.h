// The order of a communicator's collectives (runtime private): one runs at a time, in issue order. Blocking calls run
// in the caller's thread under the collective lock (Hold); asynchronous ones and groups' run on the collective thread,
// after those before them. The lock's owner (the thread that issues the blocking collectives) enters with plain
// stores (coll_queue.cc, "The collective lock").
//
//   CollQueue q(rank, cfg.membarrier != 0, [&](CollTask& t) { execute(t); }, [&] { abort(); });
//   { CollQueue::Hold hold(q); execute(task); }   // a blocking call, after what the thread has queued
//   q.submit(task);                              // an asynchronous one
//   q.stop();                                    // what is queued fails (kAborted); the thread ends
#pragma once

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "coll_task.h"

namespace topocoll::runtime::detail {

class CollQueue {
 public:
  /// `run`: executes a task (its errors go into the task); `abort`: makes what runs fail at once (stop() with tasks
  /// left). `fastPath`: the owner's lock-free entry may be used (TOPOCOLL_MEMBARRIER, and once membarrier is
  /// registered for this process).
  CollQueue(int rank, bool fastPath, std::function<void(CollTask&)> run, std::function<void()> abort)
      : rank_(rank), fastPath_(fastPath), run_(std::move(run)), abort_(std::move(abort)) {}
  ~CollQueue() { stop(); }
  CollQueue(const CollQueue&) = delete;
  CollQueue& operator=(const CollQueue&) = delete;

  /// The collective lock for a scope, after what the collective thread has queued (`foreign`: a thread that is not
  /// the owner, the collective thread itself).
  class Hold {
   public:
    /// The owner's fast entry is inline (plain stores and two loads: the smallest collectives take ~130 ns in all);
    /// everybody else, and the owner when others want in, take enter().
    explicit Hold(CollQueue& q, bool foreign = false) : q_(q), mode_(Mode::kLocked) {
      if (!foreign && q.owner_.load(std::memory_order_relaxed) == static_cast<uintptr_t>(pthread_self()) && fast())
        return;
      enter(foreign);
    }
    ~Hold() {
      if (mode_ == Mode::kFast) q_.fast_.store(0, std::memory_order_release);
      else leave();
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    enum class Mode { kFast, kLocked, kForeign };
    // The owner's entry with plain stores: inside when no other thread wants in and nothing is queued.
    bool fast() {
      q_.fast_.store(1, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      if (q_.foreign_.load(std::memory_order_acquire) == 0 && q_.queued_.load(std::memory_order_acquire) == 0) {
        mode_ = Mode::kFast;
        return true;
      }
      q_.fast_.store(0, std::memory_order_release);
      return false;
    }
    void enter(bool foreign);
    void leave();
    CollQueue& q_;
    Mode mode_;
  };

  /// Runs `t` on the collective thread after those before it (kAborted at once once stop() began).
  void submit(const std::shared_ptr<CollTask>& t);
  /// Fails what is queued or running (kAborted), ends the thread. Idempotent.
  void stop();

 private:
  bool owner();
  void loop();

  const int rank_;
  const bool fastPath_;
  std::function<void(CollTask&)> run_;
  std::function<void()> abort_;
  std::mutex mu_;  // held while a collective runs (or its fast path, below)
  std::atomic<uintptr_t> owner_{0};     // pthread_self() of the owner, 0: none yet (or no fast path)
  std::atomic<uint32_t> fast_{0};       // 1 while the owner is inside on the fast path (written by the owner only)
  std::atomic<uint32_t> foreign_{0};    // threads other than the owner that want or hold mu_
  std::mutex queueMu_;
  std::condition_variable queueCv_;
  std::deque<std::shared_ptr<CollTask>> queue_;
  std::atomic<int> queued_{0};  // submitted and not finished (changed under queueMu_; read alone by the fast entry)
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace topocoll::runtime::detail
