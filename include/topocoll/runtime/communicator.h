// The communicator: NCCL's initTransportsRank (peer-info allgather, nodes and local ranks, the plan of this rank's
// node, the graph-info allgather, job-wide rings and trees, then the transports of the rings and trees), the
// point-to-point operations on top of the transports (ncclSend / ncclRecv, groups) and the collectives.
//
//   auto comm = topocoll::runtime::Communicator::initFromEnv(topocoll::Env::fromProcess());  // mpirun/srun/torchrun
//   int peer = (comm->rank() + 1) % comm->nRanks(), from = (comm->rank() + comm->nRanks() - 1) % comm->nRanks();
//   topocoll::runtime::groupStart();                      // any order of sends and receives completes in a group
//   comm->send(out.data(), out.size(), topocoll::DataType::kFloat32, peer);
//   comm->recv(in.data(), in.size(), topocoll::DataType::kFloat32, from);
//   topocoll::runtime::groupEnd();                        // issues both, returns when both completed
//
//   auto r = comm->isend(buf, n, DataType::kInt32, peer);  // asynchronous
//   ...; r.wait();                                          // throws topocoll::Error naming the peer on failure
//
// Collectives (docs/collectives.md), NCCL's argument order, every rank in the same order:
//   comm->allReduce(in, out, n, DataType::kFloat32, RedOp::kSum);      // blocking; in == out: in place
//   auto a = comm->iallGather(in, all, n, DataType::kFloat32);          // asynchronous: runs on the collective thread
//   comm->broadcast(buf, buf, n, DataType::kInt64, /*root=*/0);
//   a.wait();                                                           // completes in issue order
#pragma once

#include "topocoll/export.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/collectives/algorithms.h"
#include "topocoll/config.h"
#include "topocoll/datatype.h"
#include "topocoll/env.h"
#include "topocoll/plan.h"
#include "topocoll/search/connect.h"
#include "topocoll/transport/transport.h"
#include "topocoll/tuning/host_model.h"
#include "topocoll/tuning/tuning.h"

namespace topocoll::topology {
struct System;
struct XmlDoc;
}
namespace topocoll::transport {
class Proxy;
class Net;
}
namespace topocoll::progress {
struct Op;
class OpPool;
class Engine;
class Connections;
class ChannelLinks;
}

namespace topocoll::runtime {

/// A memory window (Communicator::registerWindow; NCCL's ncclWindow_t). Opaque.
class Window;

/// What every rank tells the others first (NCCL's ncclPeerInfo).
using PeerInfo = transport::PeerInfo;

/// Wall-clock time of each init phase, in milliseconds (NCCL's "Init timings").
struct InitTimings {
  double bootstrap = 0, allgathers = 0, topology = 0, search = 0, connect = 0, transports = 0, total = 0;
};
static_assert(sizeof(InitTimings) == 7 * sizeof(double), "InitTimings is sent as bytes: no padding");

struct TOPOCOLL_API InitOptions {
  Config cfg;                     // every knob (NCCL_HOSTID, NCCL_TOPO_FILE, TOPOCOLL_SIMULATE_GPUS, ...)
  bootstrap::Options bootstrap;   // derived from cfg (TOPOCOLL_TIMEOUT, NCCL_SOCKET_IFNAME/FAMILY); tests adjust it
  /// The options of `cfg`.
  static InitOptions fromConfig(const Config& cfg);
  /// fromConfig(Config::fromEnv(env)): throws naming the knob on bad values.
  static InitOptions fromEnv(const Env& env);
};

class CommImpl;
namespace detail {  // the runtime's own (a Request holds one)
using progress::Op;
struct CollTask;
}

/// The handle of an asynchronous send, receive or collective.
class TOPOCOLL_API Request {
 public:
  Request() = default;
  /// Blocks until the operation completed; throws Error on failure (a size or type mismatch, kInvalidUsage; the
  /// peer gone, kRemoteError; TOPOCOLL_TIMEOUT without progress, kTimeout; abort, kAborted), naming both ranks.
  /// Inside a group, call it after groupEnd().
  void wait();
  /// True when completed; throws like wait() when it failed. Drives the transfers once if nobody else does.
  bool test();
  bool valid() const { return op_ != nullptr || task_ != nullptr; }

