// The per-host XML NCCL builds its system from. Follows NCCL 2.30.7 src/graph/topo.cc (ncclTopoGetSystem:
// ncclTopoProcessNet, ncclTopoPopulateNics, ncclTopoMakeVNics with ncclTopoGetPath/ncclTopoGetVNicParent for NIC
// fusion, then trimming and fusing the ranks' XMLs) (Apache-2.0).
#include "topocoll/topology/node_xml.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>

#include "topocoll/status.h"
#include "topocoll/topology/system.h"

namespace topocoll::topology {

namespace {

// Ports per virtual NIC (src/graph/topo.cc ncclTopoGetSystem: netInfo.maxDevsPerNic): NCCL_NET_MAX_DEVS_PER_NIC (8)
// for a net plugin of version 12 or later, NCCL_NET_MAX_DEVS_PER_NIC_V11 (4) otherwise. NCCL's internal IB and
// socket plugins leave comm->ncclNetVer at 0, so they get 4.
constexpr int kMaxDevsPerNicV12 = 8, kMaxDevsPerNicV11 = 4;
int maxDevsPerNic(const Config& cfg) { return cfg.netPluginVersion >= 12 ? kMaxDevsPerNicV12 : kMaxDevsPerNicV11; }
constexpr int kPathPort = 1, kPathPix = 4, kPathPxb = 5, kPathPhb = 8, kPathSys = 9, kPathDis = 11;

void collect(XmlNode& n, const char* name, std::vector<XmlNode*>& out) {
  if (n.name == name) out.push_back(&n);
  for (auto& s : n.subs) collect(*s, name, out);
}

bool checkPix(const XmlNode* common, const std::vector<XmlNode*>& nodes) {
  if (!common->has("busid")) return false;
  for (XmlNode* n : nodes) {
    if (n->name != "net") continue;
    XmlNode* nic = n->parent;
    if (!nic) return false;
    if (nic->name == "nic") {
      XmlNode* pci = nic->parent;
      if (!pci) return false;
      if (pci->name == "pci" && pci->parent != common) return false;
    }
  }
  return true;
}

XmlNode* firstPciParent(XmlNode* common) {
  XmlNode* p = common;
  while (p->name != "pci") {
    p = p->parent;
    if (!p || p->name == "system") return common;
  }
  return p;
}

// ncclTopoGetPath: type of the common ancestor of a set of net elements, and that ancestor.
int xmlPath(const std::vector<XmlNode*>& nodes, XmlNode** parentOut) {
  XmlNode* common = nullptr;
  int path = kPathDis;
  if (nodes.size() == 1) {
    *parentOut = firstPciParent(nodes[0]);
    return 0;
  }
  std::vector<std::vector<XmlNode*>> stacks(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (XmlNode* t = nodes[i]; t; t = (t->name == "system") ? nullptr : t->parent) stacks[i].push_back(t);
  }
  bool same = true, multiPort = false;
  while (same && !stacks[0].empty()) {
    XmlNode* top = stacks[0].back();
    for (size_t i = 1; i < nodes.size(); ++i) {
      if (stacks[i].empty() || stacks[i].back() != top) {
        same = false;
        break;
      }
    }
    if (same) {
      common = top;
      for (auto& s : stacks) s.pop_back();
    } else {
      const std::string* b0 = top->attr("busid");
      multiPort = b0 != nullptr;
      for (size_t i = 1; multiPort && i < nodes.size(); ++i) {
        if (stacks[i].empty()) continue;
        const std::string* bi = stacks[i].back()->attr("busid");
        if (!bi || bi->size() != b0->size() || bi->compare(0, bi->size() - 1, *b0, 0, b0->size() - 1) != 0)
          multiPort = false;
      }
    }
  }
  if (multiPort) path = kPathPort;
  else if (!common) path = kPathDis;
  else if (common->name == "system") path = kPathSys;
  else if (common->name == "cpu") path = kPathPhb;
  else if (common->name == "nic" || common->name == "net") path = kPathPort;
  else if (checkPix(common, nodes)) path = kPathPix;
  else path = kPathPxb;
  *parentOut = common ? firstPciParent(common) : nullptr;
  return path;
}

std::string int64ToBusId(int64_t id) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:01x}", id >> 20, (id & 0xff000) >> 12, (id & 0xff0) >> 4, id & 0xf);
}

