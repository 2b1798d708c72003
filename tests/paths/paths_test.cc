#include "topocoll/paths/paths.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/status.h"

namespace topocoll::paths {
namespace {

using testing::gpuPath;
using testing::netPath;
using topology::LinkType;
using topology::NodeType;
using topology::PathType;
using topology::XmlDoc;

Config cfgWith(std::map<std::string, std::string> m) { return Config::fromEnv(Env(std::move(m))); }

TEST(Paths, SeedH100Matrix) {
  auto s = testing::nodeSystemFromFile("seed-h100-8gpu-8nic-nvswitch.xml");
  for (int g = 0; g < 8; ++g) {
    for (int p = 0; p < 8; ++p) {
      if (g == p) {
        EXPECT_EQ(gpuPath(s, g, p).type, PathType::LOC);
        continue;
      }
      EXPECT_EQ(gpuPath(s, g, p).type, PathType::NVL);
      EXPECT_FLOAT_EQ(gpuPath(s, g, p).bw, 164.8f);
    }
    for (int n = 0; n < 8; ++n) {
      EXPECT_EQ(netPath(s, g, n).type, n == g ? PathType::PIX : PathType::PXN) << g << "->" << n;
      EXPECT_FLOAT_EQ(netPath(s, g, n).bw, 48.0f);
    }
  }
  EXPECT_EQ(intermediateRank(s, 0, s.of(NodeType::NET)[3].id), 3);
  EXPECT_EQ(s.of(NodeType::NET)[5].localGpu, 5);
}

TEST(Paths, PxnDisabledGoesThroughTheCpu) {
  auto s = testing::nodeSystemFromFile("seed-h100-8gpu-8nic-nvswitch.xml", cfgWith({{"NCCL_PXN_DISABLE", "1"}}));
  EXPECT_EQ(netPath(s, 0, 0).type, PathType::PIX);
  for (int n = 1; n < 8; ++n) EXPECT_GE(static_cast<int>(netPath(s, 0, n).type), static_cast<int>(PathType::PHB));
}

TEST(Paths, NvlinkMeshHasNvbPaths) {
  XmlDoc d = topology::parseXml(testing::dgx1MeshXml(), "dgx1.xml");
  auto s = testing::nodeSystem(d);
  EXPECT_EQ(gpuPath(s, 0, 1).type, PathType::NVL);
  EXPECT_FLOAT_EQ(gpuPath(s, 0, 1).bw, 20.0f);
  EXPECT_EQ(gpuPath(s, 0, 3).type, PathType::NVL);
  EXPECT_FLOAT_EQ(gpuPath(s, 0, 3).bw, 40.0f);
  EXPECT_EQ(gpuPath(s, 0, 5).type, PathType::NVB);
  EXPECT_FLOAT_EQ(gpuPath(s, 0, 5).bw, 20.0f);
  EXPECT_EQ(gpuPath(s, 0, 7).type, PathType::NVB);
  EXPECT_FLOAT_EQ(gpuPath(s, 0, 7).bw, 40.0f);
  int inter = -1;
  EXPECT_TRUE(checkP2p(s, Config{}, 0, 7, nullptr, &inter));
  EXPECT_TRUE(inter == 3 || inter == 4) << inter;
  // NCCL_NVB_DISABLE: no path through a peer GPU; P2P falls back to PCI/SYS.
  auto s2 = testing::nodeSystem(d, cfgWith({{"NCCL_NVB_DISABLE", "1"}}));
  EXPECT_GE(static_cast<int>(gpuPath(s2, 0, 7).type), static_cast<int>(PathType::PIX));
}

TEST(Paths, PcieTwoSocketIntelRoutesAcrossSocketsThroughTheCpu) {
  auto s = testing::nodeSystemFromFile("ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml");
  EXPECT_EQ(gpuPath(s, 0, 1).type, PathType::PIX);
  EXPECT_FLOAT_EQ(gpuPath(s, 0, 1).bw, 24.0f);
  const auto& cross = gpuPath(s, 0, 4);
  EXPECT_EQ(cross.type, PathType::SYS);
  EXPECT_FLOAT_EQ(cross.bw, 10.0f);
  EXPECT_FALSE(checkP2p(s, Config{}, 0, 4));  // SYS > PXB default level
  EXPECT_TRUE(checkP2p(s, Config{}, 0, 1));
  bool viaCpu = false;
  for (auto& hop : cross.list) viaCpu |= s.link(hop).rem.type == NodeType::CPU;
  EXPECT_TRUE(viaCpu);
  EXPECT_EQ(netPath(s, 0, 0).type, PathType::SYS);
  EXPECT_FLOAT_EQ(netPath(s, 0, 0).bw, 7.0f);
  // NCCL_P2P_LEVEL=SYS allows it; NCCL_P2P_DISABLE forbids even PIX.
  EXPECT_TRUE(checkP2p(s, cfgWith({{"NCCL_P2P_LEVEL", "SYS"}}), 0, 4));
  EXPECT_FALSE(checkP2p(s, cfgWith({{"NCCL_P2P_DISABLE", "1"}}), 0, 1));
}

TEST(Paths, GdrRefusedByDistance) {
  XmlDoc d = topology::loadXmlFile(testing::topoPath("ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml"));
  d.root->visit([](topology::XmlNode& n) {
    if (n.name == "gpu" || n.name == "net") n.set("gdr", "1");
  });
  auto s = testing::nodeSystem(d, Config{}, 16);  // two nodes: NICs are used
  int64_t net = s.of(NodeType::NET)[0].id;
  EXPECT_EQ(checkGdr(s, Config{}, 0, net, false), GdrMode::kDisable);  // GPU0 is SYS away from the NIC
  EXPECT_EQ(checkGdr(s, Config{}, 4, net, false), GdrMode::kDefault);  // GPU4 shares its switch
  EXPECT_EQ(checkGdr(s, cfgWith({{"NCCL_NET_GDR_LEVEL", "SYS"}}), 0, net, false), GdrMode::kDefault);
  EXPECT_EQ(checkGdr(s, cfgWith({{"NCCL_NET_GDR_READ", "0"}}), 4, net, true), GdrMode::kDisable);
  // Without GDR, GPU0's NIC traffic is staged through its CPU.
  bool viaCpu = false;
  for (auto& hop : netPath(s, 0, 0).list) viaCpu |= s.link(hop).rem.type == NodeType::CPU;
  EXPECT_TRUE(viaCpu);
}

TEST(Paths, LocalNicQueries) {
  auto s = testing::nodeSystemFromFile("aws-p5.48xlarge-h100-8gpu-32efa-pr1226.xml");
  auto nets = closestNets(s, 0);
  ASSERT_EQ(nets.size(), 32u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(netPath(s, 0, nets[i]).type, PathType::PIX);
  auto gpus = closestGpus(s, nets[0]);
  EXPECT_EQ(gpus[0], 0);
  int c = localCpu(s, 0);
  EXPECT_GE(c, 0);
  EXPECT_FALSE(s.of(NodeType::CPU)[c].affinity.empty());
  EXPECT_EQ(cpuAffinity(s, 0), s.of(NodeType::CPU)[c].affinity);
}

TEST(Paths, TrimKeepsOnlyMyDomainAndSetsInter) {
  auto s = testing::nodeSystemFromFile("seed-h100-8gpu-8nic-nvswitch.xml", Config{}, 16);
  EXPECT_EQ(s.inter, 1);
  EXPECT_FLOAT_EQ(s.maxBw, 48.0f);
  auto s1 = testing::nodeSystemFromFile("seed-h100-8gpu-8nic-nvswitch.xml");
  EXPECT_EQ(s1.inter, 0);
  EXPECT_EQ(s1.count(NodeType::NET), 8);  // NCCL 2.30 keeps NET nodes on one node
}

TEST(Paths, PathBandwidthIsTheBottleneckOfItsLinks) {
  for (const char* f : {"seed-h100-8gpu-8nic-nvswitch.xml", "ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml",
                        "aws-p5.48xlarge-h100-8gpu-32efa-pr1226.xml", "azure-ncv4-a100-pcie-4gpu-4numa.xml"}) {
    auto s = testing::nodeSystemFromFile(f, Config{}, 64);
    for (int g = 0; g < s.count(NodeType::GPU); ++g) {
      for (int t : {0, 5}) {
        const auto& ps = s.of(NodeType::GPU)[g].paths[t];
        for (size_t i = 0; i < ps.size(); ++i) {
          if (ps[i].list.empty()) continue;
          EXPECT_FLOAT_EQ(ps[i].bw, testing::minLinkBw(s, ps[i])) << f << " gpu " << g << " type " << t << " to " << i;
        }
      }
    }
  }
}

TEST(Paths, RanksInOtherContainersAreUnreachableAndTrimmed) {
  auto doc = topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml"));
  std::vector<topology::LocalGpu> locals;
  for (int i = 0; i < 8; ++i) locals.push_back({i, i});
  auto sys = topology::buildSystem(topology::prepareNodeXml(doc, locals, Config{}));
  std::vector<int> shm = {0, 0, 0, 0, 1, 1, 1, 1};  // two containers of four GPUs on one host
  computePaths(sys, Config{}, shm);
  EXPECT_EQ(gpuPath(sys, 0, 4).type, PathType::NET);
  EXPECT_EQ(gpuPath(sys, 0, 1).type, PathType::NVL);
  prepareForSearch(sys, Config{}, 0, 8, shm);
  EXPECT_EQ(sys.count(NodeType::GPU), 4);
  EXPECT_EQ(sys.inter, 1);  // the other container is reached through the network
}

TEST(Paths, RankWithoutGpuIsAClearError) {
  auto s = testing::nodeSystemFromFile("seed-h100-8gpu-8nic-nvswitch.xml");
  EXPECT_THROW(localNet(s, Config{}, 42, 0), Error);
}

}  // namespace
}  // namespace topocoll::paths
