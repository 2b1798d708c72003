// The one-shot path of small collectives on one host (docs/collectives.md, "Algorithms", OneShot): every
// message a rank sends in the collective goes at once into the receiving peer's mailbox of the point-to-point
// connection (transport/oneshot.h: slots whose header words carry the sequence number), every rank polls the
// mailboxes it expects and reduces in rank order. One trip through shared memory instead of the ring's 2(n-1) steps,
// and no engine, no ops, no queue: what the caller's thread does is a few stores, a few loads and the reduction.
#include <algorithm>
#include <bit>
#include <cstring>

#include "topocoll/collectives/reduce.h"
#include "topocoll/log.h"
#include "topocoll/progress/connections.h"
#include "comm_impl.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "topocoll/transport/doorbell.h"
#include "topocoll/transport/oneshot.h"

namespace topocoll::runtime {

using collectives::Args;
using collectives::Coll;
using transport::ShotBox;
using transport::ShotMessage;

namespace {

// How often a receiver publishes what it took (kShotSlots / 2: the sender keeps half its slots free ahead).
constexpr uint64_t kShotPublish = transport::kShotSlots / 2;

bool reduces(Coll c) { return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter; }
bool rooted(Coll c) { return c == Coll::kBroadcast || c == Coll::kReduce; }

// What a rank called, in 32 bits: the receiver compares it with its own (with the size, in the header). Bits 16-31
// number the communicator's one-shot calls (every rank counts the same calls): a message a mismatched call left
// unread (a Broadcast against an AllReduce) carries an older number, so a later call fails on it instead of taking
// its data.
constexpr uint32_t kCallShift = 16;
uint32_t signature(const Args& a, uint32_t call) {
  uint32_t s = static_cast<uint32_t>(a.coll) | static_cast<uint32_t>(a.type) << 3;
  if (reduces(a.coll)) s |= (static_cast<uint32_t>(a.op) + 1) << 8;
  if (rooted(a.coll)) s |= (static_cast<uint32_t>(a.root) + 1) << 12;
  return s | call << kCallShift;
}

std::string describe(uint32_t sig, size_t bytes) {
  auto coll = static_cast<Coll>(sig & 7);
  auto type = static_cast<DataType>((sig >> 3) & 31);
  std::string s = fmt::format("{} with {} bytes per peer of {}", collectives::collName(coll), bytes,
                              isValid(type) ? to_string(type) : "?");
  if ((sig >> 8) & 15) s += fmt::format(", {}", to_string(static_cast<RedOp>(((sig >> 8) & 15) - 1)));
  if ((sig >> 12) & 15) s += fmt::format(", root {}", ((sig >> 12) & 15) - 1);
  return s;
}

}  // namespace

bool CommImpl::oneShotFits(const Args& a) const {
  // Every rank decides alike: the same arguments, knobs and job facts, and the mailboxes the ranks agreed on.
  return tuning::hostOneShot(hostPolicy_, hostCall(a, hostMemory() && !shotOff_.load(std::memory_order_relaxed)));
}

bool CommImpl::runOneShot(const Args& a) {
  if (shotOff_.load(std::memory_order_relaxed)) return false;
  if (!shotReady_) {
    std::vector<int> peers;
    for (int p = 0; p < nRanks_; ++p)
      if (p != rank_) peers.push_back(p);
    ensureConnected(peers);  // collective: every rank makes the same decision at the same call
    shotSend_.assign(nRanks_, nullptr);
    shotRecv_.assign(nRanks_, nullptr);
    std::string lacking;  // the first connection without a mailbox (NET/Socket between ranks of one host)
    for (int p : peers) {
      shotSend_[p] = conns_->p2pConnectors(p, transport::Side::kSend)[0];
      shotRecv_[p] = conns_->p2pConnectors(p, transport::Side::kRecv)[0];
      if (lacking.empty() && (!ShotBox::available(shotSend_[p]->conn) || !ShotBox::available(shotRecv_[p]->conn)))
        lacking = fmt::format("rank {} via {}", p, shotSend_[p]->via);
    }
    // Every rank must take the same path: agree over the bootstrap once (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 on one
    // host, or ranks whose shared memory cannot be mapped by their peers, connect over NET: no mailboxes).
    std::vector<uint8_t> ok(nRanks_);
    ok[rank_] = lacking.empty() ? 1 : 0;
    {
      std::lock_guard<std::mutex> lock(conns_->setupMutex());
      bs_->allGather(ok.data(), 1);
    }
    if (std::find(ok.begin(), ok.end(), 0) != ok.end()) {
      TC_INFO(log::kTuning, "OneShot off: {}", lacking.empty() ? "a peer's connections lack mailboxes"
                                                                : lacking + " has no mailbox");
      shotOff_.store(true, std::memory_order_relaxed);
      return false;
    }
    shotReady_ = true;
  }
  if (log::enabled(log::Level::kInfo, log::kTuning)) {
    const tuning::HostCall c = hostCall(a, true);
    TC_INFO(log::kTuning, "{}", tuning::describe(hostPolicy_, c, tuning::hostDecide(hostPolicy_, c)));
  }
  const int n = nRanks_, me = rank_;
  const size_t es = sizeOf(a.type), count = a.count, bytes = count * es;
  const uint32_t call = ++shotCalls_ & 0xffff;
  const uint32_t sig = signature(a, call);
  const auto* in = static_cast<const char*>(a.send);
  auto* out = static_cast<char*>(a.recv);
  // Every rank's contribution (reductions), in rank order: srcs[q] points into `got` or at this rank's input.
  alignas(64) char got[collectives::kDirectMaxRanks][transport::kShotMaxBytes];
  const void* srcs[collectives::kDirectMaxRanks];

  // Who sends to whom, and what.
  uint32_t toSend = 0, toRecv = 0;  // bit q: a message to / from rank q is still due
  auto sendData = [&](int q) -> const char* {
    return a.coll == Coll::kReduceScatter ? in + static_cast<size_t>(q) * bytes : in;
  };
  auto recvInto = [&](int q) -> char* {
    if (a.coll == Coll::kAllGather) return out + static_cast<size_t>(q) * bytes;
    if (a.coll == Coll::kBroadcast) return out;
    return got[q];
  };
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    bool sends = !(a.coll == Coll::kBroadcast && me != a.root) && !(a.coll == Coll::kReduce && q != a.root);
    bool recvs = !(a.coll == Coll::kBroadcast && q != a.root) && !(a.coll == Coll::kReduce && me != a.root);
    if (sends) toSend |= 1u << q;
    if (recvs) toRecv |= 1u << q;
  }
  // A rank that only sends or only receives in this call (Broadcast and Reduce) is one end of a stream: back-to-back
  // calls run the senders ahead of their receivers, and the mailboxes' next lines are worth fetching early (not in
  // the exchanges of the other collectives, which run in lockstep).
  const bool stream = toSend == 0 || toRecv == 0;
  for (const auto* list : {&shotSend_, &shotRecv_})  // a failed one-shot left these mailboxes out of step
    for (auto* c : *list)
      if (c && c->broken())
        fail(StatusCode::kRemoteError, "the connection with rank {} is broken: {}", c->peer, c->brokenReason());

