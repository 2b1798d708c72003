// `topocoll plan --explain`: for each graph, what NCCL's search tried at each speed of its array and what refused
// the faster ones (a full link or NIC, a rule: path type / PXN / GDR distance, crossNic, a step budget), the cut that
// bounds it and whether a better graph exists; for the job, why NCCL's cost model picks each algorithm and protocol.
#pragma once

#include <string>

#include "topocoll/config.h"
#include "topocoll/plan.h"

namespace topocoll::cli {

std::string explainText(const Plan& plan, const Config& cfg);

}  // namespace topocoll::cli
