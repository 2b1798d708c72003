#include "topocoll/progress/engine.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <span>
#include <utility>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "topocoll/cuda.h"
#include "topocoll/log.h"
#include "topocoll/transport/oneshot.h"
#include "../transport/test_hooks.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace topocoll::progress {

using Clock = std::chrono::steady_clock;
using transport::Transfer;

void Op::recycle() {
  engine = nullptr;
  seq = 0;
  send = false;
  peer = -1;
  buf = nullptr;
  count = bytes = 0;
  dtype = DataType::kUint8;
  if (parts.size() > 1) parts.resize(1);  // drains a mismatch added; the first transfer is rebuilt in place
  partConns.clear();
  partDescs.clear();
  opts = transport::TransferOptions();
  unfinished = 0;
  validated = false;
  ordered = true;
  keep.reset();
  waitingSince = {};
  shot = nullptr;
  shotSig = 0;
  shotState = 0;
  shotPeerPost = 0;
  shotPair = nullptr;
  devBuf = nullptr;
  state.store(kPending, std::memory_order_relaxed);
  draining.store(false, std::memory_order_relaxed);
  code = StatusCode::kOk;
  error.clear();
}

void deviceCopy(void* dst, const void* src, size_t n, void* stream) {
#ifdef TOPOCOLL_HAVE_CUDA
  auto st = static_cast<cudaStream_t>(stream);
  TC_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, st));
  TC_CUDA(cudaStreamSynchronize(st));
#else
  (void)dst, (void)src, (void)n, (void)stream;
  fail(StatusCode::kInvalidUsage, "device copy in a build without CUDA");
#endif
}

std::shared_ptr<Op> OpPool::take() {
  while (!free_.empty()) {
    std::shared_ptr<Op> op = std::move(free_.back());
    free_.pop_back();
    // Nobody else may still look at it: an engine that completed it drops its reference just after.
    if (op.use_count() == 1) {
      op->recycle();
      return op;
    }
  }
  ++created_;
  return std::make_shared<Op>();
}

void OpPool::give(std::shared_ptr<Op>&& op) {
  if (op && op->finished() && op.use_count() == 1 && free_.size() < capacity_) free_.push_back(std::move(op));
  op.reset();
}

Transfer& OpPool::setPart(Op& op, transport::Connector& c, Transfer::Dir dir, void* buf,
                          const transport::MessageDesc& msg, const transport::TransferOptions& opts, bool gated) {
  if (op.parts.empty()) {
    op.parts.push_back(std::make_unique<Transfer>(c, dir, buf, msg, opts, gated));
  } else {
    Transfer* t = op.parts[0].get();  // a finished transfer: rebuilt where it lies
    std::destroy_at(t);
    std::construct_at(t, c, dir, buf, msg, opts, gated);
  }
  return *op.parts[0];
}

