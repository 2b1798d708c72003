// Transport selection and the connect-record exchange. Follows NCCL 2.30.7 src/transport.cc (selectTransport,
// ncclTransportP2pSetup), Apache-2.0; our own code.
#include "topocoll/transport/transport.h"

#include <mutex>
#include <thread>

#include "topocoll/bootstrap/bootstrap.h"
#include "topocoll/log.h"
#include "topocoll/status.h"
#include "transports.h"

namespace topocoll::transport {

using Clock = std::chrono::steady_clock;

std::string peerGoneWhy(int rank, uint8_t state) {
  if (state == kPeerLeftComm)
    return fmt::format("rank {} destroyed its communicator (its process lives on; it left before this call ended)",
                       rank);
  return fmt::format("rank {}'s process is gone (it exited or was killed)", rank);
}

const char* protocolName(int proto) {
  switch (proto) {
    case kProtoLL: return "LL";
    case kProtoLL128: return "LL128";
    case kProtoSimple: return "Simple";
  }
  return "?";
}

int Context::devOf(int r) const {
  if (peers[r].dev >= 0) return peers[r].dev;
  if (peers[r].cudaDev >= 0) return peers[r].cudaDev;  // ranks sharing a device, planned as host memory
  int local = 0;
  for (int i = 0; i < r; ++i) local += peers[i].hostHash == peers[r].hostHash;
  return local;
}

namespace {
std::mutex gBrokenMu;  // connectors break rarely; one lock for all of them
}

void Connector::markBroken(const std::string& why, bool peerClosed) {
  std::lock_guard<std::mutex> lock(gBrokenMu);
  if (broken_.load()) return;
  brokenWhy_ = why;
  closedByPeer_.store(peerClosed, std::memory_order_relaxed);
  broken_.store(true, std::memory_order_release);
}

std::string Connector::brokenReason() const {
  std::lock_guard<std::mutex> lock(gBrokenMu);
  return brokenWhy_;
}

bool ConnectMasks::empty() const {
  for (size_t i = 0; i < recv.size(); ++i)
    if (recv[i] || send[i]) return false;
  return true;
}

const std::vector<const Transport*>& registry() {
  static const std::vector<const Transport*> r = {&p2pTransport(), &shmTransport(), &netTransport()};
  return r;
}

int transportIndex(const Transport* t) {
  const auto& r = registry();
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i] == t) return static_cast<int>(i);
  return -1;
}

std::string checkRecord(const ConnectRecord& r, uint64_t commId, int nRanks, int from, int me, int channel,
                        int connIndex, Side mySide) {
  if (r.magic != ConnectRecord::kMagic) return fmt::format("wrong magic {:#x}", r.magic);
  if (r.commId != commId) return fmt::format("it belongs to communicator {:016x}, not {:016x}", r.commId, commId);
  if (r.rank < 0 || r.rank >= nRanks) return fmt::format("its rank {} is out of range [0, {})", r.rank, nRanks);
  if (r.rank != from) return fmt::format("it was made by rank {}, but came from rank {}", r.rank, from);
  if (r.peer != me) return fmt::format("it is for rank {}", r.peer);
  if (r.channel != channel || r.connIndex != connIndex)
    return fmt::format("it is for channel {}/{}, expected {}/{}", r.channel, r.connIndex, channel, connIndex);
  if (r.side == static_cast<uint8_t>(mySide) || r.side > 1)
    return fmt::format("it is a {} record, a {} record was expected", r.side == 1 ? "send" : "recv",
                       mySide == Side::kSend ? "recv" : "send");
  if (r.transport >= registry().size()) return fmt::format("unknown transport {}", r.transport);
  return "";
}

