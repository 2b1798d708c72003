#include "matrix.h"

#include <nlohmann/json.hpp>

#include "topocoll/status.h"
#include "topocoll/topology/render.h"

namespace topocoll::cli {

using topology::NodeRef;
using topology::NodeType;
using topology::Path;
using topology::System;

namespace {

const Path& pathBetween(const System& sys, NodeRef a, NodeRef b) {
  return sys.at(a).paths[static_cast<int>(b.type)][b.index];
}

std::string label(const System& sys, NodeRef r) {
  const auto& n = sys.at(r);
  if (r.type == NodeType::GPU) return "GPU" + std::to_string(n.dev);
  if (r.type == NodeType::NET) return "NET" + std::to_string(n.dev);
  return std::string(topology::to_string(r.type)) + std::to_string(r.index);
}

NodeRef parseNode(const System& sys, const std::string& s) {
  auto num = [&](size_t off) {
    if (s.size() <= off) fail(StatusCode::kInvalidArgument, "'{}': expected GPU<dev>, NET<dev>, CPU<i> or NVS<i>", s);
    return std::atoi(s.c_str() + off);
  };
  if (s.rfind("GPU", 0) == 0) {
    int dev = num(3);
    for (int g = 0; g < sys.count(NodeType::GPU); ++g)
      if (sys.of(NodeType::GPU)[g].dev == dev) return {NodeType::GPU, g};
    fail(StatusCode::kNotFound, "{}: no GPU with dev {} in the system", s, dev);
  }
  if (s.rfind("NET", 0) == 0) {
    int dev = num(3);
    for (int n = 0; n < sys.count(NodeType::NET); ++n)
      if (sys.of(NodeType::NET)[n].dev == dev) return {NodeType::NET, n};
    fail(StatusCode::kNotFound, "{}: no NET with dev {} in the system", s, dev);
  }
  for (NodeType t : {NodeType::CPU, NodeType::NVS}) {
    std::string p = topology::to_string(t);
    if (s.rfind(p, 0) == 0) {
      int i = num(p.size());
      if (i < 0 || i >= sys.count(t)) fail(StatusCode::kNotFound, "{}: no such {}", s, p);
      return {t, i};
    }
  }
  fail(StatusCode::kInvalidArgument, "'{}': expected GPU<dev>, NET<dev>, CPU<i> or NVS<i>", s);
}

}  // namespace

std::string pathMatrix(const System& sys) {
  std::vector<NodeRef> cols;
  for (int g = 0; g < sys.count(NodeType::GPU); ++g) cols.push_back({NodeType::GPU, g});
  for (int n = 0; n < sys.count(NodeType::NET); ++n) cols.push_back({NodeType::NET, n});
  std::string out = fmt::format("{:8}", "");
  for (auto c : cols) out += fmt::format("{:>7}", label(sys, c));
  out += "\n";
  for (auto r : cols) {
    out += fmt::format("{:8}", label(sys, r));
    for (auto c : cols) {
      if (r == c) {
        out += fmt::format("{:>7}", "X");
        continue;
      }
      const Path& p = pathBetween(sys, r, c);
      out += fmt::format("{:>7}", topology::to_string(p.type));
    }
    out += "\n";
  }
  out += "\nLegend:\n"
         "  X   = Self\n"
         "  NVL = Connection traversing NVLink\n"
         "  NVB = NVLink through an intermediate GPU\n"
         "  C2C = Chip-to-chip link to the CPU (Grace)\n"
         "  PIX = At most a single PCIe bridge\n"
         "  PXB = Multiple PCIe bridges, no host bridge\n"
         "  P2C = C2C to the CPU, then PCIe to the NIC\n"
         "  PXN = To a NIC through an NVLink peer GPU\n"
         "  PHB = PCIe and a PCIe host bridge (the CPU)\n"
         "  SYS = PCIe and the inter-CPU interconnect (QPI/UPI/xGMI)\n"
         "  NET = Through the network\n"
         "  DIS = Disconnected\n";
  return out;
}

std::string pathMatrixJson(const System& sys) {
  nlohmann::ordered_json j;
  std::vector<NodeRef> cols;
  for (int g = 0; g < sys.count(NodeType::GPU); ++g) cols.push_back({NodeType::GPU, g});
  for (int n = 0; n < sys.count(NodeType::NET); ++n) cols.push_back({NodeType::NET, n});
  std::vector<std::string> names;
  for (auto c : cols) names.push_back(label(sys, c));
  j["nodes"] = names;
  auto rows = nlohmann::ordered_json::array();
  for (auto r : cols) {
    auto row = nlohmann::ordered_json::array();
    for (auto c : cols) {
      const Path& p = pathBetween(sys, r, c);
      row.push_back({{"type", r == c ? "LOC" : topology::to_string(p.type)}, {"bw", p.bw}});
    }
    rows.push_back(row);
  }
  j["matrix"] = rows;
  return j.dump(1);
}

std::string pathReport(const System& sys, const std::string& from, const std::string& to, bool json) {
  NodeRef a = parseNode(sys, from), b = parseNode(sys, to);
  const Path& p = pathBetween(sys, a, b);
  nlohmann::ordered_json j;
  j["from"] = label(sys, a);
  j["to"] = label(sys, b);
  j["type"] = topology::to_string(p.type);
  j["bw"] = p.bw;
  auto hops = nlohmann::ordered_json::array();
  std::string text = fmt::format("{} -> {}: {} {:g} GB/s, {} hops\n", label(sys, a), label(sys, b),
                                 topology::to_string(p.type), p.bw, p.count());
  float minBw = 1e30f;
  int bottleneck = -1;
  for (int i = 0; i < p.count(); ++i) {
    const auto& l = sys.link(p.list[i]);
    if (l.bw < minBw) {
      minBw = l.bw;
      bottleneck = i;
    }
  }
  for (int i = 0; i < p.count(); ++i) {
    const auto& l = sys.link(p.list[i]);
    std::string fromL = topology::nodeLabel(sys, p.list[i].node), toL = topology::nodeLabel(sys, l.rem);
    hops.push_back({{"from", fromL}, {"to", toL}, {"type", topology::to_string(l.type)}, {"bw", l.bw},
                    {"bottleneck", i == bottleneck}});
    text += fmt::format("  {:2}  {:<22} --{}({:g})--> {}{}\n", i, fromL, topology::to_string(l.type), l.bw, toL,
                        i == bottleneck ? "   <- bottleneck" : "");
  }
  j["hops"] = hops;
  return json ? j.dump(1) + "\n" : text;
}

}  // namespace topocoll::cli
