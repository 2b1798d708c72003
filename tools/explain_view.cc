#include "explain_view.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "plot.h"
#include "topocoll/search/capacity.h"
#include "topocoll/search/connect.h"
#include "topocoll/search/explain.h"
#include "topocoll/search/optimize.h"
#include "topocoll/topology/render.h"

namespace topocoll::cli {

namespace {

using search::SearchTrace;
using topology::PathType;

const char* typeName(int t) { return topology::to_string(static_cast<PathType>(t)); }

std::string speedText(float intra, float inter) {
  return intra == inter ? fmt::format("{:g} GB/s", intra) : fmt::format("{:g}/{:g} GB/s", intra, inter);
}

// The refusals of a group of attempts, most frequent first: "link full 12 (PCI ... -> ... 8), PXN 4".
std::string refusalText(const topology::System& sys, const std::vector<const SearchTrace::Attempt*>& group) {
  int64_t counts[SearchTrace::kRefusals] = {};
  int64_t types[2][topology::kPathTypes] = {};
  std::map<std::pair<int, int>, std::pair<topology::LinkRef, int64_t>> links;
  for (const auto* a : group) {
    for (int r = 0; r < SearchTrace::kRefusals; ++r) counts[r] += a->refused[r];
    for (int k = 0; k < 2; ++k)
      for (int t = 0; t < topology::kPathTypes; ++t) types[k][t] += a->typeRefused[k][t];
    for (const auto& [ref, n] : a->fullLinks) {
      auto key = std::make_pair(static_cast<int>(ref.node.type) * 100000 + ref.node.index, ref.link);
      links[key].first = ref;
      links[key].second += n;
    }
  }
  std::vector<std::pair<int64_t, std::string>> parts;
  if (counts[SearchTrace::kLinkFull]) {
    const std::pair<topology::LinkRef, int64_t>* top = nullptr;
    for (const auto& [k, v] : links)
      if (!top || v.second > top->second) top = &v;
    std::string s = fmt::format("link full {}", counts[SearchTrace::kLinkFull]);
    if (top) {
      const auto& l = sys.link(top->first);
      s += fmt::format(" (most often {} -> {} {:g} GB/s)", topology::nodeLabel(sys, top->first.node),
                       topology::nodeLabel(sys, l.rem), l.bw);
    }
    parts.push_back({counts[SearchTrace::kLinkFull], s});
  }
  for (int k = 0; k < 2; ++k)
    for (int t = 0; t < topology::kPathTypes; ++t)
      if (types[k][t])
        parts.push_back({types[k][t], fmt::format("{} {} hop {} ({})", k ? "NIC" : "GPU", typeName(t), types[k][t],
                                                  search::pathTypeMeaning(t, k == 1))});
  static const char* kNames[] = {"", "", "NIC port full", "NIC on another rail (crossNic 0)", "NIC on another plane",
                                 "not the pair's NIC (crossNic 2)", "a tree leaves by the NIC it entered"};
  for (int r = SearchTrace::kNicSpeed; r < SearchTrace::kRefusals; ++r)
    if (counts[r]) parts.push_back({counts[r], fmt::format("{} {}", kNames[r], counts[r])});
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out;
  for (size_t i = 0; i < parts.size() && i < 4; ++i) out += (i ? ", " : "") + parts[i].second;
  return out.empty() ? "nothing refused" : out;
}

// NCCL's attempts grouped by speed, in its order.
std::string attemptsText(const topology::System& sys, const SearchTrace& trace, int gi) {
  std::string out;
  size_t i = 0;
  bool secondPass = false;
  while (i < trace.attempts.size()) {
    size_t j = i;
    std::vector<const SearchTrace::Attempt*> group;
    while (j < trace.attempts.size() && trace.attempts[j].bwIntra == trace.attempts[i].bwIntra &&
           trace.attempts[j].bwInter == trace.attempts[i].bwInter)
      group.push_back(&trace.attempts[j++]);
    const auto& first = *group.front();
    const auto& last = *group.back();
    int lo = 99, hi = -1;
    bool timedOut = false;
    std::string rules;
    for (const auto* a : group) {
      lo = std::min(lo, std::max(a->typeIntra, a->typeInter));
      hi = std::max(hi, std::max(a->typeIntra, a->typeInter));
      timedOut |= a->timedOut;
    }
    std::string types = fmt::format("{}/{}", typeName(first.typeIntra), typeName(first.typeInter));
    if (group.size() > 1) types += fmt::format(" .. {}/{}", typeName(last.typeIntra), typeName(last.typeInter));
    std::string result = last.channels ? fmt::format("best so far {} x {}", last.channels, speedText(last.bestIntra, last.bestInter))
                                       : "nothing yet";
    bool faster = i > 0 && (first.bwIntra > trace.attempts[i - 1].bwIntra || first.bwInter > trace.attempts[i - 1].bwInter);
    if (faster && !secondPass) {
      out += "    Second pass: faster speeds for the channels found:\n";
      secondPass = true;
    }
    out += fmt::format("    {:>12}: {} attempt{} (types {}{}){}: {}; refused: {}\n",
                       speedText(first.bwIntra, first.bwInter), group.size(), group.size() > 1 ? "s" : "", types,
                       gi == search::kGraphRing && last.crossNic == 2 ? ", crossNic 2" : "",
                       timedOut ? ", hit its step budget" : "", result, refusalText(sys, group));
    i = j;
  }
  if (trace.globalTimeout) out += "    Then the search's global step budget ran out.\n";
  return out;
}

std::string graphText(const Plan& plan, const Config& cfg, int gi, const SearchTrace& trace,
                      const search::OptimizedGraph& best) {
  const auto& sys = plan.system;
  const auto& g = plan.graphs[gi];
  const bool inter = sys.inter != 0;
  int ccMin = 1 << 30;
  for (const auto& d : sys.of(topology::NodeType::DEV)) ccMin = std::min(ccMin, d.cudaCompCap);
  std::vector<float> ladder = search::speedArray(ccMin, inter);
  search::LoadModel m(sys);
  search::GraphWhy why = search::explainGraph(m, g, ladder, best.bound, best.boundCut);
  std::string out = fmt::format("- {}: {} channel{} x {} = {:g} GB/s, path types {}/{}{}.\n", search::graphName(gi),
                                g.nChannels, g.nChannels == 1 ? "" : "s", speedText(g.bwIntra, g.bwInter),
                                search::graphTotal(g, inter), typeName(g.typeIntra), typeName(g.typeInter),
                                inter && gi != search::kGraphNvls ? fmt::format(", crossNic {}", g.crossNic) : "");
  if (g.fromFile) out += "  It came from a graph XML file (NCCL_GRAPH_FILE), not from the search.\n";
  if (!why.full.empty()) {
    out += "  Full links:";
    for (size_t i = 0; i < why.full.size() && i < 4; ++i)
      out += fmt::format("{} {} ({:g} of {:g} GB/s)", i ? ";" : "", why.full[i].link, why.full[i].used, why.full[i].capacity);
    if (why.full.size() > 4) out += fmt::format("; +{} more", why.full.size() - 4);
    out += ".\n";
  } else if (!why.mostLoaded.link.empty()) {
    out += fmt::format("  No link is full; the most loaded is {} ({:g} of {:g} GB/s).\n", why.mostLoaded.link,
                       why.mostLoaded.used, why.mostLoaded.capacity);
  }
  if (!g.fromFile) {
    std::string arr;
    for (float s : ladder) arr += fmt::format(" {:g}", s);
    out += fmt::format("  NCCL's speeds (SM{}, {}):{}.\n", ccMin >= 100 ? 100 : ccMin >= 90 ? 90 : 80,
                       inter ? "across nodes" : "one node", arr);
    float top = ladder[0];
    if (!trace.attempts.empty() && trace.attempts[0].bwInter < top)
      out += fmt::format("  The search starts at {:g}: faster speeds exceed the best path of any GPU (maxBw {:g}) or "
                         "the GPUs' total (totalBw {:g}).\n",
                         trace.attempts[0].bwInter, sys.maxBw, sys.totalBw);
    out += "  What it tried, in its order (path types relax, then cross-NIC, then the speed drops):\n";
    out += attemptsText(sys, trace, gi);
  }
  if (!why.limits.empty()) {
    const auto& here = why.limits[0];
    if (here.maxChannels <= g.nChannels)
      out += fmt::format("  One more channel at {:g} GB/s does not fit: the topology allows {} there ({}).\n", here.speed,
                         here.maxChannels, here.cut);
    else if (gi == search::kGraphTree)
      out += fmt::format("  At {:g} GB/s the topology's cuts would allow up to {} channels ({}), but NCCL searches the "
                         "tree with exactly the ring's channel count ({}).\n",
                         here.speed, here.maxChannels, here.cut, g.nChannels);
    else
      out += fmt::format("  At {:g} GB/s the topology's cuts would allow up to {} channels ({}): NCCL's search stopped "
                         "at {} (its order of trying, rules or step budgets; or channels share links in ways no single "
                         "cut shows).\n",
                         here.speed, here.maxChannels, here.cut, g.nChannels);
    for (size_t i = 1; i < why.limits.size(); ++i) {
      const auto& lim = why.limits[i];
      if (lim.maxChannels * lim.speed <= search::graphTotal(g, inter) * 1.0001) {
        out += fmt::format("  At {:g} GB/s and faster, the cuts allow at most {} channel{} ({}): no more bandwidth.\n",
                           lim.speed, lim.maxChannels, lim.maxChannels == 1 ? "" : "s", lim.cut);
        break;
      }
    }
  }
  out += fmt::format("  Upper bound {:g} GB/s: {}.\n", best.bound, best.boundCut);
  if (best.improved)
    out += fmt::format("  A better graph under NCCL's own rules: {} channel{} x {} = {:g} GB/s{} ({}): "
                       "`topocoll plan --optimize` writes it for NCCL_GRAPH_FILE.\n",
                       best.graph.nChannels, best.graph.nChannels == 1 ? "" : "s",
                       speedText(best.graph.bwIntra, best.graph.bwInter), best.total,
                       best.proven ? ", the best possible" : "", best.how);
  else if (best.proven)
    out += "  Nothing better exists under NCCL's rules (proven): more bandwidth needs more capacity on the cut above.\n";
  else
    out += "  The optimiser found nothing better within its budget.\n";
  return out;
}

std::string sizeText(uint64_t b) {
  if (b >= (1ULL << 30)) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ULL << 20)) return fmt::format("{} MiB", b >> 20);
  if (b >= (1ULL << 10)) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

// Why NCCL's cost model picks an algorithm and protocol at each size: the time of the choice and of the runner-up,
// each as latency + transfer.
std::string costText(const Plan& plan, int coll) {
  std::string out = fmt::format("\n{}: time = latency + bytes / bandwidth (NCCL's cost model, {} ranks)\n", tuning::collName(coll),
                                plan.nRanks);
  out += fmt::format("  {:>7}  {:<46} {:<46} {}\n", "size", "choice: time = latency + transfer (us), bw", "runner-up",
                     "why");
  for (int l = 10; l <= 32; l += 2) {
    uint64_t bytes = 1ULL << l;
    struct Cand {
      int algo, proto;
      tuning::AlgoCost c;
      double time() const { return c.latencyUs + c.transferUs; }
    };
    std::vector<Cand> cands;
    for (int a = 0; a < tuning::kNumAlgos; ++a) {
      if (!tuning::considered(plan.model, coll, a)) continue;
      for (int p = 0; p < tuning::kNumProtos; ++p) {
        auto c = tuning::algoCost(plan.model, coll, a, p, bytes);
        if (c.bandwidth > 0) cands.push_back({a, p, c});
      }
    }
    auto sel = plan.select(coll, bytes);
    if (cands.empty() || sel.algo < 0) continue;
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.time() < b.time(); });
    auto it = std::find_if(cands.begin(), cands.end(), [&](const Cand& c) { return c.algo == sel.algo && c.proto == sel.proto; });
    const Cand& win = it != cands.end() ? *it : cands[0];
    const Cand* second = nullptr;
    for (const auto& c : cands)
      if (&c != &win) {
        second = &c;
        break;
      }
    auto line = [](const Cand& c) {
      return fmt::format("{}/{} {:.1f} = {:.1f} + {:.1f}, {:.1f} GB/s", tuning::algoName(c.algo), tuning::protoName(c.proto),
                         c.time(), c.c.latencyUs, c.c.transferUs, c.c.bandwidth);
    };
    std::string reason = "the only one";
    if (second) {
      bool lat = win.c.latencyUs < second->c.latencyUs, bw = win.c.bandwidth > second->c.bandwidth;
      reason = lat && bw ? "lower latency and more bandwidth" : lat ? "lower latency" : bw ? "more bandwidth" : "lower total";
    }
    out += fmt::format("  {:>7}  {:<46} {:<46} {}\n", sizeText(bytes), line(win), second ? line(*second) : "-", reason);
  }
  return out;
}

}  // namespace

std::string explainText(const Plan& plan, const Config& cfg) {
  // NCCL's search again on a copy of the node's system, with a trace: the same decisions as the plan's.
  topology::System sys = plan.system;
  std::array<SearchTrace, search::kNumGraphs> traces;
  search::searchNode(sys, cfg, plan.nRanks, nullptr, &traces);
  search::OptimizeOptions opts;
  opts.maxNodes = 300000;
  auto best = search::optimize(plan.system, cfg, plan.graphs, plan.graphAvailable, opts);
  std::string out = fmt::format("\nExplain (system: maxBw {:g} GB/s, the best path of any GPU; totalBw {:g} GB/s, a GPU's "
                                "NVLink or PCI total):\n",
                                plan.system.maxBw, plan.system.totalBw);
  for (int gi : {search::kGraphRing, search::kGraphTree, search::kGraphNvls}) {
    if (!plan.graphAvailable[gi] || plan.graphs[gi].nChannels == 0) continue;
    out += graphText(plan, cfg, gi, traces[gi], best.graphs[gi]);
  }
  for (int coll : {tuning::kAllReduce, tuning::kAllGather}) out += costText(plan, coll);
  return out;
}

}  // namespace topocoll::cli
