/* Stands in for NVIDIA's libnccl.so.2 (which this machine does not have): every call fails. nccl_program_stub is
 * linked against it like a program built for NCCL; with LD_PRELOAD=libtopocoll_nccl.so it runs on topocoll. */
#include <nccl.h>

#define FAIL_ALL(name, ...) ncclResult_t name(__VA_ARGS__) { return ncclSystemError; }
FAIL_ALL(ncclGetVersion, int* v)
FAIL_ALL(ncclGetUniqueId, ncclUniqueId* id)
FAIL_ALL(ncclCommInitRank, ncclComm_t* c, int n, ncclUniqueId id, int r)
FAIL_ALL(ncclCommCount, const ncclComm_t c, int* n)
FAIL_ALL(ncclCommUserRank, const ncclComm_t c, int* r)
FAIL_ALL(ncclCommDestroy, ncclComm_t c)
FAIL_ALL(ncclMemAlloc, void** p, size_t n)
FAIL_ALL(ncclMemFree, void* p)
FAIL_ALL(ncclAllReduce, const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t st)
FAIL_ALL(ncclBroadcast, const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st)
FAIL_ALL(ncclAllGather, const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st)
FAIL_ALL(ncclReduceScatter, const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c,
         cudaStream_t st)
FAIL_ALL(ncclSend, const void* s, size_t n, ncclDataType_t t, int p, ncclComm_t c, cudaStream_t st)
FAIL_ALL(ncclRecv, void* r, size_t n, ncclDataType_t t, int p, ncclComm_t c, cudaStream_t st)
FAIL_ALL(ncclGroupStart, void)
FAIL_ALL(ncclGroupEnd, void)
const char* ncclGetErrorString(ncclResult_t r) { return "stub libnccl: not NCCL"; }
const char* ncclGetLastError(ncclComm_t c) { return "stub libnccl"; }
