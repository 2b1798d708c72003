// Connections of a communicator (progress/connections.h). NCCL's p2p schedule and channel base: src/init.cc
// ncclP2pSchedule and src/include/channel.h ncclP2pChannelBaseForRound (Apache-2.0), our own code.
#include "topocoll/progress/connections.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "topocoll/log.h"
#include "topocoll/status.h"
#include "topocoll/transport/doorbell.h"
#include "topocoll/transport/net.h"
#include "topocoll/transport/proxy.h"

namespace topocoll::progress {

using transport::Side;

namespace {

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

}  // namespace

Connections::Connections(const Setup& s)
    : rank_(s.rank), nRanks_(s.nRanks), multiHost_(s.hostRanks.size() > 1), rings_(s.rings) {
  const Config& cfg = s.cfg;
  ctx_ = std::make_unique<transport::Context>();
  transport::Context& ctx = *ctx_;
  ctx.rank = rank_;
  ctx.nRanks = nRanks_;
  ctx.peers = s.peers;
  ctx.cfg = cfg;
  for (auto& p : s.peers) ctx.commId = (ctx.commId ^ p.nonce) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
  ctx.system = s.system;
  ctx.buffSizes[transport::kProtoLL] = static_cast<size_t>(cfg.llBuffSize);
  ctx.buffSizes[transport::kProtoLL128] = 0;  // LL128 is not built for host memory
  ctx.buffSizes[transport::kProtoSimple] = static_cast<size_t>(cfg.buffSize);
  ctx.bootstrap = s.bootstrap;
  ctx.abortFlag = s.abortFlag;
  ctx.timeout = std::chrono::milliseconds(static_cast<long long>(cfg.timeoutSec * 1000));
  ctx.peerGone = std::make_shared<transport::PeerGone>(nRanks_);
  // The asymmetric fence makes each sleep cost a membarrier (IPIs): not where ranks outnumber cores and sleep often.
  ctx.doorbell = transport::Doorbell::process(cfg.membarrier != 0 &&
                                              s.localRanks <= static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  transport::Proxy::Options po;
  po.rank = rank_;
  po.nRanks = nRanks_;
  po.commId = ctx.commId;
  // The proxy's key: the ranks' nonces mixed another way than the commId (which names the socket, publicly).
  for (auto& p : s.peers) po.key = (po.key + p.nonce) * 0xff51afd7ed558ccdULL ^ 0xc4ceb9fe1a85ec53ULL;
  for (auto& p : s.peers) po.pids.push_back(p.pid);
  po.doorbell = ctx.doorbell;
  po.peerGone = ctx.peerGone;
  po.abortFlag = s.abortFlag;
  po.timeout = ctx.timeout;
  proxy_ = std::make_unique<transport::Proxy>(po);
  ctx.proxy = proxy_.get();
  try {
    net_ = transport::makeSocketNet(cfg);
  } catch (const Error& e) {
    if (multiHost_) throw;
    TC_INFO(log::kInit | log::kNet, "NET : no network device ({}); ranks of this host do not need one", e.what());
  }
  ctx.net = net_.get();
  ctx.netDev = s.netDev;

  // Channels: the rings and trees of the plan, and as many as point-to-point needs.
  const int nChannels = static_cast<int>(rings_.size());
  p2pnChannels_ = std::max(1, s.p2pnChannels);
  p2pnChannelsPerPeer_ = s.p2pnChannelsPerPeer;
  nvlsChannels_ = s.nvlsChannels;
  channels_.resize(std::max(nChannels, p2pnChannels_));
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
      const auto& ring = rings_[c];
      int pos = static_cast<int>(std::find(ring.begin(), ring.end(), rank_) - ring.begin());
      ch.ringPrev = ring[(pos + nRanks_ - 1) % nRanks_];
      ch.ringNext = ring[(pos + 1) % nRanks_];
      const ChannelTree& t = s.trees[c];
      ch.treeUp = t.up;
      for (int i = 0; i < 3; ++i) ch.treeDown[i] = t.down[i];
    }
  }

