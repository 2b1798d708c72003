// The cost model of the collectives on host memory (CPU threads moving data through SHM, P2P single copies or NET
// sockets): NCCL's form (time = latency + bytes / bandwidth, src/graph/tuning.cc) with constants a calibration
// benchmark measures on the machine (bench/host_calibrate.cc), and the choice of algorithm, protocol and channel
// count it makes per call (the role of NCCL's topoGetAlgoInfo for host memory).
//
//   tuning::HostModel m = tuning::HostModel::defaults();          // or HostModel::load(cfg.hostTuning)
//   tuning::HostQuery q{kAllReduce, HostLink::kP2p, nRanks, bytes, chunkBytes};
//   tuning::HostChoice c = tuning::hostSelect(m, q, tuning::hostLimits(cfg, nRings, oneHost));
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/tuning/tuning.h"

namespace topocoll::tuning {

/// The slowest link between the ranks of a job: P2P (one host; single copies between processes, a direct pointer
/// within one), SHM (one host with P2P disabled: everything through the shared-memory FIFOs) or NET (several hosts).
enum class HostLink : int { kP2p = 0, kShm = 1, kNet = 2 };
constexpr int kNumHostLinks = 3;
const char* hostLinkName(HostLink l);  // "P2P", "SHM", "NET"
/// The host algorithms: NCCL's Tree (0) and Ring (1) ids, and Direct (every rank reduces everybody's data; one host).
constexpr int kHostDirect = 2, kNumHostAlgos = 3;
const char* hostAlgoName(int a);  // "Tree", "Ring", "Direct"
/// Channel counts the model has constants for (1 and 2; more channels use the constants of 2).
constexpr int kHostMaxChannels = 2;

/// One calibrated combination: time = baseUs + steps x stepUs + bytes on the critical path / (gbps x 1e3)
/// microseconds.
struct HostCost {
  float baseUs = 0;  // per call (entering the call, the engine's wake-up)
  float stepUs = 0;  // latency of one step (one message and its acknowledgement)
  float gbps = 0;    // bytes a rank moves (and reduces) per ns on the critical path; 0: not calibrated (never chosen)
};

/// One row of the table: which combination, and its constants.
struct HostEntry {
  HostLink link = HostLink::kP2p;
  int coll = kAllReduce, algo = kRing, proto = kSimple, nChannels = 1;
  HostCost cost;
};

/// The table of every calibrated combination.
class HostModel {
 public:
  /// The constants measured on this project's machine (the table in host_model.cc names the run).
  static HostModel defaults();
  /// What bench/host_calibrate wrote (JSON: {"source": ..., "entries": [{"link": "P2P", "coll": "AllReduce", "algo":
  /// "Ring", "proto": "Simple", "nChannels": 1, "baseUs": 1.2, "stepUs": 3.1, "gbps": 5.2}, ...]}; baseUs may be
  /// left out: 0). Entries it leaves out keep the
  /// defaults. Throws Error(kInvalidArgument) naming the file and the entry on a bad file.
  static HostModel load(const std::string& path);
  /// The table in load()'s JSON format (sorted, stable).
  std::string toJson(const std::string& source) const;

