// Exact channel search beyond NCCL's greedy ladder (docs/optimize.md): for each channel count, a depth-first
// branch and bound over channels built hop by hop under NCCL's rules, pruned by the speed the loaded links still
// allow and by the topology's cuts, with channels taken in lexicographic order (a channel set is a multiset).
#include "topocoll/search/optimize.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "topocoll/status.h"

namespace topocoll::search {

using topology::NodeType;
using topology::PathType;
using topology::System;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kRel = 1e-6;  // float tolerance on speeds and totals
constexpr double kMoreChannelsGain = 0.01;  // each channel more must buy at least 1% more bandwidth
// Search nodes per second of budget, measured on the reference topologies (bench/optimize_bench): the node budget
// keeps results independent of the machine; the wall clock only stops a search that is much slower than that.
constexpr double kNodesPerSecond = 1.0e6;

int ccMinOf(const System& sys) {
  int mn = 1 << 30;
  for (const auto& d : sys.of(NodeType::DEV)) mn = std::min(mn, d.cudaCompCap);
  return mn;
}

// Speeds a graph may take: NCCL's array, or any multiple of 0.01 GB/s up to the array's top.
class Speeds {
 public:
  Speeds(std::vector<float> ladder, bool ladderOnly) : ladder_(std::move(ladder)), ladderOnly_(ladderOnly) {}
  double top() const { return ladder_.empty() ? 0 : ladder_[0]; }
  // Largest allowed speed <= s (0 when none).
  double quantize(double s) const {
    s = std::min(s, top() * (1 + kRel));
    if (!ladderOnly_) return std::min(top(), std::floor(s * 100 + 1e-6) / 100);
    for (float v : ladder_)
      if (v <= s * (1 + kRel)) return v;
    return 0;
  }
  // Smallest allowed speed >= v (strict: > v); kInf when none.
  double atLeast(double v, bool strict) const {
    if (!ladderOnly_) {
      double c = strict ? (std::floor(v * 100 + 1e-6) + 1) / 100 : std::ceil(v * 100 - 1e-6) / 100;
      return c <= top() * (1 + kRel) ? std::max(c, 0.01) : kInf;
    }
    for (auto it = ladder_.rbegin(); it != ladder_.rend(); ++it)
      if (strict ? *it > v * (1 + kRel) : *it >= v * (1 - kRel)) return *it;
    return kInf;
  }

 private:
  std::vector<float> ladder_;
  bool ladderOnly_;
};

// Search nodes and the wall clock, shared by every search of one optimisation. `limit` is the current search's
// share; the wall clock ends everything.
struct Budget {
  int64_t nodes = 0, global = 0, limit = 0;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  bool clockStop = false;
  bool tick() {
    if (++nodes > limit) return false;
    if ((nodes & 1023) == 0 && std::chrono::steady_clock::now() > deadline) {
      clockStop = true;
      global = limit = nodes;
      return false;
    }
    return true;
  }
  bool spent() const { return nodes >= global; }
};

// Gives the searches run while it lives at most `share` more nodes.
class Slice {
 public:
  Slice(Budget& b, int64_t share) : b_(b), saved_(b.limit) { b.limit = std::min(b.global, b.nodes + std::max<int64_t>(share, 1)); }
  ~Slice() { b_.limit = std::min(saved_, b_.global); }
  Slice(const Slice&) = delete;
  Slice& operator=(const Slice&) = delete;

 private:
  Budget& b_;
  int64_t saved_;
};

struct Chan {
  int netIn = -1, netOut = -1;
  std::vector<int> gpus;
  bool operator==(const Chan&) const = default;
};

struct Rules {
  int pattern = kPatternRing;
  bool inter = false;
  int crossMode = 0;  // 0: in and out on one rail; 1: any NICs; 2: channel pairs A->B, B->A
  int typeLimit = static_cast<int>(PathType::SYS);
};

// NCCL's checkNet between a channel's entry and exit NICs: one plane; trees leave where they enter; rail-aligned
// rules want one rail (or the same asic and port).
bool netPairAllowed(const System& sys, const Rules& r, int in, int out) {
  const auto& a = sys.of(NodeType::NET)[in];
  const auto& b = sys.of(NodeType::NET)[out];
  if (a.planeId != topology::kUndef && b.planeId != topology::kUndef && a.planeId != b.planeId) return false;
  if (r.pattern == kPatternTree) return in == out;
  if (r.crossMode != 0) return true;
  if (a.railId != topology::kUndef && b.railId != topology::kUndef) return a.railId == b.railId;
  return a.asic == b.asic && a.port == b.port;
}

// A weighted cut: prices on resources such that every channel costs at least `minCost` (per GB/s). With loads L,
// n channels at speed s satisfy s * (sum price * L + n * minCost) <= sum price * capacity.
struct WeightedCut {
  std::vector<double> price;
  double capacity = 0;  // sum of price * capacity
  double minCost = 0;
};

// Calls f(resource, units) for every load of one channel at unit speed.
template <typename F>
void forEachUse(const LoadModel& m, const Rules& r, const Chan& ch, F&& f) {
  const int ng = static_cast<int>(ch.gpus.size());
  auto route = [&](NodeType t1, int i1, NodeType t2, int i2, int den) {
    for (const Use& u : m.route(t1, i1, t2, i2).uses) f(u.res, u.units / den);
  };
  for (int i = 0; i + 1 < ng; ++i) route(NodeType::GPU, ch.gpus[i], NodeType::GPU, ch.gpus[i + 1], 1);
  if (!r.inter) {
    if (r.pattern == kPatternRing && ng > 1) route(NodeType::GPU, ch.gpus[ng - 1], NodeType::GPU, ch.gpus[0], 1);
    return;
  }
  route(NodeType::NET, ch.netIn, NodeType::GPU, ch.gpus[0], 1);
  switch (r.pattern) {
    case kPatternRing: route(NodeType::GPU, ch.gpus[ng - 1], NodeType::NET, ch.netOut, 1); break;
    case kPatternSplitTree: route(NodeType::GPU, ch.gpus[std::min(1, ng - 1)], NodeType::NET, ch.netOut, 1); break;
    case kPatternBalancedTree:
      route(NodeType::GPU, ch.gpus[0], NodeType::NET, ch.netOut, ng > 1 ? 2 : 1);
      if (ng > 1) route(NodeType::GPU, ch.gpus[1], NodeType::NET, ch.netOut, 2);
      break;
    default: route(NodeType::GPU, ch.gpus[0], NodeType::NET, ch.netOut, 1); break;
  }
}

// The cheapest single channel when each resource costs price[res] per unit of load, by dynamic programming over
// GPU subsets (Held-Karp): the pricing step of the LP bound and of the starting channel sets. `group` restricts
// both NICs of a channel to one set (one rail); without it the two ends are chosen independently, which is a
// relaxation of the rail rule (and exact for any-NIC rules).
class Pricer {
 public:
  static constexpr int kMaxGpus = 14;
  Pricer(const LoadModel& m, const Rules& r) : m_(m), r_(r), ng_(m.system().count(NodeType::GPU)) {}
  bool usable() const { return ng_ >= 1 && ng_ <= kMaxGpus && (ng_ > 1 || r_.inter); }

