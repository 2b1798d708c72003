// `topocoll plan --explain`: which link limits a graph.
#include <map>

#include "topocoll/search/graph.h"

namespace topocoll::search {

using topology::NodeType;

Bottleneck findBottleneck(const topology::System& sys, const Graph& g) {
  Bottleneck b;
  if (g.nChannels == 0) return b;
  const int n = sys.count(NodeType::GPU);
  std::map<std::tuple<int, int, int>, std::pair<float, int>> load;
  auto charge = [&](NodeType t1, int i1, NodeType t2, int i2, float bw) {
    if (i1 < 0 || i2 < 0) return;
    const auto& paths = sys.at({t1, i1}).paths[static_cast<int>(t2)];
    if (i2 >= static_cast<int>(paths.size())) return;
    for (auto& hop : paths[i2].list) {
      auto& e = load[{static_cast<int>(hop.node.type), hop.node.index, hop.link}];
      e.first += bw;
      e.second += 1;
    }
  };
  for (int c = 0; c < g.nChannels; ++c) {
    auto gpu = [&](int i) { return sys.gpuIndexOfRank(g.intra[c * n + i]); };
    if (g.pattern == kPatternNvls) {
      int head = gpu(0);
      for (int i = 0; i < n; ++i) {
        charge(NodeType::NVS, 0, NodeType::GPU, i, i == head ? 2 * g.bwIntra : g.bwIntra);
        charge(NodeType::GPU, i, NodeType::NVS, 0, i == head ? 2 * g.bwIntra : g.bwIntra);
      }
    } else {
      for (int i = 0; i + 1 < n; ++i) charge(NodeType::GPU, gpu(i), NodeType::GPU, gpu(i + 1), g.bwIntra);
      if (g.pattern == kPatternRing && !sys.inter && n > 1) charge(NodeType::GPU, gpu(n - 1), NodeType::GPU, gpu(0), g.bwIntra);
    }
    if (sys.inter) {
      int in = sys.indexOf(NodeType::NET, g.inter[2 * c]), out = sys.indexOf(NodeType::NET, g.inter[2 * c + 1]);
      charge(NodeType::NET, in, NodeType::GPU, gpu(0), g.bwInter);
      int last = g.pattern == kPatternRing ? gpu(n - 1) : g.pattern == kPatternSplitTree && n > 1 ? gpu(1) : gpu(0);
      charge(NodeType::GPU, last, NodeType::NET, out, g.bwInter);
    }
  }
  float worst = -1;
  for (auto& [k, v] : load) {
    topology::LinkRef ref{{static_cast<NodeType>(std::get<0>(k)), std::get<1>(k)}, std::get<2>(k)};
    float cap = sys.link(ref).bw;
    float ratio = cap > 0 ? v.first / cap : 1e30f;
    if (ratio > worst) {
      worst = ratio;
      b.link = ref;
      b.capacity = cap;
      b.used = v.first;
      b.channels = v.second;
    }
  }
  return b;
}

}  // namespace topocoll::search
