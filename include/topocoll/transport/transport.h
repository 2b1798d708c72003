// Transports: how two ranks connect and what a connection looks like to the code that moves data (seed 001;
// NCCL 2.30.7 src/transport.cc, src/include/transport.h, src/include/comm.h). A transport is a small class with
// canConnect, setup and connect; a registry tries P2P, then SHM, then NET and takes the first that can connect, for
// each channel and peer. Setup fills a 128-byte connect record (NCCL's ncclConnect) that travels over the bootstrap
// to the peer, whose connect consumes it. What a connector exposes afterwards (ConnInfo: FIFO buffers, head and
// tail counters) is the same for every transport, so the protocols (primitives.h) never look at the transport.
//
//   transport::Context ctx = ...;                         // the communicator's peers, knobs, proxy, bootstrap
//   transport::ConnectMasks m(nRanks);
//   m.mark(channel, peer, transport::Side::kSend);        // ... every connector to make (ncclTransportP2pConnect)
//   transport::setupConnections(ctx, channels, m, connIndex, graphTag);   // ncclTransportP2pSetup
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "topocoll/config.h"

namespace topocoll::topology {
struct System;
}
namespace topocoll::bootstrap {
class Bootstrap;
}

namespace topocoll::transport {

/// What every rank tells the others first (NCCL's ncclPeerInfo, the fields we use). Plain data.
struct PeerInfo {
  int32_t rank = 0;
  int32_t dev = -1;        // GPU `dev` in the topology, -1 for a host-memory rank
  int64_t busId = -1;      // GPU bus id, -1 for a host-memory rank
  uint64_t hostHash = 0;   // hostname + boot id, or NCCL_HOSTID
  uint64_t pidHash = 0;    // process
  uint64_t shmDev = 0;     // /dev/shm device: ranks of one host in different containers differ
  int32_t cudaCompCap = 0;
  int32_t gdrSupport = 0;
  int32_t numaNode = 0;    // NUMA node the rank runs on
  int32_t pid = 0;         // process id (single-copy transfers between processes)
  int32_t cudaDev = -1;    // the process's current CUDA device (NCCL's cudaDev), -1 without one
  int32_t planGpu = 0;     // 1: planned as a GPU rank (topology GPUs); 0: as a host-memory rank
  int32_t netDevs = 0;     // the NICs NET/Socket would use (NCCL_SOCKET_IFNAME), 0 without one
  int32_t netMbps = 0;     // the slowest of them (/sys/class/net/IF/speed; 10000 where it is not known)
  uint64_t nonce = 0;      // random; the communicator's id is derived from every rank's
};
static_assert(std::has_unique_object_representations_v<PeerInfo>, "PeerInfo is sent as bytes: no padding");

/// NCCL_STEPS: slots of every connection FIFO.
constexpr int kSteps = 8;
/// NCCL's protocols, in NCCL's order.
enum Protocol : int { kProtoLL = 0, kProtoLL128 = 1, kProtoSimple = 2 };
constexpr int kNumProtocols = 3;
const char* protocolName(int proto);
/// Connection indices: 0 for rings and trees, 1 for point-to-point (NCCL's connIndex).
constexpr int kNumConnIndices = 2;
constexpr int kMaxChannels = 64;

enum class Side : uint8_t { kRecv = 0, kSend = 1 };
inline const char* to_string(Side s) { return s == Side::kSend ? "send" : "recv"; }

/// NCCL's ncclConnect: the fixed-size record one side of a connection sends the other. The header lets the peer
/// refuse records that are not for it (another communicator, a wrong rank, channel or side).
struct ConnectRecord {
  static constexpr uint32_t kMagic = 0x74634352;  // "tcCR"
  uint32_t magic = 0;
  uint8_t side = 0;       // Side of the connector that made the record
  uint8_t connIndex = 0;
  uint8_t transport = 0;  // index in registry()
  uint8_t reserved = 0;
  uint64_t commId = 0;
  int32_t rank = -1;      // who made it
  int32_t peer = -1;      // for whom
  int32_t channel = -1;
  uint8_t payload[100] = {};  // the transport's connect info
};
static_assert(sizeof(ConnectRecord) == 128, "NCCL's ncclConnect is 128 bytes");

/// Why `r`, received from rank `from` for this rank's connector (me, channel, connIndex, mySide), must be
/// refused, or "" when it is acceptable. A wrong magic or communicator id (a stranger), an out-of-range or
/// unexpected rank, a record for another channel or the same side are refused.
std::string checkRecord(const ConnectRecord& r, uint64_t commId, int nRanks, int from, int me, int channel,
                        int connIndex, Side mySide);

class Transport;
class Proxy;
struct StatusLine;
struct RecvPost;
class Doorbell;
class Net;

/// Wakes whoever consumes what a connector publishes (the peer's process, or the local proxy for NET).
class Waker {
 public:
  virtual ~Waker() = default;
  virtual void ring() = 0;
  /// ring() for a caller that issued a seq_cst fence after publishing (one fence for several wakers), or that
  /// needs none (needsFence() false).
  virtual void ringFenced() { ring(); }
  /// Whether a publisher must issue a seq_cst fence between what it published and ringFenced(). False for a doorbell
  /// whose sleepers issued an asymmetric fence (membarrier) for both sides when it was imported (doorbell.h): should
  /// its owner switch to fences later, ringFenced() fences itself.
  bool needsFence() const { return needsFence_; }

