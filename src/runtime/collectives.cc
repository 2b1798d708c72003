// Collectives on the communicator: argument checks, the choice of algorithm, protocol and channels (NCCL 2.30.7
// src/enqueue.cc topoGetAlgoInfo's role), issue order (a collective thread for asynchronous ones), groups, and the
// Links the algorithms of the collectives layer move data through: the connectors of the rings and trees that init
// connected (connIndex 0), and the point-to-point ones for peers that are not neighbours (Direct).
#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "coll_links.h"
#include "coll_task.h"
#include "engine.h"
#include "topocoll/cuda.h"
#include "topocoll/log.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "topocoll/transport/doorbell.h"

namespace topocoll::runtime {

using collectives::Algo;
using collectives::Args;
using collectives::Choice;
using collectives::Coll;
using collectives::Proto;
using detail::CollTask;
using detail::Op;
using transport::Side;

namespace detail {

CollLinks::~CollLinks() { memFree(scratch_, scratchBytes_); }
int CollLinks::rank() const { return c_.rank_; }
int CollLinks::nRanks() const { return c_.nRanks_; }
int CollLinks::nChannels() const { return static_cast<int>(c_.connect_.rings.size()); }
const int* CollLinks::ring(int c) const { return c_.connect_.rings[c].data(); }
int CollLinks::treeUp(int c) const { return c_.channels_[c].treeUp; }
int CollLinks::treeDown(int c, int i) const { return c_.channels_[c].treeDown[i]; }

int CollLinks::send(int c, int peer, const void* buf, size_t bytes, Proto proto, bool staged,
                    collectives::Copier copier) {
  // A push goes into the peer's output (an in-place 2-rank Broadcast's second half), which nobody reads during the
  // call: a large collective's copy may bypass the caches.
  ops_.push_back(c_.makeLinkOp(true, c, peer, const_cast<void*>(buf), bytes, proto, staged, pool_, copier,
                               streamOutputs_ && copier == collectives::Copier::kPush));
  return static_cast<int>(ops_.size()) - 1;
}

int CollLinks::recv(int c, int peer, void* buf, size_t bytes, Proto proto, bool staged) {
  // What lands outside the scratch slots is a part of the output, which this rank does not read again (the slots
  // are reduced from at once): a large collective's single copies may bypass the caches.
  const auto* b = static_cast<const char*>(buf);
  const bool inScratch = scratch_ && b >= scratch_ && b < scratch_ + scratchBytes_;
  ops_.push_back(c_.makeLinkOp(false, c, peer, buf, bytes, proto, staged, pool_, collectives::Copier::kAny,
                               streamOutputs_ && !inScratch));
  return static_cast<int>(ops_.size()) - 1;
}

void CollLinks::start() {
  flush(false);
  c_.engine_->poke();
}

void CollLinks::wait(int h) {
  flush(false);
  c_.engine_->wait(*ops_[h]);
}

void CollLinks::waitAll() {
  flush(true);
  raw_.clear();
  for (auto& op : ops_) raw_.push_back(op.get());
  try {
    c_.engine_->waitAll(raw_);  // after an inline run: only throws what failed
  } catch (const Error&) {
    recycle();
    throw;
  }
  recycle();
}

void CollLinks::recycle() {
  for (auto& op : ops_) pool_.give(std::move(op));
  ops_.clear();
  posted_ = 0;
}

void CollLinks::beginCollective(bool streamOutputs) {
  streamOutputs_ = streamOutputs;
  mapped_.clear();
}

namespace {
constexpr uint64_t kPeerBufferMagic = 0x7463636c70627566ull;  // "tcclpbuf"
}  // namespace

bool CollLinks::describeBuffer(const void* p, size_t bytes, collectives::PeerBuffer* out) {
  const transport::RegionRef r = transport::regionOf(p, bytes);
  if (r.fd < 0 || !c_.ctx_->cfg.mapPeerBuffers) return false;
  *out = {};
  out->words[0] = kPeerBufferMagic;
  out->words[1] = r.owner;
  out->words[2] = r.serial;
  out->words[3] = r.base;
  out->words[4] = r.len;
  out->words[5] = static_cast<uint64_t>(r.fd);
  out->words[6] = reinterpret_cast<uint64_t>(p);
  out->words[7] = bytes;
  return true;
}

const char* CollLinks::mapPeerBuffer(int peer, const collectives::PeerBuffer& b, size_t bytes) {
  if (b.words[0] != kPeerBufferMagic || b.words[7] != bytes || peer < 0 || peer >= c_.nRanks_ || peer == c_.rank_)
    return nullptr;
  // Only where this pair's single copies may map each other's buffers: P2P between two processes of the host
  // (not SHM, which NCCL_P2P_DISABLE asks for; not NET), with TOPOCOLL_MAP_PEER_BUFFERS on.
  const transport::Connector* conn = c_.linkConnector(0, peer, false);
  if (!conn || !(conn->conn.flags & transport::kConnMapPeer)) return nullptr;
  transport::RegionRef r;
  r.owner = b.words[1];
  r.serial = b.words[2];
  r.base = b.words[3];
  r.len = b.words[4];
  r.fd = b.words[5] > 0x7fffffffu ? -1 : static_cast<int32_t>(b.words[5]);
  auto m = transport::mapPeerRegion(conn->conn.peerPid, r, b.words[6], b.words[7]);
  if (!m) return nullptr;
  mapped_.push_back(m);
  return m->at(r, b.words[6]);
}

void CollLinks::connectAll() {
  if (allConnected_) return;
  std::vector<int> peers;
  for (int p = 0; p < c_.nRanks_; ++p)
    if (p != c_.rank_) peers.push_back(p);
  c_.ensureConnected(peers);
  allConnected_ = true;
}

char* CollLinks::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    memFree(scratch_, scratchBytes_);
    scratch_ = nullptr;
    scratchBytes_ = 0;
    scratch_ = static_cast<char*>(memAlloc(bytes));
    scratchBytes_ = bytes;
  }
  return scratch_;
}

