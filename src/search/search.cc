// The channel search. Follows NCCL 2.30.7 src/graph/search.cc (ncclTopoCompute, ncclTopoSearchRec* and their
// helpers, ncclTopoDupChannels) (Apache-2.0) rule by rule, with a memo of sub-searches that changes the work, not
// the result (search_memo.h).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "hop_cache.h"
#include "search_common.h"
#include "search_memo.h"
#include "search_order.h"
#include "search_trace.h"
#include "speed_walks.h"
#include "topocoll/paths/paths.h"
#include "topocoll/search/graph.h"
#include "topocoll/status.h"

namespace topocoll::search {

using namespace detail;  // the search's parts, in the private headers next to this file

namespace {

constexpr int64_t kGlobalTimeout = 1LL << 19;
constexpr int kTimeout = 1 << 14;
constexpr int kTimeoutTree = 1 << 14;
constexpr int kTimeoutSameChannels = 1 << 8;
constexpr int kMaxNvlsArity = 32;   // NCCL_MAX_NVLS_ARITY
constexpr int kMaxDirectArity = 7;  // NCCL_MAX_DIRECT_ARITY

const float kSpeedIntra[] = {40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0};
const float kSpeedInter[] = {48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                             7.0,  6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};
const float kSm90SpeedIntra[] = {60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0};
const float kSm90SpeedInter[] = {48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                                 15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};
const float kSm100SpeedIntra[] = {90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0};
const float kSm100SpeedInter[] = {96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0,
                                  20.0, 17.5, 15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};

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

// The speeds NCCL tries, fastest first, by architecture and whether the graph crosses nodes.
struct Speeds {
  const float* v;
  int n;
};
// RCCL's (AMD build) speeds, the same inside and across nodes.
const float kAmdSpeeds[] = {48.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0,
                            6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};

Speeds speedsFor(int ccMin, bool inter, bool amd) {
  if (amd && ccMin < 90) return {kAmdSpeeds, static_cast<int>(std::size(kAmdSpeeds))};
  if (!inter) {
    if (ccMin >= 100) return {kSm100SpeedIntra, static_cast<int>(std::size(kSm100SpeedIntra))};
    if (ccMin >= 90) return {kSm90SpeedIntra, static_cast<int>(std::size(kSm90SpeedIntra))};
    return {kSpeedIntra, static_cast<int>(std::size(kSpeedIntra))};
  }
  if (ccMin >= 100) return {kSm100SpeedInter, static_cast<int>(std::size(kSm100SpeedInter))};
  if (ccMin >= 90) return {kSm90SpeedInter, static_cast<int>(std::size(kSm90SpeedInter))};
  return {kSpeedInter, static_cast<int>(std::size(kSpeedInter))};
}

// The path-type ranges a search may relax within, and the cross-NIC setting (ncclTopoCompute's preamble).
struct Limits {
  int minTypeIntra = P(PathType::LOC), maxTypeIntra = P(PathType::SYS);
  int minTypeInter = P(PathType::PIX), maxTypeInter = P(PathType::SYS);
  int crossNic = 0, ccMin = 0;
};
Limits limitsFor(const System& sys, const Config& cfg, const Graph& graph) {
  Limits l;
  l.ccMin = ccMinOf(sys);
  l.crossNic =
      sys.count(NodeType::NET) > 1 && (graph.pattern == kPatternRing || graph.pattern == kPatternBalancedTree ||
                                       graph.pattern == kPatternSplitTree)
          ? cfg.crossNic
          : 0;
  if (sys.count(NodeType::GPU) > 1) {
    l.minTypeIntra = paths::gpuMinPath(sys, NodeType::GPU);
    l.maxTypeIntra = paths::gpuMaxPath(sys, NodeType::GPU);
  }
  if (sys.inter) {
    l.minTypeInter = paths::gpuMinPath(sys, NodeType::NET);
    l.maxTypeInter = paths::gpuMaxPath(sys, NodeType::NET);
    l.maxTypeIntra = l.maxTypeInter;
  }
  // Ampere relies on balanced trees, which sometimes need to come back through SYS or PHB.
  if (l.ccMin < 90) l.maxTypeInter = P(PathType::SYS);
  return l;
}

// NCCL's search for the graphs of one system (ncclTopoCompute and its recursion, ncclTopoSearchRec*), one graph
// at a time. Its parts live next to it: the flattened paths and their walk (hop_cache.h), the memo of
// sub-searches and its keys (search_memo.h), the passes shared across speeds (speed_walks.h), the candidate
// orders (search_order.h) and the tracing for `plan --explain` (search_trace.h).
class Searcher {
 public:
  Searcher(System& sys, const Config& cfg);
  Searcher(const Searcher&) = delete;  // its parts point into each other
  Searcher& operator=(const Searcher&) = delete;
  void run(Graph& graph, SearchTrace* trace = nullptr);

 private:
  struct Loop;

  // ncclTopoCompute: one graph's search loop.
  void startSearch(SearchTrace* trace);
  void searchLoop(Graph& graph, const Limits& l);
  bool relax(Loop& s, const Graph& graph, const Limits& l);
  void startRaising(Loop& s, Graph& graph, const Limits& l);
  bool raise(Loop& s, const Graph& graph);
  void startPass();
  void walkPass(Graph& tmp, Graph& graph, int* time);
  bool speedSkipApplies(const Graph& g) const;
  void simpleOrder(Graph& graph);