  double cheapest(const std::vector<double>& price, const std::vector<int>* inGroup, const std::vector<int>* outGroup,
                  Chan* out) {
    const int n = ng_;
    const int nets = m_.system().count(NodeType::NET);
    auto cost = [&](const Route& rt, int den) {
      if (rt.type > r_.typeLimit || rt.type >= static_cast<int>(PathType::DIS)) return kInf;
      double c = 0;
      for (const Use& u : rt.uses) c += price[u.res] * (u.units / den);
      return c / kLoadUnit;
    };
    edge_.assign(n * n, kInf);
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        if (r_.pattern != kPatternRing && cost(m_.route(NodeType::GPU, b, NodeType::GPU, a), 1) == kInf) continue;
        edge_[a * n + b] = cost(m_.route(NodeType::GPU, a, NodeType::GPU, b), 1);
      }
    // Costs at the ends of a chain, and of the second GPU's exit (split and balanced trees).
    std::vector<double> start(n, 0), end(n, 0), second(n, 0);
    std::vector<int> inOf(n, -1), outOf(n, -1);
    if (r_.inter) {
      auto in = [&](int x) { return !inGroup || std::find(inGroup->begin(), inGroup->end(), x) != inGroup->end(); };
      auto outOk = [&](int x) { return !outGroup || std::find(outGroup->begin(), outGroup->end(), x) != outGroup->end(); };
      for (int p = 0; p < n; ++p) {
        double bestIn = kInf, bestOut = kInf, bestBoth = kInf;
        int bi = -1, bo = -1, bb = -1;
        const int exitDen = r_.pattern == kPatternBalancedTree && n > 1 ? 2 : 1;
        for (int x = 0; x < nets; ++x) {
          double ci = in(x) ? cost(m_.route(NodeType::NET, x, NodeType::GPU, p), 1) : kInf;
          double co = outOk(x) ? cost(m_.route(NodeType::GPU, p, NodeType::NET, x), exitDen) : kInf;
          if (ci < bestIn) bestIn = ci, bi = x;
          if (co < bestOut) bestOut = co, bo = x;
          if (ci + co < bestBoth) bestBoth = ci + co, bb = x;
        }
        switch (r_.pattern) {
          case kPatternRing: start[p] = bestIn, end[p] = bestOut, inOf[p] = bi, outOf[p] = bo; break;
          case kPatternSplitTree: start[p] = bestIn, second[p] = bestOut, inOf[p] = bi, outOf[p] = bo; break;
          case kPatternBalancedTree:
            start[p] = bestIn + bestOut, second[p] = n > 1 ? bestOut : 0, inOf[p] = bi, outOf[p] = bo;
            break;
          default: start[p] = bestBoth, inOf[p] = outOf[p] = bb; break;
        }
      }
    }
    const int full = (1 << n) - 1;
    dp_.assign(static_cast<size_t>(full + 1) * n, kInf);
    from_.assign(dp_.size(), -1);
    const bool cycle = r_.pattern == kPatternRing && !r_.inter;
    for (int p = 0; p < n; ++p)
      if (!cycle || p == 0) dp_[(1 << p) * n + p] = start[p];
    for (int mask = 1; mask <= full; ++mask) {
      if (cycle && !(mask & 1)) continue;
      const bool firstHop = (mask & (mask - 1)) == 0;
      for (int last = 0; last < n; ++last) {
        double d = dp_[mask * n + last];
        if (d == kInf) continue;
        for (int nx = 0; nx < n; ++nx) {
          if (mask & (1 << nx)) continue;
          double c = d + edge_[last * n + nx] + (firstHop ? second[nx] : 0);
          size_t idx = static_cast<size_t>(mask | (1 << nx)) * n + nx;
          if (c < dp_[idx]) dp_[idx] = c, from_[idx] = last;
        }
      }
    }
    double best = kInf;
    int bestLast = -1;
    for (int last = 0; last < n; ++last) {
      double c = dp_[static_cast<size_t>(full) * n + last] + (cycle ? (n > 1 ? edge_[last * n] : kInf) : end[last]);
      if (c < best) best = c, bestLast = last;
    }
    if (best == kInf || !out) return best;
    out->gpus.assign(n, -1);
    int mask = full, last = bestLast;
    for (int pos = n - 1; pos >= 0; --pos) {
      out->gpus[pos] = last;
      int prev = from_[static_cast<size_t>(mask) * n + last];
      mask &= ~(1 << last);
      last = prev;
    }
    if (r_.inter) {
      out->netIn = inOf[out->gpus[0]];
      int exitGpu = r_.pattern == kPatternRing ? out->gpus[n - 1] : out->gpus[0];
      if (r_.pattern == kPatternSplitTree || r_.pattern == kPatternBalancedTree) exitGpu = out->gpus[std::min(1, n - 1)];
      out->netOut = outOf[exitGpu];
    }
    return best;
  }

 private:
  const LoadModel& m_;
  Rules r_;
  int ng_;
  std::vector<double> edge_, dp_;
  std::vector<int> from_;
};

// The LP bound: channels of any speeds, fractional. Prices from multiplicative weights (Garg and Koenemann); every
// price vector gives a valid bound (weak duality), the best one is kept as a weighted cut for the search.
double lpBound(const LoadModel& m, const Rules& relaxed, int iterations, WeightedCut* cut) {
  Pricer pricer(m, relaxed);
  if (!pricer.usable()) return kInf;
  std::vector<double> price(m.resources(), 0);
  for (int res = 0; res < m.resources(); ++res)
    if (m.capacity(res) > 0) price[res] = 1 / m.capacity(res);
  double bound = kInf;
  const double eps = 0.15;
  Chan ch;
  int sinceBetter = 0;
  for (int it = 0; it < iterations && sinceBetter < 60; ++it) {
    double c = pricer.cheapest(price, nullptr, nullptr, &ch);
    if (c == kInf || c <= 0) return bound;
    double d = 0;
    for (int res = 0; res < m.resources(); ++res) d += price[res] * m.capacity(res);
    ++sinceBetter;
    if (d / c < bound) {
      if (d / c < bound * (1 - 1e-3)) sinceBetter = 0;
      bound = d / c;
      *cut = WeightedCut{price, d, c};
    }
    std::vector<std::pair<int, int>> uses;
    forEachUse(m, relaxed, ch, [&](int res, int units) { uses.push_back({res, units}); });
    double f = kInf;
    for (auto [res, units] : uses)
      if (units > 0) f = std::min(f, m.capacity(res) * kLoadUnit / units);
    for (auto [res, units] : uses)
      if (m.capacity(res) > 0) price[res] *= 1 + eps * f * units / (kLoadUnit * m.capacity(res));
  }
  return bound;
}

