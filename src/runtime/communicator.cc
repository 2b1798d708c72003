// Communicator initialisation, phase by phase as NCCL 2.30.7's initTransportsRank (src/init.cc): peer info, nodes,
// devices, this node's plan, the graph-info allgather, then the transports of the rings and trees.
#include "comm_impl.h"
#include "one_sided.h"
#include "topocoll/runtime/communicator.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>

#include "coll_task.h"
#include "topocoll/collectives/device_coll.h"
#include "topocoll/cuda.h"
#include "topocoll/log.h"
#include "topocoll/netif.h"
#include "topocoll/paths/paths.h"
#include "topocoll/progress/channel_links.h"
#include "topocoll/progress/connections.h"
#include "topocoll/progress/engine.h"
#include "topocoll/progress/mailboxes.h"
#include "topocoll/status.h"
#include "topocoll/topology/discovery.h"
#include "topocoll/topology/node_xml.h"
#include "topocoll/transport/net.h"
#include "topocoll/transport/proxy.h"
#include "topocoll/version.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace topocoll::runtime {

using topology::NodeType;
using Clock = std::chrono::steady_clock;

namespace {

// The graph-info record is sent as bytes: every field is 4 bytes wide, so there is no padding.
static_assert(sizeof(search::GraphInfo) == 8 * 4);
static_assert(sizeof(search::RankTopo) ==
              search::kNumGraphs * sizeof(search::GraphInfo) + (14 + 10 * search::kMaxChannels) * 4);

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// How long a failed rank 0 keeps its root up so that ranks still registering learn why the job failed.
constexpr std::chrono::milliseconds kRootLinger{10000};

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL; }

int currentNumaNode() {
  int cpu = sched_getcpu();
  if (cpu < 0) return 0;
  for (int n = 0; n < 1024; ++n) {
    std::string p = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/node" + std::to_string(n);
    if (access(p.c_str(), F_OK) == 0) return n;
  }
  return 0;
}

// The NICs NET/Socket would use and the slowest one's speed (0 and 0 without any: a host with loopback only).
void localNics(const Config& cfg, int32_t* count, int32_t* mbps) {
  std::vector<netif::Interface> ifs;
  try {
    ifs = netif::findInterfaces(cfg.socketIfname, cfg.socketFamily, cfg.commId);
  } catch (const Error&) {  // a bad NCCL_SOCKET_FAMILY: NET's setup names it where a job needs NET
  }
  *count = static_cast<int32_t>(ifs.size());
  *mbps = 0;
  for (const auto& i : ifs) {
    const int s = netif::speedMbps(i.name);
    *mbps = *mbps == 0 ? s : std::min(*mbps, s);
  }
}

// NCCL's GRAPH lines: each searched graph's pattern, bandwidths and channels.
void logGraphs(const topology::System& sys, const search::NodeGraphs& node) {
  if (!log::enabled(log::Level::kInfo, log::kGraph)) return;
  for (int gi = 0; gi < search::kNumGraphs; ++gi) {
    if (!node.available[gi]) continue;
    std::string text = search::describe(sys, node.graphs[gi]);
    for (size_t pos = 0, nl; pos < text.size(); pos = nl + 1) {
      nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      TC_INFO(log::kGraph, "{}", std::string_view(text).substr(pos, nl - pos));
    }
  }
}

}  // namespace

InitOptions InitOptions::fromConfig(const Config& cfg) {
  InitOptions o;
  o.cfg = cfg;
  o.bootstrap.timeout = std::chrono::milliseconds(static_cast<long long>(cfg.timeoutSec * 1000));
  o.bootstrap.socketIfname = cfg.socketIfname;
  o.bootstrap.socketFamily = cfg.socketFamily;
  o.bootstrap.testDieAfter = cfg.testDieAfter;
  return o;
}

InitOptions InitOptions::fromEnv(const Env& env) { return fromConfig(Config::fromEnv(env)); }

CommImpl::CommImpl() = default;

CommImpl::~CommImpl() {
  // Order matters: the collectives first (they use all of it), then the engine stops driving before the connections
  // (the connectors and their buffers, the proxy that serves them, the network) go.
  detail::dropFromGroup(this);  // nothing of this thread's open group may point here any more
  stopCollectives();
  devColl_.reset();  // closes the peers' device allocations it opened
  devHost_.reset();
  links_.reset();
  if (p2p_) p2p_->dropPool();
  engine_.reset();
  mailboxes_.reset();
  conns_.reset();
  p2p_.reset();  // the stream of device copies last
  bs_.reset();
}

