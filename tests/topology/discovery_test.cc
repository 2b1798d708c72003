// Discovery against fake machines: sysfs trees built here (with the symbolic links the kernel makes) and a fake
// NVML library (fake_nvml.cc), so that the GPU, PCI switch, NVLink and NIC paths run without the hardware. The
// expected XML is what NCCL 2.30.7's discovery (src/graph/xml.cc) writes for such a machine: CPUs only where a
// device hangs, NUMA ids as sysfs says them, switch downstream ports skipped, a virtio NIC under the first CPU.
#include "topocoll/topology/discovery.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "topocoll/status.h"
#include "topocoll/topology/system.h"

namespace topocoll::topology {
namespace {

namespace fs = std::filesystem;

// A fake /sys under a temporary folder.
class FakeSysfs {
 public:
  FakeSysfs() {
    root_ = fs::path(::testing::TempDir()) / ("fake-sysfs-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
    fs::remove_all(root_);
    fs::create_directories(root_ / "bus/pci/devices");
    fs::create_directories(root_ / "bus/virtio");
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  std::string root() const { return root_.string(); }

  void write(const std::string& rel, const std::string& content) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << content << "\n";
  }
  void link(const std::string& rel, const std::string& targetRel) {
    fs::create_directories((root_ / rel).parent_path());
    fs::create_symlink(root_ / targetRel, root_ / rel);
  }
  // A PCI function at devices/<path> (path = "pci0000:00/0000:00:01.0/..."), registered under bus/pci/devices.
  void pci(const std::string& path, std::map<std::string, std::string> attrs) {
    std::string dir = "devices/" + path;
    fs::create_directories(root_ / dir);
    for (auto& [k, v] : attrs) write(dir + "/" + k, v);
    link(dir + "/subsystem", "bus/pci");
    link("bus/pci/devices/" + path.substr(path.rfind('/') + 1), dir);
  }
  void numa(int node, const std::string& cpumap) { write("devices/system/node/node" + std::to_string(node) + "/cpumap", cpumap); }

 private:
  fs::path root_;
  static inline int counter_ = 0;
};

std::map<std::string, std::string> dev(const std::string& cls, const std::string& numaNode, const std::string& speed,
                                       const std::string& width) {
  return {{"class", cls},
          {"vendor", cls.rfind("0x03", 0) == 0 ? "0x10de" : "0x15b3"},
          {"device", "0x2330"},
          {"subsystem_vendor", "0x10de"},
          {"subsystem_device", "0x16c1"},
          {"numa_node", numaNode},
          {"max_link_speed", speed},
          {"max_link_width", width}};
}

// The XML without what depends on the machine running the test (host hash, CPUID).
std::string portable(const XmlDoc& doc) {
  XmlDoc d = doc.clone();
  d.root->visit([](XmlNode& n) {
    for (const char* k : {"host_hash", "vendor", "familyid", "modelid"})
      if (n.name == "cpu") n.unset(k);
  });
  return toString(*d.root);
}

class FakeNvml {
 public:
  explicit FakeNvml(const std::string& config) {
    path_ = ::testing::TempDir() + "/fake-nvml-" + std::to_string(getpid()) + ".txt";
    std::ofstream(path_) << config;
    setenv("FAKE_NVML_CONFIG", path_.c_str(), 1);
  }
  ~FakeNvml() {
    unsetenv("FAKE_NVML_CONFIG");
    std::remove(path_.c_str());
  }