  // The recursion. searchPass, freeStarts and recGpu wrap their walks in the memo.
  void searchPass(Graph& g, Graph& save, int* time);
  void searchRec(Graph& g, Graph& save, int* time);
  void freeStarts(Graph& g, Graph& save, int backToNet, int backToFirstRank, int* time);
  void recNet(Graph& g, Graph& save, int backToNet, int backToFirstRank, int* time);
  bool tryNetHead(Graph& g, Graph& save, int net, int netCount, int backToNet, int backToFirstRank, int* time);
  bool tryNetGpus(Graph& g, Graph& save, int net, int backToNet, int backToFirstRank, int* time);
  void recGpu(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder, int* time);
  void recGpuSteps(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
                   int* time);
  void completeChannel(Graph& g, Graph& save, int* time);
  void tryExitNets(Graph& g, Graph& save, int gi, int step, int backToFirstRank, int forcedOrder, int* time);
  void tryNextGpus(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
                   int* time);
  void tryGpu(Graph& g, Graph& save, int step, int backToNet, int backToFirstRank, int forcedOrder, int* time, int type,
              int index, int gi);
  void tryCollnetDirect(Graph& g, Graph& save, int gi, int* time);
  void tryNvls(Graph& g, Graph& save, int gi, int* time);

  // NCCL's rules the recursion applies.
  bool follow(Graph& g, int type1, int index1, NodeType type2, int index2, float mult);
  void chargeNet(Node& net, float amount);
  void chargePort(const Node& net, float amount);
  bool checkNet(const Graph& g, const Node& startNet, int n, int step);
  bool compareGraphs(const Graph& g, const Graph& ref) const;
  int countXgmi(const Graph& g) const;
  int replayGetGpu(const Graph& g, int step) const;
  void searchParams(int pattern, int* backToNet, int* backToFirstRank) const;