  void set(const HostEntry& e);
  const HostCost& at(HostLink l, int coll, int algo, int proto, int nChannels) const;
  std::vector<HostEntry> entries() const;  // the calibrated ones (gbps > 0), in table order
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::array<HostCost, kNumHostLinks * kNumColls * kNumHostAlgos * kNumProtos * kHostMaxChannels> cost_{};
};

/// What the model needs to know about one call.
struct HostQuery {
  int coll = kAllReduce;
  HostLink link = HostLink::kP2p;
  int nRanks = 1;
  uint64_t bytes = 0;       // NCCL's count: AllGather/ReduceScatter count every rank's data
  uint64_t chunkBytes = 0;  // pipelining unit (NCCL_BUFFSIZE / 32)
  int rails = 1;            // NET: the NICs every host has; channel c goes over NIC c % rails on both ends
  double netGBps = 0;       // NET: one NIC's rate (GB/s); 0: the calibrated constants alone
  int hosts = 1;            // NET: how many hosts the ranks are on (what a tree sends over each NIC depends on it)
};

/// The critical path of one call: steps (one message each, pipelined chunks counted) and bytes one rank moves.
struct HostWork {
  double steps = 0, bytes = 0;
};
HostWork hostWork(const HostQuery& q, int algo, int nChannels);
/// NET: the bytes of one call over each host's NIC, in its busier direction. Ring steps: what one rank moves (each
/// host's ring edge carries it). Tree AllReduce across two hosts: the message once each way (the up half crosses one
/// way while the down half crosses the other, every chunk overlapped), less than the ring's 2(n-1)/n x bytes once a
/// host has two ranks or more; otherwise a rank's 2 x bytes (across more hosts a tree's inner host receives from two
/// children and its parent: more than the ring's; with one rank on each of two hosts both carry the same, and the
/// tree measured slower there from 512 KiB).
double wireBytes(const HostQuery& q, int algo, const HostWork& w);
/// Estimated microseconds of (algo, proto, nChannels) for q; -1 when that combination is not calibrated.
double hostTime(const HostModel& m, const HostQuery& q, int algo, int proto, int nChannels);

/// The most channels worth running (algo, proto) on across hosts: one per rail once that many already keep the NICs
/// the bound (the wire's time for the bytes is at least all the hosts spend on that many channels); nChannels
/// otherwise, and on one host. More channels then add only TCP flows to each NIC, and flows that share a link get
/// in each other's way (docs/collectives.md, Selection).
int netFlowChannels(const HostModel& m, const HostQuery& q, int algo, int proto, int nChannels);

/// What the knobs leave: NCCL_ALGO / NCCL_PROTO per collective (NCCL's syntax; LL128 runs as Simple), Direct (only
/// while NCCL_ALGO leaves neither Tree nor Ring, or is unset; only on one host; up to TOPOCOLL_DIRECT_MAX bytes and
/// collectives::kDirectMaxRanks ranks), channels within [NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS] and the rings.
struct HostLimits {
  bool algo[kNumColls][kNumHostAlgos] = {};
  bool proto[kNumColls][kNumProtos] = {};
  int minChannels = 1, maxChannels = 1;
  long long directMax = 65536;
  int directMaxRanks = 8;
};
/// Throws Error(kInvalidUsage) on an NCCL_ALGO / NCCL_PROTO that does not parse.
HostLimits hostLimits(const Config& cfg, int nRings, bool oneHost, int directMaxRanks);

struct HostChoice {
  int algo = kRing, proto = kSimple, nChannels = 1;
  double timeUs = 0;  // the model's estimate (0 when nothing was calibrated: Ring Simple on the fewest channels)
  bool railBound = false;  // netFlowChannels' cap changed the pick: more channels were cheaper by the sums
};
/// The fastest combination the limits leave (ties: the earlier algorithm, protocol, fewer channels), on no more
/// channels than netFlowChannels allows unless NCCL_MIN_NCHANNELS asks for them. Collectives other
/// than AllReduce run Ring (their chains); a protocol the limits leave none of falls back to Simple.
HostChoice hostSelect(const HostModel& m, const HostQuery& q, const HostLimits& lim);

/// A measured point of one combination (calibration input).
struct HostSample {
  HostWork work;
  double timeUs = 0;
};
/// Least squares of time = baseUs + steps x stepUs + bytes / bandwidth in relative error (every size counts the
/// same), every term >= 0 (the best fit over the subsets of terms whose coefficients are all >= 0). gbps 0 when
/// there are no samples.
HostCost fitHostCost(const std::vector<HostSample>& samples);

}  // namespace topocoll::tuning