// Depth-first branch and bound for one channel count: the channel set whose slowest link allows the highest speed.
class ChainSearch {
 public:
  ChainSearch(const LoadModel& m, const Rules& r, const std::vector<Cut>& cuts, const std::vector<WeightedCut>& wcuts,
              const Speeds& sp)
      : m_(m), sys_(m.system()), r_(r), cuts_(cuts), wcuts_(wcuts), sp_(sp), ngpus_(sys_.count(NodeType::GPU)) {
    resCuts_.resize(m.resources());
    for (size_t c = 0; c < cuts_.size(); ++c)
      for (int res : cuts_[c].res) resCuts_[res].push_back(static_cast<int>(c));
    exitPos_ = r.pattern == kPatternRing ? ngpus_ - 1 : r.pattern == kPatternSplitTree ? std::min(1, ngpus_ - 1) : 0;
    exitDen_ = r.pattern == kPatternBalancedTree && ngpus_ > 1 ? 2 : 1;
    unit_ = r.inter && r.crossMode == 2 && r.pattern == kPatternRing ? 2 : 1;
  }

  // Best set of n channels with speed >= need. Returns false when none; `complete` tells whether the search
  // covered everything (else the budget ended it).
  bool run(int n, double need, bool firstOnly, Budget& budget, std::vector<Chan>* best, double* bestSpeed,
           bool* complete) {
    n_ = n;
    need_ = need;
    firstOnly_ = firstOnly;
    budget_ = &budget;
    stop_ = false;
    found_ = false;
    load_.assign(m_.resources(), 0);
    cutLoad_.assign(cuts_.size(), 0);
    chans_.assign(n, Chan{});
    for (auto& c : chans_) c.gpus.assign(ngpus_, -1);
    keys_.assign(n, {});
    tightEnd_.assign(n, 0);
    visited_.assign(static_cast<size_t>(n) * ngpus_, 0);
    if (candBuf_.size() < visited_.size()) candBuf_.resize(visited_.size());
    sCur_ = sp_.top();
    rootBound_ = bound(n);
    exhausted_ = true;
    if (rootBound_ >= need_ * (1 - kRel)) startChannel(0);
    *complete = exhausted_;
    if (found_) {
      *best = bestChans_;
      *bestSpeed = bestS_;
    }
    return found_;
  }

 private:
  // The speed the cuts still allow with `channels` channels not yet started, and the links loaded so far.
  double bound(int channels) const {
    double b = std::min(sCur_, sp_.top());
    for (size_t c = 0; c < cuts_.size(); ++c) {
      int64_t den = cutLoad_[c] + static_cast<int64_t>(channels) * cuts_[c].minUnits;
      if (den > 0) b = std::min(b, cuts_[c].capacity * kLoadUnit / static_cast<double>(den));
    }
    for (const WeightedCut& w : wcuts_) {
      double used = 0;
      for (int res = 0; res < m_.resources(); ++res)
        if (load_[res]) used += w.price[res] * load_[res];
      double den = used / kLoadUnit + channels * w.minCost;
      if (den > 0) b = std::min(b, w.capacity / den);
    }
    return b;
  }

  double ratioWith(const Route& rt, int den) const {
    double s = sCur_;
    for (const Use& u : rt.uses) s = std::min(s, m_.capacity(u.res) * kLoadUnit / double(load_[u.res] + u.units / den));
    return s;
  }
  void apply(const Route& rt, int den, int sign) {
    for (const Use& u : rt.uses) {
      int units = u.units / den * sign;
      load_[u.res] += units;
      for (int c : resCuts_[u.res]) cutLoad_[c] += units;
      if (sign > 0) sCur_ = std::min(sCur_, m_.capacity(u.res) * kLoadUnit / double(load_[u.res]));
    }
  }
  bool allowed(const Route& rt) const { return rt.type <= r_.typeLimit && rt.type < static_cast<int>(PathType::DIS); }
  const Route& gpuRoute(int a, int b) const { return m_.route(NodeType::GPU, a, NodeType::GPU, b); }

  // Lexicographic order of a channel's decisions against the same unit position of the previous unit.
  bool order(int k, int value, bool tight, bool* tightOut) const {
    *tightOut = false;
    if (!tight) return true;
    int pv = keys_[k - unit_][keys_[k].size()];
    if (value < pv) return false;
    *tightOut = value == pv;
    return true;
  }

  void startChannel(int k) {
    if (stop_) return;
    if (k == n_) return onSolution();
    if (!budget_->tick()) {
      stop_ = true;
      exhausted_ = false;
      return;
    }
    if (bound(n_ - k) < need_ * (1 - kRel)) return;
    // Channels in order: within a unit (one channel, or a pair A->B, B->A) against the previous unit. A last
    // channel without its pair has no order with the pairs before it.
    bool lone = unit_ == 2 && k % 2 == 0 && k == n_ - 1;
    bool tight = !lone && k >= unit_ && (k % unit_ == 0 || tightEnd_[k - 1]);
    keys_[k].clear();
    Chan& ch = chans_[k];
    if (r_.inter) {
      std::vector<int> nets;
      if (unit_ == 2 && k % 2 == 1) {
        nets.push_back(chans_[k - 1].netOut);
      } else {
        for (int n = 0; n < sys_.count(NodeType::NET); ++n) nets.push_back(n);
        // Most spare NIC port first: good channel sets early, so that the bound prunes more.
        std::stable_sort(nets.begin(), nets.end(), [&](int a, int b) {
          int ra = m_.portResource(a), rb = m_.portResource(b);
          return m_.capacity(ra) * kLoadUnit - load_[ra] > m_.capacity(rb) * kLoadUnit - load_[rb];
        });
      }
      for (int net : nets) {
        bool t2;
        if (!order(k, net, tight, &t2)) continue;
        ch.netIn = net;
        keys_[k].push_back(net);
        forEachGpu(k, 0, t2);
        keys_[k].pop_back();
        if (stop_) return;
      }
      ch.netIn = -1;
    } else if (r_.pattern == kPatternRing) {
      bool t2;
      if (order(k, 0, tight, &t2)) placeGpu(k, 0, 0, t2);  // a ring may start anywhere: at GPU 0
    } else {
      forEachGpu(k, 0, tight);
    }
  }

