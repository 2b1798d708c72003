// The link capacities a node's channels share, as NCCL's search accounts them (followPath in src/graph/search.cc),
// and upper bounds on a pattern's total bandwidth from the topology's cuts.
//
// Every link of the system and every NIC port is a *resource* with a capacity in GB/s. A route (the precomputed
// path between two nodes) puts a load on some resources per GB/s of channel speed: 1 on each link it crosses,
// 6/5 on PCI links of a PHB path through an Intel CPU, 1/8 on the reverse link towards a pre-Ampere GPU when
// the source is not a GPU, 1 on the reverse of a POWER CPU's NVLink, and 1 on the entry NIC port (NCCL's
// net->bw). Loads are integers in units of 1/kLoadUnit so that adding and removing channels is exact.
//
//   topocoll::search::LoadModel m(plan.system);
//   auto load = topocoll::search::graphLoad(m, plan.graphs[topocoll::search::kGraphRing]);
//   auto bound = topocoll::search::upperBound(m, topocoll::search::kPatternRing);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topocoll/search/graph.h"
#include "topocoll/topology/system.h"

namespace topocoll::search {

/// Loads are counted in 1/kLoadUnit of the channel speed (1, 6/5, 1/8, 1/2 and their products are integers).
constexpr int kLoadUnit = 80;

/// One resource a route loads: `units` / kLoadUnit per GB/s of channel speed.
struct Use {
  int res = -1;
  int units = 0;
};

/// A route between two GPU/NVS/NET nodes: what it loads and its NCCL path type (DIS: no route).
struct Route {
  std::vector<Use> uses;
  int type = static_cast<int>(topology::PathType::DIS);
  int hops = 0;
};

class LoadModel {
 public:
  /// `sys` must have its paths computed (paths::prepareForSearch) and must outlive the model.
  explicit LoadModel(const topology::System& sys);

  const topology::System& system() const { return sys_; }
  int resources() const { return static_cast<int>(cap_.size()); }
  /// Capacity in GB/s.
  double capacity(int res) const { return cap_[res]; }
  /// The link behind a resource (link < 0 for a NIC port resource).
  topology::LinkRef link(int res) const { return links_[res]; }
  /// Resource of a link, and of the NIC port a NET belongs to (NETs with one asic and port share it).
  int resourceOf(topology::LinkRef ref) const;
  int portResource(int net) const { return portRes_[net]; }
  /// "PCI 0000:52:00.0 -> PCI 0000:41:00.0" / "NIC port of NET0 mlx5_0".
  std::string label(int res) const;

  /// Route from node (t1, i1) to node (t2, i2); t1, t2 among GPU, NVS, NET.
  const Route& route(topology::NodeType t1, int i1, topology::NodeType t2, int i2) const;

 private:
  Route build(topology::NodeType t1, int i1, topology::NodeType t2, int i2) const;
  const topology::System& sys_;
  std::vector<double> cap_;
  std::vector<topology::LinkRef> links_;
  std::vector<std::vector<int>> linkRes_;  // [flat node][link] -> resource
  std::vector<int> nodeBase_;              // flat node index of (type, 0)
  std::vector<int> portRes_;               // [net] -> resource
  int maxN_ = 0;
  std::vector<Route> routes_;  // [slot(t1)][i1][slot(t2)][i2]
};

/// What a graph's channels put on the resources (GB/s), split by intra-node and network hops, following the
/// hops NCCL's search charges for the graph's pattern (ring, trees, NVLS; CollNet graphs are not modelled).
struct GraphLoad {
  std::vector<double> intra, inter;  // GB/s per resource
  int worst = -1;                    // resource with the highest load / capacity (-1: nothing loaded)
  double worstRatio = 0;
  int worstCrossings = 0;            // channel hops that cross it
  double used(int res) const { return intra[res] + inter[res]; }
};
GraphLoad graphLoad(const LoadModel& m, const Graph& g);

/// nChannels x speed: the intra-node speed on one node, the lower of the two speeds across nodes.
double graphTotal(const Graph& g, bool inter);

/// A set of resources every channel of a pattern crosses at least once (a cut between GPUs, or between the GPUs
/// and the network), with its capacity: no channel set exceeds it in nChannels x speed.
struct Cut {
  std::vector<int> res;
  double capacity = 0;
  std::string what;   // "GPU0 out", "GPU0 -> GPU4", "network -> GPUs"
  int minUnits = kLoadUnit;
};

/// Upper bound on nChannels x speed for a pattern: the smallest cut between any two GPUs (and the network, across
/// nodes), by max-flow over the links in both orders for rings (a ring crosses every cut both ways) and over
/// both directions together for trees (a chain crosses it at least once); for NVLS, each GPU's NVSwitch links
/// (every channel loads every GPU). `cuts` receives every cut found (deduplicated), the tightest first, with its
/// `minUnits`: the least load one channel puts on it per GB/s. Infinite when no link carries the channels (one GPU
/// and no network).
double upperBound(const LoadModel& m, int pattern, std::vector<Cut>* cuts = nullptr);

}  // namespace topocoll::search
