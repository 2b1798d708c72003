#include "topocoll/tuning/tuning.h"

#include <gtest/gtest.h>

#include <limits>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/plan.h"
#include "topocoll/status.h"

namespace topocoll::tuning {
namespace {

Plan planFor(const char* file, int nodes, std::map<std::string, std::string> env = {}) {
  return makePlan(topology::loadXmlFile(testing::topoPath(file)), JobSpec{nodes, 0, {}}, Config::fromEnv(Env(env)));
}

TEST(Tuning, NamesParse) {
  EXPECT_EQ(collFromString("allreduce"), kAllReduce);
  EXPECT_EQ(collFromString("all_gather"), kAllGather);
  EXPECT_EQ(collFromString("ReduceScatter"), kReduceScatter);
  EXPECT_EQ(collFromString("alltoall"), -1);
  EXPECT_EQ(dataTypeSize("float32"), 4);
  EXPECT_EQ(dataTypeSize("bf16"), 2);
  EXPECT_EQ(dataTypeSize("quaternion"), -1);
}

TEST(Tuning, AlgoKnobSyntaxes) {
  Plan p = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 2, {{"NCCL_ALGO", "ring"}});
  for (int c = 0; c < kNumColls; ++c)
    for (int p2 = 0; p2 < kNumProtos; ++p2) EXPECT_EQ(p.model.bandwidths[c][kTree][p2], 0.0f);
  EXPECT_GT(p.model.bandwidths[kAllReduce][kRing][kSimple], 0.0f);

  Plan q = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 2, {{"NCCL_ALGO", "^tree"}});
  EXPECT_EQ(q.model.bandwidths[kAllReduce][kTree][kSimple], 0.0f);
  EXPECT_GT(q.model.bandwidths[kAllReduce][kRing][kSimple], 0.0f);

  Plan r = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 2, {{"NCCL_ALGO", "ring;allreduce:tree"}});
  EXPECT_EQ(r.model.bandwidths[kAllReduce][kRing][kSimple], 0.0f);
  EXPECT_GT(r.model.bandwidths[kAllReduce][kTree][kSimple], 0.0f);
  EXPECT_GT(r.model.bandwidths[kAllGather][kRing][kSimple], 0.0f);

  Plan s = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 2, {{"NCCL_PROTO", "^LL128;allreduce:LL128"}});
  EXPECT_EQ(s.model.bandwidths[kAllGather][kRing][kLL128], 0.0f);
  EXPECT_GT(s.model.bandwidths[kAllReduce][kRing][kLL128], 0.0f);
  EXPECT_EQ(s.model.bandwidths[kAllReduce][kRing][kSimple], 0.0f);
}

TEST(Tuning, BadKnobsAreInvalidUsage) {
  for (const char* bad : {"ring,bogus", "allreduce:ring;tree", "alltoall:ring"}) {
    try {
      planFor("seed-h100-8gpu-8nic-nvswitch.xml", 1, {{"NCCL_ALGO", bad}});
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidUsage) << bad;
      EXPECT_NE(std::string(e.what()).find("NCCL_ALGO"), std::string::npos);
    }
  }
}

TEST(Tuning, NothingEnabledIsAnError) {
  Plan p = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 2, {{"NCCL_ALGO", "Tree"}});
  auto s = p.select(kBroadcast, 1024);
  EXPECT_EQ(s.algo, -1);
  EXPECT_EQ(s.error, 5);
  auto a = p.select(kAllReduce, 1024);
  EXPECT_EQ(a.algo, kTree);
}

