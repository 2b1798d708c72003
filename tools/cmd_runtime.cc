// `topocoll params` (the knob registry) and `topocoll comm-check` (a communicator under a launcher).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "topocoll/runtime/communicator.h"
#include "topocoll/status.h"
#include "topocoll/tuning/host_policy.h"

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

// Every rank's text, at rank 0 (in rank order); other ranks get an empty vector.
std::vector<std::string> gatherText(runtime::Communicator& comm, const std::string& mine, int tag) {
  std::vector<uint64_t> sizes(comm.nRanks());
  sizes[comm.rank()] = mine.size();
  comm.bootstrap().allGather(sizes.data(), sizeof(uint64_t));
  std::vector<std::string> out;
  if (comm.rank() != 0) {
    comm.bootstrap().send(0, tag, mine.data(), mine.size());
    return out;
  }
  out.resize(comm.nRanks());
  out[0] = mine;
  for (int r = 1; r < comm.nRanks(); ++r) {
    out[r].resize(sizes[r]);
    comm.bootstrap().recv(r, tag, out[r].data(), sizes[r]);
  }
  return out;
}

// The send side of each connection, as NCCL logs it: "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC".
std::string connectionLines(runtime::Communicator& comm) {
  std::string out;
  auto devOf = [&](int r) {
    const auto& p = comm.peers()[r];
    if (p.dev >= 0) return p.dev;
    int local = 0;
    for (int i = 0; i < r; ++i) local += comm.peers()[i].hostHash == p.hostHash;
    return local;
  };
  for (const auto& c : comm.connections()) {
    if (c.side != transport::Side::kSend) continue;
    out += fmt::format("Channel {:02d}/{} : {}[{}] -> {}[{}] via {}\n", c.channel, c.connIndex, comm.rank(),
                       devOf(comm.rank()), c.peer, devOf(c.peer), c.via);
  }
  return out;
}

// "0,1,7,1MB+3": element counts, K/M/G = 1024^n; a B suffix means bytes (divided by the element size).
size_t countFor(const std::string& spec, DataType t) {
  std::string s = spec;
  size_t plus = 0;
  if (auto p = s.find('+'); p != std::string::npos) {
    plus = std::stoull(s.substr(p + 1));
    s.resize(p);
  }
  bool bytes = !s.empty() && (s.back() == 'B' || s.back() == 'b');
  if (bytes) s.pop_back();
  size_t mult = 1;
  if (!s.empty() && std::string("KkMmGg").find(s.back()) != std::string::npos) {
    char c = static_cast<char>(std::toupper(s.back()));
    mult = c == 'K' ? 1u << 10 : c == 'M' ? 1u << 20 : 1u << 30;
    s.pop_back();
  }
  size_t v = std::stoull(s) * mult;
  return (bytes ? v / sizeOf(t) : v) + plus;
}

uint8_t pattern(int src, int dst, size_t i, int salt) {
  return static_cast<uint8_t>(src * 131 + dst * 31 + i * 7 + (i >> 9) + salt * 13);
}

struct SendrecvResult {
  uint64_t wrong = 0, exchanges = 0, bytes = 0;
  double ms = 0;
};

// Every rank sends to and receives from every rank (itself included) in one group per type and count, and checks
// every byte it received.
SendrecvResult sendrecvCheck(runtime::Communicator& comm, const std::vector<std::string>& sizes,
                             const std::vector<DataType>& types, std::string* report) {
  SendrecvResult res;
  const int n = comm.nRanks(), me = comm.rank();
  int salt = 0;
  for (DataType t : types) {
    for (const std::string& spec : sizes) {
      size_t count = countFor(spec, t), bytes = count * sizeOf(t);
      std::vector<std::vector<uint8_t>> out(n), in(n);
      for (int p = 0; p < n; ++p) {
        out[p].resize(bytes);
        in[p].assign(bytes, 0xee);
        for (size_t i = 0; i < bytes; ++i) out[p][i] = pattern(me, p, i, salt);
      }
      comm.bootstrap().barrier();
      auto t0 = std::chrono::steady_clock::now();
      runtime::groupStart();
      for (int k = 0; k < n; ++k) {  // a different order on every rank: a group completes in any order
        int p = (me + k) % n, q = (me - k + n) % n;
        comm.send(out[p].data(), count, t, p);
        comm.recv(in[q].data(), count, t, q);
      }
      runtime::groupEnd();
      res.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      for (int p = 0; p < n; ++p) {
        uint64_t bad = 0;
        for (size_t i = 0; i < bytes; ++i) bad += in[p][i] != pattern(p, me, i, salt);
        if (bad)
          *report += fmt::format("rank {} -> rank {}: {} of {} bytes wrong ({} x {})\n", p, me, bad, bytes, count,
                                 to_string(t));
        res.wrong += bad;
        res.bytes += bytes;
        res.exchanges += 1;
      }
      ++salt;
    }
  }
  return res;
}

