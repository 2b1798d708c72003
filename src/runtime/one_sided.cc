// Registered buffers, memory windows and one-sided signals for host memory (one_sided.h).
//
// ncclCommRegister is local: it checks the range (mapped, not overlapping another registration) and records it.
// Host memory from ncclMemAlloc is what peers of the host can map (a memfd); the collectives map such buffers
// whether or not they are registered (docs/collectives.md, "Mapped inputs"), and no other host memory can be mapped
// by another process on Linux, so registering heap memory changes nothing (an INFO line says so).
//
// ncclCommWindowRegister is collective: the ranks allgather each buffer's description (and, with the first window,
// their signal block's), and every rank maps each peer's buffer where it can (same process: the address itself;
// another process of the host: the memfd, transport::mapPeerRegion; another host: not mapped). ncclPutSignal is
// then a copy into the peer's buffer and a release increment of its counter of this rank in the peer's signal
// block; ncclWaitSignal waits (spin, then futex) until the counters reach what it waits for.
#include "one_sided.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "comm_impl.h"
#include "coll_queue.h"
#include "groups.h"
#include "topocoll/log.h"
#include "topocoll/progress/connections.h"
#include "topocoll/status.h"
#include "topocoll/transport/peer_memory.h"
#include "topocoll/transport/signals.h"
#include "../transport/os.h"

namespace topocoll::runtime {

namespace detail {

constexpr uint32_t kWindowMagic = 0x77696e64;  // "wind"

// A shareable buffer as its owner describes it (transport::RegionRef, the address and the size used).
struct NoteRegion {
  uint64_t owner = 0, serial = 0, base = 0, len = 0, addr = 0, bytes = 0;
  int64_t fd = -1;
};

// What every rank tells the others at a window registration.
struct WindowNote {
  uint32_t magic = kWindowMagic;
  uint32_t seq = 0;    // the communicator's window registration number
  int32_t flags = 0;
  int32_t ok = 1;      // 0: this rank's arguments are wrong (why)
  NoteRegion win, signals;
  char why[160] = {};
};
static_assert(std::has_unique_object_representations_v<NoteRegion>, "sent as bytes: no padding");

namespace {

NoteRegion describe(const void* p, size_t bytes) {
  NoteRegion n;
  const transport::RegionRef r = transport::regionOf(p, bytes);
  n.owner = r.owner;
  n.serial = r.serial;
  n.base = r.base;
  n.len = r.len;
  n.fd = r.fd;
  n.addr = reinterpret_cast<uint64_t>(p);
  n.bytes = bytes;
  return n;
}

// Whether every page of [p, p + bytes) is mapped in this process.
bool mapped(const void* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = reinterpret_cast<uintptr_t>(p) + bytes;
  if (hi < reinterpret_cast<uintptr_t>(p)) return false;
  // msync fails with ENOMEM where part of the range is not mapped; MS_ASYNC writes nothing back.
  return ::msync(reinterpret_cast<void*>(lo), hi - lo, MS_ASYNC) == 0 || errno != ENOMEM;
}

}  // namespace

OneSided::OneSided(CommImpl& comm) : c_(comm) {}

OneSided::~OneSided() {
  for (Window* w : windows_) delete w;
  windows_.clear();
  signalHolds_.clear();
  if (signals_) transport::freeShareable(signals_);
}

void* OneSided::registerBuffer(void* buf, size_t bytes) {
  const int me = c_.rank();
  if (!buf) fail(StatusCode::kInvalidArgument, "rank {}: ncclCommRegister: buff is NULL", me);
  if (bytes == 0) fail(StatusCode::kInvalidArgument, "rank {}: ncclCommRegister: size is 0", me);
  if (!mapped(buf, bytes))
    fail(StatusCode::kInvalidArgument, "rank {}: ncclCommRegister: [{}, +{}) is not mapped memory of this process",
         me, buf, bytes);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(buf), hi = lo + bytes;
  std::lock_guard<std::mutex> lk(mu_);
  // The registration at or below lo, and the first one above it, are the only ones that can overlap.
  auto it = regs_.upper_bound(lo);
  if (it != regs_.end() && it->first < hi)
    fail(StatusCode::kInvalidArgument,
         "rank {}: ncclCommRegister: [{}, +{}) overlaps the buffer registered as handle {} ([{:#x}, +{}))", me, buf,
         bytes, static_cast<void*>(it->second.get()), it->second->base, it->second->bytes);
  if (it != regs_.begin() && std::prev(it)->first + std::prev(it)->second->bytes > lo) {
    const Registration& r = *std::prev(it)->second;
    fail(StatusCode::kInvalidArgument,
         "rank {}: ncclCommRegister: [{}, +{}) overlaps the buffer registered as handle {} ([{:#x}, +{}))", me, buf,
         bytes, static_cast<const void*>(&r), r.base, r.bytes);
  }
  auto reg = std::make_unique<Registration>();
  reg->base = lo;
  reg->bytes = bytes;
  void* handle = reg.get();
  regs_.emplace(lo, std::move(reg));
  const bool shareable = transport::regionOf(buf, bytes).fd >= 0;
  TC_INFO(log::kReg, "ncclCommRegister: rank {} buffer {} ({} bytes) registered as {}: {}", me, buf, bytes, handle,
          shareable ? "ncclMemAlloc memory, which this host's peers map (no staging copies)"
                    : "not ncclMemAlloc memory: peers in other processes copy it with process_vm_readv/writev "
                      "(only ncclMemAlloc memory can be mapped by them)");
  return handle;
}

void OneSided::deregisterBuffer(void* handle) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = regs_.begin(); it != regs_.end(); ++it)
    if (it->second.get() == handle) {
      regs_.erase(it);
      return;
    }
  fail(StatusCode::kInvalidArgument,
       "rank {}: ncclCommDeregister: handle {} is not a registration of this communicator (deregistered already, or "
       "another communicator's)",
       c_.rank(), handle);
}

