// The backend's CPU allocator for PyTorch 1.13 (c10::Allocator): see cpu_allocator.h.
#include "cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <algorithm>
#include <list>
#include <vector>
#include <unordered_map>

#include "topocoll/log.h"
#include "topocoll/transport/peer_memory.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1 and later
#endif

namespace topocoll::torch_backend {
namespace {

std::atomic<std::uint64_t> gHugeAllocs{0}, gHugeFrees{0}, gHugeBytes{0};
std::atomic<bool> gHugeOn{false};  // TOPOCOLL_TORCH_HUGEPAGES: MADV_HUGEPAGE blocks and collapses

// Live huge blocks and their sizes (the deleter gets only the pointer). Blocks are at least 2 MiB, so there are few.
std::mutex gHugeMu;
std::unordered_map<void*, std::size_t>& hugeBlocks() {
  static auto* m = new std::unordered_map<void*, std::size_t>;  // never destroyed: tensors may die after exit()
  return *m;
}

// Shareable blocks (TOPOCOLL_TORCH_SHAREABLE=1): live ones by address (-> rounded length), freed ones kept for reuse
// (oldest first; a block that does not fit evicts the oldest), up to kShareCacheMax bytes; at most gShareBudget of
// them live and kept at once (each holds a descriptor), allocHuge's blocks beyond. transport::allocShareable,
// freeShareable and markUnused are called without gShareMu held (they take the shareable registry's lock, which
// fork() holds while the atfork handlers take gShareMu).
std::atomic<bool> gShareable{false};
std::atomic<std::uint64_t> gShareAllocs{0}, gShareReuses{0}, gShareReshared{0};
std::size_t gShareBudget = 0;
std::mutex gShareMu;
std::unordered_map<void*, std::size_t>& shareBlocks() {
  static auto* m = new std::unordered_map<void*, std::size_t>;
  return *m;
}
std::list<std::pair<std::size_t, void*>>& shareCache() {  // (length, block), oldest first
  static auto* m = new std::list<std::pair<std::size_t, void*>>;
  return *m;
}
std::size_t gShareCacheBytes = 0;

// Descriptors the shareable blocks may hold: a quarter of the soft limit, at most 4096.
std::size_t shareBudget() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 4096;
  return std::min<std::size_t>(4096, static_cast<std::size_t>(lim.rlim_cur) / 4);
}

void* allocHuge(std::size_t n);

void* allocShared(std::size_t n) {
  const std::size_t len = transport::shareableLength(n);
  void* p = nullptr;
  bool overBudget = false;
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(gShareMu);
      auto& cache = shareCache();
      for (auto it = cache.rbegin(); it != cache.rend(); ++it)  // the most recently freed of that length
        if (it->first == len) {
          p = it->second;
          cache.erase(std::next(it).base());
          gShareCacheBytes -= len;
          break;
        }
      overBudget = !p && shareBlocks().size() + cache.size() >= gShareBudget;
    }
    if (!p || transport::regionOf(p, 1).fd >= 0) break;
    // A kept block that is not shareable (in a forked child: fresh private memory) is freed, not reused.
    transport::freeShareable(p);
    p = nullptr;
  }
  if (overBudget)
    return n >= kHugeAllocMin && gHugeOn.load(std::memory_order_relaxed) ? allocHuge(n) : c10::alloc_cpu(n);
  if (p) {
    transport::markUnused(p, false);
    gShareReuses.fetch_add(1, std::memory_order_relaxed);
  } else {
    try {
      p = transport::allocShareable(n, transport::OnFork::kCopied);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "DefaultCPUAllocator: can't allocate memory: you tried to allocate ", n, " bytes (", e.what(),
                  ")");
    }
    gShareAllocs.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lk(gShareMu);
  shareBlocks()[p] = len;
  return p;
}

// Whether p is a live shareable block (then it is released: kept for reuse, or freed when larger than the cache).
bool releaseShared(void* p) {
  if (!gShareable.load(std::memory_order_relaxed) || reinterpret_cast<std::uintptr_t>(p) % 4096 != 0) return false;
  std::vector<void*> evicted;
  bool keep = false;
  // A block a fork() turned private (copy-on-write, no longer shareable) is freed rather than kept for reuse.
  const bool demoted = transport::regionOf(p, 1).fd < 0;
  {
    std::lock_guard<std::mutex> lk(gShareMu);
    auto it = shareBlocks().find(p);
    if (it == shareBlocks().end()) return false;
    const std::size_t len = it->second;
    shareBlocks().erase(it);
    if (len <= kShareCacheMax && !demoted) {
      auto& cache = shareCache();
      while (gShareCacheBytes + len > kShareCacheMax) {
        evicted.push_back(cache.front().second);
        gShareCacheBytes -= cache.front().first;
        cache.pop_front();
      }
      cache.emplace_back(len, p);
      gShareCacheBytes += len;
      keep = true;
    }
  }
  if (keep) transport::markUnused(p, true);  // a fork gives the child fresh memory there, not a copy
  else evicted.push_back(p);
  for (void* q : evicted) transport::freeShareable(q);
  return true;
}

