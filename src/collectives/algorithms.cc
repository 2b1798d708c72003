// The collective algorithms (follows the structure of NCCL 2.30.7 src/device/all_reduce.h, all_gather.h,
// reduce_scatter.h, broadcast.h and reduce.h, Apache-2.0: ring steps, chains and trees; our own code). Data is split
// across channels (each with its own ring or tree) and every step of every channel is posted before any is waited
// for, so channels move at once; chains and trees are pipelined in chunks.
#include "topocoll/collectives/algorithms.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <vector>

#include "topocoll/collectives/reduce.h"
#include "topocoll/memcopy.h"
#include "topocoll/status.h"

namespace topocoll::collectives {

const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "AllReduce";
    case Coll::kBroadcast: return "Broadcast";
    case Coll::kReduce: return "Reduce";
    case Coll::kAllGather: return "AllGather";
    case Coll::kReduceScatter: return "ReduceScatter";
  }
  return "?";
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kTree: return "Tree";
    case Algo::kRing: return "Ring";
    case Algo::kDirect: return "Direct";
    case Algo::kDirectSplit: return "DirectSplit";
  }
  return "?";
}

const char* protoName(Proto p) { return p == Proto::kLL ? "LL" : "Simple"; }

uint64_t callSignature(const Args& a) {
  uint64_t w = static_cast<uint64_t>(a.coll) + 1;
  w |= (static_cast<uint64_t>(a.type) & 31) << 3;
  if (reduces(a.coll)) w |= ((static_cast<uint64_t>(a.op) + 1) & 15) << 8;
  if (rooted(a.coll)) w |= (static_cast<uint64_t>(a.root) % 65535 + 1) << 12;
  w |= (a.seq & 15) << 28;
  return w | static_cast<uint64_t>(static_cast<uint32_t>(a.count)) << 32;
}

std::string describeCall(uint64_t w) {
  const auto coll = static_cast<int>(w & 7) - 1;
  const auto type = static_cast<DataType>((w >> 3) & 31);
  const uint64_t op = (w >> 8) & 15, root = (w >> 12) & 0xffff;
  std::string s = fmt::format("{}(count {}, {}", coll >= 0 && coll <= static_cast<int>(Coll::kReduceScatter)
                                                     ? collName(static_cast<Coll>(coll)) : "?",
                              w >> 32, isValid(type) ? to_string(type) : "?");
  if (op) s += fmt::format(", {}", isValid(static_cast<RedOp>(op - 1)) ? to_string(static_cast<RedOp>(op - 1)) : "?");
  if (root) s += fmt::format(", root {}", root - 1);
  return s + fmt::format(") as call {} (mod 16)", (w >> 28) & 15);
}

size_t collBytes(const Args& a, int nRanks) {
  size_t b = a.count * sizeOf(a.type);
  return a.coll == Coll::kAllGather || a.coll == Coll::kReduceScatter ? b * static_cast<size_t>(nRanks) : b;
}

namespace {

// Element range of part `i` of `n` (balanced).
struct Range {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};
Range split(size_t count, int n, int i) {
  return {count * static_cast<size_t>(i) / static_cast<size_t>(n),
          count * static_cast<size_t>(i + 1) / static_cast<size_t>(n)};
}

// Broadcast's pipelining unit between more than 2 ranks (measured at 4 ranks: 1-4 MiB beat 128 KiB by 2-10x,
// 64 MiB (no pipelining) is slower again).
constexpr size_t kBroadcastPiece = 4 << 20;
// Copies of kStreamCopyMin (memcopy.h) and more whose destination nobody reads during the call stream past the caches
// (copyUnread). Measured (bench/results/2026-11-24-coll-streaming-copies-ab-7d972f8.md): the out-of-place Broadcast
// root's copy at 2 ranks, 64 MiB 1.37x faster; 4-rank AllGather at 64 MiB (16 MiB blocks) 1.17x; from 4 MiB the
// 4-rank Broadcast lost at 4 MiB.

// allReducePair's pieces, through kPairSlots scratch slots (a few pieces fit in the L2 with the lines they meet; 512 KiB
// and 1 MiB pieces measured no better).
constexpr size_t kPairPiece = 256 << 10;
// reduceScatterStar's pieces: at 4 ranks (on 2 cores) 1 MiB beat 256 KiB by 1.1-1.3x from 4 MiB (fewer hand-overs,
// each a wake-up) and 85 KiB was 1.5x slower.
constexpr size_t kStarPiece = 1 << 20;
// The unit of the writes into the peers' outputs (Choice::mapOutputs): a piece read (or reduced) into this core's
// cache once, then written to every output.
constexpr size_t kOutputPiece = 128 << 10;
constexpr size_t kPairSlots = 4;
// Slices whose ring reduce-scatter steps go together across hosts (ringReduceScatterNet): one more than the link
// needs queued while a slice is reduced.
constexpr size_t kNetRsGroup = 3;
// How many chunks a tree rank sends up ahead of the one it then waits for from its parent and passes down: enough
// that its link up has the next chunk queued while the parent's reply is on its way.
constexpr size_t kTreeDownLag = 2;

int positionOf(const int* ring, int n, int rank) {
  for (int p = 0; p < n; ++p)
    if (ring[p] == rank) return p;
  fail(StatusCode::kInternal, "rank {} is not in its channel's ring", rank);
}

class Runner {
 public:
  Runner(Links& l, const Args& a, const Choice& c)
      : l_(l), a_(a), c_(c), n_(l.nRanks()), me_(l.rank()), es_(sizeOf(a.type)),
        send_(static_cast<const char*>(a.send)), recv_(static_cast<char*>(a.recv)),
        nCh_(std::max(1, std::min(c.nChannels, l.nChannels()))),
        chunk_(std::max<size_t>(1, c.chunkBytes / es_)) {}

  void run() {
    l_.beginCollective(collBytes(a_, n_) >= kStreamCopyMin, {callSignature(a_), describeCall});
    switch (a_.coll) {
      case Coll::kAllReduce:
        if (c_.algo == Algo::kDirect) return star() ? allReduceStar() : allReduceDirect();
        if (c_.algo == Algo::kDirectSplit) return allReduceDirectSplit();
        if (c_.algo == Algo::kTree && n_ > 1) return allReduceTree();
        return allReduceRing();
      case Coll::kAllGather:
        if (star()) return allGatherStar();
        return allGatherRing();
      case Coll::kReduceScatter:
        if (star()) return reduceScatterStar();
        return reduceScatterRing();
      case Coll::kBroadcast:
        if (star()) return broadcastStar();
        return broadcastChain();
      case Coll::kReduce: return reduceChain();
    }
  }

