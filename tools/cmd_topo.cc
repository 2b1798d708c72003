// `topocoll topo ...`: the topology as NCCL sees it (dump, show, matrix, paths, draw).
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "matrix.h"
#include "topocoll/paths/paths.h"
#include "topocoll/status.h"
#include "topocoll/topology/render.h"
#include "topocoll/topology/system.h"

namespace topocoll::cli {

namespace {

struct TopoArgs {
  std::string topo, out, from, to;
  bool json = false;
};

nlohmann::ordered_json xmlJson(const topology::XmlNode& n) {
  nlohmann::ordered_json j;
  j["name"] = n.name;
  nlohmann::ordered_json attrs = nlohmann::ordered_json::object();
  for (auto& [k, v] : n.attrs) attrs[k] = v;
  j["attrs"] = attrs;
  if (!n.subs.empty()) {
    auto subs = nlohmann::ordered_json::array();
    for (auto& c : n.subs) subs.push_back(xmlJson(*c));
    j["children"] = subs;
  }
  return j;
}

std::string systemJson(const topology::System& sys) {
  nlohmann::ordered_json j;
  j["maxBw"] = sys.maxBw;
  j["totalBw"] = sys.totalBw;
  auto nodes = nlohmann::ordered_json::array();
  for (int t = 0; t < topology::kNodeTypes; ++t) {
    for (int i = 0; i < sys.count(static_cast<topology::NodeType>(t)); ++i) {
      topology::NodeRef r{static_cast<topology::NodeType>(t), i};
      const auto& n = sys.at(r);
      nlohmann::ordered_json x;
      x["type"] = topology::to_string(r.type);
      x["index"] = i;
      x["id"] = fmt::format("{:x}", n.id);
      x["label"] = topology::nodeLabel(sys, r);
      auto links = nlohmann::ordered_json::array();
      for (auto& l : n.links)
        links.push_back({{"type", topology::to_string(l.type)}, {"bw", l.bw},
                         {"to", fmt::format("{}{}", topology::to_string(l.rem.type), l.rem.index)}});
      x["links"] = links;
      nodes.push_back(x);
    }
  }
  j["nodes"] = nodes;
  return j.dump(1) + "\n";
}

// Every GPU's paths to the other GPUs and to every NIC.
std::string allGpuPaths(const topology::System& sys, bool json) {
  std::string out;
  const auto& gpus = sys.of(topology::NodeType::GPU);
  const auto& nets = sys.of(topology::NodeType::NET);
  for (size_t g = 0; g < gpus.size(); ++g) {
    std::string a = "GPU" + std::to_string(gpus[g].dev);
    for (size_t p = 0; p < gpus.size(); ++p)
      if (p != g) out += pathReport(sys, a, "GPU" + std::to_string(gpus[p].dev), json);
    for (auto& n : nets) out += pathReport(sys, a, "NET" + std::to_string(n.dev), json);
  }
  return out;
}

}  // namespace

std::vector<Command> addTopoCommands(CLI::App& app) {
  auto a = std::make_shared<TopoArgs>();
  auto* topo = app.add_subcommand("topo", "Inspect a topology: dump, show, matrix, paths, draw");
  topo->require_subcommand(1);
  auto sub = [&](const char* name, const char* help) {
    auto* c = topo->add_subcommand(name, help);
    c->add_option("--topo", a->topo, "Topology XML (default: NCCL_TOPO_FILE, then discovery)");
    c->add_flag("--json", a->json, "Machine-readable output");
    return c;
  };
  auto* dump = sub("dump", "Write the topology XML (discovered, or --topo) as NCCL would dump it");
  dump->add_option("--out,-o", a->out, "Output file (default: NCCL_TOPO_DUMP_FILE, else stdout)");
  auto* show = sub("show", "Readable tree of the system graph with link bandwidths");
  auto* matrix = sub("matrix", "GPU/NIC path-type matrix, like nvidia-smi topo -m");
  auto* pathsCmd = sub("paths", "Hop list of one path (or all GPU paths)");
  pathsCmd->add_option("--from", a->from, "Source: GPU<dev>, NET<dev>, CPU<i>");
  pathsCmd->add_option("--to", a->to, "Destination: GPU<dev>, NET<dev>, CPU<i>");
  auto* draw = sub("draw", "Render the system with Graphviz (.svg, .png, .pdf or .dot)");
  draw->add_option("--out,-o", a->out, "Output file: FILE.svg, FILE.png, FILE.pdf (rendered by Graphviz) or FILE.dot")
      ->required();

  std::vector<Command> cmds;
  cmds.push_back({dump, [a](const Env&, Config& cfg) {
                    std::string name;
                    auto doc = loadTopology(a->topo, cfg, &name);
                    std::string out = a->out.empty() ? cfg.topoDumpFile : a->out;
                    writeOut(out, a->json ? xmlJson(*doc.root).dump(1) + "\n" : topology::toString(*doc.root));
                    return 0;
                  }});
  // The others look at the system graph after paths, as NCCL's rank 0 sees its host.
  auto onSystem = [a](auto view) {
    return [a, view](const Env&, Config& cfg) {
      std::string name;
      auto sys = paths::hostSystem(loadTopology(a->topo, cfg, &name), cfg);
      view(sys, name);
      return 0;
    };
  };
  cmds.push_back({show, onSystem([a](const topology::System& sys, const std::string&) {
                    std::cout << (a->json ? systemJson(sys) : topology::renderTree(sys));
                  })});
  cmds.push_back({matrix, onSystem([a](const topology::System& sys, const std::string&) {
                    std::cout << (a->json ? pathMatrixJson(sys) + "\n" : pathMatrix(sys));
                  })});
  cmds.push_back({pathsCmd, onSystem([a](const topology::System& sys, const std::string&) {
                    if (a->from.empty() != a->to.empty()) fail(StatusCode::kInvalidUsage, "--from and --to go together");
                    std::cout << (a->from.empty() ? allGpuPaths(sys, a->json) : pathReport(sys, a->from, a->to, a->json));
                  })});
  cmds.push_back({draw, onSystem([a](const topology::System& sys, const std::string& name) {
                    std::string format = writeGraph(a->out, topology::renderDot(sys, name));
                    if (a->json) std::cout << nlohmann::ordered_json{{"out", a->out}, {"format", format}}.dump() << "\n";
                  })});
  return cmds;
}

}  // namespace topocoll::cli
