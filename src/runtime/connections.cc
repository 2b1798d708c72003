// A communicator's transports at init: what the progress layer's Connections need (the plan's rings and this rank's
// trees, the hosts, each channel's NIC), the engine that drives them, and the point-to-point connections made on
// first use.
#include <algorithm>
#include <numeric>
#include <thread>

#include <unistd.h>

#include "topocoll/log.h"
#include "topocoll/paths/paths.h"
#include "topocoll/progress/connections.h"
#include "topocoll/progress/engine.h"
#include "topocoll/progress/mailboxes.h"
#include "comm_impl.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "topocoll/topology/system.h"
#include "topocoll/transport/transport.h"

namespace topocoll::runtime {

using transport::Side;

namespace {

// Waits of a rank on a host with more local ranks than cores yield for this long before they sleep on the doorbell:
// about a small collective's time at 4 ranks on 2 cores (docs/performance.md), so that most waits end without a
// futex wake-up, and short enough that an idle rank soon stops taking turns.
constexpr int kOversubscribedYieldUs = 100;

static_assert(progress::kRingGraphTag == search::kGraphRing + 1 && progress::kTreeGraphTag == search::kGraphTree + 1);

// The network device of a channel: for rings the NIC the plan chose (the graph's inter NET ids), for
// point-to-point the rank's local NIC (ncclTopoGetNetDev / ncclTopoGetLocalNet). Host-memory ranks have no PCI
// topology to choose by: their channels take the NICs in turn (channel c the c-th modulo their number, which
// NET's setup applies), the same on every host, so that with one NIC per rail (eth0 and eth1 on separate
// networks) both ends of a channel are on one rail and every rail carries its share (docs/cluster.md).
int netDevFor(const topology::System* sys, const Config& cfg, const search::NodeGraphs& node, int rank, int channel,
              int connIndex) {
  if (!sys) return channel;
  if (sys->count(topology::NodeType::NET) == 0) return 0;
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

void CommImpl::setupTransports(const InitOptions& opts, const search::NodeGraphs& node) {
  const Config& cfg = opts.cfg;
  progress::Connections::Setup s;
  s.rank = rank_;
  s.nRanks = nRanks_;
  s.peers = peers_;
  s.cfg = cfg;
  s.system = system();
  s.bootstrap = bs_.get();
  s.abortFlag = &abort_;
  s.hostRanks.assign(hosts_.size(), {});
  for (int r = 0; r < nRanks_; ++r)
    s.hostRanks[std::find(hosts_.begin(), hosts_.end(), peers_[r].hostHash) - hosts_.begin()].push_back(r);
  s.host = node_;
  s.localRank = localRank_;
  s.localRanks = localRanks_;
  s.rings = plan_.connect.rings;
  for (size_t c = 0; c < plan_.connect.rings.size(); ++c) {
    const auto& t = plan_.connect.trees[rank_][c];
    progress::ChannelTree ct;
    ct.up = t.up;
    for (int i = 0; i < 3; ++i) ct.down[i] = t.down[i];
    s.trees.push_back(ct);
  }
  s.p2pnChannels = plan_.connect.p2pnChannels;
  s.p2pnChannelsPerPeer = plan_.connect.p2pnChannelsPerPeer;
  s.nvlsChannels = plan_.connect.nvlsChannels;
  s.netDev = [sys = system(), cfg, node, r = rank_](int channel, int connIndex) {
    return netDevFor(sys, cfg, node, r, channel, connIndex);
  };
  conns_ = std::make_unique<progress::Connections>(s);
  const transport::Context& ctx = conns_->context();

  progress::Engine::Options eo;
  eo.rank = rank_;
  eo.timeout = ctx.timeout;
  eo.abortFlag = &abort_;
  eo.peerGone = ctx.peerGone;
  eo.doorbell = ctx.doorbell;
  eo.nRanks = nRanks_;
  // TOPOCOLL_NET_STREAMS; by default none between exactly two hosts and one over more: with BBR as the hosts'
  // congestion control more measured slower at 2 Gbit/s, none slower over three hosts at 500 Mbit/s
  // (docs/transport.md, "Streaming").
  eo.netStreamDepth = cfg.netStreams >= 0 ? static_cast<size_t>(cfg.netStreams) : hosts_.size() == 2 ? 0 : 1;
  // A failure another rank relayed (CommImpl::relayFailure), or calls that differ, end this rank's stalled operations.
  eo.onStall = [this](std::chrono::steady_clock::duration stalled, int peer, StatusCode* code, std::string* why) {
    return onStall(stalled, peer, code, why);
  };
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
  engine_ = std::make_unique<progress::Engine>(eo);
  mailboxes_ = std::make_unique<progress::Mailboxes>(*conns_, eo.spinUs, eo.yieldUs, eo.onStall);
  collQueue_ = std::make_unique<detail::CollQueue>(
      rank_, cfg.membarrier != 0,
      [this](detail::CollTask& t) {
        links();
        execute(t);
      },
      [this] { abort(); });
  detail::PointToPoint::Context pc;
  pc.rank = rank_;
  pc.nRanks = nRanks_;
  pc.nHosts = static_cast<int>(hosts_.size());
  pc.cudaDev = peers_[rank_].cudaDev;
  pc.conns = conns_.get();
  pc.engine = engine_.get();
  pc.aborted = &abort_;
  pc.owner = this;
  p2p_ = std::make_unique<detail::PointToPoint>(pc);

  // Rings then trees, connection index 0 (ncclTransportRingConnect, ncclTransportTreeConnect).
  conns_->connectRingsAndTrees();
}

void CommImpl::ensureConnected(const std::vector<int>& peers) { conns_->ensureConnected(peers); }
void CommImpl::ensureConnected(int peer) { conns_->ensureConnected(peer); }

void CommImpl::connectAll() {
  std::vector<int> all(nRanks_);
  std::iota(all.begin(), all.end(), 0);
  conns_->ensureConnected(all);
}

std::vector<ConnectionInfo> CommImpl::connections() const {
  std::vector<ConnectionInfo> out;
  for (const transport::Channel& ch : conns_->channels())
    for (int r = 0; r < nRanks_; ++r)
      for (int ci = 0; ci < transport::kNumConnIndices; ++ci)
        for (Side side : {Side::kSend, Side::kRecv}) {
          const transport::Connector& k = side == Side::kSend ? ch.peers[r]->send[ci] : ch.peers[r]->recv[ci];
          if (k.connected) out.push_back({ch.id, ci, r, side, k.via});
        }
  return out;
}

void CommImpl::abort() {
  abort_.store(true);
  if (engine_) engine_->abortAll();
}

}  // namespace topocoll::runtime
