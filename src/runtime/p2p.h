// The communicator's point-to-point part (runtime-private; CommImpl owns one): NCCL's ncclSend/ncclRecv and the p2p
// split of its addP2pToPlan. It decides how each message moves: through its connection's mailbox in the caller's
// thread (small ones), as one transfer the caller drives (a blocking call with nothing else queued), or as an op of
// the engine split over the peer's channels; it keeps the ops of finished calls for the next ones and counts each
// peer's messages (the mailbox messages' index). A group's sends and receives come here too (groups.cc).
//
//   PointToPoint p2p({rank, nRanks, nHosts, cudaDev, conns, engine, abortFlag, owner});
//   p2p.send(buf, count, type, peer);              // blocking: the fastest path that applies
//   Request r = p2p.irecv(buf, count, type, peer);  // an op of the engine
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "topocoll/datatype.h"
#include "topocoll/progress/connections.h"
#include "topocoll/progress/engine.h"
#include "topocoll/runtime/communicator.h"

namespace topocoll::runtime {

class CommImpl;

namespace detail {

struct GroupShot;

class PointToPoint {
 public:
  struct Context {
    int rank = 0, nRanks = 1, nHosts = 1;
    int cudaDev = -1;  // this rank's GPU; -1: a host-memory rank (never asks CUDA about buffers)
    progress::Connections* conns = nullptr;
    progress::Engine* engine = nullptr;
    const std::atomic<bool>* aborted = nullptr;
    CommImpl* owner = nullptr;  // the communicator a group records an op for
  };
  explicit PointToPoint(const Context& ctx);
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  Request isend(const void* buf, size_t count, DataType type, int peer);
  Request irecv(void* buf, size_t count, DataType type, int peer);
  void send(const void* buf, size_t count, DataType type, int peer);
  void recv(void* buf, size_t count, DataType type, int peer);
  /// A blocking receive from whichever of `peers` sends first (MPI's MPI_ANY_SOURCE; PyTorch's recvAnysource): waits
  /// until a message from one of them arrives, or one connects to this rank to send, then receives it as recv()
  /// does; returns its sender. Peers are looked at in turn, starting after the last one served. No receive from
  /// these peers may be under way meanwhile (nothing else receives on this communicator: NCCL's rule that one
  /// thread uses it at a time).
  int recvAny(void* buf, size_t count, DataType type, const int* peers, int nPeers);

  // What a group does with this communicator's sends and receives (groups.cc).
  void post(std::vector<std::shared_ptr<progress::Op>>& ops, bool wakeWorker);
  void waitOps(const std::vector<progress::Op*>& ops);
  bool runGroupInline(const std::vector<progress::Op*>& ops);
  /// A send or receive that its connection's mailbox takes is recorded as a GroupShot (no op, no pool) when the group
  /// holds nothing else; runGroupShots runs a group made of such records alone, in this thread (false: it cannot now,
  /// and the caller turns them into ops: groupShotOp).
  bool recordGroupShot(bool send, void* buf, size_t count, DataType type, int peer, GroupShot* out);
  bool runGroupShots(const GroupShot* shots, size_t n);
  std::shared_ptr<progress::Op> groupShotOp(const GroupShot& s);
  /// The finished operations among `n` of a group's entries (all of this communicator) back to the pool (each kept
  /// only if nobody else holds it), under one lock.
  void recycleOps(std::pair<CommImpl*, std::shared_ptr<progress::Op>>* ops, size_t n);
  /// Once `op`'s peer is connected: a small op whose connection has a point-to-point mailbox takes it (both sides
  /// decide from the size alone).
  void chooseShot(progress::Op& op);
  /// Lets go of the pooled ops (before the engine and the connections they name go).
  void dropPool();

 private:
  /// `index`: the op's place among the sends to (receives from) `peer` when already taken (any uint32_t, 0 included:
  /// the count wraps), or kNextIndex: takes the next.
  static constexpr int64_t kNextIndex = -1;
  std::shared_ptr<progress::Op> makeOp(bool send, void* buf, size_t count, DataType type, int peer,
                                       int64_t index = kNextIndex);
  /// Issues `op` now (blocking: and waits), or adds it to this thread's group.
  Request issue(std::shared_ptr<progress::Op> op, bool blocking);
  /// The latency path of a blocking send or recv outside a group: one transfer the caller drives.
  bool tryInline(bool send, void* buf, size_t count, DataType type, int peer);
  /// The mailbox path of a blocking small send or recv outside groups: false when it does not apply.
  bool tryShot(bool send, void* buf, size_t count, DataType type, int peer);
  /// The connector whose point-to-point mailbox a send (receive) of these arguments takes, its size in `*bytes`; null
  /// when it does not apply (bad arguments, not connected yet, too large, a device buffer, no mailbox): the op path
  /// then says what is wrong, or connects.
  transport::Connector* shotLane(bool send, const void* buf, size_t count, DataType type, int peer, size_t* bytes);
  /// The connector whose point-to-point mailbox a message of `bytes` to (from) a connected `peer` takes: null when
  /// it is larger than TOPOCOLL_P2P_MAILBOX_MAX or the connection has none (NET). Any buffer, device ones staged.
  transport::Connector* mailboxOf(bool send, int peer, size_t bytes);
  /// Whether `buf` is CUDA device memory of this GPU rank (host-memory ranks: never, without asking CUDA).
  bool deviceBuffer(const void* buf) const;
  /// GPU ranks: the stream of device copies, made at the first one.
  void* deviceStream();
  /// Whether a message from connected `peer` waits in its mailbox lane or the FIFO of its first connector.
  bool messageWaiting(int peer);
  bool aborted() const { return ctx_.aborted && ctx_.aborted->load(std::memory_order_relaxed); }

  Context ctx_;
  const int rank_, nRanks_;
  progress::Connections& conns_;
  progress::Engine& engine_;
  std::shared_ptr<void> devStream_;
  std::once_flag devStreamOnce_;
  // The ops of finished calls, for the next ones. Taken and given back twice per op by the thread that issues
  // (others only when several threads share the communicator): an exchange, not a futex mutex.
  struct PoolLock {
    std::atomic<bool> held{false};
    void lock() {
      while (held.exchange(true, std::memory_order_acquire)) std::this_thread::yield();
    }
    void unlock() { held.store(false, std::memory_order_release); }
  };
  PoolLock poolMu_;
  std::unique_ptr<progress::OpPool> pool_;
  // [recv, send][peer]: sends to / receives from the peer so far, both paths (the mailbox messages' index). The
  // sending and the receiving thread may differ: each counter has one writer at a time.
  std::unique_ptr<std::atomic<uint32_t>[]> index_[2];
  int anyNext_ = 0;  // recvAny: where its next look starts among its peers
};

}  // namespace detail
}  // namespace topocoll::runtime