size_t OneSided::registeredBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& [base, r] : regs_) n += r->bytes;
  return n;
}

Window* OneSided::registerWindow(void* buf, size_t bytes, int flags) {
  const int me = c_.rank(), n = c_.nRanks();
  if (groupDepth() > 0)
    fail(StatusCode::kInvalidUsage,
         "rank {}: ncclCommWindowRegister inside a group: call it outside ncclGroupStart()/ncclGroupEnd()", me);
  std::vector<WindowNote> notes(n);
  WindowNote& mine = notes[me];
  mine.seq = ++windowSeq_;
  mine.flags = flags;
  auto refuse = [&](const std::string& why) {
    mine.ok = 0;
    std::snprintf(mine.why, sizeof mine.why, "%s", why.c_str());
  };
  if (!buf)
    refuse("buff is NULL");
  else if (bytes == 0)
    refuse("size is 0");
  else if (flags & ~(Communicator::kWinSymmetric | Communicator::kWinStrictOrdering))
    refuse(fmt::format("winFlags {:#x} has bits other than NCCL_WIN_COLL_SYMMETRIC and NCCL_WIN_STRICT_ORDERING",
                       flags));
  else if (!mapped(buf, bytes))
    refuse(fmt::format("[{}, +{}) is not mapped memory", buf, bytes));
  else if (transport::regionOf(buf, bytes).fd < 0)
    refuse(fmt::format("[{}, +{}) is not ncclMemAlloc memory (a window's buffer comes from ncclMemAlloc, as NCCL "
                       "asks of windows: peers map it)",
                       buf, bytes));
  if (mine.ok) mine.win = describe(buf, bytes);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!signals_) {
      signals_ = transport::allocShareable(transport::SignalBlock::bytes(n));
      consumed_.assign(n, 0);
    }
  }
  mine.signals = describe(signals_, transport::SignalBlock::bytes(n));
  {
    // Ordered with this rank's collectives and alone on the bootstrap (as split).
    CollQueue::Hold hold(*c_.collQueue_);
    std::lock_guard<std::mutex> lock(c_.conns_->setupMutex());
    c_.bs_->setPhase(fmt::format("window registration {}", mine.seq));
    c_.bs_->allGather(notes.data(), sizeof(WindowNote));
    c_.bs_->setPhase("the communicator's calls");
  }
  for (int q = 0; q < n; ++q) {
    const WindowNote& w = notes[q];
    if (w.magic != kWindowMagic || w.seq != mine.seq)
      fail(StatusCode::kInvalidUsage,
           "rank {}: ncclCommWindowRegister {}: rank {} is not in the same registration (every rank registers the "
           "same windows in the same order)",
           me, mine.seq, q);
  }
  // Every rank fails when one rank's arguments are wrong: that rank names its own, the others the first rank's.
  auto why = [&](int q) { return std::string(notes[q].why, strnlen(notes[q].why, sizeof notes[q].why)); };
  if (!mine.ok)
    fail(StatusCode::kInvalidArgument, "rank {}: ncclCommWindowRegister {}: {}", me, mine.seq, why(me));
  for (int q = 0; q < n; ++q)
    if (!notes[q].ok)
      fail(StatusCode::kInvalidUsage, "rank {}: ncclCommWindowRegister {}: rank {}'s arguments: {}", me, mine.seq, q,
           why(q));
  auto win = std::make_unique<Window>();
  win->id = mine.seq;
  win->user = buf;
  win->bytes = bytes;
  win->flags = flags;
  win->peerBase.assign(n, nullptr);
  win->peerBytes.assign(n, 0);
  win->unmapped.assign(n, "");
  win->holds.resize(n);
  std::lock_guard<std::mutex> lk(mu_);
  if (peerSignals_.empty()) mapSignals(notes);
  for (int q = 0; q < n; ++q) {
    win->peerBytes[q] = notes[q].win.bytes;
    win->peerBase[q] = mapPart(q, notes[q].win, "buffer", &win->holds[q], &win->unmapped[q]);
  }
  int mappedPeers = 0;
  for (int q = 0; q < n; ++q) mappedPeers += win->peerBase[q] != nullptr;
  TC_INFO(log::kReg, "ncclCommWindowRegister: rank {} window {} {} ({} bytes, flags {:#x}): {} of {} ranks' buffers "
          "mapped here", me, win->id, buf, bytes, flags, mappedPeers, n);
  Window* h = win.release();
  windows_.insert(h);
  return h;
}

