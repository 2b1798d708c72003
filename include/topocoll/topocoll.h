/* topocoll's C API, with NCCL's shapes: the same argument order, enum values and result codes as nccl.h (NCCL
 * 2.30.7), under the prefix tccl, so that code written for NCCL reads the same. Host buffers take a NULL `stream`;
 * the collectives also take device buffers (cudaMalloc'ed, a CUDA build) with their cudaStream_t (docs/gpu.md: the
 * stream is synchronized first). Every call returns when its operation is complete (inside tcclGroupStart/End:
 * host buffers when tcclGroupEnd returns).
 *
 *   tcclUniqueId id;
 *   if (rank == 0) tcclGetUniqueId(&id);            // then send `id` to every rank (MPI_Bcast, a file, ...)
 *   tcclComm_t comm;
 *   tcclCommInitRank(&comm, nranks, id, rank);      // collective: every rank calls it
 *   tcclAllReduce(in, out, count, tcclFloat32, tcclSum, comm, NULL);
 *   tcclGroupStart();                               // several operations issued together (all-to-all, ...)
 *   tcclSend(a, n, tcclInt32, peer, comm, NULL);
 *   tcclRecv(b, n, tcclInt32, peer, comm, NULL);
 *   tcclGroupEnd();
 *   tcclCommDestroy(comm);
 *
 * Ordering: every rank calls the collectives of a communicator in the same order; they complete in that order.
 * Errors: a call returns a tcclResult_t; tcclGetLastError(comm) says what failed, naming the rank or peer at fault.
 * A C API call never lets a C++ exception escape. */
#ifndef TOPOCOLL_TOPOCOLL_H_
#define TOPOCOLL_TOPOCOLL_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TCCL_MAJOR 0
#define TCCL_MINOR 1
#define TCCL_PATCH 0
#define TCCL_VERSION_CODE (TCCL_MAJOR * 10000 + TCCL_MINOR * 100 + TCCL_PATCH)

/* In C++ the enums below have int as their fixed underlying type (the same size as in C), so that an out-of-range
 * value a caller passes is a value the library can check and refuse, not undefined behaviour. */
#ifdef __cplusplus
#define TCCL_ENUM_INT : int
#else
#define TCCL_ENUM_INT
#endif

/* What libtopocoll.so exports: the functions below (everything else in it is hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define TCCL_API __attribute__((visibility("default")))
#else
#define TCCL_API
#endif

#define TCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[TCCL_UNIQUE_ID_BYTES];
} tcclUniqueId;

typedef struct tcclComm* tcclComm_t;
/* A device stream (cudaStream_t) for device buffers (the collectives); NULL for host buffers. */
typedef void* tcclStream_t;

typedef enum TCCL_ENUM_INT {
  tcclSuccess = 0,
  tcclUnhandledCudaError = 1,
  tcclSystemError = 2,
  tcclInternalError = 3,
  tcclInvalidArgument = 4,
  tcclInvalidUsage = 5,
  tcclRemoteError = 6,
  tcclInProgress = 7,
  tcclTimeout = 8,
  tcclNumResults = 9
} tcclResult_t;

typedef enum TCCL_ENUM_INT {
  tcclInt8 = 0, tcclChar = 0,
  tcclUint8 = 1,
  tcclInt32 = 2, tcclInt = 2,
  tcclUint32 = 3,
  tcclInt64 = 4,
  tcclUint64 = 5,
  tcclFloat16 = 6, tcclHalf = 6,
  tcclFloat32 = 7, tcclFloat = 7,
  tcclFloat64 = 8, tcclDouble = 8,
  tcclBfloat16 = 9,
  tcclFloat8e4m3 = 10,
  tcclFloat8e5m2 = 11,
  tcclNumTypes = 12
} tcclDataType_t;

typedef enum TCCL_ENUM_INT { tcclSum = 0, tcclProd = 1, tcclMax = 2, tcclMin = 3, tcclAvg = 4, tcclNumOps = 5 } tcclRedOp_t;

