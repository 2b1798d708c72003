// The channel search. Follows NCCL 2.30.7 src/graph/search.cc (ncclTopoCompute, ncclTopoSearchRec* and their
// helpers, ncclTopoDupChannels) (Apache-2.0) rule by rule, with a memo of sub-searches that changes the work, not
// the result (see Searcher's memo section).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
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
constexpr int kTopoMaxNodes = 640;  // NCCL_TOPO_MAX_NODES (src/include/graph.h)
constexpr int kMemoMinSteps = 4;  // smaller sub-searches (below a channel's start) are cheaper to walk than to remember
constexpr int kForcedOrderPci = 1;
constexpr int kForcedOrderReplay = 2;
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
    if (size_ < N)
      inline_[size_] = v;
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
  void insert(const Key128& k, Cost cost) {
    if (2 * (count_ + 1) > slots_.size()) grow();
    for (size_t i = k.a & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.gen != gen_) {
        s = Slot{k.a, k.b, cost, gen_};
        ++count_;
        return;
      }
      if (s.a == k.a && s.b == k.b) return;
    }
  }
  // Forgets every entry and keeps the table (a search's graphs reuse it).
  void clear() {
    count_ = 0;
    if (++gen_ == 0) {  // wrapped: old generations could read as current
      std::fill(slots_.begin(), slots_.end(), Slot{});
      gen_ = 1;
    }
  }

 private:
  struct Slot {
    uint64_t a = 0, b = 0;
    Cost cost;
    uint32_t gen = 0;  // the entry is live when it equals gen_
  };
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 256 : old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    count_ = 0;
    for (const Slot& s : old)
      if (s.gen == gen_) insert(Key128{s.a, s.b}, s.cost);
  }
  uint32_t gen_ = 1;
  std::vector<Slot> slots_;
  size_t mask_ = 0, count_ = 0;
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

class Searcher {
 public:
  Searcher(System& sys, const Config& cfg) : sys_(sys), cfg_(cfg), ngpus_(sys.count(NodeType::GPU)) { buildHopCache(); }

  // Every path the search follows, flattened once into direct link pointers (the links do not move while a
  // search runs): followPath is the hot loop of the search.
  struct Hop {
    Link* link;
    Link* rev;      // reverse link that is charged too, or null
    float revMul;   // 1/8 for pre-Ampere DEV targets (not from a GPU), 1 for POWER NVLink to the CPU
    int id, revId;  // the links' dense indices (linkData_)
    bool pci;       // a PCI link (charged with Intel's overhead on PHB paths)
    // The links' LinkData, copied in once the cache is built: a charge reads them without another indirection.
    Key128 z, revZ;
    Key128* own = nullptr;
    Key128* revOwn = nullptr;
    float base = 0, revBase = 0;  // the links' bandwidths when the search starts (every pass starts from them)
  };
  // What the search keeps per link: its weight in the state key and the part of privState_ its state goes to.
  struct LinkData {
    Key128 z;
    Key128* own = nullptr;
  };
  std::vector<LinkData> linkData_;
  std::vector<Link*> linkPtr_;                                   // each link by its dense index
  std::array<std::vector<int>, topology::kNodeTypes> linkBase_;  // dense index of each node's first link
  int linkId(NodeRef node, const Link* l) const {
    return linkBase_[static_cast<int>(node.type)][node.index] + static_cast<int>(l - sys_.at(node).links.data());
  }
  // A path's hops are hops_[first, first + count): one array for every path (no allocation per path).
  struct HopPath {
    int first = 0, count = 0;  // the hops charged (links no check can refuse left out)
    int length = 0;            // the path's hop count (NCCL's nHops)
    int type = static_cast<int>(PathType::DIS);
    bool intelPciOverhead = false;
    bool distinctLinks = true;  // no link is charged twice, so checking every hop before charging is NCCL's test
    bool anyRev = false;        // some hop charges a reverse link too
  };
  static int slot(NodeType t) { return t == NodeType::GPU ? 0 : t == NodeType::NVS ? 1 : t == NodeType::NET ? 2 : -1; }
  int maxN_ = 0;
  std::vector<HopPath> hopCache_;
  std::vector<Hop> hops_;
  // Every link the search charges starts with a bandwidth >= 0 (and keeps one: a charge needs the amount).
  bool nonNegative_ = true;
  const Hop* hopsOf(const HopPath& hp) const { return hops_.data() + hp.first; }
  HopPath& hopPath(NodeType t1, int i1, NodeType t2, int i2) {
    return hopCache_[((static_cast<size_t>(slot(t1)) * maxN_ + i1) * 3 + slot(t2)) * maxN_ + i2];
  }
  void buildHopCache() {
    maxN_ = std::max({sys_.count(NodeType::GPU), sys_.count(NodeType::NVS), sys_.count(NodeType::NET), 1});
    hopCache_.assign(static_cast<size_t>(3) * maxN_ * 3 * maxN_, HopPath{});
    hops_.clear();
    privState_.assign(ngpus_ + 1, Key128{});  // the last one collects the other links' parts (unused)
    gpuMix_.resize(ngpus_);
    for (int g = 0; g < ngpus_; ++g)
      gpuMix_[g] = Key128{mixA(static_cast<uint64_t>(g)), mixB(static_cast<uint64_t>(g))};
    int links = 0;
    for (int t = 0; t < topology::kNodeTypes; ++t) {
      for (const Node& node : sys_.nodes[t]) {
        linkBase_[t].push_back(links);
        links += static_cast<int>(node.links.size());
      }
    }
    linkData_.assign(links, LinkData{});
    linkPtr_.assign(links, nullptr);
    for (int t = 0, id = 0; t < topology::kNodeTypes; ++t)
      for (Node& node : sys_.nodes[t])
        for (Link& l : node.links) linkPtr_[id++] = &l;
    endpoints_.assign(links, Endpoints{});
    for (int id = 0; id < links; ++id) {
      const uint64_t w = static_cast<uint64_t>(id) + 1;  // a random odd weight per link
      linkData_[id].z = Key128{mixA(w) | 1, mixB(w) | 1};
    }
    for (NodeType t1 : {NodeType::GPU, NodeType::NVS, NodeType::NET}) {
      for (int i1 = 0; i1 < sys_.count(t1); ++i1) {
        NodeRef start{t1, i1};
        for (NodeType t2 : {NodeType::GPU, NodeType::NVS, NodeType::NET}) {
          const auto& paths = sys_.at(start).paths[T(t2)];
          for (int i2 = 0; i2 < static_cast<int>(paths.size()); ++i2) {
            const Path& path = paths[i2];
            HopPath& hp = hopPath(t1, i1, t2, i2);
            hp.type = P(path.type);
            hp.first = static_cast<int>(hops_.size());
            hp.count = path.count();
            ((t1 == NodeType::NET || t2 == NodeType::NET) ? interTypes_ : intraTypes_) |= 1u << hp.type;
            for (int step = 0; step < path.count(); ++step) {
              const Node& n = sys_.at(sys_.link(path.list[step]).rem);
              if (n.type == NodeType::CPU && path.type == PathType::PHB && t1 == NodeType::GPU &&
                  n.arch == topology::kCpuArchX86 && n.vendor == topology::kCpuVendorIntel)
                hp.intelPciOverhead = true;
            }
            NodeRef node = start;
            for (int step = 0; step < path.count(); ++step) {
              Link& link = sys_.link(path.list[step]);
              Hop h{&link, nullptr, 0.0f, linkId(node, &link), -1, link.type == LinkType::PCI, {}, {}};
              const Node& rem = sys_.at(link.rem);
              if (link.rem.type == NodeType::DEV && rem.cudaCompCap < 80 && t1 != NodeType::GPU) {
                h.rev = findRev(node, link.rem, link.type);
                h.revMul = 0.125f;
              }
              if (link.rem.type == NodeType::CPU && rem.arch == topology::kCpuArchPower && link.type == LinkType::NVL) {
                h.rev = findRev(node, link.rem, link.type);
                h.revMul = 1.0f;
              }
              if (h.rev) h.revId = linkId(link.rem, h.rev), hp.anyRev = true;
              hops_.push_back(h);
              node = link.rem;
            }
            hp.length = hp.count;
            const int e1 = t1 == NodeType::GPU ? i1 : -1, e2 = t2 == NodeType::GPU ? i2 : -1;
            for (const Hop& h : pathHops(hp)) {
              noteEndpoints(h.id, e1, e2);
              if (h.rev) noteEndpoints(h.revId, e1, e2);
            }
          }
        }
      }
    }
    for (int id = 0; id < links; ++id) {
      const Endpoints& ep = endpoints_[id];
      linkData_[id].own = ep.a >= 0 && ep.b < 0 ? &privState_[ep.a] : &privState_[ngpus_];
    }
    if (cfg_.searchMemo && !amd_) dropSlackHops(links);  // TOPOCOLL_SEARCH_MEMO=0 (and RCCL): every link charged
    SmallVec<const Link*, 64> charged;
    for (HopPath& hp : hopCache_) {
      charged.resize(0);
      for (const Hop& h : pathHops(hp)) {
        charged.push_back(h.link);
        if (h.rev) charged.push_back(h.rev);
      }
      std::sort(charged.begin(), charged.end());
      hp.distinctLinks = std::adjacent_find(charged.begin(), charged.end()) == charged.end();
    }
    for (Hop& h : hops_) {
      nonNegative_ &= h.link->bw >= 0 && (!h.rev || h.rev->bw >= 0);
      h.z = linkData_[h.id].z;
      h.own = linkData_[h.id].own;
      if (h.rev) h.revZ = linkData_[h.revId].z, h.revOwn = linkData_[h.revId].own;
    }
    buildGpuPrefixes();
  }

