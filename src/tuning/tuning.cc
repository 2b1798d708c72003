// The cost model and selection. Follows NCCL 2.30.7 src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime)
// and src/enqueue.cc (topoGetAlgoInfo) (Apache-2.0). The constants are NCCL's default tuner constants
// (ncclTunerConstantsDefaults) and the model's inline factors, kept in named tables with their source below.
#include "topocoll/tuning/tuning.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <limits>
#include <sstream>

#include "topocoll/status.h"

namespace topocoll::tuning {

using search::Graph;
using topology::PathType;

namespace {

// Source: NCCL 2.30.7 src/graph/tuning.cc, ncclTunerConstantsDefaults.
constexpr float kBaseLat[kNumAlgos][kNumProtos] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}, {0, 0, 0}, {0, 0, 0},
                                                  {0, 0, 0},        {0, 0, 0},        {8.0, 8.0, 8.0}};
constexpr int kHwNvlink = 0, kHwPci = 1, kHwNet = 2;
constexpr float kHwLat[3][kNumAlgos][kNumProtos] = {
    {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}, {0, 0, 3.7}, {0, 0, 2.8}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4.0}},
    {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}, {0, 0, 3.7}, {0, 0, 2.8}, {0, 0, 0}, {0, 0, 0}, {0, 0, 4.0}},
    {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 31}, {0, 0, 30}, {0, 0, 18}, {0, 0, 20.9}, {0, 0, 14}}};
constexpr double kLlMaxBws[4][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {2 * 141.0, 2 * 45.0, 2 * 35.0}};
constexpr double kPerChMaxRingLL128Bws[4][3] = {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 36.7}, {40.0, 40.0, 40.0}};
constexpr double kPerChMaxTreeLL128Bws[4][3] = {{20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}};
constexpr double kPerChMaxTreeBws[4][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}};
constexpr double kPerChMaxNvlsTreeBws[4][3] = {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {0.0, 57.7, 45.5}, {0.0, 96.0, 80.0}};
constexpr float kNvlsEfficiency[4] = {0.0f, 0.0f, 0.85f, 0.74f};
// Tree correction factors by log2(size/64), 64 B to 256 MB.
constexpr float kTreeCorrection[kNumProtos][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};

// Thread counts (src/include/device.h: WARP_SIZE, NCCL_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS, NCCL_LL_MAX_NTHREADS,
// NCCL_LL128_MAX_NTHREADS) and arities (NCCL_MAX_NVLS_ARITY, NCCL_MAX_DIRECT_ARITY).
constexpr int kWarpSize = 32, kMaxNthreads = 640, kSimpleMaxNthreads = 512, kLLMaxNthreads = 512,
              kLL128MaxNthreads = 640;
constexpr int kMaxNvlsArity = 32, kMaxDirectArity = 7;
constexpr int kMaxDevWorkBatchColls = 1;  // numPipeOps is 1 for single operations

const char* kCollNames[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};
const char* kAlgoNames[] = {"Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"};
const char* kProtoNames[] = {"LL", "LL128", "Simple"};

int log2i(int64_t n) {
  if (n <= 0) return -1;
  int l = 0;
  while (n >>= 1) ++l;
  return l;
}

int getNthreads(int env, int mn, int mx, int def) {
  if (env <= 0) return def;
  if (env % kWarpSize != 0) return mx;
  if (env > mx) return mx;
  if (env < mn) return mn;
  return env;
}

bool ieq(const std::string& a, const char* b) {
  return a.size() == std::strlen(b) && strncasecmp(a.c_str(), b, a.size()) == 0;
}

