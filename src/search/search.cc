// The channel search, rule by rule as NCCL 2.30.7's src/graph/search.cc.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "topocoll/paths/paths.h"
#include "topocoll/search/graph.h"
#include "topocoll/status.h"

namespace topocoll::search {

using topology::Link;
using topology::LinkType;
using topology::Node;
using topology::NodeRef;
using topology::NodeType;
using topology::Path;
using topology::PathType;
using topology::System;

namespace {

constexpr int T(NodeType t) { return static_cast<int>(t); }
constexpr int P(PathType t) { return static_cast<int>(t); }

constexpr int64_t kGlobalTimeout = 1LL << 19;
constexpr int kTimeout = 1 << 14;
constexpr int kTimeoutTree = 1 << 14;
constexpr int kTimeoutSameChannels = 1 << 8;
constexpr int kForcedOrderPci = 1;
constexpr int kForcedOrderReplay = 2;
constexpr int kMaxNvlsArity = 32;
constexpr int kMaxDirectArity = 7;

const float kSpeedIntra[] = {40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0};
const float kSpeedInter[] = {48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                             7.0,  6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};
const float kSm90SpeedIntra[] = {60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0};
const float kSm90SpeedInter[] = {48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                                 15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};
const float kSm100SpeedIntra[] = {90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0};
const float kSm100SpeedInter[] = {96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0,
                                  20.0, 17.5, 15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};

// roundf without the libm call: exact for every float (|x| >= 2^23 is already an integer).
inline float roundHalfAway(float x) {
  if (!(std::fabs(x) < 8388608.0f)) return x;
  float t = static_cast<float>(static_cast<int32_t>(x));  // truncation toward zero, exact
  if (std::fabs(x - t) >= 0.5f) t += x < 0 ? -1.0f : 1.0f;
  return t;
}
// NCCL's SUB_ROUND: keep link bandwidths rounded to 1e-3 so that taking and giving back cancel exactly.
inline void subRound(float& a, float b) { a = roundHalfAway((a - b) * 1000) / 1000; }

// A vector that stays on the stack for the usual node sizes (the search recurses once per GPU and channel).
template <typename T, size_t N>
class SmallVec {
 public:
  void push_back(const T& v) {
    if (size_ < N) inline_[size_] = v;
    else {
      if (heap_.empty()) heap_.assign(inline_.begin(), inline_.end());
      heap_.push_back(v);
    }
    ++size_;
  }
  T& operator[](size_t i) { return size_ <= N ? inline_[i] : heap_[i]; }
  T* begin() { return size_ <= N ? inline_.data() : heap_.data(); }
  T* end() { return begin() + size_; }
  size_t size() const { return size_; }
  void resize(size_t n) {
    if (size_ > N && n <= N) {
      std::copy(heap_.begin(), heap_.begin() + n, inline_.begin());
      heap_.clear();
    }
    if (n > N) {
      if (heap_.empty()) heap_.assign(inline_.begin(), inline_.begin() + std::min(size_, N));
      heap_.resize(n);
    }
    size_ = n;
  }

 private:
  std::array<T, N> inline_;
  std::vector<T> heap_;
  size_t size_ = 0;
};

struct Score {
  int g, startIndex, intraNhops, intraBw, interNhops, interPciBw, interBw;
};

class Searcher {
 public:
  Searcher(System& sys, const Config& cfg) : sys_(sys), cfg_(cfg) { buildHopCache(); }

  // Every path the search follows, flattened once into direct link pointers (the links do not move while a
  // search runs): followPath is the hot loop of the search.
  struct Hop {
    Link* link;
    Link* rev;     // reverse link that is charged too, or null
    float revMul;  // 1/8 for pre-Ampere DEV targets (not from a GPU), 1 for POWER NVLink to the CPU
  };
  struct HopPath {
    std::vector<Hop> hops;
    int type = static_cast<int>(PathType::DIS);
    bool intelPciOverhead = false;
  };
  static int slot(NodeType t) { return t == NodeType::GPU ? 0 : t == NodeType::NVS ? 1 : t == NodeType::NET ? 2 : -1; }
  int maxN_ = 0;
  std::vector<HopPath> hopCache_;
  HopPath& hopPath(NodeType t1, int i1, NodeType t2, int i2) {
    return hopCache_[((static_cast<size_t>(slot(t1)) * maxN_ + i1) * 3 + slot(t2)) * maxN_ + i2];
  }
  void buildHopCache() {
    maxN_ = std::max({sys_.count(NodeType::GPU), sys_.count(NodeType::NVS), sys_.count(NodeType::NET), 1});
    hopCache_.assign(static_cast<size_t>(3) * maxN_ * 3 * maxN_, HopPath{});
    for (NodeType t1 : {NodeType::GPU, NodeType::NVS, NodeType::NET}) {
      for (int i1 = 0; i1 < sys_.count(t1); ++i1) {
        NodeRef start{t1, i1};
        for (NodeType t2 : {NodeType::GPU, NodeType::NVS, NodeType::NET}) {
          const auto& paths = sys_.at(start).paths[T(t2)];
          for (int i2 = 0; i2 < static_cast<int>(paths.size()); ++i2) {
            const Path& path = paths[i2];
            HopPath& hp = hopPath(t1, i1, t2, i2);
            hp.type = P(path.type);
            for (int step = 0; step < path.count(); ++step) {
              const Node& n = sys_.at(sys_.link(path.list[step]).rem);
              if (n.type == NodeType::CPU && path.type == PathType::PHB && t1 == NodeType::GPU &&
                  n.arch == topology::kCpuArchX86 && n.vendor == topology::kCpuVendorIntel)
                hp.intelPciOverhead = true;
            }
            NodeRef node = start;
            for (int step = 0; step < path.count(); ++step) {
              Link& link = sys_.link(path.list[step]);
              Hop h{&link, nullptr, 0.0f};
              const Node& rem = sys_.at(link.rem);
              if (link.rem.type == NodeType::DEV && rem.cudaCompCap < 80 && t1 != NodeType::GPU) {
                h.rev = findRev(node, link.rem, link.type);
                h.revMul = 0.125f;
              }
              if (link.rem.type == NodeType::CPU && rem.arch == topology::kCpuArchPower && link.type == LinkType::NVL) {
                h.rev = findRev(node, link.rem, link.type);
                h.revMul = 1.0f;
              }
              hp.hops.push_back(h);
              node = link.rem;
            }
          }
        }
      }
    }
  }