// Frees every block this allocator made (and, through free(), any block c10's default allocator made: the same
// free_cpu), reporting it to PyTorch's memory profiler as c10's default allocator does.
void release(void* p) {
  if (!p) return;
  c10::profiledCPUMemoryReporter().Delete(p);
  if (releaseShared(p)) return;
  if (reinterpret_cast<std::uintptr_t>(p) % kHugeAllocMin == 0) {
    std::lock_guard<std::mutex> lk(gHugeMu);
    auto it = hugeBlocks().find(p);
    if (it != hugeBlocks().end()) {
      gHugeFrees.fetch_add(1, std::memory_order_relaxed);
      gHugeBytes.fetch_sub(it->second, std::memory_order_relaxed);
      hugeBlocks().erase(it);
    }
  }
  c10::free_cpu(p);
}

// posix_memalign at 2 MiB (glibc maps large blocks itself and reuses freed ones, as for c10's own blocks), then
// MADV_HUGEPAGE over the block's pages: the kernel faults it in as 2 MiB pages where it can, 4 KiB ones otherwise.
void* allocHuge(std::size_t n) {
  void* p = nullptr;
  if (int rc = ::posix_memalign(&p, kHugeAllocMin, n); rc != 0) {
    // c10's own out-of-memory error, as c10::alloc_cpu raises it.
    TORCH_CHECK(false, "DefaultCPUAllocator: can't allocate memory: you tried to allocate ", n,
                " bytes. Error code ", rc, " (", std::strerror(rc), ")");
  }
  std::size_t len = (n + 4095) & ~std::size_t(4095);
  if (::madvise(p, len, MADV_HUGEPAGE) != 0) {  // best effort: THP "never", or a kernel without THP
    static std::once_flag once;
    int err = errno;
    std::call_once(once, [&] {
      TC_INFO(log::kAlloc, "torch CPU allocator: madvise(MADV_HUGEPAGE) of {} bytes: {} (4 KiB pages)", len,
              std::strerror(err));
    });
  }
  {
    std::lock_guard<std::mutex> lk(gHugeMu);
    hugeBlocks()[p] = n;
  }
  gHugeAllocs.fetch_add(1, std::memory_order_relaxed);
  gHugeBytes.fetch_add(n, std::memory_order_relaxed);
  return p;
}

class HugePageCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) const override {
    const bool share = gShareable.load(std::memory_order_relaxed);
    void* p = n >= kShareMin && share ? allocShared(n) : n < kHugeAllocMin ? c10::alloc_cpu(n) : allocHuge(n);
    c10::profiledCPUMemoryReporter().New(p, n);
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
};

std::atomic<bool> gInstalled{false};
std::atomic<std::uint64_t> gCollapses{0}, gCollapsesOk{0};

// Uses per 2 MiB-aligned interior (begin -> length, uses, collapsed): a few entries per large tensor used in
// collectives; emptied when it grows past kMaxTracked (a freed tensor's address may come back as another tensor's).
struct Use {
  std::size_t len = 0;
  int uses = 0;
  bool done = false;
};
std::mutex gUseMu;
std::unordered_map<std::uintptr_t, Use>& uses() {
  static auto* m = new std::unordered_map<std::uintptr_t, Use>;
  return *m;
}
constexpr std::size_t kMaxTracked = 4096;

bool isHugeBlock(const void* p) {
  if (gShareable.load(std::memory_order_relaxed)) {  // shareable blocks (page-aligned) are not collapsed either
    std::lock_guard<std::mutex> lk(gShareMu);
    if (shareBlocks().count(const_cast<void*>(p))) return true;
  }
  if (reinterpret_cast<std::uintptr_t>(p) % kHugeAllocMin != 0) return false;
  std::lock_guard<std::mutex> lk(gHugeMu);
  return hugeBlocks().count(const_cast<void*>(p)) != 0;
}

}  // namespace

