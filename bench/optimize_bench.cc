// `plan --optimize` over every reference topology (examples/topologies/public and generated, the #439 fixture and
// the test builders' machines) on 1 to 16 nodes: NCCL's total bandwidth (nChannels x speed) per graph, the
// optimised one (any speed, and NCCL's speed array only), the upper bound, whether the search proved it, and the
// search time against its budget. Prints a Markdown table and a summary (docs/optimize.md).
//
//   ./build/bench/optimize_bench [--budget S] [--nodes 1,2,4,8,16] [--filter substring]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "topo_builders.h"
#include "topocoll/plan.h"
#include "topocoll/search/optimize.h"
#include "topocoll/topology/node_xml.h"

using namespace topocoll;

namespace {

struct Machine {
  std::string name;
  topology::XmlDoc doc;
  bool hasNet;
};

std::vector<Machine> machines(const std::string& filter) {
  std::vector<Machine> out;
  auto add = [&](std::string name, topology::XmlDoc doc) {
    if (!filter.empty() && name.find(filter) == std::string::npos) return;
    if (topology::gpuDevs(doc).empty()) return;
    bool net = doc.root->find("net") != nullptr;
    out.push_back({std::move(name), std::move(doc), net});
  };
  std::vector<std::string> files;
  for (const char* dir : {"/topologies/public", "/topologies/generated"})
    for (const auto& e : std::filesystem::directory_iterator(std::string(EXAMPLES_DIR) + dir))
      if (e.path().extension() == ".xml" && e.path().string().find(".GRAPH.") == std::string::npos)
        files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) add(std::filesystem::path(f).stem().string(), topology::loadXmlFile(f));
  add("fixture-nccl-439-2nic-one-switch", topology::loadXmlFile(std::string(FIXTURE_DIR) + "/nccl-439-2nic-one-switch.xml"));
  add("builder-dgx1-v100-mesh", topology::parseXml(testing::dgx1MeshXml(), "dgx1.xml"));
  add("builder-nvswitch-16-h100", topology::parseXml(testing::nvswitchDomainXml(16), "nvs16.xml"));
  return out;
}

std::string cell(double nccl, double opt) {
  if (opt > nccl * 1.001) return fmt::format("{:.4g} → **{:.4g}**", nccl, opt);
  return fmt::format("{:.4g} = {:.4g}", nccl, opt);
}

}  // namespace

int main(int argc, char** argv) {
  double budget = 1.0;
  std::vector<int> nodeCounts = {1, 2, 4, 8, 16};
  std::string filter;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--budget")) budget = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--filter")) filter = argv[i + 1];
    else if (!std::strcmp(argv[i], "--nodes")) {
      nodeCounts.clear();
      for (char* t = std::strtok(argv[i + 1], ","); t; t = std::strtok(nullptr, ",")) nodeCounts.push_back(std::atoi(t));
    }
  }
  std::printf("| machine | nodes | ring: NCCL → optimised | ring, NCCL's speeds | ring bound | tree: NCCL → optimised "
              "| NVLS: NCCL → optimised | proven | search ms |\n|---|---|---|---|---|---|---|---|---|\n");
  int runs = 0, atLeast = 0, more = 0, moreLadder = 0, inBudget = 0, proven = 0;
  double worstMs = 0, maxNodesPerMs = 0, minNodesPerMs = 1e30;
  for (auto& mc : machines(filter)) {
    for (int nodes : nodeCounts) {
      if (nodes > 1 && !mc.hasNet) continue;
      Config cfg;
      Plan p = makePlan(mc.doc, JobSpec{nodes, 0, {}}, cfg);
      search::OptimizeOptions opts;
      opts.timeBudgetS = budget;
      auto t0 = std::chrono::steady_clock::now();
      auto r = search::optimize(p.system, cfg, p.graphs, p.graphAvailable, opts);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      opts.ladderSpeeds = true;
      auto rl = search::optimize(p.system, cfg, p.graphs, p.graphAvailable, opts);
      const auto& ring = r.graphs[search::kGraphRing];
      const auto& tree = r.graphs[search::kGraphTree];
      const auto& nvls = r.graphs[search::kGraphNvls];
      bool ok = true, better = false, betterLadder = false, allProven = true;
      for (int gi : {search::kGraphRing, search::kGraphTree, search::kGraphNvls}) {
        const auto& o = r.graphs[gi];
        if (!o.available || p.graphs[gi].nChannels == 0) continue;
        ok &= o.total >= o.ncclTotal * (1 - 1e-6);
        better |= o.total > o.ncclTotal * 1.001;
        betterLadder |= rl.graphs[gi].total > rl.graphs[gi].ncclTotal * 1.001;
        allProven &= o.proven;
      }
      int64_t nodesUsed = 0;
      for (const auto& o : r.graphs) nodesUsed += o.nodes;
      if (ms > 5) {
        maxNodesPerMs = std::max(maxNodesPerMs, nodesUsed / ms);
        minNodesPerMs = std::min(minNodesPerMs, nodesUsed / ms);
      }
      ++runs;
      atLeast += ok;
      more += better;
      moreLadder += betterLadder;
      inBudget += ms <= budget * 1000;
      proven += allProven;
      worstMs = std::max(worstMs, ms);
      std::printf("| %s | %d | %s | %.4g | %.4g | %s | %s | %s | %.0f |\n", mc.name.c_str(), nodes,
                  cell(ring.ncclTotal, ring.total).c_str(), rl.graphs[search::kGraphRing].total, ring.bound,
                  tree.available ? cell(tree.ncclTotal, tree.total).c_str() : "-",
                  nvls.available && p.graphs[search::kGraphNvls].nChannels ? cell(nvls.ncclTotal, nvls.total).c_str() : "-",
                  allProven ? "yes" : "no", ms);
      std::fflush(stdout);
    }
  }
  std::printf("\nSummary (budget %.1f s): %d runs; optimised >= NCCL on %d (%.0f%%); strictly more (>0.1%%) on %d (%.0f%%), "
              "%d (%.0f%%) with NCCL's speeds only; all graphs proven optimal on %d; within budget %d; worst %.0f ms; "
              "search nodes per ms %.0f..%.0f\n",
              budget, runs, atLeast, 100.0 * atLeast / std::max(runs, 1), more, 100.0 * more / std::max(runs, 1),
              moreLadder, 100.0 * moreLadder / std::max(runs, 1), proven, inBudget, worstMs, minNodesPerMs, maxNodesPerMs);
  return 0;
}