  // Tries every GPU at position pos, the most promising first.
  void forEachGpu(int k, int pos, bool tight) {
    Chan& ch = chans_[k];
    std::vector<Cand>& cands = candBuf_[static_cast<size_t>(k) * ngpus_ + pos];
    cands.clear();
    for (int q = 0; q < ngpus_; ++q) {
      if (visited_[k * ngpus_ + q]) continue;
      const Route* rt = nullptr;
      if (pos == 0 && r_.inter) rt = &m_.route(NodeType::NET, ch.netIn, NodeType::GPU, q);
      if (pos > 0) {
        rt = &gpuRoute(ch.gpus[pos - 1], q);
        if (r_.pattern != kPatternRing && !allowed(gpuRoute(q, ch.gpus[pos - 1]))) continue;
      }
      if (rt && !allowed(*rt)) continue;
      double s = rt ? ratioWith(*rt, 1) : sCur_;
      if (s < need_ * (1 - kRel)) continue;
      cands.push_back({q, s});
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.s > b.s; });
    for (size_t i = 0; i < cands.size() && !stop_; ++i) {
      bool t2;
      if (!order(k, cands[i].gpu, tight, &t2)) continue;
      placeGpu(k, pos, cands[i].gpu, t2);
    }
  }

  void placeGpu(int k, int pos, int q, bool tight) {
    if (!budget_->tick()) {
      stop_ = true;
      exhausted_ = false;
      return;
    }
    Chan& ch = chans_[k];
    const Route* rt = nullptr;
    if (pos == 0 && r_.inter) rt = &m_.route(NodeType::NET, ch.netIn, NodeType::GPU, q);
    if (pos > 0) rt = &gpuRoute(ch.gpus[pos - 1], q);
    double saved = sCur_;
    if (rt) apply(*rt, 1, 1);
    ch.gpus[pos] = q;
    visited_[k * ngpus_ + q] = 1;
    keys_[k].push_back(q);
    // BalancedTree: the second GPU sends the other half of the channel to the same NIC.
    const Route* second = nullptr;
    if (r_.inter && r_.pattern == kPatternBalancedTree && pos == 1)
      second = &m_.route(NodeType::GPU, q, NodeType::NET, ch.netOut);
    if (second && allowed(*second)) apply(*second, 2, 1);
    if (sCur_ >= need_ * (1 - kRel) && (!second || allowed(*second))) {
      if (r_.inter && pos == exitPos_) chooseExit(k, pos, tight);
      else next(k, pos, tight);
    }
    if (second && allowed(*second)) apply(*second, 2, -1);
    keys_[k].pop_back();
    visited_[k * ngpus_ + q] = 0;
    if (rt) apply(*rt, 1, -1);
    sCur_ = saved;
  }

  void chooseExit(int k, int pos, bool tight) {
    Chan& ch = chans_[k];
    const int q = ch.gpus[pos];
    struct Cand {
      int net;
      double s;
    };
    std::vector<Cand> cands;
    for (int net = 0; net < sys_.count(NodeType::NET); ++net) {
      if (unit_ == 2 && k % 2 == 1 && net != chans_[k - 1].netIn) continue;
      if (!netPairAllowed(sys_, r_, ch.netIn, net)) continue;
      const Route& rt = m_.route(NodeType::GPU, q, NodeType::NET, net);
      if (!allowed(rt)) continue;
      double s = ratioWith(rt, exitDen_);
      if (s >= need_ * (1 - kRel)) cands.push_back({net, s});
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.s > b.s; });
    for (const Cand& c : cands) {
      if (stop_) return;
      bool t2;
      if (!order(k, c.net, tight, &t2)) continue;
      const Route& rt = m_.route(NodeType::GPU, q, NodeType::NET, c.net);
      double saved = sCur_;
      apply(rt, exitDen_, 1);
      ch.netOut = c.net;
      keys_[k].push_back(c.net);
      next(k, pos, t2);
      keys_[k].pop_back();
      apply(rt, exitDen_, -1);
      sCur_ = saved;
    }
    ch.netOut = -1;
  }

  void next(int k, int pos, bool tight) {
    if (pos + 1 < ngpus_) return forEachGpu(k, pos + 1, tight);
    tightEnd_[k] = tight;
    if (r_.pattern == kPatternRing && !r_.inter && ngpus_ > 1) {
      const Route& close = gpuRoute(chans_[k].gpus[pos], chans_[k].gpus[0]);
      if (!allowed(close)) return;
      double saved = sCur_;
      apply(close, 1, 1);
      if (sCur_ >= need_ * (1 - kRel)) startChannel(k + 1);
      apply(close, 1, -1);
      sCur_ = saved;
      return;
    }
    startChannel(k + 1);
  }

  void onSolution() {
    if (sCur_ < need_ * (1 - kRel)) return;
    found_ = true;
    bestS_ = sCur_;
    bestChans_ = chans_;
    double q = sp_.quantize(sCur_);
    if (firstOnly_ || q >= sp_.quantize(rootBound_) * (1 - kRel)) {
      stop_ = true;  // nothing better for this channel count: the bound is reached
      return;
    }
    need_ = sp_.atLeast(q, true);
  }

  const LoadModel& m_;
  const System& sys_;
  Rules r_;
  const std::vector<Cut>& cuts_;
  const std::vector<WeightedCut>& wcuts_;
  const Speeds& sp_;
  int ngpus_, exitPos_ = 0, exitDen_ = 1, unit_ = 1;
  std::vector<std::vector<int>> resCuts_;
  // Search state.
  int n_ = 0;
  double need_ = 0, sCur_ = 0, rootBound_ = 0, bestS_ = 0;
  bool firstOnly_ = false, stop_ = false, found_ = false, exhausted_ = true;
  Budget* budget_ = nullptr;
  std::vector<int64_t> load_, cutLoad_;
  std::vector<Chan> chans_, bestChans_;
  std::vector<std::vector<int>> keys_;
  std::vector<char> tightEnd_, visited_;  // visited_[channel * ngpus + gpu]
  struct Cand {
    int gpu;
    double s;
  };
  std::vector<std::vector<Cand>> candBuf_;  // [channel * ngpus + position], reused across runs
};

// Path types a channel may use, lowest first.
std::vector<int> typeLevels(const LoadModel& m, bool inter) {
  const System& sys = m.system();
  std::set<int> types;
  int ng = sys.count(NodeType::GPU);
  for (int a = 0; a < ng; ++a) {
    for (int b = 0; b < ng; ++b)
      if (a != b) types.insert(m.route(NodeType::GPU, a, NodeType::GPU, b).type);
    if (inter)
      for (int n = 0; n < sys.count(NodeType::NET); ++n) {
        types.insert(m.route(NodeType::GPU, a, NodeType::NET, n).type);
        types.insert(m.route(NodeType::NET, n, NodeType::GPU, a).type);
      }
  }
  std::vector<int> out;
  for (int t : types)
    if (t < static_cast<int>(PathType::DIS)) out.push_back(t);
  if (out.empty()) out.push_back(static_cast<int>(PathType::LOC));
  return out;
}

// NCCL_GRAPH_FILE's loader knows LOC, NVL, NVB, PIX, PXB, P2C, PXN, PHB, SYS: C2C is declared as the next one.
int declaredType(int t) { return t == static_cast<int>(PathType::C2C) ? static_cast<int>(PathType::PIX) : t; }

