#include "plot.h"

#include <cmath>

#include <fmt/format.h>

namespace topocoll::cli {

double busFactor(int coll, int n) {
  if (coll == tuning::kAllReduce) return n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (coll == tuning::kAllGather || coll == tuning::kReduceScatter) return n > 1 ? (n - 1.0) / n : 1.0;
  return 1.0;
}

std::string tuningTables(const Plan& plan) {
  const auto& m = plan.model;
  std::string out;
  for (int block = 0; block < (tuning::kNumAlgos + 2) / 3; ++block) {
    std::string line = "  Algorithm   |";
    for (int ba = 0; ba < 3; ++ba) {
      int a = block * 3 + ba;
      if (a >= tuning::kNumAlgos) continue;
      line += fmt::format(" {:>14}   {:>14}   {:>14} |", "", tuning::algoName(a), "");
    }
    out += line + "\n";
    line = "  Protocol    |";
    for (int ba = 0; ba < 3; ++ba)
      for (int p = 0; p < tuning::kNumProtos; ++p) line += fmt::format(" {:>14} |", tuning::protoName(p));
    out += line + "\n";
    line = " Max NThreads |";
    for (int ba = 0; ba < 3; ++ba) {
      int a = block * 3 + ba;
      if (a >= tuning::kNumAlgos) continue;
      for (int p = 0; p < tuning::kNumProtos; ++p) line += fmt::format(" {:>14} |", m.maxThreads[a][p]);
    }
    out += line + "\n";
    for (int c = 0; c < tuning::kNumColls; ++c) {
      line = fmt::format("{:>13} |", tuning::collName(c));
      for (int ba = 0; ba < 3; ++ba) {
        int a = block * 3 + ba;
        if (a >= tuning::kNumAlgos) continue;
        for (int p = 0; p < tuning::kNumProtos; ++p)
          line += fmt::format("{:8.1f}/{:6.1f} |", m.latencies[c][a][p], m.bandwidths[c][a][p]);
      }
      out += line + "\n";
    }
  }
  return out;
}

std::string selectionText(const Plan& plan, int typeSize, int onlyColl) {
  std::string out;
  int last = -1;
  for (auto& s : selectionTable(plan, typeSize, onlyColl)) {
    if (s.coll != last) {
      out += fmt::format("\n# {} ({} ranks)\n{:>12} {:>12} {:>14} {:>7} {:>4} {:>6} {:>11} {:>8} {:>8}\n",
                         tuning::collName(s.coll), plan.nRanks, "size(B)", "count", "algo", "proto", "ch", "warps",
                         "time(us)", "algbw", "busbw");
      last = s.coll;
    }
    uint64_t count = s.nBytes / typeSize;
    if (s.coll == tuning::kAllGather || s.coll == tuning::kReduceScatter) count /= plan.nRanks;
    if (s.algo < 0) {
      out += fmt::format("{:>12} {:>12}   error {}: no algorithm/protocol enabled\n", s.nBytes, count, s.error);
      continue;
    }
    double algbw = s.timeUs > 0 ? s.nBytes / (s.timeUs * 1e3) : 0;
    out += fmt::format("{:>12} {:>12} {:>14} {:>7} {:>4} {:>6} {:>11.2f} {:>8.2f} {:>8.2f}\n", s.nBytes, count,
                       tuning::algoName(s.algo), tuning::protoName(s.proto), s.nChannels, s.nWarps, s.timeUs, algbw,
                       algbw * busFactor(s.coll, plan.nRanks));
  }
  return out;
}

std::string lineChart(const std::string& title, const std::string& subtitle, const std::vector<ChartSeries>& series) {
  const int W = 900, H = 520, L = 70, R = 230, T = 50, B = 60;
  const int minLog = 3, maxLog = 33;
  double maxBw = 1;
  for (const auto& s : series)
    for (auto& [l, v] : s.pts) maxBw = std::max(maxBw, v);
  double yMax = std::pow(10, std::ceil(std::log10(maxBw * 1.05)));
  if (yMax / 2 > maxBw * 1.05) yMax /= 2;
  auto x = [&](double l) { return L + (l - minLog) * (W - L - R) / (maxLog - minLog); };
  auto y = [&](double bw) { return H - B - bw * (H - T - B) / yMax; };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"Helvetica,Arial,sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"28\" font-size=\"16\" font-weight=\"bold\">{}</text>\n"
      "<text x=\"{}\" y=\"44\" font-size=\"11\" fill=\"#555\">{}</text>\n",
      W, H, L, title, L, subtitle);
  for (int i = 0; i <= 5; ++i) {
    double v = yMax * i / 5;
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eee\"/>\n", L, y(v), W - R, y(v));
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{:g}</text>\n", L - 6, y(v) + 4, v);
  }
  static const char* sizes[] = {"8B", "32B", "128B", "512B", "2K", "8K", "32K", "128K", "512K", "2M", "8M", "32M",
                                "128M", "512M", "2G", "8G"};
  for (int l = minLog, i = 0; l <= maxLog; l += 2, ++i) {
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#eee\"/>\n", x(l), T, x(l), H - B);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n", x(l), H - B + 16, sizes[i]);
  }
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, T, L, H - B);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">message size (bytes)</text>\n",
                     (L + W - R) / 2, H - 18);
  svg += fmt::format("<text x=\"18\" y=\"{}\" font-size=\"12\" transform=\"rotate(-90 18 {})\" text-anchor=\"middle\">busbw (GB/s)</text>\n",
                     (T + H - B) / 2, (T + H - B) / 2);
  for (size_t i = 0; i < series.size(); ++i) {
    const ChartSeries& s = series[i];
    std::string pts;
    for (auto& [l, bw] : s.pts) pts += fmt::format("{:.1f},{:.1f} ", x(l), y(bw));
    const char* dash = s.dashed ? "stroke-dasharray=\"6,4\" " : "";
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" {}points=\"{}\"/>\n", s.color, s.width,
                       dash, pts);
    int ly = T + 14 + static_cast<int>(i) * 16;
    svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"{}\" {}/>\n",
                       W - R + 15, ly - 4, W - R + 40, ly - 4, s.color, std::min(s.width, 3.0), dash);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\"{}>{}</text>\n", W - R + 46, ly,
                       s.bold ? " font-weight=\"bold\"" : "", s.name);
  }
  svg += "</svg>\n";
  return svg;
}

