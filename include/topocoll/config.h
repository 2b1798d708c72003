// Every knob the planner reads, parsed and validated once. NCCL's knobs keep their NCCL names so a plan
// predicts a real job; topocoll's own start with TOPOCOLL_.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "topocoll/env.h"

namespace topocoll {

/// One entry of the knob registry (`topocoll params` prints them).
struct KnobInfo {
  const char* name;
  const char* defaultValue;
  const char* description;
};
const std::vector<KnobInfo>& knobRegistry();

/// Parsed configuration. Field defaults are NCCL 2.30.7's defaults.
struct Config {
  // Topology
  std::string topoFile;          // NCCL_TOPO_FILE
  std::string netMergeLevel;     // NCCL_NET_MERGE_LEVEL (path type name), empty = PORT
  int netMergeLevelValue = 1;    // PATH_PORT
  std::string netForceMerge;     // NCCL_NET_FORCE_MERGE
  int ibMergeNics = 1;           // NCCL_IB_MERGE_NICS
  int netDevsPolicy = 0;         // NCCL_NETDEVS_POLICY: 0 AUTO, 1 ALL, 2 MAX
  int netDevsPolicyMax = -1;
  // Paths
  std::optional<int> p2pLevel;     // NCCL_P2P_LEVEL / NCCL_P2P_DISABLE (path type value)
  std::optional<int> netGdrLevel;  // NCCL_NET_GDR_LEVEL
  int netGdrRead = -2;             // NCCL_NET_GDR_READ
  int netGdrC2c = 1;               // NCCL_NET_GDR_C2C
  int pxnDisable = 0;              // NCCL_PXN_DISABLE
  int p2pPxnLevel = 2;             // NCCL_P2P_PXN_LEVEL
  int pxnC2c = 1;                  // NCCL_PXN_C2C
  int nvbDisable = 0;              // NCCL_NVB_DISABLE
  int ignoreDisabledP2p = 0;       // NCCL_IGNORE_DISABLED_P2P
  // Search
  int crossNic = 2;                // NCCL_CROSS_NIC
  int nvlsEnable = 2;              // NCCL_NVLS_ENABLE
  int collnetEnable = 0;           // NCCL_COLLNET_ENABLE
  int minNchannels = 0;            // NCCL_MIN_NCHANNELS / NCCL_MIN_NRINGS
  int maxNchannels = 64;           // NCCL_MAX_NCHANNELS / NCCL_MAX_NRINGS
  int minP2pNchannels = 1;         // NCCL_MIN_P2P_NCHANNELS
  int maxP2pNchannels = 64;        // NCCL_MAX_P2P_NCHANNELS
  int p2pPerChannelNetBw = 14;     // NCCL_P2P_PER_CHANNEL_NET_BW
  std::string graphFile;           // NCCL_GRAPH_FILE
  std::string graphDumpFile;       // NCCL_GRAPH_DUMP_FILE
  // Tuning
  std::string algo;                // NCCL_ALGO
  std::string proto;               // NCCL_PROTO
  int nthreads = -2;               // NCCL_NTHREADS
  int ll128Nthreads = -2;          // NCCL_LL128_NTHREADS
  int netOverhead = -2;            // NCCL_NET_OVERHEAD (ns)
  int ll128C2c = 1;                // NCCL_LL128_C2C
  int patEnable = 2;               // NCCL_PAT_ENABLE
  std::string threadThresholds;    // NCCL_THREAD_THRESHOLDS
  // topocoll's own
  int searchTimeoutScale = 1;      // TOPOCOLL_SEARCH_TIMEOUT_SCALE

  /// Parses and validates every knob of `env`; throws Error(kInvalidArgument) naming the knob on bad values.
  static Config fromEnv(const Env& env);
};

/// Parses a path level the way NCCL does (LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS, or an old-style
/// integer 0..5). Throws naming `knob` when the value is not one of those.
int parsePathLevel(const std::string& knob, const std::string& value);

}  // namespace topocoll
