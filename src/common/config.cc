// The knob registry: each knob declared once. NCCL's knobs keep NCCL's names, defaults and parsing rules
// (NCCL 2.30.7 src/misc/param.cc and the ncclParam declarations next to each use).
#include "topocoll/config.h"

#include <strings.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>

#include "topocoll/log.h"
#include "topocoll/status.h"

namespace topocoll {

namespace {

long long parseInteger(const std::string& name, const std::string& s, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(s.c_str(), &end, 0);
  while (end && *end == ' ') ++end;
  if (errno == ERANGE) fail(StatusCode::kInvalidArgument, "{}={}: out of range [{}, {}]", name, s, lo, hi);
  if (errno != 0 || end == s.c_str() || *end != '\0') fail(StatusCode::kInvalidArgument, "{}={}: not an integer", name, s);
  if (x < lo || x > hi) fail(StatusCode::kInvalidArgument, "{}={}: out of range [{}, {}]", name, s, lo, hi);
  return x;
}

const char* kLevelNames[] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"};

// An integer knob stored in `M`, validated against [lo, hi].
template <auto M>
Knob intKnob(std::string name, std::string group, long long lo, long long hi, std::string doc,
             std::vector<std::string> aliases = {}) {
  Knob k;
  k.name = std::move(name);
  k.aliases = std::move(aliases);
  k.type = lo == 0 && hi == 1 ? "bool" : "int";
  k.range = lo == 0 && hi == 1 ? "0 | 1" : fmt::format("[{}, {}]", lo, hi);
  k.group = std::move(group);
  k.doc = std::move(doc);
  k.set = [n = k.name, lo, hi](Config& c, const std::string& v) { c.*M = static_cast<int>(parseInteger(n, v, lo, hi)); };
  k.get = [](const Config& c) { return std::to_string(c.*M); };
  return k;
}

// A 64-bit integer knob stored in `M` (sizes in bytes), validated against [lo, hi].
template <auto M>
Knob sizeKnob(std::string name, std::string group, long long lo, long long hi, std::string doc) {
  Knob k;
  k.name = std::move(name);
  k.type = "int";
  k.range = fmt::format("[{}, {}]", lo, hi);
  k.group = std::move(group);
  k.doc = std::move(doc);
  k.set = [n = k.name, lo, hi](Config& c, const std::string& v) { c.*M = parseInteger(n, v, lo, hi); };
  k.get = [](const Config& c) { return std::to_string(c.*M); };
  return k;
}

// A free-form string knob stored in `M` (its consumer validates it: NCCL_ALGO, NCCL_SOCKET_IFNAME, ...).
template <auto M>
Knob stringKnob(std::string name, std::string group, std::string doc, std::string range = "") {
  Knob k;
  k.name = std::move(name);
  k.type = "string";
  k.range = std::move(range);
  k.group = std::move(group);
  k.doc = std::move(doc);
  k.set = [](Config& c, const std::string& v) { c.*M = v; };
  k.get = [](const Config& c) { return c.*M; };
  return k;
}

// A path-level knob (LOC..SYS or NCCL's old integers) stored in an optional int.
template <auto M>
Knob levelKnob(std::string name, std::string group, std::string doc) {
  Knob k;
  k.name = std::move(name);
  k.type = "level";
  k.range = "LOC | NVL | NVB | C2C | PIX | PXB | P2C | PXN | PHB | SYS | 0..5";
  k.group = std::move(group);
  k.doc = std::move(doc);
  k.set = [n = k.name](Config& c, const std::string& v) { c.*M = parsePathLevel(n, v); };
  k.get = [](const Config& c) { return (c.*M) ? std::string(kLevelNames[*(c.*M)]) : std::string(); };
  return k;
}

// A string knob restricted to `choices` (validated with `check`, which throws naming the knob).
template <auto M>
Knob choiceKnob(std::string name, std::string group, std::string range, std::string doc,
                std::function<void(const std::string&)> check) {
  Knob k = stringKnob<M>(std::move(name), std::move(group), std::move(doc), std::move(range));
  k.type = "choice";
  k.set = [check](Config& c, const std::string& v) {
    check(v);
    c.*M = v;
  };
  return k;
}

std::vector<Knob> buildRegistry() {
  std::vector<Knob> r;
  // --- topology
  r.push_back(stringKnob<&Config::topoFile>("NCCL_TOPO_FILE", "topology",
                                            "Topology XML to load instead of discovering the machine"));
  r.push_back(stringKnob<&Config::topoDumpFile>("NCCL_TOPO_DUMP_FILE", "topology",
                                                "Where `topo dump` writes when --out is not given"));
  r.push_back(choiceKnob<&Config::discoveryRules>(
      "TOPOCOLL_DISCOVERY_RULES", "topology", "2.30 | 2.28",
      "Which NCCL release's discovery rules the local topology follows: 2.30 (NCCL 2.30.7: a GPU's link speed and "
      "width from NVML, <cpu affinity> always written, <gpu mlopart>) or 2.28 (NCCL 2.28.x, e.g. PyTorch's 2.28.9: "
      "link speed and width from sysfs, affinity only when the NUMA node's cpumap is readable, no mlopart)",
      [](const std::string& v) {
        if (v != "2.30" && v != "2.28")
          fail(StatusCode::kInvalidArgument, "TOPOCOLL_DISCOVERY_RULES={}: expected 2.30 or 2.28", v);
      }));
  {
    Knob k = stringKnob<&Config::netMergeLevel>("NCCL_NET_MERGE_LEVEL", "topology",
                                                "Fuse NET ports at most this far apart into one virtual NIC (LOC disables)",
                                                "PORT | LOC..SYS");
    k.type = "level";
    k.set = [](Config& c, const std::string& v) {
      c.netMergeLevel = v;
      c.netMergeLevelValue = v == "PORT" ? 1 : parsePathLevel("NCCL_NET_MERGE_LEVEL", v);
    };
    k.get = [](const Config& c) { return c.netMergeLevel.empty() ? std::string("PORT") : c.netMergeLevel; };
    r.push_back(std::move(k));
  }
  r.push_back(stringKnob<&Config::netForceMerge>("NCCL_NET_FORCE_MERGE", "topology",
                                                 "Explicit NIC fusion: 'mlx5_0,mlx5_1;mlx5_2,mlx5_3'"));
  r.push_back(intKnob<&Config::ibMergeNics>("NCCL_IB_MERGE_NICS", "topology", 0, 1, "0 disables NIC fusion"));
  {
    Knob k;
    k.name = "NCCL_NETDEVS_POLICY";
    k.type = "choice";
    k.range = "AUTO | ALL | MAX:<n>";
    k.group = "topology";
    k.doc = "NICs each GPU may use: AUTO (by bandwidth), ALL, or at most n";
    k.set = [](Config& c, const std::string& v) {
      std::string s = v;
      for (auto& ch : s) ch = static_cast<char>(toupper(static_cast<unsigned char>(ch)));
      if (s == "AUTO") c.netDevsPolicy = 0;
      else if (s == "ALL") c.netDevsPolicy = 1;
      else if (s.rfind("MAX:", 0) == 0) {
        c.netDevsPolicy = 2;
        c.netDevsPolicyMax = static_cast<int>(parseInteger("NCCL_NETDEVS_POLICY", s.substr(4), 1, 1 << 16));
      } else {
        fail(StatusCode::kInvalidArgument, "NCCL_NETDEVS_POLICY={}: expected AUTO, ALL or MAX:<n>", v);
      }
    };
    k.get = [](const Config& c) {
      return c.netDevsPolicy == 0 ? std::string("AUTO")
             : c.netDevsPolicy == 1 ? std::string("ALL")
                                    : "MAX:" + std::to_string(c.netDevsPolicyMax);
    };
    r.push_back(std::move(k));
  }
  {
    Knob k = intKnob<&Config::netPluginVersion>(
        "TOPOCOLL_NET_PLUGIN_VERSION", "topology", 0, 12,
        "Network plugin NCCL loads: 0 = its internal IB/socket plugins (fused NICs of at most 4 ports), 6..12 = an "
        "external plugin of that version (v12: 8 ports)");
    k.range = "0 | 6..12";
    k.set = [](Config& c, const std::string& v) {
      long long x = parseInteger("TOPOCOLL_NET_PLUGIN_VERSION", v, 0, 12);
      if (x != 0 && x < 6)
        fail(StatusCode::kInvalidArgument,
             "TOPOCOLL_NET_PLUGIN_VERSION={}: NCCL 2.30.7 loads net plugins of versions 6 to 12 (0 = internal)", v);
      c.netPluginVersion = static_cast<int>(x);
    };
    r.push_back(std::move(k));
  }
  {
    Knob k = stringKnob<&Config::netDevices>(
        "TOPOCOLL_NET_DEVICES", "topology",
        "The network devices the job sees, in plugin order, instead of the XML's <net>s: name[:Mb/s][@PCI bus id], "
        "e.g. 'eth0:25000' or 'mlx5_0@0000:1c:00.0,mlx5_1@0000:9c:00.0'. Without a bus id a socket device under the "
        "first CPU (no GPU Direct, never fused), with one an RDMA NIC on that PCI device. An XML without <net> gets "
        "one 10 Gb/s socket device eth0",
        "name[:speed][@busid],...");
    k.set = [](Config& c, const std::string& v) {
      std::vector<NetDeviceSpec> specs;
      size_t pos = 0;
      while (pos <= v.size()) {
        size_t comma = v.find(',', pos);
        std::string tok = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? v.size() + 1 : comma + 1;
        NetDeviceSpec d;
        if (size_t at = tok.find('@'); at != std::string::npos) {
          d.busId = tok.substr(at + 1);
          tok.resize(at);
          if (d.busId.empty())
            fail(StatusCode::kInvalidArgument, "TOPOCOLL_NET_DEVICES={}: '@' without a PCI bus id", v);
        }
        if (size_t colon = tok.find(':'); colon != std::string::npos) {
          d.speedMbps = static_cast<int>(parseInteger("TOPOCOLL_NET_DEVICES", tok.substr(colon + 1), 1, 1 << 30));
          tok.resize(colon);
        }
        d.name = tok;
        if (d.name.empty())
          fail(StatusCode::kInvalidArgument, "TOPOCOLL_NET_DEVICES={}: a device without a name (name[:Mb/s][@busid])", v);
        for (auto& o : specs)
          if (o.name == d.name)
            fail(StatusCode::kInvalidArgument, "TOPOCOLL_NET_DEVICES={}: device {} named twice", v, d.name);
        specs.push_back(d);
      }
      c.netDevices = v;
      c.netDeviceSpecs = std::move(specs);
    };
    r.push_back(std::move(k));
  }
  // --- paths
  r.push_back(levelKnob<&Config::p2pLevel>("NCCL_P2P_LEVEL", "paths",
                                           "Max path type for GPU peer-to-peer (default: PXB, or SYS on some CPUs)"));
  r.push_back(intKnob<&Config::p2pDisable>("NCCL_P2P_DISABLE", "paths", 0, 1,
                                           "1 disables peer-to-peer (same as NCCL_P2P_LEVEL=LOC)"));
  r.push_back(levelKnob<&Config::netGdrLevel>("NCCL_NET_GDR_LEVEL", "paths",
                                              "Max GPU-NIC path type for GPU Direct RDMA (default P2C)"));
  r.push_back(intKnob<&Config::netGdrRead>("NCCL_NET_GDR_READ", "paths", -2, 1,
                                           "GDR for sends: 0 off, 1 on, -2 auto (on from Ampere or with NVLink)"));
  r.push_back(intKnob<&Config::netGdrC2c>("NCCL_NET_GDR_C2C", "paths", 0, 1, "Allow GDR over C2C+PCI (P2C) paths"));
  r.push_back(intKnob<&Config::pxnDisable>("NCCL_PXN_DISABLE", "paths", 0, 1,
                                           "1 disables PXN (sending through an NVLink peer's NIC)"));
  r.push_back(intKnob<&Config::pxnC2c>("NCCL_PXN_C2C", "paths", 0, 1, "Allow PXN relays reaching their NIC over P2C"));
  r.push_back(intKnob<&Config::nvbDisable>("NCCL_NVB_DISABLE", "paths", 0, 1,
                                           "1 disables NVLink paths through an intermediate GPU (NVB)"));
  r.push_back(intKnob<&Config::netDisableIntra>(
      "NCCL_NET_DISABLE_INTRA", "paths", 0, 1,
      "1: GPUs of one host never use the network between them (by default they do when both reach a NIC faster "
      "than each other)"));
  r.push_back(intKnob<&Config::shmDisable>("NCCL_SHM_DISABLE", "paths", 0, 1,
                                           "1 disables shared memory: GPUs of one host without P2P then use the network"));
  // --- search
  r.push_back(intKnob<&Config::crossNic>("NCCL_CROSS_NIC", "search", 0, 2,
                                         "Rings/trees may use different NICs in and out: 0 no, 1 yes, 2 if better"));
  r.push_back(intKnob<&Config::nvlsEnable>("NCCL_NVLS_ENABLE", "search", 0, 2,
                                           "NVLink SHARP: 0 off, 1 forced on, 2 auto (sm>=90 with an NVSwitch)"));
  r.push_back(intKnob<&Config::collnetEnable>("NCCL_COLLNET_ENABLE", "search", 0, 1,
                                              "1 enables CollNet (network SHARP) when NICs carry coll=\"1\""));
  {
    // NCCL clamps the channel counts to [0, MAXCHANNELS] / [1, MAXCHANNELS] rather than refusing.
    Knob k = intKnob<&Config::minNchannels>("NCCL_MIN_NCHANNELS", "search", 0, 1 << 20,
                                            "Minimum number of channels (values above 64 mean 64)", {"NCCL_MIN_NRINGS"});
    k.set = [](Config& c, const std::string& v) {
      c.minNchannels = static_cast<int>(std::min<long long>(parseInteger("NCCL_MIN_NCHANNELS", v, -2, 1 << 20), 64));
      c.minNchannels = std::max(c.minNchannels, 0);
    };
    r.push_back(std::move(k));
    Knob m = intKnob<&Config::maxNchannels>("NCCL_MAX_NCHANNELS", "search", 0, 1 << 20,
                                            "Maximum number of channels (clamped to [1, 64])", {"NCCL_MAX_NRINGS"});
    m.set = [](Config& c, const std::string& v) {
      c.maxNchannels = static_cast<int>(std::clamp<long long>(parseInteger("NCCL_MAX_NCHANNELS", v, -2, 1 << 20), 1, 64));
    };
    r.push_back(std::move(m));
  }
  // NCCL 2.30.7 src/init.cc (MinCTAs/MaxCTAs, ncclConfig_t's minCTAs/maxCTAs); src/graph/connect.cc applies them.
  r.push_back(intKnob<&Config::minCtas>("NCCL_MIN_CTAS", "search", -1, 1 << 20,
                                        "At least this many channels (ncclConfig_t's minCTAs; above 64 means 64; "
                                        "-1: unset)"));
  r.push_back(intKnob<&Config::maxCtas>("NCCL_MAX_CTAS", "search", -1, 1 << 20,
                                        "At most this many channels (ncclConfig_t's maxCTAs; -1: unset)"));
  // NCCL 2.30.7 src/init.cc (P2P_MAX_PEERS, ncclConfig_t's maxP2pPeers); src/graph/paths.cc applies it.
  r.push_back(intKnob<&Config::maxP2pPeers>("NCCL_P2P_MAX_PEERS", "search", -1, 1 << 30,
                                            "Peers a rank sends to or receives from at once, across nodes: fewer "
                                            "give each more channels (ncclConfig_t's maxP2pPeers; -1: every rank)"));
  r.push_back(intKnob<&Config::minP2pNchannels>("NCCL_MIN_P2P_NCHANNELS", "search", 1, 64,
                                                "Minimum channels for send/recv"));
  r.push_back(intKnob<&Config::maxP2pNchannels>("NCCL_MAX_P2P_NCHANNELS", "search", 1, 64,
                                                "Maximum channels for send/recv"));
  r.push_back(intKnob<&Config::p2pPerChannelNetBw>("NCCL_P2P_PER_CHANNEL_NET_BW", "search", 1, 1 << 20,
                                                   "GB/s per send/recv channel through the network"));
  r.push_back(stringKnob<&Config::graphFile>("NCCL_GRAPH_FILE", "search", "Graph XML to use instead of searching"));
  r.push_back(stringKnob<&Config::graphDumpFile>("NCCL_GRAPH_DUMP_FILE", "search",
                                                 "Where to write the searched graphs (graph XML)"));
  r.push_back(stringKnob<&Config::planFile>(
      "TOPOCOLL_PLAN_FILE", "search",
      "Where rank 0 of a communicator writes the plan it executes, as plan JSON without timings (what `topocoll plan "
      "--json --no-timings` prints for the same topology and job)"));
  r.push_back(intKnob<&Config::searchTimeoutScale>("TOPOCOLL_SEARCH_TIMEOUT_SCALE", "search", 1, 1 << 10,
                                                   "Multiply NCCL's search step budgets (1 = NCCL's)"));
  r.push_back(intKnob<&Config::mnnvlEnable>(
      "NCCL_MNNVL_ENABLE", "search", 0, 2,
      "Multi-node NVLink: 2 (auto) and 1 plan the hosts of a multi-host topology XML as NVLink cliques, 0 plans "
      "each host as its own node"));
  r.push_back(intKnob<&Config::searchMemo>(
      "TOPOCOLL_SEARCH_MEMO", "search", 0, 1,
      "1: the search charges a failed sub-search it has walked before instead of walking it again, and leaves out "
      "links no check can refuse (same result, less work); 0 walks every step and charges every link as NCCL does"));
  // --- tuning
  r.push_back(stringKnob<&Config::algo>("NCCL_ALGO", "tuning",
                                        "Algorithms allowed: 'ring,tree', '^nvls', 'allreduce:tree;allgather:ring'",
                                        "Ring Tree CollnetDirect CollnetChain NVLS NVLSTree PAT"));
  r.push_back(stringKnob<&Config::proto>("NCCL_PROTO", "tuning",
                                         "Protocols allowed: 'LL,Simple', '^LL128', per collective like NCCL_ALGO",
                                         "LL LL128 Simple"));
  r.push_back(intKnob<&Config::nthreads>("NCCL_NTHREADS", "tuning", -2, 1 << 16,
                                         "Threads per block for Simple/LL (multiple of 32, 64..512; -2 auto)"));
  r.push_back(intKnob<&Config::ll128Nthreads>("NCCL_LL128_NTHREADS", "tuning", -2, 1 << 16,
                                              "Threads per block for LL128 (multiple of 32, 160..640; -2 auto)"));
  r.push_back(intKnob<&Config::netOverhead>("NCCL_NET_OVERHEAD", "tuning", -2, 1 << 30,
                                            "Per network step overhead in ns (-2: by CPU vendor)"));
  r.push_back(intKnob<&Config::ll128C2c>("NCCL_LL128_C2C", "tuning", 0, 1,
                                         "Enable LL128 over P2C/PXN paths on Hopper and later"));
  r.push_back(intKnob<&Config::patEnable>("NCCL_PAT_ENABLE", "tuning", 0, 2,
                                          "PAT algorithm: 0 off, 1 on, 2 auto (one GPU per node)"));
  r.push_back(stringKnob<&Config::threadThresholds>("NCCL_THREAD_THRESHOLDS", "tuning",
                                                    "Per-thread work thresholds: 'treeLL treeLL128 treeSimple ringLL ...'"));
  // --- bootstrap and communicator init
  r.push_back(stringKnob<&Config::commId>("NCCL_COMM_ID", "bootstrap",
                                          "host:port of the bootstrap root (rank 0 listens there)"));
  r.push_back(stringKnob<&Config::hostId>("NCCL_HOSTID", "bootstrap",
                                          "Host identity override (several 'hosts' on one machine in tests)"));
  r.push_back(stringKnob<&Config::socketIfname>("NCCL_SOCKET_IFNAME", "bootstrap",
                                                "Interfaces: prefixes, ^exclude, =exact (default ib*, then not docker/lo)"));
  r.push_back(choiceKnob<&Config::netName>(
      "NCCL_NET", "transport", "Socket", "The network plugin by name (ncclConfig_t's netName): this build has Socket",
      [](const std::string& v) {
        if (!v.empty() && strcasecmp(v.c_str(), "Socket") != 0)
          fail(StatusCode::kInvalidUsage,
               "NCCL_NET={}: no network of that name here (topocoll's network is \"Socket\"; NCCL's IB and plugins "
               "are not part of it)",
               v);
      }));
  r.push_back(choiceKnob<&Config::socketFamily>(
      "NCCL_SOCKET_FAMILY", "bootstrap", "AF_INET | AF_INET6", "Address family of the bootstrap and socket transport",
      [](const std::string& v) {
        if (v != "AF_INET" && v != "AF_INET6")
          fail(StatusCode::kInvalidArgument, "NCCL_SOCKET_FAMILY={}: expected AF_INET or AF_INET6", v);
      }));
  {
    Knob k;
    k.name = "TOPOCOLL_TIMEOUT";
    k.type = "seconds";
    k.range = "(0, 86400]";
    k.group = "bootstrap";
    k.doc = "Seconds any wait on a peer may block before failing with an error naming the peer";
    k.set = [](Config& c, const std::string& v) {
      char* end = nullptr;
      errno = 0;
      double s = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || errno || !(s > 0) || s > 86400)
        fail(StatusCode::kInvalidArgument, "TOPOCOLL_TIMEOUT={}: expected seconds in (0, 86400]", v);
      c.timeoutSec = s;
    };
    k.get = [](const Config& c) { return fmt::format("{:g}", c.timeoutSec); };
    r.push_back(std::move(k));
  }
  r.push_back(intKnob<&Config::simulateGpus>("TOPOCOLL_SIMULATE_GPUS", "bootstrap", 0, 1,
                                             "1: each rank takes the NCCL_TOPO_FILE GPU whose dev is its local rank"));
  r.push_back(intKnob<&Config::simulateGpuDev>("TOPOCOLL_SIMULATE_GPU_DEV", "bootstrap", -1, 1 << 16,
                                               "With TOPOCOLL_SIMULATE_GPUS: this rank's GPU dev (-1: its local rank)"));
  r.push_back(stringKnob<&Config::jobId>(
      "TOPOCOLL_JOB_ID", "bootstrap",
      "Name of this job, mixed into the bootstrap magic so that two jobs sharing a root address are told apart "
      "(launchers' job ids are mixed in already)"));
  {
    Knob k = stringKnob<&Config::jobSecret>(
        "TOPOCOLL_JOB_SECRET", "bootstrap",
        "Secret of a job started from the environment (RANK/WORLD_SIZE, mpirun, srun, torchrun), the same on every "
        "rank: each connection of the job proves it holds it (docs/security.md). Without it (or "
        "TOPOCOLL_JOB_SECRET_FILE) anyone who can reach the root's address can join the job");
    k.get = [](const Config& c) { return c.jobSecret.empty() ? std::string() : std::string("(set)"); };
    r.push_back(std::move(k));
  }
  r.push_back(stringKnob<&Config::jobSecretFile>(
      "TOPOCOLL_JOB_SECRET_FILE", "bootstrap",
      "A file holding the job's secret (as TOPOCOLL_JOB_SECRET), owned by the job's user and readable by nobody else"));
  r.push_back(intKnob<&Config::allowSharedGpu>(
      "TOPOCOLL_ALLOW_SHARED_GPU", "bootstrap", 0, 1,
      "Tests only: 1 lets several ranks of one host use the same CUDA device (NCCL refuses: \"Duplicate GPU "
      "detected\"); such ranks are planned as host-memory ranks and connect over CUDA IPC"));
  r.push_back(choiceKnob<&Config::testDieAfter>(
      "TOPOCOLL_TEST_DIE_AFTER", "bootstrap", "register | ring | bootstrap | peerinfo",
      "Tests only: the process exits after this init phase (registration, ring setup, bootstrap, peer-info allgather)",
      [](const std::string& v) {
        if (v != "register" && v != "ring" && v != "bootstrap" && v != "peerinfo")
          fail(StatusCode::kInvalidArgument, "TOPOCOLL_TEST_DIE_AFTER={}: expected register, ring, bootstrap or peerinfo", v);
      }));
  // --- transports
  r.push_back(sizeKnob<&Config::buffSize>("NCCL_BUFFSIZE", "transport", 1 << 16, 1ll << 30,
                                          "Bytes of the Simple FIFO of each connection (NCCL_STEPS slots)"));
  r.push_back(sizeKnob<&Config::llBuffSize>("NCCL_LL_BUFFSIZE", "transport", 1 << 12, 1ll << 30,
                                            "Bytes of the LL FIFO of each connection (16-byte lines)"));
  r.push_back(intKnob<&Config::p2pReadEnable>("NCCL_P2P_READ_ENABLE", "transport", -2, 1,
                                              "P2P read mode (the Simple buffer on the sender; single copies pull): "
                                              "0 write, 1 read, -2 by topology (NVLink between sm80 GPUs)"));
  r.push_back(intKnob<&Config::p2pDirectDisable>("NCCL_P2P_DIRECT_DISABLE", "transport", 0, 1,
                                                 "1: ranks of one process do not access each other's buffers directly"));
  r.push_back(sizeKnob<&Config::p2pLlThreshold>("NCCL_P2P_LL_THRESHOLD", "transport", 0, 1ll << 30,
                                                "Send/recv messages up to this many bytes per channel use LL"));
  r.push_back(sizeKnob<&Config::p2pNetChunkSize>("NCCL_P2P_NET_CHUNKSIZE", "transport", 1 << 10, 1ll << 24,
                                                 "Send/recv chunk bytes when the job spans several nodes"));
  r.push_back(sizeKnob<&Config::p2pPciChunkSize>("NCCL_P2P_PCI_CHUNKSIZE", "transport", 1 << 10, 1ll << 24,
                                                 "Send/recv chunk bytes within one node"));
  r.push_back(sizeKnob<&Config::netChunkSize>(
      "TOPOCOLL_NET_CHUNKSIZE", "transport", 1 << 12, 1ll << 30,
      "NET send/recv chunk bytes: the proxies move them between the users' buffers, without FIFO copies"));
  r.push_back(intKnob<&Config::socketPacing>(
      "TOPOCOLL_SOCKET_PACING", "transport", -1, 1 << 30,
      "Most Mbit/s each NET/Socket socket sends at (SO_MAX_PACING_RATE); 0 no cap; -1 (default) 1.25x the "
      "interface's speed where the socket's TCP congestion control is BBR"));
  r.push_back(intKnob<&Config::netStreams>(
      "TOPOCOLL_NET_STREAMS", "transport", -1, 1024,
      "How many queued NET sends of a connection move while the one before them waits for the receiver's "
      "acknowledgement: 0 none (each waits for the last one's), N at most N, -1 the runtime's choice (none between "
      "exactly two hosts, one over more)"));
  r.push_back(sizeKnob<&Config::p2pSingleCopy>(
      "TOPOCOLL_P2P_SINGLE_COPY", "transport", -1, 1ll << 40,
      "P2P messages from this many bytes go in one copy (same process: memcpy; other process: "
      "process_vm_readv/writev where the kernel allows); -1 never"));
  r.push_back(intKnob<&Config::mapPeerBuffers>(
      "TOPOCOLL_MAP_PEER_BUFFERS", "transport", 0, 1,
      "1: a single copy between processes out of or into a buffer of runtime::memAlloc / ncclMemAlloc (shareable "
      "memory) maps that buffer in the copying process once and copies with loads and stores (up to 1.8x faster "
      "than process_vm_readv/writev); 0: always process_vm_readv/writev"));
  r.push_back(intKnob<&Config::checkCalls>(
      "TOPOCOLL_CHECK_CALLS", "collectives", 0, 1,
      "1: before every collective all ranks compare what they called (collective, count, type, op, root) and a "
      "difference fails naming both ranks (one bootstrap allgather per call)"));
  r.push_back(sizeKnob<&Config::deviceOneShotMax>(
      "TOPOCOLL_DEVICE_ONESHOT_MAX", "collectives", -1, 1ll << 40,
      "Out-of-place AllReduce on device buffers of at most this many bytes is one-shot (every rank reduces the whole "
      "vector from every rank's input: one host barrier less); larger ones are two-shot (docs/gpu.md); -1 never"));
  r.push_back(intKnob<&Config::deviceStaged>(
      "TOPOCOLL_DEVICE_STAGED", "collectives", 0, 1,
      "1: collectives on device buffers go through pinned host memory and the host collectives even when every rank "
      "is on one host (where they otherwise read each other's buffers through CUDA IPC)"));
  r.push_back(intKnob<&Config::deviceLeader>(
      "TOPOCOLL_DEVICE_LEADER", "collectives", 0, 1,
      "1: when every rank's device buffers are on the same GPU, rank 0 does all of a collective's reductions and "
      "copies (the GPU runs one process's work instead of switching between every rank's: docs/gpu.md); 0: each rank "
      "does its share (two-shot AllReduce), as on several GPUs"));
  r.push_back(intKnob<&Config::deviceIpcCache>(
      "TOPOCOLL_DEVICE_IPC_CACHE", "collectives", 4, 1 << 20,
      "Peers' device allocations a communicator keeps mapped (cudaIpcOpenMemHandle) for later collectives; beyond "
      "it the least recently used are closed"));
  r.push_back(sizeKnob<&Config::directMax>(
      "TOPOCOLL_DIRECT_MAX", "collectives", -1, 1ll << 40,
      "AllReduce of at most this many bytes with every rank on one host may use the Direct algorithm (each rank "
      "receives every input and reduces them itself) when the host cost model finds it faster; -1 never"));
  r.push_back(sizeKnob<&Config::directSplitMin>(
      "TOPOCOLL_DIRECT_SPLIT_MIN", "collectives", -1, 1ll << 40,
      "AllReduce of at least this many bytes (and above TOPOCOLL_DIRECT_MAX) with every rank on one host and at "
      "least TOPOCOLL_DIRECT_SPLIT_RANKS ranks uses the DirectSplit algorithm (each rank reduces its split of "
      "everybody's data, then takes the other splits); -1 never"));
  r.push_back(intKnob<&Config::directSplitRanks>(
      "TOPOCOLL_DIRECT_SPLIT_RANKS", "collectives", 1, 1 << 20,
      "the fewest ranks for DirectSplit (see TOPOCOLL_DIRECT_SPLIT_MIN; at most 8 ranks use it)"));
  r.push_back(intKnob<&Config::p2pMailboxMax>(
      "TOPOCOLL_P2P_MAILBOX_MAX", "transport", 0, 256,
      "sends and receives of at most this many bytes between ranks whose connection has a mailbox (shared memory, "
      "P2P; not NET) go eagerly through the connection's point-to-point mailbox: the send returns once written, the "
      "receive polls; larger ones through the FIFO. Every rank must use the same value; 0 never"));
  r.push_back(intKnob<&Config::membarrier>(
      "TOPOCOLL_MEMBARRIER", "transport", 0, 1,
      "1: a thread about to sleep on its process's doorbell issues membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), so "
      "that publishers in registered processes ring it without a fence (falls back to the fence where the kernel "
      "refuses, and switches to the fence for good once the process's sleeps are frequent: 100 within 100 ms); 0: every "
      "ring issues a seq_cst fence. The process's first communicator decides"));
  r.push_back(intKnob<&Config::oneShotMax>(
      "TOPOCOLL_ONESHOT_MAX", "collectives", 0, 256,
      "collectives whose message to each peer is at most this many bytes, with every rank on one host and neither "
      "NCCL_ALGO nor NCCL_PROTO set, move in one trip through the connections' one-shot mailboxes (each rank writes "
      "its data into every peer's mailbox and reduces what it received in rank order); 0 never"));
  r.push_back(stringKnob<&Config::hostThresholds>(
      "TOPOCOLL_HOST_THRESHOLDS", "collectives",
      "Overrides of the host collectives' size thresholds (tuning::HostThresholds), \"name=bytes,...\": what "
      "bench/host_thresholds.py measures and prints"));
  r.push_back(stringKnob<&Config::hostTuning>(
      "TOPOCOLL_HOST_TUNING", "collectives",
      "JSON of the host cost model's constants (what bench/host_calibrate writes) replacing the built-in ones "
      "measured on the project's machine; the collectives pick algorithm, protocol and channels with them"));
  // --- torch
  r.push_back(intKnob<&Config::torchHugePages>(
      "TOPOCOLL_TORCH_HUGEPAGES", "torch", 0, 1,
      "1: `import topocoll.torch` installs PyTorch's CPU allocator that starts tensors of 2 MiB and more on a 2 MiB "
      "boundary with madvise(MADV_HUGEPAGE), so that the kernel backs them with transparent huge pages and a peer "
      "pulling them pins 2 MiB pages, not 4 KiB ones (as PyTorch 2.x's THP_MEM_ALLOC_ENABLE=1), and moves a tensor of "
      "4 MiB or more that is not on them (made before the import) onto them with MADV_COLLAPSE at its third use in a "
      "collective (topocoll.torch.use_huge_pages() does the same from the program); 0 (default): PyTorch's own "
      "allocator, no collapse. PyTorch's name THP_MEM_ALLOC_ENABLE is read when this one is not set",
      {"THP_MEM_ALLOC_ENABLE"}));
  r.push_back(intKnob<&Config::torchShareable>(
      "TOPOCOLL_TORCH_SHAREABLE", "torch", 0, 1,
      "1: `import topocoll.torch` installs PyTorch's CPU allocator that puts tensors of 1 MiB and more in "
      "shareable memory (memfd, as ncclMemAlloc's; at most a quarter of RLIMIT_NOFILE of them, each holds a "
      "descriptor), keeping up to 256 MiB of freed blocks for reuse, so that the collectives copy straight out of and "
      "into peers' tensors through mappings, with no staging copy (topocoll.torch.use_shareable_tensors() does the "
      "same from the program). fork() keeps anonymous memory's meaning: the tensors alive then become copy-on-write "
      "in the parent (nothing copied; a collective on a whole such tensor makes it shareable again with one copy), "
      "or, while an operation is in flight, are copied into the child at once. 0 (default): PyTorch's allocator "
      "stays; large tensors go through the group's staging buffer (TOPOCOLL_TORCH_STAGING)"));
  r.push_back(sizeKnob<&Config::torchStaging>(
      "TOPOCOLL_TORCH_STAGING", "torch", -1, 1ll << 40,
      "all_reduce of a private tensor (PyTorch's own allocator: the peers cannot map it) of this many bytes and "
      "more: the tensor is copied into the process group's shareable staging buffer, the all-reduce runs there in "
      "place on mapped memory, and the result is copied back (one buffer per group, grown to the largest such "
      "operation up to 32 MiB, kept; 1.5-2.4x the busbw of the FIFO path at 2-32 MiB, 2 ranks); -1: never, the "
      "all-reduce runs on the tensor itself through the transports' FIFOs. Other collectives always run on the "
      "tensors (staging measured slower for them), and so does every collective of a group whose ranks are on "
      "several hosts (nothing is mapped there: the copies only cost)"));
  r.push_back(intKnob<&Config::nsocksPerThread>("NCCL_NSOCKS_PERTHREAD", "transport", -2, 64,
                                                "NET/Socket: data sockets per helper thread (-2: 1)"));
  r.push_back(intKnob<&Config::socketNthreads>("NCCL_SOCKET_NTHREADS", "transport", -2, 16,
                                               "NET/Socket: helper threads per connection (-2: 0, the proxy moves the data)"));
  // --- debug
  r.push_back(choiceKnob<&Config::debug>("NCCL_DEBUG", "debug", "VERSION | WARN | INFO | ABORT | TRACE",
                                         "Log level (each includes the less verbose ones)",
                                         [](const std::string& v) { log::parseLevel(v); }));
  r.push_back(choiceKnob<&Config::debugSubsys>(
      "NCCL_DEBUG_SUBSYS", "debug", "[^]INIT,COLL,P2P,SHM,NET,GRAPH,TUNING,ENV,ALLOC,CALL,PROXY,NVLS,BOOTSTRAP,...,ALL",
      "Subsystems logged at INFO (default INIT,BOOTSTRAP,ENV); ^ excludes the listed ones",
      [](const std::string& v) { log::parseSubsys(v); }));
  r.push_back(stringKnob<&Config::debugFile>("NCCL_DEBUG_FILE", "debug",
                                             "Log to this file instead of stdout; %h = hostname, %p = pid"));
  r.push_back(stringKnob<&Config::confFile>(
      "NCCL_CONF_FILE", "debug",
      "A file of NAME=value lines read under the environment (which wins), instead of ~/.nccl.conf; "
      "/etc/nccl.conf is read after it"));
  return r;
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// NCCL logs each knob taken from the environment once per process ("NCCL_X set by environment to Y.").
void logSetOnce(const std::string& name, const std::string& value) {
  if (!log::enabled(log::Level::kInfo, log::kEnv)) return;
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lk(mu);
  if (seen.insert(name + "=" + value).second) TC_INFO(log::kEnv, "{} set by environment to {}.", name, value);
}

void warnOnce(const std::string& msg) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lk(mu);
  if (seen.insert(msg).second) TC_WARN("{}", msg);
}

}  // namespace

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> registry = buildRegistry();
  return registry;
}

