// The shared-memory transports: P2P (NCCL 2.30.7 src/transport/p2p.cc: read/write mode, direct pointers within a
// process, shareable buffers allocated by the proxy and imported by the peer) and SHM (src/transport/shm.cc: the
// receiver's buffers, never single copies), Apache-2.0; our own code for host memory. Connection lines are NCCL's.
// Between GPU ranks P2P adds a device FIFO shared over CUDA IPC (cuda_ipc.h; p2pMap's rules).
#include <atomic>
#include <cstddef>
#include <cstring>
#include <random>

#include "cuda_ipc.h"
#include "fifo.h"
#include "os.h"
#include "topocoll/cuda.h"
#include "topocoll/log.h"
#include "topocoll/paths/paths.h"
#include "topocoll/status.h"
#include "topocoll/topology/system.h"
#include "topocoll/transport/proxy.h"
#include "transports.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace topocoll::transport {

namespace {

// What a P2P or SHM connect record carries.
struct ShmInfo {
  ShareableBuffer buf;
  uint64_t nonce = 0;  // in the owner's Probe: single copies work if the peer reads this value there
  uint8_t read = 0, direct = 0;
};
static_assert(sizeof(ShmInfo) <= sizeof(ConnectRecord::payload), "connect info too large");

uint64_t randomNonce() {
  thread_local std::mt19937_64 gen(std::random_device{}() ^ static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&gen)));
  return gen() | 1;
}

// The proxy side of a shared-memory connector: it owns the shareable buffer.
class BufferConn : public ProxyConnection {
 public:
  void setup(Proxy& proxy, const void* req, size_t reqSize, void* resp, size_t respSize) override {
    if (reqSize != sizeof(size_t) || respSize != sizeof(ShareableBuffer)) fail(StatusCode::kInternal, "bad proxy setup");
    char* ptr = nullptr;
    buf_ = proxy.allocateShareable(*static_cast<const size_t*>(req), &ptr);
    *static_cast<ShareableBuffer*>(resp) = buf_;
  }
  void free(Proxy& proxy) override {
    if (buf_.id) proxy.releaseShareable(buf_.id);
    buf_.id = 0;
  }

 private:
  ShareableBuffer buf_;
};

std::atomic<long> gDevAllocated{0}, gDevImported{0};

// The proxy side of a device FIFO (ncclP2pAllocateShareableBuffer on the proxy thread): cudaMalloc and
// cudaIpcGetMemHandle at setup, cudaFree at free.
struct DevBufferReq {
  uint64_t size = 0;
  int32_t dev = -1;
  int32_t pad = 0;
};
struct DevBufferResp {
  uint64_t ptr = 0;
  uint8_t handle[64] = {};
};

class DevBufferConn : public ProxyConnection {
 public:
  void setup(Proxy&, const void* req, size_t reqSize, void* resp, size_t respSize) override {
    if (reqSize != sizeof(DevBufferReq) || respSize != sizeof(DevBufferResp))
      fail(StatusCode::kInternal, "bad proxy setup");
#ifdef TOPOCOLL_HAVE_CUDA
    const auto& q = *static_cast<const DevBufferReq*>(req);
    auto& a = *static_cast<DevBufferResp*>(resp);
    dev_ = q.dev;
    TC_CUDA(cudaSetDevice(dev_));
    TC_CUDA(cudaMalloc(&ptr_, q.size));
    gDevAllocated.fetch_add(1);
    TC_CUDA(cudaMemset(ptr_, 0, q.size));
    cudaIpcMemHandle_t h;
    TC_CUDA(cudaIpcGetMemHandle(&h, ptr_));
    static_assert(sizeof(h) == sizeof(a.handle), "cudaIpcMemHandle_t is 64 bytes");
    std::memcpy(a.handle, &h, sizeof(h));
    a.ptr = reinterpret_cast<uint64_t>(ptr_);
#else
    (void)req, (void)resp;
    fail(StatusCode::kInternal, "device FIFO in a build without CUDA");
#endif
  }
  void free(Proxy&) override {
#ifdef TOPOCOLL_HAVE_CUDA
    if (!ptr_) return;
    (void)cudaSetDevice(dev_);
    (void)cudaFree(ptr_);
    (void)cudaGetLastError();
    gDevAllocated.fetch_sub(1);
    ptr_ = nullptr;
#endif
  }