void CollLinks::drain() {
  raw_.clear();
  for (size_t i = 0; i < posted_; ++i) raw_.push_back(ops_[i].get());
  if (!raw_.empty()) {
    TC_INFO(log::kColl, "rank {}: the collective failed: draining its {} posted transfers", c_.rank_, raw_.size());
    c_.engine_->drain(raw_);
  }
  recycle();
}

bool CollLinks::flush(bool all) {
  if (posted_ == ops_.size()) return false;
  if (all && posted_ == 0 && ops_.size() <= 8) {
    raw_.clear();
    for (auto& op : ops_) raw_.push_back(op.get());
    if (c_.engine_->runInlineGroup(raw_)) {
      posted_ = ops_.size();
      return true;
    }
  }
  fresh_.assign(ops_.begin() + static_cast<std::ptrdiff_t>(posted_), ops_.end());
  c_.engine_->post(fresh_, false);
  fresh_.clear();
  posted_ = ops_.size();
  return false;
}

}  // namespace detail

namespace {
// Largest collective step sent eagerly (see makeLinkOp).
constexpr size_t kEagerMaxBytes = 64 << 10;
}  // namespace

transport::Connector* Communicator::linkConnector(int channel, int peer, bool send) {
  const Side side = send ? Side::kSend : Side::kRecv;
  if (channel < static_cast<int>(channels_.size())) {
    transport::Connector& k = channels_[channel].connector(peer, side, 0);
    // NET ring connectors carry no acknowledgements (a send completes when its proxy sent it), so a rank could
    // finish and close while its last message is still on the way: NET uses the point-to-point connectors, whose
    // sends complete when the receiver consumed them (connected by execute() before the algorithm runs).
    if (k.connected && !(k.conn.flags & transport::kConnNet)) return &k;
  }
  ensureConnected(peer);
  const auto& conns = p2pConnectors(peer, side);
  return conns[static_cast<size_t>(channel) % conns.size()];
}

