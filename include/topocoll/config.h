// Every knob topocoll reads, declared once in a typed registry (src/common/config.cc): name, legacy aliases, type,
// range or choices, the validating parser, the documentation and the Config field it sets. The field's initialiser
// below is the knob's default (NCCL 2.30.7's, for NCCL's knobs). `Config::fromEnv`, `InitOptions::fromEnv` and
// `topocoll params` are all driven by the registry; nothing else reads a knob.
//
//   topocoll::Config cfg = topocoll::Config::fromEnv(topocoll::Env::fromProcess());  // throws naming a bad knob
//   for (const topocoll::Knob& k : topocoll::knobs()) fmt::print("{} = {}\n", k.name, k.get(cfg));
#pragma once

#include "topocoll/export.h"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "topocoll/env.h"

namespace topocoll {

/// One network device of TOPOCOLL_NET_DEVICES: `name[:speed][@busid]`.
struct NetDeviceSpec {
  std::string name;
  int speedMbps = 10000;  // what NCCL's socket plugin reports when an interface's speed is unknown
  std::string busId;      // PCI device it sits on; empty: a socket device under the first CPU
  bool operator==(const NetDeviceSpec&) const = default;
};

/// Parsed configuration. Field initialisers are the defaults.
struct TOPOCOLL_API Config {
  // Topology
  std::string topoFile;          // NCCL_TOPO_FILE
  std::string topoDumpFile;      // NCCL_TOPO_DUMP_FILE
  std::string discoveryRules = "2.30";  // TOPOCOLL_DISCOVERY_RULES: whose discovery rules: NCCL 2.30 or 2.28
  std::string netMergeLevel;     // NCCL_NET_MERGE_LEVEL (path type name), empty = PORT
  int netMergeLevelValue = 1;    //   its path type value (PATH_PORT)
  std::string netForceMerge;     // NCCL_NET_FORCE_MERGE
  int ibMergeNics = 1;           // NCCL_IB_MERGE_NICS
  int netDevsPolicy = 0;         // NCCL_NETDEVS_POLICY: 0 AUTO, 1 ALL, 2 MAX
  int netDevsPolicyMax = -1;     //   n of MAX:n
  int netPluginVersion = 0;      // TOPOCOLL_NET_PLUGIN_VERSION: 0 = NCCL's internal IB/socket plugins, else v6..v12
  std::string netDevices;        // TOPOCOLL_NET_DEVICES: the network plugin's devices (empty: the XML's <net>s)
  std::vector<NetDeviceSpec> netDeviceSpecs;  //   parsed
  // Paths
  std::optional<int> p2pLevel;     // NCCL_P2P_LEVEL, or LOC when NCCL_P2P_DISABLE=1 (path type value)
  int p2pDisable = 0;              // NCCL_P2P_DISABLE
  std::optional<int> netGdrLevel;  // NCCL_NET_GDR_LEVEL
  int netGdrRead = -2;             // NCCL_NET_GDR_READ
  int netGdrC2c = 1;               // NCCL_NET_GDR_C2C
  int pxnDisable = 0;              // NCCL_PXN_DISABLE
  int pxnC2c = 1;                  // NCCL_PXN_C2C
  int nvbDisable = 0;              // NCCL_NVB_DISABLE
  int netDisableIntra = 0;         // NCCL_NET_DISABLE_INTRA
  int shmDisable = 0;              // NCCL_SHM_DISABLE
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
  std::string planFile;            // TOPOCOLL_PLAN_FILE (rank 0 writes the plan its communicator executes)
  int searchTimeoutScale = 1;      // TOPOCOLL_SEARCH_TIMEOUT_SCALE
  int searchMemo = 1;              // TOPOCOLL_SEARCH_MEMO
  int mnnvlEnable = 2;             // NCCL_MNNVL_ENABLE
  // Tuning
  std::string algo;                // NCCL_ALGO
  std::string proto;               // NCCL_PROTO
  int nthreads = -2;               // NCCL_NTHREADS
  int ll128Nthreads = -2;          // NCCL_LL128_NTHREADS
  int netOverhead = -2;            // NCCL_NET_OVERHEAD (ns)
  int ll128C2c = 1;                // NCCL_LL128_C2C
  int patEnable = 2;               // NCCL_PAT_ENABLE
  std::string threadThresholds;    // NCCL_THREAD_THRESHOLDS
  // Bootstrap and communicator init
  std::string commId;              // NCCL_COMM_ID
  std::string hostId;              // NCCL_HOSTID
  std::string socketIfname;        // NCCL_SOCKET_IFNAME
  std::string socketFamily;        // NCCL_SOCKET_FAMILY
  double timeoutSec = 300;         // TOPOCOLL_TIMEOUT
  int simulateGpus = 0;            // TOPOCOLL_SIMULATE_GPUS
  int simulateGpuDev = -1;         // TOPOCOLL_SIMULATE_GPU_DEV
  std::string jobId;               // TOPOCOLL_JOB_ID
  std::string jobSecret;           // TOPOCOLL_JOB_SECRET (never printed)
  std::string jobSecretFile;       // TOPOCOLL_JOB_SECRET_FILE
  std::string testDieAfter;        // TOPOCOLL_TEST_DIE_AFTER (tests only)
  int allowSharedGpu = 0;          // TOPOCOLL_ALLOW_SHARED_GPU (tests only)
  // Transports
  long long buffSize = 1 << 22;    // NCCL_BUFFSIZE (Simple FIFO bytes per connection)
  long long llBuffSize = 8 * 512 * 8 * 16;  // NCCL_LL_BUFFSIZE (lines/thread x threads x steps x 16 B)
  int p2pReadEnable = -2;          // NCCL_P2P_READ_ENABLE (-2: by topology)
  int p2pDirectDisable = 0;        // NCCL_P2P_DIRECT_DISABLE
  long long p2pLlThreshold = 16384;      // NCCL_P2P_LL_THRESHOLD
  long long p2pNetChunkSize = 1 << 17;   // NCCL_P2P_NET_CHUNKSIZE
  long long p2pPciChunkSize = 1 << 17;   // NCCL_P2P_PCI_CHUNKSIZE
  long long netChunkSize = 1 << 20;      // TOPOCOLL_NET_CHUNKSIZE (NET point-to-point chunks, user buffer to buffer)
  long long p2pSingleCopy = 65536;       // TOPOCOLL_P2P_SINGLE_COPY (bytes from which single copies are used; -1 off)
  int mapPeerBuffers = 1;                // TOPOCOLL_MAP_PEER_BUFFERS (single copies map the peer's memAlloc buffers)
  int socketPacing = -1;                 // TOPOCOLL_SOCKET_PACING (Mbit/s cap of each NET socket; 0 none; -1 auto)
  int netStreams = -1;                   // TOPOCOLL_NET_STREAMS (NET sends moving behind an unacknowledged one; -1 auto)
  int nsocksPerThread = -2;        // NCCL_NSOCKS_PERTHREAD
  int socketNthreads = -2;         // NCCL_SOCKET_NTHREADS
  // Collectives
  int checkCalls = 0;              // TOPOCOLL_CHECK_CALLS
  long long deviceOneShotMax = 262144;  // TOPOCOLL_DEVICE_ONESHOT_MAX (device AllReduce bytes up to which one-shot)
  int deviceStaged = 0;            // TOPOCOLL_DEVICE_STAGED (device collectives through pinned host memory)
  int deviceLeader = 1;            // TOPOCOLL_DEVICE_LEADER (ranks on one GPU: rank 0 moves all the data)
  int deviceIpcCache = 256;        // TOPOCOLL_DEVICE_IPC_CACHE (peers' buffers kept mapped per communicator)
  long long directMax = 65536;     // TOPOCOLL_DIRECT_MAX (AllReduce bytes up to which one host may use Direct)
  long long directSplitMin = -1;   // TOPOCOLL_DIRECT_SPLIT_MIN (AllReduce bytes from which DirectSplit is used)
  int directSplitRanks = 4;
  int p2pMailboxMax = 256;         // TOPOCOLL_P2P_MAILBOX_MAX (bytes up to which sends/receives use the mailboxes)
  int membarrier = 1;              // TOPOCOLL_MEMBARRIER (asymmetric doorbell fence: membarrier on the sleeping side)
  int oneShotMax = 256;            // TOPOCOLL_ONESHOT_MAX (per-peer bytes up to which collectives use the mailboxes)        // TOPOCOLL_DIRECT_SPLIT_RANKS (... with at least this many ranks on one host)
  std::string hostThresholds;      // TOPOCOLL_HOST_THRESHOLDS (tuning::HostThresholds overrides: name=bytes,...)
  std::string hostTuning;          // TOPOCOLL_HOST_TUNING (the host cost model's constants: bench/host_calibrate's JSON)
  // PyTorch backend
  int torchHugePages = 0;          // TOPOCOLL_TORCH_HUGEPAGES (THP_MEM_ALLOC_ENABLE): 2 MiB-aligned MADV_HUGEPAGE tensors
  int torchShareable = 0;          // TOPOCOLL_TORCH_SHAREABLE: tensors from 1 MiB in shareable (memfd) memory
  long long torchStaging = 1 << 20;  // TOPOCOLL_TORCH_STAGING: private tensors from this size through shareable staging
  // Debug (the logger reads these itself; they are here so that bad values fail at the API edge)
  std::string debug;               // NCCL_DEBUG
  std::string debugSubsys;         // NCCL_DEBUG_SUBSYS
  std::string debugFile;           // NCCL_DEBUG_FILE
  int minCtas = -1, maxCtas = -1;  // NCCL_MIN_CTAS / NCCL_MAX_CTAS, else ncclConfig_t's minCTAs / maxCTAs (-1: unset):
                                   // bounds on the channels, as NCCL's connect stage applies them
  int maxP2pPeers = -1;            // NCCL_P2P_MAX_PEERS, else ncclConfig_t's maxP2pPeers (-1: unset = nRanks): the
                                   // peers a rank's sends/receives spread channels over, across nodes
  std::string netName;             // NCCL_NET, else ncclConfig_t's netName: the network ("Socket"; empty: it)
  int trafficClass = -1;           // ncclConfig_t's trafficClass: IP_TOS / IPV6_TCLASS of NET sockets (-1: unset)
  std::string confFile;            // NCCL_CONF_FILE (read by Env::fromProcess; recorded here for `topocoll params`)

