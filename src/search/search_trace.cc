// The search's attempts as `plan --explain` reports them (search_trace.h).
#include "search_trace.h"

#include <algorithm>

namespace topocoll::search::detail {

using topology::NodeType;

void SearchTracer::beginAttempt(const Graph& tmp) {
  if (!trace_) return;
  SearchTrace::Attempt& a = trace_->attempts.emplace_back();
  a.bwIntra = tmp.bwIntra;
  a.bwInter = tmp.bwInter;
  a.typeIntra = tmp.typeIntra;
  a.typeInter = tmp.typeInter;
  a.sameChannels = tmp.sameChannels;
  a.crossNic = tmp.crossNic;
  a.pattern = tmp.pattern;
  rec_ = &a;
}

void SearchTracer::endAttempt(const topology::System& sys, const Graph& best, bool timedOut) {
  if (!trace_) return;
  SearchTrace::Attempt& a = trace_->attempts.back();
  a.channels = best.nChannels;
  a.bestIntra = best.bwIntra;
  a.bestInter = best.bwInter;
  a.timedOut = timedOut;
  // In the system's order of nodes and links, so that equal counts keep a stable order.
  for (int t = 0; t < topology::kNodeTypes; ++t)
    for (int i = 0; i < sys.count(static_cast<NodeType>(t)); ++i) {
      const auto& links = sys.of(static_cast<NodeType>(t))[i].links;
      for (int l = 0; l < static_cast<int>(links.size()); ++l)
        if (auto it = full_.find(&links[l]); it != full_.end())
          a.fullLinks.push_back({{{static_cast<NodeType>(t), i}, l}, it->second});
    }
  std::stable_sort(a.fullLinks.begin(), a.fullLinks.end(),
                   [](const auto& x, const auto& y) { return x.second > y.second; });
  full_.clear();
  rec_ = nullptr;
}

}  // namespace topocoll::search::detail
