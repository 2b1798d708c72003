// Groups (NCCL 2.30.7 src/group.cc; our own code): this thread's open group, and what groupEnd runs: the small
// messages recorded without ops through the mailboxes, the point-to-point operations inline or on the engines (several
// communicators connecting in parallel), the collectives on their communicators' threads.
#include "groups.h"

#include <algorithm>
#include <deque>
#include <exception>
#include <map>
#include <thread>
#include <vector>

#include "comm_impl.h"
#include "topocoll/log.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

namespace topocoll::runtime {

using detail::CollTask;
using detail::GroupShot;
using detail::Op;

namespace {

// NCCL's group state is per thread and spans communicators. `shots`: the leading small sends and receives of one
// communicator, recorded without ops (PointToPoint::recordGroupShot); anything else joining the group turns them
// into ops first (spillShots), so that the order of each peer's messages is kept.
struct GroupState {
  int depth = 0;
  std::vector<std::pair<CommImpl*, std::shared_ptr<Op>>> ops;
  std::vector<std::shared_ptr<detail::CollTask>> colls;
  std::vector<detail::GroupShot> shots;
  int dropped = 0;  // operations of communicators destroyed while the group was open (detail::dropFromGroup)
  ~GroupState();
};
thread_local GroupState tGroup;
// Set once this thread's group state is destroyed (thread exit; for the main thread, before static destructors):
// a communicator destroyed after that (a static one) must not touch it. Trivially destructible: always readable.
thread_local bool tGroupGone = false;
GroupState::~GroupState() { tGroupGone = true; }
constexpr size_t kMaxGroupShots = 64;

// All or nothing: where an op cannot be made (its communicator was aborted) the records stay, and groupEnd reports it.
void spillShots() {
  if (tGroup.shots.empty()) return;
  std::vector<std::pair<CommImpl*, std::shared_ptr<Op>>> made;
  made.reserve(tGroup.shots.size());
  for (const auto& s : tGroup.shots) made.emplace_back(s.comm, s.comm->p2p().groupShotOp(s));
  for (auto& m : made) tGroup.ops.push_back(std::move(m));
  tGroup.shots.clear();
}

}  // namespace

void detail::dropFromGroup(CommImpl* comm) {
  if (tGroupGone || tGroup.depth == 0) return;
  const std::string why = "its communicator was destroyed inside the open group (destroy it after groupEnd())";
  size_t before = tGroup.shots.size() + tGroup.ops.size() + tGroup.colls.size();
  std::erase_if(tGroup.shots, [&](const GroupShot& s) { return s.comm == comm; });
  std::erase_if(tGroup.ops, [&](const std::pair<CommImpl*, std::shared_ptr<Op>>& o) {
    if (o.first != comm) return false;
    o.second->code = StatusCode::kAborted;  // a Request that holds it fails instead of waiting forever
    o.second->error = why;
    o.second->state.store(Op::kFailed, std::memory_order_release);
    return true;
  });
  std::erase_if(tGroup.colls, [&](const std::shared_ptr<CollTask>& t) {
    if (t->comm != comm) return false;
    t->finish(StatusCode::kAborted, why);
    return true;
  });
  tGroup.dropped += static_cast<int>(before - tGroup.shots.size() - tGroup.ops.size() - tGroup.colls.size());
}

void detail::addToGroup(CommImpl*, std::shared_ptr<CollTask> t) {
  spillShots();
  tGroup.colls.push_back(std::move(t));
}

bool detail::inGroup() { return tGroup.depth > 0; }

void detail::addOpToGroup(CommImpl* comm, std::shared_ptr<Op> op) {
  spillShots();  // recorded before this op: they go first
  tGroup.ops.emplace_back(comm, std::move(op));
}

bool detail::groupTakesShot(const CommImpl* comm) {
  return tGroup.ops.empty() && tGroup.colls.empty() && tGroup.shots.size() < kMaxGroupShots &&
         (tGroup.shots.empty() || tGroup.shots[0].comm == comm);
}

void detail::addShotToGroup(const GroupShot& s) { tGroup.shots.push_back(s); }

bool detail::groupHolds(const std::shared_ptr<CollTask>& t) {
  return tGroup.depth > 0 && std::find(tGroup.colls.begin(), tGroup.colls.end(), t) != tGroup.colls.end();
}

void groupStart() { ++tGroup.depth; }

int groupDepth() { return tGroup.depth; }

namespace {
void groupEndP2p(std::vector<std::pair<CommImpl*, std::shared_ptr<Op>>>& ops);
void runGroup();
}  // namespace

void groupEnd() {
  if (tGroup.depth == 0) fail(StatusCode::kInvalidUsage, "groupEnd() without groupStart()");
  if (--tGroup.depth > 0) return;
  const int dropped = std::exchange(tGroup.dropped, 0);
  if (dropped == 0) return runGroup();
  const std::string lost = fmt::format("{} operation(s) of a communicator destroyed inside the open group were dropped "
                                       "(destroy communicators after groupEnd())", dropped);
  try {
    runGroup();
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}; and {}", e.what(), lost));
  }
  throw Error(StatusCode::kInvalidUsage, lost);
}

