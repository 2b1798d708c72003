// The memo of sub-searches (see SubSearchMemo): the search state's keys and the table of what each sub-search
// walked cost.
//
// NCCL's search walks orders of the GPUs under step budgets. Different orders of the same GPUs often leave the
// links in the same state (each path charges its own links, whatever the order), so NCCL walks the same
// sub-search again and again. A sub-search that completes no channel changes nothing but the budget, and how many
// steps it takes depends only on the state it starts from. We remember that count by state and charge it instead
// of walking again: the budgets run out at the same step, the results are NCCL's, the work is smaller.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "search_common.h"
#include "topocoll/search/graph.h"

namespace topocoll::search::detail {

// Two independent 64-bit mixes (splitmix64's and MurmurHash3's finalizers): a 128-bit state key, so that two
// different search states sharing a key is not a practical possibility.
inline uint64_t mixA(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline uint64_t mixB(uint64_t x) {
  x ^= 0x2545f4914f6cdd1dULL;
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdULL;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}
inline uint64_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

struct Key128 {
  uint64_t a = 0, b = 0;
  void add(uint64_t x) { a += mixA(x), b += mixB(x); }
  void sub(uint64_t x) { a -= mixA(x), b -= mixB(x); }
  void fold(uint64_t x) { a = mixA(a ^ x), b = mixB(b + x); }
};

// A state key as a sum of words times per-slot odd constants (two independent lanes), mixed once at the end:
// cheaper than mixing every word, and two states differing in any word collide with probability ~2^-128.
constexpr uint64_t slotConstant(uint64_t i, uint64_t seed) {
  uint64_t x = i * 0x9e3779b97f4a7c15ULL + seed;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return (x ^ (x >> 31)) | 1;
}
constexpr int kMaxGpusInKey = 72;  // prefix words of a completing key; a larger node wraps around (still exact)
constexpr int kKeySlots = 256;
constexpr std::array<uint64_t, kKeySlots> slotTable(uint64_t seed) {
  std::array<uint64_t, kKeySlots> t{};
  for (int i = 0; i < kKeySlots; ++i) t[i] = slotConstant(static_cast<uint64_t>(i), seed);
  return t;
}
constexpr std::array<uint64_t, kKeySlots> kMulA = slotTable(0x243f6a8885a308d3ULL);
constexpr std::array<uint64_t, kKeySlots> kMulB = slotTable(0x13198a2e03707344ULL);
struct KeyAcc {
  static constexpr int kSlots = kKeySlots, kCompletingSlots = 96;
  uint64_t a = 0, b = 0;
  int slot = 0;
  void add(uint64_t w) {
    a += w * kMulA[slot & (kSlots - 1)];
    b += w * kMulB[slot & (kSlots - 1)];
    ++slot;
  }
  void add(uint64_t wa, uint64_t wb) {
    a += wa * kMulA[slot & (kSlots - 1)];
    b += wb * kMulB[slot & (kSlots - 1)];
    ++slot;
  }
  Key128 finish() const { return Key128{mixA(a), mixB(b ^ 0x6a09e667f3bcc909ULL)}; }
};

// The search state the memo keys sub-searches by. The links' part is kept up to date by every charge (HopCache,
// and the NICs' accounting); the rest changes as GPUs join and leave the channel being built.
struct StateKey {
  explicit StateKey(int ngpus);

  // Everything a sub-search that completes no channel reads: the links' bandwidths, the GPUs this channel uses,
  // the search's parameters, where it stands, the channel's first GPU and NETs, and of the channels before it only
  // what a replay (the previous channel's order) or the cross-NIC rule (the previous channel's first NET) reads.
  KeyAcc subSearch(const Graph& g, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
                   bool inter) const;
  // The key a sub-search that completes channels is remembered under (what it reads besides: below); `k` is its
  // subSearch key.
  KeyAcc completing(KeyAcc k, const Graph& g, int step, bool inter) const;

  // A type limit only matters through the paths it admits: two limits admitting the same path types of the system
  // give the same search. The key holds the highest type that occurs at or below the limit.
  static int effectiveType(int limit, uint32_t types) {
    if (limit < 0) return -1;
    const uint32_t below = limit >= 31 ? types : types & ((2u << limit) - 1);
    return below ? 31 - __builtin_clz(below) : -1;
  }

  // GPU `gpu` joins channel c (leave undoes it); `inside`, the private part of the GPU before it, now inside the
  // channel (zero when there is none), leaves the key meanwhile.
  void enter(int c, int gpu, const Key128& inside) {
    used[c].a ^= gpuMix[gpu].a, used[c].b ^= gpuMix[gpu].b;
    interior.a += inside.a, interior.b += inside.b;
  }
  void leave(int c, int gpu, const Key128& inside) {
    interior.a -= inside.a, interior.b -= inside.b;
    used[c].a ^= gpuMix[gpu].a, used[c].b ^= gpuMix[gpu].b;
  }

  const int ngpus;
  Key128 links;              // sum over the links (and NICs) of weight x bits of the bandwidth
  std::vector<Key128> priv;  // the part of `links` from each GPU's private links (the last: every other link)
  Key128 interior;           // the private parts of the GPUs inside the channel being built
  std::array<Key128, kMaxChannels + 1> used{};  // the GPUs each channel uses so far
  std::vector<Key128> gpuMix;                   // each GPU's part of `used` (xor-ed in while it is used)
  uint32_t intraTypes = 0, interTypes = 0;      // path types that occur, GPU/NVS to GPU/NVS and GPU to/from NET
};

// The keys are built at every step of the recursion: inline.
inline KeyAcc StateKey::subSearch(const Graph& g, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
                                  bool inter) const {
  const int c = g.nChannels, n = ngpus;
  KeyAcc k;
  k.a = links.a - interior.a;
  k.b = links.b - interior.b;
  k.add(used[c].a, used[c].b);
  k.add((static_cast<uint64_t>(c) << 48) | (static_cast<uint64_t>(gi + 1) << 32) |
        (static_cast<uint64_t>(step + 1) << 16) | static_cast<uint64_t>(forcedOrder));
  k.add((static_cast<uint64_t>(backToNet + 1) << 48) | (static_cast<uint64_t>(backToFirstRank + 1) << 32) |
        (static_cast<uint64_t>(g.pattern) << 16) | static_cast<uint64_t>(g.crossNic));
  k.add((static_cast<uint64_t>(effectiveType(g.typeIntra, intraTypes) + 1) << 32) |
        static_cast<uint64_t>(effectiveType(g.typeInter, interTypes) + 1));
  k.add((floatBits(g.bwIntra) << 32) | floatBits(g.bwInter));
  if (forcedOrder == kForcedOrderReplay && c > 0)
    for (int i = 0; i < n; ++i) k.add(static_cast<uint64_t>(g.intra[(c - 1) * n + i]));
  if (step < 0) return k;  // a unit that starts the channel: its first GPU and NETs are still to be chosen
  k.add(static_cast<uint64_t>(g.intra[c * n]));
  if (inter) {
    k.add(static_cast<uint64_t>(g.inter[c * 2]));
    if (g.pattern == kPatternBalancedTree) k.add(static_cast<uint64_t>(g.inter[c * 2 + 1]));
    if (g.pattern == kPatternRing && g.crossNic == 2 && (c & 1)) k.add(static_cast<uint64_t>(g.inter[(c - 1) * 2]));
  }
  return k;
}

// A sub-search that completes channels also reads, from the moment the first one completes: the channel's whole
// order (the next channel replays it), the hop count and channel limits (which solutions count as better), the
// NICs' remaining bandwidth (in `links`) and the channel's last NET. Walked again from the same state it finds
// solutions equal to those of its first walk, which the saved graph is at least as good as: it copies nothing.
inline KeyAcc StateKey::completing(KeyAcc k, const Graph& g, int step, bool inter) const {
  const int c = g.nChannels, n = ngpus;
  k.a += interior.a, k.b += interior.b;  // every link: the next channels read them all
  k.slot = KeyAcc::kCompletingSlots;     // apart from the slots a state key uses
  // Only a replay reads a finished channel's order: always within a node, with sameChannels across nodes.
  if (!inter || g.sameChannels == 1)
    for (int i = 1; i <= step; ++i) k.add(static_cast<uint64_t>(g.intra[c * n + i]));
  k.slot = KeyAcc::kCompletingSlots + kMaxGpusInKey;
  k.add((static_cast<uint64_t>(g.nHops) << 32) | (static_cast<uint64_t>(g.minChannels) << 16) |
        static_cast<uint64_t>(g.maxChannels));
  k.add((static_cast<uint64_t>(g.sameChannels) << 32) | static_cast<uint64_t>(g.collNet) | 1);
  if (inter && step >= 0) k.add(static_cast<uint64_t>(g.inter[c * 2 + 1]));
  return k;
}

// What a sub-search cost: the steps NCCL counts, and the part of them its budget paid (less where it ran a part
// under a budget of its own, as the first channel through a NIC in PCI order does).
struct Cost {
  int steps = 0, budget = 0;
};

// What each sub-search walked cost, by the state it started from: open addressing, grown at half load.
class StepMemo {
 public:
  const Cost* find(const Key128& k) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = k.a & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.gen != gen_) return nullptr;
      if (s.a == k.a && s.b == k.b) return &s.cost;
    }
  }
  void insert(const Key128& k, Cost cost);
  // Forgets every entry and keeps the table (a search's graphs reuse it).
  void clear();

 private:
  struct Slot {
    uint64_t a = 0, b = 0;
    Cost cost;
    uint32_t gen = 0;  // the entry is live when it equals gen_
  };
  void grow();
  uint32_t gen_ = 1;
  std::vector<Slot> slots_;
  size_t mask_ = 0, count_ = 0;
};

