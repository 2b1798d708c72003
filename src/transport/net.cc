// The NET transport (NCCL 2.30.7 src/transport/net.cc's structure: setup asks the proxy to listen, the records
// carry the network handles, the proxy connects, accepts and moves every FIFO slot with isend / irecv), Apache-2.0;
// our own code for host memory. Point-to-point connections also carry the receiver's acknowledgements back (a small
// second network connection), so that a sender learns that its message was consumed, or refused.
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>

#include "fifo.h"
#include "test_hooks.h"
#include "topocoll/log.h"
#include "topocoll/mapped_region.h"
#include "topocoll/status.h"
#include "topocoll/transport/net.h"
#include "topocoll/transport/proxy.h"
#include "transports.h"

namespace topocoll::transport {

namespace {

// What a NET connect record carries: the receiver's data handle, or the sender's acknowledgement handle.
struct NetInfo {
  int32_t dev = 0;
  int32_t hasHandle = 0;
  NetHandle handle;
};
static_assert(sizeof(NetInfo) <= sizeof(ConnectRecord::payload), "connect info too large");

struct SetupReq {
  int32_t dev = 0, connIndex = 0;
  uint64_t simpleBytes = 0;
};
struct SetupResp {
  NetInfo info;
  uint64_t fifo = 0;  // the FIFO block, in this process
};

// The receiver's acknowledgement of one op, with its verdict.
struct AckMsg {
  uint64_t ack = 0, statusStep = 0, bytes = 0, count = 0, call = 0;
  uint32_t dtype = 0, code = 0;
};

// The FIFO of a NET connector lives in this process: [SendMem][RecvMem][Simple slots].
struct Fifo {
  MappedRegion mem;
  SendMem* sm() const { return static_cast<SendMem*>(mem.get()); }
  RecvMem* rm() const { return reinterpret_cast<RecvMem*>(sm() + 1); }
  char* simple() const { return reinterpret_cast<char*>(rm() + 1); }
};

// Moved by the proxy, or by the thread that waits on it (CallerDrive: between take() and release() the proxy leaves
// it alone); mu_ makes the two take turns. As the connector's Waker it wakes the proxy only when the proxy moves it.
class NetConn : public ProxyConnection, public Waker, public CallerDrive {
 public:
  NetConn(Net* net, Side side, Connector* conn, std::shared_ptr<Doorbell> bell, int rank)
      : net_(net), side_(side), conn_(conn), bell_(std::move(bell)), rank_(rank) {}

  void setup(Proxy& proxy, const void* req, size_t reqSize, void* resp, size_t respSize) override {
    auto& q = *static_cast<const SetupReq*>(req);
    auto& out = *static_cast<SetupResp*>(resp);
    proxyWake_ = &proxy.waker();
    dev_ = q.dev;
    useAck_ = q.connIndex == 1;
    slotBytes_ = q.simpleBytes / kSteps;
    fifo_.mem =
        MappedRegion::anonymous(sizeof(SendMem) + sizeof(RecvMem) + q.simpleBytes, "NET : a connector's FIFO");
    new (fifo_.sm()) SendMem();
    new (fifo_.rm()) RecvMem();
    out.fifo = reinterpret_cast<uint64_t>(fifo_.mem.get());
    out.info.dev = dev_;
    if (side_ == Side::kRecv) {
      listen_ = net_->listen(dev_, &out.info.handle);
      out.info.hasHandle = 1;
    } else if (useAck_) {
      listen_ = net_->listen(dev_, &out.info.handle);
      out.info.hasHandle = 1;
    }
  }

  bool connect(Proxy& proxy, const void* req, size_t reqSize, void* resp, size_t respSize) override {
    auto& peer = *static_cast<const NetInfo*>(req);
    if (side_ == Side::kSend) {
      if (!data_) data_ = net_->connect(dev_, peer.handle, &state_);
      if (useAck_ && !ack_) ack_ = net_->accept(*listen_);
    } else {
      if (!data_) data_ = net_->accept(*listen_);
      if (useAck_ && !ack_) {
        if (!peer.hasHandle) fail(StatusCode::kRemoteError, "NET : the sender's record has no acknowledgement handle");
        ack_ = net_->connect(dev_, peer.handle, &state_);
      }
    }
    if (!data_ || (useAck_ && !ack_)) return false;
    listen_.reset();
    return true;
  }