  // The hops every path from a GPU to another GPU starts with (the same links, in the same order): a try from the
  // GPU to any next GPU fails when one of them holds less than the speed, since every amount charged on them is the
  // speed or more (Intel's PCI overhead only adds). recGpuSteps then skips the tries (they are not steps).
  struct Prefix {
    int first = 0, count = 0;  // hops_[first, first + count) of one of the GPU's paths
  };
  std::vector<Prefix> gpuPrefix_;
  bool symmetricTypes_ = true;  // every GPU pair's paths have the same type both ways
  // Behind an NVSwitch the candidates are at most two neighbours, whose NVLinks rarely fill: no prefix check.
  bool prefixCheck_ = false;
  void buildGpuPrefixes() {
    gpuPrefix_.assign(ngpus_, Prefix{});
    for (int a = 0; a < ngpus_; ++a) {
      const HopPath* ref = nullptr;
      int common = 0;
      for (int b = 0; b < ngpus_; ++b) {
        const HopPath& hp = hopPath(NodeType::GPU, a, NodeType::GPU, b);
        if (b == a || hp.count == 0) continue;
        if (!ref) {
          ref = &hp, common = hp.count;
          continue;
        }
        int j = 0;
        while (j < common && j < hp.count && hopsOf(hp)[j].link == hopsOf(*ref)[j].link) ++j;
        common = j;
      }
      if (ref) gpuPrefix_[a] = Prefix{ref->first, common};
      for (int b = 0; b < ngpus_; ++b)
        symmetricTypes_ &=
            hopPath(NodeType::GPU, a, NodeType::GPU, b).type == hopPath(NodeType::GPU, b, NodeType::GPU, a).type;
    }
  }
  bool prefixShort(int gpu, float bw) {
    const Prefix& pf = gpuPrefix_[gpu];
    for (int j = 0; j < pf.count; ++j) {
      const Hop& h = hops_[pf.first + j];
      if (h.link->bw < bw) {
        if (sw_) noteCheck(h.base, h.link->bw, bw, false);
        return true;
      }
    }
    return false;
  }
  std::span<const Hop> pathHops(const HopPath& hp) const { return {hopsOf(hp), static_cast<size_t>(hp.count)}; }

  // Links no check can refuse, left out of every walk. A link L qualifies when every path through it also
  // charges, right next to it, one of a set K of other links at least L's amount (the same path and multiplier;
  // a PCI link's amount carries Intel's overhead, so L PCI needs K PCI), no reverse charge touches it, and
  // bw(L) >= 2 x sum of K's bandwidths + 2 x the largest amount any search charges (NVLS's x2 of the fastest
  // speed with the PCI overhead). What is charged on L at any moment is then at most what is charged on K, which
  // never exceeds K's bandwidth (a charge needs the amount available), so L always keeps more than any amount:
  // NCCL's checks on L all pass and its value decides nothing. (The margin of 2 covers SUB_ROUND's rounding:
  // each operation moves a value by under 0.00125, and round trips restore it exactly in practice, as the memo
  // already relies on.) Typically the GPU <-> DEV local links (LOC_BW, 5000 GB/s): 2 of the 4 to 7 hops of a
  // PCIe machine's GPU paths. The charges left out leave L at its first value (NCCL's drifts by at most a few
  // thousandths, which nothing reads).
  static constexpr float kMaxAmount = 2.0f * 1.2f * 96.0f;  // NVLS x2, Intel PCI overhead x1.2, the fastest speed
  std::vector<char> slack_;                                 // by link id: left out
  void dropSlackHops(int links) {
    std::vector<char> candidate(links, 1), seen(links, 0);
    std::vector<std::pair<int, int>> guards;  // (link, a link next to it on some path)
    for (const HopPath& hp : hopCache_) {
      const Hop* hops = hopsOf(hp);
      for (int j = 0; j < hp.count; ++j) {
        const Hop& h = hops[j];
        seen[h.id] = 1;
        if (h.rev) candidate[h.id] = candidate[h.revId] = 0;
        const int nb = j + 1 < hp.count ? j + 1 : j - 1;
        if (nb < 0 || hops[nb].id == h.id || (h.pci && !hops[nb].pci)) {
          candidate[h.id] = 0;
          continue;
        }
        guards.emplace_back(h.id, hops[nb].id);
      }
    }
    std::sort(guards.begin(), guards.end());
    guards.erase(std::unique(guards.begin(), guards.end()), guards.end());
    std::vector<double> guardBw(links, 0.0);
    for (auto [id, k] : guards) guardBw[id] += std::max(0.0f, linkPtr_[k]->bw);
    slack_.assign(links, 0);
    bool any = false;
    for (int id = 0; id < links; ++id) {
      if (!seen[id] || !candidate[id]) continue;
      if (static_cast<double>(linkPtr_[id]->bw) >= 2 * guardBw[id] + 2 * static_cast<double>(kMaxAmount))
        slack_[id] = 1, any = true;
    }
    if (!any) return;
    std::vector<Hop> kept;
    kept.reserve(hops_.size());
    for (HopPath& hp : hopCache_) {
      const int first = static_cast<int>(kept.size());
      for (const Hop& h : pathHops(hp))
        if (!slack_[h.id]) kept.push_back(h);
      hp.first = first;
      hp.count = static_cast<int>(kept.size()) - first;
    }
    hops_ = std::move(kept);
  }