void OneSided::mapSignals(const std::vector<WindowNote>& notes) {
  const int n = c_.nRanks();
  peerSignals_.assign(n, nullptr);
  signalsUnmapped_.assign(n, "");
  signalHolds_.assign(n, nullptr);
  for (int q = 0; q < n; ++q)
    peerSignals_[q] = mapPart(q, notes[q].signals, "signal block", &signalHolds_[q], &signalsUnmapped_[q]);
}

// Rank q's part `r` here: its address in this process, else its memfd mapped where rank q is a process of this host;
// nullptr (and why) elsewhere.
char* OneSided::mapPart(int q, const NoteRegion& r, const char* what,
                        std::shared_ptr<const transport::PeerMapping>* hold, std::string* why) const {
  const int me = c_.rank();
  const auto& peers = c_.peers();
  if (q == me || peers[q].pidHash == peers[me].pidHash) return reinterpret_cast<char*>(r.addr);
  if (peers[q].hostHash != peers[me].hostHash || peers[q].shmDev != peers[me].shmDev) {
    *why = fmt::format("rank {} is on another host", q);
    return nullptr;
  }
  if (!c_.opts_.cfg.mapPeerBuffers) {
    *why = "TOPOCOLL_MAP_PEER_BUFFERS=0";
    return nullptr;
  }
  transport::RegionRef ref;
  ref.owner = r.owner;
  ref.serial = r.serial;
  ref.base = r.base;
  ref.len = r.len;
  ref.fd = static_cast<int32_t>(r.fd);
  auto m = transport::mapPeerRegion(peers[q].pid, ref, r.addr, r.bytes);
  if (!m) {
    *why = fmt::format("rank {}'s {} cannot be mapped here (pid {}: see the P2P INFO line)", q, what, peers[q].pid);
    return nullptr;
  }
  *hold = m;
  return m->at(ref, r.addr);
}

