// Speeds whose walks come out the same (single-node searches): a pass of the search loop that would repeat the
// decisions of a pass walked before, at another speed, is charged without a walk.
//
// Within one node every amount a walk charges or checks is the speed (bwIntra) times a constant of the path
// (1, Intel's 6/5 on PHB PCI hops, the reverse links' multipliers), and the walk reads the speed nowhere else
// but in compareGraphs. So a check "link keeps at least the amount" made at speed s with the link at v (base
// value B, amount a) has, at speed s' = r x s, the link at B - r x (B - v) and the amount r x a, up to SUB_ROUND's
// rounding: the same outcome for every r in [(B + E) / (B - v + a - E), inf) when it failed, in
// [0, (B - E) / (B - v + a + E)] when it passed, E bounding the rounding of both walks (each SUB_ROUND moves a value
// by at most 0.0005 plus float rounding, and a link holds at most a few dozen charges: E = 0.25 GB/s is over ten
// times that). Each speed keeps the intersection of these ranges over every check walked at it (`SpeedWalk`), and
// the most channels any channel completion had. A later pass at s' whose parameters equal those of a pass walked
// at s (`PassRecord`), with s'/s inside s's range and no completion able to beat the saved graph at s'
// (maxChannels x s' below the saved channels x speed: compareGraphs never copies, so the walk never stops early),
// makes the same decisions at every step: it counts the same steps and leaves the same budget, and copies
// nothing. It is charged without a walk. (Sub-searches the memo skipped were walked at the same speed, since the
// memo's keys hold it: their checks are in the same range.)
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "topocoll/search/graph.h"

namespace topocoll::search::detail {

// What the checks walked at one speed allow of other speeds.
struct SpeedWalk {
  static constexpr float kCheckMargin = 0.25f;  // E above
  float speed = 0;
  float lo = 0, hi = std::numeric_limits<float>::infinity();  // the ratios s'/s with the same outcomes
  int maxChannels = 0;                                        // the most channels of any completion
  bool reachedLast = false;                                   // some walk reached a channel's last GPU

  // A check of a link whose bandwidth started at `base` and is at `v`, for `amount`: passed (`ok`) or failed.
  void noteCheck(float base, float v, float amount, bool ok) {
    if (!(amount > 0)) return;  // a give-back's walk (nothing to check)
    const float den = base - v + amount;
    if (ok) {
      if (base - kCheckMargin < hi * (den + kCheckMargin)) hi = (base - kCheckMargin) / (den + kCheckMargin);
    } else if (den <= kCheckMargin) {
      lo = std::numeric_limits<float>::infinity();
    } else if (base + kCheckMargin > lo * (den - kCheckMargin)) {
      lo = (base + kCheckMargin) / (den - kCheckMargin);
    }
  }
};

// A pass walked at some speed, as a later pass finds it.
struct PassRecord {
  uint64_t group = 0;  // the pass's parameters other than the speed
  int startTime = 0, endTime = 0;
  float speed = 0;
  long steps = 0;
  int crossNic = 0;
  int walk = 0;                                       // its SpeedWalk
  int pattern = 0, minChannels = 0, maxChannels = 0;  // read only where a channel completes
};

// The passes walked and what their speeds allow.
class PassSharing {
 public:
  // A new graph's search. The records outlive one graph's search (`keep`) while the links start where they
  // started before: a ring's passes serve the tree's.
  void startSearch(bool keep);
  // Rings and trees within one node walk alike up to a channel's last GPU (where a ring goes back to its first GPU
  // and a tree completes) when no NVSwitch orders the candidates by pattern and every GPU pair's path has one type
  // both ways (`treesWalkLikeRings`; a tree also checks the way back): a pass whose walks never reached a last GPU
  // is shared across them, from the ring's search to the tree's.
  static uint64_t group(const Graph& g, int startTime, bool treesWalkLikeRings, uint32_t intraTypes);
  // A pass walked before whose decisions this one repeats (null if none).
  const PassRecord* samePass(const Graph& g, const Graph& save, uint64_t group, int startTime) const;
  // The index of speed s's SpeedWalk in this graph's search (earlier searches' walks stay with their records).
  int speedWalk(float s);
  SpeedWalk& walk(int index) { return walks_[index]; }
  void record(const PassRecord& r) { records_.push_back(r); }

 private:
  std::vector<SpeedWalk> walks_;
  std::vector<PassRecord> records_;
  size_t runWalks_ = 0;  // the first SpeedWalk of this graph's search
};

}  // namespace topocoll::search::detail
