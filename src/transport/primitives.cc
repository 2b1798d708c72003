// The protocols over one connector (NCCL 2.30.7 src/device/prims_ll.h and prims_simple.h in spirit: LL lines with
// inline flags, Simple slots published by tail and released by head; our own code for CPU threads).
#include "topocoll/transport/primitives.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "fifo.h"
#include "os.h"
#include "test_hooks.h"
#include "topocoll/cuda.h"
#include "topocoll/memcopy.h"
#include "topocoll/transport/peer_memory.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace topocoll::transport {

void (*test_hooks::recvStartBetweenLooks)() = nullptr;
bool (*test_hooks::netHoldAck)(uint64_t, uint64_t) = nullptr;
bool (*test_hooks::netHoldSendDone)(uint64_t) = nullptr;
uint64_t (*test_hooks::netEngineAck)(uint64_t) = nullptr;
void (*test_hooks::callerPollSlept)() = nullptr;

namespace {

constexpr size_t kHeaderWords = 6;  // LL: opBytes lo, opBytes hi, partBytes, dtype | nParts | mode, call lo, call hi
constexpr size_t kCopyPiece = 4 << 20;  // single copies advance in pieces: abort and other transfers get turns
constexpr size_t kLLBlockWords = 512;   // LL receivers wait for 4 KiB of lines at a time
constexpr size_t kNetInline = 8 << 10;  // NET chunks up to this size go in the slot, with their header

size_t divUp(size_t a, size_t b) { return (a + b - 1) / b; }

inline std::atomic<uint64_t>* llSlot(const ConnInfo& ci, uint64_t step) {
  return reinterpret_cast<std::atomic<uint64_t>*>(ci.buffs[kProtoLL] + (step % kSteps) * ci.slotBytes[kProtoLL]);
}
inline SlotHeader* simpleSlot(const ConnInfo& ci, uint64_t step) {
  return reinterpret_cast<SlotHeader*>(ci.buffs[kProtoSimple] + (step % kSteps) * ci.slotBytes[kProtoSimple]);
}
inline uint64_t llWord(uint64_t step, uint32_t data) { return (static_cast<uint64_t>(step + 1) << 32) | data; }
inline bool llValid(uint64_t word, uint64_t step) { return (word >> 32) == static_cast<uint32_t>(step + 1); }

// Single copies within a process hand a user buffer to the peer's thread through counters in a shared block that
// each side maps at its own address (the owner's mapping and the importer's). The release/acquire pairs on those
// counters order the copy for the hardware, but ThreadSanitizer keys synchronisation by virtual address and sees
// two unrelated atomics. These tell it about the same hand-over, keyed by the user buffer's address (the one
// address both sides know): release before publishing a buffer (or its copy) to the peer, acquire after seeing the
// peer's counter. Only direct connections (the peer is a thread of this process); nothing outside a TSan build.
inline void handOver(const ConnInfo& ci, const void* buf) {
#if defined(__SANITIZE_THREAD__)
  if ((ci.flags & kConnDirect) && buf) __tsan_release(const_cast<void*>(buf));
#else
  (void)ci, (void)buf;
#endif
}
inline void takeOver(const ConnInfo& ci, const void* buf) {
#if defined(__SANITIZE_THREAD__)
  if ((ci.flags & kConnDirect) && buf) __tsan_acquire(const_cast<void*>(buf));
#else
  (void)ci, (void)buf;
#endif
}

}  // namespace

int p2pParts(size_t bytes, size_t chunkBytes, int nNodes, int nChannelsMin, int nChannelsMax) {
  if (bytes == 0) return 1;
  size_t minPart = nNodes > 1 ? chunkBytes / 2 : chunkBytes / 8;
  size_t maxPart = nNodes > 1 ? chunkBytes : chunkBytes * 32;
  minPart = std::max<size_t>(minPart, 1);
  int n = static_cast<int>(std::min<size_t>(nChannelsMin, divUp(bytes, minPart)));
  n = std::max(n, 1);
  size_t part = std::max(minPart, divUp(bytes, n));
  while (part > maxPart && n <= nChannelsMax / 2) {
    n *= 2;
    part = divUp(bytes, n);
  }
  return n;
}

void p2pPartBounds(int nParts, int part, size_t bytes, size_t* begin, size_t* end) {
  size_t partBytes = divUp(divUp(bytes, nParts), 4 << 10) * (4 << 10);
  *begin = std::min(static_cast<size_t>(part) * partBytes, bytes);
  *end = std::min(static_cast<size_t>(part + 1) * partBytes, bytes);
}

Transfer::Transfer(Connector& c, Dir dir, void* buf, const MessageDesc& msg, const TransferOptions& opts, bool gated)
    : c_(c),
      ci_(c.conn),
      dir_(dir),
      buf_(static_cast<char*>(buf)),
      msg_(msg),
      opts_(opts),
      state_(gated ? State::kGated : State::kStart) {}

void Transfer::open(bool drain) {
  if (state_ != State::kGated) return;
  drain_ = drain;
  mismatch_ = drain;
  state_ = State::kStart;
}

const char* Transfer::modeName() const {
  switch (mode_) {
    case kModeLL: return "LL";
    case kModeSimple: return "Simple";
    case kModeDevice: return "Simple/device";
    case kModeRead: return "single copy (read)";
    case kModeWriteAsk:
    case kModeWriteDone: return "single copy (write)";
  }
  return "-";
}