// The graph of a channel set: ranks and NET ids, speeds, declared path types.
Graph toGraph(const LoadModel& m, const Graph& like, const Rules& r, const std::vector<Chan>& chans, double speed,
              int crossNicAttr) {
  const System& sys = m.system();
  const int ng = sys.count(NodeType::GPU);
  Graph g = like;
  g.intra.assign(static_cast<size_t>(kMaxChannels) * std::max(ng, 1), 0);
  g.inter.assign(kMaxChannels * 2, 0);
  g.nChannels = static_cast<int>(chans.size());
  g.bwIntra = g.bwInter = static_cast<float>(speed);
  g.crossNic = r.inter ? crossNicAttr : 0;
  int typeIntra = static_cast<int>(PathType::LOC), typeInter = like.typeInter;
  if (r.inter) typeInter = static_cast<int>(PathType::LOC);
  float latency = 0;
  int hops = 0;
  for (size_t c = 0; c < chans.size(); ++c) {
    const Chan& ch = chans[c];
    for (int i = 0; i < ng; ++i) g.intra[c * ng + i] = sys.of(NodeType::GPU)[ch.gpus[i]].rank;
    for (int i = 0; i + 1 < ng || (r.pattern == kPatternRing && !r.inter && i < ng && ng > 1); ++i) {
      int a = ch.gpus[i], b = ch.gpus[(i + 1) % ng];
      const Route& rt = m.route(NodeType::GPU, a, NodeType::GPU, b);
      typeIntra = std::max(typeIntra, rt.type);
      if (r.pattern != kPatternRing) typeIntra = std::max(typeIntra, m.route(NodeType::GPU, b, NodeType::GPU, a).type);
      hops += rt.hops;
    }
    if (r.inter) {
      g.inter[2 * c] = sys.of(NodeType::NET)[ch.netIn].id;
      g.inter[2 * c + 1] = sys.of(NodeType::NET)[ch.netOut].id;
      latency = std::max(latency, sys.of(NodeType::NET)[ch.netIn].latency);
      const Route& in = m.route(NodeType::NET, ch.netIn, NodeType::GPU, ch.gpus[0]);
      int exitGpu = r.pattern == kPatternRing ? ch.gpus[ng - 1] : r.pattern == kPatternSplitTree ? ch.gpus[std::min(1, ng - 1)] : ch.gpus[0];
      const Route& out = m.route(NodeType::GPU, exitGpu, NodeType::NET, ch.netOut);
      typeInter = std::max({typeInter, in.type, out.type});
      hops += in.hops + out.hops;
    }
  }
  g.typeIntra = declaredType(typeIntra);
  g.typeInter = declaredType(typeInter);
  g.latencyInter = r.inter ? latency : like.latencyInter;
  g.nHops = hops;
  g.sameChannels = std::all_of(chans.begin(), chans.end(), [&](const Chan& c) { return c == chans[0]; }) ? 1 : 0;
  g.fromFile = false;
  g.timedOut = false;
  return g;
}

std::string cutText(const LoadModel& m, const Cut& c) {
  std::string s = fmt::format("{} ({:g} GB/s):", c.what, c.capacity);
  int shown = 0;
  for (int res : c.res) {
    if (shown++ == 4) {
      s += fmt::format(" +{} more", c.res.size() - 4);
      break;
    }
    s += fmt::format(" {} {:g}", m.label(res), m.capacity(res));
  }
  return s;
}

// The speed left on the links for one of a graph's two speeds, the other fixed.
double maxSpeedFor(const LoadModel& m, const Graph& g, bool raiseInter) {
  Graph unit = g;
  unit.bwIntra = raiseInter ? g.bwIntra : 1.0f;
  unit.bwInter = raiseInter ? 1.0f : g.bwInter;
  GraphLoad a = graphLoad(m, unit);
  double s = kInf;
  for (int res = 0; res < m.resources(); ++res) {
    double per = raiseInter ? a.inter[res] : a.intra[res];
    if (per <= 0) continue;
    double fixed = raiseInter ? a.intra[res] : a.inter[res];
    s = std::min(s, (m.capacity(res) - fixed) / per);
  }
  return s;
}

// Bounds of one pattern, computed once per optimisation: the cuts, and the LP's best weighted cut.
struct PatternBounds {
  std::vector<Cut> cuts;
  std::vector<WeightedCut> weighted;
  double cutBound = kInf, lpBound = kInf;
};

struct Ctx {
  const LoadModel& m;
  const Config& cfg;
  const OptimizeOptions& opts;
  Budget& budget;
  int ccMin;
  std::map<int, PatternBounds> bounds;

  const PatternBounds& boundsOf(int pattern) {
    auto it = bounds.find(pattern);
    if (it != bounds.end()) return it->second;
    PatternBounds& b = bounds[pattern];
    b.cutBound = upperBound(m, pattern, &b.cuts);
    if (pattern != kPatternNvls) {
      Rules relaxed{pattern, m.system().inter != 0, 1, static_cast<int>(PathType::SYS)};
      WeightedCut w;
      int ng = m.system().count(NodeType::GPU);
      b.lpBound = lpBound(m, relaxed, ng <= 10 ? 300 : 40, &w);
      if (b.lpBound < kInf) b.weighted.push_back(std::move(w));
    }
    return b;
  }
};

// Post-duplication channel count of n channels at speed s (NCCL's ncclTopoDupChannels).
int dupCount(int n, double s, int ccMin, int maxChannels) {
  if (s < 25.0) return n;
  if (ccMin > 80 && s < 50.0 && n > 4) return n;
  return std::min(2 * n, maxChannels);
}

// NIC rules searched in full, in NCCL's order of preference: rail-aligned first; NCCL_CROSS_NIC=2 adds pairs of
// channels A->B, B->A for rings (any NICs for trees); NCCL_CROSS_NIC=1 allows any NICs.
std::vector<int> fullModes(const Ctx& x, int pattern) {
  const System& sys = x.m.system();
  if (!sys.inter || sys.count(NodeType::NET) < 2 || pattern == kPatternTree || x.cfg.crossNic == 0) return {0};
  if (x.cfg.crossNic == 1) return {1};
  return pattern == kPatternRing ? std::vector<int>{0, 2} : std::vector<int>{1};
}

int crossNicAttr(const Ctx& x, int mode) { return mode == 0 ? 0 : mode == 2 ? 2 : x.cfg.crossNic == 1 ? 1 : 2; }

struct Best {
  std::vector<Chan> chans;
  double speed = 0;  // quantised
  Rules rules;
  int mode = 0;
};

// The NIC sets a rail-aligned channel may use at both ends.
std::vector<std::vector<int>> railGroups(const System& sys, const Rules& r) {
  std::set<std::vector<int>> groups;
  for (int a = 0; a < sys.count(NodeType::NET); ++a) {
    std::vector<int> g;
    for (int b = 0; b < sys.count(NodeType::NET); ++b)
      if (netPairAllowed(sys, r, a, b)) g.push_back(b);
    groups.insert(g);
  }
  return {groups.begin(), groups.end()};
}

