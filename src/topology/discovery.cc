// Local discovery from sysfs (the same files NCCL reads), /proc/cpuinfo and, when present, NVML loaded with
// dlopen. See docs/topology.md for what each source contributes.
#include "topocoll/topology/discovery.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace topocoll::topology {

namespace {

std::string readTrim(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> out;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string realPath(const std::string& p) {
  char buf[PATH_MAX];
  if (!realpath(p.c_str(), buf)) return "";
  return buf;
}

bool isBdf(const std::string& s) {
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (int i : {0, 1, 2, 3, 5, 6, 8, 9, 11})
    if (!isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

uint64_t djb2(const std::string& s) {
  uint64_t r = 5381;
  for (unsigned char c : s) r = ((r << 5) + r) ^ c;
  return r;
}

// Minimal NVML surface, resolved with dlopen so that nothing depends on a GPU driver being installed.
struct Nvml {
  void* lib = nullptr;
  using Dev = void*;
  struct PciInfo {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
  };
  int (*init)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*byIndex)(unsigned, Dev*) = nullptr;
  int (*pci)(Dev, PciInfo*) = nullptr;
  int (*cc)(Dev, int*, int*) = nullptr;
  int (*nvlState)(Dev, unsigned, int*) = nullptr;
  int (*nvlRemote)(Dev, unsigned, PciInfo*) = nullptr;
  bool ok = false;

  Nvml() {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    count = reinterpret_cast<int (*)(unsigned*)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
    byIndex = reinterpret_cast<int (*)(unsigned, Dev*)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    pci = reinterpret_cast<int (*)(Dev, PciInfo*)>(dlsym(lib, "nvmlDeviceGetPciInfo_v3"));
    cc = reinterpret_cast<int (*)(Dev, int*, int*)>(dlsym(lib, "nvmlDeviceGetCudaComputeCapability"));
    nvlState = reinterpret_cast<int (*)(Dev, unsigned, int*)>(dlsym(lib, "nvmlDeviceGetNvLinkState"));
    nvlRemote = reinterpret_cast<int (*)(Dev, unsigned, PciInfo*)>(dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2"));
    ok = init && count && byIndex && pci && cc && init() == 0;
  }
  ~Nvml() {
    if (lib) dlclose(lib);
  }
};

class Discoverer {
 public:
  explicit Discoverer(const DiscoveryOptions& o) : o_(o) {}

  XmlDoc run() {
    doc_.source = "<discovered>";
    doc_root_has_cpu();
    for (auto& n : listDir(o_.sysfsRoot + "/devices/system/node")) {
      if (n.rfind("node", 0) == 0 && n.size() > 4 && isdigit(static_cast<unsigned char>(n[4])))
        cpu(std::atoi(n.c_str() + 4));
    }
    if (!doc_.root->child("cpu")) cpu(0);
    gpus();
    nics();
    return std::move(doc_);
  }

 private:
  const DiscoveryOptions& o_;
  XmlDoc doc_{};
  std::map<std::string, XmlNode*> pciByBus_;

  bool doc_root_has_cpu() {
    if (!doc_.root) {
      doc_.root = std::make_unique<XmlNode>();
      doc_.root->name = "system";
      doc_.root->set("version", "1");
    }
    return doc_.root->child("cpu") != nullptr;
  }

  XmlNode* cpu(int numa) {
    doc_root_has_cpu();
    if (XmlNode* c = doc_.root->childWith("cpu", "numaid", std::to_string(numa))) return c;
    XmlNode* c = doc_.root->addChild("cpu");
    c->set("host_hash", fmt::format("{:#x}", hostHash(o_.hostId)));
    c->set("numaid", std::to_string(numa));
    std::string aff = readTrim(fmt::format("{}/devices/system/node/node{}/cpumap", o_.sysfsRoot, numa));
    if (!aff.empty()) c->set("affinity", aff);
    utsname u{};
    uname(&u);
    std::string m = u.machine;
    c->set("arch", m == "aarch64" ? "arm64" : m.rfind("ppc64", 0) == 0 ? "ppc64" : "x86_64");
    if (m == "x86_64") {
      std::ifstream in(o_.procRoot + "/cpuinfo");
      std::string line, vendor, family, model;
      while (std::getline(in, line) && (vendor.empty() || family.empty() || model.empty())) {
        auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string k = line.substr(0, colon), v = line.substr(colon + 1);
        while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
        while (!v.empty() && v.front() == ' ') v.erase(v.begin());
        if (k == "vendor_id" && vendor.empty()) vendor = v;
        if (k == "cpu family" && family.empty()) family = v;
        if (k == "model" && model.empty()) model = v;
      }
      if (!vendor.empty()) c->set("vendor", vendor);
      if (!family.empty()) c->set("familyid", family);
      if (!model.empty()) c->set("modelid", model);
    }
    return c;
  }

  static std::string minSpeed(const std::string& a, const std::string& b) {
    float fa = a.empty() ? 1e30f : std::strtof(a.c_str(), nullptr);
    float fb = b.empty() ? 1e30f : std::strtof(b.c_str(), nullptr);
    return fb < fa ? b : a;
  }

  // Creates the <pci> chain for a device, collapsing switch downstream ports as NCCL does (a device hangs off
  // the upstream port two levels above it; a root port is skipped and the chain ends at the CPU).
  XmlNode* pciNode(const std::string& bdf, const char* defaultClass) {
    if (auto it = pciByBus_.find(bdf); it != pciByBus_.end()) return it->second;
    std::string dir = o_.sysfsRoot + "/bus/pci/devices/" + bdf;
    std::string real = realPath(dir);
    std::vector<std::string> chain;
    for (auto& part : split(real, '/'))
      if (isBdf(part)) chain.push_back(part);
    XmlNode* parent = nullptr;
    if (chain.size() >= 3) {
      parent = pciNode(chain[chain.size() - 3], "0x060400");
    } else {
      std::string numa = readTrim(dir + "/numa_node");
      int n = numa.empty() ? 0 : std::atoi(numa.c_str());
      parent = cpu(n < 0 ? 0 : n);
    }
    auto node = std::make_unique<XmlNode>();
    node->name = "pci";
    node->parent = parent;
    node->set("busid", bdf);
    std::string cls = readTrim(dir + "/class");
    node->set("class", cls.empty() ? defaultClass : cls);
    for (const char* k : {"vendor", "device", "subsystem_vendor", "subsystem_device"}) {
      std::string v = readTrim(dir + "/" + k);
      if (!v.empty()) node->set(k, v);
    }
    std::string speed = minSpeed(readTrim(dir + "/max_link_speed"), readTrim(dir + "/../max_link_speed"));
    node->set("link_speed", speed);
    std::string w1 = readTrim(dir + "/max_link_width"), w2 = readTrim(dir + "/../max_link_width");
    int width = std::min(w1.empty() ? 0 : std::atoi(w1.c_str()), w2.empty() ? 0 : std::atoi(w2.c_str()));
    if (w1.empty() || w2.empty()) width = std::max(w1.empty() ? 0 : std::atoi(w1.c_str()), w2.empty() ? 0 : std::atoi(w2.c_str()));
    node->set("link_width", std::to_string(width));
    // Keep PCI children ordered by bus id, as NCCL does.
    auto pos = parent->subs.begin();
    while (pos != parent->subs.end()) {
      const std::string* b = (*pos)->attr("busid");
      if (b && bdf < *b) break;
      ++pos;
    }
    XmlNode* raw = node.get();
    parent->subs.insert(pos, std::move(node));
    pciByBus_[bdf] = raw;
    return raw;
  }

  void gpus() {
    if (!o_.useNvml) return;
    Nvml nvml;
    if (!nvml.ok) return;
    unsigned n = 0;
    if (nvml.count(&n) != 0) return;
    for (unsigned i = 0; i < n; ++i) {
      Nvml::Dev dev = nullptr;
      Nvml::PciInfo info{};
      if (nvml.byIndex(i, &dev) != 0 || nvml.pci(dev, &info) != 0) continue;
      std::string bdf = info.busId;
      std::transform(bdf.begin(), bdf.end(), bdf.begin(), ::tolower);
      if (bdf.size() > 12) bdf = bdf.substr(bdf.size() - 12);
      XmlNode* pci = pciNode(bdf, "0x030000");
      int major = 0, minor = 0;
      nvml.cc(dev, &major, &minor);
      XmlNode* gpu = pci->child("gpu") ? pci->child("gpu") : pci->addChild("gpu");
      gpu->set("dev", std::to_string(i));
      gpu->set("sm", std::to_string(major * 10 + minor));
      gpu->set("gdr", "1");
      int maxLinks = major * 10 + minor < 60 ? 0 : major < 7 ? 4 : major < 8 ? 6 : major < 9 ? 12 : 18;
      for (int l = 0; l < maxLinks && nvml.nvlState && nvml.nvlRemote; ++l) {
        int active = 0;
        Nvml::PciInfo rem{};
        if (nvml.nvlState(dev, l, &active) != 0 || active != 1) continue;
        if (nvml.nvlRemote(dev, l, &rem) != 0) continue;
        std::string target = rem.busId;
        std::transform(target.begin(), target.end(), target.begin(), ::tolower);
        if (target.size() > 12) target = target.substr(target.size() - 12);
        if (target.empty()) target = "fffffff:ffff:ff";
        XmlNode* link = gpu->childWith("nvlink", "target", target);
        if (!link) {
          link = gpu->addChild("nvlink");
          link->set("target", target);
          link->set("count", "1");
        } else {
          link->set("count", std::to_string(std::atoi(link->attr("count")->c_str()) + 1));
        }
      }
      for (auto& s : gpu->subs) {
        if (s->name != "nvlink" || s->has("tclass") || !s->has("target")) continue;
        std::string cls = readTrim(o_.sysfsRoot + "/bus/pci/devices/" + *s->attr("target") + "/class");
        s->set("tclass", cls.empty() ? "0x068000" : cls);
      }
    }
  }

  void addNet(const std::string& name, const std::string& devPath, int port, int speedMbps, const std::string& guid,
              bool gdr) {
    std::string real = realPath(devPath);
    std::string bdf;
    for (auto& part : split(real, '/'))
      if (isBdf(part)) bdf = part;
    XmlNode* parent = bdf.empty() ? cpu(0) : pciNode(bdf, "0x020000");
    XmlNode* nic = parent->child("nic") ? parent->child("nic") : parent->addChild("nic");
    XmlNode* net = nic->addChild("net");
    net->set("name", name);
    net->set("dev", std::to_string(netCount_++));
    net->set("latency", "0");
    net->set("speed", std::to_string(speedMbps));
    net->set("port", std::to_string(port));
    net->set("guid", guid.empty() ? "0x0" : guid);
    net->set("maxconn", "65536");
    net->set("gdr", gdr ? "1" : "0");
  }

  void nics() {
    std::string ib = o_.sysfsRoot + "/class/infiniband";
    auto ibDevs = listDir(ib);
    for (auto& d : ibDevs) {
      std::string guidRaw = readTrim(ib + "/" + d + "/sys_image_guid");
      std::string guid;
      for (char c : guidRaw)
        if (c != ':') guid += c;
      for (auto& p : listDir(ib + "/" + d + "/ports")) {
        std::string base = ib + "/" + d + "/ports/" + p;
        if (readTrim(base + "/state").find("ACTIVE") == std::string::npos) continue;
        std::string rate = readTrim(base + "/rate");  // "400 Gb/sec (4X NDR)"
        int gbps = std::atoi(rate.c_str());
        addNet(d, ib + "/" + d + "/device", std::atoi(p.c_str()), gbps * 1000, guid.empty() ? "" : "0x" + guid,
               access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0);
      }
    }
    if (!ibDevs.empty()) return;
    std::string net = o_.sysfsRoot + "/class/net";
    for (auto& d : listDir(net)) {
      if (d == "lo" || d.rfind("docker", 0) == 0) continue;
      if (access((net + "/" + d + "/device").c_str(), F_OK) != 0) continue;  // virtual interface
      std::string speed = readTrim(net + "/" + d + "/speed");
      addNet(d, net + "/" + d + "/device", 1, speed.empty() ? -1 : std::atoi(speed.c_str()), "", false);
    }
  }

  int netCount_ = 0;
};

}  // namespace

uint64_t hostHash(const std::string& hostIdOverride) {
  if (!hostIdOverride.empty()) return djb2(hostIdOverride);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot = readTrim("/proc/sys/kernel/random/boot_id");
  return djb2(std::string(host) + boot);
}

XmlDoc discoverLocalTopology(const DiscoveryOptions& opts) { return Discoverer(opts).run(); }

}  // namespace topocoll::topology