// The counts a search reports, which a sub-search charged from the memo adds to as its walk would have.
struct SearchCounters {
  long steps = 0, walked = 0;
  long completions = 0;  // channels completed (sub-searches that complete one are remembered apart)
  long leaks = 0;        // NICs whose bandwidth the search kept (recNet): such a sub-search is never remembered
};

// The memo of sub-searches, and the probes that turn it off where states never repeat.
class SubSearchMemo {
 public:
  static constexpr int kMinSteps = 4;  // smaller sub-searches (below a channel's start) are cheaper to walk

  // Whether remembering sub-searches that start at a given step pays: on some machines the states at a step never
  // repeat (every order there leaves the links differently), and a lookup costs a fair part of a step. A step whose
  // lookups saved less than a quarter step each over a probe stops using the memo until the next pass (passes that
  // differ only where the search does not look find each other's sub-searches).
  struct Gate {
    int lookups = 0;
    long saved = 0;
    bool off = false;
    void count(long steps) {
      ++lookups;
      saved += steps;
      if (lookups >= kGateProbe && 4 * saved < lookups) off = true;
    }
  };

  explicit SubSearchMemo(SearchCounters& counters) : counters_(counters) {}
  SubSearchMemo(const SubSearchMemo&) = delete;
  SubSearchMemo& operator=(const SubSearchMemo&) = delete;

