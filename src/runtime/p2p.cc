// The communicator's point-to-point part (p2p.h; NCCL 2.30.7 src/collectives.cc ncclSend/ncclRecv, the p2p split of
// src/enqueue.cc addP2pToPlan): our own code. The groups they join are groups.cc's.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <thread>

#include "coll_task.h"
#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/cuda.h"
#include "topocoll/log.h"
#include "topocoll/memcopy.h"
#include "topocoll/progress/connections.h"
#include "topocoll/progress/engine.h"
#include "comm_impl.h"
#include "groups.h"
#include "p2p.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "topocoll/transport/oneshot.h"
#include "topocoll/transport/peer_memory.h"
#include "topocoll/transport/primitives.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace topocoll::runtime {

using detail::Op;
using transport::Side;
using transport::Transfer;

namespace {
// A finished operation needs no engine (which may be gone with its communicator).
bool finishedOrThrow(const Op& op) {
  if (!op.finished()) return false;
  if (op.state.load(std::memory_order_acquire) == Op::kFailed) throw Error(op.code, op.error);
  return true;
}
}  // namespace

void Request::wait() {
  if (task_) {
    if (!task_->finished() && detail::groupHolds(task_))
      fail(StatusCode::kInvalidUsage, "wait() on a request of an open group: call groupEnd() first (it waits for it)");
    return task_->wait();
  }
  if (!op_) fail(StatusCode::kInvalidUsage, "wait() on an empty request");
  if (finishedOrThrow(*op_)) return;
  if (!op_->engine)
    fail(StatusCode::kInvalidUsage, "wait() on a request of an open group: call groupEnd() first (it waits for it)");
  op_->engine->wait(*op_);
}

bool Request::test() {
  if (task_) {
    if (!task_->finished()) return false;
    task_->wait();
    return true;
  }
  if (!op_) fail(StatusCode::kInvalidUsage, "test() on an empty request");
  if (finishedOrThrow(*op_)) return true;
  if (!op_->engine) return false;
  return op_->engine->test(*op_);
}

detail::PointToPoint::PointToPoint(const Context& ctx)
    : ctx_(ctx), rank_(ctx.rank), nRanks_(ctx.nRanks), conns_(*ctx.conns), engine_(*ctx.engine) {
  for (auto& idx : index_) idx = std::make_unique<std::atomic<uint32_t>[]>(nRanks_);
}

detail::PointToPoint::~PointToPoint() = default;

void detail::PointToPoint::dropPool() {
  std::lock_guard<PoolLock> lock(poolMu_);
  pool_.reset();
}

