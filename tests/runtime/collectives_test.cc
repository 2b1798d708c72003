// Collectives over threads of one process (in-memory bootstrap): every collective x type x op x size x in/out of
// place, for 1-8 ranks and each algorithm/protocol forced, against a serial reference; asynchronous issue, groups,
// mismatches, abort.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <span>
#include <thread>

#include "collectives/coll_check.h"
#include "runtime/ranks.h"
#include "transport/test_hooks.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "topocoll/tuning/host_policy.h"

namespace topocoll {
namespace {

using collectives::Coll;
using runtime::Communicator;
using testing::makeInput;
using testing::reference;
using testing::runRanks;

using testing::kOps;
using testing::kTypes;

// Runs `coll` once on every rank and checks the result; returns "" or what differs.
std::string checkOne(Communicator& c, Coll coll, DataType t, RedOp op, size_t count, bool inPlace, int root) {
  int n = c.nRanks(), r = c.rank();
  size_t es = sizeOf(t), bytes = count * es;
  std::vector<char> out(bytes * n + 1, 0x5a);
  std::vector<char> in;
  std::vector<char> want;
  switch (coll) {
    case Coll::kAllReduce: {
      in = makeInput(t, op, r, count);
      want = reference(t, op, n, count);
      if (inPlace) std::memcpy(out.data(), in.data(), bytes);
      c.allReduce(inPlace ? out.data() : in.data(), out.data(), count, t, op);
      break;
    }
    case Coll::kReduce: {
      in = makeInput(t, op, r, count);
      want = reference(t, op, n, count);
      if (inPlace) std::memcpy(out.data(), in.data(), bytes);
      c.reduce(inPlace ? out.data() : in.data(), out.data(), count, t, op, root);
      if (r != root) return "";
      break;
    }
    case Coll::kBroadcast: {
      in = makeInput(t, RedOp::kMax, root + 3, count);
      want = in;
      if (inPlace && r == root) std::memcpy(out.data(), in.data(), bytes);
      c.broadcast(inPlace ? out.data() : in.data(), out.data(), count, t, root);
      break;
    }
    case Coll::kAllGather: {
      in = makeInput(t, RedOp::kMax, r + 1, count);
      want.resize(bytes * n);
      for (int q = 0; q < n; ++q) {
        auto v = makeInput(t, RedOp::kMax, q + 1, count);
        if (bytes) std::memcpy(want.data() + q * bytes, v.data(), bytes);
      }
      if (inPlace && bytes) std::memcpy(out.data() + r * bytes, in.data(), bytes);
      c.allGather(inPlace ? out.data() + r * bytes : in.data(), out.data(), count, t);
      count *= n;
      break;
    }
    case Coll::kReduceScatter: {
      in = makeInput(t, op, r, count * n);
      auto all = reference(t, op, n, count * n);
      want.assign(all.begin() + static_cast<long>(r * bytes), all.begin() + static_cast<long>((r + 1) * bytes));
      if (inPlace) std::memcpy(out.data(), in.data(), bytes * n);
      c.reduceScatter(inPlace ? out.data() : in.data(), inPlace ? out.data() + r * bytes : out.data(), count, t, op);
      if (inPlace && bytes) std::memmove(out.data(), out.data() + r * bytes, bytes);
      break;
    }
  }
  long long d = testing::firstDiff(out.data(), want.data(), count, t);
  if (d >= 0)
    return fmt::format("{} {} {} count {} {} root {}: element {} differs", collectives::collName(coll), to_string(t),
                       to_string(op), count, inPlace ? "in place" : "out of place", root, d);
  return "";
}

struct Forced {
  const char* algo;
  const char* proto;
};

// Every collective, type and op at sizes {0, 1, 7, 1023}; 1 MiB + 3 elements for a sample of types.
void checkAll(Communicator& c, int seed) {
  const size_t small[] = {0, 1, 7, 1023};
  for (Coll coll : {Coll::kAllReduce, Coll::kReduce, Coll::kBroadcast, Coll::kAllGather, Coll::kReduceScatter}) {
    bool reduces = coll != Coll::kBroadcast && coll != Coll::kAllGather;
    for (DataType t : kTypes)
      for (RedOp op : kOps) {
        if (!reduces && op != RedOp::kSum) continue;
        for (size_t count : small)
          for (bool inPlace : {false, true}) {
            int root = (seed + static_cast<int>(count)) % c.nRanks();
            std::string e = checkOne(c, coll, t, op, count, inPlace, root);
            if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", c.rank(), e);
          }
      }
    for (DataType t : {DataType::kFloat32, DataType::kInt8, DataType::kBfloat16}) {
      size_t count = (size_t{1} << 20) / sizeOf(t) + 3;
      std::string e = checkOne(c, coll, t, reduces ? RedOp::kSum : RedOp::kSum, count, seed % 2, seed % c.nRanks());
      if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", c.rank(), e);
    }
  }
}

class Collectives : public ::testing::TestWithParam<std::tuple<int, Forced>> {};

TEST_P(Collectives, MatchTheSerialReference) {
  int n = std::get<0>(GetParam());
  Forced forced = std::get<1>(GetParam());
  auto errors = runRanks(
      n,
      [&](int, runtime::InitOptions& o) {
        o.cfg.hostId = "one-host";
        o.cfg.algo = forced.algo;
        o.cfg.proto = forced.proto;
      },
      [&](Communicator& c, int) { checkAll(c, n); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndAlgorithms, Collectives,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(Forced{"", ""}, Forced{"ring", "simple"}, Forced{"ring", "ll"},
                                         Forced{"tree", "simple"}, Forced{"tree", "ll"})),
    [](const auto& info) {
      auto f = std::get<1>(info.param);
      std::string name = std::to_string(std::get<0>(info.param)) + "ranks_" + (*f.algo ? f.algo : "auto") + "_" +
                         (*f.proto ? f.proto : "auto");
      return name;
    });

// The tree across two hosts (each rank's host named; NET between them) with two channels asked for and one
// point-to-point connector per peer, which channels would share there: the tree runs one channel across hosts,
// and every AllReduce of several chunks (512 KiB across hosts) matches the serial reference, in and out of place.
TEST(Collectives, TreeAcrossTwoHostsMatchesTheSerialReference) {
  const int n = 4;
  auto errors = runRanks(
      n,
      [&](int r, runtime::InitOptions& o) {
        o.cfg.hostId = "tree-host" + std::to_string(r / 2);
        o.cfg.algo = "tree";
        o.cfg.proto = "simple";
        o.cfg.minNchannels = 2;
        o.cfg.maxP2pNchannels = 1;
      },
      [&](Communicator& c, int) {
        for (size_t count : {size_t{1}, size_t{1000}, (size_t{3} << 20) / 4 + 5})
          for (bool inPlace : {false, true}) {
            std::string e = checkOne(c, Coll::kAllReduce, DataType::kFloat32, RedOp::kSum, count, inPlace, 0);
            if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", c.rank(), e);
          }
      });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The tree in place between two hosts, one chunk (512 KiB): the child sends its next call's chunk up before the root
// posts that receive, so the root's connection has read the header and waits for the receive's buffer. Posting it
// must count as progress for the caller that holds the connection: it then moves the connection again rather than
// sleeping in poll() for a slice (20 ms a call, every call, before). A slept slice means nothing arrived and
// nothing could go on; here the data is always on its way (before: 76 slept slices in 40 calls; a loaded machine,
// a sanitizer, may still sleep a few).
std::atomic<int> gSleptSlices{0};

TEST(Collectives, TreeInPlaceAcrossTwoHostsNeverWaitsForASliceItHasTheDataFor) {
  transport::test_hooks::callerPollSlept = [] { gSleptSlices.fetch_add(1, std::memory_order_relaxed); };
  struct Unhook {
    ~Unhook() { transport::test_hooks::callerPollSlept = nullptr; }
  } unhook;
  gSleptSlices = 0;
  constexpr int kCalls = 40;
  auto errors = runRanks(
      2,
      [&](int r, runtime::InitOptions& o) {
        o.cfg.hostId = "tree-host" + std::to_string(r);
        o.cfg.algo = "tree";
        o.cfg.proto = "simple";
      },
      [&](Communicator& c, int r) {
        std::vector<float> v((512 << 10) / sizeof(float), 1.0f);
        for (int i = 0; i < kCalls; ++i) c.allReduce(v.data(), v.data(), v.size(), DataType::kFloat32, RedOp::kSum);
        // 1 doubled 40 times: exact in float.
        const float want = static_cast<float>(1ull << kCalls);
        for (size_t i = 0; i < v.size(); i += 4099)
          if (v[i] != want) fail(StatusCode::kInternal, "rank {}: element {} is {}, not {}", r, i, v[i], want);
      });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_LE(gSleptSlices.load(), kCalls / 2) << "poll slices slept through in " << kCalls << " calls";
}

// DirectSplit (every rank reduces its split of everybody's data) forced at every size through its knobs, with the
// default chunk and with 4 KiB chunks (NCCL_BUFFSIZE 64 KiB: many slices, uneven last pieces, for the ring's sliced
// reduce-scatter of AllReduce and ReduceScatter too).
class DirectSplit : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(DirectSplit, MatchesTheSerialReference) {
  int n = std::get<0>(GetParam());
  bool smallChunks = std::get<1>(GetParam());
  auto errors = runRanks(
      n,
      [&](int, runtime::InitOptions& o) {
        o.cfg.hostId = "one-host";
        o.cfg.directMax = -1;
        o.cfg.directSplitMin = 0;
        o.cfg.directSplitRanks = 1;
        if (smallChunks) o.cfg.buffSize = 1 << 16;
      },
      [&](Communicator& c, int) { checkAll(c, n + 1); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, DirectSplit, ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks" +
                                  (std::get<1>(info.param) ? "_4KiBchunks" : "");
                         });

// The one-shot path (mailboxes, oneshot.cc) forced on up to its largest size and off: every collective, type and op at
// counts below and just above the limit, in and out of place, every root; many calls in a row (the mailboxes' slots
// and a broadcast root running ahead of its peers). Exact against the serial reference either way.
class OneShot : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(OneShot, OnAndOffMatchTheSerialReference) {
  int n = std::get<0>(GetParam());
  bool on = std::get<1>(GetParam());
  auto errors = runRanks(
      n,
      [&](int, runtime::InitOptions& o) {
        o.cfg.hostId = "one-host";
        o.cfg.oneShotMax = on ? 256 : 0;
      },
      [&](Communicator& c, int) {
        for (Coll coll : {Coll::kAllReduce, Coll::kReduce, Coll::kBroadcast, Coll::kAllGather, Coll::kReduceScatter}) {
          bool reduces = coll != Coll::kBroadcast && coll != Coll::kAllGather;
          for (DataType t : kTypes)
            for (RedOp op : kOps) {
              if (!reduces && op != RedOp::kSum) continue;
              size_t limit = 256 / sizeOf(t);
              for (size_t count : {size_t{1}, size_t{3}, limit, limit + 1})
                for (bool inPlace : {false, true}) {
                  int root = static_cast<int>(count + static_cast<size_t>(op)) % n;
                  std::string e = checkOne(c, coll, t, op, count, inPlace, root);
                  if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", c.rank(), e);
                }
            }
        }
        for (int i = 0; i < 50; ++i) {  // a root that only sends runs ahead by the mailbox's slots
          std::string e = checkOne(c, Coll::kBroadcast, DataType::kInt32, RedOp::kSum, 5, false, 0);
          if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", c.rank(), e);
        }
      });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, OneShot, ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::get<1>(info.param) ? "on" : "off");
                         });

// Both ranks of a one-shot collective whose sizes or types differ fail naming the other's call; the mailboxes stay in
// step, so the next collective works.
TEST(OneShotFaults, MismatchesFailOnBothRanksAndTheNextCallWorks) {
  auto errors = runRanks(
      3, [](int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; },
      [](Communicator& c, int r) {
        auto expectMismatch = [&](auto f, const char* what) {
          try {
            f();
          } catch (const Error& e) {
            if (e.code() == StatusCode::kInvalidUsage &&
                std::string(e.what()).find("size or type mismatch") != std::string::npos &&
                std::string(e.what()).find(what) != std::string::npos)
              return;
            throw;
          }
          fail(StatusCode::kInternal, "rank {}: no error for {}", r, what);
        };
        float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8];
        expectMismatch([&] { c.allReduce(a, b, r == 0 ? 2 : 4, DataType::kFloat32, RedOp::kSum); }, "bytes per peer");
        expectMismatch([&] { c.allReduce(a, b, 2, r == 1 ? DataType::kInt32 : DataType::kFloat32, RedOp::kSum); },
                       "AllReduce");
        if (r == 2) expectMismatch([&] { c.allGather(a, b, 1, DataType::kFloat32); }, "AllGather");
        else expectMismatch([&] { c.allReduce(a, b, 1, DataType::kFloat32, RedOp::kSum); }, "AllGather");
        int32_t x = r + 1, y = 0;
        c.allReduce(&x, &y, 1, DataType::kInt32, RedOp::kSum);
        if (y != 6) fail(StatusCode::kInternal, "rank {}: {} after the mismatches", r, y);
      });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Calls whose message patterns differ (a Broadcast root against an AllReduce) leave the root's mailboxes with messages
// it never read: they are numbered by call, so the next call skips them (with a warning) and takes its own; every
// rank gets the right result, and so does the call after it.
TEST(OneShotFaults, MessagesLeftByAMismatchedCallAreSkippedNotTaken) {
  auto errors = runRanks(
      3, [](int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; },
      [](Communicator& c, int r) {
        float a[2] = {1, 2}, b[2];
        try {
          if (r == 0) c.broadcast(a, b, 2, DataType::kFloat32, 0);
          else c.allReduce(a, b, 2, DataType::kFloat32, RedOp::kSum);
          if (r != 0) fail(StatusCode::kInternal, "rank {}: no error for the mismatched call", r);
        } catch (const Error& e) {
          if (r == 0 || e.code() != StatusCode::kInvalidUsage) throw;
        }
        for (int i = 0; i < 2; ++i) {
          int32_t x = r + 1 + i, y = 0;
          c.allReduce(&x, &y, 1, DataType::kInt32, RedOp::kSum);
          if (y != 6 + 3 * i) fail(StatusCode::kInternal, "rank {}: {} after the mismatch (call {})", r, y, i);
        }
      });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// An output that overlaps the input without being it (shifted by one element, either way) still gets the sum of the
// inputs as they were, on every rank, rank 0 included.
TEST(OneShot, OutputsOverlappingTheInputGetTheSum) {
  for (int shift : {1, -1}) {
    auto errors = runRanks(
        3, [](int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; },
        [shift](Communicator& c, int r) {
          int32_t buf[8] = {};
          int32_t* in = buf + 2;
          for (int i = 0; i < 4; ++i) in[i] = (r + 1) * (i + 1);
          c.allReduce(in, in + shift, 4, DataType::kInt32, RedOp::kSum);
          for (int i = 0; i < 4; ++i)
            if (in[shift + i] != 6 * (i + 1))
              fail(StatusCode::kInternal, "rank {}, shift {}: element {} is {}", r, shift, i, in[shift + i]);
        });
    for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "shift " << shift << ", rank " << r;
  }
}

// Ranks of one host connected over NET (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1) have no mailboxes: the ranks agree at
// the first small call to leave OneShot off, and every small collective runs on the engine instead.
TEST(OneShot, OffWhenTheConnectionsHaveNoMailboxes) {
  for (int n : {2, 3}) {
    auto errors = runRanks(
        n,
        [](int, runtime::InitOptions& o) {
          o.cfg.hostId = "one-host";
          o.cfg.p2pDisable = 1;
          o.cfg.p2pLevel = 0;  // what Config::fromEnv makes of NCCL_P2P_DISABLE=1
          o.cfg.shmDisable = 1;
        },
        [n](Communicator& c, int r) {
          for (int i = 0; i < 3; ++i) {
            int32_t x[2] = {r + 1, i}, y[2] = {0, 0};
            c.allReduce(x, y, 2, DataType::kInt32, RedOp::kSum);
            if (y[0] != n * (n + 1) / 2 || y[1] != n * i) fail(StatusCode::kInternal, "rank {}: {} {}", r, y[0], y[1]);
            int32_t g[4] = {};
            c.allGather(&x[0], g, 1, DataType::kInt32);
            for (int q = 0; q < n; ++q)
              if (g[q] != q + 1) fail(StatusCode::kInternal, "rank {}: allGather[{}] = {}", r, q, g[q]);
          }
          if (c.connections().empty()) fail(StatusCode::kInternal, "no connections");
          for (const auto& ci : c.connections())
            if (ci.via.rfind("NET", 0) != 0) fail(StatusCode::kInternal, "rank {}: a connection via {}", r, ci.via);
        });
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << n << " ranks, rank " << r;
  }
}

// A rank waiting in a one-shot collective for a peer that never calls it: abort from another thread unblocks it;
// without abort it fails at TOPOCOLL_TIMEOUT naming the peer.
TEST(OneShotFaults, AbortAndTimeoutEndTheWait) {
  for (bool abortIt : {true, false}) {
    auto errors = runRanks(
        2,
        [](int, runtime::InitOptions& o) {
          o.cfg.hostId = "one-host";
          o.cfg.timeoutSec = 1;
        },
        [&](Communicator& c, int r) {
          int32_t x = 1, y = 0;
          c.allReduce(&x, &y, 1, DataType::kInt32, RedOp::kSum);  // connects (a bootstrap exchange)
          if (r == 1) return;  // never joins the next one
          std::thread aborter;
          if (abortIt) aborter = std::thread([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            c.abort();
          });
          try {
            c.allReduce(&x, &y, 1, DataType::kInt32, RedOp::kSum);
          } catch (const Error& e) {
            if (aborter.joinable()) aborter.join();
            auto want = abortIt ? StatusCode::kAborted : StatusCode::kTimeout;
            if (e.code() != want || (!abortIt && std::string(e.what()).find("rank 1") == std::string::npos)) throw;
            if (abortIt) return;
            try {  // the mailboxes are out of step now: later calls fail at once
              c.allReduce(&x, &y, 1, DataType::kInt32, RedOp::kSum);
            } catch (const Error& again) {
              if (again.code() == StatusCode::kRemoteError &&
                  std::string(again.what()).find("broken") != std::string::npos)
                return;
              throw;
            }
            fail(StatusCode::kInternal, "the call after the timeout returned");
          }
          if (aborter.joinable()) aborter.join();
          fail(StatusCode::kInternal, "the collective returned");
        });
    EXPECT_EQ(errors[0], "") << (abortIt ? "abort" : "timeout");
  }
}

TEST(Collectives8, EightRanksEveryAlgorithm) {
  for (Forced f : {Forced{"", ""}, Forced{"ring", "simple"}, Forced{"tree", "simple"}, Forced{"split", ""}}) {
    auto errors = runRanks(
        8,
        [&](int, runtime::InitOptions& o) {
          o.cfg.hostId = "one-host";
          bool split = std::string(f.algo) == "split";  // DirectSplit at every size
          o.cfg.algo = split ? "" : f.algo;
          o.cfg.proto = f.proto;
          if (split) o.cfg.directMax = -1, o.cfg.directSplitMin = 0;
        },
        [&](Communicator& c, int r) {
          for (Coll coll : {Coll::kAllReduce, Coll::kReduce, Coll::kBroadcast, Coll::kAllGather, Coll::kReduceScatter})
            for (DataType t : {DataType::kFloat32, DataType::kInt64, DataType::kFloat16})
              for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, (size_t{1} << 18) + 3})
                for (bool inPlace : {false, true}) {
                  // Three types with the auto choice; the forced algorithms move bytes the same way for each.
                  if (f.algo[0] != '\0' && t != DataType::kFloat32) continue;
                  std::string e = checkOne(c, coll, t, RedOp::kSum, count, inPlace, static_cast<int>(count % 8));
                  if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", r, e);
                }
        });
    for (int r = 0; r < 8; ++r) EXPECT_EQ(errors[r], "") << f.algo << " rank " << r;
  }
}

// A 2-rank collective that takes single copies out of the peer's buffers piece by piece from `minBytes` (of count):
// every type and op just past the threshold (in place and out of place in turn), float32 just below, at and far past
// it (uneven last pieces), in place and out of place, auto and forced Ring (LL and Simple), P2P (direct pointers) and
// SHM (single copies), 1 and 4 channels; NCCL_MAX_NCHANNELS=1 leaves one connector (the ring's FIFO steps instead).
void checkPair(Coll coll, size_t minBytes) {
  struct Case {
    const char* algo;
    const char* proto;
    int minChannels, maxChannels;
  };
  for (Case k : {Case{"", "", 0, 0}, Case{"ring", "ll", 4, 0}, Case{"ring", "simple", 0, 1}}) {
    for (bool direct : {false, true}) {
      auto errors = runRanks(
          2,
          [&](int r, runtime::InitOptions& o) {
            if (direct) o.cfg.hostId = "one-host";
            else testing::force(testing::Transport::kShm, r, o.cfg);
            o.cfg.algo = k.algo;
            o.cfg.proto = k.proto;
            o.cfg.minNchannels = k.minChannels;
            if (k.maxChannels) o.cfg.maxNchannels = k.maxChannels;
          },
          [&](Communicator& c, int r) {
            bool inPlace = false;
            for (DataType t : kTypes)
              for (RedOp op : kOps) {
                inPlace = !inPlace;
                std::string e = checkOne(c, coll, t, op, minBytes / sizeOf(t) + 1, inPlace, 0);
                if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", r, e);
              }
            for (size_t count : {minBytes / 4 - 1, minBytes / 4, (size_t{5} << 18) + 7})
              for (bool inPlace : {false, true}) {
                std::string e = checkOne(c, coll, DataType::kFloat32, RedOp::kSum, count, inPlace, 0);
                if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", r, e);
              }
          });
      for (int r = 0; r < 2; ++r)
        EXPECT_EQ(errors[r], "") << (direct ? "P2P" : "SHM") << " algo '" << k.algo << "' proto '" << k.proto
                                 << "' channels " << k.minChannels << ".." << k.maxChannels << " rank " << r;
    }
  }
}

// 2-rank AllReduce from HostThresholds::allReducePairMin (1 MiB): allReducePair.
TEST(Collectives, TwoRankAllReducePair) { checkPair(Coll::kAllReduce, size_t{1} << 20); }

// 2-rank ReduceScatter from HostThresholds::reduceScatterPairMin (64 KiB of a rank's output): reduceScatterPair.
TEST(Collectives, TwoRankReduceScatterPair) { checkPair(Coll::kReduceScatter, size_t{64} << 10); }

// One host: P2P (direct pointers) or SHM forced, NCCL_ALGO `algo`.
void oneHost(bool direct, const char* algo, int r, runtime::InitOptions& o) {
  if (direct) o.cfg.hostId = "one-host";
  else testing::force(testing::Transport::kShm, r, o.cfg);
  o.cfg.algo = algo;
}

// A collective that, on one host between more than 2 ranks from `minBytes` (of count; AllReduce: of a rank's block,
// count / n), pulls what it needs straight
// out of the peers' buffers (Direct, the auto choice); NCCL_ALGO=ring keeps the ring at the same sizes. 3 and 4
// ranks (8 in Collectives8), every op of `types` just past the threshold (in place and out of place in turn; at 3
// ranks with the auto choice, float32 sum otherwise),
// float32 and float16 just below, at and far past it (uneven blocks and last pieces), in place and out of place, P2P
// (direct pointers) and SHM (single copies).
void checkStar(Coll coll, size_t minBytes, std::span<const DataType> types,
               std::initializer_list<int> ranks = {3, 4}) {
  const bool reduces = coll != Coll::kAllGather;
  for (int n : ranks)
    for (const char* algo : {"", "ring"})
      for (bool direct : {false, true}) {
        const size_t min = coll == Coll::kAllReduce ? minBytes * n : minBytes;
        auto errors = runRanks(
            n,
            [&](int r, runtime::InitOptions& o) { oneHost(direct, algo, r, o); },
            [&](Communicator& c, int r) {
              bool inPlace = false;
              // Every type and op once per transport, at the first rank count with the auto choice (the reduction
              // is the same code at every count; the forced ring takes the ring's, tested on its own).
              const bool everyOp = n == *ranks.begin() && algo[0] == '\0';
              for (DataType t : types)
                for (RedOp op : kOps) {
                  if (!everyOp && (t != DataType::kFloat32 || op != RedOp::kSum)) continue;
                  if (!reduces && op != RedOp::kSum) continue;
                  inPlace = !inPlace;
                  std::string e = checkOne(c, coll, t, op, min / sizeOf(t) + 1, inPlace, 0);
                  if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", r, e);
                }
              for (DataType t : {DataType::kFloat32, DataType::kFloat16})
                for (size_t bytes : {min - 4, min, (size_t{5} << 20) + 12})
                  for (bool inPlace : {false, true}) {
                    std::string e = checkOne(c, coll, t, RedOp::kSum, bytes / sizeOf(t), inPlace, 0);
                    if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", r, e);
                  }
            });
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(errors[r], "") << n << " ranks " << (direct ? "P2P" : "SHM") << " algo '" << algo << "' rank " << r;
      }
}

// ReduceScatter from HostThresholds::reduceScatterStarMin (256 KiB of a rank's output): every rank pulls its block of every peer's
// input and reduces them (reduceScatterStar). Int8 only (every type and op: a minute on 2 cores; the reduction is
// allReduceStar's, tested with every type).
TEST(Collectives, ReduceScatterFromEveryPeer) {
  constexpr DataType kInt8[] = {DataType::kInt8};
  checkStar(Coll::kReduceScatter, tuning::HostThresholds{}.reduceScatterStarMin, kInt8);
}

// AllReduce from HostThresholds::allReduceStarMin (128 KiB) of a rank's block: the reduce-scatter of reduceScatterStar on split r of
// the buffer, then every rank pulls the other ranks' reduced splits out of their outputs (allReduceStar).
TEST(Collectives, AllReduceFromEveryPeer) { checkStar(Coll::kAllReduce, tuning::HostThresholds{}.allReduceStarMin, kTypes); }

// AllGather from HostThresholds::allGatherStarMin (64 KiB of a rank's input): every rank pulls every peer's input (allGatherStar).
TEST(Collectives, AllGatherFromEveryPeer) { checkStar(Coll::kAllGather, tuning::HostThresholds{}.allGatherStarMin, kTypes); }

// 2-rank AllGather from HostThresholds::allGatherPairMin (1 MiB of a rank's input): each rank pulls the peer's input straight into its
// output (allGatherStar between 2 ranks); NCCL_ALGO=ring keeps the ring's step.
TEST(Collectives, TwoRankAllGatherPieces) {
  checkStar(Coll::kAllGather, tuning::HostThresholds{}.allGatherPairMin, kTypes, {2});
}

// Broadcast on one host between more than 2 ranks from HostThresholds::broadcastStarMin (64 KiB): every rank pulls from the root
// (Direct, the auto choice); NCCL_ALGO=ring keeps the chain at the same sizes. 3 and 4 ranks, every root, in place
// and out of place, sizes around the threshold and odd counts, P2P (direct pointers) and SHM (single copies).
TEST(Collectives, BroadcastFromTheRootToEveryRank) {
  for (int n : {3, 4})
    for (const char* algo : {"", "ring"})
      for (bool direct : {false, true}) {
        auto errors = runRanks(
            n,
            [&](int r, runtime::InitOptions& o) { oneHost(direct, algo, r, o); },
            [&](Communicator& c, int r) {
              for (DataType t : {DataType::kFloat32, DataType::kInt8, DataType::kFloat16})
                for (size_t bytes : {(size_t{64} << 10) - 1, size_t{64} << 10, (size_t{1} << 20) + 3})
                  for (bool inPlace : {false, true})
                    for (int root = 0; root < n; ++root) {
                      size_t count = bytes / sizeOf(t) + (bytes % 2);
                      std::string e = checkOne(c, Coll::kBroadcast, t, RedOp::kSum, count, inPlace, root);
                      if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", r, e);
                    }
            });
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(errors[r], "") << n << " ranks " << (direct ? "P2P" : "SHM") << " algo '" << algo << "' rank " << r;
      }
}

// 2-rank Broadcast from HostThresholds::broadcastPairMin (512 KiB) goes in two halves over two connectors, the second pulled or
// pushed depending on whether the root is in place: both roots, in place and out of place, sizes around the
// threshold and odd counts, every protocol, P2P (direct pointers) and SHM (single copies), 1, 2 and 4 channels (too
// many for halves on this machine's 4: one copy per channel).
TEST(Collectives, TwoRankBroadcastInHalves) {
  struct Case {
    const char* proto;
    int minChannels;
  };
  for (Case k : {Case{"", 0}, Case{"", 2}, Case{"", 4}, Case{"ll", 0}, Case{"simple", 0}}) {
    for (bool direct : {false, true}) {
      auto errors = runRanks(
          2,
          [&](int r, runtime::InitOptions& o) {
            if (direct) o.cfg.hostId = "one-host";
            else testing::force(testing::Transport::kShm, r, o.cfg);
            o.cfg.proto = k.proto;
            o.cfg.minNchannels = k.minChannels;
          },
          [&](Communicator& c, int r) {
            for (DataType t : {DataType::kInt8, DataType::kFloat64})  // a broadcast moves bytes: 1- and 8-byte elements
              for (size_t bytes : {(size_t{512} << 10) - 1, size_t{512} << 10, (size_t{1} << 20) + 3, size_t{3} << 20})
                for (bool inPlace : {false, true})
                  for (int root : {0, 1}) {
                    size_t count = bytes / sizeOf(t) + (bytes % 2);
                    std::string e = checkOne(c, Coll::kBroadcast, t, RedOp::kSum, count, inPlace, root);
                    if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", r, e);
                  }
          });
      for (int r = 0; r < 2; ++r)
        EXPECT_EQ(errors[r], "") << (direct ? "P2P" : "SHM") << " proto '" << k.proto << "' min channels "
                                 << k.minChannels << " rank " << r;
    }
  }
}

TEST(Collectives, ShmAndNetTransports) {
  for (auto tr : {testing::Transport::kShm, testing::Transport::kNet}) {
    auto errors = runRanks(
        3, [&](int r, runtime::InitOptions& o) { testing::force(tr, r, o.cfg); },
        [&](Communicator& c, int r) {
          for (Coll coll : {Coll::kAllReduce, Coll::kReduce, Coll::kBroadcast, Coll::kAllGather, Coll::kReduceScatter})
            for (size_t count : {size_t{1}, size_t{1023}, (size_t{1} << 18) + 3}) {
              std::string e = checkOne(c, coll, DataType::kFloat32, RedOp::kSum, count, false, 1);
              if (!e.empty()) fail(StatusCode::kInternal, "rank {}: {}", r, e);
            }
        });
    for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << testing::name(tr) << " rank " << r;
  }
}

TEST(Collectives, AsynchronousIssueCompletesInOrder) {
  auto errors = runRanks(
      3, [](int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; },
      [](Communicator& c, int r) {
        std::vector<std::vector<int32_t>> in(6, std::vector<int32_t>(5000)), out(6, std::vector<int32_t>(5000));
        std::vector<runtime::Request> reqs;
        for (int k = 0; k < 6; ++k) {
          std::fill(in[k].begin(), in[k].end(), r + k);
          reqs.push_back(c.iallReduce(in[k].data(), out[k].data(), 5000, DataType::kInt32, RedOp::kSum));
        }
        for (int k = 5; k >= 0; --k) reqs[k].wait();
        for (int k = 0; k < 6; ++k)
          if (out[k][4999] != 3 + 3 * k) fail(StatusCode::kInternal, "op {} got {}", k, out[k][4999]);
        c.barrier();
        std::vector<int32_t> all(3 * 10);
        std::vector<int32_t> mine(10, r);
        c.allToAll(std::vector<int32_t>(30, r).data(), all.data(), 10, DataType::kInt32);
        for (int q = 0; q < 3; ++q)
          if (all[q * 10] != q) fail(StatusCode::kInternal, "alltoall from {} got {}", q, all[q * 10]);
      });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The collective lock's fast path (collectives.cc): the owner (the first thread to call a blocking collective) enters
// with plain stores; other threads, and the collective thread running their tasks, take the mutex after a membarrier.
// Every hand-over: owner blocking and asynchronous calls, another thread's blocking and asynchronous calls, the owner
// calling while the collective thread still runs another thread's tasks. Each call's sum is checked.
TEST(Collectives, TheCollectiveLockHandsOverBetweenThreads) {
  auto errors = runRanks(
      2, [](int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; },
      [](Communicator& c, int r) {
        int k = 0;  // every rank issues the same calls in the same order: k numbers them
        auto blocking = [&] {
          int32_t in = r + k, out = -1;
          c.allReduce(&in, &out, 1, DataType::kInt32, RedOp::kSum);
          if (out != 1 + 2 * k) fail(StatusCode::kInternal, "call {} got {}", k, out);
          ++k;
        };
        struct Async {
          std::vector<int32_t> in, out;
          runtime::Request req;
          int k;
        };
        std::vector<std::unique_ptr<Async>> pending;
        auto async = [&] {
          auto a = std::make_unique<Async>();
          a->in.assign(3000, r + k);
          a->out.assign(3000, -1);
          a->k = k++;
          a->req = c.iallReduce(a->in.data(), a->out.data(), 3000, DataType::kInt32, RedOp::kSum);
          pending.push_back(std::move(a));
        };
        auto finish = [&] {
          for (auto& a : pending) {
            a->req.wait();
            if (a->out[2999] != 1 + 2 * a->k) fail(StatusCode::kInternal, "async call {} got {}", a->k, a->out[2999]);
          }
          pending.clear();
        };
        for (int i = 0; i < 30; ++i) i % 7 == 3 ? async() : blocking();  // the owner
        finish();
        std::thread([&] {  // another thread: the foreign path, blocking and through the queue
          for (int i = 0; i < 30; ++i) i % 7 == 3 ? async() : blocking();
        }).join();
        finish();
        std::thread([&] { async(), async(), async(); }).join();  // queued by another thread...
        for (int i = 0; i < 10; ++i) blocking();                  // ... while the owner calls
        finish();
      });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Collectives, GroupsOfCollectivesAndPointToPoint) {
  auto errors = runRanks(
      2, [](int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; },
      [](Communicator& c, int r) {
        std::vector<float> a(100, 1.0f + r), b(100), s(10, r), q(10);
        runtime::groupStart();
        c.allReduce(a.data(), b.data(), 100, DataType::kFloat32, RedOp::kSum);
        c.send(s.data(), 10, DataType::kFloat32, 1 - r);
        c.recv(q.data(), 10, DataType::kFloat32, 1 - r);
        c.allGather(a.data(), a.data(), 50, DataType::kFloat32);  // in place: rank r's block is at r * 50
        runtime::groupEnd();
        if (b[99] != 3.0f || q[0] != static_cast<float>(1 - r)) fail(StatusCode::kInternal, "group results wrong");
      });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Collectives, SeveralCommunicatorsOfOneThreadInAGroup) {
  // tcclCommInitAll's pattern: one thread drives every rank in one group.
  bootstrap::Options bo;
  bo.timeout = std::chrono::seconds(60);
  auto group = bootstrap::makeInMemoryGroup(3, bo);
  std::vector<std::unique_ptr<Communicator>> comms(3);
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      runtime::InitOptions o;
      o.cfg.hostId = "one-host";
      o.bootstrap = bo;
      comms[r] = Communicator::initWithBootstrap(std::move(group[r]), o);
    });
  for (auto& t : ts) t.join();
  std::vector<std::vector<double>> bufs(3, std::vector<double>(300000));
  for (int r = 0; r < 3; ++r) std::fill(bufs[r].begin(), bufs[r].end(), r + 1.0);
  runtime::groupStart();
  for (int r = 0; r < 3; ++r) comms[r]->allReduce(bufs[r].data(), bufs[r].data(), 300000, DataType::kFloat64, RedOp::kSum);
  runtime::groupEnd();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(bufs[r][299999], 6.0);
}

TEST(Collectives, MismatchedCallsNameBothRanks) {
  auto errors = runRanks(
      2,
      [](int, runtime::InitOptions& o) {
        o.cfg.hostId = "one-host";
        o.cfg.checkCalls = 1;
      },
      [](Communicator& c, int r) {
        std::vector<float> a(100), b(200);
        if (r == 0) c.allReduce(a.data(), b.data(), 100, DataType::kFloat32, RedOp::kSum);
        else c.allGather(a.data(), b.data(), 100, DataType::kFloat32);
      });
  EXPECT_NE(errors[0].find("rank 0 called AllReduce(count 100, float, sum) while rank 1 called AllGather"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("while rank 0 called AllReduce"), std::string::npos) << errors[1];
}

// Ranks that disagree on a call fail without TOPOCOLL_CHECK_CALLS: every message of a collective carries the call's
// signature in its header (collectives::callSignature), the ranks that meet the differing rank's data fail naming
// both calls, and they tell the job, so that every rank fails at once (no TOPOCOLL_TIMEOUT) with that message. A
// rank whose whole part of the call never touched the differing rank's data (a Broadcast's ranks before it in the
// chain) may complete that call; its next call fails. The matrix: what differs x transport x size x ranks. Calls whose
// patterns differ (a Broadcast's root, AllReduce against Reduce) may exchange no message at all: a rank stalled for
// a second tells its peers its call, and they compare.
TEST(CallMismatch, EveryRankFailsNamingBothCalls) {
  struct Case {
    const char* what;
    std::function<void(Communicator&, bool odd, size_t count, float* in, float* out)> call;
  };
  const std::vector<Case> cases = {
      {"op",
       [](Communicator& c, bool odd, size_t n, float* in, float* out) {
         c.allReduce(in, out, n, DataType::kFloat32, odd ? RedOp::kMax : RedOp::kSum);
       }},
      {"type",
       [](Communicator& c, bool odd, size_t n, float* in, float* out) {
         c.allReduce(in, out, n, odd ? DataType::kInt32 : DataType::kFloat32, RedOp::kSum);
       }},
      {"count",
       [](Communicator& c, bool odd, size_t n, float* in, float* out) {
         c.allReduce(in, out, odd ? n - 64 : n, DataType::kFloat32, RedOp::kSum);
       }},
      {"root",
       [](Communicator& c, bool odd, size_t n, float* in, float* out) {
         c.broadcast(in, out, n, DataType::kFloat32, odd ? 1 : 0);
       }},
      {"collective",
       [](Communicator& c, bool odd, size_t n, float* in, float* out) {
         if (odd) c.reduce(in, out, n, DataType::kFloat32, RedOp::kSum, 0);
         else c.allReduce(in, out, n, DataType::kFloat32, RedOp::kSum);
       }},
  };
  for (auto tr : {testing::Transport::kP2p, testing::Transport::kShm, testing::Transport::kNet})
    for (int n : {2, 4})
      for (size_t count : {size_t{1000}, size_t{1} << 20})  // LL (4 KB), Simple and single copies (4 MiB)
        for (const Case& k : cases) {
          std::vector<int> failedCall(n, 0);
          auto errors = runRanks(
              n,
              [&](int r, runtime::InitOptions& o) {
                testing::force(tr, r, o.cfg);
                o.cfg.timeoutSec = 30;
              },
              [&](Communicator& c, int r) {
                std::vector<float> in(count * n, 1.0f), out(count * n);
                const bool odd = r == n - 1;
                // A first call alike: the connections a Direct algorithm makes on its first call (lazily, through
                // the bootstrap) are there (a rank that waits in that exchange sees no call of a peer's).
                c.allReduce(in.data(), out.data(), count, DataType::kFloat32, RedOp::kSum);
                // Every rank done with it before any starts the next: a rank whose eager sends are out leaves the
                // call while a slower peer still receives, and that peer would see the mismatch of call 1 fail the
                // job before it finished call 0 (seen under a loaded CI).
                c.bootstrap().barrier();
                for (int call = 1; call <= 2 && !failedCall[r]; ++call) {
                  try {
                    if (call == 1) k.call(c, odd, count, in.data(), out.data());
                    else c.allReduce(in.data(), out.data(), count, DataType::kFloat32, RedOp::kSum);
                  } catch (const Error&) {
                    failedCall[r] = call;
                    throw;
                  }
                }
              });
          const std::string where = fmt::format("{} differs, {} ranks, {}, count {}", k.what, n, testing::name(tr), count);
          for (int r = 0; r < n; ++r) {
            EXPECT_NE(failedCall[r], 0) << where << ": rank " << r << " never failed";
            EXPECT_NE(errors[r].find("the ranks' calls differ"), std::string::npos) << where << ": rank " << r << ": "
                                                                                     << errors[r];
            EXPECT_EQ(errors[r].find("TOPOCOLL_TIMEOUT"), std::string::npos) << where << ": rank " << r << ": "
                                                                             << errors[r];
            if (k.what != std::string("root") && k.what != std::string("collective")) {
              EXPECT_EQ(failedCall[r], 1) << where << ": rank " << r << ": " << errors[r];
            }
          }
        }
}

// The same through each algorithm forced (NCCL_ALGO ring, tree) and protocol (NCCL_PROTO LL, Simple), at 3 and 8
// ranks: the op differs on the last rank.
TEST(CallMismatch, EachAlgorithmAndProtocolAtThreeAndEightRanks) {
  for (const char* algo : {"ring", "tree"})
    for (const char* proto : {"LL", "Simple"})
      for (auto tr : {testing::Transport::kP2p, testing::Transport::kNet})
        for (int n : {3, 8}) {
          const size_t count = 1 << 16;
          auto errors = runRanks(
              n,
              [&](int r, runtime::InitOptions& o) {
                testing::force(tr, r, o.cfg);
                o.cfg.algo = algo;
                o.cfg.proto = proto;
                o.cfg.timeoutSec = 30;
              },
              [&](Communicator& c, int r) {
                std::vector<float> in(count, 1.0f), out(count);
                c.allReduce(in.data(), out.data(), count, DataType::kFloat32, RedOp::kSum);
                c.allReduce(in.data(), out.data(), count, DataType::kFloat32, r == n - 1 ? RedOp::kMax : RedOp::kSum);
              });
          for (int r = 0; r < n; ++r)
            EXPECT_NE(errors[r].find("the ranks' calls differ"), std::string::npos)
                << algo << "/" << proto << " " << testing::name(tr) << " " << n << " ranks, rank " << r << ": "
                << errors[r];
        }
}

TEST(Collectives, DifferentCountsFailWithoutChecks) {
  auto errors = runRanks(
      2,
      [](int, runtime::InitOptions& o) {
        o.cfg.hostId = "one-host";
        o.cfg.timeoutSec = 5;
      },
      [](Communicator& c, int r) {
        std::vector<float> a(200), b(200);
        c.allReduce(a.data(), b.data(), r == 0 ? 100 : 200, DataType::kFloat32, RedOp::kSum);
      });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r], "") << "rank " << r;
}