std::string Transfer::callMismatch(uint64_t theirs) const {
  auto words = [&](uint64_t call) {
    if (!call) return std::string("a point-to-point operation");
    return msg_.describeCall ? msg_.describeCall(call) : fmt::format("call {:#x}", call);
  };
  return fmt::format("the ranks' calls differ: this rank called {} while rank {} called {}", words(msg_.call), c_.peer,
                     words(theirs));
}

std::string Transfer::what() const {
  return fmt::format("{} {} rank {} on channel {}", dir_ == Dir::kSend ? "send to" : "recv from",
                     c_.via.empty() ? "" : "(" + c_.via + ")", c_.peer, c_.channel);
}

void Transfer::publish(std::atomic<uint64_t>* counter, uint64_t v) {
  counter->store(v, std::memory_order_release);
  ci_.wake->ring();
}

void Transfer::stopAwaiting() {
  if (!awaiting_) return;
  awaiting_ = false;
  --ci_.awaiting;
}

void Transfer::failWith(StatusCode code, std::string why, bool breaks) {
  if (finished()) return;
  stopAwaiting();
  if (offered()) withdraw();  // the user may free the buffer once we return
  if (breaks && state_ != State::kGated && state_ != State::kStart) c_.markBroken(why);
  errorCode_ = code;
  error_ = std::move(why);
  state_ = State::kFailed;
}

void Transfer::fail(StatusCode code, const std::string& why) {
  if (posted_ && ci_.rdv) ci_.rdv->step.store(0, std::memory_order_release);  // the proxy must not write here any more
  // A receiver still waiting for its first step, or a gated part, leaves the connector in step; anything later
  // does not (the peer may have published or consumed part of it).
  bool started = !(state_ == State::kGated || (state_ == State::kStart));
  // NET: the proxy sends straight from the user's buffer and lands chunks straight in it, possibly in the middle of
  // a chunk now: it lets go of the connection before the user gets the buffer back.
  if ((ci_.flags & kConnNet) && ci_.drive && (started || posted_) && !finished())
    ci_.drive->abandon(fmt::format("{}: {}", what(), why));
  if (dir_ == Dir::kRecv && state_ == State::kStart) withdrawPost();
  failWith(code, why, started);
}

bool Transfer::progress() {
  if (finished() || state_ == State::kGated) return false;
  // A broken connection fails what has not started; what is under way gets a last look (its ack may have arrived
  // just before the network connection closed). So does a receive that has not started when the peer closed the
  // connection between messages: a NET sender whose data landed in our posted buffer is acknowledged as it lands,
  // and may finish, destroy its communicator and close before we look again; every step that arrived before the
  // close is published, so the look finds the whole message or fails below. Any other break (an op left the
  // connection out of step) fails at once: the steps there may belong to an op that failed.
  bool startBroken = state_ == State::kStart && c_.broken() && !(dir_ == Dir::kRecv && c_.closedByPeer());
  bool moved = !startBroken && (dir_ == Dir::kSend ? sendProgress() : recvProgress());
  if (!finished() && c_.broken()) {
    if (posted_ && ci_.rdv) ci_.rdv->step.store(0, std::memory_order_release);
    if (dir_ == Dir::kRecv && state_ == State::kStart) withdrawPost();
    failWith(StatusCode::kRemoteError, fmt::format("{}: the connection is broken ({})", what(), c_.brokenReason()),
             false);
    return true;
  }
  return moved;
}

// A single copy reaches into the peer's user buffer, which the peer may give up on (timeout, abort, a failed part)
// and return to its user: the active side (write-mode sender, read-mode receiver) announces each piece in `copying`
// and copies only if the passive side's offer (rdv.step) still stands; the passive side withdraws the offer and
// waits for `copying` to clear. Sequentially consistent on both sides (store, then load the other word): one of
// them sees the other. Two atomics per piece of up to kCopyPiece bytes.
bool Transfer::copyData(void* dst, const void* src, size_t n) {
  if (!opts_.device && mode_ != kModeDevice) {
    std::memcpy(dst, src, n);
    return true;
  }
#ifdef TOPOCOLL_HAVE_CUDA
  try {
    if (ci_.cudaDev >= 0) TC_CUDA(cudaSetDevice(ci_.cudaDev));
    auto stream = static_cast<cudaStream_t>(opts_.stream);
    TC_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
    TC_CUDA(cudaStreamSynchronize(stream));
    return true;
  } catch (const Error& e) {
    failWith(StatusCode::kSystemError, fmt::format("{}: {}", what(), e.what()), true);
    return false;
  }
#else
  failWith(StatusCode::kInvalidUsage, fmt::format("{}: device copy in a build without CUDA", what()), true);
  return false;
#endif
}

bool Transfer::copySingle(char* local, const char* remote, size_t n, bool pull) {
  Rendezvous& r = *ci_.rdv;
  const uint64_t tag = firstStep_ + 1;
  r.copying.store(tag, std::memory_order_seq_cst);
  if (r.step.load(std::memory_order_seq_cst) != tag) {
    r.copying.store(0, std::memory_order_release);
    withdrawn_ = true;
    return false;
  }
  // The passive side's buffer mapped here (peer_memory.h), checked on a copy of what it wrote.
  std::shared_ptr<const PeerMapping> mapped;
  if (ci_.flags & kConnMapPeer) {
    const RegionRef region = r.region;
    mapped = mapPeerRegion(ci_.peerPid, region, reinterpret_cast<uint64_t>(remote), n);
    if (mapped) remote = mapped->at(region, reinterpret_cast<uint64_t>(remote));
  }
  if (mapped && opts_.streamStores) {
    if (pull) copyStreaming(local, remote, n);
    else copyStreaming(const_cast<char*>(remote), local, n);
  } else if ((ci_.flags & kConnDirect) || mapped) {
    if (pull) std::memcpy(local, remote, n);
    else std::memcpy(const_cast<char*>(remote), local, n);
  } else {
    copyErr_ = static_cast<uint32_t>(os::copyRemote(ci_.peerPid, pull, local, reinterpret_cast<uint64_t>(remote), n));
  }
  handOver(ci_, reinterpret_cast<const void*>(addr_));  // for a passive side that withdraws now
  r.copying.store(0, std::memory_order_release);
  return copyErr_ == 0;
}