// A starting set of n channels for the search: each channel the cheapest under prices that grow steeply with the
// load of the channels before it (the best rail for each under rail rules; for pairs, the second channel of a pair
// enters where the first leaves and leaves where it entered).
bool pricedChannels(const LoadModel& m, const Rules& r, int n, double sTop, Budget& budget, std::vector<Chan>* out,
                    double* speed) {
  if (r.pattern == kPatternSplitTree || (r.inter && r.pattern == kPatternBalancedTree)) return false;
  Pricer pricer(m, r);
  if (!pricer.usable()) return false;
  const System& sys = m.system();
  std::vector<std::vector<int>> groups;
  if (r.inter && r.crossMode == 0) groups = railGroups(sys, r);
  std::vector<int64_t> load(m.resources(), 0);
  std::vector<double> price(m.resources(), 0);
  out->clear();
  // Each pricing costs about as much time as this many search nodes.
  const int ng = sys.count(NodeType::GPU);
  const int64_t cost = std::max<int64_t>(1, (int64_t(1) << ng) * ng * ng / 256) * std::max<int64_t>(1, groups.size());
  for (int c = 0; c < n; ++c) {
    budget.nodes += cost;
    if (budget.nodes > budget.limit) return false;
    double umax = 0;
    for (int res = 0; res < m.resources(); ++res)
      if (m.capacity(res) > 0) umax = std::max(umax, load[res] / m.capacity(res));
    for (int res = 0; res < m.resources(); ++res)
      if (m.capacity(res) > 0) price[res] = std::exp(umax > 0 ? 6 * load[res] / m.capacity(res) / umax : 0) / m.capacity(res);
    Chan best;
    double bestCost = kInf;
    if (r.inter && r.crossMode == 2 && c % 2 == 1) {
      std::vector<int> in{(*out)[c - 1].netOut}, outNet{(*out)[c - 1].netIn};
      bestCost = pricer.cheapest(price, &in, &outNet, &best);
    } else if (groups.empty()) {
      bestCost = pricer.cheapest(price, nullptr, nullptr, &best);
    } else {
      for (const auto& g : groups) {
        Chan ch;
        double cost = pricer.cheapest(price, &g, &g, &ch);
        if (cost < bestCost) bestCost = cost, best = ch;
      }
    }
    if (bestCost == kInf) return false;
    forEachUse(m, r, best, [&](int res, int units) { load[res] += units; });
    out->push_back(best);
  }
  double s = sTop;
  for (int res = 0; res < m.resources(); ++res)
    if (load[res] > 0) s = std::min(s, m.capacity(res) * kLoadUnit / load[res]);
  *speed = s;
  return s > 0;
}

// Whether `total` on `channels` beats the best so far: more bandwidth on as many channels, the same on fewer, or
// kMoreChannelsGain more per extra channel (each channel takes SMs and connections: a marginal gain is not worth it).
bool worthIt(double total, int channels, double bestTotal, int bestChannels) {
  if (channels < bestChannels) return total >= bestTotal * (1 - kRel);
  if (channels == bestChannels) return total > bestTotal * (1 + kRel);
  return total > bestTotal * (1 + kMoreChannelsGain * (channels - bestChannels));
}

// The ring (or a tree pattern) with the most bandwidth over channel counts lo..hi, each with its best speed, in at
// most `nodes` search nodes. Only beats `incumbentTotal`, or equals it with fewer channels (counted after NCCL's
// duplication when `duplicate`). Returns whether it found something better; `proven`: every search completed.
bool searchCounts(Ctx& x, int pattern, int lo, int hi, double incumbentTotal, int incumbentChannels, bool duplicate,
                  int64_t nodes, Best* best, bool* proven) {
  const LoadModel& m = x.m;
  const bool inter = m.system().inter != 0;
  Budget& budget = x.budget;
  Speeds sp(speedArray(x.ccMin, inter), x.opts.ladderSpeeds);
  const PatternBounds& pb = x.boundsOf(pattern);
  const std::vector<int> levels = typeLevels(m, inter);
  const std::vector<int> modes = fullModes(x, pattern);
  const int64_t stop = std::min(budget.global, budget.nodes + nodes);
  auto channelsOf = [&](int n, double q) { return duplicate ? dupCount(n, q, x.ccMin, kMaxChannels / 2) : n; };
  *proven = true;
  bool improved = false;
  double bestTotal = incumbentTotal;
  int bestChannels = incumbentChannels;
  auto consider = [&](const std::vector<Chan>& chans, double s, const Rules& r, int mode) {
    const int n = static_cast<int>(chans.size());
    double q = sp.quantize(s);
    int channels = channelsOf(n, q);
    if (!worthIt(n * q, channels, bestTotal, bestChannels)) return;
    bestTotal = n * q;
    bestChannels = channels;
    *best = Best{chans, q, r, mode};
    improved = true;
  };
  // The most permissive path types first, for the best total; stricter rules (lower path types, one rail) win at
  // the same total afterwards: NCCL's own preference.
  for (size_t mi = 0; mi < modes.size(); ++mi) {
    const Rules rules{pattern, inter, modes[mi], levels.back()};
    ChainSearch search(m, rules, pb.cuts, pb.weighted, sp);
    const int64_t modeStop = budget.nodes + (stop - budget.nodes) / static_cast<int64_t>(modes.size() - mi);
    for (int n = lo; n <= hi; ++n) {
      if (budget.nodes >= modeStop) {
        *proven = false;
        break;
      }
      std::vector<Chan> chans;
      double s = 0;
      if (pricedChannels(m, rules, n, sp.top(), budget, &chans, &s)) consider(chans, s, rules, modes[mi]);
      double need = sp.atLeast(bestTotal * (1 + kMoreChannelsGain * std::max(0, n - bestChannels)) / n, n >= bestChannels);
      if (need == kInf) continue;
      bool complete = true, found;
      {
        Slice slice(budget, (modeStop - budget.nodes) / (hi - n + 1));
        found = search.run(n, need, false, budget, &chans, &s, &complete);
      }
      if (!complete) *proven = false;
      if (found) consider(chans, s, rules, modes[mi]);
    }
  }
  if (!improved) return false;
  const int n0 = static_cast<int>(best->chans.size());
  std::vector<int> prefer = modes;
  if (prefer[0] != 0) prefer.insert(prefer.begin(), 0);
  for (int mode : prefer) {
    for (int level : levels) {
      if (mode == best->mode && level == levels.back()) return true;
      const Rules r{pattern, inter, mode, level};
      ChainSearch strict(m, r, pb.cuts, pb.weighted, sp);
      for (int n = lo; n <= n0; ++n) {
        if (budget.nodes >= stop) return true;
        double need = sp.atLeast(bestTotal / n, false);
        if (need == kInf) continue;
        std::vector<Chan> chans;
        double s = 0;
        bool complete = true, found;
        {
          Slice slice(budget, (stop - budget.nodes) / 8);
          found = strict.run(n, need, true, budget, &chans, &s, &complete);
        }
        if (!found) continue;
        double q = sp.quantize(s);
        if (n * q < bestTotal * (1 - kRel) || channelsOf(n, q) > bestChannels) continue;
        *best = Best{chans, q, r, mode};
        return true;
      }
    }
  }
  return true;
}