std::unique_ptr<CommImpl> CommImpl::init(const bootstrap::UniqueId& id, int nRanks, int rank,
                                                 const InitOptions& opts) {
  std::unique_ptr<CommImpl> c(new CommImpl());
  InitOptions o = opts;
  o.bootstrap.abortFlag = &c->abort_;
  auto t0 = Clock::now();
  auto bs = bootstrap::TcpBootstrap::connect(id, rank, nRanks, o.bootstrap);
  double bsMs = msSince(t0);
  return create(std::move(c), std::move(bs), o, bsMs);
}

std::unique_ptr<CommImpl> CommImpl::initFromEnv(const Env& env) {
  InitOptions opts = InitOptions::fromEnv(env);
  LaunchInfo li = launchInfoFromEnv(env, opts.cfg.jobId);
  uint64_t magic = li.jobKey;
  if (!li.jobIdentified)
    TC_INFO(log::kBootstrap, "Bootstrap : no launcher job id: another job using root {} would not be told apart from "
            "this one (TOPOCOLL_JOB_ID names a job)", li.rootAddress);
  bool secret = false;
  const AuthKey key = jobKeyFromEnv(opts.cfg, li, &secret);
  if (!secret) {
    bool loopback = false;
    try {
      loopback = SocketAddress::parse(li.rootAddress).isLoopback();
    } catch (const Error&) {  // init names a bad address below
    }
    if (li.rank == 0 && !loopback)
      TC_WARN("Bootstrap : this job is not authenticated: anyone who can reach {} can join it and read its data. Give "
              "every rank the same TOPOCOLL_JOB_SECRET or TOPOCOLL_JOB_SECRET_FILE (docs/security.md)",
              li.rootAddress);
    else
      TC_INFO(log::kBootstrap, "Bootstrap : no TOPOCOLL_JOB_SECRET: the job's key is derived from the root address {} "
              "and the job ids (local users can compute it)", li.rootAddress);
  }
  bootstrap::RootHandle root;
  bootstrap::UniqueId id;
  if (li.rank == 0) id = bootstrap::createUniqueId(&root, li.rootAddress, magic, li.size, &key);
  else id = bootstrap::uniqueIdFor(li.rootAddress, magic, key);
  try {
    auto comm = init(id, li.size, li.rank, opts);
    comm->root_ = std::move(root);
    return comm;
  } catch (const Error& e) {
    // The root leaves with this process: first, the ranks still on their way learn why the job failed.
    root.abort(fmt::format("rank {} (hosting the root) failed: {}", li.rank, e.what()),
               std::min<std::chrono::milliseconds>(opts.bootstrap.timeout, kRootLinger));
    throw;
  }
}

std::unique_ptr<CommImpl> CommImpl::initWithBootstrap(std::unique_ptr<bootstrap::Bootstrap> bs,
                                                              const InitOptions& opts) {
  return create(std::unique_ptr<CommImpl>(new CommImpl()), std::move(bs), opts, 0);
}

std::unique_ptr<CommImpl> CommImpl::create(std::unique_ptr<CommImpl> c,
                                                   std::unique_ptr<bootstrap::Bootstrap> bs, const InitOptions& opts,
                                                   double bootstrapMs) {
  c->bs_ = std::move(bs);
  c->opts_ = opts;
  c->rank_ = c->bs_->rank();
  c->nRanks_ = c->bs_->nRanks();
  try {
    c->initialise(opts);
  } catch (const Error& e) {
    // A failure of this rank's own (not one the bootstrap reports from elsewhere) is told to the others, so that
    // they name it instead of waiting for this rank or blaming a neighbour.
    if (e.code() != StatusCode::kRemoteError && e.code() != StatusCode::kTimeout && e.code() != StatusCode::kAborted)
      c->bs_->abort(e.what());
    throw;
  }
  c->timings_.bootstrap = bootstrapMs;
  c->timings_.total += bootstrapMs;
  c->logInit();
  return c;
}