std::vector<std::string> splitBy(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

// NCCL's parseList: "elems[;prefix:elems]..." where elems may start with '^' (exclusion).
void parseList(const char* knob, const std::string& str, const char* const* elems, int nelems, int* list /*[5][nelems]*/) {
  auto tokens = splitBy(str, ';');
  bool first = true;
  for (auto& tok : tokens) {
    if (tok.empty()) {
      first = false;
      continue;
    }
    std::string prefix, elemList;
    auto colon = tok.find(':');
    if (colon == std::string::npos) {
      if (!first)
        fail(StatusCode::kInvalidUsage, "{}={}: all entries except the first must have a prefix (\"{}\")", knob, str, tok);
      elemList = tok;
    } else {
      prefix = tok.substr(0, colon);
      elemList = tok.substr(colon + 1);
    }
    first = false;
    bool set = true;
    if (!elemList.empty() && elemList[0] == '^') {
      set = false;
      elemList.erase(0, 1);
    }
    bool foundPrefix = false;
    for (int p = 0; p < kNumColls; ++p) {
      if (!prefix.empty() && !ieq(prefix, kCollNames[p])) continue;
      foundPrefix = true;
      for (int e = 0; e < nelems; ++e) list[p * nelems + e] = set ? 0 : 1;
      for (auto& el : splitBy(elemList, ',')) {
        if (el.empty()) continue;
        int e = 0;
        while (e < nelems && !ieq(el, elems[e])) ++e;
        if (e == nelems) fail(StatusCode::kInvalidUsage, "{}={}: unrecognized element \"{}\"", knob, str, el);
        list[p * nelems + e] = set ? 1 : 0;
      }
    }
    if (!foundPrefix) fail(StatusCode::kInvalidUsage, "{}={}: unrecognized collective \"{}\"", knob, str, prefix);
  }
}

}  // namespace

const char* collName(int c) { return kCollNames[c]; }
const char* algoName(int a) { return kAlgoNames[a]; }
const char* protoName(int p) { return kProtoNames[p]; }

int collFromString(const std::string& s) {
  std::string t;
  for (char c : s)
    if (c != '_' && c != '-') t += static_cast<char>(tolower(static_cast<unsigned char>(c)));
  for (int c = 0; c < kNumColls; ++c) {
    std::string n = kCollNames[c];
    for (auto& ch : n) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
    if (t == n) return c;
  }
  return -1;
}

int dataTypeSize(const std::string& s) {
  static const std::pair<const char*, int> types[] = {
      {"int8", 1},     {"char", 1},     {"uint8", 1},   {"int32", 4},   {"int", 4},      {"uint32", 4},
      {"int64", 8},    {"uint64", 8},   {"float16", 2}, {"half", 2},    {"fp16", 2},     {"float32", 4},
      {"float", 4},    {"fp32", 4},     {"float64", 8}, {"double", 8},  {"bfloat16", 2}, {"bf16", 2},
      {"float8e4m3", 1}, {"fp8e4m3", 1}, {"float8e5m2", 1}, {"fp8e5m2", 1}};
  for (auto& [n, sz] : types)
    if (ieq(s, n)) return sz;
  return -1;
}

Enables userEnables(const Config& cfg) {
  int protoList[kNumColls * kNumProtos], algoList[kNumColls * kNumAlgos];
  for (int f = 0; f < kNumColls; ++f) {
    for (int p = 0; p < kNumProtos; ++p) protoList[f * kNumProtos + p] = p == kLL128 ? 2 : 1;
    for (int a = 0; a < kNumAlgos; ++a) algoList[f * kNumAlgos + a] = 1;
  }
  if (!cfg.proto.empty()) parseList("NCCL_PROTO", cfg.proto, kProtoNames, kNumProtos, protoList);
  if (!cfg.algo.empty()) parseList("NCCL_ALGO", cfg.algo, kAlgoNames, kNumAlgos, algoList);
  Enables e;
  for (int f = 0; f < kNumColls; ++f) {
    for (int p = 0; p < kNumProtos; ++p) e.proto[f][p] = protoList[f * kNumProtos + p];
    for (int a = 0; a < kNumAlgos; ++a) e.algo[f][a] = algoList[f * kNumAlgos + a];
  }
  return e;
}

