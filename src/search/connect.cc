// Job-wide rings and trees. Follows NCCL 2.30.7 src/graph/connect.cc (ncclTopoPreset, ncclTopoPostset and the
// functions it calls), the allGather3 part of initTransportsRank (src/init.cc), ncclNvlsTuning
// (src/transport/nvls.cc) and ncclTopoComputeP2pChannels (src/graph/connect.cc) (Apache-2.0), computed for every
// rank at once. Memory is O(ranks x channels) for the outputs; records are read twice and never all held.
#include "topocoll/search/connect.h"

#include <algorithm>
#include <climits>

#include "topocoll/search/trees.h"
#include "topocoll/status.h"
#include "topocoll/topology/system.h"

namespace topocoll::search {

namespace {

// ncclNvlsTuning (src/transport/nvls.cc): NVLS_NCHANNELS_SM90, NVLS_NCHANNELS_SM100 (several nodes) and
// NVLS_NCHANNELS_SM100_NVL (one node); ncclNvlsTreeSm100Tuning raises or lowers them by the slowest NIC (GB/s).
constexpr int kNvlsChannelsSm90 = 16, kNvlsChannelsSm100 = 32, kNvlsChannelsSm100Nvl = 24;
constexpr float kNvlsTreeNicBwHigh = 96.0f, kNvlsTreeNicBwMid = 48.0f;
constexpr int kNvlsTreeChannelsLow = 24, kNvlsTreeChannelsHigh = 32, kNvlsTreePpnSplit = 8;
// ncclTopoPostset: "4 compute channels per search channel" on sm90+ across nodes when the ring's bwIntra exceeds
// this (GB/s), up to 16 channels.
constexpr float kDoubleChannelsBwIntra = 45.0f;
constexpr int kDoubleChannelsUpTo = 16;
// ncclTopoComputeP2pChannels: peers are spread over the channels in groups of 8 ranks across nodes.
constexpr int kP2pRanksPerGroup = 8;
constexpr int kMaxTreeArity = 3;  // NCCL_MAX_TREE_ARITY

int pow2Up(int v) {
  int r = 1;
  while (r < v) r <<= 1;
  return r;
}

// What the first rank of a node contributes to the postset (allTopoRanks[firstRanks[n]]), for the aligned channels.
struct NodeRecord {
  std::vector<int> ringRecv, ringSend, treeToParent, treeToChild0, treeToChild1;
  std::vector<int> nvlsHeads;
  int crossNicRing = 0;
};

// The allGather3 combination and node numbering: everything pass 1 over the records learns.
struct JobView {
  std::vector<int> rankToNode, firstRanks, localCount;
  std::vector<NodeRecord> nodes;
  int nChannelsOrig = 0;  // rank 0's preset channel count
};

void alignGraph(Graph& g, const GraphInfo& o) {
  g.nChannels = std::min(g.nChannels, o.nChannels);
  g.sameChannels = std::min(g.sameChannels, o.sameChannels);
  g.bwIntra = std::min(g.bwIntra, o.bwIntra);
  g.bwInter = std::min(g.bwInter, o.bwInter);
  g.typeIntra = std::max(g.typeIntra, o.typeIntra);
  g.typeInter = std::max(g.typeInter, o.typeInter);
  g.crossNic = std::max(g.crossNic, o.crossNic);
}

Graph graphFromInfo(const GraphInfo& gi) {
  Graph g;
  g.pattern = gi.pattern;
  g.nChannels = gi.nChannels;
  g.sameChannels = gi.sameChannels;
  g.bwIntra = gi.bwIntra;
  g.bwInter = gi.bwInter;
  g.typeIntra = gi.typeIntra;
  g.typeInter = gi.typeInter;
  g.crossNic = gi.crossNic;
  return g;
}

// Pass 1: nodes as NCCL numbers them (by the first rank of each rank's channel-0 ring, in rank order) and the
// min/max alignment of every rank's graph info (rank 0's values first, as rank 0 computes them).
JobView gatherRecords(const RankRecords& records, Connect& out) {
  const int nRanks = records.size();
  JobView v;
  v.rankToNode.resize(nRanks);
  std::vector<int> nodeOfFirstRank(nRanks, -1);
  RankTopo scratch;
  const RankTopo& r0 = records.get(0, scratch);
  for (int a = 0; a < kNumGraphs; ++a) out.aligned[a] = graphFromInfo(r0.graphs[a]);
  out.nChannelsSearchedRing = r0.searchedRing;
  out.nChannelsSearchedTree = r0.searchedTree;
  v.nChannelsOrig = out.nChannelsPreset = r0.nChannelsPreset;
  out.minCompCap = r0.minCompCap;
  out.maxCompCap = r0.maxCompCap;
  out.cpuArch = r0.cpuArch;
  out.cpuVendor = r0.cpuVendor;
  out.p2pnChannelsPerPeer = r0.p2pnChannelsPerPeer;
  out.minNetBw = r0.minNetBw;
  out.nvlsSupport = r0.nvlsSupport;
  out.collnetEnable = r0.collnetSupport;
  for (int r = 0; r < nRanks; ++r) {
    const RankTopo& t = records.get(r, scratch);
    const int first = t.ringRecv[0];
    if (first < 0 || first >= nRanks)
      fail(StatusCode::kInternal, "rank {}: its channel-0 ring starts at rank {}, which is not in the job", r, first);
    if (nodeOfFirstRank[first] < 0) {
      nodeOfFirstRank[first] = static_cast<int>(v.firstRanks.size());
      v.firstRanks.push_back(first);
      v.localCount.push_back(0);
    }
    const int node = nodeOfFirstRank[first];
    v.rankToNode[r] = node;
    v.localCount[node]++;
    for (int a = 0; a < kNumGraphs; ++a) alignGraph(out.aligned[a], t.graphs[a]);
    out.maxTreePattern = std::max(out.maxTreePattern, t.graphs[kGraphTree].pattern);
    out.minCompCap = std::min(out.minCompCap, t.minCompCap);
    out.maxCompCap = std::max(out.maxCompCap, t.maxCompCap);
    if (out.cpuArch != t.cpuArch) out.cpuArch = topology::kCpuArchMixed;
    if (out.cpuVendor != t.cpuVendor) out.cpuVendor = topology::kCpuVendorMixed;
    out.p2pnChannelsPerPeer = std::min(out.p2pnChannelsPerPeer, t.p2pnChannelsPerPeer);
    out.minNetBw = std::min(out.minNetBw, t.minNetBw);
  }
  out.nNodes = static_cast<int>(v.firstRanks.size());
  out.localRanks = v.localCount[v.rankToNode[0]];
  out.minLocalRanks = *std::min_element(v.localCount.begin(), v.localCount.end());
  out.maxLocalRanks = *std::max_element(v.localCount.begin(), v.localCount.end());
  out.nodeFirstRank = v.firstRanks;
  return v;
}

// The node records the postset reads, for the aligned channel count.
void readNodeRecords(const RankRecords& records, JobView& v, int nChannels) {
  RankTopo scratch;
  v.nodes.resize(v.firstRanks.size());
  for (size_t n = 0; n < v.firstRanks.size(); ++n) {
    const RankTopo& t = records.get(v.firstRanks[n], scratch);
    NodeRecord& rec = v.nodes[n];
    rec.ringRecv.assign(t.ringRecv, t.ringRecv + nChannels);
    rec.ringSend.assign(t.ringSend, t.ringSend + nChannels);
    rec.treeToParent.assign(t.treeToParent, t.treeToParent + nChannels);
    rec.treeToChild0.assign(t.treeToChild0, t.treeToChild0 + nChannels);
    rec.treeToChild1.assign(t.treeToChild1, t.treeToChild1 + nChannels);
    rec.nvlsHeads.assign(t.nvlsHeads, t.nvlsHeads + t.nvlsHeadNum);
    rec.crossNicRing = t.crossNicRing;
  }
}

// ncclNvlsTuning: NVLS channels by architecture, then ncclNvlsTreeSm100Tuning on several Blackwell nodes.
int nvlsChannelCount(int compCap, const Connect& c) {
  int n = compCap >= 100 ? (c.nNodes > 1 ? kNvlsChannelsSm100 : kNvlsChannelsSm100Nvl) : kNvlsChannelsSm90;
  if (c.minCompCap >= 100 && c.nNodes > 1) {
    if (c.nNodes == 2 && c.minNetBw >= kNvlsTreeNicBwMid) n = kNvlsTreeChannelsHigh;
    else if (c.minNetBw >= kNvlsTreeNicBwHigh)
      n = c.minLocalRanks <= kNvlsTreePpnSplit ? kNvlsTreeChannelsLow : kNvlsTreeChannelsHigh;
    else if (c.minNetBw >= kNvlsTreeNicBwMid) n = kNvlsTreeChannelsLow;
  }
  return std::max(1, std::min(kMaxChannels, n));  // config.minCTAs / maxCTAs defaults
}

// The channel list after ncclTopoPostset's duplications: source[c] is the base channel (of the 2 x nChannels that
// connectRings/connectTrees fill) that channel c copies.
std::vector<int> channelSources(const Connect& c, int nChannels, const Config& cfg) {
  std::vector<int> src;
  for (int i = 0; i < std::min(kMaxChannels, 2 * nChannels); ++i) src.push_back(i);
  auto copyChannels = [&](int end) {  // copyChannels(comm, start = current count, end)
    const int start = static_cast<int>(src.size());
    for (int ch = start; ch < end; ++ch) src.push_back(src[ch - start]);
  };
  int n = static_cast<int>(src.size());
  if (c.collnetEnable) {
    const Graph& chain = c.aligned[kGraphCollnetChain];
    if (chain.bwIntra > chain.bwInter && c.nRanks > c.nNodes) copyChannels(std::min(kMaxChannels, n + n / 2));
  }
  n = static_cast<int>(src.size());
  if (c.minCompCap >= 90 && c.nNodes > 1 && c.aligned[kGraphRing].bwIntra > kDoubleChannelsBwIntra &&
      n < kDoubleChannelsUpTo)
    copyChannels(2 * n);
  // NCCL_MAX_NCHANNELS and config.maxCTAs cap the channels; NCCL_MIN_NCHANNELS and config.minCTAs (at most 64)
  // copy them up.
  const int maxCtas = cfg.maxCtas > 0 ? cfg.maxCtas : kMaxChannels, minCtas = std::min(cfg.minCtas, kMaxChannels);
  src.resize(std::min<size_t>(src.size(), std::min(cfg.maxNchannels, maxCtas)));
  copyChannels(std::max({cfg.minNchannels, minCtas, 1}));
  return src;
}

void setTreeDown(TreeLinks& t, int value, int rank, int channel) {
  int x = 0;
  while (x < kMaxTreeArity && t.down[x] >= 0) ++x;
  if (x == kMaxTreeArity)
    fail(StatusCode::kInternal, "rank {} channel {}: tree already has {} children", rank, channel, kMaxTreeArity);
  t.down[x] = value;
}

// Pass 2: each rank's ring neighbours inside its node (rings of odd nodes alternated, as NCCL does against rail
// crossing) and its trees: the chain inside the node, then connectTrees' links between nodes. Base channels c and
// c + nChannels share the chain and carry the two trees of the double binary tree.
void connectRanksRingsAndTrees(const RankRecords& records, const JobView& v, int nChannels,
                               std::vector<int>& ringNext, std::vector<TreeLinks>& baseTrees) {
  const int nRanks = records.size(), nNodes = static_cast<int>(v.firstRanks.size()), nBase = 2 * nChannels;
  ringNext.assign(static_cast<size_t>(nChannels) * nRanks, -1);
  baseTrees.assign(static_cast<size_t>(nRanks) * nBase, TreeLinks{});
  RankTopo scratch;
  for (int r = 0; r < nRanks; ++r) {
    const RankTopo& t = records.get(r, scratch);
    const int node = v.rankToNode[r];
    const bool alternate = t.crossNicRing == 2 && nChannels % 2 == 0 && node % 2 == 1;
    TreeLinks* trees = &baseTrees[static_cast<size_t>(r) * nBase];
    for (int c = 0; c < nChannels; ++c) {
      ringNext[static_cast<size_t>(c) * nRanks + r] = t.ringNext[alternate ? c ^ 1 : c];
      trees[c].up = trees[c + nChannels].up = t.treeUp[c];
      trees[c].down[0] = trees[c + nChannels].down[0] = t.treeDown[c];
    }
    int t0u, t0d0, t0d1, t0ct = 0, t1u, t1d0, t1d1, t1ct = 0;
    getDtree(nNodes, node, &t0u, &t0d0, &t0d1, &t0ct, &t1u, &t1d0, &t1d1, &t1ct);
    const NodeRecord& me = v.nodes[node];
    for (int c = 0; c < nChannels; ++c) {
      TreeLinks& tr0 = trees[c];
      TreeLinks& tr1 = trees[c + nChannels];
      auto upOf = [&](int n, int childType) {
        return childType == 0 ? v.nodes[n].treeToChild0[c] : v.nodes[n].treeToChild1[c];
      };
      if (r == me.treeToParent[c]) {
        if (t0u != -1) tr0.up = upOf(t0u, t0ct);
        if (t1u != -1) tr1.up = upOf(t1u, t1ct);
      }
      if (r == me.treeToChild0[c]) {
        if (t0d0 != -1) setTreeDown(tr0, v.nodes[t0d0].treeToParent[c], r, c);
        if (t1d0 != -1) setTreeDown(tr1, v.nodes[t1d0].treeToParent[c], r, c + nChannels);
      }
      if (r == me.treeToChild1[c]) {
        if (t0d1 != -1) setTreeDown(tr0, v.nodes[t0d1].treeToParent[c], r, c);
        if (t1d1 != -1) setTreeDown(tr1, v.nodes[t1d1].treeToParent[c], r, c + nChannels);
      }
    }
  }
  // connectRings: the last rank of each node's chain sends to the next node's first (alternated on odd nodes).
  for (int c = 0; c < nChannels; ++c) {
    for (int n = 0; n < nNodes; ++n) {
      auto alternated = [&](int node) {
        return v.nodes[node].crossNicRing == 2 && nChannels % 2 == 0 && node % 2 == 1 ? c ^ 1 : c;
      };
      const int sendRank = v.nodes[n].ringSend[alternated(n)];
      const int next = (n + 1) % nNodes;
      ringNext[static_cast<size_t>(c) * nRanks + sendRank] = v.nodes[next].ringRecv[alternated(next)];
    }
  }
}

// ncclBuildRings: each ring from rank 0, checking that it closes over every rank.
std::vector<int> walkRing(const std::vector<int>& ringNext, int c, int nRanks, std::vector<char>& seen) {
  std::vector<int> ring(nRanks);
  std::fill(seen.begin(), seen.end(), 0);
  const int* next = &ringNext[static_cast<size_t>(c) * nRanks];
  int cur = 0;
  for (int i = 0; i < nRanks; ++i) {
    if (cur < 0 || cur >= nRanks) fail(StatusCode::kInternal, "ring {} is broken at position {}", c, i);
    if (seen[cur]) fail(StatusCode::kInternal, "ring {} visits rank {} twice", c, cur);
    seen[cur] = 1;
    ring[i] = cur;
    cur = next[cur];
  }
  if (cur != 0) fail(StatusCode::kInternal, "ring {} does not loop back to rank 0", c);
  return ring;
}

// connectNvls: the NVLS heads of every node and the double binary trees between the heads of the same index.
void connectNvls(const JobView& v, Connect& out) {
  const int nRanks = out.nRanks, nNodes = out.nNodes;
  int minHeadNum = INT_MAX;
  for (auto& n : v.nodes) minHeadNum = std::min(minHeadNum, static_cast<int>(n.nvlsHeads.size()));
  if (!out.nvlsSupport) minHeadNum = 0;
  if (minHeadNum == 0) out.nvlsChannels = 0;
  out.nvls.assign(nRanks, std::vector<NvlsLinks>(2));
  if (minHeadNum == 0) return;
  for (int rank = 0; rank < nRanks; ++rank) {
    const int node = v.rankToNode[rank];
    const auto& heads = v.nodes[node].nvlsHeads;
    int headRank = -1;
    for (int h = 0; h < minHeadNum; ++h)
      if (heads[h] == rank) headRank = h;
    int treeUp[2] = {-1, -1}, treeDown0[2] = {-1, -1}, treeDown1[2] = {-1, -1};
    if (nNodes > 1 && headRank >= 0) {
      int p0, c00, c01, p1, c10, c11, x0 = 0, x1 = 0;
      getDtree(nNodes, node, &p0, &c00, &c01, &x0, &p1, &c10, &c11, &x1);
      auto head = [&](int n) { return n == -1 ? -1 : v.nodes[n].nvlsHeads[headRank]; };
      treeUp[0] = head(p0);
      treeDown0[0] = head(c00);
      treeDown1[0] = head(c01);
      treeUp[1] = head(p1);
      treeDown0[1] = head(c10);
      treeDown1[1] = head(c11);
    }
    for (int c = 0; c < 2; ++c) {
      NvlsLinks& nl = out.nvls[rank][c];
      nl.nHeads = minHeadNum;
      nl.headRank = headRank;
      if (nNodes > 1) {
        nl.treeUp = treeUp[c];
        nl.treeDown[0] = nRanks + 1 + headRank;
        int ix = 1;
        if (treeDown0[c] != -1) nl.treeDown[ix++] = treeDown0[c];
        if (treeDown1[c] != -1) nl.treeDown[ix] = treeDown1[c];
      }
    }
  }
}

// ncclTopoComputeP2pChannels: channels for send/recv, and per peer.
void p2pChannels(Connect& out, const Config& cfg) {
  int p2pn = std::min(out.nChannels, cfg.maxP2pNchannels);
  p2pn = std::max(p2pn, cfg.minP2pNchannels);
  int perPeer = pow2Up(out.p2pnChannelsPerPeer);
  p2pn = std::min(pow2Up(p2pn), kMaxChannels);
  if (out.nNodes > 1) {
    // NCCL 2.30: the peers of one round are maxP2pPeers (ncclConfig_t / NCCL_P2P_MAX_PEERS), every rank by default.
    const int peers = cfg.maxP2pPeers > 0 ? std::min(cfg.maxP2pPeers, out.nRanks) : out.nRanks;
    const int groups = (peers + kP2pRanksPerGroup - 1) / kP2pRanksPerGroup;
    while (perPeer * groups > p2pn && perPeer > 1) perPeer /= 2;
  } else {
    perPeer = std::min(p2pn, perPeer);
  }
  out.p2pnChannels = p2pn;
  out.p2pnChannelsPerPeer = perPeer;
}

}  // namespace

RankTopo presetRank(int rank, const NodeGraphs& node, int rankOffset) {
  RankTopo t;
  const auto& G = node.graphs;
  const int L = node.ranks;
  for (int a = 0; a < kNumGraphs; ++a) {
    const Graph& g = G[a];
    t.graphs[a] = GraphInfo{g.pattern, g.nChannels, g.sameChannels, g.bwIntra, g.bwInter, g.typeIntra, g.typeInter,
                            g.crossNic};
  }
  t.searchedRing = G[kGraphRing].nChannels;
  t.searchedTree = G[kGraphTree].nChannels;
  const int nc = std::min(G[kGraphTree].nChannels, G[kGraphRing].nChannels);
  t.nChannelsPreset = nc;
  t.crossNicRing = G[kGraphRing].crossNic;
  std::fill(std::begin(t.ringRecv), std::end(t.ringRecv), -1);
  std::fill(std::begin(t.ringSend), std::end(t.ringSend), -1);
  std::fill(std::begin(t.ringPrev), std::end(t.ringPrev), -1);
  std::fill(std::begin(t.ringNext), std::end(t.ringNext), -1);
  std::fill(std::begin(t.treeToParent), std::end(t.treeToParent), -1);
  std::fill(std::begin(t.treeToChild0), std::end(t.treeToChild0), -1);
  std::fill(std::begin(t.treeToChild1), std::end(t.treeToChild1), -1);
  std::fill(std::begin(t.treeUp), std::end(t.treeUp), -1);
  std::fill(std::begin(t.treeDown), std::end(t.treeDown), -1);
  std::fill(std::begin(t.nvlsHeads), std::end(t.nvlsHeads), -1);
  const int local = rank - rankOffset;  // the rank as the graphs name it
  auto job = [rankOffset](int r) { return r + rankOffset; };
  // Where the tree pattern puts the node's parent and children (ncclTopoPreset).
  const int child0Index = G[kGraphTree].pattern == kPatternTree ? 0 : 1;
  const int child1Index = G[kGraphTree].pattern == kPatternSplitTree ? 1 : 0;
  for (int c = 0; c < nc; ++c) {
    const int* ring = G[kGraphRing].intra.data() + c * L;
    const int* tree = G[kGraphTree].intra.data() + c * L;
    for (int k = 0; k < L; ++k) {
      if (ring[k] == local) {
        t.ringRecv[c] = job(ring[0]);
        t.ringSend[c] = job(ring[L - 1]);
        t.ringPrev[c] = k == 0 ? -1 : job(ring[k - 1]);
        t.ringNext[c] = k == L - 1 ? -1 : job(ring[k + 1]);
      }
      if (tree[k] == local) {
        t.treeToParent[c] = job(tree[0]);
        t.treeToChild0[c] = job(tree[child0Index]);
        t.treeToChild1[c] = job(tree[child1Index]);
        t.treeUp[c] = k == 0 ? -1 : job(tree[k - 1]);
        t.treeDown[c] = k == L - 1 ? -1 : job(tree[k + 1]);
      }
    }
  }
  const Graph& nv = G[kGraphNvls];
  for (int c = 0; c < nv.nChannels; ++c) {
    const int head = job(nv.intra[c * L]);
    if (std::find(t.nvlsHeads, t.nvlsHeads + t.nvlsHeadNum, head) == t.nvlsHeads + t.nvlsHeadNum)
      t.nvlsHeads[t.nvlsHeadNum++] = head;
  }
  t.minCompCap = node.minCompCap;
  t.maxCompCap = node.maxCompCap;
  t.cpuArch = node.cpuArch;
  t.cpuVendor = node.cpuVendor;
  t.p2pnChannelsPerPeer = node.p2pnChannelsPerPeer;
  t.nvlsSupport = node.nvlsSupport;
  t.collnetSupport = node.collnetSupport;
  t.localRanks = node.ranks;
  t.minNetBw = node.minNetBw;
  return t;
}

ReplicatedNodes::ReplicatedNodes(const std::vector<std::vector<NodeGraphs>>& unitTypes, int unitRanks, int units)
    : types_(unitTypes), unitRanks_(unitRanks), units_(units) {
  if (unitRanks < 1 || units < 1 || unitTypes.empty()) fail(StatusCode::kInvalidArgument, "a job needs at least one rank");
  for (size_t t = 0; t < unitTypes.size(); ++t) {
    std::vector<int> nodeOf(unitRanks, -1);
    for (size_t n = 0; n < unitTypes[t].size(); ++n) {
      const NodeGraphs& ng = unitTypes[t][n];
      const Graph& ring = ng.graphs[kGraphRing];
      for (int i = 0; i < ng.ranks; ++i) {
        const int r = static_cast<int>(ring.intra.size()) > i ? ring.intra[i] : -1;
        if (r < 0 || r >= unitRanks || nodeOf[r] >= 0)
          fail(StatusCode::kInvalidArgument, "node {} names rank {}, which is outside its unit or in another node", n, r);
        nodeOf[r] = static_cast<int>(n);
      }
    }
    for (int r = 0; r < unitRanks; ++r)
      if (nodeOf[r] < 0) fail(StatusCode::kInvalidArgument, "rank {} of the unit is in no node", r);
    nodeOf_.push_back(std::move(nodeOf));
  }
}

const RankTopo& ReplicatedNodes::get(int rank, RankTopo& scratch) const {
  const int unit = rank / unitRanks_;
  const size_t type = static_cast<size_t>(unit) % types_.size();
  scratch = presetRank(rank, types_[type][nodeOf_[type][rank % unitRanks_]], unit * unitRanks_);
  return scratch;
}

Connect connectRanks(const RankRecords& records, const Config& cfg) {
  const int nRanks = records.size();
  if (nRanks < 1) fail(StatusCode::kInvalidArgument, "connectRanks: no rank");
  Connect out;
  out.nRanks = nRanks;
  JobView v = gatherRecords(records, out);

  if (out.aligned[kGraphCollnetChain].nChannels == 0) out.collnetEnable = 0;
  if (out.aligned[kGraphNvls].nChannels == 0) out.nvlsSupport = 0;
  RankTopo scratch;
  if (out.nvlsSupport) out.nvlsChannels = nvlsChannelCount(records.get(0, scratch).minCompCap, out);
  const int nChannels = std::min(out.aligned[kGraphTree].nChannels, out.aligned[kGraphRing].nChannels);
  out.aligned[kGraphTree].nChannels = out.aligned[kGraphRing].nChannels = nChannels;
  readNodeRecords(records, v, nChannels);

  std::vector<int> ringNext;
  std::vector<TreeLinks> baseTrees;
  connectRanksRingsAndTrees(records, v, nChannels, ringNext, baseTrees);
  const std::vector<int> source = channelSources(out, nChannels, cfg);
  out.nChannels = out.collChannels = static_cast<int>(source.size());
  connectNvls(v, out);

  std::vector<std::vector<int>> baseRings(nChannels);
  std::vector<char> seen(nRanks);
  for (int c = 0; c < nChannels; ++c) baseRings[c] = walkRing(ringNext, c, nRanks, seen);
  ringNext = {};
  out.rings.reserve(source.size());
  for (int s : source) out.rings.push_back(baseRings[s % nChannels]);
  out.trees.assign(nRanks, std::vector<TreeLinks>(source.size()));
  const int nBase = 2 * nChannels;
  for (int r = 0; r < nRanks; ++r)
    for (size_t c = 0; c < source.size(); ++c) out.trees[r][c] = baseTrees[static_cast<size_t>(r) * nBase + source[c]];
  p2pChannels(out, cfg);
  return out;
}

}  // namespace topocoll::search