void OneSided::deregisterWindow(Window* w) {
  std::lock_guard<std::mutex> lk(mu_);
  Window* win = live(w, "ncclCommWindowDeregister");
  windows_.erase(win);
  delete win;
}

void* OneSided::userPtr(Window* w) const {
  std::lock_guard<std::mutex> lk(mu_);
  return live(w, "ncclWinGetUserPtr")->user;
}

Window* OneSided::live(Window* w, const char* what) const {
  if (!w) fail(StatusCode::kInvalidArgument, "rank {}: {}: the window is NULL", c_.rank(), what);
  if (!windows_.count(w))
    fail(StatusCode::kInvalidArgument,
         "rank {}: {}: window {} is not a window of this communicator (deregistered already, or another "
         "communicator's)",
         c_.rank(), what, static_cast<void*>(w));
  return w;
}

char* OneSided::peerSignals(int peer, const char* what) const {
  const int me = c_.rank();
  if (peer < 0 || peer >= c_.nRanks())
    fail(StatusCode::kInvalidArgument, "rank {}: {}: peer {} is out of range [0, {})", me, what, peer, c_.nRanks());
  if (peerSignals_.empty())
    fail(StatusCode::kInvalidUsage,
         "rank {}: {}: no window registered yet: signals go to the ranks' signal blocks, which the first "
         "ncclCommWindowRegister sets up",
         me, what);
  if (!peerSignals_[peer])
    fail(StatusCode::kInvalidUsage, "rank {}: {} to rank {}: {}: one-sided operations here reach ranks of this host",
         me, what, peer, signalsUnmapped_[peer]);
  return peerSignals_[peer];
}

void OneSided::putSignal(const void* local, size_t bytes, int peer, Window* w, size_t offset) {
  const int me = c_.rank();
  char* signals = nullptr;
  char* dst = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    Window* win = live(w, "ncclPutSignal");
    signals = peerSignals(peer, "ncclPutSignal");
    if (bytes > 0 && !local) fail(StatusCode::kInvalidArgument, "rank {}: ncclPutSignal: localbuff is NULL", me);
    if (offset > win->peerBytes[peer] || bytes > win->peerBytes[peer] - offset)
      fail(StatusCode::kInvalidArgument,
           "rank {}: ncclPutSignal: {} bytes at offset {} of window {} leave rank {}'s buffer ({} bytes)", me, bytes,
           offset, win->id, peer, win->peerBytes[peer]);
    // NCCL's rule: the source lies in a symmetric window of this communicator.
    bool inWindow = bytes == 0;
    const auto p = reinterpret_cast<uintptr_t>(local);
    for (const Window* x : windows_)
      if ((x->flags & Communicator::kWinSymmetric) && p >= reinterpret_cast<uintptr_t>(x->user) &&
          bytes <= x->bytes && p - reinterpret_cast<uintptr_t>(x->user) <= x->bytes - bytes)
        inWindow = true;
    if (!inWindow)
      fail(StatusCode::kInvalidArgument,
           "rank {}: ncclPutSignal: localbuff {} (+{}) is not inside a window registered with "
           "NCCL_WIN_COLL_SYMMETRIC",
           me, local, bytes);
    if (!win->peerBase[peer])
      fail(StatusCode::kInvalidUsage, "rank {}: ncclPutSignal to rank {}: {}: one-sided puts here reach ranks of "
           "this host", me, peer, win->unmapped[peer]);
    dst = win->peerBase[peer] + offset;
  }
  if (c_.aborted()) fail(StatusCode::kAborted, "rank {}: ncclPutSignal: the communicator was aborted", me);
  if (bytes) std::memmove(dst, local, bytes);
  transport::SignalBlock(signals).raise(me);
}

