#include "topocoll/topology/render.h"

#include <set>

#include <fmt/format.h>

namespace topocoll::topology {

std::string nodeLabel(const System& sys, NodeRef ref) {
  const Node& n = sys.at(ref);
  switch (ref.type) {
    case NodeType::GPU: return fmt::format("GPU{} (rank {})", n.dev, n.rank);
    case NodeType::DEV: return fmt::format("DEV{}", n.dev);
    case NodeType::NET: return fmt::format("NET{}{}{}", n.dev, n.name.empty() ? "" : " ", n.name);
    case NodeType::NIC: return fmt::format("NIC {}", n.busId.empty() ? fmt::format("{:x}", localIdOf(n.id)) : n.busId);
    case NodeType::PCI: return fmt::format("PCI {}", n.busId);
    case NodeType::CPU: return fmt::format("CPU{} (numa {})", ref.index, localIdOf(n.id));
    case NodeType::NVS: return fmt::format("NVS{}", ref.index);
    default: return fmt::format("{}{}", to_string(ref.type), ref.index);
  }
}

namespace {
std::string fmtBw(float bw) { return fmt::format("{:g}", bw); }

void treeRec(const System& sys, NodeRef node, NodeRef from, int depth, std::string& out, std::set<std::pair<int, int>>& seen) {
  for (const Link& l : sys.at(node).links) {
    if (l.rem == from) continue;
    bool descend = l.type == LinkType::PCI || (node.type == NodeType::DEV && l.rem.type == NodeType::GPU) ||
                   (node.type == NodeType::NIC && l.type == LinkType::NET);
    out.append(static_cast<size_t>(depth) * 2, ' ');
    out += fmt::format("+ {} {} GB/s -> {}\n", to_string(l.type), fmtBw(l.bw), nodeLabel(sys, l.rem));
    auto key = std::make_pair(static_cast<int>(l.rem.type), l.rem.index);
    if (descend && l.rem.type != NodeType::CPU && seen.insert(key).second) treeRec(sys, l.rem, node, depth + 1, out, seen);
  }
}
}  // namespace

std::string renderTree(const System& sys) {
  std::string out = fmt::format("System: {} CPU, {} PCI switch, {} NVSwitch, {} GPU, {} NIC, {} NET (maxBw {} totalBw {})\n",
                                sys.count(NodeType::CPU), sys.count(NodeType::PCI), sys.count(NodeType::NVS),
                                sys.count(NodeType::GPU), sys.count(NodeType::NIC), sys.count(NodeType::NET),
                                fmtBw(sys.maxBw), fmtBw(sys.totalBw));
  std::set<std::pair<int, int>> seen;
  for (int c = 0; c < sys.count(NodeType::CPU); ++c) {
    const Node& cpu = sys.of(NodeType::CPU)[c];
    out += fmt::format("{} host {} arch {} vendor {} model {}\n", nodeLabel(sys, {NodeType::CPU, c}), systemIdOf(cpu.id),
                       cpu.arch, cpu.vendor, cpu.model);
    treeRec(sys, {NodeType::CPU, c}, {NodeType::CPU, -1}, 1, out, seen);
  }
  for (int s = 0; s < sys.count(NodeType::NVS); ++s) {
    out += nodeLabel(sys, {NodeType::NVS, s}) + "\n";
    for (const Link& l : sys.of(NodeType::NVS)[s].links)
      out += fmt::format("  + {} {} GB/s -> {}\n", to_string(l.type), fmtBw(l.bw), nodeLabel(sys, l.rem));
  }
  return out;
}

std::string renderDot(const System& sys, const std::string& title, const std::string& extraEdges) {
  static const char* colors[] = {"#76b900", "#d9d9d9", "#f4a261", "#8ecae6", "#ffd166", "#ef476f", "#cccccc",
                                 "#cccccc", "#b7e4c7", "#cccccc"};
  std::string out = "digraph topology {\n  graph [rankdir=TB, fontname=\"Helvetica\", label=\"" + title +
                    "\", labelloc=t];\n  node [style=filled, fontname=\"Helvetica\", shape=box];\n"
                    "  edge [fontname=\"Helvetica\", fontsize=9, dir=none];\n";
  for (int t = 0; t < kNodeTypes; ++t) {
    if (static_cast<NodeType>(t) == NodeType::DEV) continue;
    for (int i = 0; i < sys.count(static_cast<NodeType>(t)); ++i) {
      NodeRef r{static_cast<NodeType>(t), i};
      out += fmt::format("  n{}_{} [label=\"{}\", fillcolor=\"{}\"];\n", t, i, nodeLabel(sys, r), colors[t]);
    }
  }
  // A GPU is drawn in place of its DEV node: edges to a DEV go to its GPU.
  auto name = [&](NodeRef r) {
    if (r.type == NodeType::DEV) {
      for (int g = 0; g < sys.count(NodeType::GPU); ++g)
        if (sys.of(NodeType::GPU)[g].parent == r.index) return fmt::format("n0_{}", g);
    }
    return fmt::format("n{}_{}", static_cast<int>(r.type), r.index);
  };
  std::set<std::pair<std::string, std::string>> done;
  for (int t = 0; t < kNodeTypes; ++t) {
    for (int i = 0; i < sys.count(static_cast<NodeType>(t)); ++i) {
      NodeRef r{static_cast<NodeType>(t), i};
      for (const Link& l : sys.at(r).links) {
        if (l.type == LinkType::LOC && (r.type == NodeType::GPU || r.type == NodeType::DEV)) continue;
        std::string a = name(r), b = name(l.rem);
        if (a == b || done.count({b, a}) || !done.insert({a, b}).second) continue;
        const char* style = l.type == LinkType::NVL ? "color=\"#76b900\", penwidth=2"
                            : l.type == LinkType::SYS ? "style=dashed"
                                                      : "color=\"#555555\"";
        out += fmt::format("  {} -> {} [label=\"{} {}\", {}];\n", a, b, to_string(l.type), fmtBw(l.bw), style);
      }
    }
  }
  out += extraEdges;
  out += "}\n";
  return out;
}

}  // namespace topocoll::topology
