#include <gtest/gtest.h>

#include <fstream>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/plan.h"
#include "topocoll/search/graph.h"
#include "topocoll/status.h"

namespace topocoll::search {
namespace {

using topology::NodeType;

Plan planFor(const char* file, int nodes, Config cfg = {}) {
  return makePlan(topology::loadXmlFile(testing::topoPath(file)), JobSpec{nodes, 0, {}}, cfg);
}

void expectValidRings(const Plan& p) {
  ASSERT_FALSE(p.connect.rings.empty());
  for (auto& ring : p.connect.rings) {
    std::vector<int> seen(p.nRanks, 0);
    for (int r : ring) seen[r]++;
    for (int r = 0; r < p.nRanks; ++r) EXPECT_EQ(seen[r], 1);
  }
}

void expectValidTrees(const Plan& p) {
  int nch = p.connect.nChannels;
  for (int c = 0; c < nch; ++c) {
    int roots = 0;
    for (int r = 0; r < p.nRanks; ++r) {
      const auto& t = p.connect.trees[r][c];
      if (t.up < 0) ++roots;
      else {
        const auto& parent = p.connect.trees[t.up][c];
        EXPECT_NE(std::find(parent.down.begin(), parent.down.end(), r), parent.down.end())
            << "channel " << c << " rank " << r << " not a child of its parent " << t.up;
      }
    }
    EXPECT_EQ(roots, 1) << "channel " << c;
  }
}

TEST(Search, SeedH100TwoNodes) {
  Plan p = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 2);
  const Graph& ring = p.graphs[kGraphRing];
  EXPECT_EQ(ring.nChannels, 8);
  EXPECT_FLOAT_EQ(ring.bwIntra, 22.0f);
  EXPECT_EQ(ring.typeIntra, static_cast<int>(topology::PathType::NVL));
  EXPECT_EQ(ring.typeInter, static_cast<int>(topology::PathType::PIX));
  EXPECT_EQ(p.connect.nChannels, 16);
  expectValidRings(p);
  expectValidTrees(p);
}

TEST(Search, RingsAndTreesAreValidForManyShapes) {
  for (const char* f : {"seed-h100-8gpu-8nic-nvswitch.xml", "ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml",
                        "azure-ncv4-a100-pcie-4gpu-4numa.xml", "modal-b200-vm-8gpu-8x400g-2numa.xml"}) {
    for (int nodes : {1, 2, 3, 5, 16}) {
      SCOPED_TRACE(std::string(f) + " x" + std::to_string(nodes));
      Plan p = planFor(f, nodes);
      expectValidRings(p);
      expectValidTrees(p);
    }
  }
}

TEST(Search, OneGpuPerNode) {
  Plan p = makePlan(topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml")), JobSpec{4, 1, {}}, {});
  EXPECT_EQ(p.nRanks, 4);
  expectValidRings(p);
  expectValidTrees(p);
}

TEST(GraphXml, DumpThenLoadGivesTheSameChannels) {
  Plan p = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 2);
  std::vector<const Graph*> gs = {&p.graphs[kGraphRing], &p.graphs[kGraphTree]};
  std::string xml = graphsToXml(p.system, gs);
  auto doc = topology::parseXml(xml, "graphs.xml");
  Graph g;
  g.id = 0;
  g.intra.assign(kMaxChannels * 8, 0);
  g.inter.assign(kMaxChannels * 2, 0);
  int n = graphFromXml(doc, p.system, Config{}, g);
  EXPECT_EQ(n, p.graphs[kGraphRing].nChannels);
  for (int i = 0; i < n * 8; ++i) EXPECT_EQ(g.intra[i], p.graphs[kGraphRing].intra[i]);
  for (int i = 0; i < n * 2; ++i) EXPECT_EQ(g.inter[i], p.graphs[kGraphRing].inter[i]);
  EXPECT_EQ(graphsToXml(p.system, {&g}), graphsToXml(p.system, {&p.graphs[kGraphRing]}));
}

TEST(GraphXml, GraphFileReplacesTheSearch) {
  Plan p = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 1);
  std::string path = ::testing::TempDir() + "/ring.xml";
  {
    std::ofstream out(path);
    out << "<graphs version=\"1\">\n  <graph id=\"0\" pattern=\"4\" crossnic=\"0\" nchannels=\"1\" speedintra=\"10\" "
           "speedinter=\"10\" latencyinter=\"0\" typeintra=\"NVL\" typeinter=\"PIX\" samechannels=\"1\">\n"
           "    <channel>\n";
    for (int g : {7, 6, 5, 4, 3, 2, 1, 0}) out << "      <gpu dev=\"" << g << "\" rank=\"" << g << "\"/>\n";
    out << "    </channel>\n  </graph>\n</graphs>\n";
  }
  Config cfg;
  cfg.graphFile = path;
  Plan q = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 1, cfg);
  EXPECT_TRUE(q.graphs[kGraphRing].fromFile);
  EXPECT_EQ(q.graphs[kGraphRing].nChannels, 1);
  EXPECT_EQ(q.graphs[kGraphRing].intra[0], 7);
  EXPECT_EQ(q.connect.rings[0], (std::vector<int>{0, 7, 6, 5, 4, 3, 2, 1}));
}

