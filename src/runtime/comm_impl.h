// The communicator's state and the code of its parts (runtime-private; the public face is runtime::Communicator in
// include/topocoll/runtime/communicator.h, which forwards every call here): init (NCCL's initTransportsRank:
// communicator.cc, connections.cc), point-to-point (the PointToPoint part, p2p.h), groups (groups.cc), the collectives'
// issue order and choice
// (collectives.cc: the one-shot path runs collectives::runOneShot, device buffers collectives::DeviceColl).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "coll_queue.h"
#include "p2p.h"
#include "topocoll/plan.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/tuning/host_policy.h"

namespace topocoll::collectives {
class DeviceColl;
class DeviceHost;
}  // namespace topocoll::collectives

namespace topocoll::runtime {

namespace detail {
using progress::Engine;
using progress::OpPool;
struct GroupShot;
class OneSided;
}  // namespace detail

class CommImpl {
 public:
  // The public API (include/topocoll/runtime/communicator.h documents each call).
  static std::unique_ptr<CommImpl> init(const bootstrap::UniqueId& id, int nRanks, int rank,
                                        const InitOptions& opts);
  static std::unique_ptr<CommImpl> initFromEnv(const Env& env);
  static std::unique_ptr<CommImpl> initWithBootstrap(std::unique_ptr<bootstrap::Bootstrap> bs,
                                                     const InitOptions& opts);
  ~CommImpl();

  int rank() const { return rank_; }
  int nRanks() const { return nRanks_; }
  int nNodes() const { return plan_.connect.nNodes; }
  int node() const { return node_; }
  int localRank() const { return localRank_; }
  int localRanks() const { return localRanks_; }
  int intraProcRanks() const { return intraProcRanks_; }
  bool hostMemory() const { return peers_[rank_].dev < 0; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  const Plan& plan() const { return plan_; }
  const search::Connect& connect() const { return plan_.connect; }
  const tuning::Model& model() const { return plan_.model; }
  const tuning::HostModel& hostModel() const { return hostPolicy_.model; }
  tuning::HostLink hostLink() const { return hostPolicy_.link; }
  const InitTimings& timings() const { return timings_; }
  bootstrap::Bootstrap& bootstrap() { return *bs_; }

  Request isend(const void* buf, size_t count, DataType type, int peer) { return p2p_->isend(buf, count, type, peer); }
  Request irecv(void* buf, size_t count, DataType type, int peer) { return p2p_->irecv(buf, count, type, peer); }
  void send(const void* buf, size_t count, DataType type, int peer) { p2p_->send(buf, count, type, peer); }
  void recv(void* buf, size_t count, DataType type, int peer) { p2p_->recv(buf, count, type, peer); }
  int recvAny(void* buf, size_t count, DataType type, const int* peers, int nPeers) {
    return p2p_->recvAny(buf, count, type, peers, nPeers);
  }

  Request iallReduce(const void* sendbuff, void* recvbuff, size_t count, DataType type, RedOp op);
  Request ibroadcast(const void* sendbuff, void* recvbuff, size_t count, DataType type, int root);
  Request ireduce(const void* sendbuff, void* recvbuff, size_t count, DataType type, RedOp op, int root);
  Request iallGather(const void* sendbuff, void* recvbuff, size_t sendcount, DataType type);
  Request ireduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, DataType type, RedOp op);
  void allReduce(const void* sendbuff, void* recvbuff, size_t count, DataType type, RedOp op, void* stream = nullptr);
  void broadcast(const void* sendbuff, void* recvbuff, size_t count, DataType type, int root, void* stream = nullptr);
  void reduce(const void* sendbuff, void* recvbuff, size_t count, DataType type, RedOp op, int root,
              void* stream = nullptr);
  void allGather(const void* sendbuff, void* recvbuff, size_t sendcount, DataType type, void* stream = nullptr);
  void reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, DataType type, RedOp op,
                     void* stream = nullptr);
  void allToAll(const void* sendbuff, void* recvbuff, size_t count, DataType type, void* stream = nullptr);
  void barrier();
  collectives::Choice choose(const collectives::Args& a) const;
  /// The cost model's microseconds for `a` as it would run (groupSimulateEnd), and for a send or receive of `bytes`
  /// (as a 2-rank Broadcast, one message); 0 where the model has no constants.
  double simulateUs(const collectives::Args& a) const;
  double simulateP2pUs(size_t bytes) const;

