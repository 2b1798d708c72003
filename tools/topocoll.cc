// topocoll: plan what NCCL would do on a machine, from its topology XML.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "matrix.h"
#include "topocoll/config.h"
#include "topocoll/log.h"
#include "topocoll/paths/paths.h"
#include "topocoll/plan.h"
#include "topocoll/status.h"
#include "topocoll/topology/discovery.h"
#include "topocoll/topology/node_xml.h"
#include "topocoll/topology/render.h"
#include "plot.h"
#include "topocoll/runtime/communicator.h"

using namespace topocoll;

namespace {

constexpr const char* kDefaultTopo = "/var/run/nvidia-topologyd/virtualTopology.xml";

struct Common {
  std::string topo;
  bool json = false;
};

// --topo, else NCCL_TOPO_FILE, else NCCL's default virtual topology, else discovery.
topology::XmlDoc loadTopology(const std::string& flag, const Config& cfg, std::string* name) {
  std::string path = flag.empty() ? cfg.topoFile : flag;
  if (path.empty() && access(kDefaultTopo, R_OK) == 0) path = kDefaultTopo;
  if (!path.empty()) {
    *name = path;
    return topology::loadXmlFile(path);
  }
  *name = "<discovered>";
  topology::DiscoveryOptions opts;
  return topology::discoverLocalTopology(opts);
}

// `topocoll params`: the knob registry, grouped by layer, with where each value came from.
std::string paramsText(const Env& env, const Config& cfg, bool json) {
  if (json) {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const Knob& k : knobs()) {
      nlohmann::ordered_json j;
      j["name"] = k.name;
      if (!k.aliases.empty()) j["aliases"] = k.aliases;
      j["group"] = k.group;
      j["type"] = k.type;
      j["range"] = k.range;
      j["default"] = k.defaultText();
      j["value"] = k.get(cfg);
      j["set"] = env.get(k.name).has_value();
      j["doc"] = k.doc;
      arr.push_back(j);
    }
    return arr.dump(1) + "\n";
  }
  std::string out, group;
  for (const Knob& k : knobs()) {
    if (k.group != group) {
      group = k.group;
      out += fmt::format("{}# {}\n", out.empty() ? "" : "\n", group);
    }
    std::string def = k.defaultText(), cur = k.get(cfg);
    out += fmt::format("{:<30} default={:<8}{} {}{}\n", k.name, def.empty() ? "\"\"" : def,
                       env.get(k.name) ? fmt::format(" [set: {}]", cur.empty() ? "\"\"" : cur) : "", k.doc,
                       k.range.empty() ? "" : fmt::format(" ({})", k.range));
  }
  return out;
}

void writeOut(const std::string& path, const std::string& content) {
  if (path.empty() || path == "-") {
    std::cout << content;
    return;
  }
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(StatusCode::kSystemError, "{}: cannot open for writing", path);
  out << content;
  if (!out) fail(StatusCode::kSystemError, "{}: write error", path);
}

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

std::string dotToSvg(const std::string& dot) {
  char tmpl[] = "/tmp/topocoll-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) fail(StatusCode::kSystemError, "cannot create a temporary file");
  FILE* f = fdopen(fd, "w");
  fputs(dot.c_str(), f);
  fclose(f);
  std::string cmd = std::string("dot -Tsvg ") + tmpl + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string svg;
  if (p) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) svg.append(buf, n);
    int rc = pclose(p);
    if (rc != 0) svg.clear();
  }
  unlink(tmpl);
  if (svg.empty())
    fail(StatusCode::kSystemError, "Graphviz 'dot' is needed to write SVG (apt-get install graphviz), or use --out FILE.dot");
  return svg;
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string channelOverlay(const Plan& plan) {
  static const char* palette[] = {"#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6",
                                  "#bfef45", "#fabed4", "#469990", "#dcbeff", "#9a6324", "#800000", "#aaffc3"};
  const auto& g = plan.graphs[search::kGraphRing];
  const auto& sys = plan.system;
  std::string out;
  int n = plan.localRanks;
  for (int c = 0; c < g.nChannels; ++c) {
    for (int i = 0; i < n; ++i) {
      int a = sys.gpuIndexOfRank(g.intra[c * n + i]);
      int b = sys.gpuIndexOfRank(g.intra[c * n + (i + 1) % n]);
      if (i == n - 1 && sys.inter) break;
      out += fmt::format("  n0_{} -> n0_{} [color=\"{}\", dir=forward, constraint=false, penwidth=1.5, label=\"ch{}\", fontcolor=\"{}\"];\n",
                         a, b, palette[c % 14], c, palette[c % 14]);
    }
    if (sys.inter) {
      int first = sys.gpuIndexOfRank(g.intra[c * n]), last = sys.gpuIndexOfRank(g.intra[c * n + n - 1]);
      int nin = sys.indexOf(topology::NodeType::NET, g.inter[2 * c]);
      int nout = sys.indexOf(topology::NodeType::NET, g.inter[2 * c + 1]);
      out += fmt::format("  n5_{} -> n0_{} [color=\"{}\", dir=forward, constraint=false, style=dotted];\n", nin, first,
                         palette[c % 14]);
      out += fmt::format("  n0_{} -> n5_{} [color=\"{}\", dir=forward, constraint=false, style=dotted];\n", last, nout,
                         palette[c % 14]);
    }
  }
  return out;
}