 private:
  bool star() const { return c_.algo == Algo::kDirect && c_.star; }
  char* at(char* base, size_t elem) const { return base + elem * es_; }
  const char* at(const char* base, size_t elem) const { return base + elem * es_; }
  void reduce2(void* dst, const void* x, const void* y, size_t n) const { reduce(a_.type, a_.op, dst, x, y, n); }
  int avgRanks() const { return a_.op == RedOp::kAvg ? n_ : 0; }  // reduceToMany's divisor
  void avg(void* dst, size_t n) const {
    if (a_.op == RedOp::kAvg) finishAvg(a_.type, dst, n, n_);
  }
  int send(int c, int peer, const void* p, size_t elems, bool staged = false, Copier copier = Copier::kAny) {
    return l_.send(c, peer, p, elems * es_, c_.proto, staged, copier);
  }
  int recv(int c, int peer, void* p, size_t elems, bool staged = false) {
    return l_.recv(c, peer, p, elems * es_, c_.proto, staged);
  }
  void copyIfApart(void* dst, const void* src, size_t elems) const {
    if (dst != src && elems) std::memmove(dst, src, elems * es_);
  }
  // copyIfApart for a destination nobody reads during the call (the peers copy from the source): from
  // kStreamCopyMin its stores bypass the caches, which the peers' copies need (docs/collectives.md, "Mapped
  // outputs", and bench/results/2026-11-24-coll-streaming-copies-ab-7d972f8.md).
  void copyUnread(void* dst, const void* src, size_t elems) const {
    const size_t bytes = elems * es_;
    const auto *d = static_cast<const char*>(dst), *s = static_cast<const char*>(src);
    if (bytes >= kStreamCopyMin && (d + bytes <= s || s + bytes <= d)) return copyStreaming(dst, src, bytes);
    copyIfApart(dst, src, elems);
  }
  struct Ring {
    const int* r;
    int p, prev, next;
  };
  Ring ringOf(int c) const {
    const int* r = l_.ring(c);
    int p = positionOf(r, n_, me_);
    return {r, p, r[(p + n_ - 1) % n_], r[(p + 1) % n_]};
  }
  int mod(int x) const { return ((x % n_) + n_) % n_; }

  // The reduce-scatter of a ring, nSlices slices of every channel: block(c, q) is the input range (elements of the
  // send buffer) of the block at ring position q of channel c; slice k is chunk k of every block. At step s the rank
  // at position p sends block p-s (its input at step 0, then what it reduced at step s-1) and reduces block p-s-1
  // with its input into part(c, q, piece, last) (the output at the last step, which leaves it with block p+1), so a
  // received chunk is reduced while it is still in the cache.
  //
  // part(c, q, piece, last, k) is where the reduction of slice k of block q goes. `tmp` holds rsSlots() chunks per
  // channel. Across hosts the steps of a group of slices are pipelined instead (ringReduceScatterNet).
  template <class Block, class Part>
  void ringReduceScatter(const std::vector<Ring>& rings, size_t nSlices, char* tmp, size_t maxChunk,
                         const Block& block, const Part& part, bool partsReused = false) {
    if (c_.acrossHosts) return ringReduceScatterNet(rings, nSlices, tmp, maxChunk, block, part, partsReused);
    std::vector<int> h(nCh_, -1);
    for (size_t k = 0; k < nSlices; ++k) {
      for (int s = 0; s < n_ - 1; ++s) {
        for (int c = 0; c < nCh_; ++c) {
          Range out = pieceOf(block(c, rings[c].p - s), k), in = pieceOf(block(c, rings[c].p - s - 1), k);
          h[c] = in.size() ? recv(c, rings[c].prev, tmp + c * maxChunk * es_, in.size(), true) : -1;
          if (out.size())
            send(c, rings[c].next, s == 0 ? at(send_, out.begin) : part(c, rings[c].p - s, out, false, k), out.size(),
                 true);
        }
        for (int c = 0; c < nCh_; ++c) {
          if (h[c] < 0) continue;
          Range in = pieceOf(block(c, rings[c].p - s - 1), k);
          l_.wait(h[c]);
          char* dst = part(c, rings[c].p - s - 1, in, s == n_ - 2, k);
          reduce2(dst, tmp + c * maxChunk * es_, at(send_, in.begin), in.size());
          if (s == n_ - 2) avg(dst, in.size());
        }
        l_.waitAll();
      }
    }
  }
  // Chunks of receive buffer per channel that ringReduceScatter needs.
  size_t rsSlots() const { return c_.acrossHosts ? kNetRsGroup : 1; }

  // ringReduceScatter across hosts. Slice by slice, with every step waiting for the last, each step cost the links
  // a bubble (the slice's last bytes in flight, its acknowledgement, the reduction): 3 hosts x 2 ranks at 500
  // Mbit/s ran 2-4% above the TCP ceiling. Here slices go in groups of kNetRsGroup, step by step within a group
  // (every step of slice k is sent after step s-1 of slices k+1.. of its group), so the link always has a slice
  // queued while the next one's input is reduced; nothing waits for a send but the reuse of what it read. Receives
  // on one connector match its sends in the order they are posted, and every rank posts in the same order (group,
  // step, slice, channel). Slice k's receive goes to tmp slot k % kNetRsGroup of its channel, free once step s-1
  // of slice k was reduced. `partsReused`: part() hands out buffers that a later step overwrites (ReduceScatter's
  // partial sums), so a reduction first waits for the last send out of its destination.
  template <class Block, class Part>
  void ringReduceScatterNet(const std::vector<Ring>& rings, size_t nSlices, char* tmp, size_t maxChunk,
                            const Block& block, const Part& part, bool partsReused) {
    const size_t group = kNetRsGroup;
    struct Pending {
      int h, c, s;
      size_t k, seq;
    };
    std::deque<Pending> pending;                 // receives posted, not yet reduced, in posting order
    std::vector<std::pair<char*, int>> readers;  // partsReused: the last send out of each partial buffer
    std::vector<long long> lastInSlot(static_cast<size_t>(nCh_) * group, -1);  // the last receive into each slot
    auto slot = [&](int c, size_t k) { return tmp + (static_cast<size_t>(c) * group + k % group) * maxChunk * es_; };
    auto reduceOldest = [&] {
      const Pending p = pending.front();
      pending.pop_front();
      const Range in = pieceOf(block(p.c, rings[p.c].p - p.s - 1), p.k);
      l_.wait(p.h);
      const bool last = p.s == n_ - 2;
      char* dst = part(p.c, rings[p.c].p - p.s - 1, in, last, p.k);
      if (partsReused)
        for (auto& [buf, h] : readers)
          if (buf == dst && h >= 0) l_.wait(h), h = -1;
      reduce2(dst, slot(p.c, p.k), at(send_, in.begin), in.size());
      if (last) avg(dst, in.size());
    };
    // Reduces what slot (c, k) last received: step s-1 of slice k (what step s sends), or the previous group's
    // last step (before the slot takes a new receive).
    auto slotReduced = [&](int c, size_t k) {
      const long long seq = lastInSlot[static_cast<size_t>(c) * group + k % group];
      while (!pending.empty() && static_cast<long long>(pending.front().seq) <= seq) reduceOldest();
    };
    size_t seq = 0;
    for (size_t g = 0; g < nSlices; g += group)
      for (int s = 0; s < n_ - 1; ++s)
        for (size_t k = g; k < std::min(nSlices, g + group); ++k)
          for (int c = 0; c < nCh_; ++c, ++seq) {
            const Range out = pieceOf(block(c, rings[c].p - s), k), in = pieceOf(block(c, rings[c].p - s - 1), k);
            if (s > 0) slotReduced(c, k);
            if (out.size()) {
              char* src = s == 0 ? const_cast<char*>(at(send_, out.begin)) : part(c, rings[c].p - s, out, false, k);
              const int h = send(c, rings[c].next, src, out.size(), true);
              if (partsReused && s > 0) {
                auto it = std::find_if(readers.begin(), readers.end(), [&](const auto& r) { return r.first == src; });
                if (it == readers.end()) readers.emplace_back(src, h);
                else it->second = h;
              }
            }
            if (in.size()) {
              slotReduced(c, k);
              pending.push_back({recv(c, rings[c].prev, slot(c, k), in.size(), true), c, s, k, seq});
              lastInSlot[static_cast<size_t>(c) * group + k % group] = static_cast<long long>(seq);
            }
            l_.start();
          }
    while (!pending.empty()) reduceOldest();
    l_.waitAll();
  }
  // Chunk k of range r (empty past its end).
  Range pieceOf(Range r, size_t k) const {
    size_t first = std::min(r.end, r.begin + k * chunk_);
    return {first, std::min(r.end, first + chunk_)};
  }
  // Slices needed for blocks of the channels' ranges cut in n.
  size_t slicesOf(const std::vector<Range>& whole) const {
    size_t nSlices = 0;
    for (const Range& w : whole) nSlices = std::max(nSlices, ((w.size() + n_ - 1) / n_ + chunk_ - 1) / chunk_);
    return nSlices;
  }

