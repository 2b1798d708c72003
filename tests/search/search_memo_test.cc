// The search's memo of failed sub-searches (TOPOCOLL_SEARCH_MEMO) changes how much work the search does, never
// its result: every graph, and the number of steps NCCL's budgets count, is the same with and without it.
#include <dirent.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/paths/paths.h"
#include "topocoll/search/node_search.h"

namespace topocoll::search {
namespace {

std::vector<std::string> xmlsIn(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 4 && n.substr(n.size() - 4) == ".xml") out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

NodeGraphs searchAll(const topology::XmlDoc& doc, Config cfg, int nRanks, bool memo) {
  cfg.searchMemo = memo ? 1 : 0;
  topology::System sys = paths::hostSystem(doc, cfg, nRanks);
  return searchNode(sys, cfg, nRanks);
}

// Everything a search decides, and how many steps its budgets counted.
void expectSameSearch(const NodeGraphs& a, const NodeGraphs& b, const std::string& what) {
  for (int gi = 0; gi < kNumGraphs; ++gi) {
    SCOPED_TRACE(what + " graph " + graphName(gi));
    const Graph &x = a.graphs[gi], &y = b.graphs[gi];
    ASSERT_EQ(a.available[gi], b.available[gi]);
    EXPECT_EQ(x.searchSteps, y.searchSteps);
    EXPECT_EQ(x.timedOut, y.timedOut);
    EXPECT_EQ(x.nChannels, y.nChannels);
    EXPECT_EQ(x.bwIntra, y.bwIntra);
    EXPECT_EQ(x.bwInter, y.bwInter);
    EXPECT_EQ(x.typeIntra, y.typeIntra);
    EXPECT_EQ(x.typeInter, y.typeInter);
    EXPECT_EQ(x.sameChannels, y.sameChannels);
    EXPECT_EQ(x.crossNic, y.crossNic);
    EXPECT_EQ(x.nHops, y.nHops);
    EXPECT_EQ(x.pattern, y.pattern);
    EXPECT_EQ(x.intra, y.intra);
    EXPECT_EQ(x.inter, y.inter);
  }
}

TEST(SearchMemo, SameGraphsAndStepsOnEveryExampleTopology) {
  std::vector<std::string> files = xmlsIn(TOPO_DIR);
  for (auto& f : xmlsIn(GENERATED_TOPO_DIR)) files.push_back(f);
  ASSERT_GE(files.size(), 35u);
  for (const std::string& f : files) {
    const topology::XmlDoc doc = topology::loadXmlFile(f);
    if (doc.root->name != "system" || topology::gpuDevs(doc).empty()) continue;  // a graph file; partial topologies
    if (doc.root->findWith("system", "version", "2")) continue;  // RCCL's rules search without the memo
    for (int nodes : {1, 2}) {
      const int nRanks = nodes == 1 ? -1 : 1 << 10;
      expectSameSearch(searchAll(doc, {}, nRanks, true), searchAll(doc, {}, nRanks, false),
                       f + " nodes " + std::to_string(nodes));
    }
  }
}

TEST(SearchMemo, SameGraphsAndStepsWithKnobsThatReshapeTheSearch) {
  const auto doc = topology::loadXmlFile(testing::topoPath("ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml"));
  Config p2pOff;
  p2pOff.p2pLevel = 0;
  expectSameSearch(searchAll(doc, p2pOff, -1, true), searchAll(doc, p2pOff, -1, false), "P2P off");
  Config cross;
  cross.crossNic = 1;
  const auto b300 = topology::loadXmlFile(testing::topoPath("oci-b300-hgx-8gpu-8x800g-cx8-2numa.xml"));
  expectSameSearch(searchAll(b300, cross, 16, true), searchAll(b300, cross, 16, false), "cross NIC 1");
  const auto mesh = topology::parseXml(testing::dgx1MeshXml(), "dgx1.xml");
  expectSameSearch(searchAll(mesh, {}, -1, true), searchAll(mesh, {}, -1, false), "DGX-1 mesh, one node");
  expectSameSearch(searchAll(mesh, {}, 16, true), searchAll(mesh, {}, 16, false), "DGX-1 mesh, two nodes");
}

// Random PCIe machines (1-2 sockets, switches, GPUs, NICs, maybe an NVSwitch), one or several nodes.
TEST(SearchMemo, SameGraphsAndStepsOnRandomMachines) {
  auto ok = rc::check("memo on and off agree", [] {
    const int sockets = *rc::gen::inRange(1, 3), switches = *rc::gen::inRange(1, 4), gpus = *rc::gen::inRange(1, 5);
    const bool nvs = *rc::gen::arbitrary<bool>();
    const int sm = *rc::gen::element(70, 80, 90, 100);
    const int nodes = *rc::gen::element(1, 2);
    const auto doc = topology::parseXml(testing::randomPcieMachine(sockets, switches, gpus, true, nvs, sm, 1), "r.xml");
    Config cfg;
    cfg.crossNic = *rc::gen::inRange(0, 3);
    if (*rc::gen::arbitrary<bool>()) cfg.p2pLevel = 0;
    const int nRanks = nodes == 1 ? -1 : 1 << 10;
    const NodeGraphs a = searchAll(doc, cfg, nRanks, true), b = searchAll(doc, cfg, nRanks, false);
    for (int gi = 0; gi < kNumGraphs; ++gi) {
      RC_ASSERT(a.graphs[gi].searchSteps == b.graphs[gi].searchSteps);
      RC_ASSERT(a.graphs[gi].intra == b.graphs[gi].intra);
      RC_ASSERT(a.graphs[gi].inter == b.graphs[gi].inter);
      RC_ASSERT(a.graphs[gi].nChannels == b.graphs[gi].nChannels);
      RC_ASSERT(a.graphs[gi].bwIntra == b.graphs[gi].bwIntra);
      RC_ASSERT(a.graphs[gi].bwInter == b.graphs[gi].bwInter);
    }
  });
  EXPECT_TRUE(ok);
}

}  // namespace
}  // namespace topocoll::search