Engine::Engine(const Options& opts) : opts_(opts), recvChain_(std::max(1, opts.nRanks)) {
  for (auto& q : shotQ_) q.resize(std::max(1, opts.nRanks));
  shotGaveUp_.assign(std::max(1, opts.nRanks), 0);
  postFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // without it (-1) NET waits sleep on the doorbell
  worker_ = std::thread([this] { runWorker(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(workerMu_);
    stop_.store(true);
  }
  workerCv_.notify_all();
  opts_.doorbell->ring();
  worker_.join();
  // Ops nobody waited for: fail them so that their handles do not wait forever.
  std::lock_guard<std::mutex> drive(driveMu_);
  takeIncoming();
  std::vector<Op*> pending(selfSends_.begin(), selfSends_.end());
  pending.insert(pending.end(), selfRecvs_.begin(), selfRecvs_.end());
  for (auto& side : shotQ_)
    for (auto& q : side) pending.insert(pending.end(), q.begin(), q.end());
  for (auto& [conn, q] : queues_)
    for (auto& [op, t] : q.parts) {
      // A transfer that offered its user's buffer to the peer takes it back (and waits out a copy under way).
      t->fail(StatusCode::kAborted, "the communicator was destroyed with this operation pending");
      pending.push_back(op);
    }
  std::sort(pending.begin(), pending.end());
  pending.erase(std::unique(pending.begin(), pending.end()), pending.end());
  for (Op* op : pending) {
    if (op->finished()) continue;
    op->code = StatusCode::kAborted;
    op->error = fmt::format("rank {}: the communicator was destroyed with this operation pending", opts_.rank);
    op->state.store(Op::kFailed, std::memory_order_release);
    op->keep.reset();  // may free op: last use
  }
  if (postFd_ >= 0) ::close(postFd_);
}

void Engine::post(const std::shared_ptr<Op>& op, bool wakeWorker) {
  {
    std::lock_guard<std::mutex> lock(postMu_);
    op->engine = this;
    op->seq = nextSeq_++;
    incoming_.push_back(op);
    pending_.fetch_add(1, std::memory_order_release);
    hasIncoming_.store(true, std::memory_order_seq_cst);
  }
  wakeNetPoller();
  if (wakeWorker) {
    {
      std::lock_guard<std::mutex> lock(workerMu_);
      workerWanted_ = true;
    }
    workerCv_.notify_one();
  }
}

void Engine::post(const std::vector<std::shared_ptr<Op>>& ops, bool wakeWorker) {
  {
    std::lock_guard<std::mutex> lock(postMu_);
    for (auto& op : ops) {
      op->engine = this;
      op->seq = nextSeq_++;
      incoming_.push_back(op);
    }
    pending_.fetch_add(static_cast<int>(ops.size()), std::memory_order_release);
    hasIncoming_.store(true, std::memory_order_seq_cst);
  }
  wakeNetPoller();
  if (wakeWorker) {
    {
      std::lock_guard<std::mutex> lock(workerMu_);
      workerWanted_ = true;
    }
    workerCv_.notify_one();
  }
}

void Engine::wakeNetPoller() {
  // Pairs with waitMovingNet's store of netPolling_ and its look at hasIncoming_ (both seq_cst): either it sees
  // the post before it blocks, or this sees it polling.
  if (netPolling_.load(std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(postFd_, &one, sizeof one);
  }
}

void Engine::enqueue(Op* op, Transfer* t) {
  Queue& q = queues_[&t->connector()];
  q.conn = &t->connector();
  // In issue order: a part inserted later (a drain) goes before the parts of later ops.
  auto it = q.parts.end();
  while (it != q.parts.begin() && std::prev(it)->first->seq > op->seq) --it;
  q.parts.insert(it, {op, t});
  if (q.parts.size() == 1) {
    q.since = Clock::now();
    active_.push_back(&q);
  }
}

void Engine::takeIncoming() {
  if (!hasIncoming_.load(std::memory_order_acquire)) return;
  std::vector<std::shared_ptr<Op>>& in = taken_;  // swapped with incoming_: both keep their capacity
  {
    std::lock_guard<std::mutex> lock(postMu_);
    in.swap(incoming_);
    hasIncoming_.store(false, std::memory_order_relaxed);
  }
  for (auto& op : in) {
    op->keep = op;
    if (op->shot) {
      auto& q = shotQ_[op->send][op->peer];
      if (q.empty()) op->waitingSince = Clock::now();
      q.push_back(op.get());
      ++shotQueued_;
      continue;
    }
    if (op->peer == opts_.rank) {
      op->waitingSince = Clock::now();
      (op->send ? selfSends_ : selfRecvs_).push_back(op.get());
      continue;
    }
    op->unfinished = static_cast<int>(op->parts.size());
    for (auto& t : op->parts) enqueue(op.get(), t.get());
    if (!op->send && !op->ordered) {
      op->parts[0]->open(false);
    } else if (!op->send) {
      auto& chain = recvChain_[op->peer];
      chain.push_back(op.get());
      if (chain.size() == 1) op->parts[0]->open(false);
    }
  }
  in.clear();
  matchSelf();
}

void Engine::matchSelf() {
  while (!selfSends_.empty() && !selfRecvs_.empty()) {
    Op* s = selfSends_.front();
    Op* r = selfRecvs_.front();
    selfSends_.pop_front();
    selfRecvs_.pop_front();
    if (s->bytes != r->bytes || s->dtype != r->dtype) {
      failOp(*s, StatusCode::kInvalidUsage,
             fmt::format("size or type mismatch: this send has {} x {}, the receive from itself expects {} x {}",
                         s->count, to_string(s->dtype), r->count, to_string(r->dtype)));
      failOp(*r, StatusCode::kInvalidUsage,
             fmt::format("size or type mismatch: this receive expects {} x {}, the send to itself has {} x {}",
                         r->count, to_string(r->dtype), s->count, to_string(s->dtype)));
      complete(*s);
      complete(*r);
      continue;
    }
    if (s->bytes && s->buf != r->buf) {
      if (s->opts.device || r->opts.device) {
        try {
          deviceCopy(r->buf, s->buf, s->bytes, r->opts.device ? r->opts.stream : s->opts.stream);
        } catch (const Error& e) {
          failOp(*s, e.code(), e.what());
          failOp(*r, e.code(), e.what());
          complete(*s);
          complete(*r);
          continue;
        }
      } else {
        std::memmove(r->buf, s->buf, s->bytes);
      }
    }
    complete(*s);
    complete(*r);
  }
}

std::string Engine::describe(bool send, size_t count, DataType dtype, int peer, const std::string& why) const {
  return fmt::format("rank {}: {} of {} x {} {} rank {}: {}", opts_.rank, send ? "send" : "recv", count,
                     to_string(dtype), send ? "to" : "from", peer, why);
}

void Engine::failOp(Op& op, StatusCode code, const std::string& why) {
  if (op.code != StatusCode::kOk) return;  // the first error wins
  op.code = code;
  op.error = describe(op.send, op.count, op.dtype, op.peer, why);
}

namespace {
// A receive's parts 1.. as its sender split the message (the first part's header says how): the parts the sender
// used open (draining when the first found a mismatch: consumed, not kept), the others are cancelled, and the parts
// the sender used beyond this side's get draining transfers, appended to `parts`. Returns how many were appended, or
// -1 (every other part cancelled, `why` set) when the sender claims more parts than there are connections.
int followSenderSplit(std::vector<std::unique_ptr<Transfer>>& parts, const std::vector<transport::Connector*>& conns,
                      const transport::MessageDesc& firstDesc, const transport::TransferOptions& opts,
                      std::string* why) {
  const Transfer& first = *parts[0];
  const bool drain = first.mismatch();
  size_t senderParts = drain ? first.senderHeader().nParts : parts.size();
  if (first.failed() && !drain) senderParts = 0;  // broken or aborted: nothing to follow
  int result = 0;
  if (senderParts > conns.size()) {
    *why = fmt::format("the sender split the message in {} parts, at most {} are possible", senderParts, conns.size());
    senderParts = 0;
    result = -1;
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    if (i < senderParts) parts[i]->open(drain);
    else parts[i]->cancel();  // the sender did not use this channel
  }
  for (size_t i = parts.size(); i < senderParts; ++i) {
    transport::MessageDesc d = firstDesc;
    d.part = static_cast<int>(i);
    d.partBytes = 0;
    parts.push_back(std::make_unique<Transfer>(*conns[i], Transfer::Dir::kRecv, nullptr, d, opts, true));
    parts.back()->open(true);
    ++result;
  }
  return result;
}
}  // namespace

bool Engine::runInline(const std::vector<transport::Connector*>& conns, bool send, void* buf,
                       const transport::MessageDesc& msg, const transport::TransferOptions& topts) {
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock() || pending_.load(std::memory_order_acquire) != 0 ||
      hasIncoming_.load(std::memory_order_acquire))
    return false;
  transport::Connector& c = *conns[0];
  Transfer t(c, send ? Transfer::Dir::kSend : Transfer::Dir::kRecv, buf, msg, topts);
  driveInline(t, {});
  if (!send) drainSplitSender(t, conns, msg, topts);
  if (t.failed()) throw Error(t.errorCode(), describe(send, msg.count, msg.dtype, c.peer, t.error()));
  return true;
}

void Engine::drainSplitSender(const Transfer& t, const std::vector<transport::Connector*>& conns,
                              const transport::MessageDesc& desc, const transport::TransferOptions& opts) {
  if (!t.mismatch() || t.senderHeader().nParts <= 1) return;
  // The sender split its (different) message: consume its other parts too, so every channel stays in step.
  const size_t n = std::min<size_t>(t.senderHeader().nParts, conns.size());
  for (size_t i = 1; i < n; ++i) {
    transport::MessageDesc d = desc;
    d.part = static_cast<int>(i);
    d.partBytes = 0;
    Transfer drain(*conns[i], Transfer::Dir::kRecv, nullptr, d, opts, true);
    drain.open(true);
    driveInline(drain, {});
  }
}

bool Engine::runInlineParts(const std::vector<transport::Connector*>& conns, bool send, void* buf,
                            const transport::MessageDesc& msg, const transport::TransferOptions& topts, int nParts) {
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock() || pending_.load(std::memory_order_acquire) != 0 ||
      hasIncoming_.load(std::memory_order_acquire) || nParts < 1 || static_cast<size_t>(nParts) > conns.size())
    return false;
  const Transfer::Dir dir = send ? Transfer::Dir::kSend : Transfer::Dir::kRecv;
  std::vector<std::unique_ptr<Transfer>> parts;
  for (int i = 0; i < nParts; ++i) {
    transport::MessageDesc d = msg;
    d.nParts = nParts;
    d.part = i;
    size_t b, e;
    transport::p2pPartBounds(nParts, i, msg.bytes, &b, &e);
    d.partOffset = b;
    d.partBytes = e - b;
    parts.push_back(std::make_unique<Transfer>(*conns[i], dir, static_cast<char*>(buf) + b, d, topts, !send && i > 0));
  }
  std::vector<Transfer*> ts;
  Clock::time_point idle{};  // one timeout for the message, not one per part
  auto driveAll = [&](size_t from) {
    ts.clear();
    for (size_t i = from; i < parts.size(); ++i) ts.push_back(parts[i].get());
    for (Transfer* t : ts) {
      driveInline(*t, ts, nullptr, &idle);
      if (t->failed() && !t->mismatch())  // the others cannot complete the message: stop them
        for (Transfer* o : ts)
          if (!o->finished()) o->fail(t->errorCode(), t->error());
    }
  };
  if (send) {
    driveAll(0);
  } else {
    // The first part says how the sender split its message (Engine::validate for the queued path).
    driveInline(*parts[0], {}, nullptr, &idle);
    std::string why;
    if (followSenderSplit(parts, conns, msg, topts, &why) < 0) {
      parts[0]->connector().markBroken(why);
      throw Error(StatusCode::kRemoteError, describe(false, msg.count, msg.dtype, conns[0]->peer, why));
    }
    driveAll(1);
  }
  // The first failure names the operation (a mismatch first: it is the cause the user can act on).
  const Transfer* bad = nullptr;
  for (auto& t : parts)
    if (t->failed() && (!bad || (t->mismatch() && !bad->mismatch()))) bad = t.get();
  if (bad) throw Error(bad->errorCode(), describe(send, msg.count, msg.dtype, conns[0]->peer, bad->error()));
  return true;
}

namespace {
// When a caller moves a group's connections itself (all NET, as Engine::driveInline decides), they stay its own for
// the whole group: driveInline takes and releases them per operation, and between two the proxy was woken for what
// was still in flight (a wake-up and a context switch per message). Otherwise the proxy moves them: none is taken.
// Engine::driveInline moves the held connections in every drive (or hands them back to the proxy while it drives
// one it cannot move itself), so that none is left unmoved between the group's operations.
class DriveHold {
 public:
  DriveHold(std::array<transport::CallerDrive*, 32>& held, size_t& nHeld, const std::vector<Transfer*>& ts)
      : held_(held), n_(nHeld) {
    n_ = 0;
    if (!std::all_of(ts.begin(), ts.end(), [](const Transfer* t) { return t->connector().conn.drive != nullptr; }))
      return;
    for (const Transfer* t : ts)  // nothing allocated (more connections: taken per operation only)
      if (transport::CallerDrive* d = t->connector().conn.drive;
          n_ < held_.size() && std::find(held_.begin(), held_.begin() + n_, d) == held_.begin() + n_) {
        d->take();
        held_[n_++] = d;
      }
  }
  ~DriveHold() {
    const size_t n = std::exchange(n_, 0);
    for (size_t i = 0; i < n; ++i) held_[i]->release();
  }
  DriveHold(const DriveHold&) = delete;
  DriveHold& operator=(const DriveHold&) = delete;

 private:
  std::array<transport::CallerDrive*, 32>& held_;
  size_t& n_;
};
}  // namespace

bool Engine::runInlineGroup(const std::vector<Op*>& ops) {
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock() || pending_.load(std::memory_order_acquire) != 0 ||
      hasIncoming_.load(std::memory_order_acquire))
    return false;
  // Single-part operations. Several on one connector (osu_bw's window, a group of sends to one peer) run in issue
  // order, as the engine's queue runs them: a connector moves one transfer at a time, the next opens once the one
  // before finished, while every connector's current transfer moves; so no order of sends and receives can
  // deadlock two ranks, and nothing goes through the queues (over NET: no proxy hop per message). Over NET the next
  // send also opens once the one before only waits for its ack (Transfer::streaming()): sends stream instead of
  // taking a round trip each, each still learning its own verdict (at most kStatusRing steps from the oldest
  // unfinished op of the connector, whose verdict line the next would otherwise take).
  constexpr size_t kNoOp = static_cast<size_t>(-1);
  std::vector<Transfer*>& heads = groupParts_;  // keep their capacity: nothing allocated per call once warm
  std::vector<size_t>& headOp = groupHead_;
  std::vector<size_t>& tailOp = groupTail_;
  std::vector<size_t>& next = groupNext_;
  std::vector<size_t>& oldest = groupOldest_;
  heads.clear();
  headOp.clear();
  tailOp.clear();
  oldest.clear();
  next.assign(ops.size(), kNoOp);
  for (size_t i = 0; i < ops.size(); ++i) {
    Op* op = ops[i];
    if (op->peer == opts_.rank || op->parts.size() != 1) return false;
    Transfer* t = op->parts[0].get();
    size_t k = 0;
    while (k < heads.size() && &heads[k]->connector() != &t->connector()) ++k;
    if (k == heads.size()) {
      heads.push_back(t);
      headOp.push_back(i);
      tailOp.push_back(i);
      oldest.push_back(i);
    } else {
      next[tailOp[k]] = i;
      tailOp[k] = i;
    }
  }
  for (Op* op : ops) op->engine = this;
  DriveHold hold(held_, nHeld_, heads);
  for (Transfer* t : heads) t->open(false);
  // A connector whose transfer finished (or only waits for its ack, over NET) takes its next op; the sends streaming
  // behind their connector's head move here too (driveInline's steps move only the driven op and the heads). After
  // a timeout, an abort or a peer gone (kRemoteError, also a broken connection) the next ones fail at once: each
  // would wait out the timeout again. (It captures two pointers: std::function keeps that without allocating.)
  std::function<bool()> refill = [this, &ops] {
    std::vector<Transfer*>& heads = groupParts_;
    std::vector<size_t>& headOp = groupHead_;
    std::vector<size_t>& oldest = groupOldest_;
    const std::vector<size_t>& next = groupNext_;
    bool opened = false;
    // Whether connector k's next op may open beside its current one, still waiting for its ack: its verdict line
    // (its first step, the connector's step now) must not be one that an unfinished op of the connector waits on.
    auto streams = [&](size_t k) {
      return heads[k]->streaming() &&
             heads[k]->connector().conn.step - ops[oldest[k]]->parts[0]->firstStep() < transport::kStatusRing;
    };
    bool moved = false;
    for (size_t k = 0; k < heads.size(); ++k) {  // the sends that stream behind each head wait for their acks here
      for (size_t j = oldest[k]; j != headOp[k]; j = next[j])
        if (Transfer& x = *ops[j]->parts[0]; !x.finished()) moved |= x.progress();
      // The oldest unfinished op of the connector (the walk above stays short: finished ones are passed once).
      while (oldest[k] != headOp[k] && ops[oldest[k]]->parts[0]->finished()) oldest[k] = next[oldest[k]];
    }
    for (size_t k = 0; k < heads.size(); ++k)
      while ((heads[k]->finished() || streams(k)) && next[headOp[k]] != kNoOp) {
        const Transfer& done = *heads[k];
        headOp[k] = next[headOp[k]];
        heads[k] = ops[headOp[k]]->parts[0].get();
        const StatusCode code = done.failed() ? done.errorCode() : StatusCode::kOk;
        if (code == StatusCode::kTimeout || code == StatusCode::kAborted || code == StatusCode::kRemoteError) {
          // The root cause once, not wrapped again by every later op.
          static constexpr std::string_view kEarlier = "an earlier operation over this connection failed (";
          const std::string& why = done.error();
          heads[k]->fail(code, why.starts_with(kEarlier) ? why : fmt::format("{}{})", kEarlier, why));
        } else {
          heads[k]->open(false);  // done, or failed leaving the connection in step (a mismatch, a copy error)
        }
        opened = true;
      }
    return opened || moved;
  };
  Clock::time_point idle{};  // the group's TOPOCOLL_TIMEOUT clock: one timeout for the group, not one per op
  for (size_t i = 0; i < ops.size(); ++i) {
    refill();  // an op before this one may have ended outside a step (a timeout)
    Op& op = *ops[i];
    Transfer& t = *op.parts[0];
    driveInline(t, heads, &refill, &idle);
    if (!op.send) drainSplitSender(t, op.partConns, op.partDescs[0], op.opts);
    if (t.failed()) failOp(op, t.errorCode(), t.error());
    op.state.store(op.code == StatusCode::kOk ? Op::kDone : Op::kFailed, std::memory_order_release);
  }
  return true;
}

