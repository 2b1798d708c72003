// The search's memo of failed sub-searches and its links left out because no check can refuse them (both
// TOPOCOLL_SEARCH_MEMO) change how much work the search does, never its result: every graph, and the number of
// steps NCCL's budgets count, is the same with and without them.
#include <dirent.h>
#include <fmt/format.h>
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

// The channels a graph holds (entries past nChannels are the search's scratch: NCCL leaves them too).
std::vector<int> usedIntra(const Graph& g) {
  const size_t n = g.intra.size() / kMaxChannels;
  return std::vector<int>(g.intra.begin(), g.intra.begin() + static_cast<long>(g.nChannels * n));
}
std::vector<int64_t> usedInter(const Graph& g) {
  return std::vector<int64_t>(g.inter.begin(), g.inter.begin() + g.nChannels * 2);
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
    EXPECT_EQ(usedIntra(x), usedIntra(y));
    EXPECT_EQ(usedInter(x), usedInter(y));
  }
}

// The same, inside a property (RapidCheck shrinks a failing machine).
void requireSameSearch(const NodeGraphs& a, const NodeGraphs& b) {
  for (int gi = 0; gi < kNumGraphs; ++gi) {
    RC_ASSERT(a.available[gi] == b.available[gi]);
    RC_ASSERT(a.graphs[gi].searchSteps == b.graphs[gi].searchSteps);
    RC_ASSERT(usedIntra(a.graphs[gi]) == usedIntra(b.graphs[gi]));
    RC_ASSERT(usedInter(a.graphs[gi]) == usedInter(b.graphs[gi]));
    RC_ASSERT(a.graphs[gi].nChannels == b.graphs[gi].nChannels);
    RC_ASSERT(a.graphs[gi].bwIntra == b.graphs[gi].bwIntra);
    RC_ASSERT(a.graphs[gi].bwInter == b.graphs[gi].bwInter);
    RC_ASSERT(a.graphs[gi].nHops == b.graphs[gi].nHops);
  }
}

TEST(SearchMemo, SameGraphsAndStepsOnEveryExampleTopology) {
  std::vector<std::string> files = xmlsIn(TOPO_DIR);
  for (auto& f : xmlsIn(GENERATED_TOPO_DIR)) files.push_back(f);
  ASSERT_GE(files.size(), 35u);
  for (const std::string& f : files) {
    const topology::XmlDoc doc = topology::loadXmlFile(f);
    if (doc.root->name != "system" || topology::gpuDevs(doc).empty()) continue;  // a graph file; partial topologies
    if (doc.root->findWith("system", "version", "2")) continue;                  // RCCL's rules search without the memo
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
    requireSameSearch(searchAll(doc, cfg, nRanks, true), searchAll(doc, cfg, nRanks, false));
  });
  EXPECT_TRUE(ok);
}

// Machines where the order of a channel changes the links' state: Intel or AMD sockets, PCIe links of mixed
// generations and widths per device, NVLinks between random GPU pairs, NICs of mixed speeds.
std::string unevenMachine() {
  static const char* speeds[] = {"8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe"};
  const int sockets = *rc::gen::inRange(1, 3), switches = *rc::gen::inRange(1, 3), gpusPer = *rc::gen::inRange(1, 4);
  const bool intel = *rc::gen::arbitrary<bool>();
  const int sm = *rc::gen::element(70, 80, 90);
  auto pciAttrs = [&] {
    return fmt::format("link_speed=\"{}\" link_width=\"{}\"", speeds[*rc::gen::inRange(0, 3)],
                       *rc::gen::element(8, 16));
  };
  const int nGpus = sockets * switches * gpusPer;
  auto gpuBus = [](int g) { return fmt::format("0000:{:02x}:00.0", 0x40 + g); };
  std::vector<std::vector<int>> nvl(nGpus, std::vector<int>(nGpus, 0));
  for (int a = 0; a < nGpus; ++a)
    for (int b = a + 1; b < nGpus; ++b)
      if (*rc::gen::inRange(0, 4) == 0) nvl[a][b] = nvl[b][a] = *rc::gen::inRange(1, 4);
  std::string x = "<system version=\"1\">\n";
  int gpu = 0, net = 0, bus = 0x10;
  for (int s = 0; s < sockets; ++s) {
    x += intel
             ? fmt::format(
                   "<cpu host_hash=\"0x5\" numaid=\"{}\" affinity=\"f\" arch=\"x86_64\" vendor=\"GenuineIntel\" "
                   "familyid=\"6\" modelid=\"{}\">\n",
                   s, *rc::gen::element(85, 143))
             : fmt::format(
                   "<cpu host_hash=\"0x5\" numaid=\"{}\" affinity=\"f\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n", s);
    for (int w = 0; w < switches; ++w) {
      x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x060400\" {}>\n", bus++, pciAttrs());
      for (int g = 0; g < gpusPer; ++g, ++gpu) {
        x += fmt::format("<pci busid=\"{}\" class=\"0x030200\" {}>\n", gpuBus(gpu), pciAttrs());
        x += fmt::format("<gpu dev=\"{}\" sm=\"{}\" rank=\"{}\" gdr=\"1\">", gpu, sm, gpu);
        for (int p = 0; p < nGpus; ++p)
          if (nvl[gpu][p])
            x += fmt::format("<nvlink target=\"{}\" count=\"{}\" tclass=\"0x030200\"/>", gpuBus(p), nvl[gpu][p]);
        x += "</gpu></pci>\n";
      }
      if (*rc::gen::arbitrary<bool>()) {
        x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x020000\" {}><nic>", bus++, pciAttrs());
        x += fmt::format(
            "<net name=\"mlx5_{}\" dev=\"{}\" speed=\"{}\" port=\"1\" guid=\"0x{:x}\" gdr=\"1\"/></nic></pci>\n", net,
            net, *rc::gen::element(50000, 100000, 200000, 400000), 0x100 + net);
        ++net;
      }
      x += "</pci>\n";
    }
    x += "</cpu>\n";
  }
  return x + "</system>\n";
}