const Knob* findKnob(std::string_view name) {
  for (const Knob& k : knobs()) {
    if (k.name == name) return &k;
    for (auto& a : k.aliases)
      if (a == name) return &k;
  }
  return nullptr;
}

bool isNcclKnobName(std::string_view name) {
  static constexpr std::string_view kNames[] = {
#include "nccl_knob_names.inc"
  };
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

std::vector<std::string> knobTypos(const Env& env) {
  std::vector<std::string> out;
  for (auto& [name, value] : env.vars()) {
    if (name.rfind("NCCL_", 0) != 0 && name.rfind("TOPOCOLL_", 0) != 0) continue;
    // A knob of ours, or one of NCCL's (NCCL_IB_DISABLE, NCCL_RAS_ENABLE: set for NCCL, not misspelt).
    if (findKnob(name) || isNcclKnobName(name)) continue;
    const Knob* best = nullptr;
    size_t bestD = 3;
    for (const Knob& k : knobs()) {
      // The distance is at least the length difference: names far longer than any knob cost nothing.
      if (std::max(name.size(), k.name.size()) - std::min(name.size(), k.name.size()) >= bestD) continue;
      size_t d = editDistance(name, k.name);
      if (d < bestD) bestD = d, best = &k;
    }
    if (best)
      out.push_back(fmt::format("{}={} is not a knob topocoll knows; did you mean {}?", name, value, best->name));
  }
  return out;
}

int parsePathLevel(const std::string& knob, const std::string& value) {
  for (int i = 0; i < 10; ++i)
    if (value == kLevelNames[i]) return i;
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
  for (const Knob& k : knobs()) {
    // The knob's own name wins over its legacy aliases; an empty value means "not set", as NCCL's getenv checks.
    std::optional<std::string> v = env.get(k.name);
    std::string from = k.name;
    for (auto it = k.aliases.begin(); (!v || v->empty()) && it != k.aliases.end(); ++it) {
      v = env.get(*it);
      from = *it;
    }
    if (!v || v->empty()) continue;
    k.set(c, *v);
    logSetOnce(from, *v);
  }
  if (c.p2pDisable == 1) {
    if (c.p2pLevel && *c.p2pLevel != 0)
      fail(StatusCode::kInvalidArgument,
           "NCCL_P2P_DISABLE=1 contradicts NCCL_P2P_LEVEL={} (NCCL would ignore the level); unset one of them",
           env.get("NCCL_P2P_LEVEL").value_or(""));
    c.p2pLevel = 0;
  }
  for (const std::string& typo : knobTypos(env)) warnOnce(typo);
  return c;
}

}  // namespace topocoll