void describeBound(Ctx& x, int pattern, OptimizedGraph& out) {
  const PatternBounds& b = x.boundsOf(pattern);
  out.bound = std::min(b.cutBound, b.lpBound);
  if (out.bound == kInf) {
    out.bound = graphTotal(out.graph, x.m.system().inter != 0);
    out.boundCut = "no link carries these channels (one GPU, no network)";
    return;
  }
  if (b.lpBound < b.cutBound * (1 - 1e-3)) {
    out.boundCut = fmt::format("the LP relaxation (channels of any speeds, in fractions; {:g} GB/s): every channel "
                               "must cross a set of links that cannot carry more", b.lpBound);
  } else if (!b.cuts.empty()) {
    out.boundCut = cutText(x.m, b.cuts[0]);
  }
}

std::string howText(const Graph& nccl, const Graph& g, bool inter) {
  std::vector<std::string> parts;
  if (g.nChannels != nccl.nChannels) parts.push_back(fmt::format("{} channels instead of {}", g.nChannels, nccl.nChannels));
  if (g.bwIntra != nccl.bwIntra || g.bwInter != nccl.bwInter)
    parts.push_back(fmt::format("speed {:g}/{:g} GB/s instead of {:g}/{:g}", g.bwIntra, g.bwInter, nccl.bwIntra, nccl.bwInter));
  if (g.typeIntra != nccl.typeIntra || (inter && g.typeInter != nccl.typeInter))
    parts.push_back(fmt::format("path types {}/{} instead of {}/{}", topology::to_string(static_cast<PathType>(g.typeIntra)),
                                topology::to_string(static_cast<PathType>(g.typeInter)),
                                topology::to_string(static_cast<PathType>(nccl.typeIntra)),
                                topology::to_string(static_cast<PathType>(nccl.typeInter))));
  if (inter) {
    std::set<int64_t> a, b;
    for (int c = 0; c < nccl.nChannels; ++c) a.insert({nccl.inter[2 * c], nccl.inter[2 * c + 1]});
    for (int c = 0; c < g.nChannels; ++c) b.insert({g.inter[2 * c], g.inter[2 * c + 1]});
    if (a.size() != b.size()) parts.push_back(fmt::format("{} NICs instead of {}", b.size(), a.size()));
    if (g.crossNic != nccl.crossNic) parts.push_back(fmt::format("crossNic {} instead of {}", g.crossNic, nccl.crossNic));
  }
  if (parts.empty()) parts.push_back("other channels at the same speed");
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
  return s;
}

void finish(const LoadModel& m, const Graph& nccl, bool ladder, OptimizedGraph& out) {
  bool inter = m.system().inter != 0;
  out.ncclTotal = graphTotal(nccl, inter);
  out.total = graphTotal(out.graph, inter);
  // At the bound up to the 0.01 GB/s steps of the speeds: nothing better exists, whatever the search did.
  if (!ladder && out.total >= out.bound - out.graph.nChannels * 0.01 - 1e-6) out.proven = true;
  if (out.improved) out.how = howText(nccl, out.graph, inter);
}

// Tree speeds: NCCL raises the intra-node speed of a tree up to twice the network one (pass 2 of its search).
void raiseTreeIntra(Ctx& x, Graph& g) {
  if (!x.m.system().inter) return;
  Speeds sp(speedArray(x.ccMin, true), x.opts.ladderSpeeds);
  double s = std::min(maxSpeedFor(x.m, g, false), 2.0 * g.bwInter);
  double q = sp.quantize(s);
  if (q > g.bwIntra) g.bwIntra = static_cast<float>(q);
}

Graph bestChain(Ctx& x, const Graph& like, int n, double needTotal, bool strict, int64_t nodes, bool* proven) {
  Best b;
  bool ok = searchCounts(x, like.pattern, n, n, strict ? needTotal : needTotal * (1 - 2 * kRel), strict ? n : n + 1,
                         false, nodes, &b, proven);
  Graph g = like;
  g.nChannels = 0;
  if (ok) g = toGraph(x.m, like, b.rules, b.chans, b.speed, crossNicAttr(x, b.mode));
  return g;
}

}  // namespace

std::array<Graph, kNumGraphs> OptimizeResult::graphsToUse() const {
  std::array<Graph, kNumGraphs> out;
  for (int i = 0; i < kNumGraphs; ++i) out[i] = graphs[i].graph;
  return out;
}

Graph bestChannels(const LoadModel& m, int pattern, int nChannels, int crossNic, bool ladderSpeeds, int64_t maxNodes,
                   bool* complete) {
  const System& sys = m.system();
  Config cfg;
  cfg.crossNic = crossNic;
  OptimizeOptions opts;
  opts.ladderSpeeds = ladderSpeeds;
  Budget budget;
  budget.global = budget.limit = maxNodes > 0 ? maxNodes : std::numeric_limits<int64_t>::max() / 4;
  Ctx x{m, cfg, opts, budget, ccMinOf(sys), {}};
  Graph like;
  like.pattern = pattern;
  like.typeInter = static_cast<int>(PathType::PIX);
  bool proven = true;
  Graph g = bestChain(x, like, nChannels, 0, true, budget.global, &proven);
  if (complete) *complete = proven;
  return g;
}

