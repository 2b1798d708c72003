// Waiting without busy-polling, across processes. Every process has one doorbell: a futex word in a shared page
// (a memfd the proxies hand to the peers of the host). Whoever publishes a counter another process waits on rings
// the doorbell of that process; it costs a load unless somebody sleeps (plus a seq_cst fence where the asymmetric
// fence is off: doorbell.cc explains the pairing with the sleeper's membarrier). Threads that wait first spin a
// little (at most as many spinning threads as the CPUs the process may run on), then yield, then sleep on the
// doorbell, so ranks sharing a host's cores do not starve each other.
//
//   auto bell = transport::Doorbell::process();
//   bell->sleep([&] { return tail->load() > step; }, std::chrono::milliseconds(50));   // on the waiting side
//   tail->store(step + 1, std::memory_order_release); peerBell->ring();               // on the publishing side
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>

#include "topocoll/mapped_region.h"
#include "topocoll/transport/transport.h"
#include "topocoll/unique_fd.h"

namespace topocoll::transport {

/// A non-owning reference to a `bool()` callable, for the conditions waits re-check: unlike std::function it never
/// allocates (a wait builds one per idle poll). The callable must outlive the call it is passed to.
class ReadyRef {
 public:
  template <typename F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, ReadyRef>)
  ReadyRef(const F& f)  // NOLINT: implicit, like std::function
      : obj_(&f), call_([](const void* o) { return static_cast<bool>((*static_cast<const F*>(o))()); }) {}
  bool operator()() const { return call_(obj_); }

 private:
  const void* obj_;
  bool (*call_)(const void*);
};

/// The shared page.
struct DoorbellPage {
  std::atomic<uint32_t> seq{0};  // the futex word, bumped by every ring that finds sleepers
  // Threads between "I may sleep" and "I woke up": futex sleepers in the low 16 bits, pollers (threads blocked in
  // poll() on the doorbell's eventfd with sockets of their own) from bit 16. One word, so that a ring's single load
  // sees both kinds (the fence pairing below holds for each).
  std::atomic<uint32_t> waiters{0};
  static constexpr uint32_t kPoller = 1u << 16;
  // Set by the owner before the page is exported: 1 when its sleepers issue
  // membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) between `waiters++` and their last check. Cleared for good when that
  // call fails, or when the owner's sleeps become frequent (Doorbell::kFrequentSleeps): then every ring fences.
  std::atomic<uint32_t> membarrier{0};
};

class Doorbell : public Waker {
 public:
  /// This process's doorbell, created on first use and shared by every communicator of the process; it is freed
  /// (fd closed, page unmapped) with the last communicator.
  /// `membarrier`: whether its sleepers issue the asymmetric fence (TOPOCOLL_MEMBARRIER; the first call decides).
  static std::shared_ptr<Doorbell> process(bool membarrier = true);
  /// A new doorbell that is not the process's (tests): the same rules, its own page; `frequentSleeps` (2 or more)
  /// in place of kFrequentSleeps (0: never switch to fences).
  static std::shared_ptr<Doorbell> create(bool membarrier, int frequentSleeps = kFrequentSleeps);
  /// Another process's doorbell from the memfd its proxy sent (the fd is closed here).
  static std::shared_ptr<Doorbell> fromFd(int fd);
  /// Whether this process is registered for MEMBARRIER_CMD_GLOBAL_EXPEDITED (registers on the first call of each
  /// process: a forked child registers again): only then may its rings skip the fence.
  static bool membarrierRegistered();
  ~Doorbell() override;
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  /// Wakes every thread sleeping on this doorbell. Call after publishing (release store) what they wait for.
  void ring() override;
  void ringFenced() override;
  /// Sleeps until a ring or `timeout`, unless `ready()` is true after this thread announced itself (so a ring
  /// between the caller's last check and the sleep is never lost). Returns false when it slept the whole timeout.
  /// Only threads of the process that created the doorbell sleep on it.
  bool sleep(ReadyRef ready, std::chrono::microseconds timeout);
  /// For a thread that also waits on descriptors of its own (sockets): between beginPoll() and endPoll() every ring
  /// also makes eventFd() readable. Announce first, then check what you wait for (a ring before the announcement is
  /// not heard), then poll() with eventFd() among the descriptors. endPoll() drains it. Only threads of the process
  /// that created the doorbell, one at a time (the poller drains the eventfd: a second one could miss its ring).
  /// beginPoll() returns the poll slice to use, `sliceMs` or less (1 ms when the fence just failed, as sleep()
  /// does), or -1, having done nothing, when the doorbell has no eventfd or another thread polls it (sleep instead).
  int beginPoll(int sliceMs);
  void endPoll();
  int eventFd() const { return event_.get(); }
  /// The memfd of this process's doorbell (for the proxy to export); -1 for an imported one.
  int fd() const { return fd_.get(); }
  /// Gives an imported doorbell the owner's eventfd (the proxy sends it after the memfd; closed here). Without one,
  /// a ring wakes only the futex sleepers.
  void adoptEventFd(int fd) { event_ = UniqueFd(fd); }
  /// Whether this process's sleepers and pollers still issue the membarrier (owner side; false once switched).
  bool sleepersUseMembarrier() const { return !sleepersSkip_.load(std::memory_order_acquire); }
  /// Whether rings of this doorbell fence now (the page's flag; either side).
  bool ringsFence() const {
    return needsFence_ || page_->membarrier.load(std::memory_order_relaxed) == 0;
  }