  // Reduce-scatter then all-gather around each channel's ring. Each channel's range is cut into n blocks; the
  // reduce-scatter leaves the rank at ring position p with block p+1 reduced; the all-gather forwards blocks (step s:
  // sends block p+1-s, receives block p-s into the output) as single copies of whole blocks.
  void allReduceRing() {
    size_t count = a_.count;
    if (n_ == 1) return copyIfApart(recv_, send_, count), avg(recv_, count);
    if (c_.pair && n_ == 2 && l_.nChannels() >= 2) return allReducePair();
    std::vector<Range> whole(nCh_);
    std::vector<Ring> rings(nCh_);
    for (int c = 0; c < nCh_; ++c) whole[c] = split(count, nCh_, c), rings[c] = ringOf(c);
    size_t maxChunk = std::min(chunk_, (count + n_ - 1) / n_);
    char* tmp = l_.scratch(maxChunk * es_ * nCh_ * rsSlots());
    auto block = [&](int c, int b) {
      Range r = split(whole[c].size(), n_, mod(b));
      return Range{whole[c].begin + r.begin, whole[c].begin + r.end};
    };
    auto inOutput = [&](int, int, Range piece, bool, size_t) { return at(recv_, piece.begin); };
    ringReduceScatter(rings, slicesOf(whole), tmp, maxChunk, block, inOutput);
    // All-gather of the reduced blocks (ringForward: whole blocks on one host, pieces across hosts). (All-gathering
    // groups of slices right after reducing them, while they are in the cache, measured 5-20% slower at 16 and 64
    // MiB, 2 ranks, one host: more hand-overs.)
    ringForward(rings, [&](int c, int s) { return block(c, rings[c].p + 1 - s); },
                [&](int c, int s) { return block(c, rings[c].p - s); });
  }

  // The all-gather steps of a ring: at step s channel c sends the output range sent(c, s) to the next rank and
  // receives got(c, s) from the previous one, which it sends on at step s + 1. On one host whole blocks, a step at
  // a time (one hand-over per step and peer: single copies). Across hosts piece by piece (chunkBytes): every
  // receive is posted at once, and each piece goes on as soon as it arrived, so that the link does not idle
  // between steps while the whole block's last piece lands and the next step is posted.
  template <class Sent, class Got>
  void ringForward(const std::vector<Ring>& rings, const Sent& sent, const Got& got) {
    const int steps = n_ - 1;
    if (!c_.acrossHosts) {
      for (int s = 0; s < steps; ++s) {
        for (int c = 0; c < nCh_; ++c) {
          Range out = sent(c, s), in = got(c, s);
          if (in.size()) recv(c, rings[c].prev, at(recv_, in.begin), in.size());
          if (out.size()) send(c, rings[c].next, at(recv_, out.begin), out.size());
        }
        l_.waitAll();
      }
      return;
    }
    std::vector<std::vector<int>> h(static_cast<size_t>(nCh_) * steps);  // receive handles by channel and step
    for (int s = 0; s < steps; ++s)
      for (int c = 0; c < nCh_; ++c) {
        const Range in = got(c, s);
        for (size_t k = 0; pieceOf(in, k).size(); ++k) {
          const Range p = pieceOf(in, k);
          h[c * steps + s].push_back(recv(c, rings[c].prev, at(recv_, p.begin), p.size()));
        }
      }
    for (int s = 0; s < steps; ++s)
      for (int c = 0; c < nCh_; ++c) {
        const Range out = sent(c, s);
        for (size_t k = 0; pieceOf(out, k).size(); ++k) {
          if (s > 0) l_.wait(h[c * steps + s - 1][k]);  // the piece this rank received at the step before
          const Range p = pieceOf(out, k);
          send(c, rings[c].next, at(recv_, p.begin), p.size());
        }
      }
    l_.waitAll();
  }

  // The ring between 2 ranks without its FIFO copies: rank r reduces half r (pairReduce) and offers each reduced
  // piece to the peer, which pulls it into its output (channel 1) while the next piece is reduced: per rank, two
  // single copies and one reduction of half the data, both processes copying at once. Every element is reduced by
  // one rank only, so both get the same bits. In place, the peer's reduced piece lands on input the peer pulled
  // before: it reduced that piece, so its pull of it had finished.
  void allReducePair() {
    const int peer = 1 - me_;
    const Range mine = split(a_.count, 2, me_), theirs = split(a_.count, 2, peer);
    const Mapped m = mapPeers(true, mapOutputsApply());
    if (!m.in.empty() && !m.out.empty()) return reduceToOutputs(mine, m);
    if (const auto& in = m.in; !in.empty()) {
      // The peer's reduced pieces come after it read this rank's input: neither returns while the other reads.
      for (size_t b = theirs.begin; b < theirs.end; b += pieceElems(kPairPiece))
        recv(1, peer, at(recv_, b), std::min(pieceElems(kPairPiece), theirs.end - b));
      reduceMapped(mine, at(recv_, mine.begin), in, [&](Range r) {
        send(1, peer, at(recv_, r.begin), r.size(), false, Copier::kPull);
        l_.start();
      });
      l_.waitAll();
      return;
    }
    // The peer's inputs come on channel 0 and its reduced pieces on channel 1, each connector's in order.
    pairReduce(
        mine, theirs, at(recv_, mine.begin), [&](Range r) { send(1, peer, at(recv_, r.begin), r.size(), false, Copier::kPull); },
        [&](Range r) { recv(1, peer, at(recv_, r.begin), r.size()); });
  }

  // The ring's reduce-scatter between 2 ranks without its FIFO copies: rank r pulls the peer's input block r piece by
  // piece and reduces it with its own into its output, while the peer pulls block 1-r of this rank's input. In place
  // (the output is block r of the input) nothing written is pulled: the peer pulls block 1-r only.
  // A ReduceScatter out of place from kStreamCopyMin writes its output, which nobody reads during the call, past
  // the caches (2 ranks at 64 MiB: 1.4x; in place, where the output's lines were just read, slower: regular stores).
  bool streamsOutput() const {
    const size_t bytes = a_.count * es_;
    const bool apart = recv_ + bytes <= send_ || send_ + n_ * bytes <= recv_;
    return apart && collBytes(a_, n_) >= kStreamCopyMin;
  }
  void reduceScatterPair() {
    const int peer = 1 - me_;
    const size_t count = a_.count;
    const Range mine{me_ * count, (me_ + 1) * count}, theirs{peer * count, (peer + 1) * count};
    if (auto in = mapInputs(); !in.empty()) {
      reduceMapped(mine, recv_, in, [](Range) {}, streamsOutput());
      return barrier();  // the peer may still be reading this rank's input
    }
    pairReduce(mine, theirs, recv_, [](Range) {}, [](Range) {});
  }