 protected:
  bool needsFence_ = true;
};

/// NET: the thread that waits on a connection moves it itself and blocks in poll() on its sockets, so the kernel
/// wakes it when data comes (no proxy hop, no doorbell: each hop is a wake-up that, against CPU-bound processes,
/// waits for a time slice). Between take() and release() the proxy leaves the connection alone. docs/transport.md, NET.
class CallerDrive {
 public:
  virtual ~CallerDrive() = default;
  /// From now on this thread moves the connection (the proxy neither moves nor polls it).
  virtual void take() = 0;
  /// Moves what it can; true when anything advanced. Never throws: a failure breaks the connector.
  virtual bool drive() = 0;
  /// The sockets and events the connection waits for now (none when it waits only for the engine).
  virtual void waitFds(std::vector<pollfd>& fds) = 0;
  /// A last move (acknowledgements out), then the connection is the proxy's again (woken if it has work there).
  /// `lazy`: nothing posted waits on the connection any more (the engine is idle), so a send's acknowledgement
  /// still to come is left in the socket for the connection's next user (a post rings the proxy; a caller takes it)
  /// instead of waking the proxy just to read it.
  virtual void release(bool lazy = false) = 0;
  /// Receiving side, between take() and release(): whether the sender's next step began to arrive (its header is
  /// in, whether or not its data landed). A receive from any rank looks with it (nothing is taken).
  virtual bool stepArrived() = 0;
  /// A transfer over the connection failed while the proxy may be moving its bytes from or into the user's buffer:
  /// waits out a move under way, then nobody moves the connection any more (broken with `why`). After it returns,
  /// nothing of the connection touches the user's buffers.
  virtual void abandon(const std::string& why) = 0;
};

/// Shared counters of one connection side, each on its own cache line.
struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
  char pad[56];
};

/// A shareable buffer (transport::allocShareable, behind runtime::memAlloc and ncclMemAlloc) as its owner describes
/// it to a peer: the peer imports the memfd (pidfd_getfd) and maps it, so that its single copies into or out of the
/// buffer are loads and stores instead of process_vm_readv/writev. fd < 0: not in a shareable buffer.
struct RegionRef {
  uint64_t owner = 0;   // the owning process's random key (a pid may be reused, a key is not)
  uint64_t serial = 0;  // the buffer's number in that process (never reused)
  uint64_t base = 0, len = 0;  // the buffer's address and bytes in the owner's address space
  int32_t fd = -1;      // the memfd's descriptor number in the owner
  uint32_t pad = 0;
};

/// The rendezvous slot of single-copy transfers: the passive side's buffer address. Over NET, the receiver's
/// buffer for its proxy, with what the receiver expects (data lands there only when the sender's header matches).
struct alignas(64) Rendezvous {
  std::atomic<uint64_t> step{0};  // step+1 of the op the address is for (single copy: 0 once withdrawn)
  uint64_t addr = 0;
  uint64_t opBytes = 0, partBytes = 0;
  uint32_t dtype = 0, nParts = 0;
  std::atomic<uint64_t> copying{0};  // single copy: step+1 of the op the active side is copying a piece for
  uint64_t call = 0;                 // NET: the receive's MessageDesc::call (the proxy lands only matching chunks)
  RegionRef region;  // single copy: the shareable buffer `addr` lies in, written before `step`
};

/// NCCL's ncclConnInfo: what the data movers see of one connector.
struct ShotArea;

/// One direction's one-shot mailbox as a side sees it (oneshot.h): the area (in the receiver's block) and this side's
/// counters. A connection has two lanes (ConnInfo::shot* for the collectives, ConnInfo::p2pShot for sends and
/// receives), so that the two never share a sequence.
struct ShotLane {
  ShotArea* area = nullptr;
  uint64_t seq = 0;    // this side's last message (sent or taken)
  uint64_t free = 0;   // sender: the receiver's last `consumed` it read
};

