// Point-to-point over every transport, ranks as threads: all-to-all of every type and size, protocol variants,
// size/type mismatches, abort, timeouts, groups over several communicators, and no leaked descriptor or thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "ranks.h"
#include "transport/test_hooks.h"
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

uint8_t pattern(int src, int dst, size_t i, int salt) {
  return static_cast<uint8_t>(src * 131 + dst * 31 + i * 7 + (i >> 9) + salt * 13);
}

// One grouped all-to-all of `count` elements of `t` (every rank sends to and receives from every rank, itself
// included, posted in a different order on every rank); returns the bytes that arrived wrong.
size_t allToAll(Communicator& c, DataType t, size_t count, int salt) {
  const int n = c.nRanks(), me = c.rank();
  size_t bytes = count * sizeOf(t);
  std::vector<std::vector<uint8_t>> out(n), in(n);
  for (int p = 0; p < n; ++p) {
    out[p].resize(bytes);
    in[p].assign(bytes, 0xee);
    for (size_t i = 0; i < bytes; ++i) out[p][i] = pattern(me, p, i, salt);
  }
  groupStart();
  for (int k = 0; k < n; ++k) {
    c.recv(in[(me - k + n) % n].data(), count, t, (me - k + n) % n);
    c.send(out[(me + k) % n].data(), count, t, (me + k) % n);
  }
  groupEnd();
  size_t bad = 0;
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < bytes; ++i) bad += in[p][i] != pattern(p, me, i, salt);
  return bad;
}

class AllToAll : public ::testing::TestWithParam<std::tuple<Transport, int>> {};

