// Passes of the search loop charged without a walk (speed_walks.h).
#include "speed_walks.h"

#include "search_memo.h"

namespace topocoll::search::detail {

void PassSharing::startSearch(bool keep) {
  if (!keep) walks_.clear(), records_.clear();
  runWalks_ = walks_.size();
}

uint64_t PassSharing::group(const Graph& g, int startTime, bool treesWalkLikeRings, uint32_t intraTypes) {
  const bool alike = g.pattern == kPatternRing || g.pattern == kPatternBalancedTree || g.pattern == kPatternTree ||
                     g.pattern == kPatternSplitTree;
  const int walkClass = alike && treesWalkLikeRings ? 0 : 16 + g.pattern;
  Key128 k;
  k.fold(static_cast<uint64_t>(walkClass) << 32 | static_cast<uint32_t>(startTime));
  k.fold(static_cast<uint64_t>(StateKey::effectiveType(g.typeIntra, intraTypes) + 1));  // one node: typeInter unread
  k.fold(static_cast<uint64_t>(g.sameChannels));
  return k.a ^ k.b;
}

const PassRecord* PassSharing::samePass(const Graph& g, const Graph& save, uint64_t group, int startTime) const {
  const float s = g.bwIntra;
  const float best = static_cast<float>(save.nChannels) * save.bwIntra;
  for (const PassRecord& r : records_) {
    if (r.group != group || r.startTime != startTime) continue;
    const bool alike = r.pattern == g.pattern && r.minChannels == g.minChannels && r.maxChannels == g.maxChannels;
    if (!alike && walks_[r.walk].reachedLast) continue;
    const SpeedWalk* w = &walks_[r.walk];
    const float ratio = s / r.speed;
    // At the same speed every check is the same arithmetic: only the cross-NIC setting differs (it decides
    // nothing within one node but compareGraphs' ties, which need the saved graph's setting).
    if (r.speed != s && !(ratio >= w->lo && ratio <= w->hi)) continue;
    const float most = static_cast<float>(w->maxChannels) * s;
    const bool tiesCopyNothing = save.crossNic != g.crossNic || save.pattern != g.pattern;
    if (w->maxChannels > 0 && !(most < best || (most == best && tiesCopyNothing))) continue;
    return &r;
  }
  return nullptr;
}

int PassSharing::speedWalk(float s) {
  for (size_t i = runWalks_; i < walks_.size(); ++i)
    if (walks_[i].speed == s) return static_cast<int>(i);
  walks_.push_back(SpeedWalk{s});
  return static_cast<int>(walks_.size()) - 1;
}

}  // namespace topocoll::search::detail
