// Every choice the collectives on host memory make, in one place: the one-shot mailbox path or the engine, the
// algorithm (Tree, Ring, Direct, DirectSplit), its shape (the 2-rank pair variants, the star variants that pull
// straight out of the peers' buffers, the mapped inputs and outputs), protocol, channels and pipelining unit. The
// runtime asks once per call; the collectives layer executes the answer without deciding anything itself.
//
//   tuning::HostPolicy p = tuning::HostPolicy::make(cfg, HostLink::kP2p, nRanks, /*oneHost=*/true, nRings);
//   tuning::HostDecision d = tuning::hostDecide(p, {kAllReduce, rankBytes, collBytes, linkChannels, mailboxes});
//   TC_INFO(kTuning, "{}", tuning::describe(p, call, d));   // the choice and its reason
//
// The numbers come from two tables: the cost model's calibrated constants (HostModel, host_constants.inc, which
// bench/host_calibrate regenerates) and HostThresholds below, the sizes at which a shape starts to pay, each from the
// A/B run its comment names (bench/results/). NCCL_ALGO / NCCL_PROTO restrict the same decision; NCCL_DEBUG_SUBSYS=
// TUNING logs each decision with its reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/tuning/host_model.h"

namespace topocoll::tuning {

/// The largest job the Direct, DirectSplit, star and one-shot algorithms run (their per-peer arrays).
constexpr int kHostDirectMaxRanks = 8;
/// The host algorithms beyond HostModel's three: DirectSplit (every rank reduces its 1/n of everybody's data, slice
/// by slice, then takes the others' reduced splits) and OneShot (every message at once into the peers' mailboxes).
constexpr int kHostDirectSplit = 3, kHostOneShot = 4;
const char* hostDecisionAlgoName(int algo);  // "Tree", "Ring", "Direct", "DirectSplit", "OneShot"

/// The sizes at which the host algorithms change shape (bytes). One host, NCCL_ALGO leaving the choice.
struct HostThresholds {
  /// Broadcast, 3-8 ranks: every rank pulls the root's buffer at once (broadcastStar) from this size; below, the
  /// pipelined chain. bench/results/2026-11-24-coll-star-3-8-ranks-ab-7ca0bab.md.
  uint64_t broadcastStarMin = 64 << 10;
  /// ReduceScatter, 3-8 ranks, a rank's output: every rank pulls its block of every peer's input and reduces it
  /// (reduceScatterStar). Measured at 4 ranks: 1.2x faster at 256 KiB, level at 64 KiB (same run).
  uint64_t reduceScatterStarMin = 256 << 10;
  /// AllReduce, 3-8 ranks, a rank's block (bytes / nRanks): the star reduce-scatter then pulls of the reduced
  /// blocks (allReduceStar); below, Direct sends every input to every rank. Against the ring: 0.55-0.94x with
  /// 32 KiB blocks, mixed at 64 KiB, 1.2-1.6x out of place at 85-96 KiB, 1.2-1.4x (1.0-1.7x in place) from 128 KiB.
  uint64_t allReduceStarMin = 128 << 10;
  /// AllGather, 3-8 ranks, a rank's input: every rank pulls every peer's input into its output (allGatherStar).
  /// 0.15-0.35x of the ring at 16-32 KiB (the pulls go through the FIFOs), 1.4-3.4x at 64 KiB (same run).
  uint64_t allGatherStarMin = 64 << 10;
  /// AllGather, 2 ranks, a rank's input: allGatherStar instead of the ring's one step; 1.1-1.7x from 2 MiB of output
  /// (bench/results/2026-11-29-coll-design-notes-ea90390.md).
  uint64_t allGatherPairMin = 1 << 20;
  /// AllReduce, 2 ranks (Ring, the links have 2 channels): allReducePair, single copies out of the peer's buffers.
  /// 2x faster at 1-2 MiB; level out of place and 10-25% slower in place at 256-512 KiB (same notes).
  uint64_t allReducePairMin = 1 << 20;
  /// ReduceScatter, 2 ranks, a rank's output: reduceScatterPair. 1.3x faster at 64 KiB, 2x from 128 KiB, slower out
  /// of place at 32 KiB (same notes).
  uint64_t reduceScatterPairMin = 64 << 10;
  /// Broadcast, 2 ranks: two halves over two connectors (broadcastPair) instead of one single copy.
  /// bench/results/2026-11-23-coll-2rank-broadcast-ab-c91eeb1.md.
  uint64_t broadcastPairMin = 512 << 10;
  /// Star and pair reductions reduce straight out of the peers' mapped inputs from this many bytes of the collective
  /// (two rounds of small messages decide it, which the copies they save repay from here).
  uint64_t mappedInputsMin = 1 << 20;
  /// AllReduce writes each rank's block straight into every rank's output from here; AllGather and the 3-8 rank
  /// Broadcast from mappedCopiesMin (measured at 4 ranks: 1 MiB 0.72-0.76x of the pulls, 2 MiB level, 4-8 MiB
  /// 1.1-1.7x; bench/results/2026-11-29-coll-mapped-outputs-ab-91b8667.md).
  uint64_t mappedOutputsMin = 1 << 20;
  uint64_t mappedCopiesMin = 4 << 20;
};

/// One entry of HostThresholds by name: what TOPOCOLL_HOST_THRESHOLDS overrides and bench/host_thresholds.py
/// calibrates, with where it is measured: the topocoll-perf test, the rank count, and how the perf tool's size
/// relates to the value (`sizePerValue` ranks: the value is a rank's share of the perf tool's size).
struct HostThresholdField {
  const char* name;
  uint64_t HostThresholds::*member;
  const char* perfTest;
  int ranks;
  int sizePerValue;
};
const std::vector<HostThresholdField>& hostThresholdFields();
/// `t` with the entries of `spec` ("name=bytes,name=bytes", TOPOCOLL_HOST_THRESHOLDS) replaced. Throws
/// Error(kInvalidArgument) naming the knob and the entry: an unknown name (the known ones listed), a value that is
/// not a byte count.
HostThresholds withOverrides(HostThresholds t, const std::string& spec);

/// What init fixes for every call of a communicator: the job, the knobs, the two tables.
struct HostPolicy {
  HostModel model;
  HostLimits limits;
  HostThresholds thresholds;
  HostLink link = HostLink::kP2p;
  int nRanks = 1;
  bool oneHost = true;
  bool algoForced = false, protoForced = false;  // NCCL_ALGO / NCCL_PROTO set
  uint64_t chunkBytes = 4096;                    // pipelining unit of chains and trees (NCCL_BUFFSIZE / 32)
  uint64_t oneShotMax = 256;                     // TOPOCOLL_ONESHOT_MAX: per-peer bytes of the mailbox path
  long long directSplitMin = -1;                 // TOPOCOLL_DIRECT_SPLIT_MIN (-1: off)
  int directSplitRanks = 4;                      // TOPOCOLL_DIRECT_SPLIT_RANKS
  uint64_t llThreshold = 16384;                  // NCCL_P2P_LL_THRESHOLD (DirectSplit's messages)
  int rails = 1;                                 // across hosts: the NICs every host has (HostQuery::rails)
  double netGBps = 0;                            // across hosts: the slowest NIC's rate, GB/s (HostQuery::netGBps)
  int hosts = 1;                                 // across hosts: how many (HostQuery::hosts)
  /// The model from TOPOCOLL_HOST_TUNING (or the built-in constants), the limits NCCL_ALGO, NCCL_PROTO and the
  /// channel knobs leave over `nRings` rings. Throws Error naming the knob on a bad value.
  static HostPolicy make(const Config& cfg, HostLink link, int nRanks, bool oneHost, int nRings);
  /// The cost model's question for `bytes` of `coll` over `ranks` ranks on this policy's link, chunk and NICs.
  HostQuery query(int coll, int ranks, uint64_t bytes) const;
};

/// One call, as the decision needs it.
struct HostCall {
  int coll = kAllReduce;
  uint64_t rankBytes = 0;  // count x element size (AllGather: a rank's input; ReduceScatter: a rank's output)
  uint64_t bytes = 0;      // NCCL's count of the call (AllGather, ReduceScatter: every rank's data)
  int linkChannels = 1;    // channels the communicator's links have (the pair shapes need 2, Broadcast 2 per channel)
  bool mailboxes = false;  // every connection has a point-to-point mailbox (host memory, one host, agreed by all)
};

struct HostDecision {
  int algo = kRing;  // kTree, kRing, kHostDirect, kHostDirectSplit, kHostOneShot
  int proto = kSimple;
  int nChannels = 1;
  uint64_t chunkBytes = 4096;
  bool star = false;        // Direct: the star shape (pulls out of the peers' buffers)
  bool pair = false;        // 2 ranks: the pair shape (AllReduce, ReduceScatter, Broadcast)
  bool mapPeers = false;    // the star and pair shapes may map the peers' buffers (inputs)
  bool mapOutputs = false;  // ... and write into the peers' outputs
  double timeUs = 0;        // the cost model's estimate (0: not estimated)
  const char* reason = "";  // why this algorithm (static text)
};

/// Whether `call` takes the one-shot mailbox path: the first rule of hostDecide, cheap enough for every blocking
/// call to ask before anything else (inline: the smallest collectives take ~130 ns in all). Below
/// TOPOCOLL_ONESHOT_MAX nothing else comes close (docs/collectives.md, OneShot): one trip through shared memory
/// instead of the ring's 2(n-1) steps, no engine. NCCL_ALGO / NCCL_PROTO name NCCL's algorithms: forced calls run
/// those.
inline bool hostOneShot(const HostPolicy& p, const HostCall& call) {
  return call.mailboxes && p.oneHost && p.nRanks >= 2 && p.nRanks <= kHostDirectMaxRanks && call.rankBytes > 0 &&
         !p.algoForced && !p.protoForced && call.rankBytes <= p.oneShotMax;
}
/// The shape of `algo` for `call` (star, pair, mapped buffers): the thresholds' rules.
void hostShape(const HostThresholds& t, int nRanks, const HostCall& call, int nChannels, HostDecision* d);
/// The whole decision. Every rank computes the same from the same call, knobs and job facts.
HostDecision hostDecide(const HostPolicy& p, const HostCall& call);
/// One line for NCCL_DEBUG_SUBSYS=TUNING: "AllReduce: 1048576 Bytes -> Algo Direct (star, mapped) proto Simple
/// channel{Lo..Hi}={0..1} (model 97.3 us, P2P): <reason>".
std::string describe(const HostPolicy& p, const HostCall& call, const HostDecision& d);

}  // namespace topocoll::tuning