JobInfo jobInfo(const search::Connect& c, int nvsCount) {
  JobInfo ji;
  ji.nRanks = c.nRanks;
  ji.nNodes = c.nNodes;
  ji.localRanks = c.localRanks;
  ji.maxLocalRanks = c.maxLocalRanks;
  ji.minCompCap = c.minCompCap;
  ji.maxCompCap = c.maxCompCap;
  ji.cpuArch = c.cpuArch;
  ji.cpuVendor = c.cpuVendor;
  ji.maxTreePattern = c.maxTreePattern;
  ji.nChannels = c.nChannels;
  ji.nvlsChannels = c.nvlsChannels;
  ji.nvlsSupport = c.nvlsSupport;
  ji.collnetEnable = c.collnetEnable;
  ji.nvsCount = nvsCount;
  return ji;
}

namespace {

// ncclTopoTuneModel's inline refinements of the bus bandwidth (NCCL 2.30.7 src/graph/tuning.cc, "Various model
// refinements") and of the latencies, named.
constexpr double kRingLLEfficiency = 0.5;         // LL moves 8 useful bytes per 16-byte line
constexpr double kRingLL128Efficiency = 0.92;     // "120.0/128.0": LL128 lines carry 120 useful bytes of 128
constexpr double kTreeAllReduceEfficiency = 0.92;
constexpr double kTreeLLEfficiency = 1.0 / 3.8;
constexpr double kTreeLL128EfficiencyOneNode = 7.0 / 9.0, kTreeLL128EfficiencyNodes = 120.0 / 128.0;
constexpr double kSimpleTreePatternPenalty = 0.85;  // when some node's tree is NCCL_TOPO_PATTERN_TREE
constexpr double kPatEfficiency = 0.75;
constexpr float kCollNetDirectInterEfficiency = 0.9f;  // AllGather/ReduceScatter through the network
constexpr double kCollNetDirectSm90Efficiency = 0.85;
constexpr double kTreeAlgoBwRatio = 0.5;             // bus to algorithm bandwidth of trees and CollNet
constexpr double kCollNetArityLatency = 0.4;         // us per rank: "arity serialization latency"
constexpr double kPatLogLatencyDivider = 3.5, kPatLinearLatency = 2.8;  // us
constexpr float kNetOverheadAmd = 2.0f, kNetOverheadDefault = 1.0f;    // us per network step (getNetOverhead)
constexpr int kNetOverheadSimpleFactor = 3;
// ncclTopoGetAlgoTime: "Plateau effect of ring" for Simple AllReduce across nodes.
constexpr float kRingPlateauPreAmpere = 1.9f, kRingPlateau = 1.4f;
constexpr uint64_t kRingPlateauBytesPerRankChannel = 64;

// The tables that depend on the job's shape (index by architecture and by 1, 2 or more nodes).
struct Caps {
  int ccIdx = 0, index1 = 0, index2 = 0;
  double llMaxBw = 0, perChMaxTreeBw = 0, perChMaxRingLL128Bw = 0, perChMaxTreeLL128Bw = 0, perChMaxNvlsTreeBw = 0;
};
Caps capsFor(const JobInfo& job) {
  Caps c;
  const int cc = job.minCompCap;
  c.ccIdx = cc >= 100 ? 3 : cc >= 90 ? 2 : cc >= 80 ? 1 : 0;
  c.index2 = job.nNodes <= 2 ? job.nNodes - 1 : 2;
  c.index1 = job.nNodes == 1 ? c.ccIdx
             : (job.cpuVendor == topology::kCpuVendorAmd || job.cpuVendor == topology::kCpuVendorMixed) ? 1
                                                                                                      : 0;
  c.llMaxBw = kLlMaxBws[c.index1][c.index2];
  c.perChMaxTreeBw = kPerChMaxTreeBws[c.ccIdx][c.index2];
  c.perChMaxRingLL128Bw = kPerChMaxRingLL128Bws[c.ccIdx][c.index2];
  c.perChMaxTreeLL128Bw = kPerChMaxTreeLL128Bws[c.ccIdx][c.index2];
  c.perChMaxNvlsTreeBw = kPerChMaxNvlsTreeBws[c.ccIdx][c.index2];
  return c;
}

// comm->maxThreads and comm->threadThresholds (ncclTopoTuneModel's first lines, NCCL_THREAD_THRESHOLDS).
void setThreads(Model& m, const Graph& ring, const Config& cfg) {
  const int simpleDefault = ring.bwIntra * ring.nChannels <= topology::kPciBw ? 256 : kSimpleMaxNthreads;
  m.maxThreads[kRing][kSimple] = getNthreads(cfg.nthreads, 2 * kWarpSize, kSimpleMaxNthreads, simpleDefault);
  m.maxThreads[kTree][kSimple] = getNthreads(cfg.nthreads, 2 * kWarpSize, kSimpleMaxNthreads, kSimpleMaxNthreads);
  m.maxThreads[kCollNetDirect][kSimple] = m.maxThreads[kCollNetChain][kSimple] = m.maxThreads[kNvls][kSimple] =
      m.maxThreads[kNvlsTree][kSimple] = kMaxNthreads;
  m.maxThreads[kRing][kLL] = m.maxThreads[kTree][kLL] =
      getNthreads(cfg.nthreads, 2 * kWarpSize, kLLMaxNthreads, kLLMaxNthreads);
  m.maxThreads[kRing][kLL128] = m.maxThreads[kTree][kLL128] =
      getNthreads(cfg.ll128Nthreads, kLL128MaxNthreads / 4, kLL128MaxNthreads, kLL128MaxNthreads);

  // NCCL_LL_THREAD_THRESHOLD, NCCL_LL128_THREAD_THRESHOLD, NCCL_SIMPLE_THREAD_THRESHOLD (src/include/device.h).
  for (int a = 0; a < kNumAlgos; ++a) {
    m.threadThresholds[a][kLL] = 8;
    m.threadThresholds[a][kLL128] = 8;
    m.threadThresholds[a][kSimple] = 64;
  }
  m.threadThresholds[kRing][kLL] *= m.job.nRanks;
  m.threadThresholds[kCollNetDirect][kSimple] = 512;
  m.threadThresholds[kCollNetChain][kSimple] = 512;
  if (!cfg.threadThresholds.empty()) {
    long long t[6] = {-2, -2, -2, -2, -2, -2};
    std::istringstream in(cfg.threadThresholds);
    for (auto& v : t)
      if (!(in >> v)) break;
    for (int a = 0; a < 2; ++a)
      for (int p = 0; p < kNumProtos; ++p)
        if (t[a * 3 + p] >= 0) m.threadThresholds[a][p] = t[a * 3 + p];
  }
}


// Which (collective, algorithm, protocol) ncclTopoTuneModel models at all.
bool modelled(int coll, int a, int p, bool patEnable) {
  if ((coll == kBroadcast || coll == kReduce) && a != kRing) return false;
  if ((coll == kReduceScatter || coll == kAllGather) && a != kPat && a != kRing && a != kNvls && a != kCollNetDirect)
    return false;
  if (coll == kAllReduce && a == kPat) return false;
  if ((a == kNvls || a == kNvlsTree) && p != kSimple) return false;
  if ((coll == kReduceScatter || coll == kAllGather) && a == kPat && (p != kSimple || !patEnable)) return false;
  return true;
}

// The algorithm bandwidth (GB/s) of one (collective, algorithm, protocol): the graph's channels times their
// bandwidth, refined per algorithm and protocol, converted from bus to algorithm bandwidth. -1: not modelled
// (NVLS with fewer than two channels).
float busToAlgoBw(const JobInfo& job, const Caps& caps, int coll, int a, int p, const Graph& g) {
  const int nNodes = job.nNodes, nRanks = job.nRanks;
  const float ppn = static_cast<float>(nRanks) / nNodes;
  const int nsteps = coll == kAllReduce ? 2 * (nRanks - 1) : (coll == kReduceScatter || coll == kAllGather) ? nRanks - 1 : nRanks;
  const bool collnet = a == kCollNetDirect || a == kCollNetChain;
  float bw = nNodes <= 2 || collnet ? g.bwIntra : g.bwInter;
  if (a == kNvlsTree || a == kNvls) {
    if (g.nChannels < 2) return -1;
    // NVLS bus bandwidth per channel; AllReduce pipelines two operations.
    float intraBw = g.bwIntra * kNvlsEfficiency[caps.ccIdx] * (g.nChannels - 1) / g.nChannels;
    if (coll == kAllReduce) intraBw *= 2.0f;
    else intraBw *= (ppn - 1) / ppn;
    const float interBw = g.bwInter * ((nNodes <= 2 && a == kNvlsTree) ? 2 : 1);
    bw = std::min({intraBw, interBw,
                   a == kNvlsTree ? static_cast<float>(caps.perChMaxNvlsTreeBw) : std::numeric_limits<float>::max()});
  }
  float busBw = g.nChannels * bw;
  if (a == kRing && p == kLL) busBw = std::min(caps.llMaxBw, busBw * kRingLLEfficiency);
  if (a == kRing && p == kLL128) busBw = std::min(busBw * kRingLL128Efficiency, g.nChannels * caps.perChMaxRingLL128Bw);
  if (a == kTree && coll == kAllReduce) busBw = std::min(busBw * kTreeAllReduceEfficiency, g.nChannels * caps.perChMaxTreeBw);
  if (a == kTree && p == kLL) busBw = std::min(busBw * kTreeLLEfficiency, caps.llMaxBw);
  if (a == kTree && p == kLL128)
    busBw = std::min(busBw * (nNodes == 1 ? kTreeLL128EfficiencyOneNode : kTreeLL128EfficiencyNodes),
                     g.nChannels * caps.perChMaxTreeLL128Bw);
  if (a == kTree && job.maxTreePattern == search::kPatternTree) busBw *= kSimpleTreePatternPenalty;
  if (a == kPat) busBw *= kPatEfficiency;
  if (collnet && p != kSimple) busBw = 0;
  if (a == kCollNetDirect && p == kSimple) {
    if (coll == kAllGather || coll == kReduceScatter) {
      busBw = ppn * std::min(g.bwIntra, g.bwInter * kCollNetDirectInterEfficiency);
    } else {
      // CollNet Direct needs a local NIC per GPU for full speed: divide by (half) the GPU/NIC ratio.
      float factor = ppn / (1.0 * g.nChannels);
      factor -= (factor - 1) / 2;
      busBw /= factor;
      if (job.minCompCap >= 90) busBw *= kCollNetDirectSm90Efficiency;
    }
  }
  // No CollNet plugin with iallgather/ireducescatter is modelled: NCCL then zeroes these across nodes.
  if ((a == kNvls || a == kCollNetDirect) && p == kSimple && (coll == kAllGather || coll == kReduceScatter) &&
      nNodes > 1)
    busBw = 0.0f;
  if (!(a != kRing && (coll == kAllGather || coll == kReduceScatter)))
    busBw *= (a == kRing || a == kNvls || a == kNvlsTree) ? static_cast<float>((1.0 * nRanks) / nsteps)
                                                          : static_cast<float>(kTreeAlgoBwRatio);
  return busBw;
}

// The latency (us) of one (collective, algorithm, protocol): base latency plus hops inside and across nodes.
float latency(const JobInfo& job, const float (&hwLat)[3][kNumAlgos][kNumProtos], int coll, int a, int p,
              const Graph& g, const Config& cfg) {
  const int nNodes = job.nNodes, nRanks = job.nRanks;
  const float ppn = static_cast<float>(nRanks) / nNodes;
  const int nsteps = coll == kAllReduce ? 2 * (nRanks - 1) : (coll == kReduceScatter || coll == kAllGather) ? nRanks - 1 : nRanks;
  const int intraHw = g.typeIntra == static_cast<int>(PathType::NVL) ? kHwNvlink : kHwPci;
  const int hw = nNodes == 1 ? intraHw : kHwNet;
  float lat = kBaseLat[a][p];
  float intraLat = hwLat[intraHw][a][p];
  // With one rank per node latencies are fully exposed: the tree's network latency.
  float interLat = ppn == 1 ? hwLat[kHwNet][kTree][p] : hwLat[kHwNet][a][p];
  interLat += g.latencyInter;
  if (p == kSimple) interLat += g.latencyInter;  // the flush
  if (a == kRing) {
    float step = hwLat[hw][a][p];
    if (coll == kReduce || coll == kBroadcast) {
      if (g.sameChannels) return lat + step;
      if (p == kSimple) step = hwLat[hw][kTree][p];  // some chunk latency, until chunks are modelled
      return lat + nsteps * step;
    }
    // Inter-node rings still launch nsteps network operations (getNetOverhead).
    float netOverhead = 0.0f;
    if (nNodes > 1) {
      if (cfg.netOverhead != -2) netOverhead = static_cast<float>(cfg.netOverhead * .001);
      else if (job.cpuArch == topology::kCpuArchX86 && job.cpuVendor == topology::kCpuVendorAmd) netOverhead = kNetOverheadAmd;
      else netOverhead = kNetOverheadDefault;
      if (p == kSimple) netOverhead *= kNetOverheadSimpleFactor;
    }
    intraLat = std::max(intraLat, netOverhead);
    const int nInterSteps = nNodes == 1 ? 0 : coll == kAllReduce ? 2 * (nNodes - 1) : nNodes - 1;
    return lat + (nsteps - nInterSteps) * intraLat + nInterSteps * interLat;
  }
  if (a == kTree) {
    if (coll == kAllReduce) lat += 2 * ((nRanks / nNodes - 1) * intraLat + log2i(nNodes) * interLat);
    return lat;
  }
  if (a == kCollNetDirect)
    return lat + 2 * (std::min(1, nRanks / nNodes - 1) * intraLat + (nRanks / nNodes - 1) * kCollNetArityLatency) +
           interLat;
  if (a == kCollNetChain) return lat + 2 * (nRanks / nNodes - 1) * intraLat + interLat;
  if (a == kNvls) return intraLat + (nNodes > 1 ? interLat : 0.0f);
  if (a == kNvlsTree) return lat + intraLat + 2 * log2i(nNodes) * interLat;
  if (a == kPat && (coll == kAllGather || coll == kReduceScatter))
    return lat + log2i(nNodes) * (interLat / kPatLogLatencyDivider) + nRanks * kPatLinearLatency;
  return lat;
}

// LL128 by default: Hopper+ up to P2C/PXN network paths (NCCL_LL128_C2C), else up to PXB; NVLink (NVB) inside
// the node; one architecture or Hopper+; not before Volta.
bool ll128ByDefault(const JobInfo& job, const Graph& g, const Config& cfg) {
  bool on = cfg.ll128C2c && job.minCompCap >= 90 ? g.typeInter <= static_cast<int>(PathType::PXN)
                                                  : g.typeInter <= static_cast<int>(PathType::PXB);
  on &= g.typeIntra <= static_cast<int>(PathType::NVB);
  on &= job.minCompCap == job.maxCompCap || job.minCompCap >= 90;
  on &= !(job.minCompCap < 70);
  return on;
}

}  // namespace