 private:
  void* ptr_ = nullptr;
  int dev_ = -1;
};

struct ShmResources : Resources {
  Proxy* proxy = nullptr;
  std::shared_ptr<BufferConn> pc;
  char* local = nullptr;  // our block, mapped by our proxy (same process)
  MappedRegion remote;         // the peer's block
  bool read = false, direct = false;
  // Between GPU ranks: the device FIFO, ours (allocated by our proxy) or the peer's (opened over CUDA IPC).
  bool gpu = false;
  int cudaDev = -1;
  std::shared_ptr<DevBufferConn> dev;
  char* devLocal = nullptr;
  void* devImported = nullptr;
  ~ShmResources() override {
#ifdef TOPOCOLL_HAVE_CUDA
    if (devImported) {
      (void)cudaSetDevice(cudaDev);
      (void)cudaIpcCloseMemHandle(devImported);
      (void)cudaGetLastError();
      gDevImported.fetch_sub(1);
    }
#endif
    try {
      if (dev) proxy->callBlocking(*dev, Proxy::Msg::kFree);
    } catch (const std::exception&) {
    }
    try {
      if (pc) proxy->callBlocking(*pc, Proxy::Msg::kFree);
    } catch (const std::exception&) {
    }
  }
};

// The doorbell of `peer`'s process: ours within the process, else imported once per peer (and watched).
std::shared_ptr<Doorbell> peerDoorbell(Context& ctx, int peer) {
  if (ctx.peers[peer].pidHash == ctx.peers[ctx.rank].pidHash) return ctx.doorbell;
  auto& cache = ctx.peerBells;
  if (cache.size() != ctx.peers.size()) cache.resize(ctx.peers.size());
  if (!cache[peer]) cache[peer] = ctx.proxy->importDoorbell(peer);
  return cache[peer];
}

bool sameProcess(const PeerInfo& a, const PeerInfo& b) { return a.hostHash == b.hostHash && a.pidHash == b.pidHash; }

// Whether a single copy can reach the owner's memory: read the probe nonce there.
bool probe(const Context& ctx, int peer, uint64_t ownerAddr, size_t probeOffset, uint64_t nonce) {
  if (ctx.cfg.p2pSingleCopy < 0) return false;
  uint64_t v = 0;
  int err = os::copyRemote(ctx.peers[peer].pid, true, &v, ownerAddr + probeOffset + offsetof(Probe, nonce), sizeof(v));
  if (err || v != nonce) {
    TC_INFO(log::kInit | log::kP2p, "P2P : rank {} cannot copy from rank {}'s memory directly ({}): Simple FIFO only",
            ctx.rank, peer, err ? std::strerror(err) : "another process answers at that pid");
    return false;
  }
  return true;
}

// P2P and SHM share everything but the policy.
class SharedMemoryTransport : public Transport {
 public:
  explicit SharedMemoryTransport(bool p2p) : p2p_(p2p) {}
  const char* name() const override { return p2p_ ? "P2P" : "SHM"; }

  bool canConnect(const Context& ctx, const PeerInfo& me, const PeerInfo& peer) const override {
    if (me.hostHash != peer.hostHash) return false;
    if (!p2p_) return ctx.cfg.shmDisable == 0 && me.shmDev == peer.shmDev;  // shmCanConnect
    if (!sameProcess(me, peer) && me.shmDev != peer.shmDev) return false;
    if (ctx.system) {
      // GPU ranks: NCCL's P2P rules on the node's topology (path type against NCCL_P2P_LEVEL, NVB intermediates).
      int inter = -1;
      if (!paths::checkP2p(*ctx.system, ctx.cfg, me.rank, peer.rank, nullptr, &inter)) return false;
      return inter == -1;  // P2P/indirect (through a third GPU) is not built: SHM takes it
    }
    // Host memory: processes of one NUMA node are PHB apart, of two nodes SYS; NCCL_P2P_LEVEL (default SYS here)
    // and NCCL_P2P_DISABLE (LOC) bound it as they bound GPU paths.
    int level = ctx.cfg.p2pLevel ? *ctx.cfg.p2pLevel : static_cast<int>(topology::PathType::SYS);
    auto path = me.numaNode == peer.numaNode ? topology::PathType::PHB : topology::PathType::SYS;
    return static_cast<int>(path) <= level;
  }

