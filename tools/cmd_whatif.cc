// `topocoll whatif`: the plan of a machine as it is beside the plan with edits (a failed NIC, a lost or degraded
// NVLink, a slower PCIe link, a knob, more nodes): channels, bandwidths, bottleneck links, predicted busbw.
#include <cmath>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "plot.h"
#include "topocoll/search/capacity.h"
#include "topocoll/status.h"
#include "topocoll/whatif.h"

namespace topocoll::cli {

namespace {

struct WhatIfArgs {
  std::string topo, plotOut, typeName = "float32";
  std::vector<int> nodes;
  int gpusPerNode = 0;
  std::vector<std::string> removeNic, removeLink, nvlinkCount, pcieGen, pcieWidth, set;
  bool json = false, pretty = false;
};

const int kGraphs[] = {search::kGraphRing, search::kGraphTree, search::kGraphNvls};
const int kSizesLog2[] = {10, 14, 17, 20, 23, 26, 29, 32};

std::string sizeText(uint64_t b) {
  if (b >= (1ULL << 30)) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ULL << 20)) return fmt::format("{} MiB", b >> 20);
  if (b >= (1ULL << 10)) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

struct GraphSummary {
  bool available = false;
  int nChannels = 0;
  float bwIntra = 0, bwInter = 0;
  std::string types, bottleneck;
  double total = 0, bottleneckUse = 0;
};

GraphSummary summarize(const Plan& p, int gi) {
  GraphSummary s;
  const auto& g = p.graphs[gi];
  s.available = p.graphAvailable[gi] && g.nChannels > 0;
  if (!s.available) return s;
  s.nChannels = g.nChannels;
  s.bwIntra = g.bwIntra;
  s.bwInter = g.bwInter;
  s.types = fmt::format("{}/{}", topology::to_string(static_cast<topology::PathType>(g.typeIntra)),
                        topology::to_string(static_cast<topology::PathType>(g.typeInter)));
  s.total = search::graphTotal(g, p.system.inter != 0);
  search::LoadModel m(p.system);
  auto load = search::graphLoad(m, g);
  if (load.worst >= 0) {
    s.bottleneck = m.label(load.worst);
    s.bottleneckUse = load.worstRatio;
  }
  return s;
}

double busbwAt(const Plan& p, int coll, uint64_t bytes, std::string* algo) {
  auto s = p.select(coll, bytes);
  if (s.algo < 0 || s.timeUs <= 0) {
    *algo = "none";
    return 0;
  }
  *algo = fmt::format("{}/{}", tuning::algoName(s.algo), tuning::protoName(s.proto));
  return bytes / (s.timeUs * 1e3) * busFactor(coll, p.nRanks);
}

std::string speedsText(const GraphSummary& s) {
  if (!s.available) return "-";
  std::string sp = s.bwIntra == s.bwInter ? fmt::format("{:g}", s.bwIntra) : fmt::format("{:g}/{:g}", s.bwIntra, s.bwInter);
  return fmt::format("{} x {} = {:.1f} GB/s {}", s.nChannels, sp, s.total, s.types);
}

std::string text(const WhatIf& w) {
  std::string edits;
  for (const auto& e : w.edits) edits += (edits.empty() ? "" : ", ") + e.text();
  std::string out = fmt::format("What if: {}\n\n{:<14} {:<44} {}\n", edits.empty() ? "(no edit)" : edits, "", "now", "what if");
  auto row = [&](const std::string& k, const std::string& a, const std::string& b) {
    out += fmt::format("{:<14} {:<44} {}{}\n", k, a, b, a == b ? "" : "   <-");
  };
  row("job", fmt::format("{} node(s) x {} GPU(s)", w.before.job.nNodes, w.before.localRanks),
      fmt::format("{} node(s) x {} GPU(s)", w.after.job.nNodes, w.after.localRanks));
  for (int gi : kGraphs) {
    auto a = summarize(w.before, gi), b = summarize(w.after, gi);
    if (!a.available && !b.available) continue;
    row(search::graphName(gi), speedsText(a), speedsText(b));
    row("  bottleneck", a.available ? fmt::format("{} {:.0f}%", a.bottleneck, 100 * a.bottleneckUse) : "-",
        b.available ? fmt::format("{} {:.0f}%", b.bottleneck, 100 * b.bottleneckUse) : "-");
  }
  row("coll channels", std::to_string(w.before.connect.nChannels), std::to_string(w.after.connect.nChannels));
  row("nvls channels", std::to_string(w.before.connect.nvlsChannels), std::to_string(w.after.connect.nvlsChannels));
  for (int coll : {tuning::kAllReduce, tuning::kAllGather}) {
    out += fmt::format("\n{} busbw (GB/s, NCCL's choice)\n", tuning::collName(coll));
    for (int l : kSizesLog2) {
      uint64_t bytes = 1ULL << l;
      std::string aa, ab;
      double a = busbwAt(w.before, coll, bytes, &aa), b = busbwAt(w.after, coll, bytes, &ab);
      double pct = a > 0 ? 100 * (b / a - 1) : 0;
      std::string change = a > 0 && std::abs(pct) >= 0.5 ? fmt::format("{:+.0f}%", pct) : "";
      out += fmt::format("  {:>8} {:>8.1f} {:<16} {:>8.1f} {:<16} {}\n", sizeText(bytes), a, aa, b, ab, change);
    }
  }
  return out;
}

nlohmann::ordered_json planJson(const Plan& p) {
  nlohmann::ordered_json j;
  j["nodes"] = p.job.nNodes;
  j["ranks"] = p.nRanks;
  for (int gi : kGraphs) {
    auto s = summarize(p, gi);
    if (!s.available) continue;
    j["graphs"][search::graphName(gi)] = {{"nChannels", s.nChannels}, {"bwIntra", s.bwIntra},   {"bwInter", s.bwInter},
                                          {"types", s.types},         {"total", s.total},       {"bottleneck", s.bottleneck},
                                          {"bottleneckUse", s.bottleneckUse}};
  }
  j["collChannels"] = p.connect.nChannels;
  j["nvlsChannels"] = p.connect.nvlsChannels;
  for (int coll : {tuning::kAllReduce, tuning::kAllGather}) {
    auto arr = nlohmann::ordered_json::array();
    for (int l : kSizesLog2) {
      std::string algo;
      double bw = busbwAt(p, coll, 1ULL << l, &algo);
      arr.push_back({{"bytes", 1ULL << l}, {"busbw", bw}, {"choice", algo}});
    }
    j["busbw"][tuning::collName(coll)] = arr;
  }
  return j;
}

std::string plot(const WhatIf& w, int typeSize, const std::string& name) {
  std::vector<ChartSeries> series;
  const char* colors[] = {"#1f77b4", "#d62728"};
  int i = 0;
  for (int coll : {tuning::kAllReduce, tuning::kAllGather}) {
    ChartSeries now{fmt::format("{} now", tuning::collName(coll)), colors[i], 2.5, true, false, {}};
    now.pts = chosenBusbw(w.before, typeSize, coll);
    ChartSeries after{fmt::format("{} what if", tuning::collName(coll)), colors[i], 2.5, false, true, {}};
    after.pts = chosenBusbw(w.after, typeSize, coll);
    series.push_back(now);
    series.push_back(after);
    ++i;
  }
  std::string edits;
  for (const auto& e : w.edits) edits += (edits.empty() ? "" : " ") + e.text();
  return lineChart(fmt::format("What if: predicted busbw, {} ranks", w.after.nRanks), name + ": " + edits, series);
}

}  // namespace

