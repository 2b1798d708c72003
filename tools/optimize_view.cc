#include "optimize_view.h"

#include <fmt/format.h>

#include "plot.h"
#include "topocoll/search/connect.h"

namespace topocoll::cli {

std::string graphsXml(const Plan& plan, bool ranks) {
  const search::Graph* order[] = {&plan.graphs[search::kGraphRing], &plan.graphs[search::kGraphTree],
                                  &plan.graphs[search::kGraphCollnetDirect], &plan.graphs[search::kGraphCollnetChain],
                                  &plan.graphs[search::kGraphNvls]};
  return search::graphsToXml(plan.system, std::vector<const search::Graph*>(std::begin(order), std::end(order)), ranks);
}

namespace {

// Predicted bus bandwidth of one collective at one size (nccl-tests' busbw), GB/s.
double busbw(const Plan& p, int coll, uint64_t bytes) {
  auto s = p.select(coll, bytes);
  if (s.algo < 0 || s.timeUs <= 0) return 0;
  return bytes / (s.timeUs * 1e3) * busFactor(coll, p.nRanks);
}

// "20" or "48/24" (intra-node / network speed) in GB/s.
std::string speeds(const search::Graph& g) {
  return g.bwIntra == g.bwInter ? fmt::format("{:g}", g.bwIntra) : fmt::format("{:g}/{:g}", g.bwIntra, g.bwInter);
}

}  // namespace

std::string optimizeText(const Plan& nccl, const Plan& opt, const search::OptimizeResult& r) {
  std::string out = fmt::format("\nOptimised graphs ({:.0f} ms{}):\n", r.ms,
                                r.stoppedByClock ? ", stopped by the wall clock: results may vary" : "");
  out += fmt::format("  {:<6} {:>24} {:>24} {:>10}  {}\n", "graph", "NCCL (ch x GB/s)", "optimised", "bound",
                     "status");
  for (int gi : {search::kGraphRing, search::kGraphTree, search::kGraphNvls}) {
    const auto& o = r.graphs[gi];
    if (!o.available) continue;
    const auto& a = nccl.graphs[gi];
    const auto& b = o.graph;
    std::string status = o.improved ? "better" : "NCCL's is kept";
    status += o.proven ? ", proven optimal" : ", search stopped by its budget";
    out += fmt::format("  {:<6} {:>24} {:>24} {:>10}  {}\n", search::graphName(gi),
                       fmt::format("{} x {} = {:.1f}", a.nChannels, speeds(a), o.ncclTotal),
                       fmt::format("{} x {} = {:.1f}", b.nChannels, speeds(b), o.total),
                       fmt::format("{:.1f}", o.bound), status);
  }
  for (int gi : {search::kGraphRing, search::kGraphTree, search::kGraphNvls}) {
    const auto& o = r.graphs[gi];
    if (!o.available) continue;
    out += fmt::format("- {}: bound from {}\n", search::graphName(gi), o.boundCut);
    if (!o.improved) continue;
    out += fmt::format("  {}.\n", o.how);
    for (const auto& line : {search::describe(opt.system, o.graph)}) {
      size_t pos = 0;
      while (pos < line.size()) {
        size_t nl = line.find('\n', pos);
        out += "    " + line.substr(pos, nl - pos) + "\n";
        pos = nl == std::string::npos ? line.size() : nl + 1;
      }
    }
  }
  out += fmt::format("\nPredicted bus bandwidth (GB/s), NCCL's graphs -> optimised graphs:\n{:>12} {:>24} {:>24}\n",
                     "size", "AllReduce", "AllGather");
  for (uint64_t bytes : {uint64_t(1) << 20, uint64_t(1) << 24, uint64_t(1) << 28, uint64_t(1) << 32}) {
    out += fmt::format("{:>12} {:>24} {:>24}\n", bytes,
                       fmt::format("{:.1f} -> {:.1f}", busbw(nccl, tuning::kAllReduce, bytes), busbw(opt, tuning::kAllReduce, bytes)),
                       fmt::format("{:.1f} -> {:.1f}", busbw(nccl, tuning::kAllGather, bytes), busbw(opt, tuning::kAllGather, bytes)));
  }
  return out;
}

nlohmann::ordered_json optimizeJson(const search::OptimizeResult& r) {
  nlohmann::ordered_json j;
  j["ms"] = r.ms;
  j["stoppedByClock"] = r.stoppedByClock;
  for (int gi : {search::kGraphRing, search::kGraphTree, search::kGraphNvls}) {
    const auto& o = r.graphs[gi];
    if (!o.available) continue;
    j[search::graphName(gi)] = {{"ncclTotal", o.ncclTotal}, {"total", o.total},      {"bound", o.bound},
                                {"boundCut", o.boundCut},   {"improved", o.improved}, {"proven", o.proven},
                                {"how", o.how},             {"ms", o.ms},             {"nodes", o.nodes}};
  }
  return j;
}

}  // namespace topocoll::cli
