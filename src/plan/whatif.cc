#include "topocoll/whatif.h"

#include <cstdlib>

#include <fmt/format.h>

#include "topocoll/status.h"

namespace topocoll {

using topology::XmlDoc;
using topology::XmlNode;

namespace {

const char* kFlags[] = {"remove-nic", "remove-link", "nvlink-count", "pcie-gen", "pcie-width", "set", "nodes"};

int parseCount(const std::string& flag, const std::string& v, int lo, int hi) {
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || n < lo || n > hi)
    fail(StatusCode::kInvalidArgument, "--{}: '{}' is not a number in [{}, {}]", flag, v, lo, hi);
  return static_cast<int>(n);
}

// "GPU3" -> 3, else -1.
int devOf(const std::string& s, const char* prefix) {
  size_t n = std::char_traits<char>::length(prefix);
  if (s.size() <= n || s.compare(0, n, prefix) != 0) return -1;
  char* end = nullptr;
  long v = std::strtol(s.c_str() + n, &end, 10);
  return *end || v < 0 ? -1 : static_cast<int>(v);
}

XmlNode* gpuElement(XmlNode& root, int dev, const Edit& e) {
  XmlNode* g = root.findWith("gpu", "dev", std::to_string(dev));
  if (!g) fail(StatusCode::kInvalidArgument, "{}: the topology has no GPU with dev {}", e.text(), dev);
  return g;
}

XmlNode* netElement(XmlNode& root, const std::string& name, const Edit& e) {
  int dev = devOf(name, "NET");
  XmlNode* n = dev >= 0 ? root.findWith("net", "dev", std::to_string(dev)) : root.findWith("net", "name", name);
  if (!n) fail(StatusCode::kInvalidArgument, "{}: the topology has no NET {}", e.text(), name);
  return n;
}

// The <pci> element whose link a GPU, a NIC's NET or a bus id names.
XmlNode* pciElement(XmlNode& root, const std::string& target, const Edit& e) {
  XmlNode* x = nullptr;
  if (int g = devOf(target, "GPU"); g >= 0) x = gpuElement(root, g, e);
  else if (devOf(target, "NET") >= 0 || !root.findWith("pci", "busid", target)) x = netElement(root, target, e);
  else return root.findWith("pci", "busid", target);
  while (x && x->name != "pci") x = x->parent;
  if (!x) fail(StatusCode::kInvalidArgument, "{}: {} has no PCI link in the topology", e.text(), target);
  return x;
}

std::string busIdOfGpu(XmlNode& root, int dev, const Edit& e) {
  XmlNode* g = gpuElement(root, dev, e);
  const std::string* b = g->parent ? g->parent->attr("busid") : nullptr;
  if (!b) fail(StatusCode::kInvalidArgument, "{}: GPU{} has no bus id", e.text(), dev);
  return *b;
}

// NVLinks of GPU `dev` towards "NVS", "CPU" or a peer GPU's bus id.
std::vector<XmlNode*> nvlinks(XmlNode& root, int dev, const std::string& peer, const Edit& e) {
  XmlNode* g = gpuElement(root, dev, e);
  std::vector<XmlNode*> out;
  for (auto& s : g->subs) {
    if (s->name != "nvlink") continue;
    const std::string* tclass = s->attr("tclass");
    const std::string* target = s->attr("target");
    bool match = peer == "NVS" ? tclass && *tclass == "0x068000"
                 : peer == "CPU" ? tclass && *tclass == "0x068001"
                                 : target && topology::busIdToInt64(*target) == topology::busIdToInt64(peer);
    if (match) out.push_back(s.get());
  }
  return out;
}

// "GPU0-NVS0" -> (0, "NVS"); "GPU0-GPU3" -> (0, bus id of GPU3) and the reverse; "GPU0-CPU" -> (0, "CPU").
std::vector<std::pair<int, std::string>> linkEnds(XmlNode& root, const std::string& spec, const Edit& e) {
  size_t dash = spec.find('-');
  std::string a = spec.substr(0, dash), b = dash == std::string::npos ? "" : spec.substr(dash + 1);
  int ga = devOf(a, "GPU");
  if (ga < 0 || b.empty())
    fail(StatusCode::kInvalidArgument, "{}: name a link as GPU<a>-NVS0, GPU<a>-GPU<b> or GPU<a>-CPU", e.text());
  if (b.rfind("NVS", 0) == 0) return {{ga, "NVS"}};
  if (b.rfind("CPU", 0) == 0) return {{ga, "CPU"}};
  int gb = devOf(b, "GPU");
  if (gb < 0) fail(StatusCode::kInvalidArgument, "{}: '{}' is not NVS0, CPU or GPU<b>", e.text(), b);
  return {{ga, busIdOfGpu(root, gb, e)}, {gb, busIdOfGpu(root, ga, e)}};
}

void apply(XmlNode& root, const Edit& e) {
  switch (e.kind) {
    case Edit::kRemoveNic: {
      XmlNode* net = netElement(root, e.target, e);
      XmlNode* nic = net->parent;
      nic->removeChild(net);
      // A NIC without a port left is gone: take its PCI device too.
      if (nic->name == "nic" && nic->child("net") == nullptr) {
        XmlNode* up = nic->parent;
        if (up && up->name == "pci" && up->subs.size() == 1 && up->parent) up->parent->removeChild(up);
        else if (up) up->removeChild(nic);
      }
      break;
    }
    case Edit::kRemoveLink:
    case Edit::kNvlinkCount: {
      std::string spec = e.target;
      bool found = false;
      if (e.kind == Edit::kNvlinkCount && spec.find('-') == std::string::npos) spec += "-NVS0";
      for (auto [gpu, peer] : linkEnds(root, spec, e)) {
        for (XmlNode* l : nvlinks(root, gpu, peer, e)) {
          found = true;
          if (e.kind == Edit::kRemoveLink || e.value == "0") l->parent->removeChild(l);
          else l->set("count", e.value);
        }
      }
      if (!found) fail(StatusCode::kInvalidArgument, "{}: the topology has no such NVLink", e.text());
      break;
    }
    case Edit::kPcieGen: {
      static const char* kSpeeds[] = {"2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe",
                                      "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe"};
      pciElement(root, e.target, e)->set("link_speed", kSpeeds[std::atoi(e.value.c_str()) - 1]);
      break;
    }
    case Edit::kPcieWidth: pciElement(root, e.target, e)->set("link_width", e.value); break;
    default: break;
  }
}

}  // namespace