  /// The asymmetric fence pays an IPI to every CPU running a registered process at each sleep, for a plain load at
  /// each ring. Once the owner's sleeps and polls reach this many within kSleepWindow (ranks that outnumber the
  /// cores, NET waits that block in poll() at each piece), the owner switches its page to fences for good: rings
  /// fence, sleeps issue none (doorbell.cc, "Switching to fences").
  static constexpr int kFrequentSleeps = 100;
  static constexpr std::chrono::milliseconds kSleepWindow{100};

 private:
  Doorbell() = default;
  static std::shared_ptr<Doorbell> make(bool membarrier, int frequentSleeps);
  /// The sleeper's half of the pairing, after its `waiters` RMW: the membarrier, unless switched. False when the
  /// call failed (the page is switched; the caller shortens its sleep: a ring may have skipped its fence).
  bool sleeperBarrier();
  UniqueFd fd_;
  // Owner side: set once sleeps no longer issue the membarrier, only after the switching membarrier returned
  // (release; sleepers read it acquire). True from the start where the page's flag never was 1.
  std::atomic<bool> sleepersSkip_{true};
  std::atomic<int64_t> windowStartNs_{0};  // the current window of kSleepWindow, and the sleeps counted in it
  std::atomic<int> windowSleeps_{0};
  int frequentSleeps_ = kFrequentSleeps;
  UniqueFd event_;  // the owner's eventfd (non-blocking), written by rings that find pollers
  std::atomic<bool> polling_{false};  // a thread of the owner is between beginPoll() and endPoll()
  MappedRegion mapping_;
  DoorbellPage* page_ = nullptr;  // in mapping_
};

/// How a waiting thread spends the time before it sleeps: spin (if a spin slot is free: at most as many spinning
/// threads per process as CPUs in its affinity mask), then yield, then sleep on the doorbell in slices so that
/// deadlines and abort flags are checked.
class Backoff {
 public:
  /// `spinUs`: how long to spin when allowed (0 on an oversubscribed host); `yieldUs`: how long (from the end of the
  /// first 64 polls) to keep yielding before sleeping, at least `minYields` yields. Backoff(0, 0, 0) sleeps at the
  /// first idle call: for waits that another thread ends by a kernel event (NET: the proxy blocks in poll() and
  /// rings the doorbell), where a yield against CPU-bound processes costs their time slice.
  explicit Backoff(int spinUs = 20, int yieldUs = 0, int minYields = 4);
  ~Backoff();
  /// Call when nothing advanced; `ready` re-checks the awaited condition before sleeping.
  void idle(Doorbell& bell, ReadyRef ready);
  /// Call when something advanced.
  void reset();
  /// Whether the wait has reached its sleeping stage (each idle() a doorbell slice of up to 20 ms, or the caller's
  /// own blocking): a caller that reads its clock only every so many idle polls should read it at every one now,
  /// or its deadline comes that many slices late.
  bool sleeping() const { return sleeping_; }

 private:
  int spinUs_, yieldUs_, minYields_;
  bool spinning_ = false;
  bool sleeping_ = false;
  int yields_ = 0;
  unsigned polls_ = 0;
  std::chrono::steady_clock::time_point spinStart_{};
};

/// membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED): every thread of a registered process (Doorbell::membarrierRegistered)
/// passes a full barrier before this returns. The slow side of an asymmetric fence; false if the kernel refused.
bool membarrierAll();

/// CPUs this process may run on (sched_getaffinity).
int allowedCpus();
/// At most `n` threads of this process spin at once from now on (the smallest value asked for wins): communicators
/// share the host's cores with the other local ranks.
void limitSpinners(int n);

}  // namespace topocoll::transport
