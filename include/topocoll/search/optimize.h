// Beyond NCCL's greedy search: the channel sets with the most bandwidth a node allows under NCCL's own rules
// (each GPU once per channel, NCCL's routes and their link charges shared by all channels, NIC ports, rail /
// cross-NIC rules), found by an exact branch and bound instead of NCCL's speed ladder and step budgets. The
// result is a graph NCCL itself can load (NCCL_GRAPH_FILE); docs/optimize.md explains the method.
//
//   topocoll::Plan plan = topocoll::makePlan(topo, job, cfg);
//   auto opt = topocoll::search::optimize(plan.system, cfg, plan.graphs, plan.graphAvailable, {.timeBudgetS = 1});
//   topocoll::Plan better = topocoll::makePlan(topo, job, cfg, &opt.graphsToUse());
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/search/capacity.h"
#include "topocoll/search/connect.h"
#include "topocoll/search/graph.h"
#include "topocoll/topology/system.h"

namespace topocoll::search {

struct OptimizeOptions {
  double timeBudgetS = 1.0;  // for all graphs together
  /// Speeds from NCCL's speed array only; by default any speed in steps of 0.01 GB/s, up to the array's top.
  bool ladderSpeeds = false;
  /// Search nodes for all graphs together; 0: derived from the time budget (so that the same input gives the same
  /// graphs on any machine; the wall clock only stops a search that runs past the budget on a slow machine). When
  /// set, the wall clock is not watched at all.
  int64_t maxNodes = 0;
};

/// One graph before and after.
struct OptimizedGraph {
  bool available = false;
  Graph graph;                  // what to use: NCCL's own graph when nothing better was found
  double ncclTotal = 0;         // nChannels x speed of NCCL's graph (graphTotal)
  double total = 0;             // the same for `graph`
  double bound = 0;             // upper bound on nChannels x speed from the topology's cuts
  std::string boundCut;         // the tightest cut: "GPU0 out: DEV0 -> NVS0 (NVL) 164.8 GB/s"
  bool improved = false;        // more bandwidth, or the same with fewer channels
  bool proven = false;          // the search completed: nothing better exists under these rules
  double ms = 0;
  int64_t nodes = 0;
  std::string how;              // what differs from NCCL's graph, in words
};

struct OptimizeResult {
  std::array<OptimizedGraph, kNumGraphs> graphs;
  double ms = 0;
  bool stoppedByClock = false;  // the wall clock, not the node budget, ended a search (results may vary by machine)
  /// The graphs to plan with (NCCL's where a graph was not optimised).
  std::array<Graph, kNumGraphs> graphsToUse() const;
};

/// Optimises the ring, tree and NVLS graphs of one node. `sys` is the node's system after paths
/// (Plan::system); `nccl` and `available` are NCCL's graphs for it (Plan::graphs / graphAvailable).
OptimizeResult optimize(const topology::System& sys, const Config& cfg, const std::array<Graph, kNumGraphs>& nccl,
                        const std::array<bool, kNumGraphs>& available, const OptimizeOptions& opts = {});

/// The best channel set with exactly `nChannels` channels of one chain pattern (ring or a tree pattern), without
/// channel duplication: what the optimiser runs for each channel count. Exposed for exhaustive tests. Returns a
/// graph with nChannels == 0 when none fits. `pattern` and `crossNic` (0 rail-aligned, 1 any NICs, 2 pairs
/// A->B, B->A) set the rules.
Graph bestChannels(const LoadModel& m, int pattern, int nChannels, int crossNic, bool ladderSpeeds,
                   int64_t maxNodes, bool* complete = nullptr);

}  // namespace topocoll::search
