// Points where a test can force an interleaving between the two sides of a connection (the peer's steps run
// inside the hook, on this thread). Null outside tests; never set while transfers run on other threads.
#pragma once

#include <cstdint>

namespace topocoll::transport::test_hooks {

/// A receiver's first look for the sender's header, between its two reads (the Simple tail and the LL lines of
/// its first step).
extern void (*recvStartBetweenLooks)();

/// A NET receiver about to send back an acknowledgement that covers its engine's `ack` (and the parts that landed
/// in posted buffers after it) with the verdict of the op whose first step + 1 is `status` (0: none): true holds it
/// back (the receiver goes on; asked again at its next move).
extern bool (*netHoldAck)(uint64_t ack, uint64_t status);

/// A NET sender whose requests for `step` (its header and data) completed, about to tell its engine (the FIFO's
/// head): true holds that back (asked again at the sender's next move), as a network plugin whose test() reports
/// a send done some time after the receiver already has its data.
extern bool (*netHoldSendDone)(uint64_t step);

/// A NET receiver reading how far its engine has acknowledged (`ack`): returns what it sees instead (a test makes
/// the engine look slow: the acknowledgements of parts that landed in a posted buffer go without it).
extern uint64_t (*netEngineAck)(uint64_t ack);

/// A caller waiting on NET connections it holds (Engine::waitMovingNet) slept through a whole poll() slice: nothing
/// arrived and nothing it moves could go on. Called on that thread; several engines may call it at once.
extern void (*callerPollSlept)();

}  // namespace topocoll::transport::test_hooks