  void free(Proxy& proxy) override {
    std::lock_guard<std::mutex> lock(mu_);
    // Acknowledgements of receives that completed must still reach the sender (its send waits for them).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    try {
      while (side_ == Side::kRecv && ack_ && data_ && std::chrono::steady_clock::now() < deadline &&
             (ackReq_ || fifo_.sm()->ack.value.load(std::memory_order_acquire) > ackSent_))
        progressRecv();
    } catch (const std::exception&) {
    }
    ack_.reset();
    data_.reset();
    listen_.reset();
    state_.reset();
  }

  bool progress(Proxy& proxy) override {
    // A caller's: left alone without the lock (the caller holds it while it moves the connection, and a proxy
    // waiting for it there costs both a futex round per turn).
    if (owned_.load(std::memory_order_relaxed) > 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    // Freed, broken, a caller's, or nothing to do until the engine posts (which rings the proxy).
    if (!data_ || dead_ || owned_.load(std::memory_order_relaxed) > 0 || quiet()) return false;
    return move();
  }

  void pollFds(std::vector<pollfd>& fds) override {
    if (owned_.load(std::memory_order_relaxed) > 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (owned_.load(std::memory_order_relaxed) == 0 && !quiet()) socketFds(fds);
  }

  void failed(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    failedLocked(why);
  }

  // Waker: the engine published something for this connection.
  void ring() override {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with release()'s fence
    if (owned_.load(std::memory_order_relaxed) == 0) proxyWake_->ringFenced();
  }
  void ringFenced() override {
    if (owned_.load(std::memory_order_relaxed) == 0) proxyWake_->ringFenced();
  }

  // CallerDrive.
  void take() override { owned_.fetch_add(1, std::memory_order_seq_cst); }

  void abandon(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);  // a move under way (the proxy's or a caller's) ends first
    if (dead_) return;
    dead_ = true;
    conn_->markBroken(why);
  }

  bool drive() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!data_ || dead_) return false;
    try {
      return move();
    } catch (const std::exception& e) {
      dead_ = true;
      failedLocked(e.what());
      return true;
    }
  }