bool Engine::runInlineGroupParts(const std::vector<Op*>& ops) {
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock() || pending_.load(std::memory_order_acquire) != 0 ||
      hasIncoming_.load(std::memory_order_acquire))
    return false;
  std::vector<Transfer*> ts;
  std::vector<Op*> owner;  // of ts[i]
  bool multi = false;
  for (Op* op : ops) {
    if (op->peer == opts_.rank || op->parts.empty()) return false;
    multi |= op->parts.size() > 1;
    for (auto& p : op->parts) {
      if (!p->connector().conn.drive) return false;
      for (Transfer* t : ts)
        if (&t->connector() == &p->connector()) return false;
      ts.push_back(p.get());
      owner.push_back(op);
    }
  }
  if (!multi) return false;
  DriveHold hold(held_, nHeld_, ts);
  for (Op* op : ops) {
    op->engine = this;
    op->parts[0]->open(false);  // a receive's other parts wait for its first (gated)
  }
  // A failed part (not a mismatch) fails the other parts of its operation: they cannot complete the message.
  auto settle = [&](Transfer& t, Op& op) {
    if (!t.failed() || t.mismatch()) return;
    for (auto& p : op.parts)
      if (!p->finished()) p->fail(t.errorCode(), t.error());
  };
  // 1. The receives' first parts, every other transfer moving along (sends complete only once the peer's receives
  //    opened all their parts: waiting for them here could deadlock two ranks).
  Clock::time_point idle{};  // the group's TOPOCOLL_TIMEOUT clock: one timeout for the group, not one per part
  for (size_t i = 0; i < ts.size(); ++i)
    if (!owner[i]->send && ts[i] == owner[i]->parts[0].get()) {
      driveInline(*ts[i], ts, nullptr, &idle);
      settle(*ts[i], *owner[i]);
    }
  // 2. Open the receives' other parts as the sender split (Engine::validate), then drive everything to the end.
  for (Op* op : ops) {
    if (op->send) continue;
    std::string why;
    const int added = followSenderSplit(op->parts, op->partConns, op->partDescs[0], op->opts, &why);
    if (added < 0) {
      failOp(*op, StatusCode::kRemoteError, why);
      op->parts[0]->connector().markBroken(op->error);
    }
    for (int i = added; i > 0; --i) {
      ts.push_back(op->parts[op->parts.size() - i].get());
      owner.push_back(op);
    }
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    driveInline(*ts[i], ts, nullptr, &idle);
    settle(*ts[i], *owner[i]);
  }
  for (Op* op : ops) {
    for (auto& p : op->parts)
      if (p->failed() && (p->mismatch() || op->code == StatusCode::kOk))
        failOp(*op, p->mismatch() ? StatusCode::kInvalidUsage : p->errorCode(), p->error());
    op->state.store(op->code == StatusCode::kOk ? Op::kDone : Op::kFailed, std::memory_order_release);
  }
  return true;
}