int findLinkWidthRec(XmlNode* node, const std::vector<XmlNode*>& phys, bool* found) {
  int my = 0;
  if (node->name == "pci") {
    const std::string* w = node->attr("link_width");
    my = w ? std::atoi(w->c_str()) : 0;
  }
  *found = std::find(phys.begin(), phys.end(), node) != phys.end();
  int total = 0;
  for (auto& c : node->subs) {
    bool f = false;
    int w = findLinkWidthRec(c.get(), phys, &f);
    if (f) {
      *found = true;
      total += w;
    }
  }
  if (!*found) return 0;
  if (total == 0) return my;
  return my > 0 ? std::min(my, total) : total;
}

struct PhysNet {
  XmlNode* node;
  std::string name;
};

// Creates the virtual NIC's net element under the common parent of its ports (ncclTopoGetVNicParent + FillNet).
XmlNode* placeVnic(XmlNode& root, const std::vector<XmlNode*>& phys, const std::string& name) {
  XmlNode* parent = nullptr;
  int path = xmlPath(phys, &parent);
  int aggregateWidth = 0;
  if (parent && (path == kPathPhb || path == kPathPxb || path == kPathPix)) {
    for (auto& c : parent->subs) {
      bool f = false;
      int w = findLinkWidthRec(c.get(), phys, &f);
      if (f) aggregateWidth += w;
    }
  }
  XmlNode* physParent = parent;
  if (parent) {
    bool makeParent = false;
    if (parent->name == "pci") {
      const std::string* cls = parent->attr("class");
      makeParent = cls && *cls == "0x060400";
    } else if (parent->name == "cpu") {
      makeParent = true;
    } else if (parent->name == "system") {
      fail(StatusCode::kInvalidArgument, "NIC fusion of {}: fusing NET devices from different NUMA domains is not "
           "supported (set NCCL_NET_MERGE_LEVEL lower)", name);
    }
    if (makeParent) {
      XmlNode* pci = phys[0]->parent ? phys[0]->parent->parent : nullptr;
      if (!pci || pci->name != "pci" || !pci->has("busid"))
        fail(StatusCode::kInvalidArgument, "NIC fusion of {}: cannot find the PCI device of the first port", name);
      int64_t rb = busIdToInt64(*pci->attr("busid"));
      XmlNode* np = nullptr;
      for (int i = 0; i < 100 && !np; ++i) {
        std::string candidate = int64ToBusId(++rb);
        if (!root.findWith("pci", "busid", candidate)) {
          np = parent->addChild("pci");
          np->set("busid", candidate);
          for (auto& [k, v] : pci->attrs) np->set(k, v);
          np->set("busid", candidate);
        }
      }
      if (!np) fail(StatusCode::kInternal, "NIC fusion of {}: could not make a unique bus id", name);
      parent = np;
    }
  }
  if (aggregateWidth > 0) {
    for (XmlNode* n = parent; n; n = n->parent) {
      if (n->name == "pci") n->set("link_width", std::to_string(aggregateWidth));
      if (n == physParent) break;
    }
  }
  if (!parent) parent = root.find("cpu");
  if (!parent) fail(StatusCode::kInvalidArgument, "NIC fusion of {}: no parent for the virtual NIC", name);
  XmlNode* nic = parent->child("nic");
  if (!nic) nic = parent->addChild("nic");
  XmlNode* net = nic->addChild("net");
  net->set("name", name);
  return net;
}

std::string attrOr(const XmlNode* n, const char* key, const char* def) {
  const std::string* v = n->attr(key);
  return v ? *v : def;
}

}  // namespace

namespace {
// host_hash of the <cpu> above a node ("" when none).
std::string hostOf(const XmlNode* n) {
  for (; n; n = n->parent)
    if (n->name == "cpu") return n->attr("host_hash") ? *n->attr("host_hash") : "";
  return "";
}
std::vector<std::string> hostList(const XmlNode& root) {
  std::vector<std::string> hosts;
  for (auto& c : root.subs) {
    if (c->name != "cpu") continue;
    const std::string h = hostOf(c.get());
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) hosts.push_back(h);
  }
  return hosts;
}
// The <gpu>s of host `host` (index in document order).
std::vector<XmlNode*> hostGpuElements(const XmlNode& root, int host) {
  std::vector<XmlNode*> gpus, out;
  collect(const_cast<XmlNode&>(root), "gpu", gpus);
  const std::vector<std::string> hosts = hostList(root);
  if (host < 0 || host >= static_cast<int>(hosts.size())) return out;
  for (XmlNode* g : gpus)
    if (hostOf(g) == hosts[host]) out.push_back(g);
  return out;
}
}  // namespace

