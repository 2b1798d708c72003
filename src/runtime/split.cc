// Communicators made from a communicator (NCCL's ncclCommSplit and ncclCommShrink).
//
// Both end in an ordinary init (CommImpl::init) of the new communicator over a root of its own, which the new rank 0
// starts; the parent only carries the root's address to the new ranks. So the new communicator owns everything it
// uses (its bootstrap, connections and threads) and outlives its parent, as NCCL's do without splitShare.
//
//   split:  the parent's ranks allgather (call number, colour, key); each rank of a colour learns its new rank (key
//           order, then parent rank) and the new rank 0 sends the root's address to the others.
//   shrink: the ranks not excluded agree without asking anyone (they were all given the same list); the new rank 0
//           sends the root's address to the others over messages that work after the job failed (sendSurvivor), so
//           survivors of dead ranks can shrink.
//
// The new communicator's secret is derived from the parent's (Bootstrap::childKey) and never travels: a message
// carries the root's address and the call it belongs to, nothing a stranger could join with.
#include <algorithm>
#include <cstring>

#include "topocoll/log.h"
#include "topocoll/progress/connections.h"
#include "comm_impl.h"
#include "coll_queue.h"
#include "groups.h"

namespace topocoll::runtime {

namespace {

// Tags of the messages that carry a new communicator's root (call numbers mod 2^20 above them).
constexpr int kTagSplitRoot = 0x3a000000;
constexpr int kTagShrinkRoot = 0x3b000000;
constexpr int kTagSplitNote = 0x3c000000;   // split notes between the ranks of a revoked (aborted) communicator
constexpr int kTagGrowNote = 0x3d000000;    // the grown communicator's id, from the rank that holds it
constexpr uint32_t kSplitMagic = 0x73706c74;  // "splt"

// What every rank of the parent tells the others at a split.
struct SplitNote {
  uint32_t magic = kSplitMagic;
  uint32_t seq = 0;  // this communicator's split or shrink number
  int32_t color = 0, key = 0;
};

// What the new rank 0 sends every other new rank.
struct RootNote {
  bootstrap::UniqueId id;  // without its secret (withKey(AuthKey{}))
  uint32_t seq = 0;
  int32_t nRanks = 0;
  uint64_t members = 0;  // a hash of the new communicator's ranks (parent ranks, in new rank order)
};

uint64_t hashRanks(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the ranks
  for (int r : ranks) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint8_t>(static_cast<uint32_t>(r) >> (8 * b));
      h *= 1099511628211ULL;
    }
  }
  return h;
}

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += fmt::format(",... ({} ranks)", ranks.size());
  return s;
}

}  // namespace

// The new communicator of `members` (parent ranks in new rank order) that this rank joins: its rank 0 starts the root
// and tells the others over the parent's bootstrap (survivor messages when `survivors`: the parent failed or was
// aborted), with tags from `tagBase`.
std::unique_ptr<CommImpl> CommImpl::joinChild(const std::vector<int>& members, uint32_t seq, const std::string& what,
                                              const std::string& keyContext, int tagBase, bool survivors,
                                              const InitOptions& opts) {
  const int n = static_cast<int>(members.size());
  const int newRank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  const int tag = tagBase + static_cast<int>(seq & 0xfffff);
  const AuthKey key = bs_->childKey(keyContext);
  const uint64_t membersHash = hashRanks(members);
  bootstrap::RootHandle root;
  bootstrap::UniqueId id;
  if (newRank == 0) {
    id = bootstrap::createUniqueId(&root, bs_->childRootHost(), 0, n, &key);
    RootNote note{bootstrap::withKey(id, AuthKey{}), seq, n, membersHash};
    for (int i = 1; i < n; ++i) {
      if (survivors) bs_->sendSurvivor(members[i], tag, &note, sizeof note);
      else bs_->send(members[i], tag, &note, sizeof note);
    }
  } else {
    RootNote note;
    try {
      if (survivors) bs_->recvSurvivor(members[0], tag, &note, sizeof note);
      else bs_->recv(members[0], tag, &note, sizeof note);
    } catch (const Error& e) {
      fail(e.code(), "rank {}: {}: no word from rank {}, the new communicator's rank 0 ({}): {}", rank_, what,
           members[0], survivors ? "is it alive, and was it given the same excluded ranks?" : "is it alive?",
           e.what());
    }
    if (note.seq != seq || note.nRanks != n || note.members != membersHash)
      fail(StatusCode::kInvalidUsage,
           "rank {}: {}: rank {} (the new rank 0) made a communicator of {} ranks for its call {}; this rank expected "
           "{} ranks ({}) for its call {}: the ranks' calls differ (another exclude list, colour or key)",
           rank_, what, members[0], note.nRanks, note.seq, n, rankList(members), seq);
    id = bootstrap::withKey(note.id, key);
  }
  TC_INFO(log::kInit, "{}: rank {} becomes rank {} of {} (parent ranks {})", what, rank_, newRank, n,
          rankList(members));
  try {
    auto child = init(id, n, newRank, opts);
    child->root_ = std::move(root);
    return child;
  } catch (const Error& e) {
    root.abort(fmt::format("{}: the new rank 0 (parent rank {}) failed: {}", what, rank_, e.what()),
               std::chrono::milliseconds(2000));
    throw;
  }
}

