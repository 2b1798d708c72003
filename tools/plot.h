// `topocoll tune` views: NCCL's TUNING tables, the selection table and the busbw plot (SVG).
#pragma once

#include <string>

#include "topocoll/plan.h"

namespace topocoll::cli {

/// The latency/bandwidth tables in the layout NCCL prints under NCCL_DEBUG_SUBSYS=TUNING.
std::string tuningTables(const Plan& plan);
/// size, count, algorithm, protocol, channels, warps, time, algbw, busbw (nccl-tests conventions).
std::string selectionText(const Plan& plan, int typeSize, int onlyColl);
/// Predicted busbw versus size for every enabled algorithm/protocol, the chosen one highlighted.
std::string busbwPlot(const Plan& plan, int typeSize, int coll, const std::string& title);
/// nccl-tests' bus bandwidth factor for a collective on n ranks.
double busFactor(int coll, int nRanks);

}  // namespace topocoll::cli