  void setup(Context& ctx, Connector& c, ConnectRecord* rec) const override {
    const PeerInfo& me = ctx.peers[ctx.rank];
    const PeerInfo& peer = ctx.peers[c.peer];
    auto r = std::make_unique<ShmResources>();
    r->proxy = ctx.proxy;
    r->pc = std::make_shared<BufferConn>();
    r->read = p2p_ && useRead(ctx, me, peer);
    r->direct = p2p_ && sameProcess(me, peer) && ctx.cfg.p2pDirectDisable == 0;
    const bool send = c.side == Side::kSend;
    size_t size = send ? sizeof(SendMem) + (r->read ? ctx.buffSizes[kProtoSimple] : 0)
                       : sizeof(RecvMem) + ctx.buffSizes[kProtoLL] + (r->read ? 0 : ctx.buffSizes[kProtoSimple]);
    ShmInfo info;
    ctx.proxy->callBlocking(*r->pc, Proxy::Msg::kSetup, &size, sizeof(size), &info.buf, sizeof(info.buf));
    r->local = reinterpret_cast<char*>(info.buf.ownerAddr);
    r->gpu = p2p_ && gpuPair(me, peer);
    // GPU records carry the CUDA IPC handle: the probe nonce shrinks to the 32 bits left in the host block's entry.
    info.nonce = r->gpu ? randomNonce() & 0xffffffffu : randomNonce();
    Probe* pr = send ? &reinterpret_cast<SendMem*>(r->local)->probe : &reinterpret_cast<RecvMem*>(r->local)->probe;
    pr->nonce = info.nonce;
    info.read = r->read;
    info.direct = r->direct;
    if (r->gpu) {
      setupDevice(ctx, c, *r, info, rec);
    } else {
      std::memcpy(rec->payload, &info, sizeof(info));
    }
    const char* readStr = r->read ? "/read" : "";
    int from = send ? ctx.rank : c.peer, to = send ? c.peer : ctx.rank;
    if (!p2p_) c.via = "SHM/direct";
    else c.via = fmt::format("P2P/{}{}", r->direct ? "direct pointer" : "IPC", readStr);
    if (send && p2p_)
      TC_INFO(log::kInit | log::kP2p, "Channel {:02d}/{:01d} : {}[{}] -> {}[{}] via {}", c.channel, c.connIndex, from,
              ctx.devOf(from), to, ctx.devOf(to), c.via);
    if (send && !p2p_)
      TC_INFO(log::kInit | log::kShm, "Channel {:02d} : {}[{}] -> {}[{}] via SHM/direct", c.channel, from,
              ctx.devOf(from), to, ctx.devOf(to));
    c.resources = std::move(r);
  }

