// Job-wide rings and trees: NCCL 2.30.7's preset/postset (src/graph/connect.cc) and the graph-info allgather
// alignment of initTransportsRank, computed for all ranks at once.
#include "topocoll/search/connect.h"

#include <algorithm>
#include <climits>

#include "topocoll/status.h"

namespace topocoll::search {

const char* graphName(int index) {
  static const char* names[] = {"ring", "tree", "collnet_chain", "collnet_direct", "nvls"};
  return names[index];
}

namespace {

struct Channel {
  int ringPrev = -1, ringNext = -1;
  TreeLinks tree;
};



int pow2Up(int v) {
  int r = 1;
  while (r < v) r <<= 1;
  return r;
}
int log2i(int n) {
  int l = 0;
  while (n >>= 1) ++l;
  return l;
}

}  // namespace

RankTopo presetRank(int rank, const NodeGraphs& node) {
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
  for (int c = 0; c < kMaxChannels; ++c) {
    t.ringRecv[c] = t.ringSend[c] = t.ringPrev[c] = t.ringNext[c] = -1;
    t.treeToParent[c] = t.treeToChild0[c] = t.treeToChild1[c] = t.treeUp[c] = t.treeDown[c] = -1;
    t.nvlsHeads[c] = -1;
  }
  for (int c = 0; c < nc; ++c) {
    const int* ring = G[kGraphRing].intra.data() + c * L;
    const int* tree = G[kGraphTree].intra.data() + c * L;
    for (int k = 0; k < L; ++k) {
      if (ring[k] == rank) {
        t.ringRecv[c] = ring[0];
        t.ringSend[c] = ring[L - 1];
        t.ringPrev[c] = k == 0 ? -1 : ring[k - 1];
        t.ringNext[c] = k == L - 1 ? -1 : ring[k + 1];
      }
      if (tree[k] == rank) {
        int child0Index = G[kGraphTree].pattern == kPatternTree ? 0 : 1;
        int child1Index = G[kGraphTree].pattern == kPatternSplitTree ? 1 : 0;
        t.treeToParent[c] = tree[0];
        t.treeToChild0[c] = tree[child0Index];
        t.treeToChild1[c] = tree[child1Index];
        t.treeUp[c] = k == 0 ? -1 : tree[k - 1];
        t.treeDown[c] = k == L - 1 ? -1 : tree[k + 1];
      }
    }
  }
  const Graph& nv = G[kGraphNvls];
  for (int c = 0; c < nv.nChannels; ++c) {
    int head = nv.intra[c * L];
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

Connect connectJob(const std::vector<NodeGraphs>& nodes, const Config& cfg) {
  if (nodes.empty()) fail(StatusCode::kInvalidArgument, "connectJob: no node");
  int nRanks = 0;
  for (auto& n : nodes) nRanks += n.ranks;
  std::vector<RankTopo> all(nRanks);
  for (auto& n : nodes)
    for (int i = 0; i < n.ranks; ++i) all[n.firstRank + i] = presetRank(n.firstRank + i, n);
  return connectRanks(all, cfg);
}

Connect connectRanks(const std::vector<RankTopo>& allIn, const Config& cfg) {
  if (allIn.empty()) fail(StatusCode::kInvalidArgument, "connectRanks: no rank");
  std::vector<RankTopo> topo = allIn;  // the crossNic ring alternation edits ranks' records
  const int nRanks = static_cast<int>(topo.size());
  Connect out;
  out.nRanks = nRanks;
  // Nodes as NCCL finds them: ranks sharing the first rank of their channel-0 ring.
  std::vector<int> firstRanks, rankToNode(nRanks);
  for (int r = 0; r < nRanks; ++r) {
    int fr = topo[r].ringRecv[0];
    auto it = std::find(firstRanks.begin(), firstRanks.end(), fr);
    rankToNode[r] = static_cast<int>(it - firstRanks.begin());
    if (it == firstRanks.end()) firstRanks.push_back(fr);
  }
  const int nNodes = static_cast<int>(firstRanks.size());
  for (int n = 0; n < nNodes; ++n)
    if (firstRanks[n] < 0 || firstRanks[n] >= nRanks)
      fail(StatusCode::kInternal, "node {} has no ring (first rank {})", n, firstRanks[n]);
  out.nNodes = nNodes;
  out.localRanks = topo[0].localRanks;
  std::vector<std::vector<Channel>> ch(nRanks, std::vector<Channel>(kMaxChannels));
  const int nChannelsOrig = topo[0].nChannelsPreset;
  for (int r = 0; r < nRanks; ++r) {
    const int nc = topo[r].nChannelsPreset;
    for (int c = 0; c < nc; ++c) {
      ch[r][c].tree.up = topo[r].treeUp[c];
      ch[r][c].tree.down[0] = topo[r].treeDown[c];
    }
    for (int c = 0; c < nc && nc + c < kMaxChannels; ++c) ch[r][nc + c] = ch[r][c];
  }
  out.nChannelsSearchedRing = topo[0].searchedRing;
  out.nChannelsSearchedTree = topo[0].searchedTree;
  out.nChannelsPreset = nChannelsOrig;

  // AllGather3: align every rank's graphs (min of bandwidths and channels, max of path types).
  for (int a = 0; a < kNumGraphs; ++a) {
    const GraphInfo& gi = topo[0].graphs[a];
    Graph& g = out.aligned[a];
    g.pattern = gi.pattern;
    g.nChannels = gi.nChannels;
    g.sameChannels = gi.sameChannels;
    g.bwIntra = gi.bwIntra;
    g.bwInter = gi.bwInter;
    g.typeIntra = gi.typeIntra;
    g.typeInter = gi.typeInter;
    g.crossNic = gi.crossNic;
  }
  out.minCompCap = topo[0].minCompCap;
  out.maxCompCap = topo[0].maxCompCap;
  out.cpuArch = topo[0].cpuArch;
  out.cpuVendor = topo[0].cpuVendor;
  int p2pPerPeer = topo[0].p2pnChannelsPerPeer;
  float minNetBw = topo[0].minNetBw;
  int minLocalRanks = INT_MAX;
  for (auto& t : topo) {
    for (int a = 0; a < kNumGraphs; ++a) {
      Graph& g = out.aligned[a];
      const GraphInfo& o = t.graphs[a];
      g.nChannels = std::min(g.nChannels, o.nChannels);
      g.sameChannels = std::min(g.sameChannels, o.sameChannels);
      g.bwIntra = std::min(g.bwIntra, o.bwIntra);
      g.bwInter = std::min(g.bwInter, o.bwInter);
      g.typeIntra = std::max(g.typeIntra, o.typeIntra);
      g.typeInter = std::max(g.typeInter, o.typeInter);
      g.crossNic = std::max(g.crossNic, o.crossNic);
    }
    out.maxTreePattern = std::max(out.maxTreePattern, t.graphs[kGraphTree].pattern);
    out.minCompCap = std::min(out.minCompCap, t.minCompCap);
    out.maxCompCap = std::max(out.maxCompCap, t.maxCompCap);
    if (out.cpuArch != t.cpuArch) out.cpuArch = topology::kCpuArchMixed;
    if (out.cpuVendor != t.cpuVendor) out.cpuVendor = topology::kCpuVendorMixed;
    p2pPerPeer = std::min(p2pPerPeer, t.p2pnChannelsPerPeer);
    minNetBw = std::min(minNetBw, t.minNetBw);
    minLocalRanks = std::min(minLocalRanks, t.localRanks);
  }
  out.collnetEnable = topo[0].collnetSupport && out.aligned[kGraphCollnetChain].nChannels > 0 ? 1 : 0;
  out.nvlsSupport = topo[0].nvlsSupport ? 1 : 0;
  if (out.aligned[kGraphNvls].nChannels == 0) out.nvlsSupport = 0;
  if (out.nvlsSupport) {
    int nvlsCh = topo[0].minCompCap >= 100 ? (nNodes > 1 ? 32 : 24) : 16;
    if (out.minCompCap >= 100 && nNodes > 1) {
      int ppn = minLocalRanks;
      if (nNodes == 2 && minNetBw >= 48.0f) nvlsCh = 32;
      else if (minNetBw >= 96.0f) nvlsCh = ppn <= 8 ? 24 : 32;
      else if (minNetBw >= 48.0f) nvlsCh = 24;
    }
    out.nvlsChannels = std::max(1, std::min(kMaxChannels, nvlsCh));
  }
  int nChannels = std::min(out.aligned[kGraphTree].nChannels, out.aligned[kGraphRing].nChannels);
  out.aligned[kGraphTree].nChannels = out.aligned[kGraphRing].nChannels = nChannels;
  if (nChannels < nChannelsOrig) {
    for (int r = 0; r < nRanks; ++r)
      for (int i = 0; i < nChannels; ++i) ch[r][nChannels + i] = ch[r][nChannelsOrig + i];
  }

  // Postset. Alternate rings on odd nodes to avoid crossing rails.
  for (int r = 0; r < nRanks; ++r) {
    if (topo[r].crossNicRing == 2 && nChannels % 2 == 0 && rankToNode[r] % 2 == 1) {
      for (int c = 0; c < nChannels; c += 2) {
        std::swap(topo[r].ringRecv[c], topo[r].ringRecv[c ^ 1]);
        std::swap(topo[r].ringSend[c], topo[r].ringSend[c ^ 1]);
        std::swap(topo[r].ringPrev[c], topo[r].ringPrev[c ^ 1]);
        std::swap(topo[r].ringNext[c], topo[r].ringNext[c ^ 1]);
      }
    }
  }
  std::vector<int> ringPrev(static_cast<size_t>(nRanks) * kMaxChannels, -1), ringNext = ringPrev;
  for (int c = 0; c < nChannels; ++c) {
    for (int r = 0; r < nRanks; ++r) {
      ringPrev[c * nRanks + r] = topo[r].ringPrev[c];
      ringNext[c * nRanks + r] = topo[r].ringNext[c];
    }
    for (int n = 0; n < nNodes; ++n) {
      int recvRank = topo[firstRanks[n]].ringRecv[c];
      int prevSend = topo[firstRanks[(n - 1 + nNodes) % nNodes]].ringSend[c];
      ringPrev[c * nRanks + recvRank] = prevSend;
      int sendRank = topo[firstRanks[n]].ringSend[c];
      int nextRecv = topo[firstRanks[(n + 1) % nNodes]].ringRecv[c];
      ringNext[c * nRanks + sendRank] = nextRecv;
    }
  }
  // Trees across nodes (double binary tree over nodes, NIC-facing GPUs chosen by the tree pattern).
  int t0u, t0d0, t0d1, t1u, t1d0, t1d1;
  for (int rank = 0; rank < nRanks; ++rank) {
    int node = rankToNode[rank];
    int t0ct = 0, t1ct = 0;
    getDtree(nNodes, node, &t0u, &t0d0, &t0d1, &t0ct, &t1u, &t1d0, &t1d1, &t1ct);
    for (int c = 0; c < nChannels; ++c) {
      TreeLinks& tr0 = ch[rank][c].tree;
      TreeLinks& tr1 = ch[rank][c + nChannels].tree;
      auto ttp = [&](int n) { return topo[firstRanks[n]].treeToParent[c]; };
      auto ttc0 = [&](int n) { return topo[firstRanks[n]].treeToChild0[c]; };
      auto ttc1 = [&](int n) { return topo[firstRanks[n]].treeToChild1[c]; };
      auto setDown = [&](TreeLinks& t, int value) {
        int x = 0;
        while (x < 3 && t.down[x] >= 0) ++x;
        if (x == 3) fail(StatusCode::kInternal, "rank {} channel {}: tree already has 3 children", rank, c);
        t.down[x] = value;
      };
      if (rank == ttp(node)) {
        if (t0u != -1) tr0.up = t0ct == 0 ? ttc0(t0u) : ttc1(t0u);
        if (t1u != -1) tr1.up = t1ct == 0 ? ttc0(t1u) : ttc1(t1u);
      }
      if (rank == ttc0(node)) {
        if (t0d0 != -1) setDown(tr0, ttp(t0d0));
        if (t1d0 != -1) setDown(tr1, ttp(t1d0));
      }
      if (rank == ttc1(node)) {
        if (t0d1 != -1) setDown(tr0, ttp(t0d1));
        if (t1d1 != -1) setDown(tr1, ttp(t1d1));
      }
    }
  }
  for (int r = 0; r < nRanks; ++r) {
    for (int c = 0; c < nChannels; ++c) {
      ch[r][c].ringPrev = ch[r][c + nChannels].ringPrev = ringPrev[c * nRanks + r];
      ch[r][c].ringNext = ch[r][c + nChannels].ringNext = ringNext[c * nRanks + r];
    }
  }
  for (int c = 0; c < nChannels; ++c)
    for (int r = 0; r < nRanks; ++r) {
      ringPrev[(c + nChannels) * nRanks + r] = ringPrev[c * nRanks + r];
      ringNext[(c + nChannels) * nRanks + r] = ringNext[c * nRanks + r];
    }
  nChannels = std::min(kMaxChannels, nChannels * 2);

  auto copyChannels = [&](int start, int end) {
    int c;
    for (c = start; c < end; ++c) {
      for (int r = 0; r < nRanks; ++r) {
        ringPrev[c * nRanks + r] = ringPrev[(c - start) * nRanks + r];
        ringNext[c * nRanks + r] = ringNext[(c - start) * nRanks + r];
        ch[r][c] = ch[r][c - start];
      }
    }
    return c;
  };
  if (out.collnetEnable) {
    const Graph& cc = out.aligned[kGraphCollnetChain];
    if (cc.bwIntra > cc.bwInter && nRanks > nNodes) nChannels = copyChannels(nChannels, std::min(kMaxChannels, nChannels + nChannels / 2));
  }
  if (out.minCompCap >= 90 && nNodes > 1 && out.aligned[kGraphRing].bwIntra > 45.0f && nChannels < 16)
    nChannels = copyChannels(nChannels, 2 * nChannels);
  nChannels = std::min(cfg.maxNchannels, nChannels);
  nChannels = copyChannels(nChannels, std::max(cfg.minNchannels, 1));
  out.nChannels = nChannels;
  out.collChannels = nChannels;

  // NVLS heads and the trees between them.
  int minHeadNum = INT_MAX;
  for (int n = 0; n < nNodes; ++n) minHeadNum = std::min(minHeadNum, topo[firstRanks[n]].nvlsHeadNum);
  if (!out.nvlsSupport) minHeadNum = 0;
  if (minHeadNum == 0) out.nvlsChannels = 0;
  out.nvls.assign(nRanks, std::vector<NvlsLinks>(2));
  if (minHeadNum > 0) {
    for (int rank = 0; rank < nRanks; ++rank) {
      int node = rankToNode[rank];
      int headRank = -1;
      for (int h = 0; h < minHeadNum; ++h)
        if (topo[firstRanks[node]].nvlsHeads[h] == rank) headRank = h;
      int treeUp[2] = {-1, -1}, treeDown0[2] = {-1, -1}, treeDown1[2] = {-1, -1};
      if (nNodes > 1) {
        int p0, c00, c01, p1, c10, c11, x0 = 0, x1 = 0;
        getDtree(nNodes, node, &p0, &c00, &c01, &x0, &p1, &c10, &c11, &x1);
        for (int h = 0; h < minHeadNum; ++h) {
          auto head = [&](int n) { return topo[firstRanks[n]].nvlsHeads[h]; };
          if (head(node) == rank) {
            treeUp[0] = p0 == -1 ? -1 : head(p0);
            treeDown0[0] = c00 == -1 ? -1 : head(c00);
            treeDown1[0] = c01 == -1 ? -1 : head(c01);
            treeUp[1] = p1 == -1 ? -1 : head(p1);
            treeDown0[1] = c10 == -1 ? -1 : head(c10);
            treeDown1[1] = c11 == -1 ? -1 : head(c11);
            break;
          }
        }
      }
      for (int c = 0; c < 2; ++c) {
        NvlsLinks& nl = out.nvls[rank][c];
        nl.nHeads = minHeadNum;
        nl.headRank = headRank;
        if (nNodes > 1) {
          nl.treeUp = treeUp[c % 2];
          nl.treeDown[0] = nRanks + 1 + headRank;
          int ix = 1;
          if (treeDown0[c % 2] != -1) nl.treeDown[ix++] = treeDown0[c % 2];
          if (treeDown1[c % 2] != -1) nl.treeDown[ix] = treeDown1[c % 2];
        }
      }
    }
  }

  // Rings as NCCL prints them from rank 0, checking each closes over every rank.
  out.rings.assign(nChannels, std::vector<int>(nRanks));
  std::vector<char> found(nRanks);
  for (int c = 0; c < nChannels; ++c) {
    std::fill(found.begin(), found.end(), 0);
    int cur = 0;
    for (int i = 0; i < nRanks; ++i) {
      if (cur < 0 || cur >= nRanks) fail(StatusCode::kInternal, "ring {} is broken at position {}", c, i);
      found[cur] = 1;
      out.rings[c][i] = cur;
      cur = ringNext[c * nRanks + cur];
    }
    if (cur != 0) fail(StatusCode::kInternal, "ring {} does not loop back to rank 0", c);
    for (int r = 0; r < nRanks; ++r)
      if (!found[r]) fail(StatusCode::kInternal, "ring {} does not contain rank {}", c, r);
  }
  out.trees.assign(nRanks, std::vector<TreeLinks>(nChannels));
  for (int r = 0; r < nRanks; ++r)
    for (int c = 0; c < nChannels; ++c) out.trees[r][c] = ch[r][c].tree;

  // Point-to-point channels (ncclTopoComputeP2pChannels).
  int p2pn = std::min(nChannels, cfg.maxP2pNchannels);
  p2pn = std::max(p2pn, cfg.minP2pNchannels);
  int perPeer = pow2Up(p2pPerPeer);
  p2pn = std::min(pow2Up(p2pn), kMaxChannels);
  if (nNodes > 1) {
    while (perPeer * ((nRanks + 7) / 8) > p2pn && perPeer > 1) perPeer /= 2;
  } else {
    perPeer = std::min(p2pn, perPeer);
  }
  out.p2pnChannels = p2pn;
  out.p2pnChannelsPerPeer = perPeer;
  (void)log2i;
  return out;
}

}  // namespace topocoll::search
