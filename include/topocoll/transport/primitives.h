// Moving one message part over one connector (NCCL's device primitives, prims_ll.h / prims_simple.h, on a CPU
// thread). A Transfer is a state machine: progress() advances it as far as it can without waiting and returns
// whether anything moved, so one thread can drive many transfers in both directions without deadlock.
//
// The sender picks the protocol from its size and the connector; the receiver follows the header the sender puts
// in the first step, so both agree even when their sizes differ:
//   LL      bytes <= NCCL_P2P_LL_THRESHOLD: 8-byte words of 4 data bytes + a 4-byte flag (step + 1); the receiver
//           polls the flags, no counter and no fence (lowest latency). The first 4 words are the header.
//   Simple  NCCL_STEPS slots of at most the chunk size, each with a 64-byte header, published by the tail counter
//           and released by the head counter.
//   single copy (same process: P2P/direct pointer; other process: process_vm_readv/writev where the kernel allows)
//           read mode: the sender publishes its buffer's address and the receiver copies from it; write mode: the
//           sender asks, the receiver publishes its address, the sender copies into it and says so.
// The receiver acknowledges the whole part at the end (ack counter). Over shared memory it also posts what it expects
// (RecvPost) when it starts: a sender whose data is in the FIFO and matches that post completes without the ack (one
// one-way trip per message, as NCCL's unacknowledged steps; an eager send, the collectives', does not even look). A
// size or type mismatch is found by the receiver from the header, which then consumes exactly the sender's steps
// without copying and reports the mismatch in the status line (the sender, seeing a post that differs, waits for
// the ack and reads it): both sides fail and the connection stays usable.
// A side that offered its buffer for a single copy and fails (timeout, abort, a failed part) withdraws the offer and
// waits out a piece the peer is copying: a failed transfer never leaves the peer copying into or out of its buffer.
//
//   transport::Transfer t(connector, transport::Transfer::Dir::kSend, buf, desc, opts);
//   while (!t.finished()) if (!t.progress()) backoff.idle(...);
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "topocoll/datatype.h"
#include "topocoll/status.h"
#include "topocoll/transport/transport.h"