TEST_P(AllToAll, EveryTypeAndSizeArrivesExactly) {
  auto [tr, n] = GetParam();
  auto errors = runRanks(
      n, [tr = tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
      [n = n](Communicator& c, int r) {
        int salt = 0;
        for (int t = 0; t < kNumDataTypes; ++t) {
          DataType dt = static_cast<DataType>(t);
          std::vector<size_t> counts = {0, 1, 7};
          if (n <= 4 || dt == DataType::kFloat32 || dt == DataType::kInt8) counts.push_back((1 << 20) / sizeOf(dt) + 3);
          for (size_t count : counts) {
            size_t bad = allToAll(c, dt, count, ++salt);
            if (bad) throw Error(StatusCode::kInternal, fmt::format("{} x {}: {} bytes wrong", count, to_string(dt), bad));
          }
        }
      });
  expectNoErrors(errors);
}

INSTANTIATE_TEST_SUITE_P(Transports, AllToAll,
                         ::testing::Combine(::testing::Values(Transport::kP2p, Transport::kShm, Transport::kNet),
                                            ::testing::Values(1, 2, 3, 4, 8)),
                         [](const auto& info) {
                           return std::string(testing::name(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "ranks";
                         });

// The protocols and modes the knobs select, on two ranks of one process (P2P) and of two "hosts" (NET).
struct Variant {
  const char* name;
  Transport tr;
  std::function<void(Config&)> set;
};

class Protocols : public ::testing::TestWithParam<Variant> {};

TEST_P(Protocols, MessagesOfEverySizeArrive) {
  const Variant& v = GetParam();
  auto errors = runRanks(
      2,
      [&](int r, InitOptions& o) {
        force(v.tr, r, o.cfg);
        v.set(o.cfg);
      },
      [](Communicator& c, int r) {
        int salt = 0;
        for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{4095}, size_t{70000}, size_t{3u << 20}}) {
          size_t bad = allToAll(c, DataType::kUint8, count, ++salt);
          if (bad) throw Error(StatusCode::kInternal, fmt::format("{} bytes: {} wrong", count, bad));
        }
      });
  expectNoErrors(errors);
}

INSTANTIATE_TEST_SUITE_P(
    Knobs, Protocols,
    ::testing::Values(
        Variant{"ReadMode", Transport::kP2p, [](Config& c) { c.p2pReadEnable = 1; }},
        Variant{"WriteMode", Transport::kP2p, [](Config& c) { c.p2pReadEnable = 0; }},
        Variant{"DirectDisabledReadMode", Transport::kP2p,
                [](Config& c) { c.p2pDirectDisable = 1, c.p2pReadEnable = 1; }},
        Variant{"DirectDisabledWriteMode", Transport::kP2p, [](Config& c) { c.p2pDirectDisable = 1; }},
        Variant{"NoSingleCopy", Transport::kP2p, [](Config& c) { c.p2pSingleCopy = -1; }},
        Variant{"AllLL", Transport::kP2p, [](Config& c) { c.p2pLlThreshold = 1 << 30; }},
        Variant{"AllSimple", Transport::kP2p, [](Config& c) { c.p2pLlThreshold = 0, c.p2pSingleCopy = -1; }},
        Variant{"SmallFifo", Transport::kShm, [](Config& c) { c.buffSize = 1 << 16, c.llBuffSize = 1 << 12; }},
        Variant{"ShmAllLL", Transport::kShm, [](Config& c) { c.p2pLlThreshold = 1 << 30; }},
        Variant{"NetHelperThreads", Transport::kNet, [](Config& c) { c.socketNthreads = 2, c.nsocksPerThread = 2; }},
        Variant{"NetSmallChunks", Transport::kNet, [](Config& c) { c.p2pPciChunkSize = 4096; }}),
    [](const auto& info) { return std::string(info.param.name); });

// A receive whose size or type differs from the send: both fail, naming both sides, and the connection is still
// usable for the next (matching) message. Pairs cover LL against Simple and one part against several. The FIFO's
// checks: the point-to-point mailboxes are off here (p2p_mailbox_test.cc checks theirs).
class Mismatch : public ::testing::TestWithParam<Transport> {};

TEST_P(Mismatch, BothSidesFailAndTheConnectionStaysUsable) {
  Transport tr = GetParam();
  struct Case {
    size_t sendCount;
    DataType sendType;
    size_t recvCount;
    DataType recvType;
  };
  const std::vector<Case> cases = {{8, DataType::kFloat32, 9, DataType::kFloat32},
                                   {8, DataType::kFloat32, 8, DataType::kInt32},
                                   {4, DataType::kInt8, 1 << 20, DataType::kInt8},
                                   {3u << 20, DataType::kInt8, 16, DataType::kInt8},
                                   {8u << 20, DataType::kFloat64, 1000, DataType::kFloat64},
                                   {0, DataType::kFloat32, 1, DataType::kFloat32}};
  std::vector<std::vector<std::string>> seen(2);
  auto errors = runRanks(
      2,
      [tr](int r, InitOptions& o) {
        force(tr, r, o.cfg);
        o.cfg.p2pMailboxMax = 0;
      },
      [&](Communicator& c, int r) {
        for (const Case& k : cases) {
          std::vector<uint8_t> buf(std::max(k.sendCount * sizeOf(k.sendType), k.recvCount * sizeOf(k.recvType)));
          try {
            if (r == 0) c.send(buf.data(), k.sendCount, k.sendType, 1);
            else c.recv(buf.data(), k.recvCount, k.recvType, 0);
            seen[r].push_back("no error");
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), StatusCode::kInvalidUsage) << e.what();
            seen[r].push_back(e.what());
          }
          // The same connection, now with matching sizes.
          if (allToAll(c, DataType::kInt32, 1000, 7) != 0) throw Error(StatusCode::kInternal, "data wrong after mismatch");
        }
      });
  expectNoErrors(errors);
  ASSERT_EQ(seen[0].size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    std::string s = fmt::format("{} x {}", k.sendCount, to_string(k.sendType));
    std::string v = fmt::format("{} x {}", k.recvCount, to_string(k.recvType));
    EXPECT_NE(seen[0][i].find("rank 0: send of " + s + " to rank 1"), std::string::npos) << seen[0][i];
    EXPECT_NE(seen[0][i].find("mismatch"), std::string::npos) << seen[0][i];
    EXPECT_NE(seen[0][i].find(v), std::string::npos) << seen[0][i];
    EXPECT_NE(seen[1][i].find("rank 1: recv of " + v + " from rank 0"), std::string::npos) << seen[1][i];
    EXPECT_NE(seen[1][i].find(s), std::string::npos) << seen[1][i];
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Mismatch, ::testing::Values(Transport::kP2p, Transport::kShm, Transport::kNet),
                         [](const auto& info) { return std::string(testing::name(info.param)); });

TEST(SelfSendRecv, CopiesAndChecksSizes) {
  auto errors = runRanks(
      1, [](int, InitOptions&) {},
      [](Communicator& c, int) {
        std::vector<int32_t> a = {1, 2, 3}, b(3, 0);
        groupStart();
        c.recv(b.data(), 3, DataType::kInt32, 0);
        c.send(a.data(), 3, DataType::kInt32, 0);
        groupEnd();
        EXPECT_EQ(a, b);
        groupStart();
        c.send(a.data(), 3, DataType::kInt32, 0);
        c.recv(b.data(), 2, DataType::kInt32, 0);
        EXPECT_THROW(groupEnd(), Error);
      });
  expectNoErrors(errors);
}