void Engine::driveInline(Transfer& t, const std::vector<Transfer*>& others, const std::function<bool()>* refill,
                         Clock::time_point* idleSince) {
  transport::Connector& c = t.connector();
  const bool net = c.conn.flags & transport::kConnNet;
  Clock::time_point ownSince{};
  Clock::time_point& since = idleSince ? *idleSince : ownSince;  // read lazily: most transfers finish before any check
  unsigned polls = 0;
  // The other transfers of the group move too: any order of sends and receives completes.
  inlineConns_.clear();
  inlineConns_.push_back(&c);
  for (Transfer* o : others) inlineConns_.push_back(&o->connector());
  // When every connection is NET, this thread moves them itself and blocks in poll() on their sockets: the kernel
  // wakes it as data comes, as Gloo's threads wait (no proxy hop, no doorbell; docs/transport.md, NET).
  netDrives_.clear();
  for (const transport::Connector* k : inlineConns_) {
    transport::CallerDrive* d = k->conn.drive;
    if (!d) {
      netDrives_.clear();
      break;
    }
    if (std::find(netDrives_.begin(), netDrives_.end(), d) == netDrives_.end()) netDrives_.push_back(d);
  }
  // The connections a group holds (DriveHold) move with these when all are NET; otherwise this thread moves none
  // and hands them back to the proxy until it returns.
  bool suspended = false;
  if (nHeld_ > 0) {
    if (netDrives_.empty()) {
      for (size_t i = 0; i < nHeld_; ++i) held_[i]->release();
      suspended = true;
    } else {
      for (size_t i = 0; i < nHeld_; ++i)
        if (std::find(netDrives_.begin(), netDrives_.end(), held_[i]) == netDrives_.end()) netDrives_.push_back(held_[i]);
    }
  }
  struct Release {
    std::vector<transport::CallerDrive*>& drives;
    bool resume;
    std::array<transport::CallerDrive*, 32>& held;
    size_t nHeld;
    ~Release() {
      for (transport::CallerDrive* d : drives) d->release();
      drives.clear();
      for (size_t i = 0; resume && i < nHeld; ++i) held[i]->take();
    }
  } release{netDrives_, suspended, held_, nHeld_};
  for (transport::CallerDrive* d : netDrives_) d->take();
  // NET waits never yield: against CPU-bound processes a yield waits out their time slices (docs/transport.md, NET).
  // Moved by this thread, they spin within the engine's budget (an answer within it costs no wake-up), then block
  // in poll(); moved by the proxy, they sleep on the doorbell at once (the proxy rings it).
  transport::Backoff backoff(!net ? opts_.spinUs : netDrives_.empty() ? 0 : opts_.spinUs, net ? 0 : opts_.yieldUs,
                             net ? 0 : 4);
  auto driveNet = [&] {
    bool moved = false;
    for (transport::CallerDrive* d : netDrives_) moved |= d->drive();
    return moved;
  };
  auto step = [&] {
    bool moved = driveNet();  // what arrived (data, acknowledgements)
    bool progressed = t.progress();
    for (Transfer* o : others)
      if (o != &t && !o->finished()) progressed |= o->progress();
    if (refill && (*refill)()) progressed |= true;  // the next op of a connector whose transfer ended opened
    if (progressed && !netDrives_.empty()) driveNet();  // out goes what the step published
    moved |= progressed;
    if (hasIncoming_.load(std::memory_order_acquire) || pending_.load(std::memory_order_acquire) != 0)
      moved |= progressOnce();  // what other threads posted since
    return moved;
  };
  while (!t.finished()) {
    if (step()) {
      backoff.reset();
      polls = 0;
      since = {};
      continue;
    }
    if (opts_.abortFlag && opts_.abortFlag->load(std::memory_order_relaxed)) {
      t.fail(StatusCode::kAborted, "the communicator was aborted");
      break;
    }
    // The checks checkStalls makes for queued transfers. A dead peer at every idle poll (one load): counted in
    // polls, the check would come only after ~190 sleeps of 20 ms once the wait sleeps, 4-5 s after the kill (the
    // survivors of a 4-rank Broadcast from a killed root); the clock often enough once the wait sleeps.
    if (opts_.peerGone && (*opts_.peerGone)[c.peer].load(std::memory_order_acquire)) {
      // What the peer wrote before it left is visible now (its writes precede its leave): one more look, so that a
      // transfer it completed before it destroyed its communicator ends here as done, not as failed.
      if (step()) continue;
      if (t.finished()) break;
      t.fail(StatusCode::kRemoteError, transport::peerGoneWhy(c.peer, (*opts_.peerGone)[c.peer].load()));
      break;
    }
    if (++polls >= 256 || backoff.sleeping()) {  // at every slice once the wait sleeps: the deadline on time
      if (since == Clock::time_point{}) since = Clock::now();
      std::string jw;
      StatusCode jc{};
      if (pollJob(Clock::now() - since, c.peer, &jc, &jw)) {
        t.fail(jc, jw);
        break;
      }
      if (Clock::now() - since > opts_.timeout)
        t.fail(StatusCode::kTimeout,
               fmt::format("rank {} did not move for {:g} s on channel {} (TOPOCOLL_TIMEOUT): it is stuck, gone, or "
                           "never posted the matching operation",
                           c.peer, std::chrono::duration<double>(opts_.timeout).count(), c.channel));
      if (t.finished()) break;
      polls = 200;  // from here on every few polls
    }
    if (!netDrives_.empty()) {
      bool block = false;
      backoff.idle(*opts_.doorbell, [&] { return block = true; });  // spins, or says it is time to block
      if (!block) continue;
      // Slices, as the doorbell's: deadlines, aborts and dead peers are checked between them.
      netFds_.clear();
      for (transport::CallerDrive* d : netDrives_) d->waitFds(netFds_);
      ::poll(netFds_.data(), netFds_.size(), netFds_.empty() ? 1 : 20);
      continue;
    }
    backoff.idle(*opts_.doorbell, [&] {
      if (step()) {
        since = {};  // moved inside the doorbell's check: the timeout's clock starts again
        return true;
      }
      return t.finished() || (opts_.abortFlag && opts_.abortFlag->load());
    });
  }
  // What comes after (the group's next transfer, sharing the clock) starts afresh unless this one timed out.
  if (!(t.failed() && t.errorCode() == StatusCode::kTimeout)) since = {};
  inlineConns_.clear();
}

// Mailbox ops (docs/transport.md, "Point-to-point mailboxes"): a send writes its message into the peer's slot and
// is done (eager: the receiver's copy is the data); a receive takes the next message when its index is this
// receive's (NCCL's matching), and fails on a message ahead (the one between took the FIFO: sizes differ) or one
// whose size or type differ from its own.
bool Engine::shotProgress(Op& op) {
  transport::ConnInfo& ci = op.shot->conn;
  transport::ShotBox box(ci.p2pShot, ci.wake);
  const uint64_t mine = static_cast<uint64_t>(op.shotSig) << 32 | op.bytes;
  if (op.send) {
    if (op.shotState == 0) {
      if (!box.trySend(op.shotSig, op.buf, op.bytes)) return false;
      op.shotState = box.seq();
    }
    // The receiver waits for exactly this message (index, size, type): it will take it as it is (a pingpong, an
    // exchange). Valid whenever it is read: a post names the receiver's next message.
    if (box.posted(mine)) return true;
    // Otherwise its verdict: taken, or refused (its size or type differ: both sides fail, as over the FIFO).
    uint64_t expected = 0;
    int v = box.verdict(op.shotState, &expected);
    if (v == 0) return false;
    if (v < 0) {
      auto type = static_cast<DataType>((expected >> 32) & 31);
      uint64_t bytes = expected & 0xffffffff;
      size_t es = isValid(type) ? sizeOf(type) : 1;
      failOp(op, StatusCode::kInvalidUsage,
             fmt::format("size or type mismatch: rank {} expected {} x {} ({} bytes) for its receive #{}, this send has "
                         "{} x {}", op.peer, bytes / es, isValid(type) ? to_string(type) : "?", bytes,
                         expected >> 37, op.count, to_string(op.dtype)));
    }
    return true;
  }
  for (;;) {
    transport::ShotMessage m;
    if (!box.peek(&m)) {
      if (op.shotState < 2) {  // announce what this receive expects (once), then look again
        if (op.shotState == 0) box.post(mine);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        op.shotState = 2;
        continue;
      }
      op.shotState = 3;  // posted and fenced, then found nothing: the sender will see the post (below)
      return false;
    }
    int32_t ahead = shotIndexDiff(m.sig, op.shotSig);
    if (ahead < 0 && shotGaveUp_[op.peer] > 0) {
      // The late message of a receive that gave up (timeout, abort): skipped, so that the mailbox heals.
      alignas(8) char scratch[transport::kShotMaxBytes];
      if (!box.tryRecv(scratch, sizeof scratch, &m)) return false;
      --shotGaveUp_[op.peer];
      ci.wake->ring();
      TC_WARN("rank {}: skipped rank {}'s send #{} ({} bytes), whose receive gave up before it came", opts_.rank,
              op.peer, m.sig >> 5, m.bytes);
      continue;
    }
    if (ahead > 0) {  // left where it is: the next receive takes it
      failOp(op, StatusCode::kInvalidUsage,
             fmt::format("rank {}'s next small message is its send #{} but this is the receive #{} from it: the "
                         "messages between went another way (a send and its receive differ in size: sends and "
                         "receives of at most TOPOCOLL_P2P_MAILBOX_MAX bytes go through the mailbox)",
                         op.peer, m.sig >> 5, op.shotSig >> 5));
      return true;
    }
    bool match = ahead == 0 && m.sig == op.shotSig && m.bytes == op.bytes;
    alignas(8) char scratch[transport::kShotMaxBytes];
    if (!box.tryRecv(match ? op.buf : scratch, match ? op.bytes : sizeof scratch, &m, match)) return false;
    op.shotPeerPost = m.post;
    if (match && op.devBuf && op.bytes) {  // a device buffer's message was staged in op.stage
      try {
        deviceCopy(op.devBuf, op.buf, op.bytes, op.opts.stream);
      } catch (const Error& e) {
        failOp(op, e.code(), e.what());
      }
    }
    if (!match) {
      box.refuse(mine);
      box.consume();
      auto type = static_cast<DataType>(m.sig & 31);
      size_t es = isValid(type) ? sizeOf(type) : 1;
      failOp(op, StatusCode::kInvalidUsage,
             ahead < 0 ? fmt::format("rank {}'s message is its send #{} but this is the receive #{} from it (a send "
                                     "and its receive differ in size)", op.peer, m.sig >> 5, op.shotSig >> 5)
                       : fmt::format("size or type mismatch: this receive expects {} x {}, rank {} sent {} x {} ({} "
                                     "bytes)", op.count, to_string(op.dtype), op.peer, m.bytes / es,
                                     isValid(type) ? to_string(type) : "?", m.bytes));
    }
    // Wake the sender if it may wait for this: for its verdict, unless it saw this receive's post (state 3: the
    // post, a fence, then a look that found nothing, so the sender's look at the post after its message and its
    // fence found it: seq_cst fences on both sides); for a free slot, if all its slots were full.
    if (!match || op.shotState != 3 || box.full()) ci.wake->ring();
    return true;
  }
}

