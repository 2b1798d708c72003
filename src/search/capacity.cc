// Link accounting of channels (the charges of NCCL 2.30.7's followPath, src/graph/search.cc, Apache-2.0) and
// max-flow cut bounds per pattern.
#include "topocoll/search/capacity.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <queue>
#include <set>

#include <fmt/format.h>

#include "topocoll/status.h"
#include "topocoll/topology/render.h"

namespace topocoll::search {

using topology::LinkRef;
using topology::LinkType;
using topology::NodeRef;
using topology::NodeType;
using topology::PathType;
using topology::System;

namespace {

int slotOf(NodeType t) { return t == NodeType::GPU ? 0 : t == NodeType::NVS ? 1 : t == NodeType::NET ? 2 : -1; }

}  // namespace

LoadModel::LoadModel(const System& sys) : sys_(sys) {
  nodeBase_.assign(topology::kNodeTypes + 1, 0);
  for (int t = 0; t < topology::kNodeTypes; ++t) nodeBase_[t + 1] = nodeBase_[t] + sys.count(static_cast<NodeType>(t));
  linkRes_.resize(nodeBase_.back());
  for (int t = 0; t < topology::kNodeTypes; ++t) {
    for (int i = 0; i < sys.count(static_cast<NodeType>(t)); ++i) {
      NodeRef ref{static_cast<NodeType>(t), i};
      auto& ids = linkRes_[nodeBase_[t] + i];
      for (int l = 0; l < static_cast<int>(sys.at(ref).links.size()); ++l) {
        ids.push_back(static_cast<int>(cap_.size()));
        cap_.push_back(sys.at(ref).links[l].bw);
        links_.push_back({ref, l});
      }
    }
  }
  // NCCL takes a channel's speed off every NET sharing the entry NET's asic and port: one resource per port.
  std::map<std::pair<uint64_t, int>, int> ports;
  for (const auto& net : sys.of(NodeType::NET)) {
    auto [it, fresh] = ports.emplace(std::make_pair(net.asic, net.port), static_cast<int>(cap_.size()));
    if (fresh) {
      cap_.push_back(net.bw);
      links_.push_back({{NodeType::NET, static_cast<int>(portRes_.size())}, -1});
    } else {
      cap_[it->second] = std::min<double>(cap_[it->second], net.bw);
    }
    portRes_.push_back(it->second);
  }
  maxN_ = std::max({sys.count(NodeType::GPU), sys.count(NodeType::NVS), sys.count(NodeType::NET), 1});
  routes_.resize(static_cast<size_t>(9) * maxN_ * maxN_);
  for (NodeType t1 : {NodeType::GPU, NodeType::NVS, NodeType::NET})
    for (int i1 = 0; i1 < sys.count(t1); ++i1)
      for (NodeType t2 : {NodeType::GPU, NodeType::NVS, NodeType::NET})
        for (int i2 = 0; i2 < sys.count(t2); ++i2)
          routes_[((static_cast<size_t>(slotOf(t1)) * maxN_ + i1) * 3 + slotOf(t2)) * maxN_ + i2] = build(t1, i1, t2, i2);
}

int LoadModel::resourceOf(LinkRef ref) const {
  return linkRes_[nodeBase_[static_cast<int>(ref.node.type)] + ref.node.index][ref.link];
}

std::string LoadModel::label(int res) const {
  LinkRef ref = links_[res];
  if (ref.link < 0) return fmt::format("NIC port of {}", topology::nodeLabel(sys_, ref.node));
  const auto& l = sys_.link(ref);
  return fmt::format("{} -> {} ({})", topology::nodeLabel(sys_, ref.node), topology::nodeLabel(sys_, l.rem),
                     topology::to_string(l.type));
}

const Route& LoadModel::route(NodeType t1, int i1, NodeType t2, int i2) const {
  return routes_[((static_cast<size_t>(slotOf(t1)) * maxN_ + i1) * 3 + slotOf(t2)) * maxN_ + i2];
}

Route LoadModel::build(NodeType t1, int i1, NodeType t2, int i2) const {
  Route r;
  const auto& paths = sys_.at({t1, i1}).paths[static_cast<int>(t2)];
  if (i2 >= static_cast<int>(paths.size())) return r;
  const topology::Path& path = paths[i2];
  r.type = static_cast<int>(path.type);
  r.hops = path.count();
  if (path.type >= PathType::DIS) return r;
  // Intel CPUs cost PCI P2P through the host bridge 20% more (NCCL charges PCI links bw * 6/5 on PHB paths).
  bool intel = false;
  for (const auto& hop : path.list) {
    const auto& n = sys_.at(sys_.link(hop).rem);
    if (n.type == NodeType::CPU && path.type == PathType::PHB && t1 == NodeType::GPU &&
        n.arch == topology::kCpuArchX86 && n.vendor == topology::kCpuVendorIntel)
      intel = true;
  }
  auto add = [&](int res, int units) {
    for (auto& u : r.uses)
      if (u.res == res) {
        u.units += units;
        return;
      }
    r.uses.push_back({res, units});
  };
  NodeRef node{t1, i1};
  for (const auto& hop : path.list) {
    const auto& link = sys_.link(hop);
    const int fw = link.type == LinkType::PCI && intel ? kLoadUnit * 6 / 5 : kLoadUnit;
    add(resourceOf(hop), fw);
    const auto& rem = sys_.at(link.rem);
    int revUnits = 0;
    if (link.rem.type == NodeType::DEV && rem.cudaCompCap < 80 && t1 != NodeType::GPU) revUnits = fw / 8;
    if (link.rem.type == NodeType::CPU && rem.arch == topology::kCpuArchPower && link.type == LinkType::NVL)
      revUnits = fw;
    if (revUnits) {
      const auto& back = sys_.at(link.rem).links;
      int found = -1;
      for (int l = 0; l < static_cast<int>(back.size()); ++l)
        if (back[l].rem == node && back[l].type == link.type) found = l;
      if (found < 0) fail(StatusCode::kInternal, "capacity: no reverse link for {}", label(resourceOf(hop)));
      add(resourceOf({link.rem, found}), revUnits);
    }
    node = link.rem;
  }
  if (t1 == NodeType::NET) add(portRes_[i1], kLoadUnit);
  return r;
}

namespace {

// One hop of a graph's channel: a route at one of the graph's two speeds, scaled by units/kLoadUnit.
struct Hop {
  NodeType t1;
  int i1;
  NodeType t2;
  int i2;
  bool inter;
  double scale;
};

// The hops NCCL's search charges for channel c of a graph (search.cc: recNet, recGpu, tryNvls).
std::vector<Hop> channelHops(const System& sys, const Graph& g, int c) {
  std::vector<Hop> hops;
  const int n = sys.count(NodeType::GPU);
  auto gpu = [&](int i) { return sys.gpuIndexOfRank(g.intra[c * n + i]); };
  const bool inter = sys.inter != 0;
  const int netIn = inter ? sys.indexOf(NodeType::NET, g.inter[2 * c]) : -1;
  const int netOut = inter ? sys.indexOf(NodeType::NET, g.inter[2 * c + 1]) : -1;
  if (g.pattern == kPatternNvls) {
    int head = gpu(0);
    for (int i = 0; i < n; ++i) {
      double m = i == head ? 2 : 1;
      hops.push_back({NodeType::NVS, 0, NodeType::GPU, i, false, m});
      hops.push_back({NodeType::GPU, i, NodeType::NVS, 0, false, m});
    }
    if (inter) {
      hops.push_back({NodeType::NET, netIn, NodeType::GPU, head, true, 1});
      hops.push_back({NodeType::GPU, head, NodeType::NET, netOut, true, 1});
    }
    return hops;
  }
  for (int i = 0; i + 1 < n; ++i) hops.push_back({NodeType::GPU, gpu(i), NodeType::GPU, gpu(i + 1), false, 1});
  if (!inter) {
    if (g.pattern == kPatternRing && n > 1) hops.push_back({NodeType::GPU, gpu(n - 1), NodeType::GPU, gpu(0), false, 1});
    return hops;
  }
  hops.push_back({NodeType::NET, netIn, NodeType::GPU, gpu(0), true, 1});
  switch (g.pattern) {
    case kPatternRing: hops.push_back({NodeType::GPU, gpu(n - 1), NodeType::NET, netOut, true, 1}); break;
    case kPatternSplitTree: hops.push_back({NodeType::GPU, gpu(n > 1 ? 1 : 0), NodeType::NET, netOut, true, 1}); break;
    case kPatternBalancedTree:
      hops.push_back({NodeType::GPU, gpu(0), NodeType::NET, netOut, true, n > 1 ? 0.5 : 1});
      if (n > 1) hops.push_back({NodeType::GPU, gpu(1), NodeType::NET, netOut, true, 0.5});
      break;
    default: hops.push_back({NodeType::GPU, gpu(0), NodeType::NET, netOut, true, 1}); break;
  }
  return hops;
}

}  // namespace

GraphLoad graphLoad(const LoadModel& m, const Graph& g) {
  GraphLoad out;
  out.intra.assign(m.resources(), 0.0);
  out.inter.assign(m.resources(), 0.0);
  std::vector<int> crossings(m.resources(), 0);
  const System& sys = m.system();
  if (g.pattern == kPatternCollnetDirect || (g.collNet && g.pattern == kPatternTree)) return out;
  for (int c = 0; c < g.nChannels; ++c) {
    for (const Hop& h : channelHops(sys, g, c)) {
      if (h.i1 < 0 || h.i2 < 0 || (h.t1 == h.t2 && h.i1 == h.i2)) continue;
      const Route& r = m.route(h.t1, h.i1, h.t2, h.i2);
      double bw = (h.inter ? g.bwInter : g.bwIntra) * h.scale / kLoadUnit;
      for (const Use& u : r.uses) {
        (h.inter ? out.inter : out.intra)[u.res] += bw * u.units;
        crossings[u.res]++;
      }
    }
  }
  for (int res = 0; res < m.resources(); ++res) {
    double used = out.used(res);
    if (used <= 0) continue;
    double ratio = m.capacity(res) > 0 ? used / m.capacity(res) : std::numeric_limits<double>::infinity();
    if (ratio > out.worstRatio) {
      out.worstRatio = ratio;
      out.worst = res;
      out.worstCrossings = crossings[res];
    }
  }
  return out;
}

double graphTotal(const Graph& g, bool inter) {
  return g.nChannels * static_cast<double>(inter ? std::min(g.bwIntra, g.bwInter) : g.bwIntra);
}

namespace {

// Dinic's max-flow over the system's nodes (plus one "network" node joined to every NET), capacities in GB/s.
class MaxFlow {
 public:
  explicit MaxFlow(int n) : adj_(n), level_(n), it_(n) {}
  int addEdge(int u, int v, double cap, int res) {
    adj_[u].push_back(static_cast<int>(e_.size()));
    e_.push_back({v, cap, res});
    adj_[v].push_back(static_cast<int>(e_.size()));
    e_.push_back({u, 0, -1});
    return static_cast<int>(e_.size()) - 2;
  }
  // Max flow s -> t on fresh capacities; `side` gets the source side of a minimum cut.
  double run(int s, int t, std::vector<char>* side) {
    std::vector<double> saved;
    for (auto& e : e_) saved.push_back(e.cap);
    double flow = 0;
    while (bfs(s, t)) {
      std::fill(it_.begin(), it_.end(), 0);
      while (double f = dfs(s, t, kInf)) flow += f;
    }
    bfs(s, -1);
    side->assign(adj_.size(), 0);
    for (size_t v = 0; v < adj_.size(); ++v) (*side)[v] = level_[v] >= 0;
    for (size_t i = 0; i < e_.size(); ++i) e_[i].cap = saved[i];
    return flow;
  }
  struct Edge {
    int to;
    double cap;
    int res;
  };
  const std::vector<Edge>& edges() const { return e_; }
  static constexpr double kInf = 1e18;