int xmlHostCount(const XmlDoc& doc) {
  XmlNode* top = doc.root ? doc.root->find("system") : nullptr;
  return top ? static_cast<int>(hostList(*top).size()) : 0;
}

XmlDoc selectHosts(const XmlDoc& doc, int first, int count) {
  XmlDoc out = doc.clone();
  XmlNode* top = out.root->find("system");
  if (!top) fail(StatusCode::kInvalidArgument, "{}: no <system> element", doc.source);
  const std::vector<std::string> hosts = hostList(*top);
  if (first < 0 || count < 1 || first + count > static_cast<int>(hosts.size()))
    fail(StatusCode::kInvalidArgument, "{}: hosts {}..{} asked for, it describes {}", doc.source, first,
         first + count - 1, hosts.size());
  std::vector<XmlNode*> drop;
  for (auto& c : top->subs) {
    if (c->name != "cpu") continue;
    const auto at = std::find(hosts.begin(), hosts.end(), hostOf(c.get())) - hosts.begin();
    if (at < first || at >= first + count) drop.push_back(c.get());
  }
  for (XmlNode* c : drop) top->removeChild(c);
  return out;
}

std::vector<int> gpuDevs(const XmlDoc& doc, int host) {
  std::vector<XmlNode*> gpus = hostGpuElements(systemElement(doc), host);
  std::vector<int> devs;
  std::set<int> seen;
  for (XmlNode* g : gpus) {
    const std::string* d = g->attr("dev");
    if (!d) fail(StatusCode::kInvalidArgument, "{}: <gpu> is missing required attribute 'dev'", doc.where(*g));
    char* end = nullptr;
    long v = std::strtol(d->c_str(), &end, 0);
    if (d->empty() || *end || v < 0)
      fail(StatusCode::kInvalidArgument, "{}: <gpu> attribute dev=\"{}\" is not a GPU index", doc.where(*g), *d);
    if (!seen.insert(static_cast<int>(v)).second)
      fail(StatusCode::kInvalidArgument, "{}: two <gpu> elements have dev=\"{}\"", doc.where(*g), *d);
    devs.push_back(static_cast<int>(v));
  }
  std::sort(devs.begin(), devs.end());
  return devs;
}

namespace {
// The network plugin's devices in its order: the XML's <net>s in document order, or TOPOCOLL_NET_DEVICES' order.
std::vector<XmlNode*> pluginNets(XmlNode& root, const Config& cfg) {
  std::vector<XmlNode*> nets;
  collect(root, "net", nets);
  if (!cfg.netDeviceSpecs.empty()) {
    auto order = [&](const XmlNode* n) {
      const std::string* name = n->attr("name");
      for (size_t i = 0; i < cfg.netDeviceSpecs.size(); ++i)
        if (name && *name == cfg.netDeviceSpecs[i].name) return i;
      return cfg.netDeviceSpecs.size();
    };
    std::stable_sort(nets.begin(), nets.end(), [&](auto* a, auto* b) { return order(a) < order(b); });
  }
  return nets;
}

// A socket device (NCCL's socket plugin: no PCI path, so under the first CPU, no GPU Direct).
void addSocketNet(XmlNode& cpu, const std::string& name, int speedMbps) {
  XmlNode* nic = cpu.child("nic") ? cpu.child("nic") : cpu.addChild("nic");
  XmlNode* net = nic->addChild("net");
  net->set("name", name);
  net->set("dev", "0");  // renumbered in plugin order
  net->set("speed", std::to_string(speedMbps));
  net->set("latency", "0");
  net->set("port", "0");
  net->set("guid", "0x0");
  net->set("maxconn", "65536");
  net->set("gdr", "0");
}

// NCCL's socket plugin cannot fuse devices (its mergeDevices is NULL): only an RDMA plugin's devices are fused.
bool socketDevicesOnly(const Config& cfg, bool addedDefault) {
  if (addedDefault) return true;
  if (cfg.netDeviceSpecs.empty()) return false;
  for (auto& d : cfg.netDeviceSpecs)
    if (!d.busId.empty()) return false;
  return true;
}
}  // namespace

