// Building the system graph from XML. Follows NCCL 2.30.7 src/graph/topo.cc (ncclTopoGetSystemFromXml and the
// ncclTopoAdd* functions, BCM switch flattening, ncclTopoConnectCpus, ncclTopoSortSystem) (Apache-2.0) rule by rule.
#include "topocoll/topology/system.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "topocoll/log.h"
#include "topocoll/status.h"
#include "xml_attr.h"

namespace topocoll::topology {

const char* to_string(NodeType t) {
  static const char* s[] = {"GPU", "PCI", "NVS", "CPU", "NIC", "NET", "GIN", "RMA", "DEV", "CXB"};
  return s[static_cast<int>(t)];
}
const char* to_string(LinkType t) {
  switch (t) {
    case LinkType::LOC: return "LOC";
    case LinkType::NVL: return "NVL";
    case LinkType::C2C: return "C2C";
    case LinkType::PCI: return "PCI";
    case LinkType::SYS: return "SYS";
    case LinkType::NET: return "NET";
  }
  return "?";
}
const char* to_string(PathType t) {
  static const char* s[] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS"};
  return s[static_cast<int>(t)];
}
int pathTypeFromString(const std::string& s) {
  for (int i = 0; i < kPathTypes; ++i)
    if (s == to_string(static_cast<PathType>(i))) return i;
  return -1;
}

float nvlinkBw(int cc) {
  return cc >= 100 ? 40.1f : cc >= 90 ? 20.6f : cc == 86 ? 12.0f : cc >= 80 ? 20.0f : cc >= 70 ? 20.0f
         : cc >= 60 ? 18.0f : 20.0f;
}

float interCpuBw(int arch, int vendor, int model) {
  if (arch == kCpuArchPower) return 32.0f;
  if (arch == kCpuArchArm) return 6.0f;
  if (arch == kCpuArchX86 && vendor == kCpuVendorIntel) {
    return model == kCpuModelIntelErp ? 40.0f : model == kCpuModelIntelSrp ? 22.0f
           : model == kCpuModelIntelSkl ? 10.0f : 6.0f;
  }
  if (arch == kCpuArchX86 && vendor == kCpuVendorAmd) return 16.0f;
  if (arch == kCpuArchX86 && vendor == kCpuVendorZhaoxin) return model == kCpuModelYongfeng ? 9.0f : 6.0f;
  return kLocBw;
}

std::string gcnArchName(const std::string& gcn) {
  static const std::pair<const char*, const char*> old[] = {{"906", "gfx906"}, {"908", "gfx908"}, {"910", "gfx90a"},
                                                            {"940", "gfx940"}, {"941", "gfx941"}, {"942", "gfx942"}};
  for (auto& [num, name] : old)
    if (gcn == num) return name;
  return gcn;
}

float xgmiWidth(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("gfx90a")) return 36.0f;    // MI200_XGMI_WIDTH
  if (starts("gfx94")) return 48.0f;     // GFX94X_XGMI_WIDTH
  if (starts("gfx95")) return 48.0f;     // GFX95X_XGMI_WIDTH
  if (starts("gfx1250")) return 64.0f;   // GFX125X_XGMI_WIDTH
  return 24.0f;                          // VEGA_XGMI_WIDTH
}

int System::indexOf(NodeType t, int64_t id) const {
  auto& v = of(t);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].id == id) return static_cast<int>(i);
  return -1;
}

int System::gpuIndexOfRank(int rank) const {
  auto& v = of(NodeType::GPU);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].rank == rank) return static_cast<int>(i);
  return -1;
}

void System::removeNode(NodeType t, int index) {
  for (auto& vec : nodes) {
    for (auto& n : vec) {
      for (auto& p : n.paths) p.clear();
      auto& ls = n.links;
      ls.erase(std::remove_if(ls.begin(), ls.end(),
                              [&](const Link& l) { return l.rem.type == t && l.rem.index == index; }),
               ls.end());
      for (auto& l : ls)
        if (l.rem.type == t && l.rem.index > index) l.rem.index--;
    }
  }
  if (t == NodeType::DEV) {
    for (auto& g : of(NodeType::GPU)) {
      if (g.parent == index) g.parent = -1;
      else if (g.parent > index) g.parent--;
    }
  }
  of(t).erase(of(t).begin() + index);
}