bool Transfer::offered() const {
  if (finished() || stepsDone_ == 0) return false;
  return (dir_ == Dir::kRecv && mode_ == kModeWriteAsk && stepsDone_ == 1) || (dir_ == Dir::kSend && mode_ == kModeRead);
}

void Transfer::withdraw() {
  Rendezvous& r = *ci_.rdv;
  const uint64_t tag = firstStep_ + 1;
  r.step.store(0, std::memory_order_seq_cst);
  // A piece under way ends soon (at most kCopyPiece bytes); a peer process that died copies nothing more.
  while (r.copying.load(std::memory_order_seq_cst) == tag) {
    if (!(ci_.flags & kConnDirect) && ci_.peerPid > 0 && os::processEnded(ci_.peerPid)) break;
    std::this_thread::yield();
  }
  takeOver(ci_, buf_);
}

// ---------------------------------------------------------------------------------------------------------------
// Sender

bool Transfer::sendProgress() {
  bool did = false;
  if (state_ == State::kStart) {
    firstStep_ = ci_.step;
    if (refusedEarlier()) return true;
    size_t n = msg_.partBytes;
    if (opts_.device && (ci_.flags & kConnNet)) {
      failWith(StatusCode::kInvalidUsage,
               fmt::format("{}: device buffers do not go over NET yet (GPU ranks on different hosts)", what()), false);
      return true;
    }
    bool ll = !opts_.device && ci_.buffs[kProtoLL] != nullptr && n <= opts_.llThreshold;
    const bool direct = ci_.flags & kConnDirect;
    const bool pull = direct || (ci_.canPull && ci_.canPull->load(std::memory_order_acquire) == 1);
    const bool push = direct || (ci_.canPush && ci_.canPush->load(std::memory_order_acquire) == 1);
    bool single = !opts_.device && n > 0 && opts_.singleCopyMin >= 0 && n >= static_cast<size_t>(opts_.singleCopyMin) &&
                  !(ci_.flags & kConnNet) && (pull || push);
    if (ll) {
      mode_ = kModeLL;
      llWords_ = divUp(n, 4);
      size_t perSlot = ci_.slotBytes[kProtoLL] / 8;
      lastStep_ = firstStep_ + std::max<size_t>(1, divUp(kHeaderWords + llWords_, perSlot));
    } else if (single) {
      // Read mode pulls, write mode pushes; with both possible, odd parts go the other way, so that the two
      // processes copy at once.
      bool wantPull = opts_.single == TransferOptions::Single::kAsConnector ? (ci_.flags & kConnRead) != 0
                                                                            : opts_.single == TransferOptions::Single::kPull;
      if (pull && push && msg_.nParts > 1 && (msg_.part & 1)) wantPull = !wantPull;
      if (wantPull && !pull) wantPull = false;
      if (!wantPull && !push) wantPull = true;
      mode_ = wantPull ? kModeRead : kModeWriteAsk;
    } else {
      mode_ = opts_.device && ci_.devBuff ? kModeDevice : kModeSimple;
    }
    state_ = State::kRun;
    did = true;
  }
  if (state_ == State::kRun) {
    switch (mode_) {
      case kModeLL: did |= sendLL(); break;
      case kModeSimple:
      case kModeDevice: did |= sendSimple(); break;
      default: did |= sendSingle(); break;
    }
  }
  if (state_ == State::kAck && (mode_ == kModeLL || mode_ == kModeSimple || mode_ == kModeDevice) &&
      !(ci_.flags & kConnNet) &&
      (opts_.eager || receiverTakesIt())) {
    ci_.step = lastStep_;  // the data is in the receiver's FIFO: the head counter alone keeps the slots safe
    state_ = State::kDone;
    return true;
  }
  // NET: the receiver's acknowledgement says the data arrived, but our buffer stays the network's until our proxy's
  // requests for it completed (the head): a plugin may still be in its send call, or read the buffer after the
  // peer has the bytes.
  if (state_ == State::kAck && ci_.ack->load(std::memory_order_acquire) >= lastStep_ &&
      (!(ci_.flags & kConnNet) || ci_.head->load(std::memory_order_acquire) >= lastStep_)) {
    ci_.step = std::max(ci_.step, lastStep_);  // NET: advanced already when the last step went out
    stopAwaiting();
    if (mode_ == kModeRead) takeOver(ci_, buf_);  // the receiver has copied out of our buffer
    const StatusLine& st = statusOf(ci_.status, firstStep_ + 1);
    const bool refused = st.step.load(std::memory_order_acquire) == firstStep_ + 1;
    if (refused) ci_.statusSeen = std::max(ci_.statusSeen, firstStep_ + 1);  // reported here, not by the next send
    if (copyErr_) {
      failWith(StatusCode::kSystemError,
               fmt::format("{}: single copy into the receiver's buffer failed: {}", what(),
                           std::strerror(static_cast<int>(copyErr_))),
               false);
    } else if (refused) {
      if (st.code == kMismatch && st.call != msg_.call) {
        mismatch_ = true;
        failWith(StatusCode::kInvalidUsage, callMismatch(st.call), false);
      } else if (st.code == kMismatch) {
        mismatch_ = true;
        failWith(StatusCode::kInvalidUsage,
                 fmt::format("size or type mismatch: this send has {} x {} ({} bytes), rank {} posted a receive of {} "
                             "x {} ({} bytes)",
                             msg_.count, to_string(msg_.dtype), msg_.bytes, c_.peer, st.count,
                             to_string(static_cast<DataType>(st.dtype)), st.bytes),
                 false);
      } else {
        failWith(StatusCode::kSystemError,
                 fmt::format("{}: the receiver could not copy the data (errno {}: {})", what(), st.code >> 8,
                             std::strerror(static_cast<int>(st.code >> 8))),
                 false);
      }
    } else {
      state_ = State::kDone;
    }
    did = true;
  }
  return did;
}

