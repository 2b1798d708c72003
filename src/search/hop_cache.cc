// Building the hop cache (hop_cache.h): the paths flattened, each link's part in the state key, the links no
// check can refuse left out, and each GPU's common first hops.
#include "hop_cache.h"

#include <algorithm>
#include <array>

#include "search_common.h"
#include "topocoll/status.h"

namespace topocoll::search::detail {

namespace {

// A link is private to a GPU when every path the search may follow through it starts or ends at that GPU: once
// the GPU sits inside the channel being built (neither its first GPU nor the current one), no sub-search below
// touches the link again, so the link's state does not belong in the key of those sub-searches.
struct Endpoints {
  int a = -2, b = -2;  // GPUs every path through the link has as an endpoint (-2: no path yet, -1: none)
  // Another path through the link, between e1 and e2 (-1 where that end is not a GPU).
  void note(int e1, int e2) {
    if (a == -2) {
      a = e1, b = e2;
      if (a == -1) std::swap(a, b);
      return;
    }
    auto in = [&](int g) { return g >= 0 && (g == e1 || g == e2); };
    Endpoints kept{-1, -1};
    if (in(a)) kept.a = a;
    if (in(b)) (kept.a == -1 ? kept.a : kept.b) = b;
    *this = kept;
  }
};

// What the build keeps per link, by a dense index: its weight in the state key and the part of StateKey::priv
// its state goes to.
struct LinkData {
  Key128 z;
  Key128* own = nullptr;
};

// Every link of the system by a dense index.
struct LinkIndex {
  explicit LinkIndex(System& sys) : sys(sys) {
    int links = 0;
    for (int t = 0; t < topology::kNodeTypes; ++t) {
      for (const Node& node : sys.nodes[t]) {
        base[t].push_back(links);
        links += static_cast<int>(node.links.size());
      }
    }
    ptr.assign(links, nullptr);
    for (int t = 0, id = 0; t < topology::kNodeTypes; ++t)
      for (Node& node : sys.nodes[t])
        for (Link& l : node.links) ptr[id++] = &l;
  }
  int size() const { return static_cast<int>(ptr.size()); }
  int id(NodeRef node, const Link* l) const {
    return base[static_cast<int>(node.type)][node.index] + static_cast<int>(l - sys.at(node).links.data());
  }