std::shared_ptr<Op> Communicator::makeLinkOp(bool send, int channel, int peer, void* buf, size_t bytes, Proto proto,
                                             bool staged, detail::OpPool& pool,
                                             collectives::Copier copier, bool streamStores) {
  transport::Connector* conn = linkConnector(channel, peer, send);
  std::shared_ptr<Op> op = pool.take();
  op->send = send;
  op->peer = peer;
  op->buf = buf;
  op->count = op->bytes = bytes;
  op->dtype = DataType::kUint8;
  const Config& cfg = ctx_->cfg;
  // The ranks of a collective run the same steps: a small send completes once its data is in the peer's FIFO (one
  // trip instead of two). Large ones wait for the ack: a sender that runs ahead of its receiver by whole slices
  // competes with it for the cores and the cache (2-rank AllReduce at 16-64 MiB took 1.5-3x longer eager).
  op->opts.eager = bytes <= kEagerMaxBytes;
  op->opts.llThreshold = proto == Proto::kLL ? std::numeric_limits<size_t>::max() : 0;
  op->opts.chunkBytes = p2pChunk_;
  op->opts.netChunkBytes = static_cast<size_t>(cfg.netChunkSize);
  // Slices the receiver reduces go through the FIFOs: faster than single copies (process_vm_readv pins pages per
  // call) at these sizes, and the data stays in the cache (docs/collectives.md). Data that lands where it stays
  // takes single copies.
  op->opts.singleCopyMin = staged ? -1 : cfg.p2pSingleCopy;
  op->opts.streamStores = streamStores;
  using Single = transport::TransferOptions::Single;
  op->opts.single = copier == collectives::Copier::kPull   ? Single::kPull
                    : copier == collectives::Copier::kPush ? Single::kPush
                                                           : Single::kAsConnector;
  transport::MessageDesc d;
  d.bytes = d.partBytes = d.count = bytes;
  d.dtype = DataType::kUint8;
  if (!send) {
    op->partDescs.push_back(d);
    op->partConns.push_back(conn);
  }
  detail::OpPool::setPart(*op, *conn, send ? transport::Transfer::Dir::kSend : transport::Transfer::Dir::kRecv, buf, d,
                          op->opts, !send);
  return op;
}

namespace {

int tuningColl(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return tuning::kAllReduce;
    case Coll::kBroadcast: return tuning::kBroadcast;
    case Coll::kReduce: return tuning::kReduce;
    case Coll::kAllGather: return tuning::kAllGather;
    case Coll::kReduceScatter: return tuning::kReduceScatter;
  }
  return tuning::kAllReduce;
}

}  // namespace

Choice Communicator::choose(const Args& a) const {
  const Config& cfg = ctx_->cfg;
  Choice c;
  // Slices of blocks this size keep the block a rank receives in the cache until it is reduced (2 MiB L2 here).
  c.chunkBytes = std::max<size_t>(4096, static_cast<size_t>(cfg.buffSize) / (transport::kSteps * 4));
  // The host cost model (calibrated constants) picks among what NCCL_ALGO, NCCL_PROTO, NCCL_MIN/MAX_NCHANNELS and
  // TOPOCOLL_DIRECT_MAX leave. Every rank computes the same choice from the same job facts and knobs.
  tuning::HostQuery q;
  q.coll = tuningColl(a.coll);
  q.link = hostLink_;
  q.nRanks = nRanks_;
  q.bytes = collectives::collBytes(a, nRanks_);
  q.chunkBytes = c.chunkBytes;
  tuning::HostChoice h = tuning::hostSelect(hostModel_, q, hostLimits_);
  c.algo = h.algo == tuning::kHostDirect ? Algo::kDirect : h.algo == tuning::kTree ? Algo::kTree : Algo::kRing;
  c.proto = h.proto == tuning::kLL ? Proto::kLL : Proto::kSimple;
  c.nChannels = h.nChannels;
  // DirectSplit (off unless TOPOCOLL_DIRECT_SPLIT_MIN is set, not in the model yet): one-host AllReduce the model
  // gave to the ring or the tree, from that size and rank count, when NCCL_ALGO leaves the choice.
  if (c.algo != Algo::kDirect && a.coll == Coll::kAllReduce && cfg.algo.empty() && hosts_.size() == 1 &&
      nRanks_ <= collectives::kDirectMaxRanks && cfg.directSplitMin >= 0 &&
      q.bytes >= static_cast<size_t>(cfg.directSplitMin) && nRanks_ >= cfg.directSplitRanks) {
    c.algo = Algo::kDirectSplit;
    size_t perMessage = std::min(q.bytes / static_cast<size_t>(nRanks_), c.chunkBytes);
    c.proto = cfg.proto.empty() ? (perMessage <= static_cast<size_t>(cfg.p2pLlThreshold) ? Proto::kLL : Proto::kSimple)
                                : c.proto;
  }
  // On one host between more than 2 ranks, Broadcast, AllReduce, AllGather and ReduceScatter from their star
  // thresholds: every rank pulls what it needs straight out of the peers' buffers (Direct) instead of the chain or
  // the ring, when NCCL_ALGO leaves the choice and TOPOCOLL_DIRECT_SPLIT_MIN did not pick DirectSplit
  // (docs/collectives.md, "Algorithms"). The model has no constants for these yet.
  if (cfg.algo.empty() && c.algo != Algo::kDirectSplit && hosts_.size() == 1 && collectives::starApplies(a, nRanks_))
    c.algo = Algo::kDirect;
  TC_INFO(log::kTuning, "{}: {} Bytes -> Algo {} proto {} channel{{Lo..Hi}}={{0..{}}} (model {:.1f} us, {})",
          collectives::collName(a.coll), q.bytes, collectives::algoName(c.algo), collectives::protoName(c.proto),
          c.nChannels - 1, h.timeUs, tuning::hostLinkName(q.link));
  return c;
}