  /// Parses and validates every knob of `env`; throws Error(kInvalidArgument) naming the knob on bad values.
  /// Variables named like a known knob but misspelt get a WARN line (see knobTypos).
  static Config fromEnv(const Env& env);
};

/// One entry of the knob registry.
struct Knob {
  std::string name;
  std::vector<std::string> aliases;  // legacy names, read when `name` is not set (NCCL_MIN_NRINGS)
  std::string type;                  // int, bool, seconds, string, level, choice, list
  std::string range;                 // "[0, 2]", "LOC..SYS", "AUTO | ALL | MAX:<n>" (empty: any)
  std::string group;                 // topology, paths, search, tuning, bootstrap, runtime, debug
  std::string doc;
  std::function<void(Config&, const std::string&)> set;  // validates `value` and sets the field; throws naming the knob
  std::function<std::string(const Config&)> get;         // the field as text
  /// The default as text (get() of a default-constructed Config).
  std::string defaultText() const { return get(Config{}); }
};

/// Every knob, grouped by layer, in a stable order.
TOPOCOLL_API const std::vector<Knob>& knobs();
/// The knob named `name` (or one of its aliases), nullptr when there is none.
TOPOCOLL_API const Knob* findKnob(std::string_view name);
/// One message per NCCL_* / TOPOCOLL_* variable of `env` that is not a knob but is within two edits of one:
/// "NCCL_CROS_NIC=1 is not a knob topocoll knows; did you mean NCCL_CROSS_NIC?".
std::vector<std::string> knobTypos(const Env& env);
/// Whether `name` is an environment variable NCCL 2.30.7 (or PyTorch's ProcessGroupNCCL) reads: never reported as a
/// misspelt knob of ours, whether or not topocoll reads it.
bool isNcclKnobName(std::string_view name);

/// Parses a path level the way NCCL does (LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS, or an old-style
/// integer 0..5). Throws naming `knob` when the value is not one of those.
int parsePathLevel(const std::string& knob, const std::string& value);

}  // namespace topocoll