  System& sys_;
  const Config& cfg_;
  const int ngpus_;
  const bool amd_;            // RCCL's rules (AMD GPUs)
  bool keyed_;                // the memo is on: charges keep the state key (off while tracing)
  bool memoOn_;               // the memo and its shortcuts are allowed for this graph's search
  bool prefixCheck_ = false;  // skip the tries from a GPU whose first hops lack the speed (HopCache::prefixShort)
  SearchCounters counters_;
  int passesShared_ = 0;
  StateKey key_;
  HopCache hops_;
  SubSearchMemo memo_{counters_};
  PassSharing passes_;
  SpeedWalk* sw_ = nullptr;  // the speed being walked, while a pass records
  CandidateOrder order_;
  SearchTracer tracer_;
};

void copyGraph(Graph& dst, const Graph& src) {
  // Only the search state; diagnostics stay with the destination.
  double ms = dst.searchMs;
  bool to = dst.timedOut;
  int st = dst.searchSteps, walked = dst.searchWalked, shared = dst.searchPassesShared;
  dst = src;
  dst.searchPassesShared = shared;
  dst.searchMs = ms;
  dst.timedOut = to;
  dst.searchSteps = st;
  dst.searchWalked = walked;
}

}  // namespace

Searcher::Searcher(System& sys, const Config& cfg)
    : sys_(sys),
      cfg_(cfg),
      ngpus_(sys.count(NodeType::GPU)),
      amd_(sys.amdGpus()),
      keyed_(cfg.searchMemo && !amd_),
      memoOn_(keyed_),
      key_(ngpus_),
      hops_(sys, key_, cfg.searchMemo && !amd_),  // TOPOCOLL_SEARCH_MEMO=0 (and RCCL): every link charged
      order_(sys, cfg) {}

// ncclTopoFollowPath. type1 == -1 means "start here" (no link accounting).
bool Searcher::follow(Graph& g, int type1, int index1, NodeType type2, int index2, float mult) {
  if (type1 == -1) return true;
  NodeRef n1{static_cast<NodeType>(type1), index1};
  const HopCache::HopPath& hp = hops_.path(n1.type, index1, type2, index2);
  bool intra =
      (n1.type == NodeType::GPU || n1.type == NodeType::NVS) && (type2 == NodeType::GPU || type2 == NodeType::NVS);
  float bw = intra ? g.bwIntra : g.bwInter;
  int type = intra ? g.typeIntra : g.typeInter;
  if (hp.type >= P(PathType::DIS)) return false;
  if (mult == 1 && hp.type > type) return tracer_.noteType(intra, hp.type), false;
  if (mult == 1 && (g.pattern == kPatternBalancedTree || g.pattern == kPatternTree || g.pattern == kPatternSplitTree) &&
      hops_.path(type2, index2, n1.type, index1).type > type)
    return tracer_.noteType(intra, hops_.path(type2, index2, n1.type, index1).type), false;
  bw *= mult;
  int failed = -1;
  if (!(keyed_ ? hops_.chargePath<true>(hp, bw, sw_, &failed) : hops_.chargePath<false>(hp, bw, sw_, &failed))) {
    if (mult > 0 && failed >= 0 && tracer_.recording()) tracer_.noteFull(hops_.refusingLink(hp, failed, bw));
    return false;
  }
  g.nHops = static_cast<int>(static_cast<float>(g.nHops) + mult * static_cast<float>(hp.length));
  return true;
}

// recNet's NIC accounting (no rounding: NCCL subtracts the integer part of bwInter), in the state key too.
void Searcher::chargeNet(Node& net, float amount) {
  const int64_t before = floatBits(net.bw);
  net.bw -= amount;
  const uint64_t delta = static_cast<uint64_t>(static_cast<int64_t>(floatBits(net.bw)) - before);
  const uint64_t id = 0x4e4554ULL << 32 | static_cast<uint64_t>(&net - sys_.of(NodeType::NET).data());
  key_.links.a += (mixA(id) | 1) * delta;
  key_.links.b += (mixB(id) | 1) * delta;
}

// Every NET on the NIC port of `net`: they share its bandwidth.
void Searcher::chargePort(const Node& net, float amount) {
  const uint64_t asic = net.asic;
  const int port = net.port;
  for (auto& other : sys_.of(NodeType::NET))
    if (other.asic == asic && other.port == port) chargeNet(other, amount);
}

int Searcher::replayGetGpu(const Graph& g, int step) const {
  int nextRank = g.intra[(g.nChannels - 1) * ngpus_ + step + 1];
  int idx = sys_.gpuIndexOfRank(nextRank);
  if (idx < 0) fail(StatusCode::kInternal, "replay: rank {} not found", nextRank);
  return idx;
}

void Searcher::tryGpu(Graph& g, Graph& save, int step, int backToNet, int backToFirstRank, int forcedOrder, int* time,
                      int type, int index, int gi) {
  const uint64_t flag = 1ULL << g.nChannels;
  if (!follow(g, type, index, NodeType::GPU, gi, 1)) return;
  sys_.of(NodeType::GPU)[gi].used ^= flag;
  // The previous GPU is inside the channel from now on (unless it is the first): its private links leave the key.
  const Key128 inside = type == T(NodeType::GPU) && step >= 2 ? key_.priv[index] : Key128{};
  key_.enter(g.nChannels, gi, inside);
  recGpu(g, save, gi, step, backToNet, backToFirstRank, forcedOrder, time);
  key_.leave(g.nChannels, gi, inside);
  sys_.of(NodeType::GPU)[gi].used ^= flag;
  follow(g, type, index, NodeType::GPU, gi, -1);
}

void Searcher::tryCollnetDirect(Graph& g, Graph& save, int gi, int* time) {
  int n = ngpus_;
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

void Searcher::tryNvls(Graph& g, Graph& save, int gi, int* time) {
  int n = ngpus_;
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
    if (!ok)
      d1--;
    else
      recGpu(g, save, -1, n, -1, -1, 0, time);
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

bool Searcher::compareGraphs(const Graph& g, const Graph& ref) const {
  if (g.nChannels < g.minChannels) return false;
  if (g.pattern == kPatternNvls) {
    bool copy = false;
    if (g.nChannels > ref.nChannels && g.nChannels <= ngpus_) copy = true;
    if (static_cast<float>(g.nChannels) * g.bwInter > static_cast<float>(ref.nChannels) * ref.bwInter) copy = true;
    return copy;
  }
  float a = static_cast<float>(g.nChannels) * g.bwIntra, b = static_cast<float>(ref.nChannels) * ref.bwIntra;
  if (a > b) return true;
  if (a < b) return false;
  const bool fewerHops = g.pattern == ref.pattern && g.crossNic == ref.crossNic && g.nHops < ref.nHops;
  // RCCL's ncclTopoCompareGraphs: at equal channels, prefer the graph with more XGMI hops.
  if (amd_ && g.nChannels == ref.nChannels && countXgmi(ref) < countXgmi(g)) return true;
  return fewerHops;
}

// RCCL's ncclTopoCountXGMI: consecutive GPUs of each channel (the last back to the first) joined by one XGMI link.
int Searcher::countXgmi(const Graph& g) const {
  const int n = ngpus_;
  int count = 0;
  for (int c = 0; c < g.nChannels; ++c) {
    for (int i = 0; i < n; ++i) {
      const int a = sys_.gpuIndexOfRank(g.intra[c * n + i]), b = sys_.gpuIndexOfRank(g.intra[c * n + (i + 1) % n]);
      if (a < 0 || b < 0 || a == b) continue;
      const Path& p = sys_.of(NodeType::GPU)[a].paths[T(NodeType::GPU)][b];
      // GPU -> DEV, DEV -> DEV over XGMI, DEV -> GPU: one XGMI link (RCCL's paths of count 1, without DEV nodes).
      if (p.count() == 3 && sys_.link(p.list[1]).type == LinkType::NVL &&
          sys_.link(p.list[1]).rem.type == NodeType::DEV)
        ++count;
    }
  }
  return count;
}

bool Searcher::checkNet(const Graph& g, const Node& startNet, int n, int step) {
  const Node& net = sys_.of(NodeType::NET)[n];
  if (net.planeId != topology::kUndef && startNet.planeId != topology::kUndef && net.planeId != startNet.planeId)
    return tracer_.note(SearchTrace::kNicPlane), false;
  if (g.pattern == kPatternTree && net.id != startNet.id) return tracer_.note(SearchTrace::kTreeNic), false;
  if (g.pattern == kPatternRing && g.crossNic == 2) {
    if ((g.nChannels & 1) && net.id != g.inter[(g.nChannels - 1) * 2])
      return tracer_.note(SearchTrace::kNicPair), false;
  } else if (g.crossNic == 0) {
    if (net.railId != topology::kUndef && startNet.railId != topology::kUndef) {
      if (net.railId != startNet.railId) return tracer_.note(SearchTrace::kNicRail), false;
    } else if (net.asic != startNet.asic || net.port != startNet.port) {
      return tracer_.note(SearchTrace::kNicRail), false;
    }
  }
  if (g.pattern == kPatternBalancedTree && step != 0 && net.id != g.inter[g.nChannels * 2 + 1])
    return tracer_.note(SearchTrace::kTreeNic), false;
  return true;
}

void Searcher::recGpu(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
                      int* time) {
  if (*time <= 0) return;
  const int n = ngpus_;
  // RCCL's XGMI preference makes "better than the saved graph" depend on more than the search state: no memo.
  SubSearchMemo::Gate& gate = memo_.gate(step);
  if (!keyed_ || step == n || g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect || gate.off) {
    recGpuSteps(g, save, gi, step, backToNet, backToFirstRank, forcedOrder, time);
    return;
  }
  g.intra[g.nChannels * n + step] = sys_.of(NodeType::GPU)[gi].rank;
  const bool inter = sys_.inter != 0;
  const KeyAcc acc = key_.subSearch(g, gi, step, backToNet, backToFirstRank, forcedOrder, inter);
  memo_.run(
      acc.finish(), key_.completing(acc, g, step, inter).finish(), time,
      [&] { recGpuSteps(g, save, gi, step, backToNet, backToFirstRank, forcedOrder, time); }, SubSearchMemo::kMinSteps,
      &gate);
}

void Searcher::recGpuSteps(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
                           int* time) {
  (*time)--;
  ++counters_.steps;
  ++counters_.walked;
  const int n = ngpus_;
  if (step == n - 1 && sw_) sw_->reachedLast = true;
  if (step == n) return completeChannel(g, save, time);
  g.intra[g.nChannels * n + step] = sys_.of(NodeType::GPU)[gi].rank;
  if (step == backToNet) {
    if (sys_.inter) tryExitNets(g, save, gi, step, backToFirstRank, forcedOrder, time);
  } else if (g.pattern == kPatternNvls) {
    tryNvls(g, save, gi, time);
  } else if (g.pattern == kPatternCollnetDirect) {
    tryCollnetDirect(g, save, gi, time);
  } else if (step < n - 1) {
    tryNextGpus(g, save, gi, step, backToNet, backToFirstRank, forcedOrder, time);
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

// The channel is complete: it becomes the saved graph when better, and the next channel is searched.
void Searcher::completeChannel(Graph& g, Graph& save, int* time) {
  ++counters_.completions;
  g.nChannels++;
  if (sw_) sw_->maxChannels = std::max(sw_->maxChannels, g.nChannels);
  if (compareGraphs(g, save)) {
    copyGraph(save, g);
    if (g.nChannels == g.maxChannels) *time = -1;
  }
  if (g.nChannels < g.maxChannels) {
    const Key128 outer = key_.interior;  // the next channel may use every link again
    key_.interior = Key128{};
    searchRec(g, save, time);
    key_.interior = outer;
  }
  g.nChannels--;
}

// The channel leaves the node from GPU gi: through each NET it may, in NCCL's order.
void Searcher::tryExitNets(Graph& g, Graph& save, int gi, int step, int backToFirstRank, int forcedOrder, int* time) {
  int startIdx = netIndex(sys_, g.inter[g.nChannels * 2]);
  const std::vector<int>& nets = order_.selectNets(g.typeInter, gi);
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

// The channel goes on from GPU gi to each candidate GPU, in NCCL's order (or the one the order forces).
void Searcher::tryNextGpus(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
                           int* time) {
  if (prefixCheck_ && hops_.prefixShort(gi, g.bwIntra, sw_)) return;  // every try from gi would fail on its first hops
  CandidateOrder::NextList next;
  if (forcedOrder == kForcedOrderPci) {
    next.push_back(step + 1);
  } else if (forcedOrder == kForcedOrderReplay) {
    next.push_back(replayGetGpu(g, step));
  } else {
    order_.nextGpus(g, gi, next, backToNet == -1 ? 0 : backToNet == step + 1 ? 1 : -1);
  }
  for (size_t i = 0; i < next.size(); ++i)
    tryGpu(g, save, step + 1, backToNet, backToFirstRank, forcedOrder, time, T(NodeType::GPU), gi, next[i]);
}

void Searcher::recNet(Graph& g, Graph& save, int backToNet, int backToFirstRank, int* time) {
  const int bw = static_cast<int>(g.bwInter);
  const std::vector<int>& nets = order_.selectNets(g.typeInter, -1);
  int netCount = static_cast<int>(nets.size());
  const bool headsOnly = g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect;
  bool graphFound = false;
  for (int i = 0; i < netCount; ++i) {
    if (headsOnly && graphFound) break;
    int n = nets[(g.nChannels + i) % netCount];
    Node& net = sys_.of(NodeType::NET)[n];
    if (g.collNet && net.collSupport == 0) continue;
    if (net.bw < bw) {
      tracer_.note(SearchTrace::kNicSpeed);
      continue;
    }
    if (g.pattern == kPatternRing && g.crossNic == 2 && (g.nChannels & 1) &&
        net.id != g.inter[(g.nChannels - 1) * 2 + 1]) {
      tracer_.note(SearchTrace::kNicPair);
      continue;
    }
    g.inter[g.nChannels * 2] = net.id;
    g.latencyInter = net.latency;
    chargePort(net, static_cast<float>(bw));
    bool giveBack = true;
    if (headsOnly)
      graphFound |= tryNetHead(g, save, n, netCount, backToNet, backToFirstRank, time);
    else
      giveBack = tryNetGpus(g, save, n, backToNet, backToFirstRank, time);
    if (giveBack) chargePort(net, -static_cast<float>(bw));
  }
}

// NVLS and CollNet Direct: the channel starts at the NET's own GPU, each GPU heading one channel at most. True
// when it was tried.
bool Searcher::tryNetHead(Graph& g, Graph& save, int net, int netCount, int backToNet, int backToFirstRank, int* time) {
  if (g.nChannels >= netCount) return false;
  int gpu = sys_.of(NodeType::NET)[net].localGpu;
  if (gpu == -1) return false;
  for (int gc = 0; gc < g.nChannels; ++gc)
    if (g.intra[gc * ngpus_] == sys_.of(NodeType::GPU)[gpu].rank) return false;
  tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, T(NodeType::NET), net, gpu);
  return true;
}

// The channel's first GPU behind the NET: the previous channel's (same channels), else GPU 0 in PCI order under a
// budget of its own (the first channel, without NVSwitch), the NET's own GPU, then the GPUs closest to the NET.
// False where NCCL keeps the NIC's bandwidth.
bool Searcher::tryNetGpus(Graph& g, Graph& save, int net, int backToNet, int backToFirstRank, int* time) {
  if (g.nChannels > 0 && g.sameChannels == 1) {
    int gi = replayGetGpu(g, -1);
    tryGpu(g, save, 0, backToNet, backToFirstRank, kForcedOrderReplay, time, T(NodeType::NET), net, gi);
    return true;
  }
  if (g.nChannels == 0 && sys_.count(NodeType::NVS) == 0) {
    int t = 1 << 10;
    tryGpu(g, save, 0, backToNet, backToFirstRank, kForcedOrderPci, &t, T(NodeType::NET), net, 0);
    if (t == -1) *time = -1;
  }
  int localGpu = sys_.of(NodeType::NET)[net].localGpu;
  if (localGpu != -1) tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, T(NodeType::NET), net, localGpu);
  const CandidateOrder::LocalGpus& locals = order_.netLocalGpus(net);
  // NCCL skips this NIC here without giving its bandwidth back; kept for fidelity (and never memoized).
  if (locals.type == PathType::DIS) {
    ++counters_.leaks;
    return false;
  }
  for (int lg : locals.gpus) {
    if (lg == localGpu) continue;
    tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, T(NodeType::NET), net, lg);
  }
  return true;
}

void Searcher::searchParams(int pattern, int* backToNet, int* backToFirstRank) const {
  int n = ngpus_;
  if (sys_.inter) {
    *backToNet = pattern == kPatternRing ? n - 1 : pattern == kPatternSplitTree ? 1 : 0;
    *backToFirstRank = -1;
  } else {
    *backToNet = -1;
    *backToFirstRank = pattern == kPatternRing ? n - 1 : -1;
  }
}

// One pass of the search loop, as a memo unit: passes whose parameters differ only where the search does not
// look (a path type no path has, same channels before any channel is found) walk the same search again.
void Searcher::searchPass(Graph& g, Graph& save, int* time) {
  auto walk = [&] { searchRec(g, save, time); };
  if (!keyed_ || g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect) return walk();
  int backToNet, backToFirstRank;
  searchParams(g.pattern, &backToNet, &backToFirstRank);
  const bool inter = sys_.inter != 0;
  const KeyAcc acc = key_.subSearch(g, -3, -1, backToNet, backToFirstRank, 0, inter);
  memo_.run(acc.finish(), key_.completing(acc, g, -1, inter).finish(), time, walk, 1);
}

void Searcher::searchRec(Graph& g, Graph& save, int* time) {
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
  if (g.sameChannels == 0 || g.nChannels == 0) freeStarts(g, save, backToNet, backToFirstRank, time);
}

// A channel started from every GPU in turn, as one memo unit: after each channel found, the next one is tried
// from every GPU, and many channels found leave the same state.
void Searcher::freeStarts(Graph& g, Graph& save, int backToNet, int backToFirstRank, int* time) {
  auto walk = [&] {
    for (int gi = 0; gi < ngpus_; ++gi) tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, -1, -1, gi);
  };
  if (*time <= 0 || !keyed_ || g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect) return walk();
  const bool inter = sys_.inter != 0;
  const KeyAcc acc = key_.subSearch(g, -2, -1, backToNet, backToFirstRank, 0, inter);
  memo_.run(acc.finish(), key_.completing(acc, g, -1, inter).finish(), time, walk, 1);
}

// ncclTopoCompute's search loop: pass 1 relaxes the constraints one at a time (same channels off, a simple tree on
// Hopper+, intra then inter path types up, cross NIC, lower speed) until a solution reaches the total bandwidth or
// the global budget runs out; pass 2 raises the speed again for the channels found.
struct Searcher::Loop {
  Speeds sp;
  Graph tmp;  // the parameters of the next pass
  int pass = 1, speedIndex = 0;
  float maxBw = 0;
  int64_t globalTimeout = 0;
  int time = 0;  // the pass's budget: what is left of it after the pass, -1 once the best graph is found
  int trySameChannels = 1;
  bool amdCpu = false;
};

void Searcher::searchLoop(Graph& graph, const Limits& l) {
  Loop s{speedsFor(l.ccMin, sys_.inter != 0, amd_), graph};
  s.trySameChannels = graph.pattern == kPatternNvls ? 0 : 1;
  const int ndevs = sys_.count(NodeType::DEV);
  const Node& cpu0 = sys_.of(NodeType::CPU)[0];
  s.amdCpu = cpu0.arch == topology::kCpuArchX86 && cpu0.vendor == topology::kCpuVendorAmd;
  s.maxBw = sys_.maxBw;
  float totalBw = sys_.totalBw;
  if (ndevs > 1 && graph.pattern != kPatternRing) totalBw = static_cast<float>(totalBw * (ndevs * 1.0 / (ndevs - 1)));
  while ((s.sp.v[s.speedIndex] > s.maxBw || s.sp.v[s.speedIndex] * graph.minChannels > totalBw) &&
         s.speedIndex < s.sp.n - 1)
    s.speedIndex++;
  s.tmp.bwIntra = s.tmp.bwInter = s.sp.v[s.speedIndex];
  s.globalTimeout = kGlobalTimeout * cfg_.searchTimeoutScale;
  while (true) {
    s.time = (s.tmp.sameChannels              ? kTimeoutSameChannels
              : s.tmp.pattern == kPatternTree ? kTimeoutTree
                                              : kTimeout) *
             cfg_.searchTimeoutScale;
    s.tmp.nChannels = 0;
    s.globalTimeout -= s.time;
    startPass();
    tracer_.beginAttempt(s.tmp);
    walkPass(s.tmp, graph, &s.time);
    if (s.time == 0) graph.timedOut = true;
    tracer_.endAttempt(sys_, graph, s.time == 0);
    const bool done = s.time == -1 || static_cast<float>(graph.nChannels) * graph.bwInter >= sys_.totalBw;
    if (!done && s.pass == 1 && relax(s, graph, l)) continue;
    if (s.pass == 1) startRaising(s, graph, l);
    if (s.pass == 2 && raise(s, graph)) continue;
    break;
  }
}

// Pass 1: the next pass's parameters, one constraint relaxed; false when every one has been (the speed then back
// at the fastest), or the global budget ran out with channels found.
bool Searcher::relax(Loop& s, const Graph& graph, const Limits& l) {
  Graph& tmp = s.tmp;
  // Same channels first (AMD CPUs keep them when going through SYS).
  if (tmp.sameChannels == 1 && !(s.amdCpu && tmp.typeIntra == P(PathType::SYS))) {
    tmp.sameChannels = 0;
    return true;
  }
  tmp.sameChannels = s.trySameChannels;
  if (s.time != -1)
    s.globalTimeout += s.time;
  else
    s.globalTimeout = kGlobalTimeout;
  if (s.globalTimeout < 0 && graph.nChannels) {
    tracer_.globalTimeout();
    return false;
  }
  if (l.ccMin >= 90 && tmp.pattern == kPatternBalancedTree) {
    tmp.pattern = kPatternTree;
    return true;
  }
  tmp.pattern = graph.pattern;
  const int maxIntra = sys_.inter ? tmp.typeInter : l.maxTypeIntra;
  if (tmp.typeIntra < maxIntra && (graph.nChannels == 0 || tmp.typeIntra < graph.typeIntra)) {
    tmp.typeIntra += 1;
    if (tmp.typeIntra < P(PathType::DIS)) return true;
  }
  tmp.typeIntra = l.minTypeIntra;
  if (sys_.inter && tmp.typeInter < l.maxTypeInter &&
      (graph.nChannels == 0 || tmp.typeInter < graph.typeInter || tmp.typeInter < P(PathType::PXN))) {
    tmp.typeInter += 1;
    if (tmp.typeInter < P(PathType::DIS)) return true;
  }
  tmp.typeInter = l.minTypeInter;
  if (l.crossNic == 2 && tmp.crossNic == 0 &&
      (graph.pattern == kPatternRing || graph.pattern == kPatternBalancedTree)) {
    tmp.crossNic = 2;
    return true;
  }
  tmp.crossNic = l.crossNic == 1 ? 1 : 0;
  if (s.speedIndex < s.sp.n - 1 && (graph.nChannels == 0 || s.sp.v[s.speedIndex + 1] / graph.bwInter > .49)) {
    tmp.bwInter = tmp.bwIntra = s.sp.v[++s.speedIndex];
    return true;
  }
  s.speedIndex = 0;
  while (s.sp.v[s.speedIndex] > s.maxBw && s.speedIndex < s.sp.n - 1) s.speedIndex++;
  tmp.bwIntra = tmp.bwInter = s.sp.v[s.speedIndex];
  return false;
}

// Pass 1 is over: the channels found are duplicated where NCCL does, and pass 2 starts at their speed.
void Searcher::startRaising(Loop& s, Graph& graph, const Limits& l) {
  s.time = -1;
  dupChannels(graph, l.ccMin, ngpus_);
  s.tmp = graph;
  s.speedIndex = 0;
  while (s.sp.v[s.speedIndex] > graph.bwInter && s.speedIndex < s.sp.n - 1) s.speedIndex++;
  s.tmp.bwIntra = s.tmp.bwInter = s.sp.v[s.speedIndex];
  s.tmp.minChannels = graph.nChannels;
  s.pass = 2;
}

// Pass 2: the next faster speed to try for the channels found (rings both ways, NVLS bwInter, trees bwIntra);
// false when there is none.
bool Searcher::raise(Loop& s, const Graph& graph) {
  if (!(s.time != 0 && s.speedIndex > 0)) return false;
  Graph& tmp = s.tmp;
  if (graph.pattern == kPatternRing) {
    tmp.bwIntra = tmp.bwInter = s.sp.v[--s.speedIndex];
    return true;
  }
  if (graph.pattern == kPatternNvls && tmp.bwInter == graph.bwInter && tmp.bwInter < tmp.bwIntra * 2) {
    tmp.minChannels = tmp.maxChannels = graph.nChannels;
    tmp.bwInter = s.sp.v[--s.speedIndex];
    return true;
  }
  if (tmp.bwIntra == graph.bwIntra && tmp.bwIntra < tmp.bwInter * 2) {
    tmp.bwIntra = s.sp.v[--s.speedIndex];
    return true;
  }
  return false;
}

// A new pass of the search loop: the memo carries over (its keys hold the pass's parameters), the gates probe again,
// and the state key is dropped where the memo has not paid.
void Searcher::startPass() {
  memo_.startPass(ngpus_);
  if (keyed_ && !memo_.pays(ngpus_)) keyed_ = false;
}

bool Searcher::speedSkipApplies(const Graph& g) const {
  return memoOn_ && !sys_.inter && !amd_ && hops_.nonNegative() && g.collNet == 0 && g.pattern != kPatternNvls &&
         g.pattern != kPatternCollnetDirect;
}

// One pass with `tmp`'s parameters; charged without a walk where a pass walked before makes the same decisions
// (speed_walks.h), recorded for later passes otherwise.
void Searcher::walkPass(Graph& tmp, Graph& graph, int* time) {
  if (!speedSkipApplies(tmp)) return searchPass(tmp, graph, time);
  const bool treesWalkLikeRings = hops_.symmetricTypes() && sys_.count(NodeType::NVS) == 0;
  const uint64_t group = PassSharing::group(tmp, *time, treesWalkLikeRings, key_.intraTypes);
  if (const PassRecord* r = passes_.samePass(tmp, graph, group, *time)) {
    counters_.steps += r->steps;
    *time = r->endTime;
    ++passesShared_;
    return;
  }
  const int startTime = *time;
  const long steps = counters_.steps;
  const int walk = passes_.speedWalk(tmp.bwIntra);
  sw_ = &passes_.walk(walk);
  searchPass(tmp, graph, time);
  sw_ = nullptr;
  if (*time >= 0)
    passes_.record(PassRecord{group, startTime, *time, tmp.bwIntra, counters_.steps - steps, tmp.crossNic, walk,
                              tmp.pattern, tmp.minChannels, tmp.maxChannels});
}

// Nothing found: one channel in GPU order at 0.1 GB/s through the first and last GPUs' preferred NETs.
void Searcher::simpleOrder(Graph& graph) {
  for (int i = 0; i < ngpus_; ++i) graph.intra[i] = sys_.of(NodeType::GPU)[i].rank;
  graph.bwIntra = 0.1f;
  graph.typeIntra = P(PathType::SYS);
  auto first = [&](int gpu) -> int64_t {
    if (sys_.count(NodeType::NET) == 0) return -1;
    const std::vector<int>& nets = order_.selectNets(-1, gpu);  // ncclTopoSelectNets with typeInter -1: preferred only
    return nets.empty() ? -1 : sys_.of(NodeType::NET)[nets[0]].id;
  };
  graph.inter[0] = first(0);
  graph.inter[1] = first(ngpus_ - 1);
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

// A graph's search starts: traced or not, the memo on or off, every count at zero.
void Searcher::startSearch(SearchTrace* trace) {
  // A traced search walks every step (the memo would skip the refusals it counts); its result is the same.
  tracer_.start(trace);
  keyed_ = memoOn_ = cfg_.searchMemo && !amd_ && !trace;
  prefixCheck_ = memoOn_ && sys_.count(NodeType::NVS) == 0;
  counters_ = SearchCounters{};
  passesShared_ = 0;
  const bool sameBases = hops_.resetBases();
  passes_.startSearch(sameBases && memoOn_);
  memo_.startSearch();
}

void Searcher::run(Graph& graph, SearchTrace* trace) {
  auto t0 = std::chrono::steady_clock::now();
  startSearch(trace);
  auto finish = [&]() {
    graph.searchMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  graph.intra.assign(static_cast<size_t>(kMaxChannels) * std::max(ngpus_, 1), 0);
  graph.inter.assign(kMaxChannels * 2, 0);
  const Limits l = limitsFor(sys_, cfg_, graph);
  graph.crossNic = l.crossNic == 1 ? 1 : 0;
  graph.bwIntra = graph.bwInter = 0;
  graph.latencyInter = 0;
  graph.typeIntra = l.minTypeIntra;
  graph.typeInter = l.minTypeInter;
  graph.nChannels = 0;
  graph.sameChannels = graph.pattern == kPatternNvls ? 0 : 1;

  if (!cfg_.graphFile.empty()) {
    auto doc = topology::loadXmlFile(cfg_.graphFile);
    if (graphFromXml(doc, sys_, cfg_, graph) > 0 && graph.nChannels > 0) {
      graph.fromFile = true;
      return;
    }
  }
  if (graph.pattern == kPatternNvls && (sys_.count(NodeType::NVS) == 0 || l.ccMin < 90)) return finish();
  // NVLS and CollNet Direct graphs have at most one channel per GPU (their heads).
  if (graph.pattern == kPatternNvls) graph.maxChannels = std::min(kMaxNvlsArity, ngpus_);
  if (graph.pattern == kPatternCollnetDirect) graph.maxChannels = std::min(kMaxDirectArity + 1, ngpus_);
  if (ngpus_ == 1 && graph.pattern != kPatternRing) graph.pattern = kPatternTree;
  // Intra-node NVLS pulls evenly from all GPUs.
  if (sys_.inter == 0 && graph.pattern == kPatternNvls) graph.minChannels = graph.maxChannels;
  // Two NVLink domains joined by a slower link: trees need two channels, and rings the same count as trees.
  if (graph.pattern == kPatternRing && splitNvLink(sys_) && graph.maxChannels >= 2 && graph.minChannels == 1)
    graph.minChannels = 2;

  searchLoop(graph, l);
  if (graph.nChannels == 0 && graph.collNet == 0 && graph.pattern != kPatternNvls) simpleOrder(graph);
  graph.searchSteps = static_cast<int>(counters_.steps);
  graph.searchWalked = static_cast<int>(counters_.walked);
  graph.searchPassesShared = passesShared_;
  finish();
}

const char* graphName(int index) {
  static const char* names[] = {"ring", "tree", "collnet_chain", "collnet_direct", "nvls"};
  return names[index];
}

std::vector<float> speedArray(int ccMin, bool inter) {
  const Speeds sp = speedsFor(ccMin, inter, false);
  return std::vector<float>(sp.v, sp.v + sp.n);
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

struct Searches::Impl {
  Impl(System& sys, const Config& cfg) : searcher(sys, cfg) {}
  Searcher searcher;
};
Searches::Searches(System& sys, const Config& cfg) : impl_(new Impl(sys, cfg)) {}
Searches::~Searches() = default;
void Searches::compute(Graph& graph, SearchTrace* trace) { impl_->searcher.run(graph, trace); }

void compute(System& sys, const Config& cfg, Graph& graph, SearchTrace* trace) { Searcher(sys, cfg).run(graph, trace); }

std::string describe(const System& sys, const Graph& g) {
  std::string out =
      fmt::format("Pattern {}, crossNic {}, nChannels {}, bw {:f}/{:f}, type {}/{}, sameChannels {}\n", g.pattern,
                  g.crossNic, g.nChannels, g.bwIntra, g.bwInter, to_string(static_cast<PathType>(g.typeIntra)),
                  to_string(static_cast<PathType>(g.typeInter)), g.sameChannels);
  int n = sys.count(NodeType::GPU);
  for (int c = 0; c < g.nChannels; ++c) {
    out += fmt::format("{:2d} :", c);
    if (sys.inter)
      out += fmt::format(" NET/{:x}-{:x}", topology::systemIdOf(g.inter[2 * c]), topology::localIdOf(g.inter[2 * c]));
    for (int i = 0; i < n; ++i) {
      int gi = sys.gpuIndexOfRank(g.intra[n * c + i]);
      int64_t id = gi >= 0 ? sys.of(NodeType::GPU)[gi].id : 0;
      out += fmt::format(" GPU/{:x}-{:x}", topology::systemIdOf(id), topology::localIdOf(id));
      if (g.id == kGraphIdNvls) break;  // NVLS channels name their head only
    }
    if (sys.inter)
      out += fmt::format(" NET/{:x}-{:x}", topology::systemIdOf(g.inter[2 * c + 1]),
                         topology::localIdOf(g.inter[2 * c + 1]));
    out += "\n";
  }
  return out;
}

}  // namespace topocoll::search
