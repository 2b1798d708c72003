// Communicator initialisation: the peer-info allgather, node and local-rank discovery, the plan of this rank's
// node, the graph-info allgather and the job-wide rings and trees (NCCL's initTransportsRank up to the
// transports). Transports and data movement come later; a Communicator already holds what they need.
//
//   auto comm = topocoll::runtime::Communicator::initFromEnv(topocoll::Env::fromProcess());  // mpirun/srun/torchrun
//   for (auto& ring : comm->connect().rings) ...
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/config.h"
#include "topocoll/env.h"
#include "topocoll/search/connect.h"
#include "topocoll/tuning/tuning.h"

namespace topocoll::runtime {

/// What every rank tells the others first (NCCL's ncclPeerInfo, the fields we use). Plain data.
struct PeerInfo {
  int32_t rank = 0;
  int32_t dev = -1;        // GPU `dev` in the topology, -1 for a host-memory rank
  int64_t busId = -1;      // GPU bus id, -1 for a host-memory rank
  uint64_t hostHash = 0;   // hostname + boot id, or NCCL_HOSTID
  uint64_t pidHash = 0;    // process
  uint64_t shmDev = 0;     // /dev/shm device: ranks of one host in different containers differ
  int32_t cudaCompCap = 0;
  int32_t gdrSupport = 0;
  int32_t numaNode = 0;    // NUMA node the rank runs on
  int32_t reserved = 0;    // explicit, so that no uninitialised padding byte goes on the wire
};
static_assert(std::has_unique_object_representations_v<PeerInfo>, "PeerInfo is sent as bytes: no padding");

/// Wall-clock time of each init phase, in milliseconds (NCCL's "Init timings").
struct InitTimings {
  double bootstrap = 0, allgathers = 0, topology = 0, search = 0, connect = 0, total = 0;
};
static_assert(sizeof(InitTimings) == 6 * sizeof(double), "InitTimings is sent as bytes: no padding");

struct InitOptions {
  Config cfg;                     // every knob (NCCL_HOSTID, NCCL_TOPO_FILE, TOPOCOLL_SIMULATE_GPUS, ...)
  bootstrap::Options bootstrap;   // derived from cfg (TOPOCOLL_TIMEOUT, NCCL_SOCKET_IFNAME/FAMILY); tests adjust it
  /// The options of `cfg`.
  static InitOptions fromConfig(const Config& cfg);
  /// fromConfig(Config::fromEnv(env)): throws naming the knob on bad values.
  static InitOptions fromEnv(const Env& env);
};

class Communicator {
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

  int rank() const { return rank_; }
  int nRanks() const { return nRanks_; }
  int nNodes() const { return connect_.nNodes; }
  int node() const { return node_; }
  int localRank() const { return localRank_; }
  int localRanks() const { return localRanks_; }
  int intraProcRanks() const { return intraProcRanks_; }
  bool hostMemory() const { return peers_[rank_].dev < 0; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  const search::Connect& connect() const { return connect_; }
  const tuning::Model& model() const { return model_; }
  const InitTimings& timings() const { return timings_; }
  bootstrap::Bootstrap& bootstrap() { return *bs_; }

 private:
  Communicator() = default;
  static std::unique_ptr<Communicator> create(std::unique_ptr<bootstrap::Bootstrap> bs, const InitOptions& opts,
                                              double bootstrapMs);
  void initialise(const InitOptions& opts);
  void logInit() const;
  std::unique_ptr<bootstrap::Bootstrap> bs_;
  bootstrap::RootHandle root_;
  int rank_ = 0, nRanks_ = 0, node_ = 0, localRank_ = 0, localRanks_ = 0, intraProcRanks_ = 0;
  std::vector<PeerInfo> peers_;
  search::Connect connect_;
  tuning::Model model_;
  InitTimings timings_;
};

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
LaunchInfo launchInfoFromEnv(const Env& env, const std::string& jobId = "");
/// The kernel's ephemeral port range (/proc/sys/net/ipv4/ip_local_port_range; Linux's default when unreadable).
std::pair<int, int> ephemeralPortRange();
/// The root port of a job whose launcher gives no address (mpirun on one host, srun): from `jobHash`, in
/// 10000..65535 and outside the ephemeral range. Throws when that range leaves no port.
int derivedRootPort(uint64_t jobHash, std::pair<int, int> ephemeral);
/// First host of a Slurm node list ("node[01-04,07],gpu2" -> "node01").
std::string firstSlurmHost(const std::string& nodeList);

}  // namespace topocoll::runtime