void CommImpl::initialise(const InitOptions& opts) {
  auto tStart = Clock::now();
  log::setThreadRank(rank_);
  static std::once_flag versionOnce;
  std::call_once(versionOnce, [] {
    TC_LOG_(log::Level::kVersion, log::kInit, "topocoll version {} (NCCL 2.30.7 rules)", TOPOCOLL_VERSION_FULL);
  });
  if (opts.cfg.testDieAfter == "bootstrap") std::_Exit(3);
  bool gpuMode = false;
  topology::XmlDoc doc;
  gatherPeerInfo(opts, &gpuMode, &doc);
  findNodes();
  auto t = Clock::now();
  if (gpuMode) assignDevices(opts, doc);
  timings_.topology += msSince(t);
  search::NodeGraphs node = planNode(opts, doc);
  joinNodes(opts, node);
  dumpPlan(opts);
  t = Clock::now();
  bs_->setPhase("transport setup");
  setupTransports(opts, node);
  bs_->setPhase("the communicator's calls");
  timings_.transports = msSince(t);
  timings_.total = msSince(tStart);
}

// AllGather 1: every rank's PeerInfo. GPU ranks are simulated from NCCL_TOPO_FILE (TOPOCOLL_SIMULATE_GPUS) or real
// ones that discovery (NVML) finds; a job is all GPU ranks or all host-memory ranks.
void CommImpl::gatherPeerInfo(const InitOptions& opts, bool* gpuMode, topology::XmlDoc* doc) {
  bs_->setPhase("topology discovery");
  auto t = Clock::now();
  peers_.assign(nRanks_, PeerInfo{});
  PeerInfo& me = peers_[rank_];
  me.rank = rank_;
  me.hostHash = topology::hostHash(opts.cfg.hostId);
  me.pid = static_cast<int32_t>(getpid());
  me.pidHash = mix(me.hostHash, static_cast<uint64_t>(me.pid));
  struct stat st {};
  if (stat("/dev/shm", &st) == 0) me.shmDev = static_cast<uint64_t>(st.st_dev);
  me.numaNode = currentNumaNode();
  localNics(opts.cfg, &me.netDevs, &me.netMbps);
  std::random_device rd;
  me.nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  *gpuMode = opts.cfg.simulateGpus != 0;
  if (!*gpuMode) {
    topology::XmlDoc local = topology::discoverLocalTopology(topology::discoveryOptions(opts.cfg));
    if (!topology::gpuDevs(local).empty()) {
      *gpuMode = true;
      *doc = opts.cfg.topoFile.empty() ? std::move(local) : topology::loadXmlFile(opts.cfg.topoFile);
    }
  } else {
    if (opts.cfg.topoFile.empty())
      fail(StatusCode::kInvalidUsage, "TOPOCOLL_SIMULATE_GPUS=1 needs NCCL_TOPO_FILE naming the machine's topology");
    *doc = topology::loadXmlFile(opts.cfg.topoFile);
  }
  me.planGpu = *gpuMode ? 1 : 0;
  me.cudaCompCap = *gpuMode ? 1 : 0;  // simulated GPUs: set from the topology (assignDevices)
  me.dev = opts.cfg.simulateGpus ? opts.cfg.simulateGpuDev : -1;
  if (!opts.cfg.simulateGpus) currentCudaDevice(&me);
  timings_.topology += msSince(t);
  t = Clock::now();
  bs_->setPhase("peer-info allgather");
  bs_->allGather(peers_.data(), sizeof(PeerInfo));
  if (opts.cfg.testDieAfter == "peerinfo") std::_Exit(3);
  bs_->setPhase("node search");
  for (int r = 0; r < nRanks_; ++r)
    if (peers_[r].rank != r) fail(StatusCode::kRemoteError, "peer info of rank {} is corrupt", r);
  // NCCL's duplicate-GPU check (init.cc), on the CUDA devices themselves. Ranks sharing a device (allowed for tests)
  // are planned as host-memory ranks: the topology has one GPU per device.
  bool shared = false;
  for (int i = 0; i < nRanks_; ++i)
    for (int j = i + 1; j < nRanks_; ++j)
      if (peers_[i].cudaDev >= 0 && peers_[i].hostHash == peers_[j].hostHash && peers_[i].busId == peers_[j].busId &&
          peers_[j].cudaDev >= 0) {
        if (!opts.cfg.allowSharedGpu)
          fail(StatusCode::kInvalidUsage,
               "Duplicate GPU detected : rank {} and rank {} both on CUDA device {:x} (TOPOCOLL_ALLOW_SHARED_GPU=1 "
               "allows it for tests)",
               i, j, peers_[i].busId);
        shared = true;
      }
  if (shared && *gpuMode && !opts.cfg.simulateGpus) {
    TC_INFO(log::kInit, "ranks share a CUDA device (TOPOCOLL_ALLOW_SHARED_GPU): planned as host-memory ranks");
    *gpuMode = false;
    for (auto& p : peers_) p.planGpu = 0;
  }
  // GPUs found by discovery, but no rank uses one (cuda::deviceInUse: a host-memory job on a GPU machine, PyTorch
  // CPU tensors, host perf runs): host-memory ranks, whatever the number of ranks and GPUs.
  if (*gpuMode && !opts.cfg.simulateGpus &&
      std::none_of(peers_.begin(), peers_.end(), [](const PeerInfo& p) { return p.cudaDev >= 0; })) {
    TC_INFO(log::kInit, "no rank uses a CUDA device: planned as host-memory ranks");
    *gpuMode = false;
    for (auto& p : peers_) p.planGpu = 0;
  }
  for (int r = 0; r < nRanks_; ++r) {
    if ((peers_[r].planGpu != 0) != *gpuMode)
      fail(StatusCode::kInvalidUsage,
           "rank {} {} a GPU but rank {} {}: every rank must use a GPU (or TOPOCOLL_SIMULATE_GPUS) or none", rank_,
           *gpuMode ? "has" : "has no", r, *gpuMode ? "has none" : "has one");
  }
  timings_.allgathers += msSince(t);
}