// NCCL's "Channel cc/nn : ..." ring lines and each rank's "Trees [c] d0/d1/d2->r->up" (the first 64 ranks).
std::string ringsAndTrees(const search::Connect& c, int nRanks) {
  std::string out;
  for (size_t ch = 0; ch < c.rings.size(); ++ch) {
    std::string line = fmt::format("Channel {:02d}/{:02d} :", ch, c.rings.size());
    for (int r : c.rings[ch]) line += fmt::format(" {}", r);
    out += line + "\n";
  }
  for (int r = 0; r < std::min<int>(nRanks, 64); ++r) {
    std::string line = fmt::format("Rank {:3d} Trees", r);
    for (size_t ch = 0; ch < c.trees[r].size(); ++ch) {
      const auto& t = c.trees[r][ch];
      line += fmt::format(" [{}] {}/{}/{}->{}->{}", ch, t.down[0], t.down[1], t.down[2], r, t.up);
    }
    out += line + "\n";
  }
  if (nRanks > 64) out += fmt::format("... ({} more ranks; --json has all)\n", nRanks - 64);
  return out;
}

std::string commCheck(bool json) {
  auto comm = runtime::Communicator::initFromEnv(Env::fromProcess());
  const auto& tm = comm->timings();
  std::vector<runtime::InitTimings> all(comm->nRanks());
  all[comm->rank()] = tm;
  comm->bootstrap().allGather(all.data(), sizeof(runtime::InitTimings));
  if (comm->rank() != 0) return "";
  const auto& c = comm->connect();
  if (json) {
    nlohmann::ordered_json j;
    j["nranks"] = comm->nRanks();
    j["nNodes"] = c.nNodes;
    j["hostMemory"] = comm->hostMemory();
    auto peers = nlohmann::ordered_json::array();
    for (auto& p : comm->peers())
      peers.push_back({{"rank", p.rank}, {"hostHash", fmt::format("{:x}", p.hostHash)}, {"dev", p.dev},
                       {"busId", fmt::format("{:x}", p.busId)}, {"numa", p.numaNode}});
    j["peers"] = peers;
    j["rings"] = c.rings;
    auto trees = nlohmann::ordered_json::array();
    for (auto& perRank : c.trees) {
      auto rj = nlohmann::ordered_json::array();
      for (auto& t : perRank) rj.push_back({{"up", t.up}, {"down", t.down}});
      trees.push_back(rj);
    }
    j["trees"] = trees;
    auto tj = nlohmann::ordered_json::array();
    for (auto& x : all)
      tj.push_back({{"bootstrap", x.bootstrap}, {"allgathers", x.allgathers}, {"topology", x.topology},
                    {"search", x.search}, {"connect", x.connect}, {"total", x.total}});
    j["initTimingsMs"] = tj;
    return j.dump(1) + "\n";
  }
  std::string out = fmt::format("comm-check: {} ranks on {} node(s), {} ranks\n", comm->nRanks(), c.nNodes,
                                comm->hostMemory() ? "host-memory" : "GPU");
  out += fmt::format("{:>5} {:>18} {:>5} {:>6} {:>4}\n", "rank", "host", "dev", "busId", "numa");
  for (auto& p : comm->peers())
    out += fmt::format("{:>5} {:>18x} {:>5} {:>6x} {:>4}\n", p.rank, p.hostHash, p.dev, p.busId < 0 ? 0 : p.busId, p.numaNode);
  out += ringsAndTrees(c, comm->nRanks());
  for (int r = 0; r < comm->nRanks(); ++r)
    out += fmt::format("Init timings (ms) rank {}: bootstrap {:.2f} allgathers {:.2f} topology {:.2f} search {:.2f} "
                       "connect {:.2f} total {:.2f}\n",
                       r, all[r].bootstrap, all[r].allgathers, all[r].topology, all[r].search, all[r].connect,
                       all[r].total);
  return out;
}

