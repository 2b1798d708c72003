#include "topocoll/plan.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <numeric>

#include <nlohmann/json.hpp>

#include "topocoll/paths/paths.h"
#include "topocoll/status.h"
#include "topocoll/topology/node_xml.h"

namespace topocoll {

using topology::NodeType;
using topology::PathType;


namespace {

// The GPU devs each local rank drives, from the job description.
std::vector<int> localDevsOf(const topology::XmlDoc& topo, const JobSpec& job, int host) {
  std::vector<int> devs = topology::gpuDevs(topo, host);
  const std::string where = host ? fmt::format("{} (host {})", topo.source, host) : topo.source;
  if (devs.empty())
    fail(StatusCode::kInvalidArgument,
         "{}: the topology has no <gpu>: nothing to plan (a partial file, which NCCL completes with the GPUs it finds "
         "on the machine it runs on? Plan on that machine, or from a complete dump: NCCL_TOPO_DUMP_FILE)",
         where);
  if (!job.ranksOnGpus.empty()) {
    for (int d : job.ranksOnGpus)
      if (std::find(devs.begin(), devs.end(), d) == devs.end())
        fail(StatusCode::kInvalidArgument, "--ranks-on-gpus names GPU dev {}, which {} does not have", d, where);
    return job.ranksOnGpus;
  }
  if (job.gpusPerNode > 0) {
    if (job.gpusPerNode > static_cast<int>(devs.size()))
      fail(StatusCode::kInvalidArgument, "--gpus-per-node {} but {} has only {} GPUs", job.gpusPerNode, where,
           devs.size());
    devs.resize(job.gpusPerNode);
  }
  return devs;
}

// How the job's hosts group into NVLink cliques: `clique` hosts each, the topology's hosts repeating.
int cliqueHostsOf(const topology::XmlDoc& topo, const JobSpec& job, const Config& cfg) {
  const int xmlHosts = std::max(1, topology::xmlHostCount(topo));
  if (cfg.mnnvlEnable == 0 && job.cliqueHosts > 1)
    fail(StatusCode::kInvalidArgument, "--clique-hosts {} asks for multi-node NVLink, NCCL_MNNVL_ENABLE=0 disables it",
         job.cliqueHosts);
  // By default the largest clique both the job and the topology divide into.
  const int k = job.cliqueHosts > 0 ? job.cliqueHosts : cfg.mnnvlEnable == 0 ? 1 : std::gcd(xmlHosts, job.nNodes);
  if (k > xmlHosts || xmlHosts % k != 0)
    fail(StatusCode::kInvalidArgument,
         "--clique-hosts {}: {} describes {} host(s); a clique is 1 host or a divisor of the hosts it describes", k,
         topo.source, xmlHosts);
  if (job.nNodes % k != 0)
    fail(StatusCode::kInvalidArgument, "--nodes {} is not a whole number of NVLink cliques of {} hosts", job.nNodes, k);
  return k;
}

// One kind of unit (a host, or a clique of hosts): its NCCL nodes, each searched as its ranks search it (a host can
// split into domains whose GPUs talk through the network).
struct Unit {
  topology::XmlDoc xml;
  std::vector<search::NodeGraphs> nodes;
  std::vector<std::vector<int>> domains;  // unit-local ranks of each node
  topology::System rank0System;           // the system of the unit's rank 0
};

// `given` graphs (plan --optimize's) replace the searches of the unit's first node.
Unit searchUnit(const topology::XmlDoc& unitDoc, const std::vector<topology::LocalGpu>& locals, int nRanks,
                const Config& cfg, const std::array<search::Graph, search::kNumGraphs>* given) {
  Unit u;
  u.xml = topology::prepareNodeXml(unitDoc, locals, cfg);
  const topology::System whole = topology::buildSystem(u.xml);
  const int unitRanks = static_cast<int>(locals.size());
  std::vector<int> domainOf(unitRanks, -1);
  {
    topology::System withPaths = whole;
    paths::computePaths(withPaths, cfg);
    const std::vector<int> dom = paths::gpuDomains(withPaths);
    for (int g = 0; g < withPaths.count(NodeType::GPU); ++g) domainOf[withPaths.of(NodeType::GPU)[g].rank] = dom[g];
  }
  for (int r = 0; r < unitRanks; ++r) {
    bool first = true;
    for (int q = 0; q < r; ++q) first &= domainOf[q] != domainOf[r];
    if (!first) continue;
    NodePlan node = planNode(whole, r, nRanks, cfg, unitDoc.source, {}, r == 0 ? given : nullptr);
    u.nodes.push_back(std::move(node.graphs));
    std::vector<int> members;
    for (int q = r; q < unitRanks; ++q)
      if (domainOf[q] == domainOf[r]) members.push_back(q);
    u.domains.push_back(members);
    if (r == 0) u.rank0System = std::move(node.system);
  }
  return u;
}

// Bytes the plan's per-rank tables take at most: the rings and trees of every channel, the NVLS links, the
// connect's working arrays (ring neighbours, base trees), all per rank.
constexpr uint64_t kPlanBytesPerRank =
    search::kMaxChannels * (sizeof(int) + 2 * sizeof(search::TreeLinks) + sizeof(int)) +
    2 * sizeof(search::NvlsLinks) + 3 * sizeof(std::vector<int>) + 64;

// A job too large for this machine fails before anything is allocated, naming what it would need.
void checkPlanMemory(int64_t nRanks) {
  const uint64_t need = static_cast<uint64_t>(nRanks) * kPlanBytesPerRank;
  uint64_t have = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) have = std::min<uint64_t>(have, lim.rlim_cur);
  if (need > have / 2)
    fail(StatusCode::kInvalidArgument,
         "a job of {} ranks needs up to {:.1f} GiB for its rings and trees; this machine allows {:.1f} GiB (half of "
         "its memory or address-space limit): plan fewer --nodes",
         nRanks, need / 1073741824.0, have / 2 / 1073741824.0);
}

}  // namespace