std::string Engine::shotTimeout(int peer) const {
  return fmt::format("rank {} did not move for {:g} s (TOPOCOLL_TIMEOUT): it is stuck, gone, or never posted the "
                     "matching operation (or one of another size: sends and receives of at most "
                     "TOPOCOLL_P2P_MAILBOX_MAX bytes go through the mailbox, larger ones through the FIFO)",
                     peer, std::chrono::duration<double>(opts_.timeout).count());
}

void Engine::shotGaveUp(Op& op, StatusCode code, const std::string& why) {
  if (!op.send) ++shotGaveUp_[op.peer];  // its message may still come: skipped then
  failOp(op, code, why);
}

bool Engine::progressShots() {
  bool did = false;
  for (int send = 0; send < 2; ++send)
    for (size_t peer = 0; peer < shotQ_[send].size(); ++peer) {
      auto& q = shotQ_[send][peer];
      if (q.empty()) continue;
      if (drivenInline(static_cast<int>(peer), send == 1)) continue;  // a caller drives it: its queue waits
      while (!q.empty() && shotProgress(*q.front())) {
        Op* op = q.front();
        q.pop_front();
        --shotQueued_;
        complete(*op);
        did = true;
        if (!q.empty()) q.front()->waitingSince = Clock::now();
      }
    }
  return did;
}

template <typename Step, typename Pending>
void Engine::driveShots(const Step& step, const Pending& pending, Op* const* opList, size_t nOps) {
  auto ops = [&] { return std::span<Op* const>(opList, nOps); };
  transport::Backoff backoff(opts_.spinUs, opts_.yieldUs);
  Clock::time_point since{};  // read lazily: most waits end before any check
  unsigned polls = 0;
  auto move = [&] {
    bool moved = step();
    if (hasIncoming_.load(std::memory_order_acquire) || pending_.load(std::memory_order_acquire) != 0)
      moved |= progressOnce();  // what other threads posted since
    return moved;
  };
  auto stopAll = [&](StatusCode code, const std::string& why, int onlyPeer) {
    for (Op* op : ops())
      if (!op->finished() && op->code == StatusCode::kOk && (onlyPeer < 0 || op->peer == onlyPeer)) {
        // A send that waited for its group's receive (the reply: runShotGroup) may have been taken all the same:
        // one look at the peer's post line and verdict before it fails. Settled, it stays unfinished here with its
        // own outcome (runShotGroup marks it).
        if (op->send && op->shotPair && op->shotState != 0) {
          op->shotPair = nullptr;
          if (shotProgress(*op)) continue;
        }
        shotGaveUp(*op, code, why);
      }
  };
  while (pending()) {
    if (move()) {
      backoff.reset();
      polls = 0;
      since = {};
      continue;
    }
    if (opts_.abortFlag && opts_.abortFlag->load(std::memory_order_relaxed)) {
      stopAll(StatusCode::kAborted, "the communicator was aborted", -1);
      return;
    }
    if (++polls >= 64 || backoff.sleeping()) {  // every few idle polls, and every slice once the wait sleeps
      polls = 0;
      if (since == Clock::time_point{}) since = Clock::now();
      bool gone = false;
      // A peer that left may have sent (or taken) its last message before it did: one more look before its ops fail.
      bool anyGone = false;
      for (Op* op : ops())
        anyGone |= !op->finished() && opts_.peerGone && (*opts_.peerGone)[op->peer].load(std::memory_order_acquire);
      if (anyGone && move()) continue;
      for (Op* op : ops())
        if (!op->finished() && op->code == StatusCode::kOk && opts_.peerGone && (*opts_.peerGone)[op->peer].load()) {
          stopAll(StatusCode::kRemoteError,
                  transport::peerGoneWhy(op->peer, (*opts_.peerGone)[op->peer].load()), op->peer);
          gone = true;
        }
      if (gone) continue;
      std::string jw;
      StatusCode jc{};
      int waitsOn = -1;
      for (Op* op : ops())
        if (!op->finished() && waitsOn < 0) waitsOn = op->peer;
      if (pollJob(Clock::now() - since, waitsOn, &jc, &jw)) {
        stopAll(jc, jw, -1);
        return;
      }
      if (Clock::now() - since > opts_.timeout) {
        int peer = -1;
        for (Op* op : ops())
          if (!op->finished() && op->code == StatusCode::kOk) peer = peer < 0 ? op->peer : peer;
        stopAll(StatusCode::kTimeout, shotTimeout(peer), -1);
        return;
      }
    }
    backoff.idle(*opts_.doorbell, [&] {
      if (move()) {
        since = {};  // moved inside the doorbell's check: the timeout's clock starts again
        return true;
      }
      return opts_.abortFlag && opts_.abortFlag->load(std::memory_order_relaxed);
    });
  }
}

bool Engine::runShotInline(Op& op) {
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock() || hasIncoming_.load(std::memory_order_acquire) || !shotQ_[op.send][op.peer].empty())
    return false;
  if (!shotProgress(op)) {
    shotInline_.assign(1, {op.peer, op.send});
    bool done = false;
    Op* self = &op;
    driveShots([&] { return done = done || shotProgress(op); }, [&] { return !done && op.code == StatusCode::kOk; },
               &self, 1);
    shotInline_.clear();
  }
  if (op.code != StatusCode::kOk) throw Error(op.code, op.error);
  return true;
}

bool Engine::runShotGroup(const std::vector<Op*>& ops) {
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock() || hasIncoming_.load(std::memory_order_acquire)) return false;
  for (Op* op : ops)
    if (!op->shot || !shotQ_[op->send][op->peer].empty()) return false;
  shotInline_.clear();
  for (size_t i = 0; i < ops.size(); ++i) {
    Op* op = ops[i];
    op->engine = this;
    shotInline_.emplace_back(op->peer, op->send);
  }
  openShotGroup(ops);
  // One pass: every op whose earlier ops of the same peer and direction are done makes one attempt; sends also
  // once those wrote their messages and only wait for their verdicts (a window of kShotSlots messages from the
  // oldest unfinished one: a refusal's entry stays until its sender read it), so that a group's sends to one peer
  // stream through the slots instead of taking a round trip each. Receives take their messages in order.
  size_t left = ops.size();
  // At most one lane per op: reserved for the group's size on its first call (warm-up), so that a later call whose
  // ops find their peers not ready (a loaded host) allocates nothing either.
  if (shotLanes_.capacity() < ops.size()) shotLanes_.reserve(ops.size());
  auto step = [&] { return shotGroupPass(ops, &left); };
  if (!step() || left) {
    driveShots(step, [&] {
      for (Op* op : ops)  // failed ones (abort, gone, timeout) end the wait
        if (!op->finished() && op->code != StatusCode::kOk) {
          op->state.store(Op::kFailed, std::memory_order_release);
          --left;
        }
      return left > 0;
    }, ops.data(), ops.size());
    for (Op* op : ops)
      if (!op->finished())  // failed by the wait, or a send settled in its last look (stopAll)
        op->state.store(op->code == StatusCode::kOk ? Op::kDone : Op::kFailed, std::memory_order_release);
  }
  shotInline_.clear();
  return true;
}