std::string Edit::text() const {
  std::string arg = value.empty() ? target : kind == kNodes ? value : target + "=" + value;
  return fmt::format("--{} {}", kFlags[kind], arg);
}

Edit parseEdit(const std::string& flag, const std::string& arg) {
  Edit e;
  int kind = -1;
  for (int k = 0; k < static_cast<int>(std::size(kFlags)); ++k)
    if (flag == kFlags[k]) kind = k;
  if (kind < 0) fail(StatusCode::kInvalidArgument, "unknown what-if edit --{}", flag);
  e.kind = static_cast<Edit::Kind>(kind);
  size_t eq = arg.find('=');
  switch (e.kind) {
    case Edit::kRemoveNic:
    case Edit::kRemoveLink:
      if (arg.empty() || eq != std::string::npos) fail(StatusCode::kInvalidArgument, "--{}: name one {}", flag,
                                                       e.kind == Edit::kRemoveNic ? "NET (NET3 or mlx5_3)" : "link (GPU0-NVS0)");
      e.target = arg;
      break;
    case Edit::kNodes:
      e.value = std::to_string(parseCount(flag, arg, 1, 1 << 20));
      break;
    default:
      if (eq == std::string::npos || eq == 0)
        fail(StatusCode::kInvalidArgument, "--{} {}: expected TARGET=VALUE", flag, arg);
      e.target = arg.substr(0, eq);
      e.value = arg.substr(eq + 1);
      if (e.kind == Edit::kNvlinkCount) e.value = std::to_string(parseCount(flag, e.value, 0, 64));
      if (e.kind == Edit::kPcieGen) e.value = std::to_string(parseCount(flag, e.value, 1, 6));
      if (e.kind == Edit::kPcieWidth) e.value = std::to_string(parseCount(flag, e.value, 1, 32));
      if (e.kind == Edit::kSet && !findKnob(e.target))
        fail(StatusCode::kInvalidArgument, "--set {}: no such knob (topocoll params lists them)", e.target);
      break;
  }
  return e;
}

XmlDoc applyEdits(const XmlDoc& topo, const std::vector<Edit>& edits) {
  XmlDoc out = topo.clone();
  for (const Edit& e : edits) apply(*out.root, e);
  return out;
}

WhatIf whatIf(const XmlDoc& topo, const JobSpec& job, const Env& env, const std::vector<Edit>& edits) {
  WhatIf w;
  w.edits = edits;
  Config cfg = Config::fromEnv(env);
  w.before = makePlan(topo, job, cfg);
  Env afterEnv = env;
  JobSpec afterJob = job;
  for (const Edit& e : edits) {
    if (e.kind == Edit::kSet) afterEnv = afterEnv.with(e.target, e.value);
    if (e.kind == Edit::kNodes) afterJob.nNodes = std::atoi(e.value.c_str());
  }
  XmlDoc edited = applyEdits(topo, edits);
  edited.source = topo.source + " (edited)";
  w.after = makePlan(edited, afterJob, Config::fromEnv(afterEnv));
  return w;
}

}  // namespace topocoll
