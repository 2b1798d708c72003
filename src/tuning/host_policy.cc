#include "topocoll/tuning/host_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>

#include "topocoll/status.h"

namespace topocoll::tuning {

namespace {

// NCCL's buffer is 8 steps; a slice of a quarter step keeps the block a rank receives in the cache until it is
// reduced (2 MiB L2 here).
constexpr uint64_t kChunkDivisor = 8 * 4;
// Across hosts (HostLink::kNet): a whole step.
constexpr uint64_t kNetChunkDivisor = 8;
// Across hosts a ring AllReduce's slices shrink while a rank's chunk holds fewer than kNetSlicesPerChunk of them
// (the pipeline fills and drains one slice at each end of the ring), down to what the slowest NIC carries in
// kNetSliceMinS (each slice is a NET message with its own header, acknowledgement and proxy hop; 128 KiB slices,
// half a millisecond at 2 Gbit/s, kept a ring over 3 or 4 hosts' links 62-75% busy). Measured on the emulated
// cluster: docs/cluster.md, "Across hosts, side by side".
constexpr uint64_t kNetSlicesPerChunk = 8;
constexpr double kNetSliceMinS = 2e-3;

// The slice of a ring AllReduce of `bytes` across hosts on `nChannels` channels (at most `full`, the whole step).
uint64_t netRingSlice(const HostPolicy& p, uint64_t bytes, int nChannels, uint64_t full) {
  if (p.netGBps <= 0 || p.nRanks < 2) return full;
  const uint64_t floor = std::max<uint64_t>(4096, std::bit_ceil(static_cast<uint64_t>(p.netGBps * 1e9 * kNetSliceMinS)));
  const uint64_t perRank = bytes / static_cast<uint64_t>(p.nRanks) / static_cast<uint64_t>(std::max(1, nChannels));
  return std::min(full, std::max(floor, std::bit_floor(perRank / kNetSlicesPerChunk)));
}

// Star shapes: every rank pulls what it needs straight out of the peers' buffers (AllReduce, AllGather,
// ReduceScatter, Broadcast; between 2 ranks AllGather only).
bool starApplies(const HostThresholds& t, int coll, int nRanks, uint64_t rankBytes) {
  if (nRanks < 2) return false;
  if (nRanks == 2) return coll == kAllGather && rankBytes >= t.allGatherPairMin;
  const bool small = nRanks <= kHostDirectMaxRanks;
  switch (coll) {
    case kBroadcast: return rankBytes >= t.broadcastStarMin;
    case kAllReduce: return small && rankBytes >= static_cast<uint64_t>(nRanks) * t.allReduceStarMin;
    case kAllGather: return small && rankBytes >= t.allGatherStarMin;
    case kReduceScatter: return small && rankBytes >= t.reduceScatterStarMin;
    default: return false;
  }
}

}  // namespace

const char* hostDecisionAlgoName(int algo) {
  switch (algo) {
    case kHostDirectSplit: return "DirectSplit";
    case kHostOneShot: return "OneShot";
    default: return hostAlgoName(algo);
  }
}

const std::vector<HostThresholdField>& hostThresholdFields() {
  static const std::vector<HostThresholdField> fields = {
      {"broadcastStarMin", &HostThresholds::broadcastStarMin, "broadcast_perf", 4, 1},
      {"reduceScatterStarMin", &HostThresholds::reduceScatterStarMin, "reduce_scatter_perf", 4, 4},
      {"allReduceStarMin", &HostThresholds::allReduceStarMin, "all_reduce_perf", 4, 4},
      {"allGatherStarMin", &HostThresholds::allGatherStarMin, "all_gather_perf", 4, 4},
      {"allGatherPairMin", &HostThresholds::allGatherPairMin, "all_gather_perf", 2, 2},
      {"allReducePairMin", &HostThresholds::allReducePairMin, "all_reduce_perf", 2, 1},
      {"reduceScatterPairMin", &HostThresholds::reduceScatterPairMin, "reduce_scatter_perf", 2, 2},
      {"broadcastPairMin", &HostThresholds::broadcastPairMin, "broadcast_perf", 2, 1},
      {"mappedInputsMin", &HostThresholds::mappedInputsMin, "all_reduce_perf", 4, 1},
      {"mappedOutputsMin", &HostThresholds::mappedOutputsMin, "all_reduce_perf", 4, 1},
      {"mappedCopiesMin", &HostThresholds::mappedCopiesMin, "all_gather_perf", 4, 1},
  };
  return fields;
}

HostThresholds withOverrides(HostThresholds t, const std::string& spec) {
  size_t at = 0;
  while (at < spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    const std::string entry = spec.substr(at, end - at);
    at = end + 1;
    if (entry.empty()) continue;
    const size_t eq = entry.find('=');
    const std::string name = entry.substr(0, eq), value = eq == std::string::npos ? "" : entry.substr(eq + 1);
    const HostThresholdField* field = nullptr;
    for (const auto& f : hostThresholdFields())
      if (name == f.name) field = &f;
    if (!field) {
      std::string known;
      for (const auto& f : hostThresholdFields()) known += std::string(known.empty() ? "" : ", ") + f.name;
      fail(StatusCode::kInvalidArgument, "TOPOCOLL_HOST_THRESHOLDS: unknown entry '{}' (known: {})", name, known);
    }
    char* stop = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(value.c_str(), &stop, 10);
    if (value.empty() || *stop || errno || value[0] == '-')
      fail(StatusCode::kInvalidArgument, "TOPOCOLL_HOST_THRESHOLDS: {}={}: expected a byte count", name, value);
    t.*(field->member) = v;
  }
  return t;
}

HostPolicy HostPolicy::make(const Config& cfg, HostLink link, int nRanks, bool oneHost, int nRings) {
  HostPolicy p;
  p.thresholds = withOverrides(HostThresholds{}, cfg.hostThresholds);
  p.model = cfg.hostTuning.empty() ? HostModel::defaults() : HostModel::load(cfg.hostTuning);
  p.limits = hostLimits(cfg, nRings, oneHost, kHostDirectMaxRanks);
  p.link = link;
  p.nRanks = nRanks;
  p.oneHost = oneHost;
  p.algoForced = !cfg.algo.empty();
  p.protoForced = !cfg.proto.empty();
  p.chunkBytes = std::max<uint64_t>(4096, static_cast<uint64_t>(cfg.buffSize) / kChunkDivisor);
  // Across hosts every slice is a NET message with its own step, header and acknowledgement: at 128 KiB a ring over
  // 3 or 4 hosts kept its links 62-75% busy (docs/cluster.md), at a full step 92-96%. The cache's reason for small
  // slices weighs less than the network's there.
  if (link == HostLink::kNet)
    p.chunkBytes = std::max<uint64_t>(p.chunkBytes, static_cast<uint64_t>(cfg.buffSize) / kNetChunkDivisor);
  p.oneShotMax = static_cast<uint64_t>(std::max(0, cfg.oneShotMax));
  p.directSplitMin = cfg.directSplitMin;
  p.directSplitRanks = cfg.directSplitRanks;
  p.llThreshold = static_cast<uint64_t>(std::max(0LL, cfg.p2pLlThreshold));
  return p;
}

HostQuery HostPolicy::query(int coll, int ranks, uint64_t bytes) const {
  HostQuery q;
  q.coll = coll;
  q.link = link;
  q.nRanks = ranks;
  q.bytes = bytes;
  q.chunkBytes = chunkBytes;
  q.rails = rails;
  q.netGBps = netGBps;
  q.hosts = hosts;
  return q;
}

void hostShape(const HostThresholds& t, int nRanks, const HostCall& call, int nChannels, HostDecision* d) {
  d->star = d->algo == kHostDirect && starApplies(t, call.coll, nRanks, call.rankBytes);
  d->pair = false;
  if (nRanks == 2 && !d->star) {
    const int channels = std::max(1, std::min(nChannels, call.linkChannels));
    switch (call.coll) {
      case kAllReduce:
        d->pair = d->algo == kRing && call.rankBytes >= t.allReducePairMin && call.linkChannels >= 2;
        break;
      case kReduceScatter:
        d->pair = call.rankBytes >= t.reduceScatterPairMin && call.linkChannels >= 2;
        break;
      case kBroadcast:
        d->pair = call.rankBytes >= t.broadcastPairMin && call.linkChannels >= 2 * channels;
        break;
      default: break;
    }
  }
  d->mapPeers = nRanks >= 2 && nRanks <= kHostDirectMaxRanks && call.bytes >= t.mappedInputsMin;
  d->mapOutputs = d->mapPeers && call.bytes >= (call.coll == kAllReduce ? t.mappedOutputsMin : t.mappedCopiesMin);
}

HostDecision hostDecide(const HostPolicy& p, const HostCall& call) {
  HostDecision d;
  d.chunkBytes = p.chunkBytes;
  if (hostOneShot(p, call)) {
    d.algo = kHostOneShot;
    d.proto = kLL;
    d.reason = "at most TOPOCOLL_ONESHOT_MAX bytes a peer: one trip through the mailboxes";
    return d;
  }
  // The cost model picks among what NCCL_ALGO, NCCL_PROTO, NCCL_MIN/MAX_NCHANNELS and TOPOCOLL_DIRECT_MAX leave.
  const HostQuery q = p.query(call.coll, p.nRanks, call.bytes);
  const HostChoice h = hostSelect(p.model, q, p.limits);
  d.algo = h.algo;
  d.proto = h.proto;
  d.nChannels = h.nChannels;
  d.timeUs = h.timeUs;
  const bool forced = p.algoForced || p.protoForced;
  if (h.railBound)
    d.reason = forced ? "the fastest the cost model finds among what NCCL_ALGO/NCCL_PROTO leave, one channel per NIC "
                        "(the NICs are the bound: more channels would only add TCP flows)"
                      : "the fastest the cost model finds, one channel per NIC (the NICs are the bound: more channels "
                        "would only add TCP flows)";
  else
    d.reason = forced ? "the fastest the cost model finds among what NCCL_ALGO/NCCL_PROTO leave"
                      : "the fastest the cost model finds";
  // DirectSplit (off unless TOPOCOLL_DIRECT_SPLIT_MIN is set; no calibrated constants yet): one-host AllReduce from
  // that size and rank count.
  if (d.algo != kHostDirect && call.coll == kAllReduce && !p.algoForced && p.oneHost &&
      p.nRanks <= kHostDirectMaxRanks && p.directSplitMin >= 0 &&
      call.bytes >= static_cast<uint64_t>(p.directSplitMin) && p.nRanks >= p.directSplitRanks) {
    d.algo = kHostDirectSplit;
    const uint64_t perMessage = std::min(call.bytes / static_cast<uint64_t>(p.nRanks), p.chunkBytes);
    if (!p.protoForced) d.proto = perMessage <= p.llThreshold ? kLL : kSimple;
    d.reason = "TOPOCOLL_DIRECT_SPLIT_MIN and TOPOCOLL_DIRECT_SPLIT_RANKS reached";
  }
  // The star shapes from their thresholds (HostThresholds; the cost model has no constants for them yet): every
  // rank pulls what it needs straight out of the peers' buffers instead of the chain or the ring.
  if (!p.algoForced && d.algo != kHostDirectSplit && p.oneHost &&
      starApplies(p.thresholds, call.coll, p.nRanks, call.rankBytes)) {
    d.algo = kHostDirect;
    d.reason = "past its star threshold (HostThresholds): pulls out of the peers' buffers";
  }
  if (p.link == HostLink::kNet && !p.oneHost && d.algo == kRing && call.coll == kAllReduce)
    d.chunkBytes = netRingSlice(p, call.bytes, d.nChannels, d.chunkBytes);
  hostShape(p.thresholds, p.nRanks, call, d.nChannels, &d);
  // The pair shapes are single copies out of the peer's buffers, which ranks on different hosts cannot map: across
  // hosts they would be FIFO messages on channel 0 (and 1) only, one rail of several (docs/cluster.md), where the
  // ring spreads over every channel.
  if (!p.oneHost) d.pair = false;
  if (d.pair) d.reason = "2 ranks past its pair threshold (HostThresholds): single copies out of the peer's buffers";
  return d;
}

std::string describe(const HostPolicy& p, const HostCall& call, const HostDecision& d) {
  std::string shape;
  if (d.star) shape += "star";
  if (d.pair) shape += "pair";
  if ((d.star || d.pair) && d.mapPeers) shape += d.mapOutputs ? ", mapped inputs and outputs" : ", mapped inputs";
  if (d.chunkBytes < p.chunkBytes) shape += fmt::format("slices of {} KiB", d.chunkBytes >> 10);  // netRingSlice
  if (!shape.empty()) shape = " (" + shape + ")";
  return fmt::format("{}: {} Bytes -> Algo {}{} proto {} channel{{Lo..Hi}}={{0..{}}} (model {:.1f} us, {}): {}",
                     collName(call.coll), call.bytes, hostDecisionAlgoName(d.algo), shape, protoName(d.proto),
                     d.nChannels - 1, d.timeUs, hostLinkName(p.link), d.reason);
}

}  // namespace topocoll::tuning