  // ReduceScatter on one host without the ring's FIFO steps: block r of every rank's input reduced into rank r's
  // output (starReduce).
  void reduceScatterStar() {
    const size_t count = a_.count;
    if (auto in = mapInputs(); !in.empty()) {
      reduceMapped(Range{me_ * count, (me_ + 1) * count}, recv_, in, [](Range) {}, streamsOutput());
      return barrier();  // the peers may still be reading this rank's input
    }
    starReduce([&](int q) { return Range{q * count, (q + 1) * count}; }, recv_);
  }

  // AllReduce on one host between 3 and kDirectMaxRanks ranks without the ring's FIFO steps: rank r reduces block r
  // (split r of n) of everybody's input into its output (starReduce), then pulls every other rank's reduced block
  // straight out of that rank's output (starGather). In place, the block a rank pulls lands on input the block's
  // owner pulled before: the owner offers its reduced block only after reducing it, so its pulls had finished; and
  // a rank's own block r, which it overwrites, is pulled by no peer while it reduces.
  void allReduceStar() {
    const size_t count = a_.count;
    auto block = [&](int q) { return split(count, n_, q); };
    const Mapped m = mapPeers(true, mapOutputsApply());
    if (!m.in.empty() && !m.out.empty()) return reduceToOutputs(block(me_), m);
    // The gather waits for every peer's reduced block, offered after that peer read this rank's input: no barrier.
    if (!m.in.empty()) reduceMapped(block(me_), at(recv_, block(me_).begin), m.in, [](Range) {});
    else starReduce(block, at(recv_, block(me_).begin));
    starGather(at(recv_, block(me_).begin), block, recv_, [] {});
  }

  // AllGather on one host without the ring's steps (Choice::star: 3 to kDirectMaxRanks ranks from
  // HostThresholds::allGatherStarMin, 2 from allGatherPairMin): every rank pulls every peer's input straight into its
  // output (starGather) while it copies its own (out of place).
  void allGatherStar() {
    const size_t count = a_.count;
    if (mapOutputsApply())
      if (const Mapped m = mapPeers(false, true); !m.out.empty())
        return spreadToOutputs(m.out, me_ * count, send_, count);
    starGather(send_, [&](int q) { return Range{q * count, (q + 1) * count}; }, recv_,
               [&] { copyUnread(at(recv_, me_ * count), send_, count); });
  }

  // Every rank offers block(q) of its input (elements of the send buffer) to rank q (single copies the peers pull,
  // channel 0) and pulls block(me) of every peer's input piece by piece into scratch slots of kStarPiece (two sets
  // of n-1, one reduced while the other fills), reducing each piece with its own input, which goes first, into `out`
  // (element i of block(me) at out[i - block(me).begin]; out may alias only its own input block, which no peer
  // pulls). Waits for every transfer, so the peers are done with this rank's input when it returns.
  template <class Block>
  void starReduce(const Block& block, char* out) {
    l_.connectAll();
    const size_t piece = std::max<size_t>(1, kStarPiece / es_);
    auto pieceAt = [&](Range b, size_t k) {
      return Range{b.begin + k * piece, std::min(b.end, b.begin + (k + 1) * piece)};
    };
    auto nPieces = [&](Range b) { return (b.size() + piece - 1) / piece; };
    for (int i = 1; i < n_; ++i) {
      int to = (me_ + i) % n_;
      for (size_t k = 0; k < nPieces(block(to)); ++k) {
        Range r = pieceAt(block(to), k);
        send(0, to, at(send_, r.begin), r.size(), false, Copier::kPull);
      }
    }
    const Range mine = block(me_);
    const size_t nMine = nPieces(mine);
    char* tmp = l_.scratch(2 * static_cast<size_t>(n_ - 1) * piece * es_);
    auto slot = [&](size_t k, int i) { return tmp + ((k % 2) * (n_ - 1) + (i - 1)) * piece * es_; };
    std::vector<int> h(2 * static_cast<size_t>(n_ - 1));
    auto post = [&](size_t k) {
      for (int i = 1; i < n_; ++i)
        h[(k % 2) * (n_ - 1) + (i - 1)] = recv(0, (me_ + n_ - i) % n_, slot(k, i), pieceAt(mine, k).size());
    };
    for (size_t k = 0; k < std::min<size_t>(nMine, 2); ++k) post(k);
    const void* srcs[kDirectMaxRanks];
    for (size_t k = 0; k < nMine; ++k) {
      Range r = pieceAt(mine, k);
      char* dst = out + (r.begin - mine.begin) * es_;
      srcs[0] = at(send_, r.begin);
      for (int i = 1; i < n_; ++i) l_.wait(h[(k % 2) * (n_ - 1) + (i - 1)]), srcs[i] = slot(k, i);
      reduceMany(a_.type, a_.op, dst, srcs, n_, r.size());
      avg(dst, r.size());
      if (k + 2 < nMine) post(k + 2);
    }
    l_.waitAll();
  }

  // Every rank offers `mine` (block(me)'s elements) to every other rank, which pulls it into block(me) of its output
  // `dst` (one single copy per peer), and pulls block(q) of every peer q the same way, starting with the next rank
  // so that the ranks pull from different sources at once; local() runs once everything is started, while the peers
  // copy. Waits for every transfer.
  template <class Block, class Local>
  void starGather(const char* mine, const Block& block, char* dst, const Local& local) {
    l_.connectAll();
    offerToEveryPeer(0, mine, block(me_).size());
    for (int i = 1; i < n_; ++i) {
      Range r = block((me_ + i) % n_);
      if (r.size()) recv(0, (me_ + i) % n_, at(dst, r.begin), r.size());
    }
    l_.start();
    local();
    l_.waitAll();
  }

  size_t pieceElems(size_t bytes) const { return std::max<size_t>(1, bytes / es_); }

