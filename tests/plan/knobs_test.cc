// NCCL's planner knobs change what NCCL would change, by the amounts NCCL's code gives (each expectation names the
// rule it comes from). Knobs of the topology (NIC fusion) are in topology/node_xml_test.cc, of the paths in
// paths/paths_test.cc, of the network inside a host in plan/plan_test.cc.
#include <gtest/gtest.h>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/plan.h"
#include "topocoll/status.h"

namespace topocoll {
namespace {

Config cfgOf(std::map<std::string, std::string> vars) { return Config::fromEnv(Env(std::move(vars))); }

Plan plan(const char* file, int nodes, std::map<std::string, std::string> vars = {}) {
  return makePlan(topology::loadXmlFile(testing::topoPath(file)), JobSpec{nodes, 0, {}},
                  Config::fromEnv(Env(std::move(vars))));
}
constexpr const char* kSeed = "seed-h100-8gpu-8nic-nvswitch.xml";

// getNthreads (src/graph/tuning.cc): a multiple of 32 within [min, max] is taken, another value gives the max.
TEST(Knobs, NthreadsAndLl128Nthreads) {
  Plan d = plan(kSeed, 2);
  EXPECT_EQ(d.model.maxThreads[tuning::kRing][tuning::kSimple], 512);  // NCCL_SIMPLE_MAX_NTHREADS
  EXPECT_EQ(d.model.maxThreads[tuning::kRing][tuning::kLL128], 640);   // NCCL_LL128_MAX_NTHREADS
  Plan p = plan(kSeed, 2, {{"NCCL_NTHREADS", "256"}, {"NCCL_LL128_NTHREADS", "320"}});
  EXPECT_EQ(p.model.maxThreads[tuning::kRing][tuning::kSimple], 256);
  EXPECT_EQ(p.model.maxThreads[tuning::kTree][tuning::kLL], 256);
  EXPECT_EQ(p.model.maxThreads[tuning::kRing][tuning::kLL128], 320);
  EXPECT_EQ(plan(kSeed, 2, {{"NCCL_NTHREADS", "100"}}).model.maxThreads[tuning::kRing][tuning::kSimple], 512);
}

// Ring latency across nodes (ncclTopoTuneModel): base + (nsteps - nInterSteps) x max(intra hop, net overhead) +
// nInterSteps x inter hop. Seed H100 on 2 nodes, AllReduce LL: base 6.6, NVLink hop 0.6, network hop 2.7
// (ncclTunerConstantsDefaults), 16 ranks: 30 steps, 2 across nodes. The overhead is 1 us on Intel (getNetOverhead).
TEST(Knobs, NetOverheadEntersRingLatency) {
  const float def = plan(kSeed, 2).model.latencies[tuning::kAllReduce][tuning::kRing][tuning::kLL];
  EXPECT_NEAR(def, 6.6 + 28 * 1.0 + 2 * 2.7, 1e-4);
  const float five = plan(kSeed, 2, {{"NCCL_NET_OVERHEAD", "5000"}})
                         .model.latencies[tuning::kAllReduce][tuning::kRing][tuning::kLL];
  EXPECT_NEAR(five, 6.6 + 28 * 5.0 + 2 * 2.7, 1e-4);
}

// LL128 by default on Hopper up to PXN network paths (NCCL_LL128_C2C=1), else only up to PXB: OCI H100's rings
// leave through PXN.
TEST(Knobs, Ll128C2c) {
  const char* oci = "oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml";
  Plan d = plan(oci, 2);
  ASSERT_EQ(d.graphs[search::kGraphRing].typeInter, static_cast<int>(topology::PathType::PXN));
  EXPECT_GT(d.model.bandwidths[tuning::kAllReduce][tuning::kRing][tuning::kLL128], 0);
  EXPECT_EQ(plan(oci, 2, {{"NCCL_LL128_C2C", "0"}}).model.bandwidths[tuning::kAllReduce][tuning::kRing][tuning::kLL128],
            0);
}

// ncclPatEnable: by default only with one GPU per node; NCCL_PAT_ENABLE=1 forces it (sm60+).
TEST(Knobs, PatEnable) {
  EXPECT_EQ(plan(kSeed, 2).model.bandwidths[tuning::kAllGather][tuning::kPat][tuning::kSimple], 0);
  EXPECT_GT(plan(kSeed, 2, {{"NCCL_PAT_ENABLE", "1"}}).model.bandwidths[tuning::kAllGather][tuning::kPat][tuning::kSimple],
            0);
  Plan oneGpu = makePlan(topology::loadXmlFile(testing::topoPath(kSeed)), JobSpec{4, 1, {}}, {});
  EXPECT_GT(oneGpu.model.bandwidths[tuning::kAllGather][tuning::kPat][tuning::kSimple], 0);
  Plan off = makePlan(topology::loadXmlFile(testing::topoPath(kSeed)), JobSpec{4, 1, {}},
                      cfgOf({{"NCCL_PAT_ENABLE", "0"}}));
  EXPECT_EQ(off.model.bandwidths[tuning::kAllGather][tuning::kPat][tuning::kSimple], 0);
}

// NCCL_THREAD_THRESHOLDS: "treeLL treeLL128 treeSimple ringLL ringLL128 ringSimple", negative = keep.
TEST(Knobs, ThreadThresholds) {
  Plan p = plan(kSeed, 2, {{"NCCL_THREAD_THRESHOLDS", "1 -1 3 4 5 6"}});
  EXPECT_EQ(p.model.threadThresholds[tuning::kTree][tuning::kLL], 1);
  EXPECT_EQ(p.model.threadThresholds[tuning::kTree][tuning::kLL128], 8);  // NCCL_LL128_THREAD_THRESHOLD, kept
  EXPECT_EQ(p.model.threadThresholds[tuning::kTree][tuning::kSimple], 3);
  EXPECT_EQ(p.model.threadThresholds[tuning::kRing][tuning::kSimple], 6);
}

// ncclTopoComputeP2pChannels: p2pnChannels = pow2 of min(nChannels, NCCL_MAX_P2P_NCHANNELS), at least
// NCCL_MIN_P2P_NCHANNELS; per peer: the NICs' bandwidth over NCCL_P2P_PER_CHANNEL_NET_BW GB/s per channel.
TEST(Knobs, P2pChannels) {
  Plan d = plan(kSeed, 2);
  EXPECT_EQ(d.connect.p2pnChannels, 16);
  EXPECT_EQ(d.connect.p2pnChannelsPerPeer, 4);
  EXPECT_EQ(plan(kSeed, 2, {{"NCCL_MAX_P2P_NCHANNELS", "4"}}).connect.p2pnChannels, 4);
  EXPECT_EQ(plan(kSeed, 2, {{"NCCL_MIN_P2P_NCHANNELS", "32"}}).connect.p2pnChannels, 32);
  // One 400G NIC per GPU is 50 GB/s: 50 / 14 -> 4 channels by default, 50 / 50 -> 1.
  EXPECT_EQ(plan(kSeed, 2, {{"NCCL_P2P_PER_CHANNEL_NET_BW", "50"}}).connect.p2pnChannelsPerPeer, 1);
  // Across nodes the channels per peer halve until a round of peers (8 a round) fits p2pnChannels: 64 ranks are 8
  // rounds (4 x 8 > 16: 2 per peer); NCCL_P2P_MAX_PEERS (ncclConfig_t's maxP2pPeers) = 8 is one round (4 per peer).
  EXPECT_EQ(plan(kSeed, 8).connect.p2pnChannelsPerPeer, 2);
  EXPECT_EQ(plan(kSeed, 8, {{"NCCL_P2P_MAX_PEERS", "8"}}).connect.p2pnChannelsPerPeer, 4);
}

// NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS and their legacy names (connect.cc, ncclMinNchannels/ncclMaxNchannels).
TEST(Knobs, ChannelCountsAndLegacyNames) {
  EXPECT_EQ(plan(kSeed, 2, {{"NCCL_MAX_NCHANNELS", "4"}}).connect.nChannels, 4);
  EXPECT_EQ(plan(kSeed, 2, {{"NCCL_MAX_NRINGS", "4"}}).connect.nChannels, 4);
  EXPECT_EQ(plan(kSeed, 2, {{"NCCL_MIN_NRINGS", "40"}}).connect.nChannels, 40);
}

// TOPOCOLL_SEARCH_TIMEOUT_SCALE multiplies NCCL's step budgets: a search that used its budgets takes more steps.
TEST(Knobs, SearchTimeoutScale) {
  const int steps = plan(kSeed, 1).graphs[search::kGraphRing].searchSteps;
  const int scaled = plan(kSeed, 1, {{"TOPOCOLL_SEARCH_TIMEOUT_SCALE", "2"}}).graphs[search::kGraphRing].searchSteps;
  EXPECT_GT(scaled, steps);
}

// NCCL_NVB_DISABLE: no NVLink paths through a peer GPU (the DGX-1 mesh's 2-hop pairs become PCI/SYS paths).
TEST(Knobs, NvbDisable) {
  auto doc = topology::parseXml(testing::dgx1MeshXml(), "dgx1.xml");
  topology::System on = testing::nodeSystem(doc);
  topology::System off = testing::nodeSystem(doc, cfgOf({{"NCCL_NVB_DISABLE", "1"}}));
  int nvbOn = 0, nvbOff = 0;
  for (int g = 0; g < 8; ++g)
    for (int p = 0; p < 8; ++p) {
      nvbOn += testing::gpuPath(on, g, p).type == topology::PathType::NVB;
      nvbOff += testing::gpuPath(off, g, p).type == topology::PathType::NVB;
    }
  EXPECT_GT(nvbOn, 0);
  EXPECT_EQ(nvbOff, 0);
}

}  // namespace
}  // namespace topocoll
