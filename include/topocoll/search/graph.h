// Third layer: the communication graphs NCCL searches inside one node (src/graph/search.cc), their XML form,
// and the job-wide rings and trees built from them (connect.cc, trees.cc).
#pragma once

#include <cstdint>
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
  int searchSteps = 0;
  bool fromFile = false;
};

/// Runs NCCL's search for one pattern (ncclTopoCompute). The graph's id, pattern, collNet, minChannels and
/// maxChannels are inputs. When `cfg.graphFile` names a graph XML holding this id, it is used instead.
void compute(topology::System& sys, const Config& cfg, Graph& graph);

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

namespace topocoll::search {

/// Why a graph has the bandwidth it has: the link its channels load the most, relative to its capacity.
struct Bottleneck {
  topology::LinkRef link;  // link.link < 0: nothing found (graph without channels)
  float capacity = 0;      // the link's bandwidth in GB/s
  float used = 0;          // bandwidth the graph's channels put on it (GB/s)
  int channels = 0;        // channel crossings of that link
  float nextSpeed = 0;     // the next speed of NCCL's array above the graph's, 0 when none
};

/// Accounts every channel's hops (GPU to GPU, NET to GPU and back, GPU to NVSwitch) on the system's links and
/// returns the most loaded link.
Bottleneck findBottleneck(const topology::System& sys, const Graph& graph);

}  // namespace topocoll::search