  bool connect(Context& ctx, Connector& c, const ConnectRecord& rec) const override {
    auto& r = static_cast<ShmResources&>(*c.resources);
    ShmInfo info;
    CudaIpcInfo ipc;
    if (r.gpu) {
      std::memcpy(&ipc, rec.payload, sizeof(ipc));
      std::string why =
          checkCudaIpcInfo(ipc, r.read, c.side == Side::kRecv, sameProcess(ctx.peers[ctx.rank], ctx.peers[c.peer]),
                           ctx.buffSizes[kProtoSimple]);
      if (!why.empty())
        fail(StatusCode::kRemoteError, "rank {}: refused rank {}'s CUDA IPC connect info for channel {} ({}): {}",
             ctx.rank, c.peer, c.channel, to_string(c.side), why);
      info.buf = ipc.buf;
      info.nonce = ipc.buf.reserved;
      info.read = (ipc.flags & kIpcRead) != 0;
      info.direct = (ipc.flags & kIpcDirect) != 0;
    } else {
      std::memcpy(&info, rec.payload, sizeof(info));
    }
    if (info.read != r.read)
      fail(StatusCode::kInvalidUsage, "rank {}: rank {} uses P2P {} mode, this rank {} mode (NCCL_P2P_READ_ENABLE differs?)",
           ctx.rank, c.peer, info.read ? "read" : "write", r.read ? "read" : "write");
    const bool send = c.side == Side::kSend;
    const size_t ll = ctx.buffSizes[kProtoLL], simple = ctx.buffSizes[kProtoSimple];
    size_t expect = send ? sizeof(RecvMem) + ll + (r.read ? 0 : simple) : sizeof(SendMem) + (r.read ? simple : 0);
    if (info.buf.size != expect)
      fail(StatusCode::kInvalidUsage,
           "rank {}: rank {}'s buffer for channel {} has {} bytes, {} expected (NCCL_BUFFSIZE / NCCL_LL_BUFFSIZE "
           "differ between ranks?)",
           ctx.rank, c.peer, c.channel, info.buf.size, expect);
    r.remote = ctx.proxy->importShareable(c.peer, info.buf);
    r.direct = r.direct && info.direct;
    ConnInfo& ci = c.conn;
    SendMem* sm = reinterpret_cast<SendMem*>(send ? r.local : r.remote.data());
    RecvMem* rm = reinterpret_cast<RecvMem*>(send ? r.remote.data() : r.local);
    char* recvBufs = reinterpret_cast<char*>(rm + 1);
    ci.buffs[kProtoLL] = recvBufs;
    ci.buffs[kProtoSimple] = r.read ? reinterpret_cast<char*>(sm + 1) : recvBufs + ll;
    ci.slotBytes[kProtoLL] = ll / kSteps;
    ci.slotBytes[kProtoSimple] = simple / kSteps;
    bindControl(ci, sm, rm);
    ci.canPull = &sm->probe.pull;
    ci.canPush = &sm->probe.push;
    ci.peerPid = ctx.peers[c.peer].pid;
    ci.flags = (r.read ? uint32_t{kConnRead} : 0u) | (r.direct ? uint32_t{kConnDirect} : 0u) |
               (p2p_ && !r.direct && ctx.cfg.mapPeerBuffers ? uint32_t{kConnMapPeer} : 0u);
    ci.wake = peerDoorbell(ctx, c.peer).get();
    if (r.gpu) connectDevice(ctx, c, r, ipc);
    c.via = p2p_ ? fmt::format("P2P/{}{}", r.direct ? "direct pointer" : "IPC", r.read ? "/read" : "") : "SHM/direct";
    // Single copies between processes: each side checks it can reach the other's memory (the sender to push into
    // the receiver's buffers, the receiver to pull from the sender's); the results live in the sender's block,
    // where the sender chooses. Large messages use both directions at once (one part each).
    if (p2p_ && r.direct) {
      sm->probe.pull.store(1, std::memory_order_release);
      sm->probe.push.store(1, std::memory_order_release);
    } else if (p2p_) {
      size_t probeAt = send ? offsetof(RecvMem, probe) : offsetof(SendMem, probe);
      if (probe(ctx, c.peer, info.buf.ownerAddr, probeAt, info.nonce)) {
        (send ? sm->probe.push : sm->probe.pull).store(1, std::memory_order_release);
        c.via += "/CMA";
      }
    }
    return true;
  }

 private:
  // Both ranks have a CUDA device: the device FIFO over CUDA IPC.
  static bool gpuPair(const PeerInfo& me, const PeerInfo& peer) { return me.cudaDev >= 0 && peer.cudaDev >= 0; }

  // p2pSendSetup / p2pRecvSetup for the device FIFO: its owner (the receiver in write mode, the sender in read mode)
  // asks its proxy for it (ncclProxyMsgSetup) and puts the handle in the record.
  static void setupDevice(Context& ctx, Connector& c, ShmResources& r, const ShmInfo& host, ConnectRecord* rec) {
    const PeerInfo& me = ctx.peers[ctx.rank];
    const bool same = sameProcess(me, ctx.peers[c.peer]);
    CudaIpcInfo ipc;
    ipc.buf = host.buf;
    ipc.buf.reserved = static_cast<uint32_t>(host.nonce);
    ipc.flags = (r.read ? kIpcRead : 0u) | (r.direct ? kIpcDirect : 0u) | (same ? kIpcSameProcess : 0u);
    r.cudaDev = me.cudaDev;
    if ((c.side == Side::kSend) == r.read) {
      r.dev = std::make_shared<DevBufferConn>();
      DevBufferReq req;
      req.size = ctx.buffSizes[kProtoSimple];
      req.dev = me.cudaDev;
      DevBufferResp resp;
      ctx.proxy->callBlocking(*r.dev, Proxy::Msg::kSetup, &req, sizeof(req), &resp, sizeof(resp));
      r.devLocal = reinterpret_cast<char*>(resp.ptr);
      if (same)
        std::memcpy(ipc.handle, &resp.ptr, sizeof(resp.ptr));
      else
        std::memcpy(ipc.handle, resp.handle, sizeof(ipc.handle));
      ipc.devSize = req.size;
      ipc.flags |= kIpcOwner;
    }
    std::memcpy(rec->payload, &ipc, sizeof(ipc));
  }