  // Reductions straight out of the peers' inputs (docs/collectives.md, "Mapped inputs") and writes straight into
  // their outputs ("Mapped outputs"). Every rank describes its input and/or its output to every peer, maps the
  // peers', and tells every peer which kinds it could map for all. The answer is the same on every rank: `in` holds
  // every rank's input (index: rank; this rank's own at me_) when every rank mapped every input, else it is empty;
  // `out` likewise. `inOf` >= 0: only that rank's input (a Broadcast's root's; `in` holds it at that index). Two
  // rounds of one small message per pair, on channel 0 (one when no rank's buffer is shareable).
  struct Mapped {
    std::vector<const char*> in;
    std::vector<char*> out;
  };
  Mapped mapPeers(bool wantIn, bool wantOut, int inOf = -1) {
    auto inputOf = [&](int q) { return wantIn && (inOf < 0 || q == inOf); };
    if (!c_.mapPeers || n_ < 2 || n_ > kDirectMaxRanks) return {};
    // From 3 ranks every pair at once (the star algorithms do it anyway): a peer connected lazily in the exchange
    // would connect in that pair's turn only (a cycle of ranks waiting for each other's connection beyond 4 ranks).
    // 2 ranks talk over their ring's connectors, connected already.
    if (n_ > 2) l_.connectAll();
    const size_t inBytes = (a_.coll == Coll::kReduceScatter ? a_.count * n_ : a_.count) * es_;
    const size_t outBytes = (a_.coll == Coll::kAllGather ? a_.count * n_ : a_.count) * es_;
    struct Both {
      PeerBuffer in, out;
    };
    Both mine;
    if (inputOf(me_) && !l_.describeBuffer(send_, inBytes, &mine.in)) mine.in = PeerBuffer{};
    if (wantOut && !l_.describeBuffer(recv_, outBytes, &mine.out)) mine.out = PeerBuffer{};
    std::vector<Both> theirs(n_);
    theirs[me_] = mine;
    exchange(&mine, theirs.data(), sizeof(Both));
    // A rank that could not describe a buffer sent zeros for it: every rank sees it, so all leave that kind alike.
    uint64_t ok = (wantIn ? 1 : 0) | (wantOut ? 2 : 0);
    for (int q = 0; q < n_; ++q) {
      if (inputOf(q) && theirs[q].in.words[0] == 0) ok &= ~uint64_t{1};
      if (theirs[q].out.words[0] == 0) ok &= ~uint64_t{2};
    }
    if (!ok) return {};
    std::vector<const char*> in(n_, nullptr), out(n_, nullptr);
    in[me_] = send_;
    out[me_] = recv_;
    for (int q = 0; q < n_; ++q) {
      if (q == me_) continue;
      if ((ok & 1) && inputOf(q) && !(in[q] = l_.mapPeerBuffer(q, theirs[q].in, inBytes))) ok &= ~uint64_t{1};
      if ((ok & 2) && !(out[q] = l_.mapPeerBuffer(q, theirs[q].out, outBytes))) ok &= ~uint64_t{2};
    }
    std::vector<uint64_t> oks(n_);
    exchange(&ok, oks.data(), sizeof ok);
    for (int q = 0; q < n_; ++q)
      if (q != me_) ok &= oks[q];
    Mapped m;
    if (ok & 1) m.in = std::move(in);
    if (ok & 2)  // the mappings are writable: the peers' outputs, which their owners lent to this collective
      for (const char* p : out) m.out.push_back(const_cast<char*>(p));
    return m;
  }
  std::vector<const char*> mapInputs() { return mapPeers(true, false).in; }
  // Writes into the peers' outputs (Choice::mapOutputs; TOPOCOLL_MAP_PEER_BUFFERS=0 turns them off with the rest of
  // the mappings).
  bool mapOutputsApply() const { return c_.mapOutputs; }
  // `elems` at `src` into every rank's output `out` (mapPeers) at element `atElem` but the one that is `src`: this
  // rank's own first, then the next rank's and on (the ranks write to different outputs at once), in kOutputPiece
  // pieces, then a barrier: every rank has written this rank's other blocks and read what it needed of this rank's
  // input. 2 ranks, and below kStreamCopyMin, a memcpy per output (the source, read once, stays in this core's cache
  // for the other copies); 3-8 ranks from kStreamCopyMin one pass into every output with non-temporal stores
  // (copyToMany; nobody reads the outputs before the barrier). bench/results/2026-11-29-coll-one-pass-ab-a3e7abd.md:
  // 3-4 ranks at 64 MiB 0.92-1.37x, 5 of 6 medians ahead, 16 MiB too noisy to call; at 2 ranks the memcpys are
  // faster, and regular stores beat copyStreaming per output there.
  void spreadToOutputs(const std::vector<char*>& out, size_t atElem, const char* src, size_t elems) {
    char* dsts[kDirectMaxRanks];
    int nd = 0;
    for (int i = 0; i < n_; ++i)
      if (char* d = at(out[(me_ + i) % n_], atElem); d != src) dsts[nd++] = d;
    const bool onePass = n_ > 2 && collBytes(a_, n_) >= kStreamCopyMin;
    const size_t piece = pieceElems(kOutputPiece);
    for (size_t b = 0; b < elems && nd; b += piece) {
      const size_t bytes = std::min(piece, elems - b) * es_;
      void* at_b[kDirectMaxRanks];
      for (int k = 0; k < nd; ++k) at_b[k] = at(dsts[k], b);
      if (onePass) {
        copyToMany(at_b, nd, (1u << nd) - 1, at(src, b), bytes);
      } else {
        for (int k = 0; k < nd; ++k) std::memcpy(at_b[k], at(src, b), bytes);
      }
    }
    barrier();
  }

  // Sends `bytes` at `mine` to every peer and receives every peer's into all[peer] (all[me] untouched), LL.
  void exchange(const void* mine, void* all, size_t bytes) {
    for (int i = 1; i < n_; ++i) {
      const int to = (me_ + i) % n_, from = (me_ + n_ - i) % n_;
      l_.recv(0, from, static_cast<char*>(all) + from * bytes, bytes, Proto::kLL, false);
      l_.send(0, to, mine, bytes, Proto::kLL, false, Copier::kAny);
    }
    l_.waitAll();
  }
  // Every rank waits until every rank got here. The fence orders this rank's plain loads and stores of the peers'
  // mapped buffers before the barrier's messages (a no-op on x86; on weaker memory models the LL lines are plain
  // stores, and a peer past the barrier must see every write into its output and no later read of its input).
  void barrier() {
    std::atomic_thread_fence(std::memory_order_release);
    uint64_t token = 1;
    std::vector<uint64_t> all(n_);
    exchange(&token, all.data(), sizeof token);
  }
  // The operands of elements r out of every rank's input `in` (mapPeers), in the order of the copying algorithms
  // (pairReduce: the peer's, then this rank's; starReduce: this rank's, then the peers' from the previous rank
  // backwards), so that every path gives the same bits; into srcs, which it returns.
  const void** operands(Range r, const std::vector<const char*>& in, const void** srcs) const {
    if (n_ == 2) {
      srcs[0] = at(in[1 - me_], r.begin), srcs[1] = at(send_, r.begin);
    } else {
      srcs[0] = at(send_, r.begin);
      for (int i = 1; i < n_; ++i) srcs[i] = at(in[(me_ + n_ - i) % n_], r.begin);
    }
    return srcs;
  }
  // Rank r reduces `mine` (elements of every rank's input) out of every rank's input (m.in) and writes the result
  // into every rank's output (m.out), its own included, in one pass per piece (reduceToMany): the inputs are read
  // once and the outputs written once, nothing else. From kStreamCopyMin, outputs apart from their rank's input get
  // non-temporal stores: nobody reads them before the collective ends, and their lines are not read for ownership
  // first (4 ranks, 64 MiB out of place, against reducing into scratch and copying that out: 1.43x median in the
  // interleaved rounds of bench/results/2026-11-29-coll-one-pass-ab-a3e7abd.md, 1.8-2.0x in shorter ones); below it
  // they would stay in the last-level cache (2 ranks at 4 MiB: 1.2-2x slower streamed).
  // Only rank r reads or writes block `mine` anywhere, so in place each line is read everywhere before it is
  // written. Then it waits for every rank: they have written this rank's other blocks and are done reading its input.
  void reduceToOutputs(Range mine, const Mapped& m) {
    const size_t piece = pieceElems(kOutputPiece);
    const void* srcs[kDirectMaxRanks];
    void* dsts[kDirectMaxRanks];
    uint32_t stream = 0;  // outputs apart from their rank's input: nobody reads them before the collective ends
    for (int i = 0; i < n_ && collBytes(a_, n_) >= kStreamCopyMin; ++i)
      if (m.out[(me_ + i) % n_] != m.in[(me_ + i) % n_]) stream |= 1u << i;
    for (size_t b = mine.begin; b < mine.end; b += piece) {
      const Range r{b, std::min(mine.end, b + piece)};
      for (int i = 0; i < n_; ++i) dsts[i] = at(m.out[(me_ + i) % n_], r.begin);
      reduceToMany(a_.type, a_.op, dsts, n_, stream, operands(r, m.in, srcs), n_, r.size(), avgRanks());
    }
    barrier();
  }

