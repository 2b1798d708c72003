// Every path the search follows, flattened once into direct link pointers (the links do not move while a search
// runs), and NCCL's walk of a path over them (ncclTopoFollowPath's checks and charges): the search's hot loop.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "search_memo.h"
#include "speed_walks.h"
#include "topocoll/search/graph.h"

namespace topocoll::search::detail {

// roundf without the libm call: exact for every float (|x| >= 2^23 is already an integer).
inline float roundHalfAway(float x) {
  if (!(std::fabs(x) < 8388608.0f)) return x;
  float t = static_cast<float>(static_cast<int32_t>(x));  // truncation toward zero, exact
  if (std::fabs(x - t) >= 0.5f) t += x < 0 ? -1.0f : 1.0f;
  return t;
}
// NCCL's SUB_ROUND: keep link bandwidths rounded to 1e-3 so that taking and giving back cancel exactly.
inline void subRound(float& a, float b) { a = roundHalfAway((a - b) * 1000) / 1000; }

class HopCache {
 public:
  struct Hop {
    topology::Link* link;
    topology::Link* rev;  // reverse link that is charged too, or null
    float revMul;         // 1/8 for pre-Ampere DEV targets (not from a GPU), 1 for POWER NVLink to the CPU
    int id, revId;        // the links' dense indices
    bool pci;             // a PCI link (charged with Intel's overhead on PHB paths)
    // The links' weights in the state key and the parts of it their state goes to (StateKey::priv): a charge
    // reads them without another indirection.
    Key128 z, revZ;
    Key128* own = nullptr;
    Key128* revOwn = nullptr;
    float base = 0, revBase = 0;  // the links' bandwidths when the search starts (every pass starts from them)
  };
  // A path's hops are hops_[first, first + count): one array for every path (no allocation per path).
  struct HopPath {
    int first = 0, count = 0;  // the hops charged (links no check can refuse left out)
    int length = 0;            // the path's hop count (NCCL's nHops)
    int type = static_cast<int>(topology::PathType::DIS);
    bool intelPciOverhead = false;
    bool distinctLinks = true;  // no link is charged twice, so checking every hop before charging is NCCL's test
    bool anyRev = false;        // some hop charges a reverse link too
  };

  // Flattens the paths between GPUs, NVSwitches and NETs, and gives each link its weight and part in `key`
  // (`key.priv`, `key.intraTypes` and `key.interTypes` filled here). `dropSlack`: leave out the links no check
  // can refuse (hop_cache.cc).
  HopCache(topology::System& sys, StateKey& key, bool dropSlack);
  HopCache(const HopCache&) = delete;
  HopCache& operator=(const HopCache&) = delete;

  HopPath& path(topology::NodeType t1, int i1, topology::NodeType t2, int i2) {
    return paths_[((static_cast<size_t>(slot(t1)) * maxN_ + i1) * 3 + slot(t2)) * maxN_ + i2];
  }
  std::span<const Hop> hopsOf(const HopPath& hp) const {
    return {hops_.data() + hp.first, static_cast<size_t>(hp.count)};
  }
  // Every link the search charges starts with a bandwidth >= 0 (and keeps one: a charge needs the amount).
  bool nonNegative() const { return nonNegative_; }
  // Every GPU pair's paths have the same type both ways.
  bool symmetricTypes() const { return symmetricTypes_; }

  // Takes the links' bandwidths now as where every pass of a graph's search starts; true when they are where the
  // previous graph's search started them.
  bool resetBases();

  // The hops every path from a GPU to another GPU starts with (the same links, in the same order): a try from the
  // GPU to any next GPU fails when one of them holds less than the speed, since every amount charged on them is the
  // speed or more (Intel's PCI overhead only adds), so the search can skip the tries (they are not steps).
  bool prefixShort(int gpu, float bw, SpeedWalk* sw) const {
    const Prefix& pf = gpuPrefix_[gpu];
    for (int j = 0; j < pf.count; ++j) {
      const Hop& h = hops_[pf.first + j];
      if (h.link->bw < bw) {
        if (sw) sw->noteCheck(h.base, h.link->bw, bw, false);
        return true;
      }
    }
    return false;
  }

  // Charges the path (bw < 0 gives it back); false, with nothing charged and the short hop in `failed`, where a hop
  // lacks the bandwidth. `kKeyed`: the state key follows the charges. `sw`, when given, records the checks.
  template <bool kKeyed>
  bool chargePath(const HopPath& hp, float bw, SpeedWalk* sw, int* failed) {
    const int count = hp.count;
    // Giving back: no link has less than nothing, so no hop lacks a negative amount (nonNegative_).
    if (bw < 0 && nonNegative_) return chargeHops<kKeyed>(hp, bw), true;
    if (hp.distinctLinks) {
      // Every hop checked before any is charged: most tries fail at an early hop, where reading beats undoing.
      const int step = sw ? shortHop<true>(hp, bw, sw) : shortHop<false>(hp, bw, nullptr);
      if (step < count) return *failed = step, false;
      chargeHops<kKeyed>(hp, bw);
      return true;
    }
    const int step = followHops<kKeyed>(hp, count, bw, sw);
    if (step == count) return true;
    followHops<kKeyed>(hp, step, -bw, sw);
    return *failed = step, false;
  }

