// Tracing of the search for `plan --explain`: counts only, never a decision (a traced search walks without the
// memo, whose skipped sub-searches would hide the refusals it counts).
#pragma once

#include <cstdint>
#include <unordered_map>

#include "topocoll/search/graph.h"

namespace topocoll::search::detail {

class SearchTracer {
 public:
  // A graph's search, traced into `trace` (null: not traced).
  void start(SearchTrace* trace) { trace_ = trace; }
  bool on() const { return trace_ != nullptr; }
  // Within an attempt (a pass of the search loop), where refusals are counted.
  bool recording() const { return rec_ != nullptr; }

  void note(SearchTrace::Refusal r) {
    if (rec_) rec_->refused[r]++;
  }
  void noteType(bool intra, int type) {
    if (!rec_) return;
    rec_->refused[SearchTrace::kPathType]++;
    rec_->typeRefused[intra ? 0 : 1][type]++;
  }
  // A hop refused for lack of bandwidth on `link` (only while recording).
  void noteFull(const topology::Link* link) {
    rec_->refused[SearchTrace::kLinkFull]++;
    full_[link]++;
  }

  // A pass of the search loop with the parameters of `tmp` starts.
  void beginAttempt(const Graph& tmp);
  // It ended: `best` is the best graph so far. The full links go into the attempt, most often full first.
  void endAttempt(const topology::System& sys, const Graph& best, bool timedOut);
  void globalTimeout() {
    if (trace_) trace_->globalTimeout = true;
  }

 private:
  SearchTrace* trace_ = nullptr;
  SearchTrace::Attempt* rec_ = nullptr;
  std::unordered_map<const topology::Link*, int64_t> full_;
};

}  // namespace topocoll::search::detail
