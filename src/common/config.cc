#include "topocoll/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "topocoll/status.h"

namespace topocoll {

const std::vector<KnobInfo>& knobRegistry() {
  static const std::vector<KnobInfo> knobs = {
      {"NCCL_TOPO_FILE", "", "Topology XML to load instead of discovering the machine"},
      {"NCCL_TOPO_DUMP_FILE", "", "Where `topo dump` writes when --out is not given"},
      {"NCCL_NET_MERGE_LEVEL", "PORT", "Fuse NET ports at most this far apart into one virtual NIC (LOC disables)"},
      {"NCCL_NET_FORCE_MERGE", "", "Explicit NIC fusion: 'mlx5_0,mlx5_1;mlx5_2,mlx5_3'"},
      {"NCCL_IB_MERGE_NICS", "1", "0 disables NIC fusion"},
      {"NCCL_NETDEVS_POLICY", "AUTO", "NICs per GPU: AUTO, ALL or MAX:<n>"},
      {"NCCL_P2P_LEVEL", "", "Max path type for GPU peer-to-peer (LOC..SYS or 0..5)"},
      {"NCCL_P2P_DISABLE", "0", "1 disables GPU peer-to-peer (same as NCCL_P2P_LEVEL=LOC)"},
      {"NCCL_NET_GDR_LEVEL", "P2C", "Max GPU-NIC path type for GPU Direct RDMA"},
      {"NCCL_NET_GDR_READ", "-2", "GDR for sends: 0 off, 1 on, -2 auto (on from Ampere or with NVLink)"},
      {"NCCL_NET_GDR_C2C", "1", "Allow GDR over C2C+PCI (P2C) paths"},
      {"NCCL_PXN_DISABLE", "0", "1 disables PXN (sending through an NVLink peer's NIC)"},
      {"NCCL_P2P_PXN_LEVEL", "2", "PXN for send/recv: 0 never, 1 when needed, 2 always"},
      {"NCCL_PXN_C2C", "1", "Allow PXN relays reaching their NIC over P2C"},
      {"NCCL_NVB_DISABLE", "0", "1 disables NVLink paths through an intermediate GPU (NVB)"},
      {"NCCL_IGNORE_DISABLED_P2P", "0", "Ignore NVML's P2P status"},
      {"NCCL_CROSS_NIC", "2", "Rings/trees may use different NICs in and out: 0 no, 1 yes, 2 if better"},
      {"NCCL_NVLS_ENABLE", "2", "NVLink SHARP: 0 off, 1 forced on, 2 auto (sm>=90 with an NVSwitch)"},
      {"NCCL_COLLNET_ENABLE", "0", "1 enables CollNet (network SHARP) when NICs carry coll=\"1\""},
      {"NCCL_MIN_NCHANNELS", "0", "Minimum number of channels (NCCL_MIN_NRINGS is the legacy name)"},
      {"NCCL_MAX_NCHANNELS", "64", "Maximum number of channels (NCCL_MAX_NRINGS is the legacy name)"},
      {"NCCL_MIN_P2P_NCHANNELS", "1", "Minimum channels for send/recv"},
      {"NCCL_MAX_P2P_NCHANNELS", "64", "Maximum channels for send/recv"},
      {"NCCL_P2P_PER_CHANNEL_NET_BW", "14", "GB/s per send/recv channel through the network"},
      {"NCCL_GRAPH_FILE", "", "Graph XML to use instead of searching"},
      {"NCCL_GRAPH_DUMP_FILE", "", "Where to write the searched graphs (graph XML)"},
      {"NCCL_ALGO", "", "Algorithms allowed: 'ring,tree', '^nvls', 'allreduce:tree;allgather:ring'"},
      {"NCCL_PROTO", "", "Protocols allowed: 'LL,Simple', '^LL128', per collective like NCCL_ALGO"},
      {"NCCL_NTHREADS", "-2", "Threads per block for Simple/LL (multiple of 32, 64..512)"},
      {"NCCL_LL128_NTHREADS", "-2", "Threads per block for LL128 (multiple of 32, 160..640)"},
      {"NCCL_NET_OVERHEAD", "-2", "Per network step overhead in ns (default by CPU vendor)"},
      {"NCCL_LL128_C2C", "1", "Enable LL128 over P2C/PXN paths on Hopper and later"},
      {"NCCL_PAT_ENABLE", "2", "PAT algorithm: 0 off, 1 on, 2 auto (one GPU per node)"},
      {"NCCL_THREAD_THRESHOLDS", "", "Per-thread work thresholds: 'treeLL treeLL128 treeSimple ringLL ...'"},
      {"TOPOCOLL_SEARCH_TIMEOUT_SCALE", "1", "Multiply the search step budgets (tests use 1)"},
      {"NCCL_COMM_ID", "", "host:port of the bootstrap root (comm-check / initFromEnv)"},
      {"NCCL_SOCKET_IFNAME", "", "Bootstrap interfaces: prefixes, ^exclude, =exact (default ib*, then not docker/lo)"},
      {"NCCL_SOCKET_FAMILY", "", "AF_INET or AF_INET6 for the bootstrap"},
      {"NCCL_HOSTID", "", "Host identity override (several 'hosts' on one machine in tests)"},
      {"TOPOCOLL_TIMEOUT", "300", "Seconds every bootstrap operation may block"},
      {"TOPOCOLL_SIMULATE_GPU_DEV", "", "With TOPOCOLL_SIMULATE_GPUS: this rank's GPU dev (default: its local rank)"},
      {"TOPOCOLL_SIMULATE_GPUS", "0", "1: each rank takes the NCCL_TOPO_FILE GPU whose dev is its local rank"},
  };
  return knobs;
}

namespace {

int parseInt(const Env& env, const char* name, int def, long lo, long hi) {
  auto v = env.get(name);
  if (!v) return def;
  const std::string& s = *v;
  if (s.empty()) return def;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(s.c_str(), &end, 0);
  while (end && *end == ' ') ++end;
  if (errno != 0 || end == s.c_str() || *end != '\0')
    fail(StatusCode::kInvalidArgument, "{}={}: not an integer", name, s);
  if (x < lo || x > hi) fail(StatusCode::kInvalidArgument, "{}={}: out of range [{}, {}]", name, s, lo, hi);
  return static_cast<int>(x);
}

std::string getStr(const Env& env, const char* name) { return env.get(name).value_or(""); }

}  // namespace

int parsePathLevel(const std::string& knob, const std::string& value) {
  static const char* names[] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"};
  for (int i = 0; i < 10; ++i)
    if (value == names[i]) return i;
  if (!value.empty() && value[0] >= '0' && value[0] <= '9') {
    char* end = nullptr;
    long old = std::strtol(value.c_str(), &end, 0);
    if (*end == '\0') {
      static const int oldToNew[] = {0, 4, 5, 8, 9, 9};  // LOC PIX PXB PHB SYS SYS
      if (old > 5) old = 5;
      return oldToNew[old];
    }
  }
  fail(StatusCode::kInvalidArgument,
       "{}={}: unknown level (expected LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS or an integer)", knob, value);
}

Config Config::fromEnv(const Env& env) {
  Config c;
  c.topoFile = getStr(env, "NCCL_TOPO_FILE");
  c.netForceMerge = getStr(env, "NCCL_NET_FORCE_MERGE");
  c.netMergeLevel = getStr(env, "NCCL_NET_MERGE_LEVEL");
  if (!c.netMergeLevel.empty()) {
    if (c.netMergeLevel == "PORT") c.netMergeLevelValue = 1;
    else c.netMergeLevelValue = parsePathLevel("NCCL_NET_MERGE_LEVEL", c.netMergeLevel);
  }
  c.ibMergeNics = parseInt(env, "NCCL_IB_MERGE_NICS", 1, 0, 1);
  if (auto p = env.get("NCCL_NETDEVS_POLICY")) {
    std::string s = *p;
    for (auto& ch : s) ch = static_cast<char>(toupper(ch));
    if (s == "AUTO") c.netDevsPolicy = 0;
    else if (s == "ALL") c.netDevsPolicy = 1;
    else if (s.rfind("MAX:", 0) == 0 && atoi(s.c_str() + 4) > 0) {
      c.netDevsPolicy = 2;
      c.netDevsPolicyMax = atoi(s.c_str() + 4);
    } else {
      fail(StatusCode::kInvalidArgument, "NCCL_NETDEVS_POLICY={}: expected AUTO, ALL or MAX:<n>", *p);
    }
  }
  int p2pDisable = parseInt(env, "NCCL_P2P_DISABLE", 0, 0, 1);
  auto p2pLevel = env.get("NCCL_P2P_LEVEL");
  if (p2pDisable == 1) {
    if (p2pLevel && !p2pLevel->empty() && parsePathLevel("NCCL_P2P_LEVEL", *p2pLevel) != 0)
      fail(StatusCode::kInvalidArgument,
           "NCCL_P2P_DISABLE=1 contradicts NCCL_P2P_LEVEL={} (NCCL would ignore the level); unset one of them",
           *p2pLevel);
    c.p2pLevel = 0;
  } else if (p2pLevel && !p2pLevel->empty()) {
    c.p2pLevel = parsePathLevel("NCCL_P2P_LEVEL", *p2pLevel);
  }
  if (auto g = env.get("NCCL_NET_GDR_LEVEL"); g && !g->empty()) c.netGdrLevel = parsePathLevel("NCCL_NET_GDR_LEVEL", *g);
  c.netGdrRead = parseInt(env, "NCCL_NET_GDR_READ", -2, -2, 1);
  c.netGdrC2c = parseInt(env, "NCCL_NET_GDR_C2C", 1, 0, 1);
  c.pxnDisable = parseInt(env, "NCCL_PXN_DISABLE", 0, 0, 1);
  c.p2pPxnLevel = parseInt(env, "NCCL_P2P_PXN_LEVEL", 2, 0, 2);
  c.pxnC2c = parseInt(env, "NCCL_PXN_C2C", 1, 0, 1);
  c.nvbDisable = parseInt(env, "NCCL_NVB_DISABLE", 0, 0, 1);
  c.ignoreDisabledP2p = parseInt(env, "NCCL_IGNORE_DISABLED_P2P", 0, 0, 2);
  c.crossNic = parseInt(env, "NCCL_CROSS_NIC", 2, 0, 2);
  c.nvlsEnable = parseInt(env, "NCCL_NVLS_ENABLE", 2, 0, 2);
  c.collnetEnable = parseInt(env, "NCCL_COLLNET_ENABLE", 0, 0, 1);
  int minRings = parseInt(env, "NCCL_MIN_NRINGS", -2, -2, 1 << 20);
  int minCh = parseInt(env, "NCCL_MIN_NCHANNELS", -2, -2, 1 << 20);
  int maxRings = parseInt(env, "NCCL_MAX_NRINGS", -2, -2, 1 << 20);
  int maxCh = parseInt(env, "NCCL_MAX_NCHANNELS", -2, -2, 1 << 20);
  c.minNchannels = 0;
  if (minRings != -2) c.minNchannels = minRings;
  if (minCh != -2) c.minNchannels = minCh;
  c.minNchannels = std::max(0, std::min(c.minNchannels, 64));
  c.maxNchannels = 64;
  if (maxRings != -2) c.maxNchannels = maxRings;
  if (maxCh != -2) c.maxNchannels = maxCh;
  c.maxNchannels = std::max(1, std::min(c.maxNchannels, 64));
  c.minP2pNchannels = parseInt(env, "NCCL_MIN_P2P_NCHANNELS", 1, 1, 64);
  c.maxP2pNchannels = parseInt(env, "NCCL_MAX_P2P_NCHANNELS", 64, 1, 64);
  c.p2pPerChannelNetBw = parseInt(env, "NCCL_P2P_PER_CHANNEL_NET_BW", 14, 1, 1 << 20);
  c.graphFile = getStr(env, "NCCL_GRAPH_FILE");
  c.graphDumpFile = getStr(env, "NCCL_GRAPH_DUMP_FILE");
  c.algo = getStr(env, "NCCL_ALGO");
  c.proto = getStr(env, "NCCL_PROTO");
  c.nthreads = parseInt(env, "NCCL_NTHREADS", -2, -2, 1 << 16);
  c.ll128Nthreads = parseInt(env, "NCCL_LL128_NTHREADS", -2, -2, 1 << 16);
  c.netOverhead = parseInt(env, "NCCL_NET_OVERHEAD", -2, -2, 1 << 30);
  c.ll128C2c = parseInt(env, "NCCL_LL128_C2C", 1, 0, 1);
  c.patEnable = parseInt(env, "NCCL_PAT_ENABLE", 2, 0, 2);
  c.threadThresholds = getStr(env, "NCCL_THREAD_THRESHOLDS");
  c.searchTimeoutScale = parseInt(env, "TOPOCOLL_SEARCH_TIMEOUT_SCALE", 1, 1, 1 << 10);
  return c;
}

}  // namespace topocoll