// The process's current CUDA device (NCCL's cudaDev, busId in NCCL's int64 form, cudaCompCap), when it uses one
// (cuda::deviceInUse: its primary context is active, as after cudaSetDevice in CUDA 12+).
void CommImpl::currentCudaDevice(PeerInfo* me) {
#ifdef TOPOCOLL_HAVE_CUDA
  const int dev = cuda::deviceInUse();  // -1: this process never used CUDA (a host-memory rank on a GPU machine)
  if (dev < 0) return;
  char bus[32] = {};
  TC_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
  int major = 0, minor = 0;
  TC_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TC_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  for (char* c = bus; *c; ++c) *c = static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
  me->cudaDev = dev;
  me->busId = topology::busIdToInt64(bus);
  me->cudaCompCap = major * 10 + minor;
  TC_INFO(log::kInit, "rank {} on CUDA device {} (busId {}, sm {})", rank_, dev, bus, me->cudaCompCap);
#else
  (void)me;
#endif
}

// Nodes are hosts in order of first appearance; local and intra-process ranks.
void CommImpl::findNodes() {
  const PeerInfo& me = peers_[rank_];
  hosts_.clear();
  for (auto& p : peers_)
    if (std::find(hosts_.begin(), hosts_.end(), p.hostHash) == hosts_.end()) hosts_.push_back(p.hostHash);
  node_ = static_cast<int>(std::find(hosts_.begin(), hosts_.end(), me.hostHash) - hosts_.begin());
  localRankOf_.assign(nRanks_, 0);
  std::vector<int> localCount(hosts_.size(), 0);
  for (int r = 0; r < nRanks_; ++r) {
    int h = static_cast<int>(std::find(hosts_.begin(), hosts_.end(), peers_[r].hostHash) - hosts_.begin());
    localRankOf_[r] = localCount[h]++;
  }
  localRank_ = localRankOf_[rank_];
  localRanks_ = localCount[node_];
  intraProcRanks_ = 0;
  for (auto& p : peers_) intraProcRanks_ += p.hostHash == me.hostHash && p.pidHash == me.pidHash;
}