/* Where a PreMulSum's scalar lives: read at each call through the pointer (tcclScalarDevice), or copied at creation
 * (tcclScalarHostImmediate). */
typedef enum TCCL_ENUM_INT { tcclScalarDevice = 0, tcclScalarHostImmediate = 1 } tcclScalarResidence_t;

/* TCCL_VERSION_CODE of the library. */
TCCL_API tcclResult_t tcclGetVersion(int* version);
/* Starts the rendezvous root in this process (kept alive until every rank has joined) and returns its id. */
TCCL_API tcclResult_t tcclGetUniqueId(tcclUniqueId* uniqueId);
/* Joins communicator `commId` as `rank` of `nranks`. Collective. */
TCCL_API tcclResult_t tcclCommInitRank(tcclComm_t* comm, int nranks, tcclUniqueId commId, int rank);
/* tcclCommInitRank whose waits give up after `seconds` without progress (this communicator's TOPOCOLL_TIMEOUT,
 * unless the environment sets TOPOCOLL_TIMEOUT, which wins): a framework's per-group timeout. Not in NCCL. */
TCCL_API tcclResult_t tcclCommInitRankTimeout(tcclComm_t* comm, int nranks, tcclUniqueId commId, int rank,
                                              double seconds);
/* `ndev` ranks in this process, one communicator each (devlist: GPU of each rank, or NULL for host ranks). */
TCCL_API tcclResult_t tcclCommInitAll(tcclComm_t* comms, int ndev, const int* devlist);
/* Waits for the communicator's operations, then frees it. */
TCCL_API tcclResult_t tcclCommFinalize(tcclComm_t comm);
TCCL_API tcclResult_t tcclCommDestroy(tcclComm_t comm);
/* Stops every pending operation (they fail with tcclInvalidUsage / the abort message) and frees the communicator. */
TCCL_API tcclResult_t tcclCommAbort(tcclComm_t comm);
/* NCCL's ncclCommSplit: every rank of `comm` calls it (after the same calls); the ranks of one `color` (>= 0) make
 * a communicator, ranked by `key` then by their rank in `comm`. TCCL_SPLIT_NOCOLOR: this rank joins none and gets
 * NULL. The new communicator is independent of `comm` (destroy them in any order). */
#define TCCL_SPLIT_NOCOLOR (-1)
TCCL_API tcclResult_t tcclCommSplit(tcclComm_t comm, int color, int key, tcclComm_t* newcomm);
/* NCCL's ncclCommShrink: the ranks not in `excludeRanks` (which do not call it) make a communicator, in their order
 * in `comm`; it works when the excluded ranks died or hang. TCCL_SHRINK_ABORT: `comm`'s pending calls end first
 * (with an error), and `comm` is aborted (destroy it afterwards). Every calling rank gives the same list. */
#define TCCL_SHRINK_DEFAULT 0
#define TCCL_SHRINK_ABORT 1
TCCL_API tcclResult_t tcclCommShrink(tcclComm_t comm, const int* excludeRanks, int excludeCount, tcclComm_t* newcomm,
                                     int flags);
TCCL_API tcclResult_t tcclCommCount(const tcclComm_t comm, int* count);
TCCL_API tcclResult_t tcclCommUserRank(const tcclComm_t comm, int* rank);
/* The GPU of this rank, -1 for a host-memory rank. */
TCCL_API tcclResult_t tcclCommCuDevice(const tcclComm_t comm, int* device);
/* NCCL's ncclMemAlloc / ncclMemFree for host-memory ranks: `size` zeroed bytes of shareable host memory (whole
 * 2 MiB pages), which ranks of other processes on the host map and copy into or out of with loads and stores instead
 * of process_vm_readv/writev (large messages up to 1.8x faster; docs/transport.md, "Shareable buffers"). Any buffer works
 * with every call; these are the fast ones. size 0 gives NULL. tcclMemFree(NULL) does nothing; a pointer
 * tcclMemAlloc did not return is tcclInvalidUsage. */