// runShotGroup's opening: the first message to each peer written, the first receive from each peer posted, one fence.
void Engine::openShotGroup(const std::vector<Op*>& ops) {
  // The first message to each peer is written and the first receive from each peer announces what it expects,
  // then one fence: each side of an exchange then finds the other's receive posted (its send completes at once) and
  // neither needs to wake the other after taking a message. A first message to a peer from which the group also
  // receives carries what that receive expects (ShotSlot::post): in an exchange each side learns its send's verdict
  // from the message its receive takes anyway, one cache line each way instead of two (the post lines stay where
  // they were written).
  bool any = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    Op* op = ops[i];
    bool first = true;
    for (size_t j = 0; j < i && first; ++j) first = ops[j]->send != op->send || ops[j]->peer != op->peer;
    if (!first) continue;
    transport::ConnInfo& ci = op->shot->conn;
    transport::ShotBox box(ci.p2pShot, ci.wake);
    if (op->send) {
      Op* pair = nullptr;  // the group's first receive from this peer: this side's next one from it
      int sends = 0;
      for (Op* o : ops) {
        if (!o->send && o->peer == op->peer && !pair) pair = o;
        sends += o->send && o->peer == op->peer;
      }
      // The send waits for the reply only when it is the group's one send to that peer: a window of sends moves on
      // verdicts, since the receive may finish only after the peer's group took them all (a peer that receives
      // first and replies after its group: MailboxOrder.AWindowOfSendsBesideAReceiveFromALaterSender).
      op->shotPair = sends == 1 ? pair : nullptr;
      const uint64_t post = pair ? static_cast<uint64_t>(pair->shotSig) << 32 | pair->bytes : 0;
      if (box.trySend(op->shotSig, op->buf, op->bytes, false, false, post)) op->shotState = box.seq();
    } else {
      box.post(static_cast<uint64_t>(op->shotSig) << 32 | op->bytes);
      op->shotState = 1;
    }
    any = true;
  }
  if (any) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    transport::Waker* rung[16];
    int nRung = 0;
    for (Op* op : ops) {
      if (op->send && op->shotState) {
        transport::Waker* w = op->shot->conn.wake;
        if (!w || std::find(rung, rung + nRung, w) != rung + nRung) continue;
        if (nRung < 16) rung[nRung++] = w;
        w->ringFenced();
      } else if (!op->send && op->shotState == 1) {
        op->shotState = 2;
      }
    }
  }
}

// runShotGroup: a send paired with a receive that has finished is done without a look at the peer's lines when the
// reply named this message; otherwise (no reply post, another message named, the receive failed) as any send from
// here on.
bool Engine::settleShotByReply(Op* op, size_t* left) {
  Op* pair = std::exchange(op->shotPair, nullptr);
  if (pair->code != StatusCode::kOk || pair->shotPeerPost == 0 ||
      pair->shotPeerPost != (static_cast<uint64_t>(op->shotSig) << 32 | op->bytes))
    return false;
  op->state.store(op->code == StatusCode::kOk ? Op::kDone : Op::kFailed, std::memory_order_release);
  --*left;
  return true;
}

// runShotGroup, one pass over the group's ops (see there); true when anything finished.
bool Engine::shotGroupPass(const std::vector<Op*>& ops, size_t* left) {
  bool moved = false;
  bool waitsForPair = false;
  std::vector<ShotLaneState>& lanes = shotLanes_;  // keeps its capacity: nothing allocated once warm
  lanes.clear();
  for (Op* op : ops) {
    if (op->finished()) continue;
    auto it = std::find_if(lanes.begin(), lanes.end(),
                           [&](const ShotLaneState& l) { return l.peer == op->peer && l.send == op->send; });
    if (it == lanes.end()) it = lanes.insert(lanes.end(), ShotLaneState{op->peer, op->send});
    if (it->blocked) continue;
    // A later message than one still without its verdict has none either (the receiver takes them in order): its
    // look waits for the next pass.
    if (op->send && op->shotState != 0 && it->oldest != 0) continue;
    if (op->send && op->shotState == 0 && it->oldest != 0 &&
        op->shot->conn.p2pShot.seq + 1 - it->oldest >= static_cast<uint64_t>(transport::kShotSlots)) {
      it->blocked = true;  // the window is full: the oldest message's verdict first
      continue;
    }
    // A written send whose verdict the peer's reply may carry (an exchange): not until the group's receive from
    // that peer took its message (the group cannot end before that receive does anyway), then as below.
    if (op->send && op->shotState != 0 && op->shotPair) {
      if (!op->shotPair->finished() && op->shotPair->code == StatusCode::kOk) {
        if (it->oldest == 0) it->oldest = op->shotState;
        waitsForPair = true;
        continue;
      }
      if (settleShotByReply(op, left)) {
        moved = true;
        continue;
      }
    }
    if (op->code == StatusCode::kOk && !shotProgress(*op)) {
      if (op->send && op->shotState != 0) {  // written: waits for its verdict, the next sends may write theirs
        if (it->oldest == 0) it->oldest = op->shotState;
      } else {
        it->blocked = true;
      }
      continue;
    }
    op->state.store(op->code == StatusCode::kOk ? Op::kDone : Op::kFailed, std::memory_order_release);
    --*left;
    moved = true;
  }
  // The sends passed over above whose receive finished after them in this pass: settled now, not a pass later.
  if (waitsForPair)
    for (Op* op : ops)
      if (op->shotPair && !op->finished() && op->shotState != 0 && op->shotPair->finished() &&
          settleShotByReply(op, left))
        moved = true;
  return moved;
}

void Engine::complete(Op& op) {
  std::shared_ptr<Op> keep = std::move(op.keep);  // the handle (if any) keeps it from here
  op.state.store(op.code == StatusCode::kOk ? Op::kDone : Op::kFailed, std::memory_order_release);
  pending_.fetch_sub(1, std::memory_order_release);
  opts_.doorbell->ring();
}

// The first part of a receive has read the sender's header: open the others, to copy or (sizes or types differ) to
// consume what the sender sent without copying; then the next receive from that peer may start.
void Engine::validate(Op& op) {
  op.validated = true;
  std::string why;
  const int added = followSenderSplit(op.parts, op.partConns, op.partDescs[0], op.opts, &why);
  if (added < 0) {
    failOp(op, StatusCode::kRemoteError, why);
    op.parts[0]->connector().markBroken(op.error);
  }
  for (int i = added; i > 0; --i) {
    ++op.unfinished;
    enqueue(&op, op.parts[op.parts.size() - i].get());
  }
  if (!op.ordered) return;
  auto& chain = recvChain_[op.peer];
  if (!chain.empty() && chain.front() == &op) chain.pop_front();
  if (!chain.empty()) chain.front()->parts[0]->open(false);
}

void Engine::partFinished(Op& op, Transfer& t) {
  if (t.failed()) {
    if (t.mismatch()) {
      failOp(op, StatusCode::kInvalidUsage, t.error());
    } else if (t.errorCode() != StatusCode::kAborted || op.code == StatusCode::kOk) {
      failOp(op, t.errorCode(), t.error());
      // The other parts cannot complete the message: stop them (those that started break their connection).
      for (auto& p : op.parts)
        if (!p->finished()) p->fail(t.errorCode(), t.error());
    }
  }
  if (--op.unfinished == 0) complete(op);
}

// Over NET a send finishes on the receiver's acknowledgement, a round trip after its last bytes left. The sends
// queued behind it on the connector move meanwhile, as in runInlineGroup (Transfer::streaming()): otherwise the link
// idled for that round trip after every message (a ring across hosts sends one per slice and step), and each
// acknowledgement crossed a link loaded with the other direction's data. Each still learns its own verdict, at most
// kStatusRing steps from the front's first, and at most Options::netStreamDepth of them move. They finish in any
// order; the queue pops them in order.
bool Engine::progressStreaming(Queue& q) {
  bool moved = false;
  const uint64_t first = q.parts.front().second->firstStep();
  for (size_t i = 1; i < q.parts.size() && i <= opts_.netStreamDepth; ++i) {
    const transport::Transfer& before = *q.parts[i - 1].second;
    if (!before.finished() && !before.streaming()) break;
    auto [op, t] = q.parts[i];
    if (!op->send) break;
    if (!t->pastStart() && q.conn->conn.step - first >= transport::kStatusRing) break;  // its verdict line is taken
    moved |= t->progress();
  }
  return moved;
}

bool Engine::progressOnce() {
  takeIncoming();
  bool did = shotQueued_ > 0 && progressShots();
  for (size_t i = 0; i < active_.size();) {
    Queue& q = *active_[i];
    if (drivenInline(q.conn)) {
      ++i;  // a caller drives this connector inline: its queue waits
      continue;
    }
    while (!q.parts.empty()) {
      auto [op, t] = q.parts.front();
      bool moved = t->progress();
      if (!op->send && !op->validated && t == op->parts[0].get() && (t->pastStart() || t->finished())) validate(*op);
      if (moved) {
        did = true;
        q.since = Clock::now();
      }
      if (!t->finished()) {
        if (opts_.netStreamDepth > 0 && t->streaming() && progressStreaming(q)) did = true, q.since = Clock::now();
        break;
      }
      q.parts.pop_front();
      partFinished(*op, *t);
      q.since = Clock::now();
      did = true;
    }
    if (q.parts.empty()) {
      active_[i] = active_.back();
      active_.pop_back();
    } else {
      ++i;
    }
  }
  if (!did && ++idlePasses_ >= 64) {
    idlePasses_ = 0;
    checkStalls();
  }
  return did;
}

