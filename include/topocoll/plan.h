// The library's front door: one call that turns a topology, a job shape and the environment into the whole plan
// NCCL 2.30.7 would compute (system, paths, graphs, rings, trees, tuning tables) plus a selection function.
//
//   topocoll::Config cfg = topocoll::Config::fromEnv(topocoll::Env::fromProcess());
//   auto topo = topocoll::topology::loadXmlFile("dgx.xml");
//   topocoll::Plan plan = topocoll::makePlan(topo, {.nNodes = 2}, cfg);
//   auto choice = plan.select(topocoll::tuning::kAllReduce, 1 << 20);
//
// A Plan is an immutable value: a communicator computes one at init (the same two stages, planNode and joinNodes,
// with the graph-info allgather between them) and executes what it says; select() serves its hot path.
#pragma once

#include "topocoll/export.h"

#include <array>
#include <string>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/search/connect.h"
#include "topocoll/search/graph.h"
#include "topocoll/search/node_search.h"
#include "topocoll/topology/system.h"
#include "topocoll/topology/xml.h"
#include "topocoll/tuning/tuning.h"

namespace topocoll {

/// The job: `nNodes` hosts, ranks numbered host by host (GPUs by `dev` within a host). A topology describes one
/// host, or (several host_hash values) the trays of one multi-node NVLink domain: job host i is then the
/// topology's host i mod H, and `cliqueHosts` consecutive hosts form an NVLink clique (one NCCL node, the network
/// only between cliques).
struct JobSpec {
  int nNodes = 1;
  int gpusPerNode = 0;             // 0: every GPU of a host; else the first G GPUs by `dev`
  std::vector<int> ranksOnGpus;    // explicit `dev` of each local rank (overrides gpusPerNode)
  int cliqueHosts = 0;             // hosts per NVLink clique; 0: gcd(nNodes, the topology's hosts), 1 with
                                   // NCCL_MNNVL_ENABLE=0
};

/// The most ranks a plan may have (NCCL's ranks are ints; the per-rank tables must fit in memory too).
constexpr int64_t kMaxPlanRanks = int64_t{1} << 24;

struct Plan {
  JobSpec job;
  Config cfg;
  int nRanks = 0, localRanks = 0;            // localRanks: ranks per host
  int cliqueHosts = 1;                        // hosts per NVLink clique (1: no multi-node NVLink)
  std::vector<int> localDevs;                 // GPU dev of local rank i (of every host)
  topology::XmlDoc nodeXml;                   // the fused XML rank 0's system was built from (its host or clique)
  topology::System system;                    // rank 0's system after paths, trim and paths again
  std::vector<std::vector<int>> hostDomains;  // the NCCL nodes of one host (or clique): their ranks in it
  std::array<search::Graph, search::kNumGraphs> graphs;  // rank 0's node's graphs, as searched
  std::array<bool, search::kNumGraphs> graphAvailable = {};
  search::Connect connect;
  tuning::Model model;
  bool hostMemory = false;  // the ranks move host memory: hostMemoryNode's layout, no system, graphs or model
  double searchMs = 0, wallMs = 0;

  /// Cost-based choice for one operation (nBytes as the tuner sees it).
  tuning::Selection select(int coll, uint64_t nBytes) const {
    return tuning::select(model, coll, nBytes, !cfg.algo.empty() || !cfg.proto.empty());
  }
};

/// Builds the plan. Throws Error with a message naming the input at fault. `graphs` (node 0's, indexed like
/// Plan::graphs), when given, replace the searches of the graphs that have channels, as NCCL_GRAPH_FILE does: the
/// rest (connect, tuning, selection) is what NCCL then computes.
TOPOCOLL_API Plan makePlan(const topology::XmlDoc& topo, const JobSpec& job, const Config& cfg,
              const std::array<search::Graph, search::kNumGraphs>* graphs = nullptr);

/// The node stage of a plan (NCCL's initTransportsRank up to the graph-info allgather): what one rank computes alone.
struct NodePlan {
  topology::System system;   // the rank's system after paths, trim and paths again
  search::NodeGraphs graphs;  // the searched graphs of its NCCL node
};

/// planNode for `rank` (numbered as `host`'s GPUs number their ranks) of a job of `nRanks`. `host`: the system of its
/// host (or NVLink clique) built from the fused XML; `shmDevByRank`: which ranks share /dev/shm (empty: all);
/// `given` graphs replace the searches (NCCL_GRAPH_FILE, plan --optimize). Throws Error(kInvalidArgument) naming
/// `source` when the rank's GPUs talk through the network and `host` has no network device.
NodePlan planNode(const topology::System& host, int rank, int nRanks, const Config& cfg, const std::string& source,
                  const std::vector<int>& shmDevByRank = {},
                  const std::array<search::Graph, search::kNumGraphs>* given = nullptr);

/// A rank of a host-memory job (no GPU): its rank and NUMA node.
struct HostRank {
  int rank = 0, numaNode = 0;
};
/// The node stage of a host-memory job: the host's ranks ordered by NUMA node then rank, one ring and one chain on
/// two channels.
search::NodeGraphs hostMemoryNode(std::vector<HostRank> ranks);

/// The join stage (NCCL's allGather3 onwards): the job-wide channels, rings and trees from every rank's record
/// (search::presetRank of each rank's node), and the tuning model from them (GPU plans: from `plan.system`).
void joinNodes(Plan& plan, const search::RankRecords& records);

/// The plan as one JSON document, with the field names of tests/conformance/SCHEMA.md (`system`, `graphs`,
/// `graph_dump_xml`, `connect`, `tuning`, `selection`) plus topocoll's own (documented in docs/plan-json.md).
/// `timings` false leaves out the fields that measure time (graphs' searchMs, searchTimeMs, wallMs), so that two plans
/// of the same inputs compare byte for byte (`topocoll plan --json --no-timings`, TOPOCOLL_PLAN_FILE).
TOPOCOLL_API std::string planToJson(const Plan& plan, const std::string& topoName, int typeSize = 4, bool pretty = false,
                       bool timings = true);

/// The name a plan JSON gives a topology file: its path from `topologies/` on when it has one (the conformance
/// fixtures' names), else the path as given.
std::string topoName(const std::string& path);

/// The size nccl-tests reports (and NCCL's tuner sees) for a test size `size` (its -b/-e/-f sizes): the size
/// itself, except for AllGather and ReduceScatter, whose buffer holds a whole number of elements per rank:
/// floor(size / nRanks / typeSize) x typeSize x nRanks (0 when a rank would get no element).
uint64_t testSize(int coll, uint64_t size, int typeSize, int nRanks);

/// Selection table for the test sizes 8 B .. 8 GiB (powers of two, rounded by testSize; sizes of 0 elements left
/// out), collectives in nccl-tests' order.
TOPOCOLL_API std::vector<tuning::Selection> selectionTable(const Plan& plan, int typeSize, int onlyColl = -1);

}  // namespace topocoll
