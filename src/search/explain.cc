// `topocoll plan --explain`: the links a graph fills and the cuts that stop faster speeds.
#include "topocoll/search/explain.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace topocoll::search {

using topology::PathType;

GraphWhy explainGraph(const LoadModel& m, const Graph& g, const std::vector<float>& ladder, double bound,
                      const std::string& boundText) {
  GraphWhy why;
  if (g.nChannels == 0) return why;
  GraphLoad load = graphLoad(m, g);
  Graph unit = g;
  unit.bwIntra = unit.bwInter = 1.0f;
  GraphLoad perSpeed = graphLoad(m, unit);
  for (int r = 0; r < m.resources(); ++r) {
    double used = load.used(r);
    if (used <= 0) continue;
    LinkUse u{m.label(r), used, m.capacity(r), static_cast<int>(std::lround(perSpeed.used(r)))};
    if (used >= m.capacity(r) * 0.99) why.full.push_back(u);
    if (r == load.worst) why.mostLoaded = u;
  }
  std::stable_sort(why.full.begin(), why.full.end(),
                   [](const LinkUse& a, const LinkUse& b) { return a.used / a.capacity > b.used / b.capacity; });
  std::vector<Cut> cuts;
  upperBound(m, g.pattern, &cuts);
  const float speed = std::min(g.bwIntra, g.bwInter);
  std::vector<float> speeds{speed};
  for (auto it = ladder.rbegin(); it != ladder.rend(); ++it)
    if (*it > speed * 1.0001f) speeds.push_back(*it);
  for (float s : speeds) {
    SpeedLimit lim{s, 1 << 20, ""};
    for (const Cut& c : cuts) {
      int n = static_cast<int>(std::floor(c.capacity * kLoadUnit / (s * c.minUnits) + 1e-6));
      if (n < lim.maxChannels) {
        lim.maxChannels = n;
        lim.cut = fmt::format("{} ({:g} GB/s)", c.what, c.capacity);
        int shown = 0;
        for (int r : c.res) {
          if (shown++ == 3) {
            lim.cut += fmt::format(" +{} more", c.res.size() - 3);
            break;
          }
          lim.cut += fmt::format("{} {} {:g}", shown == 1 ? ":" : ",", m.label(r), m.capacity(r));
        }
      }
    }
    if (bound > 0) {
      int n = static_cast<int>(std::floor(bound / s + 1e-6));
      if (n < lim.maxChannels) lim = SpeedLimit{s, n, boundText};
    }
    why.limits.push_back(lim);
  }
  return why;
}

const char* pathTypeMeaning(int type, bool nicHop) {
  switch (static_cast<PathType>(type)) {
    case PathType::NVL: return "NVLink";
    case PathType::NVB: return "NVLink through a peer GPU";
    case PathType::C2C: return "chip-to-chip link to the CPU";
    case PathType::PIX: return "one PCIe switch";
    case PathType::PXB: return "several PCIe switches";
    case PathType::P2C: return "C2C to the CPU, then PCIe to the NIC";
    case PathType::PXN: return "PXN: the NIC of an NVLink peer GPU (NCCL_PXN_DISABLE)";
    case PathType::PHB:
      return nicHop ? "through the CPU: a NIC under another host bridge, or no GPUDirect RDMA (NCCL_NET_GDR_LEVEL)"
                    : "through the CPU's host bridge";
    case PathType::SYS: return "across CPU sockets";
    default: return "";
  }
}

}  // namespace topocoll::search