namespace topocoll::transport {

/// The 64 bytes at the start of every Simple slot.
struct SlotHeader {
  uint64_t opBytes = 0;     // the whole message (all parts)
  uint64_t partBytes = 0;   // this part
  uint64_t chunkBytes = 0;  // data in this slot
  uint64_t addr = 0;        // single copy: the sender's buffer (read); NET: where the sender's proxy sends from
  uint64_t offset = 0;      // NET: where this chunk's data goes in the part
  uint64_t partFirst = 0;   // NET: the part's first step (the receiver's proxy matches its buffer with it)
  uint64_t call = 0;        // the collective call the message belongs to (MessageDesc::call; 0: none)
  uint16_t error = 0;       // write mode, done step: the copy failed (errno)
  uint8_t nParts = 0;
  uint8_t dtype = 0;
  uint8_t mode = 0;         // Transfer::Mode
  uint8_t last = 0;         // the part's last step
  uint8_t landed = 0;       // NET: the receiver's proxy put the data in the receiver's buffer, not after this header
  uint8_t inlined = 0;      // NET: small chunk: the data follows this header in the slot and in the same message
};
static_assert(sizeof(SlotHeader) == 64, "one cache line");

/// The receiver's verdict on an op, written before the ack (NET: carried back by the proxies). A connection keeps
/// kStatusRing of them, the op's at statusOf(firstStep + 1): a sender with several ops in flight on one connector
/// (NET sends streaming in a group, Engine::runInlineGroup) reads the verdict of each; it opens an op only while
/// the ring's entry for it belongs to no op still waiting for its verdict.
struct alignas(64) StatusLine {
  std::atomic<uint64_t> step{0};  // firstStep + 1 of the op it is about
  uint64_t bytes = 0;             // what the receiver expected
  uint32_t dtype = 0;
  uint32_t code = 0;              // Transfer::Code
  uint64_t count = 0;
  uint64_t call = 0;              // the receiver's call (MessageDesc::call)
  char pad[24];
};
static_assert(sizeof(StatusLine) == 64, "one cache line");
constexpr uint64_t kStatusRing = 16;
/// The ring entry of the op whose first step + 1 is `tag`.
inline StatusLine& statusOf(StatusLine* ring, uint64_t tag) { return ring[tag % kStatusRing]; }

/// Shared memory: the receive a receiver has started (its first step and what it expects), written before it looks
/// for the sender's header. A sender whose LL or Simple message (the data is in the FIFO) matches it completes
/// without waiting for the ack: the receiver will take the message as it is. Written and read as a seqlock (step 0
/// while it changes), every field an atomic.
struct alignas(64) RecvPost {
  std::atomic<uint64_t> step{0};       // firstStep + 1 of the receive, 0 while being written
  std::atomic<uint64_t> bytes{0};      // the whole message it expects
  std::atomic<uint64_t> partBytes{0};  // this part
  std::atomic<uint64_t> shape{0};      // dtype | nParts << 8 | drain << 40
  std::atomic<uint64_t> call{0};       // MessageDesc::call
  char pad[24];
};
static_assert(sizeof(RecvPost) == 64, "one cache line");

/// What both sides know about the message a part belongs to.
struct MessageDesc {
  size_t bytes = 0;           // whole message
  size_t count = 0;           // elements
  DataType dtype = DataType::kUint8;
  int nParts = 1, part = 0;
  size_t partOffset = 0, partBytes = 0;
  /// The collective call the message is a step of, as the collectives encode it (collectives::callSignature; 0: a
  /// point-to-point message). The receiver compares the sender's with its own like the size and the type: ranks that
  /// disagree on the call (collective, type, op, count, root, its number) fail instead of mixing their data.
  uint64_t call = 0;
  /// Words a call for the messages ("AllReduce(count 4096, float32, sum)"); null: none (the number is printed).
  std::string (*describeCall)(uint64_t call) = nullptr;
};

struct TransferOptions {
  size_t llThreshold = 16384;        // NCCL_P2P_LL_THRESHOLD (per part)
  size_t chunkBytes = 128 << 10;     // NCCL_P2P_PCI_CHUNKSIZE / NCCL_P2P_NET_CHUNKSIZE
  size_t netChunkBytes = 1 << 20;    // TOPOCOLL_NET_CHUNKSIZE: NET chunks go between the users' buffers
  long long singleCopyMin = 65536;   // TOPOCOLL_P2P_SINGLE_COPY: bytes from which single copies are used, -1 never
  /// A send whose data went into the peer's FIFO (LL lines, Simple slots; not NET, not single copies) completes
  /// without waiting for the receiver's ack, as NCCL's steps do: flow control by the FIFO counters only. For the
  /// collectives, whose ranks run the same steps: a receiver that finds a size or type mismatch still fails, and the
  /// sender learns it from the status line at its next send over that connector.
  bool eager = false;
  /// A single copy goes in this mode whatever the connector prefers (where the processes' rights allow it): read
  /// (the receiver pulls) or write (the sender pushes). Lets the two sides split the copying (2-rank Broadcast).
  enum class Single : uint8_t { kAsConnector, kPull, kPush };
  Single single = Single::kAsConnector;
  /// A single copy this side makes through a mapping of the peer's buffer (peer_memory.h) bypasses the caches
  /// (copyStreaming): for data that lands where nobody reads it soon (a collective's output, not the slots it
  /// reduces from). Without a mapping (process_vm_readv/writev, same process) it changes nothing.
  bool streamStores = false;
  /// This side's buffer is CUDA device memory: the data goes through the connection's device FIFO (P2P/IPC between
  /// GPU ranks) or is staged through the host Simple slots, always with cudaMemcpyAsync on `stream` (a
  /// cudaStream_t; null: the default stream), synchronised before a step is published. Never LL or single copies.
  bool device = false;
  void* stream = nullptr;
};

class Transfer {
 public:
  enum class Dir { kSend, kRecv };
  enum Mode : uint8_t {
    kModeLL = 1,
    kModeSimple = 2,
    kModeRead = 3,
    kModeWriteAsk = 4,
    kModeWriteDone = 5,
    kModeDevice = 6,  // Simple with the data in the device FIFO slot of the step (P2P/IPC), the header in the host slot
  };
  enum Code : uint32_t { kOk = 0, kMismatch = 1, kCopyFailed = 2 };

  /// `buf` is the part's own bytes (already offset). A receiver part with `gated` waits for open() before it looks
  /// at its connector (parts after the first wait until the first part has checked the header).
  Transfer(Connector& c, Dir dir, void* buf, const MessageDesc& msg, const TransferOptions& opts, bool gated = false);