void Communicator::checkCollArgs(const Args& a) const {
  const char* name = collectives::collName(a.coll);
  if (abort_.load()) fail(StatusCode::kAborted, "rank {}: {} on an aborted communicator", rank_, name);
  if (!isValid(a.type))
    fail(StatusCode::kInvalidArgument, "rank {}: {}: unknown data type {}", rank_, name, static_cast<int>(a.type));
  if (static_cast<int>(a.op) < 0 || static_cast<int>(a.op) >= kNumRedOps)
    fail(StatusCode::kInvalidArgument, "rank {}: {}: unknown reduction op {}", rank_, name, static_cast<int>(a.op));
  bool rooted = a.coll == Coll::kBroadcast || a.coll == Coll::kReduce;
  if (rooted && (a.root < 0 || a.root >= nRanks_))
    fail(StatusCode::kInvalidArgument, "rank {}: {}: root {} is not a rank (the communicator has {})", rank_, name,
         a.root, nRanks_);
  size_t es = sizeOf(a.type);
  size_t mult = a.coll == Coll::kAllGather || a.coll == Coll::kReduceScatter ? static_cast<size_t>(nRanks_) : 1;
  if (a.count > std::numeric_limits<size_t>::max() / es / mult)
    fail(StatusCode::kInvalidArgument, "rank {}: {} of {} elements of {}: the size overflows", rank_, name, a.count,
         to_string(a.type));
  if (a.count > 0) {
    bool needSend = !(a.coll == Coll::kBroadcast && rank_ != a.root);
    bool needRecv = !(a.coll == Coll::kReduce && rank_ != a.root);
    if (needSend && !a.send) fail(StatusCode::kInvalidArgument, "rank {}: {}: sendbuff is null", rank_, name);
    if (needRecv && !a.recv) fail(StatusCode::kInvalidArgument, "rank {}: {}: recvbuff is null", rank_, name);
  }
}

std::shared_ptr<CollTask> Communicator::makeCollTask(const Args& a) {
  checkCollArgs(a);
  auto t = std::make_shared<CollTask>();
  t->comm = this;
  t->args = a;
  return t;
}

void Communicator::execute(CollTask& t) {
  const Args& a = t.args;
  try {
    if (abort_.load()) fail(StatusCode::kAborted, "the communicator was aborted");
    if (ctx_->cfg.checkCalls) {
      struct Sig {
        int32_t coll, type, op, root;
        uint64_t count;
      };
      std::vector<Sig> all(nRanks_);
      bool rooted = a.coll == Coll::kBroadcast || a.coll == Coll::kReduce;
      bool reduces = a.coll != Coll::kBroadcast && a.coll != Coll::kAllGather;
      all[rank_] = {static_cast<int32_t>(a.coll), static_cast<int32_t>(a.type), reduces ? static_cast<int32_t>(a.op) : -1,
                    rooted ? a.root : -1, a.count};
      {
        std::lock_guard<std::mutex> lock(setupMu_);
        bs_->allGather(all.data(), sizeof(Sig));
      }
      auto describe = [](const Sig& s) {
        return fmt::format("{}(count {}, {}{}{})", collectives::collName(static_cast<Coll>(s.coll)), s.count,
                           to_string(static_cast<DataType>(s.type)),
                           s.op >= 0 ? fmt::format(", {}", to_string(static_cast<RedOp>(s.op))) : "",
                           s.root >= 0 ? fmt::format(", root {}", s.root) : "");
      };
      for (int r = 0; r < nRanks_; ++r)
        if (std::memcmp(&all[r], &all[rank_], sizeof(Sig)) != 0)
          fail(StatusCode::kInvalidUsage, "rank {} called {} while rank {} called {}", rank_, describe(all[rank_]), r,
               describe(all[r]));
    }
    if (!(oneShotFits(a) && runOneShot(a))) {
      if (hosts_.size() > 1 && a.count > 0) links_->connectAll();  // see makeLinkOp
      collectives::run(*links_, a, choose(a));
    }
    t.finish(StatusCode::kOk, "");
  } catch (const Error& e) {
    links_->drain();
    t.finish(e.code(), fmt::format("rank {}: {} of {} x {}: {}", rank_, collectives::collName(a.coll), a.count,
                                   to_string(a.type), e.what()));
  } catch (const std::exception& e) {
    links_->drain();
    t.finish(StatusCode::kInternal, fmt::format("rank {}: {}: {}", rank_, collectives::collName(a.coll), e.what()));
  }
}