void noteTensorUse(const void* data, std::size_t bytes) {
  if (bytes < kCollapseMin || !gHugeOn.load(std::memory_order_relaxed) || isHugeBlock(data)) return;
  const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t b = (p + kHugeAllocMin - 1) & ~(kHugeAllocMin - 1), e = (p + bytes) & ~(kHugeAllocMin - 1);
  if (e <= b) return;
  {
    std::lock_guard<std::mutex> lk(gUseMu);
    if (uses().size() >= kMaxTracked) uses().clear();
    Use& u = uses()[b];
    if (u.len != e - b) u = Use{e - b, 0, false};
    if (u.done || ++u.uses < kCollapseAfter) return;
    u.done = true;
  }
  void* at = reinterpret_cast<void*>(b);
  ::madvise(at, e - b, MADV_HUGEPAGE);  // so that the range stays huge (khugepaged, later faults)
  auto t0 = std::chrono::steady_clock::now();
  int rc = ::madvise(at, e - b, MADV_COLLAPSE);
  int err = errno;
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  gCollapses.fetch_add(1, std::memory_order_relaxed);
  if (rc == 0) gCollapsesOk.fetch_add(1, std::memory_order_relaxed);
  TC_INFO(log::kAlloc, "torch: MADV_COLLAPSE of a tensor's {} bytes at {} after {} uses: {} ({:.1f} ms)", e - b, at,
          kCollapseAfter, rc == 0 ? "on 2 MiB pages" : std::strerror(err), ms);
}

void reshareWholeBlock(const void* base, std::size_t storageBytes, const void* data, std::size_t bytes) {
  if (!gShareable.load(std::memory_order_relaxed) || !base || base != data || bytes != storageBytes ||
      bytes < kShareMin || reinterpret_cast<std::uintptr_t>(base) % 4096 != 0)
    return;
  {
    std::lock_guard<std::mutex> lk(gShareMu);
    if (!shareBlocks().count(const_cast<void*>(base))) return;
  }
  bool copied = false;  // false too for a block that is shareable as it is
  if (transport::reshare(const_cast<void*>(base), &copied) && copied) {
    gShareReshared.fetch_add(1, std::memory_order_relaxed);
    TC_INFO(log::kAlloc, "torch: a tensor's {} bytes at {} are shareable again after fork() (one copy)", bytes, base);
  }
}

bool installCpuAllocator(bool hugePages, bool shareable) {
  if (!hugePages && !shareable) return gInstalled.load();
  if (hugePages) gHugeOn.store(true);
  if (shareable && !gShareable.load()) {
    {
      std::lock_guard<std::mutex> lk(gShareMu);
      gShareBudget = shareBudget();
    }
    gShareable.store(true);
    TC_INFO(log::kInit | log::kAlloc,
            "torch CPU allocator: blocks from {} bytes in shareable memory, up to {} bytes of freed ones kept "
            "(TOPOCOLL_TORCH_SHAREABLE=1), at most {} of them at once (descriptors)",
            kShareMin, kShareCacheMax, gShareBudget);
  }
  if (gInstalled.exchange(true)) return true;
  // SetCPUAllocator takes the pointer for good; the allocator is never destroyed (tensors outlive everything).
  static HugePageCpuAllocator* alloc = new HugePageCpuAllocator;
  // Fork safety: a child forked while another thread holds the table's lock gets it unlocked, and consistent.
  ::pthread_atfork(
      [] {
        gUseMu.lock();
        gShareMu.lock();
        gHugeMu.lock();
      },
      [] {
        gHugeMu.unlock();
        gShareMu.unlock();
        gUseMu.unlock();
      },
      [] {
        gHugeMu.unlock();
        gShareMu.unlock();
        gUseMu.unlock();
      });
  c10::SetCPUAllocator(alloc);
  if (hugePages)
    TC_INFO(log::kInit | log::kAlloc,
            "torch CPU allocator: blocks from {} bytes 2 MiB-aligned with MADV_HUGEPAGE (TOPOCOLL_TORCH_HUGEPAGES=1)",
            kHugeAllocMin);
  return true;
}

CpuAllocatorStats cpuAllocatorStats() {
  CpuAllocatorStats s;
  s.installed = gInstalled.load();
  s.hugePages = gHugeOn.load();
  s.collapses = gCollapses.load(std::memory_order_relaxed);
  s.collapsesOk = gCollapsesOk.load(std::memory_order_relaxed);
  s.hugeAllocs = gHugeAllocs.load(std::memory_order_relaxed);
  s.hugeFrees = gHugeFrees.load(std::memory_order_relaxed);
  s.hugeBytes = gHugeBytes.load(std::memory_order_relaxed);
  s.shareable = gShareable.load();
  s.shareAllocs = gShareAllocs.load(std::memory_order_relaxed);
  s.shareReuses = gShareReuses.load(std::memory_order_relaxed);
  s.shareReshared = gShareReshared.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(gShareMu);
  s.shareLive = shareBlocks().size();
  s.shareCachedBytes = gShareCacheBytes;
  return s;
}

}  // namespace topocoll::torch_backend
