// The capacity model, the cut and LP bounds, and the optimiser on chosen machines: NCCL's charges, the #439 cut,
// determinism, NCCL's fallback and the NVSwitch optimum, NCCL's speed array; on small PCIe machines the branch and
// bound equals an exhaustive enumeration; the graph XML it writes is what NCCL's loader accepts. Every reference
// topology: optimize_references_test.cc.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "search/graph_check.h"
#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/plan.h"
#include "topocoll/search/capacity.h"
#include "topocoll/search/optimize.h"

namespace topocoll::search {
namespace {

using topology::NodeType;
using topology::PathType;

void expectValid(const LoadModel& m, const Graph& g, const std::string& what) {
  EXPECT_EQ(testing::graphViolation(m, g), "") << what;
}

TEST(Capacity, ChargesFollowNcclsSearch) {
  // Intel host bridge: PCI hops of a PHB path cost 6/5; pre-Ampere GPUs get 1/8 back on the reverse link when the
  // sender is not a GPU; the NIC port of the entry NET is charged.
  auto sys = testing::nodeSystem(topology::parseXml(testing::dgx1MeshXml(), "dgx1.xml"), Config{}, 1 << 10);
  LoadModel m(sys);
  const Route& net0ToGpu0 = m.route(NodeType::NET, 0, NodeType::GPU, 0);
  bool sawRev = false, sawPort = false;
  for (const Use& u : net0ToGpu0.uses) {
    sawRev |= u.units == kLoadUnit / 8;
    sawPort |= u.res == m.portResource(0);
  }
  EXPECT_TRUE(sawRev);
  EXPECT_TRUE(sawPort);
  const Route& gpu0ToNet1 = m.route(NodeType::GPU, 0, NodeType::NET, 1);  // through the other socket's host bridge
  ASSERT_LT(gpu0ToNet1.type, static_cast<int>(PathType::DIS));
  for (const Use& u : gpu0ToNet1.uses) EXPECT_NE(u.res, m.portResource(1)) << "exit NICs are not charged at the port";
}

TEST(Capacity, Issue439TheSwitchUplinkIsTheCut) {
  Plan p = makePlan(topology::loadXmlFile(std::string(FIXTURE_DIR) + "/nccl-439-2nic-one-switch.xml"),
                    JobSpec{2, 0, {}}, Config{});
  LoadModel m(p.system);
  std::vector<Cut> cuts;
  EXPECT_FLOAT_EQ(upperBound(m, kPatternRing, &cuts), 24.0f);
  ASSERT_FALSE(cuts.empty());
  ASSERT_EQ(cuts[0].res.size(), 1u);
  EXPECT_NE(m.label(cuts[0].res[0]).find("0000:52:00.0"), std::string::npos) << m.label(cuts[0].res[0]);
}

TEST(Optimize, SameInputSameGraphs) {
  auto doc = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  Plan p = makePlan(doc, JobSpec{2, 0, {}}, Config{});
  OptimizeOptions opts;
  opts.maxNodes = 100000;
  auto a = optimize(p.system, Config{}, p.graphs, p.graphAvailable, opts);
  auto b = optimize(p.system, Config{}, p.graphs, p.graphAvailable, opts);
  for (int gi = 0; gi < kNumGraphs; ++gi) {
    EXPECT_EQ(a.graphs[gi].graph.intra, b.graphs[gi].graph.intra);
    EXPECT_EQ(a.graphs[gi].graph.inter, b.graphs[gi].graph.inter);
    EXPECT_EQ(a.graphs[gi].graph.bwIntra, b.graphs[gi].graph.bwIntra);
  }
}

TEST(Optimize, FindsRingsWhereNcclFallsBackAndTheOptimumOnNvswitch) {
  // sm120 GPUs behind one PCIe Gen3 switch: NCCL's SM100 speed array stops at 18 GB/s, above what the links carry,
  // so its search finds nothing and falls back to 0.1 GB/s. The optimiser finds a real ring.
  Plan p = makePlan(topology::parseXml(testing::randomPcieMachine(1, 1, 4, false, false, 120, 0), "sm120-pcie.xml"),
                    JobSpec{1, 0, {}}, Config{});
  auto r = optimize(p.system, Config{}, p.graphs, p.graphAvailable, {});
  EXPECT_FLOAT_EQ(p.graphs[kGraphRing].bwIntra, 0.1f);
  EXPECT_GE(r.graphs[kGraphRing].total, 6.0);
  EXPECT_TRUE(r.graphs[kGraphRing].proven);
  // H100 NVSwitch, one node: the rings fill each GPU's 164.8 GB/s of NVLink (NCCL: 8 x 20 = 160).
  Plan h = makePlan(topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml")), JobSpec{1, 0, {}}, Config{});
  auto rh = optimize(h.system, Config{}, h.graphs, h.graphAvailable, {});
  EXPECT_NEAR(rh.graphs[kGraphRing].total, 164.8, 0.1);
  EXPECT_TRUE(rh.graphs[kGraphRing].proven);
  // NVLS: 8 heads, each GPU's NVLink carries 8 + 1 channel shares: 164.8 / 9 per channel.
  EXPECT_NEAR(rh.graphs[kGraphNvls].graph.bwIntra, 18.31, 0.005);
}

TEST(Optimize, LadderSpeedsStayOnNcclsArray) {
  Plan p = makePlan(topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml")), JobSpec{2, 0, {}}, Config{});
  OptimizeOptions opts;
  opts.ladderSpeeds = true;
  opts.maxNodes = 200000;
  auto r = optimize(p.system, Config{}, p.graphs, p.graphAvailable, opts);
  auto ladder = speedArray(90, true);
  for (int gi : {kGraphRing, kGraphTree}) {
    const auto& g = r.graphs[gi].graph;
    EXPECT_NE(std::find(ladder.begin(), ladder.end(), g.bwInter), ladder.end()) << g.bwInter;
    EXPECT_GE(r.graphs[gi].total, r.graphs[gi].ncclTotal);
  }
}

// --- Exhaustive check on small PCIe machines ---------------------------------------------------------------

// A PCIe-only machine: `gpus` GPUs under two switches of one or two CPUs, NICs on the switches.
std::string smallPcie(int gpus, int sockets, int nics, int genA, int genB) {
  static const char* speeds[] = {"8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe"};
  std::string x = "<system version=\"1\">\n";
  int g = 0, net = 0, bus = 0x10;
  for (int s = 0; s < sockets; ++s) {
    x += fmt::format("<cpu host_hash=\"0x7\" numaid=\"{}\" affinity=\"f\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n", s);
    for (int w = 0; w < 2; ++w) {
      int per = (gpus + 2 * sockets - 1 - (s * 2 + w)) / (2 * sockets);
      x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x060400\" link_speed=\"{}\" link_width=\"16\">\n", bus++,
                       speeds[w ? genB : genA]);
      for (int k = 0; k < per; ++k, ++g)
        x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x030200\" link_speed=\"{}\" link_width=\"16\">"
                         "<gpu dev=\"{}\" sm=\"80\" rank=\"{}\" gdr=\"1\"/></pci>\n",
                         bus++, speeds[2], g, g);
      if (net < nics) {
        x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x020000\" link_speed=\"{}\" link_width=\"16\"><nic>"
                         "<net name=\"mlx5_{}\" dev=\"{}\" speed=\"100000\" port=\"1\" guid=\"0x{:x}\" gdr=\"1\"/></nic></pci>\n",
                         bus++, speeds[1], net, net, 0x100 + net);
        ++net;
      }
      x += "</pci>\n";
    }
    x += "</cpu>\n";
  }
  return x + "</system>\n";
}

struct Cand {
  int netIn = -1, netOut = -1;
  std::vector<int> gpus;
};

// Every channel the rules allow, then every multiset (or pair sequence) of n of them: the best n x speed.
double exhaustive(const LoadModel& m, int pattern, int n, int crossNic) {
  const auto& sys = m.system();
  const int ng = sys.count(NodeType::GPU), nets = sys.count(NodeType::NET);
  const bool inter = sys.inter != 0;
  std::vector<int> perm(ng);
  for (int i = 0; i < ng; ++i) perm[i] = i;
  std::vector<Cand> cands;
  auto ok = [](const Route& r) { return r.type < static_cast<int>(PathType::DIS); };
  do {
    if (!inter && pattern == kPatternRing && perm[0] != 0) continue;
    bool good = true;
    for (int i = 0; i + 1 < ng; ++i) {
      good &= ok(m.route(NodeType::GPU, perm[i], NodeType::GPU, perm[i + 1]));
      if (pattern != kPatternRing) good &= ok(m.route(NodeType::GPU, perm[i + 1], NodeType::GPU, perm[i]));
    }
    if (!good) continue;
    if (!inter) {
      cands.push_back({-1, -1, perm});
      continue;
    }
    for (int a = 0; a < nets; ++a)
      for (int b = 0; b < nets; ++b) {
        const auto& na = sys.of(NodeType::NET)[a];
        const auto& nb = sys.of(NodeType::NET)[b];
        if (pattern == kPatternTree && a != b) continue;
        if (crossNic == 0 && !(na.asic == nb.asic && na.port == nb.port)) continue;
        cands.push_back({a, b, perm});
      }
  } while (std::next_permutation(perm.begin(), perm.end()));
  auto top = speedArray(80, inter)[0];
  std::vector<int64_t> load(m.resources());
  double best = 0;
  std::vector<int> pick(n, 0);
  auto charge = [&](const Cand& c, int sign) {
    auto add = [&](NodeType t1, int i1, NodeType t2, int i2) {
      for (const Use& u : m.route(t1, i1, t2, i2).uses) load[u.res] += sign * u.units;
    };
    for (int i = 0; i + 1 < ng; ++i) add(NodeType::GPU, c.gpus[i], NodeType::GPU, c.gpus[i + 1]);
    if (!inter && pattern == kPatternRing && ng > 1) add(NodeType::GPU, c.gpus[ng - 1], NodeType::GPU, c.gpus[0]);
    if (inter) {
      add(NodeType::NET, c.netIn, NodeType::GPU, c.gpus[0]);
      add(NodeType::GPU, pattern == kPatternRing ? c.gpus[ng - 1] : c.gpus[0], NodeType::NET, c.netOut);
    }
  };
  std::function<void(int, int)> rec = [&](int k, int from) {
    if (k == n) {
      double s = top;
      for (int r = 0; r < m.resources(); ++r)
        if (load[r] > 0) s = std::min(s, m.capacity(r) * kLoadUnit / load[r]);
      best = std::max(best, n * std::min<double>(top, std::floor(s * 100 + 1e-6) / 100));
      return;
    }
    const bool pairSecond = crossNic == 2 && inter && k % 2 == 1;
    for (int i = pairSecond ? 0 : from; i < static_cast<int>(cands.size()); ++i) {
      const Cand& c = cands[i];
      if (pairSecond && (c.netIn != cands[pick[k - 1]].netOut || c.netOut != cands[pick[k - 1]].netIn)) continue;
      pick[k] = i;
      charge(c, 1);
      rec(k + 1, crossNic == 2 && inter ? 0 : i);
      charge(c, -1);
    }
  };
  rec(0, 0);
  // NCCL_CROSS_NIC=2: rail-aligned channels, or pairs A->B, B->A.
  if (crossNic == 2 && inter) best = std::max(best, exhaustive(m, pattern, n, 0));
  return best;
}

TEST(Optimize, BranchAndBoundEqualsExhaustiveSearchOnSmallPcieMachines) {
  struct Shape {
    int gpus, sockets, nics, genA, genB, nodes;
  };
  const Shape shapes[] = {{3, 1, 0, 1, 0, 1}, {4, 1, 0, 0, 1, 1}, {4, 2, 0, 1, 1, 1}, {4, 2, 0, 2, 0, 1},
                          {3, 1, 2, 1, 1, 2}, {4, 2, 2, 0, 1, 2}, {4, 1, 1, 1, 0, 2}, {3, 2, 2, 2, 1, 2}};
  for (const Shape& sh : shapes) {
    auto doc = topology::parseXml(smallPcie(sh.gpus, sh.sockets, sh.nics, sh.genA, sh.genB), "small.xml");
    Config cfg;
    auto sys = paths::hostSystem(doc, cfg, sh.nodes > 1 ? sh.gpus * sh.nodes : -1);
    LoadModel m(sys);
    for (int pattern : {kPatternRing, kPatternTree}) {
      for (int crossNic : sh.nodes > 1 ? std::vector<int>{0, 1, 2} : std::vector<int>{0}) {
        if (pattern == kPatternTree && crossNic != 0) continue;
        for (int n = 1; n <= 3; ++n) {
          bool complete = false;
          Graph g = bestChannels(m, pattern, n, crossNic, false, 0, &complete);
          double want = exhaustive(m, pattern, n, crossNic);
          std::string what = fmt::format("{} GPUs {} sockets {} NICs gen {}/{} nodes {} pattern {} crossNic {} n {}",
                                         sh.gpus, sh.sockets, sh.nics, sh.genA, sh.genB, sh.nodes, pattern, crossNic, n);
          EXPECT_TRUE(complete) << what;
          EXPECT_NEAR(g.nChannels * static_cast<double>(g.bwIntra), want, 1e-4) << what;
          if (g.nChannels) expectValid(m, g, what);
        }
      }
    }
  }
}

// --- The graph file NCCL loads ----------------------------------------------------------------------------

TEST(Optimize, GraphXmlIsWhatNcclsLoaderAcceptsAndPlansTheSame) {
  auto doc = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  Plan p = makePlan(doc, JobSpec{2, 0, {}}, Config{});
  OptimizeOptions opts;
  opts.maxNodes = 200000;
  auto r = optimize(p.system, Config{}, p.graphs, p.graphAvailable, opts);
  auto graphs = r.graphsToUse();
  Plan q = makePlan(doc, JobSpec{2, 0, {}}, Config{}, &graphs);
  const search::Graph* order[] = {&q.graphs[kGraphRing], &q.graphs[kGraphTree], &q.graphs[kGraphCollnetDirect],
                                  &q.graphs[kGraphCollnetChain], &q.graphs[kGraphNvls]};
  std::string xml = graphsToXml(q.system, std::vector<const Graph*>(std::begin(order), std::end(order)), false);

  // NCCL's ncclTopoGetGraphFromXml: the attributes it reads, its link type names, channels naming existing NICs
  // and GPU devs (no rank attribute: each node maps devs to its own ranks), crossnic 1 only when allowed.
  static const std::set<std::string> kNcclTypes = {"LOC", "NVL", "NVB", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"};
  auto gx = topology::parseXml(xml, "graph.xml");
  auto* root = gx.root->find("graphs");
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(*root->attr("version"), "1");
  for (auto& g : root->subs) {
    for (const char* a : {"id", "pattern", "crossnic", "nchannels", "speedintra", "speedinter", "latencyinter",
                          "typeintra", "typeinter", "samechannels"})
      ASSERT_TRUE(g->has(a)) << a;
    EXPECT_TRUE(kNcclTypes.count(*g->attr("typeintra")));
    EXPECT_TRUE(kNcclTypes.count(*g->attr("typeinter")));
    EXPECT_EQ(std::stoi(*g->attr("nchannels")), static_cast<int>(g->subs.size()));
    for (auto& ch : g->subs)
      for (auto& x : ch->subs) {
        EXPECT_FALSE(x->has("rank"));
        int64_t dev = std::strtoll(x->attr("dev")->c_str(), nullptr, 16);
        if (x->name == "net") {
          EXPECT_GE(q.system.indexOf(NodeType::NET, dev), 0);
        }
      }
  }
  // Loading it as NCCL_GRAPH_FILE reproduces the optimised plan: graphs, connect and tuning.
  std::string path = ::testing::TempDir() + "/topocoll_optimize_graph.xml";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(xml.c_str(), f);
  std::fclose(f);
  Config cfg;
  cfg.graphFile = path;
  Plan fromFile = makePlan(doc, JobSpec{2, 0, {}}, cfg);
  std::remove(path.c_str());
  for (int gi : {kGraphRing, kGraphTree, kGraphNvls}) {
    EXPECT_EQ(fromFile.graphs[gi].nChannels, q.graphs[gi].nChannels);
    EXPECT_EQ(fromFile.graphs[gi].bwIntra, q.graphs[gi].bwIntra);
    EXPECT_EQ(fromFile.graphs[gi].bwInter, q.graphs[gi].bwInter);
    EXPECT_TRUE(std::equal(q.graphs[gi].intra.begin(), q.graphs[gi].intra.begin() + q.graphs[gi].nChannels * 8,
                           fromFile.graphs[gi].intra.begin()));
  }
  EXPECT_EQ(fromFile.connect.rings, q.connect.rings);
  EXPECT_EQ(fromFile.connect.nChannels, q.connect.nChannels);
  for (uint64_t bytes : {uint64_t(1) << 10, uint64_t(1) << 20, uint64_t(1) << 30}) {
    auto a = fromFile.select(tuning::kAllReduce, bytes), b = q.select(tuning::kAllReduce, bytes);
    EXPECT_EQ(a.algo, b.algo);
    EXPECT_EQ(a.proto, b.proto);
    EXPECT_FLOAT_EQ(a.timeUs, b.timeUs);
  }
}

TEST(Optimize, CrossNicZeroNeverExportsCrossNicOne) {
  // NCCL's loader ignores a crossnic="1" graph when NCCL_CROSS_NIC=0: the optimiser keeps every channel on a rail.
  Config cfg;
  cfg.crossNic = 0;
  auto doc = topology::loadXmlFile(testing::topoPath("oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml"));
  Plan p = makePlan(doc, JobSpec{2, 0, {}}, cfg);
  OptimizeOptions opts;
  opts.maxNodes = 100000;
  auto r = optimize(p.system, cfg, p.graphs, p.graphAvailable, opts);
  LoadModel m(p.system);
  for (int gi : {kGraphRing, kGraphTree}) {
    EXPECT_EQ(r.graphs[gi].graph.crossNic, 0);
    expectValid(m, r.graphs[gi].graph, graphName(gi));
  }
}

}  // namespace
}  // namespace topocoll::search
