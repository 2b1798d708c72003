// The collective algorithms on CPU threads (NCCL 2.30.7 src/device/all_reduce.h, all_gather.h, reduce_scatter.h,
// broadcast.h, reduce.h: the same rings, chains and trees, our own code). An algorithm sees the communicator only
// through `Links` (progress/links.h): asynchronous sends and receives of byte ranges to a ring or tree neighbour on
// one channel, which complete in issue order per connection. The progress layer implements Links over the transport
// connectors that init connected (rings and trees, connIndex 0) and the point-to-point ones (direct algorithm).
//
//   collectives::Args a{Coll::kAllReduce, send, recv, count, DataType::kFloat32, RedOp::kSum, 0};
//   collectives::Choice c = collectives::choose(a, links.nRanks(), links.nChannels(), forced);
//   collectives::run(links, a, c);   // throws the first failed transfer's Error (naming the peer)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "topocoll/datatype.h"
#include "topocoll/progress/links.h"

namespace topocoll::collectives {

using progress::Copier;
using progress::Links;
using progress::PeerBuffer;
using progress::Proto;

enum class Coll : int { kAllReduce = 0, kBroadcast, kReduce, kAllGather, kReduceScatter };
const char* collName(Coll c);  // NCCL's names: "AllReduce", "Broadcast", ...

/// Ring and Tree are NCCL's (ids 1 and 0 in its logs); Direct: every rank sends its data to every other rank and
/// reduces everything itself in rank order (one round of messages: the small-size algorithm of one host; Broadcast:
/// every rank pulls from the root, see kBroadcastStarMin);
/// DirectSplit: every rank reduces its split (1/n) of everybody's data, slice by slice, then takes every other
/// rank's reduced split (one round of messages per slice and one for the all-gather, instead of the ring's 2(n-1)
/// dependent steps: the large-size algorithm of one host with many ranks per core).
enum class Algo : int { kTree = 0, kRing = 1, kDirect = 2, kDirectSplit = 3 };
constexpr int kDirectMaxRanks = 8;
/// Broadcast with Direct (one host, more than 2 ranks) from this size: every rank pulls the root's buffer at once;
/// below, and with Ring, a pipelined chain.
constexpr size_t kBroadcastStarMin = 64 << 10;
/// ReduceScatter with Direct (one host, 3 to kDirectMaxRanks ranks) from this size of a rank's output: every rank
/// pulls its block of every peer's input piece by piece and reduces them; below, and with Ring, the ring (measured at
/// 4 ranks: 1.2x faster at 256 KiB a rank, level at 64 KiB).
constexpr size_t kReduceScatterStarMin = 256 << 10;
/// AllReduce with Direct (one host, 3 to kDirectMaxRanks ranks) from this size of a rank's block (count / nRanks):
/// the reduce-scatter of reduceScatterStar on block r of the buffer, then every rank pulls the other ranks' reduced
/// blocks out of their outputs; below, Direct sends every input to every rank (measured at 3, 4 and 8 ranks against
/// the ring: 0.55-0.94x with 32 KiB blocks, mixed at 64 KiB, 1.2-1.6x out of place but level in place at 85-96 KiB,
/// 1.2-1.4x out of place and 1.0-1.7x in place from 128 KiB). AllGather with Direct from kAllGatherStarMin of a
/// rank's input: every rank pulls every peer's input straight into its output; below, and with Ring, the ring
/// (0.15-0.35x of the ring out of place at 16-32 KiB, where the pulls go through the FIFOs below
/// TOPOCOLL_P2P_SINGLE_COPY; 1.4-3.4x at 64 KiB). bench/results/2026-11-24-coll-star-3-8-ranks-ab-7ca0bab.md.
constexpr size_t kAllReduceStarMin = 128 << 10;
constexpr size_t kAllGatherStarMin = 64 << 10;
/// AllGather with Direct between 2 ranks of one host from this size of a rank's input: allGatherStar (each rank
/// pulls the peer's input into its output while it copies its own) instead of the ring's one step. Not piece by
/// piece out of the owner's output right after the owner's copy (so that the peer reads it from the cache): with
/// mapped shareable buffers and non-temporal stores the star is 1.1-1.7x faster out of place from 2 MiB of output,
/// heap buffers included (bench/results/2026-11-29-coll-design-notes-ea90390.md).
constexpr size_t kAllGatherPairMin = 1 << 20;
const char* algoName(Algo a);
const char* protoName(Proto p);

struct Args {
  Coll coll = Coll::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // NCCL's count: AllGather sendcount, ReduceScatter recvcount
  DataType type = DataType::kUint8;
  RedOp op = RedOp::kSum;
  int root = 0;
  void* stream = nullptr;  // device buffers: the caller's cudaStream_t (runtime's device path; nullptr: legacy stream)
};

struct Choice {
  Algo algo = Algo::kRing;
  Proto proto = Proto::kSimple;
  int nChannels = 1;
  size_t chunkBytes = 512 << 10;  // pipelining unit of chains and trees
};

/// Runs the collective `a` with `c`. Every rank calls it with the same collective, count, type, op and root.
void run(Links& links, const Args& a, const Choice& c);

/// Whether `a` between `nRanks` ranks of one host runs a star algorithm (every rank pulls what it needs straight out
/// of the peers' buffers: AllReduce, AllGather, ReduceScatter, Broadcast; between 2 ranks AllGather only) when
/// Direct is chosen: what choose() picks Direct for when NCCL_ALGO leaves the choice.
bool starApplies(const Args& a, int nRanks);

/// Bytes NCCL's tuning counts for a collective (the message size in its "N Bytes -> Algo" line): AllGather and
/// ReduceScatter count all ranks' data.
size_t collBytes(const Args& a, int nRanks);

}  // namespace topocoll::collectives