OptimizeResult optimize(const System& sys, const Config& cfg, const std::array<Graph, kNumGraphs>& nccl,
                        const std::array<bool, kNumGraphs>& available, const OptimizeOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  OptimizeResult res;
  LoadModel m(sys);
  Budget budget;
  budget.global = budget.limit =
      opts.maxNodes > 0 ? opts.maxNodes : std::max<int64_t>(1, static_cast<int64_t>(opts.timeBudgetS * kNodesPerSecond));
  if (opts.maxNodes == 0) budget.deadline = t0 + std::chrono::microseconds(static_cast<int64_t>(opts.timeBudgetS * 1e6));
  const int ngpus = sys.count(NodeType::GPU);
  const bool inter = sys.inter != 0;
  Ctx x{m, cfg, opts, budget, ccMinOf(sys), {}};
  for (int i = 0; i < kNumGraphs; ++i) {
    res.graphs[i].available = available[i];
    res.graphs[i].graph = nccl[i];
  }
  auto timed = [&](OptimizedGraph& out, auto&& fn) {
    auto t = std::chrono::steady_clock::now();
    int64_t n0 = budget.nodes;
    fn();
    out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    out.nodes = budget.nodes - n0;
  };
  const bool chains = ngpus > 1 || inter;

  // Ring: every channel count, the best speed for each. Tree: as many channels as the ring (NCCL searches it with
  // min = max = the ring's count). When the best ring has another channel count than NCCL's, the best ring on
  // NCCL's count is a second candidate: the pair with the better ring wins, the better tree at about the same
  // ring bandwidth, and a tree worse than NCCL's is never taken.
  OptimizedGraph& ring = res.graphs[kGraphRing];
  OptimizedGraph& tree = res.graphs[kGraphTree];
  const Graph& ncclRing = nccl[kGraphRing];
  const Graph& ncclTree = nccl[kGraphTree];
  describeBound(x, kPatternRing, ring);
  describeBound(x, ncclTree.pattern, tree);
  const bool doRing = available[kGraphRing] && chains && ncclRing.nChannels > 0;
  const bool doTree = available[kGraphTree] && chains && ncclTree.nChannels > 0;
  auto share = [&](double f) { return std::max<int64_t>(1, static_cast<int64_t>((budget.global - budget.nodes) * f)); };
  // Best tree with n channels; NCCL's own when n is its count and nothing is better.
  auto treeAt = [&](int n, int64_t nodes, bool* proven) {
    bool same = n == ncclTree.nChannels;
    double ncclTotal = graphTotal(ncclTree, inter);
    Graph g = bestChain(x, ncclTree, n, same ? ncclTotal : 0, false, nodes, proven);
    if (g.nChannels > 0) raiseTreeIntra(x, g);
    bool better = g.nChannels > 0 && (!same || graphTotal(g, inter) > ncclTotal * (1 + kRel) ||
                                      (graphTotal(g, inter) >= ncclTotal * (1 - kRel) &&
                                       g.nChannels * g.bwIntra > ncclTree.nChannels * ncclTree.bwIntra * (1 + kRel)));
    return better ? g : same ? ncclTree : Graph{};
  };
  if (doRing) {
    auto tr = std::chrono::steady_clock::now();
    int64_t n0 = budget.nodes;
    Best b;
    bool proven = true;
    Graph ringA = ncclRing;
    if (searchCounts(x, kPatternRing, std::max(1, ncclRing.minChannels), ncclRing.maxChannels,
                     graphTotal(ncclRing, inter), ncclRing.nChannels, true, share(0.45), &b, &proven)) {
      ringA = toGraph(m, ncclRing, b.rules, b.chans, b.speed, crossNicAttr(x, b.mode));
      dupChannels(ringA, x.ccMin, ngpus);
    }
    ring.proven = proven;
    ring.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tr).count();
    Graph ringUse = ringA, treeUse = ncclTree;
    if (doTree) {
      auto tt = std::chrono::steady_clock::now();
      int64_t t0n = budget.nodes;
      bool treeProven = true;
      Graph treeA = treeAt(ringA.nChannels, share(ringA.nChannels == ncclRing.nChannels ? 0.9 : 0.4), &treeProven);
      bool okA = treeA.nChannels > 0 && graphTotal(treeA, inter) >= graphTotal(ncclTree, inter) * (1 - kRel);
      ringUse = ringA;
      treeUse = okA ? treeA : ncclTree;
      if (ringA.nChannels != ncclRing.nChannels) {
        bool p2 = true;
        Graph ringB = bestChain(x, ncclRing, ncclRing.nChannels, graphTotal(ncclRing, inter), true, share(0.2), &p2);
        if (ringB.nChannels == 0) ringB = ncclRing;
        Graph treeB = treeAt(ncclTree.nChannels, share(0.9), &p2);
        treeProven = treeProven && p2;
        double ra = graphTotal(ringA, inter), rb = graphTotal(ringB, inter);
        // Rings within 1% of each other: the better tree decides, then fewer channels.
        double ta = graphTotal(treeA, inter), tb = graphTotal(treeB, inter);
        bool sameRing = std::abs(ra - rb) <= rb * kMoreChannelsGain;
        bool pickA = okA && (sameRing ? ta > tb * (1 + kRel) || (ta >= tb * (1 - kRel) && ringA.nChannels < ringB.nChannels)
                                      : worthIt(ra, ringA.nChannels, rb, ringB.nChannels));
        ringUse = pickA ? ringA : ringB;
        treeUse = pickA ? treeA : treeB;
      }
      tree.proven = treeProven;
      tree.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tt).count();
      tree.nodes = budget.nodes - t0n;
    }
    ring.nodes = budget.nodes - n0 - tree.nodes;
    auto differs = [](const Graph& a, const Graph& b) {
      return a.nChannels != b.nChannels || a.bwIntra != b.bwIntra || a.bwInter != b.bwInter || a.intra != b.intra ||
             a.inter != b.inter;
    };
    ring.graph = ringUse;
    ring.improved = differs(ringUse, ncclRing);
    tree.graph = treeUse;
    tree.improved = differs(treeUse, ncclTree);
  }
  finish(m, ncclRing, opts.ladderSpeeds, ring);
  finish(m, ncclTree, opts.ladderSpeeds, tree);

  // NVLS: its channels are fixed by NCCL's rules (every GPU a head on one node; heads with a NIC of their own
  // across nodes), so only the speeds can go further: exactly what the NVSwitch links and NICs allow.
  OptimizedGraph& nvls = res.graphs[kGraphNvls];
  const Graph& ncclNvls = nccl[kGraphNvls];
  describeBound(x, kPatternNvls, nvls);
  if (available[kGraphNvls] && ncclNvls.nChannels > 0) {
    timed(nvls, [&] {
      // As NCCL: one speed for both first, then the network speed raised up to twice the intra-node one (or to
      // NCCL's own, which its ladder may have taken one step further).
      Speeds sp(speedArray(x.ccMin, inter), opts.ladderSpeeds);
      Graph g = ncclNvls;
      g.bwIntra = g.bwInter = 1.0f;
      GraphLoad unit = graphLoad(m, g);
      double both = kInf;
      for (int r = 0; r < m.resources(); ++r)
        if (unit.used(r) > 0) both = std::min(both, m.capacity(r) / unit.used(r));
      g.bwIntra = g.bwInter = static_cast<float>(sp.quantize(both));
      double raised = inter ? maxSpeedFor(m, g, true) : kInf;
      double cap = std::max<double>(2.0 * g.bwIntra, ncclNvls.bwInter);
      g.bwInter = static_cast<float>(std::max<double>(g.bwInter, sp.quantize(std::min(raised, cap))));
      if (g.bwIntra < ncclNvls.bwIntra || g.bwInter < ncclNvls.bwInter) g = ncclNvls;
      if (g.bwIntra > ncclNvls.bwIntra || g.bwInter > ncclNvls.bwInter) {
        nvls.graph = g;
        nvls.improved = true;
      }
      nvls.proven = true;
    });
  }
  finish(m, ncclNvls, opts.ladderSpeeds, nvls);

  res.stoppedByClock = budget.clockStop;
  res.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace topocoll::search