bool applyPluginDevices(XmlDoc& doc, const Config& cfg) {
  XmlNode& root = *doc.root;
  XmlNode* cpu = root.find("cpu");
  if (!cpu) fail(StatusCode::kInvalidArgument, "{}: <system> has no <cpu>", doc.source);
  std::vector<XmlNode*> nets;
  collect(root, "net", nets);
  if (cfg.netDeviceSpecs.empty()) {
    if (!nets.empty()) return false;
    addSocketNet(*cpu, "eth0", 10000);  // a machine with one Ethernet interface, speed unknown
    return true;
  }
  // The devices the plugin reports: an XML <net> of the same name is that device (its attributes win, as NCCL's
  // xmlInitAttr leaves set attributes alone); the XML's other <net>s are not the job's and go.
  for (XmlNode* n : nets) {
    const std::string* name = n->attr("name");
    bool listed = false;
    for (auto& d : cfg.netDeviceSpecs) listed |= name && *name == d.name;
    if (!listed) n->parent->removeChild(n);
  }
  for (auto& d : cfg.netDeviceSpecs) {
    if (root.findWith("net", "name", d.name)) continue;
    if (d.busId.empty()) {
      addSocketNet(*cpu, d.name, d.speedMbps);
      continue;
    }
    XmlNode* pci = root.findWith("pci", "busid", d.busId);
    if (!pci)
      fail(StatusCode::kInvalidArgument, "TOPOCOLL_NET_DEVICES: device {} is on PCI bus id {}, which {} does not have",
           d.name, d.busId, doc.source);
    XmlNode* nic = pci->child("nic") ? pci->child("nic") : pci->addChild("nic");
    XmlNode* net = nic->addChild("net");
    net->set("name", d.name);
    net->set("dev", "0");
    net->set("speed", std::to_string(d.speedMbps));
    net->set("latency", "0");
    net->set("port", "1");
    net->set("guid", "0x0");
    net->set("maxconn", "131072");
    net->set("gdr", "1");
  }
  return socketDevicesOnly(cfg, false);
}

namespace {
// Which physical NET devices (by plugin order) fuse into virtual NICs. Depends only on the file, so it is
// computed once per host and applied to every rank's copy.
std::vector<std::vector<int>> netGroups(XmlNode& root, const Config& cfg) {
  std::vector<XmlNode*> nets = pluginNets(root, cfg);
  const int nPhys = static_cast<int>(nets.size());
  std::vector<std::vector<int>> groups;
  if (nPhys == 0 || cfg.ibMergeNics == 0) return groups;

  std::vector<int> placed(nPhys, 0);
  auto nameOf = [&](int i) { return attrOr(nets[i], "name", ("net" + std::to_string(i)).c_str()); };
  if (!cfg.netForceMerge.empty()) {
    size_t pos = 0;
    const std::string& s = cfg.netForceMerge;
    while (pos <= s.size()) {
      size_t semi = s.find(';', pos);
      std::string grp = s.substr(pos, semi == std::string::npos ? std::string::npos : semi - pos);
      pos = semi == std::string::npos ? s.size() + 1 : semi + 1;
      if (grp.empty()) continue;
      std::vector<std::string> want;
      size_t p = 0;
      while (p <= grp.size()) {
        size_t comma = grp.find(',', p);
        std::string tok = grp.substr(p, comma == std::string::npos ? std::string::npos : comma - p);
        p = comma == std::string::npos ? grp.size() + 1 : comma + 1;
        if (!tok.empty()) want.push_back(tok);
      }
      std::vector<int> g;
      for (int d = 0; d < nPhys; ++d) {
        std::string nm = nameOf(d);
        std::string port = attrOr(nets[d], "port", "");
        for (auto& w : want) {
          auto colon = w.find(':');
          if ((colon == std::string::npos && w == nm) ||
              (colon != std::string::npos && w.substr(0, colon) == nm && w.substr(colon + 1) == port)) {
            g.push_back(d);
            break;
          }
        }
      }
      if (g.size() != want.size())
        fail(StatusCode::kInvalidArgument, "NCCL_NET_FORCE_MERGE={}: only matched {} devices of '{}'",
             cfg.netForceMerge, g.size(), grp);
      if (static_cast<int>(g.size()) > maxDevsPerNic(cfg))
        fail(StatusCode::kInvalidArgument,
             "NCCL_NET_FORCE_MERGE={}: group '{}' has more than {} devices (the most a virtual NIC may have with net "
             "plugin version {}; TOPOCOLL_NET_PLUGIN_VERSION)",
             cfg.netForceMerge, grp, maxDevsPerNic(cfg), cfg.netPluginVersion);
      for (int d : g) placed[d] = 1;
      if (g.size() > 1) groups.push_back(g);
    }
  }
  std::vector<std::vector<int>> paths(nPhys, std::vector<int>(nPhys));
  for (int i = 0; i < nPhys; ++i) {
    for (int j = 0; j < nPhys; ++j) {
      XmlNode* parent = nullptr;
      paths[i][j] = xmlPath({nets[i], nets[j]}, &parent);
    }
  }
  for (int i = 0; i < nPhys; ++i) {
    if (placed[i]) continue;
    std::vector<int> g = {i};
    placed[i] = 1;
    for (int j = 0; j < nPhys; ++j) {
      if (paths[i][j] <= cfg.netMergeLevelValue && !placed[j] && j != i) {
        g.push_back(j);
        placed[j] = 1;
      }
      if (static_cast<int>(g.size()) == maxDevsPerNic(cfg)) break;
    }
    if (g.size() > 1) groups.push_back(g);
  }
  return groups;
}
}  // namespace