std::string busbwPlot(const Plan& plan, int typeSize, int coll, const std::string& title) {
  static const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                 "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"};
  std::vector<ChartSeries> series;
  double f = busFactor(coll, plan.nRanks);
  for (int a = 0; a < tuning::kNumAlgos; ++a) {
    for (int p = 0; p < tuning::kNumProtos; ++p) {
      ChartSeries s{fmt::format("{}/{}", tuning::algoName(a), tuning::protoName(p)), colors[series.size() % 14], 1.5, false,
                    false, {}};
      for (int l = 3; l <= 33; ++l) {
        uint64_t n = 1ULL << l;
        float t = tuning::algoTime(plan.model, coll, a, p, n);
        if (t > 0) s.pts.push_back({l, n / (t * 1e3) * f});
      }
      if (!s.pts.empty()) series.push_back(s);
    }
  }
  ChartSeries chosen{"NCCL's choice", "black", 4, true, true, {}};
  chosen.pts = chosenBusbw(plan, typeSize, coll);
  series.push_back(chosen);
  return lineChart(fmt::format("{} predicted busbw, {} ranks ({} nodes)", tuning::collName(coll), plan.nRanks, plan.job.nNodes),
                   title, series);
}

std::vector<std::pair<int, double>> chosenBusbw(const Plan& plan, int typeSize, int coll) {
  std::vector<std::pair<int, double>> pts;
  double f = busFactor(coll, plan.nRanks);
  for (int l = 3; l <= 33; ++l) {
    uint64_t n = 1ULL << l;
    if ((coll == tuning::kAllGather || coll == tuning::kReduceScatter) && n / plan.nRanks < static_cast<uint64_t>(typeSize))
      continue;
    auto s = plan.select(coll, n);
    if (s.algo < 0 || s.timeUs <= 0) continue;
    pts.push_back({l, n / (s.timeUs * 1e3) * f});
  }
  return pts;
}

}  // namespace topocoll::cli