TEST(GraphXml, InvalidGraphFilesAreRejected) {
  Plan p = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 1);
  auto load = [&](const std::string& channel) {
    std::string x = "<graphs version=\"1\"><graph id=\"0\" pattern=\"4\" crossnic=\"0\" nchannels=\"1\" speedintra=\"10\" "
                    "speedinter=\"10\" typeintra=\"NVL\" typeinter=\"PIX\" samechannels=\"1\"><channel>" +
                    channel + "</channel></graph></graphs>";
    Graph g;
    g.id = 0;
    g.intra.assign(kMaxChannels * 8, 0);
    g.inter.assign(kMaxChannels * 2, 0);
    graphFromXml(topology::parseXml(x, "g.xml"), p.system, Config{}, g);
  };
  std::string all;
  for (int r = 0; r < 8; ++r) all += "<gpu dev=\"" + std::to_string(r) + "\" rank=\"" + std::to_string(r) + "\"/>";
  EXPECT_NO_THROW(load(all));
  EXPECT_THROW(load("<gpu dev=\"0\" rank=\"0\"/><gpu dev=\"0\" rank=\"0\"/>"), Error);  // not a permutation
  EXPECT_THROW(load(all + "<gpu dev=\"9\" rank=\"9\"/>"), Error);                       // GPU the system lacks
  EXPECT_THROW(load("<net dev=\"0x42\"/>" + all), Error);                               // NET the system lacks
}

TEST(Search, DupChannelsFollowsNcclsRule) {
  Graph g;
  g.pattern = kPatternRing;
  g.nChannels = 2;
  g.maxChannels = 32;
  g.bwIntra = g.bwInter = 40;
  g.intra = std::vector<int>(kMaxChannels * 2, 0);
  g.inter = std::vector<int64_t>(kMaxChannels * 2, 0);
  g.intra[0] = 0, g.intra[1] = 1, g.intra[2] = 1, g.intra[3] = 0;
  dupChannels(g, 80, 2);
  EXPECT_EQ(g.nChannels, 4);
  EXPECT_FLOAT_EQ(g.bwIntra, 20.0f);
  EXPECT_EQ(g.intra[4], 0);
  EXPECT_EQ(g.intra[6], 1);
  Graph slow = g;
  slow.bwIntra = 10;
  dupChannels(slow, 80, 2);
  EXPECT_EQ(slow.nChannels, 4);  // below 25 GB/s: unchanged
}

TEST(Search, KnobsOutOfRangeOrShapesThatDoNotFit) {
  auto topo = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  EXPECT_THROW(makePlan(topo, JobSpec{0, 0, {}}, {}), Error);
  EXPECT_THROW(makePlan(topo, JobSpec{1, 9, {}}, {}), Error);
  EXPECT_THROW(makePlan(topo, JobSpec{1, 0, {0, 0}}, {}), Error);   // duplicate GPU
  EXPECT_THROW(makePlan(topo, JobSpec{1, 0, {12}}, {}), Error);     // GPU the topology lacks
  auto noGpu = topology::parseXml("<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\"/></system>");
  EXPECT_THROW(makePlan(noGpu, JobSpec{}, {}), Error);
}

TEST(Search, SyntheticNvswitchDomainOf72Gpus) {
  auto doc = topology::parseXml(testing::nvswitchDomainXml(72), "nvl72.xml");
  Plan p = makePlan(doc, JobSpec{2, 0, {}}, {});
  EXPECT_EQ(p.localRanks, 72);
  EXPECT_GT(p.graphs[kGraphRing].nChannels, 0);
  expectValidRings(p);
  expectValidTrees(p);
}

}  // namespace
}  // namespace topocoll::search
