// What NCCL's API (nccl_api.cc) needs of the C API's internals beyond topocoll.h.
#pragma once

#include <string>

#include "topocoll/status.h"
#include "topocoll/topocoll.h"

namespace topocoll::runtime::capi {

/// What NCCL's ncclConfig_t sets of a communicator here.
struct CommConfig {
  /// false: calls outside groups are issued and return tcclInProgress while they run; tcclCommGetAsyncError says
  /// tcclInProgress until every one completed (init included: it runs on a thread of its own).
  bool blocking = true;
  std::string name;  // commName, in the log lines
  int minCtas = -1, maxCtas = -1;  // minCTAs / maxCTAs: channel bounds (NCCL_MIN_CTAS / NCCL_MAX_CTAS win)
  int maxP2pPeers = -1;            // maxP2pPeers (NCCL_P2P_MAX_PEERS wins)
  std::string netName;             // netName (NCCL_NET wins): "Socket", else the init fails
  int trafficClass = -1;           // trafficClass: NET sockets' IP traffic class
  int splitShare = 0;              // splitShare: accepted; children own their resources (docs/nccl-api.md)
  double timeoutSec = -1;          // the communicator's TOPOCOLL_TIMEOUT unless the environment sets it (-1: unset)
};

/// tcclCommInitRank with `cfg`: non-blocking returns tcclInProgress at once with *comm set.
tcclResult_t initRank(tcclComm_t* comm, int nranks, const tcclUniqueId& id, int rank, const CommConfig& cfg,
                      const char* what = "ncclCommInitRankConfig");
/// ncclCommInitRankScalable: `nId` ids of roots, every rank given the same; the first id's root serves every rank.
tcclResult_t initRankScalable(tcclComm_t* comm, int nranks, int rank, int nId, const tcclUniqueId* ids,
                              const CommConfig& cfg);
/// The config of a communicator (children of split and shrink inherit their parent's); set replaces it.
tcclResult_t getConfig(tcclComm_t comm, CommConfig* cfg);
tcclResult_t setConfig(tcclComm_t comm, const CommConfig& cfg);
/// ncclCommRevoke: in-flight operations end (not as errors), and only destroy, abort, split and shrink work after.
tcclResult_t revoke(tcclComm_t comm, int flags);
/// ncclCommSuspend / ncclCommResume: between them every call but resume, destroy and abort is refused.
tcclResult_t suspend(tcclComm_t comm, int flags);
tcclResult_t resume(tcclComm_t comm);
tcclResult_t isSuspended(tcclComm_t comm, bool* suspended);
/// The hosts the communicator's ranks are on (NCCL's nNodes): 1 when every peer's memory can be mapped.
tcclResult_t hostCount(tcclComm_t comm, int* hosts);
/// ncclCommGetUniqueId (an id for a grow, one outstanding at a time) and ncclCommGrow.
tcclResult_t growId(tcclComm_t comm, tcclUniqueId* id);
tcclResult_t grow(tcclComm_t comm, int nranks, const tcclUniqueId* id, int rank, tcclComm_t* newcomm);
/// ncclGroupSimulateEnd: runtime::groupSimulateEnd's estimate (microseconds) into *us.
tcclResult_t groupSimulateEnd(double* us);

/// Fails a call as the C API fails one: `why` becomes the thread's (and `comm`'s, when it is a handle) last error,
/// logged as a WARN line, and the result is `code`'s. `what` names the call ("ncclCommSplit").
tcclResult_t refuse(tcclComm_t comm, const char* what, StatusCode code, const std::string& why);
/// Whether `comm` moves host memory only (no device buffers of its own): fails as any call on a bad handle.
tcclResult_t hostMemory(tcclComm_t comm, bool* host);

}  // namespace topocoll::runtime::capi