  /// Made by the communicator for one of its operations (the types are the runtime's own).
  explicit Request(std::shared_ptr<detail::Op> op) : op_(std::move(op)) {}
  explicit Request(std::shared_ptr<detail::CollTask> t) : task_(std::move(t)) {}

 private:
  std::shared_ptr<detail::Op> op_;
  std::shared_ptr<detail::CollTask> task_;
};

/// One connection of the communicator, for `comm-check` and tests.
struct ConnectionInfo {
  int channel = 0, connIndex = 0, peer = 0;
  transport::Side side = transport::Side::kSend;
  std::string via;   // "P2P/direct pointer", "P2P/IPC/CMA", "SHM/direct", "NET/Socket/0"
};

/// The public face of a communicator: every call goes to its state and parts (runtime-private).
class TOPOCOLL_API Communicator {
 public:
  /// Joins the job `id` as `rank` of `nRanks` over TCP.
  static std::unique_ptr<Communicator> init(const bootstrap::UniqueId& id, int nRanks, int rank,
                                            const InitOptions& opts);
  /// Reads the launcher's environment (OpenMPI's mpirun, Slurm's srun, torchrun) for rank, size and the root
  /// address (NCCL_COMM_ID, MASTER_ADDR/MASTER_PORT, or derived from the launcher's job id); rank 0 hosts the
  /// root. Throws Error(kInvalidUsage) saying which variable to set when no address can be derived.
  static std::unique_ptr<Communicator> initFromEnv(const Env& env);
  /// Over an existing bootstrap (in-memory groups in tests).
  static std::unique_ptr<Communicator> initWithBootstrap(std::unique_ptr<bootstrap::Bootstrap> bs,
                                                         const InitOptions& opts);
  /// Pending operations fail (kAborted); the threads stop; every buffer, socket and descriptor is released.
  ~Communicator();

  int rank() const;
  int nRanks() const;
  int nNodes() const;
  int node() const;
  int localRank() const;
  int localRanks() const;
  int intraProcRanks() const;
  bool hostMemory() const;
  const std::vector<PeerInfo>& peers() const;
  /// The plan this communicator executes (plan.h): its rank's system and graphs, the job's rings, trees and
  /// channels, the tuning model. connect() and model() are its parts.
  const Plan& plan() const;
  const search::Connect& connect() const;
  const tuning::Model& model() const;
  /// The host cost model the collectives choose with, and the slowest link between the ranks.
  const tuning::HostModel& hostModel() const;
  tuning::HostLink hostLink() const;
  const InitTimings& timings() const;
  bootstrap::Bootstrap& bootstrap();

  /// NCCL's ncclSend: `count` elements of `type` from `buf` to rank `peer` (this rank included). Returns at once;
  /// outside a group the transfer starts now, inside one at groupEnd(). The buffer must stay valid until done.
  Request isend(const void* buf, size_t count, DataType type, int peer);
  /// NCCL's ncclRecv into `buf` from rank `peer`. The peer's send must have the same count and type: if not, both
  /// operations fail (kInvalidUsage) and the connection stays usable.
  Request irecv(void* buf, size_t count, DataType type, int peer);
  /// isend(...).wait(); inside a group, issued and completed by groupEnd().
  void send(const void* buf, size_t count, DataType type, int peer);
  void recv(void* buf, size_t count, DataType type, int peer);
  /// A blocking receive from whichever of the `nPeers` ranks in `peers` sends first (MPI_ANY_SOURCE): returns the
  /// sender's rank. The message must match `count` and `type` as for recv(). Not in a group; no other receive from
  /// these peers may be under way. Fails kTimeout after TOPOCOLL_TIMEOUT with no sender, kRemoteError when every
  /// one of them is gone.
  int recvAny(void* buf, size_t count, DataType type, const int* peers, int nPeers);