  // The link that refused `bw` at hop `step` of the path (the hop's link, or its reverse charge).
  const topology::Link* refusingLink(const HopPath& hp, int step, float bw) const;

 private:
  struct Prefix {
    int first = 0, count = 0;  // hops_[first, first + count) of one of the GPU's paths
  };
  static int slot(topology::NodeType t) {
    using topology::NodeType;
    return t == NodeType::GPU ? 0 : t == NodeType::NVS ? 1 : t == NodeType::NET ? 2 : -1;
  }
  void buildGpuPrefixes(int ngpus);
  void dropSlackHops(const std::vector<topology::Link*>& linkPtr);

  // NCCL's rounded subtraction on one link; the state key holds sum(weight x bits of the bandwidth) over all links.
  // `sum` collects the change of the key's links part (the caller adds it once per path).
  template <bool kKeyed>
  static void charge(float& bw, float amount, const Key128& z, Key128* own, Key128& sum) {
    const int64_t before = floatBits(bw);
    subRound(bw, amount);
    if (!kKeyed) return;
    const uint64_t delta = static_cast<uint64_t>(static_cast<int64_t>(floatBits(bw)) - before);
    uint64_t da = z.a * delta, db = z.b * delta;
#if defined(__GNUC__)
    // Two scalar multiplies: compilers otherwise pair the lanes in SSE2 registers at several times the cost.
    asm("" : "+r"(da), "+r"(db));
#endif
    sum.a += da;
    sum.b += db;
    own->a += da;
    own->b += db;
  }

  // NCCL's followPath: each hop checked, then charged, until one lacks the bandwidth (its index returned).
  template <bool kKeyed>
  int followHops(const HopPath& hp, int maxSteps, float bw, SpeedWalk* sw) {
    return hp.anyRev ? walkHops<kKeyed, true, true>(hp, maxSteps, bw, sw)
                     : walkHops<kKeyed, true, false>(hp, maxSteps, bw, sw);
  }
  // The same walk where no hop can lack the bandwidth (checked before, or given back): no test.
  template <bool kKeyed>
  void chargeHops(const HopPath& hp, float bw) {
    hp.anyRev ? walkHops<kKeyed, false, true>(hp, hp.count, bw, nullptr)
              : walkHops<kKeyed, false, false>(hp, hp.count, bw, nullptr);
  }
  template <bool kKeyed, bool kCheck, bool kRev>
  int walkHops(const HopPath& hp, int maxSteps, float bw, SpeedWalk* sw) {
    const float pciBw = hp.intelPciOverhead ? bw * 6 / 5 : bw;
    const Hop* hops = hops_.data() + hp.first;
    Key128 sum;
    int step = 0;
    for (; step < maxSteps; ++step) {
      const Hop& h = hops[step];
      const float fwBw = h.pci ? pciBw : bw;
      const float revBw = kRev && h.rev ? fwBw * h.revMul : 0.0f;
      if (kCheck) {
        const bool linkShort = h.link->bw < fwBw;
        if (sw) sw->noteCheck(h.base, h.link->bw, fwBw, !linkShort);
        if (linkShort) break;
        if (kRev && revBw != 0) {
          const bool revShort = h.rev->bw < revBw;
          if (sw) sw->noteCheck(h.revBase, h.rev->bw, revBw, !revShort);
          if (revShort) break;
        }
      }
      charge<kKeyed>(h.link->bw, fwBw, h.z, h.own, sum);
      if (kRev && revBw != 0) charge<kKeyed>(h.rev->bw, revBw, h.revZ, h.revOwn, sum);
    }
    if (kKeyed) linkKey_.a += sum.a, linkKey_.b += sum.b;
    return step;
  }
  // The first hop lacking the bandwidth (count when none does), charging nothing.
  template <bool kRecord>
  int shortHop(const HopPath& hp, float bw, SpeedWalk* sw) const {
    const float pciBw = hp.intelPciOverhead ? bw * 6 / 5 : bw;
    const Hop* hops = hops_.data() + hp.first;
    for (int step = 0; step < hp.count; ++step) {
      const Hop& h = hops[step];
      const float fwBw = h.pci ? pciBw : bw;
      const float revBw = h.rev ? fwBw * h.revMul : 0.0f;
      if (kRecord) {
        const bool linkShort = h.link->bw < fwBw;
        sw->noteCheck(h.base, h.link->bw, fwBw, !linkShort);
        if (linkShort) return step;
        if (revBw != 0) {
          const bool revShort = h.rev->bw < revBw;
          sw->noteCheck(h.revBase, h.rev->bw, revBw, !revShort);
          if (revShort) return step;
        }
        continue;
      }
      if (h.link->bw < fwBw || (revBw != 0 && h.rev->bw < revBw)) return step;
    }
    return hp.count;
  }

  Key128& linkKey_;  // the state key's links part
  int maxN_ = 0;
  std::vector<HopPath> paths_;  // by (type, index) of both ends
  std::vector<Hop> hops_;
  bool nonNegative_ = true;
  std::vector<Prefix> gpuPrefix_;
  bool symmetricTypes_ = true;
};

}  // namespace topocoll::search::detail