  std::string mismatch;
  auto poll = [&] {
    bool moved = false;
    uint32_t sent = 0, took = 0;
    for (int i = 1; i < n; ++i) {  // the next rank first, as the ring would
      int q = (me + i) % n;
      if ((toSend >> q & 1) && ShotBox(shotSend_[q]->conn).trySend(sig, sendData(q), bytes, false, stream)) {
        toSend &= ~(1u << q);
        sent |= 1u << q;
        moved = true;
      }
      int f = (me - i + n) % n;
      ShotMessage m;
      if (!(toRecv >> f & 1)) continue;
      ShotBox box(shotRecv_[f]->conn);
      if (!box.tryRecv(recvInto(f), bytes, &m, false, stream)) {
        // About to wait for it: publish what was taken first (a sender that waits for a slot waits for this).
        if (box.unpublished()) {
          box.consume();
          took |= 1u << f;
        }
        continue;
      }
      // Published every kShotPublish messages (or when this side finds the mailbox empty, above), not after each:
      // the sender reads the line only when it runs out of slots, and a broadcast root always does (it only sends),
      // so a line written after every message crossed cores twice per message.
      if (box.seq() % kShotPublish == 0) {
        box.consume();
        took |= 1u << f;
      }
      {
        toRecv &= ~(1u << f);
        moved = true;
        const uint32_t from = m.sig >> kCallShift;
        if (from != call && static_cast<int16_t>(call - from) > 0) {
          // Left unread by an earlier call that was mismatched across ranks (a Broadcast root against a Reduce: both
          // only send): skip it, so the mailbox heals, and wait for this call's message.
          toRecv |= 1u << f;
          TC_WARN("rank {}: skipped rank {}'s message of its one-shot call {} (this is call {}: {}), left "
                  "unread by a call mismatched across ranks", me, f, from, call, describe(m.sig, m.bytes));
        } else if (mismatch.empty() && from != call)
          mismatch = fmt::format("rank {}'s message belongs to its one-shot call {} (this is call {}): {}", f, from,
                                 call, describe(m.sig, m.bytes));
        else if ((m.sig != sig || m.bytes != bytes) && mismatch.empty())
          mismatch = fmt::format("size or type mismatch: this rank called {}, rank {} called {}", describe(sig, bytes),
                                 f, describe(m.sig, m.bytes));
      }
    }
    if (sent | took) {
      // Wake the receivers of what was sent, and the senders whose slots were published (one waiting for a free slot
      // may sleep): each distinct doorbell once (ranks of one process share theirs), after one seq_cst fence if any of
      // them needs one (none where the sleepers issue membarrier: transport/doorbell.cc).
      transport::Waker* rung[2 * collectives::kDirectMaxRanks];
      int nRung = 0;
      bool fenced = false;
      for (int q = 0; q < n; ++q)
        for (transport::Waker* w : {sent >> q & 1 ? shotSend_[q]->conn.wake : nullptr,
                                    took >> q & 1 ? shotRecv_[q]->conn.wake : nullptr}) {
          if (!w || std::find(rung, rung + nRung, w) != rung + nRung) continue;
          rung[nRung++] = w;
          if (w->needsFence() && !fenced) {
            std::atomic_thread_fence(std::memory_order_seq_cst);
            fenced = true;
          }
          std::atomic_signal_fence(std::memory_order_seq_cst);
          w->ringFenced();
        }
    }
    return moved;
  };

