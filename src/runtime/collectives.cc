// Collectives on the communicator: argument checks, the choice of algorithm, protocol and channels (NCCL 2.30.7
// src/enqueue.cc topoGetAlgoInfo's role), issue order (a collective thread for asynchronous ones) and groups. The
// algorithms (collectives layer) move data through the progress layer's ChannelLinks.
#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>
#include <tuple>

#include "coll_task.h"
#include "topocoll/collectives/device_coll.h"
#include "topocoll/cuda.h"
#include "topocoll/log.h"
#include "topocoll/progress/channel_links.h"
#include "topocoll/progress/connections.h"
#include "topocoll/progress/engine.h"
#include "topocoll/progress/mailboxes.h"
#include "comm_impl.h"
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

tuning::HostCall CommImpl::hostCall(const Args& a, bool mailboxes) const {
  tuning::HostCall call;
  call.coll = tuningColl(a.coll);
  call.rankBytes = a.count * sizeOf(a.type);
  call.bytes = collectives::collBytes(a, nRanks_);
  call.linkChannels = conns_->nRingChannels();
  call.mailboxes = mailboxes;
  return call;
}

bool CommImpl::oneShotFits(const Args& a) const {
  // Every rank decides alike: the same arguments, knobs and job facts, and the mailboxes the ranks agreed on.
  const tuning::HostCall call = hostCall(a, hostMemory() && !mailboxes_->off());
  if (!tuning::hostOneShot(hostPolicy_, call)) return false;
  if (log::enabled(log::Level::kInfo, log::kTuning))
    TC_INFO(log::kTuning, "{}", tuning::describe(hostPolicy_, call, tuning::hostDecide(hostPolicy_, call)));
  return true;
}

// The engine's choice for `a`, made in one place (tuning::hostDecide); every rank computes the same from the same
// call, knobs and job facts. The one-shot path is hostDecide's first rule, asked alone by oneShotFits before the
// engine: a call that reaches the engine does not take it.
Choice CommImpl::choose(const Args& a) const {
  const tuning::HostCall call = hostCall(a, false);
  const tuning::HostDecision d = tuning::hostDecide(hostPolicy_, call);
  if (log::enabled(log::Level::kInfo, log::kTuning)) TC_INFO(log::kTuning, "{}", tuning::describe(hostPolicy_, call, d));
  Choice c;
  c.algo = d.algo == tuning::kHostDirect        ? Algo::kDirect
           : d.algo == tuning::kHostDirectSplit ? Algo::kDirectSplit
           : d.algo == tuning::kTree            ? Algo::kTree
                                                : Algo::kRing;
  c.proto = d.proto == tuning::kLL ? Proto::kLL : Proto::kSimple;
  c.nChannels = d.nChannels;
  c.chunkBytes = d.chunkBytes;
  c.star = d.star;
  c.pair = d.pair;
  c.mapPeers = d.mapPeers;
  c.mapOutputs = d.mapOutputs;
  c.acrossHosts = hostPolicy_.link == tuning::HostLink::kNet;
  return c;
}

double CommImpl::simulateUs(const Args& a) const {
  const tuning::HostCall call = hostCall(a, hostMemory() && mailboxes_ && !mailboxes_->off());
  const tuning::HostDecision d = tuning::hostDecide(hostPolicy_, call);
  if (d.timeUs > 0) return d.timeUs;
  // Paths the table has no row for (the one-shot mailboxes, Direct): the model's Ring Simple on one channel.
  const tuning::HostQuery q = hostPolicy_.query(call.coll, nRanks_, call.bytes);
  return std::max(0.0, tuning::hostTime(hostPolicy_.model, q, tuning::kRing, tuning::kSimple, 1));
}

double CommImpl::simulateP2pUs(size_t bytes) const {
  if (nRanks_ < 2) return 0;
  const tuning::HostQuery q = hostPolicy_.query(tuning::kBroadcast, 2, bytes);
  return std::max(0.0, tuning::hostTime(hostPolicy_.model, q, tuning::kRing, tuning::kSimple, 1));
}

