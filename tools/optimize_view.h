// `topocoll plan --optimize`: NCCL's graphs beside the optimised ones and the topology's bound, as text or JSON,
// and the graph XML a user gives NCCL (NCCL_GRAPH_FILE).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "topocoll/plan.h"
#include "topocoll/search/optimize.h"

namespace topocoll::cli {

/// Graph XML of a plan's graphs in NCCL's dump order (ring, tree, CollNet direct, CollNet chain, NVLS). Without
/// `ranks` the file names GPUs by dev only, so that every node of a job can load it.
std::string graphsXml(const Plan& plan, bool ranks);

/// Per graph: NCCL's channels x speed, the optimised ones, the upper bound and the tightest cut, then the
/// optimised channels and what the change buys in predicted AllReduce / AllGather bus bandwidth.
std::string optimizeText(const Plan& nccl, const Plan& optimized, const search::OptimizeResult& r);

/// The same as a JSON object (graph name -> totals, bound, proof, time).
nlohmann::ordered_json optimizeJson(const search::OptimizeResult& r);

}  // namespace topocoll::cli
