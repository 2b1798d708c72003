// Grace (C2C) and POWER9 (NVLink to the CPU) machines, generated, with each rule NCCL 2.30.7 applies to them and
// where it lives. The conformance cases gen-grace-2x2b200-c2c-4x400g-rootnic.n1 and gen-power9-ac922-6v100-2ib.n1
// check two such machines against NCCL itself; these check the rules on their variants.
#include <gtest/gtest.h>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/paths/paths.h"
#include "topocoll/plan.h"

namespace topocoll::paths {
namespace {

using topology::NodeType;

Config envConfig(std::map<std::string, std::string> vars) { return Config::fromEnv(Env(std::move(vars))); }
topology::XmlDoc xml(const std::string& text) { return topology::parseXml(text, "generated.xml"); }
Plan planOf(const std::string& text, int nodes, const Config& cfg = {}, int gpusPerNode = 0) {
  return makePlan(xml(text), JobSpec{nodes, gpusPerNode, {}}, cfg);
}
float c2cBw(int bwMBps, int count) { return static_cast<float>((bwMBps * count) / 1000.0); }  // ncclTopoAddC2c

// --- Grace: GPU to CPU over C2C (topo.cc ncclTopoAddC2c: bw x count / 1000 GB/s), CPUs 6 GB/s apart (ARM_BW).
const std::string kGb200Tray = testing::graceXml(2, 2, 2, true);  // 2 Grace, 4 B200 on an NVSwitch, 2 NICs each

TEST(Grace, GpuReachesItsCpuOverC2c) {
  System sys = testing::nodeSystem(xml(kGb200Tray), {}, 1 << 10);
  const int c = localCpu(sys, 0);
  EXPECT_EQ(sys.of(NodeType::GPU)[0].paths[static_cast<int>(NodeType::CPU)][c].type, PathType::C2C);
  EXPECT_FLOAT_EQ(sys.of(NodeType::GPU)[0].paths[static_cast<int>(NodeType::CPU)][c].bw, c2cBw(22356, 10));
}

// paths.cc ncclTopoComputePaths: C2C then PCI to the GPU's closest NIC is P2C (bw the NIC's PCIe link, 48 GB/s),
// the other socket's NICs are reached through an NVLink peer there (PXN: it reaches them at P2C with GDR and more
// bandwidth than the GPU's own SYS path).
TEST(Grace, LocalNicsAreP2cRemoteNicsPxn) {
  System sys = testing::nodeSystem(xml(kGb200Tray), {}, 1 << 10);
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(testing::netPath(sys, 0, n).type, PathType::P2C);
    EXPECT_FLOAT_EQ(testing::netPath(sys, 0, n).bw, 48.0f);
    EXPECT_EQ(checkGdr(sys, {}, 0, sys.of(NodeType::NET)[n].id, false), GdrMode::kDefault);  // distance == P2C
  }
  for (int n = 2; n < 4; ++n) {
    EXPECT_EQ(testing::netPath(sys, 0, n).type, PathType::PXN);
    EXPECT_FLOAT_EQ(testing::netPath(sys, 0, n).bw, 48.0f);
    EXPECT_EQ(intermediateRank(sys, 0, sys.of(NodeType::NET)[n].id) / 2, 1);  // a GPU of the other socket
  }
}

// NCCL_PXN_C2C=0: a relay must reach its NIC at PXB or better, so P2C peers relay nothing: SYS at ARM_BW.
// NCCL_NET_GDR_C2C=0: no GPU Direct over P2C (level PXB), so no relay either, and the local NICs' traffic goes
// through the CPU (still P2C: C2C + PHB).
TEST(Grace, PxnC2cAndGdrC2cKnobs) {
  for (const char* knob : {"NCCL_PXN_C2C", "NCCL_NET_GDR_C2C"}) {
    SCOPED_TRACE(knob);
    System sys = testing::nodeSystem(xml(kGb200Tray), envConfig({{knob, "0"}}), 1 << 10);
    EXPECT_EQ(testing::netPath(sys, 0, 2).type, PathType::SYS);
    EXPECT_FLOAT_EQ(testing::netPath(sys, 0, 2).bw, 6.0f);
    EXPECT_EQ(testing::netPath(sys, 0, 0).type, PathType::P2C);
  }
  System noGdr = testing::nodeSystem(xml(kGb200Tray), envConfig({{"NCCL_NET_GDR_C2C", "0"}}), 1 << 10);
  EXPECT_EQ(checkGdr(noGdr, envConfig({{"NCCL_NET_GDR_C2C", "0"}}), 0, noGdr.of(NodeType::NET)[0].id, false),
            GdrMode::kDisable);
}

// Two GH200s without NVLink between them: GPU to GPU is C2C, SYS (6 GB/s), C2C. ncclTopoCheckNet only counts NICs
// at PXB or better, and P2C is not: the host stays one NCCL node although its NICs (48 GB/s) are faster.
TEST(Grace, P2cNicsDoNotSplitTheHost) {
  Plan p = planOf(testing::graceXml(2, 1, 1, false, 90), 1);
  EXPECT_EQ(p.connect.nNodes, 1);
  EXPECT_EQ(testing::gpuPath(p.system, 0, 1).type, PathType::SYS);
  EXPECT_FLOAT_EQ(testing::gpuPath(p.system, 0, 1).bw, 6.0f);
  EXPECT_FLOAT_EQ(p.graphs[search::kGraphRing].bwIntra, 6.0f);
}

// LL128 over the network on Hopper: up to PXN paths when NCCL_LL128_C2C=1 (the default), so over P2C; only up to
// PXB otherwise (tuning.cc, "Enable LL128 by default only on Hopper/Blackwell for all connections up to P2C").
TEST(Grace, Ll128OverP2c) {
  const std::string gh200 = testing::graceXml(1, 1, 1, false, 90);
  Plan p = planOf(gh200, 2);
  ASSERT_EQ(p.graphs[search::kGraphRing].typeInter, static_cast<int>(PathType::P2C));
  EXPECT_GT(p.model.bandwidths[tuning::kAllReduce][tuning::kRing][tuning::kLL128], 0);
  Plan off = planOf(gh200, 2, envConfig({{"NCCL_LL128_C2C", "0"}}));
  EXPECT_EQ(off.model.bandwidths[tuning::kAllReduce][tuning::kRing][tuning::kLL128], 0);
}

// The NVLS tree's size correction applies on x86 only (tuning.cc ncclTopoGetAlgoTime): on Grace an NVLSTree
// AllReduce costs latency + size / bandwidth.
TEST(Grace, NvlsTreeCorrectionIsX86Only) {
  Plan p = planOf(kGb200Tray, 2);
  ASSERT_EQ(p.model.job.cpuArch, topology::kCpuArchArm);
  const float bw = p.model.bandwidths[tuning::kAllReduce][tuning::kNvlsTree][tuning::kSimple];
  const float lat = p.model.latencies[tuning::kAllReduce][tuning::kNvlsTree][tuning::kSimple];
  ASSERT_GT(bw, 0);
  const uint64_t n = 1 << 20;
  EXPECT_FLOAT_EQ(tuning::algoTime(p.model, tuning::kAllReduce, tuning::kNvlsTree, tuning::kSimple, n),
                  lat + static_cast<float>(n) / (1000 * bw));
}

// --- POWER9: NVLink to the CPU (tclass 0x068001), CPUs 32 GB/s apart (P9_BW).
TEST(Power9, GpuPathsThroughTheCpuNvlinks) {
  System sys = testing::nodeSystem(xml(testing::power9Xml(2, 2)), {}, 1 << 10);
  EXPECT_EQ(testing::gpuPath(sys, 0, 1).type, PathType::NVL);
  EXPECT_FLOAT_EQ(testing::gpuPath(sys, 0, 1).bw, 40.0f);  // 2 links x SM70_NVLINK_BW
  EXPECT_EQ(testing::gpuPath(sys, 0, 2).type, PathType::SYS);
  EXPECT_FLOAT_EQ(testing::gpuPath(sys, 0, 2).bw, 32.0f);  // P9_BW between the sockets
  // NVLink to the CPU then PCI to its NIC is PHB; the other socket's NIC is SYS. Both beyond P2C: no GPU Direct.
  EXPECT_EQ(testing::netPath(sys, 0, 0).type, PathType::PHB);
  EXPECT_FLOAT_EQ(testing::netPath(sys, 0, 0).bw, 12.5f);
  EXPECT_EQ(testing::netPath(sys, 0, 1).type, PathType::SYS);
  EXPECT_EQ(checkGdr(sys, {}, 0, sys.of(NodeType::NET)[0].id, false), GdrMode::kDisable);
}

// search.cc ncclTopoFollowPath: on POWER a path through a GPU's NVLink to the CPU charges that link's reverse
// direction too. The balanced tree's two channels cross between the sockets in opposite directions: at 30 GB/s
// each would put 60 on a 40 GB/s CPU NVLink, so the tree settles at 20; with 6 CPU links (120 GB/s) the P9 link
// (32) allows 30.
TEST(Power9, CpuNvlinksAreChargedBothWays) {
  Plan narrow = planOf(testing::power9Xml(2, 2, 2), 1);
  Plan wide = planOf(testing::power9Xml(2, 2, 6), 1);
  EXPECT_EQ(narrow.graphs[search::kGraphTree].nChannels, 2);
  EXPECT_FLOAT_EQ(narrow.graphs[search::kGraphTree].bwIntra, 20.0f);
  EXPECT_FLOAT_EQ(wide.graphs[search::kGraphTree].bwIntra, 30.0f);
}

// tuning.cc ncclTopoTuneModel: on POWER the PCI tree Simple hop costs what the ring's does (5.7 instead of 4.0 us):
// a one-node tree AllReduce over 4 ranks is 8.4 + 2 x 3 hops.
TEST(Power9, TreeSimpleLatencyIsTheRings) {
  Plan power = planOf(testing::power9Xml(2, 2), 1);
  Plan x86 = planOf(testing::power9Xml(2, 2, 2, "x86_64"), 1);
  EXPECT_NEAR(power.model.latencies[tuning::kAllReduce][tuning::kTree][tuning::kSimple], 8.4 + 6 * 5.7, 1e-4);
  EXPECT_NEAR(x86.model.latencies[tuning::kAllReduce][tuning::kTree][tuning::kSimple], 8.4 + 6 * 4.0, 1e-4);
}

}  // namespace
}  // namespace topocoll::paths