namespace {

// NCCL's selectTransport<type>: the first transport that can connect sets this side up.
void selectTransport(Context& ctx, Connector& c, ConnectRecord* rec) {
  const PeerInfo& me = ctx.peers[ctx.rank];
  const PeerInfo& peer = ctx.peers[c.peer];
  for (const Transport* t : registry()) {
    if (!t->canConnect(ctx, me, peer)) continue;
    *rec = ConnectRecord{};
    rec->magic = ConnectRecord::kMagic;
    rec->side = static_cast<uint8_t>(c.side);
    rec->connIndex = static_cast<uint8_t>(c.connIndex);
    rec->transport = static_cast<uint8_t>(transportIndex(t));
    rec->commId = ctx.commId;
    rec->rank = ctx.rank;
    rec->peer = c.peer;
    rec->channel = c.channel;
    c.transport = t;
    t->setup(ctx, c, rec);
    return;
  }
  fail(StatusCode::kSystemError, "No transport found for rank {}[{:x}] -> rank {}[{:x}]", me.rank, me.busId, peer.rank,
       peer.busId);
}

struct Pending {
  Connector* conn;
  const ConnectRecord* rec;
  int from;
};

void checkWait(const Context& ctx, Clock::time_point deadline, const std::string& what) {
  if (ctx.abortFlag && ctx.abortFlag->load()) fail(StatusCode::kAborted, "rank {}: aborted while {}", ctx.rank, what);
  if (Clock::now() > deadline) fail(StatusCode::kTimeout, "rank {}: timeout while {}", ctx.rank, what);
}

}  // namespace

namespace {
// The bootstrap tag of round `round`'s connect records, and of the exchange that ends the setup.
int recordTag(int round, int graphTag) { return (round << 8) + graphTag; }
int doneTag(int round, int graphTag) { return (round << 8) + (1 << 7) + graphTag; }
}  // namespace

bool peerConnecting(const Context& ctx, int peer, int graphTag) {
  const int n = ctx.nRanks, me = ctx.rank;
  if (n == 1 || peer == me || !ctx.bootstrap) return false;
  // The peer's round with this rank as its send peer, and the one with this rank as its receive peer.
  const int asSend = (me - peer + n) % n, asRecv = (peer - me + n) % n;
  return ctx.bootstrap->hasMessage(peer, recordTag(asSend, graphTag)) ||
         (asRecv != asSend && ctx.bootstrap->hasMessage(peer, recordTag(asRecv, graphTag)));
}