void CommImpl::checkCollArgs(const Args& a) const {
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

std::shared_ptr<CollTask> CommImpl::makeCollTask(const Args& a) {
  checkCollArgs(a);
  auto t = std::make_shared<CollTask>();
  t->comm = this;
  t->args = a;
  return t;
}

void CommImpl::execute(CollTask& t) {
  Args& a = t.args;
  a.seq = collSeq_++;  // in execution order, the same on every rank
  bool onEngine = false;  // the error came from the ranks' transfers (others may wait for this rank)
  try {
    if (abort_.load()) fail(StatusCode::kAborted, "the communicator was aborted");
    if (std::string why; jobFailure(&why)) fail(StatusCode::kRemoteError, "{}", why);
    if (conns_->config().checkCalls) {
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
        std::lock_guard<std::mutex> lock(conns_->setupMutex());
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
    curSeq_.store(a.seq, std::memory_order_relaxed);
    curCall_.store(collectives::callSignature(a), std::memory_order_release);  // for onStall
    if (!(oneShotFits(a) && collectives::runOneShot(*links_, a))) {
      if (hosts_.size() > 1 && a.count > 0) links_->connectAll();  // see Connections::linkConnector
      onEngine = true;
      collectives::run(*links_, a, choose(a));
    }
    curCall_.store(0, std::memory_order_release);
    t.finish(StatusCode::kOk, "");
  } catch (const Error& e) {
    const std::string call = fmt::format("rank {}: {} of {} x {}", rank_, collectives::collName(a.coll), a.count,
                                         to_string(a.type));
    StatusCode code = e.code();
    std::string why = e.what();
    // Told before the drain: this rank's leftovers may wait for peers that only the word of the failure stops.
    if (onEngine && code != StatusCode::kAborted && code != StatusCode::kInvalidArgument)
      std::tie(code, why) = relayFailure(code, why, call);
    links_->drain();
    curCall_.store(0, std::memory_order_release);
    t.finish(code, fmt::format("{}: {}", call, why));
  } catch (const std::exception& e) {
    links_->drain();
    t.finish(StatusCode::kInternal, fmt::format("rank {}: {}: {}", rank_, collectives::collName(a.coll), e.what()));
  }
}

// The ranks of a collective wait for each other: a rank whose transfers failed tells the job (the bootstrap's abort,
// which every rank's stalled operations see, Engine::Options::jobFailed), so that every rank fails at once and names
// the first failure, not the neighbour that left because of it. A broken connection is often that neighbour leaving:
// its word comes first when it is on the way (kRelayGrace). From then on every call of the communicator fails with
// the job's failure.
std::pair<StatusCode, std::string> CommImpl::relayFailure(StatusCode code, const std::string& why,
                                                          const std::string& call) {
  std::string first;
  const auto grace = code == StatusCode::kRemoteError ? kRelayGrace : std::chrono::milliseconds(0);
  if (bs_->failedElsewhere(&first, grace)) {
    bs_->relay(first);  // this rank leaves because of it: its neighbours hear why first
    first = "the job failed: " + first;
    code = StatusCode::kRemoteError;
  } else {
    if (code == StatusCode::kTimeout) {
      if (std::string stuck = stuckRank(); !stuck.empty()) first = stuck + ": " + why;
      else first = why;
    } else {
      first = why;
    }
    bs_->abort(fmt::format("{}: {}", call, first));
    engine_->setJobFailure(code, fmt::format("this rank's call failed: {}", why));  // its leftovers stop at once too
  }
  std::lock_guard<std::mutex> lock(jobMu_);
  if (jobWhy_.empty()) {
    jobWhy_ = first;
    jobCode_ = code;
  }
  jobFailed_.store(true, std::memory_order_release);
  return {code, first};
}

namespace {
constexpr int kTagCallCheck = 0x7ffffff0;  // bootstrap tag of CommImpl::CallNote
}  // namespace

bool CommImpl::onStall(std::chrono::steady_clock::duration stalled, int peer, StatusCode* code, std::string* why) {
  std::string w;
  if (bs_->failedElsewhere(&w)) {
    *code = StatusCode::kRemoteError;
    *why = "the job failed: " + w;
    return true;
  }
  const uint64_t call = curCall_.load(std::memory_order_acquire), seq = curSeq_.load(std::memory_order_relaxed);
  if (!call) return false;
  std::unique_lock<std::mutex> lock(stallMu_, std::try_to_lock);  // the engine's driver and a mailbox exchange
  if (!lock.owns_lock()) return false;
  if (notesSeq_ != seq) {
    notesSeq_ = seq;
    waitsOn_ = -1;
  }
  if (peer >= 0) waitsOn_ = peer;
  auto keep = [&](int from, const CallNote& n) {  // each peer's latest note
    if (from < 0 || from >= nRanks_) return;
    auto it = notes_.find(from);
    if (it == notes_.end() || it->second.seq <= n.seq) notes_[from] = n;
  };
  auto differs = [&](int from, const CallNote& n) {
    if (n.seq != seq || n.call == call) return false;
    *code = StatusCode::kInvalidUsage;
    *why = fmt::format("the ranks' calls differ: this rank called {} while rank {} called {}",
                       collectives::describeCall(call), from, collectives::describeCall(n.call));
    return true;
  };
  try {
    if (stalled >= kCallCheckAfter && announced_ != seq + 1) {
      announced_ = seq + 1;
      const CallNote mine{seq, call, waitsOn_};
      TC_INFO(log::kColl, "rank {}: {} stalled for {:.1f} s: telling the peers, who compare it with theirs", rank_,
              collectives::describeCall(call), std::chrono::duration<double>(stalled).count());
      // Every peer that can be reached hears it: one that cannot (its host cut off, or gone) is named as what
      // failed, with its host and the host's other ranks (skipped: they cannot be reached either), rather than ending
      // the notes at the first such peer and leaving the others to blame a live neighbour.
      int unreachable = -1;
      std::string unreachableWhy;
      StatusCode unreachableCode = StatusCode::kRemoteError;
      for (int p = 0; p < nRanks_; ++p) {
        if (p == rank_ || (unreachable >= 0 && peers_[p].hostHash == peers_[unreachable].hostHash)) continue;
        try {
          bs_->send(p, kTagCallCheck, &mine, sizeof mine);
        } catch (const Error& e) {
          if (std::string w; bs_->failedElsewhere(&w)) {  // not this peer: the job's failure, told meanwhile
            *code = StatusCode::kRemoteError;
            *why = "the job failed: " + w;
            return true;
          }
          if (unreachable >= 0) continue;
          unreachable = p;
          unreachableWhy = e.what();
          if (e.code() == StatusCode::kAborted) unreachableCode = e.code();
        }
      }
      if (unreachable >= 0) {
        *code = unreachableCode;
        *why = fmt::format("rank {}{} cannot be reached: {}", unreachable, hostOfRank(unreachable), unreachableWhy);
        return true;
      }
    }
    std::erase_if(laterNotes_, [&](const auto& n) { return n.second.seq < seq; });
    for (const auto& [from, n] : laterNotes_) {
      if (n.seq == seq) keep(from, n);
      if (differs(from, n)) return true;
    }
    CallNote n;
    int from = -1;
    while (bs_->tryRecvAny(kTagCallCheck, &from, &n, sizeof n)) {
      if (n.seq > seq) laterNotes_.emplace_back(from, n);
      else keep(from, n);
      if (differs(from, n)) return true;
    }
  } catch (const Error& e) {  // a peer is gone (the bootstrap told the others)
    *code = e.code();
    *why = e.what();
    return true;
  }
  return false;
}

std::string CommImpl::stuckRank() {
  std::lock_guard<std::mutex> lock(stallMu_);
  if (waitsOn_ < 0 || notesSeq_ != curSeq_.load(std::memory_order_relaxed)) return "";
  const uint64_t seq = curSeq_.load(std::memory_order_relaxed);
  std::string path = fmt::format("rank {} waits on rank {}", rank_, waitsOn_);
  std::vector<bool> seen(nRanks_, false);
  seen[rank_] = true;
  int r = waitsOn_;
  while (true) {
    seen[r] = true;
    // A peer's latest note: of this call, or of an earlier one it is still stuck in (a peer that moved on to this
    // call and stalled in it as long as this rank would have said so).
    auto it = notes_.find(r);
    if (it == notes_.end() || it->second.seq > seq) break;  // r said nothing: stopped, or stuck outside
    const int next = static_cast<int>(it->second.waitsOn);
    if (next < 0 || next >= nRanks_ || seen[next]) return "";  // no end to follow
    path += fmt::format(", which waits on rank {}{}", next, it->second.seq < seq ? " in an earlier call" : "");
    r = next;
  }
  return fmt::format("rank {}{} is the one stuck ({}, which said nothing while the others waited: it is stopped, "
                     "or stuck outside this communicator)",
                     r, hostOfRank(r), path);
}

std::string CommImpl::hostOfRank(int r) const {
  if (hosts_.size() <= 1 || r < 0 || r >= static_cast<int>(peers_.size())) return "";
  // Across hosts the host is what stopped answering as often as the rank (its link, its machine): named with the
  // ranks it holds, whose calls fail alike.
  std::vector<int> same;
  for (int q = 0; q < static_cast<int>(peers_.size()); ++q)
    if (peers_[q].hostHash == peers_[r].hostHash) same.push_back(q);
  std::string at = bs_->peerHost(r);
  if (at.empty())
    at = fmt::format("#{}", std::find(hosts_.begin(), hosts_.end(), peers_[r].hostHash) - hosts_.begin());
  return fmt::format(" (on host {} with rank{} {})", at, same.size() > 1 ? "s" : "", fmt::join(same, ", "));
}

StatusCode CommImpl::jobCode() {
  std::lock_guard<std::mutex> lock(jobMu_);
  return jobCode_;
}

bool CommImpl::jobFailure(std::string* why) {
  if (!jobFailed_.load(std::memory_order_acquire)) return false;  // one load per call while the job is well
  {
    std::lock_guard<std::mutex> lock(jobMu_);
    if (!jobWhy_.empty()) {
      *why = fmt::format("an earlier call failed, and with it the job: {}", jobWhy_);
      return true;
    }
  }
  return false;
}

progress::ChannelLinks& CommImpl::links() {
  if (!links_) links_ = std::make_unique<progress::ChannelLinks>(*conns_, *engine_, mailboxes_.get());
  return *links_;
}

void CommImpl::runNow(CollTask& t) {
  detail::CollQueue::Hold hold(*collQueue_);
  links();
  execute(t);
}

bool CommImpl::runOneShotNow(const Args& a) {
  detail::CollQueue::Hold hold(*collQueue_);
  struct Current {  // what onStall compares with the peers' calls while this one waits
    CommImpl& c;
    Current(CommImpl& comm, Args x) : c(comm) {
      x.seq = c.collSeq_++;
      c.curSeq_.store(x.seq, std::memory_order_relaxed);
      c.curCall_.store(collectives::callSignature(x), std::memory_order_release);
    }
    ~Current() { c.curCall_.store(0, std::memory_order_release); }
  };
  try {
    if (abort_.load()) fail(StatusCode::kAborted, "the communicator was aborted");
    if (std::string why; jobFailure(&why)) fail(StatusCode::kRemoteError, "{}", why);
    Current current(*this, a);
    if (collectives::runOneShot(links(), a)) return true;
    --collSeq_;  // execute() counts it
    return false;
  } catch (const Error& e) {
    fail(e.code(), "rank {}: {} of {} x {}: {}", rank_, collectives::collName(a.coll), a.count, to_string(a.type),
         e.what());
  }
}

void CommImpl::submit(const std::shared_ptr<CollTask>& t) { collQueue_->submit(t); }

void CommImpl::stopCollectives() {
  if (collQueue_) collQueue_->stop();  // what is still queued or running fails (kAborted)
  links_.reset();
}

Request CommImpl::collective(const Args& a, bool blocking) {
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
    if (!conns_->config().checkCalls && oneShotFits(a) && runOneShotNow(a)) return Request();
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

Request CommImpl::iallReduce(const void* s, void* r, size_t n, DataType t, RedOp op) {
  return collective(args(Coll::kAllReduce, s, r, n, t, op), false);
}
Request CommImpl::ibroadcast(const void* s, void* r, size_t n, DataType t, int root) {
  return collective(args(Coll::kBroadcast, s, r, n, t, RedOp::kSum, root), false);
}
Request CommImpl::ireduce(const void* s, void* r, size_t n, DataType t, RedOp op, int root) {
  return collective(args(Coll::kReduce, s, r, n, t, op, root), false);
}
Request CommImpl::iallGather(const void* s, void* r, size_t n, DataType t) {
  return collective(args(Coll::kAllGather, s, r, n, t), false);
}
Request CommImpl::ireduceScatter(const void* s, void* r, size_t n, DataType t, RedOp op) {
  return collective(args(Coll::kReduceScatter, s, r, n, t, op), false);
}
void CommImpl::allReduce(const void* s, void* r, size_t n, DataType t, RedOp op, void* stream) {
  collective(args(Coll::kAllReduce, s, r, n, t, op, 0, stream), true);
}
void CommImpl::broadcast(const void* s, void* r, size_t n, DataType t, int root, void* stream) {
  collective(args(Coll::kBroadcast, s, r, n, t, RedOp::kSum, root, stream), true);
}
void CommImpl::reduce(const void* s, void* r, size_t n, DataType t, RedOp op, int root, void* stream) {
  collective(args(Coll::kReduce, s, r, n, t, op, root, stream), true);
}
void CommImpl::allGather(const void* s, void* r, size_t n, DataType t, void* stream) {
  collective(args(Coll::kAllGather, s, r, n, t, RedOp::kSum, 0, stream), true);
}
void CommImpl::reduceScatter(const void* s, void* r, size_t n, DataType t, RedOp op, void* stream) {
  collective(args(Coll::kReduceScatter, s, r, n, t, op, 0, stream), true);
}

void CommImpl::allToAll(const void* sendbuff, void* recvbuff, size_t count, DataType type, void* stream) {
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

namespace {

// The device path's view of this communicator: its host-memory collectives, called as a user would call them.
class DeviceHostOf final : public collectives::DeviceHost {
 public:
  explicit DeviceHostOf(CommImpl& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int nRanks() const override { return c_.nRanks(); }
  int nNodes() const override { return c_.nNodes(); }
  const Config& config() const override { return c_.conns_->config(); }
  void barrier() override { c_.barrier(); }
  void hostRun(const Args& a) override {
    switch (a.coll) {
      case Coll::kAllReduce: c_.allReduce(a.send, a.recv, a.count, a.type, a.op); break;
      case Coll::kBroadcast: c_.broadcast(a.send, a.recv, a.count, a.type, a.root); break;
      case Coll::kReduce: c_.reduce(a.send, a.recv, a.count, a.type, a.op, a.root); break;
      case Coll::kAllGather: c_.allGather(a.send, a.recv, a.count, a.type); break;
      case Coll::kReduceScatter: c_.reduceScatter(a.send, a.recv, a.count, a.type, a.op); break;
    }
  }
  void hostAllToAll(const void* send, void* recv, size_t count, DataType type) override {
    c_.allToAll(send, recv, count, type);
  }

 private:
  CommImpl& c_;
};

}  // namespace

bool CommImpl::onDevice(const Args& a) const {
  if (a.count == 0 || cuda::deviceCount() == 0) return false;
  const bool needSend = !(a.coll == Coll::kBroadcast && rank_ != a.root);
  const bool needRecv = !(a.coll == Coll::kReduce && rank_ != a.root);
  auto kind = [](const void* p) { return cuda::locate(p).kind != cuda::MemoryKind::kHost; };
  const bool s = needSend && a.send && kind(a.send), r = needRecv && a.recv && kind(a.recv);
  if (needSend && needRecv && a.send && a.recv && s != r)
    fail(StatusCode::kInvalidArgument, "rank {}: {}: sendbuff is {} memory but recvbuff is {} memory", rank_,
         collectives::collName(a.coll), s ? "device" : "host", r ? "device" : "host");
  return s || r;
}

collectives::DeviceColl& CommImpl::deviceColl() {
  if (!devColl_) {
    devHost_ = std::make_unique<DeviceHostOf>(*this);
    devColl_ = std::make_unique<collectives::DeviceColl>(*devHost_);
  }
  return *devColl_;
}

void CommImpl::runDevice(const Args& a) {
  checkCollArgs(a);
  collectives::DeviceColl& dc = deviceColl();
  try {
    dc.run(a);
  } catch (const Error& e) {
    fail(e.code(), "rank {}: {} of {} x {} on device buffers: {}", rank_, collectives::collName(a.coll), a.count,
         to_string(a.type), e.what());
  }
}

void CommImpl::runDeviceAllToAll(const void* s, void* r, size_t count, DataType type, void* stream) {
  if (abort_.load()) fail(StatusCode::kAborted, "rank {}: AllToAll on an aborted communicator", rank_);
  collectives::DeviceColl& dc = deviceColl();
  try {
    dc.allToAll(s, r, count, type, stream);
  } catch (const Error& e) {
    fail(e.code(), "rank {}: AllToAll of {} x {} on device buffers: {}", rank_, count, to_string(type), e.what());
  }
}

void CommImpl::barrier() {
  if (groupDepth() > 0) fail(StatusCode::kInvalidUsage, "rank {}: barrier() inside a group", rank_);
  uint8_t in = 0, out = 0;
  allReduce(&in, &out, 1, DataType::kUint8, RedOp::kMax);
}

}  // namespace topocoll::runtime
