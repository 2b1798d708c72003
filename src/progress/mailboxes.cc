#include "topocoll/progress/mailboxes.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>

#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/progress/connections.h"
#include "topocoll/log.h"
#include "topocoll/status.h"
#include "topocoll/transport/doorbell.h"
#include "topocoll/transport/oneshot.h"

namespace topocoll::progress {

using transport::ShotBox;
using transport::ShotMessage;

namespace {

static_assert(Mailboxes::kMaxBytes == transport::kShotMaxBytes);

// How often a receiver publishes what it took (kShotSlots / 2: the sender keeps half its slots free ahead).
constexpr uint64_t kShotPublish = transport::kShotSlots / 2;

}  // namespace

bool Mailboxes::setUp() {
  if (off()) return false;
  const int n = conns_.nRanks(), me = conns_.rank();
  std::vector<int> peers;
  for (int p = 0; p < n; ++p)
    if (p != me) peers.push_back(p);
  conns_.ensureConnected(peers);  // collective: every rank makes the same decision at the same call
  send_.assign(n, nullptr);
  recv_.assign(n, nullptr);
  std::string lacking;  // the first connection without a mailbox (NET/Socket between ranks of one host)
  for (int p : peers) {
    send_[p] = conns_.p2pConnectors(p, transport::Side::kSend)[0];
    recv_[p] = conns_.p2pConnectors(p, transport::Side::kRecv)[0];
    if (lacking.empty() && (!ShotBox::available(send_[p]->conn) || !ShotBox::available(recv_[p]->conn)))
      lacking = fmt::format("rank {} via {}", p, send_[p]->via);
  }
  // Every rank must take the same path: agree over the bootstrap once (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 on one
  // host, or ranks whose shared memory cannot be mapped by their peers, connect over NET: no mailboxes).
  std::vector<uint8_t> ok(n);
  ok[me] = lacking.empty() ? 1 : 0;
  {
    std::lock_guard<std::mutex> lock(conns_.setupMutex());
    conns_.context().bootstrap->allGather(ok.data(), 1);
  }
  if (std::find(ok.begin(), ok.end(), 0) != ok.end()) {
    TC_INFO(log::kTuning, "OneShot off: {}",
            lacking.empty() ? "a peer's connections lack mailboxes" : lacking + " has no mailbox");
    off_.store(true, std::memory_order_relaxed);
    return false;
  }
  ready_ = true;
  return true;
}

bool Mailboxes::poll(Exchange& x, std::string* mismatch) {
  const int n = conns_.nRanks(), me = conns_.rank();
  bool moved = false;
  uint32_t sent = 0, took = 0;
  for (int i = 1; i < n; ++i) {  // the next rank first, as the ring would
    const int q = (me + i) % n;
    if ((x.toSend >> q & 1) && ShotBox(send_[q]->conn).trySend(x.sig, x.send[q], x.bytes, false, stream_)) {
      x.toSend &= ~(1u << q);
      sent |= 1u << q;
      moved = true;
    }
    const int f = (me - i + n) % n;
    if (!(x.toRecv >> f & 1)) continue;
    ShotMessage m;
    ShotBox box(recv_[f]->conn);
    if (!box.tryRecv(x.recv[f], x.bytes, &m, false, stream_)) {
      // About to wait for it: publish what was taken first (a sender that waits for a slot waits for this).
      if (box.unpublished()) {
        box.consume();
        took |= 1u << f;
      }
      continue;
    }
    // Published every kShotPublish messages (or when this side finds the mailbox empty, above), not after each: the
    // sender reads the line only when it runs out of slots, and a broadcast root always does (it only sends), so a
    // line written after every message crossed cores twice per message.
    if (box.seq() % kShotPublish == 0) {
      box.consume();
      took |= 1u << f;
    }
    x.toRecv &= ~(1u << f);
    moved = true;
    const uint32_t from = m.sig >> kCallShift;
    if (from != call_ && static_cast<int16_t>(call_ - from) > 0) {
      // Left unread by an earlier call that was mismatched across ranks (a Broadcast root against a Reduce: both
      // only send): skip it, so the mailbox heals, and wait for this call's message.
      x.toRecv |= 1u << f;
      TC_WARN("rank {}: skipped rank {}'s message of its one-shot call {} (this is call {}: {}), left unread by a "
              "call mismatched across ranks",
              me, f, from, call_, x.describe(m.sig, m.bytes));
    } else if (mismatch->empty() && from != call_) {
      *mismatch = fmt::format("rank {}'s message belongs to its one-shot call {} (this is call {}): {}", f, from,
                              call_, x.describe(m.sig, m.bytes));
    } else if ((m.sig != x.sig || m.bytes != x.bytes) && mismatch->empty()) {
      *mismatch = fmt::format("size or type mismatch: this rank called {}, rank {} called {}",
                              x.describe(x.sig, x.bytes), f, x.describe(m.sig, m.bytes));
    }
  }
  if (sent | took) {
    // Wake the receivers of what was sent, and the senders whose slots were published (one waiting for a free slot
    // may sleep): each distinct doorbell once (ranks of one process share theirs), after one seq_cst fence if any of
    // them needs one (none where the sleepers issue membarrier: transport/doorbell.cc; a doorbell whose owner has
    // switched to fences since fences in its ringFenced()).
    transport::Waker* rung[2 * kMaxRanks];
    int nRung = 0;
    bool fenced = false;
    for (int q = 0; q < n; ++q)
      for (transport::Waker* w : {sent >> q & 1 ? send_[q]->conn.wake : nullptr,
                                  took >> q & 1 ? recv_[q]->conn.wake : nullptr}) {
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
}

void Mailboxes::exchange(Exchange& x) {
  const int n = conns_.nRanks();
  call_ = x.sig >> kCallShift;
  // A rank that only sends or only receives in this call (Broadcast and Reduce) is one end of a stream: back-to-back
  // calls run the senders ahead of their receivers, and the mailboxes' next lines are worth fetching early (not in
  // the exchanges of the other collectives, which run in lockstep).
  stream_ = x.toSend == 0 || x.toRecv == 0;
  for (const auto* list : {&send_, &recv_})  // a failed exchange left these mailboxes out of step
    for (auto* c : *list)
      if (c && c->broken())
        fail(StatusCode::kRemoteError, "the connection with rank {} is broken: {}", c->peer, c->brokenReason());

  std::string mismatch;
  if (!poll(x, &mismatch) || x.toSend || x.toRecv) {
    const transport::Context& ctx = conns_.context();
    transport::Backoff backoff(spinUs_, yieldUs_);
    std::chrono::steady_clock::time_point since{};  // read lazily: most waits end before any check
    unsigned idle = 0;
    auto stop = [&] { return ctx.abortFlag && ctx.abortFlag->load(std::memory_order_relaxed); };
    while (x.toSend || x.toRecv) {
      if (poll(x, &mismatch)) {
        backoff.reset();
        idle = 0;
        since = {};
        continue;
      }
      if (stop()) fail(StatusCode::kAborted, "the communicator was aborted");
      if (++idle >= 64 || backoff.sleeping()) {  // every few idle polls, and every slice once the wait sleeps
        idle = 0;
        if (since == std::chrono::steady_clock::time_point{}) since = std::chrono::steady_clock::now();
        const uint32_t due = x.toSend | x.toRecv;
        int gone = -1;
        for (int q = 0; q < n && gone < 0; ++q)
          if ((due >> q & 1) && (*ctx.peerGone)[q].load()) gone = q;
        // What a peer sent or took before it left is visible now: one more look before the exchange fails.
        if (gone >= 0 && poll(x, &mismatch)) continue;
        if (gone >= 0 && ((x.toSend | x.toRecv) >> gone & 1))
          fail(StatusCode::kRemoteError, "{}", transport::peerGoneWhy(gone, (*ctx.peerGone)[gone].load()));
        const auto now = std::chrono::steady_clock::now();
        if (onStall_ && now - polled_ >= std::chrono::milliseconds(5)) {
          polled_ = now;
          StatusCode code = StatusCode::kRemoteError;
          std::string why;
          if (onStall_(now - since, std::countr_zero(due), &code, &why)) {
            for (int p = 0; p < n; ++p)  // the mailboxes' sequence numbers are out of step from here on
              if (due >> p & 1) (x.toSend >> p & 1 ? send_ : recv_)[p]->markBroken(why);
            fail(code, "{}", why);
          }
        }
        if (now - since > ctx.timeout) {
          const int q = std::countr_zero(due);
          std::string why = fmt::format(
              "rank {} did not move for {:g} s (TOPOCOLL_TIMEOUT): it is stuck, gone, or never called this collective "
              "(or called it with a size above TOPOCOLL_ONESHOT_MAX)",
              q, std::chrono::duration<double>(ctx.timeout).count());
          for (int p = 0; p < n; ++p)  // the mailboxes' sequence numbers are out of step from here on
            if (due >> p & 1) (x.toSend >> p & 1 ? send_ : recv_)[p]->markBroken(why);
          fail(StatusCode::kTimeout, "{}", why);
        }
      }
      backoff.idle(*ctx.doorbell, [&] {
        if (poll(x, &mismatch)) {
          since = {};  // moved inside the doorbell's check: the timeout's clock starts again
          return true;
        }
        return stop();
      });
    }
  }
  if (!mismatch.empty()) fail(StatusCode::kInvalidUsage, "{}", mismatch);
}

}  // namespace topocoll::progress