  /// Advances without waiting; true when anything moved.
  bool progress();
  bool finished() const { return state_ == State::kDone || state_ == State::kFailed; }
  bool failed() const { return state_ == State::kFailed; }
  /// Lets a gated receiver part start; `drain`: consume what the sender sent on this connector without copying
  /// (the message did not match).
  void open(bool drain);
  /// Drops a gated part that never started (the sender did not use its channel): it finishes without error and
  /// without touching its connector.
  void cancel() {
    if (state_ == State::kGated) state_ = State::kDone;
  }
  bool started() const { return state_ != State::kGated; }
  /// A NET send whose steps are all out and that only waits for its ack and verdict: the connector's next op may
  /// open beside it (its verdict has its own line in the status ring).
  bool streaming() const { return awaiting_ && state_ == State::kAck; }
  /// The transfer's first step on its connector (set once it started).
  uint64_t firstStep() const { return firstStep_; }
  /// A receiver past its first step's header (the sender's mode and sizes are known, mismatch() is decided).
  bool pastStart() const { return state_ != State::kGated && state_ != State::kStart; }
  /// Marks the transfer failed from outside (timeout, abort, peer gone). If it had started, the connector is left
  /// out of step and marked broken.
  void fail(StatusCode code, const std::string& why);

  StatusCode errorCode() const { return errorCode_; }
  const std::string& error() const { return error_; }
  /// Receiver, after a mismatch: what the sender sent.
  const SlotHeader& senderHeader() const { return peerHdr_; }
  bool mismatch() const { return mismatch_; }
  /// The protocol the sender chose (after the first step for a receiver).
  const char* modeName() const;
  Connector& connector() const { return c_; }

 private:
  enum class State { kGated, kStart, kRun, kAck, kDone, kFailed };
  bool sendProgress();
  bool refusedEarlier();
  bool receiverTakesIt() const;
  void postReceive();
  void withdrawPost();
  bool recvProgress();
  bool recvStart();
  bool sendLL();
  bool recvLL();
  bool sendSimple();
  bool recvSimple();
  bool sendSingle();
  bool recvSingle();
  /// memcpy (same process) or process_vm_readv/writev (`pull`: from the peer into `local`).
  bool copySingle(char* local, const char* remote, size_t n, bool pull);
  /// Simple and device steps: memcpy, or cudaMemcpyAsync + synchronise when device memory is involved. False (and the
  /// transfer failed) when CUDA reports an error.
  bool copyData(void* dst, const void* src, size_t n);
  /// Single copy, passive side (our buffer is offered to the peer): whether the offer stands; withdraw() takes it
  /// back and returns once no piece of the peer's copy is under way.
  bool offered() const;
  void withdraw();
  void finish();
  void stopAwaiting();
  void failWith(StatusCode code, std::string why, bool breaks);
  void publish(std::atomic<uint64_t>* counter, uint64_t v);
  std::string what() const;
  /// The message of a call mismatch with the peer, whose call was `theirs` (MessageDesc::call).
  std::string callMismatch(uint64_t theirs) const;

  Connector& c_;
  ConnInfo& ci_;
  Dir dir_;
  char* buf_;
  MessageDesc msg_;
  TransferOptions opts_;
  State state_;
  uint8_t mode_ = 0;
  bool drain_ = false, mismatch_ = false;
  bool posted_ = false;                    // NET receiver: our buffer is posted for the proxy
  bool postedRecv_ = false;                // shared-memory receiver: RecvPost written
  bool awaiting_ = false;                  // NET sender: counted in ConnInfo::awaiting (streaming())
  uint64_t firstStep_ = 0, lastStep_ = 0;  // lastStep_: one past the part's last step
  size_t done_ = 0;                        // bytes moved (LL: words)
  uint64_t stepsDone_ = 0;
  size_t llWords_ = 0;                     // LL: data words of the part
  uint64_t addr_ = 0;                      // single copy: the peer's buffer
  uint32_t copyErr_ = 0;
  bool withdrawn_ = false;                 // single copy, active side: the peer withdrew its buffer
  bool hostOnly_ = false;                  // receiver with a device buffer, sender's LL or single copy: drained
  SlotHeader peerHdr_;
  StatusCode errorCode_ = StatusCode::kOk;
  std::string error_;
};

/// Receiver side of a FIFO: whether the sender's next message began to arrive (an LL header or a Simple step past
/// this side's step); nothing is taken. Only while no receive on the connection is under way.
bool messageArrived(const ConnInfo& ci);

/// NCCL's p2p split: how many channels a message of `bytes` uses (ncclP2pChannels... in addP2pToPlan), with
/// nChannelsMin/Max from the communicator, and part bounds (ncclP2pPartBounds).
int p2pParts(size_t bytes, size_t chunkBytes, int nNodes, int nChannelsMin, int nChannelsMax);
void p2pPartBounds(int nParts, int part, size_t bytes, size_t* begin, size_t* end);

}  // namespace topocoll::transport
