// `topocoll tune` views: NCCL's TUNING tables, the selection table and the busbw plot (SVG).
#pragma once

#include <string>
#include <utility>
#include <vector>

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
/// Predicted busbw of NCCL's choice at each power-of-two size 8 B .. 8 GiB: (log2 size, GB/s).
std::vector<std::pair<int, double>> chosenBusbw(const Plan& plan, int typeSize, int coll);

/// One curve of a busbw chart: points (log2 size, GB/s).
struct ChartSeries {
  std::string name;
  std::string color;
  double width = 1.5;
  bool dashed = false, bold = false;
  std::vector<std::pair<int, double>> pts;
};
/// An SVG chart of busbw versus message size (log2 x axis, 8 B .. 8 GiB).
std::string lineChart(const std::string& title, const std::string& subtitle, const std::vector<ChartSeries>& series);

}  // namespace topocoll::cli