std::string commCheck(const Env& env, bool json, bool sendrecv, const std::string& sizesSpec,
                      const std::string& typesSpec, int* status) {
  auto comm = runtime::Communicator::initFromEnv(env);
  const auto& tm = comm->timings();
  std::vector<runtime::InitTimings> all(comm->nRanks());
  all[comm->rank()] = tm;
  comm->bootstrap().allGather(all.data(), sizeof(runtime::InitTimings));
  std::vector<std::string> sizes, report;
  std::vector<DataType> types;
  SendrecvResult sr;
  if (sendrecv) {
    for (size_t pos = 0; pos <= sizesSpec.size();) {
      size_t comma = std::min(sizesSpec.find(',', pos), sizesSpec.size());
      if (comma > pos) sizes.push_back(sizesSpec.substr(pos, comma - pos));
      pos = comma + 1;
    }
    if (typesSpec == "all") {
      for (int t = 0; t < kNumDataTypes; ++t) types.push_back(static_cast<DataType>(t));
    } else {
      for (size_t pos = 0; pos <= typesSpec.size();) {
        size_t comma = std::min(typesSpec.find(',', pos), typesSpec.size());
        auto t = dataTypeFromString(typesSpec.substr(pos, comma - pos));
        if (!t) fail(StatusCode::kInvalidArgument, "--types: unknown type '{}'", typesSpec.substr(pos, comma - pos));
        types.push_back(*t);
        pos = comma + 1;
      }
    }
    comm->connectAll();
    std::string mine;
    sr = sendrecvCheck(*comm, sizes, types, &mine);
    report = gatherText(*comm, mine, 0x7ff00001);
    std::vector<SendrecvResult> results(comm->nRanks());
    results[comm->rank()] = sr;
    comm->bootstrap().allGather(results.data(), sizeof(SendrecvResult));
    sr = SendrecvResult{};
    for (auto& r : results) {
      sr.wrong += r.wrong;
      sr.exchanges += r.exchanges;
      sr.bytes += r.bytes;
      sr.ms = std::max(sr.ms, r.ms);
    }
    if (sr.wrong) *status = 1;
  }
  std::vector<std::string> conns = gatherText(*comm, connectionLines(*comm), 0x7ff00002);
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
    auto cj = nlohmann::ordered_json::array();
    for (auto& text : conns)
      for (size_t pos = 0, nl; pos < text.size(); pos = nl + 1) {
        nl = text.find('\n', pos);
        cj.push_back(text.substr(pos, nl - pos));
      }
    j["connections"] = cj;
    if (sendrecv)
      j["sendrecv"] = {{"wrong", sr.wrong}, {"exchanges", sr.exchanges}, {"bytes", sr.bytes}, {"ms", sr.ms}};
    auto tj = nlohmann::ordered_json::array();
    for (auto& x : all)
      tj.push_back({{"bootstrap", x.bootstrap}, {"allgathers", x.allgathers}, {"topology", x.topology},
                    {"search", x.search}, {"connect", x.connect}, {"transports", x.transports}, {"total", x.total}});
    j["initTimingsMs"] = tj;
    return j.dump(1) + "\n";
  }
  std::string out = fmt::format("comm-check: {} ranks on {} node(s), {} ranks\n", comm->nRanks(), c.nNodes,
                                comm->hostMemory() ? "host-memory" : "GPU");
  out += fmt::format("{:>5} {:>18} {:>5} {:>6} {:>4}\n", "rank", "host", "dev", "busId", "numa");
  for (auto& p : comm->peers())
    out += fmt::format("{:>5} {:>18x} {:>5} {:>6x} {:>4}\n", p.rank, p.hostHash, p.dev, p.busId < 0 ? 0 : p.busId, p.numaNode);
  out += ringsAndTrees(c, comm->nRanks());
  for (auto& text : conns) out += text;
  for (int r = 0; r < comm->nRanks(); ++r)
    out += fmt::format("Init timings (ms) rank {}: bootstrap {:.2f} allgathers {:.2f} topology {:.2f} search {:.2f} "
                       "connect {:.2f} transports {:.2f} total {:.2f}\n",
                       r, all[r].bootstrap, all[r].allgathers, all[r].topology, all[r].search, all[r].connect,
                       all[r].transports, all[r].total);
  if (sendrecv) {
    for (auto& r : report) out += r;
    std::string counts;
    for (auto& s : sizes) counts += " " + s;
    out += fmt::format("sendrecv: {} ranks, every pair both ways, {} type(s) x counts{}: {} wrong bytes ({} exchanges, "
                       "{:.1f} MB in {:.1f} ms){}\n",
                       comm->nRanks(), types.size(), counts, sr.wrong, sr.exchanges, sr.bytes / 1e6, sr.ms,
                       sr.wrong ? "" : ", all correct");
  }
  return out;
}

}  // namespace