void setupConnections(Context& ctx, std::vector<Channel>& channels, const ConnectMasks& masks, int connIndex,
                      int graphTag) {
  const int n = ctx.nRanks, me = ctx.rank;
  if (n == 1) return;
  bootstrap::Bootstrap& bs = *ctx.bootstrap;
  // Per round i: the records of the connectors this rank makes and, after the exchange, the peers'.
  struct Round {
    int recvPeer, sendPeer;
    std::vector<Connector*> recvConns, sendConns;
    std::vector<ConnectRecord> data;  // [recv records..., send records...]
    std::vector<ConnectRecord> recvIn, sendIn;
  };
  std::vector<Round> rounds;
  for (int i = 1; i < n; ++i) {
    Round r;
    r.recvPeer = (me - i + n) % n;
    r.sendPeer = (me + i) % n;
    for (int c = 0; c < kMaxChannels; ++c) {
      if (!(masks.recv[r.recvPeer] >> c & 1)) continue;
      Connector& k = channels.at(c).connector(r.recvPeer, Side::kRecv, connIndex);
      if (!k.connected) r.recvConns.push_back(&k);
    }
    for (int c = 0; c < kMaxChannels; ++c) {
      if (!(masks.send[r.sendPeer] >> c & 1)) continue;
      Connector& k = channels.at(c).connector(r.sendPeer, Side::kSend, connIndex);
      if (!k.connected) r.sendConns.push_back(&k);
    }
    if (r.recvConns.empty() && r.sendConns.empty()) continue;
    r.data.resize(r.recvConns.size() + r.sendConns.size());
    size_t k = 0;
    for (Connector* c : r.recvConns) selectTransport(ctx, *c, &r.data[k++]);
    for (Connector* c : r.sendConns) selectTransport(ctx, *c, &r.data[k++]);
    const int tag = recordTag(i, graphTag);
    const size_t nr = r.recvConns.size(), ns = r.sendConns.size();
    if (r.sendPeer == r.recvPeer) {
      bs.send(r.recvPeer, tag, r.data.data(), sizeof(ConnectRecord) * (nr + ns));
      std::vector<ConnectRecord> in(nr + ns);
      bs.recv(r.recvPeer, tag, in.data(), sizeof(ConnectRecord) * (nr + ns));
      // The peer's block starts with its recv records: those are for our send connectors.
      r.sendIn.assign(in.begin(), in.begin() + static_cast<long>(ns));
      r.recvIn.assign(in.begin() + static_cast<long>(ns), in.end());
    } else {
      if (nr) bs.send(r.recvPeer, tag, r.data.data(), sizeof(ConnectRecord) * nr);
      if (ns) bs.send(r.sendPeer, tag, r.data.data() + nr, sizeof(ConnectRecord) * ns);
      r.sendIn.resize(ns);
      r.recvIn.resize(nr);
      if (ns) bs.recv(r.sendPeer, tag, r.sendIn.data(), sizeof(ConnectRecord) * ns);
      if (nr) bs.recv(r.recvPeer, tag, r.recvIn.data(), sizeof(ConnectRecord) * nr);
    }
    rounds.push_back(std::move(r));
  }

  // Check every record, then connect until none is in progress (NCCL loops the same way).
  std::vector<Pending> pending;
  for (Round& r : rounds) {
    for (size_t j = 0; j < r.sendConns.size(); ++j) pending.push_back({r.sendConns[j], &r.sendIn[j], r.sendPeer});
    for (size_t j = 0; j < r.recvConns.size(); ++j) pending.push_back({r.recvConns[j], &r.recvIn[j], r.recvPeer});
  }
  for (const Pending& p : pending) {
    std::string why = checkRecord(*p.rec, ctx.commId, n, p.from, me, p.conn->channel, connIndex, p.conn->side);
    if (!why.empty())
      fail(StatusCode::kRemoteError, "rank {}: refused the connect record rank {} sent for channel {} ({}): {}", me,
           p.from, p.conn->channel, to_string(p.conn->side), why);
    if (p.rec->transport != transportIndex(p.conn->transport))
      fail(StatusCode::kInvalidUsage,
           "rank {}: channel {} to rank {}: rank {} connects with {}, this rank chose {} (do the NCCL_* knobs differ "
           "between ranks?)",
           me, p.conn->channel, p.from, p.from, registry()[p.rec->transport]->name(), p.conn->transport->name());
  }
  const auto deadline = Clock::now() + ctx.timeout;
  while (!pending.empty()) {
    bool progressed = false;
    for (size_t j = 0; j < pending.size();) {
      Pending& p = pending[j];
      if (p.conn->transport->connect(ctx, *p.conn, *p.rec)) {
        p.conn->connected = true;
        pending[j] = pending.back();
        pending.pop_back();
        progressed = true;
      } else {
        ++j;
      }
    }
    if (!pending.empty() && !progressed) {
      checkWait(ctx, deadline,
                fmt::format("connecting channel {} to rank {} (it has not connected its side)", pending[0].conn->channel,
                            pending[0].from));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Nobody returns (and maybe frees buffers) before its peers have connected to them.
  char none = 0;  // one byte: empty messages trip some bootstraps (memcpy from an empty buffer)
  for (const Round& r : rounds) {
    int i = (r.sendPeer - me + n) % n;
    const int tag = doneTag(i, graphTag);
    bool s = !r.sendConns.empty(), v = !r.recvConns.empty();
    if (r.recvPeer != r.sendPeer) {
      if (s) bs.send(r.sendPeer, tag, &none, 1);
      if (v) bs.send(r.recvPeer, tag, &none, 1);
      if (s) bs.recv(r.sendPeer, tag, &none, 1);
      if (v) bs.recv(r.recvPeer, tag, &none, 1);
    } else {
      bs.send(r.sendPeer, tag, &none, 1);
      bs.recv(r.sendPeer, tag, &none, 1);
    }
  }
}

}  // namespace topocoll::transport
