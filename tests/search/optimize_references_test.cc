// The capacity model and the optimiser on every reference topology (examples/topologies/public and generated, the
// #439 fixture) on 1 and 2 nodes: NCCL's own graphs fit the model and its bounds; optimised graphs respect NCCL's
// rules and the capacities, are never worse than NCCL's and gain on at least 20% of the machines. Labelled slow
// (the sanitizer run leaves it out; tests/search/optimize_test.cc covers the same code on small cases).
#include <gtest/gtest.h>

#include <filesystem>

#include "search/graph_check.h"
#include "test_util.h"
#include "topocoll/plan.h"
#include "topocoll/search/capacity.h"
#include "topocoll/search/optimize.h"
#include "topocoll/topology/node_xml.h"

namespace topocoll::search {
namespace {

// Every reference topology with GPUs: examples/topologies/public and generated, and the #439 fixture.
std::vector<std::string> referenceTopologies() {
  std::vector<std::string> out;
  for (const char* dir : {"/topologies/public", "/topologies/generated"})
    for (const auto& e : std::filesystem::directory_iterator(std::string(EXAMPLES_DIR) + dir)) {
      std::string p = e.path().string();
      if (e.path().extension() != ".xml" || p.find(".GRAPH.") != std::string::npos) continue;
      if (topology::gpuDevs(topology::loadXmlFile(p)).empty()) continue;
      out.push_back(p);
    }
  out.push_back(std::string(FIXTURE_DIR) + "/nccl-439-2nic-one-switch.xml");
  std::sort(out.begin(), out.end());
  return out;
}

bool hasNet(const std::string& path) { return topology::loadXmlFile(path).root->find("net") != nullptr; }

void expectValid(const LoadModel& m, const Graph& g, const std::string& what) {
  EXPECT_EQ(testing::graphViolation(m, g), "") << what;
}

struct Case {
  std::string path;
  int nodes;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& p : referenceTopologies()) {
    out.push_back({p, 1});
    if (hasNet(p)) out.push_back({p, 2});
  }
  return out;
}

TEST(Capacity, NcclsOwnGraphsFitTheModelAndTheBounds) {
  // The model charges what NCCL's search charges: every graph NCCL's search finds fits, and no bound is below it.
  for (const auto& c : cases()) {
    Plan p = makePlan(topology::loadXmlFile(c.path), JobSpec{c.nodes, 0, {}}, Config{});
    LoadModel m(p.system);
    for (int gi : {kGraphRing, kGraphTree, kGraphNvls}) {
      const Graph& g = p.graphs[gi];
      if (!p.graphAvailable[gi] || g.nChannels == 0) continue;
      std::string what = c.path + " n" + std::to_string(c.nodes) + " " + graphName(gi);
      if (g.bwIntra > 0.1f) expectValid(m, g, what);  // 0.1: NCCL's fallback ring, not searched
      EXPECT_GE(upperBound(m, g.pattern) * (1 + 1e-4), graphTotal(g, p.system.inter != 0)) << what;
    }
  }
}

TEST(Optimize, NeverWorseAlwaysValidOnEveryReferenceTopology) {
  int better = 0, total = 0;
  for (const auto& c : cases()) {
    auto doc = topology::loadXmlFile(c.path);
    Plan p = makePlan(doc, JobSpec{c.nodes, 0, {}}, Config{});
    OptimizeOptions opts;
    opts.maxNodes = 200000;  // deterministic and quick; the benchmark gives the full budget
    auto r = optimize(p.system, Config{}, p.graphs, p.graphAvailable, opts);
    LoadModel m(p.system);
    const bool inter = p.system.inter != 0;
    bool any = false;
    for (int gi : {kGraphRing, kGraphTree, kGraphNvls}) {
      const auto& o = r.graphs[gi];
      if (!o.available || p.graphs[gi].nChannels == 0) continue;
      std::string what = c.path + " n" + std::to_string(c.nodes) + " " + graphName(gi);
      EXPECT_GE(o.total, o.ncclTotal * (1 - 1e-6)) << what;
      EXPECT_LE(o.total, o.bound * (1 + 1e-4) + 1e-4) << what;
      EXPECT_DOUBLE_EQ(o.total, graphTotal(o.graph, inter)) << what;
      if (o.improved) expectValid(m, o.graph, what);
      any |= o.total > o.ncclTotal * 1.001;
    }
    // NCCL aligns the ring and tree channel counts: the optimiser keeps them equal.
    if (r.graphs[kGraphTree].available) {
      EXPECT_EQ(r.graphs[kGraphRing].graph.nChannels, r.graphs[kGraphTree].graph.nChannels) << c.path;
    }
    // The graphs plan as NCCL would run them: rings visit every rank once.
    auto graphs = r.graphsToUse();
    Plan q = makePlan(doc, JobSpec{c.nodes, 0, {}}, Config{}, &graphs);
    for (auto& ring : q.connect.rings) {
      std::vector<int> seen(q.nRanks, 0);
      for (int rank : ring) seen[rank]++;
      for (int v : seen) EXPECT_EQ(v, 1) << c.path;
    }
    better += any;
    ++total;
  }
  EXPECT_GE(better * 5, total) << "the optimiser should gain on at least 20% of the reference machines";
}

}  // namespace
}  // namespace topocoll::search