  bool stepArrived() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (side_ != Side::kRecv) return false;
    return phase_ == 2 || phase_ == 3 || posted_ > fifo_.sm()->head.value.load(std::memory_order_acquire);
  }

  void waitFds(std::vector<pollfd>& fds) override {
    std::lock_guard<std::mutex> lock(mu_);
    socketFds(fds);
  }

  void release(bool lazy) override {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (data_ && !dead_) {
        try {
          move();  // the acknowledgement of what the caller consumed goes out now
        } catch (const std::exception& e) {
          dead_ = true;
          failedLocked(e.what());
        }
      }
      // The proxy is woken only once the last caller leaves (a group's window holds the connection across its
      // operations: waking the proxy between them cost a wake-up per message).
      const int left = owned_.fetch_sub(1, std::memory_order_seq_cst) - 1;
      // Pairs with ring()'s fence: a thread that posted while we owned it and did not wake the proxy is seen here.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      wake = left == 0 && data_ && !dead_ && !quiet() && !(lazy && onlyAckAwaited());
    }
    if (wake) proxyWake_->ring();
  }

  void failedLocked(const std::string& why) {
    // A peer that closes an idle connection has destroyed its communicator: worth a line, not a warning. For a
    // receiver that is a close between messages: the steps received before it stay published, and a receive they
    // complete still completes (Transfer::progress's last look); one that needs more fails.
    bool idle = side_ == Side::kSend ? posted_ == done_ && (!useAck_ || fifo_.sm()->ack.value.load() >= done_)
                                     : (phase_ == 0 || phase_ == 1) && lastDone_;
    if (side_ == Side::kRecv) dead_ = true;  // everything before the close is published: nothing left to move
    if (idle) TC_INFO(log::kNet, "NET : rank {}: rank {} closed its connection for channel {}", rank_, conn_->peer,
                      conn_->channel);
    else TC_WARN("NET : rank {}: {}", rank_, why);
    conn_->markBroken(fmt::format("rank {}: network connection {} rank {} on channel {} lost: {}", rank_,
                                  side_ == Side::kSend ? "to" : "from", conn_->peer, conn_->channel, why),
                      side_ == Side::kRecv && idle);
    bell_->ring();
  }

  const Fifo& fifo() const { return fifo_; }
  CallerDrive* callerDrive() { return this; }
  size_t slotBytes() const { return slotBytes_; }

 private:
  void socketFds(std::vector<pollfd>& fds) {
    if (dead_) return;
    if (data_) net_->pollFds(*data_, fds);
    if (ack_) net_->pollFds(*ack_, fds);
  }

  bool move() { return side_ == Side::kSend ? progressSend() : progressRecv(); }

  // Nothing for the proxy to watch: no step or acknowledgement in flight, no receive posted that waits for data
  // (what comes later waits in the socket until a post rings the proxy, or a caller takes the connection again).
  bool quiet() const {
    SendMem* sm = fifo_.sm();
    if (side_ == Side::kSend)
      return fifo_.rm()->tail.value.load(std::memory_order_acquire) == posted_ && posted_ == done_ &&
             (!useAck_ || sm->ack.value.load(std::memory_order_acquire) >= done_);
    return !ackReq_ && (!ack_ || ackReach(sm->ack.value.load(std::memory_order_acquire)) <= ackSent_) &&
           (phase_ == 0 || phase_ == 1) && lastDone_ && sm->rdv.step.load(std::memory_order_acquire) <= posted_;
  }

  // Receive side: how far the engine has acknowledged (a test may hide it: test_hooks::netEngineAck).
  uint64_t engineAck() const {
    uint64_t a = fifo_.sm()->ack.value.load(std::memory_order_acquire);
    return test_hooks::netEngineAck ? test_hooks::netEngineAck(a) : a;
  }
  // How far the receive side may acknowledge, given the engine's `a`: further over the parts that landed in the
  // posted buffer (landedParts_) that follow it without a gap. Such a part's verdict can only be success (the
  // rendezvous matched what the receiver expects), and with everything before it acknowledged by the engine every
  // earlier verdict is written and goes back first, so no refusal is skipped.
  uint64_t ackReach(uint64_t a) const {
    for (const auto& [first, end] : landedParts_) {
      if (first > a) break;
      a = std::max(a, end);
    }
    return a;
  }

  // A send side whose steps all went out and only waits for the receiver's acknowledgement of them.
  bool onlyAckAwaited() const {
    return side_ == Side::kSend && fifo_.rm()->tail.value.load(std::memory_order_acquire) == posted_ &&
           posted_ == done_;
  }

  // Each step is two messages: the slot's 64-byte header, then the chunk's data from the sender's own buffer (the
  // header's addr): no copy into the FIFO.
  bool progressSend() {
    bool did = false, moved = false;
    SendMem* sm = fifo_.sm();
    uint64_t tail = fifo_.rm()->tail.value.load(std::memory_order_acquire);
    while (posted_ < tail && posted_ < done_ + kSteps) {
      auto* h = reinterpret_cast<SlotHeader*>(fifo_.simple() + (posted_ % kSteps) * slotBytes_);
      NetRequest* rh = net_->isend(*data_, h, sizeof(SlotHeader) + (h->inlined ? h->chunkBytes : 0), 0, nullptr);
      if (!rh) break;
      NetRequest* rd = nullptr;
      if (!h->inlined && !(rd = net_->isend(*data_, reinterpret_cast<const void*>(h->addr), h->chunkBytes, 0, nullptr)))
        fail(StatusCode::kInternal, "NET : no request for a chunk's data");
      req_[posted_ % kSteps] = rh;
      dataReq_[posted_ % kSteps] = rd;
      ++posted_;
      did = true;
    }
    size_t sz;
    while (done_ < posted_) {
      int slot = static_cast<int>(done_ % kSteps);
      if (req_[slot]) {
        if (!net_->test(req_[slot], &sz)) break;
        req_[slot] = nullptr;
      }
      if (dataReq_[slot] && !net_->test(dataReq_[slot], &sz)) break;
      dataReq_[slot] = nullptr;
      if (test_hooks::netHoldSendDone && test_hooks::netHoldSendDone(done_)) break;
      sm->head.value.store(++done_, std::memory_order_release);
      moved = true;
    }
    if (ack_) {
      if (!ackReq_) ackReq_ = net_->irecv(*ack_, &ackMsg_, sizeof(ackMsg_), 0, nullptr);
      if (ackReq_ && net_->test(ackReq_, &sz)) {
        ackReq_ = nullptr;
        if (sz != sizeof(AckMsg)) fail(StatusCode::kRemoteError, "acknowledgement of {} bytes", sz);
        if (ackMsg_.statusStep) {  // before the ack that covers its op
          StatusLine& st = statusOf(sm->status, ackMsg_.statusStep);
          st.bytes = ackMsg_.bytes;
          st.count = ackMsg_.count;
          st.dtype = ackMsg_.dtype;
          st.code = ackMsg_.code;
          st.call = ackMsg_.call;
          st.step.store(ackMsg_.statusStep, std::memory_order_release);
        }
        sm->ack.value.store(ackMsg_.ack, std::memory_order_release);
        moved = true;
      }
    }
    if (moved) bell_->ring();
    return did || moved;
  }

  // One step at a time: the header, then the data where the receiver wants it (its posted buffer when the header
  // matches what it expects, else after the header in the slot, for the engine to copy or drop).
  bool progressRecv() {
    bool did = false, moved = false;
    SendMem* sm = fifo_.sm();
    size_t sz;
    while (true) {
      char* slot = fifo_.simple() + (posted_ % kSteps) * slotBytes_;
      auto* h = reinterpret_cast<SlotHeader*>(slot);
      if (phase_ == 0) {
        if (posted_ >= sm->head.value.load(std::memory_order_acquire) + kSteps) break;
        if (!(req_[0] = net_->irecv(*data_, h, slotBytes_, 0, nullptr))) break;  // a header, with a small chunk
        phase_ = 1;
        did = true;
      }
      if (phase_ == 1) {
        if (!net_->test(req_[0], &sz)) break;
        if (sz < sizeof(SlotHeader) || sz != sizeof(SlotHeader) + (h->inlined ? h->chunkBytes : 0))
          fail(StatusCode::kRemoteError, "a corrupt FIFO slot ({} bytes, chunk {})", sz, h->chunkBytes);
        if (h->inlined) {
          h->landed = 0;
          partLanded_ = false;
          lastDone_ = h->last;
          fifo_.rm()->tail.value.store(++posted_, std::memory_order_release);
          phase_ = 0;
          moved = true;
          continue;
        }
        phase_ = 3;
      }
      if (phase_ == 3) {
        const Rendezvous& r = sm->rdv;
        uint64_t posted = r.step.load(std::memory_order_acquire);
        h->landed = posted == h->partFirst + 1 && r.addr && r.opBytes == h->opBytes && r.partBytes == h->partBytes &&
                    r.dtype == h->dtype && r.nParts == h->nParts && r.call == h->call && h->offset + h->chunkBytes <= r.partBytes;
        char* dst;
        if (h->landed) {
          dst = reinterpret_cast<char*>(r.addr) + h->offset;
        } else if (h->chunkBytes <= slotBytes_ - sizeof(SlotHeader)) {
          dst = slot + sizeof(SlotHeader);  // the receiver is not there yet: it copies from the slot later
        } else if (posted == h->partFirst + 1) {
          scratch_.resize(h->chunkBytes);  // it is there and will not take it (sizes differ): dropped
          dst = scratch_.data();
        } else {
          break;  // too big for the slot: wait for the receiver's buffer
        }
        if (!(req_[0] = net_->irecv(*data_, dst, h->chunkBytes, 0, nullptr)))
          fail(StatusCode::kInternal, "NET : no request for a chunk's data");
        phase_ = 2;
        did = true;
      }
      if (!net_->test(req_[0], &sz)) break;
      if (sz != h->chunkBytes) fail(StatusCode::kRemoteError, "a chunk of {} bytes, its header says {}", sz, h->chunkBytes);
      lastDone_ = h->last;
      partLanded_ = h->landed && (posted_ == h->partFirst || partLanded_);
      fifo_.rm()->tail.value.store(++posted_, std::memory_order_release);
      if (ack_ && h->last && partLanded_) landedParts_.push_back({h->partFirst, posted_});
      phase_ = 0;
      moved = true;
    }
    if (ack_) {
      // A part that landed in the posted buffer is acknowledged as it arrives (ackReach), not when the receiver's
      // engine gets to look: it may be reducing the previous slice meanwhile, and the sender's next send waited.
      const uint64_t a = engineAck();
      while (!landedParts_.empty() && landedParts_.front().second <= a) landedParts_.pop_front();
      const uint64_t reach = ackReach(a);
      if (!ackReq_ && reach > ackSent_) {
        // The verdicts go back in order, each before (or with) the ack that covers its op: with two or more not
        // sent yet, the first goes with an ack that stops short of the second's op (its first step), so that the
        // sender never sees that op acknowledged without its verdict (several ops in flight: NET sends streaming).
        const StatusLine* first = nullptr;  // the oldest verdict not sent (its step s1), and the next one's step s2
        uint64_t s1 = 0, s2 = 0;
        for (const StatusLine& st : sm->status) {
          uint64_t s = st.step.load(std::memory_order_acquire);
          if (s <= statusSent_ || s > a) continue;
          if (!s1 || s < s1) {
            s2 = s1;
            s1 = s;
            first = &st;
          } else if (!s2 || s < s2) {
            s2 = s;
          }
        }
        if (!test_hooks::netHoldAck || !test_hooks::netHoldAck(a, s1)) {
          ackMsg_ = AckMsg{};
          ackMsg_.ack = s2 ? s2 - 1 : reach;
          if (first) {
            ackMsg_.statusStep = s1;
            ackMsg_.bytes = first->bytes;
            ackMsg_.count = first->count;
            ackMsg_.dtype = first->dtype;
            ackMsg_.code = first->code;
            ackMsg_.call = first->call;
          }
          ackReq_ = net_->isend(*ack_, &ackMsg_, sizeof(ackMsg_), 0, nullptr);
          did |= ackReq_ != nullptr;
        }
      }
      if (ackReq_ && net_->test(ackReq_, &sz)) {
        ackReq_ = nullptr;
        ackSent_ = std::max(ackSent_, ackMsg_.ack);
        if (ackMsg_.statusStep) statusSent_ = ackMsg_.statusStep;
        did = true;
      }
    }
    if (moved) bell_->ring();
    return did || moved;
  }

  std::mutex mu_;                // held by whoever moves the connection (the proxy or a waiting caller)
  std::atomic<int> owned_{0};    // callers that took the connection (CallerDrive)
  bool dead_ = false;            // a caller's move failed: nobody moves it any more
  Waker* proxyWake_ = nullptr;
  Net* net_;
  Side side_;
  Connector* conn_;
  std::shared_ptr<Doorbell> bell_;
  int rank_;
  int dev_ = 0;
  bool useAck_ = false;
  size_t slotBytes_ = 0;
  Fifo fifo_;
  std::unique_ptr<NetComm> listen_, data_, ack_, state_;
  NetRequest* req_[kSteps] = {};      // send: headers; recv: [0] the message being received
  NetRequest* dataReq_[kSteps] = {};  // send: the chunks' data
  uint64_t posted_ = 0, done_ = 0;
  int phase_ = 0;                     // recv: 0 post a header, 1 header posted, 3 header in, 2 data posted
  bool lastDone_ = true;              // recv: the last step received ended its part
  bool partLanded_ = false;           // recv: every chunk of the part being received landed in the posted buffer
  std::deque<std::pair<uint64_t, uint64_t>> landedParts_;  // recv: such parts (first step, end), not yet engine-acked
  std::vector<char> scratch_;         // recv: chunks the receiver drops
  NetRequest* ackReq_ = nullptr;
  AckMsg ackMsg_;
  uint64_t ackSent_ = 0, statusSent_ = 0;
};