  // A link is private to a GPU when every path the search may follow through it starts or ends at that GPU: once
  // the GPU sits inside the channel being built (neither its first GPU nor the current one), no sub-search below
  // touches the link again, so the link's state does not belong in the key of those sub-searches.
  struct Endpoints {
    int a = -2, b = -2;  // GPUs every path through the link has as an endpoint (-2: no path yet, -1: none)
  };
  std::vector<Endpoints> endpoints_;
  void noteEndpoints(int id, int e1, int e2) {
    Endpoints& ep = endpoints_[id];
    if (ep.a == -2) {
      ep = Endpoints{e1, e2};
      if (ep.a == -1) std::swap(ep.a, ep.b);
      return;
    }
    auto in = [&](int g) { return g >= 0 && (g == e1 || g == e2); };
    Endpoints kept{-1, -1};
    if (in(ep.a)) kept.a = ep.a;
    if (in(ep.b)) (kept.a == -1 ? kept.a : kept.b) = ep.b;
    ep = kept;
  }
  // NCCL's rounded subtraction on one link; the state key holds sum(weight x bits of the bandwidth) over all links.
  // `sum` collects the change of linkState_ (the caller adds it once per path).
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

  // The GPUs closest to each NET (ncclTopoGetLocal): paths do not change during a search.
  struct LocalGpus {
    std::vector<int> gpus;
    PathType type = PathType::DIS;
  };
  std::vector<LocalGpus> netLocals_;
  const LocalGpus& netLocalGpus(int net) {
    if (netLocals_.empty()) {
      netLocals_.resize(sys_.count(NodeType::NET));
      for (int i = 0; i < sys_.count(NodeType::NET); ++i)
        netLocals_[i].gpus = paths::getLocal(sys_, NodeType::NET, i, NodeType::GPU, &netLocals_[i].type);
    }
    return netLocals_[net];
  }

  // recNet's NIC accounting (no rounding: NCCL subtracts the integer part of bwInter), in the state key too.
  void chargeNet(Node& net, float amount) {
    const int64_t before = floatBits(net.bw);
    net.bw -= amount;
    const uint64_t delta = static_cast<uint64_t>(static_cast<int64_t>(floatBits(net.bw)) - before);
    const uint64_t id = 0x4e4554ULL << 32 | static_cast<uint64_t>(&net - sys_.of(NodeType::NET).data());
    linkState_.a += (mixA(id) | 1) * delta;
    linkState_.b += (mixB(id) | 1) * delta;
  }

  // NCCL's walk of a path: each hop checked, then charged; the hops charged before a failing one are given back.

  // --- Tracing for `plan --explain`: counts only, never a decision (a traced search walks without the memo). ---
  SearchTrace* trace_ = nullptr;
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
    const Hop& h = hopsOf(hp)[step];
    const float fw = h.pci && hp.intelPciOverhead ? bw * 6 / 5 : bw;
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

  // NCCL's followPath: each hop checked, then charged, until one lacks the bandwidth (its index returned).
  template <bool kKeyed>
  int followHops(const HopPath& hp, int maxSteps, float bw) {
    return hp.anyRev ? walkHops<kKeyed, true, true>(hp, maxSteps, bw) : walkHops<kKeyed, true, false>(hp, maxSteps, bw);
  }
  // The same walk where no hop can lack the bandwidth (checked before, or given back): no test.
  template <bool kKeyed>
  void chargeHops(const HopPath& hp, float bw) {
    hp.anyRev ? walkHops<kKeyed, false, true>(hp, hp.count, bw) : walkHops<kKeyed, false, false>(hp, hp.count, bw);
  }
  template <bool kKeyed, bool kCheck, bool kRev>
  int walkHops(const HopPath& hp, int maxSteps, float bw) {
    const float pciBw = hp.intelPciOverhead ? bw * 6 / 5 : bw;
    const Hop* hops = hopsOf(hp);
    Key128 sum;
    int step = 0;
    for (; step < maxSteps; ++step) {
      const Hop& h = hops[step];
      const float fwBw = h.pci ? pciBw : bw;
      const float revBw = kRev && h.rev ? fwBw * h.revMul : 0.0f;
      if (kCheck) {
        const bool linkShort = h.link->bw < fwBw;
        if (sw_) noteCheck(h.base, h.link->bw, fwBw, !linkShort);
        if (linkShort) break;
        if (kRev && revBw != 0) {
          const bool revShort = h.rev->bw < revBw;
          if (sw_) noteCheck(h.revBase, h.rev->bw, revBw, !revShort);
          if (revShort) break;
        }
      }
      charge<kKeyed>(h.link->bw, fwBw, h.z, h.own, sum);
      if (kRev && revBw != 0) charge<kKeyed>(h.rev->bw, revBw, h.revZ, h.revOwn, sum);
    }
    if (kKeyed) linkState_.a += sum.a, linkState_.b += sum.b;
    return step;
  }
  // The first hop lacking the bandwidth (count when none does), charging nothing.
  template <bool kRecord>
  int shortHop(const HopPath& hp, float bw) {
    const float pciBw = hp.intelPciOverhead ? bw * 6 / 5 : bw;
    const Hop* hops = hopsOf(hp);
    for (int step = 0; step < hp.count; ++step) {
      const Hop& h = hops[step];
      const float fwBw = h.pci ? pciBw : bw;
      const float revBw = h.rev ? fwBw * h.revMul : 0.0f;
      if (kRecord) {
        const bool linkShort = h.link->bw < fwBw;
        noteCheck(h.base, h.link->bw, fwBw, !linkShort);
        if (linkShort) return step;
        if (revBw != 0) {
          const bool revShort = h.rev->bw < revBw;
          noteCheck(h.revBase, h.rev->bw, revBw, !revShort);
          if (revShort) return step;
        }
        continue;
      }
      if (h.link->bw < fwBw || (revBw != 0 && h.rev->bw < revBw)) return step;
    }
    return hp.count;
  }

