// Joining the per-node graphs into job-wide rings and trees (NCCL's ncclTopoPreset / ncclTopoPostset, the
// graph-info allgather's min/max alignment, and the double binary trees of src/graph/trees.cc).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/search/graph.h"
#include "topocoll/topology/system.h"

namespace topocoll::search {

/// Graph indices in NCCL's algorithm order.
enum GraphIndex { kGraphRing = 0, kGraphTree = 1, kGraphCollnetChain = 2, kGraphCollnetDirect = 3, kGraphNvls = 4 };
constexpr int kNumGraphs = 5;
const char* graphName(int index);  // "ring", "tree", "collnet_chain", "collnet_direct", "nvls"

/// ncclGetBtree: parent and children of `rank` in NCCL's binary tree over nranks (-1 when absent).
void getBtree(int nranks, int rank, int* up, int* down0, int* down1, int* parentChildType);
/// ncclGetDtree: the two trees of the double binary tree (shift for odd, mirror for even nranks).
void getDtree(int nranks, int rank, int* s0, int* d0_0, int* d0_1, int* parentChildType0, int* s1, int* d1_0,
              int* d1_1, int* parentChildType1);

struct TreeLinks {
  int up = -1;
  std::array<int, 3> down = {-1, -1, -1};
};
struct NvlsLinks {
  int nHeads = 0, headRank = -1, treeUp = -1;
  std::array<int, 3> treeDown = {-1, -1, -1};
};

/// Per-node inputs: the graphs rank `firstRank` .. of one node computed (ranks are global).
struct NodeGraphs {
  std::array<Graph, kNumGraphs> graphs;
  int ranks = 0;          // local ranks of this node
  int firstRank = 0;      // global rank of its first local rank
  int minCompCap = 0, maxCompCap = 0;
  int p2pnChannelsPerPeer = 0;
  float minNetBw = 0;
  int cpuArch = 0, cpuVendor = 0;
  bool nvlsSupport = false;
  bool collnetSupport = false;
  std::array<bool, kNumGraphs> available = {};  // which graphs were searched
  double searchMs = 0;
};

/// Everything one rank of NCCL computes for its node after the paths (initTransportsRank): the ring, tree,
/// CollNet and NVLS searches in NCCL's order, NVLS and CollNet support, P2P channels per peer and the minimum
/// NIC bandwidth. `sys` is the rank's system after prepareForSearch; `nRanks` the job's size. Graphs of `given`
/// (indexed like NodeGraphs::graphs) that have channels replace the searches, as NCCL_GRAPH_FILE does; `traces`
/// receives what each search tried.
NodeGraphs searchNode(topology::System& sys, const Config& cfg, int nRanks,
                      const std::array<Graph, kNumGraphs>* given = nullptr,
                      std::array<SearchTrace, kNumGraphs>* traces = nullptr);

struct Connect {
  int nNodes = 0, localRanks = 0, nRanks = 0;
  int nChannelsSearchedRing = 0, nChannelsSearchedTree = 0, nChannelsPreset = 0;
  int nChannels = 0, collChannels = 0;
  int nvlsSupport = 0, nvlsChannels = 0;
  int p2pnChannels = 0, p2pnChannelsPerPeer = 0;
  int maxTreePattern = 0, minCompCap = 0, maxCompCap = 0, cpuArch = 0, cpuVendor = 0;
  int collnetEnable = 0;
  std::array<Graph, kNumGraphs> aligned;   // graphs after the min/max combination (no channel lists)
  std::vector<std::vector<int>> rings;     // [channel] ranks from rank 0
  std::vector<std::vector<TreeLinks>> trees;  // [rank][channel]
  std::vector<std::vector<NvlsLinks>> nvls;   // [rank][channel] (first two channels)
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

/// ncclTopoPreset for `rank`, a rank of `node`.
RankTopo presetRank(int rank, const NodeGraphs& node);

/// Alignment and postset from every rank's record (index = rank). Nodes are found as NCCL finds them (ranks sharing
/// their ring's first rank). Throws Error(kInternal) if a ring does not close.
Connect connectRanks(const std::vector<RankTopo>& all, const Config& cfg);

/// Everything after the per-node searches, for all ranks at once. `nodes[n]` holds node n's graphs with global
/// ranks.
Connect connectJob(const std::vector<NodeGraphs>& nodes, const Config& cfg);

}  // namespace topocoll::search
