// Shareable host buffers and the peers' views of them (peer_memory.h).
#include "topocoll/transport/peer_memory.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "os.h"
#include "topocoll/log.h"
#include "topocoll/status.h"

namespace topocoll::transport {
namespace {

constexpr size_t kMaxMappings = 64;         // peers' buffers mapped at once (imports and failures alike)

struct Owned {
  size_t len;
  int fd;  // -1: anonymous memory (no memfd could be had, or copied into a forked child)
  uint64_t owner, serial;
  OnFork onFork = OnFork::kShared;
  bool unused = false;  // markUnused: a fork gives the child fresh memory there, not a copy
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Owned> owned;  // by base address
  uint64_t key = 0;                  // this process's key, 0 until first needed (and again in a forked child)
  uint64_t nextSerial = 1;
  int forkPipe[2] = {-1, -1};        // during fork() with OnFork::kCopied buffers (prepareFork)
  size_t forkDemoted = 0;            // buffers the last fork() turned private in the parent
};

std::atomic<long> gPeerAccess{0};     // notePeerAccess
std::atomic<size_t> gDemotedUnlogged{0};  // demotions not logged yet (nothing logs inside fork()'s handlers)

void logDemotions() {
  if (gDemotedUnlogged.load(std::memory_order_relaxed) == 0) return;
  if (size_t n = gDemotedUnlogged.exchange(0))
    TC_INFO(log::kAlloc, "fork(): {} shareable buffer(s) of this process became copy-on-write, as anonymous memory "
            "is (not shareable until reshared)", n);
}

// Whether fork() leaves a kCopied buffer whose bytes the child must copy at once.
bool anyCopiedOnFork(const Registry& reg) {
  for (const auto& [base, o] : reg.owned)
    if (o.onFork == OnFork::kCopied && o.fd >= 0 && !o.unused) return true;
  return false;
}

// In the parent, before fork() and with no peer access in flight (the registry's lock held): every live kCopied
// buffer becomes a private mapping of its own memfd at the same address, and the parent's descriptor is closed. Both
// sides then have copy-on-write views of the bytes of this moment, as fork() gives anonymous memory; nobody writes
// the memfd any more (peers write only into buffers an operation of ours names, and regionOf no longer names this
// one). A buffer whose mapping cannot be made stays as it was, and the child copies it.
void demoteInParent(Registry& reg) {
  reg.forkDemoted = 0;
  for (auto& [base, o] : reg.owned) {
    if (o.onFork != OnFork::kCopied || o.fd < 0 || o.unused) continue;
    void* view = ::mmap(nullptr, o.len, PROT_READ | PROT_WRITE, MAP_PRIVATE, o.fd, 0);
    if (view == MAP_FAILED) continue;
    if (::mremap(view, o.len, o.len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(base)) == MAP_FAILED) {
      // The kernel may have unmapped the address before failing: the memfd (which holds every byte) goes back there.
      ::munmap(view, o.len);
      ::mmap(reinterpret_cast<void*>(base), o.len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, o.fd, 0);
      continue;
    }
    ::close(o.fd);
    o.fd = -1;
    ++reg.forkDemoted;
  }
}

// In a forked child (single-threaded, the registry's lock held): every OnFork::kCopied buffer becomes private
// anonymous memory at the same address holding what it held (as fork() gives anonymous memory; an unused one, whose
// bytes nobody needs, fresh zeroed memory), and stops being shareable here (fd -1: regionOf no longer names the
// parent's memfd for it). Only system calls and memcpy: nothing that allocates. Where a copy cannot be mapped the
// child aborts: staying shared would let it write into its parent's memory.
void privatizeInChild(Registry& reg) {
  for (auto& [base, o] : reg.owned) {
    if (o.onFork != OnFork::kCopied || o.fd < 0) continue;
    void* at = reinterpret_cast<void*>(base);
    bool ok;
    if (o.unused) {
      ok = ::mmap(at, o.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED;
    } else {
      void* copy = ::mmap(nullptr, o.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ok = copy != MAP_FAILED;
      if (ok) {
        std::memcpy(copy, at, o.len);
        ok = ::mremap(copy, o.len, o.len, MREMAP_MAYMOVE | MREMAP_FIXED, at) != MAP_FAILED;
      }
    }
    if (!ok) {
      static const char msg[] =
          "topocoll: fork(): no memory for the child's private copy of a shareable buffer (OnFork::kCopied); "
          "aborting the child rather than sharing its parent's memory\n";
      [[maybe_unused]] ssize_t w = ::write(2, msg, sizeof msg - 1);
      ::abort();
    }
    ::close(o.fd);
    o.fd = -1;
  }
}

// fork() with kCopied buffers: with no peer access in flight the parent's become copy-on-write (demoteInParent);
// otherwise, or where that failed, the parent waits (in its atfork handler, until the child closes the pipe's write
// end) for the child's copies, so that the child gets the bytes of the moment of fork(), not what the parent's
// threads or its peers write afterwards.
void prepareFork(Registry& reg) {
  reg.mu.lock();
  reg.forkPipe[0] = reg.forkPipe[1] = -1;
  reg.forkDemoted = 0;
  if (gPeerAccess.load(std::memory_order_seq_cst) <= 0) demoteInParent(reg);  // < 0: a child's inherited tasks
  if (anyCopiedOnFork(reg) && ::pipe2(reg.forkPipe, O_CLOEXEC) != 0) reg.forkPipe[0] = reg.forkPipe[1] = -1;
}
void parentAfterFork(Registry& reg) {
  if (reg.forkPipe[1] >= 0) {
    ::close(reg.forkPipe[1]);
    char c;
    for (;;) {  // EOF when the child closed its end (or there is no child: fork failed)
      ssize_t n = ::read(reg.forkPipe[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    ::close(reg.forkPipe[0]);
  }
  gDemotedUnlogged.fetch_add(reg.forkDemoted, std::memory_order_relaxed);  // logged by the next reshare/alloc
  reg.mu.unlock();
}
void childAfterFork(Registry& reg) {
  reg.key = 0;
  gPeerAccess.store(0);  // the parent's operations in flight are not the child's
  gDemotedUnlogged.store(0);
  privatizeInChild(reg);
  if (reg.forkPipe[1] >= 0) ::close(reg.forkPipe[0]), ::close(reg.forkPipe[1]);
  reg.mu.unlock();
}

Registry& ownedBuffers() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: buffers may be freed from static destructors
    // A forked child shares its parent's kShared buffers (MAP_SHARED) under the parent's key and serials, which
    // still name those memfds; what it allocates itself gets a key of its own.
    // The lock is held across fork() so that the child never inherits one taken by another thread.
    ::pthread_atfork([] { prepareFork(ownedBuffers()); }, [] { parentAfterFork(ownedBuffers()); },
                     [] { childAfterFork(ownedBuffers()); });
    return reg;
  }();
  return *r;
}

uint64_t processKey(Registry& r) {
  while (r.key == 0) {
    if (::getrandom(&r.key, sizeof r.key, 0) != static_cast<ssize_t>(sizeof r.key))
      r.key = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(::time(nullptr));
  }
  return r.key;
}

std::string memfdName(uint64_t owner, uint64_t serial) { return fmt::format("topocoll-buf-{:016x}-{}", owner, serial); }

struct Imports {
  std::mutex mu;
  std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const PeerMapping>> byRegion;  // nullptr: import failed
  std::deque<std::pair<uint64_t, uint64_t>> order;                                       // oldest first
};

Imports& imports() {
  static auto* i = [] {
    auto* im = new Imports;
    ::pthread_atfork([] { imports().mu.lock(); }, [] { imports().mu.unlock(); }, [] { imports().mu.unlock(); });
    return im;
  }();
  return *i;
}

// The cached view of `key` if it is the buffer `r` describes (a peer could describe a cached buffer as longer).
std::shared_ptr<const PeerMapping> cachedView(Imports& im, const std::pair<uint64_t, uint64_t>& key,
                                              const RegionRef& r, bool* found) {
  auto it = im.byRegion.find(key);
  *found = it != im.byRegion.end();
  if (!*found) return nullptr;
  for (auto o = im.order.begin(); o != im.order.end(); ++o)  // least recently used first
    if (*o == key) {
      im.order.erase(o);
      im.order.push_back(key);
      break;
    }
  const auto& m = it->second;
  if (!m || m->ref().base != r.base || m->ref().len != r.len || m->ref().fd != r.fd) return nullptr;
  return m;
}

// The owner's memfd as a descriptor of ours, checked to be that buffer's (its name carries key and serial); -1 if
// it cannot be had.
UniqueFd importFd(pid_t pid, const RegionRef& r) {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) return UniqueFd();
  UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), r.fd, 0)));
  if (!fd.valid()) return UniqueFd();
  char link[256];
  std::string path = fmt::format("/proc/self/fd/{}", fd.get());
  ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
  if (n <= 0) return UniqueFd();
  link[n] = 0;
  const std::string want = "/memfd:" + memfdName(r.owner, r.serial) + " ";  // then "(deleted)"
  if (std::strncmp(link, want.c_str(), want.size()) != 0 || os::fileSize(fd.get()) < r.len) return UniqueFd();
  return fd;
#else
  (void)pid, (void)r;
  return UniqueFd();
#endif
}