TEST(AsyncRequests, SendsFirstThenReceivesCompleteWithoutAGroup) {
  auto errors = runRanks(
      2, [](int r, InitOptions& o) { force(Transport::kP2p, r, o.cfg); },
      [](Communicator& c, int r) {
        std::vector<double> out(100000, r + 1.5), in(100000, 0);
        Request s = c.isend(out.data(), out.size(), DataType::kFloat64, 1 - r);
        c.recv(in.data(), in.size(), DataType::kFloat64, 1 - r);
        s.wait();
        EXPECT_EQ(in[99999], 2.5 - r);
        // Several in flight to the same peer complete in order.
        std::vector<int32_t> a(10), b(10, -1);
        std::vector<Request> reqs;
        for (int i = 0; i < 10; ++i) {
          a[i] = 100 * r + i;
          reqs.push_back(c.isend(&a[i], 1, DataType::kInt32, 1 - r));
          reqs.push_back(c.irecv(&b[i], 1, DataType::kInt32, 1 - r));
        }
        for (auto& q : reqs) q.wait();
        for (int i = 0; i < 10; ++i) EXPECT_EQ(b[i], 100 * (1 - r) + i);
      });
  expectNoErrors(errors);
}

TEST(Groups, OneThreadDrivesSeveralCommunicators) {
  // Two ranks' communicators created by two threads; then one thread groups operations of both (NCCL's
  // single-process multi-GPU pattern): connections are made in parallel, the group completes.
  auto comms = testing::initLocalComms(2);
  std::vector<float> x(5000, 1.f), y(5000, 2.f), gx(5000), gy(5000);
  groupStart();
  comms[0]->send(x.data(), x.size(), DataType::kFloat32, 1);
  comms[1]->recv(gx.data(), gx.size(), DataType::kFloat32, 0);
  comms[1]->send(y.data(), y.size(), DataType::kFloat32, 0);
  comms[0]->recv(gy.data(), gy.size(), DataType::kFloat32, 1);
  EXPECT_EQ(groupDepth(), 1);
  groupEnd();
  EXPECT_EQ(gx, x);
  EXPECT_EQ(gy, y);
}

TEST(Faults, AbortFromAnotherThreadUnblocksWaits) {
  std::atomic<bool> aborted{false};
  auto errors = runRanks(
      2, [](int r, InitOptions& o) { force(Transport::kShm, r, o.cfg); },
      [&](Communicator& c, int r) {
        c.connectAll();
        if (r == 1) {
          while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;
        }
        std::vector<int> buf(100);
        std::thread killer([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          c.abort();
        });
        auto t0 = Clock::now();
        try {
          c.recv(buf.data(), buf.size(), DataType::kInt32, 1);
          ADD_FAILURE() << "the receive completed";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), StatusCode::kAborted) << e.what();
        }
        EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
        killer.join();
        EXPECT_THROW(c.send(buf.data(), 1, DataType::kInt32, 1), Error);
        aborted = true;
      });
  expectNoErrors(errors);
}