TEST(Tuning, AvailabilityRules) {
  Plan one = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 1);
  EXPECT_EQ(one.model.bandwidths[kAllReduce][kNvlsTree][kSimple], 0.0f);  // NVLSTree needs several nodes
  EXPECT_GT(one.model.bandwidths[kAllReduce][kNvls][kSimple], 0.0f);      // NVSwitch + sm90
  Plan two = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 2);
  EXPECT_EQ(two.model.bandwidths[kAllReduce][kNvls][kSimple], 0.0f);      // NVLS across nodes needs CollNet
  EXPECT_GT(two.model.bandwidths[kAllReduce][kNvlsTree][kSimple], 0.0f);
  EXPECT_EQ(two.model.bandwidths[kAllReduce][kCollNetDirect][kSimple], 0.0f);
  Plan pcie = planFor("ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml", 1);
  EXPECT_EQ(pcie.model.bandwidths[kAllReduce][kNvls][kSimple], 0.0f);     // no NVSwitch
  EXPECT_EQ(pcie.model.bandwidths[kAllGather][kPat][kSimple], 0.0f);      // PAT only with one GPU per node
  Plan pat = makePlan(topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml")), JobSpec{4, 1, {}}, {});
  EXPECT_GT(pat.model.bandwidths[kAllGather][kPat][kSimple], 0.0f);
  Plan noNvls = planFor("seed-h100-8gpu-8nic-nvswitch.xml", 1, {{"NCCL_NVLS_ENABLE", "0"}});
  EXPECT_EQ(noNvls.model.bandwidths[kAllReduce][kNvls][kSimple], 0.0f);
}

TEST(Tuning, CollNetNeedsTheKnobAndCollCapableNics) {
  auto coll = topology::parseXml(testing::nvswitchDomainXml(8, 18, 90, true), "coll.xml");
  Plan off = makePlan(coll, JobSpec{2, 0, {}}, Config{});
  EXPECT_FALSE(off.graphAvailable[search::kGraphCollnetChain]);
  EXPECT_EQ(off.model.bandwidths[kAllReduce][kCollNetChain][kSimple], 0.0f);
  Plan on = makePlan(coll, JobSpec{2, 0, {}}, Config::fromEnv(Env(std::map<std::string, std::string>{{"NCCL_COLLNET_ENABLE", "1"}})));
  ASSERT_TRUE(on.graphAvailable[search::kGraphCollnetChain]);
  ASSERT_TRUE(on.graphAvailable[search::kGraphCollnetDirect]);
  EXPECT_GT(on.graphs[search::kGraphCollnetChain].nChannels, 0);
  EXPECT_EQ(on.graphs[search::kGraphCollnetDirect].pattern, search::kPatternCollnetDirect);
  EXPECT_GT(on.model.bandwidths[kAllReduce][kCollNetChain][kSimple], 0.0f);
  EXPECT_GT(on.model.bandwidths[kAllReduce][kCollNetDirect][kSimple], 0.0f);
  EXPECT_GT(on.model.bandwidths[kAllReduce][kNvls][kSimple], 0.0f);  // NVLS across nodes rides on CollNet
  EXPECT_EQ(on.model.bandwidths[kAllReduce][kCollNetChain][kLL], 0.0f);
  // Without coll="1" NICs the knob alone does nothing.
  auto plain = topology::parseXml(testing::nvswitchDomainXml(8), "plain.xml");
  Plan p = makePlan(plain, JobSpec{2, 0, {}}, Config::fromEnv(Env(std::map<std::string, std::string>{{"NCCL_COLLNET_ENABLE", "1"}})));
  EXPECT_FALSE(p.graphAvailable[search::kGraphCollnetChain]);
}

TEST(Tuning, TimeNeverDecreasesWithSize) {
  for (const char* f : {"seed-h100-8gpu-8nic-nvswitch.xml", "ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml"}) {
    for (int nodes : {1, 2, 4}) {
      Plan p = planFor(f, nodes);
      for (int c = 0; c < kNumColls; ++c)
        for (int a = 0; a < kNumAlgos; ++a)
          for (int pr = 0; pr < kNumProtos; ++pr) {
            float prev = -1;
            for (int l = 0; l <= 36; ++l) {
              float t = algoTime(p.model, c, a, pr, 1ULL << l);
              if (t < 0) break;
              EXPECT_GE(t, prev) << f << " " << collName(c) << " " << algoName(a) << " " << protoName(pr) << " 2^" << l;
              prev = t;
            }
          }
    }
  }
}