  if (!poll() || toSend || toRecv) {
    transport::Backoff backoff(waitSpinUs_, waitYieldUs_);
    std::chrono::steady_clock::time_point since{};  // read lazily: most waits end before any check
    unsigned idle = 0;
    auto stop = [&] { return abort_.load(std::memory_order_relaxed); };
    while (toSend || toRecv) {
      if (poll()) {
        backoff.reset();
        idle = 0;
        since = {};
        continue;
      }
      if (stop()) fail(StatusCode::kAborted, "the communicator was aborted");
      if (++idle >= 64 || backoff.sleeping()) {  // every few idle polls, and every slice once the wait sleeps
        idle = 0;
        // Read lazily: most waits end before a check, without a clock read.
        if (since == std::chrono::steady_clock::time_point{}) since = std::chrono::steady_clock::now();
        uint32_t due = toSend | toRecv;
        for (int q = 0; q < n; ++q) {
          if (!(due >> q & 1)) continue;
          if ((*conns_->context().peerGone)[q].load())
            fail(StatusCode::kRemoteError, "rank {}'s process is gone (it exited or was killed)", q);
        }
        if (std::chrono::steady_clock::now() - since > conns_->context().timeout) {
          int q = std::countr_zero(due);
          std::string why = fmt::format(
              "rank {} did not move for {:g} s (TOPOCOLL_TIMEOUT): it is stuck, gone, or never called this collective "
              "(or called it with a size above TOPOCOLL_ONESHOT_MAX)",
              q, std::chrono::duration<double>(conns_->context().timeout).count());
          for (int p = 0; p < n; ++p)  // the mailboxes' sequence numbers are out of step from here on
            if (due >> p & 1) (toSend >> p & 1 ? shotSend_ : shotRecv_)[p]->markBroken(why);
          fail(StatusCode::kTimeout, "{}", why);
        }
      }
      backoff.idle(*conns_->context().doorbell, [&] {
        if (poll()) {
          since = {};  // moved inside the doorbell's check: the timeout's clock starts again
          return true;
        }
        return stop();
      });
    }
  }
  if (!mismatch.empty()) fail(StatusCode::kInvalidUsage, "{}", mismatch);

  // Every message arrived: finish locally, in rank order (every rank computes the same bits; the Direct algorithm's
  // order, so the results are those of Direct).
  switch (a.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kReduceScatter: {
      if (a.coll == Coll::kReduce && me != a.root) return true;
      const char* mine = sendData(me);
      for (int q = 0; q < n; ++q) srcs[q] = q == me ? static_cast<const void*>(mine) : got[q];
      // dst may alias only srcs[0], and only exactly: reduce into a scratch line when the output overlaps this rank's
      // input otherwise (a later source, or rank 0's input shifted).
      bool alias = (me != 0 || out != mine) && out < mine + bytes && mine < out + bytes;
      char* dst = alias ? got[me] : out;
      collectives::reduceMany(a.type, a.op, dst, srcs, n, count);
      if (alias) std::memcpy(out, dst, bytes);
      if (a.op == RedOp::kAvg) collectives::finishAvg(a.type, out, count, n);
      return true;
    }
    case Coll::kAllGather:
      if (out + static_cast<size_t>(me) * bytes != in) std::memmove(out + static_cast<size_t>(me) * bytes, in, bytes);
      return true;
    case Coll::kBroadcast:
      if (me == a.root && out != in) std::memmove(out, in, bytes);
      return true;
  }
  return true;
}

}  // namespace topocoll::runtime
