#include "topocoll/transport/doorbell.h"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <thread>

#include "os.h"
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

std::shared_ptr<Doorbell> Doorbell::process() {
  static std::mutex mu;
  static std::weak_ptr<Doorbell> current;
  std::lock_guard<std::mutex> lock(mu);
  if (auto d = current.lock()) return d;
  std::shared_ptr<Doorbell> d(new Doorbell());
  os::Fd fd = os::createMemfd("topocoll-doorbell", sizeof(DoorbellPage));
  d->page_ = new (os::mapShared(fd.get(), sizeof(DoorbellPage))) DoorbellPage();
  d->fd_ = fd.release();
  current = d;
  return d;
}

std::shared_ptr<Doorbell> Doorbell::fromFd(int fd) {
  os::Fd owned(fd);
  if (os::fileSize(fd) < sizeof(DoorbellPage))
    fail(StatusCode::kRemoteError, "a peer's doorbell is {} bytes, {} expected", os::fileSize(fd), sizeof(DoorbellPage));
  std::shared_ptr<Doorbell> d(new Doorbell());
  d->page_ = static_cast<DoorbellPage*>(os::mapShared(fd, sizeof(DoorbellPage)));
  return d;
}

Doorbell::~Doorbell() {
  if (page_) ::munmap(page_, sizeof(DoorbellPage));
  if (fd_ >= 0) ::close(fd_);
}

void Doorbell::ring() {
  // Pairs with the fence implied by the sleeper's fetch_add: either it sees what we published, or we see it waiting.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ringFenced();
}

void Doorbell::ringFenced() {
  if (page_->waiters.load(std::memory_order_relaxed) == 0) return;
  page_->seq.fetch_add(1, std::memory_order_seq_cst);
  os::futexWakeAll(&page_->seq);
}

void Doorbell::sleep(ReadyRef ready, std::chrono::microseconds timeout) {
  page_->waiters.fetch_add(1, std::memory_order_seq_cst);
  uint32_t seq = page_->seq.load(std::memory_order_seq_cst);
  if (!ready()) os::futexWait(&page_->seq, seq, timeout);
  page_->waiters.fetch_sub(1, std::memory_order_seq_cst);
}

Backoff::Backoff(int spinUs, int yieldUs, int minYields) : spinUs_(spinUs), yieldUs_(yieldUs), minYields_(minYields) {}

Backoff::~Backoff() { reset(); }

void Backoff::reset() {
  if (polls_ == 0) return;
  if (spinning_) gSpinners.fetch_sub(1, std::memory_order_relaxed);
  spinning_ = false;
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
  bell.sleep(ready, std::chrono::milliseconds(20));
}

}  // namespace topocoll::transport