Model tuneModel(const JobInfo& job, const std::array<Graph, search::kNumGraphs>& sg, const Config& cfg) {
  Model m;
  m.job = job;
  // NCCL's algorithm -> graph mapping: {tree, ring, collnetDirect, collnetChain, nvls, nvls, tree}.
  const Graph* graphs[kNumAlgos] = {&sg[search::kGraphTree], &sg[search::kGraphRing],
                                    &sg[search::kGraphCollnetDirect], &sg[search::kGraphCollnetChain],
                                    &sg[search::kGraphNvls], &sg[search::kGraphNvls], &sg[search::kGraphTree]};
  setThreads(m, *graphs[kRing], cfg);
  // Enable flags are computed even for one rank so that knob errors surface.
  const Enables en = userEnables(cfg);
  for (int c = 0; c < kNumColls; ++c) {
    for (int p = 0; p < kNumProtos; ++p) m.protoEnabled[c][p] = en.proto[c][p] != 0;
    for (int a = 0; a < kNumAlgos; ++a) m.algoEnabled[c][a] = en.algo[c][a] != 0;
  }
  if (job.nRanks <= 1) return m;

  const Caps caps = capsFor(job);
  float hwLat[3][kNumAlgos][kNumProtos];
  std::memcpy(hwLat, kHwLat, sizeof(hwLat));
  if (job.cpuArch == topology::kCpuArchPower) hwLat[kHwPci][kTree][kSimple] = hwLat[kHwPci][kRing][kSimple];
  // ncclPatEnable: CUDA atomics (sm60+), and by default only with one GPU per node.
  const bool patEnable = job.minCompCap >= 60 && (cfg.patEnable != 2 ? cfg.patEnable != 0 : job.nNodes == job.nRanks);
  for (int coll = 0; coll < kNumColls; ++coll) {
    for (int a = 0; a < kNumAlgos; ++a) {
      for (int p = 0; p < kNumProtos; ++p) {
        if (!modelled(coll, a, p, patEnable)) continue;
        const float bw = busToAlgoBw(job, caps, coll, a, p, *graphs[a]);
        if (bw < 0) continue;
        m.bandwidths[coll][a][p] = bw;
        m.latencies[coll][a][p] = latency(job, hwLat, coll, a, p, *graphs[a], cfg);
      }
    }
  }

  for (int c = 0; c < kNumColls; ++c) {
    for (int a = 0; a < kNumAlgos; ++a) {
      // NVLS Tree needs several nodes; CollNet (and NVLS across nodes) needs CollNet; CollNet Direct an NVSwitch.
      if ((job.nNodes == 1 && a == kNvlsTree) ||
          (job.collnetEnable == 0 && (a == kCollNetDirect || a == kCollNetChain || (a == kNvls && job.nNodes > 1))) ||
          (job.nvsCount == 0 && a == kCollNetDirect))
        m.algoEnabled[c][a] = false;
      for (int p = 0; p < kNumProtos; ++p) {
        const int pEnable = en.proto[c][p] == 2 && p == kLL128 ? ll128ByDefault(job, *graphs[a], cfg) : en.proto[c][p];
        if (pEnable == 0 || !m.algoEnabled[c][a]) m.bandwidths[c][a][p] = 0;
      }
    }
  }
  return m;
}