  // --- Speeds whose walks come out the same (single-node searches). ---
  // Within one node every amount a walk charges or checks is the speed (bwIntra) times a constant of the path
  // (1, Intel's 6/5 on PHB PCI hops, the reverse links' multipliers), and the walk reads the speed nowhere else
  // but in compareGraphs. So a check "link keeps at least the amount" made at speed s with the link at v (base
  // value B, amount a) has, at speed s' = r x s, the link at B - r x (B - v) and the amount r x a, up to SUB_ROUND's
  // rounding: the same outcome for every r in [(B + E) / (B - v + a - E), inf) when it failed, in
  // [0, (B - E) / (B - v + a + E)] when it passed, E bounding the rounding of both walks (each SUB_ROUND moves a value
  // by at most 0.0005 plus float rounding, and a link holds at most a few dozen charges: E = 0.25 GB/s is over ten
  // times that). Each speed keeps the intersection of these ranges over every check walked at it (`SpeedWalk`), and
  // the most channels any channel completion had. A later pass at s' whose parameters equal those of a pass walked
  // at s (`PassRecord`), with s'/s inside s's range and no completion able to beat the saved graph at s'
  // (maxChannels x s' below the saved channels x speed: compareGraphs never copies, so the walk never stops early),
  // makes the same decisions at every step: it counts the same steps and leaves the same budget, and copies
  // nothing. It is charged without a walk. (Sub-searches the memo skipped were walked at the same speed, since the
  // memo's keys hold it: their checks are in the same range.)
  static constexpr float kCheckMargin = 0.25f;
  struct SpeedWalk {
    float speed = 0;
    float lo = 0, hi = std::numeric_limits<float>::infinity();  // the ratios s'/s with the same outcomes
    int maxChannels = 0;                                        // the most channels of any completion
    bool reachedLast = false;                                   // some walk reached a channel's last GPU
  };
  struct PassRecord {
    uint64_t group = 0;  // the pass's parameters other than the speed
    int startTime = 0, endTime = 0;
    float speed = 0;
    long steps = 0;
    int crossNic = 0;
    int walk = 0;                                       // its SpeedWalk
    int pattern = 0, minChannels = 0, maxChannels = 0;  // read only where a channel completes
  };
  std::vector<SpeedWalk> speedWalks_;
  std::vector<PassRecord> passRecords_;
  SpeedWalk* sw_ = nullptr;  // the speed being walked, while a pass records
  int passesShared_ = 0;
  void noteCheck(float base, float v, float amount, bool ok) {
    if (!(amount > 0)) return;  // a give-back's walk (nothing to check)
    const float den = base - v + amount;
    if (ok) {
      if (base - kCheckMargin < sw_->hi * (den + kCheckMargin)) sw_->hi = (base - kCheckMargin) / (den + kCheckMargin);
    } else if (den <= kCheckMargin) {
      sw_->lo = std::numeric_limits<float>::infinity();
    } else if (base + kCheckMargin > sw_->lo * (den - kCheckMargin)) {
      sw_->lo = (base + kCheckMargin) / (den - kCheckMargin);
    }
  }
  // Rings and trees within one node walk alike up to a channel's last GPU (where a ring goes back to its first GPU
  // and a tree completes) when no NVSwitch orders the candidates by pattern and every GPU pair's path has one type
  // both ways (a tree also checks the way back): a pass whose walks never reached a last GPU is shared across them,
  // from the ring's search to the tree's (the records outlive one graph's search while the links' bases agree).
  int walkClass(int pattern) const {
    const bool alike = pattern == kPatternRing || pattern == kPatternBalancedTree || pattern == kPatternTree ||
                       pattern == kPatternSplitTree;
    return alike && symmetricTypes_ && sys_.count(NodeType::NVS) == 0 ? 0 : 16 + pattern;
  }
  uint64_t passGroup(const Graph& g, int startTime) const {
    Key128 k;
    k.fold(static_cast<uint64_t>(walkClass(g.pattern)) << 32 | static_cast<uint32_t>(startTime));
    k.fold(static_cast<uint64_t>(effectiveType(g.typeIntra, intraTypes_) + 1));  // one node: typeInter unread
    k.fold(static_cast<uint64_t>(g.sameChannels));
    return k.a ^ k.b;
  }
  bool speedSkipApplies(const Graph& g) const {
    return memoOn_ && !sys_.inter && !amd_ && nonNegative_ && g.collNet == 0 && g.pattern != kPatternNvls &&
           g.pattern != kPatternCollnetDirect;
  }
  // A pass walked before whose decisions this one repeats (null if none): see the section's comment.
  const PassRecord* samePass(const Graph& g, const Graph& save, uint64_t group, int startTime) const {
    const float s = g.bwIntra;
    const float best = static_cast<float>(save.nChannels) * save.bwIntra;
    for (const PassRecord& r : passRecords_) {
      if (r.group != group || r.startTime != startTime) continue;
      const bool alike = r.pattern == g.pattern && r.minChannels == g.minChannels && r.maxChannels == g.maxChannels;
      if (!alike && speedWalks_[r.walk].reachedLast) continue;
      const SpeedWalk* w = &speedWalks_[r.walk];
      const float ratio = s / r.speed;
      // At the same speed every check is the same arithmetic: only the cross-NIC setting differs (it decides
      // nothing within one node but compareGraphs' ties, which need the saved graph's setting).
      if (r.speed != s && !(ratio >= w->lo && ratio <= w->hi)) continue;
      const float most = static_cast<float>(w->maxChannels) * s;
      const bool tiesCopyNothing = save.crossNic != g.crossNic || save.pattern != g.pattern;
      if (w->maxChannels > 0 && !(most < best || (most == best && tiesCopyNothing))) continue;
      return &r;
    }
    return nullptr;
  }
  size_t runWalks_ = 0;  // the first SpeedWalk of this graph's search (earlier ones stay with earlier records)
  int speedWalk(float s) {
    for (size_t i = runWalks_; i < speedWalks_.size(); ++i)
      if (speedWalks_[i].speed == s) return static_cast<int>(i);
    speedWalks_.push_back(SpeedWalk{s});
    return static_cast<int>(speedWalks_.size()) - 1;
  }
  // Charges the path (bw < 0 gives it back); false, with nothing charged and the short hop in `failed`, where a hop
  // lacks the bandwidth.
  template <bool kKeyed>
  bool chargePath(const HopPath& hp, float bw, int* failed) {
    const int count = hp.count;
    // Giving back: no link has less than nothing, so no hop lacks a negative amount (nonNegative_).
    if (bw < 0 && nonNegative_) return chargeHops<kKeyed>(hp, bw), true;
    if (hp.distinctLinks) {
      // Every hop checked before any is charged: most tries fail at an early hop, where reading beats undoing.
      const int step = sw_ ? shortHop<true>(hp, bw) : shortHop<false>(hp, bw);
      if (step < count) return *failed = step, false;
      chargeHops<kKeyed>(hp, bw);
      return true;
    }
    const int step = followHops<kKeyed>(hp, count, bw);
    if (step == count) return true;
    followHops<kKeyed>(hp, step, -bw);
    return *failed = step, false;
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
    bool intra =
        (n1.type == NodeType::GPU || n1.type == NodeType::NVS) && (type2 == NodeType::GPU || type2 == NodeType::NVS);
    float bw = intra ? g.bwIntra : g.bwInter;
    int type = intra ? g.typeIntra : g.typeInter;
    if (hp.type >= P(PathType::DIS)) return false;
    if (mult == 1 && hp.type > type) return noteType(intra, hp.type), false;
    if (mult == 1 &&
        (g.pattern == kPatternBalancedTree || g.pattern == kPatternTree || g.pattern == kPatternSplitTree) &&
        hopPath(type2, index2, n1.type, index1).type > type)
      return noteType(intra, hopPath(type2, index2, n1.type, index1).type), false;
    bw *= mult;
    int failed = -1;
    if (!(keyed_ ? chargePath<true>(hp, bw, &failed) : chargePath<false>(hp, bw, &failed))) {
      if (mult > 0 && failed >= 0) noteFull(hp, failed, bw);
      return false;
    }
    g.nHops = static_cast<int>(static_cast<float>(g.nHops) + mult * static_cast<float>(hp.length));
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
    if (netIdx < 0) {
      // The static order, filtered in place: two passes over the cached list, nothing copied.
      const std::vector<Score>& sorted = sortedCandidates(gpu);
      const auto& gpus = sys_.of(NodeType::GPU);
      int count = 0;
      const Score* first = nullptr;
      bool sameIntra = true;
      for (const Score& sc : sorted) {
        if (gpus[sc.g].used & flag) continue;
        if (!first)
          first = &sc;
        else if (sc.intraBw != first->intraBw || sc.intraNhops != first->intraNhops)
          sameIntra = false;
        ++count;
      }
      next.resize(count);
      const bool reverse = sortNet == -1 && sameIntra;
      int i = 0;
      for (const Score& sc : sorted) {
        if (gpus[sc.g].used & flag) continue;
        next[reverse ? count - 1 - i : i] = sc.g;
        ++i;
      }
      return;
    }
    // Sorting by NET: only the GPUs' PCI bandwidth changes. The static order (by interBw, then the static
    // fields) is computed once; each sort orders packed keys (interBw's rank, PCI bandwidth, static position).
    const StaticOrder& so = staticOrder(gpu, netIdx);
    const auto& gpus = sys_.of(NodeType::GPU);
    SmallVec<uint64_t, 32> keys;
    const Score* first = nullptr;
    bool sameIntra = true;
    for (int pos = 0; pos < static_cast<int>(so.scores.size()); ++pos) {
      const Score& sc = so.scores[pos];
      if (gpus[sc.g].used & flag) continue;
      if (!first)
        first = &sc;
      else if (sc.intraBw != first->intraBw || sc.intraNhops != first->intraNhops)
        sameIntra = false;
      const uint32_t pci = static_cast<uint32_t>(0x7fffffff - static_cast<int64_t>(std::max(gpuPciBw(sc.g), -1)));
      keys.push_back(static_cast<uint64_t>(so.group[pos]) << 48 | static_cast<uint64_t>(pci) << 16 |
                     static_cast<uint64_t>(pos));
    }
    const int count = static_cast<int>(keys.size());
    for (int i = 1; i < count; ++i)  // insertion sort: a handful of keys
      for (int j = i; j > 0 && keys[j] < keys[j - 1]; --j) std::swap(keys[j], keys[j - 1]);
    next.resize(count);
    const bool reverse = sortNet == -1 && sameIntra;
    for (int i = 0; i < count; ++i) next[reverse ? count - 1 - i : i] = so.scores[keys[i] & 0xffff].g;
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

  // The candidates of a GPU sorted by NCCL's order with every PCI bandwidth equal (their static order), and
  // the rank of each one's interBw among them: NCCL's order is (interBw rank, PCI bandwidth down, static order).
  struct StaticOrder {
    std::vector<Score> scores;
    std::vector<uint16_t> group;
    bool done = false;
  };
  std::vector<StaticOrder> staticOrders_;
  const StaticOrder& staticOrder(int gpu, int netIdx) {
    const int nets = sys_.count(NodeType::NET);
    if (staticOrders_.empty()) staticOrders_.resize(static_cast<size_t>(ngpus()) * nets);
    StaticOrder& so = staticOrders_[static_cast<size_t>(gpu) * nets + netIdx];
    if (so.done) return so;
    so.done = true;
    SmallVec<Score, 32> tmp;
    scoreCandidates(gpu, netIdx, tmp, 0, false);
    so.scores.assign(tmp.begin(), tmp.end());
    for (size_t i = 0; i < so.scores.size(); ++i)
      so.group.push_back(static_cast<uint16_t>(
          i == 0 ? 0 : so.group[i - 1] + (so.scores[i].interBw != so.scores[i - 1].interBw ? 1 : 0)));
    return so;
  }

  // The candidates not used by the channel (`flag`), in NCCL's order (all PCI bandwidths 0 without `pci`).
  void scoreCandidates(int gpu, int netIdx, SmallVec<Score, 32>& scores, uint64_t flag = 0, bool pci = true) {
    int n = ngpus();
    const auto& gpus = sys_.of(NodeType::GPU);
    const auto& paths = sys_.of(NodeType::GPU)[gpu].paths[T(NodeType::GPU)];
    const std::vector<Path>* netPaths = netIdx >= 0 ? &sys_.of(NodeType::NET)[netIdx].paths[T(NodeType::GPU)] : nullptr;
    for (int i = 1; i < n; ++i) {
      int p = (gpu + i) % n;
      if (paths[p].count() == 0) continue;
      if (gpus[p].used & flag) continue;
      Score sc{p, i, paths[p].count(), static_cast<int>(paths[p].bw), 0, 0, 0};
      if (netPaths) {
        sc.interNhops = (*netPaths)[p].count();
        if (pci) sc.interPciBw = gpuPciBw(p);
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

  void tryGpu(Graph& g, Graph& save, int step, int backToNet, int backToFirstRank, int forcedOrder, int* time, int type,
              int index, int gi) {
    const uint64_t flag = 1ULL << g.nChannels;
    if (!follow(g, type, index, NodeType::GPU, gi, 1)) return;
    Node& gpu = sys_.of(NodeType::GPU)[gi];
    gpu.used ^= flag;
    const Key128& gm = gpuMix_[gi];
    usedState_[g.nChannels].a ^= gm.a, usedState_[g.nChannels].b ^= gm.b;
    // The previous GPU is inside the channel from now on (unless it is the first): its private links leave the key.
    const Key128 inside = type == T(NodeType::GPU) && step >= 2 ? privState_[index] : Key128{};
    interior_.a += inside.a, interior_.b += inside.b;
    recGpu(g, save, gi, step, backToNet, backToFirstRank, forcedOrder, time);
    interior_.a -= inside.a, interior_.b -= inside.b;
    usedState_[g.nChannels].a ^= gm.a, usedState_[g.nChannels].b ^= gm.b;
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
    const bool fewerHops = g.pattern == ref.pattern && g.crossNic == ref.crossNic && g.nHops < ref.nHops;
    // RCCL's ncclTopoCompareGraphs: at equal channels, prefer the graph with more XGMI hops.
    if (amd_ && g.nChannels == ref.nChannels && countXgmi(ref) < countXgmi(g)) return true;
    return fewerHops;
  }

  // RCCL's ncclTopoCountXGMI: consecutive GPUs of each channel (the last back to the first) joined by one XGMI link.
  int countXgmi(const Graph& g) const {
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

  // The preferred NETs of a GPU (or all, -1) do not depend on the path type: computed once per GPU.
  std::unordered_map<int, std::vector<int>> prefCache_;
  const std::vector<int>& prefNets(int gpu) {
    auto it = prefCache_.find(gpu);
    if (it != prefCache_.end()) return it->second;
    return prefCache_.emplace(gpu, sys_.hostHashes.size() > 1 ? prefNetsGpuFirst(gpu) : prefNetsChannelFirst(gpu))
        .first->second;
  }
  std::vector<int> selectNetsUncached(int typeInter, int gpu) {
    std::vector<int> nets = prefNets(gpu);
    int maxDevCount = kTopoMaxNodes;  // NETDEVS_POLICY other than MAX: no limit
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

  // --- Memo of failed sub-searches.
  // NCCL's search walks orders of the GPUs under step budgets. Different orders of the same GPUs often leave the
  // links in the same state (each path charges its own links, whatever the order), so NCCL walks the same
  // sub-search again and again. A sub-search that completes no channel changes nothing but the budget, and how many
  // steps it takes depends only on the state it starts from. We remember that count by state and charge it instead
  // of walking again: the budgets run out at the same step, the results are NCCL's, the work is smaller.
  Key128 linkState_;
  std::vector<Key128> privState_;                     // the part of linkState_ from each GPU's private links
  Key128 interior_;                                   // the private parts of the GPUs inside the channel being built
  std::array<Key128, kMaxChannels + 1> usedState_{};  // the GPUs each channel uses so far
  std::vector<Key128> gpuMix_;                        // each GPU's part of usedState_ (xor-ed in while it is used)
  StepMemo memo_;
  long completions_ = 0;
  long leaks_ = 0;  // NICs whose bandwidth the search kept (recNet)

  // Everything a sub-search that completes no channel reads: the links' bandwidths, the GPUs this channel uses,
  // the search's parameters, where it stands, the channel's first GPU and NETs, and of the channels before it only
  // what a replay (the previous channel's order) or the cross-NIC rule (the previous channel's first NET) reads.
  // A type limit only matters through the paths it admits: two limits admitting the same path types of the system
  // give the same search. The key holds the highest type that occurs at or below the limit.
  uint32_t intraTypes_ = 0, interTypes_ = 0;  // path types that occur, GPU/NVS to GPU/NVS and GPU to/from NET
  static int effectiveType(int limit, uint32_t types) {
    if (limit < 0) return -1;
    const uint32_t below = limit >= 31 ? types : types & ((2u << limit) - 1);
    return below ? 31 - __builtin_clz(below) : -1;
  }

  KeyAcc stateKey(const Graph& g, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder) const {
    const int c = g.nChannels, n = ngpus_;
    KeyAcc k;
    k.a = linkState_.a - interior_.a;
    k.b = linkState_.b - interior_.b;
    k.add(usedState_[c].a, usedState_[c].b);
    k.add((static_cast<uint64_t>(c) << 48) | (static_cast<uint64_t>(gi + 1) << 32) |
          (static_cast<uint64_t>(step + 1) << 16) | static_cast<uint64_t>(forcedOrder));
    k.add((static_cast<uint64_t>(backToNet + 1) << 48) | (static_cast<uint64_t>(backToFirstRank + 1) << 32) |
          (static_cast<uint64_t>(g.pattern) << 16) | static_cast<uint64_t>(g.crossNic));
    k.add((static_cast<uint64_t>(effectiveType(g.typeIntra, intraTypes_) + 1) << 32) |
          static_cast<uint64_t>(effectiveType(g.typeInter, interTypes_) + 1));
    k.add((floatBits(g.bwIntra) << 32) | floatBits(g.bwInter));
    if (forcedOrder == kForcedOrderReplay && c > 0)
      for (int i = 0; i < n; ++i) k.add(static_cast<uint64_t>(g.intra[(c - 1) * n + i]));
    if (step < 0) return k;  // a unit that starts the channel: its first GPU and NETs are still to be chosen
    k.add(static_cast<uint64_t>(g.intra[c * n]));
    if (sys_.inter) {
      k.add(static_cast<uint64_t>(g.inter[c * 2]));
      if (g.pattern == kPatternBalancedTree) k.add(static_cast<uint64_t>(g.inter[c * 2 + 1]));
      if (g.pattern == kPatternRing && g.crossNic == 2 && (c & 1)) k.add(static_cast<uint64_t>(g.inter[(c - 1) * 2]));
    }
    return k;
  }

  // A sub-search that completes channels also reads, from the moment the first one completes: the channel's whole
  // order (the next channel replays it), the hop count and channel limits (which solutions count as better), the
  // NICs' remaining bandwidth (in linkState_) and the channel's last NET. Walked again from the same state it finds
  // solutions equal to those of its first walk, which the saved graph is at least as good as: it copies nothing.
  KeyAcc completingKey(KeyAcc k, const Graph& g, int step) const {
    const int c = g.nChannels, n = ngpus_;
    k.a += interior_.a, k.b += interior_.b;  // every link: the next channels read them all
    k.slot = KeyAcc::kCompletingSlots;       // apart from the slots a state key uses
    // Only a replay reads a finished channel's order: always within a node, with sameChannels across nodes.
    if (!sys_.inter || g.sameChannels == 1)
      for (int i = 1; i <= step; ++i) k.add(static_cast<uint64_t>(g.intra[c * n + i]));
    k.slot = KeyAcc::kCompletingSlots + kMaxGpusInKey;
    k.add((static_cast<uint64_t>(g.nHops) << 32) | (static_cast<uint64_t>(g.minChannels) << 16) |
          static_cast<uint64_t>(g.maxChannels));
    k.add((static_cast<uint64_t>(g.sameChannels) << 32) | static_cast<uint64_t>(g.collNet) | 1);
    if (sys_.inter && step >= 0) k.add(static_cast<uint64_t>(g.inter[c * 2 + 1]));
    return k;
  }

  void recGpu(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder, int* time) {
    if (*time <= 0) return;
    const int n = ngpus_;
    // RCCL's XGMI preference makes "better than the saved graph" depend on more than the search state: no memo.
    Gate& gate = gates_[std::min(step, kGates - 1)];
    if (!keyed_ || step == n || g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect || gate.off) {
      recGpuSteps(g, save, gi, step, backToNet, backToFirstRank, forcedOrder, time);
      return;
    }
    g.intra[g.nChannels * n + step] = sys_.of(NodeType::GPU)[gi].rank;
    const KeyAcc acc = stateKey(g, gi, step, backToNet, backToFirstRank, forcedOrder);
    memoized(
        acc.finish(), completingKey(acc, g, step).finish(), time,
        [&] { recGpuSteps(g, save, gi, step, backToNet, backToFirstRank, forcedOrder, time); }, kMemoMinSteps, &gate);
  }

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
  static constexpr int kGates = 64, kGateProbe = 128;
  std::array<Gate, kGates> gates_{};

  void recGpuSteps(Graph& g, Graph& save, int gi, int step, int backToNet, int backToFirstRank, int forcedOrder,
                   int* time) {
    (*time)--;
    ++steps_;
    ++walked_;
    int n = ngpus_;
    if (step == n - 1 && sw_) sw_->reachedLast = true;
    if (step == n) {
      ++completions_;
      g.nChannels++;
      if (sw_) sw_->maxChannels = std::max(sw_->maxChannels, g.nChannels);
      if (compareGraphs(g, save)) {
        copyGraph(save, g);
        if (g.nChannels == g.maxChannels) *time = -1;
      }
      if (g.nChannels < g.maxChannels) {
        const Key128 outer = interior_;  // the next channel may use every link again
        interior_ = Key128{};
        searchRec(g, save, time);
        interior_ = outer;
      }
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
      if (prefixCheck_ && prefixShort(gi, g.bwIntra)) return;  // every try from gi would fail on its first hops
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
        if (other.asic == asic && other.port == port) chargeNet(other, static_cast<float>(bw));
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
          if (localGpu != -1) tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, T(NodeType::NET), n, localGpu);
          const LocalGpus& locals = netLocalGpus(n);
          // NCCL skips this NIC here without giving its bandwidth back; kept for fidelity (and never memoized).
          if (locals.type == PathType::DIS) {
            ++leaks_;
            continue;
          }
          for (int lg : locals.gpus) {
            if (lg == localGpu) continue;
            tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, T(NodeType::NET), n, lg);
          }
        }
      }
      for (auto& other : sys_.of(NodeType::NET))
        if (other.asic == asic && other.port == port) chargeNet(other, -static_cast<float>(bw));
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

  void run(Graph& graph, SearchTrace* trace = nullptr);
  void searchLoop(Graph& graph, const Limits& l);
  void simpleOrder(Graph& graph);
  // A new pass of the search loop: the memo carries over (its keys hold the pass's parameters), the gates probe again.
  void startPass() {
    std::fill_n(gates_.begin(), std::min(ngpus_ + 1, kGates), Gate{});  // the steps a pass reaches
    // A search whose memo has saved less than a quarter step per lookup over its first passes stops keeping the
    // state key for the rest of this graph (tiny searches, where the states never repeat): between two passes
    // every charge has been given back, so the key needs no catching up, and the memo then never looks.
    const long ratio = ngpus_ <= kSmallNode ? 4 : 16;
    if (keyed_ && ++passes_ > kMemoProbePasses && memoLookups_ >= kMemoProbeLookups &&
        ratio * memoSaved_ < memoLookups_)
      keyed_ = false;
  }
  static constexpr int kMemoProbePasses = 2, kMemoProbeLookups = 64, kSmallNode = 4;
  long memoLookups_ = 0, memoSaved_ = 0;
  int passes_ = 0;

  // One pass of the search loop, as a memo unit: passes whose parameters differ only where the search does not
  // look (a path type no path has, same channels before any channel is found) walk the same search again.
  void searchPass(Graph& g, Graph& save, int* time) {
    auto walk = [&] { searchRec(g, save, time); };
    if (!keyed_ || g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect) return walk();
    int backToNet, backToFirstRank;
    searchParams(g.pattern, &backToNet, &backToFirstRank);
    const KeyAcc acc = stateKey(g, -3, -1, backToNet, backToFirstRank, 0);
    memoized(acc.finish(), completingKey(acc, g, -1).finish(), time, walk, 1);
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
    if (g.sameChannels == 0 || g.nChannels == 0) freeStarts(g, save, backToNet, backToFirstRank, time);
  }

  // A channel started from every GPU in turn, as one memo unit: after each channel found, the next one is tried
  // from every GPU, and many channels found leave the same state.
  void freeStarts(Graph& g, Graph& save, int backToNet, int backToFirstRank, int* time) {
    auto walk = [&] {
      for (int gi = 0; gi < ngpus_; ++gi) tryGpu(g, save, 0, backToNet, backToFirstRank, 0, time, -1, -1, gi);
    };
    if (*time <= 0 || !keyed_ || g.pattern == kPatternNvls || g.pattern == kPatternCollnetDirect) return walk();
    const KeyAcc acc = stateKey(g, -2, -1, backToNet, backToFirstRank, 0);
    memoized(acc.finish(), completingKey(acc, g, -1).finish(), time, walk, 1);
  }

  // Charges a sub-search from the memo when its state was walked before, walks it and remembers it otherwise.
  template <typename Walk>
  void memoized(const Key128& key, const Key128& key2, int* time, Walk&& walk, int minSteps = kMemoMinSteps,
                Gate* gate = nullptr) {
    const Cost* cost = memo_.find(key);
    bool completes = false;
    if (!cost && (cost = memo_.find(key2))) completes = true;
    // A budget that runs out midway stops the walk at the same step, unless part of the walk has its own budget.
    if (cost && (cost->budget <= *time || cost->steps == cost->budget)) {
      if (completes) ++completions_;  // the skipped sub-search completes channels
      const int taken = std::min(cost->budget, *time);
      steps_ += cost->steps == cost->budget ? taken : cost->steps;
      ++memoLookups_, memoSaved_ += taken;
      *time -= taken;
      if (gate) gate->count(taken);
      return;
    }
    if (gate) gate->count(0);
    ++memoLookups_;
    const int before = *time;
    const long steps = steps_, completions = completions_, leaks = leaks_;
    walk();
    // A sub-search that kept a NIC's bandwidth changed more than the budget: it is walked every time.
    if (*time > 0 && before - *time >= minSteps && leaks_ == leaks)
      memo_.insert(completions_ == completions ? key : key2, Cost{static_cast<int>(steps_ - steps), before - *time});
  }

  static void copyGraph(Graph& dst, const Graph& src) {
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

  long steps_ = 0, walked_ = 0;

 private:
  std::unordered_map<int, std::vector<int>> netCache_;
  System& sys_;
  const Config& cfg_;
  const int ngpus_;
  const bool amd_ = sys_.amdGpus();        // RCCL's rules (AMD GPUs)
  bool keyed_ = cfg_.searchMemo && !amd_;  // the memo is on: charges keep the state key (off while tracing)
  bool memoOn_ = keyed_;                   // the memo and its shortcuts are allowed for this graph's search
};

}  // namespace

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

// ncclTopoCompute's search loop: pass 1 relaxes the constraints one at a time (same channels off, a simple tree on
// Hopper+, intra then inter path types up, cross NIC, lower speed) until a solution reaches the total bandwidth or
// the global budget runs out; pass 2 raises the speed again for the channels found.
void Searcher::searchLoop(Graph& graph, const Limits& l) {
  const Speeds sp = speedsFor(l.ccMin, sys_.inter != 0, amd_);
  const int trySameChannels = graph.pattern == kPatternNvls ? 0 : 1;
  const int ndevs = sys_.count(NodeType::DEV);
  const Node& cpu0 = sys_.of(NodeType::CPU)[0];
  const bool amdSys = cpu0.arch == topology::kCpuArchX86 && cpu0.vendor == topology::kCpuVendorAmd;
  Graph tmp = graph;
  int pass = 1, speedIndex = 0;
  const float maxBw = sys_.maxBw;
  float totalBw = sys_.totalBw;
  if (ndevs > 1 && graph.pattern != kPatternRing) totalBw = static_cast<float>(totalBw * (ndevs * 1.0 / (ndevs - 1)));
  while ((sp.v[speedIndex] > maxBw || sp.v[speedIndex] * graph.minChannels > totalBw) && speedIndex < sp.n - 1)
    speedIndex++;
  tmp.bwIntra = tmp.bwInter = sp.v[speedIndex];
  int64_t globalTimeout = kGlobalTimeout * cfg_.searchTimeoutScale;
  int time = 0;
  while (true) {
    time = (tmp.sameChannels              ? kTimeoutSameChannels
            : tmp.pattern == kPatternTree ? kTimeoutTree
                                          : kTimeout) *
           cfg_.searchTimeoutScale;
    tmp.nChannels = 0;
    globalTimeout -= time;
    startPass();
    if (trace_) {
      SearchTrace::Attempt& a = trace_->attempts.emplace_back();
      a.bwIntra = tmp.bwIntra;
      a.bwInter = tmp.bwInter;
      a.typeIntra = tmp.typeIntra;
      a.typeInter = tmp.typeInter;
      a.sameChannels = tmp.sameChannels;
      a.crossNic = tmp.crossNic;
      a.pattern = tmp.pattern;
      rec_ = &a;
    }
    if (speedSkipApplies(tmp)) {
      const uint64_t group = passGroup(tmp, time);
      if (const PassRecord* r = samePass(tmp, graph, group, time)) {
        steps_ += r->steps;
        time = r->endTime;
        ++passesShared_;
      } else {
        const int startTime = time;
        const long steps = steps_;
        const int walk = speedWalk(tmp.bwIntra);
        sw_ = &speedWalks_[walk];
        searchPass(tmp, graph, &time);
        sw_ = nullptr;
        if (time >= 0)
          passRecords_.push_back(PassRecord{group, startTime, time, tmp.bwIntra, steps_ - steps, tmp.crossNic, walk,
                                            tmp.pattern, tmp.minChannels, tmp.maxChannels});
      }
    } else {
      searchPass(tmp, graph, &time);
    }
    if (time == 0) graph.timedOut = true;
    if (trace_) {
      SearchTrace::Attempt& a = trace_->attempts.back();
      a.channels = graph.nChannels;
      a.bestIntra = graph.bwIntra;
      a.bestInter = graph.bwInter;
      a.timedOut = time == 0;
      endAttempt();
    }
    bool done = time == -1 || static_cast<float>(graph.nChannels) * graph.bwInter >= sys_.totalBw;
    if (!done && pass == 1) {
      // Same channels first (AMD CPUs keep them when going through SYS).
      if (tmp.sameChannels == 1 && !(amdSys && tmp.typeIntra == P(PathType::SYS))) {
        tmp.sameChannels = 0;
        continue;
      }
      tmp.sameChannels = trySameChannels;
      if (time != -1)
        globalTimeout += time;
      else
        globalTimeout = kGlobalTimeout;
      if (globalTimeout < 0 && graph.nChannels) {
        if (trace_) trace_->globalTimeout = true;
        done = true;
      } else {
        if (l.ccMin >= 90 && tmp.pattern == kPatternBalancedTree) {
          tmp.pattern = kPatternTree;
          continue;
        }
        tmp.pattern = graph.pattern;
        const int maxIntra = sys_.inter ? tmp.typeInter : l.maxTypeIntra;
        if (tmp.typeIntra < maxIntra && (graph.nChannels == 0 || tmp.typeIntra < graph.typeIntra)) {
          tmp.typeIntra += 1;
          if (tmp.typeIntra < P(PathType::DIS)) continue;
        }
        tmp.typeIntra = l.minTypeIntra;
        if (sys_.inter && tmp.typeInter < l.maxTypeInter &&
            (graph.nChannels == 0 || tmp.typeInter < graph.typeInter || tmp.typeInter < P(PathType::PXN))) {
          tmp.typeInter += 1;
          if (tmp.typeInter < P(PathType::DIS)) continue;
        }
        tmp.typeInter = l.minTypeInter;
        if (l.crossNic == 2 && tmp.crossNic == 0 &&
            (graph.pattern == kPatternRing || graph.pattern == kPatternBalancedTree)) {
          tmp.crossNic = 2;
          continue;
        }
        tmp.crossNic = l.crossNic == 1 ? 1 : 0;
        if (speedIndex < sp.n - 1 && (graph.nChannels == 0 || sp.v[speedIndex + 1] / graph.bwInter > .49)) {
          tmp.bwInter = tmp.bwIntra = sp.v[++speedIndex];
          continue;
        }
        speedIndex = 0;
        while (sp.v[speedIndex] > maxBw && speedIndex < sp.n - 1) speedIndex++;
        tmp.bwIntra = tmp.bwInter = sp.v[speedIndex];
      }
    }
    if (pass == 1) {
      time = -1;
      dupChannels(graph, l.ccMin, ngpus_);
      tmp = graph;
      speedIndex = 0;
      while (sp.v[speedIndex] > graph.bwInter && speedIndex < sp.n - 1) speedIndex++;
      tmp.bwIntra = tmp.bwInter = sp.v[speedIndex];
      tmp.minChannels = graph.nChannels;
      pass = 2;
    }
    if (pass == 2) {
      // Try to raise the speed of the channels found: rings both ways, NVLS bwInter, trees bwIntra.
      if (time != 0 && speedIndex > 0) {
        if (graph.pattern == kPatternRing) {
          tmp.bwIntra = tmp.bwInter = sp.v[--speedIndex];
          continue;
        } else if (graph.pattern == kPatternNvls && tmp.bwInter == graph.bwInter && tmp.bwInter < tmp.bwIntra * 2) {
          tmp.minChannels = tmp.maxChannels = graph.nChannels;
          tmp.bwInter = sp.v[--speedIndex];
          continue;
        } else if (tmp.bwIntra == graph.bwIntra && tmp.bwIntra < tmp.bwInter * 2) {
          tmp.bwIntra = sp.v[--speedIndex];
          continue;
        }
      }
      time = -1;
      tmp = graph;
    }
    break;
  }
}

// Nothing found: one channel in GPU order at 0.1 GB/s through the first and last GPUs' preferred NETs.
void Searcher::simpleOrder(Graph& graph) {
  for (int i = 0; i < ngpus_; ++i) graph.intra[i] = sys_.of(NodeType::GPU)[i].rank;
  graph.bwIntra = 0.1f;
  graph.typeIntra = P(PathType::SYS);
  auto first = [&](int gpu) -> int64_t {
    if (sys_.count(NodeType::NET) == 0) return -1;
    const std::vector<int>& nets = selectNets(-1, gpu);  // ncclTopoSelectNets with typeInter -1: preferred only
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

void Searcher::run(Graph& graph, SearchTrace* trace) {
  auto t0 = std::chrono::steady_clock::now();
  // A traced search walks every step (the memo would skip the refusals it counts); its result is the same.
  trace_ = trace;
  keyed_ = memoOn_ = cfg_.searchMemo && !amd_ && !trace;
  prefixCheck_ = memoOn_ && sys_.count(NodeType::NVS) == 0;
  memoLookups_ = memoSaved_ = 0;
  passes_ = 0;
  auto finish = [&]() {
    graph.searchMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  steps_ = walked_ = 0;
  passesShared_ = 0;
  bool sameBases = true;  // the links start where the previous graph's search started them (records stay valid)
  for (Hop& h : hops_) {
    sameBases &= h.base == h.link->bw && h.revBase == (h.rev ? h.rev->bw : 0.0f);
    h.base = h.link->bw, h.revBase = h.rev ? h.rev->bw : 0.0f;
  }
  if (!sameBases || !memoOn_) speedWalks_.clear(), passRecords_.clear();
  runWalks_ = speedWalks_.size();
  memo_.clear();
  gates_.fill(Gate{});
  completions_ = leaks_ = 0;
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
  graph.searchSteps = static_cast<int>(steps_);
  graph.searchWalked = static_cast<int>(walked_);
  graph.searchPassesShared = passesShared_;
  finish();
}

struct Searches::Impl {
  Searcher searcher;
};
Searches::Searches(System& sys, const Config& cfg) : impl_(new Impl{Searcher(sys, cfg)}) {}
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
