#include "topocoll/topology/node_xml.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>

#include "topocoll/status.h"
#include "topocoll/topology/system.h"

namespace topocoll::topology {

namespace {

constexpr int kMaxDevsPerNic = 8;  // NCCL_NET_MAX_DEVS_PER_NIC for net plugin v12
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
std::string firstHost(const XmlNode& root) {
  XmlNode* cpu = const_cast<XmlNode&>(root).find("cpu");
  return cpu ? hostOf(cpu) : "";
}
// GPUs of the first host only: a multi-host (multi-node NVLink) XML is planned as its first host for now.
std::vector<XmlNode*> localGpuElements(const XmlNode& root) {
  std::vector<XmlNode*> gpus, out;
  collect(const_cast<XmlNode&>(root), "gpu", gpus);
  std::string host = firstHost(root);
  for (XmlNode* g : gpus)
    if (hostOf(g) == host) out.push_back(g);
  return out;
}
}  // namespace

std::vector<int> gpuDevs(const XmlDoc& doc) {
  systemElement(doc);
  std::vector<XmlNode*> gpus = localGpuElements(*doc.root);
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
// Which physical NET devices (by document order) fuse into virtual NICs. Depends only on the file, so it is
// computed once per host and applied to every rank's copy.
std::vector<std::vector<int>> netGroups(XmlNode& root, const Config& cfg) {
  std::vector<XmlNode*> nets;
  collect(root, "net", nets);
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
      if (g.size() > kMaxDevsPerNic)
        fail(StatusCode::kInvalidArgument, "NCCL_NET_FORCE_MERGE={}: group '{}' has more than {} devices",
             cfg.netForceMerge, grp, kMaxDevsPerNic);
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
      if (static_cast<int>(g.size()) == kMaxDevsPerNic) break;
    }
    if (g.size() > 1) groups.push_back(g);
  }
  return groups;
}
}  // namespace

void processNets(XmlNode& root, const Config& cfg) { applyNets(root, cfg, netGroups(root, cfg)); }

void applyNets(XmlNode& root, const Config& cfg, const std::vector<std::vector<int>>& groups) {
  std::vector<XmlNode*> nets;
  collect(root, "net", nets);
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
    std::set<int> seen;
    for (auto& r : ranks)
      if (!seen.insert(r.dev).second)
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
  // NCCL trims a fresh copy of the host's XML for each local rank and fuses the copies. The network view (device
  // numbers, fused NICs) is the same in every copy, so it is applied once, and each rank's trimmed copy is made
  // without copying what trimming removes: linear in the ranks' views, not ranks x file.
  XmlDoc base = file.clone();
  applyNets(*base.root, cfg, netGroups(*base.root, cfg));
  std::unordered_map<int, const XmlNode*> gpuByDev;
  for (XmlNode* g : localGpuElements(*base.root))
    if (g->attr("dev")) gpuByDev[std::atoi(g->attr("dev")->c_str())] = g;
  TrimmedCopies copies(*base.root);
  XmlDoc fused;
  fused.source = file.source;
  for (auto& r : ranks) {
    auto gpu = gpuByDev.find(r.dev);
    if (gpu == gpuByDev.end())
      fail(StatusCode::kInvalidArgument, "{}: rank {} uses GPU dev {}, which the topology does not have", file.source,
           r.rank, r.dev);
    auto mine = copies.copy(gpu->second, [&](XmlNode& g) {
      g.set("keep", "1");
      g.set("rank", std::to_string(r.rank));
      g.setIfUnset("gdr", "1");
    });
    if (!fused.root) fused.root = std::move(mine);
    else fuseXml(*fused.root, *mine);
  }
  if (!fused.root) {
    // No rank on this host: keep the whole machine (nothing would be kept by trimming).
    fused = std::move(base);
    fused.root->visit([](XmlNode& n) { n.unset("keep"); });
  }
  return fused;
}

}  // namespace topocoll::topology