  // ---- Collectives (NCCL's argument order). Every rank calls the same collectives in the same order, with the same
  // count, type, op and root; they complete in that order. In place when the send buffer is the receive buffer
  // (AllGather: recvbuff + rank * count; ReduceScatter: sendbuff + rank * count). The i* forms return at once (the
  // collective runs on the communicator's collective thread; buffers must stay valid until wait()); the plain forms
  // block. Inside groupStart()/groupEnd() both are issued by groupEnd(), which returns when they completed.
  // Failures throw Error: a peer gone (kRemoteError), TOPOCOLL_TIMEOUT without progress (kTimeout), abort
  // (kAborted), a peer that called something else (kInvalidUsage, naming both ranks; always detected with
  // TOPOCOLL_CHECK_CALLS=1, otherwise when the sizes differ).
  //
  //   comm->allReduce(in, out, n, DataType::kFloat32, RedOp::kSum);
  //   auto r = comm->iallGather(in, out, n, DataType::kInt32); ...; r.wait();
  Request iallReduce(const void* sendbuff, void* recvbuff, size_t count, DataType type, RedOp op);
  Request ibroadcast(const void* sendbuff, void* recvbuff, size_t count, DataType type, int root);
  Request ireduce(const void* sendbuff, void* recvbuff, size_t count, DataType type, RedOp op, int root);
  Request iallGather(const void* sendbuff, void* recvbuff, size_t sendcount, DataType type);
  Request ireduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, DataType type, RedOp op);
  //
  // Device buffers (cudaMalloc'ed; docs/gpu.md, "Device collectives"): the blocking forms take the caller's stream (a
  // cudaStream_t; nullptr: the legacy default stream). The call first synchronizes that stream (the collective comes
  // after the work queued on it) and returns when the collective is complete on every buffer, so it is stream-ordered
  // trivially; the i* forms and calls inside a group do the same on the legacy stream and return a completed
  // Request. Every rank passes device buffers or every rank host buffers; one call mixing both fails
  // (kInvalidArgument).
  void allReduce(const void* sendbuff, void* recvbuff, size_t count, DataType type, RedOp op, void* stream = nullptr);
  void broadcast(const void* sendbuff, void* recvbuff, size_t count, DataType type, int root, void* stream = nullptr);
  void reduce(const void* sendbuff, void* recvbuff, size_t count, DataType type, RedOp op, int root,
              void* stream = nullptr);
  void allGather(const void* sendbuff, void* recvbuff, size_t sendcount, DataType type, void* stream = nullptr);
  void reduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, DataType type, RedOp op,
                     void* stream = nullptr);
  /// `count` elements to and from every rank (a group of sends and receives, as NCCL's).
  void allToAll(const void* sendbuff, void* recvbuff, size_t count, DataType type, void* stream = nullptr);
  /// Returns when every rank called it.
  void barrier();
  /// The algorithm, protocol and channels a collective would use (NCCL_DEBUG_SUBSYS=TUNING logs each choice).
  collectives::Choice choose(const collectives::Args& a) const;

  /// Makes the point-to-point connections to every peer now (they are otherwise made on first use, as NCCL does);
  /// every rank must call it.
  void connectAll();
  /// The connections made so far (rings and trees at init, point-to-point ones on first use).
  std::vector<ConnectionInfo> connections() const;

  /// NCCL's ncclCommSplit: every rank of this communicator calls it, after the same collectives; the ranks of one
  /// `color` (>= 0) make a communicator, ranked by `key` then by their rank here. kNoColor: this rank joins none and
  /// gets null. The new communicator has its own root, connections and threads (it may outlive this one) and this
  /// one's options unless `opts` are given. Fails on every rank alike (kInvalidUsage) when the ranks' calls differ.
  static constexpr int kNoColor = -1;
  std::unique_ptr<Communicator> split(int color, int key);
  std::unique_ptr<Communicator> split(int color, int key, const InitOptions& opts);
  /// NCCL's ncclCommShrink: the ranks not in `exclude` (which do not call it) make a communicator, in their order
  /// here. Works when the excluded ranks are dead or hung and this communicator failed. `abortFirst`
  /// (NCCL_SHRINK_ABORT): this communicator's pending operations end first (kAborted); it is aborted afterwards.
  /// Every remaining rank gives the same `exclude` (else kInvalidUsage naming the difference).
  std::unique_ptr<Communicator> shrink(const std::vector<int>& exclude, bool abortFirst = false);
  std::unique_ptr<Communicator> shrink(const std::vector<int>& exclude, bool abortFirst, const InitOptions& opts);
  /// NCCL's ncclCommGrow, for the ranks of this communicator: every one calls it, exactly one with the id of the
  /// grown communicator (a root it started: createUniqueId), the others with null. Each keeps its rank in a
  /// communicator of `newSize` ranks; the new ranks join it with init(id, newSize, rank) for ranks nRanks() and up.
  std::unique_ptr<Communicator> grow(int newSize, const bootstrap::UniqueId* id);
  // ---- Registration, windows and one-sided signals (NCCL's ncclCommRegister, ncclCommWindowRegister,
  // ncclPutSignal, ncclSignal, ncclWaitSignal; docs/nccl-api.md "Registration and windows").
  /// Local: records [buf, buf + bytes) (mapped memory, overlapping no other registration of this communicator, else
  /// kInvalidArgument) and returns its handle. memAlloc memory is what peers in other processes map; the collectives
  /// map it whether or not it is registered.
  void* registerBuffer(void* buf, size_t bytes);
  /// kInvalidArgument for a handle that is not a live registration of this communicator.
  void deregisterBuffer(void* handle);
  /// Bytes registered now (ncclCommMemStats).
  size_t registeredBytes() const;
  static constexpr int kWinSymmetric = 1;        // NCCL_WIN_COLL_SYMMETRIC
  static constexpr int kWinStrictOrdering = 2;   // NCCL_WIN_STRICT_ORDERING
  /// Collective: every rank registers its part of a window (memAlloc memory), in the same order; each rank maps
  /// every peer's part it can (this host). Fails on every rank alike when a rank's arguments are wrong.
  Window* registerWindow(void* buf, size_t bytes, int flags);
  /// Local: the handle is dead afterwards (peers may still hold their mapping of this rank's part).
  void deregisterWindow(Window* w);
  void* windowUserPtr(Window* w) const;
  /// Copies `bytes` from `local` (inside a kWinSymmetric window of this communicator) into rank `peer`'s part of `w`
  /// at `offset`, then signals `peer`. Returns when the data is there (host memory: no stream). Peers of this host.
  void putSignal(const void* local, size_t bytes, int peer, Window* w, size_t offset);
  /// One signal to `peer` (signal index 0), no data.
  void signal(int peer);
  /// Waits until each peer's signals since the last waits reach `count` (and takes them), within TOPOCOLL_TIMEOUT;
  /// a peer process that ended, an abort or the job's failure end it with an error.
  struct SignalWait {
    int peer = 0, count = 1;
  };
  void waitSignals(const std::vector<SignalWait>& waits);

  /// Any thread: every pending and later operation fails with kAborted; every wait returns.
  void abort();
  /// Any thread (a watchdog polling while another thread waits in a call): the failure that ended this
  /// communicator's job, kOk while there is none. A call of this rank failed and told the job, or a call of this
  /// rank learnt of another rank's failure; every later call fails with it (`why` names the rank at fault).
  StatusCode asyncError(std::string* why) const;
  bool aborted() const;

 private:
  explicit Communicator(std::unique_ptr<CommImpl> impl);
  std::unique_ptr<CommImpl> impl_;
};