  // Reduces `mine` (elements of every rank's input) out of the inputs `in` (mapInputs) into `out` (element i of
  // mine at out[i - mine.begin]), in pieces, operands in operands()'s order; reduced(piece) after each; `stream`
  // (out apart from the inputs and read by nobody soon): with non-temporal stores.
  template <class Reduced>
  void reduceMapped(Range mine, char* out, const std::vector<const char*>& in, const Reduced& reduced,
                    bool stream = false) {
    const size_t piece = pieceElems(n_ == 2 ? kPairPiece : kStarPiece);
    const void* srcs[kDirectMaxRanks];
    for (size_t b = mine.begin; b < mine.end; b += piece) {
      const Range r{b, std::min(mine.end, b + piece)};
      void* dst = at(out, r.begin - mine.begin);
      reduceToMany(a_.type, a_.op, &dst, 1, stream ? 1 : 0, operands(r, in, srcs), n_, r.size(), avgRanks());
      reduced(r);
    }
  }

  // Single copies every other rank pulls, starting with the next rank.
  void offerToEveryPeer(int c, const char* p, size_t elems) {
    if (!elems) return;
    for (int i = 1; i < n_; ++i) send(c, (me_ + i) % n_, p, elems, false, Copier::kPull);
  }

  // Both ranks of a pair at once: this rank offers its input `theirs` (elements of the send buffer) to the peer,
  // which pulls it piece by piece (single copies, channel 0), and pulls the peer's input `mine` piece by piece into
  // kPairSlots scratch slots, reducing each with its own input into `out` (element i of `mine` at out[i -
  // mine.begin]). After reducing piece k it calls reduced(piece), then theirsPiece(piece k of `theirs`).
  template <class Reduced, class TheirsPiece>
  void pairReduce(Range mine, Range theirs, char* out, Reduced reduced, TheirsPiece theirsPiece) {
    const int peer = 1 - me_;
    const size_t piece = std::max<size_t>(1, kPairPiece / es_);
    auto pieceAt = [&](Range r, size_t k) {
      size_t b = r.begin + k * piece;
      return Range{b, std::min(r.end, b + piece)};
    };
    const size_t nMine = (mine.size() + piece - 1) / piece, nTheirs = (theirs.size() + piece - 1) / piece;
    char* tmp = l_.scratch(kPairSlots * piece * es_);
    auto slot = [&](size_t k) { return tmp + (k % kPairSlots) * piece * es_; };
    for (size_t k = 0; k < nTheirs; ++k) {
      Range r = pieceAt(theirs, k);
      send(0, peer, at(send_, r.begin), r.size(), false, Copier::kPull);
    }
    int h[kPairSlots];
    for (size_t k = 0; k < std::min(nMine, kPairSlots); ++k) h[k] = recv(0, peer, slot(k), pieceAt(mine, k).size());
    for (size_t k = 0; k < std::max(nMine, nTheirs); ++k) {
      if (k < nMine) {
        Range r = pieceAt(mine, k);
        char* dst = at(out, r.begin - mine.begin);
        l_.wait(h[k % kPairSlots]);
        reduce2(dst, slot(k), at(send_, r.begin), r.size());
        avg(dst, r.size());
        reduced(r);
        if (k + kPairSlots < nMine) h[k % kPairSlots] = recv(0, peer, slot(k), pieceAt(mine, k + kPairSlots).size());
      }
      if (k < nTheirs) theirsPiece(pieceAt(theirs, k));
    }
    l_.waitAll();
  }

  // Each rank sends its whole input to every other rank and reduces all inputs itself, in rank order (so every rank
  // computes the same bits): one round of messages, the lowest latency on one host.
  void allReduceDirect() {
    size_t count = a_.count, bytes = count * es_;
    if (n_ == 1) return copyIfApart(recv_, send_, count), avg(recv_, count);
    if (n_ > kDirectMaxRanks) fail(StatusCode::kInvalidUsage, "Direct is for at most {} ranks", kDirectMaxRanks);
    l_.connectAll();
    char* tmp = l_.scratch(bytes * n_);
    for (int i = 1; i < n_; ++i) {
      int to = (me_ + i) % n_, from = (me_ - i + n_) % n_;
      recv(0, from, tmp + from * bytes, count, true);
      send(0, to, send_, count, true);
    }
    l_.waitAll();
    const void* srcs[kDirectMaxRanks];
    for (int q = 0; q < n_; ++q) srcs[q] = q == me_ ? static_cast<const void*>(send_) : tmp + q * bytes;
    if (me_ == 0) {
      reduceMany(a_.type, a_.op, recv_, srcs, n_, count);
    } else {
      // dst may alias only srcs[0]: reduce into the scratch of rank 0's input, then copy out.
      reduceMany(a_.type, a_.op, tmp, srcs, n_, count);
      std::memcpy(recv_, tmp, bytes);
    }
    avg(recv_, count);
  }

  // Rank r owns split r of the buffer. Per slice k (chunk k of every split): every rank sends chunk k of each
  // peer's split to that peer and receives chunk k of its own split from every peer (through the FIFOs, all at
  // once), then reduces the n copies, its input first (dst may alias only srcs[0]), into its output; then every
  // rank takes every other rank's reduced split into its output (single copies, all at once).
  void allReduceDirectSplit() {
    size_t count = a_.count;
    if (n_ == 1) return copyIfApart(recv_, send_, count), avg(recv_, count);
    if (n_ > kDirectMaxRanks) fail(StatusCode::kInvalidUsage, "DirectSplit is for at most {} ranks", kDirectMaxRanks);
    l_.connectAll();
    auto mine = [&](int q) { return split(count, n_, q); };
    size_t nSlices = 0;
    for (int q = 0; q < n_; ++q) nSlices = std::max(nSlices, (mine(q).size() + chunk_ - 1) / chunk_);
    size_t maxChunk = std::min(chunk_, (count + n_ - 1) / n_);
    char* tmp = l_.scratch(maxChunk * es_ * n_);
    const void* srcs[kDirectMaxRanks];
    for (size_t k = 0; k < nSlices; ++k) {
      Range in = pieceOf(mine(me_), k);
      for (int i = 1; i < n_; ++i) {
        int to = (me_ + i) % n_, from = (me_ - i + n_) % n_;
        Range out = pieceOf(mine(to), k);
        if (in.size()) recv(k % nCh_, from, tmp + from * maxChunk * es_, in.size(), true);
        if (out.size()) send(k % nCh_, to, at(send_, out.begin), out.size(), true);
      }
      l_.waitAll();
      if (!in.size()) continue;
      srcs[0] = at(send_, in.begin);
      for (int i = 1; i < n_; ++i) srcs[i] = tmp + ((me_ + i) % n_) * maxChunk * es_;
      reduceMany(a_.type, a_.op, at(recv_, in.begin), srcs, n_, in.size());
      avg(at(recv_, in.begin), in.size());
    }
    for (int i = 1; i < n_; ++i) {
      int to = (me_ + i) % n_, from = (me_ - i + n_) % n_;
      if (mine(from).size()) recv(0, from, at(recv_, mine(from).begin), mine(from).size());
      if (mine(me_).size()) send(0, to, at(recv_, mine(me_).begin), mine(me_).size());
    }
    l_.waitAll();
  }