  System& sys;
  std::array<std::vector<int>, topology::kNodeTypes> base;  // dense index of each node's first link
  std::vector<Link*> ptr;                                   // each link by its dense index
};

Link* findRev(System& sys, NodeRef node1, NodeRef node2, LinkType type) {
  for (auto& l : sys.at(node2).links)
    if (l.rem == node1 && l.type == type) return &l;
  fail(StatusCode::kInternal, "no reverse link");
}

}  // namespace

HopCache::HopCache(System& sys, StateKey& key, bool dropSlack) : linkKey_(key.links) {
  const int ngpus = sys.count(NodeType::GPU);
  maxN_ = std::max({ngpus, sys.count(NodeType::NVS), sys.count(NodeType::NET), 1});
  paths_.assign(static_cast<size_t>(3) * maxN_ * 3 * maxN_, HopPath{});
  const LinkIndex links(sys);
  std::vector<LinkData> linkData(links.size());
  std::vector<Endpoints> endpoints(links.size());
  for (int id = 0; id < links.size(); ++id) {
    const uint64_t w = static_cast<uint64_t>(id) + 1;  // a random odd weight per link
    linkData[id].z = Key128{mixA(w) | 1, mixB(w) | 1};
  }
  for (NodeType t1 : {NodeType::GPU, NodeType::NVS, NodeType::NET}) {
    for (int i1 = 0; i1 < sys.count(t1); ++i1) {
      NodeRef start{t1, i1};
      for (NodeType t2 : {NodeType::GPU, NodeType::NVS, NodeType::NET}) {
        const auto& paths = sys.at(start).paths[T(t2)];
        for (int i2 = 0; i2 < static_cast<int>(paths.size()); ++i2) {
          const Path& route = paths[i2];
          HopPath& hp = path(t1, i1, t2, i2);
          hp.type = P(route.type);
          hp.first = static_cast<int>(hops_.size());
          hp.count = route.count();
          ((t1 == NodeType::NET || t2 == NodeType::NET) ? key.interTypes : key.intraTypes) |= 1u << hp.type;
          for (int step = 0; step < route.count(); ++step) {
            const Node& n = sys.at(sys.link(route.list[step]).rem);
            if (n.type == NodeType::CPU && route.type == PathType::PHB && t1 == NodeType::GPU &&
                n.arch == topology::kCpuArchX86 && n.vendor == topology::kCpuVendorIntel)
              hp.intelPciOverhead = true;
          }
          NodeRef node = start;
          for (int step = 0; step < route.count(); ++step) {
            Link& link = sys.link(route.list[step]);
            Hop h{&link, nullptr, 0.0f, links.id(node, &link), -1, link.type == LinkType::PCI, {}, {}};
            const Node& rem = sys.at(link.rem);
            if (link.rem.type == NodeType::DEV && rem.cudaCompCap < 80 && t1 != NodeType::GPU) {
              h.rev = findRev(sys, node, link.rem, link.type);
              h.revMul = 0.125f;
            }
            if (link.rem.type == NodeType::CPU && rem.arch == topology::kCpuArchPower && link.type == LinkType::NVL) {
              h.rev = findRev(sys, node, link.rem, link.type);
              h.revMul = 1.0f;
            }
            if (h.rev) h.revId = links.id(link.rem, h.rev), hp.anyRev = true;
            hops_.push_back(h);
            node = link.rem;
          }
          hp.length = hp.count;
          const int e1 = t1 == NodeType::GPU ? i1 : -1, e2 = t2 == NodeType::GPU ? i2 : -1;
          for (const Hop& h : hopsOf(hp)) {
            endpoints[h.id].note(e1, e2);
            if (h.rev) endpoints[h.revId].note(e1, e2);
          }
        }
      }
    }
  }
  for (int id = 0; id < links.size(); ++id) {
    const Endpoints& ep = endpoints[id];
    linkData[id].own = ep.a >= 0 && ep.b < 0 ? &key.priv[ep.a] : &key.priv[ngpus];
  }
  if (dropSlack) dropSlackHops(links.ptr);
  SmallVec<const Link*, 64> charged;
  for (HopPath& hp : paths_) {
    charged.resize(0);
    for (const Hop& h : hopsOf(hp)) {
      charged.push_back(h.link);
      if (h.rev) charged.push_back(h.rev);
    }
    std::sort(charged.begin(), charged.end());
    hp.distinctLinks = std::adjacent_find(charged.begin(), charged.end()) == charged.end();
  }
  for (Hop& h : hops_) {
    nonNegative_ &= h.link->bw >= 0 && (!h.rev || h.rev->bw >= 0);
    h.z = linkData[h.id].z;
    h.own = linkData[h.id].own;
    if (h.rev) h.revZ = linkData[h.revId].z, h.revOwn = linkData[h.revId].own;
  }
  buildGpuPrefixes(ngpus);
}

void HopCache::buildGpuPrefixes(int ngpus) {
  gpuPrefix_.assign(ngpus, Prefix{});
  for (int a = 0; a < ngpus; ++a) {
    const HopPath* ref = nullptr;
    int common = 0;
    for (int b = 0; b < ngpus; ++b) {
      const HopPath& hp = path(NodeType::GPU, a, NodeType::GPU, b);
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
    for (int b = 0; b < ngpus; ++b)
      symmetricTypes_ &= path(NodeType::GPU, a, NodeType::GPU, b).type == path(NodeType::GPU, b, NodeType::GPU, a).type;
  }
}

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
void HopCache::dropSlackHops(const std::vector<Link*>& linkPtr) {
  constexpr float kMaxAmount = 2.0f * 1.2f * 96.0f;  // NVLS x2, Intel PCI overhead x1.2, the fastest speed
  const int links = static_cast<int>(linkPtr.size());
  std::vector<char> candidate(links, 1), seen(links, 0);
  std::vector<std::pair<int, int>> guards;  // (link, a link next to it on some path)
  for (const HopPath& hp : paths_) {
    const Hop* hops = hops_.data() + hp.first;
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
  for (auto [id, k] : guards) guardBw[id] += std::max(0.0f, linkPtr[k]->bw);
  std::vector<char> slack(links, 0);
  bool any = false;
  for (int id = 0; id < links; ++id) {
    if (!seen[id] || !candidate[id]) continue;
    if (static_cast<double>(linkPtr[id]->bw) >= 2 * guardBw[id] + 2 * static_cast<double>(kMaxAmount))
      slack[id] = 1, any = true;
  }
  if (!any) return;
  std::vector<Hop> kept;
  kept.reserve(hops_.size());
  for (HopPath& hp : paths_) {
    const int first = static_cast<int>(kept.size());
    for (const Hop& h : hopsOf(hp))
      if (!slack[h.id]) kept.push_back(h);
    hp.first = first;
    hp.count = static_cast<int>(kept.size()) - first;
  }
  hops_ = std::move(kept);
}

bool HopCache::resetBases() {
  bool same = true;
  for (Hop& h : hops_) {
    same &= h.base == h.link->bw && h.revBase == (h.rev ? h.rev->bw : 0.0f);
    h.base = h.link->bw, h.revBase = h.rev ? h.rev->bw : 0.0f;
  }
  return same;
}

const Link* HopCache::refusingLink(const HopPath& hp, int step, float bw) const {
  const Hop& h = hops_[hp.first + step];
  const float fw = h.pci && hp.intelPciOverhead ? bw * 6 / 5 : bw;
  return h.link->bw < fw || !h.rev ? h.link : h.rev;
}

}  // namespace topocoll::search::detail