// topoGetAlgoInfo picks the (algorithm, protocol) of least estimated time among those available, the first in
// NCCL's order (algorithm, then protocol) on a tie. On these jobs every pair with a bandwidth is available (no
// CollNet; NVLS across nodes has no bandwidth without CollNet), so the choice must be the minimum of all costs.
TEST(Tuning, SelectionIsTheMinimumOverAvailableCosts) {
  for (auto [file, nodes] : std::vector<std::pair<const char*, int>>{{"seed-h100-8gpu-8nic-nvswitch.xml", 1},
                                                                      {"seed-h100-8gpu-8nic-nvswitch.xml", 2},
                                                                      {"ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml", 1},
                                                                      {"azure-ncv4-a100-pcie-4gpu-4numa.xml", 3}}) {
    Plan p = planFor(file, nodes);
    for (int c = 0; c < kNumColls; ++c) {
      for (int l = 3; l < 34; ++l) {
        const uint64_t n = 1ULL << l;
        const Selection s = p.select(c, n);
        ASSERT_GE(s.algo, 0) << file << " " << collName(c) << " " << n;
        float best = std::numeric_limits<float>::max();
        int bestA = -1, bestP = -1;
        for (int a = 0; a < kNumAlgos; ++a)
          for (int pr = 0; pr < kNumProtos; ++pr) {
            const float t = algoTime(p.model, c, a, pr, n);
            if (t >= 0 && t < best) best = t, bestA = a, bestP = pr;
          }
        EXPECT_EQ(s.algo, bestA) << file << " " << collName(c) << " " << n;
        EXPECT_EQ(s.proto, bestP) << file << " " << collName(c) << " " << n;
        EXPECT_FLOAT_EQ(s.timeUs, best);
        EXPECT_GT(s.nChannels, 0);
        EXPECT_GE(s.nWarps, 3);
      }
    }
  }
}

// comm->maxLocalRanks is the largest node's rank count, not rank 0's node's (init.cc, after allGather3): a job
// whose nodes hold 1, 2 and 2 ranks has localRanks 1 for rank 0 but maxLocalRanks 2, which is what CollNet's
// arity rule and the tuner read.
TEST(Tuning, MaxLocalRanksIsOverAllNodes) {
  auto node = [](std::vector<int> ranks) {
    search::NodeGraphs ng;
    ng.ranks = static_cast<int>(ranks.size());
    ng.firstRank = ranks[0];
    for (int gi : {search::kGraphRing, search::kGraphTree}) {
      auto& g = ng.graphs[gi];
      g.pattern = gi == search::kGraphRing ? search::kPatternRing : search::kPatternBalancedTree;
      g.nChannels = 1;
      g.bwIntra = g.bwInter = 10;
      g.intra.assign(search::kMaxChannels * ranks.size(), 0);
      for (size_t i = 0; i < ranks.size(); ++i) g.intra[i] = ranks[i];
    }
    ng.minCompCap = ng.maxCompCap = 80;
    ng.p2pnChannelsPerPeer = 2;
    return ng;
  };
  const std::vector<search::NodeGraphs> nodes = {node({0}), node({1, 2}), node({3, 4})};
  std::vector<search::RankTopo> all;
  for (int r = 0; r < 5; ++r) all.push_back(search::presetRank(r, nodes[r == 0 ? 0 : r < 3 ? 1 : 2]));
  const search::Connect c = search::connectRanks(all, {});
  EXPECT_EQ(c.nNodes, 3);
  EXPECT_EQ(c.localRanks, 1);
  EXPECT_EQ(c.minLocalRanks, 1);
  EXPECT_EQ(c.maxLocalRanks, 2);
  EXPECT_EQ(jobInfo(c, 0).maxLocalRanks, 2);
  EXPECT_EQ(jobInfo(c, 0).localRanks, 1);
}

}  // namespace
}  // namespace topocoll::tuning
