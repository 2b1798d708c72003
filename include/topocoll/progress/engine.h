// The progress engine of one communicator: the queues of transfers per connector, the thread that drives them when
// nobody waits, and the waits of the calling threads (which drive them themselves: no hand-off on the fast path).
// Below the collectives and above the transports: an operation (Op) is a user's send or receive, or one step of a
// collective algorithm, made of transport Transfers; the engine moves them and reports each op's outcome.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "topocoll/datatype.h"
#include "topocoll/status.h"
#include "topocoll/transport/doorbell.h"
#include "topocoll/transport/oneshot.h"
#include "topocoll/transport/primitives.h"
#include "topocoll/transport/transport.h"

namespace topocoll::progress {

class Engine;

/// A mailbox message's signature: the sender's (receiver's) count of sends to (receives from) that peer, both paths
/// counted, in bits 5-31 (NCCL's matching: the k-th send matches the k-th receive), and the data type in bits 0-4.
inline uint32_t shotSignature(uint32_t index, DataType type) {
  return index << 5 | (static_cast<uint32_t>(type) & 31);
}
/// How far the message's index `got` is ahead of the expected one (negative: behind), modulo 2^27.
inline int32_t shotIndexDiff(uint32_t got, uint32_t want) {
  return static_cast<int32_t>(((got >> 5) - (want >> 5)) << 5) >> 5;
}

/// One send or recv of the user.
/// cudaMemcpyAsync on `stream` (a cudaStream_t, null: the default stream) and its synchronisation; throws Error.
void deviceCopy(void* dst, const void* src, size_t n, void* stream);

struct Op {
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };
  Engine* engine = nullptr;
  uint64_t seq = 0;       // issue order on the engine
  bool send = false;
  int peer = -1;
  void* buf = nullptr;
  size_t count = 0, bytes = 0;
  DataType dtype = DataType::kUint8;
  std::vector<std::unique_ptr<transport::Transfer>> parts;
  /// Receive side: the connector of every part the sender may use (its split can differ when sizes mismatch).
  std::vector<transport::Connector*> partConns;
  std::vector<transport::MessageDesc> partDescs;  // MessageDesc of parts[i] (for drains)
  transport::TransferOptions opts;
  int unfinished = 0;     // driver only
  bool validated = false; // receive side: the first part checked the sender's header
  /// Receive: starts only once the previous receive from its peer read its header (point-to-point matching: the
  /// k-th send to a peer meets the k-th receive, over whichever connectors each splits across). A collective's step
  /// is matched by its connector alone and starts at once: a rank may wait on a later step from a peer before an
  /// earlier one on another channel (a tree's halves across channels). Over NET, channels may share a peer's
  /// point-to-point connector; the steps on one connector then meet in the order both sides post them, which the
  /// algorithms keep equal (the tree runs one channel across hosts for that; docs/transport.md).
  bool ordered = true;
  std::shared_ptr<Op> keep;  // itself, while the engine holds it (the caller may drop its handle)
  std::chrono::steady_clock::time_point waitingSince{};  // self and mailbox ops: since when it waits
  /// The mailbox path (small sends and receives, docs/transport.md "Point-to-point mailboxes"): the connector whose
  /// point-to-point mailbox lane it uses (its parts are then unused), and its signature (shotSignature).
  transport::Connector* shot = nullptr;
  uint32_t shotSig = 0;
  uint64_t shotState = 0;  // send: its message's sequence number once written; receive: 1 once posted
  /// Receive: what the message it took says the sender's next receive from this side expects (ShotMessage::post).
  uint64_t shotPeerPost = 0;
  /// Send in a group (Engine::runShotGroup): the group's receive from the same peer whose message may carry this
  /// send's verdict (ShotSlot::post); null otherwise.
  Op* shotPair = nullptr;
  /// Mailbox op on a device buffer: the user's buffer; `buf` is then `stage` (host), filled before a send is posted
  /// and copied to devBuf once a receive took its message.
  void* devBuf = nullptr;
  alignas(8) char stage[transport::kShotMaxBytes];
  std::atomic<int> state{kPending};
  /// Its call already failed (Engine::drain): once a peer of the communicator is gone, it fails as soon as it stalls,
  /// whichever peer it waits for (that peer gave up on the call too, or is about to).
  std::atomic<bool> draining{false};
  StatusCode code = StatusCode::kOk;
  std::string error;      // written before state turns kFailed

  bool finished() const { return state.load(std::memory_order_acquire) != kPending; }
  /// Back to a fresh op, keeping what its vectors and strings allocated (OpPool).
  void recycle();
};