// The collective lock. One collective runs at a time: collMu_, held by the thread that runs it. A mutex costs two
// locked instructions per call, and a locked instruction waits until this core's stores have left it: after a
// one-shot publish, until the peers' mailbox lines (which they poll) came over, as long as the fence it replaced
// (docs/transport.md, "Threads and waiting"). So the thread that issues the blocking collectives (the first to call
// one: the owner) enters with plain stores, on the asymmetric fence of doorbell.cc:
//   owner:           collFast_ = 1;    [compiler barrier]; read collForeign_ and queued_ -> both 0: inside
//   any other thread: collForeign_++;  membarrier();       collMu_.lock(); wait until collFast_ == 0: inside
// (the owner's fast exit: collFast_ = 0, release). The doorbell's three cases apply: an owner that saw no foreign
// thread and a foreign thread that saw the owner outside are never both inside. The collective thread runs a task
// submitted by the owner with collMu_ alone: the task counts in queued_ from its submission (by the owner, so before
// any later fast entry in its program order) until it finished, and the owner's fast entry checks queued_, then waits
// for the queue and takes collMu_ like everybody else. Tasks of other threads take the foreign path. Where membarrier
// is unavailable (or TOPOCOLL_MEMBARRIER=0) there is no owner and everybody takes collMu_. Should membarrier fail
// after registration (a seccomp filter installed later), the foreign thread turns the fast path off and waits 1 ms
// before reading collFast_: an owner inside has made its store visible by then (x86: stores leave the store buffer
// in nanoseconds; not a C++ guarantee).
bool Communicator::collOwner() {
  const auto me = static_cast<uintptr_t>(pthread_self());
  uintptr_t o = collOwner_.load(std::memory_order_relaxed);
  if (o == me) return true;
  if (o != 0 || ctx_->cfg.membarrier == 0 || !transport::Doorbell::membarrierRegistered()) return false;
  return collOwner_.compare_exchange_strong(o, me);
}

