// One rank's searches for its node. Follows the graph part of NCCL 2.30.7 src/init.cc initTransportsRank (the
// order of the searches, NVLS/CollNet support, ncclTopoComputeP2pChannelsPerPeer, ncclTopoGetMinNetBw) (Apache-2.0).
#include <chrono>

#include "topocoll/paths/paths.h"
#include "topocoll/search/node_search.h"

namespace topocoll::search {

using topology::NodeType;

namespace {
Graph makeGraph(int id, int pattern, int minCh, int maxCh, int collNet = 0) {
  Graph g;
  g.id = id;
  g.pattern = pattern;
  g.minChannels = minCh;
  g.maxChannels = maxCh;
  g.collNet = collNet;
  return g;
}
}  // namespace

NodeGraphs searchNode(topology::System& sys, const Config& cfg, int nRanks, const std::array<Graph, kNumGraphs>* given,
                      std::array<SearchTrace, kNumGraphs>* traces) {
  NodeGraphs out;
  auto t0 = std::chrono::steady_clock::now();
  auto& G = out.graphs;
  Searches searches(sys, cfg);
  // A given graph with channels is used as NCCL uses one from NCCL_GRAPH_FILE: instead of the search.
  auto compute = [&](Graph& g) {
    const auto gi = &g - G.data();
    if (given && (*given)[gi].nChannels > 0) g = (*given)[gi];
    else searches.compute(g, traces ? &(*traces)[gi] : nullptr);
  };
  G[kGraphRing] = makeGraph(kGraphIdRing, kPatternRing, 1, kMaxChannels / 2);
  compute(G[kGraphRing]);
  int ringCh = G[kGraphRing].nChannels;
  G[kGraphTree] = makeGraph(kGraphIdTree, kPatternBalancedTree, ringCh, ringCh);
  compute(G[kGraphTree]);
  out.available[kGraphRing] = out.available[kGraphTree] = true;
  bool anyColl = false;
  for (auto& n : sys.of(NodeType::NET)) anyColl |= n.collSupport != 0;
  out.collnetSupport = cfg.collnetEnable == 1 && anyColl && sys.inter;
  G[kGraphCollnetChain] = makeGraph(kGraphIdCollnetChain, kPatternTree, ringCh, ringCh, 1);
  G[kGraphCollnetDirect] = makeGraph(kGraphIdCollnetDirect, kPatternCollnetDirect, 1, kMaxChannels, 1);
  if (out.collnetSupport) {
    compute(G[kGraphCollnetChain]);
    compute(G[kGraphCollnetDirect]);
    out.available[kGraphCollnetChain] = out.available[kGraphCollnetDirect] = true;
  }
  int ccMin = 1 << 30, ccMax = 0;
  for (auto& d : sys.of(NodeType::DEV)) {
    ccMin = std::min(ccMin, d.cudaCompCap);
    ccMax = std::max(ccMax, d.cudaCompCap);
  }
  // NVLS: multicast is taken as available on sm90+ GPUs behind an NVSwitch (NCCL asks the driver).
  if (cfg.nvlsEnable != 0 && sys.count(NodeType::GPU) >= 2)
    out.nvlsSupport = cfg.nvlsEnable == 1 || (ccMin >= 90 && sys.count(NodeType::NVS) > 0);
  G[kGraphNvls] = makeGraph(kGraphIdNvls, kPatternNvls, 1, kMaxChannels);
  if (out.nvlsSupport) {
    compute(G[kGraphNvls]);
    out.available[kGraphNvls] = true;
  }
  out.searchMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  // Values NCCL computes per rank and then takes the minimum of across ranks: the minimum over this node's GPUs.
  int perPeer = kMaxChannels;
  int firstRank = 1 << 30;
  for (auto& g : sys.of(NodeType::GPU)) firstRank = std::min(firstRank, g.rank);
  for (int g = 0; g < sys.count(NodeType::GPU); ++g) {
    bool remoteDone = false;
    for (int r = 0; r < nRanks; ++r) {
      bool local = sys.gpuIndexOfRank(r) >= 0;
      if (!local && remoteDone) continue;  // every remote peer gets the same count
      remoteDone |= !local;
      int n = paths::p2pChannelsToPeer(sys, cfg, g, r);
      if (n >= 0) perPeer = std::min(perPeer, n);
    }
  }
  float minNetBw = 0;
  if (sys.count(NodeType::NET) > 0) {
    minNetBw = 1e30f;
    for (int g = 0; g < sys.count(NodeType::GPU); ++g) {
      int rank = sys.of(NodeType::GPU)[g].rank;
      int64_t first = 0;
      for (int c = 0; c < kMaxChannels; ++c) {
        int64_t id = paths::localNet(sys, cfg, rank, c);
        if (c == 0) first = id;
        else if (id == first) break;
        minNetBw = std::min(
            minNetBw, sys.of(NodeType::GPU)[g].paths[static_cast<int>(NodeType::NET)][sys.indexOf(NodeType::NET, id)].bw);
      }
    }
  }
  out.ranks = sys.count(NodeType::GPU);
  out.firstRank = firstRank;
  out.minCompCap = ccMin;
  out.maxCompCap = ccMax;
  out.p2pnChannelsPerPeer = perPeer;
  out.minNetBw = minNetBw;
  out.cpuArch = sys.of(NodeType::CPU)[0].arch;
  out.cpuVendor = sys.of(NodeType::CPU)[0].vendor;
  return out;
}

}  // namespace topocoll::search
