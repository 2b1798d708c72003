// Search speed against NCCL's own: for every conformance case (tests/conformance, both lists), the best of R runs
// of rank 0's searches (ring, tree, CollNet, NVLS: what NCCL's searchTimeMs.rank0 measures), beside the time the
// reference data records for NCCL 2.30.7's search on the same kind of machine, and their ratio.
//
//   [TOPOCOLL_SEARCH_MEMO=0] ./build/bench/search_speed [--runs R] [--min-ms M] [--filter SUBSTRING] [--loop N]
//
// Each case runs at least R times and at least M milliseconds; the table is markdown (docs/performance.md).
// --loop N (for profilers: perf record, perf stat, callgrind) then runs rank 0's searches N more times on copies of
// the searched system, nothing else, and prints their median and best time per case.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "topocoll/env.h"
#include "topocoll/plan.h"
#include "topocoll/search/node_search.h"
#include "topocoll/topology/xml.h"

using namespace topocoll;

namespace {

struct Case {
  std::string name, topo;
  int nodes = 1, gpusPerNode = 0;
  std::map<std::string, std::string> env;
};

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<Case> readCases(const std::string& file) {
  std::ifstream in(file);
  if (!in) {
    fmt::print(stderr, "search_speed: cannot read {}\n", file);
    std::exit(1);
  }
  std::vector<Case> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, '|');) f.push_back(trim(x));
    if (f.size() != 5) continue;
    Case c{f[0], f[1], std::atoi(f[2].c_str()), std::atoi(f[3].c_str()), {}};
    if (f[4] != "-") {
      std::stringstream es(f[4]);
      for (std::string kv; es >> kv;) {
        auto eq = kv.find('=');
        if (eq != std::string::npos) c.env[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  double minMs = 200;
  std::string filter;
  int loop = 0;
  CLI::App app{
      "Search speed against NCCL 2.30.7's own: for every conformance case (tests/conformance/cases.txt and "
      "cases-more.txt, with their knobs), the best of the runs of rank 0's ring, tree, CollNet and NVLS searches, "
      "beside NCCL's recorded searchTimeMs.rank0 and their ratio, as a markdown table (docs/performance.md). "
      "TOPOCOLL_SEARCH_MEMO=0 in the environment times the full walk.",
      "search_speed"};
  app.add_option("--runs", runs, "runs per case, at least (the best one counts)")->check(CLI::Range(1, 1000000));
  app.add_option("--min-ms", minMs, "milliseconds per case, at least")->check(CLI::Range(0.0, 1e7));
  app.add_option("--filter", filter, "only the cases whose name contains this");
  app.add_option("--loop", loop,
                 "then run rank 0's searches N more times per case on copies of the searched system, nothing else, "
                 "and print their median and best time (for perf record, perf stat, callgrind)")
      ->check(CLI::Range(0, 100000000));
  CLI11_PARSE(app, argc, argv);
  const std::string root = TOPOCOLL_SOURCE_DIR;
  fmt::print(
      "| case | topocoll search, best of runs (ms) | NCCL 2.30.7 searchTimeMs.rank0 (ms) | ratio NCCL/topocoll "
      "| steps (NCCL's count) | steps walked |\n");
  fmt::print("| --- | ---: | ---: | ---: | ---: | ---: |\n");
  double minRatio = 1e30;
  std::vector<double> ratios;
  for (const char* list : {"cases.txt", "cases-more.txt"}) {
    for (const Case& c : readCases(root + "/tests/conformance/" + list)) {
      if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
      std::ifstream ef(root + "/tests/conformance/expected/" + c.name + ".json");
      const double ncclMs = nlohmann::json::parse(ef)["searchTimeMs"]["rank0"].get<double>();
      std::map<std::string, std::string> vars;
      for (auto& [k, v] : c.env) vars[k] = v;
      if (const char* memo = std::getenv("TOPOCOLL_SEARCH_MEMO")) vars["TOPOCOLL_SEARCH_MEMO"] = memo;  // to compare
      const Config cfg = Config::fromEnv(Env(vars));
      const auto doc = topology::loadXmlFile(root + "/examples/topologies/" + c.topo);
      JobSpec job;
      job.nNodes = c.nodes;
      job.gpusPerNode = c.gpusPerNode;
      double best = 1e30, spent = 0;
      long steps = 0, walked = 0;
      Plan p;
      for (int r = 0; r < runs || spent < minMs; ++r) {
        p = makePlan(doc, job, cfg);
        best = std::min(best, p.searchMs);
        spent += p.wallMs;
        steps = walked = 0;
        for (const search::Graph& g : p.graphs) steps += g.searchSteps, walked += g.searchWalked;
      }
      const double ratio = ncclMs / best;
      minRatio = std::min(minRatio, ratio);
      ratios.push_back(ratio);
      fmt::print("| {} | {:.3f} | {:.3f} | {:.1f}x | {} | {} |\n", c.name, best, ncclMs, ratio, steps, walked);
      if (loop > 0) {
        // The system after the search (NIC bandwidth the search kept, a rare quirk, stays kept: profiling only).
        std::vector<double> ms;
        for (int r = 0; r < loop; ++r) {
          topology::System sys = p.system;
          ms.push_back(search::searchNode(sys, cfg, p.nRanks).searchMs);
        }
        std::sort(ms.begin(), ms.end());
        fmt::print("  loop of {}: median {:.4f} ms, best {:.4f} ms\n", loop, ms[ms.size() / 2], ms[0]);
      }
      std::fflush(stdout);
    }
  }
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    fmt::print("\n{} cases: minimum ratio {:.1f}x, median {:.1f}x\n", ratios.size(), minRatio,
               ratios[ratios.size() / 2]);
  }
  return 0;
}
