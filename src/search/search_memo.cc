// The memo of sub-searches: its keys and its table (search_memo.h).
#include "search_memo.h"

namespace topocoll::search::detail {

StateKey::StateKey(int ngpus) : ngpus(ngpus), priv(ngpus + 1), gpuMix(ngpus) {
  for (int g = 0; g < ngpus; ++g) gpuMix[g] = Key128{mixA(static_cast<uint64_t>(g)), mixB(static_cast<uint64_t>(g))};
}

void StepMemo::insert(const Key128& k, Cost cost) {
  if (2 * (count_ + 1) > slots_.size()) grow();
  for (size_t i = k.a & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.gen != gen_) {
      s = Slot{k.a, k.b, cost, gen_};
      ++count_;
      return;
    }
    if (s.a == k.a && s.b == k.b) return;
  }
}

void StepMemo::clear() {
  count_ = 0;
  if (++gen_ == 0) {  // wrapped: old generations could read as current
    std::fill(slots_.begin(), slots_.end(), Slot{});
    gen_ = 1;
  }
}

void StepMemo::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 256 : old.size() * 2, Slot{});
  mask_ = slots_.size() - 1;
  count_ = 0;
  for (const Slot& s : old)
    if (s.gen == gen_) insert(Key128{s.a, s.b}, s.cost);
}

void SubSearchMemo::startSearch() {
  table_.clear();
  gates_.fill(Gate{});
  lookups_ = saved_ = 0;
  passes_ = 0;
}

void SubSearchMemo::startPass(int ngpus) { std::fill_n(gates_.begin(), std::min(ngpus + 1, kGates), Gate{}); }

bool SubSearchMemo::pays(int ngpus) {
  const long ratio = ngpus <= kSmallNode ? 4 : 16;
  return !(++passes_ > kProbePasses && lookups_ >= kProbeLookups && ratio * saved_ < lookups_);
}

}  // namespace topocoll::search::detail