  // p2pMap: our own FIFO; the peer's in this process by its address (peer access when on another device); the
  // peer's in another process with cudaIpcOpenMemHandle (lazy peer access).
  static void connectDevice(Context& ctx, Connector& c, ShmResources& r, const CudaIpcInfo& ipc) {
    ConnInfo& ci = c.conn;
    ci.cudaDev = r.cudaDev;
    ci.devSlotBytes = ctx.buffSizes[kProtoSimple] / kSteps;
    if (!(ipc.flags & kIpcOwner)) {
      ci.devBuff = r.devLocal;
      return;
    }
#ifdef TOPOCOLL_HAVE_CUDA
    const PeerInfo& peer = ctx.peers[c.peer];
    TC_CUDA(cudaSetDevice(r.cudaDev));
    if (ipc.flags & kIpcSameProcess) {
      uint64_t addr = 0;
      std::memcpy(&addr, ipc.handle, sizeof(addr));
      if (peer.cudaDev != r.cudaDev) {
        cudaError_t e = cudaDeviceEnablePeerAccess(peer.cudaDev, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) TC_CUDA(e);
        (void)cudaGetLastError();
      }
      ci.devBuff = reinterpret_cast<char*>(addr);
      return;
    }
    cudaIpcMemHandle_t h;
    std::memcpy(&h, ipc.handle, sizeof(h));
    void* p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(StatusCode::kSystemError, "rank {}: cudaIpcOpenMemHandle of rank {}'s FIFO (channel {}) failed: {}: {}",
           ctx.rank, c.peer, c.channel, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    r.devImported = p;
    gDevImported.fetch_add(1);
    ci.devBuff = static_cast<char*>(p);
#else
    fail(StatusCode::kInternal, "rank {}: CUDA IPC connection in a build without CUDA", ctx.rank);
#endif
  }

  bool useRead(const Context& ctx, const PeerInfo& me, const PeerInfo& peer) const {
    bool read = false;
    if (ctx.system) paths::checkP2p(*ctx.system, ctx.cfg, me.rank, peer.rank, &read, nullptr);
    if (ctx.cfg.p2pReadEnable != -2) read = ctx.cfg.p2pReadEnable != 0;  // NCCL_P2P_READ_ENABLE
    return read;
  }
  bool p2p_;
};

}  // namespace

std::string checkCudaIpcInfo(const CudaIpcInfo& p, bool read, bool peerSends, bool sameProcess, uint64_t devSize) {
  if (p.flags & ~kIpcKnownFlags) return fmt::format("unknown flags {:#x}", p.flags & ~kIpcKnownFlags);
  if (((p.flags & kIpcRead) != 0) != read)
    return fmt::format("it uses P2P {} mode, this rank {} mode (NCCL_P2P_READ_ENABLE differs?)",
                       (p.flags & kIpcRead) ? "read" : "write", read ? "read" : "write");
  if (((p.flags & kIpcSameProcess) != 0) != sameProcess)
    return sameProcess ? "it says it is in another process" : "it says it is in this process";
  const bool owner = (p.flags & kIpcOwner) != 0;
  if (owner != (peerSends == read))
    return owner ? "it claims the device FIFO its peer owns" : "it has no device FIFO where it must own it";
  if (!owner && p.devSize != 0) return fmt::format("a device FIFO of {} bytes without owning one", p.devSize);
  if (owner && p.devSize != devSize)
    return fmt::format("its device FIFO has {} bytes, {} expected (NCCL_BUFFSIZE differs between ranks?)", p.devSize,
                       devSize);
  if (owner && sameProcess) {
    uint64_t addr = 0;
    std::memcpy(&addr, p.handle, sizeof(addr));
    if (addr == 0) return "a null device FIFO address";
  }
  return "";
}

CudaIpcCounts cudaIpcCounts() { return {gDevAllocated.load(), gDevImported.load()}; }

const Transport& p2pTransport() {
  static const SharedMemoryTransport t(true);
  return t;
}

const Transport& shmTransport() {
  static const SharedMemoryTransport t(false);
  return t;
}

}  // namespace topocoll::transport
