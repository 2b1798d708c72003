// Path computation and policy. Follows NCCL 2.30.7 src/graph/paths.cc (ncclTopoSetPaths, ncclTopoComputePaths,
// ncclTopoCheckP2p/Gdr/Net, ncclTopoTrimSystem, ncclTopoSearchInit) (Apache-2.0), rule by rule.
#include "topocoll/paths/paths.h"

#include <algorithm>
#include <cfloat>

#include "topocoll/status.h"
#include "topocoll/topology/node_xml.h"

namespace topocoll::paths {

using topology::kLocBw;
using topology::Link;
using topology::LinkRef;
using topology::LinkType;
using topology::Node;
using topology::Path;

namespace {

constexpr int T(NodeType t) { return static_cast<int>(t); }
constexpr int P(PathType t) { return static_cast<int>(t); }

std::vector<Path>& pathsTo(System& sys, NodeRef from, NodeType t) {
  auto& v = sys.at(from).paths[T(t)];
  if (v.empty()) v.resize(sys.count(t));
  return v;
}

// Breadth-first relaxation from `base`: every node learns its best path to `base`.
void setPaths(System& sys, NodeRef base, const Config& cfg) {
  const NodeType bt = base.type;
  std::vector<NodeRef> list = {base}, next;
  Path& basePath = pathsTo(sys, base, bt)[base.index];
  basePath.list.clear();
  basePath.bw = kLocBw;
  basePath.type = PathType::LOC;
  const int pathMaxLength = bt == NodeType::GPU ? 2 : 1;
  NodeRef baseDev = bt == NodeType::GPU ? NodeRef{NodeType::DEV, sys.at(base).parent} : base;
  while (!list.empty()) {
    next.clear();
    for (NodeRef node : list) {
      const Node& nn = sys.at(node);
      for (int l = 0; l < static_cast<int>(nn.links.size()); ++l) {
        const Link& link = sys.at(node).links[l];
        NodeRef rem = link.rem;
        const Path& path = pathsTo(sys, node, bt)[base.index];
        Path& remPath = pathsTo(sys, rem, bt)[base.index];
        float bw = std::min(path.bw, link.bw);
        // Only go through a GPU's DEV node to reach that GPU, or (NVB) on to another DEV over NVLink.
        if (!(node == baseDev) && node.type == NodeType::DEV &&
            (link.type != LinkType::LOC || rem.type != NodeType::GPU) &&
            (cfg.nvbDisable || link.type != LinkType::NVL || rem.type != NodeType::DEV ||
             path.count() > pathMaxLength))
          continue;
        int newType = link.type == LinkType::NET ? P(PathType::LOC) : static_cast<int>(link.type);
        if (node.type == NodeType::PCI && rem.type == NodeType::PCI) newType = P(PathType::PXB);
        if (link.type == LinkType::PCI && (node.type == NodeType::CPU || rem.type == NodeType::CPU))
          newType = P(PathType::PHB);
        if (node.type == NodeType::DEV && path.type == PathType::NVL && newType == P(PathType::NVL) &&
            path.count() == pathMaxLength)
          newType = P(PathType::NVB);
        newType = std::max(P(path.type), newType);
        int remType = P(remPath.type);
        if (newType < remType || (newType == remType && remPath.bw < bw) ||
            (newType == remType && remPath.bw == bw && remPath.count() > path.count() + 1)) {
          const auto& rl = sys.at(rem).links;
          int rev = -1;
          for (int k = 0; k < static_cast<int>(rl.size()); ++k) {
            if (rl[k].rem == node && rl[k].type == link.type) {
              rev = k;
              break;
            }
          }
          if (rev < 0)
            fail(StatusCode::kInternal, "no reverse link from {}/{:x} to {}/{:x}", to_string(rem.type),
                 sys.at(rem).id, to_string(node.type), sys.at(node).id);
          std::vector<LinkRef> nl;
          nl.reserve(path.list.size() + 1);
          nl.push_back(LinkRef{rem, rev});
          nl.insert(nl.end(), path.list.begin(), path.list.end());
          remPath.list = std::move(nl);
          remPath.bw = bw;
          remPath.type = static_cast<PathType>(newType);
          if (std::find(next.begin(), next.end(), rem) == next.end()) next.push_back(rem);
        }
      }
    }
    std::swap(list, next);
  }
}

int mergePathType(int t0, int t1) {
  int mx = std::max(t0, t1), mn = std::min(t0, t1);
  if (mx == P(PathType::PHB) && mn == P(PathType::C2C)) return P(PathType::P2C);
  return mx;
}

// Route node (t1,i1) -> (t2,i2) through node (tx,ix).
void addInterStep(System& sys, NodeType tx, int ix, NodeType t1, int i1, NodeType t2, int i2) {
  Node& src = sys.of(t1)[i1];
  const Path& toMid = src.paths[T(tx)][ix];
  const Path& midTo = sys.of(tx)[ix].paths[T(t2)][i2];
  Path np;
  np.list = toMid.list;
  np.list.insert(np.list.end(), midTo.list.begin(), midTo.list.end());
  np.type = static_cast<PathType>(mergePathType(P(toMid.type), P(midTo.type)));
  if (tx == NodeType::GPU) np.type = PathType::PXN;
  np.bw = std::min(toMid.bw, midTo.bw);
  src.paths[T(t2)][i2] = std::move(np);
}

bool isPow2(int v) { return (v & (v - 1)) == 0; }
int mirrorBits(int val, int pow2) {
  int m = 0;
  for (int b = 1, mb = pow2 >> 1; b < pow2; b <<= 1, mb >>= 1)
    if (val & b) m |= mb;
  return m;
}

int gpuIndex(const System& sys, int rank) {
  int g = sys.gpuIndexOfRank(rank);
  if (g < 0) fail(StatusCode::kInvalidArgument, "rank {} has no GPU in this system", rank);
  return g;
}

// RCCL's ncclTopoCheckGdr default level: PXB; on Rome CPUs PHB when the GPU and the NIC hang off the same CPU
// (two hops each) in the same bus segment (the 0xf0000 bits of their ids).
int rcclGdrLevel(const System& sys, int g, int n) {
  const Node& cpu0 = sys.of(NodeType::CPU)[0];
  if (!(cpu0.arch == topology::kCpuArchX86 && cpu0.vendor == topology::kCpuVendorAmd &&
        cpu0.model == topology::kCpuModelAmdRome))
    return P(PathType::PXB);
  auto twoHopCpu = [&](const Node& node) -> int64_t {
    const auto& toCpu = node.paths[T(NodeType::CPU)];
    for (int c = 0; c < sys.count(NodeType::CPU); ++c)
      if (toCpu[c].count() == 2) return sys.of(NodeType::CPU)[c].id;
    return -1;
  };
  const Node& gpu = sys.of(NodeType::GPU)[g];
  const Node& net = sys.of(NodeType::NET)[n];
  const int64_t d1 = twoHopCpu(gpu), d2 = twoHopCpu(net);
  int64_t netBus = 0;  // the NIC's PCI bus id (its node id without the system bits)
  for (const auto& l : net.links)
    if (l.rem.type == NodeType::NIC) netBus = topology::localIdOf(sys.at(l.rem).id);
  if (d1 != -1 && d1 == d2 && (topology::localIdOf(gpu.id) & 0xf0000) == (netBus & 0xf0000)) return P(PathType::PHB);
  return P(PathType::PXB);
}

}  // namespace

bool useNetBetween(const System& sys, const Config& cfg, int g1, int g2) {
  if (cfg.netDisableIntra) return false;
  const Node& gpu1 = sys.of(NodeType::GPU)[g1];
  const Node& gpu2 = sys.of(NodeType::GPU)[g2];
  const float speed = gpu1.paths[T(NodeType::GPU)][g2].bw;
  float netSpeed1 = 0, netSpeed2 = 0;
  for (int n = 0; n < sys.count(NodeType::NET); ++n) {
    const Path& p1 = gpu1.paths[T(NodeType::NET)][n];
    const Path& p2 = gpu2.paths[T(NodeType::NET)][n];
    if (P(p1.type) <= P(PathType::PXB)) netSpeed1 = std::max(netSpeed1, p1.bw);
    if (P(p2.type) <= P(PathType::PXB)) netSpeed2 = std::max(netSpeed2, p2.bw);
  }
  return netSpeed1 > speed && netSpeed2 > speed;
}

std::vector<int> getLocal(const System& sys, NodeType type, int index, NodeType resultType, PathType* pathType) {
  std::vector<int> locals;
  const auto& paths = sys.of(type)[index].paths[T(resultType)];
  if (paths.empty()) return locals;
  int minType = P(PathType::DIS);
  float maxBw = 0;
  for (int i = 0; i < sys.count(resultType); ++i) {
    const Path& p = paths[i];
    if (p.bw > maxBw || (p.bw == maxBw && P(p.type) < minType)) {
      maxBw = p.bw;
      minType = P(p.type);
      if (pathType) *pathType = p.type;
      locals.clear();
    }
    if (p.bw == maxBw && P(p.type) == minType) locals.push_back(i);
  }
  return locals;
}

int localCpu(const System& sys, int gpu) {
  auto locals = getLocal(sys, NodeType::GPU, gpu, NodeType::CPU);
  if (locals.empty())
    fail(StatusCode::kInvalidArgument, "GPU {} (rank {}) has no path to any CPU", sys.of(NodeType::GPU)[gpu].dev,
         sys.of(NodeType::GPU)[gpu].rank);
  const auto& paths = sys.of(NodeType::GPU)[gpu].paths[T(NodeType::CPU)];
  int cpu = locals[0];
  for (size_t i = 1; i < locals.size(); ++i)
    if (paths[locals[i]].count() < paths[cpu].count()) cpu = locals[i];
  return cpu;
}

int64_t localNet(const System& sys, const Config& cfg, int rank, int channel, int* dev) {
  int gpu = gpuIndex(sys, rank);
  auto nets = getLocal(sys, NodeType::GPU, gpu, NodeType::NET);
  if (nets.empty()) fail(StatusCode::kInvalidArgument, "rank {}: no path from its GPU to any NET", rank);
  auto gpus = getLocal(sys, NodeType::NET, nets[0], NodeType::GPU);
  int nNets = static_cast<int>(nets.size()), nGpus = std::max(1, static_cast<int>(gpus.size()));
  int netsPerGpu = cfg.netDevsPolicy == 1   ? nNets
                   : cfg.netDevsPolicy == 2 ? std::min(cfg.netDevsPolicyMax, nNets)
                                            : (nNets + nGpus - 1) / nGpus;
  int net = sys.of(NodeType::GPU)[gpu].dev % nGpus;
  if (isPow2(nNets)) net = mirrorBits(net, nNets);
  net += channel % netsPerGpu;
  const Node& n = sys.of(NodeType::NET)[nets[net % nNets]];
  if (dev) *dev = n.dev;
  return n.id;
}

int localGpuOfNet(const System& sys, const Config& cfg, int64_t netId) {
  int n = sys.indexOf(NodeType::NET, netId);
  auto gpus = getLocal(sys, NodeType::NET, n, NodeType::GPU);
  for (int c = 0; c < 64; ++c) {
    for (int g : gpus) {
      if (localNet(sys, cfg, sys.of(NodeType::GPU)[g].rank, c) == netId) return g;
    }
  }
  return -1;
}

int intermediateRank(const System& sys, int rank, int64_t netId) {
  int n = sys.indexOf(NodeType::NET, netId);
  int g = gpuIndex(sys, rank);
  const Path& path = sys.of(NodeType::GPU)[g].paths[T(NodeType::NET)][n];
  if (path.type != PathType::PXN) return rank;
  int i = 1;
  while (i < path.count() && sys.link(path.list[i]).rem.type == NodeType::NVS) ++i;
  NodeRef node = sys.link(path.list[std::min(i, path.count() - 1)]).rem;
  if (node.type == NodeType::DEV) {
    for (auto& l : sys.at(node).links) {
      if (l.rem.type == NodeType::GPU) {
        node = l.rem;
        break;
      }
    }
  }
  if (node.type != NodeType::GPU)
    fail(StatusCode::kInternal, "could not find the intermediate GPU between rank {} and NET {:x}", rank, netId);
  return sys.at(node).rank;
}

bool checkP2p(const System& sys, const Config& cfg, int rank1, int rank2, bool* read, int* interRank) {
  if (read) *read = false;
  if (interRank) *interRank = -1;
  int g1 = gpuIndex(sys, rank1);
  int g2 = sys.gpuIndexOfRank(rank2);
  if (g2 < 0) return false;
  const Node& gpu1 = sys.of(NodeType::GPU)[g1];
  const Node& gpu2 = sys.of(NodeType::GPU)[g2];
  // GPUs of different hosts share a system only in a multi-node NVLink clique, where NCCL's ncclTopoCheckMNNVL lets
  // them use P2P (same fabric, same clique): the path decides, as within a host.
  const Path& path = gpu1.paths[T(NodeType::GPU)][g2];
  if (path.count() == 4 && interRank) {
    NodeRef mid = sys.link(path.list[1]).rem;
    if (mid.type == NodeType::DEV) {
      for (auto& g : sys.of(NodeType::GPU))
        if (g.parent == mid.index) *interRank = g.rank;
    }
  }
  int level = P(PathType::PXB);
  const Node& cpu0 = sys.of(NodeType::CPU)[0];
  if (sys.amdGpus()) {
    // RCCL's ncclTopoCheckP2p: "use P2P whenever we can", except through ARM, Intel and Zhaoxin CPUs.
    const bool pxbCpu = cpu0.arch == topology::kCpuArchArm ||
                        (cpu0.arch == topology::kCpuArchX86 && (cpu0.vendor == topology::kCpuVendorIntel ||
                                                               cpu0.vendor == topology::kCpuVendorZhaoxin));
    level = pxbCpu ? P(PathType::PXB) : P(PathType::SYS);
  } else if (cpu0.arch == topology::kCpuArchX86 && cpu0.vendor == topology::kCpuVendorAmd &&
             sys.count(NodeType::DEV) <= 2) {
    level = P(PathType::SYS);
  }
  if (cfg.p2pLevel) level = *cfg.p2pLevel;
  bool p2p = P(path.type) <= level;
  if (path.type == PathType::NVL && read && gpu1.cudaCompCap == gpu2.cudaCompCap && gpu1.cudaCompCap == 80) *read = true;
  return p2p;
}

GdrMode checkGdr(const System& sys, const Config& cfg, int rank, int64_t netId, bool read) {
  int n = sys.indexOf(NodeType::NET, netId);
  int g = gpuIndex(sys, rank);
  const Node& net = sys.of(NodeType::NET)[n];
  const Node* gpu = &sys.of(NodeType::GPU)[g];
  if (net.gdrSupport == 0 || gpu->gdrSupport == 0) return GdrMode::kDisable;
  if (gpu->mloPart != topology::kUndef) return GdrMode::kDisable;
  if (read) {
    if (cfg.netGdrRead == 0) return GdrMode::kDisable;
    // Pre-Ampere reads need an NVLink peer (NCCL); RCCL has no such rule.
    if (cfg.netGdrRead < 0 && gpu->cudaCompCap < 80 && !sys.amdGpus()) {
      bool nvlink = sys.count(NodeType::GPU) == 1;
      for (int i = 0; i < sys.count(NodeType::GPU) && !nvlink; ++i)
        if (i != g && gpu->paths[T(NodeType::GPU)][i].type == PathType::NVL) nvlink = true;
      if (!nvlink) return GdrMode::kDisable;
    }
  }
  int level = cfg.netGdrC2c ? P(PathType::P2C) : P(PathType::PXB);
  if (sys.amdGpus()) level = rcclGdrLevel(sys, g, n);
  if (cfg.netGdrLevel) level = *cfg.netGdrLevel;
  int distance = P(gpu->paths[T(NodeType::NET)][n].type);
  if (distance == P(PathType::PXN)) {
    int proxy = intermediateRank(sys, gpu->rank, netId);
    g = gpuIndex(sys, proxy);
    gpu = &sys.of(NodeType::GPU)[g];
    distance = P(gpu->paths[T(NodeType::NET)][n].type);
  }
  if (distance > level) return GdrMode::kDisable;
  int c = localCpu(sys, g);
  if (gpu->paths[T(NodeType::CPU)][c].type == PathType::C2C && distance != P(PathType::P2C)) return GdrMode::kPci;
  return GdrMode::kDefault;
}

namespace {

// ncclTopoComputePaths' steps, in its order.

// Bottleneck-bandwidth BFS from every CPU, DEV, GPU, NET and NVSwitch.
void allBestPaths(System& sys, const Config& cfg) {
  for (auto& vec : sys.nodes)
    for (auto& n : vec)
      for (auto& p : n.paths) p.clear();
  for (NodeType t : {NodeType::CPU, NodeType::DEV, NodeType::GPU, NodeType::NET, NodeType::NVS})
    for (int i = 0; i < sys.count(t); ++i) setPaths(sys, {t, i}, cfg);
  // Every node gets path arrays towards every type that exists (unreachable = DIS).
  for (auto& vec : sys.nodes)
    for (auto& n : vec)
      for (int t = 0; t < topology::kNodeTypes; ++t)
        if (n.paths[t].empty() && !sys.nodes[t].empty()) n.paths[t].resize(sys.nodes[t].size());
}

// A rank's shared-memory device (its container); 0 when none is given.
int shmOf(const std::vector<int>& shmDevByRank, int rank) {
  return rank >= 0 && rank < static_cast<int>(shmDevByRank.size()) ? shmDevByRank[rank] : 0;
}

// GPU pairs without P2P go through the CPU local to the destination GPU.
void divertWithoutP2p(System& sys, const Config& cfg, const std::vector<int>& shmDevByRank) {
  const int nGpus = sys.count(NodeType::GPU);
  for (int g = 0; g < nGpus; ++g) {
    for (int p = 0; p < nGpus; ++p) {
      const int rp = sys.of(NodeType::GPU)[p].rank, rg = sys.of(NodeType::GPU)[g].rank;
      if (shmOf(shmDevByRank, rp) != shmOf(shmDevByRank, rg) || !checkP2p(sys, cfg, rp, rg))
        addInterStep(sys, NodeType::CPU, localCpu(sys, g), NodeType::GPU, p, NodeType::GPU, g);
    }
  }
}

// Peers that can use neither P2P nor SHM (the P2P and SHM transports' canConnect) are marked NET: trimming
// separates them into different NCCL nodes. Both transports refuse a pair that the network serves better.
void markNetPeers(System& sys, const Config& cfg, const std::vector<int>& shmDevByRank) {
  const int nGpus = sys.count(NodeType::GPU);
  for (int g = 0; g < nGpus; ++g) {
    for (int p = 0; p < nGpus; ++p) {
      if (p == g) continue;
      const Node& src = sys.of(NodeType::GPU)[p];
      const Node& dst = sys.of(NodeType::GPU)[g];
      const bool net = useNetBetween(sys, cfg, p, g);
      const bool sameHost = topology::systemIdOf(src.id) == topology::systemIdOf(dst.id);
      const bool sameShm = shmOf(shmDevByRank, src.rank) == shmOf(shmDevByRank, dst.rank);
      const bool p2p = !net && sameShm && checkP2p(sys, cfg, src.rank, dst.rank);
      const bool shm = !cfg.shmDisable && !net && sameHost && sameShm;
      if (!p2p && !shm) sys.of(NodeType::GPU)[p].paths[T(NodeType::GPU)][g].type = PathType::NET;
    }
  }
}

// C2C + PHB: a GPU reaching its closest NIC over C2C then PCI is P2C (other NICs stay PHB: PXN is preferred).
void c2cNetPaths(System& sys) {
  for (int g = 0; g < sys.count(NodeType::GPU); ++g) {
    const int c = localCpu(sys, g);
    for (int n : getLocal(sys, NodeType::GPU, g, NodeType::NET)) {
      Node& gpu = sys.of(NodeType::GPU)[g];
      Node& net = sys.of(NodeType::NET)[n];
      if (mergePathType(P(gpu.paths[T(NodeType::CPU)][c].type), P(net.paths[T(NodeType::CPU)][c].type)) ==
          P(PathType::P2C)) {
        auto& gp = gpu.paths[T(NodeType::NET)][n];
        gp.type = static_cast<PathType>(std::min(P(PathType::P2C), P(gp.type)));
        auto& np = net.paths[T(NodeType::GPU)][g];
        np.type = static_cast<PathType>(std::min(P(PathType::P2C), P(np.type)));
      }
    }
  }
}

// PXN: GPU g reaches NIC n through the NVLink peer that uses n first, when that peer reaches it at P2C (or PXB with
// NCCL_PXN_C2C=0) with GDR, on the same host, and either has more bandwidth or avoids the CPU.
bool usePxn(const System& sys, const Config& cfg, int g, int n, int lg) {
  const Node& peer = sys.of(NodeType::GPU)[lg];
  const Node& gpu = sys.of(NodeType::GPU)[g];
  const Path& peerNet = peer.paths[T(NodeType::NET)][n];
  const Path& gpuNet = gpu.paths[T(NodeType::NET)][n];
  if (sys.amdGpus())  // RCCL: the relay reaches the NIC at PXB or better, without a GDR check; the GPU avoids PXB+
    return P(peerNet.type) <= P(PathType::PXB) && P(peer.paths[T(NodeType::GPU)][g].type) <= P(PathType::NVL) &&
           topology::systemIdOf(peer.id) == topology::systemIdOf(gpu.id) &&
           (peerNet.bw > gpuNet.bw || P(gpuNet.type) > P(PathType::PXB));
  const int pxnType = cfg.pxnC2c ? P(PathType::P2C) : P(PathType::PXB);
  return P(peerNet.type) <= pxnType &&
         checkGdr(sys, cfg, peer.rank, sys.of(NodeType::NET)[n].id, true) != GdrMode::kDisable &&
         P(peer.paths[T(NodeType::GPU)][g].type) <= P(PathType::NVL) &&
         topology::systemIdOf(peer.id) == topology::systemIdOf(gpu.id) &&
         (peerNet.bw > gpuNet.bw || P(gpuNet.type) > P(PathType::PXN));
}

// GPU to NIC paths: PXN relays (GPU to NIC direction only), and CPU detours where GPU Direct RDMA is off.
void netPaths(System& sys, const Config& cfg) {
  for (int n = 0; n < sys.count(NodeType::NET); ++n) {
    const int64_t netId = sys.of(NodeType::NET)[n].id;
    for (int g = 0; g < sys.count(NodeType::GPU); ++g) {
      if (cfg.pxnDisable != 1) {
        const int lg = localGpuOfNet(sys, cfg, netId);
        if (lg != g && lg != -1 && usePxn(sys, cfg, g, n, lg))
          addInterStep(sys, NodeType::GPU, lg, NodeType::GPU, g, NodeType::NET, n);
      }
      if (P(sys.of(NodeType::GPU)[g].paths[T(NodeType::NET)][n].type) < P(PathType::PHB) &&
          checkGdr(sys, cfg, sys.of(NodeType::GPU)[g].rank, netId, false) == GdrMode::kDisable) {
        const int c = localCpu(sys, g);
        addInterStep(sys, NodeType::CPU, c, NodeType::NET, n, NodeType::GPU, g);
        addInterStep(sys, NodeType::CPU, c, NodeType::GPU, g, NodeType::NET, n);
      }
    }
  }
}

}  // namespace

void computePaths(System& sys, const Config& cfg, const std::vector<int>& shmDevByRank) {
  allBestPaths(sys, cfg);
  divertWithoutP2p(sys, cfg, shmDevByRank);
  markNetPeers(sys, cfg, shmDevByRank);
  c2cNetPaths(sys);
  netPaths(sys, cfg);
  for (auto& net : sys.of(NodeType::NET)) net.localGpu = localGpuOfNet(sys, cfg, net.id);
}

std::vector<int> gpuDomains(const System& sys) {
  const int ngpus = sys.count(NodeType::GPU);
  std::vector<int> domains(ngpus);
  for (int g = 0; g < ngpus; ++g) {
    const Node& gpu = sys.of(NodeType::GPU)[g];
    domains[g] = g;
    for (int p = 0; p < g; ++p)
      if (P(gpu.paths[T(NodeType::GPU)][p].type) < P(PathType::NET)) domains[g] = std::min(domains[g], domains[p]);
  }
  return domains;
}

void trimSystem(System& sys, int myRank, int nRanks) {
  const std::vector<int> domains = gpuDomains(sys);
  const int ngpus = static_cast<int>(domains.size());
  std::vector<int64_t> ids(ngpus);
  int myDomain = 0;
  for (int g = 0; g < ngpus; ++g) {
    ids[g] = sys.of(NodeType::GPU)[g].id;
    if (sys.of(NodeType::GPU)[g].rank == myRank) myDomain = domains[g];
  }
  for (int i = 0; i < ngpus; ++i) {
    if (domains[i] == myDomain) continue;
    sys.removeNode(NodeType::GPU, sys.indexOf(NodeType::GPU, ids[i]));
  }
  sys.inter = sys.count(NodeType::GPU) == nRanks ? 0 : 1;
}

void searchInit(System& sys) {
  sys.maxBw = 0;
  sys.totalBw = 0;
  if (sys.inter == 0 && sys.count(NodeType::GPU) == 1) {
    sys.maxBw = sys.totalBw = kLocBw;
    return;
  }
  NodeType target = sys.inter ? NodeType::NET : NodeType::DEV;
  for (auto& dev : sys.of(NodeType::DEV)) {
    float maxBw = 0;
    const auto& paths = dev.paths[T(target)];
    for (int i = 0; i < static_cast<int>(paths.size()); ++i) {
      if (paths[i].count() == 0) continue;
      maxBw = std::max(maxBw, paths[i].bw);
    }
    float nvl = 0, pci = 0;
    for (auto& l : dev.links) {
      if (l.type == LinkType::NVL) nvl += l.bw;
      if (l.type == LinkType::PCI) pci = l.bw;
    }
    sys.maxBw = std::max(sys.maxBw, maxBw);
    sys.totalBw = std::max(sys.totalBw, std::max(pci, nvl));
  }
}

void prepareForSearch(System& sys, const Config& cfg, int myRank, int nRanks, const std::vector<int>& shmDevByRank) {
  computePaths(sys, cfg, shmDevByRank);
  if (sys.count(NodeType::GPU) > 0) {
    trimSystem(sys, myRank, nRanks);
    computePaths(sys, cfg, shmDevByRank);
  }
  searchInit(sys);
}

System hostSystem(const topology::XmlDoc& topo, const Config& cfg, int nRanks) {
  std::vector<topology::LocalGpu> locals;
  auto devs = topology::gpuDevs(topo);
  for (size_t i = 0; i < devs.size(); ++i) locals.push_back({static_cast<int>(i), devs[i]});
  System sys = topology::buildSystem(topology::prepareNodeXml(topo, locals, cfg));
  prepareForSearch(sys, cfg, 0, nRanks < 0 ? static_cast<int>(locals.size()) : nRanks);
  return sys;
}

int gpuMinPath(const System& sys, NodeType type) {
  int mn = P(PathType::SYS);
  for (int i = 0; i < sys.count(NodeType::GPU); ++i) {
    const auto& paths = sys.of(NodeType::GPU)[i].paths[T(type)];
    for (int j = 0; j < static_cast<int>(paths.size()); ++j) {
      if (type == NodeType::GPU && i == j) continue;
      mn = std::min(mn, P(paths[j].type));
    }
  }
  return mn;
}

int gpuMaxPath(const System& sys, NodeType type) {
  int mx = P(PathType::LOC);
  for (int i = 0; i < sys.count(NodeType::GPU); ++i) {
    const auto& paths = sys.of(NodeType::GPU)[i].paths[T(type)];
    for (int j = 0; j < static_cast<int>(paths.size()); ++j) {
      if (type == NodeType::GPU && i == j) continue;
      mx = std::max(mx, P(paths[j].type));
    }
  }
  return mx;
}

std::vector<int> closestNets(const System& sys, int gpu) {
  std::vector<int> nets(sys.count(NodeType::NET));
  for (int i = 0; i < static_cast<int>(nets.size()); ++i) nets[i] = i;
  const auto& paths = sys.of(NodeType::GPU)[gpu].paths[T(NodeType::NET)];
  std::stable_sort(nets.begin(), nets.end(), [&](int a, int b) {
    if (paths[a].type != paths[b].type) return P(paths[a].type) < P(paths[b].type);
    return paths[a].bw > paths[b].bw;
  });
  return nets;
}

std::vector<int> closestGpus(const System& sys, int net) {
  std::vector<int> gpus(sys.count(NodeType::GPU));
  for (int i = 0; i < static_cast<int>(gpus.size()); ++i) gpus[i] = i;
  const auto& paths = sys.of(NodeType::NET)[net].paths[T(NodeType::GPU)];
  std::stable_sort(gpus.begin(), gpus.end(), [&](int a, int b) {
    if (paths[a].type != paths[b].type) return P(paths[a].type) < P(paths[b].type);
    return paths[a].bw > paths[b].bw;
  });
  return gpus;
}

std::string cpuAffinity(const System& sys, int gpu) { return sys.of(NodeType::CPU)[localCpu(sys, gpu)].affinity; }

int p2pChannelsToPeer(const System& sys, const Config& cfg, int g, int peerRank) {
  int peer = sys.gpuIndexOfRank(peerRank);
  if (peer >= 0) {
    if (peer == g) return -1;
    const Path& path = sys.of(NodeType::GPU)[peer].paths[T(NodeType::GPU)][g];
    if (path.type == PathType::NVL || path.type == PathType::NVB) {
      const Node& gpu = sys.of(NodeType::GPU)[g];
      if (!gpu.gcn.empty()) {  // RCCL: XGMI links of the GPU's width; gfx94x doubles the channels per link
        if (path.type != PathType::NVL) return 2;
        const int perLink = sys.of(NodeType::GPU)[0].gcn.rfind("gfx94", 0) == 0 ? 4 : 2;
        return perLink * std::max(1, static_cast<int>(path.bw / topology::xgmiWidth(gpu.gcn)));
      }
      float nvlBw = topology::nvlinkBw(gpu.cudaCompCap);
      return 2 * std::max(1, static_cast<int>(path.bw / nvlBw));
    }
    return 2;
  }
  // Remote peer: enough channels for the local NICs' bandwidth (ncclTopoGetLocalNetCountByBw).
  if (sys.count(NodeType::NET) == 0) return 2;
  int c = localCpu(sys, g);
  float gpuBw = sys.of(NodeType::GPU)[g].paths[T(NodeType::CPU)][c].bw;
  int rank = sys.of(NodeType::GPU)[g].rank;
  int count = 0;
  float total = 0;
  int64_t first = 0;
  for (int ch = 0; ch < 64; ++ch) {
    int64_t id = localNet(sys, cfg, rank, ch);
    if (ch == 0) first = id;
    else if (id == first) break;
    total += sys.of(NodeType::GPU)[g].paths[T(NodeType::NET)][sys.indexOf(NodeType::NET, id)].bw;
    ++count;
    if (total >= gpuBw) break;
  }
  int n = 2;
  if (count > 0) n = std::max(count, (static_cast<int>(total) + cfg.p2pPerChannelNetBw - 1) / cfg.p2pPerChannelNetBw);
  return n;
}

}  // namespace topocoll::paths