NodePlan planNode(const topology::System& host, int rank, int nRanks, const Config& cfg, const std::string& source,
                  const std::vector<int>& shmDevByRank, const std::array<search::Graph, search::kNumGraphs>* given) {
  NodePlan n;
  n.system = host;
  paths::prepareForSearch(n.system, cfg, rank, nRanks, shmDevByRank);
  if (n.system.inter && n.system.count(NodeType::NET) == 0)
    fail(StatusCode::kInvalidArgument, "{}: GPUs of this job talk through the network, but it has no network device",
         source);
  n.graphs = search::searchNode(n.system, cfg, nRanks, given);
  return n;
}

search::NodeGraphs hostMemoryNode(std::vector<HostRank> ranks) {
  std::stable_sort(ranks.begin(), ranks.end(), [](const HostRank& a, const HostRank& b) {
    return a.numaNode != b.numaNode ? a.numaNode < b.numaNode : a.rank < b.rank;
  });
  search::NodeGraphs ng;
  ng.ranks = static_cast<int>(ranks.size());
  ng.firstRank = ranks[0].rank;
  const int nc = 2;
  for (int gi : {search::kGraphRing, search::kGraphTree}) {
    auto& g = ng.graphs[gi];
    g.id = gi;
    g.pattern = gi == search::kGraphRing ? search::kPatternRing : search::kPatternTree;
    g.nChannels = nc;
    g.bwIntra = g.bwInter = 1.0f;
    g.typeIntra = static_cast<int>(PathType::SYS);
    g.typeInter = static_cast<int>(PathType::NET);
    g.intra.assign(static_cast<size_t>(search::kMaxChannels) * ng.ranks, 0);
    g.inter.assign(search::kMaxChannels * 2, 0);
    for (int c = 0; c < nc; ++c)
      for (int i = 0; i < ng.ranks; ++i) g.intra[c * ng.ranks + i] = ranks[i].rank;
    ng.available[gi] = true;
  }
  ng.p2pnChannelsPerPeer = 2;
  return ng;
}

