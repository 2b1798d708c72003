#include "topocoll/transport/doorbell.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "os.h"
#include "topocoll/log.h"
#include "topocoll/status.h"

namespace topocoll::transport {

namespace {

// Threads of this process spinning right now (Backoff), and how many may.
std::atomic<int> gSpinners{0};
std::atomic<int> gSpinLimit{0};  // 0: allowedCpus()

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

int allowedCpus() {
  static const int n = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
    return std::max(1, CPU_COUNT(&set));
  }();
  return n;
}

void limitSpinners(int n) {
  int cur = gSpinLimit.load();
  while ((cur == 0 || n < cur) && !gSpinLimit.compare_exchange_weak(cur, n)) {
  }
}

// The asymmetric fence. A ring and a sleep form a Dekker pair:
//   publisher P: store X (what the sleeper waits for, release); [barrier]; load waiters -> ring only if > 0
//   sleeper   S: waiters++ (seq_cst RMW);                      [barrier]; load X (ready()) -> sleep only if not there
// Each side needs a full barrier between its store and its load, or both loads may see the old values: P skips the
// wake-up and S sleeps. With membarrier, the frequent side (P: every publish) uses only a compiler barrier, and the
// rare side (S: a thread about to sleep, after spinning and yielding) calls membarrier(GLOBAL_EXPEDITED) in its
// place: when it returns, every thread of a registered process has passed a full barrier at some point b of its
// program order since the call began (an IPI on the CPUs that run one; a thread that was not running passed the
// scheduler's barriers). For a registered P:
//   - b before P's store of X: S's waiters++ (before the call) is visible to every load P makes after b, so P's load
//     of waiters sees it and P rings;
//   - b between P's store and its load: P had a full barrier there, and S one (the syscall): the classic pairing;
//   - b after P's load: P's store of X is visible to S's loads after the call returns, so ready() sees X.
// In every case S does not sleep through what P published. The futex word keeps the rest as before: S reads `seq`
// after the barrier and before ready(); a P that saw it waiting bumps `seq` (a locked RMW, after its store of X) then
// wakes, so S's futex_wait either returns at once (seq changed) or is woken. Across processes the pairing holds only
// if P's process is registered (so it gets the IPI) and S issues the membarrier: the page says whether its sleepers
// do (the owner sets `membarrier` once, before the page is exported, after registering), and a ring skips the fence
// only when both hold (needsFence_ false); everything else fences as before. Should the call fail in a sleeper (a
// seccomp filter installed later), it clears the page's flag (rings fence from then on) and that sleep lasts at most
// 1 ms: a ring that read the flag before the clear and lost the race is then late by at most that, and in any case a
// wait sleeps in slices (Backoff: 20 ms) and re-checks its condition after each, so a wake-up is never lost for good.
//
// Switching to fences. Where the owner's threads sleep or poll often (more ranks than cores; NET waits that block in
// poll() once a piece), the membarriers cost more than the fences they spare (a 4 x 2 AllReduce across emulated
// hosts spent 11% of the machine's CPU sending their IPIs), so the owner switches for good: a sleeper S0 stores the
// page's flag 0, then issues its membarrier (the sleep's own and the switch's), and only after it returns sets the
// process-local sleepersSkip_ (release). A later sleeper S that reads it set (acquire) skips the membarrier, relying
// on the rings' fences. A ring P that still read the flag as 1 and skipped its fence: P's load of the flag comes
// before S0's barrier point b in P (after b, P would see the 0 stored before the call), so P's store of X is before
// b too, and visible to S0 after its call and, through the release/acquire pair, to S's check: S sees X. A ring
// that read 0 fenced: the classic pairing with S's RMW. A sleeper that read sleepersSkip_ clear issues the
// membarrier as before, whatever the flag says.
namespace {
long membarrierCall(int cmd) { return ::syscall(SYS_membarrier, cmd, 0, 0); }
}  // namespace

bool membarrierAll() { return membarrierCall(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0; }

bool Doorbell::membarrierRegistered() {
  // Per process: fork copies this memory but the registration is the kernel's per-mm state, so a child registers
  // again (registering twice is harmless).
  static std::atomic<pid_t> registeredPid{0};
  static std::mutex mu;
  const pid_t pid = ::getpid();
  if (registeredPid.load(std::memory_order_acquire) == pid) return true;
  std::lock_guard<std::mutex> lock(mu);
  static pid_t refusedPid = 0;
  if (refusedPid == pid) return false;
  if (registeredPid.load(std::memory_order_relaxed) == pid) return true;
  long cmds = membarrierCall(MEMBARRIER_CMD_QUERY);
  if (cmds < 0 || !(cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) || !(cmds & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) ||
      membarrierCall(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0) {
    refusedPid = pid;
    return false;
  }
  registeredPid.store(pid, std::memory_order_release);
  return true;
}

namespace {
std::atomic<bool> gMembarrierOff{false};  // TOPOCOLL_MEMBARRIER=0 for the process's doorbell: every ring fences
}  // namespace

std::shared_ptr<Doorbell> Doorbell::make(bool membarrier, int frequentSleeps) {
  std::shared_ptr<Doorbell> d(new Doorbell());
  d->frequentSleeps_ = frequentSleeps;
  UniqueFd fd = os::createMemfd("topocoll-doorbell", sizeof(DoorbellPage));
  d->mapping_ = MappedRegion::shared(fd.get(), sizeof(DoorbellPage), "the process's doorbell");
  d->page_ = new (d->mapping_.get()) DoorbellPage();
  d->fd_ = std::move(fd);
  d->event_ = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));  // -1 (no pollers, sleepers only) if refused
  if (membarrier && membarrierRegistered()) {
    d->page_->membarrier.store(1, std::memory_order_relaxed);  // before the fd leaves the process
    d->needsFence_ = false;
    d->sleepersSkip_.store(false, std::memory_order_relaxed);
  }
  return d;
}

std::shared_ptr<Doorbell> Doorbell::create(bool membarrier, int frequentSleeps) {
  return make(membarrier, frequentSleeps);
}

std::shared_ptr<Doorbell> Doorbell::process(bool membarrier) {
  static std::mutex mu;
  static std::weak_ptr<Doorbell> current;
  std::lock_guard<std::mutex> lock(mu);
  if (auto d = current.lock()) return d;
  gMembarrierOff.store(!membarrier, std::memory_order_relaxed);
  auto d = make(membarrier, kFrequentSleeps);
  current = d;
  return d;
}

std::shared_ptr<Doorbell> Doorbell::fromFd(int fd) {
  UniqueFd owned(fd);
  if (os::fileSize(fd) < sizeof(DoorbellPage))
    fail(StatusCode::kRemoteError, "a peer's doorbell is {} bytes, {} expected", os::fileSize(fd), sizeof(DoorbellPage));
  std::shared_ptr<Doorbell> d(new Doorbell());
  d->mapping_ = MappedRegion::shared(fd, sizeof(DoorbellPage), "a peer's doorbell");
  d->page_ = static_cast<DoorbellPage*>(d->mapping_.get());
  d->needsFence_ = gMembarrierOff.load(std::memory_order_relaxed) ||
                   d->page_->membarrier.load(std::memory_order_relaxed) == 0 || !membarrierRegistered();
  return d;
}

Doorbell::~Doorbell() = default;

void Doorbell::ring() {
  // Pairs with the sleeper's fetch_add (a full barrier) or, without the fence, its membarrier (see above): either it
  // sees what we published, or we see it waiting.
  if (needsFence_)
    std::atomic_thread_fence(std::memory_order_seq_cst);
  else
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler keeps the publish before the load
  ringFenced();
}

void Doorbell::ringFenced() {
  // A page whose sleepers stopped issuing membarrier: fence (rare; the flag's line is only read).
  if (!needsFence_ && page_->membarrier.load(std::memory_order_relaxed) == 0)
    std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint32_t w = page_->waiters.load(std::memory_order_relaxed);
  if (w == 0) return;
  if ((w & (DoorbellPage::kPoller - 1)) != 0) {
    page_->seq.fetch_add(1, std::memory_order_seq_cst);
    os::futexWakeAll(&page_->seq);
  }
  if (w >= DoorbellPage::kPoller && event_.valid()) {
    uint64_t one = 1;
    ssize_t r = ::write(event_.get(), &one, sizeof one);  // never blocks: the counter cannot reach its limit
    (void)r;
  }
}

// A poller announces itself in the same word as a sleeper, with the same fence: a ring either sees it (and writes
// the eventfd) or published before the poller's next check, which then sees what was published.
int Doorbell::beginPoll(int sliceMs) {
  if (!event_.valid() || polling_.exchange(true, std::memory_order_acquire)) return -1;
  page_->waiters.fetch_add(DoorbellPage::kPoller, std::memory_order_seq_cst);
  if (!sleeperBarrier()) sliceMs = std::min(sliceMs, 1);
  return sliceMs;
}

bool Doorbell::sleeperBarrier() {
  if (sleepersSkip_.load(std::memory_order_acquire)) return true;  // the rings fence
  // Count this sleep in the current window; the one that reaches kFrequentSleeps switches (see above).
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  bool frequent = false;
  if (now - windowStartNs_.load(std::memory_order_relaxed) >
      std::chrono::duration_cast<std::chrono::nanoseconds>(kSleepWindow).count()) {
    windowStartNs_.store(now, std::memory_order_relaxed);
    windowSleeps_.store(1, std::memory_order_relaxed);
  } else {
    frequent = windowSleeps_.fetch_add(1, std::memory_order_relaxed) + 1 == frequentSleeps_;
  }
  if (frequent) page_->membarrier.store(0, std::memory_order_seq_cst);  // before the call: rings fence from now on
  const bool ok = membarrierAll();
  if (!ok) page_->membarrier.store(0, std::memory_order_seq_cst);  // refused: rings fence from now on too
  if (frequent || !ok) sleepersSkip_.store(true, std::memory_order_release);
  if (frequent && ok)
    TC_INFO(log::kInit | log::kNet | log::kP2p,
            "Doorbell : {} sleeps within {} ms: this process's waits stop issuing membarrier, rings fence instead",
            frequentSleeps_, kSleepWindow.count());
  return ok;
}

void Doorbell::endPoll() {
  page_->waiters.fetch_sub(DoorbellPage::kPoller, std::memory_order_seq_cst);
  uint64_t drained;
  while (::read(event_.get(), &drained, sizeof drained) > 0) {
  }
  polling_.store(false, std::memory_order_release);
}

bool Doorbell::sleep(ReadyRef ready, std::chrono::microseconds timeout) {
  page_->waiters.fetch_add(1, std::memory_order_seq_cst);
  if (!sleeperBarrier()) timeout = std::min<std::chrono::microseconds>(timeout, std::chrono::milliseconds(1));
  uint32_t seq = page_->seq.load(std::memory_order_seq_cst);
  bool woken = true;
  if (!ready()) woken = os::futexWait(&page_->seq, seq, timeout);
  page_->waiters.fetch_sub(1, std::memory_order_seq_cst);
  return woken;
}

Backoff::Backoff(int spinUs, int yieldUs, int minYields) : spinUs_(spinUs), yieldUs_(yieldUs), minYields_(minYields) {}

Backoff::~Backoff() { reset(); }

void Backoff::reset() {
  if (polls_ == 0) return;
  if (spinning_) gSpinners.fetch_sub(1, std::memory_order_relaxed);
  spinning_ = false;
  sleeping_ = false;
  yields_ = 0;
  polls_ = 0;
  spinStart_ = {};
}

void Backoff::idle(Doorbell& bell, ReadyRef ready) {
  using Clock = std::chrono::steady_clock;
  // Short waits (most of them) cost a pause per poll and nothing else: no clock, no shared counter.
  // (polls_ counts every idle call, also without a spin: reset() starts the next wait from the top.)
  if (++polls_ <= 64 && spinUs_ > 0) {
    cpuRelax();
    return;
  }
  if (spinStart_ == Clock::time_point{}) {
    spinStart_ = Clock::now();
    int limit = gSpinLimit.load(std::memory_order_relaxed);
    if (spinUs_ > 0 && gSpinners.fetch_add(1, std::memory_order_relaxed) < (limit > 0 ? limit : allowedCpus()))
      spinning_ = true;
    else if (spinUs_ > 0)
      gSpinners.fetch_sub(1, std::memory_order_relaxed);
  }
  if (spinning_) {
    // Poll often (a pause is up to ~40 ns) and read the clock rarely: the wait is what latency is made of.
    cpuRelax();
    if ((polls_ & 63) != 0 || Clock::now() - spinStart_ < std::chrono::microseconds(spinUs_)) return;
    gSpinners.fetch_sub(1, std::memory_order_relaxed);
    spinning_ = false;
  }
  // Then yield: a peer that shares our core runs at once (ranks outnumber cores: Open MPI's vader waits this way),
  // and an answer that comes within yieldUs costs no futex wake-up on either side.
  if (yields_ < minYields_ || (yieldUs_ > 0 && Clock::now() - spinStart_ < std::chrono::microseconds(yieldUs_))) {
    ++yields_;
    std::this_thread::yield();
    return;
  }
  // Short slices: deadlines, abort flags and peers that died are checked between them.
  sleeping_ = true;
  bell.sleep(ready, std::chrono::milliseconds(20));
}

}  // namespace topocoll::transport
