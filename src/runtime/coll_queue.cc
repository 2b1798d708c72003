#include "coll_queue.h"

#include <pthread.h>

#include <chrono>

#include "topocoll/log.h"
#include "topocoll/transport/doorbell.h"

namespace topocoll::runtime::detail {

// The collective lock. One collective runs at a time: mu_, held by the thread that runs it. A mutex costs two locked
// instructions per call, and a locked instruction waits until this core's stores have left it: after a one-shot
// publish, until the peers' mailbox lines (which they poll) came over, as long as the fence it replaced
// (docs/transport.md, "Threads and waiting"). So the thread that issues the blocking collectives (the first to call
// one: the owner) enters with plain stores, on the asymmetric fence of doorbell.cc:
//   owner:            fast_ = 1;    [compiler barrier]; read foreign_ and queued_ -> both 0: inside
//   any other thread: foreign_++;   membarrier();       mu_.lock(); wait until fast_ == 0: inside
// (the owner's fast exit: fast_ = 0, release). The doorbell's three cases apply: an owner that saw no foreign thread
// and a foreign thread that saw the owner outside are never both inside. The collective thread runs a task submitted
// by the owner with mu_ alone: the task counts in queued_ from its submission (by the owner, so before any later fast
// entry in its program order) until it finished, and the owner's fast entry checks queued_, then waits for the queue
// and takes mu_ like everybody else. Tasks of other threads take the foreign path. Where membarrier is unavailable
// (or TOPOCOLL_MEMBARRIER=0) there is no owner and everybody takes mu_. Should membarrier fail after registration (a
// seccomp filter installed later), the foreign thread turns the fast path off and waits 1 ms before reading fast_: an
// owner inside has made its store visible by then (x86: stores leave the store buffer in nanoseconds; not a C++
// guarantee).
bool CollQueue::owner() {
  const auto me = static_cast<uintptr_t>(pthread_self());
  uintptr_t o = owner_.load(std::memory_order_relaxed);
  if (o == me) return true;
  if (o != 0 || !fastPath_ || !transport::Doorbell::membarrierRegistered()) return false;
  return owner_.compare_exchange_strong(o, me);
}

// The owner's entry when others want in, or the first entry of a thread that may become the owner; everybody else's.
void CollQueue::Hold::enter(bool foreign) {
  CollQueue& q = q_;
  const bool owner = !foreign && q.owner();
  if (owner && fast()) return;  // this thread just became the owner (the inline entry saw others: once more)
  if (!foreign && q.queued_.load(std::memory_order_acquire) != 0) {  // the collective thread's queue first
    std::unique_lock<std::mutex> lock(q.queueMu_);
    q.queueCv_.wait(lock, [&] { return q.queued_ == 0; });
  }
  if (owner) {
    q.mu_.lock();
    return;
  }
  mode_ = Mode::kForeign;
  q.foreign_.fetch_add(1, std::memory_order_seq_cst);
  const uintptr_t o = q.owner_.load(std::memory_order_seq_cst);
  if (o != 0 && o != ~uintptr_t{0} && !transport::membarrierAll()) {
    q.owner_.store(~uintptr_t{0}, std::memory_order_relaxed);  // matches no thread: no fast path from now on
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  q.mu_.lock();
  while (q.fast_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void CollQueue::Hold::leave() {
  q_.mu_.unlock();
  if (mode_ == Mode::kForeign) q_.foreign_.fetch_sub(1, std::memory_order_release);
}

void CollQueue::submit(const std::shared_ptr<CollTask>& t) {
  std::lock_guard<std::mutex> lock(queueMu_);
  if (stop_) {
    t->finish(StatusCode::kAborted, fmt::format("rank {}: the communicator is being destroyed", rank_));
    return;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  t->byOwner = owner_.load(std::memory_order_relaxed) == static_cast<uintptr_t>(pthread_self());
  queue_.push_back(t);
  ++queued_;
  queueCv_.notify_all();
}

void CollQueue::loop() {
  log::setThreadRank(rank_);
  std::unique_lock<std::mutex> lock(queueMu_);
  for (;;) {
    queueCv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto t = queue_.front();
    queue_.pop_front();
    lock.unlock();
    if (stop_) {
      t->finish(StatusCode::kAborted, fmt::format("rank {}: the communicator was destroyed", rank_));
    } else if (t->byOwner) {  // the owner is not on the fast path: its task counts in queued_
      std::lock_guard<std::mutex> run(mu_);
      run_(*t);
    } else {
      Hold run(*this, true);
      run_(*t);
    }
    lock.lock();
    --queued_;
    queueCv_.notify_all();
  }
}

void CollQueue::stop() {
  bool busy;
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    stop_ = true;
    busy = queued_ > 0;
    queueCv_.notify_all();
  }
  if (busy) abort_();  // what is still queued or running fails (kAborted)
  if (thread_.joinable()) thread_.join();
}

}  // namespace topocoll::runtime::detail