std::shared_ptr<Op> detail::PointToPoint::makeOp(bool send, void* buf, size_t count, DataType type, int peer,
                                         int64_t index) {
  const char* what = send ? "send" : "recv";
  if (aborted()) fail(StatusCode::kAborted, "rank {}: {} on an aborted communicator", rank_, what);
  if (peer < 0 || peer >= nRanks_)
    fail(StatusCode::kInvalidArgument, "rank {}: {} {} rank {}: no such rank (the communicator has {})", rank_, what,
         send ? "to" : "from", peer, nRanks_);
  if (!isValid(type))
    fail(StatusCode::kInvalidArgument, "rank {}: {}: unknown data type {}", rank_, what, static_cast<int>(type));
  size_t elem = sizeOf(type);
  if (count > std::numeric_limits<size_t>::max() / elem)
    fail(StatusCode::kInvalidArgument, "rank {}: {} of {} elements of {}: the size overflows", rank_, what, count,
         to_string(type));
  if (!buf && count > 0)
    fail(StatusCode::kInvalidArgument, "rank {}: {} of {} x {}: null buffer", rank_, what, count, to_string(type));
  std::shared_ptr<Op> op;
  {
    std::lock_guard<PoolLock> lock(poolMu_);
    if (!pool_) pool_ = std::make_unique<detail::OpPool>();
    op = pool_->take();
  }
  op->send = send;
  op->peer = peer;
  op->buf = buf;
  op->count = count;
  op->dtype = type;
  op->bytes = count * elem;
  op->opts.device = count > 0 && deviceBuffer(buf);
  op->opts.stream = op->opts.device ? deviceStream() : nullptr;
  if (peer == rank_) {
    op->parts.clear();
    return op;
  }
  const uint32_t place = index == kNextIndex ? index_[send][peer].fetch_add(1, std::memory_order_relaxed) + 1
                                             : static_cast<uint32_t>(index);
  op->shotSig = progress::shotSignature(place, type);
  const Config& cfg = conns_.config();
  if (conns_.connected(peer)) {
    chooseShot(*op);
    if (op->shot) return op;  // the mailbox path: no parts
  }
  op->opts.llThreshold = static_cast<size_t>(cfg.p2pLlThreshold);
  op->opts.chunkBytes = conns_.p2pChunk();
  op->opts.netChunkBytes = static_cast<size_t>(cfg.netChunkSize);
  op->opts.singleCopyMin = cfg.p2pSingleCopy;
  op->opts.streamStores = op->bytes >= kStreamCopyMin;  // a large message does not stay in the cache anyway
  const std::vector<transport::Connector*>& conns = conns_.p2pConnectors(peer, send ? Side::kSend : Side::kRecv);
  int nParts = transport::p2pParts(op->bytes, conns_.p2pChunk(), ctx_.nHosts, conns_.p2pMinChannels(),
                                   static_cast<int>(conns.size()));
  for (int i = 0; i < nParts; ++i) {
    transport::MessageDesc d;
    d.bytes = op->bytes;
    d.count = count;
    d.dtype = type;
    d.nParts = nParts;
    d.part = i;
    size_t b, e;
    transport::p2pPartBounds(nParts, i, op->bytes, &b, &e);
    d.partOffset = b;
    d.partBytes = e - b;
    if (!send) op->partDescs.push_back(d);
    Transfer::Dir dir = send ? Transfer::Dir::kSend : Transfer::Dir::kRecv;
    if (nParts == 1) {
      detail::OpPool::setPart(*op, *conns[i], dir, static_cast<char*>(buf) + b, d, op->opts, !send);
    } else {
      if (i == 0) op->parts.clear();
      op->parts.push_back(std::make_unique<Transfer>(*conns[i], dir, static_cast<char*>(buf) + b, d, op->opts, !send));
    }
  }
  if (!send) op->partConns = conns;
  return op;
}

void detail::PointToPoint::recycleOps(std::pair<CommImpl*, std::shared_ptr<Op>>* ops, size_t n) {
  std::lock_guard<PoolLock> lock(poolMu_);
  for (size_t i = 0; i < n; ++i) {
    std::shared_ptr<Op>& op = ops[i].second;
    if (!op || !op->finished()) continue;
    if (pool_) pool_->give(std::move(op));
    op.reset();
  }
}

Request detail::PointToPoint::issue(std::shared_ptr<Op> op, bool blocking) {
  if (detail::inGroup()) {
    detail::addOpToGroup(ctx_.owner, op);
    return Request(op);
  }
  conns_.ensureConnected(op->peer);
  if (aborted()) fail(StatusCode::kAborted, "rank {}: the communicator was aborted", rank_);
  chooseShot(*op);
  engine_.post(op, !blocking);  // a blocking caller drives its own operation
  if (blocking) engine_.wait(*op);
  return Request(std::move(op));
}

Request detail::PointToPoint::isend(const void* buf, size_t count, DataType type, int peer) {
  return issue(makeOp(true, const_cast<void*>(buf), count, type, peer), false);
}

Request detail::PointToPoint::irecv(void* buf, size_t count, DataType type, int peer) {
  return issue(makeOp(false, buf, count, type, peer), false);
}

// The latency path of a blocking send or recv outside a group: one part, nothing else queued.
bool detail::PointToPoint::tryInline(bool send, void* buf, size_t count, DataType type, int peer) {
  if (detail::inGroup() || peer == rank_ || peer < 0 || peer >= nRanks_ || !isValid(type) || aborted() ||
      count > (size_t{1} << 40) || (!buf && count > 0) || !conns_.connected(peer) ||
      (count > 0 && deviceBuffer(buf)))
    return false;  // the general path says what is wrong, or connects (or copies device memory)
  size_t bytes = count * sizeOf(type);
  const auto& conns = conns_.p2pConnectors(peer, send ? Side::kSend : Side::kRecv);
  const int nParts = transport::p2pParts(bytes, conns_.p2pChunk(), ctx_.nHosts, conns_.p2pMinChannels(),
                                         static_cast<int>(conns.size()));
  // Several parts: inline only over NET (the caller moves the sockets itself; docs/transport.md, NET).
  if (nParts != 1)
    for (int i = 0; i < nParts; ++i)
      if (i >= static_cast<int>(conns.size()) || !conns[i]->conn.drive) return false;
  transport::MessageDesc d;
  d.bytes = d.partBytes = bytes;
  d.count = count;
  d.dtype = type;
  transport::TransferOptions o;
  o.llThreshold = static_cast<size_t>(conns_.config().p2pLlThreshold);
  o.chunkBytes = conns_.p2pChunk();
  o.netChunkBytes = static_cast<size_t>(conns_.config().netChunkSize);
  o.singleCopyMin = conns_.config().p2pSingleCopy;
  o.streamStores = d.bytes >= kStreamCopyMin;
  uint32_t index = index_[send][peer].fetch_add(1, std::memory_order_relaxed) + 1;  // counted whatever happens
  bool ran = nParts == 1 ? engine_.runInline(conns, send, buf, d, o) : engine_.runInlineParts(conns, send, buf, d, o, nParts);
  if (!ran) issue(makeOp(send, buf, count, type, peer, index), true);
  return true;
}