 private:
  std::string path_;
};

// hostname + boot id of the VM whose NCCL dump is tests/fixtures/nccl-2.28.9-h100-vm.xml.
constexpr const char* kVmHostId = "vm0c647e01-7322-4dce-9081-d7d0f990794a";

DiscoveryOptions optionsFor(const FakeSysfs& sys, std::vector<std::string> socketDevices = {}) {
  DiscoveryOptions o;
  o.sysfsRoot = sys.root();
  o.nvmlLibrary = FAKE_NVML_PATH;
  o.cudaLibrary = FAKE_NVML_PATH;
  o.hostId = "test-host";
  o.socketDevices = std::move(socketDevices);
  return o;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The lent one-H100 cloud VM (tests/fixtures/nccl-2.28.9-h100-vm.xml) is, as a probe of its /sys showed:
// every PCI function on the root bus with numa_node -1, only the GPU with link attributes (no port above it), eth0 a
// virtio device under 0000:00:03.0 reporting speed -1, node0 the only NUMA node.
void cloudVm(FakeSysfs& sys) {
  sys.numa(0, "ffff");
  auto fn = [&](const std::string& bdf, const std::string& cls, const std::string& device) {
    sys.pci("pci0000:00/" + bdf, {{"class", cls}, {"vendor", "0x1af4"}, {"device", device}, {"numa_node", "-1"}});
  };
  fn("0000:00:00.0", "0x060000", "0x0d57");
  fn("0000:00:01.0", "0x018000", "0x1042");
  fn("0000:00:02.0", "0x018000", "0x1042");
  fn("0000:00:03.0", "0x020000", "0x1041");
  fn("0000:00:04.0", "0xffff00", "0x1053");
  fn("0000:00:05.0", "0xffff00", "0x1044");
  sys.pci("pci0000:00/0000:00:06.0", dev("0x030200", "-1", "32.0 GT/s PCIe", "16"));
  sys.write("devices/pci0000:00/0000:00:03.0/virtio2/features", "1");
  sys.link("devices/pci0000:00/0000:00:03.0/virtio2/subsystem", "bus/virtio");
  sys.link("class/net/eth0/device", "devices/pci0000:00/0000:00:03.0/virtio2");
  sys.write("class/net/eth0/speed", "-1");
}

// NCCL's dump of that VM (tests/fixtures/README.md), with the CPU's CPUID attributes taken from this machine.
std::string ncclVmDump() {
  XmlDoc d = parseXml(readFile(FIXTURE_DIR "/nccl-2.28.9-h100-vm.xml"));
  XmlNode* cpu = d.root->child("cpu");
  XmlDoc here = discoverLocalTopology([] {
    DiscoveryOptions o;
    o.useNvml = false;
    o.socketDevices = {"lo"};
    return o;
  }());
  for (const char* k : {"vendor", "familyid", "modelid"})
    if (const std::string* v = here.root->child("cpu")->attr(k)) cpu->set(k, *v);
  return toString(*d.root);
}

XmlDoc discoverVm(DiscoveryRules rules) {
  FakeSysfs sys;
  cloudVm(sys);
  FakeNvml nvml("gpu 00000000:00:06.0 9 0\nwidth 0 16\ngen 0 5\ngdr 0 1\n");
  DiscoveryOptions o = optionsFor(sys, {"eth0"});
  o.hostId = kVmHostId;
  o.rules = rules;
  return discoverLocalTopology(o);
}

// Under NCCL 2.28's rules our dump of the VM is NCCL 2.28.9's, element by element and attribute by attribute: the
// GPU's link width 0 (sysfs: the root bus has no max_link_width above it), no affinity (node-1 has no cpumap),
// gdr="1" (CUDA says the H100 supports GPU Direct RDMA), eth0 under the first CPU.
TEST(Discovery, CloudVmUnderNccl228RulesIsNcclsDump) {
  EXPECT_EQ(toString(*discoverVm(DiscoveryRules::kNccl228).root), ncclVmDump());
}

// NCCL builds its system from that dump, numaid="-1" included (the CPU's id is NCCL_TOPO_ID(0, -1)); so do we
// (plan and comm-check on the VM refused it before).
TEST(Discovery, CloudVmDumpBuildsASystem) {
  System s = buildSystem(parseXml(ncclVmDump()));
  EXPECT_EQ(s.count(NodeType::CPU), 1);
  EXPECT_EQ(s.count(NodeType::GPU), 1);
  EXPECT_EQ(s.count(NodeType::NET), 1);
  EXPECT_EQ(s.of(NodeType::CPU)[0].id, makeId(0, -1));
}

// NCCL 2.30.7 reads the GPU's link from NVML (x16, gen 5), writes affinity="" and the GPU's mlopart: exactly
// those three differences (docs/topology.md).
TEST(Discovery, CloudVmUnderNccl230RulesDiffersOnlyAsNccl230Does) {
  std::string want = ncclVmDump();
  auto replace = [&](const std::string& from, const std::string& to) {
    auto at = want.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    want.replace(at, from.size(), to);
  };
  replace("numaid=\"-1\" arch", "numaid=\"-1\" affinity=\"\" arch");
  replace("link_width=\"0\"", "link_width=\"16\"");
  replace("gdr=\"1\"/>", "gdr=\"1\" mlopart=\"-1\"/>");
  EXPECT_EQ(toString(*discoverVm(DiscoveryRules::kNccl230).root), want);
}

// The host hash is NCCL's getHostHash: its string hash of hostname + boot id (here given whole, as NCCL_HOSTID
// would be), so the dump's host_hash is the one NCCL wrote on that boot.
TEST(Discovery, HostHashIsNcclsHashOfHostnameAndBootId) {
  XmlDoc nccl = parseXml(readFile(FIXTURE_DIR "/nccl-2.28.9-h100-vm.xml"));
  EXPECT_EQ(fmt::format("{:#x}", hostHash(kVmHostId)), *nccl.root->child("cpu")->attr("host_hash"));
  // Values NCCL 2.30.7's getHash gives for these strings.
  EXPECT_EQ(ncclStringHash(""), 0x75b6431c590e86a2ULL);
  EXPECT_EQ(ncclStringHash("a"), 0xf67f960500f37951ULL);
  EXPECT_EQ(ncclStringHash("node-a"), 0xae2423acfbeb25b2ULL);
  EXPECT_EQ(ncclStringHash("some-long-string-over-sixteen"), 0xb7a65098d683d9c0ULL);
}

// A DGX-like tray: per NUMA node a PCIe switch (upstream port, downstream ports) with two GPUs and one NIC, and
// NVLinks from every GPU to two NVSwitches (one of them not visible in sysfs).
TEST(Discovery, DgxLikeTrayWithSwitchesNvlinksAndInfiniband) {
  FakeSysfs sys;
  sys.numa(0, "00000000,0000ffff");
  sys.numa(1, "00000000,ffff0000");
  const char* rp[] = {"pci0000:00/0000:00:01.0", "pci0000:80/0000:80:01.0"};
  for (int s = 0; s < 2; ++s) {
    std::string numa = std::to_string(s);
    std::string up = fmt::format("{}/0000:{:02x}:00.0", rp[s], 0x10 + 0x80 * s);
    sys.pci(rp[s], dev("0x060400", numa, "32.0 GT/s PCIe", "16"));
    sys.pci(up, dev("0x060400", numa, "32.0 GT/s PCIe", "16"));
    for (int port = 0; port < 3; ++port) {
      std::string down = fmt::format("{}/0000:{:02x}:{:02x}.0", up, 0x11 + 0x80 * s, port);
      sys.pci(down, dev("0x060400", numa, "32.0 GT/s PCIe", "16"));
      std::string bdf = fmt::format("0000:{:02x}:00.0", 0x12 + port + 0x80 * s);
      sys.pci(down + "/" + bdf, dev(port < 2 ? "0x030200" : "0x020700", numa, "32.0 GT/s PCIe", "16"));
      if (port == 2) {
        std::string ib = fmt::format("class/infiniband/mlx5_{}", s);
        sys.link(ib + "/device", "devices/" + down + "/" + bdf);
        sys.write(ib + "/sys_image_guid", s == 0 ? "b83f:d203:00aa:0001" : "b83f:d203:00aa:0002");
        sys.write(ib + "/ports/1/state", "4: ACTIVE");
        sys.write(ib + "/ports/1/rate", "400 Gb/sec (4X NDR)");
      }
    }
  }
  sys.pci("pci0000:00/0000:00:09.0", dev("0x068000", "0", "", ""));  // NVSwitch seen in sysfs
  sys.write("kernel/mm/memory_peers/nv_mem/version", "1.0");
  std::string cfg;
  for (int g = 0; g < 4; ++g) {
    cfg += fmt::format("gpu 00000000:{:02X}:00.0 9 0\n", 0x12 + (g % 2) + 0x80 * (g / 2));
    for (int l = 0; l < 9; ++l) cfg += fmt::format("nvlink {} 00000000:00:09.0\n", g);
    for (int l = 0; l < 9; ++l) cfg += fmt::format("nvlink {} -\n", g);
  }
  FakeNvml nvml(cfg);
  XmlDoc d = discoverLocalTopology(optionsFor(sys));
  std::string x = portable(d);
  // One CPU per socket, with its affinity. NCCL climbs two sysfs levels at a time, so the switch's upstream port
  // hangs directly under the CPU (its root port skipped) and the GPUs and NIC under it (downstream ports skipped).
  EXPECT_NE(x.find("<cpu numaid=\"0\" affinity=\"00000000,0000ffff\" arch=\"x86_64\">"), std::string::npos) << x;
  EXPECT_NE(x.find("<cpu numaid=\"1\" affinity=\"00000000,ffff0000\" arch=\"x86_64\">"), std::string::npos) << x;
  XmlNode* cpu0 = d.root->childWith("cpu", "numaid", "0");
  ASSERT_NE(cpu0, nullptr);
  XmlNode* up0 = cpu0->childWith("pci", "busid", "0000:10:00.0");
  ASSERT_NE(up0, nullptr) << x;
  ASSERT_EQ(up0->subs.size(), 3u) << x;  // two GPUs and the NIC, downstream ports skipped
  EXPECT_EQ(*up0->subs[0]->attr("busid"), "0000:12:00.0");
  EXPECT_EQ(*up0->subs[2]->attr("busid"), "0000:14:00.0");
  XmlNode* gpu = up0->subs[0]->child("gpu");
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(*gpu->attr("gdr"), "1");  // CUDA cannot say (no gdr line): nv_peermem present
  XmlNode* sw = gpu->childWith("nvlink", "target", "0000:00:09.0");
  ASSERT_NE(sw, nullptr);
  EXPECT_EQ(*sw->attr("count"), "9");
  EXPECT_EQ(*sw->attr("tclass"), "0x068000");
  XmlNode* hidden = gpu->childWith("nvlink", "target", "fffffff:ffff:ff");
  ASSERT_NE(hidden, nullptr);
  EXPECT_EQ(*hidden->attr("tclass"), "0x068000");  // invisible NVLink peers are taken as NVSwitches
  XmlNode* net = up0->subs[2]->child("nic")->child("net");
  ASSERT_NE(net, nullptr);
  EXPECT_EQ(toString(*net), "<net name=\"mlx5_0\" dev=\"0\" latency=\"0\" speed=\"400000\" port=\"1\" "
                            "guid=\"0xb83fd20300aa0001\" maxconn=\"65536\" gdr=\"1\"/>\n");
  // The discovered machine builds and plans: 4 GPUs, NVSwitch, 2 NICs.
  System s = buildSystem(d);
  EXPECT_EQ(s.count(NodeType::GPU), 4);
  EXPECT_EQ(s.count(NodeType::NET), 2);
  EXPECT_EQ(s.count(NodeType::NVS), 1);
}

// A two-socket PCIe workstation: GPUs under root ports of both sockets, no NVLink, an onboard Ethernet port that is
// a PCI device (so it hangs from its PCI function, not from the first CPU).
TEST(Discovery, TwoSocketPcieBoxWithAnOnboardEthernetPort) {
  FakeSysfs sys;
  sys.numa(0, "0000ffff");
  sys.numa(1, "ffff0000");
  sys.pci("pci0000:00/0000:00:02.0", dev("0x060400", "0", "16.0 GT/s PCIe", "16"));
  sys.pci("pci0000:00/0000:00:02.0/0000:01:00.0", dev("0x030000", "0", "16.0 GT/s PCIe", "16"));
  sys.pci("pci0000:80/0000:80:02.0", dev("0x060400", "1", "8.0 GT/s PCIe", "16"));
  sys.pci("pci0000:80/0000:80:02.0/0000:81:00.0", dev("0x030000", "1", "16.0 GT/s PCIe", "16"));
  sys.pci("pci0000:00/0000:00:1f.6", dev("0x020000", "0", "", ""));
  sys.link("class/net/eno1/device", "devices/pci0000:00/0000:00:1f.6");
  sys.write("class/net/eno1/speed", "1000");
  FakeNvml nvml("gpu 00000000:01:00.0 8 6\ngpu 00000000:81:00.0 8 6\ngdr 0 0\ngdr 1 0\n");
  DiscoveryOptions o = optionsFor(sys, {"eno1"});
  o.rules = DiscoveryRules::kNccl228;  // GPU links from sysfs, as NCCL 2.28 reads them
  XmlDoc d = discoverLocalTopology(o);
  std::string x = portable(d);
  EXPECT_EQ(x,
            "<system version=\"1\">\n"
            "  <cpu numaid=\"0\" affinity=\"0000ffff\" arch=\"x86_64\">\n"
            "    <pci busid=\"0000:00:1f.6\" class=\"0x020000\" vendor=\"0x15b3\" device=\"0x2330\" "
            "subsystem_vendor=\"0x10de\" subsystem_device=\"0x16c1\" link_speed=\"\" link_width=\"0\">\n"
            "      <nic>\n"
            "        <net name=\"eno1\" dev=\"0\" latency=\"0\" speed=\"1000\" port=\"0\" guid=\"0x0\" maxconn=\"65536\" "
            "gdr=\"0\"/>\n"
            "      </nic>\n"
            "    </pci>\n"
            "    <pci busid=\"0000:01:00.0\" class=\"0x030000\" vendor=\"0x10de\" device=\"0x2330\" "
            "subsystem_vendor=\"0x10de\" subsystem_device=\"0x16c1\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
            "      <gpu dev=\"0\" sm=\"86\" rank=\"0\" gdr=\"0\"/>\n"
            "    </pci>\n"
            "  </cpu>\n"
            "  <cpu numaid=\"1\" affinity=\"ffff0000\" arch=\"x86_64\">\n"
            "    <pci busid=\"0000:81:00.0\" class=\"0x030000\" vendor=\"0x10de\" device=\"0x2330\" "
            "subsystem_vendor=\"0x10de\" subsystem_device=\"0x16c1\" link_speed=\"8.0 GT/s PCIe\" link_width=\"16\">\n"
            "      <gpu dev=\"1\" sm=\"86\" rank=\"1\" gdr=\"0\"/>\n"
            "    </pci>\n"
            "  </cpu>\n"
            "</system>\n")
      << x;
  // The slower of the GPU's and its root port's speeds is the link's (8 GT/s on socket 1).
  System s = buildSystem(d);
  EXPECT_EQ(s.count(NodeType::GPU), 2);
  EXPECT_EQ(s.count(NodeType::CPU), 2);
}

TEST(Discovery, ThisMachineGivesAValidTopologyThatLoadsAgain) {
  XmlDoc d = discoverLocalTopology();
  ASSERT_TRUE(d.root);
  EXPECT_EQ(d.root->name, "system");
  ASSERT_NE(d.root->child("cpu"), nullptr);  // at least the socket plugin's interface hangs from a CPU
  std::string text = toString(*d.root);
  XmlDoc again = parseXml(text);
  EXPECT_EQ(toString(*again.root), text);
  System s = buildSystem(again);
  EXPECT_GE(s.count(NodeType::CPU), 1);
  EXPECT_GT(s.of(NodeType::CPU)[0].arch, 0);
}

TEST(Discovery, HostIdOverrideIsStable) {
  EXPECT_EQ(hostHash("node-a"), hostHash("node-a"));
  EXPECT_NE(hostHash("node-a"), hostHash("node-b"));
}

TEST(Discovery, RulesKnobSelectsNcclsRelease) {
  Config cfg;
  EXPECT_EQ(discoveryOptions(cfg).rules, DiscoveryRules::kNccl230);
  using Vars = std::map<std::string, std::string>;
  cfg = Config::fromEnv(Env(Vars{{"TOPOCOLL_DISCOVERY_RULES", "2.28"}, {"NCCL_HOSTID", "h"}}));
  EXPECT_EQ(discoveryOptions(cfg).rules, DiscoveryRules::kNccl228);
  EXPECT_EQ(discoveryOptions(cfg).hostId, "h");
  EXPECT_THROW(Config::fromEnv(Env(Vars{{"TOPOCOLL_DISCOVERY_RULES", "2.29"}})), Error);
}

TEST(Discovery, NoSysfsNoNvmlStillGivesTheNicsCpu) {
  DiscoveryOptions o;
  o.sysfsRoot = "/nonexistent-sysfs";
  o.useNvml = false;
  o.socketDevices = {"eth0"};
  XmlDoc d = discoverLocalTopology(o);
  XmlNode* cpu = d.root->child("cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(*cpu->attr("numaid"), "0");  // NCCL's default CPU for a NIC with nowhere else to go
  EXPECT_NE(cpu->child("nic"), nullptr);
}

}  // namespace
}  // namespace topocoll::topology