int64_t busIdToInt64(const std::string& busId) {
  std::string hex;
  for (char c : busId) {
    if (c == '.' || c == ':') continue;
    if (!isxdigit(static_cast<unsigned char>(c))) break;
    if (hex.size() < 16) hex += c;
  }
  if (hex.empty()) return 0;
  return static_cast<int64_t>(std::strtoull(hex.c_str(), nullptr, 16));
}

namespace {

struct KV {
  const char* str;
  int value;
};
// Prefix match, as NCCL's kvConvertToInt; returns `fallback` when nothing matches.
int kvPrefix(const std::string& s, const KV* dict, int fallback, bool* matched = nullptr) {
  for (const KV* d = dict; d->str; ++d) {
    if (s.compare(0, std::strlen(d->str), d->str) == 0) {
      if (matched) *matched = true;
      return d->value;
    }
  }
  if (matched) *matched = false;
  return fallback;
}

constexpr int kTGPU = 0, kTPCI = 1, kTNVS = 2, kTCPU = 3, kTNIC = 4;
const KV kPciClass[] = {{"0x060400", kTPCI}, {"0x080100", kTPCI}, {"0x068000", kTNVS}, {"0x068001", kTCPU},
                        {"0x03", kTGPU},     {"0x02", kTNIC},     {nullptr, 0}};
const KV kPciGen[] = {{"2.5 GT/s", 15},       {"5 GT/s", 30},          {"8 GT/s", 60},          {"16 GT/s", 120},
                      {"32 GT/s", 240},       {"2.5 GT/s PCIe", 15},   {"5.0 GT/s PCIe", 30},   {"8.0 GT/s PCIe", 60},
                      {"16.0 GT/s PCIe", 120}, {"32.0 GT/s PCIe", 240}, {"64.0 GT/s PCIe", 480}, {nullptr, 0}};
const KV kCpuArch[] = {{"x86_64", kCpuArchX86}, {"arm64", kCpuArchArm}, {"ppc64", kCpuArchPower}, {nullptr, 0}};
const KV kCpuVendor[] = {{"GenuineIntel", kCpuVendorIntel}, {"AuthenticAMD", kCpuVendorAmd},
                         {"CentaurHauls", kCpuVendorZhaoxin}, {"  Shanghai  ", kCpuVendorZhaoxin}, {nullptr, 0}};

// Bounds of values NCCL computes with (beyond them its arithmetic gives nonsense or overflows).
constexpr int kMaxComputeCapability = 999;  // sm="90": major * 10 + minor
constexpr int kMaxLinksPerPeer = 64;        // NVLink or C2C links between two devices (18 on Hopper and Blackwell)
constexpr int kMaxC2cLinkBw = 1000000;      // MB/s per C2C link
constexpr int kMaxPciWidth = 32;            // PCIe lanes (x32 is the widest link the standard defines)
constexpr int kMaxNumaId = 1 << 16;

// The elements NCCL's topology loader reads under each element (src/graph/xml.cc, ncclTopoXmlLoad*); it ignores
// the others, and so does the system builder. XGMI links are AMD's and go beside NVLinks.
const std::pair<const char*, const char*> kGrammar[] = {
    {"system", "cpu"}, {"cpu", "pci"},     {"cpu", "nic"},    {"pci", "pci"},   {"pci", "gpu"},  {"pci", "nic"},
    {"pci", "pcilink"}, {"gpu", "nvlink"}, {"gpu", "c2c"},    {"gpu", "xgmi"},  {"nic", "net"}};

// One warning line per kind of ignored element (its first place), once per process.
void warnIgnoredElements(const XmlDoc& doc, const XmlNode& n) {
  static std::mutex mu;
  static std::set<std::string> said;
  for (auto& c : n.subs) {
    bool known = false;
    std::string allowed;
    for (auto& [parent, child] : kGrammar) {
      if (n.name != parent) continue;
      known |= c->name == child;
      allowed += (allowed.empty() ? "" : ", ") + std::string("<") + child + ">";
    }
    if (known) {
      warnIgnoredElements(doc, *c);
      continue;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!said.insert(doc.source + "\n" + n.name + "\n" + c->name).second) continue;
    TC_WARN("{}: <{}> in <{}> is ignored, as NCCL ignores it ({})", doc.where(*c), c->name, n.name,
            allowed.empty() ? "nothing is read inside <" + n.name + ">" : "it reads " + allowed + " there");
  }
}

class Builder {
 public:
  Builder(const XmlDoc& doc) : doc_(doc), a_(doc) {}