void processNets(XmlNode& root, const Config& cfg) { applyNets(root, cfg, netGroups(root, cfg)); }

void applyNets(XmlNode& root, const Config& cfg, const std::vector<std::vector<int>>& groups) {
  std::vector<XmlNode*> nets = pluginNets(root, cfg);
  const int nPhys = static_cast<int>(nets.size());
  for (int n = 0; n < nPhys; ++n) {
    nets[n]->set("keep", "1");
    nets[n]->set("dev", std::to_string(n));
    nets[n]->set("net", "1");
  }
  if (groups.empty()) return;
  auto nameOf = [&](int i) { return attrOr(nets[i], "name", ("net" + std::to_string(i)).c_str()); };

  // Virtual devices are numbered after the physical ones; their ports stop being network devices.
  std::vector<std::pair<std::vector<XmlNode*>, std::string>> vnics;
  for (auto& g : groups) {
    std::vector<XmlNode*> phys;
    std::string name;
    for (int d : g) {
      phys.push_back(nets[d]);
      name += (name.empty() ? "" : "+") + nameOf(d);
    }
    vnics.emplace_back(phys, name);
  }
  for (auto& [phys, name] : vnics) {
    for (XmlNode* p : phys) {
      p->set("net", "0");
      if (attrOr(p, "gin", "0") == "0" && attrOr(p, "coll", "0") == "0") p->set("keep", "0");
    }
  }
  int n = nPhys;
  for (auto& [phys, name] : vnics) {
    long long speed = 0;
    for (XmlNode* p : phys) speed += std::atoll(attrOr(p, "speed", "0").c_str());
    XmlNode* first = phys[0];
    XmlNode* net = placeVnic(root, phys, name);
    net->set("keep", "1");
    net->set("dev", std::to_string(n++));
    net->set("latency", "0");
    net->set("speed", std::to_string(speed));
    net->set("port", attrOr(first, "port", "0"));
    uint64_t guid = std::strtoull(attrOr(first, "guid", "0").c_str(), nullptr, 16);
    net->set("guid", fmt::format("{:#x}", guid));
    net->set("maxconn", attrOr(first, "maxconn", "64"));
    net->set("gdr", attrOr(first, "gdr", "0"));
    net->set("net", "1");
  }
}

