// AMD GPUs (RCCL's XML, version 2: <gpu gcn=...> with <xgmi> links): the rules RCCL applies where they differ from
// NCCL's (docs/rccl.md lists them with their place in RCCL's code), and every RCCL topology of the examples plans.
#include <dirent.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "test_util.h"
#include "topocoll/paths/paths.h"
#include "topocoll/plan.h"

namespace topocoll::topology {
namespace {

std::vector<std::string> rcclFiles() {
  std::vector<std::string> out;
  if (DIR* d = opendir(TOPO_DIR)) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("rccl-", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".xml") out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Two AMD GPUs of architecture `gcn` on one CPU, each with `count` XGMI links to the other.
std::string pairXml(const char* gcn, int count, const char* cpuVendor = "AuthenticAMD", const char* cls = "0x120000") {
  std::string x = fmt::format("<system version=\"2\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"{}\" familyid=\"25\" "
                              "modelid=\"1\">",
                              cpuVendor);
  for (int g = 0; g < 2; ++g) {
    x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
                     "<pci busid=\"0000:{:02x}:00.0\" class=\"{}\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">"
                     "<gpu dev=\"{}\" sm=\"120\" gcn=\"{}\" arch=\"38911\" rank=\"{}\" gdr=\"1\">"
                     "<xgmi target=\"0000:{:02x}:00.0\" count=\"{}\" tclass=\"{}\"/></gpu></pci></pci>",
                     0x10 + 0x20 * g, 0x11 + 0x20 * g, cls, g, gcn, g, 0x11 + 0x20 * (1 - g), count, cls);
  }
  return x + "</cpu></system>";
}

System pairSystem(const char* gcn, int count, const char* vendor = "AuthenticAMD", const char* cls = "0x120000") {
  return testing::nodeSystem(parseXml(pairXml(gcn, count, vendor, cls), "pair.xml"));
}

// topo.h ncclTopoXGMISpeed: the width of one link by architecture; the `gcn` attribute's old numbers map to names
// (archinfo.cc convertGcnArchToGcnArchName).
TEST(Rccl, XgmiLinkBandwidthByArchitecture) {
  EXPECT_EQ(gcnArchName("910"), "gfx90a");
  EXPECT_EQ(gcnArchName("908"), "gfx908");
  EXPECT_EQ(gcnArchName("gfx942"), "gfx942");
  for (auto [gcn, width] : std::vector<std::pair<const char*, float>>{
           {"906", 24}, {"908", 24}, {"910", 36}, {"940", 48}, {"gfx942", 48}, {"gfx950", 48}}) {
    SCOPED_TRACE(gcn);
    System sys = pairSystem(gcn, 2);
    EXPECT_EQ(testing::gpuPath(sys, 0, 1).type, PathType::NVL);
    EXPECT_FLOAT_EQ(testing::gpuPath(sys, 0, 1).bw, 2 * width);
  }
}

// topo.cc ncclTopoAddGpu: AMD GPUs have compute capability 60 and `sm` is their CU count; class 0x120000
// (processing accelerator) is a GPU in RCCL's class dictionary, as is 0x03.. for XGMI targets.
TEST(Rccl, AmdGpusAreSm60WithCus) {
  System sys = pairSystem("gfx942", 1);
  const Node& g = sys.of(NodeType::GPU)[0];
  EXPECT_TRUE(sys.amdGpus());
  EXPECT_EQ(g.cudaCompCap, kAmdGpuCompCap);
  EXPECT_EQ(g.cu, 120);
  EXPECT_EQ(g.gcn, "gfx942");
  EXPECT_EQ(sys.count(NodeType::PCI), 2);  // the two bridges: the accelerator function is the GPU itself
  System display = pairSystem("906", 1, "AuthenticAMD", "0x038000");
  EXPECT_EQ(testing::gpuPath(display, 0, 1).type, PathType::NVL);
}

// paths.cc ncclTopoCheckP2p (RCCL): P2P at any distance (SYS) except through ARM, Intel and Zhaoxin CPUs (PXB).
TEST(Rccl, P2pLevelByCpu) {
  auto pcieOnly = [](const char* vendor) {
    std::string x = pairXml("gfx942", 1, vendor);
    for (size_t p; (p = x.find("<xgmi")) != std::string::npos;) x.erase(p, x.find("/>", p) + 2 - p);
    return testing::nodeSystem(parseXml(x, "pcie.xml"));
  };
  System amd = pcieOnly("AuthenticAMD"), intel = pcieOnly("GenuineIntel");
  EXPECT_EQ(testing::gpuPath(amd, 0, 1).type, PathType::PHB);
  EXPECT_TRUE(paths::checkP2p(amd, {}, 0, 1));
  EXPECT_FALSE(paths::checkP2p(intel, {}, 0, 1));
}

// search.cc (AMD build): one speed list inside and across nodes, from 48 GB/s down. 48 GB/s of XGMI each way
// makes a ring of 2 GPUs at 48 (NVIDIA's pre-Hopper list would start at 40), which ncclTopoDupChannels then splits
// into 2 channels of 24 (compute capability 60, bandwidth above 25).
TEST(Rccl, SearchUsesRcclSpeeds) {
  Plan p = makePlan(parseXml(pairXml("gfx942", 1), "pair.xml"), JobSpec{1, 0, {}}, {});
  EXPECT_EQ(p.graphs[search::kGraphRing].nChannels, 2);
  EXPECT_FLOAT_EQ(p.graphs[search::kGraphRing].bwIntra, 24.0f);
}

// Every RCCL topology of the examples plans on one and two nodes: rings through all ranks, XGMI where present.
TEST(Rccl, EveryRcclTopologyPlans) {
  auto files = rcclFiles();
  ASSERT_EQ(files.size(), 15u);
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const XmlDoc doc = loadXmlFile(testing::topoPath(f));
    Plan p = makePlan(doc, JobSpec{2, 0, {}}, {});
    EXPECT_TRUE(p.system.amdGpus());
    ASSERT_FALSE(p.connect.rings.empty());
    for (auto& ring : p.connect.rings) EXPECT_EQ(static_cast<int>(ring.size()), p.nRanks);
    const bool hasXgmi = std::string(toString(*doc.root)).find("<xgmi") != std::string::npos;
    bool nvl = false;
    for (int g = 0; g < p.system.count(NodeType::GPU); ++g)
      for (int q = 0; q < p.system.count(NodeType::GPU); ++q)
        nvl |= g != q && testing::gpuPath(p.system, g, q).type == PathType::NVL;
    EXPECT_EQ(nvl, hasXgmi);
  }
}

}  // namespace
}  // namespace topocoll::topology
