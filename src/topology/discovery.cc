// Local discovery from sysfs (the files NCCL reads), NVML and the CUDA driver loaded with dlopen. The order of
// operations and the attributes follow NCCL 2.30.7 src/graph/xml.cc, src/graph/topo.cc (ncclTopoGetSystem),
// src/os/linux.cc and src/misc/utils.cc (getHostHash), and NCCL 2.28.9's xml.cc where TOPOCOLL_DISCOVERY_RULES=2.28
// asks for it (Apache-2.0, see NOTICE); the code is ours. docs/topology.md says what each source contributes.
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
#include <optional>
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

// The CUDA driver calls NCCL's ncclGpuGdrSupport amounts to (cudaDevAttrGPUDirectRDMASupported), by PCI bus id.
class CudaDriver {
 public:
  explicit CudaDriver(const std::string& library) {
    lib_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib_, "cuInit"));
    byBusId_ = reinterpret_cast<int (*)(int*, const char*)>(dlsym(lib_, "cuDeviceGetByPCIBusId"));
    attribute_ = reinterpret_cast<int (*)(int*, int, int)>(dlsym(lib_, "cuDeviceGetAttribute"));
    ok_ = init && byBusId_ && attribute_ && init(0) == 0;
    if (!ok_)
      TC_INFO(log::kGraph, "CUDA driver: {} found but not usable; GPU Direct RDMA taken from nv_peermem", library);
  }
  ~CudaDriver() {
    if (lib_) dlclose(lib_);
  }
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED of the GPU at `busId`; nullopt when the driver cannot say.
  std::optional<bool> gdrSupported(const std::string& busId) const {
    constexpr int kGpuDirectRdmaSupported = 116;
    int dev = 0, v = 0;
    if (!ok_ || byBusId_(&dev, busId.c_str()) != 0 || attribute_(&v, kGpuDirectRdmaSupported, dev) != 0)
      return std::nullopt;
    return v != 0;
  }

 private:
  void* lib_ = nullptr;
  int (*byBusId_)(int*, const char*) = nullptr;
  int (*attribute_)(int*, int, int) = nullptr;
  bool ok_ = false;
};

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
    bind(name, "nvmlDeviceGetName");
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
  int (*name)(Dev, char*, unsigned) = nullptr;

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