// A group of `m` messages of `count` int32 over one connection (osu_bw's window; the FIFO, mailboxes off) runs
// inline in issue order (over NET the sends stream, each waiting for its own verdict): the receives at `bad` expect
// another size, both sides fail those only, every other message arrives, in order; then the connection works on.
// `async`: isend/irecv, waited for afterwards, instead of a group: the operations go through the engine's queues,
// where over NET the sends behind one that only waits for its acknowledgement stream too
// (Engine::progressStreaming); each refused message fails its two requests, no other. `ranks`: the job's size (the
// window stays between ranks 0 and 1; a third rank over NET makes three hosts, where the engine streams its NET
// sends by default: not between exactly two). `streams`: TOPOCOLL_NET_STREAMS (-1 the runtime's choice).
void windowWithMismatches(Transport tr, int m, size_t count, const std::vector<int>& bad, bool async = false,
                          int ranks = 2, int streams = -1) {
  std::vector<std::string> seen(ranks);
  auto isBad = [&](int i) { return std::find(bad.begin(), bad.end(), i) != bad.end(); };
  auto errors = runRanks(
      ranks,
      [tr, streams](int r, InitOptions& o) {
        force(tr, r, o.cfg);
        o.cfg.p2pMailboxMax = 0;
        o.cfg.netStreams = streams;
      },
      [&](Communicator& c, int r) {
        std::vector<std::vector<int32_t>> buf(m, std::vector<int32_t>(count + 1, -1));
        for (int i = 0; i < m; ++i)
          for (size_t j = 0; j < count && r == 0; ++j) buf[i][j] = static_cast<int32_t>(i * 100000 + j);
        if (r >= 2) {
          // not in the window
        } else if (async) {
          std::vector<Request> reqs;
          for (int i = 0; i < m; ++i)
            reqs.push_back(r == 0 ? c.isend(buf[i].data(), count, DataType::kInt32, 1)
                                  : c.irecv(buf[i].data(), isBad(i) ? count + 1 : count, DataType::kInt32, 0));
          for (int i = 0; i < m; ++i) {
            try {
              reqs[i].wait();
              if (isBad(i)) throw Error(StatusCode::kInternal, fmt::format("rank {}: message {} passed", r, i));
            } catch (const Error& e) {
              if (!isBad(i) || e.code() != StatusCode::kInvalidUsage ||
                  std::string(e.what()).find("mismatch") == std::string::npos)
                throw Error(StatusCode::kInternal, fmt::format("rank {}: message {}: {}", r, i, e.what()));
            }
          }
        } else {
          seen[r] = testing::groupError(
              [&] {
                for (int i = 0; i < m; ++i) {
                  if (r == 0) c.send(buf[i].data(), count, DataType::kInt32, 1);
                  else c.recv(buf[i].data(), isBad(i) ? count + 1 : count, DataType::kInt32, 0);
                }
              },
              StatusCode::kInvalidUsage);
        }
        if (r == 1)
          for (int i = 0; i < m; ++i)
            for (size_t j = 0; j < count && !isBad(i); ++j)
              if (buf[i][j] != static_cast<int32_t>(i * 100000 + j))
                throw Error(StatusCode::kInternal, fmt::format("message {} wrong at {}", i, j));
        if (allToAll(c, DataType::kInt32, 1000, 7) != 0) throw Error(StatusCode::kInternal, "data wrong afterwards");
      });
  expectNoErrors(errors);
  for (int r = 0; r < 2 && !async; ++r) {
    EXPECT_NE(seen[r].find("mismatch"), std::string::npos) << "rank " << r << ": " << seen[r];
    if (bad.size() == 1)
      EXPECT_EQ(seen[r].find("operations failed"), std::string::npos) << "only one fails: " << seen[r];
    else
      EXPECT_NE(seen[r].find(fmt::format("{} operations failed", bad.size())), std::string::npos)
          << "rank " << r << ": each bad one fails, no other: " << seen[r];
  }
}

class Window : public ::testing::TestWithParam<Transport> {};

TEST_P(Window, AMismatchInTheMiddleFailsOnlyItself) { windowWithMismatches(GetParam(), 12, 1000, {5}); }

// More messages than a connection keeps verdicts for (kStatusRing) and than its FIFO has slots, two refused in a
// row (over NET their verdicts come back in two acknowledgements, the first stopping short of the second's
// message), then others far apart; small messages (in the slot) and larger ones (sent from the user's buffer).
TEST_P(Window, EachOfSeveralMismatchesFailsItself) {
  windowWithMismatches(GetParam(), 40, 1000, {5, 6, 21, 37});
  windowWithMismatches(GetParam(), 24, 20000, {0, 1, 2, 17});
}

// EachOfSeveralMismatchesFailsItself's windows as isend/irecv, and one of larger messages with none refused.
TEST_P(Window, AsynchronousSendsEachMismatchFailsItself) {
  windowWithMismatches(GetParam(), 40, 1000, {5, 6, 21, 37}, true);
  windowWithMismatches(GetParam(), 24, 20000, {0, 1, 2, 17}, true);
  windowWithMismatches(GetParam(), 30, 70000, {}, true);
  if (GetParam() == Transport::kNet) {  // three hosts: the queued NET sends stream behind an unacknowledged one
    windowWithMismatches(GetParam(), 40, 1000, {5, 6, 21, 37}, true, 3);
    windowWithMismatches(GetParam(), 30, 70000, {}, true, 3);
  }
}

// TOPOCOLL_NET_STREAMS: between two hosts one or two sends move behind the unacknowledged one (the runtime streams
// none there by default), over three none; each refused message still fails itself only.
TEST(NetStreams, KnobSetsHowManySendsMoveBehindAnUnacknowledgedOne) {
  for (int streams : {1, 2}) {
    windowWithMismatches(Transport::kNet, 40, 1000, {5, 6, 21, 37}, true, 2, streams);
    windowWithMismatches(Transport::kNet, 30, 70000, {0, 29}, true, 2, streams);
  }
  windowWithMismatches(Transport::kNet, 40, 1000, {5, 6, 21, 37}, true, 3, 0);
}