// Moves a buffer's descriptor above 1023 where the limit allows (select() users keep the low numbers), and gives it
// up (-1: anonymous memory) when it would take one of the process's last 64 descriptors.
int keepDescriptorAside(int fd) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return fd;
  const rlim_t soft = lim.rlim_cur;
  if (soft != RLIM_INFINITY && soft > 2048 && fd < 1024) {
    int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 1024);
    if (high >= 0) ::close(fd), fd = high;
  }
  if (soft != RLIM_INFINITY && static_cast<rlim_t>(fd) + 64 >= soft) {
    static std::once_flag once;
    std::call_once(once, [&] {
      TC_INFO(log::kAlloc, "memAlloc: descriptor {} of at most {}: buffers are anonymous memory from here on (peers "
              "copy them with process_vm_readv)", fd, static_cast<unsigned long long>(soft));
    });
    ::close(fd);
    return -1;
  }
  return fd;
}

// A fresh memfd of `len` bytes named for (owner, serial) (importFd checks the name), mapped shared with `flags`
// added: its descriptor and address, or {-1, MAP_FAILED} (no memfd: seccomp, an old kernel, the descriptor limit).
std::pair<int, void*> mapNewMemfd(uint64_t owner, uint64_t serial, size_t len, int flags) {
  int fd = static_cast<int>(::syscall(SYS_memfd_create, memfdName(owner, serial).c_str(), MFD_CLOEXEC));
  if (fd >= 0) fd = keepDescriptorAside(fd);
  if (fd < 0) return {-1, MAP_FAILED};
  void* p = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(len)) == 0)
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | flags, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return {-1, MAP_FAILED};
  }
  return {fd, p};
}

}  // namespace

