// The planner's front door: jobs whose hosts split into several NCCL nodes (the network inside one host), hosts
// without NICs, the network plugin's devices, nccl-tests' sizes, and jobs too large for memory.
#include "topocoll/plan.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <sys/resource.h>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/paths/paths.h"
#include "topocoll/status.h"

namespace topocoll {
namespace {

using topology::NodeType;
using topology::PathType;

Config envConfig(std::map<std::string, std::string> vars) { return Config::fromEnv(Env(std::move(vars))); }

Plan planXml(const std::string& xml, int nodes, const Config& cfg = {}) {
  return makePlan(topology::parseXml(xml, "generated.xml"), JobSpec{nodes, 0, {}}, cfg);
}

// --- The network inside one host (ncclTopoCheckNet through the P2P and SHM transports' canConnect).

// Two Sapphire Rapids sockets (22 GB/s between them, src/graph/topo.h) with Gen4 GPUs (24 GB/s) and a 400G NIC
// (50 GB/s) per socket: across sockets the GPUs reach each other at 22 GB/s but their NIC at 24 (PXB or better),
// so NCCL talks through the network: each socket is an NCCL node (conformance case gen-spr-2s-4l40s-2x400g.n1).
TEST(NetworkInsideOneHost, SlowSocketLinkSplitsTheHost) {
  const std::string xml = testing::twoSocketPcieXml(testing::kSapphireRapids, 2, 400000);
  Plan one = planXml(xml, 1);
  EXPECT_EQ(one.hostDomains, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(one.connect.nNodes, 2);
  EXPECT_EQ(one.system.count(NodeType::GPU), 2);  // rank 0's node only
  EXPECT_EQ(one.system.inter, 1);                 // its ring leaves through the NIC
  EXPECT_EQ(one.connect.rings[0], (std::vector<int>{0, 1, 2, 3}));
  Plan two = planXml(xml, 2);
  EXPECT_EQ(two.connect.nNodes, 4);  // 2 hosts x 2 sockets
  EXPECT_EQ(two.connect.maxLocalRanks, 2);
}

// Emerald Rapids sockets talk at 40 GB/s: the GPUs' 24 GB/s is the limit either way, the NIC is not faster.
TEST(NetworkInsideOneHost, FastSocketLinkKeepsOneNode) {
  Plan p = planXml(testing::twoSocketPcieXml(testing::kEmeraldRapids, 2, 400000), 1);
  EXPECT_EQ(p.hostDomains.size(), 1u);
  EXPECT_EQ(p.connect.nNodes, 1);
  EXPECT_EQ(p.system.inter, 0);
}

// A 100G NIC (12.5 GB/s) is slower than the 22 GB/s between sockets: no split.
TEST(NetworkInsideOneHost, SlowNicKeepsOneNode) {
  Plan p = planXml(testing::twoSocketPcieXml(testing::kSapphireRapids, 2, 100000), 1);
  EXPECT_EQ(p.connect.nNodes, 1);
}

// Equal is not faster: Gen3 GPUs (12 GB/s) reach each other and the NIC at 12 GB/s.
TEST(NetworkInsideOneHost, EqualSpeedsKeepOneNode) {
  Plan p = planXml(testing::twoSocketPcieXml(testing::kSapphireRapids, 2, 400000, "8.0 GT/s PCIe"), 1);
  EXPECT_EQ(p.connect.nNodes, 1);
}

TEST(NetworkInsideOneHost, NetDisableIntraKeepsOneNode) {
  Plan p = planXml(testing::twoSocketPcieXml(testing::kSapphireRapids, 2, 400000), 1,
                   envConfig({{"NCCL_NET_DISABLE_INTRA", "1"}}));
  EXPECT_EQ(p.connect.nNodes, 1);
}

// Without P2P between sockets (SYS is beyond PXB) GPUs talk through shared memory; NCCL_SHM_DISABLE=1 leaves them
// only the network, on a machine where the NIC is no faster.
TEST(NetworkInsideOneHost, ShmDisableSplitsPairsWithoutP2p) {
  const std::string xml = testing::twoSocketPcieXml(testing::kEmeraldRapids, 2, 400000);
  EXPECT_EQ(planXml(xml, 1).connect.nNodes, 1);
  Plan p = planXml(xml, 1, envConfig({{"NCCL_SHM_DISABLE", "1"}}));
  EXPECT_EQ(p.hostDomains, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  // With P2P everywhere (NCCL_P2P_LEVEL=SYS) shared memory is not needed: one node.
  EXPECT_EQ(planXml(xml, 1, envConfig({{"NCCL_SHM_DISABLE", "1"}, {"NCCL_P2P_LEVEL", "SYS"}})).connect.nNodes, 1);
}

// The tuning follows: two NCCL nodes use the network model (nNodes 2) even on one host.
TEST(NetworkInsideOneHost, TuningSeesTheNodes) {
  Plan split = planXml(testing::twoSocketPcieXml(testing::kSapphireRapids, 2, 400000), 1);
  Plan whole = planXml(testing::twoSocketPcieXml(testing::kEmeraldRapids, 2, 400000), 1);
  EXPECT_EQ(split.model.job.nNodes, 2);
  EXPECT_EQ(whole.model.job.nNodes, 1);
  EXPECT_EQ(split.model.job.nRanks, 4);
}

// On random two-socket machines: a GPU pair is marked NET exactly when both GPUs reach a NIC (PXB or better)
// faster than each other (shared memory is on, one host); the host's NCCL nodes are the components of the other
// pairs; every node's graphs use its own GPUs only; and the job has hosts x nodes-per-host NCCL nodes.
TEST(NetworkInsideOneHost, DomainsFollowTheRuleOnRandomMachines) {
  auto ok = rc::check("net rule", [] {
    const testing::CpuKind cpus[] = {testing::kSapphireRapids, testing::kEmeraldRapids, testing::kSkylake,
                                     testing::kZen};
    const testing::CpuKind cpu = cpus[*rc::gen::inRange(0, 4)];
    const int perSocket = *rc::gen::inRange(1, 4);
    const int nic = *rc::gen::element(10000, 100000, 200000, 400000, 800000);
    const char* gen = *rc::gen::element("8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe");
    const int hosts = *rc::gen::inRange(1, 3);
    const std::string xml = testing::twoSocketPcieXml(cpu, perSocket, nic, gen);
    const auto doc = topology::parseXml(xml, "r.xml");
    std::vector<topology::LocalGpu> locals;
    for (int i = 0; i < 2 * perSocket; ++i) locals.push_back({i, i});
    topology::System host = topology::buildSystem(topology::prepareNodeXml(doc, locals, {}));
    paths::computePaths(host, {});  // the whole host's paths, before trimming
    const int n = host.count(NodeType::GPU);
    for (int p = 0; p < n; ++p)
      for (int g = 0; g < n; ++g) {
        if (p == g) continue;
        const bool net = host.of(NodeType::GPU)[p].paths[static_cast<int>(NodeType::GPU)][g].type == PathType::NET;
        RC_ASSERT(net == paths::useNetBetween(host, {}, p, g));
      }
    const std::vector<int> domains = paths::gpuDomains(host);
    Plan plan = makePlan(doc, JobSpec{hosts, 0, {}}, {});
    RC_ASSERT(static_cast<int>(plan.hostDomains.size()) * hosts == plan.connect.nNodes);
    size_t covered = 0;
    for (const auto& d : plan.hostDomains) {
      covered += d.size();
      for (int r : d) RC_ASSERT(domains[host.gpuIndexOfRank(r)] == domains[host.gpuIndexOfRank(d[0])]);
    }
    RC_ASSERT(covered == static_cast<size_t>(n));
    const auto& ring = plan.graphs[search::kGraphRing];
    for (int i = 0; i < ring.nChannels * plan.system.count(NodeType::GPU); ++i)
      RC_ASSERT(plan.system.gpuIndexOfRank(ring.intra[i]) >= 0);
  });
  EXPECT_TRUE(ok);
}

// --- Hosts without NICs, and the network plugin's devices.

// A NIC-less workstation (conformance case gen-trpro-ws-2rtx6000ada-nonic): NCCL's socket plugin reports one
// device, eth0 at 10 Gb/s (1.25 GB/s), without a PCI path, so under the first CPU: GPUs reach it through the CPU
// (PHB), without GPU Direct. Two such hosts plan over it.
TEST(PluginDevices, HostWithoutNicGetsOneSocketDevice) {
  const auto doc = topology::loadXmlFile(std::string(GENERATED_TOPO_DIR) + "/nc-trpro-ws-2rtx6000ada-nonic.xml");
  Plan p = makePlan(doc, JobSpec{2, 0, {}}, {});
  ASSERT_EQ(p.system.count(NodeType::NET), 1);
  const auto& net = p.system.of(NodeType::NET)[0];
  EXPECT_EQ(net.name, "eth0");
  EXPECT_FLOAT_EQ(net.bw, 1.25f);
  EXPECT_EQ(net.gdrSupport, 0);
  EXPECT_EQ(testing::netPath(p.system, 0, 0).type, PathType::PHB);
  EXPECT_EQ(p.connect.nNodes, 2);
  EXPECT_FLOAT_EQ(p.graphs[search::kGraphRing].bwInter, 1.2f);  // the fastest speed at or below 1.25 GB/s
}

TEST(PluginDevices, NetDevicesDescribeSocketDevices) {
  const auto doc = topology::loadXmlFile(std::string(GENERATED_TOPO_DIR) + "/nc-trpro-ws-2rtx6000ada-nonic.xml");
  Plan p = makePlan(doc, JobSpec{2, 0, {}}, envConfig({{"TOPOCOLL_NET_DEVICES", "eth0:25000,eth1:25000"}}));
  ASSERT_EQ(p.system.count(NodeType::NET), 2);  // socket devices are never fused
  EXPECT_EQ(p.system.of(NodeType::NET)[1].name, "eth1");
  EXPECT_FLOAT_EQ(p.system.of(NodeType::NET)[0].bw, 3.125f);
}

// A NIC named on a PCI device of the XML is an RDMA NIC there (GPU Direct); the devices are numbered in the order
// given, as a plugin numbers them; the XML's other <net>s are not the job's.
TEST(PluginDevices, NetDevicesOnPciDevicesInPluginOrder) {
  const auto doc = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  Config cfg = envConfig({{"TOPOCOLL_NET_DEVICES", "mlx5_2,mlx5_1"}});
  topology::System sys = topology::buildSystem(topology::prepareNodeXml(doc, {{0, 0}}, cfg));
  ASSERT_EQ(sys.count(NodeType::NET), 2);
  // NET nodes stay in the XML's order (as NCCL adds them); their dev is the plugin's index.
  EXPECT_EQ(sys.of(NodeType::NET)[0].name, "mlx5_1");
  EXPECT_EQ(sys.of(NodeType::NET)[0].dev, 1);
  EXPECT_EQ(sys.of(NodeType::NET)[1].name, "mlx5_2");
  EXPECT_EQ(sys.of(NodeType::NET)[1].dev, 0);
  EXPECT_EQ(sys.of(NodeType::NET)[1].gdrSupport, 1);  // the XML's attributes: an RDMA NIC

  const auto partial = topology::parseXml(testing::twoSocketPcieXml(testing::kSapphireRapids, 1, 400000), "p.xml");
  Config onPci = envConfig({{"TOPOCOLL_NET_DEVICES", "ib0:200000@0000:58:00.0"}});
  topology::System s2 = topology::buildSystem(topology::prepareNodeXml(partial, {{0, 0}, {1, 1}}, onPci));
  ASSERT_EQ(s2.count(NodeType::NET), 1);
  EXPECT_EQ(s2.of(NodeType::NET)[0].name, "ib0");
  EXPECT_EQ(s2.of(NodeType::NET)[0].gdrSupport, 1);
  EXPECT_FLOAT_EQ(s2.of(NodeType::NET)[0].bw, 25.0f);
}

TEST(PluginDevices, UnknownBusIdIsNamed) {
  const auto doc = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  try {
    makePlan(doc, JobSpec{2, 0, {}}, envConfig({{"TOPOCOLL_NET_DEVICES", "ib9@0000:ee:00.0"}}));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0000:ee:00.0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("TOPOCOLL_NET_DEVICES"), std::string::npos) << e.what();
  }
}

// --- nccl-tests' sizes (tests/conformance/SCHEMA.md): AllGather/ReduceScatter buffers hold whole elements per rank.
TEST(TestSizes, AllGatherAndReduceScatterRoundToWholeElementsPerRank) {
  EXPECT_EQ(testSize(tuning::kAllGather, 128, 4, 24), 96u);  // floor(128 / 24 / 4) = 1 float per rank
  EXPECT_EQ(testSize(tuning::kReduceScatter, 8, 4, 3), 0u);  // no whole float per rank: left out
  EXPECT_EQ(testSize(tuning::kAllGather, 1024, 4, 16), 1024u);
  EXPECT_EQ(testSize(tuning::kAllReduce, 100, 4, 24), 100u);
  Plan p = makePlan(topology::loadXmlFile(testing::topoPath("azure-ncv4-a100-pcie-4gpu-4numa.xml")), JobSpec{3, 0, {}},
                    {});
  for (const auto& s : selectionTable(p, 4)) {
    if (s.coll == tuning::kAllGather || s.coll == tuning::kReduceScatter) {
      EXPECT_EQ(s.nBytes % (4 * 12), 0u) << s.nBytes;  // 12 ranks x whole floats
      EXPECT_GT(s.nBytes, 0u);
    }
  }
}

// --- Scale: a job larger than memory allows fails before planning, naming what it needs.
#if defined(__SANITIZE_ADDRESS__)
#define TOPOCOLL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TOPOCOLL_TEST_ASAN 1
#endif
#endif
TEST(PlanMemory, TooManyNodesFailsUpFront) {
#ifdef TOPOCOLL_TEST_ASAN
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: an RLIMIT_AS of 4 GiB leaves it none";
#endif
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  rlimit lim = old;
  lim.rlim_cur = 4ULL << 30;  // 4 GiB of address space: 2 GiB for the tables
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < lim.rlim_cur) lim.rlim_cur = old.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lim), 0);
  const auto doc = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  try {
    makePlan(doc, JobSpec{1 << 20, 0, {}}, {});
    ADD_FAILURE() << "a plan of 8M ranks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8388608 ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GiB"), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_AS, &old);
}

}  // namespace
}  // namespace topocoll