/// NCCL's ncclMemAlloc / ncclMemFree for host memory: zeroed, in whole 2 MiB pages, shareable (a memfd: ranks of
/// other processes on the host map it and copy into or out of it with loads and stores, up to 1.8x faster than
/// process_vm_readv; TOPOCOLL_MAP_PEER_BUFFERS, docs/transport.md "Shareable buffers"). Any buffer works with every
/// operation; these are the fast ones for large messages. Throws Error(kSystemError) when no memory can be had;
/// memFree throws Error(kInvalidUsage) for a pointer memAlloc did not return (`bytes` is not needed any more).
TOPOCOLL_API void* memAlloc(size_t bytes);
TOPOCOLL_API void memFree(void* ptr, size_t bytes);

/// NCCL's ncclGroupStart / ncclGroupEnd: per thread, nestable, spanning communicators. Sends and receives called in
/// between are issued together by the outermost groupEnd(), which makes the connections they need, issues them and
/// returns when all of them completed (there is no stream to complete on with host memory); it throws the first
/// failure after every operation has finished. All-to-all is a group of sends and receives.
TOPOCOLL_API void groupStart();
TOPOCOLL_API void groupEnd();
/// The group depth of this thread (0: not in a group).
TOPOCOLL_API int groupDepth();
/// NCCL's ncclGroupSimulateEnd: closes the group like groupEnd() but runs nothing; returns the cost model's estimate
/// of its time in microseconds (each communicator's collectives in turn plus its sends or receives, whichever take
/// longer; the communicators side by side). What the group held is dropped (a Request on it fails, kAborted). A
/// nested call only closes its level and returns 0.
TOPOCOLL_API double groupSimulateEnd();