// Uneven machines make most sub-searches differ in links that only the channel's inner GPUs use: the memo leaves
// those links out of a failed sub-search's state, and must put them back where the next channel starts.
TEST(SearchMemo, SameGraphsAndStepsOnUnevenMachines) {
  for (int round = 0; round < 3; ++round) {  // 300 machines: a memo that forgets a link fails within ~150
    auto ok = rc::check("memo on and off agree", [] {
      const std::string xml = unevenMachine();
      const auto doc = topology::parseXml(xml, "u.xml");
      Config cfg;
      cfg.crossNic = *rc::gen::inRange(0, 3);
      if (*rc::gen::inRange(0, 4) == 0) cfg.p2pLevel = 0;
      const int nRanks = *rc::gen::element(-1, 1 << 10);
      requireSameSearch(searchAll(doc, cfg, nRanks, true), searchAll(doc, cfg, nRanks, false));
    });
    ASSERT_TRUE(ok);
  }
}

// Single-node passes charged from a pass walked at another speed or cross-NIC setting (when every link check and
// channel completion provably comes out the same), and tries skipped because the GPU's shared first hops lack the
// speed: both are off with TOPOCOLL_SEARCH_MEMO=0, which walks every pass and tries every next GPU.
TEST(SearchPassSharing, SameGraphsAndStepsOnSingleNodeMachines) {
  static int shared = 0, searches = 0;
  shared = searches = 0;
  auto ok = rc::check("shared passes agree with walked ones", [] {
    const auto doc = topology::parseXml(unevenMachine(), "u.xml");
    Config cfg;
    cfg.crossNic = *rc::gen::inRange(0, 3);
    if (*rc::gen::inRange(0, 3) == 0) cfg.p2pLevel = 0;
    const NodeGraphs on = searchAll(doc, cfg, -1, true);
    requireSameSearch(on, searchAll(doc, cfg, -1, false));
    for (const Graph& g : on.graphs) shared += g.searchPassesShared;
    ++searches;
  });
  ASSERT_TRUE(ok);
  EXPECT_GT(shared, searches / 10) << "the rule should apply on a fair part of the generated machines";
}

TEST(SearchPassSharing, AppliesOnThePcieReferenceMachines) {
  const auto emr = topology::loadXmlFile(GENERATED_TOPO_DIR "/nc-emr-2s-4l40s-2x400g.xml");
  const NodeGraphs a = searchAll(emr, {}, -1, true);
  expectSameSearch(a, searchAll(emr, {}, -1, false), "EMR, 4 L40S");
  EXPECT_GT(a.graphs[kGraphIdRing].searchPassesShared, 0);
  EXPECT_LT(a.graphs[kGraphIdRing].searchWalked, a.graphs[kGraphIdRing].searchSteps);
  const auto ws = topology::loadXmlFile(testing::topoPath("ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml"));
  Config p2pOff;
  p2pOff.p2pLevel = 0;
  const NodeGraphs b = searchAll(ws, p2pOff, -1, true);
  expectSameSearch(b, searchAll(ws, p2pOff, -1, false), "RTX 3090, P2P off");
  EXPECT_GT(b.graphs[kGraphIdRing].searchPassesShared, 0);
  EXPECT_GT(b.graphs[kGraphIdTree].searchPassesShared, 0);  // passes the ring walked without reaching a last GPU
  // Multi-node searches read the speed in more places (NIC bandwidth, PCI-sorted candidates): never shared.
  const NodeGraphs c = searchAll(ws, p2pOff, 1 << 10, true);
  for (const Graph& g : c.graphs) EXPECT_EQ(g.searchPassesShared, 0);
}

}  // namespace
}  // namespace topocoll::search