  // A new graph's search: nothing remembered, every probe anew.
  void startSearch();
  // A new pass of the search loop: the entries carry over (their keys hold the pass's parameters), the gates of
  // the steps a pass reaches probe again.
  void startPass(int ngpus);
  // Whether the memo has paid over this graph's passes so far (counts this pass): a search where it saved less
  // than a quarter step per lookup over its first passes (tiny searches, where the states never repeat) need not
  // keep the state key for the rest of the graph. Between two passes every charge has been given back, so the key
  // needs no catching up, and the memo then never looks.
  bool pays(int ngpus);
  Gate& gate(int step) { return gates_[std::min(step, kGates - 1)]; }

  // Charges a sub-search from the memo when its state was walked before, walks it and remembers it otherwise.
  // `key` is the sub-search's state key, `completingKey` the one it is remembered under when it completes channels.
  template <typename Walk>
  void run(const Key128& key, const Key128& completingKey, int* time, Walk&& walk, int minSteps = kMinSteps,
           Gate* gate = nullptr) {
    const Cost* cost = table_.find(key);
    bool completes = false;
    if (!cost && (cost = table_.find(completingKey))) completes = true;
    // A budget that runs out midway stops the walk at the same step, unless part of the walk has its own budget.
    if (cost && (cost->budget <= *time || cost->steps == cost->budget)) {
      if (completes) ++counters_.completions;  // the skipped sub-search completes channels
      const int taken = std::min(cost->budget, *time);
      counters_.steps += cost->steps == cost->budget ? taken : cost->steps;
      ++lookups_, saved_ += taken;
      *time -= taken;
      if (gate) gate->count(taken);
      return;
    }
    if (gate) gate->count(0);
    ++lookups_;
    const int before = *time;
    const long steps = counters_.steps, completions = counters_.completions, leaks = counters_.leaks;
    walk();
    // A sub-search that kept a NIC's bandwidth changed more than the budget: it is walked every time.
    if (*time > 0 && before - *time >= minSteps && counters_.leaks == leaks)
      table_.insert(counters_.completions == completions ? key : completingKey,
                    Cost{static_cast<int>(counters_.steps - steps), before - *time});
  }

 private:
  static constexpr int kGates = 64, kGateProbe = 128;
  static constexpr int kProbePasses = 2, kProbeLookups = 64, kSmallNode = 4;
  SearchCounters& counters_;
  StepMemo table_;
  std::array<Gate, kGates> gates_{};
  long lookups_ = 0, saved_ = 0;
  int passes_ = 0;
};

}  // namespace topocoll::search::detail