  // Reduce up the tree then broadcast down, in chunks: a chunk goes up as soon as the children's copies of it
  // arrived (reduced with the rank's input in one reduceMany), and down as soon as the parent's arrived, so that the
  // two halves overlap: the root sends chunk k down right after reducing it, and every other rank forwards chunk
  // k - kTreeDownLag down after sending chunk k up (the children's chunks are posted first, the parent's chunk k
  // once chunk k went up out of the same place; a rank waits on its parent's chunks while a child on another channel
  // still sends, so these receives start at once, Op::ordered). Across two hosts up and down
  // cross the link in opposite directions at once: each NIC carries the message once each way, against the ring's
  // 2(n-1)/n. Channels alternate the two trees of the double binary tree.
  void allReduceTree() {
    size_t count = a_.count;
    // Across hosts one channel: there the channels' steps go over the point-to-point connectors, which channels may
    // share (Connections::linkConnector), and a shared connector matches in order; a peer that is this rank's
    // parent on one channel and its child on the other sends its down and up chunks in an order of its own timing.
    const int nCh = c_.acrossHosts ? 1 : nCh_;
    std::vector<Range> ch(nCh);
    for (int c = 0; c < nCh; ++c) ch[c] = split(count, nCh, c);
    char* tmp = l_.scratch(count * es_ * 3);
    auto nChunks = [&](int c) { return (ch[c].size() + chunk_ - 1) / chunk_; };
    auto chunk = [&](int c, size_t k) {
      size_t b = ch[c].begin + k * chunk_;
      return Range{b, std::min(ch[c].end, b + chunk_)};
    };
    size_t maxChunks = 0;
    for (int c = 0; c < nCh; ++c) maxChunks = std::max(maxChunks, nChunks(c));
    // kids[c][k * 3 + i]: child i's chunk k; down[c][k]: the parent's chunk k (-1: none, or the root).
    std::vector<std::vector<int>> kids(nCh), down(nCh);
    for (int c = 0; c < nCh; ++c) {
      kids[c].assign(nChunks(c) * 3, -1);
      down[c].assign(nChunks(c), -1);
      for (size_t k = 0; k < nChunks(c); ++k) {
        Range r = chunk(c, k);
        for (int i = 0; i < 3; ++i)
          if (int d = l_.treeDown(c, i); d >= 0)
            kids[c][k * 3 + i] = recv(c, d, at(tmp, i * count + r.begin), r.size(), true);
      }
    }
    auto sendDown = [&](int c, size_t k) {
      Range r = chunk(c, k);
      for (int i = 0; i < 3; ++i)
        if (int d = l_.treeDown(c, i); d >= 0) send(c, d, at(recv_, r.begin), r.size());
    };
    for (size_t k = 0; k < maxChunks + kTreeDownLag; ++k)
      for (int c = 0; c < nCh; ++c) {
        if (k < nChunks(c)) {
          Range r = chunk(c, k);
          const void* srcs[4] = {at(send_, r.begin)};
          int ns = 1;
          for (int i = 0; i < 3; ++i)
            if (kids[c][k * 3 + i] >= 0) l_.wait(kids[c][k * 3 + i]), srcs[ns++] = at(tmp, i * count + r.begin);
          if (ns > 1) reduceMany(a_.type, a_.op, at(recv_, r.begin), srcs, ns, r.size());
          else copyIfApart(at(recv_, r.begin), srcs[0], r.size());
          if (l_.treeUp(c) >= 0) {
            send(c, l_.treeUp(c), at(recv_, r.begin), r.size(), true);
            down[c][k] = recv(c, l_.treeUp(c), at(recv_, r.begin), r.size());
          } else {
            avg(at(recv_, r.begin), r.size());
            sendDown(c, k);
          }
        }
        if (l_.treeUp(c) < 0 || k < kTreeDownLag || k - kTreeDownLag >= nChunks(c)) continue;
        l_.wait(down[c][k - kTreeDownLag]);
        sendDown(c, k - kTreeDownLag);
      }
    l_.waitAll();
  }

  // Step s: the rank at ring position p forwards rank ring[p-s]'s block and receives ring[p-s-1]'s.
  void allGatherRing() {
    size_t count = a_.count;
    copyIfApart(at(recv_, me_ * count), send_, count);
    if (n_ == 1) return;
    std::vector<Ring> rings(nCh_);
    for (int c = 0; c < nCh_; ++c) rings[c] = ringOf(c);
    auto blockOf = [&](int c, int q) {  // rank ring[q]'s block of channel c in the output
      const Range r = split(count, nCh_, c);
      const size_t base = static_cast<size_t>(rings[c].r[mod(q)]) * count;
      return Range{base + r.begin, base + r.end};
    };
    ringForward(rings, [&](int c, int s) { return blockOf(c, rings[c].p - s); },
                [&](int c, int s) { return blockOf(c, rings[c].p - s - 1); });
  }

  // The ring's reduce-scatter slice by slice (ringReduceScatter): the block at ring position q is the input of rank
  // ring[q-1]'s block (so the last step reduces the rank's own block into the output); partial sums go to a
  // chunk-sized buffer per channel and step parity, across hosts also per slice of a group (what step s reduced is
  // sent while step s+1 reduces).
  void reduceScatterRing() {
    size_t count = a_.count;
    if (n_ == 1) return copyIfApart(recv_, send_, count), avg(recv_, count);
    if (c_.pair && n_ == 2 && l_.nChannels() >= 2) return reduceScatterPair();
    std::vector<Range> whole(nCh_);
    std::vector<Ring> rings(nCh_);
    for (int c = 0; c < nCh_; ++c) whole[c] = split(count, nCh_, c), rings[c] = ringOf(c);
    size_t nSlices = 0;
    for (const Range& w : whole) nSlices = std::max(nSlices, (w.size() + chunk_ - 1) / chunk_);
    size_t maxChunk = std::min(chunk_, count);
    const size_t slots = rsSlots();  // receive chunks per channel; partial sums: two per receive chunk (step parity)
    char* tmp = l_.scratch(maxChunk * es_ * nCh_ * slots * 3);
    char* acc = tmp + maxChunk * es_ * nCh_ * slots;
    auto block = [&](int c, int q) {
      size_t base = static_cast<size_t>(rings[c].r[mod(q - 1)]) * count;
      return Range{base + whole[c].begin, base + whole[c].end};
    };
    auto partial = [&](int c, int q, Range piece, bool last, size_t k) {
      if (last) return at(recv_, piece.begin - static_cast<size_t>(me_) * count);
      int step = mod(rings[c].p - 1 - q);  // the step that reduces block q
      return acc + ((c * slots + k % slots) * 2 + step % 2) * maxChunk * es_;
    };
    ringReduceScatter(rings, nSlices, tmp, maxChunk, block, partial, true);
  }

