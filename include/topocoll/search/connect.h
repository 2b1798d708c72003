// Joining the nodes' graphs into job-wide rings and trees: NCCL 2.30.7's ncclTopoPreset / ncclTopoPostset
// (src/graph/connect.cc), the graph-info allgather's min/max alignment and node numbering of initTransportsRank
// (src/init.cc), ncclNvlsTuning (src/transport/nvls.cc) and ncclTopoComputeP2pChannels.
//
//   // A communicator: every rank's record from the allgather.
//   std::vector<RankTopo> all(nRanks);
//   all[myRank] = presetRank(myRank, searchNode(sys, cfg, nRanks));
//   bootstrap.allGather(all.data(), sizeof(RankTopo));
//   Connect c = connectRanks(all, cfg);
//
//   // The planner: nodes that repeat (every host described by the same topology) are searched once.
//   Connect c = connectRanks(ReplicatedNodes({hostNodes}, ranksPerHost, nHosts), cfg);
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/search/graph.h"
#include "topocoll/search/node_search.h"

namespace topocoll::search {

struct TreeLinks {
  int up = -1;
  std::array<int, 3> down = {-1, -1, -1};
};
struct NvlsLinks {
  int nHeads = 0, headRank = -1, treeUp = -1;
  std::array<int, 3> treeDown = {-1, -1, -1};
};

/// The per-graph summary every rank shares (NCCL's graphInfo).
struct GraphInfo {
  int32_t pattern = 0, nChannels = 0, sameChannels = 0;
  float bwIntra = 0, bwInter = 0;
  int32_t typeIntra = 0, typeInter = 0, crossNic = 0;
};

/// One rank's fixed-size record of the graph-info allgather (NCCL's allGather3: graphInfo + ncclTopoRanks), made
/// by presetRank() from its node's graphs. Plain data, so a bootstrap can exchange it as bytes.
struct RankTopo {
  GraphInfo graphs[kNumGraphs];
  int32_t searchedRing = 0, searchedTree = 0, nChannelsPreset = 0, crossNicRing = 0;
  int32_t ringRecv[kMaxChannels], ringSend[kMaxChannels], ringPrev[kMaxChannels], ringNext[kMaxChannels];
  int32_t treeToParent[kMaxChannels], treeToChild0[kMaxChannels], treeToChild1[kMaxChannels];
  int32_t treeUp[kMaxChannels], treeDown[kMaxChannels];  // the chain inside the node
  int32_t nvlsHeadNum = 0, nvlsHeads[kMaxChannels];
  int32_t minCompCap = 0, maxCompCap = 0, cpuArch = 0, cpuVendor = 0, p2pnChannelsPerPeer = 0;
  int32_t nvlsSupport = 0, collnetSupport = 0, localRanks = 0;
  float minNetBw = 0;
};

/// ncclTopoPreset for `rank`, a rank of `node`. The node's graphs name ranks `rankOffset` below their job ranks
/// (a node searched once and repeated on other hosts); `rank` is the job rank.
RankTopo presetRank(int rank, const NodeGraphs& node, int rankOffset = 0);

/// Every rank's record, by rank: the allgather's result, or records made on demand.
class RankRecords {
 public:
  virtual ~RankRecords() = default;
  virtual int size() const = 0;
  /// The record of `rank`: a reference into the source, or `scratch` filled.
  virtual const RankTopo& get(int rank, RankTopo& scratch) const = 0;
};

/// Records held in memory (a communicator's allgather).
class RecordList : public RankRecords {
 public:
  explicit RecordList(const std::vector<RankTopo>& all) : all_(all) {}
  int size() const override { return static_cast<int>(all_.size()); }
  const RankTopo& get(int rank, RankTopo&) const override { return all_[rank]; }

 private:
  const std::vector<RankTopo>& all_;
};

/// A job of `units` units (hosts, or NVLink cliques of hosts) of `unitRanks` ranks each, unit u holding ranks
/// [u * unitRanks, (u + 1) * unitRanks) and described by unitTypes[u % unitTypes.size()]: the NCCL nodes of such a
/// unit (one per host, or several when a host splits into domains, or one per clique), their graphs naming the
/// unit's ranks from 0. Every rank of a unit is in exactly one node. Records are made when asked for, so no
/// per-rank copy of the graphs exists.
class ReplicatedNodes : public RankRecords {
 public:
  /// Throws Error(kInvalidArgument) when some type's nodes do not partition the unit's ranks.
  ReplicatedNodes(const std::vector<std::vector<NodeGraphs>>& unitTypes, int unitRanks, int units);
  int size() const override { return unitRanks_ * units_; }
  const RankTopo& get(int rank, RankTopo& scratch) const override;

 private:
  const std::vector<std::vector<NodeGraphs>>& types_;
  int unitRanks_, units_;
  std::vector<std::vector<int>> nodeOf_;  // [type][unit-local rank] -> index in types_[type]
};

struct Connect {
  int nNodes = 0, localRanks = 0, nRanks = 0;
  int minLocalRanks = 0, maxLocalRanks = 0;  // over all nodes (rank 0's node for localRanks)
  int nChannelsSearchedRing = 0, nChannelsSearchedTree = 0, nChannelsPreset = 0;
  int nChannels = 0, collChannels = 0;
  int nvlsSupport = 0, nvlsChannels = 0;
  int p2pnChannels = 0, p2pnChannelsPerPeer = 0;
  int maxTreePattern = 0, minCompCap = 0, maxCompCap = 0, cpuArch = 0, cpuVendor = 0;
  int collnetEnable = 0;
  float minNetBw = 0;
  std::array<Graph, kNumGraphs> aligned;      // graphs after the min/max combination (no channel lists)
  std::vector<int> nodeFirstRank;             // [node] the rank that starts its channel-0 ring
  std::vector<std::vector<int>> rings;        // [channel] ranks from rank 0
  std::vector<std::vector<TreeLinks>> trees;  // [rank][channel]
  std::vector<std::vector<NvlsLinks>> nvls;   // [rank][channel] (first two channels)
};

/// Alignment and postset from every rank's record. Nodes are found as NCCL finds them (ranks sharing their ring's
/// first rank). Throws Error(kInternal) if a ring does not close.
Connect connectRanks(const RankRecords& records, const Config& cfg);
inline Connect connectRanks(const std::vector<RankTopo>& all, const Config& cfg) {
  return connectRanks(RecordList(all), cfg);
}

}  // namespace topocoll::search