void* allocShareable(size_t bytes, OnFork onFork) {
  if (bytes == 0) return nullptr;
  if (bytes > (size_t{1} << 50)) fail(StatusCode::kInvalidArgument, "memAlloc of {} bytes: too large", bytes);
  const size_t len = shareableLength(bytes);  // whole huge pages, as ncclMemAlloc rounds to its granularity
  logDemotions();
  Registry& reg = ownedBuffers();
  uint64_t owner, serial;
  {
    std::lock_guard<std::mutex> lk(reg.mu);
    owner = processKey(reg);
    serial = reg.nextSerial++;
  }
  auto [fd, p] = mapNewMemfd(owner, serial, len, 0);
  if (p == MAP_FAILED) {  // no memfd (seccomp, an old kernel, a limit): private memory, copied with process_vm_*
    p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail(StatusCode::kSystemError, "memAlloc of {} bytes: {}", bytes, std::strerror(errno));
  }
  ::madvise(p, len, MADV_HUGEPAGE);  // best effort (shared memory gets huge pages only where shmem_enabled allows)
  std::lock_guard<std::mutex> lk(reg.mu);
  reg.owned[reinterpret_cast<uintptr_t>(p)] = Owned{len, fd, owner, serial, onFork};
  return p;
}

void freeShareable(void* p) {
  if (!p) return;
  Registry& reg = ownedBuffers();
  Owned o;
  {
    std::lock_guard<std::mutex> lk(reg.mu);
    auto it = reg.owned.find(reinterpret_cast<uintptr_t>(p));
    if (it == reg.owned.end()) fail(StatusCode::kInvalidUsage, "memFree({}): not a pointer memAlloc returned", p);
    o = it->second;
    reg.owned.erase(it);
  }
  ::munmap(p, o.len);
  if (o.fd >= 0) ::close(o.fd);
}

void notePeerAccess(int delta) { gPeerAccess.fetch_add(delta, std::memory_order_seq_cst); }