std::unique_ptr<CommImpl> CommImpl::split(int color, int key, const InitOptions* given) {
  if (groupDepth() > 0)
    fail(StatusCode::kInvalidUsage, "rank {}: split inside a group: call it outside groupStart()/groupEnd()", rank_);
  if (std::string why; !aborted() && jobFailure(&why))
    fail(StatusCode::kRemoteError, "rank {}: split of a failed communicator: {}", rank_, why);
  const uint32_t seq = ++splitSeq_;
  std::vector<SplitNote> notes(nRanks_);
  notes[rank_] = SplitNote{kSplitMagic, seq, color, key};
  if (aborted()) {
    // Revoked (or aborted): its bootstrap refuses ordinary calls, so every rank tells every other directly.
    const int tag = kTagSplitNote + static_cast<int>(seq & 0xfffff);
    for (int p = 0; p < nRanks_; ++p)
      if (p != rank_) bs_->sendSurvivor(p, tag, &notes[rank_], sizeof(SplitNote));
    for (int p = 0; p < nRanks_; ++p)
      if (p != rank_) bs_->recvSurvivor(p, tag, &notes[p], sizeof(SplitNote));
  } else {
    // After this rank's collectives (the split is ordered with them, as NCCL's), alone on the bootstrap.
    detail::CollQueue::Hold hold(*collQueue_);
    std::lock_guard<std::mutex> lock(conns_->setupMutex());
    bs_->setPhase(fmt::format("split {} (colours and keys allgather)", seq));
    bs_->allGather(notes.data(), sizeof(SplitNote));
    bs_->setPhase("the communicator's calls");
  }
  // Every rank checks every note alike, so they fail together.
  for (int r = 0; r < nRanks_; ++r) {
    const SplitNote& n = notes[r];
    if (n.magic != kSplitMagic || n.seq != seq)
      fail(StatusCode::kInvalidUsage,
           "rank {}: split {}: rank {} is not in the same split (it called split {} of this communicator, or another "
           "call): every rank calls the same splits in the same order",
           rank_, seq, r, n.magic == kSplitMagic ? std::to_string(n.seq) : "none");
    if (n.color < kNoColor)
      fail(StatusCode::kInvalidArgument,
           "rank {}: split {}: rank {} gave color {}: a color is >= 0, or NCCL_SPLIT_NOCOLOR (-1) for no communicator",
           rank_, seq, r, n.color);
  }
  if (color == kNoColor) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < nRanks_; ++r)
    if (notes[r].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return notes[a].key < notes[b].key; });
  return joinChild(members, seq, fmt::format("split {} color {}", seq, color),
                   fmt::format("topocoll split {} color {}", seq, color), kTagSplitRoot, /*survivors=*/aborted(),
                   given ? *given : opts_);
}