struct ConnInfo {
  char* buffs[kNumProtocols] = {};     // FIFO base per protocol (nullptr: protocol not available)
  size_t slotBytes[kNumProtocols] = {};  // bytes of one of the kSteps slots per protocol
  std::atomic<uint64_t>* tail = nullptr;   // steps the sender has published
  std::atomic<uint64_t>* head = nullptr;   // steps the receiver has consumed
  std::atomic<uint64_t>* ack = nullptr;    // completion counter (== head, except over NET)
  StatusLine* status = nullptr;            // the receiver's verdicts, kStatusRing lines (primitives.h statusOf)
  RecvPost* post = nullptr;                // shared memory: what the receiver waits for (primitives.h)
  std::atomic<uint64_t>* forwarded = nullptr;  // NET receiver: the last ack its proxy sent back
  Rendezvous* rdv = nullptr;               // write mode: the receiver's buffer address
  std::atomic<uint32_t>* canPull = nullptr;  // 1 once the receiver proved it can copy from the sender's memory
  std::atomic<uint32_t>* canPush = nullptr;  // 1 once the sender proved it can copy into the receiver's memory
  uint64_t step = 0;                       // this side's next step
  uint64_t statusSeen = 0;                 // sender: the last status line step it reported (eager sends)
  uint32_t awaiting = 0;                   // sender: ops whose steps are all out, waiting for their verdicts (NET)
  uint32_t flags = 0;
  int peerPid = 0;
  Waker* wake = nullptr;                   // ring after publishing tail/head/ack
  CallerDrive* drive = nullptr;            // NET: lets a waiting caller move the connection itself
  ShotArea* shot = nullptr;                // one-shot mailbox (oneshot.h), in the receiver's block; null over NET
  uint64_t shotSeq = 0;                    // this side's last mailbox message (sent or taken)
  uint64_t shotFree = 0;                   // sender: the receiver's last `consumed` it read
  ShotLane p2pShot;                        // the sends' and receives' mailbox (oneshot.h); null over NET
  char* devBuff = nullptr;                 // P2P/IPC between GPU ranks: the device Simple FIFO (kSteps slots)
  size_t devSlotBytes = 0;                 // bytes of one device slot
  int cudaDev = -1;                        // this rank's CUDA device (device copies)
};
enum ConnFlags : uint32_t {
  kConnRead = 1u << 0,        // P2P read mode: the Simple buffer is the sender's, single copies pull
  kConnDirect = 1u << 1,      // same process: the peer's user buffer is addressable (P2P/direct pointer)
  kConnCma = 1u << 2,         // other process: single copies with process_vm_readv/writev
  kConnNet = 1u << 3,         // NET: a proxy moves the slots; completion is a separate ack counter
  kConnMapPeer = 1u << 4,     // other process: single copies map the peer's shareable buffers (peer_memory.h)
};

/// A transport's per-connector resources; the destructor is NCCL's free.
class Resources {
 public:
  virtual ~Resources() = default;
};

/// NCCL's ncclConnector: one side of one connection.
struct Connector {
  Side side = Side::kRecv;
  int peer = -1, channel = -1, connIndex = 0;
  const Transport* transport = nullptr;
  bool connected = false;
  std::string via;  // "P2P/direct pointer", "SHM/direct", "NET/Socket/0": how it connects
  ConnInfo conn;
  std::unique_ptr<Resources> resources;

  Connector() = default;
  /// Frees the resources first: their proxy side may report a failure (markBroken) until it is stopped.
  ~Connector() { resources.reset(); }

  /// The connection cannot be used any more (an op left it out of step, the network connection broke): every op
  /// on it fails at once with the reason. Any thread. `peerClosed`: the peer closed it between two messages, and
  /// every step received before that is published (a NET receiver's proxy): a receive may still take a message
  /// that arrived whole (Transfer::progress); the first break decides.
  void markBroken(const std::string& why, bool peerClosed = false);
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  bool closedByPeer() const { return closedByPeer_.load(std::memory_order_acquire); }
  std::string brokenReason() const;

 private:
  std::atomic<bool> broken_{false}, closedByPeer_{false};
  std::string brokenWhy_;
};

/// One channel's view of a peer (NCCL's ncclChannelPeer).
struct ChannelPeer {
  Connector send[kNumConnIndices];
  Connector recv[kNumConnIndices];
};

/// NCCL's ncclChannel: ring and tree neighbours and one ChannelPeer per rank.
struct Channel {
  int id = 0;
  int ringPrev = -1, ringNext = -1;
  int treeUp = -1;
  int treeDown[3] = {-1, -1, -1};
  std::vector<std::unique_ptr<ChannelPeer>> peers;  // [rank]
  Connector& connector(int peer, Side side, int connIndex) {
    return side == Side::kSend ? peers[peer]->send[connIndex] : peers[peer]->recv[connIndex];
  }
};