  System build(uint64_t localHostHash) {
    XmlNode* top = &systemElement(doc_);
    warnIgnoredElements(doc_, *top);
    for (auto& s : top->subs)
      if (s->name == "cpu") addCpu(*s);
    if (sys_.hostHashes.empty()) fail(StatusCode::kInvalidArgument, "{}: <system> has no <cpu>", doc_.where(*top));
    int systemId = 0;
    if (localHostHash != 0) {
      while (systemId < static_cast<int>(sys_.hostHashes.size()) && sys_.hostHashes[systemId] != localHostHash)
        ++systemId;
      if (systemId == static_cast<int>(sys_.hostHashes.size()))
        fail(StatusCode::kInvalidArgument, "{}: host hash {:#x} not found among the CPUs' host_hash", doc_.source,
             localHostHash);
    }
    sys_.systemId = systemId;
    secondPass(*top, "", 0, &Builder::onNvLink);
    secondPass(*top, "", 0, &Builder::onXgmi);
    secondPass(*top, "", 0, &Builder::onC2c);
    secondPass(*top, "", 0, &Builder::onPciLink);
    flattenBcmSwitches();
    connectCpus();
    for (int c = 0; c < sys_.count(NodeType::CPU); ++c) sortRec({NodeType::CPU, c}, {NodeType::CPU, -1});
    return std::move(sys_);
  }

 private:
  const XmlDoc& doc_;
  AttrReader a_;
  System sys_;

  // `at`: the element the node comes from, named when NCCL's per-type limit is reached.
  NodeRef create(NodeType t, int64_t id, const XmlNode& at) {
    if (sys_.count(t) >= kTopoMaxNodes)
      fail(StatusCode::kInvalidArgument, "{}: more than {} {} nodes on one host, NCCL's limit (NCCL_TOPO_MAX_NODES)",
           doc_.where(at), kTopoMaxNodes, to_string(t));
    Node n;
    n.type = t;
    n.id = id;
    sys_.of(t).push_back(std::move(n));
    return {t, sys_.count(t) - 1};
  }

  // ncclTopoConnectNodes: aggregate parallel links of one type, keep links sorted by bandwidth (descending).
  void connect(NodeRef from, NodeRef to, LinkType type, float bw) {
    auto& ls = sys_.at(from).links;
    size_t i = 0;
    for (; i < ls.size(); ++i)
      if (ls[i].rem == to && ls[i].type == type) break;
    if (i == ls.size()) ls.push_back(Link{type, 0.0f, to});
    ls[i].bw += bw;
    Link save = ls[i];
    while (i > 0 && !(ls[i - 1].bw >= save.bw)) {
      ls[i] = ls[i - 1];
      --i;
    }
    ls[i] = save;
  }

  int systemIdFor(const XmlNode& cpu) {
    uint64_t h = 0;
    if (const std::string* s = cpu.attr("host_hash")) h = std::strtoull(s->c_str(), nullptr, 16);
    for (size_t i = 0; i < sys_.hostHashes.size(); ++i)
      if (sys_.hostHashes[i] == h) return static_cast<int>(i);
    if (sys_.hostHashes.size() >= 256)
      fail(StatusCode::kInvalidArgument, "{}: more than 256 distinct host_hash values", doc_.where(cpu));
    sys_.hostHashes.push_back(h);
    return static_cast<int>(sys_.hostHashes.size()) - 1;
  }