void joinNodes(Plan& plan, const search::RankRecords& records) {
  plan.connect = search::connectRanks(records, plan.cfg);
  if (!plan.hostMemory)
    plan.model = tuning::tuneModel(tuning::jobInfo(plan.connect, plan.system.count(NodeType::NVS)),
                                   plan.connect.aligned, plan.cfg);
}

Plan makePlan(const topology::XmlDoc& topo, const JobSpec& job, const Config& cfg,
              const std::array<search::Graph, search::kNumGraphs>* graphs) {
  auto t0 = std::chrono::steady_clock::now();
  Plan plan;
  plan.job = job;
  plan.cfg = cfg;
  if (job.nNodes < 1) fail(StatusCode::kInvalidArgument, "--nodes must be >= 1 (got {})", job.nNodes);
  if (job.nNodes > (1 << 20))
    fail(StatusCode::kInvalidArgument, "--nodes {} is more than this planner supports (1048576)", job.nNodes);
  const int xmlHosts = std::max(1, topology::xmlHostCount(topo));
  plan.cliqueHosts = cliqueHostsOf(topo, job, cfg);
  std::vector<std::vector<int>> devsOf;  // [topology host] the devs of its ranks
  for (int h = 0; h < xmlHosts; ++h) {
    devsOf.push_back(localDevsOf(topo, job, h));
    if (devsOf[h].size() != devsOf[0].size())
      fail(StatusCode::kInvalidArgument, "{}: host {} has {} GPUs for the job, host 0 has {}; hosts must match",
           topo.source, h, devsOf[h].size(), devsOf[0].size());
  }
  plan.localDevs = devsOf[0];
  plan.localRanks = static_cast<int>(plan.localDevs.size());
  const int64_t nRanks64 = static_cast<int64_t>(plan.localRanks) * job.nNodes;
  if (nRanks64 > kMaxPlanRanks)
    fail(StatusCode::kInvalidArgument, "{} ranks is more than this planner supports ({})", nRanks64, kMaxPlanRanks);
  checkPlanMemory(nRanks64);
  plan.nRanks = static_cast<int>(nRanks64);

  // The job is units of `cliqueHosts` hosts (one host without multi-node NVLink); the topology's hosts give
  // xmlHosts / cliqueHosts kinds of unit, repeating. Each kind is searched once and repeated with shifted ranks.
  const int k = plan.cliqueHosts, unitRanks = k * plan.localRanks;
  std::vector<std::vector<search::NodeGraphs>> unitTypes;
  for (int t = 0; t < xmlHosts / k; ++t) {
    std::vector<topology::LocalGpu> locals;
    for (int h = 0; h < k; ++h)
      for (int i = 0; i < plan.localRanks; ++i) locals.push_back({h * plan.localRanks + i, devsOf[t * k + h][i], h});
    Unit u = xmlHosts == 1 ? searchUnit(topo, locals, plan.nRanks, cfg, graphs)
                           : searchUnit(topology::selectHosts(topo, t * k, k), locals, plan.nRanks, cfg, graphs);
    if (t == 0) {
      plan.nodeXml = std::move(u.xml);
      plan.system = std::move(u.rank0System);
      plan.hostDomains = u.domains;
      plan.graphs = u.nodes[0].graphs;
      plan.graphAvailable = u.nodes[0].available;
      plan.searchMs = u.nodes[0].searchMs;
    }
    unitTypes.push_back(std::move(u.nodes));
  }
  joinNodes(plan, search::ReplicatedNodes(unitTypes, unitRanks, job.nNodes / k));
  plan.wallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

std::string topoName(const std::string& path) {
  const auto pos = path.find("topologies/");
  return pos == std::string::npos ? path : path.substr(pos);
}

uint64_t testSize(int coll, uint64_t size, int typeSize, int nRanks) {
  if (coll != tuning::kAllGather && coll != tuning::kReduceScatter) return size;
  // nccl-tests' rounding: a whole number of elements per rank, times the ranks.
  uint64_t count = size / static_cast<uint64_t>(nRanks) / static_cast<uint64_t>(typeSize);
  return count * static_cast<uint64_t>(typeSize) * static_cast<uint64_t>(nRanks);
}

std::vector<tuning::Selection> selectionTable(const Plan& plan, int typeSize, int onlyColl) {
  std::vector<tuning::Selection> out;
  static const int order[] = {tuning::kAllReduce, tuning::kBroadcast, tuning::kReduce, tuning::kAllGather,
                              tuning::kReduceScatter};
  for (int coll : order) {
    if (onlyColl >= 0 && coll != onlyColl) continue;
    for (int l = 3; l <= 33; ++l) {
      uint64_t nBytes = testSize(coll, 1ULL << l, typeSize, plan.nRanks);
      if (nBytes < static_cast<uint64_t>(typeSize)) continue;  // nccl-tests leaves sizes of 0 elements out
      out.push_back(plan.select(coll, nBytes));
    }
  }
  return out;
}

namespace {

nlohmann::ordered_json graphJson(const Plan& plan, int gi, bool timings) {
  const search::Graph& g = plan.graphs[gi];
  nlohmann::ordered_json j;
  j["available"] = plan.graphAvailable[gi];
  if (!plan.graphAvailable[gi]) return j;
  j["id"] = g.id;
  j["pattern"] = g.pattern;
  j["nChannels"] = g.nChannels;
  j["bwIntra"] = g.bwIntra;
  j["bwInter"] = g.bwInter;
  j["latencyInter"] = g.latencyInter;
  j["typeIntra"] = topology::to_string(static_cast<PathType>(g.typeIntra));
  j["typeInter"] = topology::to_string(static_cast<PathType>(g.typeInter));
  j["sameChannels"] = g.sameChannels;
  j["crossNic"] = g.crossNic;
  j["nHops"] = g.nHops;
  if (timings) j["searchMs"] = g.searchMs;
  j["searchTimedOut"] = g.timedOut;
  j["searchSteps"] = g.searchSteps;
  j["searchWalked"] = g.searchWalked;
  j["fromFile"] = g.fromFile;
  const int n = plan.system.count(NodeType::GPU);  // the GPUs of rank 0's NCCL node
  auto chans = nlohmann::ordered_json::array();
  for (int c = 0; c < g.nChannels; ++c) {
    nlohmann::ordered_json ch;
    std::vector<int> intra(g.intra.begin() + c * n, g.intra.begin() + (c + 1) * n);
    ch["intra"] = intra;
    if (plan.system.inter) {
      ch["inter"] = {g.inter[2 * c], g.inter[2 * c + 1]};
    }
    chans.push_back(ch);
  }
  j["channels"] = chans;
  return j;
}

}  // namespace

namespace {

using json = nlohmann::ordered_json;

json pathsJson(const topology::System& sys, const topology::Node& gpu, NodeType type) {
  json out = json::array();
  const auto& paths = gpu.paths[static_cast<int>(type)];
  for (int i = 0; i < sys.count(type); ++i) {
    const auto& path = paths[i];
    if (type == NodeType::GPU)
      out.push_back({{"gpu", i}, {"type", topology::to_string(path.type)}, {"bw", path.bw}, {"hops", path.count()}});
    else
      out.push_back({{"net", sys.of(type)[i].dev}, {"type", topology::to_string(path.type)}, {"bw", path.bw},
                     {"hops", path.count()}});
  }
  return out;
}

// `system`: rank 0's system after paths, trim and paths again.
json systemJson(const topology::System& sys) {
  json s;
  s["maxBw"] = sys.maxBw;
  s["totalBw"] = sys.totalBw;
  s["inter"] = sys.inter;
  s["cpuArch"] = sys.of(NodeType::CPU)[0].arch;
  s["cpuVendor"] = sys.of(NodeType::CPU)[0].vendor;
  s["nvsCount"] = sys.count(NodeType::NVS);
  json gpus = json::array();
  for (int g = 0; g < sys.count(NodeType::GPU); ++g) {
    const auto& gpu = sys.of(NodeType::GPU)[g];
    json x;
    x["index"] = g;
    x["rank"] = gpu.rank;
    x["dev"] = gpu.dev;
    x["busId"] = fmt::format("{:x}", topology::busIdToInt64(gpu.busId));
    x["sm"] = gpu.cudaCompCap;
    x["gdr"] = gpu.gdrSupport;
    x["cpuAffinity"] = paths::cpuAffinity(sys, g);
    x["toGpu"] = pathsJson(sys, gpu, NodeType::GPU);
    x["toNet"] = pathsJson(sys, gpu, NodeType::NET);
    gpus.push_back(x);
  }
  s["gpus"] = gpus;
  json nets = json::array();
  for (auto& n : sys.of(NodeType::NET)) {
    nets.push_back({{"dev", n.dev}, {"id", fmt::format("{:x}", n.id)}, {"bw", n.bw}, {"port", n.port},
                    {"gdr", n.gdrSupport}, {"localGpu", n.localGpu}, {"name", n.name}});
  }
  s["nets"] = nets;
  return s;
}

// `connect`: the job-wide values after the allgather, preset and postset.
json connectJson(const Plan& plan) {
  const auto& c = plan.connect;
  json cj;
  cj["nNodes"] = c.nNodes;
  cj["localRanks"] = c.localRanks;
  cj["nChannelsSearchedRing"] = c.nChannelsSearchedRing;
  cj["nChannelsSearchedTree"] = c.nChannelsSearchedTree;
  cj["nChannelsPreset"] = c.nChannelsPreset;
  cj["nChannels"] = c.nChannels;
  cj["collChannels"] = c.collChannels;
  cj["nvlsSupport"] = c.nvlsSupport;
  cj["nvlsChannels"] = c.nvlsChannels;
  cj["p2pnChannels"] = c.p2pnChannels;
  cj["p2pnChannelsPerPeer"] = c.p2pnChannelsPerPeer;
  json aligned;
  for (int gi = 0; gi < search::kNumGraphs; ++gi) {
    const auto& g = c.aligned[gi];
    const bool avail = plan.graphAvailable[gi];
    aligned[search::graphName(gi)] = {{"nChannels", avail ? g.nChannels : 0},
                                      {"bwIntra", avail ? g.bwIntra : 0.0f},
                                      {"bwInter", avail ? g.bwInter : 0.0f},
                                      {"typeIntra", topology::to_string(static_cast<PathType>(avail ? g.typeIntra : 0))},
                                      {"typeInter", topology::to_string(static_cast<PathType>(avail ? g.typeInter : 0))},
                                      {"sameChannels", avail ? g.sameChannels : 0},
                                      {"crossNic", avail ? g.crossNic : 0}};
  }
  cj["alignedGraphs"] = aligned;
  cj["rings"] = c.rings;
  json trees = json::array();
  for (auto& perRank : c.trees) {
    json rj = json::array();
    for (auto& t : perRank) rj.push_back({{"up", t.up}, {"down", t.down}});
    trees.push_back(rj);
  }
  cj["trees"] = trees;
  json nv = json::array();
  for (auto& perRank : c.nvls) {
    json rj = json::array();
    for (auto& t : perRank)
      rj.push_back({{"nHeads", t.nHeads}, {"headRank", t.headRank}, {"treeUp", t.treeUp}, {"treeDown", t.treeDown}});
    nv.push_back(rj);
  }
  cj["nvls"] = nv;
  return cj;
}

// `tuning`: the latency, bandwidth and thread tables.
json tuningJson(const tuning::Model& m) {
  json tj;
  tj["protocols"] = {"LL", "LL128", "Simple"};
  json lat, bw, mt;
  for (int coll = 0; coll < tuning::kNumColls; ++coll) {
    json la, ba;
    for (int a = 0; a < tuning::kNumAlgos; ++a) {
      la[tuning::algoName(a)] = {m.latencies[coll][a][0], m.latencies[coll][a][1], m.latencies[coll][a][2]};
      ba[tuning::algoName(a)] = {m.bandwidths[coll][a][0], m.bandwidths[coll][a][1], m.bandwidths[coll][a][2]};
    }
    lat[tuning::collName(coll)] = la;
    bw[tuning::collName(coll)] = ba;
  }
  for (int a = 0; a < tuning::kNumAlgos; ++a)
    mt[tuning::algoName(a)] = {m.maxThreads[a][0], m.maxThreads[a][1], m.maxThreads[a][2]};
  tj["latencies"] = lat;
  tj["bandwidths"] = bw;
  tj["maxThreads"] = mt;
  return tj;
}

// `selection`: NCCL's choice for every test size.
json selectionJson(const Plan& plan, int typeSize) {
  json sel = json::array();
  for (auto& x : selectionTable(plan, typeSize)) {
    json e;
    e["coll"] = tuning::collName(x.coll);
    e["nBytes"] = x.nBytes;
    if (x.algo < 0) {
      e["error"] = x.error;
      e["message"] = "no algorithm/protocol available (NCCL_ALGO/NCCL_PROTO leave none for this collective)";
    } else {
      e["algo"] = tuning::algoName(x.algo);
      e["proto"] = tuning::protoName(x.proto);
      e["timeUs"] = x.timeUs;
      e["nChannels"] = x.nChannels;
      e["nWarps"] = x.nWarps;
    }
    sel.push_back(e);
  }
  return sel;
}

}  // namespace

std::string planToJson(const Plan& plan, const std::string& topoName, int typeSize, bool pretty, bool timings) {
  json j;
  j["topocoll_version"] = "0.1.0";
  j["nccl_version"] = "2.30.7";
  j["topo"] = topoName;
  j["nodes"] = plan.job.nNodes;
  j["gpus_per_node"] = plan.localRanks;
  j["nranks"] = plan.nRanks;
  j["cliqueHosts"] = plan.cliqueHosts;
  j["dtype"] = typeSize == 4 ? "float" : std::to_string(typeSize) + "-byte";
  if (plan.hostMemory) {
    // A host-memory job has no system, graphs or GPU model: its rings and trees (hostMemoryNode's) are the plan.
    j["hostMemory"] = true;
    j["connect"] = connectJson(plan);
    return j.dump(pretty ? 1 : -1);
  }
  j["system"] = systemJson(plan.system);
  json graphs;
  for (int gi = 0; gi < search::kNumGraphs; ++gi) graphs[search::graphName(gi)] = graphJson(plan, gi, timings);
  j["graphs"] = graphs;
  {
    const search::Graph* order[] = {&plan.graphs[search::kGraphRing], &plan.graphs[search::kGraphTree],
                                    &plan.graphs[search::kGraphCollnetDirect], &plan.graphs[search::kGraphCollnetChain],
                                    &plan.graphs[search::kGraphNvls]};
    j["graph_dump_xml"] =
        search::graphsToXml(plan.system, std::vector<const search::Graph*>(std::begin(order), std::end(order)));
  }
  j["connect"] = connectJson(plan);
  j["tuning"] = tuningJson(plan.model);
  j["selection"] = selectionJson(plan, typeSize);
  if (timings) {
    j["searchTimeMs"] = {{"rank0", plan.searchMs}};
    j["wallMs"] = plan.wallMs;
  }
  return j.dump(pretty ? 1 : -1);
}

}  // namespace topocoll