  void connectAll();
  std::vector<ConnectionInfo> connections() const;
  // Communicators made from this one (split.cc). `given`: their options (null: this communicator's).
  static constexpr int kNoColor = -1;
  std::unique_ptr<CommImpl> split(int color, int key, const InitOptions* given);
  std::unique_ptr<CommImpl> shrink(const std::vector<int>& exclude, bool abortFirst, const InitOptions* given);
  std::unique_ptr<CommImpl> grow(int newSize, const bootstrap::UniqueId* id, const InitOptions* given);
  void abort();
  bool aborted() const { return abort_.load(); }

  // Groups (groups.cc): the connections a group needs, and its sends and receives (the point-to-point part).
  void ensureConnected(const std::vector<int>& peers);
  void ensureConnected(int peer);
  detail::PointToPoint& p2p() { return *p2p_; }
  void checkCollArgs(const collectives::Args& a) const;
  std::shared_ptr<detail::CollTask> makeCollTask(const collectives::Args& a);
  /// Runs `t` on the collective thread, after those before it.
  void submit(const std::shared_ptr<detail::CollTask>& t);
  /// Runs `t` now in this thread (waiting for the collective thread's queue first).
  void runNow(detail::CollTask& t);

  CommImpl();
  static std::unique_ptr<CommImpl> create(std::unique_ptr<CommImpl> c, std::unique_ptr<bootstrap::Bootstrap> bs,
                                          const InitOptions& opts, double bootstrapMs);
  // Init phases (NCCL's initTransportsRank, in order).
  void initialise(const InitOptions& opts);
  void gatherPeerInfo(const InitOptions& opts, bool* gpuMode, topology::XmlDoc* doc);
  void currentCudaDevice(transport::PeerInfo* me);
  void findNodes();
  void assignDevices(const InitOptions& opts, topology::XmlDoc& doc);
  // The plan's two stages (plan.h's planNode and joinNodes) with the graph-info allgather between them.
  search::NodeGraphs planNode(const InitOptions& opts, const topology::XmlDoc& doc);
  void joinNodes(const InitOptions& opts, const search::NodeGraphs& node);
  /// TOPOCOLL_PLAN_FILE: rank 0 writes the plan it executes as plan JSON.
  void dumpPlan(const InitOptions& opts) const;
  void setupTransports(const InitOptions& opts, const search::NodeGraphs& node);
  void logInit() const;

  /// After a collective's transfers failed: tells the job, or takes the failure another rank told first (what the
  /// call then reports: code and message). `call` names the call.
  std::pair<StatusCode, std::string> relayFailure(StatusCode code, const std::string& why, const std::string& call);
  /// The job failed at an earlier call (relayFailure): every call fails with it.
  bool jobFailure(std::string* why);
  /// Its code (kRemoteError when another rank's failure ended the job); kOk while the job is well.
  StatusCode jobCode();
  /// How long a rank whose connection broke waits for word of a failure elsewhere before it names its peer.
  static constexpr std::chrono::milliseconds kRelayGrace{500};
  /// The engine's stalls (progress::Engine::Options::onStall): the job's failure told by another rank; and once a
  /// collective stalled for kCallCheckAfter, its call told to every peer and the peers' stalled calls compared with
  /// it (ranks whose calls differ in their pattern, a Broadcast's root, AllReduce against Reduce, may never exchange
  /// a message that would show it).
  bool onStall(std::chrono::steady_clock::duration stalled, int peer, StatusCode* code, std::string* why);
  /// After a timeout waiting on `peer`: the rank really stuck, from the peers' notes (who waits on whom), as words
  /// for the message ("" when it is `peer` itself, or nobody said).
  std::string stuckRank();
  std::string hostOfRank(int r) const;  // " (on host ADDR with ranks ...)" across hosts, else ""
  static constexpr std::chrono::milliseconds kCallCheckAfter{1000};
  struct CallNote {
    uint64_t seq = 0, call = 0;
    int64_t waitsOn = -1;  // the rank its stalled operation waits on
  };
  std::atomic<uint64_t> curCall_{0}, curSeq_{0};  // the collective on the engine now (call 0: none)
  std::mutex stallMu_;                             // onStall's state below
  uint64_t announced_ = 0;                         // seq + 1 of the last call told to the peers (onStall only)
  std::vector<std::pair<int, CallNote>> laterNotes_;  // peers' notes of calls after the current one (onStall only)
  std::map<int, CallNote> notes_;                     // peers' notes of the current call (onStall only)
  uint64_t notesSeq_ = 0;                             // the call notes_ is about
  int waitsOn_ = -1;                                  // the rank this one's stall waited on last