// An eager send completed before its receiver looked at it; a receiver that refused it (size or type mismatch, a
// failed copy) left its verdict in the status line: the next send over the connector reports it, without starting
// (the connection stays in step).
bool Transfer::refusedEarlier() {
  // Ops still waiting for their own verdicts (NET sends streaming) read them themselves.
  if (!ci_.status || ci_.awaiting) return false;
  const StatusLine* found = nullptr;
  uint64_t s = 0;
  for (uint64_t i = 0; i < kStatusRing; ++i) {  // the latest verdict not reported yet
    uint64_t si = ci_.status[i].step.load(std::memory_order_acquire);
    if (si > ci_.statusSeen && si <= firstStep_ && si > s) {
      s = si;
      found = &ci_.status[i];
    }
  }
  if (!found) return false;
  const StatusLine& st = *found;
  ci_.statusSeen = s;
  auto dtype = static_cast<DataType>(st.dtype);
  if (st.code == kMismatch && st.call && msg_.call && st.call != msg_.call) {
    failWith(StatusCode::kInvalidUsage,
             fmt::format("{}: rank {} refused an earlier message over this connection: {}", what(), c_.peer,
                         callMismatch(st.call)),
             false);
    return true;
  }
  failWith(StatusCode::kInvalidUsage,
           fmt::format("{}: rank {} refused an earlier message over this connection: size or type mismatch (it "
                       "expected {} x {}, {} bytes)",
                       what(), c_.peer, st.count, isValid(dtype) ? to_string(dtype) : "?", st.bytes),
           false);
  return true;
}

namespace {
uint64_t postShape(const MessageDesc& m, bool drain) {
  return static_cast<uint64_t>(m.dtype) | static_cast<uint64_t>(m.nParts) << 8 | static_cast<uint64_t>(drain) << 40;
}
}  // namespace

// Whether the receiver posted a receive for this message's first step that takes it as it is (seqlock read).
bool Transfer::receiverTakesIt() const {
  if (!ci_.post) return false;
  const RecvPost& p = *ci_.post;
  const uint64_t s = p.step.load(std::memory_order_acquire);
  if (s != firstStep_ + 1) return false;
  const uint64_t bytes = p.bytes.load(std::memory_order_relaxed);
  const uint64_t partBytes = p.partBytes.load(std::memory_order_relaxed);
  const uint64_t shape = p.shape.load(std::memory_order_relaxed);
  const uint64_t call = p.call.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (p.step.load(std::memory_order_relaxed) != s) return false;
  return bytes == msg_.bytes && partBytes == msg_.partBytes && shape == postShape(msg_, false) && call == msg_.call;
}

void Transfer::postReceive() {
  postedRecv_ = true;
  if (!ci_.post) return;
  RecvPost& p = *ci_.post;
  p.step.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  p.bytes.store(msg_.bytes, std::memory_order_relaxed);
  p.partBytes.store(msg_.partBytes, std::memory_order_relaxed);
  p.shape.store(postShape(msg_, drain_), std::memory_order_relaxed);
  p.call.store(msg_.call, std::memory_order_relaxed);
  p.step.store(firstStep_ + 1, std::memory_order_release);
}

// A receive that gives up before the sender's header arrived takes its post back: the next receive on this
// connector (same first step) may expect another message.
void Transfer::withdrawPost() {
  if (!postedRecv_ || !ci_.post) return;
  uint64_t mine = firstStep_ + 1;
  ci_.post->step.compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
}

