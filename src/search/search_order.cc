// The orders NCCL tries a channel's next GPU and the NETs in (search_order.h).
#include "search_order.h"

#include <algorithm>

#include "topocoll/paths/paths.h"
#include "topocoll/status.h"

namespace topocoll::search::detail {

namespace {
constexpr int kTopoMaxNodes = 640;  // NCCL_TOPO_MAX_NODES (src/include/graph.h)
}  // namespace

void failNoNet(int64_t id) { fail(StatusCode::kInternal, "could not find net id {:x}", id); }

void CandidateOrder::nextGpus(const Graph& g, int gpu, NextList& next, int sortNet) {
  if (sys_.count(NodeType::NVS)) return nextGpusNvSwitch(g, gpu, next);
  const int netIdx = sortNet ? netIndex(sys_, g.inter[g.nChannels * 2]) : -1;
  if (netIdx < 0) return nextGpusStatic(g, gpu, next, sortNet);
  nextGpusByNet(g, gpu, netIdx, next, sortNet);
}

// NVSwitches prefer a limited set of peers: NCCL sorts every candidate, then keeps only the neighbours it moved to
// the front. The result is those neighbours, so compute them directly.
void CandidateOrder::nextGpusNvSwitch(const Graph& g, int gpu, NextList& next) const {
  const uint64_t flag = 1ULL << g.nChannels;
  const int n = sys_.count(NodeType::GPU);
  const auto& paths = sys_.of(NodeType::GPU)[gpu].paths[T(NodeType::GPU)];
  auto candidate = [&](int p) { return p != gpu && paths[p].count() != 0 && !(sys_.of(NodeType::GPU)[p].used & flag); };
  int prevGpu = (gpu - 1 + n) % n, nextGpu = (gpu + 1) % n;
  int first[2];
  int firstCount;
  if (g.pattern == kPatternRing) {
    first[0] = nextGpu;
    first[1] = prevGpu;
    firstCount = 2;
  } else if (g.pattern == kPatternSplitTree || g.pattern == kPatternBalancedTree) {
    first[0] = prevGpu;
    first[1] = nextGpu;
    firstCount = 2;
  } else {
    first[0] = nextGpu;
    firstCount = 1;
  }
  if (nextGpu == prevGpu && firstCount == 2) firstCount = 1;
  next.resize(0);
  for (int f = firstCount - 1; f >= 0; --f)
    if (candidate(first[f])) next.push_back(first[f]);
}

// Without a NET to sort by, the scores are static (paths do not change during a search), so each candidate order
// is sorted once and filtered by the `used` flags afterwards: filtering a sorted list gives the sorted filtered
// list. Two passes over the cached list, nothing copied.
void CandidateOrder::nextGpusStatic(const Graph& g, int gpu, NextList& next, int sortNet) {
  const uint64_t flag = 1ULL << g.nChannels;
  const std::vector<Score>& sorted = sortedCandidates(gpu);
  const auto& gpus = sys_.of(NodeType::GPU);
  int count = 0;
  const Score* first = nullptr;
  bool sameIntra = true;
  for (const Score& sc : sorted) {
    if (gpus[sc.g].used & flag) continue;
    if (!first)
      first = &sc;
    else if (sc.intraBw != first->intraBw || sc.intraNhops != first->intraNhops)
      sameIntra = false;
    ++count;
  }
  next.resize(count);
  const bool reverse = sortNet == -1 && sameIntra;
  int i = 0;
  for (const Score& sc : sorted) {
    if (gpus[sc.g].used & flag) continue;
    next[reverse ? count - 1 - i : i] = sc.g;
    ++i;
  }
}

// Sorting by NET: only the GPUs' PCI bandwidth changes, which the search changes. The static order (by interBw,
// then the static fields) is computed once; each sort orders packed keys (interBw's rank, PCI bandwidth, static
// position).
void CandidateOrder::nextGpusByNet(const Graph& g, int gpu, int netIdx, NextList& next, int sortNet) {
  const uint64_t flag = 1ULL << g.nChannels;
  const StaticOrder& so = staticOrder(gpu, netIdx);
  const auto& gpus = sys_.of(NodeType::GPU);
  SmallVec<uint64_t, 32> keys;
  const Score* first = nullptr;
  bool sameIntra = true;
  for (int pos = 0; pos < static_cast<int>(so.scores.size()); ++pos) {
    const Score& sc = so.scores[pos];
    if (gpus[sc.g].used & flag) continue;
    if (!first)
      first = &sc;
    else if (sc.intraBw != first->intraBw || sc.intraNhops != first->intraNhops)
      sameIntra = false;
    const uint32_t pci = static_cast<uint32_t>(0x7fffffff - static_cast<int64_t>(std::max(gpuPciBw(sc.g), -1)));
    keys.push_back(static_cast<uint64_t>(so.group[pos]) << 48 | static_cast<uint64_t>(pci) << 16 |
                   static_cast<uint64_t>(pos));
  }
  const int count = static_cast<int>(keys.size());
  for (int i = 1; i < count; ++i)  // insertion sort: a handful of keys
    for (int j = i; j > 0 && keys[j] < keys[j - 1]; --j) std::swap(keys[j], keys[j - 1]);
  next.resize(count);
  const bool reverse = sortNet == -1 && sameIntra;
  for (int i = 0; i < count; ++i) next[reverse ? count - 1 - i : i] = so.scores[keys[i] & 0xffff].g;
}

void CandidateOrder::sortCandidates(int gpu) {
  if (sortCache_.empty()) {
    sortCache_.resize(sys_.count(NodeType::GPU));
    sortCached_.assign(sortCache_.size(), 0);
  }
  SmallVec<Score, 32> tmp;
  scoreCandidates(gpu, -1, tmp);
  sortCache_[gpu].assign(tmp.begin(), tmp.end());
  sortCached_[gpu] = 1;
}

const CandidateOrder::StaticOrder& CandidateOrder::orderStatically(int gpu, int netIdx) {
  const int nets = sys_.count(NodeType::NET);
  if (staticOrders_.empty()) staticOrders_.resize(static_cast<size_t>(sys_.count(NodeType::GPU)) * nets);
  StaticOrder& so = staticOrders_[static_cast<size_t>(gpu) * nets + netIdx];
  so.done = true;
  SmallVec<Score, 32> tmp;
  scoreCandidates(gpu, netIdx, tmp, 0, false);
  so.scores.assign(tmp.begin(), tmp.end());
  for (size_t i = 0; i < so.scores.size(); ++i)
    so.group.push_back(static_cast<uint16_t>(
        i == 0 ? 0 : so.group[i - 1] + (so.scores[i].interBw != so.scores[i - 1].interBw ? 1 : 0)));
  return so;
}

// The candidates not used by the channel (`flag`), in NCCL's order (all PCI bandwidths 0 without `pci`).
void CandidateOrder::scoreCandidates(int gpu, int netIdx, SmallVec<Score, 32>& scores, uint64_t flag, bool pci) {
  int n = sys_.count(NodeType::GPU);
  const auto& gpus = sys_.of(NodeType::GPU);
  const auto& paths = sys_.of(NodeType::GPU)[gpu].paths[T(NodeType::GPU)];
  const std::vector<Path>* netPaths = netIdx >= 0 ? &sys_.of(NodeType::NET)[netIdx].paths[T(NodeType::GPU)] : nullptr;
  for (int i = 1; i < n; ++i) {
    int p = (gpu + i) % n;
    if (paths[p].count() == 0) continue;
    if (gpus[p].used & flag) continue;
    Score sc{p, i, paths[p].count(), static_cast<int>(paths[p].bw), 0, 0, 0};
    if (netPaths) {
      sc.interNhops = (*netPaths)[p].count();
      if (pci) sc.interPciBw = gpuPciBw(p);
      sc.interBw = static_cast<int>((*netPaths)[p].bw);
    }
    scores.push_back(sc);
  }
  std::sort(scores.begin(), scores.end(), [](const Score& a, const Score& b) {
    if (a.interBw != b.interBw) return a.interBw > b.interBw;
    if (a.interPciBw != b.interPciBw) return a.interPciBw > b.interPciBw;
    if (a.interNhops != b.interNhops) return a.interNhops < b.interNhops;
    if (a.intraBw != b.intraBw) return a.intraBw > b.intraBw;
    if (a.intraNhops != b.intraNhops) return a.intraNhops < b.intraNhops;
    return a.startIndex < b.startIndex;
  });
}

// The GPU's PCI uplink in both directions, for every GPU: the search consumes their bandwidth.
void CandidateOrder::findPciLinks() {
  pciLinks_.assign(sys_.count(NodeType::GPU), {nullptr, nullptr});
  for (int g = 0; g < sys_.count(NodeType::GPU); ++g) {
    int dev = sys_.of(NodeType::GPU)[g].parent;
    NodeRef devRef{NodeType::DEV, dev};
    for (auto& gl : sys_.at(devRef).links) {
      if (gl.type != LinkType::PCI) continue;
      const Link* back = nullptr;
      for (auto& pl : sys_.at(gl.rem).links) {
        if (!(pl.rem == devRef)) continue;
        back = &pl;
        break;
      }
      if (back) {
        pciLinks_[g] = {&gl, back};
        break;
      }
    }
  }
}

const CandidateOrder::LocalGpus& CandidateOrder::netLocalGpus(int net) {
  if (netLocals_.empty()) {
    netLocals_.resize(sys_.count(NodeType::NET));
    for (int i = 0; i < sys_.count(NodeType::NET); ++i)
      netLocals_[i].gpus = paths::getLocal(sys_, NodeType::NET, i, NodeType::GPU, &netLocals_[i].type);
  }
  return netLocals_[net];
}

std::vector<int> CandidateOrder::prefNetsChannelFirst(int gpu) const {
  std::vector<int> nets;
  for (int gi = 0; gi < sys_.count(NodeType::GPU); ++gi) {
    if (gpu != -1 && gpu != gi) continue;
    std::vector<int> local;
    int rank = sys_.of(NodeType::GPU)[gi].rank;
    for (int c = 0; c < kMaxChannels; ++c) {
      int n = netIndex(sys_, paths::localNet(sys_, cfg_, rank, c));
      if (!local.empty() && n == local[0]) break;
      local.push_back(n);
    }
    for (int n : local)
      if (std::find(nets.begin(), nets.end(), n) == nets.end()) nets.push_back(n);
  }
  return nets;
}

std::vector<int> CandidateOrder::prefNetsGpuFirst(int gpu) const {
  int nG = gpu == -1 ? sys_.count(NodeType::GPU) : 1;
  std::vector<int> ids(nG), firstNets(nG, -1);
  for (int i = 0; i < nG; ++i) ids[i] = gpu == -1 ? i : gpu;
  int remaining = nG;
  std::vector<int> nets;
  for (int c = 0; c < kMaxChannels && remaining > 0; ++c) {
    for (int i = 0; i < nG; ++i) {
      if (ids[i] == -1) continue;
      int n = netIndex(sys_, paths::localNet(sys_, cfg_, sys_.of(NodeType::GPU)[ids[i]].rank, c));
      if (c == 0) firstNets[i] = n;
      if (c > 0 && firstNets[i] == n) {
        ids[i] = -1;
        --remaining;
        continue;
      }
      if (std::find(nets.begin(), nets.end(), n) == nets.end()) nets.push_back(n);
    }
  }
  return nets;
}

// The preferred NETs of a GPU (or all, -1) do not depend on the path type: computed once per GPU.
const std::vector<int>& CandidateOrder::prefNets(int gpu) {
  auto it = prefCache_.find(gpu);
  if (it != prefCache_.end()) return it->second;
  return prefCache_.emplace(gpu, sys_.hostHashes.size() > 1 ? prefNetsGpuFirst(gpu) : prefNetsChannelFirst(gpu))
      .first->second;
}

std::vector<int> CandidateOrder::selectNetsUncached(int typeInter, int gpu) {
  const int ngpus = sys_.count(NodeType::GPU);
  std::vector<int> nets = prefNets(gpu);
  int maxDevCount = kTopoMaxNodes;  // NETDEVS_POLICY other than MAX: no limit
  if (cfg_.netDevsPolicy == 2) {
    maxDevCount = cfg_.netDevsPolicyMax * (gpu == -1 ? ngpus : 1);
    if (static_cast<int>(nets.size()) >= maxDevCount) return nets;
  }
  for (int t = 0; t <= typeInter; ++t) {
    for (int gi = 0; gi < ngpus; ++gi) {
      if (gpu != -1 && gpu != gi) continue;
      const auto& paths = sys_.of(NodeType::GPU)[gi].paths[T(NodeType::NET)];
      for (int n = 0; n < sys_.count(NodeType::NET) && n < kMaxChannels; ++n) {
        if (P(paths[n].type) != t) continue;
        if (std::find(nets.begin(), nets.end(), n) == nets.end()) nets.push_back(n);
        if (static_cast<int>(nets.size()) >= maxDevCount) return nets;
      }
    }
  }
  return nets;
}

}  // namespace topocoll::search::detail