TCCL_API tcclResult_t tcclMemAlloc(void** ptr, size_t size);
TCCL_API tcclResult_t tcclMemFree(void* ptr);
/* The first error a background thread met (tcclSuccess if none). */
TCCL_API tcclResult_t tcclCommGetAsyncError(tcclComm_t comm, tcclResult_t* asyncError);
TCCL_API const char* tcclGetErrorString(tcclResult_t result);
/* The message of the last failure on `comm` (or of this thread's last failed call when comm is NULL). */
TCCL_API const char* tcclGetLastError(tcclComm_t comm);

/* Collectives (counts in elements). In place when sendbuff == recvbuff (AllGather: sendbuff == recvbuff +
 * rank * sendcount; ReduceScatter: sendbuff + rank * recvcount == recvbuff). */
TCCL_API tcclResult_t tcclAllReduce(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclRedOp_t op,
                           tcclComm_t comm, tcclStream_t stream);
TCCL_API tcclResult_t tcclBroadcast(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, int root,
                           tcclComm_t comm, tcclStream_t stream);
TCCL_API tcclResult_t tcclReduce(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclRedOp_t op,
                        int root, tcclComm_t comm, tcclStream_t stream);
TCCL_API tcclResult_t tcclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, tcclDataType_t datatype,
                           tcclComm_t comm, tcclStream_t stream);
TCCL_API tcclResult_t tcclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, tcclDataType_t datatype,
                               tcclRedOp_t op, tcclComm_t comm, tcclStream_t stream);
/* Data for rank j is sendbuff + j*count; data from rank i lands at recvbuff + i*count. */
TCCL_API tcclResult_t tcclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, tcclComm_t comm,
                          tcclStream_t stream);
TCCL_API tcclResult_t tcclGather(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, int root,
                        tcclComm_t comm, tcclStream_t stream);
TCCL_API tcclResult_t tcclScatter(const void* sendbuff, void* recvbuff, size_t count, tcclDataType_t datatype, int root,
                         tcclComm_t comm, tcclStream_t stream);
/* NCCL's ncclRedOpCreatePreMulSum: an op of `comm` for `datatype` (any of them, as NCCL) that multiplies each rank's
 * input by *scalar, then sums; for AllReduce, Reduce and ReduceScatter on host buffers. Ops are numbered from
 * tcclNumOps; tcclRedOpDestroy frees one (a destroyed op, or one of another communicator, is tcclInvalidArgument). */
TCCL_API tcclResult_t tcclRedOpCreatePreMulSum(tcclRedOp_t* op, void* scalar, tcclDataType_t datatype,
                                               tcclScalarResidence_t residence, tcclComm_t comm);
TCCL_API tcclResult_t tcclRedOpDestroy(tcclRedOp_t op, tcclComm_t comm);

/* Registration (NCCL's ncclCommRegister): local; records [buff, buff + size) and returns its handle. Mapped memory
 * only, overlapping no other registration of `comm` (else tcclInvalidArgument). Memory from tcclMemAlloc is what
 * ranks in other processes of the host map (no staging copies); the collectives map it registered or not, and heap
 * memory cannot be mapped by another process (registering it changes nothing). */
TCCL_API tcclResult_t tcclCommRegister(const tcclComm_t comm, void* buff, size_t size, void** handle);
TCCL_API tcclResult_t tcclCommDeregister(const tcclComm_t comm, void* handle);
/* Windows (NCCL's ncclCommWindowRegister): collective, every rank in the same order, each with tcclMemAlloc memory;
 * every rank maps the parts of the ranks of its host. */