/// Ops of finished calls kept for the next calls (the collectives' links): the blocking small-message path
/// allocates neither ops nor transfers per call. An op is taken again only once nobody else holds it (a Request, or
/// the engine just letting go of it after completion); the others are left to their holders.
///
///   OpPool pool;
///   std::shared_ptr<Op> op = pool.take();          // recycled, or new
///   Transfer& t = OpPool::setPart(*op, conn, Transfer::Dir::kSend, buf, desc, opts, false);
///   ... post, wait ...
///   pool.give(std::move(op));                      // when the call finished with it
class OpPool {
 public:
  explicit OpPool(size_t capacity = 64) : capacity_(capacity) {}
  std::shared_ptr<Op> take();
  void give(std::shared_ptr<Op>&& op);
  /// The op's single part, built in place of the one it had (no allocation when it had one).
  static transport::Transfer& setPart(Op& op, transport::Connector& c, transport::Transfer::Dir dir, void* buf,
                                      const transport::MessageDesc& msg, const transport::TransferOptions& opts,
                                      bool gated);
  size_t size() const { return free_.size(); }
  /// Ops created because none was free (for tests and counters).
  uint64_t created() const { return created_; }

 private:
  size_t capacity_;
  std::vector<std::shared_ptr<Op>> free_;
  uint64_t created_ = 0;
};

class Engine {
 public:
  static constexpr size_t kUnlimitedStreams = static_cast<size_t>(-1);
  struct Options {
    int rank = 0;
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
    const std::atomic<bool>* abortFlag = nullptr;
    std::shared_ptr<transport::PeerGone> peerGone;
    std::shared_ptr<transport::Doorbell> doorbell;
    int spinUs = 20;  // how long waits spin before sleeping (0 on an oversubscribed host)
    int yieldUs = 0;  // how long waits then yield before sleeping (at least 4 yields)
    int nRanks = 1;
    /// How many of a connector's queued NET sends move behind one that only waits for its acknowledgement
    /// (progressStreaming): 0 none, kUnlimitedStreams as many as the verdict ring allows. The runtime sets it from
    /// TOPOCOLL_NET_STREAMS (src/runtime/connections.cc); what each depth measured: docs/transport.md.
    size_t netStreamDepth = kUnlimitedStreams;
    /// Asked while operations stall (`stalled`: for how long nothing moved; `peer`: the rank the longest-stalled one
    /// waits on, -1 unknown), at most every kJobPollEvery: whether they must fail (the job failed elsewhere; the
    /// ranks' calls differ), with the code and the message. Once it says so, every stalled operation fails with
    /// them, at once, from then on.
    using OnStall =
        std::function<bool(std::chrono::steady_clock::duration stalled, int peer, StatusCode* code, std::string* why)>;
    OnStall onStall;
  };
  static constexpr std::chrono::milliseconds kJobPollEvery{5};
  explicit Engine(const Options& opts);
  /// Fails what is still pending (aborted) and stops the worker thread.
  ~Engine();