/// What initFromEnv found in the environment (exposed for tests).
struct LaunchInfo {
  int rank = -1, size = -1, localRank = -1;
  std::string rootAddress;  // host:port
  std::string launcher;     // "torchrun", "mpirun", "srun", "env"
  std::string jobIdentity;  // job ids: OpenMPI's job, Slurm's job.step, torchrun's run.restart, TOPOCOLL_JOB_ID
  bool jobIdentified = false;  // some id is known: two jobs on one root address have different magics
  uint64_t jobKey = 0;      // stable per job (root address and job ids): seeds the magic
};
/// `jobId` (TOPOCOLL_JOB_ID) is mixed into the job key with the launchers' own job ids.
TOPOCOLL_API LaunchInfo launchInfoFromEnv(const Env& env, const std::string& jobId = "");
/// The secret of a job started from the environment (docs/security.md): from TOPOCOLL_JOB_SECRET or
/// TOPOCOLL_JOB_SECRET_FILE (a file owned by this user that nobody else can read, else Error(kInvalidUsage) naming
/// it and its mode). `*secret` is false when neither is set: the key is then derived from the root address and the
/// job ids, which anyone who knows them can compute.
AuthKey jobKeyFromEnv(const Config& cfg, const LaunchInfo& li, bool* secret);
/// The kernel's ephemeral port range (/proc/sys/net/ipv4/ip_local_port_range; Linux's default when unreadable).
std::pair<int, int> ephemeralPortRange();
/// The root port of a job whose launcher gives no address (mpirun on one host, srun): from `jobHash`, in
/// 10000..65535 and outside the ephemeral range. Throws when that range leaves no port.
int derivedRootPort(uint64_t jobHash, std::pair<int, int> ephemeral);
/// First host of a Slurm node list ("node[01-04,07],gpu2" -> "node01").
std::string firstSlurmHost(const std::string& nodeList);

}  // namespace topocoll::runtime
