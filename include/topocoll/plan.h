// The library's front door: one call that turns a topology, a job shape and the environment into the whole plan
// NCCL 2.30.7 would compute (system, paths, graphs, rings, trees, tuning tables) plus a selection function.
//
//   topocoll::Config cfg = topocoll::Config::fromEnv(topocoll::Env::fromProcess());
//   auto topo = topocoll::topology::loadXmlFile("dgx.xml");
//   topocoll::Plan plan = topocoll::makePlan(topo, {.nNodes = 2}, cfg);
//   auto choice = plan.select(topocoll::tuning::kAllReduce, 1 << 20);
//
// A Plan is an immutable value: a communicator can hold one and call select() on its hot path.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/search/connect.h"
#include "topocoll/search/graph.h"
#include "topocoll/topology/system.h"
#include "topocoll/topology/xml.h"
#include "topocoll/tuning/tuning.h"

namespace topocoll {

/// The job: `nNodes` hosts, each described by the same topology; ranks numbered node by node.
struct JobSpec {
  int nNodes = 1;
  int gpusPerNode = 0;             // 0: every GPU of the topology; else the first G GPUs by `dev`
  std::vector<int> ranksOnGpus;    // explicit `dev` of each local rank (overrides gpusPerNode)
};

struct Plan {
  JobSpec job;
  Config cfg;
  int nRanks = 0, localRanks = 0;
  std::vector<int> localDevs;                 // GPU dev of local rank i
  topology::XmlDoc nodeXml;                   // the fused per-host XML the system was built from
  topology::System system;                    // rank 0's system after paths, trim and paths again
  std::array<search::Graph, search::kNumGraphs> graphs;  // node 0's graphs, as searched
  std::array<bool, search::kNumGraphs> graphAvailable = {};
  search::Connect connect;
  tuning::Model model;
  double searchMs = 0, wallMs = 0;

  /// Cost-based choice for one operation (nBytes as the tuner sees it).
  tuning::Selection select(int coll, uint64_t nBytes) const {
    return tuning::select(model, coll, nBytes, !cfg.algo.empty() || !cfg.proto.empty());
  }
};

/// Builds the plan. Throws Error with a message naming the input at fault. `graphs` (node 0's, indexed like
/// Plan::graphs), when given, replace the searches of the graphs that have channels, as NCCL_GRAPH_FILE does: the
/// rest (connect, tuning, selection) is what NCCL then computes.
Plan makePlan(const topology::XmlDoc& topo, const JobSpec& job, const Config& cfg,
              const std::array<search::Graph, search::kNumGraphs>* graphs = nullptr);

/// The plan as one JSON document, with the field names of shared/conformance/SCHEMA.md (`system`, `graphs`,
/// `graph_dump_xml`, `connect`, `tuning`, `selection`) plus topocoll's own (documented in docs/plan-json.md).
std::string planToJson(const Plan& plan, const std::string& topoName, int typeSize = 4, bool pretty = false);

/// Selection table for sizes 8 B .. 8 GiB (powers of two; sizes below one element per rank left out).
std::vector<tuning::Selection> selectionTable(const Plan& plan, int typeSize, int onlyColl = -1);

}  // namespace topocoll