  /// Queues ops (their parts are built; self ops have none). `wakeWorker`: somebody other than the caller must drive
  /// them (asynchronous issue); blocking callers drive their own.
  void post(const std::vector<std::shared_ptr<Op>>& ops, bool wakeWorker);
  void post(const std::shared_ptr<Op>& op, bool wakeWorker);
  /// A blocking single-part operation when nothing else is queued: the caller drives a transfer of its own, no
  /// queue, no allocation (the latency path). False when the engine is busy (then post and wait as usual); throws
  /// the transfer's error like wait().
  bool runInline(const std::vector<transport::Connector*>& conns, bool send, void* buf,
                 const transport::MessageDesc& msg, const transport::TransferOptions& topts);
  /// A blocking NET operation split in `nParts` parts (conns[i] carries part i): the caller drives them itself, as
  /// runInline (a receive opens its other parts once the first has finished and says how the sender split it). The
  /// queued path costs a proxy hop and a doorbell per message (docs/transport.md, NET). False when the engine is busy.
  bool runInlineParts(const std::vector<transport::Connector*>& conns, bool send, void* buf,
                      const transport::MessageDesc& msg, const transport::TransferOptions& topts, int nParts);
  /// The same for a group of single-part operations on distinct connectors (a sendrecv, an all-to-all of small
  /// messages): driven together by the caller. False when the engine is busy or the group does not qualify.
  bool runInlineGroup(const std::vector<Op*>& ops);
  /// A group with operations split in several parts, every connector NET and distinct: driven by the caller as
  /// runInlineGroup (the receives' first parts first, then their other parts with the sends'). False when the
  /// engine is busy or the group does not qualify.
  bool runInlineGroupParts(const std::vector<Op*>& ops);
  /// A blocking mailbox send or receive (Op::shot) in the caller's thread, not posted: false (nothing done) when
  /// another thread drives the engine or holds mailbox ops for that peer and direction; throws its error.
  bool runShotInline(Op& op);
  /// The same for a group of mailbox ops (any order of sends and receives completes; ops of one peer and direction
  /// in order): false when the engine is busy with mailbox ops of those peers. The ops finish (ok or failed).
  bool runShotGroup(const std::vector<Op*>& ops);
  /// Drives until `op` finishes; throws its error. `more`: the caller waits again soon (a collective's step inside
  /// the call: it reduces what arrived, posts the next sends, then waits for the next piece), so the worker is not
  /// woken for the ops still pending meanwhile: it would take the engine (and a core) the caller's next wait needs.
  void wait(Op& op, bool more = false);
  /// Drives until all of `ops` finished; throws the first error (in their order).
  void waitAll(const std::vector<Op*>& ops);
  /// Ops that all finished: throws what failed (every failure named), nothing when all succeeded.
  void throwFailures(const std::vector<Op*>& ops);
  /// After a failed collective: drives until every op of `ops` ended, throwing nothing, so that none touches the
  /// user's buffers afterwards. What still moves completes; once a peer process of the communicator is gone, an op
  /// that stalls fails at once, also when its own peer is alive: that peer failed the call too and will not post
  /// the rest of it (without this, two survivors waited for each other until TOPOCOLL_TIMEOUT).
  void drain(const std::vector<Op*>& ops);
  /// Whether `op` finished; throws its error if it failed. Drives once if nobody else does.
  bool test(Op& op);
  /// Fails every pending op with kAborted and wakes every waiter (the communicator's abort).
  void abortAll();
  /// The job's failure elsewhere, once a stall found it (Options::jobFailed): its message. Any thread.
  bool jobFailure(StatusCode* code, std::string* why) const;
  /// The job failed (this rank told it): from now on every stalled operation fails at once with `code`, `why`.
  void setJobFailure(StatusCode code, const std::string& why);
  /// Ops not finished yet.
  bool idle() const { return pending_.load(std::memory_order_acquire) == 0; }
  /// Moves what is posted once, without waiting (unless another thread drives right now): a caller that posted
  /// transfers and goes on with local work lets its peers start.
  bool poke() { return tryProgress(); }

 private:
  struct Queue {
    transport::Connector* conn = nullptr;
    std::deque<std::pair<Op*, transport::Transfer*>> parts;
    std::chrono::steady_clock::time_point since{};  // when the front part last moved
  };
  bool tryProgress();
  /// The sends behind `q`'s front, which only waits for its acknowledgement (progressOnce).
  bool progressStreaming(Queue& q);
  /// Drives `t` to its end in this thread, moving `others` too; `refill` (if any), called after each step, may put
  /// new transfers in the places of finished ones in `others` (same connectors) and says whether it did.
  /// `idleSince` (if any): the clock of TOPOCOLL_TIMEOUT shared by the calls that drive one group's transfers one
  /// after another (when nothing of the group last moved; {} while it moves), so that a group waiting on several
  /// silent connections fails within one timeout, not one per transfer.
  void driveInline(transport::Transfer& t, const std::vector<transport::Transfer*>& others,
                   const std::function<bool()>* refill = nullptr,
                   std::chrono::steady_clock::time_point* idleSince = nullptr);
  /// After a single-part receive `t` found a mismatch from a sender that split its message: drives draining
  /// transfers over the sender's other parts (on `conns`), so that every channel stays in step.
  void drainSplitSender(const transport::Transfer& t, const std::vector<transport::Connector*>& conns,
                        const transport::MessageDesc& desc, const transport::TransferOptions& opts);
  void validate(Op& op);               // driver only
  bool progressOnce();                 // driver only
  void takeIncoming();                 // driver only
  void partFinished(Op& op, transport::Transfer& t);
  void matchSelf();
  void complete(Op& op);
  void failOp(Op& op, StatusCode code, const std::string& why);
  std::string describe(bool send, size_t count, DataType dtype, int peer, const std::string& why) const;
  void checkStalls();                  // driver only: timeouts, peers gone, abort
  int goneRank() const;                // the lowest rank whose process is gone, -1 if none
  // Driver only: Options::onStall, rate-limited, its failure kept.
  bool pollJob(std::chrono::steady_clock::duration stalled, int peer, StatusCode* code, std::string* why);
  void waitFinished(const std::vector<Op*>& ops);  // drives (or sleeps) until every op of `ops` finished
  bool shotProgress(Op& op);           // driver only: one attempt at a mailbox op; true once it finished
  void openShotGroup(const std::vector<Op*>& ops);                // runShotGroup's parts (engine.cc)
  bool shotGroupPass(const std::vector<Op*>& ops, size_t* left);
  bool settleShotByReply(Op* op, size_t* left);
  bool progressShots();                // driver only: the queued mailbox ops
  void shotGaveUp(Op& op, StatusCode code, const std::string& why);  // driver only: fails a mailbox op not done
  std::string shotTimeout(int peer) const;
  template <typename Step, typename Pending>
  void driveShots(const Step& step, const Pending& pending, Op* const* ops, size_t nOps);  // driver only
  void enqueue(Op* op, transport::Transfer* t);
  void wakeNetPoller();  // post(): waitMovingNet wakes for what was posted
  void runWorker();
  template <typename Done>
  void waitUntil(const Done& done, int spinUs, int yieldUs, int minYields = 4);
  template <typename Done>
  void waitAsCaller(const Done& done, Op* const* ops, size_t nOps, bool more = false);
  template <typename Done>
  bool waitMovingNet(const Done& done, Op* const* ops, size_t nOps);