typedef struct tcclWindow* tcclWindow_t;
#define TCCL_WIN_DEFAULT 0x00
#define TCCL_WIN_COLL_SYMMETRIC 0x01
#define TCCL_WIN_STRICT_ORDERING 0x02
TCCL_API tcclResult_t tcclCommWindowRegister(tcclComm_t comm, void* buff, size_t size, tcclWindow_t* win, int winFlags);
TCCL_API tcclResult_t tcclCommWindowDeregister(tcclComm_t comm, tcclWindow_t win);
TCCL_API tcclResult_t tcclWinGetUserPtr(tcclComm_t comm, tcclWindow_t win, void** outUserPtr);
/* One-sided (NCCL's ncclPutSignal, ncclSignal, ncclWaitSignal) between ranks of one host, signal index and context
 * 0, flags 0: a put copies count elements from localbuff (inside a TCCL_WIN_COLL_SYMMETRIC window) into peer's part
 * of peerWin at peerWinOffset bytes, then signals peer; a wait returns when each descriptor's peer has signalled opCnt
 * more times (TOPOCOLL_TIMEOUT; a peer that ended fails it). */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} tcclWaitSignalDesc_t;
TCCL_API tcclResult_t tcclPutSignal(const void* localbuff, size_t count, tcclDataType_t datatype, int peer,
                                    tcclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                                    unsigned int flags, tcclComm_t comm, tcclStream_t stream);
TCCL_API tcclResult_t tcclSignal(int peer, int sigIdx, int ctx, unsigned int flags, tcclComm_t comm,
                                 tcclStream_t stream);
TCCL_API tcclResult_t tcclWaitSignal(int nDesc, tcclWaitSignalDesc_t* signalDescs, tcclComm_t comm,
                                     tcclStream_t stream);

/* Returns when every rank has entered it (not in NCCL: its users allreduce one element). */
TCCL_API tcclResult_t tcclBarrier(tcclComm_t comm, tcclStream_t stream);

/* Point to point; a send and its receive must agree on count and datatype (a mismatch fails on both sides). */
TCCL_API tcclResult_t tcclSend(const void* sendbuff, size_t count, tcclDataType_t datatype, int peer, tcclComm_t comm,
                      tcclStream_t stream);
TCCL_API tcclResult_t tcclRecv(void* recvbuff, size_t count, tcclDataType_t datatype, int peer, tcclComm_t comm,
                      tcclStream_t stream);
/* A receive from whichever of the nPeers ranks in `peers` sends first (not in NCCL; MPI's MPI_ANY_SOURCE, PyTorch's
   recv from any source): blocks until one of them sends to this rank, receives that message (its count and
   datatype must match, as for tcclRecv), and writes the sender's rank to *source. Peers are served in turn. Not in a
   group; no other receive from these peers may be under way. Host memory. */
TCCL_API tcclResult_t tcclRecvAny(void* recvbuff, size_t count, tcclDataType_t datatype, const int* peers,
                                  int nPeers, int* source, tcclComm_t comm);

/* Operations between GroupStart and GroupEnd are issued together: any order of sends and receives completes. */
TCCL_API tcclResult_t tcclGroupStart(void);
TCCL_API tcclResult_t tcclGroupEnd(void);

/* Joins the job the launcher describes in the environment, without a unique id passed by the caller: rank and size
 * from Open MPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE), Slurm's srun (SLURM_PROCID/NTASKS) or torchrun
 * (RANK/WORLD_SIZE), the root's address from NCCL_COMM_ID, MASTER_ADDR/MASTER_PORT or the launcher's job id; rank 0
 * hosts the root. Collective: every rank of the job calls it. Fails with tcclInvalidUsage, saying which variable to
 * set, when the environment names no job. Not in NCCL (its users broadcast the id themselves).
 *
 *   tcclComm_t comm;
 *   if (tcclCommInitFromEnv(&comm) != tcclSuccess) fprintf(stderr, "%s\n", tcclGetLastError(NULL));
 */
TCCL_API tcclResult_t tcclCommInitFromEnv(tcclComm_t* comm);

#ifdef __cplusplus
}
#endif

#endif /* TOPOCOLL_TOPOCOLL_H_ */