TEST(Collectives, AbortFailsPendingAndLaterCalls) {
  auto errors = runRanks(
      2, [](int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; },
      [](Communicator& c, int r) {
        std::vector<float> a(1 << 20), b(1 << 20);
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));  // stays, never joins
        if (r == 0) {
          auto req = c.iallReduce(a.data(), b.data(), 1 << 20, DataType::kFloat32, RedOp::kSum);
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          c.abort();
          try {
            req.wait();
            fail(StatusCode::kInternal, "the pending collective did not fail");
          } catch (const Error& e) {
            if (e.code() != StatusCode::kAborted) throw;
          }
          try {
            c.allReduce(a.data(), b.data(), 1000, DataType::kFloat32, RedOp::kSum);
            fail(StatusCode::kInternal, "a collective after abort did not fail");
          } catch (const Error& e) {
            if (e.code() != StatusCode::kAborted || std::string(e.what()).find("aborted") == std::string::npos) throw;
          }
        }
      });
  EXPECT_EQ(errors[0], "");
}

TEST(Collectives, BadArguments) {
  auto errors = runRanks(
      1, [](int, runtime::InitOptions&) {},
      [](Communicator& c, int) {
        float x = 0;
        auto expect = [](auto f, const char* what) {
          try {
            f();
          } catch (const Error& e) {
            if (e.code() == StatusCode::kInvalidArgument && std::string(e.what()).find(what) != std::string::npos)
              return;
            throw;
          }
          fail(StatusCode::kInternal, "no error for {}", what);
        };
        expect([&] { c.allReduce(nullptr, &x, 1, DataType::kFloat32, RedOp::kSum); }, "sendbuff is null");
        expect([&] { c.broadcast(&x, &x, 1, DataType::kFloat32, 3); }, "root 3");
        expect([&] { c.allReduce(&x, &x, 1, static_cast<DataType>(99), RedOp::kSum); }, "unknown data type");
        expect([&] { c.allReduce(&x, &x, 1, DataType::kFloat32, static_cast<RedOp>(9)); }, "unknown reduction op");
        expect([&] { c.allGather(&x, &x, ~size_t{0} / 2, DataType::kFloat32); }, "overflows");
      });
  EXPECT_EQ(errors[0], "");
}

}  // namespace
}  // namespace topocoll
