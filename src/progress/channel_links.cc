// The Links of the collective algorithms over a communicator's connections and engine (progress/channel_links.h).
#include "topocoll/progress/channel_links.h"

#include <limits>

#include "topocoll/log.h"
#include "topocoll/status.h"
#include "topocoll/transport/peer_memory.h"

namespace topocoll::progress {

namespace {
constexpr uint64_t kPeerBufferMagic = 0x7463636c70627566ull;  // "tcclpbuf"
// Largest collective step sent eagerly (see makeOp).
constexpr size_t kEagerMaxBytes = 64 << 10;
}  // namespace

ChannelLinks::~ChannelLinks() { transport::freeShareable(scratch_); }
int ChannelLinks::rank() const { return conns_.rank(); }
int ChannelLinks::nRanks() const { return conns_.nRanks(); }
int ChannelLinks::nChannels() const { return conns_.nRingChannels(); }
const int* ChannelLinks::ring(int c) const { return conns_.ring(c).data(); }
int ChannelLinks::treeUp(int c) const { return conns_.channel(c).treeUp; }
int ChannelLinks::treeDown(int c, int i) const { return conns_.channel(c).treeDown[i]; }

int ChannelLinks::send(int c, int peer, const void* buf, size_t bytes, Proto proto, bool staged, Copier copier) {
  // A push goes into the peer's output (an in-place 2-rank Broadcast's second half), which nobody reads during the
  // call: a large collective's copy may bypass the caches.
  ops_.push_back(makeOp(true, c, peer, const_cast<void*>(buf), bytes, proto, staged, copier,
                         streamOutputs_ && copier == Copier::kPush));
  return static_cast<int>(ops_.size()) - 1;
}

int ChannelLinks::recv(int c, int peer, void* buf, size_t bytes, Proto proto, bool staged) {
  // What lands outside the scratch slots is a part of the output, which this rank does not read again (the slots
  // are reduced from at once): a large collective's single copies may bypass the caches.
  const auto* b = static_cast<const char*>(buf);
  const bool inScratch = scratch_ && b >= scratch_ && b < scratch_ + scratchBytes_;
  ops_.push_back(makeOp(false, c, peer, buf, bytes, proto, staged, Copier::kAny, streamOutputs_ && !inScratch));
  return static_cast<int>(ops_.size()) - 1;
}

void ChannelLinks::start() {
  flush(false);
  engine_.poke();
}

void ChannelLinks::wait(int h) {
  flush(false);
  engine_.wait(*ops_[h], /*more=*/true);  // waitAll() (or drain()) ends every collective
}

void ChannelLinks::waitAll() {
  flush(true);
  raw_.clear();
  for (auto& op : ops_) raw_.push_back(op.get());
  try {
    engine_.waitAll(raw_);  // after an inline run: only throws what failed
  } catch (const Error&) {
    recycle();
    throw;
  }
  recycle();
}

void ChannelLinks::recycle() {
  for (auto& op : ops_) pool_.give(std::move(op));
  ops_.clear();
  posted_ = 0;
}

void ChannelLinks::beginCollective(bool streamOutputs, const CallSignature& call) {
  streamOutputs_ = streamOutputs;
  call_ = call;
  mapped_.clear();
}

bool ChannelLinks::describeBuffer(const void* p, size_t bytes, PeerBuffer* out) {
  const transport::RegionRef r = transport::regionOf(p, bytes);
  if (r.fd < 0 || !conns_.config().mapPeerBuffers) return false;
  *out = {};
  out->words[0] = kPeerBufferMagic;
  out->words[1] = r.owner;
  out->words[2] = r.serial;
  out->words[3] = r.base;
  out->words[4] = r.len;
  out->words[5] = static_cast<uint64_t>(r.fd);
  out->words[6] = reinterpret_cast<uint64_t>(p);
  out->words[7] = bytes;
  return true;
}

const char* ChannelLinks::mapPeerBuffer(int peer, const PeerBuffer& b, size_t bytes) {
  if (b.words[0] != kPeerBufferMagic || b.words[7] != bytes || peer < 0 || peer >= conns_.nRanks() ||
      peer == conns_.rank())
    return nullptr;
  // Only where this pair's single copies may map each other's buffers: P2P between two processes of the host
  // (not SHM, which NCCL_P2P_DISABLE asks for; not NET), with TOPOCOLL_MAP_PEER_BUFFERS on.
  const transport::Connector* conn = conns_.linkConnector(0, peer, false);
  if (!conn || !(conn->conn.flags & transport::kConnMapPeer)) return nullptr;
  transport::RegionRef r;
  r.owner = b.words[1];
  r.serial = b.words[2];
  r.base = b.words[3];
  r.len = b.words[4];
  r.fd = b.words[5] > 0x7fffffffu ? -1 : static_cast<int32_t>(b.words[5]);
  auto m = transport::mapPeerRegion(conn->conn.peerPid, r, b.words[6], b.words[7]);
  if (!m) return nullptr;
  mapped_.push_back(m);
  return m->at(r, b.words[6]);
}

void ChannelLinks::connectAll() {
  if (allConnected_) return;
  std::vector<int> peers;
  for (int p = 0; p < conns_.nRanks(); ++p)
    if (p != conns_.rank()) peers.push_back(p);
  conns_.ensureConnected(peers);
  allConnected_ = true;
}

char* ChannelLinks::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    transport::freeShareable(scratch_);
    scratch_ = nullptr;
    scratchBytes_ = 0;
    scratch_ = static_cast<char*>(transport::allocShareable(bytes));
    scratchBytes_ = bytes;
  }
  return scratch_;
}

