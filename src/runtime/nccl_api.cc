// libtopocoll_nccl.so: NCCL's C API (nccl.h, NCCL 2.30.7's signatures) on topocoll's, so that programs written for
// NCCL run on topocoll by linking or LD_PRELOAD. NCCL's and topocoll's enums have the same values and the
// communicator handles are the same objects, so every function forwards its arguments unchanged. Each symbol is also
// exported with NCCL's profiling prefix (pncclX), as libnccl.so does.
#include "topocoll/nccl_compat/nccl.h"

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "c_api_internal.h"
#include "topocoll/config.h"
#include "topocoll/env.h"
#include "topocoll/log.h"
#include "topocoll/topocoll.h"

static_assert(sizeof(ncclUniqueId) == sizeof(tcclUniqueId));
static_assert(static_cast<int>(ncclFloat8e5m2) == static_cast<int>(tcclFloat8e5m2));
static_assert(static_cast<int>(ncclAvg) == static_cast<int>(tcclAvg));
static_assert(static_cast<int>(ncclTimeout) == static_cast<int>(tcclTimeout));

namespace {
tcclComm_t c(ncclComm_t comm) { return reinterpret_cast<tcclComm_t>(comm); }
ncclResult_t r(tcclResult_t rc) { return static_cast<ncclResult_t>(rc); }
tcclDataType_t t(ncclDataType_t d) { return static_cast<tcclDataType_t>(d); }
tcclRedOp_t o(ncclRedOp_t op) { return static_cast<tcclRedOp_t>(op); }
tcclStream_t s(cudaStream_t st) { return reinterpret_cast<tcclStream_t>(st); }
}  // namespace

