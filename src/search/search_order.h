// The orders NCCL tries candidates in: a channel's next GPU (ncclTopoSearchNextGpuSort) and the NETs
// (ncclTopoSelectNets, ncclTopoGetLocal). What depends only on the paths, which do not change during a search, is
// computed once per system.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "search_common.h"
#include "topocoll/search/graph.h"

namespace topocoll::search::detail {

[[noreturn]] void failNoNet(int64_t id);
// The index of the NET with this id (fails when there is none).
inline int netIndex(const topology::System& sys, int64_t id) {
  const int n = sys.indexOf(topology::NodeType::NET, id);
  if (n < 0) failNoNet(id);
  return n;
}

class CandidateOrder {
 public:
  using NextList = SmallVec<int, 32>;
  // The GPUs closest to a NET.
  struct LocalGpus {
    std::vector<int> gpus;
    topology::PathType type = topology::PathType::DIS;
  };

  CandidateOrder(topology::System& sys, const Config& cfg) : sys_(sys), cfg_(cfg) {}

  // The GPUs a channel may go to after `gpu`, in NCCL's order. `sortNet`: 0 when the channel does not go back to
  // a NET, 1 when the next GPU does, -1 when a later one does; with 1 and -1 the candidates are sorted by the
  // channel's first NET too, and with -1 their order is reversed when they are alike inside the node.
  void nextGpus(const Graph& g, int gpu, NextList& next, int sortNet);
  // ncclTopoSelectNets for the GPU (-1: every GPU) within path type typeInter.
  // Cached: the NETs only depend on the paths.
  const std::vector<int>& selectNets(int typeInter, int gpu) {
    const int key = (typeInter + 1) * 1024 + (gpu + 1);
    auto it = netCache_.find(key);
    if (it != netCache_.end()) return it->second;
    return netCache_.emplace(key, selectNetsUncached(typeInter, gpu)).first->second;
  }
  // ncclTopoGetLocal for a NET's GPUs.
  const LocalGpus& netLocalGpus(int net);

 private:
  struct Score {
    int g, startIndex, intraNhops, intraBw, interNhops, interPciBw, interBw;
  };
  // The candidates of a GPU sorted by NCCL's order with every PCI bandwidth equal (their static order), and
  // the rank of each one's interBw among them: NCCL's order is (interBw rank, PCI bandwidth down, static order).
  struct StaticOrder {
    std::vector<Score> scores;
    std::vector<uint16_t> group;
    bool done = false;
  };

  void nextGpusNvSwitch(const Graph& g, int gpu, NextList& next) const;
  void nextGpusStatic(const Graph& g, int gpu, NextList& next, int sortNet);
  void nextGpusByNet(const Graph& g, int gpu, int netIdx, NextList& next, int sortNet);
  // Both orders are computed on first use and cached (a lookup at every step of the search).
  const std::vector<Score>& sortedCandidates(int gpu) {
    if (sortCache_.empty() || !sortCached_[gpu]) sortCandidates(gpu);
    return sortCache_[gpu];
  }
  const StaticOrder& staticOrder(int gpu, int netIdx) {
    const int nets = sys_.count(topology::NodeType::NET);
    if (!staticOrders_.empty()) {
      const StaticOrder& so = staticOrders_[static_cast<size_t>(gpu) * nets + netIdx];
      if (so.done) return so;
    }
    return orderStatically(gpu, netIdx);
  }
  void sortCandidates(int gpu);
  const StaticOrder& orderStatically(int gpu, int netIdx);
  void scoreCandidates(int gpu, int netIdx, SmallVec<Score, 32>& scores, uint64_t flag = 0, bool pci = true);
  // The GPU's PCI bandwidth left, the lower of both directions (-1 without a PCI uplink).
  int gpuPciBw(int gpu) {
    if (pciLinks_.empty()) findPciLinks();
    auto [up, down] = pciLinks_[gpu];
    if (!up) return -1;
    return static_cast<int>(std::min(up->bw, down->bw));
  }
  void findPciLinks();
  std::vector<int> prefNetsChannelFirst(int gpu) const;
  std::vector<int> prefNetsGpuFirst(int gpu) const;
  const std::vector<int>& prefNets(int gpu);
  std::vector<int> selectNetsUncached(int typeInter, int gpu);

  topology::System& sys_;
  const Config& cfg_;
  std::vector<std::vector<Score>> sortCache_;
  std::vector<char> sortCached_;
  std::vector<StaticOrder> staticOrders_;
  // The GPU's PCI uplink in both directions (the search consumes their bandwidth), found once per GPU.
  std::vector<std::pair<const topology::Link*, const topology::Link*>> pciLinks_;
  std::unordered_map<int, std::vector<int>> netCache_;   // by path type and GPU
  std::unordered_map<int, std::vector<int>> prefCache_;  // by GPU
  std::vector<LocalGpus> netLocals_;
};

}  // namespace topocoll::search::detail
