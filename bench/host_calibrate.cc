// Calibration of the host cost model (include/topocoll/tuning/host_model.h): runs topocoll-perf with each
// (link, collective, algorithm, protocol, channels) forced over a sweep of sizes, takes the median time per size over
// the rounds (rounds interleave every combination, so a change of load hits all alike), fits time = steps x stepUs +
// bytes / bandwidth per combination (tuning::fitHostCost) and writes the JSON TOPOCOLL_HOST_TUNING loads, a markdown
// table (fit and its error), the C++ rows of src/tuning/host_constants.inc and the medians (CSV).
//
//   host_calibrate --perf build/topocoll-perf --np 2 --rounds 3 --json host.json --md host.md --inc host.inc
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "topocoll/tuning/host_model.h"

using namespace topocoll::tuning;

namespace {

struct Combo {
  HostLink link;
  int coll, algo, proto, nChannels;
};

const char* perfTest(int coll) {
  switch (coll) {
    case kAllReduce: return "all_reduce_perf";
    case kBroadcast: return "broadcast_perf";
    case kReduce: return "reduce_perf";
    case kAllGather: return "all_gather_perf";
    default: return "reduce_scatter_perf";
  }
}

std::string envFor(const Combo& c) {
  std::string e;
  if (c.link == HostLink::kShm) e += "NCCL_P2P_DISABLE=1 ";
  if (c.algo == kHostDirect) e += "NCCL_ALGO=^Tree,Ring TOPOCOLL_DIRECT_MAX=1099511627776 ";
  else e += fmt::format("NCCL_ALGO={} ", algoName(c.algo));
  e += fmt::format("NCCL_PROTO={} NCCL_MIN_NCHANNELS={} NCCL_MAX_NCHANNELS={} ", protoName(c.proto), c.nChannels,
                   c.nChannels);
  return e;
}

// Out-of-place time (us) per size of one topocoll-perf run; empty when it failed.
std::map<uint64_t, double> runPerf(const std::string& perf, const Combo& c, int np, const std::string& sizes,
                                   double targetS) {
  std::string cmd = fmt::format("env {} {} {} -np {} {} -l {} -c 0 --target-time {} 2>&1", envFor(c), perf, perfTest(c.coll), np,
                                c.link == HostLink::kNet ? fmt::format("--hosts {}", np) : "", sizes, targetS);
  std::map<uint64_t, double> out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[4096];
  std::string all;
  while (std::fgets(line, sizeof line, p)) {
    all += line;
    if (line[0] == '#') continue;
    std::istringstream in(line);
    uint64_t size = 0, count = 0;
    std::string type, redop, root;
    double time = 0;
    if (in >> size >> count >> type >> redop >> root >> time) out[size] = time;
  }
  if (pclose(p) != 0) {
    std::fprintf(stderr, "failed: %s\n%s", cmd.c_str(), all.c_str());
    out.clear();
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string perf = "topocoll-perf", json, md, inc, rawPath, links = "P2P,SHM,NET";
  std::string sizes = "8,64,512,4096,32768,262144,1048576,4194304,16777216";
  std::vector<int> nps{2};
  int rounds = 3;
  double targetS = 0.05;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--perf") perf = next();
    else if (a == "--np") {
      nps.clear();
      std::istringstream in(next());
      for (int n; in >> n;) nps.push_back(n);
    } else if (a == "--rounds") rounds = std::atoi(next().c_str());
    else if (a == "--sizes") sizes = next();
    else if (a == "--links") links = next();
    else if (a == "-T") targetS = std::atof(next().c_str());
    else if (a == "--json") json = next();
    else if (a == "--md") md = next();
    else if (a == "--inc") inc = next();
    else if (a == "--raw") rawPath = next();
    else {
      std::fprintf(stderr,
                   "usage: host_calibrate [--perf topocoll-perf] [--np \"2 4\"] [--rounds 3] [--sizes 8,64,...] "
                   "[--links P2P,SHM,NET] [-T seconds per size] [--json out] [--md out] [--inc out] [--raw csv]\n");
      return 2;
    }
  }
  std::vector<Combo> combos;
  for (int l = 0; l < kNumHostLinks; ++l) {
    if (links.find(hostLinkName(static_cast<HostLink>(l))) == std::string::npos) continue;
    for (int coll : {kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter})
      for (int algo : {static_cast<int>(kRing), static_cast<int>(kTree), kHostDirect}) {
        if (coll != kAllReduce && algo != kRing) continue;
        if (algo == kHostDirect && l == static_cast<int>(HostLink::kNet)) continue;  // one host only
        for (int proto : {kLL, kSimple})
          for (int ch = 1; ch <= (algo == kHostDirect ? 1 : kHostMaxChannels); ++ch)
            combos.push_back({static_cast<HostLink>(l), coll, algo, proto, ch});
      }
  }
  // samples[combo][np][size] = times over the rounds
  std::vector<std::map<int, std::map<uint64_t, std::vector<double>>>> samples(combos.size());
  for (int r = 0; r < rounds; ++r)
    for (int np : nps)
      for (size_t i = 0; i < combos.size(); ++i) {
        std::fprintf(stderr, "round %d np %d combo %zu/%zu\r", r + 1, np, i + 1, combos.size());
        for (auto [size, t] : runPerf(perf, combos[i], np, sizes, targetS)) samples[i][np][size].push_back(t);
      }
  std::fprintf(stderr, "\n");
  HostModel model;
  std::string table =
      "| link | coll | algo | proto | ch | baseUs | stepUs | GB/s | points | mean abs err |\n"
      "|---|---|---|---|---:|---:|---:|---:|---:|---:|\n";
  std::string rows, raw = "link,coll,algo,proto,nChannels,nRanks,bytes,medianUs\n";
  const uint64_t chunk = (4u << 20) / 32;  // NCCL_BUFFSIZE / 32, as the communicator
  for (size_t i = 0; i < combos.size(); ++i) {
    const Combo& c = combos[i];
    std::vector<HostSample> pts;
    for (auto& [np, bySize] : samples[i])
      for (auto& [size, ts] : bySize) {
        HostQuery q{c.coll, c.link, np, size, chunk};
        pts.push_back({hostWork(q, c.algo, c.nChannels), median(ts)});
      }
    HostCost k = fitHostCost(pts);
    if (pts.empty()) continue;
    double err = 0;
    for (auto& s : pts)
      err += std::abs((k.baseUs + s.work.steps * k.stepUs + s.work.bytes / (1e3 * k.gbps)) / s.timeUs - 1);
    err /= static_cast<double>(pts.size());
    HostEntry e{c.link, c.coll, c.algo, c.proto, c.nChannels, k};
    model.set(e);
    if (c.algo == kHostDirect) model.set({c.link, c.coll, c.algo, c.proto, 2, k});  // Direct runs on channel 0
    table += fmt::format("| {} | {} | {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {} | {:.0f}% |\n",
                         hostLinkName(c.link), collName(c.coll), hostAlgoName(c.algo), protoName(c.proto), c.nChannels,
                         k.baseUs, k.stepUs, k.gbps, pts.size(), 100 * err);
    for (auto& [np, bySize] : samples[i])
      for (auto& [size, ts] : bySize)
        raw += fmt::format("{},{},{},{},{},{},{},{:.3f}\n", hostLinkName(c.link), collName(c.coll),
                           hostAlgoName(c.algo), protoName(c.proto), c.nChannels, np, size, median(ts));
  }
  for (const HostEntry& e : model.entries())
    rows += fmt::format("    {{HostLink::k{}, {}, {}, {}, {}, {{{:#.4g}f, {:#.4g}f, {:#.4g}f}}}},\n",
                        e.link == HostLink::kP2p ? "P2p" : e.link == HostLink::kShm ? "Shm" : "Net",
                        e.coll == kAllReduce ? "kAllReduce" : e.coll == kBroadcast ? "kBroadcast"
                                            : e.coll == kReduce ? "kReduce" : e.coll == kAllGather ? "kAllGather"
                                                                                                  : "kReduceScatter",
                        e.algo == kHostDirect ? "kHostDirect" : e.algo == kTree ? "kTree" : "kRing",
                        e.proto == kLL ? "kLL" : "kSimple", e.nChannels, e.cost.baseUs, e.cost.stepUs, e.cost.gbps);
  std::string source = fmt::format("bench/host_calibrate --np \"{}\" --rounds {} --sizes {} -T {}",
                                   fmt::join(nps, " "), rounds, sizes, targetS);
  auto write = [](const std::string& path, const std::string& text) {
    if (path.empty()) return;
    std::ofstream(path) << text;
  };
  write(json, model.toJson(source));
  write(md, table);
  write(inc, "// " + source + "\n" + rows);
  write(rawPath, raw);
  std::fputs(table.c_str(), stdout);
  return 0;
}
