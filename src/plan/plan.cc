#include "topocoll/plan.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "topocoll/paths/paths.h"
#include "topocoll/status.h"
#include "topocoll/topology/node_xml.h"

namespace topocoll {

using topology::NodeType;
using topology::PathType;


Plan makePlan(const topology::XmlDoc& topo, const JobSpec& job, const Config& cfg,
              const std::array<search::Graph, search::kNumGraphs>* graphs) {
  auto t0 = std::chrono::steady_clock::now();
  Plan plan;
  plan.job = job;
  plan.cfg = cfg;
  if (job.nNodes < 1) fail(StatusCode::kInvalidArgument, "--nodes must be >= 1 (got {})", job.nNodes);
  if (job.nNodes > (1 << 20)) fail(StatusCode::kInvalidArgument, "--nodes {} is more than this planner supports (1048576)", job.nNodes);
  std::vector<int> devs = topology::gpuDevs(topo);
  if (devs.empty()) fail(StatusCode::kInvalidArgument, "{}: the topology has no <gpu>: nothing to plan", topo.source);
  if (!job.ranksOnGpus.empty()) {
    for (int d : job.ranksOnGpus)
      if (std::find(devs.begin(), devs.end(), d) == devs.end())
        fail(StatusCode::kInvalidArgument, "--ranks-on-gpus names GPU dev {}, which {} does not have", d, topo.source);
    plan.localDevs = job.ranksOnGpus;
  } else if (job.gpusPerNode > 0) {
    if (job.gpusPerNode > static_cast<int>(devs.size()))
      fail(StatusCode::kInvalidArgument, "--gpus-per-node {} but {} has only {} GPUs", job.gpusPerNode, topo.source,
           devs.size());
    plan.localDevs.assign(devs.begin(), devs.begin() + job.gpusPerNode);
  } else {
    plan.localDevs = devs;
  }
  plan.localRanks = static_cast<int>(plan.localDevs.size());
  int64_t nRanks64 = static_cast<int64_t>(plan.localRanks) * job.nNodes;
  if (nRanks64 > (1 << 24)) fail(StatusCode::kInvalidArgument, "{} ranks is more than this planner supports", nRanks64);
  plan.nRanks = static_cast<int>(nRanks64);

  std::vector<topology::LocalGpu> locals;
  for (int i = 0; i < plan.localRanks; ++i) locals.push_back({i, plan.localDevs[i]});
  plan.nodeXml = topology::prepareNodeXml(topo, locals, cfg);
  plan.system = topology::buildSystem(plan.nodeXml);
  auto& sys = plan.system;
  if (job.nNodes > 1 && sys.count(NodeType::NET) == 0)
    fail(StatusCode::kInvalidArgument, "{}: a job on {} nodes needs a network device (<net>) in the topology",
         topo.source, job.nNodes);
  paths::prepareForSearch(sys, cfg, 0, plan.nRanks);

  search::NodeGraphs node0 = search::searchNode(sys, cfg, plan.nRanks, graphs);
  plan.graphs = node0.graphs;
  plan.graphAvailable = node0.available;
  plan.searchMs = node0.searchMs;
  std::vector<search::NodeGraphs> nodes(job.nNodes);
  for (int n = 0; n < job.nNodes; ++n) {
    auto& ng = nodes[n];
    ng = node0;
    ng.firstRank = n * plan.localRanks;
    if (n > 0) {
      for (auto& g : ng.graphs)
        for (auto& r : g.intra) r += ng.firstRank;
    }
  }
  plan.connect = search::connectJob(nodes, cfg);

  tuning::JobInfo ji = tuning::jobInfo(plan.connect, sys.count(NodeType::NVS));
  plan.model = tuning::tuneModel(ji, plan.connect.aligned, cfg);
  plan.wallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

std::vector<tuning::Selection> selectionTable(const Plan& plan, int typeSize, int onlyColl) {
  std::vector<tuning::Selection> out;
  static const int order[] = {tuning::kAllReduce, tuning::kBroadcast, tuning::kReduce, tuning::kAllGather,
                              tuning::kReduceScatter};
  for (int coll : order) {
    if (onlyColl >= 0 && coll != onlyColl) continue;
    for (int l = 3; l <= 33; ++l) {
      uint64_t nBytes = 1ULL << l;
      uint64_t perRank = (coll == tuning::kAllGather || coll == tuning::kReduceScatter)
                             ? nBytes / static_cast<uint64_t>(plan.nRanks)
                             : nBytes;
      if (perRank < static_cast<uint64_t>(typeSize)) continue;
      out.push_back(plan.select(coll, nBytes));
    }
  }
  return out;
}

namespace {

nlohmann::ordered_json graphJson(const Plan& plan, int gi) {
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
  j["searchMs"] = g.searchMs;
  j["searchTimedOut"] = g.timedOut;
  j["searchSteps"] = g.searchSteps;
  j["fromFile"] = g.fromFile;
  int n = plan.localRanks;
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

std::string planToJson(const Plan& plan, const std::string& topoName, int typeSize, bool pretty) {
  using json = nlohmann::ordered_json;
  const auto& sys = plan.system;
  json j;
  j["topocoll_version"] = "0.1.0";
  j["nccl_version"] = "2.30.7";
  j["topo"] = topoName;
  j["nodes"] = plan.job.nNodes;
  j["gpus_per_node"] = plan.localRanks;
  j["nranks"] = plan.nRanks;
  j["dtype"] = typeSize == 4 ? "float" : std::to_string(typeSize) + "-byte";
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
    json tg = json::array(), tn = json::array();
    for (int p = 0; p < sys.count(NodeType::GPU); ++p) {
      const auto& path = gpu.paths[static_cast<int>(NodeType::GPU)][p];
      tg.push_back({{"gpu", p}, {"type", topology::to_string(path.type)}, {"bw", path.bw}, {"hops", path.count()}});
    }
    for (int n = 0; n < sys.count(NodeType::NET); ++n) {
      const auto& path = gpu.paths[static_cast<int>(NodeType::NET)][n];
      tn.push_back({{"net", sys.of(NodeType::NET)[n].dev}, {"type", topology::to_string(path.type)}, {"bw", path.bw},
                    {"hops", path.count()}});
    }
    x["toGpu"] = tg;
    x["toNet"] = tn;
    gpus.push_back(x);
  }
  s["gpus"] = gpus;
  json nets = json::array();
  for (auto& n : sys.of(NodeType::NET)) {
    nets.push_back({{"dev", n.dev}, {"id", fmt::format("{:x}", n.id)}, {"bw", n.bw}, {"port", n.port},
                    {"gdr", n.gdrSupport}, {"localGpu", n.localGpu}, {"name", n.name}});
  }
  s["nets"] = nets;
  j["system"] = s;
  json graphs;
  for (int gi = 0; gi < search::kNumGraphs; ++gi) graphs[search::graphName(gi)] = graphJson(plan, gi);
  j["graphs"] = graphs;
  {
    const search::Graph* order[] = {&plan.graphs[search::kGraphRing], &plan.graphs[search::kGraphTree],
                                    &plan.graphs[search::kGraphCollnetDirect], &plan.graphs[search::kGraphCollnetChain],
                                    &plan.graphs[search::kGraphNvls]};
    j["graph_dump_xml"] = search::graphsToXml(sys, std::vector<const search::Graph*>(std::begin(order), std::end(order)));
  }
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
    bool avail = plan.graphAvailable[gi];
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
  j["connect"] = cj;
  json tj;
  tj["protocols"] = {"LL", "LL128", "Simple"};
  json lat, bw, mt;
  for (int coll = 0; coll < tuning::kNumColls; ++coll) {
    json la, ba;
    for (int a = 0; a < tuning::kNumAlgos; ++a) {
      la[tuning::algoName(a)] = {plan.model.latencies[coll][a][0], plan.model.latencies[coll][a][1],
                                 plan.model.latencies[coll][a][2]};
      ba[tuning::algoName(a)] = {plan.model.bandwidths[coll][a][0], plan.model.bandwidths[coll][a][1],
                                 plan.model.bandwidths[coll][a][2]};
    }
    lat[tuning::collName(coll)] = la;
    bw[tuning::collName(coll)] = ba;
  }
  for (int a = 0; a < tuning::kNumAlgos; ++a)
    mt[tuning::algoName(a)] = {plan.model.maxThreads[a][0], plan.model.maxThreads[a][1], plan.model.maxThreads[a][2]};
  tj["latencies"] = lat;
  tj["bandwidths"] = bw;
  tj["maxThreads"] = mt;
  j["tuning"] = tj;
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
  j["selection"] = sel;
  j["searchTimeMs"] = {{"rank0", plan.searchMs}};
  j["wallMs"] = plan.wallMs;
  return j.dump(pretty ? 1 : -1);
}

}  // namespace topocoll