Command addWhatIfCommand(CLI::App& app) {
  auto a = std::make_shared<WhatIfArgs>();
  auto* c = app.add_subcommand("whatif", "The plan beside the plan with edits: a failed NIC, a lost NVLink, a slower "
                                         "PCIe link, a knob, more nodes");
  c->add_option("--topo", a->topo, "Topology XML of one node (default: NCCL_TOPO_FILE, then discovery)");
  c->add_option("--nodes,-n", a->nodes, "Number of nodes; given twice, the second is the what-if's (--nodes 2 --nodes 8)")
      ->check(CLI::Range(1, 1 << 20))
      ->expected(1, 2);
  c->add_option("--gpus-per-node,-g", a->gpusPerNode, "Use the first G GPUs (by dev) of each node")
      ->check(CLI::Range(1, 1 << 16));
  c->add_option("--remove-nic", a->removeNic, "Remove a NIC port: NET3 (dev) or mlx5_3 (name)");
  c->add_option("--remove-link", a->removeLink, "Remove NVLinks: GPU0-NVS0, GPU0-GPU1 or GPU0-CPU");
  c->add_option("--nvlink-count", a->nvlinkCount, "NVLinks of a GPU to the NVSwitch (GPU2=12) or to a peer (GPU2-GPU3=2)");
  c->add_option("--pcie-gen", a->pcieGen, "PCIe generation of a GPU's, NIC's or switch's link: GPU1=3, NET0=4, 0000:52:00.0=5");
  c->add_option("--pcie-width", a->pcieWidth, "PCIe lanes of a GPU's, NIC's or switch's link: GPU1=8");
  c->add_option("--set", a->set, "A knob for the what-if plan: NCCL_CROSS_NIC=1");
  c->add_flag("--json", a->json, "One JSON document: edits, now, whatIf");
  c->add_flag("--pretty", a->pretty, "Indent the JSON");
  c->add_option("--plot", a->plotOut, "Draw predicted AllReduce/AllGather busbw, now and what if, as SVG");
  c->add_option("--type", a->typeName, "Data type for the plot (float32, float16, ...)");
  return {c, [a](const Env& env, Config& cfg) {
            std::vector<Edit> edits;
            auto add = [&](const char* flag, const std::vector<std::string>& args) {
              for (const auto& v : args) edits.push_back(parseEdit(flag, v));
            };
            add("remove-nic", a->removeNic);
            add("remove-link", a->removeLink);
            add("nvlink-count", a->nvlinkCount);
            add("pcie-gen", a->pcieGen);
            add("pcie-width", a->pcieWidth);
            add("set", a->set);
            JobSpec job;
            job.nNodes = a->nodes.empty() ? 1 : a->nodes[0];
            job.gpusPerNode = a->gpusPerNode;
            if (a->nodes.size() > 1) edits.push_back(parseEdit("nodes", std::to_string(a->nodes[1])));
            std::string name;
            auto doc = loadTopology(a->topo, cfg, &name);
            WhatIf w = whatIf(doc, job, env, edits);
            int typeSize = tuning::dataTypeSize(a->typeName);
            if (typeSize < 0) fail(StatusCode::kInvalidArgument, "--type {}: unknown data type", a->typeName);
            if (!a->plotOut.empty()) writeOut(a->plotOut, plot(w, typeSize, name));
            if (a->json) {
              nlohmann::ordered_json j;
              std::string shown = name;
              if (auto pos = name.find("topologies/"); pos != std::string::npos) shown = name.substr(pos);
              j["topo"] = shown;
              j["edits"] = nlohmann::ordered_json::array();
              for (const auto& e : edits) j["edits"].push_back(e.text());
              j["now"] = planJson(w.before);
              j["whatIf"] = planJson(w.after);
              std::cout << j.dump(a->pretty ? 1 : -1) << "\n";
            } else {
              std::cout << text(w);
            }
            return 0;
          }};
}

}  // namespace topocoll::cli