/// Everything a transport needs from the communicator. Built once by the runtime; transports read it.
/// [rank] whether a peer is gone: its process exited or was killed (kPeerProcessGone), or it destroyed its
/// communicator while its process lives on (kPeerLeftComm); 0 while it is there. Set by the proxy's watches.
enum : uint8_t { kPeerHere = 0, kPeerProcessGone = 1, kPeerLeftComm = 2 };
using PeerGone = std::vector<std::atomic<uint8_t>>;
/// How a failure names peer `rank` in state `state` ("rank 3's process is gone (it exited or was killed)").
std::string peerGoneWhy(int rank, uint8_t state);

struct Context {
  int rank = 0, nRanks = 0;
  uint64_t commId = 0;
  std::vector<PeerInfo> peers;
  Config cfg;
  /// GPU ranks (TOPOCOLL_SIMULATE_GPUS or NVML): this rank's node system with paths; null for host-memory ranks.
  const topology::System* system = nullptr;
  size_t buffSizes[kNumProtocols] = {};   // NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE, NCCL_BUFFSIZE
  bootstrap::Bootstrap* bootstrap = nullptr;
  Proxy* proxy = nullptr;
  std::shared_ptr<Doorbell> doorbell;      // this process's
  Net* net = nullptr;                      // the network plugin
  /// The network device a channel uses (the plan's NIC for rings, the local one for point-to-point).
  std::function<int(int channel, int connIndex)> netDev;
  const std::atomic<bool>* abortFlag = nullptr;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// Per-rank flags the proxy sets when a peer process is gone (its connection to our proxy closed).
  std::shared_ptr<PeerGone> peerGone;
  /// The doorbells of the peers' processes, imported once per peer (transports fill it).
  std::vector<std::shared_ptr<Doorbell>> peerBells;
  /// The number shown in "0[0]" of connection lines: the GPU dev, else the local rank.
  int devOf(int rank) const;
};

/// A transport (NCCL's ncclTransport): canConnect decides, setup and connect make one side of a connection.
class Transport {
 public:
  virtual ~Transport() = default;
  /// "P2P", "SHM", "NET".
  virtual const char* name() const = 0;
  /// Whether this transport can connect `me` and `peer` (NCCL's canConnect, first arguments info1 = me).
  virtual bool canConnect(const Context& ctx, const PeerInfo& me, const PeerInfo& peer) const = 0;
  /// Allocates what this side owns (shareable buffers through the proxy), fills `record->payload` and logs the
  /// connection. `c.side`, `c.peer`, `c.channel`, `c.connIndex` are set.
  virtual void setup(Context& ctx, Connector& c, ConnectRecord* record) const = 0;
  /// Consumes the peer's record: maps the peer's buffers and fills `c.conn`. Returns false while the peer is not
  /// ready yet (NCCL's ncclInProgress); it is called again.
  virtual bool connect(Context& ctx, Connector& c, const ConnectRecord& peerRecord) const = 0;
};

/// P2P, SHM, NET in NCCL's order (CollNet is not built).
const std::vector<const Transport*>& registry();
/// The index of `t` in registry().
int transportIndex(const Transport* t);

/// Which connectors to make: per peer, a bit per channel for the recv and the send side (NCCL's connectRecv /
/// connectSend).
struct ConnectMasks {
  explicit ConnectMasks(int nRanks) : recv(nRanks, 0), send(nRanks, 0) {}
  void mark(int channel, int peer, Side side) { (side == Side::kSend ? send : recv)[peer] |= 1ull << channel; }
  bool empty() const;
  std::vector<uint64_t> recv, send;
};

/// Whether `peer`'s connect records for its connections with this rank (setupConnections of `graphTag`) arrived and
/// wait for this rank's side of the exchange: the peer is connecting to this rank. Never blocks (bootstrap::
/// Bootstrap::hasMessage).
bool peerConnecting(const Context& ctx, int peer, int graphTag);

/// NCCL's ncclTransportP2pSetup: for i = 1 .. nRanks-1, with recvPeer = rank - i and sendPeer = rank + i, set up
/// the recv connectors to recvPeer then the send connectors to sendPeer of every marked channel (selectTransport
/// <0> then <1>), send the recv records to recvPeer and the send records to sendPeer, receive in the opposite
/// order (one combined block when both peers are the same rank), connect them all until none is in progress, then
/// a last exchange with every peer so nobody frees buffers a peer is still importing. Connectors already connected
/// are skipped. `graphTag` distinguishes the exchanges of rings (1), trees (2) and point-to-point (0) as NCCL's
/// bootstrap tags do. Throws naming the peer on a refused record, a timeout or an abort.
void setupConnections(Context& ctx, std::vector<Channel>& channels, const ConnectMasks& masks, int connIndex,
                      int graphTag);

/// Shared-memory transports find each other's buffers through the proxies: one abstract Unix socket per rank.
std::string proxySocketName(uint64_t commId, int rank);

}  // namespace topocoll::transport
