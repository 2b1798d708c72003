// NIC fusion and the network plugin's view (src/topology/node_xml.cc), with NCCL's knobs.
#include "topocoll/topology/node_xml.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "topocoll/status.h"

namespace topocoll::topology {
namespace {

Config envConfig(std::map<std::string, std::string> vars) { return Config::fromEnv(Env(std::move(vars))); }

std::vector<std::string> netNames(const char* file, const Config& cfg) {
  System sys = buildSystem(prepareNodeXml(loadXmlFile(testing::topoPath(file)), {{0, 0}}, cfg));
  std::vector<std::string> names;
  for (auto& n : sys.of(NodeType::NET)) names.push_back(n.name);
  return names;
}

// OCI BM.GPU.H100.8: 8 dual-port ConnectX-7, 16 ports. By default (NCCL_NET_MERGE_LEVEL=PORT) the two ports of
// each card fuse into one virtual NIC (ncclTopoGetPath gives PATH_PORT for ports of one device: their bus ids
// differ in the function digit only).
constexpr const char* kOci = "oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml";

TEST(NicFusion, PortsOfOneCardFuseByDefault) {
  auto names = netNames(kOci, {});
  ASSERT_EQ(names.size(), 8u);
  EXPECT_EQ(names[0], "mlx5_0+mlx5_1");
}

TEST(NicFusion, MergeLevelLocAndMergeNicsZeroTurnItOff) {
  EXPECT_EQ(netNames(kOci, envConfig({{"NCCL_NET_MERGE_LEVEL", "LOC"}})).size(), 16u);
  EXPECT_EQ(netNames(kOci, envConfig({{"NCCL_IB_MERGE_NICS", "0"}})).size(), 16u);
}

// Ports under one CPU fuse at PHB, four at a time with NCCL's internal plugins: 8 ports per socket make 2 virtual
// NICs each. At SYS the groups are the same here (each socket's ports fill their groups of 4 first).
TEST(NicFusion, MergeLevelPhbFusesPerSocketUpToTheCap) {
  auto names = netNames(kOci, envConfig({{"NCCL_NET_MERGE_LEVEL", "PHB"}}));
  ASSERT_EQ(names.size(), 4u);
  for (auto& n : names) EXPECT_EQ(std::count(n.begin(), n.end(), '+') + 1, 4) << n;
  EXPECT_EQ(netNames(kOci, envConfig({{"NCCL_NET_MERGE_LEVEL", "SYS"}})), names);
}

// A group whose ports sit under different CPUs has no PCI parent to hang the virtual NIC on: NCCL refuses it.
TEST(NicFusion, FusingAcrossSocketsIsRefused) {
  try {
    netNames(kOci, envConfig({{"NCCL_NET_FORCE_MERGE", "mlx5_0,mlx5_17"}}));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different NUMA domains"), std::string::npos) << e.what();
  }
}

// NCCL_NET_FORCE_MERGE groups named ports first; the rest fuse as usual.
TEST(NicFusion, ForceMergeGroupsNamedPorts) {
  auto names = netNames(kOci, envConfig({{"NCCL_NET_FORCE_MERGE", "mlx5_0,mlx5_3"}}));
  EXPECT_NE(std::find(names.begin(), names.end(), "mlx5_0+mlx5_3"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "mlx5_1"), names.end());  // its former partner stays alone
  EXPECT_THROW(netNames(kOci, envConfig({{"NCCL_NET_FORCE_MERGE", "mlx5_0,nosuch"}})), Error);
}

// modal B200: mlx5_0..4 are the five ports of one card. NCCL's internal IB plugin leaves ncclNetVer at 0, so a
// virtual NIC has at most NCCL_NET_MAX_DEVS_PER_NIC_V11 = 4 ports; an external v12 plugin allows 8
// (src/graph/topo.cc ncclTopoGetSystem: netInfo.maxDevsPerNic).
TEST(NicFusion, PortCapFollowsTheNetPluginVersion) {
  const char* modal = "modal-b200-vm-8gpu-8x400g-2numa.xml";
  auto internal = netNames(modal, {});
  EXPECT_NE(std::find(internal.begin(), internal.end(), "mlx5_0+mlx5_1+mlx5_2+mlx5_3"), internal.end());
  EXPECT_NE(std::find(internal.begin(), internal.end(), "mlx5_4"), internal.end());
  auto v12 = netNames(modal, envConfig({{"TOPOCOLL_NET_PLUGIN_VERSION", "12"}}));
  EXPECT_NE(std::find(v12.begin(), v12.end(), "mlx5_0+mlx5_1+mlx5_2+mlx5_3+mlx5_4"), v12.end());
  // A forced group beyond the cap is refused, naming the version.
  const char* five = "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4";
  try {
    netNames(modal, envConfig({{"NCCL_NET_FORCE_MERGE", five}}));
    FAIL() << "five ports accepted with the internal plugin";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TOPOCOLL_NET_PLUGIN_VERSION"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(netNames(modal, envConfig({{"NCCL_NET_FORCE_MERGE", five}, {"TOPOCOLL_NET_PLUGIN_VERSION", "12"}})));
}

TEST(NicFusion, PluginVersionIsValidated) {
  EXPECT_THROW(envConfig({{"TOPOCOLL_NET_PLUGIN_VERSION", "5"}}), Error);  // NCCL 2.30.7 loads v6..v12
  EXPECT_THROW(envConfig({{"TOPOCOLL_NET_PLUGIN_VERSION", "13"}}), Error);
  EXPECT_EQ(envConfig({{"TOPOCOLL_NET_PLUGIN_VERSION", "9"}}).netPluginVersion, 9);
}

// The socket plugin's default device is what a real NCCL dump of a NIC-less VM shows, directly under the CPU.
TEST(PluginView, DefaultSocketDeviceLooksLikeNcclsDump) {
  XmlDoc doc = loadXmlFile(std::string(GENERATED_TOPO_DIR) + "/nc-trpro-ws-2rtx6000ada-nonic.xml");
  EXPECT_TRUE(applyPluginDevices(doc, {}));
  XmlNode* net = doc.root->find("net");
  ASSERT_NE(net, nullptr);
  EXPECT_EQ(net->parent->name, "nic");
  EXPECT_EQ(net->parent->parent->name, "cpu");
  for (auto [k, v] : std::vector<std::pair<const char*, const char*>>{
           {"name", "eth0"}, {"speed", "10000"}, {"latency", "0"}, {"port", "0"}, {"guid", "0x0"},
           {"maxconn", "65536"}, {"gdr", "0"}})
    EXPECT_EQ(*net->attr(k), v) << k;
  // An XML that has NICs keeps them.
  XmlDoc seed = loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  EXPECT_FALSE(applyPluginDevices(seed, {}));
}

TEST(PluginView, NetDevicesSyntax) {
  Config c = envConfig({{"TOPOCOLL_NET_DEVICES", "eth0,ib0:200000@0000:1c:00.0"}});
  ASSERT_EQ(c.netDeviceSpecs.size(), 2u);
  EXPECT_EQ(c.netDeviceSpecs[0], (NetDeviceSpec{"eth0", 10000, ""}));
  EXPECT_EQ(c.netDeviceSpecs[1], (NetDeviceSpec{"ib0", 200000, "0000:1c:00.0"}));
  for (const char* bad : {"eth0,eth0", ":100", "eth0:fast", "eth0@", "eth0,,eth1"})
    EXPECT_THROW(envConfig({{"TOPOCOLL_NET_DEVICES", bad}}), Error) << bad;
}

}  // namespace
}  // namespace topocoll::topology
