// One NCCL node's searches: what every rank of initTransportsRank computes for its node after the paths, in NCCL's
// order (ring, tree, CollNet chain and direct, NVLS), plus the per-node values the graph-info allgather carries.
#pragma once

#include <array>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/search/graph.h"
#include "topocoll/topology/system.h"

namespace topocoll::search {

/// One NCCL node's graphs and facts. The graphs name ranks as the system does.
struct NodeGraphs {
  std::array<Graph, kNumGraphs> graphs;
  int ranks = 0;      // the node's ranks (GPUs of its system)
  int firstRank = 0;  // the lowest of them
  int minCompCap = 0, maxCompCap = 0;
  int p2pnChannelsPerPeer = 0;
  float minNetBw = 0;
  int cpuArch = 0, cpuVendor = 0;
  bool nvlsSupport = false;
  bool collnetSupport = false;
  std::array<bool, kNumGraphs> available = {};  // which graphs were searched
  double searchMs = 0;
};

/// The searches of one node in NCCL's order, NVLS and CollNet support, P2P channels per peer and the minimum NIC
/// bandwidth. `sys` is the node's system after paths::prepareForSearch; `nRanks` the job's size. Graphs of `given`
/// (indexed like NodeGraphs::graphs) that have channels replace the searches, as NCCL_GRAPH_FILE does; `traces`
/// receives what each search tried.
NodeGraphs searchNode(topology::System& sys, const Config& cfg, int nRanks,
                      const std::array<Graph, kNumGraphs>* given = nullptr,
                      std::array<SearchTrace, kNumGraphs>* traces = nullptr);

}  // namespace topocoll::search