void ChannelLinks::drain() {
  raw_.clear();
  for (size_t i = 0; i < posted_; ++i) raw_.push_back(ops_[i].get());
  if (!raw_.empty()) {
    TC_INFO(log::kColl, "rank {}: the collective failed: draining its {} posted transfers", conns_.rank(),
            raw_.size());
    engine_.drain(raw_);
  }
  recycle();
}

bool ChannelLinks::flush(bool all) {
  if (posted_ == ops_.size()) return false;
  if (all && posted_ == 0 && ops_.size() <= 8) {
    raw_.clear();
    for (auto& op : ops_) raw_.push_back(op.get());
    if (engine_.runInlineGroup(raw_)) {
      posted_ = ops_.size();
      return true;
    }
  }
  fresh_.assign(ops_.begin() + static_cast<std::ptrdiff_t>(posted_), ops_.end());
  engine_.post(fresh_, false);
  fresh_.clear();
  posted_ = ops_.size();
  return false;
}

std::shared_ptr<Op> ChannelLinks::makeOp(bool send, int channel, int peer, void* buf, size_t bytes, Proto proto,
                                         bool staged, Copier copier, bool streamStores) {
  transport::Connector* conn = conns_.linkConnector(channel, peer, send);
  std::shared_ptr<Op> op = pool_.take();
  op->send = send;
  op->ordered = false;  // matched by its connector (Op::ordered)
  op->peer = peer;
  op->buf = buf;
  op->count = op->bytes = bytes;
  op->dtype = DataType::kUint8;
  const Config& cfg = conns_.config();
  // The ranks of a collective run the same steps: a small send completes once its data is in the peer's FIFO (one
  // trip instead of two). Large ones wait for the ack: a sender that runs ahead of its receiver by whole slices
  // competes with it for the cores and the cache (2-rank AllReduce at 16-64 MiB took 1.5-3x longer eager).
  op->opts.eager = bytes <= kEagerMaxBytes;
  op->opts.llThreshold = proto == Proto::kLL ? std::numeric_limits<size_t>::max() : 0;
  op->opts.chunkBytes = conns_.p2pChunk();
  op->opts.netChunkBytes = static_cast<size_t>(cfg.netChunkSize);
  // Slices the receiver reduces go through the FIFOs: faster than single copies (process_vm_readv pins pages per
  // call) at these sizes, and the data stays in the cache (docs/collectives.md). Data that lands where it stays
  // takes single copies.
  op->opts.singleCopyMin = staged ? -1 : cfg.p2pSingleCopy;
  op->opts.streamStores = streamStores;
  using Single = transport::TransferOptions::Single;
  op->opts.single = copier == Copier::kPull   ? Single::kPull
                    : copier == Copier::kPush ? Single::kPush
                                              : Single::kAsConnector;
  transport::MessageDesc d;
  d.bytes = d.partBytes = d.count = bytes;
  d.dtype = DataType::kUint8;
  d.call = call_.word;
  d.describeCall = call_.describe;
  if (!send) {
    op->partDescs.push_back(d);
    op->partConns.push_back(conn);
  }
  OpPool::setPart(*op, *conn, send ? transport::Transfer::Dir::kSend : transport::Transfer::Dir::kRecv, buf, d,
                  op->opts, !send);
  return op;
}

}  // namespace topocoll::progress