// A GPU's PCIe link as NCCL 2.30.7 reads it from NVML: the current generation's speed (none past gen 6, "16.0 GT/s"
// when NVML cannot say) and the current width (16 when NVML cannot say).
struct NvmlLink {
  std::optional<std::string> speed;
  std::string width;
};

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

  // NCCL's ncclTopoGetXmlFromCpu: affinity of the NUMA node, arch, and on x86 the vendor, family and model as
  // CPUID reports them (family = base + extended << 4, like NCCL). An unreadable cpumap (numaid -1 on a VM) gives
  // affinity="" in 2.30 (node<unsigned numaid>) and no affinity at all in 2.28 (node<numaid as written>).
  void fillCpu(XmlNode* c) {
    if (!c->has("affinity")) {
      const std::string& numa = *c->attr("numaid");
      if (o_.rules == DiscoveryRules::kNccl228) {
        std::string a = readSys(fmt::format("{}/devices/system/node/node{}", o_.sysfsRoot, numa), "cpumap");
        if (!a.empty()) c->set("affinity", a);
      } else {
        auto n = static_cast<unsigned>(std::strtoul(numa.c_str(), nullptr, 0));
        c->set("affinity", readSys(fmt::format("{}/devices/system/node/node{}", o_.sysfsRoot, n), "cpumap"));
      }
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

  // The <pci> element of `busId` (created, with its attributes and its parents, on first use). `nvmlLink`: a GPU's
  // link speed and width as NVML gives them (2.30 rules), instead of sysfs.
  XmlNode* pciNode(const std::string& busId, const NvmlLink* nvmlLink = nullptr) {
    if (auto it = pciByBus_.find(busId); it != pciByBus_.end()) return it->second;
    auto owned = std::make_unique<XmlNode>();
    XmlNode* node = owned.get();
    node->name = "pci";
    node->set("busid", busId);
    pciByBus_[busId] = node;
    std::string path = pciPath(busId);
    fillPci(node, path, nvmlLink);
    XmlNode* parent = parentOf(path);
    owned->parent = parent;
    // PCI children stay ordered by bus id (NCCL issue #820).
    auto pos = parent->subs.begin();
    for (; pos != parent->subs.end(); ++pos)
      if (const std::string* b = (*pos)->attr("busid"); b && busId < *b) break;
    parent->subs.insert(pos, std::move(owned));
    return node;
  }

  // class, vendor, device, subsystem ids (sysfs values that exist; class always, the others when not known yet),
  // and the link speed and width: NVML's for a GPU under 2.30 rules, else the slower of the device's and its port's
  // (0 when the port has no max_link_width, as for a GPU on a VM's root bus), or "" without a sysfs path.
  void fillPci(XmlNode* node, const std::string& path, const NvmlLink* nvmlLink) {
    for (const char* k : {"class", "vendor", "device", "subsystem_vendor", "subsystem_device"}) {
      if (path.empty() || (node->has(k) && std::strcmp(k, "class") != 0)) continue;
      if (std::string v = readSys(path, k); !v.empty()) node->set(k, v);
    }
    if (nvmlLink) {
      if (!node->has("link_speed") && nvmlLink->speed) node->set("link_speed", *nvmlLink->speed);
      node->setIfUnset("link_width", nvmlLink->width);
    }
    if (path.empty()) {
      node->setIfUnset("link_speed", "");
      node->setIfUnset("link_width", "");
      return;
    }
    if (!node->has("link_speed") && !nvmlLink) {
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
    std::unique_ptr<CudaDriver> cuda;
    for (unsigned i = 0; i < n; ++i) {
      Nvml::Dev dev = nullptr;
      Nvml::PciInfo info{};
      if (nvml.byIndex(i, &dev) != 0 || nvml.pci(dev, &info) != 0) continue;
      std::string busId = sysfsBusId(info.busId);
      std::optional<NvmlLink> link;
      if (o_.rules == DiscoveryRules::kNccl230) link = nvmlLink(nvml, dev);
      XmlNode* pci = pciNode(busId, link ? &*link : nullptr);
      pci->setIfUnset("class", "0x03");
      int major = 0, minor = 0;
      nvml.cc(dev, &major, &minor);
      int sm = major * 10 + minor;
      XmlNode* gpu = pci->child("gpu") ? pci->child("gpu") : pci->addChild("gpu");
      gpu->setIfUnset("dev", std::to_string(i));
      gpu->setIfUnset("sm", std::to_string(sm));
      nvlinks(nvml, dev, sm, gpu);
      // What ncclTopoGetSystem adds for a rank on this GPU: its rank (one rank per GPU here), GDR support as
      // ncclGpuGdrSupport asks CUDA (cudaDevAttrGPUDirectRDMASupported), and in 2.30 its MLOPart partition (the
      // number after "MLOPart" in the device name, -1 for a whole GPU).
      gpu->setIfUnset("rank", std::to_string(i));
      if (!cuda) cuda = std::make_unique<CudaDriver>(o_.cudaLibrary);
      gpu->setIfUnset("gdr", cuda->gdrSupported(busId).value_or(peermem()) ? "1" : "0");
      if (o_.rules == DiscoveryRules::kNccl230) gpu->setIfUnset("mlopart", std::to_string(mloPart(nvml, dev)));
    }
  }

  bool peermem() const {
    return access((o_.sysfsRoot + "/kernel/mm/memory_peers/nv_mem/version").c_str(), F_OK) == 0 ||
           access((o_.sysfsRoot + "/module/nvidia_peermem").c_str(), F_OK) == 0;
  }

  static NvmlLink nvmlLink(Nvml& nvml, Nvml::Dev dev) {
    NvmlLink l;
    if (unsigned gen = 0; nvml.linkGen && nvml.linkGen(dev, &gen) == 0 && gen > 0) {
      static const char* speeds[] = {"", "2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe",
                                     "32.0 GT/s PCIe", "64.0 GT/s PCIe"};
      if (gen <= 6) l.speed = speeds[gen];
    } else {
      l.speed = "16.0 GT/s";
    }
    unsigned w = 0;
    l.width = std::to_string(nvml.linkWidth && nvml.linkWidth(dev, &w) == 0 && w > 0 ? w : 16);
    return l;
  }

  static int mloPart(Nvml& nvml, Nvml::Dev dev) {
    char name[96] = {};
    if (!nvml.name || nvml.name(dev, name, sizeof(name)) != 0) return -1;
    const char* m = std::strstr(name, "MLOPart");
    return m ? std::atoi(m + 7) : -1;
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
    net->set("latency", "0");  // ncclTopoProcessNet's order: name dev latency speed port guid maxconn gdr
    net->set("speed", std::to_string(speedMbps));
    net->set("port", std::to_string(port));
    net->set("guid", guid.empty() ? "0x0" : guid);
    net->set("maxconn", "65536");
    net->set("gdr", gdr ? "1" : "0");
  }

  // The network plugin's devices: NCCL's internal IB plugin when an InfiniBand device has an ACTIVE port, else its
  // socket plugin (one device per interface chosen as the bootstrap chooses them; 10 Gb/s when the speed is unknown).
  void nics() {
    std::string ib = o_.sysfsRoot + "/class/infiniband";
    bool gdr = peermem();
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

uint64_t ncclStringHash(std::string_view bytes) {
  // Two 64-bit accumulators fed 8 little-endian bytes at a time, mixed before each word, then finalised.
  uint64_t a = 1 ^ bytes.size(), b = 1;
  for (size_t at = 0; at < bytes.size(); at += 8) {
    a += b;
    b ^= a;
    a = (a ^ (a >> 31)) * 0x9de62bbc8cef3ce3ULL;
    b = (b ^ (b >> 32)) * 0x485cd6311b599e79ULL;
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + at, std::min<size_t>(8, bytes.size() - at));
    a += word;
  }
  uint64_t h = (a ^ (a >> 31)) * 0xbac3bd562846de6bULL + b;
  return (h ^ (h >> 32)) * 0x995a187a14e7b445ULL;
}

uint64_t hostHash(const std::string& hostIdOverride) {
  if (!hostIdOverride.empty()) return ncclStringHash(hostIdOverride);
  char host[1024] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown");
  // The boot id's first whitespace-separated word (it has no spaces; NCCL reads it with %ms).
  std::string boot = readSys("/proc/sys/kernel/random", "boot_id");
  boot = boot.substr(0, boot.find_first_of(" \t\r\n"));
  return ncclStringHash(std::string(host) + boot);
}

DiscoveryOptions discoveryOptions(const Config& cfg) {
  DiscoveryOptions o;
  o.hostId = cfg.hostId;
  o.socketIfname = cfg.socketIfname;
  o.socketFamily = cfg.socketFamily;
  o.commId = cfg.commId;
  o.rules = cfg.discoveryRules == "2.28" ? DiscoveryRules::kNccl228 : DiscoveryRules::kNccl230;
  return o;
}

XmlDoc discoverLocalTopology(const DiscoveryOptions& opts) { return Discoverer(opts).run(); }

}  // namespace topocoll::topology