// Lines are built in a local block and copied into the slot in one go: word-by-word stores into lines the
// receiver is polling would bounce each cache line between the cores. Each 8-byte word still carries its own flag
// (8-byte aligned stores are never torn), so the order in which the copy lands does not matter.
bool Transfer::sendLL() {
  const size_t perSlot = ci_.slotBytes[kProtoLL] / 8;
  const size_t total = kHeaderWords + llWords_;
  bool did = false;
  uint64_t head = ci_.head->load(std::memory_order_acquire);
  uint64_t block[kLLBlockWords];
  while (true) {
    uint64_t step = firstStep_ + done_ / perSlot;
    if (step >= head + kSteps) return did;
    char* slot = reinterpret_cast<char*>(llSlot(ci_, step));
    size_t end = std::min(total, (done_ / perSlot + 1) * perSlot);
    while (done_ < end) {
      size_t first = done_, n = std::min(end - done_, kLLBlockWords);
      const uint64_t flag = static_cast<uint64_t>(step + 1) << 32;
      size_t k = 0;
      for (; k < n && done_ < kHeaderWords; ++k, ++done_) {
        uint32_t v = done_ == 0   ? static_cast<uint32_t>(msg_.bytes)
                     : done_ == 1 ? static_cast<uint32_t>(msg_.bytes >> 32)
                     : done_ == 2 ? static_cast<uint32_t>(msg_.partBytes)
                     : done_ == 3 ? static_cast<uint32_t>(msg_.dtype) | static_cast<uint32_t>(msg_.nParts) << 8 |
                                        uint32_t{kModeLL} << 24
                     : done_ == 4 ? static_cast<uint32_t>(msg_.call)
                                  : static_cast<uint32_t>(msg_.call >> 32);
        block[k] = flag | v;
      }
      // Whole data words (a loop the compiler vectorises), then the last partial one.
      const size_t fullWords = msg_.partBytes / 4 + kHeaderWords;
      const char* src = buf_ + (done_ - kHeaderWords) * 4;
      size_t full = std::min(n - k, done_ < fullWords ? fullWords - done_ : 0);
      for (size_t j = 0; j < full; ++j) {
        uint32_t v;
        std::memcpy(&v, src + 4 * j, 4);
        block[k + j] = flag | v;
      }
      k += full;
      done_ += full;
      for (; k < n; ++k, ++done_) {
        uint32_t v = 0;
        size_t off = (done_ - kHeaderWords) * 4;
        std::memcpy(&v, buf_ + off, msg_.partBytes - off);
        block[k] = flag | v;
      }
      std::memcpy(slot + (first % perSlot) * 8, block, n * 8);
    }
    did = true;
    ci_.wake->ring();
    if (done_ == total) {
      state_ = State::kAck;
      return true;
    }
  }
}

bool Transfer::sendSimple() {
  // NET moves the data between the users' buffers (the proxies), so its chunks need not fit a slot.
  const bool dev = mode_ == kModeDevice;
  const size_t chunk = (ci_.flags & kConnNet) ? opts_.netChunkBytes
                       : dev ? ci_.devSlotBytes  // one copy per slot: each step costs a synchronisation
                             : std::min(opts_.chunkBytes, ci_.slotBytes[kProtoSimple] - sizeof(SlotHeader));
  bool did = false;
  uint64_t head = ci_.head->load(std::memory_order_acquire);
  while (true) {
    uint64_t step = firstStep_ + stepsDone_;
    if (step >= head + kSteps) return did;
    size_t n = std::min(chunk, msg_.partBytes - done_);
    SlotHeader* h = simpleSlot(ci_, step);
    // NET: the proxy sends the data from our buffer (it stays ours until the receiver's ack); else it goes in the slot.
    // Small NET chunks travel in the slot, with their header in one message: fewer system calls than zero copy.
    const bool net = (ci_.flags & kConnNet) && n > kNetInline;
    if (n && !net) {
      void* dst = dev ? ci_.devBuff + (step % kSteps) * ci_.devSlotBytes : static_cast<void*>(h + 1);
      if (!copyData(dst, buf_ + done_, n)) return true;
    }
    h->inlined = !net;
    h->opBytes = msg_.bytes;
    h->partBytes = msg_.partBytes;
    h->chunkBytes = n;
    h->addr = net ? reinterpret_cast<uint64_t>(buf_ + done_) : 0;
    h->offset = done_;
    h->partFirst = firstStep_;
    h->landed = 0;
    h->dtype = static_cast<uint8_t>(msg_.dtype);
    h->nParts = static_cast<uint8_t>(msg_.nParts);
    h->call = msg_.call;
    h->mode = mode_;
    done_ += n;
    h->last = done_ == msg_.partBytes;
    h->error = 0;
    ++stepsDone_;
    publish(ci_.tail, step + 1);
    did = true;
    if (h->last) {
      lastStep_ = step + 1;
      state_ = State::kAck;
      if ((ci_.flags & kConnNet) && ci_.ack != ci_.head) {
        // Every step is out; the ack and the verdict come later. The connector's next op may open now
        // (streaming(): Engine::runInlineGroup), its steps after ours.
        ci_.step = lastStep_;
        ++ci_.awaiting;
        awaiting_ = true;
      }
      return true;
    }
  }
}