  Options opts_;
  std::mutex postMu_;
  std::vector<std::shared_ptr<Op>> incoming_, taken_;
  std::atomic<bool> hasIncoming_{false};
  std::atomic<int> pending_{0};

  std::mutex driveMu_;                 // one driver at a time
  std::unordered_map<transport::Connector*, Queue> queues_;
  std::vector<Queue*> active_;
  std::deque<Op*> selfSends_, selfRecvs_;
  std::vector<std::deque<Op*>> recvChain_;  // [peer]: receives not yet validated, in order
  std::chrono::steady_clock::time_point lastCheck_{};
  std::chrono::steady_clock::time_point jobPolled_{};  // driver only
  std::atomic<bool> jobFailed_{false};
  mutable std::mutex jobMu_;
  std::string jobWhy_;  // under jobMu_, set once before jobFailed_
  StatusCode jobCode_ = StatusCode::kOk;
  uint64_t nextSeq_ = 0;

  int idlePasses_ = 0;
  // Connectors a caller drives inline right now (driver only): progressOnce leaves their queues alone, so that an
  // inline driver can also move what other threads of the process posted meanwhile (a send thread and a receive
  // thread on one communicator would otherwise wait for each other's lock).
  std::vector<const transport::Connector*> inlineConns_;
  std::vector<transport::Transfer*> groupParts_;  // runInlineGroup's transfers (driver only)
  // runInlineGroup (driver only): per connector its current op's index and its last op's; per op the next op on its
  // connector (or kNoOp).
  std::vector<size_t> groupHead_, groupTail_, groupNext_, groupOldest_;
  // NET connections an inline caller moves itself and the sockets it blocks on (driveInline; driver only).
  std::vector<transport::CallerDrive*> netDrives_;
  // NET connections an inline group keeps for its whole run (engine.cc DriveHold): driveInline moves them too, or
  // hands them back to the proxy while it drives a connection it cannot move itself (not NET).
  std::array<transport::CallerDrive*, 32> held_{};
  size_t nHeld_ = 0;
  std::vector<pollfd> netFds_;
  // waitMovingNet blocks in poll() on its NET sockets and on this eventfd, which post() signals while netPolling_:
  // what other threads post meanwhile wakes it.
  int postFd_ = -1;
  std::atomic<bool> netPolling_{false};
  // Mailbox ops (driver only): [0 receives, 1 sends][peer], each in issue order; the receives from a peer that
  // gave up before their message came (a late message of theirs is skipped); the peers a caller drives inline.
  std::vector<std::deque<Op*>> shotQ_[2];
  std::vector<int> shotGaveUp_;
  int shotQueued_ = 0;
  std::vector<std::pair<int, bool>> shotInline_;
  bool drivenInline(const transport::Connector* c) const {
    return !inlineConns_.empty() && std::find(inlineConns_.begin(), inlineConns_.end(), c) != inlineConns_.end();
  }
  bool drivenInline(int peer, bool send) const {
    return !shotInline_.empty() &&
           std::find(shotInline_.begin(), shotInline_.end(), std::make_pair(peer, send)) != shotInline_.end();
  }
  // runShotGroup, per pass: each peer and direction of the group, whether its next op waits, and (sends) the
  // sequence number of its oldest message still waiting for a verdict.
  struct ShotLaneState {
    int peer = -1;
    bool send = false;
    bool blocked = false;
    uint64_t oldest = 0;
  };
  std::vector<ShotLaneState> shotLanes_;

  std::atomic<int> callers_{0};        // threads in wait(): the worker leaves the driving to them
  std::mutex workerMu_;
  std::condition_variable workerCv_;
  bool workerWanted_ = false;
  std::atomic<bool> stop_{false};
  std::thread worker_;
};

}  // namespace topocoll::progress
