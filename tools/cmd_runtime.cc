// `topocoll params` (the knob registry) and `topocoll comm-check` (a communicator under a launcher).
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "topocoll/runtime/communicator.h"

namespace topocoll::cli {

namespace {

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

std::string commCheck(const Env& env, bool json) {
  auto comm = runtime::Communicator::initFromEnv(env);
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

}  // namespace

Command addParamsCommand(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* params = app.add_subcommand("params", "List every knob topocoll reads: default, current value, range, meaning");
  params->add_flag("--json", *json, "Machine-readable output");
  return {params, [json](const Env& env, Config& cfg) {
            std::cout << paramsText(env, cfg, *json);
            return 0;
          }};
}

Command addCommCheckCommand(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cc = app.add_subcommand(
      "comm-check",
      "Initialise a communicator from the launcher's environment (mpirun, srun, torchrun, or RANK/WORLD_SIZE with "
      "NCCL_COMM_ID) and print, from rank 0, the peers, rings, trees and init timings");
  cc->add_flag("--json", *json, "Machine-readable output");
  return {cc, [json](const Env& env, Config&) {
            std::cout << commCheck(env, *json) << std::flush;
            return 0;
          }};
}

}  // namespace topocoll::cli