AlgoCost algoCost(const Model& m, int coll, int algo, int proto, uint64_t nBytes, int numPipeOps) {
  AlgoCost c;
  float bw = m.bandwidths[coll][algo][proto];
  float lat = m.latencies[coll][algo][proto];
  if (bw == 0) return c;
  int logSize = log2i(static_cast<int64_t>(nBytes >> 6));
  if (algo == kTree && coll == kAllReduce && logSize >= 0 && logSize < 23) bw *= kTreeCorrection[proto][logSize];
  if (algo == kNvlsTree && coll == kAllReduce && logSize >= 0 && logSize < 24 && m.job.minCompCap >= 100 &&
      m.job.cpuArch == topology::kCpuArchX86)
    bw *= kTreeCorrection[proto][logSize];
  if (algo == kRing && proto == kSimple && m.job.nNodes > 1 && coll == kAllReduce &&
      nBytes / (static_cast<uint64_t>(m.job.nChannels) * m.job.nRanks) >= kRingPlateauBytesPerRankChannel)
    lat *= m.job.minCompCap < 80 ? kRingPlateauPreAmpere : kRingPlateau;
  int latCount = algo == kRing ? numPipeOps : (numPipeOps + kMaxDevWorkBatchColls - 1) / kMaxDevWorkBatchColls;
  c.latencyUs = lat * latCount;
  c.bandwidth = bw;
  c.transferUs = static_cast<float>(nBytes) / (1000 * bw);
  return c;
}