namespace {
using topocoll::StatusCode;

ncclResult_t refused(ncclComm_t comm, const char* what, StatusCode code, const std::string& why) {
  return r(topocoll::runtime::capi::refuse(c(comm), what, code, why));
}
// What this build cannot do yet fails, naming why: never a silent success, never another library's code.
ncclResult_t notHere(ncclComm_t comm, const char* what, const char* why) {
  return refused(comm, what, StatusCode::kInvalidUsage, fmt::format("not supported by topocoll yet: {}", why));
}

// A config as ncclCommInitRankConfig reads it: NCCL_CONFIG_INITIALIZER's magic, a size this library knows (an older
// NCCL's smaller struct: the fields past its size are unset), and each field's range. "" when valid, else the field
// at fault and why.
std::string checkConfig(const ncclConfig_t* cfg) {
  if (!cfg) return "";
  if (cfg->magic != NCCL_API_MAGIC)
    return fmt::format("config->magic is {:#x}, not NCCL_API_MAGIC: initialise the config with NCCL_CONFIG_INITIALIZER",
                       cfg->magic);
  constexpr size_t kOldest = offsetof(ncclConfig_t, blocking) + sizeof(int);
  if (cfg->size < kOldest || cfg->size > sizeof(ncclConfig_t))
    return fmt::format("config->size is {}: an ncclConfig_t of NCCL 2.14 to 2.30 has {} to {} bytes", cfg->size,
                       kOldest, sizeof(ncclConfig_t));
  if (cfg->version < static_cast<unsigned>(NCCL_VERSION(2, 14, 0)))
    return fmt::format("config->version is {}: not an NCCL version (NCCL_VERSION_CODE, 21400 or later)", cfg->version);
  auto has = [&](size_t offset) { return offset + sizeof(int) <= cfg->size; };
  struct Field {
    const char* name;
    size_t offset;
    int lo, hi;  // the range of a set value
  };
  constexpr int kMax = std::numeric_limits<int>::max();
  static constexpr Field kFields[] = {
      {"blocking", offsetof(ncclConfig_t, blocking), 0, 1},
      {"cgaClusterSize", offsetof(ncclConfig_t, cgaClusterSize), 0, 8},
      {"minCTAs", offsetof(ncclConfig_t, minCTAs), 1, 64},
      {"maxCTAs", offsetof(ncclConfig_t, maxCTAs), 1, 64},
      {"splitShare", offsetof(ncclConfig_t, splitShare), 0, 1},
      {"trafficClass", offsetof(ncclConfig_t, trafficClass), 0, kMax},
      {"collnetEnable", offsetof(ncclConfig_t, collnetEnable), 0, 1},
      {"CTAPolicy", offsetof(ncclConfig_t, CTAPolicy), 0, NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO},
      {"shrinkShare", offsetof(ncclConfig_t, shrinkShare), 0, 1},
      {"nvlsCTAs", offsetof(ncclConfig_t, nvlsCTAs), 1, 64},
      {"nChannelsPerNetPeer", offsetof(ncclConfig_t, nChannelsPerNetPeer), 1, 64},
      {"nvlinkCentricSched", offsetof(ncclConfig_t, nvlinkCentricSched), 0, 1},
      {"graphUsageMode", offsetof(ncclConfig_t, graphUsageMode), 0, 2},
      {"numRmaCtx", offsetof(ncclConfig_t, numRmaCtx), 1, kMax},
      {"maxP2pPeers", offsetof(ncclConfig_t, maxP2pPeers), 1, kMax},
      {"graphStreamOrdering", offsetof(ncclConfig_t, graphStreamOrdering), 0, 1},
  };
  for (const Field& f : kFields) {
    if (!has(f.offset)) continue;
    int v;
    std::memcpy(&v, reinterpret_cast<const char*>(cfg) + f.offset, sizeof v);
    if (v != NCCL_CONFIG_UNDEF_INT && (v < f.lo || v > f.hi))
      return fmt::format("config->{} is {}: expected {} to {} (or NCCL_CONFIG_UNDEF_INT for the default)", f.name, v,
                         f.lo, f.hi);
  }
  if (has(offsetof(ncclConfig_t, maxCTAs)) && cfg->minCTAs != NCCL_CONFIG_UNDEF_INT &&
      cfg->maxCTAs != NCCL_CONFIG_UNDEF_INT && cfg->minCTAs > cfg->maxCTAs)
    return fmt::format("config->minCTAs {} is above config->maxCTAs {}", cfg->minCTAs, cfg->maxCTAs);
  return "";
}

// What a (valid) config sets here: blocking (NCCL_CONFIG_UNDEF_INT: blocking), commName. `base`: what unset fields
// keep (a parent's config at split and shrink, else the defaults).
topocoll::runtime::capi::CommConfig commConfig(const ncclConfig_t* cfg, topocoll::runtime::capi::CommConfig base = {}) {
  if (!cfg) return base;
  if (cfg->blocking != NCCL_CONFIG_UNDEF_INT) base.blocking = cfg->blocking != 0;
  if (cfg->size >= offsetof(ncclConfig_t, commName) + sizeof(cfg->commName) && cfg->commName)
    base.name = cfg->commName;
  if (cfg->size >= offsetof(ncclConfig_t, maxCTAs) + sizeof(int)) {
    if (cfg->minCTAs != NCCL_CONFIG_UNDEF_INT) base.minCtas = cfg->minCTAs;
    if (cfg->maxCTAs != NCCL_CONFIG_UNDEF_INT) base.maxCtas = cfg->maxCTAs;
  }
  auto has = [&](size_t offset, size_t bytes) { return cfg->size >= offset + bytes; };
  if (has(offsetof(ncclConfig_t, netName), sizeof(cfg->netName)) && cfg->netName != NCCL_CONFIG_UNDEF_PTR &&
      cfg->netName)
    base.netName = cfg->netName;
  if (has(offsetof(ncclConfig_t, splitShare), sizeof(int)) && cfg->splitShare != NCCL_CONFIG_UNDEF_INT)
    base.splitShare = cfg->splitShare;
  if (has(offsetof(ncclConfig_t, trafficClass), sizeof(int)) && cfg->trafficClass != NCCL_CONFIG_UNDEF_INT)
    base.trafficClass = cfg->trafficClass;
  if (has(offsetof(ncclConfig_t, maxP2pPeers), sizeof(int)) && cfg->maxP2pPeers != NCCL_CONFIG_UNDEF_INT)
    base.maxP2pPeers = cfg->maxP2pPeers;
  return base;
}

// The Param API's handle is the knob's registry entry.
const topocoll::Knob* knobOf(ncclParamHandle_t h) { return reinterpret_cast<const topocoll::Knob*>(h); }
// The knobs' values now: the environment's, then NCCL's config files' (Env::fromProcess), else defaults.
ncclResult_t currentConfig(topocoll::Config* cfg) {
  try {
    *cfg = topocoll::Config::fromEnv(topocoll::Env::fromProcess());
    return ncclSuccess;
  } catch (const topocoll::Error& e) {
    return refused(nullptr, "ncclParam", e.code(), e.what());
  }
}
ncclResult_t knobText(const topocoll::Knob& k, std::string* out) {
  topocoll::Config cfg;
  if (ncclResult_t rc = currentConfig(&cfg); rc != ncclSuccess) return rc;
  *out = k.get(cfg);
  return ncclSuccess;
}
template <typename T>
ncclResult_t knobInt(ncclParamHandle_t h, T* out, const char* what) {
  if (!h || !out) return refused(nullptr, what, StatusCode::kInvalidArgument, "handle or out is NULL");
  const topocoll::Knob& k = *knobOf(h);
  if (k.type != "int" && k.type != "bool")
    return refused(nullptr, what, StatusCode::kInvalidArgument,
                   fmt::format("{} is a {} knob, not an integer: read it with ncclParamGetStr", k.name, k.type));
  std::string text;
  if (ncclResult_t rc = knobText(k, &text); rc != ncclSuccess) return rc;
  long long v = 0;
  char* end = nullptr;
  errno = 0;
  v = std::strtoll(text.c_str(), &end, 0);
  if (errno || !end || *end || v < static_cast<long long>(std::numeric_limits<T>::min()) ||
      (v > 0 && static_cast<unsigned long long>(v) > static_cast<unsigned long long>(std::numeric_limits<T>::max())))
    return refused(nullptr, what, StatusCode::kInvalidArgument,
                   fmt::format("{}={} does not fit the type this getter reads", k.name, text));
  *out = static_cast<T>(v);
  return ncclSuccess;
}
}  // namespace