double groupSimulateEnd() {
  if (tGroup.depth == 0) fail(StatusCode::kInvalidUsage, "groupSimulateEnd() without groupStart()");
  if (--tGroup.depth > 0) return 0;  // nested: the outermost end decides
  tGroup.dropped = 0;
  // Per communicator: its collectives one after another, its sends beside its receives; the communicators of the
  // group run side by side.
  struct Time {
    double colls = 0, sends = 0, recvs = 0;
  };
  std::map<const CommImpl*, Time> per;
  for (const GroupShot& s : tGroup.shots) (s.send ? per[s.comm].sends : per[s.comm].recvs) += s.comm->simulateP2pUs(s.bytes);
  for (auto& [c, op] : tGroup.ops) (op->send ? per[c].sends : per[c].recvs) += c->simulateP2pUs(op->bytes);
  for (auto& t : tGroup.colls) per[t->comm].colls += t->comm->simulateUs(t->args);
  // Nothing runs: what the group held ends (a Request on it fails, saying so).
  const std::string why = "simulated by groupSimulateEnd (ncclGroupSimulateEnd), not run";
  for (auto& [c, op] : tGroup.ops) {
    op->code = StatusCode::kAborted;
    op->error = why;
    op->state.store(Op::kFailed, std::memory_order_release);
  }
  for (auto& t : tGroup.colls) t->finish(StatusCode::kAborted, why);
  tGroup.shots.clear();
  tGroup.ops.clear();
  tGroup.colls.clear();
  double worst = 0;
  for (const auto& [c, t] : per) worst = std::max(worst, t.colls + std::max(t.sends, t.recvs));
  return worst;
}