float algoTime(const Model& m, int coll, int algo, int proto, uint64_t nBytes, int numPipeOps) {
  AlgoCost c = algoCost(m, coll, algo, proto, nBytes, numPipeOps);
  return c.bandwidth == 0 ? -1.0f : c.latencyUs + c.transferUs;
}

bool considered(const Model& m, int coll, int algo) {
  const JobInfo& j = m.job;
  if (j.nRanks == 1) return algo == kRing;
  if ((algo == kCollNetDirect || algo == kCollNetChain) && j.collnetEnable != 1) return false;
  if ((algo == kCollNetDirect || algo == kCollNetChain) && j.maxLocalRanks > kMaxDirectArity + 1) return false;
  if ((algo == kNvls || algo == kNvlsTree) && (!j.nvlsSupport || (coll != kAllReduce && j.localRanks > kMaxNvlsArity)))
    return false;
  if (algo == kNvls && j.collnetEnable != 1 && j.nNodes > 1) return false;
  return true;
}

Selection select(const Model& m, int coll, uint64_t nBytes, bool userKnobs) {
  Selection s;
  s.coll = coll;
  s.nBytes = nBytes;
  const JobInfo& j = m.job;
  float table[kNumAlgos][kNumProtos];
  for (auto& row : table)
    for (auto& v : row) v = -1.0f;
  bool ignore[kNumAlgos][kNumProtos] = {};
  for (auto& row : ignore)
    for (auto& v : row) v = true;
  if (j.nRanks == 1) {
    table[kRing][kSimple] = 0;
    ignore[kRing][kSimple] = false;
  } else {
    for (int a = 0; a < kNumAlgos; ++a) {
      if (!considered(m, coll, a)) continue;
      for (int p = 0; p < kNumProtos; ++p) {
        table[a][p] = algoTime(m, coll, a, p, nBytes);
        ignore[a][p] = false;
      }
    }
  }
  float minTime = FLT_MAX;
  for (int a = 0; a < kNumAlgos; ++a)
    for (int p = 0; p < kNumProtos; ++p) {
      if (ignore[a][p]) continue;
      if (table[a][p] >= 0.0f && table[a][p] < minTime) {
        s.algo = a;
        s.proto = p;
        minTime = table[a][p];
      }
    }
  if (s.algo < 0) {
    s.error = userKnobs ? 5 : 3;  // ncclInvalidUsage, else ncclInternalError
    return s;
  }
  s.timeUs = minTime;
  int nc = j.nChannels;
  int nt = m.maxThreads[s.algo][s.proto];
  int64_t threshold = m.threadThresholds[s.algo][s.proto];
  if (s.algo == kCollNetDirect) {
    int ncSwitch = 16;
    bool flag = true;
    const int nHeads = 1;
    while (ncSwitch >= 1 && flag) {
      while ((flag = nBytes < static_cast<uint64_t>(nc) * nt * nHeads * threshold) && nc > ncSwitch) {
        if (nc == ncSwitch + ncSwitch / 2) threshold /= 2;
        nc--;
      }
      ncSwitch /= 2;
    }
  } else if (s.algo == kNvls || s.algo == kNvlsTree) {
    nc = (j.nNodes > 1 && s.algo == kNvls) ? std::min(j.nvlsChannels, j.nChannels) : j.nvlsChannels;
  } else {
    while (nBytes < static_cast<uint64_t>(nc) * nt * threshold) {
      if (nc >= 2) nc--;
      else break;
    }
  }
  if (s.algo != kNvls && s.algo != kNvlsTree && s.algo != kCollNetDirect) {
    while (nBytes < static_cast<uint64_t>(nc) * nt * threshold) {
      if (nt % 128 == 0) nt /= 2;
      else break;
    }
  }
  if (s.proto == kSimple) {
    if (s.algo == kRing) nt += kWarpSize;
    if (s.algo == kTree) nt += 4 * kWarpSize;
  }
  nt = nt / kWarpSize < 3 ? 3 * kWarpSize : nt;
  if (s.algo == kTree || s.algo == kPat) nt = kMaxNthreads;
  s.nChannels = nc;
  s.nWarps = nt / kWarpSize;
  return s;
}

}  // namespace topocoll::tuning