XmlDoc prepareNodeXml(const XmlDoc& file, const std::vector<LocalGpu>& ranks, const Config& cfg) {
  systemElement(file);
  if (ranks.size() > static_cast<size_t>(kTopoMaxNodes))
    fail(StatusCode::kInvalidArgument, "{}: {} ranks on one host; NCCL supports at most {} GPUs per host "
         "(NCCL_TOPO_MAX_NODES)", file.source, ranks.size(), kTopoMaxNodes);
  {
    std::set<std::pair<int, int>> seen;
    for (auto& r : ranks)
      if (!seen.insert({r.host, r.dev}).second)
        fail(StatusCode::kInvalidArgument, "Duplicate GPU detected: ranks use GPU dev {} twice on one host", r.dev);
  }
  // Every PCI device needs its bus id before NIC fusion looks at them.
  {
    std::vector<XmlNode*> pcis;
    collect(*file.root, "pci", pcis);
    for (XmlNode* p : pcis)
      if (!p->has("busid"))
        fail(StatusCode::kInvalidArgument, "{}: <pci> is missing required attribute 'busid'", file.where(*p));
  }
  // GPU-to-GPU NVLinks must point at a GPU of the file (NCCL silently drops them).
  {
    std::vector<XmlNode*> links, pcis;
    collect(*file.root, "nvlink", links);
    collect(*file.root, "pci", pcis);
    std::unordered_map<std::string, XmlNode*> pciByBusId;  // the first in document order, as findWith
    for (XmlNode* p : pcis) pciByBusId.emplace(*p->attr("busid"), p);
    for (XmlNode* l : links) {
      const std::string* tclass = l->attr("tclass");
      const std::string* target = l->attr("target");
      if (!tclass || !target || tclass->compare(0, 4, "0x03") != 0) continue;
      auto it = pciByBusId.find(*target);
      XmlNode* pci = it == pciByBusId.end() ? nullptr : it->second;
      if (!pci || !pci->child("gpu"))
        fail(StatusCode::kInvalidArgument, "{}: <nvlink target=\"{}\"> points at no GPU of the topology",
             file.where(*l), *target);
    }
  }
  // Each host's network plugin sees its own devices and numbers them from 0 (a multi-host XML is the fused view of
  // an NVLink domain: every host contributes its ranks' XMLs). NCCL trims a fresh copy of the host's XML for each
  // local rank and fuses the copies. The network view (device numbers, fused NICs) is the same in every copy of a
  // host, so it is applied once per host, and each rank's trimmed copy is made without copying what trimming
  // removes: linear in the ranks' views, not ranks x file.
  const int nHosts = std::max(1, xmlHostCount(file));
  std::vector<XmlDoc> hostDocs;
  std::vector<std::unordered_map<int, const XmlNode*>> gpuByDev(nHosts);
  std::vector<std::unique_ptr<TrimmedCopies>> copies;
  for (int h = 0; h < nHosts; ++h) {
    hostDocs.push_back(nHosts == 1 ? file.clone() : selectHosts(file, h, 1));
    XmlDoc& d = hostDocs.back();
    const bool socketOnly = applyPluginDevices(d, cfg);
    applyNets(*d.root, cfg, socketOnly ? std::vector<std::vector<int>>{} : netGroups(*d.root, cfg));
    for (XmlNode* g : hostGpuElements(systemElement(d), 0))
      if (g->attr("dev")) gpuByDev[h][std::atoi(g->attr("dev")->c_str())] = g;
    copies.push_back(std::make_unique<TrimmedCopies>(*d.root));
  }
  XmlDoc fused;
  fused.source = file.source;
  auto fuse = [&](XmlDoc d) {
    if (!fused.root) fused.root = std::move(d.root);
    else fuseXml(*fused.root, *d.root);
  };
  for (auto& r : ranks) {
    if (r.host < 0 || r.host >= nHosts)
      fail(StatusCode::kInvalidArgument, "{}: rank {} is on host {}, the topology describes {}", file.source, r.rank,
           r.host, nHosts);
    auto gpu = gpuByDev[r.host].find(r.dev);
    if (gpu == gpuByDev[r.host].end())
      fail(StatusCode::kInvalidArgument, "{}: rank {} uses GPU dev {}{}, which the topology does not have", file.source,
           r.rank, r.dev, r.host ? fmt::format(" of host {}", r.host) : std::string());
    auto mine = copies[r.host]->copy(gpu->second, [&](XmlNode& g) {
      g.set("keep", "1");
      g.set("rank", std::to_string(r.rank));
      g.setIfUnset("gdr", "1");
    });
    if (!fused.root) fused.root = std::move(mine);
    else fuseXml(*fused.root, *mine);
  }
  if (!fused.root) {
    // No rank: keep the whole machine (nothing would be kept by trimming).
    for (int h = 0; h < nHosts; ++h) {
      hostDocs[h].root->visit([](XmlNode& n) { n.unset("keep"); });
      fuse(std::move(hostDocs[h]));
    }
  }
  return fused;
}

}  // namespace topocoll::topology