  std::unique_ptr<CommImpl> joinChild(const std::vector<int>& members, uint32_t seq, const std::string& what,
                                      const std::string& keyContext, int tagBase, bool survivors,
                                      const InitOptions& opts);
  InitOptions opts_;        // what this communicator was made with (split and shrink pass them on)
  uint32_t splitSeq_ = 0;   // splits and shrinks called so far

  std::atomic<bool> abort_{false};
  std::mutex jobMu_;
  std::string jobWhy_;  // the job's failure (relayFailure), under jobMu_
  StatusCode jobCode_ = StatusCode::kOk;  // its code, under jobMu_
  std::atomic<bool> jobFailed_{false};  // jobWhy_ is set
  uint64_t collSeq_ = 0;  // collectives executed (Args::seq; under the collective queue's hold)
  std::unique_ptr<bootstrap::Bootstrap> bs_;
  bootstrap::RootHandle root_;
  int rank_ = 0, nRanks_ = 0, node_ = 0, localRank_ = 0, localRanks_ = 0, intraProcRanks_ = 0;
  std::vector<uint64_t> hosts_;        // node n's host hash
  std::vector<int> localRankOf_;
  std::vector<PeerInfo> peers_;
  /// What this communicator executes: its rank's system and graphs, the job's rings, trees and channels, the model.
  Plan plan_;
  /// Every choice of the collectives on host memory (tuning/host_policy.h): asked once per call by choose().
  tuning::HostPolicy hostPolicy_;
  InitTimings timings_;
  /// GPU ranks: this node's system with paths (the plan's); null for host-memory ranks.
  const topology::System* system() const { return plan_.hostMemory ? nullptr : &plan_.system; }

  // Transports.
  /// The point-to-point part (p2p.h), made with the engine. Its pooled ops go before the engine; the part itself
  /// (with the stream of device copies, which operations in flight may use) after the engine and the connections
  /// (declared before them).
  std::unique_ptr<detail::PointToPoint> p2p_;
  std::unique_ptr<progress::Connections> conns_;
  std::unique_ptr<detail::Engine> engine_;

  // Collectives: one runs at a time, in issue order (collQueue_); asynchronous ones on its thread.
  Request collective(const collectives::Args& a, bool blocking);
  void execute(detail::CollTask& t);
  // One-shot small collectives (collectives::runOneShot over the mailboxes): whether `a` takes that path
  // (tuning::hostOneShot: the same answer on every rank).
  tuning::HostCall hostCall(const collectives::Args& a, bool mailboxes) const;
  bool oneShotFits(const collectives::Args& a) const;
  /// collectives::runOneShot for a blocking call outside groups: after what the collective thread has queued, errors
  /// worded as execute() words them. false (nothing done, on every rank alike) when some rank's connections lack
  /// mailboxes: the caller runs the call on the engine, and oneShotFits says false from then on.
  bool runOneShotNow(const collectives::Args& a);
  int waitSpinUs_ = 20, waitYieldUs_ = 0;  // how waits spin and yield before sleeping (the engine's)
  void stopCollectives();
  /// The mailboxes of the one-shot path (made with the engine; destroyed before the connections).
  std::unique_ptr<progress::Mailboxes> mailboxes_;
  /// The collectives' links (made at the first collective, under the collective lock).
  progress::ChannelLinks& links();
  std::unique_ptr<progress::ChannelLinks> links_;
  // Collectives on device buffers (collectives.cc): whether `a`'s buffers are device memory (throws on a mix), and
  // the calls into the device path (collectives::DeviceColl, made at the first one, seeing this communicator
  // through devHost_).
  bool onDevice(const collectives::Args& a) const;
  void runDevice(const collectives::Args& a);
  void runDeviceAllToAll(const void* sendbuff, void* recvbuff, size_t count, DataType type, void* stream);
  collectives::DeviceColl& deviceColl();
  std::unique_ptr<collectives::DeviceHost> devHost_;
  std::unique_ptr<collectives::DeviceColl> devColl_;
  /// One collective at a time, in issue order: the collective lock and the collective thread (coll_queue.h).
  std::unique_ptr<detail::CollQueue> collQueue_;
  std::vector<std::shared_ptr<std::vector<char>>> allToAllCopies_;
  detail::OneSided& oneSided();  // registrations, windows, signals (made on first use)
  std::mutex oneSidedMu_;
  std::unique_ptr<detail::OneSided> oneSided_;  // inputs of in-place all-to-alls in flight
};

}  // namespace topocoll::runtime
