// Fourth layer: NCCL 2.30.7's cost model (src/graph/tuning.cc) and its cost-based algorithm / protocol choice
// (enqueue.cc topoGetAlgoInfo), without a tuner plugin.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "topocoll/config.h"
#include "topocoll/search/connect.h"

namespace topocoll::tuning {

enum Coll : int { kBroadcast = 0, kReduce = 1, kAllGather = 2, kReduceScatter = 3, kAllReduce = 4 };
enum Algo : int { kTree = 0, kRing = 1, kCollNetDirect = 2, kCollNetChain = 3, kNvls = 4, kNvlsTree = 5, kPat = 6 };
enum Proto : int { kLL = 0, kLL128 = 1, kSimple = 2 };
constexpr int kNumColls = 5, kNumAlgos = 7, kNumProtos = 3;

const char* collName(int c);   // "AllReduce" ...
const char* algoName(int a);   // "Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"
const char* protoName(int p);  // "LL", "LL128", "Simple"
/// Case-insensitive; accepts nccl-tests spellings ("all_reduce", "allreduce"). -1 when unknown.
int collFromString(const std::string& s);
/// Data type size in bytes ("float32"/"float", "bf16", "int8", ...); -1 when unknown.
int dataTypeSize(const std::string& s);

/// NCCL_PROTO / NCCL_ALGO per collective: 1 enabled, 0 disabled, 2 (LL128) "decide by the topology".
struct Enables {
  int proto[kNumColls][kNumProtos];
  int algo[kNumColls][kNumAlgos];
};
/// Parses NCCL_PROTO / NCCL_ALGO (NCCL's syntax); throws Error(kInvalidUsage) on what does not parse.
Enables userEnables(const Config& cfg);

/// What the model needs to know about the job besides the graphs.
struct JobInfo {
  int nRanks = 1, nNodes = 1, localRanks = 1, maxLocalRanks = 1;
  int minCompCap = 0, maxCompCap = 0;
  int cpuArch = 0, cpuVendor = 0;
  int maxTreePattern = 0;
  int nChannels = 1, nvlsChannels = 0;
  int nvlsSupport = 0, collnetEnable = 0;
  int nvsCount = 0;
};

/// The job facts after connect (comm fields NCCL's tuner reads).
JobInfo jobInfo(const search::Connect& c, int nvsCount);

/// Tuning tables (comm->latencies, comm->bandwidths, comm->maxThreads, comm->threadThresholds).
struct Model {
  JobInfo job;
  float latencies[kNumColls][kNumAlgos][kNumProtos] = {};
  float bandwidths[kNumColls][kNumAlgos][kNumProtos] = {};
  int maxThreads[kNumAlgos][kNumProtos] = {};
  int64_t threadThresholds[kNumAlgos][kNumProtos] = {};
  bool algoEnabled[kNumColls][kNumAlgos] = {};
  bool protoEnabled[kNumColls][kNumProtos] = {};
};

/// ncclTopoTuneModel. `graphs` are the aligned graphs (Connect::aligned). Throws Error(kInvalidUsage) on an
/// NCCL_ALGO / NCCL_PROTO that does not parse.
Model tuneModel(const JobInfo& job, const std::array<search::Graph, search::kNumGraphs>& graphs, const Config& cfg);

/// One cost-based decision.
struct Selection {
  int coll = 0;
  uint64_t nBytes = 0;
  int algo = -1, proto = -1;  // -1: nothing available (error set)
  float timeUs = 0;
  int nChannels = 0, nWarps = 0;
  int error = 0;  // NCCL result code when no algorithm is available (5 = ncclInvalidUsage)
};

/// The two terms of ncclTopoGetAlgoTime: latency (with NCCL's per-size corrections) and bytes / bandwidth, and the
/// bandwidth used (GB/s, after the tree correction factors); bandwidth 0 when the pair is disabled.
struct AlgoCost {
  float latencyUs = 0, transferUs = 0, bandwidth = 0;
};
AlgoCost algoCost(const Model& m, int coll, int algo, int proto, uint64_t nBytes, int numPipeOps = 1);
/// Estimated time of one (coll, algo, proto) for nBytes; -1 when disabled (ncclTopoGetAlgoTime).
float algoTime(const Model& m, int coll, int algo, int proto, uint64_t nBytes, int numPipeOps = 1);
/// Whether topoGetAlgoInfo looks at this algorithm at all for the job (CollNet, NVLS and PAT availability).
bool considered(const Model& m, int coll, int algo);

/// topoGetAlgoInfo: the fastest enabled (algo, proto), then its channels and warps. `nBytes` is what the tuner
/// sees (total buffer for AllGather/ReduceScatter). `algoForced`/`userKnobs` tell whether NCCL_ALGO/PROTO were set.
Selection select(const Model& m, int coll, uint64_t nBytes, bool userKnobs);

}  // namespace topocoll::tuning
