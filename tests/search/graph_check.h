// What every graph handed to NCCL must satisfy, as a test helper: each GPU once per channel, NICs that exist, the
// rail rules of its crossNic, and every link and NIC port within capacity under NCCL's charges.
#pragma once

#include <set>
#include <string>

#include <fmt/format.h>

#include "topocoll/search/capacity.h"
#include "topocoll/search/graph.h"

namespace topocoll::testing {

/// "" when the graph is valid, else what is wrong.
inline std::string graphViolation(const search::LoadModel& m, const search::Graph& g) {
  using topology::NodeType;
  const auto& sys = m.system();
  const int n = sys.count(NodeType::GPU);
  if (g.nChannels <= 0 || g.nChannels > search::kMaxChannels) return fmt::format("{} channels", g.nChannels);
  for (int c = 0; c < g.nChannels; ++c) {
    std::set<int> ranks;
    int per = g.pattern == search::kPatternNvls ? 1 : n;
    for (int i = 0; i < per; ++i) {
      if (sys.gpuIndexOfRank(g.intra[c * n + i]) < 0) return fmt::format("channel {}: rank {} is not here", c, g.intra[c * n + i]);
      if (!ranks.insert(g.intra[c * n + i]).second) return fmt::format("channel {} visits rank {} twice", c, g.intra[c * n + i]);
    }
    if (!sys.inter) continue;
    int in = sys.indexOf(NodeType::NET, g.inter[2 * c]), out = sys.indexOf(NodeType::NET, g.inter[2 * c + 1]);
    if (in < 0 || out < 0) return fmt::format("channel {}: unknown NET", c);
    const auto& a = sys.of(NodeType::NET)[in];
    const auto& b = sys.of(NodeType::NET)[out];
    bool rail = a.railId != topology::kUndef ? a.railId == b.railId : (a.asic == b.asic && a.port == b.port);
    if (g.crossNic == 0 && g.pattern != search::kPatternNvls && !rail)
      return fmt::format("channel {} leaves on another rail with crossNic 0", c);
    if (g.crossNic == 2 && g.pattern == search::kPatternRing && c % 2 == 1 &&
        (g.inter[2 * c] != g.inter[2 * c - 1] || g.inter[2 * c + 1] != g.inter[2 * c - 2]))
      return fmt::format("channels {} and {} are not a pair A->B, B->A", c - 1, c);
  }
  search::GraphLoad load = search::graphLoad(m, g);
  for (int r = 0; r < m.resources(); ++r)
    if (load.used(r) > m.capacity(r) * (1 + 1e-4) + 1e-4)
      return fmt::format("{}: {:g} GB/s on {:g}", m.label(r), load.used(r), m.capacity(r));
  return "";
}

}  // namespace topocoll::testing