  // Point-to-point: NCCL's schedule, chunk size and channel counts.
  int groupSize = 1;
  auto sched = p2pSchedule(rank_, nRanks_, s.hostRanks, s.host, s.localRank, &groupSize);
  std::vector<int> sendRound(nRanks_, 0), recvRound(nRanks_, 0);
  for (int round = 0; round < nRanks_; ++round) {
    sendRound[sched[round].first] = round;
    recvRound[sched[round].second] = round;
  }
  p2pGroupSize_ = groupSize;
  p2pChunk_ = static_cast<size_t>(multiHost_ ? cfg.p2pNetChunkSize : cfg.p2pPciChunkSize);
  if (p2pChunk_ * transport::kSteps > static_cast<size_t>(cfg.buffSize))
    p2pChunk_ = static_cast<size_t>(cfg.buffSize) / transport::kSteps;
  p2pMinChannels_ = std::max(1, s.p2pnChannelsPerPeer);
  while (p2pMinChannels_ * nRanks_ > p2pnChannels_ && p2pMinChannels_ > 1) p2pMinChannels_ /= 2;
  p2pConnected_ = std::vector<std::atomic<bool>>(nRanks_);
  // Each peer's point-to-point connectors (NCCL's channels for the peer's round), listed once here: later only read,
  // from whichever threads send and receive.
  for (Side side : {Side::kRecv, Side::kSend}) {
    auto& list = p2pConns_[side == Side::kSend ? 1 : 0];
    list.assign(nRanks_, {});
    for (int r = 0; r < nRanks_; ++r) {
      int base = p2pChannelBase(side == Side::kSend ? sendRound[r] : recvRound[r]);
      for (int part = 0; part < std::max(1, s.p2pnChannelsPerPeer); ++part)
        list[r].push_back(&channels_[(base + part) & (p2pnChannels_ - 1)].connector(r, side, 1));
    }
  }
  TC_INFO(log::kInit, "P2P Chunksize set to {}", p2pChunk_);
}

Connections::~Connections() {
  // The connectors (and their buffers) before the proxy that serves them, the proxy before the network it
  // progresses.
  channels_.clear();
  proxy_.reset();
  ctx_.reset();
  net_.reset();
}

void Connections::connectRingsAndTrees() {
  const int nChannels = static_cast<int>(rings_.size());
  if (nRanks_ > 1) {
    std::lock_guard<std::mutex> lock(setupMu_);
    transport::ConnectMasks rings(nRanks_);
    for (int c = 0; c < nChannels; ++c) {
      rings.mark(c, channels_[c].ringPrev, Side::kRecv);
      rings.mark(c, channels_[c].ringNext, Side::kSend);
    }
    transport::setupConnections(*ctx_, channels_, rings, 0, kRingGraphTag);
    TC_INFO(log::kInit, "Connected all rings, use ring PXN 0 GDR 0");
    transport::ConnectMasks trees(nRanks_);
    for (int c = 0; c < nChannels; ++c) {
      const transport::Channel& ch = channels_[c];
      for (int d : ch.treeDown)
        if (d >= 0) trees.mark(c, d, Side::kRecv), trees.mark(c, d, Side::kSend);
      if (ch.treeUp >= 0) trees.mark(c, ch.treeUp, Side::kSend), trees.mark(c, ch.treeUp, Side::kRecv);
    }
    transport::setupConnections(*ctx_, channels_, trees, 0, kTreeGraphTag);
    TC_INFO(log::kInit, "Connected all trees");
  }
  TC_INFO(log::kInit, "{} coll channels, {} collnet channels, {} nvls channels, {} p2p channels, {} p2p channels per peer",
          nChannels, nChannels, nvlsChannels_, p2pnChannels_, p2pnChannelsPerPeer_);
}

int Connections::p2pChannelBase(int round) const {
  int base;
  if (multiHost_) {
    int groupDelta = round / p2pGroupSize_, localDelta = round % p2pGroupSize_;
    base = groupDelta * ((p2pGroupSize_ + 7) / 8) + localDelta / 8;  // NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8
  } else {
    base = round;
  }
  return reverseBits(base, log2Up(p2pnChannels_));
}

void Connections::ensureConnected(const std::vector<int>& peers) {
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
  if (ctx_->abortFlag && ctx_->abortFlag->load())
    fail(StatusCode::kAborted, "rank {}: the communicator was aborted", rank_);
  transport::setupConnections(*ctx_, channels_, masks, 1, 0);
  for (int p : todo) p2pConnected_[p].store(true, std::memory_order_release);
}

transport::Connector* Connections::linkConnector(int channel, int peer, bool send) {
  const Side side = send ? Side::kSend : Side::kRecv;
  if (channel < static_cast<int>(channels_.size())) {
    transport::Connector& k = channels_[channel].connector(peer, side, 0);
    // NET ring connectors carry no acknowledgements (a send completes when its proxy sent it), so a rank could
    // finish and close while its last message is still on the way: NET uses the point-to-point connectors, whose
    // sends complete when the receiver consumed them (connected before the algorithm runs).
    if (k.connected && !(k.conn.flags & transport::kConnNet)) return &k;
  }
  ensureConnected(peer);
  const auto& conns = p2pConnectors(peer, side);
  return conns[static_cast<size_t>(channel) % conns.size()];
}

}  // namespace topocoll::progress