// `topocoll params --thresholds`: the host collectives' size thresholds as this environment sets them
// (TOPOCOLL_HOST_THRESHOLDS over the built-in table), with where bench/host_thresholds.py measures each.
std::string thresholdsText(const Config& cfg, bool json) {
  const tuning::HostThresholds today{}, now = tuning::withOverrides(today, cfg.hostThresholds);
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  std::string out = fmt::format("{:<22} {:>12} {:>12}  {}\n", "threshold", "bytes", "built in", "measured with");
  for (const auto& f : tuning::hostThresholdFields()) {
    if (json) {
      arr.push_back({{"name", f.name}, {"value", now.*(f.member)}, {"default", today.*(f.member)},
                     {"perf_test", f.perfTest}, {"ranks", f.ranks}, {"size_per_value", f.sizePerValue}});
    } else {
      out += fmt::format("{:<22} {:>12} {:>12}  {} -np {}{}\n", f.name, now.*(f.member), today.*(f.member),
                         f.perfTest, f.ranks,
                         f.sizePerValue > 1 ? fmt::format(" (size = {} x the value)", f.sizePerValue) : "");
    }
  }
  return json ? arr.dump(1) + "\n" : out;
}

Command addParamsCommand(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto thresholds = std::make_shared<bool>(false);
  auto* params = app.add_subcommand("params", "List every knob topocoll reads: default, current value, range, meaning");
  params->add_flag("--json", *json, "Machine-readable output");
  params->add_flag("--thresholds", *thresholds,
                   "The host collectives' size thresholds instead (TOPOCOLL_HOST_THRESHOLDS over the built-in "
                   "table; bench/host_thresholds.py measures them)");
  return {params, [json, thresholds](const Env& env, Config& cfg) {
            std::cout << (*thresholds ? thresholdsText(cfg, *json) : paramsText(env, cfg, *json));
            return 0;
          }};
}

Command addCommCheckCommand(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cc = app.add_subcommand(
      "comm-check",
      "Initialise a communicator from the launcher's environment (mpirun, srun, torchrun, or RANK/WORLD_SIZE with "
      "NCCL_COMM_ID) and print, from rank 0, the peers, rings, trees, the transport of every connection and the "
      "init timings");
  cc->add_flag("--json", *json, "Machine-readable output");
  auto sendrecv = std::make_shared<bool>(false);
  auto sizes = std::make_shared<std::string>("0,1,7,1MB+3");
  auto types = std::make_shared<std::string>("all");
  cc->add_flag("--sendrecv", *sendrecv,
               "Connect every pair, then every rank sends to and receives from every rank (one group per type and "
               "count) and checks every byte; the exit status is 1 if any is wrong");
  cc->add_option("--sizes", *sizes,
                 "Element counts for --sendrecv: K/M/G multiply by 1024, a B suffix means bytes, +N adds elements "
                 "(default 0,1,7,1MB+3)");
  cc->add_option("--types", *types, "Data types for --sendrecv: all, or nccl-tests names (float,int8,...)");
  return {cc, [json, sendrecv, sizes, types](const Env& env, Config&) {
            int status = 0;
            std::cout << commCheck(env, *json, *sendrecv, *sizes, *types, &status) << std::flush;
            return status;
          }};
}

}  // namespace topocoll::cli
