// The shared control blocks of a connection (NCCL's ncclSendMem / ncclRecvMem), each at the start of the buffer its
// side owns, followed by the FIFO buffers. Page-sized so the buffers behind them stay page-aligned.
#pragma once

#include <atomic>
#include <cstdint>

#include "topocoll/transport/oneshot.h"
#include "topocoll/transport/primitives.h"
#include "topocoll/transport/transport.h"

namespace topocoll::transport {

/// Probe for single copies between processes: the active side reads `nonce` at its address in the owner's memory
/// with process_vm_readv; if it reads the value the connect record announced, single copies work.
struct alignas(64) Probe {
  std::atomic<uint32_t> pull{0};  // in the sender's block: the receiver can copy from the sender's memory
  std::atomic<uint32_t> push{0};  // in the sender's block: the sender can copy into the receiver's memory
  uint64_t nonce = 0;
};

/// Owned by the sender; the receiver writes head, status and rdv.
struct alignas(4096) SendMem {
  Counter head;
  Counter ack;        // NET: acks the proxy received (shared memory: the head is the ack)
  Counter forwarded;  // NET, receive side: the last ack the proxy sent back
  StatusLine status[kStatusRing];  // the receiver's verdicts (primitives.h statusOf)
  Rendezvous rdv;
  Probe probe;
  RecvPost post;      // written by the receiver
};

/// Owned by the receiver (22 pages, 88 KiB, with the two mailboxes of kShotSlots slots); the sender writes tail and
/// the mailbox slots.
struct alignas(4096) RecvMem {
  Counter tail;
  Probe probe;
  ShotArea shot;      // the one-shot mailbox: the sender writes the slots, the receiver `consumed`
  ShotArea p2pShot;   // the same for small sends and receives (their own sequence)
};

static_assert(sizeof(SendMem) == 4096 && sizeof(RecvMem) % 4096 == 0, "control blocks are whole pages");

/// Points a shared-memory connection's counters and control lines into its two blocks (both sides alike): the
/// receiver's head doubles as the sender's ack. NET lays its own out (net.cc: a proxy forwards the acks).
inline void bindControl(ConnInfo& ci, SendMem* sm, RecvMem* rm) {
  ci.tail = &rm->tail.value;
  ci.head = &sm->head.value;
  ci.ack = &sm->head.value;
  ci.status = sm->status;
  ci.post = &sm->post;
  ci.rdv = &sm->rdv;
  ci.shot = &rm->shot;
  ci.p2pShot.area = &rm->p2pShot;
}

}  // namespace topocoll::transport