  // --- Tracing for `plan --explain`: counts only, never a decision. ---
  SearchTrace::Attempt* rec_ = nullptr;
  std::unordered_map<const Link*, int64_t> full_;
  void note(SearchTrace::Refusal r) {
    if (rec_) rec_->refused[r]++;
  }
  void noteType(bool intra, int type) {
    if (!rec_) return;
    rec_->refused[SearchTrace::kPathType]++;
    rec_->typeRefused[intra ? 0 : 1][type]++;
  }
  void noteFull(const HopPath& hp, int step, float bw) {
    if (!rec_) return;
    rec_->refused[SearchTrace::kLinkFull]++;
    const Hop& h = hp.hops[step];
    float fw = h.link->type == LinkType::PCI && hp.intelPciOverhead ? bw * 6 / 5 : bw;
    full_[h.link->bw < fw || !h.rev ? h.link : h.rev]++;
  }
  void endAttempt() {
    if (!rec_) return;
    for (int t = 0; t < topology::kNodeTypes; ++t)
      for (int i = 0; i < sys_.count(static_cast<NodeType>(t)); ++i) {
        const auto& links = sys_.of(static_cast<NodeType>(t))[i].links;
        for (int l = 0; l < static_cast<int>(links.size()); ++l)
          if (auto it = full_.find(&links[l]); it != full_.end())
            rec_->fullLinks.push_back({{{static_cast<NodeType>(t), i}, l}, it->second});
      }
    std::stable_sort(rec_->fullLinks.begin(), rec_->fullLinks.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    full_.clear();
    rec_ = nullptr;
  }

  int followHops(const HopPath& hp, int maxSteps, float bw) {
    const float pciBw = hp.intelPciOverhead ? bw * 6 / 5 : bw;
    for (int step = 0; step < maxSteps; ++step) {
      const Hop& h = hp.hops[step];
      float fwBw = h.link->type == LinkType::PCI ? pciBw : bw;
      float revBw = h.rev ? fwBw * h.revMul : 0.0f;
      if (h.link->bw < fwBw || (revBw != 0 && h.rev->bw < revBw)) return step;
      subRound(h.link->bw, fwBw);
      if (revBw != 0) subRound(h.rev->bw, revBw);
    }
    return maxSteps;
  }

  int ngpus() const { return sys_.count(NodeType::GPU); }

  Link* findRev(NodeRef node1, NodeRef node2, LinkType type) {
    for (auto& l : sys_.at(node2).links)
      if (l.rem == node1 && l.type == type) return &l;
    fail(StatusCode::kInternal, "no reverse link");
  }

  // ncclTopoFollowPath. type1 == -1 means "start here" (no link accounting).
  bool follow(Graph& g, int type1, int index1, NodeType type2, int index2, float mult) {
    if (type1 == -1) return true;
    NodeRef n1{static_cast<NodeType>(type1), index1};
    const HopPath& hp = hopPath(n1.type, index1, type2, index2);
    bool intra = (n1.type == NodeType::GPU || n1.type == NodeType::NVS) &&
                 (type2 == NodeType::GPU || type2 == NodeType::NVS);
    float bw = intra ? g.bwIntra : g.bwInter;
    int type = intra ? g.typeIntra : g.typeInter;
    if (hp.type >= P(PathType::DIS)) return false;
    if (mult == 1 && hp.type > type) return noteType(intra, hp.type), false;
    if (mult == 1 &&
        (g.pattern == kPatternBalancedTree || g.pattern == kPatternTree || g.pattern == kPatternSplitTree) &&
        hopPath(type2, index2, n1.type, index1).type > type)
      return noteType(intra, hopPath(type2, index2, n1.type, index1).type), false;
    bw *= mult;
    const int count = static_cast<int>(hp.hops.size());
    int step = followHops(hp, count, bw);
    if (step < count) {
      if (mult > 0) noteFull(hp, step, bw);
      followHops(hp, step, -bw);
      return false;
    }
    g.nHops = static_cast<int>(static_cast<float>(g.nHops) + mult * static_cast<float>(count));
    return true;
  }

  // The GPU's PCI uplink in both directions (the search consumes their bandwidth), found once per GPU.
  std::vector<std::pair<const Link*, const Link*>> pciLinks_;
  int gpuPciBw(int gpu) {
    if (pciLinks_.empty()) {
      pciLinks_.assign(ngpus(), {nullptr, nullptr});
      for (int g = 0; g < ngpus(); ++g) pciLinks_[g] = findPciLinks(g);
    }
    auto [up, down] = pciLinks_[gpu];
    if (!up) return -1;
    return static_cast<int>(std::min(up->bw, down->bw));
  }
  std::pair<const Link*, const Link*> findPciLinks(int gpu) {
    int dev = sys_.of(NodeType::GPU)[gpu].parent;
    NodeRef devRef{NodeType::DEV, dev};
    for (auto& gl : sys_.at(devRef).links) {
      if (gl.type != LinkType::PCI) continue;
      for (auto& pl : sys_.at(gl.rem).links) {
        if (!(pl.rem == devRef)) continue;
        return {&gl, &pl};
      }
    }
    return {nullptr, nullptr};
  }

  int netIndex(int64_t id) {
    int n = sys_.indexOf(NodeType::NET, id);
    if (n < 0) fail(StatusCode::kInternal, "could not find net id {:x}", id);
    return n;
  }

  using NextList = SmallVec<int, 32>;
  void nextGpuSort(Graph& g, int gpu, NextList& next, int sortNet) {
    const uint64_t flag = 1ULL << g.nChannels;
    int n = ngpus();
    if (sys_.count(NodeType::NVS)) {
      // NVSwitches prefer a limited set of peers: NCCL sorts every candidate, then keeps only the neighbours it
      // moved to the front. The result is those neighbours, so compute them directly.
      const auto& paths = sys_.of(NodeType::GPU)[gpu].paths[T(NodeType::GPU)];
      auto candidate = [&](int p) {
        return p != gpu && paths[p].count() != 0 && !(sys_.of(NodeType::GPU)[p].used & flag);
      };
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
      return;
    }
    // Without a NET to sort by, the scores are static (paths do not change during a search), so each candidate
    // order is sorted once and filtered by the `used` flags afterwards: filtering a sorted list gives the sorted
    // filtered list. Sorting by NET uses the GPUs' remaining PCI bandwidth, which the search changes: sort anew.
    int netIdx = sortNet ? netIndex(g.inter[g.nChannels * 2]) : -1;
    SmallVec<Score, 32> fresh;
    SmallVec<const Score*, 32> scores;
    if (netIdx >= 0) {
      scoreCandidates(gpu, netIdx, fresh);
      for (Score& sc : fresh)
        if (!(sys_.of(NodeType::GPU)[sc.g].used & flag)) scores.push_back(&sc);
    } else {
      for (const Score& sc : sortedCandidates(gpu))
        if (!(sys_.of(NodeType::GPU)[sc.g].used & flag)) scores.push_back(&sc);
    }
    int count = static_cast<int>(scores.size());
    next.resize(count);
    bool sameIntra = true;
    for (int i = 1; i < count; ++i)
      if (scores[i]->intraBw != scores[0]->intraBw || scores[i]->intraNhops != scores[0]->intraNhops) sameIntra = false;
    for (int i = 0; i < count; ++i) next[i] = (sortNet == -1 && sameIntra) ? scores[count - 1 - i]->g : scores[i]->g;
  }

  std::vector<std::vector<Score>> sortCache_;
  std::vector<char> sortCached_;
  const std::vector<Score>& sortedCandidates(int gpu) {
    if (sortCache_.empty()) {
      sortCache_.resize(ngpus());
      sortCached_.assign(sortCache_.size(), 0);
    }
    if (!sortCached_[gpu]) {
      SmallVec<Score, 32> tmp;
      scoreCandidates(gpu, -1, tmp);
      sortCache_[gpu].assign(tmp.begin(), tmp.end());
      sortCached_[gpu] = 1;
    }
    return sortCache_[gpu];
  }

  void scoreCandidates(int gpu, int netIdx, SmallVec<Score, 32>& scores) {
    int n = ngpus();
    const auto& paths = sys_.of(NodeType::GPU)[gpu].paths[T(NodeType::GPU)];
    const std::vector<Path>* netPaths = netIdx >= 0 ? &sys_.of(NodeType::NET)[netIdx].paths[T(NodeType::GPU)] : nullptr;
    for (int i = 1; i < n; ++i) {
      int p = (gpu + i) % n;
      if (paths[p].count() == 0) continue;
      Score sc{p, i, paths[p].count(), static_cast<int>(paths[p].bw), 0, 0, 0};
      if (netPaths) {
        sc.interNhops = (*netPaths)[p].count();
        sc.interPciBw = gpuPciBw(p);
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

  int replayGetGpu(const Graph& g, int step) {
    int nextRank = g.intra[(g.nChannels - 1) * ngpus() + step + 1];
    int idx = sys_.gpuIndexOfRank(nextRank);
    if (idx < 0) fail(StatusCode::kInternal, "replay: rank {} not found", nextRank);
    return idx;
  }

  void tryGpu(Graph& g, Graph& save, int step, int backToNet, int backToFirstRank, int forcedOrder, int* time,
              int type, int index, int gi) {
    const uint64_t flag = 1ULL << g.nChannels;
    if (!follow(g, type, index, NodeType::GPU, gi, 1)) return;
    Node& gpu = sys_.of(NodeType::GPU)[gi];
    gpu.used ^= flag;
    recGpu(g, save, gi, step, backToNet, backToFirstRank, forcedOrder, time);
    sys_.of(NodeType::GPU)[gi].used ^= flag;
    follow(g, type, index, NodeType::GPU, gi, -1);
  }

  void tryCollnetDirect(Graph& g, Graph& save, int gi, int* time) {
    int n = ngpus();
    int fwd = 0, bwd = 0;
    float mul = 1.0f / static_cast<float>(n - 1);
    bool ok = true;
    do {
      ok = follow(g, T(NodeType::GPU), gi, NodeType::GPU, fwd, mul);
    } while (ok && ++fwd < n);
    if (ok) {
      do {
        ok = follow(g, T(NodeType::GPU), bwd, NodeType::GPU, gi, mul);
      } while (ok && ++bwd < n);
      if (ok) {
        int step = 1;
        for (int idx = 0; idx < n; ++idx) {
          if (idx != gi) g.intra[g.nChannels * n + step++] = sys_.of(NodeType::GPU)[idx].rank;
        }
        recGpu(g, save, -1, n, -1, -1, 0, time);
      }
      while (bwd) {
        --bwd;
        follow(g, T(NodeType::GPU), bwd, NodeType::GPU, gi, -mul);
      }
    }
    while (fwd) {
      --fwd;
      follow(g, T(NodeType::GPU), gi, NodeType::GPU, fwd, -mul);
    }
  }

  void tryNvls(Graph& g, Graph& save, int gi, int* time) {
    int n = ngpus();
    int d0 = 0;
    bool ok;
    do {
      ok = follow(g, T(NodeType::NVS), 0, NodeType::GPU, d0, d0 == gi ? 2 : 1);
      d0++;
    } while (ok && d0 < n);
    if (!ok) {
      d0--;
    } else {
      int d1 = 0;
      do {
        ok = follow(g, T(NodeType::GPU), d1, NodeType::NVS, 0, d1 == gi ? 2 : 1);
        d1++;
      } while (ok && d1 < n);
      if (!ok) d1--;
      else recGpu(g, save, -1, n, -1, -1, 0, time);
      while (d1) {
        d1--;
        follow(g, T(NodeType::GPU), d1, NodeType::NVS, 0, d1 == gi ? -2 : -1);
      }
    }
    while (d0) {
      d0--;
      follow(g, T(NodeType::NVS), 0, NodeType::GPU, d0, d0 == gi ? -2 : -1);
    }
  }

  bool compareGraphs(const Graph& g, const Graph& ref) {
    if (g.nChannels < g.minChannels) return false;
    if (g.pattern == kPatternNvls) {
      bool copy = false;
      if (g.nChannels > ref.nChannels && g.nChannels <= ngpus()) copy = true;
      if (static_cast<float>(g.nChannels) * g.bwInter > static_cast<float>(ref.nChannels) * ref.bwInter) copy = true;
      return copy;
    }
    float a = static_cast<float>(g.nChannels) * g.bwIntra, b = static_cast<float>(ref.nChannels) * ref.bwIntra;
    if (a > b) return true;
    if (a < b) return false;
    return g.pattern == ref.pattern && g.crossNic == ref.crossNic && g.nHops < ref.nHops;
  }

  std::vector<int> prefNetsChannelFirst(int gpu) {
    std::vector<int> nets;
    for (int gi = 0; gi < ngpus(); ++gi) {
      if (gpu != -1 && gpu != gi) continue;
      std::vector<int> local;
      int rank = sys_.of(NodeType::GPU)[gi].rank;
      for (int c = 0; c < kMaxChannels; ++c) {
        int n = netIndex(paths::localNet(sys_, cfg_, rank, c));
        if (!local.empty() && n == local[0]) break;
        local.push_back(n);
      }
      for (int n : local)
        if (std::find(nets.begin(), nets.end(), n) == nets.end()) nets.push_back(n);
    }
    return nets;
  }

  std::vector<int> prefNetsGpuFirst(int gpu) {
    int nG = gpu == -1 ? ngpus() : 1;
    std::vector<int> ids(nG), firstNets(nG, -1);
    for (int i = 0; i < nG; ++i) ids[i] = gpu == -1 ? i : gpu;
    int remaining = nG;
    std::vector<int> nets;
    for (int c = 0; c < kMaxChannels && remaining > 0; ++c) {
      for (int i = 0; i < nG; ++i) {
        if (ids[i] == -1) continue;
        int n = netIndex(paths::localNet(sys_, cfg_, sys_.of(NodeType::GPU)[ids[i]].rank, c));
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

  // The preferred NET lists only depend on paths, which do not change during a search: compute each once.
  const std::vector<int>& selectNets(int typeInter, int gpu) {
    int key = (typeInter + 1) * 1024 + (gpu + 1);
    auto it = netCache_.find(key);
    if (it != netCache_.end()) return it->second;
    return netCache_.emplace(key, selectNetsUncached(typeInter, gpu)).first->second;
  }

  std::vector<int> selectNetsUncached(int typeInter, int gpu) {
    std::vector<int> nets = sys_.hostHashes.size() > 1 ? prefNetsGpuFirst(gpu) : prefNetsChannelFirst(gpu);
    int maxDevCount = 640;
    if (cfg_.netDevsPolicy == 2) {
      maxDevCount = cfg_.netDevsPolicyMax * (gpu == -1 ? ngpus() : 1);
      if (static_cast<int>(nets.size()) >= maxDevCount) return nets;
    }
    for (int t = 0; t <= typeInter; ++t) {
      for (int gi = 0; gi < ngpus(); ++gi) {
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

  bool checkNet(const Graph& g, const Node& startNet, int n, int step) {
    const Node& net = sys_.of(NodeType::NET)[n];
    if (net.planeId != topology::kUndef && startNet.planeId != topology::kUndef && net.planeId != startNet.planeId)
      return note(SearchTrace::kNicPlane), false;
    if (g.pattern == kPatternTree && net.id != startNet.id) return note(SearchTrace::kTreeNic), false;
    if (g.pattern == kPatternRing && g.crossNic == 2) {
      if ((g.nChannels & 1) && net.id != g.inter[(g.nChannels - 1) * 2]) return note(SearchTrace::kNicPair), false;
    } else if (g.crossNic == 0) {
      if (net.railId != topology::kUndef && startNet.railId != topology::kUndef) {
        if (net.railId != startNet.railId) return note(SearchTrace::kNicRail), false;
      } else if (net.asic != startNet.asic || net.port != startNet.port) {
        return note(SearchTrace::kNicRail), false;
      }
    }
    if (g.pattern == kPatternBalancedTree && step != 0 && net.id != g.inter[g.nChannels * 2 + 1])
      return note(SearchTrace::kTreeNic), false;
    return true;
  }

  void recGpu(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
              int* time) {
    if (*time <= 0) return;
    (*time)--;
    ++steps_;
    int n = ngpus();
    if (step == n) {
      g.nChannels++;
      if (compareGraphs(g, save)) {
        copyGraph(save, g);
        if (g.nChannels == g.maxChannels) *time = -1;
      }
      if (g.nChannels < g.maxChannels) searchRec(g, save, time);
      g.nChannels--;
      return;
    }
    g.intra[g.nChannels * n + step] = sys_.of(NodeType::GPU)[gi].rank;
    if (step == backToNet) {
      if (sys_.inter) {
        int startIdx = netIndex(g.inter[g.nChannels * 2]);
        const std::vector<int>& nets = selectNets(g.typeInter, gi);
        for (int n2 : nets) {
          if (!checkNet(g, sys_.of(NodeType::NET)[startIdx], n2, step)) continue;
          int nextBackToNet = -1;
          float save_bw = g.bwInter;
          if (g.pattern == kPatternBalancedTree) {
            if (step == 0) nextBackToNet = 1;
            g.bwInter /= 2;
          }
          bool ok = follow(g, T(NodeType::GPU), gi, NodeType::NET, n2, 1);
          g.bwInter = save_bw;
          if (ok) {
            g.inter[g.nChannels * 2 + 1] = sys_.of(NodeType::NET)[n2].id;
            recGpu(g, save, gi, step, nextBackToNet, backToFirstRank, forcedOrder, time);
            if (g.pattern == kPatternBalancedTree) g.bwInter /= 2;
            follow(g, T(NodeType::GPU), gi, NodeType::NET, n2, -1);
            g.bwInter = save_bw;
          }
        }
      }
    } else if (g.pattern == kPatternNvls) {
      tryNvls(g, save, gi, time);
    } else if (g.pattern == kPatternCollnetDirect) {
      tryCollnetDirect(g, save, gi, time);
    } else if (step < n - 1) {
      NextList next;
      if (forcedOrder == kForcedOrderPci) {
        next.push_back(step + 1);
      } else if (forcedOrder == kForcedOrderReplay) {
        next.push_back(replayGetGpu(g, step));
      } else {
        nextGpuSort(g, gi, next, backToNet == -1 ? 0 : backToNet == step + 1 ? 1 : -1);
      }
      for (size_t i = 0; i < next.size(); ++i)
        tryGpu(g, save, step + 1, backToNet, backToFirstRank, forcedOrder, time, T(NodeType::GPU), gi, next[i]);
    } else if (step == backToFirstRank) {
      int p = sys_.gpuIndexOfRank(g.intra[g.nChannels * n]);
      if (follow(g, T(NodeType::GPU), gi, NodeType::GPU, p, 1)) {
        recGpu(g, save, p, step + 1, backToNet, -1, forcedOrder, time);
        follow(g, T(NodeType::GPU), gi, NodeType::GPU, p, -1);
      }
    } else {
      recGpu(g, save, gi, n, -1, -1, forcedOrder, time);
    }
  }

  void recNet(Graph& g, Graph& save, int backToNet, int backToFirstRank, int* time) {
    const int bw = static_cast<int>(g.bwInter);
    const std::vector<int>& nets = selectNets(g.typeInter, -1);
    int netCount = static_cast<int>(nets.size());
    bool graphFound = false;
    for (int i = 0; i < netCount; ++i) {
      if ((g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect) && graphFound) break;
      int n = nets[(g.nChannels + i) % netCount];
      Node& net = sys_.of(NodeType::NET)[n];
      if (g.collNet && net.collSupport == 0) continue;
      if (net.bw < bw) {
        note(SearchTrace::kNicSpeed);
        continue;
      }
      if (g.pattern == kPatternRing && g.crossNic == 2 && (g.nChannels & 1) &&
          net.id != g.inter[(g.nChannels - 1) * 2 + 1]) {
        note(SearchTrace::kNicPair);
        continue;
      }
      g.inter[g.nChannels * 2] = net.id;
      g.latencyInter = net.latency;
      const uint64_t asic = net.asic;
      const int port = net.port;
      for (auto& other : sys_.of(NodeType::NET))
        if (other.asic == asic && other.port == port) other.bw -= bw;
      if (g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect) {
        if (g.nChannels < netCount) {
          int gpu = sys_.of(NodeType::NET)[n].localGpu;
          if (gpu != -1) {
            bool dup = false;
            for (int gc = 0; gc < g.nChannels; ++gc)
              if (g.intra[gc * ngpus()] == sys_.of(NodeType::GPU)[gpu].rank) dup = true;
            if (!dup) {
              tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, T(NodeType::NET), n, gpu);
              graphFound = true;
            }
          }
        }
      } else {
        if (g.nChannels > 0 && g.sameChannels == 1) {
          int gi = replayGetGpu(g, -1);
          tryGpu(g, save, 0, backToNet, backToFirstRank, kForcedOrderReplay, time, T(NodeType::NET), n, gi);
        } else {
          if (g.nChannels == 0 && sys_.count(NodeType::NVS) == 0) {
            int t = 1 << 10;
            tryGpu(g, save, 0, backToNet, backToFirstRank, kForcedOrderPci, &t, T(NodeType::NET), n, 0);
            if (t == -1) *time = -1;
          }
          int localGpu = sys_.of(NodeType::NET)[n].localGpu;
          if (localGpu != -1)
            tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, T(NodeType::NET), n, localGpu);
          PathType pathType = PathType::DIS;
          std::vector<int> locals = paths::getLocal(sys_, NodeType::NET, n, NodeType::GPU, &pathType);
          // NCCL skips this NIC here without giving its bandwidth back; kept for fidelity.
          if (pathType == PathType::DIS) continue;
          for (int lg : locals) {
            if (lg == localGpu) continue;
            tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, T(NodeType::NET), n, lg);
          }
        }
      }
      for (auto& other : sys_.of(NodeType::NET))
        if (other.asic == asic && other.port == port) other.bw += bw;
    }
  }

  void searchParams(int pattern, int* backToNet, int* backToFirstRank) {
    int n = ngpus();
    if (sys_.inter) {
      *backToNet = pattern == kPatternRing ? n - 1 : pattern == kPatternSplitTree ? 1 : 0;
      *backToFirstRank = -1;
    } else {
      *backToNet = -1;
      *backToFirstRank = pattern == kPatternRing ? n - 1 : -1;
    }
  }

  void searchRec(Graph& g, Graph& save, int* time) {
    int backToNet, backToFirstRank;
    searchParams(g.pattern, &backToNet, &backToFirstRank);
    if (sys_.inter) {
      recNet(g, save, backToNet, backToFirstRank, time);
      return;
    }
    if (g.pattern == kPatternNvls) {
      tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, -1, -1, g.nChannels);
      return;
    }
    if (g.nChannels == 0) {
      tryGpu(g, save, 0, backToNet, backToFirstRank, kForcedOrderPci, time, -1, -1, 0);
    } else {
      int gi = replayGetGpu(g, -1);
      tryGpu(g, save, 0, backToNet, backToFirstRank, kForcedOrderReplay, time, -1, -1, gi);
    }
    if (g.sameChannels == 0 || g.nChannels == 0) {
      for (int gi = 0; gi < ngpus(); ++gi) tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, -1, -1, gi);
    }
  }

  static void copyGraph(Graph& dst, const Graph& src) {
    // Only the search state; diagnostics stay with the destination.
    double ms = dst.searchMs;
    bool to = dst.timedOut;
    int st = dst.searchSteps;
    dst = src;
    dst.searchMs = ms;
    dst.timedOut = to;
    dst.searchSteps = st;
  }

  long steps_ = 0;

 private:
  std::unordered_map<int, std::vector<int>> netCache_;
  System& sys_;
  const Config& cfg_;
};

int ccMinOf(const System& sys) {
  int mn = 1 << 30;
  for (auto& d : sys.of(NodeType::DEV)) mn = std::min(mn, d.cudaCompCap);
  if (sys.of(NodeType::DEV).empty()) fail(StatusCode::kInvalidArgument, "the topology has no GPU");
  return mn;
}

bool splitNvLink(const System& sys) {
  int n = sys.count(NodeType::GPU);
  std::vector<int> domain(n), count(n, 0);
  for (int g = 0; g < n; ++g) domain[g] = g;
  for (int g = 0; g < n; ++g)
    for (int p = g + 1; p < n; ++p)
      if (sys.of(NodeType::GPU)[g].paths[T(NodeType::GPU)][p].type == PathType::NVL) domain[p] = domain[g];
  for (int g = 0; g < n; ++g) count[domain[g]]++;
  int domains = 0;
  for (int g = 0; g < n; ++g)
    if (count[g] > 1) ++domains;
  return domains == 2;
}

}  // namespace

std::vector<float> speedArray(int ccMin, bool inter) {
  auto v = [](const auto& a) { return std::vector<float>(std::begin(a), std::end(a)); };
  if (inter) return ccMin >= 100 ? v(kSm100SpeedInter) : ccMin >= 90 ? v(kSm90SpeedInter) : v(kSpeedInter);
  return ccMin >= 100 ? v(kSm100SpeedIntra) : ccMin >= 90 ? v(kSm90SpeedIntra) : v(kSpeedIntra);
}

void dupChannels(Graph& graph, int ccMin, int ngpus) {
  if (graph.nChannels == 0) return;
  if (graph.pattern == kPatternNvls) return;
  if (graph.bwIntra < 25.0f) return;
  if (ccMin > 80 && graph.bwIntra < 50.0f && graph.nChannels > 4) return;
  int dup = std::min(graph.nChannels * 2, graph.maxChannels);
  for (int i = 0; i < (dup - graph.nChannels) * ngpus; ++i) graph.intra[graph.nChannels * ngpus + i] = graph.intra[i];
  for (int i = 0; i < (dup - graph.nChannels) * 2; ++i) graph.inter[graph.nChannels * 2 + i] = graph.inter[i];
  int factor = (dup + graph.nChannels - 1) / graph.nChannels;
  graph.bwIntra /= factor;
  graph.bwInter /= factor;
  graph.nChannels = dup;
}

void compute(System& sys, const Config& cfg, Graph& graph, SearchTrace* trace) {
  auto t0 = std::chrono::steady_clock::now();
  const int ccMin = ccMinOf(sys);
  const int ngpus = sys.count(NodeType::GPU);
  const int ndevs = sys.count(NodeType::DEV);
  graph.intra.assign(static_cast<size_t>(kMaxChannels) * std::max(ngpus, 1), 0);
  graph.inter.assign(kMaxChannels * 2, 0);
  int crossNic = (sys.count(NodeType::NET) > 1) && (graph.pattern == kPatternRing ||
                                                    graph.pattern == kPatternBalancedTree ||
                                                    graph.pattern == kPatternSplitTree)
                     ? cfg.crossNic
                     : 0;
  graph.crossNic = crossNic == 1 ? 1 : 0;
  graph.bwIntra = graph.bwInter = 0;
  graph.latencyInter = 0;
  int minTypeIntra = P(PathType::LOC), minTypeInter = P(PathType::PIX);
  int maxTypeIntra = P(PathType::SYS), maxTypeInter = P(PathType::SYS);
  if (ngpus > 1) {
    minTypeIntra = paths::gpuMinPath(sys, NodeType::GPU);
    maxTypeIntra = paths::gpuMaxPath(sys, NodeType::GPU);
  }
  if (sys.inter) {
    minTypeInter = paths::gpuMinPath(sys, NodeType::NET);
    maxTypeInter = paths::gpuMaxPath(sys, NodeType::NET);
    maxTypeIntra = maxTypeInter;
  }
  if (ccMin < 90) maxTypeInter = P(PathType::SYS);
  graph.typeIntra = minTypeIntra;
  graph.typeInter = minTypeInter;
  graph.nChannels = 0;
  const int trySameChannels = graph.pattern == kPatternNvls ? 0 : 1;
  graph.sameChannels = trySameChannels;
  const Node& cpu0 = sys.of(NodeType::CPU)[0];

  if (!cfg.graphFile.empty()) {
    auto doc = topology::loadXmlFile(cfg.graphFile);
    if (graphFromXml(doc, sys, cfg, graph) > 0 && graph.nChannels > 0) {
      graph.fromFile = true;
      return;
    }
  }

  auto finish = [&]() {
    graph.searchMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  if (graph.pattern == kPatternNvls && (sys.count(NodeType::NVS) == 0 || ccMin < 90)) return finish();
  if (graph.pattern == kPatternNvls) graph.maxChannels = std::min(kMaxNvlsArity, ngpus);
  if (graph.pattern == kPatternCollnetDirect) graph.maxChannels = std::min(kMaxDirectArity + 1, ngpus);
  if (ngpus == 1 && graph.pattern != kPatternRing) graph.pattern = kPatternTree;
  if (sys.inter == 0 && graph.pattern == kPatternNvls) graph.minChannels = graph.maxChannels;
  if (graph.pattern == kPatternRing && splitNvLink(sys) && graph.maxChannels >= 2 && graph.minChannels == 1)
    graph.minChannels = 2;

  Graph tmp = graph;
  const float* speedArray;
  int nspeeds;
  if (sys.inter == 0) {
    speedArray = ccMin >= 100 ? kSm100SpeedIntra : ccMin >= 90 ? kSm90SpeedIntra : kSpeedIntra;
    nspeeds = ccMin >= 100 ? std::size(kSm100SpeedIntra) : ccMin >= 90 ? std::size(kSm90SpeedIntra) : std::size(kSpeedIntra);
  } else {
    speedArray = ccMin >= 100 ? kSm100SpeedInter : ccMin >= 90 ? kSm90SpeedInter : kSpeedInter;
    nspeeds = ccMin >= 100 ? std::size(kSm100SpeedInter) : ccMin >= 90 ? std::size(kSm90SpeedInter) : std::size(kSpeedInter);
  }
  int pass = 1;
  int speedIndex = 0;
  float maxBw = sys.maxBw;
  float totalBw = sys.totalBw;
  if (ndevs > 1 && graph.pattern != kPatternRing) totalBw = static_cast<float>(totalBw * (ndevs * 1.0 / (ndevs - 1)));
  while ((speedArray[speedIndex] > maxBw || speedArray[speedIndex] * graph.minChannels > totalBw) &&
         speedIndex < nspeeds - 1)
    speedIndex++;
  tmp.bwIntra = tmp.bwInter = speedArray[speedIndex];
  int64_t globalTimeout = kGlobalTimeout * cfg.searchTimeoutScale;
  Searcher s(sys, cfg);
  int time = 0;

  while (true) {
    // search:
    time = (tmp.sameChannels ? kTimeoutSameChannels : tmp.pattern == kPatternTree ? kTimeoutTree : kTimeout) *
           cfg.searchTimeoutScale;
    tmp.nChannels = 0;
    globalTimeout -= time;
    if (trace) {
      SearchTrace::Attempt& a = trace->attempts.emplace_back();
      a.bwIntra = tmp.bwIntra;
      a.bwInter = tmp.bwInter;
      a.typeIntra = tmp.typeIntra;
      a.typeInter = tmp.typeInter;
      a.sameChannels = tmp.sameChannels;
      a.crossNic = tmp.crossNic;
      a.pattern = tmp.pattern;
      s.rec_ = &a;
    }
    s.searchRec(tmp, graph, &time);
    if (time == 0) graph.timedOut = true;
    if (trace) {
      auto& a = trace->attempts.back();
      a.channels = graph.nChannels;
      a.bestIntra = graph.bwIntra;
      a.bestInter = graph.bwInter;
      a.timedOut = time == 0;
      s.endAttempt();
    }
    bool done = time == -1 || static_cast<float>(graph.nChannels) * graph.bwInter >= sys.totalBw;
    if (!done && pass == 1) {
      if (tmp.sameChannels == 1 && !(cpu0.arch == topology::kCpuArchX86 && cpu0.vendor == topology::kCpuVendorAmd &&
                                     tmp.typeIntra == P(PathType::SYS))) {
        tmp.sameChannels = 0;
        continue;
      }
      tmp.sameChannels = trySameChannels;
      if (time != -1) globalTimeout += time;
      else globalTimeout = kGlobalTimeout;
      if (globalTimeout < 0 && graph.nChannels) {
        if (trace) trace->globalTimeout = true;
        done = true;
      } else {
        if (ccMin >= 90 && tmp.pattern == kPatternBalancedTree) {
          tmp.pattern = kPatternTree;
          continue;
        }
        tmp.pattern = graph.pattern;
        int maxIntra = sys.inter ? tmp.typeInter : maxTypeIntra;
        if (tmp.typeIntra < maxIntra && (graph.nChannels == 0 || tmp.typeIntra < graph.typeIntra)) {
          tmp.typeIntra += 1;
          if (tmp.typeIntra < P(PathType::DIS)) continue;
        }
        tmp.typeIntra = minTypeIntra;
        if (sys.inter && tmp.typeInter < maxTypeInter &&
            (graph.nChannels == 0 || tmp.typeInter < graph.typeInter || tmp.typeInter < P(PathType::PXN))) {
          tmp.typeInter += 1;
          if (tmp.typeInter < P(PathType::DIS)) continue;
        }
        tmp.typeInter = minTypeInter;
        if (crossNic == 2 && tmp.crossNic == 0 &&
            (graph.pattern == kPatternRing || graph.pattern == kPatternBalancedTree)) {
          tmp.crossNic = 2;
          continue;
        }
        tmp.crossNic = crossNic == 1 ? 1 : 0;
        if (speedIndex < nspeeds - 1 &&
            (graph.nChannels == 0 || speedArray[speedIndex + 1] / graph.bwInter > .49)) {
          tmp.bwInter = tmp.bwIntra = speedArray[++speedIndex];
          continue;
        }
        speedIndex = 0;
        while (speedArray[speedIndex] > maxBw && speedIndex < nspeeds - 1) speedIndex++;
        tmp.bwIntra = tmp.bwInter = speedArray[speedIndex];
      }
    }
    // done:
    if (pass == 1) {
      time = -1;
      dupChannels(graph, ccMin, ngpus);
      tmp = graph;
      speedIndex = 0;
      while (speedArray[speedIndex] > graph.bwInter && speedIndex < nspeeds - 1) speedIndex++;
      tmp.bwIntra = tmp.bwInter = speedArray[speedIndex];
      tmp.minChannels = graph.nChannels;
      pass = 2;
    }
    if (pass == 2) {
      if (time != 0 && speedIndex > 0) {
        if (graph.pattern == kPatternRing) {
          tmp.bwIntra = tmp.bwInter = speedArray[--speedIndex];
          continue;
        } else if (graph.pattern == kPatternNvls && tmp.bwInter == graph.bwInter && tmp.bwInter < tmp.bwIntra * 2) {
          tmp.minChannels = tmp.maxChannels = graph.nChannels;
          tmp.bwInter = speedArray[--speedIndex];
          continue;
        } else if (tmp.bwIntra == graph.bwIntra && tmp.bwIntra < tmp.bwInter * 2) {
          tmp.bwIntra = speedArray[--speedIndex];
          continue;
        }
      }
      time = -1;
      tmp = graph;
    }
    break;
  }

  if (graph.nChannels == 0 && graph.collNet == 0 && graph.pattern != kPatternNvls) {
    for (int i = 0; i < ngpus; ++i) graph.intra[i] = sys.of(NodeType::GPU)[i].rank;
    graph.bwIntra = 0.1f;
    graph.typeIntra = P(PathType::SYS);
    auto first = [&](int gpu) -> int64_t {
      // ncclTopoSelectNets with typeInter -1: the GPU's preferred NETs only.
      Searcher s2(sys, cfg);
      auto nets = sys.count(NodeType::NET) ? s2.selectNets(-1, gpu) : std::vector<int>{};
      return nets.empty() ? -1 : sys.of(NodeType::NET)[nets[0]].id;
    };
    graph.inter[0] = first(0);
    graph.inter[1] = first(ngpus - 1);
    if (graph.inter[0] != -1 && graph.inter[1] != -1) {
      graph.bwInter = 0.1f;
      graph.typeInter = P(PathType::SYS);
    } else {
      graph.inter[0] = graph.inter[1] = -1;
      graph.bwInter = 0;
      graph.typeInter = P(PathType::DIS);
    }
    graph.nChannels = 1;
  }
  graph.searchSteps = static_cast<int>(s.steps_);
  finish();
}

std::string describe(const System& sys, const Graph& g) {
  std::string out = fmt::format("Pattern {}, crossNic {}, nChannels {}, bw {:f}/{:f}, type {}/{}, sameChannels {}\n",
                                g.pattern, g.crossNic, g.nChannels, g.bwIntra, g.bwInter,
                                to_string(static_cast<PathType>(g.typeIntra)),
                                to_string(static_cast<PathType>(g.typeInter)), g.sameChannels);
  int n = sys.count(NodeType::GPU);
  for (int c = 0; c < g.nChannels; ++c) {
    out += fmt::format("{:2d} :", c);
    if (sys.inter) out += fmt::format(" NET/{:x}-{:x}", topology::systemIdOf(g.inter[2 * c]), topology::localIdOf(g.inter[2 * c]));
    for (int i = 0; i < n; ++i) {
      int gi = sys.gpuIndexOfRank(g.intra[n * c + i]);
      int64_t id = gi >= 0 ? sys.of(NodeType::GPU)[gi].id : 0;
      out += fmt::format(" GPU/{:x}-{:x}", topology::systemIdOf(id), topology::localIdOf(id));
      if (g.id == 3) break;
    }
    if (sys.inter)
      out += fmt::format(" NET/{:x}-{:x}", topology::systemIdOf(g.inter[2 * c + 1]), topology::localIdOf(g.inter[2 * c + 1]));
    out += "\n";
  }
  return out;
}

}  // namespace topocoll::search