// Read mode: one step carrying our address; write mode: ask, wait for the receiver's address, copy, say done.
bool Transfer::sendSingle() {
  uint64_t head = ci_.head->load(std::memory_order_acquire);
  if (stepsDone_ == 0) {
    if (firstStep_ >= head + kSteps) return false;
    SlotHeader* h = simpleSlot(ci_, firstStep_);
    *h = SlotHeader{};
    h->opBytes = msg_.bytes;
    h->partBytes = msg_.partBytes;
    h->addr = mode_ == kModeRead ? reinterpret_cast<uint64_t>(buf_) : 0;
    h->dtype = static_cast<uint8_t>(msg_.dtype);
    h->nParts = static_cast<uint8_t>(msg_.nParts);
    h->call = msg_.call;
    h->mode = mode_;
    h->last = mode_ == kModeRead;
    stepsDone_ = 1;
    if (mode_ == kModeRead) {  // the offer of our buffer, for withdraw()
      ci_.rdv->addr = reinterpret_cast<uint64_t>(buf_);
      ci_.rdv->region = (ci_.flags & kConnMapPeer) ? regionOf(buf_, msg_.partBytes) : RegionRef{};
      ci_.rdv->step.store(firstStep_ + 1, std::memory_order_release);
      handOver(ci_, buf_);
    }
    publish(ci_.tail, firstStep_ + 1);
    if (mode_ == kModeRead) {
      lastStep_ = firstStep_ + 1;
      state_ = State::kAck;
    }
    return true;
  }
  if (stepsDone_ == 1) {  // write mode: the receiver's answer
    if (head < firstStep_ + 1) return false;
    if (statusOf(ci_.status, firstStep_ + 1).step.load(std::memory_order_acquire) == firstStep_ + 1) {
      lastStep_ = firstStep_ + 1;  // it refused (mismatch): the ack check reports it
      state_ = State::kAck;
      return true;
    }
    if (ci_.rdv->step.load(std::memory_order_acquire) != firstStep_ + 1) {
      failWith(StatusCode::kRemoteError, fmt::format("{}: the receiver's address is missing", what()), true);
      return true;
    }
    addr_ = ci_.rdv->addr;
    takeOver(ci_, reinterpret_cast<const void*>(addr_));  // the receiver's buffer is ours to write
    stepsDone_ = 2;
  }
  if (done_ < msg_.partBytes && copyErr_ == 0) {
    size_t n = std::min(kCopyPiece, msg_.partBytes - done_);
    if (copySingle(buf_ + done_, reinterpret_cast<const char*>(addr_ + done_), n, false)) done_ += n;
    if (withdrawn_) {
      failWith(StatusCode::kRemoteError, fmt::format("{}: the receiver gave up on this transfer", what()), true);
      return true;
    }
    if (done_ < msg_.partBytes && copyErr_ == 0) return true;  // the next piece on the next turn
  }
  SlotHeader* h = simpleSlot(ci_, firstStep_ + 1);
  *h = SlotHeader{};
  h->opBytes = msg_.bytes;
  h->partBytes = msg_.partBytes;
  h->chunkBytes = done_;
  h->mode = kModeWriteDone;
  h->last = 1;
  h->error = static_cast<uint16_t>(copyErr_);
  lastStep_ = firstStep_ + 2;
  handOver(ci_, reinterpret_cast<const void*>(addr_));  // what we copied into the receiver's buffer
  publish(ci_.tail, lastStep_);
  state_ = State::kAck;
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// Receiver

bool Transfer::recvProgress() {
  bool did = false;
  if (state_ == State::kStart) {
    did = recvStart();
    // A single copy waits for the next turn: the other parts of the message open first (they may copy the other way).
    if (state_ != State::kRun || mode_ == kModeRead) return did;
  }
  switch (mode_) {
    case kModeLL: return recvLL() || did;
    case kModeSimple:
    case kModeDevice: return recvSimple() || did;
    default: return recvSingle() || did;
  }
}

bool Transfer::recvStart() {
  if (opts_.device && (ci_.flags & kConnNet)) {  // the proxy would receive into device memory with recv()
    failWith(StatusCode::kInvalidUsage,
             fmt::format("{}: device buffers do not go over NET yet (GPU ranks on different hosts)", what()), false);
    return true;
  }
  firstStep_ = ci_.step;
  if (!postedRecv_) postReceive();
  // Publishing the rendezvous counts as progress: a NET connection that already read the sender's header waits for
  // it with no socket to watch, and its mover (the proxy, rung below, or a waiting caller that holds the connection
  // and moves it after every pass that did something) must look again. Reported as nothing, a caller blocked in
  // poll() for its slice: 20 ms a message when the header came before the receive (a tree AllReduce in place
  // between two hosts, 512 KiB: 18.7 ms against 0.9).
  bool did = false;
  if ((ci_.flags & kConnNet) && ci_.rdv && !posted_) {
    // Our buffer for the proxy: chunks whose header matches what we expect land there directly.
    Rendezvous& r = *ci_.rdv;
    r.addr = drain_ ? 0 : reinterpret_cast<uint64_t>(buf_);
    r.opBytes = msg_.bytes;
    r.partBytes = msg_.partBytes;
    r.dtype = static_cast<uint32_t>(msg_.dtype);
    r.nParts = static_cast<uint32_t>(msg_.nParts);
    r.call = msg_.call;
    r.step.store(firstStep_ + 1, std::memory_order_release);
    ci_.wake->ring();
    posted_ = true;
    did = true;
  }
  // The tail first, then the LL lines. An LL message does not move the tail, and a send matching our post (or an
  // eager one) completes as soon as its lines are written, so the sender's next message may be Simple and move the
  // tail past our step. Lines first and tail second, a receiver could miss lines written just after its look, see
  // that later tail and take the old header in our step's Simple slot for the message (size mismatch, one message
  // behind the sender: the cross-host collectives test's rare reduce_scatter-types failure). A tail past our step read first
  // (acquire) makes the sender's earlier lines visible to the look that follows.
  const uint64_t tail = ci_.tail->load(std::memory_order_acquire);
  if (test_hooks::recvStartBetweenLooks) test_hooks::recvStartBetweenLooks();
  bool found = false;
  if (ci_.buffs[kProtoLL]) {
    std::atomic<uint64_t>* w = llSlot(ci_, firstStep_);
    uint64_t h[kHeaderWords];
    bool valid = true;
    for (size_t i = 0; i < kHeaderWords && valid; ++i) valid = llValid(h[i] = w[i].load(std::memory_order_relaxed), firstStep_);
    if (valid && ((h[3] >> 24) & 0xff) == kModeLL) {
      peerHdr_ = SlotHeader{};
      peerHdr_.opBytes = static_cast<uint32_t>(h[0]) | static_cast<uint64_t>(static_cast<uint32_t>(h[1])) << 32;
      peerHdr_.partBytes = static_cast<uint32_t>(h[2]);
      peerHdr_.dtype = static_cast<uint8_t>(h[3] & 0xff);
      peerHdr_.nParts = static_cast<uint8_t>((h[3] >> 8) & 0xff);
      peerHdr_.mode = static_cast<uint8_t>((h[3] >> 24) & 0xff);
      peerHdr_.call = static_cast<uint32_t>(h[4]) | static_cast<uint64_t>(static_cast<uint32_t>(h[5])) << 32;
      mode_ = kModeLL;
      llWords_ = divUp(peerHdr_.partBytes, 4);
      lastStep_ = firstStep_ + std::max<size_t>(1, divUp(kHeaderWords + llWords_, ci_.slotBytes[kProtoLL] / 8));
      done_ = kHeaderWords;
      found = true;
    }
  }
  if (!found) {
    if (tail <= firstStep_) return did;
    peerHdr_ = *simpleSlot(ci_, firstStep_);
    mode_ = peerHdr_.mode;
    if ((mode_ != kModeSimple && mode_ != kModeRead && mode_ != kModeWriteAsk && mode_ != kModeDevice) ||
        (mode_ == kModeDevice && !ci_.devBuff)) {
      failWith(StatusCode::kRemoteError,
               fmt::format("{}: the first step has mode {} (corrupt connection)", what(), peerHdr_.mode), true);
      return true;
    }
  }
  if (!drain_ && (peerHdr_.opBytes != msg_.bytes || peerHdr_.dtype != static_cast<uint8_t>(msg_.dtype) ||
                  peerHdr_.nParts != static_cast<uint8_t>(msg_.nParts) || peerHdr_.partBytes != msg_.partBytes ||
                  peerHdr_.call != msg_.call)) {
    mismatch_ = drain_ = true;
  }
  if (opts_.device && mode_ != kModeSimple && mode_ != kModeDevice && !drain_) {
    // The sender's data is in host memory for LL or a single copy, which never write device memory: refused.
    hostOnly_ = mismatch_ = drain_ = true;
  }
  state_ = State::kRun;
  return true;
}

void Transfer::finish() {
  if (mismatch_ || copyErr_) {
    StatusLine& st = statusOf(ci_.status, firstStep_ + 1);
    st.bytes = msg_.bytes;
    st.count = msg_.count;
    st.dtype = static_cast<uint32_t>(msg_.dtype);
    st.call = msg_.call;
    st.code = mismatch_ ? kMismatch : (kCopyFailed | copyErr_ << 8);
    st.step.store(firstStep_ + 1, std::memory_order_release);
  }
  ci_.step = lastStep_;
  if (posted_) ci_.rdv->step.store(0, std::memory_order_release);
  if (ci_.flags & kConnNet) {
    ci_.head->store(lastStep_, std::memory_order_release);
    publish(ci_.ack, lastStep_);
  } else {
    publish(ci_.head, lastStep_);  // shared memory: the head is the ack
  }
  if (hostOnly_) {
    failWith(StatusCode::kInvalidUsage,
             fmt::format("{}: this receive's buffer is device memory but rank {} sent from host memory ({}): use device "
                         "buffers on both sides, or host buffers on both",
                         what(), c_.peer, modeName()),
             false);
  } else if (mismatch_ && peerHdr_.call != msg_.call) {
    failWith(StatusCode::kInvalidUsage, callMismatch(peerHdr_.call), false);
  } else if (mismatch_) {
    size_t elem = sizeOf(static_cast<DataType>(peerHdr_.dtype & 0xff));
    failWith(StatusCode::kInvalidUsage,
             fmt::format("size or type mismatch: this receive expects {} x {} ({} bytes), rank {} sent {} x {} ({} bytes)",
                         msg_.count, to_string(msg_.dtype), msg_.bytes, c_.peer,
                         elem && isValid(static_cast<DataType>(peerHdr_.dtype)) ? peerHdr_.opBytes / elem : 0,
                         isValid(static_cast<DataType>(peerHdr_.dtype)) ? to_string(static_cast<DataType>(peerHdr_.dtype))
                                                                         : "?",
                         peerHdr_.opBytes),
             false);
  } else if (copyErr_) {
    failWith(StatusCode::kSystemError,
             fmt::format("{}: single copy failed: {}", what(), std::strerror(static_cast<int>(copyErr_))), false);
  } else {
    state_ = State::kDone;
  }
}

// The receiver copies a block out at once (parallel cache misses) and checks every word's flag in its copy; a
// block that is not complete yet is copied again later.
bool Transfer::recvLL() {
  const size_t perSlot = ci_.slotBytes[kProtoLL] / 8;
  const size_t total = kHeaderWords + llWords_;
  bool did = false;
  uint64_t block[kLLBlockWords];
  while (done_ < total) {
    uint64_t step = firstStep_ + done_ / perSlot;
    const char* slot = reinterpret_cast<const char*>(llSlot(ci_, step));
    size_t stepEnd = std::min(total, (done_ / perSlot + 1) * perSlot);
    size_t n = std::min(stepEnd - done_, kLLBlockWords);
    // The last word first (one line polled while the sender writes), then the whole block.
    if (!llValid(llSlot(ci_, step)[(done_ + n - 1) % perSlot].load(std::memory_order_acquire), step)) return did;
    std::memcpy(block, slot + (done_ % perSlot) * 8, n * 8);
    for (size_t k = 0; k < n; ++k)
      if (!llValid(block[k], step)) return did;
    if (!drain_) {
      size_t k = done_ < kHeaderWords ? std::min(n, kHeaderWords - done_) : 0;
      const size_t fullWords = msg_.partBytes / 4 + kHeaderWords;
      char* dst = buf_ + (done_ + k - kHeaderWords) * 4;
      size_t full = std::min(n - k, done_ + k < fullWords ? fullWords - done_ - k : 0);
      for (size_t j = 0; j < full; ++j) {
        uint32_t data = static_cast<uint32_t>(block[k + j]);
        std::memcpy(dst + 4 * j, &data, 4);
      }
      k += full;
      for (; k < n; ++k) {  // the last partial word
        size_t off = (done_ + k - kHeaderWords) * 4;
        uint32_t data = static_cast<uint32_t>(block[k]);
        std::memcpy(buf_ + off, &data, msg_.partBytes - off);
      }
    }
    done_ += n;
    did = true;
    if (done_ == stepEnd && done_ < total) publish(ci_.head, step + 1);
  }
  finish();
  return true;
}

bool Transfer::recvSimple() {
  const size_t capacity = ci_.slotBytes[kProtoSimple] - sizeof(SlotHeader);
  bool did = false;
  while (true) {
    uint64_t step = firstStep_ + stepsDone_;
    if (ci_.tail->load(std::memory_order_acquire) <= step) return did;
    const SlotHeader* h = simpleSlot(ci_, step);
    size_t n = h->chunkBytes;
    const bool dev = mode_ == kModeDevice;
    if (h->mode != mode_ || (n > (dev ? ci_.devSlotBytes : capacity) && !h->landed && !drain_) ||
        (!drain_ && done_ + n > msg_.partBytes)) {
      failWith(StatusCode::kRemoteError, fmt::format("{}: step {} is corrupt", what(), step), true);
      return true;
    }
    if (!drain_ && n && !h->landed) {
      const void* src = dev ? ci_.devBuff + (step % kSteps) * ci_.devSlotBytes : static_cast<const void*>(h + 1);
      if (!copyData(buf_ + done_, src, n)) return true;
    }
    done_ += n;
    ++stepsDone_;
    did = true;
    if (h->last) {
      if (!drain_ && done_ != msg_.partBytes) mismatch_ = drain_ = true;
      lastStep_ = step + 1;
      finish();
      return true;
    }
    publish(ci_.head, step + 1);
  }
}

bool Transfer::recvSingle() {
  if (stepsDone_ == 0) {
    if (mode_ == kModeRead) {
      if (addr_ == 0) takeOver(ci_, reinterpret_cast<const void*>(peerHdr_.addr));  // the sender's buffer, to read
      addr_ = peerHdr_.addr;
      if (!drain_) {
        while (done_ < msg_.partBytes && copyErr_ == 0) {
          size_t n = std::min(kCopyPiece, msg_.partBytes - done_);
          if (copySingle(buf_ + done_, reinterpret_cast<const char*>(addr_ + done_), n, true)) done_ += n;
          if (withdrawn_) {
            failWith(StatusCode::kRemoteError, fmt::format("{}: the sender gave up on this transfer", what()), true);
            return true;
          }
          if (done_ < msg_.partBytes && copyErr_ == 0) return true;  // the next piece on the next turn
        }
      }
      lastStep_ = firstStep_ + 1;
      handOver(ci_, reinterpret_cast<const void*>(addr_));  // we are done reading the sender's buffer
      finish();
      return true;
    }
    // Write mode: our address, unless we refuse.
    if (drain_) {
      lastStep_ = firstStep_ + 1;
      finish();
      return true;
    }
    ci_.rdv->addr = reinterpret_cast<uint64_t>(buf_);
    ci_.rdv->region = (ci_.flags & kConnMapPeer) ? regionOf(buf_, msg_.partBytes) : RegionRef{};
    handOver(ci_, buf_);  // our buffer, for the sender to write
    ci_.rdv->step.store(firstStep_ + 1, std::memory_order_release);
    stepsDone_ = 1;
    publish(ci_.head, firstStep_ + 1);
    return true;
  }
  if (ci_.tail->load(std::memory_order_acquire) <= firstStep_ + 1) return false;
  const SlotHeader* h = simpleSlot(ci_, firstStep_ + 1);
  if (h->mode != kModeWriteDone) {
    failWith(StatusCode::kRemoteError, fmt::format("{}: expected the end of a single copy", what()), true);
    return true;
  }
  copyErr_ = h->error;
  done_ = h->chunkBytes;
  takeOver(ci_, buf_);  // the sender's copy into our buffer
  lastStep_ = firstStep_ + 2;
  finish();
  return true;
}

bool messageArrived(const ConnInfo& ci) {
  const uint64_t step = ci.step;
  if (ci.tail && ci.tail->load(std::memory_order_acquire) > step) return true;
  return ci.buffs[kProtoLL] && llValid(llSlot(ci, step)[0].load(std::memory_order_acquire), step);
}

}  // namespace topocoll::transport