  void addCpu(const XmlNode& x) {
    int numaId = a_.reqInt(x, "numaid", -1, kMaxNumaId);  // -1: sysfs knows no NUMA node (a VM), as NCCL allows
    int systemId = systemIdFor(x);
    if (sys_.indexOf(NodeType::CPU, makeId(systemId, numaId)) >= 0)
      fail(StatusCode::kInvalidArgument, "{}: duplicate <cpu numaid=\"{}\"> on the same host", doc_.where(x), numaId);
    NodeRef cpu = create(NodeType::CPU, makeId(systemId, numaId), x);
    Node& c = sys_.at(cpu);
    if (const std::string* s = x.attr("affinity")) c.affinity = *s;
    // A partial file's CPUs lack what NCCL reads from the machine it runs on; another machine cannot be guessed.
    for (const char* key : {"arch", "vendor"})
      if (!x.has(key) && (std::string(key) == "arch" || *x.attr("arch") == "x86_64"))
        fail(StatusCode::kInvalidArgument,
             "{}: <cpu> is missing attribute '{}' (NCCL fills it from the machine it runs on: a partial topology file "
             "needs that machine, or name it in the file)",
             doc_.where(x), key);
    c.arch = kvPrefix(a_.reqStr(x, "arch"), kCpuArch, 0);
    if (c.arch == kCpuArchX86) {
      c.vendor = kvPrefix(a_.reqStr(x, "vendor"), kCpuVendor, 0);
      if (c.vendor == kCpuVendorIntel) {
        int family = a_.reqInt(x, "familyid"), model = a_.reqInt(x, "modelid");
        c.model = (family == 6 && model >= 0xCF)   ? kCpuModelIntelErp
                  : (family == 6 && model >= 0x8F) ? kCpuModelIntelSrp
                  : (family == 6 && model >= 0x55) ? kCpuModelIntelSkl
                                                   : kCpuModelIntelBdw;
      } else if (c.vendor == kCpuVendorZhaoxin) {
        int family = a_.reqInt(x, "familyid"), model = a_.reqInt(x, "modelid");
        if (family == 7 && model == 0x5B) c.model = kCpuModelYongfeng;
      } else if (c.vendor == kCpuVendorAmd && x.has("familyid") && x.has("modelid")) {
        // RCCL's topo.cc: Rome (and later) AMD CPUs, which its GDR rule distinguishes.
        int family = a_.reqInt(x, "familyid"), model = a_.reqInt(x, "modelid");
        if ((family == 143 && model >= 49) || family == 175) c.model = kCpuModelAmdRome;
      }
    }
    for (auto& s : x.subs) {
      if (s->name == "pci") addPci(*s, cpu, systemId, numaId);
      if (s->name == "nic") {
        int64_t id = makeId(systemId, 0);  // NCCL_TOPO_LOCAL_NIC_ID(numaId, 0): the numa bits are masked away
        int ni = sys_.indexOf(NodeType::NIC, id);
        NodeRef nic{NodeType::NIC, ni};
        if (ni < 0) {
          nic = create(NodeType::NIC, id, *s);
          connect(cpu, nic, LinkType::PCI, kLocBw);
          connect(nic, cpu, LinkType::PCI, kLocBw);
        }
        addNic(*s, nic, systemId);
      }
    }
  }

  uint64_t intDevice(const XmlNode& x) {
    uint64_t r = 0;
    if (const std::string* s = x.attr("vendor")) r += a_.hexOrInt(x, "vendor", *s) << 48;
    if (const std::string* s = x.attr("device")) r += a_.hexOrInt(x, "device", *s) << 32;
    if (const std::string* s = x.attr("subsystem_vendor")) r += a_.hexOrInt(x, "subsystem_vendor", *s) << 16;
    if (const std::string* s = x.attr("subsystem_device")) r += a_.hexOrInt(x, "subsystem_device", *s);
    return r;
  }

  float pciBw(const XmlNode& x) {
    const std::string* w = x.attr("link_width");
    int width = w && !w->empty() ? a_.reqInt(x, "link_width", 0, kMaxPciWidth) : 0;
    const std::string speedStr = a_.reqStr(x, "link_speed");
    if (width == 0) width = 16;
    bool matched = false;
    int speed = kvPrefix(speedStr, kPciGen, 60, &matched);
    // NCCL falls back to 8 GT/s for any string it does not know; we refuse typos but accept what NCCL writes itself:
    // "" (no sysfs), "Unknown..." (old kernels) and "16.0 GT/s" (2.30.7's discovery when NVML has no generation).
    if (!matched && !speedStr.empty() && speedStr.rfind("Unknown", 0) != 0 && speedStr != "16.0 GT/s") {
      fail(StatusCode::kInvalidArgument,
           "{}: link_speed=\"{}\" is not a PCIe speed NCCL knows (e.g. \"16.0 GT/s PCIe\", \"8 GT/s\")",
           doc_.where(x), speedStr);
    }
    return static_cast<float>(width * speed / 80.0);
  }