void detail::PointToPoint::chooseShot(Op& op) {
  transport::Connector* c = op.peer == rank_ ? nullptr : mailboxOf(op.send, op.peer, op.bytes);
  if (!c) return;
  op.shot = c;
  if (op.opts.device && !op.devBuf) {  // the mailbox is host memory: a device buffer's bytes are staged
    op.devBuf = op.buf;
    op.buf = op.stage;
    if (op.send) progress::deviceCopy(op.stage, op.devBuf, op.bytes, op.opts.stream);
  }
}

bool detail::PointToPoint::deviceBuffer(const void* buf) const {
  if (ctx_.cudaDev < 0 || !buf) return false;
  return cuda::locate(buf).kind == cuda::MemoryKind::kDevice;
}

void* detail::PointToPoint::deviceStream() {
  std::call_once(devStreamOnce_, [this] {
#ifdef TOPOCOLL_HAVE_CUDA
    TC_CUDA(cudaSetDevice(ctx_.cudaDev));
    // A blocking stream: what the caller queued on the legacy default stream (a cudaMemcpy from pageable memory
    // still in flight when it returned) is done before our copies read or write its buffers.
    cudaStream_t s = nullptr;
    TC_CUDA(cudaStreamCreate(&s));
    devStream_ = std::shared_ptr<void>(s, [](void* p) { (void)cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
#endif
  });
  return devStream_.get();
}

transport::Connector* detail::PointToPoint::shotLane(bool send, const void* buf, size_t count, DataType type, int peer,
                                             size_t* bytes) {
  if (peer == rank_ || peer < 0 || peer >= nRanks_ || !isValid(type) || aborted() ||
      count > transport::kShotMaxBytes || (!buf && count > 0) || !conns_.connected(peer))
    return nullptr;
  *bytes = count * sizeOf(type);
  if (count > 0 && deviceBuffer(buf)) return nullptr;
  return mailboxOf(send, peer, *bytes);
}

transport::Connector* detail::PointToPoint::mailboxOf(bool send, int peer, size_t bytes) {
  const int max = conns_.config().p2pMailboxMax;  // 0: never (not even empty messages)
  if (max <= 0 || bytes > static_cast<size_t>(max)) return nullptr;
  transport::Connector* c = conns_.p2pConnectors(peer, send ? Side::kSend : Side::kRecv)[0];
  return c->conn.p2pShot.area ? c : nullptr;
}

namespace {
// A mailbox op of this thread, reused call after call (tryShot, runGroupShots): it never gets parts, a handle or a
// device buffer (shotLane refuses those), is never posted to the engine, and nothing holds it once its call returns,
// so only the fields the mailbox path reads are set again (Op::recycle resets them all, and a fresh Op builds and
// frees its vectors and strings: measurably slower at 8 B).
void loadShotOp(Op& op, bool send, void* buf, size_t count, size_t bytes, DataType type, int peer,
                transport::Connector* lane, uint32_t index) {
  op.engine = nullptr;  // runShotGroup sets it; unread on this path, but never left naming another communicator's
  op.state.store(Op::kPending, std::memory_order_relaxed);
  op.code = StatusCode::kOk;
  if (!op.error.empty()) op.error.clear();
  op.shotState = 0;
  op.shotPeerPost = 0;
  op.shotPair = nullptr;
  op.send = send;
  op.peer = peer;
  op.buf = buf;
  op.count = count;
  op.bytes = bytes;
  op.dtype = type;
  op.shot = lane;
  op.shotSig = progress::shotSignature(index, type);
}
}  // namespace

// The latency path of a small blocking send or recv outside groups: the message goes through the connection's
// point-to-point mailbox in this thread (a send returns once the receiver posted or took it), on this thread's
// reused op, never queued.
bool detail::PointToPoint::tryShot(bool send, void* buf, size_t count, DataType type, int peer) {
  size_t bytes = 0;
  transport::Connector* c = detail::inGroup() ? nullptr : shotLane(send, buf, count, type, peer, &bytes);
  if (!c) return false;
  uint32_t index = index_[send][peer].fetch_add(1, std::memory_order_relaxed) + 1;
  thread_local Op tOp;
  loadShotOp(tOp, send, buf, count, bytes, type, peer, c, index);
  if (!engine_.runShotInline(tOp)) issue(makeOp(send, buf, count, type, peer, index), true);
  return true;
}

bool detail::PointToPoint::recordGroupShot(bool send, void* buf, size_t count, DataType type, int peer,
                                   detail::GroupShot* out) {
  if (!detail::groupTakesShot(ctx_.owner)) return false;
  size_t bytes = 0;
  transport::Connector* c = shotLane(send, buf, count, type, peer, &bytes);
  if (!c) return false;
  out->comm = ctx_.owner;
  out->conn = c;
  out->buf = buf;
  out->count = count;
  out->bytes = bytes;
  out->type = type;
  out->peer = peer;
  out->send = send;
  out->index = index_[send][peer].fetch_add(1, std::memory_order_relaxed) + 1;
  return true;
}

bool detail::PointToPoint::runGroupShots(const detail::GroupShot* shots, size_t n) {
  if (aborted()) return false;  // the op path fails them
  // This thread's ops, reset for each group (the group runs to its end here: nothing keeps them).
  thread_local std::deque<Op> tOps;
  thread_local std::vector<Op*> tPtrs;
  while (tOps.size() < n) tOps.emplace_back();
  tPtrs.clear();
  for (size_t i = 0; i < n; ++i) {
    const detail::GroupShot& s = shots[i];
    loadShotOp(tOps[i], s.send, s.buf, s.count, s.bytes, s.type, s.peer, s.conn, s.index);
    tPtrs.push_back(&tOps[i]);
  }
  if (!engine_.runShotGroup(tPtrs)) return false;
  engine_.throwFailures(tPtrs);  // all finished
  return true;
}

std::shared_ptr<Op> detail::PointToPoint::groupShotOp(const detail::GroupShot& s) {
  return makeOp(s.send, s.buf, s.count, s.type, s.peer, s.index);
}

void detail::PointToPoint::send(const void* buf, size_t count, DataType type, int peer) {
  if (detail::inGroup()) {  // no Request to make: the op goes straight into the group (no reference count touched)
    detail::GroupShot s;
    if (recordGroupShot(true, const_cast<void*>(buf), count, type, peer, &s)) return detail::addShotToGroup(s);
    detail::addOpToGroup(ctx_.owner, makeOp(true, const_cast<void*>(buf), count, type, peer));
    return;
  }
  if (tryShot(true, const_cast<void*>(buf), count, type, peer)) return;
  if (tryInline(true, const_cast<void*>(buf), count, type, peer)) return;
  issue(makeOp(true, const_cast<void*>(buf), count, type, peer), true);
}

void detail::PointToPoint::recv(void* buf, size_t count, DataType type, int peer) {
  if (detail::inGroup()) {
    detail::GroupShot s;
    if (recordGroupShot(false, buf, count, type, peer, &s)) return detail::addShotToGroup(s);
    detail::addOpToGroup(ctx_.owner, makeOp(false, buf, count, type, peer));
    return;
  }
  if (tryShot(false, buf, count, type, peer)) return;
  if (tryInline(false, buf, count, type, peer)) return;
  issue(makeOp(false, buf, count, type, peer), true);
}

bool detail::PointToPoint::messageWaiting(int peer) {
  const std::vector<transport::Connector*>& conns = conns_.p2pConnectors(peer, Side::kRecv);
  if (conns.empty()) return false;
  transport::ConnInfo& ci = conns[0]->conn;
  transport::ShotMessage m;
  if (ci.p2pShot.area && transport::ShotBox(ci.p2pShot, ci.wake).peek(&m)) return true;
  if (ci.drive) {  // NET: move the connection in this thread (its proxy leaves an idle one alone), then look
    ci.drive->take();
    ci.drive->drive();
    const bool arrived = ci.drive->stepArrived();
    ci.drive->release();
    return arrived;
  }
  return transport::messageArrived(ci);
}

int detail::PointToPoint::recvAny(void* buf, size_t count, DataType type, const int* peers, int nPeers) {
  if (detail::inGroup())
    fail(StatusCode::kInvalidUsage, "rank {}: a receive from any rank cannot join a group (it blocks until one sends)",
         rank_);
  if (nPeers <= 0 || !peers)
    fail(StatusCode::kInvalidArgument, "rank {}: a receive from any rank needs at least one rank to receive from",
         rank_);
  for (int i = 0; i < nPeers; ++i)
    if (peers[i] < 0 || peers[i] >= nRanks_ || peers[i] == rank_)
      fail(StatusCode::kInvalidArgument, "rank {}: receive from any rank: rank {} (peers[{}]) {}", rank_, peers[i], i,
           peers[i] == rank_ ? "is this rank" : fmt::format("is not in the communicator ({} ranks)", nRanks_));
  transport::Context& ctx = conns_.context();
  const auto start = std::chrono::steady_clock::now();
  auto nextJobCheck = start;
  int idle = 0;
  while (true) {
    if (aborted()) fail(StatusCode::kAborted, "rank {}: receive from any rank on an aborted communicator", rank_);
    int gone = 0;
    for (int k = 0; k < nPeers; ++k) {
      const int at = (anyNext_ + k) % nPeers, p = peers[at];
      // A peer that left counts as gone unless the message it sent before it did is still here to take.
      if (ctx.peerGone && (*ctx.peerGone)[p].load(std::memory_order_acquire) &&
          !(conns_.connected(p) && messageWaiting(p))) {
        ++gone;
        continue;
      }
      // A peer that sends to this rank for the first time connects first: its connect records wait here.
      if (!conns_.connected(p)) {
        if (!transport::peerConnecting(ctx, p, 0)) continue;
        conns_.ensureConnected(p);
      }
      if (!messageWaiting(p)) continue;
      anyNext_ = (at + 1) % nPeers;
      recv(buf, count, type, p);
      return p;
    }
    const auto now = std::chrono::steady_clock::now();
    if (gone == nPeers) {
      const int p = peers[0];
      fail(StatusCode::kRemoteError, "rank {}: receive from any rank: every rank it could come from is gone ({})",
           rank_, transport::peerGoneWhy(p, (*ctx.peerGone)[p].load()));
    }
    if (now - start > ctx.timeout)
      fail(StatusCode::kTimeout, "rank {}: receive from any rank: none of {} rank(s) sent within {} ms", rank_, nPeers,
           ctx.timeout.count());
    if (now >= nextJobCheck) {  // another rank's failure of the job, as the bootstrap heard it
      std::string why;
      if (ctx.bootstrap && ctx.bootstrap->failedElsewhere(&why))
        fail(StatusCode::kRemoteError, "rank {}: receive from any rank: {}", rank_, why);
      nextJobCheck = now + std::chrono::milliseconds(100);
    }
    // Spin a little (a message often comes at once), then sleep, up to 100 us between looks.
    if (++idle < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(std::min(100, idle - 63)));
  }
}

void detail::PointToPoint::post(std::vector<std::shared_ptr<Op>>& ops, bool wakeWorker) {
  if (aborted()) fail(StatusCode::kAborted, "rank {}: the communicator was aborted", rank_);
  engine_.post(ops, wakeWorker);
}

bool detail::PointToPoint::runGroupInline(const std::vector<Op*>& ops) {
  int shots = 0;
  for (Op* op : ops) {
    if (op->peer != rank_ && !conns_.connected(op->peer)) return false;
    shots += op->shot != nullptr;
  }
  if (aborted()) return false;
  if (shots == static_cast<int>(ops.size())) return engine_.runShotGroup(ops);  // small messages only
  return shots == 0 && (engine_.runInlineGroup(ops) || engine_.runInlineGroupParts(ops));
}

void detail::PointToPoint::waitOps(const std::vector<Op*>& ops) { engine_.waitAll(ops); }

void* memAlloc(size_t bytes) { return transport::allocShareable(bytes); }

void memFree(void* ptr, size_t) { transport::freeShareable(ptr); }

}  // namespace topocoll::runtime