 private:
  bool bfs(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::queue<int> q;
    level_[s] = 0;
    q.push(s);
    while (!q.empty()) {
      int u = q.front();
      q.pop();
      for (int id : adj_[u]) {
        const Edge& e = e_[id];
        if (e.cap > 1e-9 && level_[e.to] < 0) {
          level_[e.to] = level_[u] + 1;
          q.push(e.to);
        }
      }
    }
    return t >= 0 && level_[t] >= 0;
  }
  double dfs(int u, int t, double f) {
    if (u == t) return f;
    for (int& i = it_[u]; i < static_cast<int>(adj_[u].size()); ++i) {
      Edge& e = e_[adj_[u][i]];
      if (e.cap <= 1e-9 || level_[e.to] != level_[u] + 1) continue;
      if (double d = dfs(e.to, t, std::min(f, e.cap)); d > 0) {
        e.cap -= d;
        e_[adj_[u][i] ^ 1].cap += d;
        return d;
      }
    }
    return 0;
  }
  std::vector<std::vector<int>> adj_;
  std::vector<Edge> e_;
  std::vector<int> level_, it_;
};

}  // namespace

double upperBound(const LoadModel& m, int pattern, std::vector<Cut>* cutsOut) {
  const System& sys = m.system();
  const int ngpus = sys.count(NodeType::GPU);
  const bool inter = sys.inter != 0;
  std::vector<Cut> cuts;
  std::set<std::vector<int>> seen;
  auto addCut = [&](std::vector<int> res, std::string what, int minUnits) {
    std::sort(res.begin(), res.end());
    res.erase(std::unique(res.begin(), res.end()), res.end());
    if (res.empty() || !seen.insert(res).second) return;
    Cut c;
    for (int r : res) c.capacity += m.capacity(r);
    c.res = std::move(res);
    c.what = std::move(what);
    c.minUnits = minUnits;
    cuts.push_back(std::move(c));
  };
  auto gpuName = [&](int g) { return fmt::format("GPU{}", sys.of(NodeType::GPU)[g].dev); };

  if (pattern == kPatternNvls) {
    // Every NVLS channel loads every GPU's NVSwitch links (the head twice).
    if (sys.count(NodeType::NVS) == 0) return std::numeric_limits<double>::infinity();
    for (int g = 0; g < ngpus; ++g) {
      for (const Use& u : m.route(NodeType::GPU, g, NodeType::NVS, 0).uses)
        addCut({u.res}, gpuName(g) + " -> NVSwitch", u.units);
      for (const Use& u : m.route(NodeType::NVS, 0, NodeType::GPU, g).uses)
        addCut({u.res}, "NVSwitch -> " + gpuName(g), u.units);
    }
  } else {
    const bool undirected = pattern != kPatternRing;
    const int minUnits = pattern == kPatternBalancedTree && inter ? kLoadUnit / 2 : kLoadUnit;
    // Flow graph over the system's nodes; node ids as LoadModel's flat order, then the network node.
    std::vector<int> base(topology::kNodeTypes + 1, 0);
    for (int t = 0; t < topology::kNodeTypes; ++t) base[t + 1] = base[t] + sys.count(static_cast<NodeType>(t));
    const int netNode = base.back();
    auto id = [&](NodeRef r) { return base[static_cast<int>(r.type)] + r.index; };
    // Only the links NCCL's routes between GPUs (and NICs) use: a channel cannot take any other.
    std::vector<char> routed(m.resources(), 0);
    auto mark = [&](const Route& r) {
      if (r.type < static_cast<int>(PathType::DIS))
        for (const Use& u : r.uses) routed[u.res] = 1;
    };
    for (int a = 0; a < ngpus; ++a) {
      for (int b = 0; b < ngpus; ++b)
        if (a != b) mark(m.route(NodeType::GPU, a, NodeType::GPU, b));
      for (int n = 0; inter && n < sys.count(NodeType::NET); ++n) {
        mark(m.route(NodeType::GPU, a, NodeType::NET, n));
        mark(m.route(NodeType::NET, n, NodeType::GPU, a));
      }
    }
    MaxFlow flow(netNode + 1);
    for (int res = 0; res < m.resources(); ++res) {
      LinkRef ref = m.link(res);
      if (ref.link < 0 || !routed[res]) continue;
      const auto& l = sys.link(ref);
      flow.addEdge(id(ref.node), id(l.rem), m.capacity(res), res);
      if (undirected) flow.addEdge(id(l.rem), id(ref.node), m.capacity(res), res);
    }
    if (inter)
      for (int n = 0; n < sys.count(NodeType::NET); ++n) {
        flow.addEdge(netNode, id({NodeType::NET, n}), MaxFlow::kInf, -1);
        flow.addEdge(id({NodeType::NET, n}), netNode, MaxFlow::kInf, -1);
      }
    std::vector<int> terminals;
    std::vector<std::string> names;
    for (int g = 0; g < ngpus; ++g) {
      terminals.push_back(id({NodeType::GPU, g}));
      names.push_back(gpuName(g));
    }
    if (inter) {
      terminals.push_back(netNode);
      names.push_back("network");
    }
    auto cutOf = [&](const std::vector<char>& side) {
      std::vector<int> res;
      for (const auto& e : flow.edges())
        if (e.res >= 0) {
          LinkRef ref = m.link(e.res);
          int u = id(ref.node), v = id(sys.link(ref).rem);
          if ((side[u] && !side[v]) || (undirected && side[v] && !side[u])) res.push_back(e.res);
        }
      return res;
    };
    // Each GPU (and the network) alone: every channel leaves it and enters it.
    for (size_t t = 0; t < terminals.size(); ++t) {
      std::vector<char> side(netNode + 1, 0);
      side[terminals[t]] = 1;
      if (terminals[t] == netNode)
        for (int n = 0; n < sys.count(NodeType::NET); ++n) side[id({NodeType::NET, n})] = 1;
      else
        side[id({NodeType::DEV, sys.of(NodeType::GPU)[t].parent})] = 1;
      addCut(cutOf(side), names[t] + (undirected ? "" : " out"), minUnits);
      if (!undirected) {
        for (auto& v : side) v = !v;
        addCut(cutOf(side), names[t] + " in", minUnits);
      }
    }
    // The smallest cut between the first terminal and each other one, both ways: together they contain the
    // smallest cut separating any two terminals.
    std::vector<char> side;
    for (size_t t = 1; t < terminals.size(); ++t) {
      flow.run(terminals[0], terminals[t], &side);
      addCut(cutOf(side), names[0] + " -> " + names[t], minUnits);
      if (!undirected) {
        flow.run(terminals[t], terminals[0], &side);
        addCut(cutOf(side), names[t] + " -> " + names[0], minUnits);
      }
    }
    if (inter) {
      std::vector<int> ports;
      for (int n = 0; n < sys.count(NodeType::NET); ++n) ports.push_back(m.portResource(n));
      addCut(ports, "NIC ports", minUnits);
    }
  }
  std::stable_sort(cuts.begin(), cuts.end(), [](const Cut& a, const Cut& b) {
    return a.capacity * kLoadUnit / a.minUnits < b.capacity * kLoadUnit / b.minUnits;
  });
  double bound = cuts.empty() ? std::numeric_limits<double>::infinity() : cuts[0].capacity * kLoadUnit / cuts[0].minUnits;
  if (cutsOut) *cutsOut = std::move(cuts);
  return bound;
}

}  // namespace topocoll::search