// Both ranks in one group: a window of receives from the peer, then a window of sends to it (osu_bibw's order),
// longer than the sends may stream ahead of their oldest unacknowledged one: the streaming sends must keep moving
// while the receives are driven, or each rank waits for the other's sends.
TEST_P(Window, ReceivesFirstThenSendsBothWays) {
  const int m = 40;
  const size_t count = 500;
  auto errors = runRanks(
      2,
      [tr = GetParam()](int r, InitOptions& o) {
        force(tr, r, o.cfg);
        o.cfg.p2pMailboxMax = 0;
        o.cfg.timeoutSec = 20;
      },
      [&](Communicator& c, int r) {
        std::vector<std::vector<int32_t>> in(m, std::vector<int32_t>(count, -1)), out(m, std::vector<int32_t>(count));
        for (int i = 0; i < m; ++i)
          for (size_t j = 0; j < count; ++j) out[i][j] = static_cast<int32_t>(r * 1000000 + i * 1000 + j);
        for (int round = 0; round < 3; ++round) {
          groupStart();
          for (int i = 0; i < m; ++i) c.recv(in[i].data(), count, DataType::kInt32, 1 - r);
          for (int i = 0; i < m; ++i) c.send(out[i].data(), count, DataType::kInt32, 1 - r);
          groupEnd();
          for (int i = 0; i < m; ++i)
            for (size_t j = 0; j < count; ++j)
              if (in[i][j] != static_cast<int32_t>((1 - r) * 1000000 + i * 1000 + j))
                throw Error(StatusCode::kInternal, fmt::format("round {} message {} wrong at {}", round, i, j));
        }
      });
  expectNoErrors(errors);
}

// Over NET: the receiver holds the verdict of message 5 (one step each: its first step + 1 is 6) back until it
// refused message 6 too, so that both verdicts go back together: the first must come with an acknowledgement that
// stops short of message 6, or the sender would take message 6 as accepted before its verdict arrived.
TEST(Window, TwoVerdictsPendingAtOnceGoBackInOrder) {
  transport::test_hooks::netHoldAck = [](uint64_t ack, uint64_t status) { return status == 6 && ack < 7; };
  struct Unhook {
    ~Unhook() { transport::test_hooks::netHoldAck = nullptr; }
  } unhook;
  windowWithMismatches(Transport::kNet, 12, 1000, {5, 6});
}

