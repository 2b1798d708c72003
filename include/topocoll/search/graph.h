// Third layer: the communication graphs NCCL searches inside one node (src/graph/search.cc), their XML form,
// and the job-wide rings and trees built from them (connect.cc, trees.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/topology/system.h"
#include "topocoll/topology/xml.h"

namespace topocoll::search {

constexpr int kMaxChannels = 64;  // MAXCHANNELS

enum Pattern : int {
  kPatternBalancedTree = 1,
  kPatternSplitTree = 2,
  kPatternTree = 3,
  kPatternRing = 4,
  kPatternNvls = 5,
  kPatternCollnetDirect = 6,
};

/// Graph indices in NCCL's algorithm order (the graphs[] of initTransportsRank).
enum GraphIndex { kGraphRing = 0, kGraphTree = 1, kGraphCollnetChain = 2, kGraphCollnetDirect = 3, kGraphNvls = 4 };
constexpr int kNumGraphs = 5;
const char* graphName(int index);  // "ring", "tree", "collnet_chain", "collnet_direct", "nvls"

/// The ids NCCL gives its graphs (ncclTopoGraph::id, the `id` of graph XML): not the index above.
constexpr int kGraphIdRing = 0, kGraphIdTree = 1, kGraphIdCollnetChain = 2, kGraphIdNvls = 3, kGraphIdCollnetDirect = 4;

/// ncclTopoGraph. `intra[c * ngpus + i]` is the rank at position i of channel c; `inter[c * 2 + {0,1}]` the ids
/// of the NET the channel enters and leaves the node through.
struct Graph {
  int id = 0;
  int pattern = kPatternRing;
  int crossNic = 0;
  int collNet = 0;
  int minChannels = 1;
  int maxChannels = kMaxChannels;
  int nChannels = 0;
  float bwIntra = 0, bwInter = 0, latencyInter = 0;
  int typeIntra = 0, typeInter = 0;
  int sameChannels = 0;
  int nHops = 0;
  std::vector<int> intra;
  std::vector<int64_t> inter;
  // Diagnostics (not part of NCCL's struct).
  double searchMs = 0;
  bool timedOut = false;
  int searchSteps = 0;   // steps NCCL's budgets count
  int searchWalked = 0;  // of those, the steps walked (the rest were charged from the memo)
  int searchPassesShared = 0;  // passes charged from one walked at another speed or cross-NIC setting
  bool fromFile = false;
};

/// What NCCL's search did, attempt by attempt (`plan --explain`). The search fills it when given one; its
/// decisions do not depend on it.
struct SearchTrace {
  enum Refusal : int {
    kLinkFull,   // a hop's link (or its reverse charge) had less bandwidth left than the speed
    kPathType,   // a hop's path type is above the attempt's typeIntra / typeInter (e.g. PXN, or CPU staging without GDR)
    kNicSpeed,   // the NIC port has less bandwidth left than the speed
    kNicRail,    // crossNic 0: the exit NIC is on another rail (or asic and port)
    kNicPlane,   // the exit NIC is on another plane
    kNicPair,    // crossNic 2: a channel must enter where the previous one left (and leave where it entered)
    kTreeNic,    // a tree leaves through the NIC it entered
    kRefusals
  };
  struct Attempt {
    float bwIntra = 0, bwInter = 0;
    int typeIntra = 0, typeInter = 0, sameChannels = 0, crossNic = 0, pattern = 0;
    int channels = 0;              // channels the best graph so far has after this attempt
    float bestIntra = 0, bestInter = 0;
    bool timedOut = false;         // the attempt used up its step budget
    int64_t refused[kRefusals] = {};
    int64_t typeRefused[2][topology::kPathTypes] = {};  // kPathType refusals by the hop's type: [0] intra, [1] NIC hops
    std::vector<std::pair<topology::LinkRef, int64_t>> fullLinks;  // links found full, most often first
  };
  std::vector<Attempt> attempts;
  bool globalTimeout = false;      // the search stopped on its global step budget
};

/// NCCL's searches for several graphs of one system (ncclTopoCompute each), sharing what depends only on the
/// system's paths (flattened routes, candidate orders, preferred NETs). The system's paths must not change while
/// it lives.
class Searches {
 public:
  Searches(topology::System& sys, const Config& cfg);
  ~Searches();
  Searches(const Searches&) = delete;
  Searches& operator=(const Searches&) = delete;
  /// ncclTopoCompute for `graph` (id, pattern, collNet, minChannels, maxChannels are inputs). `trace`, when given,
  /// records the attempts.
  void compute(Graph& graph, SearchTrace* trace = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Runs NCCL's search for one pattern (ncclTopoCompute). The graph's id, pattern, collNet, minChannels and
/// maxChannels are inputs. When `cfg.graphFile` names a graph XML holding this id, it is used instead. `trace`,
/// when given, records the attempts.
void compute(topology::System& sys, const Config& cfg, Graph& graph, SearchTrace* trace = nullptr);

/// NCCL's speed array for the GPUs' smallest compute capability, within a node or across nodes (GB/s, descending).
std::vector<float> speedArray(int ccMin, bool inter);

/// ncclTopoDupChannels, exposed for tests.
void dupChannels(Graph& graph, int ccMin, int ngpus);

/// NCCL's "Pattern 4, crossNic 0, nChannels 16, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1" line and
/// one line per channel.
std::string describe(const topology::System& sys, const Graph& graph);

/// Graph XML (NCCL_GRAPH_DUMP_FILE / NCCL_GRAPH_FILE). Without `ranks`, GPUs are named by `dev` only, which
/// NCCL's loader maps to each node's own rank: the form to give every node of a job.
std::string graphsToXml(const topology::System& sys, const std::vector<const Graph*>& graphs, bool ranks = true);
/// Loads channels for `graph` (matched by id) from a graphs document; returns the number of channels loaded
/// (0 when the file has no graph with that id). Validates GPUs, NETs and permutations.
int graphFromXml(const topology::XmlDoc& doc, const topology::System& sys, const Config& cfg, Graph& graph);

}  // namespace topocoll::search
