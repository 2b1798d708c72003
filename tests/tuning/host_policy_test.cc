// The host collectives' one decision (tuning::hostDecide): the one-shot rule, the cost model's pick, DirectSplit, the
// star and pair shapes at their thresholds (one byte below and at each), the mapped buffers, and the knobs that force
// or turn them off.
#include "topocoll/tuning/host_policy.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "topocoll/env.h"
#include "topocoll/status.h"

namespace topocoll::tuning {
namespace {

HostPolicy policy(int nRanks, std::map<std::string, std::string> env = {}, bool oneHost = true) {
  return HostPolicy::make(Config::fromEnv(Env(std::move(env))), oneHost ? HostLink::kP2p : HostLink::kNet, nRanks,
                          oneHost, 2);
}

// A call of `rankBytes` a rank (AllGather, ReduceScatter: NCCL's count is every rank's).
HostCall call(int coll, uint64_t rankBytes, int nRanks, bool mailboxes = false) {
  HostCall c;
  c.coll = coll;
  c.rankBytes = rankBytes;
  c.bytes = coll == kAllGather || coll == kReduceScatter ? rankBytes * nRanks : rankBytes;
  c.linkChannels = 2;
  c.mailboxes = mailboxes;
  return c;
}

TEST(HostPolicy, SmallCallsTakeTheMailboxesWhenEveryConnectionHasOne) {
  const HostPolicy p = policy(4);
  EXPECT_EQ(hostDecide(p, call(kAllReduce, 256, 4, true)).algo, kHostOneShot);
  EXPECT_TRUE(hostOneShot(p, call(kAllReduce, 256, 4, true)));
  EXPECT_FALSE(hostOneShot(p, call(kAllReduce, 257, 4, true)));  // past TOPOCOLL_ONESHOT_MAX
  EXPECT_FALSE(hostOneShot(p, call(kAllReduce, 256, 4, false)));  // no mailboxes (NET on one host, GPU buffers)
  EXPECT_FALSE(hostOneShot(p, call(kAllReduce, 0, 4, true)));
  EXPECT_FALSE(hostOneShot(policy(9), call(kAllReduce, 8, 9, true)));  // more ranks than the mailbox path holds
  EXPECT_FALSE(hostOneShot(policy(4, {{"NCCL_ALGO", "ring"}}), call(kAllReduce, 8, 4, true)));
  EXPECT_FALSE(hostOneShot(policy(4, {{"NCCL_PROTO", "LL"}}), call(kAllReduce, 8, 4, true)));
  EXPECT_FALSE(hostOneShot(policy(4, {{"TOPOCOLL_ONESHOT_MAX", "0"}}), call(kAllReduce, 8, 4, true)));
}

TEST(HostPolicy, StarShapesStartAtTheirThresholds) {
  const HostThresholds t;
  struct Row {
    int coll, nRanks;
    uint64_t min;
  };
  for (const Row& r : {Row{kBroadcast, 4, t.broadcastStarMin}, Row{kReduceScatter, 4, t.reduceScatterStarMin},
                       Row{kAllReduce, 4, 4 * t.allReduceStarMin}, Row{kAllGather, 3, t.allGatherStarMin},
                       Row{kAllGather, 2, t.allGatherPairMin}}) {
    SCOPED_TRACE(fmt::format("{} at {} ranks", collName(r.coll), r.nRanks));
    const HostPolicy p = policy(r.nRanks);
    const HostDecision below = hostDecide(p, call(r.coll, r.min - 1, r.nRanks));
    const HostDecision at = hostDecide(p, call(r.coll, r.min, r.nRanks));
    EXPECT_FALSE(below.star);
    EXPECT_EQ(at.algo, kHostDirect);
    EXPECT_TRUE(at.star);
    EXPECT_NE(std::string(at.reason).find("star threshold"), std::string::npos) << at.reason;
    // NCCL_ALGO keeps NCCL's algorithm; several hosts never take the star.
    EXPECT_FALSE(hostDecide(policy(r.nRanks, {{"NCCL_ALGO", "ring"}}), call(r.coll, r.min, r.nRanks)).star);
    EXPECT_FALSE(hostDecide(policy(r.nRanks, {}, false), call(r.coll, r.min, r.nRanks)).star);
  }
  EXPECT_FALSE(hostDecide(policy(9), call(kAllGather, 1 << 20, 9)).star);  // beyond kHostDirectMaxRanks
  EXPECT_FALSE(hostDecide(policy(4), call(kReduce, 64 << 20, 4)).star);    // Reduce has no star
}

TEST(HostPolicy, PairShapesAtTwoRanksWithTwoChannels) {
  const HostThresholds t;
  const HostPolicy p = policy(2, {{"NCCL_ALGO", "ring"}});
  EXPECT_FALSE(hostDecide(p, call(kAllReduce, t.allReducePairMin - 1, 2)).pair);
  EXPECT_TRUE(hostDecide(p, call(kAllReduce, t.allReducePairMin, 2)).pair);
  EXPECT_FALSE(hostDecide(p, call(kReduceScatter, t.reduceScatterPairMin - 1, 2)).pair);
  EXPECT_TRUE(hostDecide(p, call(kReduceScatter, t.reduceScatterPairMin, 2)).pair);
  EXPECT_FALSE(hostDecide(p, call(kBroadcast, t.broadcastPairMin - 1, 2)).pair);
  EXPECT_TRUE(hostDecide(p, call(kBroadcast, t.broadcastPairMin, 2)).pair);
  HostCall one = call(kAllReduce, 64 << 20, 2);
  one.linkChannels = 1;  // the pair shapes need two connectors
  EXPECT_FALSE(hostDecide(p, one).pair);
  EXPECT_FALSE(hostDecide(policy(3, {{"NCCL_ALGO", "ring"}}), call(kAllReduce, 64 << 20, 3)).pair);
  EXPECT_FALSE(hostDecide(policy(2, {{"NCCL_ALGO", "tree"}}), call(kAllReduce, 64 << 20, 2)).pair);
  // Across hosts nothing is single-copied: the ring, over every channel (every rail).
  const HostPolicy net = policy(2, {{"NCCL_ALGO", "ring"}}, false);
  for (int coll : {kAllReduce, kReduceScatter, kBroadcast}) EXPECT_FALSE(hostDecide(net, call(coll, 64 << 20, 2)).pair);
}

TEST(HostPolicy, MappedBuffersFromTheirThresholds) {
  const HostThresholds t;
  const HostPolicy p = policy(4);
  EXPECT_FALSE(hostDecide(p, call(kAllReduce, t.mappedInputsMin - 1, 4)).mapPeers);
  HostDecision d = hostDecide(p, call(kAllReduce, t.mappedInputsMin, 4));
  EXPECT_TRUE(d.mapPeers);
  EXPECT_EQ(d.mapOutputs, t.mappedInputsMin >= t.mappedOutputsMin);
  // AllGather writes into the outputs from mappedCopiesMin of the whole call.
  EXPECT_FALSE(hostDecide(p, call(kAllGather, t.mappedCopiesMin / 4 - 1, 4)).mapOutputs);
  EXPECT_TRUE(hostDecide(p, call(kAllGather, t.mappedCopiesMin / 4, 4)).mapOutputs);
  EXPECT_FALSE(hostDecide(policy(9), call(kAllReduce, 64 << 20, 9)).mapPeers);
}

TEST(HostPolicy, DirectSplitOnlyWhenItsKnobsAskForIt) {
  EXPECT_NE(hostDecide(policy(4), call(kAllReduce, 64 << 10, 4)).algo, kHostDirectSplit);
  const HostPolicy p = policy(4, {{"TOPOCOLL_DIRECT_SPLIT_MIN", "0"}, {"TOPOCOLL_DIRECT_MAX", "-1"}});
  HostDecision d = hostDecide(p, call(kAllReduce, 64 << 10, 4));
  EXPECT_EQ(d.algo, kHostDirectSplit);
  EXPECT_EQ(d.proto, kLL);  // 16 KiB messages: NCCL_P2P_LL_THRESHOLD
  EXPECT_EQ(hostDecide(p, call(kAllReduce, 64 << 20, 4)).proto, kSimple);
  EXPECT_NE(hostDecide(policy(4, {{"TOPOCOLL_DIRECT_SPLIT_MIN", "0"}, {"NCCL_ALGO", "ring"}}),
                       call(kAllReduce, 64 << 10, 4))
                .algo,
            kHostDirectSplit);
}

// TOPOCOLL_HOST_THRESHOLDS replaces entries of the table by name (what bench/host_thresholds.py measures), and
// the decision follows: a star from 1 KiB when the knob says so, never when it says 2^62.
TEST(HostPolicy, TheThresholdsKnobReplacesEntriesByName) {
  const HostPolicy p = policy(4, {{"TOPOCOLL_HOST_THRESHOLDS", "broadcastStarMin=1024,mappedCopiesMin=0"}});
  EXPECT_EQ(p.thresholds.broadcastStarMin, 1024u);
  EXPECT_EQ(p.thresholds.mappedCopiesMin, 0u);
  EXPECT_EQ(p.thresholds.allGatherStarMin, HostThresholds{}.allGatherStarMin);  // the others stay
  HostDecision d;
  d.algo = kHostDirect;
  hostShape(p.thresholds, 4, call(kBroadcast, 1024, 4), 2, &d);
  EXPECT_TRUE(d.star);
  const HostPolicy never = policy(4, {{"TOPOCOLL_HOST_THRESHOLDS", "broadcastStarMin=4611686018427387904"}});
  hostShape(never.thresholds, 4, call(kBroadcast, 1 << 30, 4), 2, &d);
  EXPECT_FALSE(d.star);
  // Every entry has a name, a perf test and a rank count the calibration can use.
  for (const auto& f : hostThresholdFields()) {
    EXPECT_NE(withOverrides({}, fmt::format("{}=7", f.name)).*(f.member), HostThresholds{}.*(f.member)) << f.name;
    EXPECT_GE(f.ranks, 2) << f.name;
  }
  for (const char* bad : {"broadcastStar=1", "broadcastStarMin=-1", "broadcastStarMin=1k", "broadcastStarMin"}) {
    try {
      policy(4, {{"TOPOCOLL_HOST_THRESHOLDS", bad}});
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("TOPOCOLL_HOST_THRESHOLDS"), std::string::npos) << e.what();
    }
  }
}

// Across hosts a ring AllReduce's slices shrink while a rank's chunk holds fewer than 8 of them, down to what the
// slowest NIC carries in 2 ms (a power of two); never past the whole step, and not on one host.
TEST(HostPolicy, RingSlicesAcrossHostsShrinkForSmallChunksOnSlowLinks) {
  auto slice = [](int nRanks, double netGBps, uint64_t bytes, int nChannels = 1) {
    HostPolicy p = policy(nRanks, {{"NCCL_ALGO", "ring"}}, false);
    p.netGBps = netGBps;
    p.limits.maxChannels = p.limits.minChannels = nChannels;
    const HostDecision d = hostDecide(p, call(kAllReduce, bytes, nRanks));
    EXPECT_EQ(d.algo, kRing);
    EXPECT_EQ(d.nChannels, nChannels);
    return d.chunkBytes;
  };
  const uint64_t step = 512 << 10;                   // NCCL_BUFFSIZE 4 MiB / 8
  EXPECT_EQ(slice(2, 0.0625, 4 << 20), 256u << 10);  // 500 Mbit/s: a 2 MiB chunk in 8 slices
  EXPECT_EQ(slice(6, 0.0625, 4 << 20), 128u << 10);  // 683 KiB: no smaller than 2 ms of the link (125 000 B)
  EXPECT_EQ(slice(6, 0.0625, 16 << 20), 256u << 10);
  EXPECT_EQ(slice(2, 0.0625, 16 << 20), step);
  EXPECT_EQ(slice(2, 0.0625, 4 << 20, 2), 128u << 10);  // two channels: a chunk each
  EXPECT_EQ(slice(8, 0.25, 4 << 20), step);             // 2 Gbit/s: 2 ms is 500 000 B, a whole step
  EXPECT_EQ(slice(8, 12.5, 4 << 20), step);             // 100 Gbit/s
  EXPECT_EQ(slice(6, 0, 4 << 20), step);                // the NIC's rate unknown
  EXPECT_EQ(slice(2, 0.0001, 4 << 20), 256u << 10);     // the floor is at least 4 KiB
  HostPolicy one = policy(6, {{"NCCL_ALGO", "ring"}});  // one host: the cache's slices, as before
  one.netGBps = 0.0625;
  EXPECT_EQ(hostDecide(one, call(kAllReduce, 4 << 20, 6)).chunkBytes, one.chunkBytes);
  HostPolicy p = policy(6, {{"NCCL_ALGO", "ring"}}, false);
  p.netGBps = 0.0625;
  EXPECT_NE(describe(p, call(kAllReduce, 4 << 20, 6), hostDecide(p, call(kAllReduce, 4 << 20, 6))).find("slices of 128 KiB"),
            std::string::npos);
  EXPECT_EQ(hostDecide(p, call(kAllGather, 1 << 20, 6)).chunkBytes, step);  // AllReduce only
}

TEST(HostPolicy, DescribeNamesTheChoiceAndItsReason) {
  const HostPolicy p = policy(4);
  const HostCall c = call(kAllReduce, 4 << 20, 4);
  const std::string line = describe(p, c, hostDecide(p, c));
  EXPECT_NE(line.find("AllReduce: 4194304 Bytes -> Algo Direct (star, mapped inputs and outputs) proto"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("P2P): past its star threshold"), std::string::npos) << line;
}

}  // namespace
}  // namespace topocoll::tuning
