// A communicator's connections: the context the transports read, the proxy, the network plugin and the channels.
// Rings and trees are connected at init (NCCL does so when memory is not cuMem-managed, as host memory is not);
// point-to-point connectors on first use, on the channels NCCL's p2p schedule gives each peer (src/init.cc
// ncclP2pSchedule, src/include/channel.h ncclP2pChannelBaseForRound).
//
//   progress::Connections::Setup s;        // ranks, peers, knobs, the plan's rings and this rank's trees
//   auto conns = std::make_unique<progress::Connections>(s);   // context, proxy, NET, channels, p2p schedule
//   conns->connectRingsAndTrees();          // collective: every rank calls it
//   transport::Connector* k = conns->linkConnector(channel, peer, /*send=*/true);  // connects the peer if needed
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/transport/transport.h"

namespace topocoll::transport {
class Proxy;
class Net;
}  // namespace topocoll::transport

namespace topocoll::progress {

/// A channel's tree around this rank: parent and up to 3 children (-1: none).
struct ChannelTree {
  int up = -1;
  std::array<int, 3> down{-1, -1, -1};
};

/// The graph tags of the connection lines (transport::setupConnections): ring and tree graphs, as NCCL numbers them
/// (its graph index + 1); point-to-point connections have 0.
constexpr int kRingGraphTag = 1;
constexpr int kTreeGraphTag = 2;

class Connections {
 public:
  struct Setup {
    int rank = 0, nRanks = 0;
    std::vector<transport::PeerInfo> peers;
    Config cfg;
    /// GPU ranks: this node's system with paths (null for host-memory ranks); must outlive the connections.
    const topology::System* system = nullptr;
    bootstrap::Bootstrap* bootstrap = nullptr;
    const std::atomic<bool>* abortFlag = nullptr;
    /// Ranks of each host, in rank order, and this rank's host and place in it.
    std::vector<std::vector<int>> hostRanks;
    int host = 0, localRank = 0, localRanks = 1;
    /// [channel]: the job's rings (every rank sees the same) and this rank's trees.
    std::vector<std::vector<int>> rings;
    std::vector<ChannelTree> trees;
    int p2pnChannels = 1, p2pnChannelsPerPeer = 1, nvlsChannels = 0;
    /// The network device of a channel's connection (the plan's NIC for rings, the local one for point-to-point).
    std::function<int(int channel, int connIndex)> netDev;
  };
  /// Makes the context, the proxy, the network plugin (required with more than one host) and the channels, and
  /// lists each peer's point-to-point connectors; connects nothing yet.
  explicit Connections(const Setup& s);
  /// Releases the channels (their buffers) before the proxy that serves them and the network it progresses.
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  /// Connects every channel's ring neighbours, then its tree links (connection index 0). Collective.
  void connectRingsAndTrees();
  /// Makes the point-to-point connections to `peers` that are not made yet, both directions (the peers do the
  /// same: the exchanges match). Collective between the ranks concerned; throws kAborted after abort.
  void ensureConnected(const std::vector<int>& peers);
  void ensureConnected(int peer) {
    if (peer != rank_ && !p2pConnected_[peer].load(std::memory_order_acquire)) ensureConnected(std::vector<int>{peer});
  }
  bool connected(int peer) const { return p2pConnected_[peer].load(std::memory_order_acquire); }
  /// The connector a collective's transfer to/from `peer` on `channel` uses: the ring or tree connector init made,
  /// else (and always over NET, whose ring connectors carry no acknowledgements) a point-to-point one, connected if
  /// needed.
  transport::Connector* linkConnector(int channel, int peer, bool send);
  /// The peer's point-to-point connectors in one direction (listed at construction, then only read).
  const std::vector<transport::Connector*>& p2pConnectors(int peer, transport::Side side) const {
    return p2pConns_[side == transport::Side::kSend ? 1 : 0][peer];
  }
  /// Point-to-point channels of a message to one peer, at least (NCCL's p2pnChannelsPerPeer, shrunk to fit).
  int p2pMinChannels() const { return p2pMinChannels_; }
  /// NCCL's point-to-point chunk size (P2P/SHM or NET).
  size_t p2pChunk() const { return p2pChunk_; }

  int rank() const { return rank_; }
  int nRanks() const { return nRanks_; }
  /// Channels with rings (and trees).
  int nRingChannels() const { return static_cast<int>(rings_.size()); }
  const std::vector<int>& ring(int c) const { return rings_[c]; }
  const transport::Channel& channel(int c) const { return channels_[c]; }
  const std::vector<transport::Channel>& channels() const { return channels_; }
  transport::Context& context() { return *ctx_; }
  const transport::Context& context() const { return *ctx_; }
  const Config& config() const { return ctx_->cfg; }
  /// Serialises the bootstrap exchanges of connection setup with other users of the bootstrap (one at a time).
  std::mutex& setupMutex() { return setupMu_; }

 private:
  int p2pChannelBase(int round) const;

  int rank_ = 0, nRanks_ = 0;
  bool multiHost_ = false;
  std::vector<std::vector<int>> rings_;
  std::unique_ptr<transport::Net> net_;
  std::unique_ptr<transport::Proxy> proxy_;
  std::unique_ptr<transport::Context> ctx_;
  std::vector<transport::Channel> channels_;
  std::mutex setupMu_;
  std::vector<std::atomic<bool>> p2pConnected_;  // [peer]
  std::vector<std::vector<transport::Connector*>> p2pConns_[2];  // [recv, send][peer]
  int p2pMinChannels_ = 1, p2pGroupSize_ = 1, p2pnChannels_ = 1, nvlsChannels_ = 0, p2pnChannelsPerPeer_ = 1;
  size_t p2pChunk_ = 0;
};

}  // namespace topocoll::progress
