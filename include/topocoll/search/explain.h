// `plan --explain`: why a graph has the bandwidth it has, from the topology: the links its channels fill, and at its
// speed and each faster one of NCCL's array the most channels the topology's cuts allow and the cut that stops more.
#pragma once

#include <string>
#include <vector>

#include "topocoll/search/capacity.h"
#include "topocoll/search/graph.h"

namespace topocoll::search {

/// A link or NIC port and what a graph's channels put on it.
struct LinkUse {
  std::string link;
  double used = 0, capacity = 0;
  int crossings = 0;
};

/// One speed of NCCL's array: at most how many channels the topology's cuts allow there, and the cut.
struct SpeedLimit {
  float speed = 0;
  int maxChannels = 0;
  std::string cut;  // "GPU0 -> network (24 GB/s): PCI 0000:41:00.0 -> PCI 0000:52:00.0 (PCI) 24"
};

struct GraphWhy {
  std::vector<LinkUse> full;       // links and NIC ports the channels fill (>= 99%), fullest first
  LinkUse mostLoaded;              // the most loaded one (when none is full)
  std::vector<SpeedLimit> limits;  // the graph's speed, then the faster ones of `ladder` (slowest first)
};

/// `ladder`: NCCL's speed array for the system (speedArray). `bound` / `boundText`: a bound on nChannels x speed
/// tighter than single cuts (the optimiser's LP bound), used where it allows fewer channels.
GraphWhy explainGraph(const LoadModel& m, const Graph& g, const std::vector<float>& ladder, double bound = 0,
                      const std::string& boundText = "");

/// "PXN (a NIC reached through an NVLink peer GPU)", ...: what a path type means for the search, in words.
const char* pathTypeMeaning(int type, bool nicHop);

}  // namespace topocoll::search
