// Multi-node NVLink (seed 002, NCCL's MNNVL clique support): a job whose hosts are trays of one NVLink domain. The
// clique's ranks fuse their XMLs into one system with one systemId per host (topo.cc ncclTopoGetSystem, MNNVL
// branch); GPUs of different trays use P2P over the shared NVSwitch (paths.cc ncclTopoCheckMNNVL); each tray keeps
// its own NICs (no CPU link crosses hosts), a GPU reaches only its tray's NICs, PXN stays within a tray; the clique
// is one NCCL node, the network only runs between cliques; NETs are preferred GPU first (search.cc
// ncclTopoSelectNets with nHosts > 1).
#include <gtest/gtest.h>

#include <set>

#include "test_util.h"
#include "topocoll/plan.h"
#include "topocoll/paths/paths.h"
#include "topocoll/status.h"

namespace topocoll {
namespace {

using topology::NodeType;
using topology::PathType;

const char* kTrays = "oci-gb300-2tray-mnnvl-8gpu-8x800g-cx8.xml";  // 2 GB300 trays x 4 GPUs, 4 NICs each

Plan plan(int nodes, int cliqueHosts = 0, std::map<std::string, std::string> vars = {}) {
  JobSpec job;
  job.nNodes = nodes;
  job.cliqueHosts = cliqueHosts;
  return makePlan(topology::loadXmlFile(testing::topoPath(kTrays)), job, Config::fromEnv(Env(std::move(vars))));
}

TEST(Mnnvl, TwoTraysAreOneNcclNode) {
  Plan p = plan(2);
  EXPECT_EQ(p.cliqueHosts, 2);
  EXPECT_EQ(p.connect.nNodes, 1);
  EXPECT_EQ(p.connect.localRanks, 8);
  const auto& sys = p.system;
  ASSERT_EQ(sys.count(NodeType::GPU), 8);
  EXPECT_EQ(sys.hostHashes.size(), 2u);
  EXPECT_EQ(sys.inter, 0);  // one node: no network in the searches
  // Across trays: NVLink through the shared NVSwitch, usable for P2P.
  EXPECT_EQ(testing::gpuPath(sys, 0, 4).type, PathType::NVL);
  EXPECT_TRUE(paths::checkP2p(sys, {}, 0, 4));
  // The rings and the NVLS graph span both trays.
  const auto& ring = p.graphs[search::kGraphRing];
  std::set<int> hosts;
  for (int i = 0; i < 8; ++i) hosts.insert(topology::systemIdOf(sys.of(NodeType::GPU)[sys.gpuIndexOfRank(ring.intra[i])].id));
  EXPECT_EQ(hosts.size(), 2u);
  EXPECT_EQ(p.graphs[search::kGraphNvls].nChannels, 8);  // one head per GPU of the clique
  EXPECT_EQ(p.connect.nvlsChannels, 24);                 // NVLS_NCHANNELS_SM100_NVL: one node
}

TEST(Mnnvl, EachTrayKeepsItsNics) {
  Plan p = plan(4);
  const auto& sys = p.system;
  ASSERT_EQ(sys.count(NodeType::NET), 8);
  for (int g = 0; g < 8; ++g) {
    const int host = topology::systemIdOf(sys.of(NodeType::GPU)[g].id);
    for (int n = 0; n < 8; ++n) {
      const auto& path = testing::netPath(sys, g, n);
      const bool sameTray = topology::systemIdOf(sys.of(NodeType::NET)[n].id) == host;
      if (!sameTray) EXPECT_EQ(path.type, PathType::DIS) << g << " " << n;
      else EXPECT_LE(static_cast<int>(path.type), static_cast<int>(PathType::PXN)) << g << " " << n;
      if (path.type == PathType::PXN) {
        const int relay = paths::intermediateRank(sys, sys.of(NodeType::GPU)[g].rank, sys.of(NodeType::NET)[n].id);
        EXPECT_EQ(topology::systemIdOf(sys.of(NodeType::GPU)[sys.gpuIndexOfRank(relay)].id), host);
      }
    }
  }
}

// Four trays, cliques of two: two NCCL nodes, joined through the network. Every job ring visits each clique's
// ranks as one block (it leaves a clique only through a NIC, once per channel).
TEST(Mnnvl, NetworkOnlyBetweenCliques) {
  Plan p = plan(4);
  EXPECT_EQ(p.connect.nNodes, 2);
  EXPECT_EQ(p.system.inter, 1);
  for (const auto& ring : p.connect.rings) {
    int changes = 0;
    for (size_t i = 0; i < ring.size(); ++i) changes += (ring[i] / 8) != (ring[(i + 1) % ring.size()] / 8);
    EXPECT_EQ(changes, 2);
  }
}

TEST(Mnnvl, OffMeansOneNodePerTray) {
  for (int knob = 0; knob < 2; ++knob) {
    const Plan p = knob ? plan(4, 0, {{"NCCL_MNNVL_ENABLE", "0"}}) : plan(4, 1);
    EXPECT_EQ(p.cliqueHosts, 1);
    EXPECT_EQ(p.connect.nNodes, 4);
    EXPECT_EQ(p.system.count(NodeType::GPU), 4);
    EXPECT_EQ(p.system.hostHashes.size(), 1u);
  }
}

// By default a clique is as many hosts as the job and the topology divide into: one tray alone, three trays apart.
TEST(Mnnvl, DefaultCliqueAndBadShapes) {
  EXPECT_EQ(plan(1).cliqueHosts, 1);
  EXPECT_EQ(plan(3).cliqueHosts, 1);
  EXPECT_EQ(plan(6).cliqueHosts, 2);
  EXPECT_THROW(plan(4, 3), Error);   // not a divisor of the 2 trays described
  EXPECT_THROW(plan(3, 2), Error);   // 3 hosts are not whole cliques of 2
  EXPECT_THROW(plan(2, 2, {{"NCCL_MNNVL_ENABLE", "0"}}), Error);
}

}  // namespace
}  // namespace topocoll