  void addPci(const XmlNode& x, NodeRef parent, int systemId, int numaId) {
    const std::string cls = a_.reqStr(x, "class");
    if (cls.size() < 4 || cls.compare(0, 2, "0x") != 0 ||
        !std::all_of(cls.begin() + 2, cls.end(), [](char c) { return isxdigit(static_cast<unsigned char>(c)); }))
      fail(StatusCode::kInvalidArgument, "{}: class=\"{}\" is not a PCI class code (like 0x060400)", doc_.where(x), cls);
    int type = kvPrefix(cls, kPciClass, kTPCI);
    // RCCL's class dictionary also names processing accelerators (0x120000) GPUs.
    if (cls == "0x120000") {
      const XmlNode* g = x.child("gpu");
      if (g && g->has("gcn")) type = kTGPU;
    }
    const std::string busIdStr = a_.reqStr(x, "busid");
    a_.checkBusId(x, busIdStr);
    int64_t busId = busIdToInt64(busIdStr);
    if (parent.type == NodeType::PCI && busIdToInt64(sys_.at(parent).busId) == busId)
      fail(StatusCode::kInvalidArgument, "{}: <pci busid=\"{}\"> has the bus id of the PCI switch it is under",
           doc_.where(x), busIdStr);
    float bw = pciBw(x);

    for (auto& s : x.subs) {
      if (s->name != "gpu") continue;
      if (!s->has("rank")) return;  // GPU not used by this job: NCCL skips the whole PCI device
      addGpu(x, *s, parent, systemId, busId, bw);
    }
    NodeRef node{NodeType::PCI, -1};
    if (XmlNode* xnic = x.child("nic")) {
      int64_t id = makeId(systemId, busId);
      int ni = sys_.indexOf(NodeType::NIC, id);
      NodeRef nic{NodeType::NIC, ni};
      if (ni < 0) {
        nic = create(NodeType::NIC, id, *xnic);
        sys_.at(nic).busId = busIdStr;
        node = nic;
      }
      addNic(*xnic, nic, systemId);
    } else if (type == kTPCI) {
      if (sys_.indexOf(NodeType::PCI, makeId(systemId, busId)) >= 0)
        fail(StatusCode::kInvalidArgument, "{}: duplicate PCI busid \"{}\"", doc_.where(x), busIdStr);
      node = create(NodeType::PCI, makeId(systemId, busId), x);
      sys_.at(node).device = intDevice(x);
      sys_.at(node).busId = busIdStr;
      for (auto& s : x.subs)
        if (s->name != "pcilink" && s->name == "pci") addPci(*s, node, systemId, numaId);
    }
    if (node.index >= 0) {
      connect(node, parent, LinkType::PCI, bw);
      connect(parent, node, LinkType::PCI, bw);
    }
  }

  void addGpu(const XmlNode& xpci, const XmlNode& xgpu, NodeRef parent, int systemId, int64_t busId, float bw) {
    int sm = a_.reqInt(xgpu, "sm", 0, kMaxComputeCapability);  // AMD (gcn=): the CU count
    std::string gcn;
    if (const std::string* g = xgpu.attr("gcn")) {
      gcn = gcnArchName(*g);
      if (gcn.empty()) fail(StatusCode::kInvalidArgument, "{}: <gpu> gcn=\"\" names no architecture", doc_.where(xgpu));
    }
    const int cu = gcn.empty() ? 0 : sm;
    if (!gcn.empty()) sm = kAmdGpuCompCap;
    int64_t devId = makeId(systemId, busId);
    int di = sys_.indexOf(NodeType::DEV, devId);
    if (di >= 0) fail(StatusCode::kInvalidArgument, "{}: duplicate GPU bus id {:x}", doc_.where(xgpu), busId);
    NodeRef dev = create(NodeType::DEV, devId, xgpu);
    {
      Node& d = sys_.at(dev);
      d.device = intDevice(xpci);
      d.cudaCompCap = sm;
      d.dev = a_.reqInt(xgpu, "dev");
      d.busId = a_.reqStr(xpci, "busid");
      d.gcn = gcn;
      d.cu = cu;
    }
    connect(dev, parent, LinkType::PCI, bw);
    connect(parent, dev, LinkType::PCI, bw);
    int64_t gpuLocal = (static_cast<int64_t>(sys_.at(dev).nGpus) << 40) | (busId & ((1LL << 40) - 1));
    NodeRef gpu = create(NodeType::GPU, makeId(systemId, gpuLocal), xgpu);
    Node& g = sys_.at(gpu);
    g.rank = a_.reqInt(xgpu, "rank", 0, INT32_MAX);
    g.cudaCompCap = sm;
    g.dev = a_.reqInt(xgpu, "dev");
    g.gdrSupport = a_.reqInt(xgpu, "gdr", 0, 1);
    g.mloPart = a_.optInt(xgpu, "mlopart", kUndef);
    g.parent = dev.index;
    g.busId = sys_.at(dev).busId;
    g.gcn = gcn;
    g.cu = cu;
    if (g.dev < 0) fail(StatusCode::kInvalidArgument, "{}: dev=\"{}\" must be >= 0", doc_.where(xgpu), g.dev);
    connect(dev, gpu, LinkType::LOC, kLocBw);
    connect(gpu, dev, LinkType::LOC, kLocBw);
    sys_.at(dev).nGpus++;
  }

