// Local discovery from sysfs (the files NCCL reads) and NVML loaded with dlopen. The order of operations and the
// attributes follow NCCL 2.30.7 src/graph/xml.cc and src/os/linux.cc (Apache-2.0, see NOTICE); the code is ours.
// docs/topology.md says what each source contributes.
#include "topocoll/topology/discovery.h"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "topocoll/log.h"
#include "topocoll/netif.h"

namespace topocoll::topology {

namespace {

// NCCL's ncclOsTopoGetStrFromSys: the file's content without its last character (the newline), "" if unreadable.
std::string readSys(const std::string& dir, const std::string& file) {
  std::ifstream in(dir + "/" + file);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

struct DirCloser {
  void operator()(DIR* d) const { closedir(d); }
};

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> out;
  std::unique_ptr<DIR, DirCloser> d(opendir(path.c_str()));
  if (!d) return out;
  while (dirent* e = readdir(d.get()))
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string realPath(const std::string& p) {
  std::unique_ptr<char, decltype(&std::free)> r(realpath(p.c_str(), nullptr), &std::free);
  return r ? std::string(r.get()) : std::string();
}

std::string baseName(const std::string& p) {
  auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// NCCL's checkBDFFormat: "dddd:bb:dd.f" in hex.
bool isBdf(const std::string& s) {
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (int i : {0, 1, 2, 3, 5, 6, 8, 9, 11})
    if (!isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

uint64_t djb2(const std::string& s) {
  uint64_t r = 5381;
  for (unsigned char c : s) r = ((r << 5) + r) ^ c;
  return r;
}

// The NVML calls NCCL makes during discovery, resolved with dlopen so that nothing depends on a GPU driver.
class Nvml {
 public:
  using Dev = void*;
  struct PciInfo {  // nvmlPciInfo_t
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
  };

  explicit Nvml(const std::string& library) {
    lib_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    bind(init_, "nvmlInit_v2");
    bind(count, "nvmlDeviceGetCount_v2");
    bind(byIndex, "nvmlDeviceGetHandleByIndex_v2");
    bind(pci, "nvmlDeviceGetPciInfo_v3");
    bind(cc, "nvmlDeviceGetCudaComputeCapability");
    bind(nvlCapability, "nvmlDeviceGetNvLinkCapability");
    bind(nvlState, "nvmlDeviceGetNvLinkState");
    bind(nvlRemote, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    bind(linkGen, "nvmlDeviceGetCurrPcieLinkGeneration");
    bind(linkWidth, "nvmlDeviceGetCurrPcieLinkWidth");
    ok_ = init_ && count && byIndex && pci && cc && init_() == 0;
    if (!ok_) TC_INFO(log::kGraph, "NVML: {} found but not usable; no GPU discovered", library);
  }
  ~Nvml() {
    if (lib_) dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  bool ok() const { return ok_; }

  int (*count)(unsigned*) = nullptr;
  int (*byIndex)(unsigned, Dev*) = nullptr;
  int (*pci)(Dev, PciInfo*) = nullptr;
  int (*cc)(Dev, int*, int*) = nullptr;
  int (*nvlCapability)(Dev, unsigned, int, unsigned*) = nullptr;  // cap 0 = NVML_NVLINK_CAP_P2P_SUPPORTED
  int (*nvlState)(Dev, unsigned, int*) = nullptr;
  int (*nvlRemote)(Dev, unsigned, PciInfo*) = nullptr;
  int (*linkGen)(Dev, unsigned*) = nullptr;
  int (*linkWidth)(Dev, unsigned*) = nullptr;

 private:
  template <typename F>
  void bind(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib_, name));
  }
  void* lib_ = nullptr;
  int (*init_)() = nullptr;
  bool ok_ = false;
};

// NVML bus ids are upper case and may carry an 8-digit domain; sysfs paths use "dddd:bb:dd.f" in lower case.
std::string sysfsBusId(const char* nvmlBusId) {
  std::string b = lower(nvmlBusId);
  return b.size() > 12 ? b.substr(b.size() - 12) : b;
}

class Discoverer {
 public:
  explicit Discoverer(const DiscoveryOptions& o) : o_(o) {
    doc_.source = "<discovered>";
    doc_.root = std::make_unique<XmlNode>();
    doc_.root->name = "system";
    doc_.root->set("version", "1");
  }

  XmlDoc run() {
    gpus();
    nics();
    return std::move(doc_);
  }

 private:
  const DiscoveryOptions& o_;
  XmlDoc doc_{};
  std::map<std::string, XmlNode*> pciByBus_;
  int netCount_ = 0;

  std::string pciPath(const std::string& busId) const { return realPath(o_.sysfsRoot + "/bus/pci/devices/" + busId); }

  // NCCL's ncclTopoGetXmlFromCpu: affinity of the NUMA node (empty when unknown, e.g. numaid -1), arch, and on
  // x86 the vendor, family and model as CPUID reports them (family = base + extended << 4, like NCCL).
  void fillCpu(XmlNode* c) {
    if (!c->has("affinity")) {
      unsigned long n = std::strtoul(c->attr("numaid")->c_str(), nullptr, 0);
      c->set("affinity", readSys(fmt::format("{}/devices/system/node/node{}", o_.sysfsRoot, n), "cpumap"));
    }
#if defined(__powerpc64__)
    c->setIfUnset("arch", "ppc64");
#elif defined(__aarch64__)
    c->setIfUnset("arch", "arm64");
#else
    c->setIfUnset("arch", "x86_64");
#endif
#if defined(__x86_64__)
    if (!c->has("vendor")) {
      unsigned a = 0, b = 0, cx = 0, d = 0;
      __cpuid(0, a, b, cx, d);
      char vendor[13] = {};
      std::memcpy(vendor, &b, 4);
      std::memcpy(vendor + 4, &d, 4);
      std::memcpy(vendor + 8, &cx, 4);
      c->set("vendor", vendor);
    }
    if (!c->has("familyid")) {
      unsigned a = 0, b = 0, cx = 0, d = 0;
      __cpuid(1, a, b, cx, d);
      unsigned model = (a >> 4) & 0xf, family = (a >> 8) & 0xf, extModel = (a >> 16) & 0xf, extFamily = (a >> 20) & 0xff;
      c->set("familyid", std::to_string(family + (extFamily << 4)));
      c->set("modelid", std::to_string(model + (extModel << 4)));
    }
#endif
  }

  XmlNode* cpuWithNuma(const std::string& numaId) {
    if (XmlNode* c = doc_.root->childWith("cpu", "numaid", numaId)) return c;
    XmlNode* c = doc_.root->addChild("cpu");
    c->set("host_hash", fmt::format("{:#x}", hostHash(o_.hostId)));
    c->set("numaid", numaId);
    fillCpu(c);
    return c;
  }

  // The <pci> element of `busId` (created, with its attributes and its parents, on first use).
  XmlNode* pciNode(const std::string& busId) {
    if (auto it = pciByBus_.find(busId); it != pciByBus_.end()) return it->second;
    auto owned = std::make_unique<XmlNode>();
    XmlNode* node = owned.get();
    node->name = "pci";
    node->set("busid", busId);
    pciByBus_[busId] = node;
    std::string path = pciPath(busId);
    fillPci(node, path);
    XmlNode* parent = parentOf(path);
    owned->parent = parent;
    // PCI children stay ordered by bus id (NCCL issue #820).
    auto pos = parent->subs.begin();
    for (; pos != parent->subs.end(); ++pos)
      if (const std::string* b = (*pos)->attr("busid"); b && busId < *b) break;
    parent->subs.insert(pos, std::move(owned));
    return node;
  }

  // class, vendor, device, subsystem ids, and the slower of the device's and its port's link speed and width.
  void fillPci(XmlNode* node, const std::string& path) {
    if (path.empty()) {
      node->setIfUnset("link_speed", "");
      node->setIfUnset("link_width", "");
      return;
    }
    for (const char* k : {"class", "vendor", "device", "subsystem_vendor", "subsystem_device"}) {
      std::string v = readSys(path, k);
      if (!v.empty() || !node->has(k)) node->set(k, v);
    }
    if (!node->has("link_speed")) {
      std::string dev = readSys(path, "max_link_speed"), port = readSys(path, "../max_link_speed");
      float fd = 3.4e38f, fp = 3.4e38f;
      std::sscanf(dev.c_str(), "%f GT/s", &fd);
      std::sscanf(port.c_str(), "%f GT/s", &fp);
      node->set("link_speed", fp < fd ? port : dev);
    }
    if (!node->has("link_width")) {
      int wd = std::atoi(readSys(path, "max_link_width").c_str());
      int wp = std::atoi(readSys(path, "../max_link_width").c_str());
      node->set("link_width", std::to_string(std::min(wd, wp)));
    }
  }

  // NCCL's walk up the sysfs path: the parent is the PCI device two levels up (a switch's upstream port, skipping
  // the downstream port), or the CPU of the root complex, with the NUMA node the device reports.
  XmlNode* parentOf(const std::string& path) {
    if (path.empty()) return cpuWithNuma("-1");  // no information in sysfs: an unknown CPU
    std::string numa = readSys(path, "numa_node");
    std::string p = path;
    int slashes = 0;
    while (true) {
      auto slash = p.rfind('/');
      if (slash == std::string::npos || slash == 0) return cpuWithNuma(numa);
      p.resize(slash);
      ++slashes;
      std::string comp = baseName(p);
      if (!isBdf(comp)) return cpuWithNuma(numa);
      if (slashes == 2) return pciNode(comp);
    }
  }

  // The GPUs NVML reports, as ncclTopoFillGpu fills each: PCI chain, dev, sm, NVLinks and their target classes.
  void gpus() {
    if (!o_.useNvml) return;
    Nvml nvml(o_.nvmlLibrary);
    if (!nvml.ok()) return;
    unsigned n = 0;
    if (nvml.count(&n) != 0) return;
    for (unsigned i = 0; i < n; ++i) {
      Nvml::Dev dev = nullptr;
      Nvml::PciInfo info{};
      if (nvml.byIndex(i, &dev) != 0 || nvml.pci(dev, &info) != 0) continue;
      std::string busId = sysfsBusId(info.busId);
      XmlNode* pci = pciNode(busId);
      pci->setIfUnset("class", "0x03");
      // NCCL 2.30.7 prefers NVML's current link generation and width for GPUs (16.0 GT/s and x16 when unknown).
      if (unsigned gen = 0; nvml.linkGen && nvml.linkGen(dev, &gen) == 0 && gen > 0 && gen <= 6) {
        static const char* speeds[] = {"", "2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe",
                                       "32.0 GT/s PCIe", "64.0 GT/s PCIe"};
        pci->set("link_speed", speeds[gen]);
      }
      if (unsigned w = 0; nvml.linkWidth && nvml.linkWidth(dev, &w) == 0 && w > 0) pci->set("link_width", std::to_string(w));
      int major = 0, minor = 0;
      nvml.cc(dev, &major, &minor);
      int sm = major * 10 + minor;
      XmlNode* gpu = pci->child("gpu") ? pci->child("gpu") : pci->addChild("gpu");
      gpu->setIfUnset("dev", std::to_string(i));
      gpu->setIfUnset("sm", std::to_string(sm));
      nvlinks(nvml, dev, sm, gpu);
      // What ncclTopoGetSystem adds for a rank on this GPU: its rank (one rank per GPU here) and GDR support.
      gpu->setIfUnset("rank", std::to_string(i));
      bool peermem = access((o_.sysfsRoot + "/kernel/mm/memory_peers/nv_mem/version").c_str(), F_OK) == 0 ||
                     access((o_.sysfsRoot + "/module/nvidia_peermem").c_str(), F_OK) == 0;
      gpu->setIfUnset("gdr", peermem ? "1" : "0");
    }
  }

  void nvlinks(Nvml& nvml, Nvml::Dev dev, int sm, XmlNode* gpu) {
    int maxLinks = sm < 60 ? 0 : sm < 70 ? 4 : sm < 80 ? 6 : sm < 90 ? 12 : 18;
    for (int l = 0; l < maxLinks && nvml.nvlState && nvml.nvlRemote; ++l) {
      unsigned canP2p = 1;
      if (nvml.nvlCapability && (nvml.nvlCapability(dev, l, 0, &canP2p) != 0 || !canP2p)) continue;
      int active = 0;
      Nvml::PciInfo rem{};
      if (nvml.nvlState(dev, l, &active) != 0 || active != 1) continue;
      if (nvml.nvlRemote(dev, l, &rem) != 0) continue;
      bool printable = rem.busId[0] != '\0';
      for (const char* c = rem.busId; *c && printable; ++c) printable = isprint(static_cast<unsigned char>(*c));
      std::string target = printable ? sysfsBusId(rem.busId) : "fffffff:ffff:ff";
      if (XmlNode* link = gpu->childWith("nvlink", "target", target)) {
        link->set("count", std::to_string(std::atoi(link->attr("count")->c_str()) + 1));
      } else {
        link = gpu->addChild("nvlink");
        link->set("target", target);
        link->set("count", "1");
      }
    }
    // The class of what each NVLink reaches; an invisible or unknown target is taken as an NVSwitch.
    for (auto& s : gpu->subs) {
      if (s->name != "nvlink" || s->has("tclass")) continue;
      const std::string& target = *s->attr("target");
      std::string cls = target == "fffffff:ffff:ff" ? "" : readSys(pciPath(target), "class");
      s->set("tclass", cls.empty() ? "0x068000" : cls);
    }
  }

  // NCCL's ncclTopoFillNet: under the NIC's PCI device when its sysfs path is a PCI device, else under the first
  // CPU (a virtual or virtio interface), creating a CPU with NUMA id 0 when there is none.
  XmlNode* netParent(const std::string& name, const std::string& devicePath) {
    std::string path = devicePath.empty() ? "" : realPath(devicePath);
    if (!path.empty() && baseName(realPath(path + "/subsystem")) != "pci") {
      TC_INFO(log::kNet | log::kGraph,
              "Topology detection: network path (name = {}) {} is not a PCI device ({}). Attaching to first CPU", name,
              path, baseName(realPath(path + "/subsystem")));
      path.clear();
    }
    if (!path.empty()) {
      XmlNode* pci = pciNode(baseName(path));
      pci->setIfUnset("class", "0x02");
      return pci;
    }
    if (XmlNode* c = doc_.root->child("cpu")) return c;
    return cpuWithNuma("0");
  }

  void addNet(const std::string& name, const std::string& devicePath, int port, int speedMbps, const std::string& guid,
              bool gdr) {
    XmlNode* parent = netParent(name, devicePath);
    XmlNode* nic = parent->child("nic") ? parent->child("nic") : parent->addChild("nic");
    XmlNode* net = nic->addChild("net");
    net->set("name", name);
    net->set("dev", std::to_string(netCount_++));
    net->set("speed", std::to_string(speedMbps));
    net->set("latency", "0");
    net->set("port", std::to_string(port));
    net->set("guid", guid.empty() ? "0x0" : guid);
    net->set("maxconn", "65536");
    net->set("gdr", gdr ? "1" : "0");
  }

  // The network plugin's devices: NCCL's internal IB plugin when an InfiniBand device has an ACTIVE port, else its
  // socket plugin (one device per interface chosen as the bootstrap chooses them; 10 Gb/s when the speed is unknown).
  void nics() {
    std::string ib = o_.sysfsRoot + "/class/infiniband";
    bool gdr = access((o_.sysfsRoot + "/kernel/mm/memory_peers/nv_mem/version").c_str(), F_OK) == 0 ||
               access((o_.sysfsRoot + "/module/nvidia_peermem").c_str(), F_OK) == 0;
    for (auto& d : listDir(ib)) {
      std::string guid;
      for (char c : readSys(ib + "/" + d, "sys_image_guid"))
        if (c != ':') guid += c;
      for (auto& p : listDir(ib + "/" + d + "/ports")) {
        std::string base = ib + "/" + d + "/ports/" + p;
        if (readSys(base, "state").find("ACTIVE") == std::string::npos) continue;
        int gbps = std::atoi(readSys(base, "rate").c_str());  // "400 Gb/sec (4X NDR)"
        addNet(d, ib + "/" + d + "/device", std::atoi(p.c_str()), gbps * 1000, guid.empty() ? "" : "0x" + guid, gdr);
      }
    }
    if (netCount_ > 0) return;
    std::vector<std::string> names = o_.socketDevices;
    if (names.empty())
      for (auto& i : netif::findInterfaces(o_.socketIfname, o_.socketFamily, o_.commId)) names.push_back(i.name);
    std::string net = o_.sysfsRoot + "/class/net";
    for (auto& name : names) {
      int speed = std::atoi(readSys(net + "/" + name, "speed").c_str());
      addNet(name, net + "/" + name + "/device", 0, speed > 0 ? speed : 10000, "", false);
    }
  }
};

}  // namespace

uint64_t hostHash(const std::string& hostIdOverride) {
  if (!hostIdOverride.empty()) return djb2(hostIdOverride);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return djb2(std::string(host) + readSys("/proc/sys/kernel/random", "boot_id"));
}

XmlDoc discoverLocalTopology(const DiscoveryOptions& opts) { return Discoverer(opts).run(); }

}  // namespace topocoll::topology
