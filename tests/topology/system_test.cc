#include "topocoll/topology/system.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "topo_builders.h"
#include "topocoll/status.h"

namespace topocoll::topology {
namespace {

using testing::nodeSystemFromFile;

int countLinks(const System& s, NodeType from, LinkType type) {
  int n = 0;
  for (auto& node : s.of(from))
    for (auto& l : node.links) n += l.type == type;
  return n;
}

TEST(System, SeedH100NodeAndLinkCounts) {
  System s = nodeSystemFromFile("seed-h100-8gpu-8nic-nvswitch.xml");
  EXPECT_EQ(s.count(NodeType::GPU), 8);
  EXPECT_EQ(s.count(NodeType::DEV), 8);
  EXPECT_EQ(s.count(NodeType::CPU), 2);
  EXPECT_EQ(s.count(NodeType::PCI), 8);
  EXPECT_EQ(s.count(NodeType::NVS), 1);
  EXPECT_EQ(s.count(NodeType::NIC), 8);
  EXPECT_EQ(s.count(NodeType::NET), 8);
  // 8 NVLink entries x 20.6 GB/s (SM90) from every GPU to the NVSwitch in this dump.
  for (auto& dev : s.of(NodeType::DEV)) {
    float nvl = 0;
    for (auto& l : dev.links)
      if (l.type == LinkType::NVL) nvl += l.bw;
    EXPECT_FLOAT_EQ(nvl, 8 * 20.6f);
  }
  EXPECT_EQ(countLinks(s, NodeType::NVS, LinkType::NVL), 8);
  // Gen5 x16 = 48 GB/s PCI, 400 Gb/s NICs = 50 GB/s.
  for (auto& n : s.of(NodeType::NET)) EXPECT_FLOAT_EQ(n.bw, 50.0f);
  // Sapphire Rapids sockets: 22 GB/s inter-CPU.
  EXPECT_EQ(s.of(NodeType::CPU)[0].model, kCpuModelIntelSrp);
  EXPECT_FLOAT_EQ(s.of(NodeType::CPU)[0].links.back().bw, 22.0f);
  EXPECT_FLOAT_EQ(s.maxBw, 164.8f);
  EXPECT_FLOAT_EQ(s.totalBw, 164.8f);
}

TEST(System, LinkOrderIsNvlinkPciDownPciUpSys) {
  System s = nodeSystemFromFile("seed-h100-8gpu-8nic-nvswitch.xml");
  for (auto& sw : s.of(NodeType::PCI)) {
    ASSERT_FALSE(sw.links.empty());
    EXPECT_EQ(sw.links.back().rem.type, NodeType::CPU);  // up link last
  }
  for (auto& dev : s.of(NodeType::DEV)) {
    EXPECT_EQ(dev.links.front().type, LinkType::LOC);   // 5000 GB/s to its GPU
    EXPECT_EQ(dev.links[1].type, LinkType::NVL);
    EXPECT_EQ(dev.links.back().type, LinkType::PCI);
  }
  auto& cpu = s.of(NodeType::CPU)[0];
  EXPECT_EQ(cpu.links.back().type, LinkType::SYS);
}

TEST(System, PcieTwoSocketWorkstation) {
  System s = nodeSystemFromFile("ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml");
  EXPECT_EQ(s.count(NodeType::GPU), 8);
  EXPECT_EQ(s.count(NodeType::NVS), 0);
  EXPECT_EQ(s.count(NodeType::PCI), 2);
  EXPECT_EQ(s.count(NodeType::NET), 1);
  EXPECT_EQ(countLinks(s, NodeType::DEV, LinkType::NVL), 0);
  EXPECT_EQ(s.of(NodeType::CPU)[0].model, kCpuModelIntelSkl);
  EXPECT_FLOAT_EQ(s.of(NodeType::CPU)[0].links.back().bw, 10.0f);  // Skylake UPI
  EXPECT_FLOAT_EQ(s.of(NodeType::NET)[0].bw, 7.0f);                 // 56 Gb/s IB
}

TEST(System, SeveralNicsPerPciSwitch) {
  System s = nodeSystemFromFile("aws-p5.48xlarge-h100-8gpu-32efa-pr1226.xml");
  EXPECT_EQ(s.count(NodeType::NET), 32);
  EXPECT_EQ(s.count(NodeType::NIC), 32);
  int maxNicsPerSwitch = 0;
  for (auto& sw : s.of(NodeType::PCI)) {
    int n = 0;
    for (auto& l : sw.links) n += l.rem.type == NodeType::NIC;
    maxNicsPerSwitch = std::max(maxNicsPerSwitch, n);
  }
  EXPECT_EQ(maxNicsPerSwitch, 4);
  for (auto& n : s.of(NodeType::NET)) EXPECT_FLOAT_EQ(n.bw, 12.5f);
  EXPECT_EQ(s.of(NodeType::CPU)[0].vendor, kCpuVendorAmd);
}

TEST(System, BroadcomGen5SwitchesAreFlattenedAndDualPortNicsFused) {
  System s = nodeSystemFromFile("oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml");
  EXPECT_EQ(s.count(NodeType::PCI), 8);   // two-level BCM switches become one each
  EXPECT_EQ(s.count(NodeType::NET), 8);   // 16 ports fused into 8 virtual NICs
  for (auto& n : s.of(NodeType::NET)) {
    EXPECT_FLOAT_EQ(n.bw, 45.0f);
    EXPECT_GE(n.dev, 16);
    EXPECT_NE(n.name.find('+'), std::string::npos);
  }
}

TEST(System, NvlinkMeshGpuToGpuLinks) {
  XmlDoc d = parseXml(testing::dgx1MeshXml(), "dgx1.xml");
  System s = testing::nodeSystem(d);
  EXPECT_EQ(s.count(NodeType::NVS), 0);
  EXPECT_EQ(countLinks(s, NodeType::DEV, LinkType::NVL), 32);  // 4 peers per GPU
  float total = 0;
  for (auto& l : s.of(NodeType::DEV)[0].links)
    if (l.type == LinkType::NVL) total += l.bw;
  EXPECT_FLOAT_EQ(total, 6 * 20.0f);  // 6 links x 20 GB/s (SM70)
  EXPECT_FLOAT_EQ(s.totalBw, 120.0f);
}

TEST(System, PcieBandwidthFromSpeedAndWidth) {
  auto bw = [](const char* speed, const char* width) {
    std::string x = fmt::format(
        "<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\"><pci busid=\"0000:01:00.0\" "
        "class=\"0x060400\" link_speed=\"{}\" link_width=\"{}\"/></cpu></system>",
        speed, width);
    System s = buildSystem(parseXml(x));
    return s.of(NodeType::PCI)[0].links[0].bw;
  };
  EXPECT_FLOAT_EQ(bw("2.5 GT/s", "16"), 3.0f);
  EXPECT_FLOAT_EQ(bw("5.0 GT/s PCIe", "16"), 6.0f);
  EXPECT_FLOAT_EQ(bw("8 GT/s", "16"), 12.0f);
  EXPECT_FLOAT_EQ(bw("16.0 GT/s PCIe", "16"), 24.0f);
  EXPECT_FLOAT_EQ(bw("32 GT/s PCIe/s", "16"), 48.0f);  // old kernels' spelling, prefix match
  EXPECT_FLOAT_EQ(bw("64.0 GT/s PCIe", "16"), 96.0f);
  EXPECT_FLOAT_EQ(bw("16.0 GT/s PCIe", "8"), 12.0f);
  EXPECT_FLOAT_EQ(bw("", "0"), 12.0f);         // unknown: Gen3 x16 fallback, as NCCL
  EXPECT_FLOAT_EQ(bw("Unknown", ""), 12.0f);
  EXPECT_THROW(bw("fast", "16"), Error);
  EXPECT_THROW(bw("16 GT/s", "-4"), Error);
  EXPECT_THROW(bw("16 GT/s", "x16"), Error);
}

// The message of building the system of `x` (as file t.xml), "" when it builds.
std::string err(const std::string& x) {
  try {
    buildSystem(parseXml(x, "t.xml"));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(System, BadInputNamesFileLineAndAttribute) {
  std::string m = err("<system version=\"1\">\n<cpu arch=\"x86_64\" vendor=\"AuthenticAMD\"/></system>");
  EXPECT_NE(m.find("t.xml:2"), std::string::npos) << m;
  EXPECT_NE(m.find("numaid"), std::string::npos) << m;
  m = err("<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\"><pci busid=\"0000:01:00.0\" "
          "class=\"bridge\" link_speed=\"\" link_width=\"16\"/></cpu></system>");
  EXPECT_NE(m.find("class"), std::string::npos) << m;
  m = err("<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\">"
          "<pci busid=\"0000:01:00.0\" class=\"0x060400\" link_speed=\"\" link_width=\"16\"/>"
          "<pci busid=\"0000:01:00.0\" class=\"0x060400\" link_speed=\"\" link_width=\"16\"/></cpu></system>");
  EXPECT_NE(m.find("duplicate"), std::string::npos) << m;
  m = err("<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\"><pci busid=\"0000:01:00.0\" "
          "class=\"0x030200\" link_speed=\"\" link_width=\"16\"><gpu rank=\"0\" sm=\"90\" gdr=\"1\"/></pci></cpu></system>");
  EXPECT_NE(m.find("'dev'"), std::string::npos) << m;
  m = err("<system version=\"1\"><cpu numaid=\"zero\" arch=\"x86_64\"/></system>");
  EXPECT_NE(m.find("numaid=\"zero\""), std::string::npos) << m;
}

// One CPU with one PCI device holding `inside`, and an NVLink-capable GPU: values NCCL would compute nonsense with.
std::string gpuWith(const std::string& gpuAttrs, const std::string& inside = "", const std::string& pciAttrs = "") {
  return "<system version=\"1\">\n<cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n"
         "<pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"\" link_width=\"16\"" + pciAttrs + ">\n"
         "<gpu dev=\"0\" rank=\"0\" gdr=\"1\" " + gpuAttrs + ">\n" + inside + "</gpu></pci>\n"
         "<pci busid=\"0000:02:00.0\" class=\"0x030200\" link_speed=\"\" link_width=\"16\">"
         "<gpu dev=\"1\" rank=\"1\" gdr=\"1\" sm=\"90\"/></pci>\n"
         "<nic><net name=\"eth0\" dev=\"0\" speed=\"1000\" latency=\"0\"/></nic></cpu></system>";
}

TEST(System, ValuesNcclWouldComputeNonsenseWithAreErrorsNamingFileAndLine) {
  EXPECT_EQ(err(gpuWith("sm=\"90\"")), "");
  EXPECT_NE(err(gpuWith("sm=\"-90\"")).find("t.xml:4: <gpu> attribute sm=\"-90\" is out of range [0, 999]"),
            std::string::npos);
  EXPECT_NE(err(gpuWith("sm=\"1e300\"")).find("sm=\"1e300\" is out of range"), std::string::npos);
  EXPECT_NE(err(gpuWith("sm=\"99999999999999999999\"")).find("is out of range"), std::string::npos);
  EXPECT_NE(err(gpuWith("sm=\"ninety\"")).find("sm=\"ninety\" is not an integer"), std::string::npos);
  std::string nv = "<nvlink target=\"0000:02:00.0\" count=\"2147483647\" tclass=\"0x030200\"/>\n";
  EXPECT_NE(err(gpuWith("sm=\"90\"", nv)).find("t.xml:5: <nvlink> attribute count=\"2147483647\" is out of range [0, 64]"),
            std::string::npos);
  std::string c2c = "<c2c bw=\"2147483647\" count=\"2147483647\"/>\n";
  EXPECT_NE(err(gpuWith("sm=\"90\"", c2c)).find("is out of range"), std::string::npos);
  EXPECT_NE(err(gpuWith("sm=\"90\"", "", " link_width=\"2147483647\"")).find("duplicate attribute"),
            std::string::npos);
  std::string wide = gpuWith("sm=\"90\"");
  wide.replace(wide.find("link_width=\"16\""), 15, "link_width=\"99999\"");
  EXPECT_NE(err(wide).find("link_width=\"99999\" is out of range [0, 32]"), std::string::npos);
  for (const char* lat : {"nan", "inf", "-1", "1e300"}) {
    std::string x = gpuWith("sm=\"90\"");
    x.replace(x.find("latency=\"0\""), 11, std::string("latency=\"") + lat + "\"");
    std::string m = err(x);
    EXPECT_NE(m.find(std::string("t.xml:7: <net> attribute latency=\"") + lat + "\""), std::string::npos) << m;
  }
  // A device with the bus id of the switch above it.
  EXPECT_NE(err("<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n"
                "<pci busid=\"0000:01:00.0\" class=\"0x060400\" link_speed=\"\" link_width=\"16\">\n"
                "<pci busid=\"0000:01:00.0\" class=\"0x020000\" link_speed=\"\" link_width=\"16\"><nic/></pci>"
                "</pci></cpu></system>")
                .find("t.xml:3: <pci busid=\"0000:01:00.0\"> has the bus id of the PCI switch it is under"),
            std::string::npos);
}

TEST(System, ANvlinkToItselfIsKeptAsNcclKeepsIt) {
  // NVML in Azure's A100 VMs reports each GPU's NVLinks as pointing at itself; NCCL keeps them.
  System s = buildSystem(parseXml(gpuWith("sm=\"80\"", "<nvlink target=\"0000:01:00.0\" count=\"12\" "
                                                       "tclass=\"0x030200\"/>\n")));
  const Node& dev = s.of(NodeType::DEV)[0];
  EXPECT_TRUE(std::any_of(dev.links.begin(), dev.links.end(), [](const Link& l) {
    return l.type == LinkType::NVL && l.rem.type == NodeType::DEV && l.rem.index == 0;
  }));
}

TEST(System, MoreNodesOfATypeThanNcclAllowsIsAnError) {
  std::string x = "<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n";
  for (int i = 0; i <= kTopoMaxNodes; ++i)
    x += fmt::format("<pci busid=\"0000:{:02x}:{:02x}.0\" class=\"0x060400\" link_speed=\"\" link_width=\"16\"/>\n",
                     i / 32 + 1, i % 32);
  x += "</cpu></system>";
  try {
    buildSystem(parseXml(x, "t.xml"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.xml:642: more than 640 PCI nodes on one host, NCCL's limit "
                                         "(NCCL_TOPO_MAX_NODES)"),
              std::string::npos)
        << e.what();
  }
}

TEST(System, MultiHostXmlKeepsHostsApart) {
  std::string x =
      "<system version=\"1\"><cpu host_hash=\"0xa\" numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\"/>"
      "<cpu host_hash=\"0xb\" numaid=\"0\" arch=\"x86_64\" vendor=\"AuthenticAMD\"/></system>";
  System s = buildSystem(parseXml(x));
  ASSERT_EQ(s.count(NodeType::CPU), 2);
  EXPECT_EQ(s.hostHashes.size(), 2u);
  EXPECT_NE(systemIdOf(s.of(NodeType::CPU)[0].id), systemIdOf(s.of(NodeType::CPU)[1].id));
  EXPECT_TRUE(s.of(NodeType::CPU)[0].links.empty());  // no SYS link across hosts
}

TEST(System, EveryNvidiaReferenceTopologyBuilds) {
  for (const char* f : {"seed-h100-8gpu-8nic-nvswitch.xml", "oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml",
                        "oci-b300-hgx-8gpu-8x800g-cx8-2numa.xml", "modal-b200-vm-8gpu-8x400g-2numa.xml",
                        "aws-p5.48xlarge-h100-8gpu-32efa-pr1226.xml", "azure-ncv4-a100-pcie-4gpu-4numa.xml",
                        "ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml", "oci-gb300-2tray-mnnvl-8gpu-8x800g-cx8.xml"}) {
    SCOPED_TRACE(f);
    System s = nodeSystemFromFile(f);
    EXPECT_GT(s.count(NodeType::GPU), 0);
  }
}

}  // namespace
}  // namespace topocoll::topology