#define TC_EXPORT extern "C" __attribute__((visibility("default")))
#define TC_ALIAS(name) TC_EXPORT __typeof__(name) p##name __attribute__((alias(#name)));

TC_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;  // the NCCL API level implemented
  return ncclSuccess;
}
TC_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { return r(tcclGetUniqueId(reinterpret_cast<tcclUniqueId*>(id))); }
TC_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  tcclUniqueId id;
  __builtin_memcpy(&id, &commId, sizeof(id));
  return r(tcclCommInitRank(reinterpret_cast<tcclComm_t*>(comm), nranks, id, rank));
}
TC_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  return r(tcclCommInitAll(reinterpret_cast<tcclComm_t*>(comm), ndev, devlist));
}
TC_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) { return r(tcclCommFinalize(c(comm))); }
TC_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) { return r(tcclCommDestroy(c(comm))); }
TC_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) { return r(tcclCommAbort(c(comm))); }
TC_EXPORT const char* ncclGetErrorString(ncclResult_t rc) { return tcclGetErrorString(static_cast<tcclResult_t>(rc)); }
TC_EXPORT const char* ncclGetLastError(ncclComm_t comm) { return tcclGetLastError(c(comm)); }
TC_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  return r(tcclCommGetAsyncError(c(comm), reinterpret_cast<tcclResult_t*>(err)));
}
TC_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) { return r(tcclCommCount(c(comm), count)); }
TC_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) { return r(tcclCommCuDevice(c(comm), device)); }
TC_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) { return r(tcclMemAlloc(ptr, size)); }
TC_EXPORT ncclResult_t ncclMemFree(void* ptr) { return r(tcclMemFree(ptr)); }
TC_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) { return r(tcclCommUserRank(c(comm), rank)); }
TC_EXPORT ncclResult_t ncclReduce(const void* sb, void* rb, size_t n, ncclDataType_t d, ncclRedOp_t op, int root,
                                  ncclComm_t comm, cudaStream_t st) {
  return r(tcclReduce(sb, rb, n, t(d), o(op), root, c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclBcast(void* b, size_t n, ncclDataType_t d, int root, ncclComm_t comm, cudaStream_t st) {
  return r(tcclBroadcast(b, b, n, t(d), root, c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclBroadcast(const void* sb, void* rb, size_t n, ncclDataType_t d, int root, ncclComm_t comm,
                                     cudaStream_t st) {
  return r(tcclBroadcast(sb, rb, n, t(d), root, c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclAllReduce(const void* sb, void* rb, size_t n, ncclDataType_t d, ncclRedOp_t op,
                                     ncclComm_t comm, cudaStream_t st) {
  return r(tcclAllReduce(sb, rb, n, t(d), o(op), c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclReduceScatter(const void* sb, void* rb, size_t n, ncclDataType_t d, ncclRedOp_t op,
                                         ncclComm_t comm, cudaStream_t st) {
  return r(tcclReduceScatter(sb, rb, n, t(d), o(op), c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclAllGather(const void* sb, void* rb, size_t n, ncclDataType_t d, ncclComm_t comm,
                                     cudaStream_t st) {
  return r(tcclAllGather(sb, rb, n, t(d), c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclAlltoAll(const void* sb, void* rb, size_t n, ncclDataType_t d, ncclComm_t comm,
                                    cudaStream_t st) {
  return r(tcclAlltoAll(sb, rb, n, t(d), c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclGather(const void* sb, void* rb, size_t n, ncclDataType_t d, int root, ncclComm_t comm,
                                  cudaStream_t st) {
  return r(tcclGather(sb, rb, n, t(d), root, c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclScatter(const void* sb, void* rb, size_t n, ncclDataType_t d, int root, ncclComm_t comm,
                                   cudaStream_t st) {
  return r(tcclScatter(sb, rb, n, t(d), root, c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclSend(const void* sb, size_t n, ncclDataType_t d, int peer, ncclComm_t comm, cudaStream_t st) {
  return r(tcclSend(sb, n, t(d), peer, c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclRecv(void* rb, size_t n, ncclDataType_t d, int peer, ncclComm_t comm, cudaStream_t st) {
  return r(tcclRecv(rb, n, t(d), peer, c(comm), s(st)));
}
TC_EXPORT ncclResult_t ncclGroupStart(void) { return r(tcclGroupStart()); }
TC_EXPORT ncclResult_t ncclGroupEnd(void) { return r(tcclGroupEnd()); }

// A blocking or non-blocking communicator with a validated config. Non-blocking (config->blocking = 0): init runs on
// a thread of its own and the call returns ncclInProgress; later collectives and sends outside groups are issued and
// return ncclInProgress while they run; ncclCommGetAsyncError says ncclInProgress until all of them completed, then
// ncclSuccess or the failure. commName is named in the log.
TC_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                              ncclConfig_t* config) {
  if (std::string why = checkConfig(config); !why.empty())
    return refused(nullptr, "ncclCommInitRankConfig", StatusCode::kInvalidArgument, why);
  const auto cfg = commConfig(config);
  tcclUniqueId id;
  __builtin_memcpy(&id, &commId, sizeof(id));
  const ncclResult_t rc =
      r(topocoll::runtime::capi::initRank(reinterpret_cast<tcclComm_t*>(comm), nranks, id, rank, cfg));
  if ((rc == ncclSuccess || rc == ncclInProgress) && !cfg.name.empty())
    TC_INFO(topocoll::log::kInit, "ncclCommInitRankConfig comm {} commName {} rank {} nranks {}{}", (void*)*comm,
            cfg.name, rank, nranks, cfg.blocking ? "" : " (non-blocking)");
  return rc;
}
// Every rank gives the same ids; the first id's root serves them all (docs/nccl-api.md says why).
TC_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                ncclUniqueId* commIds, ncclConfig_t* config) {
  if (std::string why = checkConfig(config); !why.empty())
    return refused(nullptr, "ncclCommInitRankScalable", StatusCode::kInvalidArgument, why);
  static_assert(sizeof(ncclUniqueId) == sizeof(tcclUniqueId));
  return r(topocoll::runtime::capi::initRankScalable(reinterpret_cast<tcclComm_t*>(newcomm), nranks, myrank, nId,
                                                     reinterpret_cast<const tcclUniqueId*>(commIds),
                                                     commConfig(config)));
}
TC_EXPORT ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* id) {
  return r(topocoll::runtime::capi::growId(c(comm), reinterpret_cast<tcclUniqueId*>(id)));
}
// The new communicator inherits the parent's config, or takes `config`'s fields over the parent's. It is complete
// when the call returns (ncclSuccess also for non-blocking parents: NCCL's contract allows it).
namespace {
ncclResult_t adopt(ncclComm_t parent, ncclComm_t* newcomm, const ncclConfig_t* config) {
  if (!config || !*newcomm) return ncclSuccess;
  topocoll::runtime::capi::CommConfig base;
  if (ncclResult_t rc = r(topocoll::runtime::capi::getConfig(c(parent), &base)); rc != ncclSuccess) return rc;
  return r(topocoll::runtime::capi::setConfig(c(*newcomm), commConfig(config, base)));
}
}  // namespace
TC_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (newcomm) *newcomm = nullptr;
  if (std::string why = checkConfig(config); !why.empty())
    return refused(comm, "ncclCommSplit", StatusCode::kInvalidArgument, why);
  ncclResult_t rc = r(tcclCommSplit(c(comm), color, key, reinterpret_cast<tcclComm_t*>(newcomm)));
  return rc == ncclSuccess ? adopt(comm, newcomm, config) : rc;
}
TC_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  if (newcomm) *newcomm = nullptr;
  if (std::string why = checkConfig(config); !why.empty())
    return refused(comm, "ncclCommShrink", StatusCode::kInvalidArgument, why);
  ncclResult_t rc = r(tcclCommShrink(c(comm), excludeRanksList, excludeRanksCount,
                                     reinterpret_cast<tcclComm_t*>(newcomm), shrinkFlags));
  return rc == ncclSuccess ? adopt(comm, newcomm, config) : rc;
}
TC_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                                    ncclComm_t* newcomm, ncclConfig_t* config) {
  if (newcomm) *newcomm = nullptr;
  if (std::string why = checkConfig(config); !why.empty())
    return refused(comm, "ncclCommGrow", StatusCode::kInvalidArgument, why);
  ncclResult_t rc = r(topocoll::runtime::capi::grow(c(comm), nRanks, reinterpret_cast<const tcclUniqueId*>(uniqueId),
                                                    rank, reinterpret_cast<tcclComm_t*>(newcomm)));
  if (rc != ncclSuccess || !config || !*newcomm) return rc;
  if (!comm) return r(topocoll::runtime::capi::setConfig(c(*newcomm), commConfig(config)));
  return adopt(comm, newcomm, config);
}
TC_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return r(topocoll::runtime::capi::revoke(c(comm), revokeFlags));
}
TC_EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  return r(topocoll::runtime::capi::suspend(c(comm), flags));
}
TC_EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) { return r(topocoll::runtime::capi::resume(c(comm))); }
// The GPU memory the communicator holds: none on host memory.
TC_EXPORT ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  if (!value) return refused(comm, "ncclCommMemStats", StatusCode::kInvalidArgument, "value is NULL");
  if (stat < ncclStatGpuMemSuspend || stat > ncclStatGpuMemTotal)
    return refused(comm, "ncclCommMemStats", StatusCode::kInvalidArgument,
                   fmt::format("stat {} is not an ncclCommMemStat_t", static_cast<int>(stat)));
  bool host = false;
  if (ncclResult_t rc = r(topocoll::runtime::capi::hostMemory(c(comm), &host)); rc != ncclSuccess) return rc;
  if (!host) return notHere(comm, "ncclCommMemStats", "the device memory of a communicator on GPUs");
  bool suspended = false;
  if (ncclResult_t rc = r(topocoll::runtime::capi::isSuspended(c(comm), &suspended)); rc != ncclSuccess) return rc;
  *value = stat == ncclStatGpuMemSuspended ? (suspended ? 1 : 0) : 0;
  return ncclSuccess;
}
TC_EXPORT void ncclResetDebugInit(void) {
  topocoll::log::configure(topocoll::log::settingsFromEnv(topocoll::Env::fromProcess()));
}
TC_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return r(tcclCommRegister(c(comm), buff, size, handle));
}
TC_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return r(tcclCommDeregister(c(comm), handle));
}
static_assert(NCCL_WIN_COLL_SYMMETRIC == TCCL_WIN_COLL_SYMMETRIC && NCCL_WIN_STRICT_ORDERING == TCCL_WIN_STRICT_ORDERING);
TC_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                              int winFlags) {
  return r(tcclCommWindowRegister(c(comm), buff, size, reinterpret_cast<tcclWindow_t*>(win), winFlags));
}
TC_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return r(tcclCommWindowDeregister(c(comm), reinterpret_cast<tcclWindow_t>(win)));
}
TC_EXPORT ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  return r(tcclWinGetUserPtr(c(comm), reinterpret_cast<tcclWindow_t>(win), outUserPtr));
}
TC_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm) {
  static_assert(static_cast<int>(ncclScalarHostImmediate) == static_cast<int>(tcclScalarHostImmediate));
  return r(tcclRedOpCreatePreMulSum(reinterpret_cast<tcclRedOp_t*>(op), scalar, t(datatype),
                                    static_cast<tcclScalarResidence_t>(residence), c(comm)));
}
TC_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) { return r(tcclRedOpDestroy(o(op), c(comm))); }
TC_EXPORT ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                                     ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                                     unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  return r(tcclPutSignal(localbuff, count, t(datatype), peer, reinterpret_cast<tcclWindow_t>(peerWin), peerWinOffset,
                         sigIdx, ctx, flags, c(comm), stream));
}
TC_EXPORT ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                                  cudaStream_t stream) {
  return r(tcclSignal(peer, sigIdx, ctx, flags, c(comm), stream));
}
static_assert(sizeof(ncclWaitSignalDesc_t) == sizeof(tcclWaitSignalDesc_t) &&
              offsetof(ncclWaitSignalDesc_t, ctx) == offsetof(tcclWaitSignalDesc_t, ctx));
TC_EXPORT ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                                      cudaStream_t stream) {
  return r(tcclWaitSignal(nDesc, reinterpret_cast<tcclWaitSignalDesc_t*>(signalDescs), c(comm), stream));
}
// The group closes and nothing runs; estimatedTime is the cost model's microseconds (docs/nccl-api.md compares it
// with measured times). The struct is read up to the size it says it has, as NCCL does.
TC_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  size_t size = sizeof(info);
  if (simInfo) {
    __builtin_memcpy(&size, &simInfo->size, sizeof(size));
    size = size > sizeof(info) ? sizeof(info) : size;
    __builtin_memcpy(&info, simInfo, size);
    if (size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float) || info.magic != 0x74685283u) {
      ncclGroupEnd();  // the group still closes (nothing of it runs: NCCL fails the whole group here too)
      return refused(nullptr, "ncclGroupSimulateEnd", StatusCode::kInvalidArgument,
                     "simInfo was not initialised with NCCL_SIM_INFO_INITIALIZER (its magic or size is wrong)");
    }
  }
  double us = 0;
  ncclResult_t rc = r(topocoll::runtime::capi::groupSimulateEnd(&us));
  if (rc != ncclSuccess) return rc;
  if (simInfo) {
    info.estimatedTime = static_cast<float>(us);
    __builtin_memcpy(simInfo, &info, size);
  }
  return ncclSuccess;
}

// The Param API over topocoll's knob registry (`topocoll params`): NCCL's knobs that topocoll reads, and its own.
TC_EXPORT ncclResult_t ncclParamBind(ncclParamHandle_t* out, const char* key) {
  if (!out || !key) return refused(nullptr, "ncclParamBind", StatusCode::kInvalidArgument, "out or key is NULL");
  const topocoll::Knob* k = topocoll::findKnob(key);
  if (!k)
    return refused(nullptr, "ncclParamBind", StatusCode::kInvalidArgument,
                   topocoll::isNcclKnobName(key)
                       ? fmt::format("{} is NCCL's knob, which topocoll does not read (`topocoll params` lists ours)", key)
                       : fmt::format("{} is not a knob (`topocoll params` lists them)", key));
  *out = reinterpret_cast<ncclParamHandle_t>(const_cast<topocoll::Knob*>(k));
  return ncclSuccess;
}
TC_EXPORT ncclResult_t ncclParamGetI8(ncclParamHandle_t h, int8_t* out) { return knobInt(h, out, "ncclParamGetI8"); }
TC_EXPORT ncclResult_t ncclParamGetI16(ncclParamHandle_t h, int16_t* out) { return knobInt(h, out, "ncclParamGetI16"); }
TC_EXPORT ncclResult_t ncclParamGetI32(ncclParamHandle_t h, int32_t* out) { return knobInt(h, out, "ncclParamGetI32"); }
TC_EXPORT ncclResult_t ncclParamGetI64(ncclParamHandle_t h, int64_t* out) { return knobInt(h, out, "ncclParamGetI64"); }
TC_EXPORT ncclResult_t ncclParamGetU8(ncclParamHandle_t h, uint8_t* out) { return knobInt(h, out, "ncclParamGetU8"); }
TC_EXPORT ncclResult_t ncclParamGetU16(ncclParamHandle_t h, uint16_t* out) { return knobInt(h, out, "ncclParamGetU16"); }
TC_EXPORT ncclResult_t ncclParamGetU32(ncclParamHandle_t h, uint32_t* out) { return knobInt(h, out, "ncclParamGetU32"); }
TC_EXPORT ncclResult_t ncclParamGetU64(ncclParamHandle_t h, uint64_t* out) { return knobInt(h, out, "ncclParamGetU64"); }
// Any knob as text (valid until this thread's next call).
TC_EXPORT ncclResult_t ncclParamGetStr(ncclParamHandle_t h, const char** out) {
  if (!h || !out) return refused(nullptr, "ncclParamGetStr", StatusCode::kInvalidArgument, "handle or out is NULL");
  static thread_local std::string text;
  if (ncclResult_t rc = knobText(*knobOf(h), &text); rc != ncclSuccess) return rc;
  *out = text.c_str();
  return ncclSuccess;
}
// The text with its terminating NUL, into the caller's buffer.
TC_EXPORT ncclResult_t ncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len) {
  if (!h || !out) return refused(nullptr, "ncclParamGet", StatusCode::kInvalidArgument, "handle or out is NULL");
  std::string text;
  if (ncclResult_t rc = knobText(*knobOf(h), &text); rc != ncclSuccess) return rc;
  const int need = static_cast<int>(text.size()) + 1;
  if (len) *len = need;
  if (maxLen < need)
    return refused(nullptr, "ncclParamGet", StatusCode::kInvalidArgument,
                   fmt::format("{} needs {} bytes, maxLen is {}", knobOf(h)->name, need, maxLen));
  std::memcpy(out, text.c_str(), static_cast<size_t>(need));
  return ncclSuccess;
}
TC_EXPORT ncclResult_t ncclParamGetParameter(const char* key, const char** value, int* valueLen) {
  if (!key || !value || !valueLen)
    return refused(nullptr, "ncclParamGetParameter", StatusCode::kInvalidArgument, "key, value or valueLen is NULL");
  *value = nullptr;
  *valueLen = 0;
  ncclParamHandle_t h;
  if (ncclResult_t rc = ncclParamBind(&h, key); rc != ncclSuccess) return rc;
  if (ncclResult_t rc = ncclParamGetStr(h, value); rc != ncclSuccess) return rc;
  *valueLen = static_cast<int>(std::strlen(*value));
  return ncclSuccess;
}
TC_EXPORT ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen) {
  if (!table || !tableLen)
    return refused(nullptr, "ncclParamGetAllParameterKeys", StatusCode::kInvalidArgument, "table or tableLen is NULL");
  static thread_local std::vector<const char*> keys;
  keys.clear();
  for (const topocoll::Knob& k : topocoll::knobs()) keys.push_back(k.name.c_str());  // the registry lives forever
  *table = keys.data();
  *tableLen = static_cast<int>(keys.size());
  return ncclSuccess;
}
TC_EXPORT void ncclParamDumpAll(void) {
  std::printf("=== topocoll knobs (ncclParamDumpAll) ===\n");
  topocoll::Config cfg;  // the environment parsed once for every knob
  if (currentConfig(&cfg) != ncclSuccess) return;
  for (const topocoll::Knob& k : topocoll::knobs())
    std::printf("%s=%s (default %s, %s)\n", k.name.c_str(), k.get(cfg).c_str(), k.defaultText().c_str(),
                k.type.c_str());
}

TC_ALIAS(ncclGetVersion)
TC_ALIAS(ncclGetUniqueId)
TC_ALIAS(ncclCommInitRank)
TC_ALIAS(ncclCommInitAll)
TC_ALIAS(ncclCommFinalize)
TC_ALIAS(ncclCommDestroy)
TC_ALIAS(ncclCommAbort)
TC_ALIAS(ncclGetErrorString)
TC_ALIAS(ncclGetLastError)
TC_ALIAS(ncclCommGetAsyncError)
TC_ALIAS(ncclCommCount)
TC_ALIAS(ncclCommCuDevice)
TC_ALIAS(ncclCommUserRank)
TC_ALIAS(ncclMemAlloc)
TC_ALIAS(ncclMemFree)
TC_ALIAS(ncclReduce)
TC_ALIAS(ncclBcast)
TC_ALIAS(ncclBroadcast)
TC_ALIAS(ncclAllReduce)
TC_ALIAS(ncclReduceScatter)
TC_ALIAS(ncclAllGather)
TC_ALIAS(ncclAlltoAll)
TC_ALIAS(ncclGather)
TC_ALIAS(ncclScatter)
TC_ALIAS(ncclSend)
TC_ALIAS(ncclRecv)
TC_ALIAS(ncclGroupStart)
TC_ALIAS(ncclGroupEnd)
TC_ALIAS(ncclCommInitRankConfig)
TC_ALIAS(ncclCommInitRankScalable)
TC_ALIAS(ncclCommGetUniqueId)
TC_ALIAS(ncclCommSplit)
TC_ALIAS(ncclCommShrink)
TC_ALIAS(ncclCommGrow)
TC_ALIAS(ncclCommRevoke)
TC_ALIAS(ncclCommSuspend)
TC_ALIAS(ncclCommResume)
TC_ALIAS(ncclCommMemStats)
TC_ALIAS(ncclResetDebugInit)
TC_ALIAS(ncclCommRegister)
TC_ALIAS(ncclCommDeregister)
TC_ALIAS(ncclCommWindowRegister)
TC_ALIAS(ncclCommWindowDeregister)
TC_ALIAS(ncclWinGetUserPtr)
TC_ALIAS(ncclRedOpCreatePreMulSum)
TC_ALIAS(ncclRedOpDestroy)
TC_ALIAS(ncclPutSignal)
TC_ALIAS(ncclSignal)
TC_ALIAS(ncclWaitSignal)
TC_ALIAS(ncclGroupSimulateEnd)
TC_ALIAS(ncclParamBind)
TC_ALIAS(ncclParamGetI8)
TC_ALIAS(ncclParamGetI16)
TC_ALIAS(ncclParamGetI32)
TC_ALIAS(ncclParamGetI64)
TC_ALIAS(ncclParamGetU8)
TC_ALIAS(ncclParamGetU16)
TC_ALIAS(ncclParamGetU32)
TC_ALIAS(ncclParamGetU64)
TC_ALIAS(ncclParamGetStr)
TC_ALIAS(ncclParamGet)
TC_ALIAS(ncclParamGetParameter)
TC_ALIAS(ncclParamGetAllParameterKeys)
TC_ALIAS(ncclParamDumpAll)