bool Engine::pollJob(Clock::duration stalled, int peer, StatusCode* code, std::string* why) {
  if (jobFailed_.load(std::memory_order_acquire)) return jobFailure(code, why);
  if (!opts_.onStall) return false;
  const auto now = Clock::now();
  if (now - jobPolled_ < kJobPollEvery) return false;
  jobPolled_ = now;
  StatusCode c = StatusCode::kRemoteError;
  std::string w;
  if (!opts_.onStall(stalled, peer, &c, &w)) return false;
  setJobFailure(c, w);
  return jobFailure(code, why);
}

void Engine::setJobFailure(StatusCode code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(jobMu_);
    if (jobFailed_.load()) return;
    jobCode_ = code;
    jobWhy_ = why;
  }
  jobFailed_.store(true, std::memory_order_release);
}

bool Engine::jobFailure(StatusCode* code, std::string* why) const {
  if (!jobFailed_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(jobMu_);
  *code = jobCode_;
  *why = jobWhy_;
  return true;
}

void Engine::checkStalls() {
  auto now = Clock::now();
  bool aborted = opts_.abortFlag && opts_.abortFlag->load();
  std::string jobWhy;
  StatusCode jobCode = StatusCode::kOk;
  Clock::duration stalled{};
  int stalledOn = -1;
  for (Queue* q : active_)
    if (!q->parts.empty() && now - q->since >= stalled) {
      stalled = now - q->since;
      stalledOn = q->conn->peer;
    }
  const bool jobDown = !aborted && pollJob(stalled, stalledOn, &jobCode, &jobWhy);
  for (Queue* q : active_) {
    if (q->parts.empty()) continue;
    // A caller drives this connector inline (its own deadlines): nothing of its queue may move meanwhile, as in
    // progressOnce.
    if (drivenInline(q->conn)) continue;
    int peer = q->conn->peer;
    StatusCode code = StatusCode::kOk;
    std::string why;
    bool drainedOnly = false;  // the ops of other calls on this connector wait for their peer as usual
    if (aborted) {
      code = StatusCode::kAborted;
      why = "the communicator was aborted";
    } else if (opts_.peerGone && (*opts_.peerGone)[peer].load()) {
      code = StatusCode::kRemoteError;
      why = transport::peerGoneWhy(peer, (*opts_.peerGone)[peer].load());
    } else if (jobDown) {
      code = jobCode;
      why = jobWhy;
    } else if (int gone = -1; q->parts.front().first->draining.load(std::memory_order_acquire) &&
                              (gone = goneRank()) >= 0) {
      // A failed collective's leftovers with a live peer: that peer failed the call too (or will, when it reaches
      // the dead rank) and will not post the rest of it; waiting would cost both TOPOCOLL_TIMEOUT.
      code = StatusCode::kRemoteError;
      why = transport::peerGoneWhy(gone, (*opts_.peerGone)[gone].load());
      drainedOnly = true;
    } else if (now - q->since > opts_.timeout) {
      code = StatusCode::kTimeout;
      why = fmt::format("rank {} did not move for {:g} s on channel {} (TOPOCOLL_TIMEOUT): it is stuck, gone, or never "
                        "posted the matching operation",
                        peer, std::chrono::duration<double>(opts_.timeout).count(), q->conn->channel);
    }
    if (code == StatusCode::kOk) continue;
    if (code != StatusCode::kAborted && q->parts.front().second->progress()) {  // it just moved after all
      q->since = now;
      continue;
    }
    for (auto& [op, t] : q->parts)
      if (!drainedOnly || op->draining.load(std::memory_order_acquire)) t->fail(code, why);
  }
  // Mailbox ops: the front of each queue waits for its peer (the others wait for it).
  for (int send = 0; send < 2; ++send)
    for (size_t peer = 0; peer < shotQ_[send].size(); ++peer) {
      auto& q = shotQ_[send][peer];
      if (q.empty()) continue;
      // A caller drives this lane inline (with its own deadlines): nothing of its queue may move meanwhile.
      if (drivenInline(static_cast<int>(peer), send == 1)) continue;
      std::string why;
      StatusCode code = StatusCode::kOk;
      if (aborted) {
        code = StatusCode::kAborted;
        why = "the communicator was aborted";
      } else if (opts_.peerGone && (*opts_.peerGone)[peer].load()) {
        code = StatusCode::kRemoteError;
        why = transport::peerGoneWhy(peer, (*opts_.peerGone)[peer].load());
      } else if (jobDown) {
        code = jobCode;
        why = jobWhy;
      } else if (now - q.front()->waitingSince > opts_.timeout) {
        code = StatusCode::kTimeout;
        why = shotTimeout(static_cast<int>(peer));
      }
      if (code == StatusCode::kOk) continue;
      // One more look first: the message a peer sent (or took) before it left or timed out ends its op as done.
      if (code != StatusCode::kAborted && shotProgress(*q.front())) {
        Op* op = q.front();
        q.pop_front();
        --shotQueued_;
        complete(*op);
        if (!q.empty()) q.front()->waitingSince = now;
        continue;
      }
      while (!q.empty()) {
        Op* op = q.front();
        q.pop_front();
        --shotQueued_;
        shotGaveUp(*op, code, why);
        complete(*op);
      }
    }
  // Operations with this rank itself wait for their match (a send to itself for a receive from itself): one that
  // waits longer than TOPOCOLL_TIMEOUT never had one posted.
  for (auto* list : {&selfSends_, &selfRecvs_}) {
    while (!list->empty() && (aborted || now - list->front()->waitingSince > opts_.timeout)) {
      Op* op = list->front();
      list->pop_front();
      if (aborted)
        failOp(*op, StatusCode::kAborted, "the communicator was aborted");
      else
        failOp(*op, StatusCode::kTimeout,
               fmt::format("no {} itself was posted within {:g} s (TOPOCOLL_TIMEOUT): a send to oneself needs a "
                           "receive from oneself, in the same group when blocking",
                           op->send ? "receive from" : "send to",
                           std::chrono::duration<double>(opts_.timeout).count()));
      complete(*op);
    }
  }
}

bool Engine::tryProgress() {
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  return progressOnce();
}

template <typename Done>
void Engine::waitUntil(const Done& done, int spinUs, int yieldUs, int minYields) {
  transport::Backoff backoff(spinUs, yieldUs, minYields);
  while (!done()) {
    if (tryProgress()) {
      backoff.reset();
      continue;
    }
    backoff.idle(*opts_.doorbell, [&] { return done() || tryProgress(); });
  }
}

namespace {
// A NET wait for more bytes than this does not spin before it blocks (waitMovingNet).
constexpr size_t kNetSpinMaxBytes = 64 << 10;
}  // namespace

// A caller drives its own operations: the worker stays out of the way until it leaves.
template <typename Done>
void Engine::waitAsCaller(const Done& done, Op* const* ops, size_t nOps, bool more) {
  if (done()) return;
  callers_.fetch_add(1);
  bool net = false, netOnly = true;  // some of the awaited connections are NET; all are (shots' count as not)
  for (size_t i = 0; i < nOps; ++i) {
    size_t nNet = 0;
    if (!ops[i]->shot)
      for (auto& t : ops[i]->parts) nNet += (t->connector().conn.flags & transport::kConnNet) != 0;
    net |= nNet > 0;
    netOnly &= nNet > 0 && nNet == ops[i]->parts.size();
  }
  // Operations that NET moves (alone, or with P2P and SHM inside the host): this thread moves their NET connections
  // itself (waitMovingNet); when it cannot (another thread drives the engine, or a group holds connections), NET-only
  // waits sleep on the doorbell at once (no yield: against CPU-bound processes a yield waits out their time slices;
  // a 20 us spin first made 1 MiB no faster), and the proxy rings it.
  if (!net || !waitMovingNet(done, ops, nOps)) {
    if (netOnly) waitUntil(done, 0, 0, 0);
    else waitUntil(done, opts_.spinUs, opts_.yieldUs);
  }
  // The last caller to leave hands what is pending to the worker, unless it comes back at once (`more`).
  if (callers_.fetch_sub(1) == 1 && !more && !idle()) {
    {
      std::lock_guard<std::mutex> lock(workerMu_);
      workerWanted_ = true;
    }
    workerCv_.notify_one();
  }
}

// Queued operations with NET connections (a collective's steps across hosts, alone or with P2P and SHM steps inside
// the host): this thread moves the NET connections (CallerDrive), with those of every other NET queue of the engine
// (the sends a collective posted before this receive), and the engine's queues, and blocks in poll() on their
// sockets, on postFd_ and, when some queue is not NET, on the doorbell's eventfd (the local peers of P2P and SHM
// ring the doorbell; announced as a poller, this thread hears the ring there), as driveInline does for a blocking
// send or receive. Through the proxy every NET message costs three wake-ups (caller -> proxy eventfd, socket -> the
// peer's proxy, doorbell -> the peer's caller); here one (the socket). It holds the engine for the whole wait, so no
// other driver publishes a step that this thread, blocked in poll(), would not see (moving the connections while
// taking the engine per pass made sendrecv 1 MiB 2-4x slower); what other threads post meanwhile rings postFd_.
// A wait with a queue that is not NET whose doorbell eventfd is missing or polled by another thread (one poller per
// process: Doorbell::beginPoll) hands everything back to the proxy and the rest of it sleeps on the doorbell.
// False, having done nothing, when it cannot start: the engine is driven elsewhere, a group holds connections, or
// no eventfd.
template <typename Done>
bool Engine::waitMovingNet(const Done& done, Op* const* ops, size_t nOps) {
  if (postFd_ < 0) return false;
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock() || nHeld_ > 0 || !inlineConns_.empty()) return false;
  struct Held {
    std::array<transport::CallerDrive*, 32> d{};
    size_t n = 0;
    bool full = false;
    void add(transport::CallerDrive* c) {
      if (std::find(d.begin(), d.begin() + n, c) != d.begin() + n) return;
      if (n == d.size()) {
        full = true;
        return;
      }
      c->take();
      d[n++] = c;
    }
    bool lazy = false;  // the wait ended with nothing posted left: acknowledgements to come need no proxy
    void releaseAll() {
      for (size_t i = 0; i < n; ++i) d[i]->release(lazy);
      n = 0;
    }
    ~Held() { releaseAll(); }
  } held;
  bool local = false;  // some queue is not NET: its peers ring the doorbell
  for (size_t i = 0; i < nOps; ++i)
    if (!ops[i]->finished())
      for (auto& t : ops[i]->parts) {
        if (auto* d = t->connector().conn.drive) held.add(d);
        else local = true;
      }
  // The other queues' connections; false when they are more than this thread can hold.
  auto holdQueues = [&] {
    for (Queue* q : active_) {
      if (q->parts.empty()) continue;
      if (transport::CallerDrive* d = q->conn->conn.drive) held.add(d);
      else local = true;
    }
    return !held.full;
  };
  auto driveNet = [&] {
    bool moved = false;
    for (size_t i = 0; i < held.n; ++i) moved |= held.d[i]->drive();
    return moved;
  };
  transport::Doorbell& bell = *opts_.doorbell;
  // It spins (within the engine's budget) for small operations only, and only until it first blocks: a small
  // message's answer comes within the spin, and it pays (8 B AllReduce at 2 x 1: 53-66 us against 133-326
  // without); a large one arrives in bursts over a wire that needs far longer than the spin, and a spin restarted
  // after each (a loop of failed recv()) took the cores that the other ranks' reductions needed (4 x 2, 64 MiB, 8
  // ranks on 2 cores: 4-10% slower).
  size_t bytes = 0;
  for (size_t i = 0; i < nOps; ++i) bytes += ops[i]->bytes;
  transport::Backoff spinning(bytes <= kNetSpinMaxBytes ? opts_.spinUs : 0, 0, 0), blocking(0, 0, 0);
  transport::Backoff* backoff = &spinning;
  std::vector<pollfd>& fds = netFds_;  // driver only
  // Posted operations are taken before the first pass publishes them: a step published on a connection that this
  // thread does not hold yet wakes the proxy.
  takeIncoming();
  bool holding = holdQueues();
  while (!done()) {
    bool moved = driveNet();  // what arrived (data, acknowledgements)
    if (hasIncoming_.load(std::memory_order_acquire)) {  // what other threads posted meanwhile, likewise
      takeIncoming();
      holding = holdQueues();
    }
    if (progressOnce()) {  // the steps it completes, and those it publishes
      // Queues it started (an op after the one that finished, the next receive from a peer) join the held ones:
      // the proxy would move them and ring the doorbell, which this thread, blocked in poll(), does not hear
      // (a chain across hosts stalled a poll slice of 20 ms per piece).
      if (holding) holding = holdQueues();
      driveNet();  // out goes what was published
      moved = true;
    }
    if (moved) {
      backoff->reset();
      continue;
    }
    bool block = false;
    backoff->idle(bell, [&] { return block = true; });  // spins within the budget, then says block
    if (!block) continue;
    backoff = &blocking;
    if (!holding) break;
    int slice = 20;  // ms, as the doorbell's: the engine's deadlines, aborts and dead peers are checked between them
    if (local) {
      // Announced before the last look: a local peer that publishes after it rings the eventfd.
      slice = bell.beginPoll(slice);
      if (slice < 0) break;
      if (progressOnce()) {
        bell.endPoll();
        backoff->reset();
        continue;
      }
    }
    fds.clear();
    for (size_t i = 0; i < held.n; ++i) held.d[i]->waitFds(fds);
    fds.push_back({postFd_, POLLIN, 0});
    if (local) fds.push_back({bell.eventFd(), POLLIN, 0});
    netPolling_.store(true, std::memory_order_seq_cst);
    if (!hasIncoming_.load(std::memory_order_seq_cst) && !done()) {
      if (::poll(fds.data(), fds.size(), slice) == 0) {
        if (transport::test_hooks::callerPollSlept) transport::test_hooks::callerPollSlept();
        checkStalls();
      }
    }
    netPolling_.store(false, std::memory_order_relaxed);
    if (local) bell.endPoll();
    uint64_t drained;
    while (::read(postFd_, &drained, sizeof drained) > 0) {
    }
  }
  if (done()) {
    held.lazy = idle();
    return true;
  }
  // More connections than it can hold, or a local queue and the doorbell's eventfd taken (another communicator of
  // the process polls it): the rest as waitAsCaller waits without this, the proxy moving NET.
  held.releaseAll();
  lock.unlock();
  if (local) waitUntil(done, opts_.spinUs, opts_.yieldUs);
  else waitUntil(done, 0, 0, 0);
  return true;
}