std::string planText(const Plan& plan, bool explain) {
  std::string out;
  const auto& sys = plan.system;
  out += fmt::format("Job: {} node(s) x {} GPU(s) = {} ranks\n", plan.job.nNodes, plan.localRanks, plan.nRanks);
  for (int gi = 0; gi < search::kNumGraphs; ++gi) {
    if (!plan.graphAvailable[gi]) continue;
    const auto& g = plan.graphs[gi];
    out += fmt::format("\nGraph {} ({}): search {:.2f} ms{}\n", g.id, search::graphName(gi), g.searchMs,
                       g.timedOut ? " (hit a search time limit)" : "");
    out += search::describe(sys, g);
  }
  const auto& c = plan.connect;
  out += fmt::format("\n{} coll channels, {} nvls channels, {} p2p channels, {} p2p channels per peer\n",
                     c.nChannels, c.nvlsChannels, c.p2pnChannels, c.p2pnChannelsPerPeer);
  out += ringsAndTrees(c, plan.nRanks);
  if (explain) {
    out += "\nExplain:\n";
    for (int gi = 0; gi < search::kNumGraphs; ++gi) {
      if (!plan.graphAvailable[gi] || plan.graphs[gi].nChannels == 0) continue;
      const auto& g = plan.graphs[gi];
      out += fmt::format("- {}: {} channels x {:g} GB/s (intra) / {:g} GB/s (inter), path types {}/{}; system maxBw {:g}, "
                         "totalBw {:g}.\n",
                         search::graphName(gi), g.nChannels, g.bwIntra, g.bwInter,
                         topology::to_string(static_cast<topology::PathType>(g.typeIntra)),
                         topology::to_string(static_cast<topology::PathType>(g.typeInter)), sys.maxBw, sys.totalBw);
      auto b = search::findBottleneck(sys, g);
      if (b.link.link >= 0) {
        const auto& l = sys.link(b.link);
        out += fmt::format("  Most loaded link: {} --{}--> {}: {} channel crossings use {:g} of its {:g} GB/s ({:.0f}%).\n",
                           topology::nodeLabel(sys, b.link.node), topology::to_string(l.type),
                           topology::nodeLabel(sys, l.rem), b.channels, b.used, b.capacity,
                           b.capacity > 0 ? 100.0 * b.used / b.capacity : 0.0);
        if (b.capacity > 0 && b.used * 1.0001f >= b.capacity)
          out += "  It is saturated: another channel, or a faster speed for these channels, does not fit on it.\n";
      }
      if (g.nChannels * g.bwIntra >= sys.totalBw)
        out += "  The channels already reach the GPUs' total bandwidth (NVLink sum or PCI), the search's stop condition.\n";
      if (g.timedOut)
        out += "  The search hit a step budget before it could prove that nothing better exists.\n";
      if (g.fromFile) out += "  This graph came from a graph XML file, not from the search.\n";
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"topocoll: what NCCL 2.30.7 would build on a machine, from its topology XML.\n"
               "Reads NCCL's environment knobs (NCCL_TOPO_FILE, NCCL_P2P_LEVEL, NCCL_ALGO, ...): `topocoll params`."};
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  topocoll topo show --topo dgx-h100.xml\n"
      "  topocoll topo matrix --topo dgx-h100.xml\n"
      "  topocoll plan --topo dgx-h100.xml --nodes 4 --explain\n"
      "  NCCL_ALGO=ring topocoll tune --topo dgx-h100.xml --nodes 2 --coll allreduce --plot busbw.svg\n"
      "  mpirun -np 8 -x NCCL_TOPO_FILE=dgx-h100.xml -x TOPOCOLL_SIMULATE_GPUS=1 topocoll comm-check\n"
      "Exit status: 0 ok, 1 bad input or failure (the message names the file:line, attribute, knob or rank), 2 invalid\n"
      "usage (e.g. an NCCL_ALGO naming no algorithm), 3 internal error.");
  app.set_version_flag("--version", "topocoll 0.1.0 (NCCL 2.30.7 rules)");

  Common topoOpts;
  auto* topo = app.add_subcommand("topo", "Inspect a topology: dump, show, matrix, paths, draw");
  topo->require_subcommand(1);
  std::string outFile, fromNode, toNode;
  auto addTopo = [&](CLI::App* c) {
    c->add_option("--topo", topoOpts.topo, "Topology XML (default: NCCL_TOPO_FILE, then discovery)");
    c->add_flag("--json", topoOpts.json, "Machine-readable output");
  };
  auto* dump = topo->add_subcommand("dump", "Write the topology XML (discovered, or --topo) as NCCL would dump it");
  addTopo(dump);
  dump->add_option("--out,-o", outFile, "Output file (default: NCCL_TOPO_DUMP_FILE, else stdout)");
  auto* show = topo->add_subcommand("show", "Readable tree of the system graph with link bandwidths");
  addTopo(show);
  auto* matrix = topo->add_subcommand("matrix", "GPU/NIC path-type matrix, like nvidia-smi topo -m");
  addTopo(matrix);
  auto* pathsCmd = topo->add_subcommand("paths", "Hop list of one path (or all GPU paths)");
  addTopo(pathsCmd);
  pathsCmd->add_option("--from", fromNode, "Source: GPU<dev>, NET<dev>, CPU<i>");
  pathsCmd->add_option("--to", toNode, "Destination: GPU<dev>, NET<dev>, CPU<i>");
  auto* draw = topo->add_subcommand("draw", "Render the system with Graphviz (.svg or .dot)");
  addTopo(draw);
  draw->add_option("--out,-o", outFile, "Output file: FILE.svg or FILE.dot")->required();

  JobSpec job;
  std::string gpusList, graphOut, graphIn, drawOut, plotOut, collName = "", typeName = "float32";
  bool explain = false, pretty = false;
  auto addJob = [&](CLI::App* c) {
    c->add_option("--topo", topoOpts.topo, "Topology XML of one node (default: NCCL_TOPO_FILE, then discovery)");
    c->add_option("--nodes,-n", job.nNodes, "Number of nodes, each described by the same topology")
        ->check(CLI::Range(1, 1 << 20));
    c->add_option("--gpus-per-node,-g", job.gpusPerNode, "Use the first G GPUs (by dev) of each node")
        ->check(CLI::Range(1, 1 << 16));
    c->add_option("--ranks-on-gpus", gpusList, "Comma-separated GPU dev of each local rank, e.g. 0,1,2,3");
    c->add_flag("--json", topoOpts.json, "One JSON document (field names of shared/conformance/SCHEMA.md)");
    c->add_flag("--pretty", pretty, "Indent the JSON");
  };
  auto* plan = app.add_subcommand("plan", "Channels, rings and trees NCCL would build for a job");
  addJob(plan);
  plan->add_option("--graph-out", graphOut, "Write the searched graphs as graph XML (NCCL_GRAPH_DUMP_FILE format)");
  plan->add_option("--graph-in", graphIn, "Use graphs from a graph XML instead of searching (NCCL_GRAPH_FILE)");
  plan->add_option("--draw", drawOut, "Draw the ring channels over the topology (FILE.svg or FILE.dot)");
  plan->add_flag("--explain", explain, "Say which link limits the channels and why");
  auto* tune = app.add_subcommand("tune", "Tuning tables and algorithm/protocol choice per size");
  addJob(tune);
  tune->add_option("--coll", collName, "Only this collective (allreduce, allgather, reducescatter, broadcast, reduce)");
  tune->add_option("--type", typeName, "Data type (float32, float16, bfloat16, int8, float64, ...)");
  tune->add_option("--plot", plotOut, "Draw predicted busbw vs size as SVG");
  auto* params = app.add_subcommand("params", "List every knob topocoll reads: default, current value, range, meaning");
  bool paramsJson = false;
  params->add_flag("--json", paramsJson, "Machine-readable output");
  bool ccJson = false;
  auto* commCheckCmd = app.add_subcommand(
      "comm-check",
      "Initialise a communicator from the launcher's environment (mpirun, srun, torchrun, or RANK/WORLD_SIZE with "
      "NCCL_COMM_ID) and print, from rank 0, the peers, rings, trees and init timings");
  commCheckCmd->add_flag("--json", ccJson, "Machine-readable output");

  log::setDefaultStream(stderr);  // stdout carries the command's output (JSON, XML)
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    Env env = Env::fromProcess();
    Config cfg = Config::fromEnv(env);
    if (commCheckCmd->parsed()) {
      std::cout << commCheck(ccJson) << std::flush;
      return 0;
    }
    if (params->parsed()) {
      std::cout << paramsText(env, cfg, paramsJson);
      return 0;
    }
    std::string name;
    if (topo->parsed()) {
      auto doc = loadTopology(topoOpts.topo, cfg, &name);
      if (dump->parsed()) {
        std::string out = outFile;
        if (out.empty()) out = cfg.topoDumpFile;
        writeOut(out, topoOpts.json ? xmlJson(*doc.root).dump(1) + "\n" : topology::toString(*doc.root));
        return 0;
      }
      auto sys = paths::hostSystem(doc, cfg);
      if (show->parsed()) {
        std::cout << (topoOpts.json ? systemJson(sys) : topology::renderTree(sys));
      } else if (matrix->parsed()) {
        std::cout << (topoOpts.json ? cli::pathMatrixJson(sys) + "\n" : cli::pathMatrix(sys));
      } else if (pathsCmd->parsed()) {
        if (fromNode.empty() != toNode.empty()) fail(StatusCode::kInvalidUsage, "--from and --to go together");
        if (!fromNode.empty()) {
          std::cout << cli::pathReport(sys, fromNode, toNode, topoOpts.json);
        } else {
          for (int g = 0; g < sys.count(topology::NodeType::GPU); ++g) {
            std::string a = "GPU" + std::to_string(sys.of(topology::NodeType::GPU)[g].dev);
            for (int p = 0; p < sys.count(topology::NodeType::GPU); ++p)
              if (p != g) std::cout << cli::pathReport(sys, a, "GPU" + std::to_string(sys.of(topology::NodeType::GPU)[p].dev), topoOpts.json);
            for (int n = 0; n < sys.count(topology::NodeType::NET); ++n)
              std::cout << cli::pathReport(sys, a, "NET" + std::to_string(sys.of(topology::NodeType::NET)[n].dev), topoOpts.json);
          }
        }
      } else if (draw->parsed()) {
        std::string dot = topology::renderDot(sys, name);
        writeOut(outFile, endsWith(outFile, ".svg") ? dotToSvg(dot) : dot);
        if (topoOpts.json) std::cout << nlohmann::ordered_json{{"out", outFile}, {"format", endsWith(outFile, ".svg") ? "svg" : "dot"}}.dump() << "\n";
      }
      return 0;
    }
    if (!gpusList.empty()) {
      size_t pos = 0;
      while (pos <= gpusList.size()) {
        size_t comma = gpusList.find(',', pos);
        std::string tok = gpusList.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        char* end = nullptr;
        long v = std::strtol(tok.c_str(), &end, 10);
        if (tok.empty() || *end || v < 0) fail(StatusCode::kInvalidArgument, "--ranks-on-gpus: '{}' is not a GPU dev", tok);
        job.ranksOnGpus.push_back(static_cast<int>(v));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    }
    if (!graphIn.empty()) cfg.graphFile = graphIn;
    auto doc = loadTopology(topoOpts.topo, cfg, &name);
    Plan p = makePlan(doc, job, cfg);
    int typeSize = tuning::dataTypeSize(typeName);
    if (typeSize < 0) fail(StatusCode::kInvalidArgument, "--type {}: unknown data type", typeName);
    int onlyColl = -1;
    if (!collName.empty()) {
      onlyColl = tuning::collFromString(collName);
      if (onlyColl < 0) fail(StatusCode::kInvalidArgument, "--coll {}: unknown collective", collName);
    }
    std::string shownName = name;
    if (auto pos = name.find("topologies/"); pos != std::string::npos) shownName = name.substr(pos);
    std::string graphXml;
    {
      const search::Graph* order[] = {&p.graphs[search::kGraphRing], &p.graphs[search::kGraphTree],
                                      &p.graphs[search::kGraphCollnetDirect], &p.graphs[search::kGraphCollnetChain],
                                      &p.graphs[search::kGraphNvls]};
      graphXml = search::graphsToXml(p.system, std::vector<const search::Graph*>(std::begin(order), std::end(order)));
    }
    if (!graphOut.empty()) writeOut(graphOut, graphXml);
    if (!cfg.graphDumpFile.empty()) writeOut(cfg.graphDumpFile, graphXml);
    if (plan->parsed()) {
      if (!drawOut.empty()) {
        std::string dot = topology::renderDot(p.system, name + " ring channels", channelOverlay(p));
        writeOut(drawOut, endsWith(drawOut, ".svg") ? dotToSvg(dot) : dot);
      }
      if (topoOpts.json) std::cout << planToJson(p, shownName, typeSize, pretty) << "\n";
      else std::cout << planText(p, explain);
      return 0;
    }
    // tune
    if (!plotOut.empty()) writeOut(plotOut, cli::busbwPlot(p, typeSize, onlyColl < 0 ? tuning::kAllReduce : onlyColl, name));
    if (topoOpts.json) {
      std::cout << planToJson(p, shownName, typeSize, pretty) << "\n";
      return 0;
    }
    std::cout << cli::tuningTables(p) << "\n" << cli::selectionText(p, typeSize, onlyColl);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "topocoll: error: %s\n", e.what());
    return e.code() == StatusCode::kInvalidUsage ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "topocoll: internal error: %s\n", e.what());
    return 3;
  }
}