bool reshare(void* p, bool* copied) {
  if (copied) *copied = false;
  logDemotions();
  Registry& reg = ownedBuffers();
  size_t len;
  uint64_t owner, serial;
  {
    std::lock_guard<std::mutex> lk(reg.mu);
    auto it = reg.owned.find(reinterpret_cast<uintptr_t>(p));
    if (it == reg.owned.end() || it->second.onFork != OnFork::kCopied) return it != reg.owned.end() && it->second.fd >= 0;
    if (it->second.fd >= 0) return true;
    len = it->second.len;
    owner = processKey(reg);
    serial = reg.nextSerial++;
  }
  auto [fd, fresh] = mapNewMemfd(owner, serial, len, MAP_POPULATE);  // one call, not a fault a page: it is all written
  if (fresh == MAP_FAILED) return false;
  // The caller owns the bytes: the copy needs no lock (a fork() meanwhile leaves a private buffer alone).
  std::memcpy(fresh, p, len);
  // The swap under the lock: a fork() must never see a shared mapping the registry calls private.
  std::lock_guard<std::mutex> lk(reg.mu);
  auto it = reg.owned.find(reinterpret_cast<uintptr_t>(p));
  if (it == reg.owned.end() || it->second.fd >= 0 || it->second.len != len) {  // freed, or reshared meanwhile
    ::munmap(fresh, len);
    ::close(fd);
    return it != reg.owned.end() && it->second.fd >= 0;
  }
  if (::mremap(fresh, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, p) == MAP_FAILED) {
    // The kernel may have unmapped p before failing: the new memfd (which holds the copy) goes there instead.
    ::munmap(fresh, len);
    if (::mmap(p, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      static const char msg[] = "topocoll: reshare(): a tensor's memory could not be mapped back; aborting\n";
      [[maybe_unused]] ssize_t w = ::write(2, msg, sizeof msg - 1);
      ::abort();
    }
  }
  ::madvise(p, len, MADV_HUGEPAGE);
  it->second.fd = fd;
  it->second.owner = owner;
  it->second.serial = serial;
  if (copied) *copied = true;
  return true;
}

void markUnused(void* p, bool unused) {
  Registry& reg = ownedBuffers();
  std::lock_guard<std::mutex> lk(reg.mu);
  auto it = reg.owned.find(reinterpret_cast<uintptr_t>(p));
  if (it != reg.owned.end()) it->second.unused = unused;
}

RegionRef regionOf(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  Registry& reg = ownedBuffers();
  std::lock_guard<std::mutex> lk(reg.mu);
  auto it = reg.owned.upper_bound(a);
  if (it == reg.owned.begin()) return {};
  --it;
  const Owned& o = it->second;
  if (o.fd < 0 || a - it->first > o.len || n > o.len - (a - it->first)) return {};
  RegionRef r;
  r.owner = o.owner;
  r.serial = o.serial;
  r.base = it->first;
  r.len = o.len;
  r.fd = o.fd;
  return r;
}

std::shared_ptr<const PeerMapping> mapPeerRegion(pid_t pid, const RegionRef& r, uint64_t remote, size_t n) {
  // What the peer wrote is checked before it is used: the range inside the buffer, a plausible descriptor.
  if (r.fd < 0 || r.len == 0 || remote < r.base || remote - r.base > r.len || n > r.len - (remote - r.base) ||
      pid <= 0)
    return nullptr;
  Imports& im = imports();
  const auto key = std::make_pair(r.owner, r.serial);
  {
    std::lock_guard<std::mutex> lk(im.mu);
    bool found = false;
    auto m = cachedView(im, key, r, &found);
    if (found) return m;
  }
  std::shared_ptr<const PeerMapping> m;
  if (UniqueFd fd = importFd(pid, r); fd.valid()) {
    void* p = ::mmap(nullptr, r.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p != MAP_FAILED) m = std::make_shared<const PeerMapping>(MappedRegion(p, r.len), r);
  }
  if (m)
    TC_INFO(log::kP2p, "P2P : process {}'s buffer {:#x} ({} bytes) mapped here: single copies of it are loads and "
            "stores", pid, r.base, r.len);
  else
    TC_INFO(log::kP2p, "P2P : process {}'s buffer {:#x} ({} bytes) cannot be mapped here: single copies of it use "
            "process_vm_readv/writev", pid, r.base, r.len);
  std::lock_guard<std::mutex> lk(im.mu);
  bool found = false;
  auto other = cachedView(im, key, r, &found);
  if (found) return other;  // another thread imported it meanwhile: ours unmaps as it goes
  // An older buffer of the owner at the same address (freed, or reshared after a fork()) is dead: its mapping goes
  // now rather than when the cache evicts it, so that its memory is not kept alive here.
  if (m)
    for (auto o = im.order.begin(); o != im.order.end();) {
      auto it = im.byRegion.find(*o);
      if (o->first == r.owner && it != im.byRegion.end() && it->second && it->second->ref().base == r.base) {
        im.byRegion.erase(it);
        o = im.order.erase(o);
      } else {
        ++o;
      }
    }
  im.byRegion.emplace(key, m);
  im.order.push_back(key);
  while (im.order.size() > kMaxMappings) {
    im.byRegion.erase(im.order.front());  // a copy still holding it keeps it mapped until it ends
    im.order.pop_front();
  }
  return m;
}

size_t peerMappingsCached() {
  Imports& im = imports();
  std::lock_guard<std::mutex> lk(im.mu);
  return im.byRegion.size();
}

}  // namespace topocoll::transport