struct NetResources : Resources {
  Proxy* proxy = nullptr;
  std::shared_ptr<NetConn> pc;
  SetupResp resp;
  ~NetResources() override {
    try {
      if (pc) proxy->callBlocking(*pc, Proxy::Msg::kFree);
    } catch (const std::exception&) {
    }
  }
};

class NetTransport : public Transport {
 public:
  const char* name() const override { return "NET"; }

  bool canConnect(const Context& ctx, const PeerInfo& me, const PeerInfo& peer) const override {
    return ctx.net != nullptr && ctx.net->devices() > 0;
  }

  void setup(Context& ctx, Connector& c, ConnectRecord* rec) const override {
    auto r = std::make_unique<NetResources>();
    r->proxy = ctx.proxy;
    r->pc = std::make_shared<NetConn>(ctx.net, c.side, &c, ctx.doorbell, ctx.rank);
    SetupReq q;
    q.dev = ctx.netDev ? ctx.netDev(c.channel, c.connIndex) % ctx.net->devices() : 0;
    q.connIndex = c.connIndex;
    q.simpleBytes = ctx.buffSizes[kProtoSimple];
    ctx.proxy->callBlocking(*r->pc, Proxy::Msg::kSetup, &q, sizeof(q), &r->resp, sizeof(r->resp));
    std::memcpy(rec->payload, &r->resp.info, sizeof(NetInfo));
    c.via = fmt::format("NET/{}/{}", ctx.net->name(), q.dev);
    if (c.side == Side::kSend)
      TC_INFO(log::kInit | log::kNet, "Channel {:02d}/{} : {}[{}] -> {}[{}] [send] via {}", c.channel, c.connIndex,
              ctx.rank, ctx.devOf(ctx.rank), c.peer, ctx.devOf(c.peer), c.via);
    else
      TC_INFO(log::kInit | log::kNet, "Channel {:02d}/{} : {}[{}] -> {}[{}] [receive] via {}", c.channel, c.connIndex,
              c.peer, ctx.devOf(c.peer), ctx.rank, ctx.devOf(ctx.rank), c.via);
    c.resources = std::move(r);
  }