  void addNic(const XmlNode& xnic, NodeRef nic, int systemId) {
    for (auto& s : xnic.subs) {
      if (s->name != "net" || !s->has("dev")) continue;
      int isNet = a_.optInt(*s, "net", 1);
      if (isNet) addNet(*s, nic, systemId);
    }
  }

  void addNet(const XmlNode& x, NodeRef nic, int systemId) {
    int dev = a_.reqInt(x, "dev");
    if (dev < 0) fail(StatusCode::kInvalidArgument, "{}: net dev=\"{}\" must be >= 0", doc_.where(x), dev);
    int64_t netId = makeId(systemId, dev);
    if (sys_.indexOf(NodeType::NET, netId) >= 0)
      fail(StatusCode::kInvalidArgument, "{}: duplicate <net dev=\"{}\">", doc_.where(x), dev);
    NodeRef net = create(NodeType::NET, netId, x);
    Node& n = sys_.at(net);
    n.dev = dev;
    if (const std::string* name = x.attr("name")) n.name = *name;
    if (const std::string* g = x.attr("guid")) n.asic = std::strtoull(g->c_str(), nullptr, 16);
    else n.asic = static_cast<uint64_t>(netId);
    int mbps = a_.optInt(x, "speed", 0);
    if (mbps <= 0) mbps = 10000;  // some NICs report speed -1: NCCL assumes 10 Gb/s
    n.bw = static_cast<float>(mbps / 8000.0);
    n.latency = a_.optFloat(x, "latency", 0.0f, 0.0, 1e9);
    n.port = a_.optInt(x, "port", 0, 0, INT32_MAX);
    n.gdrSupport = a_.optInt(x, "gdr", 0, 0, 1);
    n.maxChannels = a_.optInt(x, "maxconn", 64, 0, INT32_MAX);
    n.collSupport = a_.optInt(x, "coll", 0, 0, 1);
    n.railId = a_.optInt(x, "rail", kUndef);
    n.planeId = a_.optInt(x, "plane", kUndef);
    float bw = n.bw;
    connect(nic, net, LinkType::NET, bw);
    connect(net, nic, LinkType::NET, bw);
  }

  using Handler = void (Builder::*)(const XmlNode&, const std::string&, int);
  void secondPass(const XmlNode& x, const std::string& parentBusId, int systemId, Handler h) {
    if (x.name == "nvlink" || x.name == "xgmi" || x.name == "c2c" || x.name == "pcilink") {
      (this->*h)(x, parentBusId, systemId);
      return;
    }
    if (x.name == "cpu") systemId = systemIdFor(x);
    const std::string* b = x.attr("busid");
    for (auto& s : x.subs) secondPass(*s, b ? *b : parentBusId, systemId, h);
  }

  NodeRef devOfGpuElement(const XmlNode& xgpu, const std::string& busId, int systemId, const char* what) {
    int di = sys_.indexOf(NodeType::DEV, makeId(systemId, busIdToInt64(busId)));
    if (di < 0) fail(StatusCode::kInvalidArgument, "{}: <{}> under a GPU that is not in the system (bus {})",
                     doc_.where(xgpu), what, busId);
    return {NodeType::DEV, di};
  }

  NodeRef findLocalCpu(NodeRef node, NodeRef from) {
    if (node.type == NodeType::CPU) return node;
    for (auto& l : sys_.at(node).links) {
      if (l.type == LinkType::PCI && !(l.rem == from) && (l.rem.type == NodeType::PCI || l.rem.type == NodeType::CPU)) {
        NodeRef c = findLocalCpu(l.rem, node);
        if (c.index >= 0) return c;
      }
    }
    return {NodeType::CPU, -1};
  }