void OneSided::signal(int peer) {
  char* signals = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    signals = peerSignals(peer, "ncclSignal");
  }
  if (c_.aborted()) fail(StatusCode::kAborted, "rank {}: ncclSignal: the communicator was aborted", c_.rank());
  transport::SignalBlock(signals).raise(c_.rank());
}

void OneSided::waitSignals(const std::vector<Communicator::SignalWait>& waits) {
  const int me = c_.rank(), n = c_.nRanks();
  char* mine = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!signals_)
      fail(StatusCode::kInvalidUsage,
           "rank {}: ncclWaitSignal: no window registered yet: signals arrive in the signal block the first "
           "ncclCommWindowRegister sets up",
           me);
    for (size_t i = 0; i < waits.size(); ++i) {
      if (waits[i].peer < 0 || waits[i].peer >= n)
        fail(StatusCode::kInvalidArgument, "rank {}: ncclWaitSignal: descriptor {} has peer {}, out of range [0, {})",
             me, i, waits[i].peer, n);
      if (waits[i].count <= 0)
        fail(StatusCode::kInvalidArgument, "rank {}: ncclWaitSignal: descriptor {} has opCnt {} (at least 1)", me, i,
             waits[i].count);
    }
    mine = static_cast<char*>(signals_);
  }
  std::lock_guard<std::mutex> waiting(waitMu_);
  transport::SignalBlock block(mine);
  const auto& peers = c_.peers();
  const auto start = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(c_.opts_.cfg.timeoutSec);
  for (const Communicator::SignalWait& w : waits) {
    const uint64_t target = consumed_[w.peer] + static_cast<uint64_t>(w.count);
    for (int spins = 0; block.count(w.peer) < target; ++spins) {
      if (spins < 2000) {
        if (spins > 100) std::this_thread::yield();
        continue;
      }
      const uint32_t epoch = block.epoch();
      if (block.count(w.peer) >= target) break;
      block.sleep(epoch, std::chrono::milliseconds(20));
      if (c_.aborted()) fail(StatusCode::kAborted, "rank {}: ncclWaitSignal: the communicator was aborted", me);
      if (std::string why; c_.jobFailure(&why))
        fail(StatusCode::kRemoteError, "rank {}: ncclWaitSignal: the job failed: {}", me, why);
      const uint64_t got = block.count(w.peer) - consumed_[w.peer];
      if (peers[w.peer].pidHash != peers[me].pidHash && peers[w.peer].hostHash == peers[me].hostHash &&
          block.count(w.peer) < target && transport::os::processEnded(peers[w.peer].pid))
        fail(StatusCode::kRemoteError, "rank {}: ncclWaitSignal: rank {} (pid {}) ended after {} of the {} signals "
             "awaited", me, w.peer, peers[w.peer].pid, got, w.count);
      if (std::chrono::steady_clock::now() - start > limit)
        fail(StatusCode::kTimeout,
             "rank {}: ncclWaitSignal: rank {} sent {} of the {} signals awaited within TOPOCOLL_TIMEOUT={} s", me,
             w.peer, got, w.count, c_.opts_.cfg.timeoutSec);
    }
    consumed_[w.peer] = target;
  }
}

}  // namespace detail
}  // namespace topocoll::runtime

namespace topocoll::runtime {
detail::OneSided& CommImpl::oneSided() {
  std::lock_guard<std::mutex> lk(oneSidedMu_);
  if (!oneSided_) oneSided_ = std::make_unique<detail::OneSided>(*this);
  return *oneSided_;
}
}  // namespace topocoll::runtime
