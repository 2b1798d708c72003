// Receives from any rank (Communicator::recvAny, tcclRecvAny): every transport and path a message can take (the
// point-to-point mailbox, LL and Simple FIFO steps, single copies, NET), peers that connect for the first time while
// the receiver waits, senders that come late, the rotation between peers that all send, and the timeout (bad
// arguments: p2p_test.cc BadInput).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "ranks.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"

namespace topocoll::runtime {
namespace {

using testing::expectError;
using testing::expectNoErrors;
using testing::force;
using testing::runRanks;
using testing::Transport;
using Clock = std::chrono::steady_clock;

struct Case {
  const char* name;
  Transport tr;
  size_t count;      // int32 elements per message
  int mailboxMax;    // TOPOCOLL_P2P_MAILBOX_MAX (0: every message through the FIFO)
  bool connectFirst; // connect every peer before (otherwise the senders connect while rank 0 waits)
};

class AnySource : public ::testing::TestWithParam<Case> {};

// Ranks 1..n-1 each send `kMessages` messages to rank 0 (rank r's values r * 1000 + i), rank r after r * 2 ms; rank 0
// receives them all from any rank, then (after a barrier) one more from each by name. Every message arrives once, whole, from its sender, in
// each sender's order.
TEST_P(AnySource, EveryMessageArrivesOnceFromItsSender) {
  const Case& k = GetParam();
  constexpr int kRanks = 4, kMessages = 5;
  auto errors = runRanks(
      kRanks,
      [&](int r, InitOptions& o) {
        force(k.tr, r, o.cfg);
        o.cfg.p2pMailboxMax = k.mailboxMax;
        o.cfg.timeoutSec = 20;
      },
      [&](Communicator& c, int r) {
        if (k.connectFirst) c.connectAll();
        std::vector<int32_t> buf(k.count);
        if (r > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2 * r));
          for (int i = 0; i < kMessages; ++i) {
            std::fill(buf.begin(), buf.end(), r * 1000 + i);
            c.send(buf.data(), buf.size(), DataType::kInt32, 0);
          }
          c.barrier();
          std::fill(buf.begin(), buf.end(), -r);
          c.send(buf.data(), buf.size(), DataType::kInt32, 0);
          return;
        }
        const int peers[] = {1, 2, 3};
        std::vector<int> next(kRanks, 0);
        for (int m = 0; m < (kRanks - 1) * kMessages; ++m) {
          std::fill(buf.begin(), buf.end(), 0x5a5a5a5a);
          int src = c.recvAny(buf.data(), buf.size(), DataType::kInt32, peers, 3);
          ASSERT_GE(src, 1);
          ASSERT_LT(src, kRanks);
          ASSERT_LT(next[src], kMessages) << "a message too many from rank " << src;
          for (size_t i = 0; i < buf.size(); ++i)
            ASSERT_EQ(buf[i], src * 1000 + next[src]) << "from rank " << src << ", element " << i;
          ++next[src];
        }
        c.barrier();
        for (int p = 1; p < kRanks; ++p) {
          c.recv(buf.data(), buf.size(), DataType::kInt32, p);  // the last ones, by name: the counts still agree
          EXPECT_EQ(buf[0], -p);
        }
      });
  expectNoErrors(errors);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, AnySource,
    ::testing::Values(Case{"P2pMailbox", Transport::kP2p, 4, 256, false},
                      Case{"P2pMailboxConnected", Transport::kP2p, 4, 256, true},
                      Case{"P2pFifoLL", Transport::kP2p, 4, 0, false},
                      Case{"P2pLarge", Transport::kP2p, 300000, 256, false},
                      Case{"ShmMailbox", Transport::kShm, 16, 256, false},
                      Case{"ShmFifo", Transport::kShm, 5000, 256, true},
                      Case{"ShmLarge", Transport::kShm, 1 << 20, 256, false},
                      Case{"NetSmall", Transport::kNet, 4, 256, false},
                      Case{"NetLarge", Transport::kNet, 600000, 256, true}),
    [](const auto& info) { return std::string(info.param.name); });

// Two peers that keep sending: neither waits behind the other (each receive looks first after the last sender).
TEST(AnySourceTurns, PeersThatAllSendAreServedInTurn) {
  auto errors = runRanks(
      3, [](int r, InitOptions& o) { force(Transport::kShm, r, o.cfg); },
      [](Communicator& c, int r) {
        c.connectAll();
        int x = r;
        c.barrier();
        if (r > 0) {
          groupStart();  // all 8 written at once (blocking sends would wait for each verdict)
          for (int i = 0; i < 8; ++i) c.send(&x, 1, DataType::kInt32, 0);
          groupEnd();
          c.barrier();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both have messages waiting
        const int peers[] = {1, 2};
        int from1 = 0, from2 = 0;
        for (int i = 0; i < 4; ++i) {
          int src = c.recvAny(&x, 1, DataType::kInt32, peers, 2);
          EXPECT_EQ(x, src);
          (src == 1 ? from1 : from2)++;
        }
        EXPECT_EQ(from1, 2);
        EXPECT_EQ(from2, 2);
        for (int i = 0; i < 12; ++i) c.recvAny(&x, 1, DataType::kInt32, peers, 2);
        c.barrier();
      });
  expectNoErrors(errors);
}

TEST(AnySourceFaults, NobodySendsTimesOut) {
  std::atomic<bool> done{false};
  auto errors = runRanks(
      3,
      [](int r, InitOptions& o) {
        force(Transport::kP2p, r, o.cfg);
        o.cfg.timeoutSec = 0.5;
      },
      [&](Communicator& c, int r) {
        if (r > 0) {
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;
        }
        int x = 0;
        const int peers[] = {1, 2};
        auto t0 = Clock::now();
        try {
          c.recvAny(&x, 1, DataType::kInt32, peers, 2);
          ADD_FAILURE() << "the receive completed";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), StatusCode::kTimeout) << e.what();
          EXPECT_NE(std::string(e.what()).find("none of 2 rank(s) sent within 500 ms"), std::string::npos) << e.what();
        }
        EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
        done = true;
      });
  expectNoErrors(errors);
}

}  // namespace
}  // namespace topocoll::runtime