  // A pipelined chain along each channel's ring starting at the root. Its transfers are single copies into their
  // final place, so they go in pieces of kBroadcastPiece (each piece costs the peers a hand-over, which on a loaded
  // host is a wake-up: 128 KiB pieces were 2-10x slower at 16 MiB, docs/collectives.md). At 2 ranks nobody
  // forwards: see broadcastPair. The root's own copy (out of place) runs while the peers copy.
  void broadcastChain() {
    size_t count = a_.count;
    const bool root = me_ == a_.root;
    if (n_ == 1) return copyIfApart(recv_, send_, count);
    if (c_.pair && n_ == 2 && l_.nChannels() >= 2 * nCh_) return broadcastPair();
    size_t piece = n_ == 2 ? count : c_.acrossHosts ? chunk_ : std::max(chunk_, kBroadcastPiece / es_);
    // Every channel's pieces are posted first, in piece order across the channels (point-to-point receives from one
    // peer would start in the order they are posted; a collective's start at once, Op::ordered), then forwarded in
    // that order: a rank in the middle of the chains keeps every channel (every NIC across hosts)
    // busy, not one channel after the other.
    std::vector<std::vector<int>> hs(nCh_);
    piecesAcrossChannels(piece, [&](int c, size_t, Range p) {
      Ring g = ringOf(c);
      if (root) send(c, g.next, at(send_, p.begin), p.size(), false, Copier::kPull);  // the root copies its own meanwhile
      else hs[c].push_back(recv(c, g.prev, at(recv_, p.begin), p.size()));
    });
    if (!root)
      piecesAcrossChannels(piece, [&](int c, size_t k, Range p) {
        Ring g = ringOf(c);
        if (g.next == a_.root) return;
        l_.wait(hs[c][k]);
        send(c, g.next, at(recv_, p.begin), p.size());
      });
    rootCopyWhileSending();
    l_.waitAll();
  }

  // Broadcast between 2 ranks: each channel's range in two halves over two connectors (channel c and c + nCh_),
  // each one single copy out of the root's buffer. The receiver pulls the first half; the second is pushed by an
  // in-place root (so that both processes copy at once) and pulled too when the root is busy with its own copy
  // (out of place). The sender picks the mode, so the receiver posts the same two halves either way.
  void broadcastPair() {
    const bool root = me_ == a_.root, inPlace = send_ == recv_;
    for (int c = 0; c < nCh_; ++c) {
      Range r = split(a_.count, nCh_, c);
      size_t mid = r.begin + r.size() / 2;
      Ring g = ringOf(c), h = ringOf(c + nCh_);
      if (root) {
        send(c + nCh_, h.next, at(send_, mid), r.end - mid, false, inPlace ? Copier::kPush : Copier::kPull);
        send(c, g.next, at(send_, r.begin), mid - r.begin, false, Copier::kPull);
      } else {
        recv(c + nCh_, h.prev, at(recv_, mid), r.end - mid);
        recv(c, g.prev, at(recv_, r.begin), mid - r.begin);
      }
    }
    rootCopyWhileSending();
    l_.waitAll();
  }

  // Broadcast on one host between more than 2 ranks (Direct, Choice::star): every other rank pulls each
  // channel's range straight out of the root's buffer, all at once (one single copy each, nobody forwards: a chain
  // makes the last rank wait for every hop), while the root copies its own output (out of place).
  void broadcastStar() {
    if (mapOutputsApply())
      if (const Mapped m = mapPeers(true, true, a_.root); !m.in.empty() && !m.out.empty()) {
        // Rank r copies block r of the root's input into every output (the root's own out of place): the input read
        // once, the outputs written once.
        const Range mine = split(a_.count, n_, me_);
        return spreadToOutputs(m.out, mine.begin, at(m.in[a_.root], mine.begin), mine.size());
      }
    l_.connectAll();
    for (int c = 0; c < nCh_; ++c) {
      Range r = split(a_.count, nCh_, c);
      if (!r.size()) continue;
      if (me_ != a_.root) {
        recv(c, a_.root, at(recv_, r.begin), r.size());
        continue;
      }
      offerToEveryPeer(c, at(send_, r.begin), r.size());
    }
    rootCopyWhileSending();
    l_.waitAll();
  }

  // f(channel, k, piece) for piece k of every channel's range (split(count, nCh_, c)) in pieces of `piece`
  // elements, in piece order across the channels: piece 0 of every channel, then piece 1, ...
  template <class F>
  void piecesAcrossChannels(size_t piece, F f) {
    piece = std::max<size_t>(1, piece);
    size_t most = 0;
    for (int c = 0; c < nCh_; ++c) most = std::max(most, (split(a_.count, nCh_, c).size() + piece - 1) / piece);
    for (size_t k = 0; k < most; ++k)
      for (int c = 0; c < nCh_; ++c) {
        const Range r = split(a_.count, nCh_, c);
        const size_t b = r.begin + k * piece;
        if (b < r.end) f(c, k, Range{b, std::min(r.end, b + piece)});
      }
  }

  // Out of place, the root copies its input to its output while its sends (started first) are under way (nobody reads
  // that output during the call).
  void rootCopyWhileSending() {
    if (me_ != a_.root || send_ == recv_) return;
    l_.start();
    copyUnread(recv_, send_, a_.count);
  }

  // A pipelined chain along each channel's ring ending at the root: each rank adds its input to what its ring
  // predecessor sent and passes it on.
  void reduceChain() {
    size_t count = a_.count;
    if (n_ == 1) return copyIfApart(recv_, send_, count), avg(recv_, count);
    char* tmp = l_.scratch(count * es_ * 2);
    char* acc = tmp + count * es_;
    const bool root = me_ == a_.root;
    // As broadcastChain: every channel's chunks posted first in chunk order across the channels, then reduced and
    // passed on in that order.
    std::vector<std::vector<int>> hs(nCh_);
    piecesAcrossChannels(chunk_, [&](int c, size_t, Range p) {
      Ring g = ringOf(c);
      if (g.prev == a_.root) send(c, g.next, at(send_, p.begin), p.size(), true);
      else hs[c].push_back(recv(c, g.prev, at(tmp, p.begin), p.size(), true));
    });
    piecesAcrossChannels(chunk_, [&](int c, size_t k, Range p) {
      if (k >= hs[c].size()) return;  // this rank starts channel c's chain
      l_.wait(hs[c][k]);
      char* dst = root ? at(recv_, p.begin) : at(acc, p.begin);
      reduce2(dst, at(tmp, p.begin), at(send_, p.begin), p.size());
      if (root) avg(dst, p.size());
      else send(c, ringOf(c).next, dst, p.size(), true);
    });
    l_.waitAll();
  }

  Links& l_;
  const Args& a_;
  const Choice& c_;
  int n_, me_;
  size_t es_;
  const char* send_;
  char* recv_;
  int nCh_;
  size_t chunk_;  // elements
};

}  // namespace

void run(Links& links, const Args& a, const Choice& c) {
  if (a.count == 0) return;
  Runner(links, a, c).run();
}

}  // namespace topocoll::collectives