Communicator::CollHold::CollHold(Communicator& c, bool foreign) : comm(c), mode(CollHoldMode::kLocked) {
  const bool owner = !foreign && c.collOwner();
  if (owner) {
    c.collFast_.store(1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (c.collForeign_.load(std::memory_order_acquire) == 0 && c.queued_.load(std::memory_order_acquire) == 0) {
      mode = CollHoldMode::kFast;
      return;
    }
    c.collFast_.store(0, std::memory_order_release);
  }
  if (!foreign && c.queued_.load(std::memory_order_acquire) != 0) {  // the collective thread's queue first
    std::unique_lock<std::mutex> lock(c.queueMu_);
    c.queueCv_.wait(lock, [&] { return c.queued_ == 0; });
  }
  if (owner) {
    c.collMu_.lock();
    return;
  }
  mode = CollHoldMode::kForeign;
  c.collForeign_.fetch_add(1, std::memory_order_seq_cst);
  const uintptr_t o = c.collOwner_.load(std::memory_order_seq_cst);
  if (o != 0 && o != ~uintptr_t{0} && !transport::membarrierAll()) {
    c.collOwner_.store(~uintptr_t{0}, std::memory_order_relaxed);  // matches no thread: no fast path from now on
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  c.collMu_.lock();
  while (c.collFast_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

Communicator::CollHold::~CollHold() {
  if (mode == CollHoldMode::kFast) {
    comm.collFast_.store(0, std::memory_order_release);
    return;
  }
  comm.collMu_.unlock();
  if (mode == CollHoldMode::kForeign) comm.collForeign_.fetch_sub(1, std::memory_order_release);
}

void Communicator::runNow(CollTask& t) {
  CollHold hold(*this);
  if (!links_) links_ = std::make_unique<detail::CollLinks>(*this);
  execute(t);
}

bool Communicator::runOneShotNow(const Args& a) {
  CollHold hold(*this);
  try {
    if (abort_.load()) fail(StatusCode::kAborted, "the communicator was aborted");
    return runOneShot(a);
  } catch (const Error& e) {
    fail(e.code(), "rank {}: {} of {} x {}: {}", rank_, collectives::collName(a.coll), a.count, to_string(a.type),
         e.what());
  }
}

void Communicator::submit(const std::shared_ptr<CollTask>& t) {
  std::lock_guard<std::mutex> lock(queueMu_);
  if (collStop_) {
    t->finish(StatusCode::kAborted, fmt::format("rank {}: the communicator is being destroyed", rank_));
    return;
  }
  if (!collThread_.joinable()) collThread_ = std::thread([this] { collLoop(); });
  t->byOwner = collOwner_.load(std::memory_order_relaxed) == static_cast<uintptr_t>(pthread_self());
  queue_.push_back(t);
  ++queued_;
  queueCv_.notify_all();
}

void Communicator::collLoop() {
  log::setThreadRank(rank_);
  std::unique_lock<std::mutex> lock(queueMu_);
  for (;;) {
    queueCv_.wait(lock, [&] { return collStop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto t = queue_.front();
    queue_.pop_front();
    lock.unlock();
    if (collStop_) {
      t->finish(StatusCode::kAborted, fmt::format("rank {}: the communicator was destroyed", rank_));
    } else if (t->byOwner) {  // the owner is not on the fast path: its task counts in queued_
      std::lock_guard<std::mutex> run(collMu_);
      if (!links_) links_ = std::make_unique<detail::CollLinks>(*this);
      execute(*t);
    } else {
      CollHold run(*this, true);
      if (!links_) links_ = std::make_unique<detail::CollLinks>(*this);
      execute(*t);
    }
    lock.lock();
    --queued_;
    queueCv_.notify_all();
  }
}

void Communicator::stopCollectives() {
  bool busy;
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    collStop_ = true;
    busy = queued_ > 0;
    queueCv_.notify_all();
  }
  if (busy) abort();  // what is still queued or running fails (kAborted)
  if (collThread_.joinable()) collThread_.join();
  links_.reset();
}

Request Communicator::collective(const Args& a, bool blocking) {
  if (onDevice(a)) {  // device buffers: run now, whatever the form (docs/gpu.md, "Device collectives")
    if (blocking && groupDepth() == 0) {
      runDevice(a);
      return Request();
    }
    auto t = std::make_shared<CollTask>();
    t->comm = this;
    t->args = a;
    try {
      runDevice(a);
      t->finish(StatusCode::kOk, "");
    } catch (const Error& e) {
      t->finish(e.code(), e.what());
    }
    return Request(t);
  }
  if (blocking && groupDepth() == 0) {  // the latency path: nothing allocated here
    checkCollArgs(a);
    // The smallest: no task, straight to the mailboxes (unless the ranks found some lack them: then the engine).
    if (!ctx_->cfg.checkCalls && oneShotFits(a) && runOneShotNow(a)) return Request();
    CollTask t;
    t.comm = this;
    t.args = a;
    runNow(t);
    t.wait();
    return Request();
  }
  auto t = makeCollTask(a);
  if (groupDepth() > 0) {
    detail::addToGroup(this, t);
    return Request(t);
  }
  submit(t);
  return Request(t);
}

namespace {
Args args(Coll c, const void* s, void* r, size_t n, DataType t, RedOp op = RedOp::kSum, int root = 0,
          void* stream = nullptr) {
  Args a;
  a.stream = stream;
  a.coll = c;
  a.send = s;
  a.recv = r;
  a.count = n;
  a.type = t;
  a.op = op;
  a.root = root;
  return a;
}
}  // namespace

Request Communicator::iallReduce(const void* s, void* r, size_t n, DataType t, RedOp op) {
  return collective(args(Coll::kAllReduce, s, r, n, t, op), false);
}
Request Communicator::ibroadcast(const void* s, void* r, size_t n, DataType t, int root) {
  return collective(args(Coll::kBroadcast, s, r, n, t, RedOp::kSum, root), false);
}
Request Communicator::ireduce(const void* s, void* r, size_t n, DataType t, RedOp op, int root) {
  return collective(args(Coll::kReduce, s, r, n, t, op, root), false);
}
Request Communicator::iallGather(const void* s, void* r, size_t n, DataType t) {
  return collective(args(Coll::kAllGather, s, r, n, t), false);
}
Request Communicator::ireduceScatter(const void* s, void* r, size_t n, DataType t, RedOp op) {
  return collective(args(Coll::kReduceScatter, s, r, n, t, op), false);
}
void Communicator::allReduce(const void* s, void* r, size_t n, DataType t, RedOp op, void* stream) {
  collective(args(Coll::kAllReduce, s, r, n, t, op, 0, stream), true);
}
void Communicator::broadcast(const void* s, void* r, size_t n, DataType t, int root, void* stream) {
  collective(args(Coll::kBroadcast, s, r, n, t, RedOp::kSum, root, stream), true);
}
void Communicator::reduce(const void* s, void* r, size_t n, DataType t, RedOp op, int root, void* stream) {
  collective(args(Coll::kReduce, s, r, n, t, op, root, stream), true);
}
void Communicator::allGather(const void* s, void* r, size_t n, DataType t, void* stream) {
  collective(args(Coll::kAllGather, s, r, n, t, RedOp::kSum, 0, stream), true);
}
void Communicator::reduceScatter(const void* s, void* r, size_t n, DataType t, RedOp op, void* stream) {
  collective(args(Coll::kReduceScatter, s, r, n, t, op, 0, stream), true);
}

void Communicator::allToAll(const void* sendbuff, void* recvbuff, size_t count, DataType type, void* stream) {
  if (!isValid(type))
    fail(StatusCode::kInvalidArgument, "rank {}: AllToAll: unknown data type {}", rank_, static_cast<int>(type));
  if (count > 0 && cuda::deviceCount() > 0) {
    auto s = cuda::locate(sendbuff).kind, r = cuda::locate(recvbuff).kind;
    if ((s == cuda::MemoryKind::kHost) != (r == cuda::MemoryKind::kHost))
      fail(StatusCode::kInvalidArgument, "rank {}: AllToAll: sendbuff is {} memory but recvbuff is {} memory", rank_,
           s == cuda::MemoryKind::kHost ? "host" : "device", r == cuda::MemoryKind::kHost ? "host" : "device");
    if (s != cuda::MemoryKind::kHost) return runDeviceAllToAll(sendbuff, recvbuff, count, type, stream);
  }
  size_t bytes = count * sizeOf(type);
  // In place (or overlapping): a block may arrive before it left, so the input is copied aside first. Inside a group
  // the copy lives until the group ends (the operations use it then).
  const char* src = static_cast<const char*>(sendbuff);
  size_t total = bytes * static_cast<size_t>(nRanks_);
  if (total && src < static_cast<const char*>(recvbuff) + total && static_cast<const char*>(recvbuff) < src + total) {
    auto copy = std::make_shared<std::vector<char>>(src, src + total);
    src = copy->data();
    allToAllCopies_.push_back(std::move(copy));
  }
  groupStart();
  try {
    for (int i = 0; i < nRanks_; ++i) {
      int to = (rank_ + i) % nRanks_, from = (rank_ - i + nRanks_) % nRanks_;
      send(src + to * bytes, count, type, to);
      recv(static_cast<char*>(recvbuff) + from * bytes, count, type, from);
    }
  } catch (...) {
    groupEnd();
    throw;
  }
  groupEnd();
  if (groupDepth() == 0) allToAllCopies_.clear();  // inside an outer group: kept until it ended
}

void Communicator::barrier() {
  if (groupDepth() > 0) fail(StatusCode::kInvalidUsage, "rank {}: barrier() inside a group", rank_);
  uint8_t in = 0, out = 0;
  allReduce(&in, &out, 1, DataType::kUint8, RedOp::kMax);
}

}  // namespace topocoll::runtime