  bool connect(Context& ctx, Connector& c, const ConnectRecord& rec) const override {
    auto& r = static_cast<NetResources&>(*c.resources);
    NetInfo peer;
    std::memcpy(&peer, rec.payload, sizeof(peer));
    if (c.side == Side::kSend && !peer.hasHandle)
      fail(StatusCode::kRemoteError, "rank {}: rank {}'s NET record for channel {} has no handle", ctx.rank, c.peer,
           c.channel);
    if (!ctx.proxy->callBlocking(*r.pc, Proxy::Msg::kConnect, &peer, sizeof(peer))) return false;
    const Fifo& f = r.pc->fifo();
    ConnInfo& ci = c.conn;
    ci.buffs[kProtoSimple] = f.simple();
    ci.slotBytes[kProtoSimple] = r.pc->slotBytes();
    ci.tail = &f.rm()->tail.value;
    ci.head = &f.sm()->head.value;
    ci.ack = c.side == Side::kSend && c.connIndex == 0 ? &f.sm()->head.value : &f.sm()->ack.value;
    ci.status = f.sm()->status;
    if (c.side == Side::kRecv) ci.rdv = &f.sm()->rdv;  // our buffer, for the proxy
    ci.flags = kConnNet;
    ci.wake = r.pc.get();  // wakes the proxy unless a caller moves the connection
    ci.drive = r.pc->callerDrive();
    ctx.proxy->activate(r.pc);
    return true;
  }
};

}  // namespace

const Transport& netTransport() {
  static const NetTransport t;
  return t;
}

}  // namespace topocoll::transport