namespace {
// groupEnd's work once the outermost group closes: the records, operations and collectives it holds run.
void runGroup() {
  if (!tGroup.shots.empty()) {
    if (tGroup.ops.empty() && tGroup.colls.empty()) {
      struct Clear {  // however it ends, the records are this group's only
        ~Clear() { tGroup.shots.clear(); }
      } clear;
      if (tGroup.shots[0].comm->p2p().runGroupShots(tGroup.shots.data(), tGroup.shots.size())) return;
      try {
        spillShots();  // the engine's mailboxes are busy (queued ops, another thread): the op path
      } catch (...) {
        tGroup.ops.clear();
        throw;
      }
    } else {  // defensive: whatever joins the group spills the records first
      try {
        spillShots();
      } catch (...) {  // the group is over either way
        tGroup.ops.clear();
        tGroup.colls.clear();
        throw;
      }
    }
  }
  std::vector<std::pair<CommImpl*, std::shared_ptr<Op>>> ops;
  ops.swap(tGroup.ops);
  // However the group ends: its finished operations go back to their communicators' pools and the list's storage
  // back to this thread (a group of small messages allocates nothing once warm).
  struct Recycle {
    std::vector<std::pair<CommImpl*, std::shared_ptr<Op>>>& ops;
    ~Recycle() {
      for (size_t i = 0; i < ops.size();) {  // one lock per run of one communicator's ops
        size_t j = i + 1;
        while (j < ops.size() && ops[j].first == ops[i].first) ++j;
        ops[i].first->p2p().recycleOps(ops.data() + i, j - i);
        i = j;
      }
      ops.clear();
      if (tGroup.ops.empty()) tGroup.ops.swap(ops);
    }
  } recycle{ops};
  auto colls = std::move(tGroup.colls);
  tGroup.colls.clear();
  if (colls.empty()) return groupEndP2p(ops);
  // Collectives of one communicator and nothing else run here, in order; otherwise each communicator's collective
  // thread runs its own (several communicators of this thread progress at once) while this thread does the rest.
  bool here = ops.empty();
  for (auto& t : colls) here = here && t->comm == colls[0]->comm;
  if (here) {
    for (auto& t : colls) t->comm->runNow(*t);
  } else {
    for (auto& t : colls) t->comm->submit(t);
  }
  StatusCode code = StatusCode::kOk;
  std::string why;
  auto note = [&](const Error& e) {
    if (code == StatusCode::kOk) code = e.code();
    why += (why.empty() ? "" : "; ") + std::string(e.what());
  };
  try {
    groupEndP2p(ops);
  } catch (const Error& e) {
    note(e);
  }
  for (auto& t : colls) {
    try {
      t->wait();
    } catch (const Error& e) {
      note(e);
    }
  }
  if (code != StatusCode::kOk) throw Error(code, why);
}

void groupEndP2p(std::vector<std::pair<CommImpl*, std::shared_ptr<Op>>>& ops) {
  if (ops.empty()) return;
  // This thread's scratch lists (kept between groups: nothing allocated per group once warm).
  // (Local references: the connecting threads below must see this thread's lists, not their own.)
  thread_local std::vector<CommImpl*> tComms;
  thread_local std::vector<int> tPeers;
  thread_local std::vector<Op*> tAll;
  std::vector<CommImpl*>& comms = tComms;
  std::vector<int>& peers = tPeers;
  std::vector<Op*>& all = tAll;
  comms.clear();
  for (auto& [c, op] : ops)
    if (std::find(comms.begin(), comms.end(), c) == comms.end()) comms.push_back(c);
  auto peersOf = [&](CommImpl* c) {
    std::vector<int> peers;
    for (auto& [cc, op] : ops)
      if (cc == c) peers.push_back(op->peer);
    return peers;
  };
  // Connections first. Several communicators of this thread connect in parallel threads (their exchanges wait for
  // each other), as NCCL's preconnect jobs do.
  if (comms.size() == 1) {
    peers.clear();
    for (auto& [c, op] : ops) peers.push_back(op->peer);
    comms[0]->ensureConnected(peers);
  } else {
    std::vector<std::exception_ptr> errors(comms.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < comms.size(); ++i) {
      threads.emplace_back([&, i] {
        log::setThreadRank(comms[i]->rank());
        try {
          comms[i]->ensureConnected(peersOf(comms[i]));
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  for (auto& [c, op] : ops) c->p2p().chooseShot(*op);
  if (comms.size() == 1) {
    all.clear();
    for (auto& [c, op] : ops) all.push_back(op.get());
    if (comms[0]->p2p().runGroupInline(all)) {
      comms[0]->p2p().waitOps(all);  // all finished: throws what failed
      return;
    }
  }
  for (CommImpl* c : comms) {
    std::vector<std::shared_ptr<Op>> mine;
    for (auto& [cc, op] : ops)
      if (cc == c) mine.push_back(op);
    c->p2p().post(mine, comms.size() > 1);
  }
  StatusCode code = StatusCode::kOk;
  std::string why;
  for (CommImpl* c : comms) {
    std::vector<Op*> mine;
    for (auto& [cc, op] : ops)
      if (cc == c) mine.push_back(op.get());
    try {
      c->p2p().waitOps(mine);
    } catch (const Error& e) {
      if (code == StatusCode::kOk) code = e.code();
      why += (why.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  if (code != StatusCode::kOk) throw Error(code, why);
}

}  // namespace

}  // namespace topocoll::runtime