  void onNvLink(const XmlNode& x, const std::string& parentBusId, int systemId) {
    if (x.name != "nvlink") return;
    if (!x.parent || x.parent->name != "gpu") return;
    if (!isPrimaryGpu(*x.parent)) return;
    NodeRef dev = devOfGpuElement(*x.parent, parentBusId, systemId, "nvlink");
    int count = a_.reqInt(x, "count", 0, kMaxLinksPerPeer);
    const std::string tclass = a_.reqStr(x, "tclass");
    int targetType = kvPrefix(tclass, kPciClass, kTPCI);
    float nvlBw = nvlinkBw(sys_.at(dev).cudaCompCap);
    if (targetType == kTGPU) {
      const std::string target = a_.reqStr(x, "target");
      int ri = sys_.indexOf(NodeType::DEV, makeId(systemId, busIdToInt64(target)));
      if (ri == dev.index)  // NVML in some VMs reports this (azure-ncv4); NCCL keeps it as a link to itself
        TC_WARN("{}: <nvlink target=\"{}\"> points at its own GPU; kept as NCCL keeps it (a link to itself, counted "
                "in the GPU's NVLink bandwidth)", doc_.where(x), target);
      if (ri >= 0) connect(dev, {NodeType::DEV, ri}, LinkType::NVL, static_cast<float>(count) * nvlBw);
    } else {
      NodeRef remote{NodeType::NVS, -1};
      if (targetType == kTCPU) {
        remote = findLocalCpu(dev, {NodeType::GPU, -1});
      } else {
        remote = sys_.count(NodeType::NVS) == 0 ? create(NodeType::NVS, 0, x) : NodeRef{NodeType::NVS, 0};
      }
      if (remote.index >= 0) {
        connect(dev, remote, LinkType::NVL, static_cast<float>(count) * nvlBw);
        connect(remote, dev, LinkType::NVL, static_cast<float>(count) * nvlBw);
      }
    }
  }

  // RCCL's ncclTopoAddXGMI: an AMD GPU's <xgmi> links, count x the link width of its architecture, to a GPU (class
  // 0x03.. or 0x120000, one direction: the peer lists its own), its CPU or an XGMI switch (both directions).
  void onXgmi(const XmlNode& x, const std::string& parentBusId, int systemId) {
    if (x.name != "xgmi") return;
    if (!x.parent || x.parent->name != "gpu" || !isPrimaryGpu(*x.parent)) return;
    NodeRef dev = devOfGpuElement(*x.parent, parentBusId, systemId, "xgmi");
    if (sys_.at(dev).gcn.empty())
      fail(StatusCode::kInvalidArgument, "{}: <xgmi> under a <gpu> without gcn (XGMI links are AMD GPUs')",
           doc_.where(x));
    int count = a_.reqInt(x, "count");
    if (count < 0) fail(StatusCode::kInvalidArgument, "{}: count=\"{}\" is negative", doc_.where(x), count);
    const std::string tclass = a_.reqStr(x, "tclass");
    const int targetType = tclass == "0x120000" ? kTGPU : kvPrefix(tclass, kPciClass, kTPCI);
    const float bw = static_cast<float>(count) * xgmiWidth(sys_.at(dev).gcn);
    if (targetType == kTGPU) {
      const std::string target = a_.reqStr(x, "target");
      int ri = sys_.indexOf(NodeType::DEV, makeId(systemId, busIdToInt64(target)));
      if (ri >= 0) connect(dev, {NodeType::DEV, ri}, LinkType::NVL, bw);
      return;
    }
    NodeRef remote = targetType == kTCPU ? findLocalCpu(dev, {NodeType::GPU, -1})
                     : sys_.count(NodeType::NVS) == 0 ? create(NodeType::NVS, 0, x)
                                                      : NodeRef{NodeType::NVS, 0};
    if (remote.index >= 0) {
      connect(dev, remote, LinkType::NVL, bw);
      connect(remote, dev, LinkType::NVL, bw);
    }
  }

  static bool isPrimaryGpu(const XmlNode& xgpu) {
    for (auto& s : xgpu.parent->subs) {
      if (s->name != "gpu") continue;
      return s.get() == &xgpu;
    }
    return true;
  }

  void onC2c(const XmlNode& x, const std::string& parentBusId, int systemId) {
    if (x.name != "c2c") return;
    if (!x.parent || x.parent->name != "gpu" || !isPrimaryGpu(*x.parent)) return;
    NodeRef dev = devOfGpuElement(*x.parent, parentBusId, systemId, "c2c");
    int count = a_.reqInt(x, "count", 0, kMaxLinksPerPeer), bw = a_.reqInt(x, "bw", 0, kMaxC2cLinkBw);
    float c2cBw = static_cast<float>((static_cast<double>(bw) * count) / 1000.0);
    NodeRef cpu = findLocalCpu(dev, {NodeType::GPU, -1});
    if (cpu.index < 0) return;
    connect(dev, cpu, LinkType::C2C, c2cBw);
    connect(cpu, dev, LinkType::C2C, c2cBw);
  }

