// libFuzzer target: what a peer writes that a rank then reads, from a corrupt or hostile peer.
//   - connect records (NCCL's 128-byte ncclConnect) through checkRecord, as setup receives them over the bootstrap,
//     and their payload as GPU ranks' CUDA IPC info through checkCudaIpcInfo;
//   - a receiver's view of a connection FIFO: the LL lines, the Simple slot headers and data, the tail counter, all
//     from the input, driven by transport::Transfer until it finishes or a step bound is reached (then failed from
//     outside, as a timeout would). The receiver must finish, fail with a message, or stay waiting: never write
//     outside its buffer, never crash. Single copies go through process_vm_readv on this process (kConnCma), which
//     turns any address the input names into a clean EFAULT; direct pointers and NET need a trusted peer and a
//     proxy and are left out.
//
// Input: byte 0 selects the case; then the record (128 bytes + expectations) or, for the FIFO, a 16-byte message
// description (size, type, parts, mode bits, tail) followed by the LL buffer's bytes (when mode bit 0 enables LL)
// and the Simple buffer's.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "topocoll/status.h"
#include "topocoll/transport/primitives.h"
#include "topocoll/transport/transport.h"
#include "transport/cuda_ipc.h"

namespace {

using namespace topocoll;
using namespace topocoll::transport;

class NoWaker : public Waker {
 public:
  void ring() override {}
};

struct Reader {
  const uint8_t* p;
  size_t n;
  template <typename T>
  T take() {
    T v{};
    const size_t k = std::min(sizeof(T), n);
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
};

void fuzzRecord(Reader in) {
  ConnectRecord r;
  const size_t k = std::min(sizeof(r), in.n);
  std::memcpy(static_cast<void*>(&r), in.p, k);
  in.p += k;
  in.n -= k;
  const auto nRanks = static_cast<int>(in.take<uint8_t>()) + 1;
  const int from = in.take<uint8_t>() % nRanks, me = in.take<uint8_t>() % nRanks;
  const int channel = in.take<uint8_t>() % kMaxChannels, connIndex = in.take<uint8_t>() % kNumConnIndices;
  const Side side = in.take<uint8_t>() & 1 ? Side::kSend : Side::kRecv;
  const uint64_t commId = in.take<uint64_t>();
  (void)checkRecord(r, commId, nRanks, from, me, channel, connIndex, side);
  // Between GPU ranks the payload is the CUDA IPC info (cuda_ipc.h): checked before any handle is opened.
  CudaIpcInfo ipc;
  std::memcpy(&ipc, r.payload, sizeof(ipc));
  const uint8_t bits = in.take<uint8_t>();
  const std::string why = checkCudaIpcInfo(ipc, bits & 1, bits & 2, bits & 4, uint64_t{4} << 20);
  if (why.empty() && (ipc.flags & ~kIpcKnownFlags)) __builtin_trap();  // accepted only when well formed
}

void fuzzFifo(Reader in) {
  constexpr size_t kLLSlot = 512, kSimpleSlot = 4096;  // small slots: every step boundary is reachable
  const uint32_t bytes = in.take<uint16_t>() % 20000;
  const auto dtype = static_cast<DataType>(in.take<uint8_t>() % 12);
  const int nParts = in.take<uint8_t>() % 4 + 1;
  const uint8_t modes = in.take<uint8_t>();
  const uint64_t tail = in.take<uint8_t>() % (2 * kSteps + 2);

  std::vector<uint64_t> ll(kSteps * kLLSlot / 8), simple(kSteps * kSimpleSlot / 8);
  const size_t llBytes = modes & 1 ? std::min(ll.size() * 8, in.n) : 0;
  std::memcpy(ll.data(), in.p, llBytes);
  in.p += llBytes;
  in.n -= llBytes;
  // The Simple buffer: the input's bytes, repeated so that short inputs still fill the slot headers.
  auto* s = reinterpret_cast<uint8_t*>(simple.data());
  for (size_t i = 0; i < simple.size() * 8 && in.n; ++i) s[i] = in.p[i % in.n];

  std::atomic<uint64_t> tailC{tail}, headC{0}, ackC{0}, forwarded{0};
  std::atomic<uint32_t> canPull{1}, canPush{1};
  StatusLine status[kStatusRing];  // the receiver's verdict ring, as RecvMem holds it (fifo.h)
  Rendezvous rdv;
  NoWaker waker;
  Connector c;
  c.side = Side::kRecv;
  c.peer = 1;
  c.channel = 0;
  ConnInfo& ci = c.conn;
  if (modes & 1) {
    ci.buffs[kProtoLL] = reinterpret_cast<char*>(ll.data());
    ci.slotBytes[kProtoLL] = kLLSlot;
  }
  ci.buffs[kProtoSimple] = reinterpret_cast<char*>(simple.data());
  ci.slotBytes[kProtoSimple] = kSimpleSlot;
  ci.tail = &tailC;
  ci.head = &headC;
  ci.ack = &ackC;
  ci.status = status;
  ci.forwarded = &forwarded;
  ci.rdv = &rdv;
  ci.canPull = &canPull;
  ci.canPush = &canPush;
  ci.flags = (modes & 2 ? kConnRead : 0) | (modes & 4 ? kConnCma : 0);
  ci.peerPid = getpid();
  ci.wake = &waker;

  MessageDesc msg;
  msg.bytes = bytes;
  msg.count = bytes;
  msg.dtype = dtype;
  msg.nParts = nParts;
  msg.part = 0;
  msg.partOffset = 0;
  msg.partBytes = bytes / nParts;
  std::vector<char> buf(msg.partBytes);
  TransferOptions opts;
  opts.chunkBytes = kSimpleSlot - sizeof(SlotHeader);
  Transfer t(c, Transfer::Dir::kRecv, buf.data(), msg, opts);
  for (int i = 0; i < 4096 && !t.finished(); ++i)
    if (!t.progress()) break;  // nothing more will come: a live receiver would now wait
  if (!t.finished()) t.fail(StatusCode::kTimeout, "fuzz: no progress");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Reader in{data + 1, size - 1};
  try {
    if (data[0] & 1) fuzzFifo(in);
    else fuzzRecord(in);
  } catch (const topocoll::Error&) {
  }
  return 0;
}
