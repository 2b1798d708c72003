// libtopocoll_nccl.so: NCCL's C API (nccl.h, NCCL 2.30.7's signatures) on topocoll's, so that programs written for
// NCCL run on topocoll by linking or LD_PRELOAD. NCCL's and topocoll's enums have the same values and the
// communicator handles are the same objects, so every function forwards its arguments unchanged. Each symbol is also
// exported with NCCL's profiling prefix (pncclX), as libnccl.so does.
#include "topocoll/nccl_compat/nccl.h"
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