// With TOPOCOLL_SIMULATE_GPUS every rank takes the topology GPU whose dev is its local rank, which every rank can
// work out for every other rank.
void CommImpl::assignDevices(const InitOptions& opts, topology::XmlDoc& doc) {
  auto devs = topology::gpuDevs(doc);
  for (int r = 0; r < nRanks_; ++r) {
    PeerInfo& p = peers_[r];
    if (p.dev >= 0) {
      if (std::find(devs.begin(), devs.end(), p.dev) == devs.end())
        fail(StatusCode::kInvalidUsage, "rank {} asks for GPU dev {}, which {} does not have", r, p.dev, opts.cfg.topoFile);
    } else {
      if (localRankOf_[r] >= static_cast<int>(devs.size()))
        fail(StatusCode::kInvalidUsage, "rank {} is local rank {} of its host but {} has only {} GPUs", r,
             localRankOf_[r], opts.cfg.topoFile, devs.size());
      p.dev = devs[localRankOf_[r]];
    }
    topology::XmlNode* gpu = nullptr;
    if (p.cudaDev >= 0) {  // a real device: the topology GPU on its bus
      doc.root->visit([&](topology::XmlNode& n) {
        if (!gpu && n.name == "gpu" && n.parent && n.parent->attr("busid") && n.attr("dev") &&
            topology::busIdToInt64(*n.parent->attr("busid")) == p.busId)
          gpu = &n;
      });
      if (gpu) p.dev = std::atoi(gpu->attr("dev")->c_str());
    }
    if (!gpu)
      doc.root->visit([&](topology::XmlNode& n) {
        if (!gpu && n.name == "gpu" && n.attr("dev") && std::atoi(n.attr("dev")->c_str()) == p.dev) gpu = &n;
      });
    if (p.cudaDev < 0) {
      p.busId = gpu && gpu->parent && gpu->parent->attr("busid") ? topology::busIdToInt64(*gpu->parent->attr("busid"))
                                                                 : p.dev;
      p.cudaCompCap = gpu && gpu->attr("sm") ? std::atoi(gpu->attr("sm")->c_str()) : 0;
    }
    p.gdrSupport = gpu && gpu->attr("gdr") ? std::atoi(gpu->attr("gdr")->c_str()) : 1;
  }
  for (int i = 0; i < nRanks_; ++i)
    for (int j = i + 1; j < nRanks_; ++j)
      if (peers_[i].busId >= 0 && peers_[i].hostHash == peers_[j].hostHash && peers_[i].busId == peers_[j].busId)
        fail(StatusCode::kInvalidUsage, "Duplicate GPU detected : rank {} and rank {} both on CUDA device {:x}", i, j,
             peers_[i].busId);
}

// The plan's node stage for this rank: system, paths and searches for GPU ranks, the host-memory layout otherwise.
search::NodeGraphs CommImpl::planNode(const InitOptions& opts, const topology::XmlDoc& doc) {
  auto t = Clock::now();
  const PeerInfo& me = peers_[rank_];
  plan_.cfg = opts.cfg;
  plan_.job.nNodes = static_cast<int>(hosts_.size());
  plan_.job.gpusPerNode = localRanks_;
  plan_.nRanks = nRanks_;
  plan_.localRanks = localRanks_;
  search::NodeGraphs node;
  if (hostMemory()) {
    plan_.hostMemory = true;
    std::vector<HostRank> local;
    for (auto& p : peers_)
      if (p.hostHash == me.hostHash) local.push_back({p.rank, p.numaNode});
    node = hostMemoryNode(std::move(local));
    timings_.topology += msSince(t);
  } else {
    std::vector<topology::LocalGpu> locals;
    std::vector<int> shm(nRanks_, 0);
    std::map<uint64_t, int> shmIds;
    for (int r = 0; r < nRanks_; ++r) {
      if (peers_[r].hostHash == me.hostHash) {
        locals.push_back({r, peers_[r].dev});
        plan_.localDevs.push_back(peers_[r].dev);
      }
      shm[r] = shmIds.emplace(peers_[r].shmDev, static_cast<int>(shmIds.size())).first->second;
    }
    plan_.nodeXml = topology::prepareNodeXml(doc, locals, opts.cfg);
    const topology::System host = topology::buildSystem(plan_.nodeXml);
    if (hosts_.size() > 1 && host.count(NodeType::NET) == 0)
      fail(StatusCode::kInvalidArgument, "{}: a job on {} hosts needs a network device (<net>) in the topology",
           opts.cfg.topoFile, hosts_.size());
    timings_.topology += msSince(t);
    t = Clock::now();
    NodePlan n = topocoll::planNode(host, rank_, nRanks_, opts.cfg, opts.cfg.topoFile, shm);
    plan_.system = std::move(n.system);
    node = std::move(n.graphs);
    logGraphs(plan_.system, node);
    timings_.search = msSince(t);
  }
  plan_.graphs = node.graphs;
  plan_.graphAvailable = node.available;
  plan_.searchMs = node.searchMs;
  return node;
}

