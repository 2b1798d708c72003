// `topocoll plan` and `topocoll tune`: what NCCL would build and choose for a job.
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli.h"
#include "explain_view.h"
#include "optimize_view.h"
#include "plot.h"
#include "topocoll/plan.h"
#include "topocoll/search/graph.h"
#include "topocoll/status.h"
#include "topocoll/topology/render.h"

namespace topocoll::cli {

namespace {

struct PlanArgs {
  std::string topo, gpusList, graphOut, graphIn, drawOut, plotOut, collName, typeName = "float32";
  std::string netPluginVersion, netDevices;  // set the knobs of the same meaning
  JobSpec job;
  bool json = false, pretty = false, explain = false, noTimings = false;
  bool optimize = false, ladderSpeeds = false;
  double timeBudget = 1.0;
  int64_t searchNodes = 0;
};

std::string channelOverlay(const Plan& plan) {
  static const char* palette[] = {"#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6",
                                  "#bfef45", "#fabed4", "#469990", "#dcbeff", "#9a6324", "#800000", "#aaffc3"};
  const auto& g = plan.graphs[search::kGraphRing];
  const auto& sys = plan.system;
  std::string out;
  const int n = plan.system.count(topology::NodeType::GPU);
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

std::string planText(const Plan& plan, bool explain, const Config& cfg) {
  std::string out;
  const auto& sys = plan.system;
  out += fmt::format("Job: {} node(s) x {} GPU(s) = {} ranks\n", plan.job.nNodes, plan.localRanks, plan.nRanks);
  if (plan.cliqueHosts > 1)
    out += fmt::format("Multi-node NVLink: cliques of {} hosts, {} NCCL node(s), the network only between cliques\n",
                       plan.cliqueHosts, plan.connect.nNodes);
  if (plan.hostDomains.size() > 1) {
    out += fmt::format("Each host is {} NCCL nodes (its GPUs of different nodes talk through the network):",
                       plan.hostDomains.size());
    for (size_t d = 0; d < plan.hostDomains.size(); ++d)
      out += fmt::format("{} local ranks {}", d ? ";" : "", fmt::join(plan.hostDomains[d], ","));
    out += fmt::format(" ({} NCCL nodes in all)\n", plan.connect.nNodes);
  }
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
  if (explain) out += explainText(plan, cfg);
  return out;
}

std::vector<int> parseDevList(const std::string& list) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    std::string tok = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long v = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end || v < 0) fail(StatusCode::kInvalidArgument, "--ranks-on-gpus: '{}' is not a GPU dev", tok);
    out.push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// Both commands: load, plan, write the graph XML where asked. Returns the plan and the topology's shown name.
Plan planFor(PlanArgs& a, Config& cfg, std::string* name, std::string* shownName, topology::XmlDoc* docOut = nullptr) {
  if (!a.gpusList.empty()) a.job.ranksOnGpus = parseDevList(a.gpusList);
  if (!a.graphIn.empty()) cfg.graphFile = a.graphIn;
  // Flags that stand for knobs go through the knob's own parser (same validation, same messages).
  if (!a.netPluginVersion.empty()) findKnob("TOPOCOLL_NET_PLUGIN_VERSION")->set(cfg, a.netPluginVersion);
  if (!a.netDevices.empty()) findKnob("TOPOCOLL_NET_DEVICES")->set(cfg, a.netDevices);
  auto doc = loadTopology(a.topo, cfg, name);
  Plan p = makePlan(doc, a.job, cfg);
  if (docOut) *docOut = std::move(doc);
  *shownName = topoName(*name);
  if (!cfg.graphDumpFile.empty()) writeOut(cfg.graphDumpFile, graphsXml(p, true));
  if (!a.graphOut.empty() && !a.optimize) writeOut(a.graphOut, graphsXml(p, true));
  return p;
}

int typeSizeOf(const std::string& typeName) {
  int typeSize = tuning::dataTypeSize(typeName);
  if (typeSize < 0) fail(StatusCode::kInvalidArgument, "--type {}: unknown data type", typeName);
  return typeSize;
}

}  // namespace

std::vector<Command> addPlanCommands(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto addJob = [&](CLI::App* c) {
    c->add_option("--topo", a->topo, "Topology XML of one node (default: NCCL_TOPO_FILE, then discovery)");
    c->add_option("--nodes,-n", a->job.nNodes, "Number of nodes, each described by the same topology")
        ->check(CLI::Range(1, 1 << 20));
    auto* g = c->add_option("--gpus-per-node,-g", a->job.gpusPerNode, "Use the first G GPUs (by dev) of each node")
                  ->check(CLI::Range(1, 1 << 16));
    c->add_option("--ranks-on-gpus", a->gpusList, "Comma-separated GPU dev of each local rank, e.g. 0,1,2,3")
        ->excludes(g);
    c->add_option("--clique-hosts", a->job.cliqueHosts,
                  "Hosts per multi-node NVLink clique when the topology describes several hosts (default: as many "
                  "as the job and the topology divide into; 1 = no multi-node NVLink, like NCCL_MNNVL_ENABLE=0)")
        ->check(CLI::Range(1, 256));
    c->add_option("--net-plugin-version", a->netPluginVersion,
                  "Net plugin NCCL loads: 0 internal (default; fused NICs of at most 4 ports), 6..12 external "
                  "(TOPOCOLL_NET_PLUGIN_VERSION)");
    c->add_option("--net-devices", a->netDevices,
                  "Network devices the job sees, e.g. 'eth0:25000' or 'mlx5_0@0000:1c:00.0,mlx5_1@0000:9c:00.0' "
                  "(TOPOCOLL_NET_DEVICES; default: the XML's <net>s, or one 10 Gb/s eth0)");
    c->add_flag("--json", a->json, "One JSON document (field names of tests/conformance/SCHEMA.md)");
    c->add_flag("--pretty", a->pretty, "Indent the JSON");
    c->add_flag("--no-timings", a->noTimings,
                "Leave the search and wall times out of --json: the same inputs give the same bytes (what a "
                "communicator writes to TOPOCOLL_PLAN_FILE)");
  };
  auto* plan = app.add_subcommand("plan", "Channels, rings and trees NCCL would build for a job");
  addJob(plan);
  plan->add_option("--graph-out", a->graphOut, "Write the searched graphs as graph XML (NCCL_GRAPH_DUMP_FILE format)");
  plan->add_option("--graph-in", a->graphIn, "Use graphs from a graph XML instead of searching (NCCL_GRAPH_FILE)");
  plan->add_option("--draw", a->drawOut, "Draw the ring channels over the topology (FILE.svg, .png, .pdf or .dot)");
  plan->add_flag("--explain", a->explain, "Say which link limits the channels and why");
  plan->add_flag("--optimize", a->optimize,
                 "Search beyond NCCL's greedy search for graphs with more bandwidth; print them beside NCCL's and the "
                 "topology's bound (--graph-out then writes them, for NCCL_GRAPH_FILE)");
  plan->add_option("--time-budget", a->timeBudget, "Seconds --optimize may search (default 1)")
      ->check(CLI::Range(0.001, 3600.0));
  plan->add_flag("--ladder-speeds", a->ladderSpeeds, "--optimize: only speeds of NCCL's speed array");
  plan->add_option("--search-nodes", a->searchNodes,
                   "--optimize: this many search nodes instead of the time budget (the same graphs on any machine)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  auto* tune = app.add_subcommand("tune", "Tuning tables and algorithm/protocol choice per size");
  addJob(tune);
  tune->add_option("--coll", a->collName, "Only this collective (allreduce, allgather, reducescatter, broadcast, reduce)");
  tune->add_option("--type", a->typeName, "Data type (float32, float16, bfloat16, int8, float64, ...)");
  tune->add_option("--plot", a->plotOut, "Draw predicted busbw vs size as SVG");

  std::vector<Command> cmds;
  cmds.push_back({plan, [a](const Env&, Config& cfg) {
                    std::string name, shown;
                    topology::XmlDoc doc;
                    Plan p = planFor(*a, cfg, &name, &shown, &doc);
                    if (!a->drawOut.empty()) {
                      writeGraph(a->drawOut, topology::renderDot(p.system, name + " ring channels", channelOverlay(p)));
                    }
                    if (a->optimize) {
                      search::OptimizeOptions opts;
                      opts.timeBudgetS = a->timeBudget;
                      opts.ladderSpeeds = a->ladderSpeeds;
                      opts.maxNodes = a->searchNodes;
                      auto r = search::optimize(p.system, cfg, p.graphs, p.graphAvailable, opts);
                      auto graphs = r.graphsToUse();
                      Plan q = makePlan(doc, a->job, cfg, &graphs);
                      if (!a->graphOut.empty()) writeOut(a->graphOut, graphsXml(q, false));
                      if (a->json) {
                        auto j = nlohmann::ordered_json::parse(
                            planToJson(q, shown, typeSizeOf(a->typeName), false, !a->noTimings));
                        j["optimize"] = optimizeJson(r);
                        std::cout << j.dump(a->pretty ? 1 : -1) << "\n";
                      } else {
                        std::cout << planText(p, a->explain, cfg) << optimizeText(p, q, r);
                      }
                      return 0;
                    }
                    if (a->json)
                      std::cout << planToJson(p, shown, typeSizeOf(a->typeName), a->pretty, !a->noTimings) << "\n";
                    else std::cout << planText(p, a->explain, cfg);
                    return 0;
                  }});
  cmds.push_back({tune, [a](const Env&, Config& cfg) {
                    int typeSize = typeSizeOf(a->typeName);
                    int onlyColl = -1;
                    if (!a->collName.empty()) {
                      onlyColl = tuning::collFromString(a->collName);
                      if (onlyColl < 0) fail(StatusCode::kInvalidArgument, "--coll {}: unknown collective", a->collName);
                    }
                    std::string name, shown;
                    Plan p = planFor(*a, cfg, &name, &shown);
                    if (!a->plotOut.empty())
                      writeOut(a->plotOut, busbwPlot(p, typeSize, onlyColl < 0 ? tuning::kAllReduce : onlyColl, name));
                    if (a->json) std::cout << planToJson(p, shown, typeSize, a->pretty, !a->noTimings) << "\n";
                    else std::cout << tuningTables(p) << "\n" << selectionText(p, typeSize, onlyColl);
                    // NCCL fails an operation for which no algorithm/protocol is enabled: so does tune.
                    for (const auto& s : selectionTable(p, typeSize, onlyColl))
                      if (s.error)
                        fail(StatusCode::kInvalidUsage,
                             "no algorithm/protocol is enabled for {} of {} bytes (NCCL_ALGO=\"{}\", NCCL_PROTO=\"{}\"): "
                             "NCCL would fail it",
                             tuning::collName(s.coll), s.nBytes, cfg.algo, cfg.proto);
                    return 0;
                  }});
  return cmds;
}

}  // namespace topocoll::cli