  void onPciLink(const XmlNode& x, const std::string& parentBusId, int systemId) {
    if (x.name != "pcilink") return;
    int pi = sys_.indexOf(NodeType::PCI, makeId(systemId, busIdToInt64(parentBusId)));
    if (pi < 0) fail(StatusCode::kInvalidArgument, "{}: <pcilink> under bus {} which is not a PCI switch",
                     doc_.where(x), parentBusId);
    const std::string target = a_.reqStr(x, "target");
    int ri = sys_.indexOf(NodeType::PCI, makeId(systemId, busIdToInt64(target)));
    if (ri >= 0) connect({NodeType::PCI, pi}, {NodeType::PCI, ri}, LinkType::LOC, kLocBw);
  }

  static int bcmGen(uint64_t id, int level) {
    if ((id & 0xfffffffffffff000ULL) == 0x1000c0101000a000ULL) return 4;
    if ((id & 0xfffffffffffff000ULL) == (0x1000c03010000000ULL | static_cast<uint64_t>(level) * 0x1000)) return 5;
    return 0;
  }

  // Broadcom PEX Gen4/Gen5 switches show two levels; NCCL flattens them into one switch.
  void flattenBcmSwitches() {
    for (int s = 0; s < sys_.count(NodeType::PCI); ++s) {
      int gen = bcmGen(sys_.of(NodeType::PCI)[s].device, 0);
      if (!gen) continue;
      std::vector<int64_t> subIds;
      {
        auto& ls = sys_.of(NodeType::PCI)[s].links;
        for (size_t l = 0; l < ls.size();) {
          const Node& sub = sys_.at(ls[l].rem);
          if (sub.type == NodeType::PCI && bcmGen(sub.device, 1) == gen) {
            subIds.push_back(sub.id);
            ls.erase(ls.begin() + l);
          } else {
            ++l;
          }
        }
      }
      int64_t switchId = sys_.of(NodeType::PCI)[s].id;
      for (int64_t subId : subIds) {
        int sw = sys_.indexOf(NodeType::PCI, switchId);
        int si = sys_.indexOf(NodeType::PCI, subId);
        NodeRef swRef{NodeType::PCI, sw}, subRef{NodeType::PCI, si};
        std::vector<Link> subLinks = sys_.at(subRef).links;
        for (auto& l : subLinks) {
          if (l.rem == swRef) continue;
          sys_.at(swRef).links.push_back(l);
          for (auto& rl : sys_.at(l.rem).links) {
            if (rl.rem == subRef) {
              rl.rem = swRef;
              break;
            }
          }
        }
        sys_.removeNode(NodeType::PCI, si);
      }
      sys_.of(NodeType::PCI)[sys_.indexOf(NodeType::PCI, switchId)].device |= 0xffff;
      s = -1;
    }
  }

  void connectCpus() {
    int n = sys_.count(NodeType::CPU);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        const Node& c1 = sys_.of(NodeType::CPU)[i];
        const Node& c2 = sys_.of(NodeType::CPU)[j];
        if (i == j || systemIdOf(c1.id) != systemIdOf(c2.id)) continue;
        float bw = interCpuBw(c1.arch, c1.vendor, c1.model);
        connect({NodeType::CPU, i}, {NodeType::CPU, j}, LinkType::SYS, bw);
      }
    }
  }

  // NVLinks first (already, by bandwidth), then PCI down, PCI up last, SYS last.
  void sortRec(NodeRef node, NodeRef up) {
    auto& ls = sys_.at(node).links;
    if (up.index >= 0) {
      size_t l = 0;
      while (l < ls.size() && !(ls[l].rem == up)) ++l;
      if (l < ls.size()) {
        Link upLink = ls[l];
        ls.erase(ls.begin() + l);
        ls.push_back(upLink);
      }
    }
    for (size_t l = 0; l < sys_.at(node).links.size(); ++l) {
      Link link = sys_.at(node).links[l];
      if (link.type == LinkType::PCI && !(link.rem == up)) sortRec(link.rem, node);
    }
  }
};

}  // namespace

System buildSystem(const XmlDoc& doc, uint64_t localHostHash) { return Builder(doc).build(localHostHash); }

}  // namespace topocoll::topology