// Over NET a send completes on the receiver's acknowledgement, and only once its own requests for the data completed
// too: the buffer is the network's until then (a plugin may report the send done after the peer has the bytes; the
// socket helpers are still in send() when the ack comes back). With the sender's proxy holding its completions
// back, the receive completes and is acknowledged while the send must not.
TEST(NetAck, ASendWaitsForItsOwnRequestsAfterTheReceiversAcknowledgement) {
  static std::atomic<bool> held{true};
  transport::test_hooks::netHoldSendDone = [](uint64_t) { return held.load(); };
  struct Unhook {
    ~Unhook() {
      transport::test_hooks::netHoldSendDone = nullptr;
      held = true;
    }
  } unhook;
  std::atomic<bool> received{false}, sent{false};
  const size_t count = 1 << 18;  // int32: 1 MiB, sent from the sender's buffer
  auto errors = runRanks(
      2,
      [](int r, InitOptions& o) {
        force(Transport::kNet, r, o.cfg);
        o.cfg.timeoutSec = 20;
      },
      [&](Communicator& c, int r) {
        c.connectAll();
        std::vector<int32_t> buf(count, r == 0 ? 7 : 0);
        if (r == 1) {
          c.recv(buf.data(), count, DataType::kInt32, 0);
          if (buf != std::vector<int32_t>(count, 7)) throw Error(StatusCode::kInternal, "the message arrived wrong");
          received = true;
          while (!sent.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // connections stay up
          return;
        }
        struct Release {  // rank 1 goes, whatever happens here
          std::atomic<bool>& sent;
          ~Release() { sent = true; }
        } release{sent};
        Request s = c.isend(buf.data(), count, DataType::kInt32, 1);
        while (!received.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        auto t0 = Clock::now();
        while (Clock::now() - t0 < std::chrono::milliseconds(300))
          if (s.test()) throw Error(StatusCode::kInternal, "the send completed before its own requests did");
        held = false;
        s.wait();
      });
  expectNoErrors(errors);
}

// Over NET a send completes on the receiver's acknowledgement. A message that lands in the receiver's posted buffer is
// acknowledged as it arrives, not when the receiver's engine gets to look (it may be reducing the previous slice):
// with the engine's acknowledgements hidden from its proxy, three 1 MiB sends to posted receives complete, and a
// small one (it travels in the FIFO slot, for the engine to copy) waits until they show again.
TEST(NetAck, AMessageThatLandsInAPostedBufferIsAcknowledgedWithoutTheReceiversEngine) {
  static std::atomic<bool> hidden{false};
  transport::test_hooks::netEngineAck = [](uint64_t ack) { return hidden.load() ? uint64_t{0} : ack; };
  struct Unhook {
    ~Unhook() {
      transport::test_hooks::netEngineAck = nullptr;
      hidden = false;
    }
  } unhook;
  std::atomic<int> posted{0};
  const size_t big = 1 << 18;  // int32: 1 MiB, more than a FIFO slot
  auto errors = runRanks(
      2,
      [](int r, InitOptions& o) {
        force(Transport::kNet, r, o.cfg);
        o.cfg.p2pMailboxMax = 0;
        o.cfg.timeoutSec = 20;
      },
      [&](Communicator& c, int r) {
        c.connectAll();
        std::vector<std::vector<int32_t>> buf(3, std::vector<int32_t>(big, r == 0 ? 5 : 0));
        std::vector<int32_t> small(100, r == 0 ? 9 : 0);
        if (r == 1) {
          for (int i = 0; i < 3; ++i) {
            Request q = c.irecv(buf[i].data(), big, DataType::kInt32, 0);
            posted = i + 1;
            q.wait();
            if (buf[i] != std::vector<int32_t>(big, 5)) throw Error(StatusCode::kInternal, "a large message arrived wrong");
          }
          c.recv(small.data(), small.size(), DataType::kInt32, 0);
          if (small != std::vector<int32_t>(100, 9)) throw Error(StatusCode::kInternal, "the small message is wrong");
          return;
        }
        hidden = true;
        for (int i = 0; i < 3; ++i) {
          while (posted.load() <= i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the receive is posted to rank 1's proxy
          c.send(buf[i].data(), big, DataType::kInt32, 1);
        }
        Request s = c.isend(small.data(), small.size(), DataType::kInt32, 1);
        auto t0 = Clock::now();
        while (Clock::now() - t0 < std::chrono::milliseconds(300))
          if (s.test()) throw Error(StatusCode::kInternal, "the small send completed without the engine's ack");
        hidden = false;
        s.wait();
      });
  expectNoErrors(errors);
}

// A sender whose message landed in the receiver's posted buffer is acknowledged as it lands, so it may finish,
// destroy its communicator and close the connection before the receiver's engine looks again. The receive still
// completes with the data, and the next one from that rank fails, naming the lost connection (the interleaving
// itself, held still: PostedReceive.CompletesWhenTheConnectionBrokeAfterItsMessage in tests/transport).
TEST(NetAck, AReceiveCompletesWhenItsSenderClosedAfterTheWholeMessage) {
  std::atomic<bool> closed{false};
  const size_t big = 1 << 18;  // int32: 1 MiB, more than a FIFO slot: it lands in the posted buffer
  bootstrap::Options bo;
  bo.timeout = std::chrono::seconds(60);
  auto group = bootstrap::makeInMemoryGroup(2, bo);
  std::string errors[2];
  std::atomic<bool> connected[2] = {false, false};
  auto rank = [&](int r) {
    try {
      InitOptions o;
      force(Transport::kNet, r, o.cfg);
      o.cfg.p2pMailboxMax = 0;
      o.cfg.timeoutSec = 20;
      o.bootstrap = bo;
      auto c = Communicator::initWithBootstrap(std::move(group[r]), o);
      c->connectAll();
      connected[r] = true;
      while (!connected[0] || !connected[1]) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::vector<int32_t> buf(big, r == 0 ? 7 : 0);
      if (r == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 1's receive is posted
        c->send(buf.data(), big, DataType::kInt32, 1);
        c.reset();  // the connections close
        closed = true;
        return;
      }
      Request q = c->irecv(buf.data(), big, DataType::kInt32, 0);
      while (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // our proxy sees the close
      q.wait();
      if (buf != std::vector<int32_t>(big, 7)) throw Error(StatusCode::kInternal, "the message arrived wrong");
      expectError([&] { c->recv(buf.data(), big, DataType::kInt32, 0); }, StatusCode::kRemoteError,
                  "network connection from rank 0");
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  EXPECT_TRUE(closed.load());
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

INSTANTIATE_TEST_SUITE_P(Transports, Window, ::testing::Values(Transport::kP2p, Transport::kShm, Transport::kNet),
                         [](const auto& info) { return std::string(testing::name(info.param)); });

// `nRanks` ranks with TOPOCOLL_TIMEOUT `timeoutSec`: ranks 1.. connect and then stay silent until rank 0's `body`
// returned; the time `body` took must stay under `within` (generous: sanitizer builds run several times slower).
void silentPeer(const std::function<void(int, InitOptions&)>& configure, double timeoutSec,
                std::chrono::seconds within, const std::function<void(Communicator&)>& body, int nRanks = 2) {
  std::atomic<bool> done{false};
  auto errors = runRanks(
      nRanks,
      [&](int r, InitOptions& o) {
        configure(r, o);
        o.cfg.timeoutSec = timeoutSec;
      },
      [&](Communicator& c, int r) {
        c.connectAll();
        if (r > 0) {
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;
        }
        struct Release {  // the silent ranks go, whatever body does
          std::atomic<bool>& done;
          ~Release() { done = true; }
        } release{done};
        auto t0 = Clock::now();
        body(c);
        EXPECT_LT(Clock::now() - t0, within);
      });
  expectNoErrors(errors);
}

// A group of receives over one connection from a peer that sends nothing: the first times out, the others fail
// with it at once (not one timeout each: 8 s here).
TEST(Faults, AWindowOfReceivesFromASilentPeerFailsWithinOneTimeout) {
  silentPeer(
      [](int r, InitOptions& o) {
        force(Transport::kShm, r, o.cfg);
        o.cfg.p2pMailboxMax = 0;
      },
      1.0, std::chrono::seconds(6), [](Communicator& c) {
        std::vector<int32_t> x(8 * 100);
        try {
          groupStart();
          for (int i = 0; i < 8; ++i) c.recv(x.data() + 100 * i, 100, DataType::kInt32, 1);
          groupEnd();
          ADD_FAILURE() << "the receives completed";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), StatusCode::kTimeout) << e.what();
          EXPECT_NE(std::string(e.what()).find("8 operations failed"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("an earlier operation over this connection failed"), std::string::npos)
              << e.what();
        }
      });
}

// A group of receives from four silent peers, each over its own connection and driven one after another: the
// group fails within one timeout (1 s here), not one per connection (4 s), naming a silent peer.
TEST(Faults, AGroupOverSeveralSilentConnectionsFailsWithinOneTimeout) {
  silentPeer(
      [](int r, InitOptions& o) {
        force(Transport::kShm, r, o.cfg);
        o.cfg.p2pMailboxMax = 0;
      },
      1.0, std::chrono::seconds(3),
      [](Communicator& c) {
        std::vector<int32_t> x(4 * 100);
        try {
          groupStart();
          for (int p = 1; p <= 4; ++p) c.recv(x.data() + 100 * (p - 1), 100, DataType::kInt32, p);
          groupEnd();
          ADD_FAILURE() << "the receives completed";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), StatusCode::kTimeout) << e.what();
          EXPECT_NE(std::string(e.what()).find("4 operations failed"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("did not move"), std::string::npos) << e.what();
        }
      },
      5);
}

TEST(Faults, AReceiveWithoutSenderTimesOutNamingThePeer) {
  silentPeer([](int r, InitOptions& o) { force(Transport::kP2p, r, o.cfg); }, 0.5, std::chrono::seconds(5),
             [](Communicator& c) {
               int x = 0;
               try {
                 c.recv(&x, 1, DataType::kInt32, 1);
                 ADD_FAILURE() << "the receive completed";
               } catch (const Error& e) {
                 EXPECT_EQ(e.code(), StatusCode::kTimeout);
                 EXPECT_NE(std::string(e.what()).find("rank 1 did not move"), std::string::npos) << e.what();
                 EXPECT_NE(std::string(e.what()).find("rank 0: recv of 1 x int32 from rank 1"), std::string::npos)
                     << e.what();
               }
             });
}

TEST(Faults, ASendThatTimedOutTakesItsBufferBack) {
  // Read mode: the sender offers its buffer for the receiver to copy from. After the send timed out, the buffer is
  // the user's again (here overwritten): a receive posted late must fail, not copy from it.
  std::atomic<bool> sent{false}, done{false};
  auto errors = runRanks(
      2,
      [](int r, InitOptions& o) {
        force(Transport::kP2p, r, o.cfg);
        o.cfg.timeoutSec = 0.5;
        o.cfg.p2pReadEnable = 1;
        o.cfg.p2pSingleCopy = 4096;
        o.cfg.p2pLlThreshold = 0;
      },
      [&](Communicator& c, int r) {
        c.connectAll();
        std::vector<int32_t> buf(4096, r == 0 ? 7 : 0);  // 16 KiB: one part, a single copy
        if (r == 0) {
          EXPECT_THROW(c.send(buf.data(), buf.size(), DataType::kInt32, 1), Error);
          std::fill(buf.begin(), buf.end(), -1);
          sent = true;
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;
        }
        while (!sent.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        try {
          c.recv(buf.data(), buf.size(), DataType::kInt32, 0);
          ADD_FAILURE() << "the receive copied from a buffer the sender had taken back: " << buf[0];
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("the sender gave up on this transfer"), std::string::npos) << e.what();
        }
        done = true;
      });
  expectNoErrors(errors);
}

TEST(BadInput, ClearErrors) {
  auto errors = runRanks(
      2, [](int r, InitOptions& o) { force(Transport::kP2p, r, o.cfg); },
      [](Communicator& c, int r) {
        int x = 0;
        expectError([&] { c.send(&x, 1, DataType::kInt32, 2); }, StatusCode::kInvalidArgument, "no such rank");
        expectError([&] { c.recv(&x, 1, DataType::kInt32, -1); }, StatusCode::kInvalidArgument, "no such rank");
        expectError([&] { c.send(nullptr, 4, DataType::kInt32, 1 - r); }, StatusCode::kInvalidArgument, "null buffer");
        expectError([&] { c.send(&x, 1, static_cast<DataType>(42), 1 - r); }, StatusCode::kInvalidArgument,
                    "unknown data type");
        expectError([&] { c.send(&x, SIZE_MAX / 2, DataType::kInt64, 1 - r); }, StatusCode::kInvalidArgument,
                    "overflows");
        const int self[] = {r}, outside[] = {1 - r, 2};  // receives from any rank
        expectError([&] { c.recvAny(&x, 1, DataType::kInt32, self, 1); }, StatusCode::kInvalidArgument,
                    "is this rank");
        expectError([&] { c.recvAny(&x, 1, DataType::kInt32, outside, 2); }, StatusCode::kInvalidArgument,
                    "rank 2 (peers[1]) is not in the communicator");
        expectError([&] { c.recvAny(&x, 1, DataType::kInt32, outside, 0); }, StatusCode::kInvalidArgument,
                    "at least one rank");
        groupStart();
        expectError([&] { c.recvAny(&x, 1, DataType::kInt32, outside, 1); }, StatusCode::kInvalidUsage,
                    "cannot join a group");
        groupEnd();
        expectError([] { groupEnd(); }, StatusCode::kInvalidUsage, "without groupStart");
        groupStart();
        Request q = c.isend(&x, 1, DataType::kInt32, 1 - r);
        expectError([&] { q.wait(); }, StatusCode::kInvalidUsage, "groupEnd() first");
        c.recv(&x, 1, DataType::kInt32, 1 - r);
        groupEnd();
        q.wait();
      });
  expectNoErrors(errors);
}

TEST(Connections, EachTransportSaysHowItConnects) {
  for (Transport tr : {Transport::kP2p, Transport::kShm, Transport::kNet}) {
    std::vector<std::vector<ConnectionInfo>> conns(2);
    auto errors = runRanks(
        2, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
        [&](Communicator& c, int r) {
          c.connectAll();
          conns[r] = c.connections();
        });
    expectNoErrors(errors);
    const char* expect = tr == Transport::kP2p ? "P2P/direct pointer" : tr == Transport::kShm ? "SHM/direct" : "NET/Socket/0";
    ASSERT_FALSE(conns[0].empty());
    bool p2pIndex = false;
    for (auto& ci : conns[0]) {
      EXPECT_EQ(ci.via, expect);
      EXPECT_EQ(ci.peer, 1);
      p2pIndex |= ci.connIndex == 1;
    }
    EXPECT_TRUE(p2pIndex) << "no point-to-point connection";
  }
}

TEST(Leaks, NoDescriptorOrThreadOutlivesTheCommunicators) {
  // A first round creates the process-wide state (the logger's file, the doorbell is per communicator group).
  for (int round = 0; round < 2; ++round) {
    int fds = testing::countEntries("/proc/self/fd"), threads = testing::countEntries("/proc/self/task");
    for (Transport tr : {Transport::kP2p, Transport::kShm, Transport::kNet}) {
      auto errors = runRanks(
          3, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
          [](Communicator& c, int) {
            if (allToAll(c, DataType::kInt32, 5000, 3)) throw Error(StatusCode::kInternal, "wrong data");
          });
      expectNoErrors(errors);
      // A communicator that failed (a receive aborted while waiting) releases everything too.
      errors = runRanks(
          2, [tr](int r, InitOptions& o) { force(tr, r, o.cfg); },
          [](Communicator& c, int r) {
            c.connectAll();
            int x = 0;
            Request q = c.irecv(&x, 1, DataType::kInt32, 1 - r);
            c.abort();
            EXPECT_THROW(q.wait(), Error);
          });
      expectNoErrors(errors);
    }
    if (round == 1) {
      EXPECT_EQ(testing::countEntries("/proc/self/fd"), fds);
      EXPECT_EQ(testing::countEntries("/proc/self/task"), threads);
    }
  }
}

}  // namespace
}  // namespace topocoll::runtime
