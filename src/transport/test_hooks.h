// Points where a test can force an interleaving between the two sides of a connection (the peer's steps run
// inside the hook, on this thread). Null outside tests; never set while transfers run on other threads.
#pragma once

namespace topocoll::transport::test_hooks {

/// A receiver's first look for the sender's header, between its two reads (the Simple tail and the LL lines of
/// its first step).
extern void (*recvStartBetweenLooks)();

}  // namespace topocoll::transport::test_hooks
