// Small generated topologies for tests.
#pragma once

#include <fmt/format.h>

#include <map>
#include <string>

namespace topocoll::testing {

/// An 8-GPU NVLink hybrid cube-mesh (DGX-1 V100 style): two Intel Skylake sockets, GPUs in pairs behind PCIe
/// switches, one NIC on the first switch of each socket.
inline std::string dgx1MeshXml() {
  static const std::map<int, std::map<int, int>> links = {
      {0, {{1, 1}, {2, 1}, {3, 2}, {4, 2}}}, {1, {{0, 1}, {2, 2}, {3, 1}, {5, 2}}}, {2, {{0, 1}, {1, 2}, {3, 1}, {6, 2}}},
      {3, {{0, 2}, {1, 1}, {2, 1}, {7, 2}}}, {4, {{5, 1}, {6, 1}, {7, 2}, {0, 2}}}, {5, {{4, 1}, {6, 2}, {7, 1}, {1, 2}}},
      {6, {{4, 1}, {5, 2}, {7, 1}, {2, 2}}}, {7, {{4, 2}, {5, 1}, {6, 1}, {3, 2}}}};
  auto gpuBus = [](int g) { return fmt::format("0000:{:02x}:00.0", 0x10 + g * 0x10); };
  std::string x = "<system version=\"1\">\n";
  for (int cpu = 0; cpu < 2; ++cpu) {
    x += fmt::format(
        "  <cpu host_hash=\"0x1234\" numaid=\"{}\" affinity=\"ff\" arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"6\" "
        "modelid=\"85\">\n",
        cpu);
    for (int sw = 0; sw < 2; ++sw) {
      int sb = 0x8 + cpu * 0x80 + sw * 0x40;
      x += fmt::format("    <pci busid=\"0000:{:02x}:00.0\" class=\"0x060400\" link_speed=\"8.0 GT/s PCIe\" link_width=\"16\">\n", sb);
      for (int k = 0; k < 2; ++k) {
        int g = cpu * 4 + sw * 2 + k;
        x += fmt::format("      <pci busid=\"{}\" class=\"0x030200\" link_speed=\"8.0 GT/s PCIe\" link_width=\"16\">\n", gpuBus(g));
        x += fmt::format("        <gpu dev=\"{}\" sm=\"70\" rank=\"{}\" gdr=\"1\">\n", g, g);
        for (auto [peer, count] : links.at(g))
          x += fmt::format("          <nvlink target=\"{}\" count=\"{}\" tclass=\"0x030200\"/>\n", gpuBus(peer), count);
        x += "        </gpu>\n      </pci>\n";
      }
      if (sw == 0) {
        x += fmt::format("      <pci busid=\"0000:{:02x}:00.0\" class=\"0x020000\" link_speed=\"8.0 GT/s PCIe\" link_width=\"16\">\n", sb + 4);
        x += fmt::format("        <nic>\n          <net name=\"mlx5_{}\" dev=\"{}\" speed=\"100000\" port=\"1\" guid=\"0x{}\" maxconn=\"131072\" gdr=\"1\"/>\n        </nic>\n", cpu, cpu, 100 + cpu);
        x += "      </pci>\n";
      }
      x += "    </pci>\n";
    }
    x += "  </cpu>\n";
  }
  x += "</system>\n";
  return x;
}

/// A synthetic NVSwitch domain: `nGpus` Hopper GPUs, each behind its own PCIe switch with its own 400G NIC,
/// split over two sockets (the 72-GPU case stands for a GB200-NVL72-sized domain in one system).
inline std::string nvswitchDomainXml(int nGpus, int nvlinks = 18, int sm = 90, bool collNics = false) {
  std::string x = "<system version=\"1\">\n";
  for (int cpu = 0; cpu < 2; ++cpu) {
    x += fmt::format(
        "  <cpu host_hash=\"0x99\" numaid=\"{}\" affinity=\"ffff\" arch=\"x86_64\" vendor=\"GenuineIntel\" familyid=\"6\" "
        "modelid=\"143\">\n",
        cpu);
    for (int g = cpu * nGpus / 2; g < (cpu + 1) * nGpus / 2; ++g) {
      int bus = 0x10 + g * 2;
      x += fmt::format("    <pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x060400\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n", g / 100, bus % 256);
      x += fmt::format("      <pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x030200\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n", g / 100, (bus + 1) % 256);
      x += fmt::format("        <gpu dev=\"{}\" sm=\"{}\" rank=\"{}\" gdr=\"1\">\n          <nvlink target=\"fffffff:ffff:ff\" count=\"{}\" tclass=\"0x068000\"/>\n        </gpu>\n      </pci>\n", g, sm, g, nvlinks);
      x += fmt::format("      <pci busid=\"{:04x}:{:02x}:01.0\" class=\"0x020000\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n", g / 100, (bus + 1) % 256);
      x += fmt::format("        <nic>\n          <net name=\"mlx5_{}\" dev=\"{}\" speed=\"400000\" port=\"1\" guid=\"0x{:x}\" maxconn=\"131072\" gdr=\"1\"{}/>\n        </nic>\n      </pci>\n", g, g, 0x1000 + g, collNics ? " coll=\"1\"" : "");
      x += "    </pci>\n";
    }
    x += "  </cpu>\n";
  }
  return x + "</system>\n";
}

/// The CPU of a generated socket: NCCL's arch/vendor/model decide the bandwidth between sockets
/// (src/graph/topo.h: BDW 6, SKL 10, SRP 22, ERP 40 GB/s for Intel; 16 for AMD).
struct CpuKind {
  const char* vendor = "GenuineIntel";
  int family = 6, model = 0x8F;  // Sapphire Rapids
};
constexpr CpuKind kSapphireRapids{"GenuineIntel", 6, 0x8F}, kEmeraldRapids{"GenuineIntel", 6, 0xCF},
    kSkylake{"GenuineIntel", 6, 0x55}, kZen{"AuthenticAMD", 25, 1};

/// Two sockets, each with one PCIe switch holding `gpusPerSocket` GPUs and one NIC of `nicMbps` (the shape of the
/// conformance's generated nc-spr / nc-emr machines). GPUs on `gpuSpeed` x16, switch and NIC on Gen5 x16.
inline std::string twoSocketPcieXml(CpuKind cpu, int gpusPerSocket, int nicMbps,
                                    const char* gpuSpeed = "16.0 GT/s PCIe", int sm = 89) {
  std::string x = "<system version=\"1\">\n";
  int gpu = 0;
  for (int s = 0; s < 2; ++s) {
    x += fmt::format("  <cpu numaid=\"{}\" affinity=\"ff\" arch=\"x86_64\" vendor=\"{}\" familyid=\"{}\" modelid=\"{}\">\n", s,
                     cpu.vendor, cpu.family, cpu.model);
    const int bus = 0x18 + 0x80 * s;
    x += fmt::format("    <pci busid=\"0000:{:02x}:00.0\" class=\"0x060400\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n", bus);
    for (int g = 0; g < gpusPerSocket; ++g, ++gpu) {
      x += fmt::format("      <pci busid=\"0000:{:02x}:00.0\" class=\"0x030200\" link_speed=\"{}\" link_width=\"16\">\n", bus + 2 + g,
                       gpuSpeed);
      x += fmt::format("        <gpu dev=\"{}\" sm=\"{}\" rank=\"{}\" gdr=\"1\"/>\n      </pci>\n", gpu, sm, gpu);
    }
    x += fmt::format("      <pci busid=\"0000:{:02x}:00.0\" class=\"0x020700\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n", bus + 0x40);
    x += fmt::format("        <nic><net name=\"mlx5_{}\" dev=\"{}\" speed=\"{}\" port=\"1\" guid=\"0x{:x}\" maxconn=\"131072\" gdr=\"1\"/></nic>\n", s, s,
                     nicMbps, 0x100 + s);
    x += "      </pci>\n    </pci>\n  </cpu>\n";
  }
  return x + "</system>\n";
}

/// Grace (arm64) sockets, each with `gpusPerSocket` GPUs on C2C (`c2cBw` MB/s x `c2cCount` links, as
/// nvidia-smi reports them) and `nicsPerSocket` NICs on Grace root ports; with `nvswitch` every GPU has 18 NVLinks
/// to an NVSwitch (a GB200 tray), else the GPUs see each other only through the CPUs (GH200s).
inline std::string graceXml(int sockets, int gpusPerSocket, int nicsPerSocket, bool nvswitch, int sm = 100,
                            int c2cBw = 22356, int c2cCount = 10, int nicMbps = 400000) {
  std::string x = "<system version=\"1\">\n";
  int gpu = 0, nic = 0;
  for (int s = 0; s < sockets; ++s) {
    x += fmt::format("  <cpu numaid=\"{}\" affinity=\"ff\" arch=\"arm64\">\n", s);
    for (int g = 0; g < gpusPerSocket; ++g, ++gpu) {
      x += fmt::format("    <pci busid=\"{:04x}:01:00.0\" class=\"0x030200\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n",
                       0x8 + s * 0x10 + g);
      x += fmt::format("      <gpu dev=\"{}\" sm=\"{}\" rank=\"{}\" gdr=\"1\">\n", gpu, sm, gpu);
      if (nvswitch) x += "        <nvlink target=\"fffffff:ff:ff.0\" count=\"18\" tclass=\"0x068000\"/>\n";
      x += fmt::format("        <c2c bw=\"{}\" count=\"{}\"/>\n      </gpu>\n    </pci>\n", c2cBw, c2cCount);
    }
    for (int n = 0; n < nicsPerSocket; ++n, ++nic) {
      x += fmt::format("    <pci busid=\"{:04x}:01:00.0\" class=\"0x020700\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n",
                       0x2 + s * 0x10 + n);
      x += fmt::format("      <nic><net name=\"mlx5_{}\" dev=\"{}\" speed=\"{}\" port=\"1\" guid=\"0x{:x}\" maxconn=\"131072\" gdr=\"1\"/></nic>\n",
                       nic, nic, nicMbps, 0x500 + nic);
      x += "    </pci>\n";
    }
    x += "  </cpu>\n";
  }
  return x + "</system>\n";
}

/// POWER9 sockets (AC922-like): `gpusPerSocket` V100s, each with `cpuLinks` NVLinks to its CPU and 2 to every
/// other GPU of the socket, one EDR NIC per socket on a CPU root port. `arch` lets a test build the same machine as
/// an x86 one.
inline std::string power9Xml(int sockets, int gpusPerSocket, int cpuLinks = 2, const char* arch = "ppc64") {
  std::string x = "<system version=\"1\">\n";
  auto bus = [](int s, int g) { return fmt::format("{:04x}:{:02x}:00.0", 0x4 + 2 * s, 0x4 + g); };
  int gpu = 0;
  for (int s = 0; s < sockets; ++s) {
    x += fmt::format("  <cpu numaid=\"{}\" affinity=\"ff\" arch=\"{}\"{}>\n", s * 8, arch,
                     std::string(arch) == "x86_64" ? " vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"85\"" : "");
    for (int g = 0; g < gpusPerSocket; ++g, ++gpu) {
      x += fmt::format("    <pci busid=\"{}\" class=\"0x030200\" link_speed=\"8.0 GT/s PCIe\" link_width=\"8\">\n", bus(s, g));
      x += fmt::format("      <gpu dev=\"{}\" sm=\"70\" rank=\"{}\" gdr=\"1\">\n", gpu, gpu);
      for (int p = 0; p < gpusPerSocket; ++p)
        if (p != g) x += fmt::format("        <nvlink target=\"{}\" count=\"2\" tclass=\"0x030200\"/>\n", bus(s, p));
      x += fmt::format("        <nvlink target=\"{:04x}:00:00.0\" count=\"{}\" tclass=\"0x068001\"/>\n      </gpu>\n    </pci>\n",
                       0x7 + s, cpuLinks);
    }
    x += fmt::format("    <pci busid=\"{:04x}:01:00.0\" class=\"0x020700\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n", 0x3 + 2 * s);
    x += fmt::format("      <nic><net name=\"mlx5_{}\" dev=\"{}\" speed=\"100000\" port=\"1\" guid=\"0x{:x}\" maxconn=\"131072\" gdr=\"1\"/></nic>\n",
                     s, s, 0x900 + s);
    x += "    </pci>\n  </cpu>\n";
  }
  return x + "</system>\n";
}

// A random but valid machine: 1-2 sockets, 1-3 PCIe switches per socket, 1-4 GPUs per switch, maybe a NIC per
// switch, maybe an NVSwitch connecting every GPU.
inline std::string randomPcieMachine(int sockets, int switches, int gpusPer, bool nics, bool nvswitch, int sm, int genIdx) {
  static const char* speeds[] = {"8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe"};
  std::string x = "<system version=\"1\">\n";
  int gpu = 0, net = 0, bus = 0x10;
  for (int s = 0; s < sockets; ++s) {
    x += fmt::format("<cpu host_hash=\"0x5\" numaid=\"{}\" affinity=\"f\" arch=\"x86_64\" vendor=\"AuthenticAMD\">\n", s);
    for (int w = 0; w < switches; ++w) {
      x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x060400\" link_speed=\"{}\" link_width=\"16\">\n", bus++,
                       speeds[genIdx]);
      for (int g = 0; g < gpusPer; ++g) {
        x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x030200\" link_speed=\"{}\" link_width=\"16\">\n", bus++,
                         speeds[genIdx]);
        x += fmt::format("<gpu dev=\"{}\" sm=\"{}\" rank=\"{}\" gdr=\"1\">", gpu, sm, gpu);
        if (nvswitch) x += "<nvlink target=\"fffffff:ffff:ff\" count=\"12\" tclass=\"0x068000\"/>";
        x += "</gpu></pci>\n";
        ++gpu;
      }
      if (nics) {
        x += fmt::format("<pci busid=\"0000:{:02x}:00.0\" class=\"0x020000\" link_speed=\"{}\" link_width=\"16\"><nic>", bus++,
                         speeds[genIdx]);
        x += fmt::format("<net name=\"mlx5_{}\" dev=\"{}\" speed=\"200000\" port=\"1\" guid=\"0x{:x}\" gdr=\"1\"/></nic></pci>\n",
                         net, net, 0x100 + net);
        ++net;
      }
      x += "</pci>\n";
    }
    x += "</cpu>\n";
  }
  return x + "</system>\n";
}

}  // namespace topocoll::testing
