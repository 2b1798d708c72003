// Property tests over generated topologies: path bandwidths, path types, rings and trees.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <rapidcheck.h>

#include <map>

#include "search/graph_check.h"
#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/plan.h"
#include "topocoll/search/optimize.h"

namespace topocoll {
namespace {

using topology::NodeType;
using topology::PathType;

TEST(Property, PathsRingsAndTreesOnRandomMachines) {
  auto ok = rc::check("generated machines", [] {
    int sockets = *rc::gen::inRange(1, 3);
    int switches = *rc::gen::inRange(1, 4);
    int gpusPer = *rc::gen::inRange(1, 5);
    bool nics = *rc::gen::arbitrary<bool>();
    bool nvs = *rc::gen::arbitrary<bool>();
    int sm = *rc::gen::element(70, 80, 90, 100);
    int gen = *rc::gen::inRange(0, 3);
    int nodes = *rc::gen::element(1, 2, 3, 4, 8);
    if (nodes > 1) nics = true;
    auto doc = topology::parseXml(testing::randomPcieMachine(sockets, switches, gpusPer, nics, nvs, sm, gen), "random.xml");
    Plan p = makePlan(doc, JobSpec{nodes, 0, {}}, Config{});
    const auto& s = p.system;
    // Every path's bandwidth is the minimum of its links, and symmetric GPU-GPU paths agree in type and bw.
    for (int g = 0; g < s.count(NodeType::GPU); ++g) {
      for (int t : {0, 5}) {
        const auto& ps = s.of(NodeType::GPU)[g].paths[t];
        for (size_t i = 0; i < ps.size(); ++i) {
          if (ps[i].list.empty()) continue;
          float mn = testing::minLinkBw(s, ps[i]);
          RC_ASSERT(std::abs(ps[i].bw - mn) <= 1e-4f * mn);  // the search leaves links rounded to 1e-3
        }
      }
      for (int q = 0; q < s.count(NodeType::GPU); ++q) {
        const auto& a = s.of(NodeType::GPU)[g].paths[0][q];
        const auto& b = s.of(NodeType::GPU)[q].paths[0][g];
        RC_ASSERT(a.type == b.type);
        RC_ASSERT(a.bw == b.bw);
        // Type agrees with the hop list: NVL-only paths are NVL/NVB, a path through a CPU is PHB or worse.
        bool viaCpu = false, allNvl = !a.list.empty();
        for (auto& hop : a.list) {
          viaCpu |= s.link(hop).rem.type == NodeType::CPU;
          auto lt = s.link(hop).type;
          allNvl &= lt == topology::LinkType::NVL || lt == topology::LinkType::LOC;
        }
        if (viaCpu) RC_ASSERT(static_cast<int>(a.type) >= static_cast<int>(PathType::PHB));
        if (allNvl && g != q) RC_ASSERT(a.type == PathType::NVL || a.type == PathType::NVB);
      }
    }
    // Each ring visits every rank once; each tree channel is a tree with at most 3 children per rank.
    for (auto& ring : p.connect.rings) {
      std::vector<int> seen(p.nRanks, 0);
      for (int r : ring) seen[r]++;
      for (int v : seen) RC_ASSERT(v == 1);
    }
    for (int c = 0; c < p.connect.nChannels; ++c) {
      int roots = 0;
      for (int r = 0; r < p.nRanks; ++r) {
        const auto& t = p.connect.trees[r][c];
        if (t.up < 0) ++roots;
        else {
          const auto& d = p.connect.trees[t.up][c].down;
          RC_ASSERT(std::find(d.begin(), d.end(), r) != d.end());
        }
      }
      RC_ASSERT(roots == 1);
    }
    // No channel asks more of a GPU-GPU hop than the bandwidth of the links it uses, shared by the channels.
    const auto& ring = p.graphs[search::kGraphRing];
    if (ring.nChannels > 0 && ring.bwIntra >= 0.1f && s.count(NodeType::GPU) > 1) {
      int n = s.count(NodeType::GPU);
      std::map<std::pair<int, int>, float> used;
      for (int c = 0; c < ring.nChannels; ++c) {
        for (int i = 0; i + 1 < n; ++i) {
          int a = s.gpuIndexOfRank(ring.intra[c * n + i]), b = s.gpuIndexOfRank(ring.intra[c * n + i + 1]);
          for (auto& hop : s.of(NodeType::GPU)[a].paths[0][b].list)
            used[{static_cast<int>(hop.node.type) * 10000 + hop.node.index, hop.link}] += ring.bwIntra;
        }
      }
      for (auto& [k, bw] : used) {
        topology::LinkRef ref{{static_cast<NodeType>(k.first / 10000), k.first % 10000}, k.second};
        RC_ASSERT(bw <= s.link(ref).bw * 1.2f + 0.01f);  // 1.2: Intel PCI P2P overhead accounting
      }
    }
  });
  EXPECT_TRUE(ok);
}

TEST(Property, OptimisedGraphsAreValidAndNeverWorseThanNccls) {
  auto ok = rc::check("optimised graphs on generated machines", [] {
    int sockets = *rc::gen::inRange(1, 3);
    int switches = *rc::gen::inRange(1, 3);
    int gpusPer = *rc::gen::inRange(1, 4);
    bool nvs = *rc::gen::arbitrary<bool>();
    int sm = *rc::gen::element(70, 80, 90, 100);
    int gen = *rc::gen::inRange(0, 3);
    int nodes = *rc::gen::element(1, 2, 4);
    int crossNic = *rc::gen::element(0, 1, 2);
    auto doc = topology::parseXml(testing::randomPcieMachine(sockets, switches, gpusPer, true, nvs, sm, gen), "random.xml");
    Config cfg;
    cfg.crossNic = crossNic;
    Plan p = makePlan(doc, JobSpec{nodes, 0, {}}, cfg);
    search::OptimizeOptions opts;
    opts.maxNodes = 10000;
    auto r = search::optimize(p.system, cfg, p.graphs, p.graphAvailable, opts);
    search::LoadModel m(p.system);
    for (int gi : {search::kGraphRing, search::kGraphTree, search::kGraphNvls}) {
      const auto& o = r.graphs[gi];
      if (!o.available || p.graphs[gi].nChannels == 0) continue;
      RC_ASSERT(o.total >= o.ncclTotal * (1 - 1e-6));
      RC_ASSERT(o.total <= o.bound * (1 + 1e-4) + 1e-4);
      if (o.improved) RC_ASSERT(testing::graphViolation(m, o.graph) == std::string());
      if (o.improved && cfg.crossNic == 0) RC_ASSERT(o.graph.crossNic == 0);
    }
  });
  EXPECT_TRUE(ok);
}

// Exhaustive check of the BFS on PCIe-only machines: no simple path beats the computed one, in NCCL's order
// (better type first, then larger bottleneck). GPUs (DEV nodes) are never transit hops.
struct Best {
  int type = 99;
  float bw = 0;
};
void enumerate(const topology::System& s, topology::NodeRef node, topology::NodeRef target, int type, float bw,
               std::vector<topology::NodeRef>& stack, Best& best) {
  using topology::LinkType;
  for (auto& l : s.at(node).links) {
    if (l.type == LinkType::NET) continue;
    if (std::find(stack.begin(), stack.end(), l.rem) != stack.end()) continue;
    if (node.type == NodeType::DEV && stack.size() > 2 && l.rem.type != NodeType::GPU) continue;  // no DEV transit
    int hop = l.type == LinkType::LOC ? 0 : static_cast<int>(l.type);
    if (node.type == NodeType::PCI && l.rem.type == NodeType::PCI) hop = static_cast<int>(PathType::PXB);
    if (l.type == LinkType::PCI && (node.type == NodeType::CPU || l.rem.type == NodeType::CPU))
      hop = static_cast<int>(PathType::PHB);
    int t = std::max(type, hop);
    float b = std::min(bw, l.bw);
    if (l.rem == target) {
      if (t < best.type || (t == best.type && b > best.bw)) best = {t, b};
      continue;
    }
    if (l.rem.type == NodeType::GPU) continue;
    stack.push_back(l.rem);
    enumerate(s, l.rem, target, t, b, stack, best);
    stack.pop_back();
  }
}

TEST(Property, NoSimplePathBeatsTheComputedOneOnPcieMachines) {
  auto ok = rc::check("PCIe-only machines", [] {
    int sockets = *rc::gen::inRange(1, 3);
    int switches = *rc::gen::inRange(1, 3);
    int gpusPer = *rc::gen::inRange(1, 4);
    int gen = *rc::gen::inRange(0, 3);
    auto doc = topology::parseXml(testing::randomPcieMachine(sockets, switches, gpusPer, false, false, 80, gen), "pcie.xml");
    Config cfg = Config::fromEnv(Env(std::map<std::string, std::string>{{"NCCL_P2P_LEVEL", "SYS"}}));
    auto s = paths::hostSystem(doc, cfg);
    for (int g = 0; g < s.count(NodeType::GPU); ++g) {
      for (int q = 0; q < s.count(NodeType::GPU); ++q) {
        if (g == q) continue;
        Best best;
        std::vector<topology::NodeRef> stack = {{NodeType::GPU, g}};
        enumerate(s, {NodeType::GPU, g}, {NodeType::GPU, q}, 0, 1e30f, stack, best);
        const auto& p = s.of(NodeType::GPU)[g].paths[0][q];
        RC_ASSERT(static_cast<int>(p.type) == best.type);
        RC_ASSERT(p.bw == best.bw);
      }
    }
  });
  EXPECT_TRUE(ok);
}

}  // namespace
}  // namespace topocoll