void Engine::wait(Op& op, bool more) {
  Op* const one = &op;
  waitAsCaller([&] { return op.finished(); }, &one, 1, more);
  if (op.state.load(std::memory_order_acquire) == Op::kFailed) throw Error(op.code, op.error);
}

void Engine::waitFinished(const std::vector<Op*>& ops) {
  waitAsCaller(
      [&] {
        for (Op* op : ops)
          if (!op->finished()) return false;
        return true;
      },
      ops.data(), ops.size());
}

void Engine::drain(const std::vector<Op*>& ops) {
  for (Op* op : ops) op->draining.store(true, std::memory_order_release);
  waitFinished(ops);
}

int Engine::goneRank() const {
  if (!opts_.peerGone) return -1;
  for (size_t r = 0; r < opts_.peerGone->size(); ++r)
    if ((*opts_.peerGone)[r].load(std::memory_order_relaxed)) return static_cast<int>(r);
  return -1;
}

void Engine::waitAll(const std::vector<Op*>& ops) {
  waitFinished(ops);
  throwFailures(ops);
}

void Engine::throwFailures(const std::vector<Op*>& ops) {
  // Every failure is named: a peer that died can make other operations fail too (their peers gave up on us).
  StatusCode code = StatusCode::kOk;
  std::string why;
  int failed = 0;
  for (Op* op : ops) {
    if (op->state.load(std::memory_order_acquire) != Op::kFailed) continue;
    if (failed++ == 0) code = op->code;
    why += (why.empty() ? "" : "; ") + op->error;
  }
  if (failed == 1) throw Error(code, why);
  if (failed > 1) throw Error(code, fmt::format("{} operations failed: {}", failed, why));
}

bool Engine::test(Op& op) {
  if (!op.finished()) tryProgress();
  if (!op.finished()) return false;
  if (op.state.load(std::memory_order_acquire) == Op::kFailed) throw Error(op.code, op.error);
  return true;
}

void Engine::abortAll() {
  opts_.doorbell->ring();
  {
    std::lock_guard<std::mutex> lock(workerMu_);
    workerWanted_ = true;
  }
  workerCv_.notify_all();
  // Drive once so that ops fail even if nobody waits; waiters (and an inline transfer, which holds the lock) see
  // the flag themselves within a sleep slice.
  std::unique_lock<std::mutex> lock(driveMu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  takeIncoming();
  checkStalls();
  progressOnce();
}

void Engine::runWorker() {
  log::setThreadRank(opts_.rank);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(workerMu_);
      workerCv_.wait(lock, [&] { return stop_.load() || (workerWanted_ && !idle()); });
      if (stop_.load()) return;
    }
    waitUntil([&] { return stop_.load() || idle() || callers_.load(std::memory_order_relaxed) > 0; }, opts_.spinUs, 0);
    std::lock_guard<std::mutex> lock(workerMu_);
    if (idle()) workerWanted_ = false;
    else if (callers_.load() > 0) workerWanted_ = false;  // a caller drives; it hands back when it leaves
  }
}

}  // namespace topocoll::progress
