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

#include "topocoll/export.h"

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
TOPOCOLL_API const char* collName(Coll c);  // NCCL's names: "AllReduce", "Broadcast", ...
/// Whether the collective takes a reduction op / a root (the others ignore what the caller passed).
constexpr bool reduces(Coll c) { return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter; }
constexpr bool rooted(Coll c) { return c == Coll::kBroadcast || c == Coll::kReduce; }

/// Ring and Tree are NCCL's (ids 1 and 0 in its logs); Direct: every rank sends its data to every other rank and
/// reduces everything itself in rank order (one round of messages: the small-size algorithm of one host), or with
/// Choice::star, every rank pulls what it needs straight out of the peers' buffers;
/// DirectSplit: every rank reduces its split (1/n) of everybody's data, slice by slice, then takes every other
/// rank's reduced split (one round of messages per slice and one for the all-gather, instead of the ring's 2(n-1)
/// dependent steps: the large-size algorithm of one host with many ranks per core).
enum class Algo : int { kTree = 0, kRing = 1, kDirect = 2, kDirectSplit = 3 };
/// The most ranks Direct, DirectSplit and the star shapes run (their per-peer arrays; tuning::kHostDirectMaxRanks).
constexpr int kDirectMaxRanks = 8;
TOPOCOLL_API const char* algoName(Algo a);
TOPOCOLL_API const char* protoName(Proto p);

struct Args {
  Coll coll = Coll::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // NCCL's count: AllGather sendcount, ReduceScatter recvcount
  DataType type = DataType::kUint8;
  RedOp op = RedOp::kSum;
  int root = 0;
  void* stream = nullptr;  // device buffers: the caller's cudaStream_t (runtime's device path; nullptr: legacy stream)
  uint64_t seq = 0;        // the communicator's number of this collective call (every rank counts the same calls)
};

/// What to run: decided by the caller (the runtime asks tuning::hostDecide), executed as given.
struct Choice {
  Algo algo = Algo::kRing;
  Proto proto = Proto::kSimple;
  int nChannels = 1;
  size_t chunkBytes = 512 << 10;  // pipelining unit of chains and trees
  /// Direct: the star shape (allReduceStar, allGatherStar, reduceScatterStar, broadcastStar: pulls straight out of
  /// the peers' buffers, 3-8 ranks; AllGather from 2).
  bool star = false;
  /// 2 ranks, Ring (AllReduce, ReduceScatter) or the chain (Broadcast): the pair shape (single copies out of the
  /// peer's buffers, two connectors). Needs the links' channels (2; Broadcast 2 per channel used): else the ring.
  bool pair = false;
  /// The star and pair shapes may map every peer's input (exchanging descriptions first), and also write into
  /// every peer's output (mapOutputs).
  bool mapPeers = false, mapOutputs = false;
  /// Ranks on more than one host: the chains (Broadcast) forward in chunkBytes pieces, not in the large pieces that
  /// save one host's wake-ups (a host forwarding a whole large piece at a time leaves the links idle in turn).
  bool acrossHosts = false;
};

/// Runs the collective `a` with `c`. Every rank calls it with the same collective, count, type, op and root.
void run(Links& links, const Args& a, const Choice& c);

/// The one-shot algorithm of small collectives (tuning::hostOneShot decides it): every message at once through the
/// links' mailboxes (progress/mailboxes.h), then a local finish. false (nothing done, on every rank alike) when the
/// links have none or the ranks found some connection without one: run() then. Throws like run().
bool runOneShot(Links& links, const Args& a);

/// What a rank called, in 64 bits, for its peers to compare (progress::CallSignature; every message of the
/// collective carries it in its header): bits 0-2 the collective + 1, 3-7 the type, 8-11 the op + 1 (reductions),
/// 12-27 the root + 1 (Broadcast, Reduce; modulo 65535), 28-31 the call's number (Args::seq modulo 16), 32-63 the
/// count (modulo 2^32). Two calls that differ in any of these differ in the word.
uint64_t callSignature(const Args& a);
/// The word in words: "AllReduce(count 4096, float32, sum)", "Broadcast(count 8, int8, root 3)".
std::string describeCall(uint64_t word);

/// Bytes NCCL's tuning counts for a collective (the message size in its "N Bytes -> Algo" line): AllGather and
/// ReduceScatter count all ranks' data.
size_t collBytes(const Args& a, int nRanks);

}  // namespace topocoll::collectives
