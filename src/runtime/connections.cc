// A communicator's transports: the context the transports read, the proxy, the network plugin and the channels;
// rings and trees are connected at init (NCCL does so when memory is not cuMem-managed, as host memory is not),
// point-to-point channels on first use, chosen by NCCL's p2p schedule (src/init.cc ncclP2pSchedule,
// src/include/channel.h ncclP2pChannelBaseForRound), Apache-2.0; our own code.
#include <algorithm>
#include <numeric>
#include <thread>

#include <unistd.h>

#include "engine.h"
#include "topocoll/log.h"
#include "topocoll/paths/paths.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "topocoll/topology/system.h"
#include "topocoll/transport/net.h"
#include "topocoll/transport/proxy.h"

namespace topocoll::runtime {

using transport::Side;

namespace {

// Waits of a rank on a host with more local ranks than cores yield for this long before they sleep on the doorbell:
// about a small collective's time at 4 ranks on 2 cores (docs/performance.md), so that most waits end without a
// futex wake-up, and short enough that an idle rank soon stops taking turns.
constexpr int kOversubscribedYieldUs = 100;

int log2Up(int x) {
  int n = 0;
  while ((1 << n) < x) ++n;
  return n;
}

int reverseBits(int x, int nBits) {
  int r = 0;
  for (int i = 0; i < nBits; ++i) r |= ((x >> i) & 1) << (nBits - 1 - i);
  return r;
}

int pow2Up(int x) { return 1 << log2Up(x); }

// NCCL's ncclP2pSchedule: round r pairs this rank with sendRank (r-th peer to send to) and recvRank; the quadratic
// walk over groups of nodes spreads the load. Returns [round] -> {sendRank, recvRank} and the group size.
std::vector<std::pair<int, int>> p2pSchedule(int rank, int nRanks, const std::vector<std::vector<int>>& nodeRanks,
                                             int myNode, int localRank, int* groupSizeOut) {
  int nNodes = static_cast<int>(nodeRanks.size());
  int maxLocal = 0;
  for (auto& n : nodeRanks) maxLocal = std::max(maxLocal, static_cast<int>(n.size()));
  int groupSize = nNodes > 1 ? 8 : maxLocal;  // NCCL_P2P_SCHEDULE_GROUP_SIZE = NCCL_MAX_DEV_WORK_P2P_PER_BATCH
  for (auto& n : nodeRanks) {
    int l = static_cast<int>(n.size());
    if (l % groupSize != 0 || l < groupSize) groupSize = std::gcd(groupSize, l);
  }
  *groupSizeOut = groupSize;
  int local = localRank % groupSize, group = localRank / groupSize;
  int nGroups = nRanks / groupSize, nGroupsPow2 = pow2Up(nGroups);
  std::vector<int> groupToNode, groupToLocal;
  for (int n = 0; n < nNodes; ++n) {
    int inNode = static_cast<int>(nodeRanks[n].size()) / groupSize;
    for (int g = 0; g < inNode; ++g) {
      groupToLocal.push_back(g * groupSize);
      groupToNode.push_back(n);
    }
    if (n < myNode) group += inNode;
  }
  std::vector<std::pair<int, int>> sched;
  uint32_t groupRound = 0, groupDelta = 0;
  do {
    if (groupDelta < static_cast<uint32_t>(nGroups)) {
      int sendGroup = (group + static_cast<int>(groupDelta)) % nGroups;
      int recvGroup = (group - static_cast<int>(groupDelta) + nGroups) % nGroups;
      for (int delta = 0; delta < groupSize; ++delta) {
        int sendLocal = groupToLocal[sendGroup] + (local + delta) % groupSize;
        int recvLocal = groupToLocal[recvGroup] + (local - delta + groupSize) % groupSize;
        sched.push_back({nodeRanks[groupToNode[sendGroup]][sendLocal], nodeRanks[groupToNode[recvGroup]][recvLocal]});
      }
    }
    groupRound += 1;
    groupDelta = (groupDelta + groupRound) & (static_cast<uint32_t>(nGroupsPow2) - 1);
  } while (groupRound != static_cast<uint32_t>(nGroupsPow2));
  if (static_cast<int>(sched.size()) != nRanks)
    fail(StatusCode::kInternal, "rank {}: the p2p schedule has {} rounds for {} ranks", rank, sched.size(), nRanks);
  return sched;
}

// The network device of a channel: for rings the NIC the plan chose (the graph's inter NET ids), for
// point-to-point the rank's local NIC (ncclTopoGetNetDev / ncclTopoGetLocalNet).
int netDevFor(const topology::System* sys, const Config& cfg, const search::NodeGraphs& node, int rank, int channel,
              int connIndex) {
  if (!sys || sys->count(topology::NodeType::NET) == 0) return 0;
  const search::Graph& g = node.graphs[search::kGraphRing];
  int64_t netId = -1;
  if (connIndex == 0 && g.nChannels > 0 && node.ranks > 0) {
    int ch = channel % g.nChannels;
    int index = g.intra[static_cast<size_t>(ch) * node.ranks] == rank ? 0 : 1;
    netId = g.inter[static_cast<size_t>(ch) * 2 + index];
  } else {
    netId = paths::localNet(*sys, cfg, rank, channel);
  }
  int ni = sys->indexOf(topology::NodeType::NET, netId);
  return ni >= 0 ? std::max(0, sys->of(topology::NodeType::NET)[ni].dev) : 0;
}

}  // namespace

void Communicator::setupTransports(const InitOptions& opts, const search::NodeGraphs& node) {
  const Config& cfg = opts.cfg;
  ctx_ = std::make_unique<transport::Context>();
  transport::Context& ctx = *ctx_;
  ctx.rank = rank_;
  ctx.nRanks = nRanks_;
  ctx.peers = peers_;
  ctx.cfg = cfg;
  for (auto& p : peers_) ctx.commId = (ctx.commId ^ p.nonce) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
  ctx.system = system_.get();
  ctx.buffSizes[transport::kProtoLL] = static_cast<size_t>(cfg.llBuffSize);
  ctx.buffSizes[transport::kProtoLL128] = 0;  // LL128 is not built for host memory
  ctx.buffSizes[transport::kProtoSimple] = static_cast<size_t>(cfg.buffSize);
  ctx.bootstrap = bs_.get();
  ctx.abortFlag = &abort_;
  ctx.timeout = std::chrono::milliseconds(static_cast<long long>(cfg.timeoutSec * 1000));
  ctx.peerGone = std::make_shared<std::vector<std::atomic<bool>>>(nRanks_);
  // The asymmetric fence makes each sleep cost a membarrier (IPIs): not where ranks outnumber cores and sleep often.
  ctx.doorbell = transport::Doorbell::process(cfg.membarrier != 0 &&
                                              localRanks_ <= static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  transport::Proxy::Options po;
  po.rank = rank_;
  po.nRanks = nRanks_;
  po.commId = ctx.commId;
  po.doorbell = ctx.doorbell;
  po.peerGone = ctx.peerGone;
  po.abortFlag = &abort_;
  po.timeout = ctx.timeout;
  proxy_ = std::make_unique<transport::Proxy>(po);
  ctx.proxy = proxy_.get();
  try {
    net_ = transport::makeSocketNet(cfg);
  } catch (const Error& e) {
    if (hosts_.size() > 1) throw;
    TC_INFO(log::kInit | log::kNet, "NET : no network device ({}); ranks of this host do not need one", e.what());
  }
  ctx.net = net_.get();
  ctx.netDev = [sys = system_.get(), cfg, node, r = rank_](int channel, int connIndex) {
    return netDevFor(sys, cfg, node, r, channel, connIndex);
  };

  // Channels: the rings and trees of the plan, and as many as point-to-point needs.
  int nChannels = static_cast<int>(connect_.rings.size());
  int p2pn = std::max(1, connect_.p2pnChannels);
  channels_.resize(std::max(nChannels, p2pn));
  for (int c = 0; c < static_cast<int>(channels_.size()); ++c) {
    transport::Channel& ch = channels_[c];
    ch.id = c;
    ch.peers.clear();
    for (int r = 0; r < nRanks_; ++r) {
      auto cp = std::make_unique<transport::ChannelPeer>();
      for (int ci = 0; ci < transport::kNumConnIndices; ++ci) {
        for (Side side : {Side::kSend, Side::kRecv}) {
          transport::Connector& k = side == Side::kSend ? cp->send[ci] : cp->recv[ci];
          k.side = side;
          k.peer = r;
          k.channel = c;
          k.connIndex = ci;
        }
      }
      ch.peers.push_back(std::move(cp));
    }
    if (c < nChannels) {
      const auto& ring = connect_.rings[c];
      int pos = static_cast<int>(std::find(ring.begin(), ring.end(), rank_) - ring.begin());
      ch.ringPrev = ring[(pos + nRanks_ - 1) % nRanks_];
      ch.ringNext = ring[(pos + 1) % nRanks_];
      const auto& t = connect_.trees[rank_][c];
      ch.treeUp = t.up;
      for (int i = 0; i < 3; ++i) ch.treeDown[i] = t.down[i];
    }
  }

  detail::Engine::Options eo;
  eo.rank = rank_;
  eo.timeout = ctx.timeout;
  eo.abortFlag = &abort_;
  eo.peerGone = ctx.peerGone;
  eo.doorbell = ctx.doorbell;
  eo.nRanks = nRanks_;
  // More ranks than cores on this host: never spin (the peers need the cores), yield a while before sleeping (a
  // peer's answer that comes within that time costs no futex wake-up on either side; Open MPI's vader waits with
  // sched_yield only).
  const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  eo.spinUs = localRanks_ > cpus ? 0 : 20;
  eo.yieldUs = localRanks_ > cpus ? kOversubscribedYieldUs : 0;
  waitSpinUs_ = eo.spinUs;
  waitYieldUs_ = eo.yieldUs;
  // This host's cores shared by its local ranks (processes); ranks of this process count once per process.
  int localProcs = std::max(1, localRanks_ / std::max(1, intraProcRanks_));
  transport::limitSpinners(std::max(1, std::min(transport::allowedCpus(), cpus / localProcs)));
  engine_ = std::make_unique<detail::Engine>(eo);

  // Point-to-point: NCCL's schedule, chunk size and channel counts.
  std::vector<std::vector<int>> nodeRanks(hosts_.size());
  for (int r = 0; r < nRanks_; ++r)
    nodeRanks[std::find(hosts_.begin(), hosts_.end(), peers_[r].hostHash) - hosts_.begin()].push_back(r);
  int groupSize = 1;
  auto sched = p2pSchedule(rank_, nRanks_, nodeRanks, node_, localRank_, &groupSize);
  sendRound_.assign(nRanks_, 0);
  recvRound_.assign(nRanks_, 0);
  for (int round = 0; round < nRanks_; ++round) {
    sendRound_[sched[round].first] = round;
    recvRound_[sched[round].second] = round;
  }
  p2pGroupSize_ = groupSize;
  p2pChunk_ = static_cast<size_t>(hosts_.size() > 1 ? cfg.p2pNetChunkSize : cfg.p2pPciChunkSize);
  if (p2pChunk_ * transport::kSteps > static_cast<size_t>(cfg.buffSize))
    p2pChunk_ = static_cast<size_t>(cfg.buffSize) / transport::kSteps;
  p2pMinChannels_ = std::max(1, connect_.p2pnChannelsPerPeer);
  while (p2pMinChannels_ * nRanks_ > p2pn && p2pMinChannels_ > 1) p2pMinChannels_ /= 2;
  p2pConnected_ = std::vector<std::atomic<bool>>(nRanks_);
  for (auto& idx : p2pIndex_) idx = std::make_unique<std::atomic<uint32_t>[]>(nRanks_);
  // Each peer's point-to-point connectors (NCCL's channels for the peer's round), listed once here: later only read,
  // from whichever threads send and receive.
  for (Side side : {Side::kRecv, Side::kSend}) {
    auto& list = p2pConns_[side == Side::kSend ? 1 : 0];
    list.assign(nRanks_, {});
    for (int r = 0; r < nRanks_; ++r) {
      int base = p2pChannelBase(side == Side::kSend ? sendRound_[r] : recvRound_[r]);
      for (int part = 0; part < std::max(1, connect_.p2pnChannelsPerPeer); ++part)
        list[r].push_back(&channels_[(base + part) & (p2pn - 1)].connector(r, side, 1));
    }
  }
  TC_INFO(log::kInit, "P2P Chunksize set to {}", p2pChunk_);

  // Rings then trees, connection index 0 (ncclTransportRingConnect, ncclTransportTreeConnect).
  if (nRanks_ > 1) {
    std::lock_guard<std::mutex> lock(setupMu_);
    transport::ConnectMasks rings(nRanks_);
    for (int c = 0; c < nChannels; ++c) {
      rings.mark(c, channels_[c].ringPrev, Side::kRecv);
      rings.mark(c, channels_[c].ringNext, Side::kSend);
    }
    transport::setupConnections(ctx, channels_, rings, 0, search::kGraphRing + 1);
    TC_INFO(log::kInit, "Connected all rings, use ring PXN 0 GDR 0");
    transport::ConnectMasks trees(nRanks_);
    for (int c = 0; c < nChannels; ++c) {
      const transport::Channel& ch = channels_[c];
      for (int d : ch.treeDown)
        if (d >= 0) trees.mark(c, d, Side::kRecv), trees.mark(c, d, Side::kSend);
      if (ch.treeUp >= 0) trees.mark(c, ch.treeUp, Side::kSend), trees.mark(c, ch.treeUp, Side::kRecv);
    }
    transport::setupConnections(ctx, channels_, trees, 0, search::kGraphTree + 1);
    TC_INFO(log::kInit, "Connected all trees");
  }
  TC_INFO(log::kInit, "{} coll channels, {} collnet channels, {} nvls channels, {} p2p channels, {} p2p channels per peer",
          nChannels, nChannels, connect_.nvlsChannels, connect_.p2pnChannels, connect_.p2pnChannelsPerPeer);
}

int Communicator::p2pChannelBase(int round) const {
  int base;
  if (hosts_.size() > 1) {
    int groupDelta = round / p2pGroupSize_, localDelta = round % p2pGroupSize_;
    base = groupDelta * ((p2pGroupSize_ + 7) / 8) + localDelta / 8;  // NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8
  } else {
    base = round;
  }
  return reverseBits(base, log2Up(std::max(1, connect_.p2pnChannels)));
}

const std::vector<transport::Connector*>& Communicator::p2pConnectors(int peer, Side side) {
  return p2pConns_[side == Side::kSend ? 1 : 0][peer];
}

void Communicator::ensureConnected(const std::vector<int>& peers) {
  bool all = true;  // the common case, without the lock: every peer is connected already
  for (int p : peers) all = all && (p == rank_ || p2pConnected_[p].load(std::memory_order_acquire));
  if (all) return;
  std::lock_guard<std::mutex> lock(setupMu_);
  transport::ConnectMasks masks(nRanks_);
  std::vector<int> todo;
  for (int p : peers) {
    if (p == rank_ || p2pConnected_[p].load() || std::find(todo.begin(), todo.end(), p) != todo.end()) continue;
    todo.push_back(p);
    // Both directions, whichever the operation: the peer does the same, so the exchanges always match.
    for (Side side : {Side::kSend, Side::kRecv})
      for (transport::Connector* k : p2pConnectors(p, side)) masks.mark(k->channel, p, side);
  }
  if (todo.empty()) return;
  if (abort_.load()) fail(StatusCode::kAborted, "rank {}: the communicator was aborted", rank_);
  transport::setupConnections(*ctx_, channels_, masks, 1, 0);
  for (int p : todo) p2pConnected_[p].store(true, std::memory_order_release);
}

void Communicator::connectAll() {
  std::vector<int> all(nRanks_);
  std::iota(all.begin(), all.end(), 0);
  ensureConnected(all);
}

std::vector<ConnectionInfo> Communicator::connections() const {
  std::vector<ConnectionInfo> out;
  for (const transport::Channel& ch : channels_)
    for (int r = 0; r < nRanks_; ++r)
      for (int ci = 0; ci < transport::kNumConnIndices; ++ci)
        for (Side side : {Side::kSend, Side::kRecv}) {
          const transport::Connector& k = side == Side::kSend ? ch.peers[r]->send[ci] : ch.peers[r]->recv[ci];
          if (k.connected) out.push_back({ch.id, ci, r, side, k.via});
        }
  return out;
}

void Communicator::abort() {
  abort_.store(true);
  if (engine_) engine_->abortAll();
}

}  // namespace topocoll::runtime