std::unique_ptr<CommImpl> CommImpl::shrink(const std::vector<int>& exclude, bool abortFirst, const InitOptions* given) {
  if (groupDepth() > 0)
    fail(StatusCode::kInvalidUsage, "rank {}: shrink inside a group: call it outside groupStart()/groupEnd()", rank_);
  std::vector<uint8_t> out(nRanks_, 0);
  for (int r : exclude) {
    if (r < 0 || r >= nRanks_)
      fail(StatusCode::kInvalidArgument, "rank {}: excluded rank {} is out of range [0, {})", rank_, r, nRanks_);
    if (out[r]) fail(StatusCode::kInvalidArgument, "rank {}: rank {} is excluded twice", rank_, r);
    out[r] = 1;
  }
  if (out[rank_])
    fail(StatusCode::kInvalidArgument,
         "rank {}: this rank is in the excluded ranks: only the ranks that stay call shrink", rank_);
  std::vector<int> members;
  for (int r = 0; r < nRanks_; ++r)
    if (!out[r]) members.push_back(r);
  const uint32_t seq = ++splitSeq_;
  if (abortFirst) {
    // NCCL_SHRINK_ABORT: the parent's pending work ends first (with kAborted), then the survivors talk.
    abort();
  } else {
    detail::CollQueue::Hold hold(*collQueue_);  // after this rank's collectives
  }
  std::vector<int> sorted = exclude;
  std::sort(sorted.begin(), sorted.end());
  return joinChild(members, seq, fmt::format("shrink {} (excluding {})", seq, rankList(sorted)),
                   fmt::format("topocoll shrink {} of {}", seq, hashRanks(members)), kTagShrinkRoot, /*survivors=*/true,
                   given ? *given : opts_);
}

std::unique_ptr<CommImpl> CommImpl::grow(int newSize, const bootstrap::UniqueId* id, const InitOptions* given) {
  if (groupDepth() > 0)
    fail(StatusCode::kInvalidUsage, "rank {}: grow inside a group: call it outside groupStart()/groupEnd()", rank_);
  if (newSize <= nRanks_)
    fail(StatusCode::kInvalidArgument, "rank {}: grow to {} ranks: a grown communicator has more than this one's {}",
         rank_, newSize, nRanks_);
  const uint32_t seq = ++splitSeq_;
  struct GrowNote {
    uint32_t magic, seq;
    int32_t hasId, newSize;
  };
  std::vector<GrowNote> notes(nRanks_);
  notes[rank_] = GrowNote{kSplitMagic + 1, seq, id != nullptr, newSize};
  bootstrap::UniqueId shared;
  {
    detail::CollQueue::Hold hold(*collQueue_);
    std::lock_guard<std::mutex> lock(conns_->setupMutex());
    bs_->setPhase(fmt::format("grow {} (who holds the id)", seq));
    bs_->allGather(notes.data(), sizeof(GrowNote));
    int holder = -1;
    for (int r = 0; r < nRanks_; ++r) {
      const GrowNote& n = notes[r];
      if (n.magic != kSplitMagic + 1 || n.seq != seq)
        fail(StatusCode::kInvalidUsage, "rank {}: grow {}: rank {} is not in the same grow (every rank calls it)",
             rank_, seq, r);
      if (n.newSize != newSize)
        fail(StatusCode::kInvalidUsage, "rank {}: grow {}: rank {} grows to {} ranks and this rank to {}", rank_, seq,
             r, n.newSize, newSize);
      if (n.hasId && holder >= 0)
        fail(StatusCode::kInvalidUsage,
             "rank {}: grow {}: ranks {} and {} both give a unique id (exactly one existing rank gives it)", rank_, seq,
             holder, r);
      if (n.hasId) holder = r;
    }
    if (holder < 0)
      fail(StatusCode::kInvalidUsage,
           "rank {}: grow {}: no existing rank gives the unique id (one gives what ncclCommGetUniqueId made)", rank_,
           seq);
    if (holder == rank_) shared = *id;
    const int tag = kTagGrowNote + static_cast<int>(seq & 0xfffff);
    if (holder == rank_) {
      for (int p = 0; p < nRanks_; ++p)
        if (p != rank_) bs_->send(p, tag, shared.bytes.data(), shared.bytes.size());
    } else {
      bs_->recv(holder, tag, shared.bytes.data(), shared.bytes.size());
    }
    bs_->setPhase("the communicator's calls");
  }
  TC_INFO(log::kInit, "grow {}: rank {} of {} joins a communicator of {}", seq, rank_, nRanks_, newSize);
  return init(shared, newSize, rank_, given ? *given : opts_);
}

}  // namespace topocoll::runtime