// AllGather 3: every rank's graph info and preset; then the plan's join stage (the job-wide rings, trees, channels
// and tuning model) and the host-memory collectives' model.
void CommImpl::joinNodes(const InitOptions& opts, const search::NodeGraphs& node) {
  auto t = Clock::now();
  std::vector<search::RankTopo> all(nRanks_);
  all[rank_] = search::presetRank(rank_, node);
  bs_->setPhase("graph-info allgather");
  bs_->allGather(all.data(), sizeof(search::RankTopo));
  bs_->setPhase("connect");
  timings_.allgathers += msSince(t);
  t = Clock::now();
  topocoll::joinNodes(plan_, search::RecordList(all));
  // The collectives' choice (host memory): the calibrated constants, the job's slowest link, what the knobs leave.
  const Config& cfg = opts.cfg;
  static_assert(collectives::kDirectMaxRanks == tuning::kHostDirectMaxRanks);
  bool p2pOff = cfg.p2pDisable != 0 || (cfg.p2pLevel && *cfg.p2pLevel == 0);
  const auto link = hosts_.size() > 1 ? tuning::HostLink::kNet : p2pOff ? tuning::HostLink::kShm : tuning::HostLink::kP2p;
  hostPolicy_ = tuning::HostPolicy::make(cfg, link, nRanks_, hosts_.size() == 1,
                                         static_cast<int>(plan_.connect.rings.size()));
  if (link == tuning::HostLink::kNet) {  // every rank agrees: the fewest NICs and the slowest of any rank
    int rails = std::numeric_limits<int>::max(), mbps = std::numeric_limits<int>::max();
    for (const auto& p : peers_) rails = std::min(rails, p.netDevs), mbps = std::min(mbps, p.netMbps);
    hostPolicy_.rails = std::max(1, rails);
    hostPolicy_.netGBps = mbps > 0 ? mbps / 8e3 : 0;
    hostPolicy_.hosts = static_cast<int>(hosts_.size());
  }
  timings_.connect = msSince(t);
  plan_.wallMs = timings_.topology + timings_.search + timings_.connect;
}

void CommImpl::dumpPlan(const InitOptions& opts) const {
  const std::string& path = opts.cfg.planFile;
  if (path.empty() || rank_ != 0) return;
  std::string json = planToJson(plan_, topoName(opts.cfg.topoFile), 4, false, false) + "\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f || std::fwrite(json.data(), 1, json.size(), f) != json.size() || std::fclose(f) != 0) {
    if (f) std::fclose(f);
    fail(StatusCode::kSystemError, "TOPOCOLL_PLAN_FILE={}: cannot write the plan: {}", path, std::strerror(errno));
  }
  TC_INFO(log::kInit, "plan written to {} (TOPOCOLL_PLAN_FILE)", path);
}

void CommImpl::logInit() const {
  if (!log::enabled(log::Level::kInfo, log::kInit | log::kGraph)) return;
  TC_INFO(log::kInit, "comm {} rank {} nRanks {} nNodes {} localRanks {} localRank {} MNNVL 0", fmt::ptr(this), rank_,
          nRanks_, plan_.connect.nNodes, localRanks_, localRank_);
  for (size_t ch = 0; ch < plan_.connect.rings.size(); ++ch) {
    std::string line;
    for (int r : plan_.connect.rings[ch]) line += fmt::format(" {}", r);
    TC_INFO(log::kInit, "Channel {:02d}/{:02d} :{}", ch, plan_.connect.rings.size(), line);
  }
  std::string trees;
  for (size_t ch = 0; ch < plan_.connect.trees[rank_].size(); ++ch) {
    const auto& tr = plan_.connect.trees[rank_][ch];
    trees += fmt::format(" [{}] {}/{}/{}->{}->{}", ch, tr.down[0], tr.down[1], tr.down[2], rank_, tr.up);
  }
  TC_INFO(log::kInit, "Trees{}", trees);
  TC_INFO(log::kInit,
          "Init timings - topocollCommInitRank: rank {} nranks {} total {:.2f} (bootstrap {:.2f}, allgathers {:.2f}, "
          "topo {:.2f}, graphs {:.2f}, connections {:.2f})",
          rank_, nRanks_, timings_.total / 1000, timings_.bootstrap / 1000, timings_.allgathers / 1000,
          timings_.topology / 1000, timings_.search / 1000, (timings_.connect + timings_.transports) / 1000);
}

}  // namespace topocoll::runtime
