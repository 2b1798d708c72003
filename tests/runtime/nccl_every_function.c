/* Every function NVIDIA's nccl.h 2.30.7 declares links against libtopocoll_nccl.so (built as C99 with topocoll's
 * nccl.h), and the ones beyond the collectives behave as NCCL documents or fail naming why:
 *   - ncclCommInitRankConfig: NCCL_CONFIG_INITIALIZER configs (blocking and not) make working communicators; a
 *     config with a bad magic, size or field value is ncclInvalidArgument naming it;
 *   - ncclCommGetAsyncError: ncclSuccess while the job is well; an error once a peer died during a call;
 *   - ncclCommMemStats: no GPU memory on host memory; the Param API over the knob registry;
 *   - what is not built yet returns ncclInvalidUsage with a message, never success.
 * Prints "every function OK" when all holds. */
#define _POSIX_C_SOURCE 200809L /* fork, waitpid under -std=c99 */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef void (*AnyFn)(void);
#define FN(f) (AnyFn) & f
static const AnyFn kEvery[] = {
    FN(ncclMemAlloc), FN(ncclMemFree), FN(ncclGetVersion), FN(ncclGetUniqueId), FN(ncclCommInitRankConfig),
    FN(ncclCommInitRank), FN(ncclCommInitAll), FN(ncclCommFinalize), FN(ncclCommDestroy), FN(ncclCommAbort),
    FN(ncclCommRevoke), FN(ncclCommSplit), FN(ncclCommShrink), FN(ncclCommGetUniqueId), FN(ncclCommGrow),
    FN(ncclCommInitRankScalable), FN(ncclGetErrorString), FN(ncclGetLastError), FN(ncclResetDebugInit),
    FN(ncclCommGetAsyncError), FN(ncclCommCount), FN(ncclCommCuDevice), FN(ncclCommUserRank), FN(ncclCommRegister),
    FN(ncclCommDeregister), FN(ncclCommSuspend), FN(ncclCommResume), FN(ncclCommMemStats),
    FN(ncclCommWindowRegister), FN(ncclCommWindowDeregister), FN(ncclWinGetUserPtr), FN(ncclRedOpCreatePreMulSum),
    FN(ncclRedOpDestroy), FN(ncclReduce), FN(ncclBcast), FN(ncclBroadcast), FN(ncclAllReduce), FN(ncclReduceScatter),
    FN(ncclAllGather), FN(ncclAlltoAll), FN(ncclGather), FN(ncclScatter), FN(ncclSend), FN(ncclRecv),
    FN(ncclPutSignal), FN(ncclSignal), FN(ncclWaitSignal), FN(ncclGroupStart), FN(ncclGroupEnd),
    FN(ncclGroupSimulateEnd), FN(ncclParamBind), FN(ncclParamGetI8), FN(ncclParamGetI16), FN(ncclParamGetI32),
    FN(ncclParamGetI64), FN(ncclParamGetU8), FN(ncclParamGetU16), FN(ncclParamGetU32), FN(ncclParamGetU64),
    FN(ncclParamGetStr), FN(ncclParamGet), FN(ncclParamGetParameter), FN(ncclParamGetAllParameterKeys),
    FN(ncclParamDumpAll),
};

static int failures = 0;
#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "%s:%d: FAILED %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      failures++;                                                \
    }                                                            \
  } while (0)

/* The call failed with `want` and left a message naming `word`. */
static void expectRefused(ncclResult_t rc, ncclResult_t want, const char* word, const char* what) {
  const char* msg = ncclGetLastError(NULL);
  EXPECT(rc == want, "%s returned %d (%s), want %d", what, (int)rc, ncclGetErrorString(rc), (int)want);
  EXPECT(msg && strstr(msg, word), "%s: last error '%s' does not name '%s'", what, msg ? msg : "(null)", word);
}

/* 2 ranks: an AllReduce on a communicator made with a config (blocking or not). */
static int configRank(ncclUniqueId id, int rank, int blocking) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking;
  cfg.commName = "config-test";
  cfg.minCTAs = 1;
  cfg.maxCTAs = 4;
  cfg.netName = "socket"; /* NCCL compares names without case */
  cfg.trafficClass = 32;
  cfg.maxP2pPeers = 64; /* capped to the communicator's size */
  cfg.splitShare = 1;
  ncclComm_t comm = NULL;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, 2, id, rank, &cfg);
  ncclResult_t state = ncclInProgress;
  if (rc == ncclInProgress && !blocking) rc = ncclSuccess; /* non-blocking init: poll until it completed */
  while (rc == ncclSuccess && state == ncclInProgress) rc = ncclCommGetAsyncError(comm, &state);
  if (rc != ncclSuccess || state != ncclSuccess) return 10;
  int buf[64];
  for (int i = 0; i < 64; i++) buf[i] = rank + 1;
  rc = ncclAllReduce(buf, buf, 64, ncclInt32, ncclSum, comm, NULL);
  if (rc != ncclSuccess && !(rc == ncclInProgress && !blocking)) return 11;
  state = ncclInProgress;
  while (rc == ncclInProgress || state == ncclInProgress) {
    rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return 11;
  }
  if (state != ncclSuccess) return 11;
  for (int i = 0; i < 64; i++)
    if (buf[i] != 3) return 12;
  uint64_t mem = 1;
  if (ncclCommMemStats(comm, ncclStatGpuMemTotal, &mem) != ncclSuccess || mem != 0) return 13;
  if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state != ncclSuccess) return 14;
  /* Registration of a heap buffer: recorded (only ncclMemAlloc memory is mapped by peers), then released. */
  void* handle = NULL;
  if (ncclCommRegister(comm, buf, sizeof buf, &handle) != ncclSuccess || handle == NULL) return 15;
  if (ncclCommDeregister(comm, handle) != ncclSuccess) return 16;
  if (ncclCommDestroy(comm) != ncclSuccess) return 17;
  return 0;
}

/* 2 ranks: rank 1 dies after init; rank 0's AllReduce fails and ncclCommGetAsyncError reports it from then on. */
static int asyncRank(ncclUniqueId id, int rank) {
  ncclComm_t comm = NULL;
  if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 20;
  if (rank == 1) _exit(0); /* gone without a word */
  float buf[1024] = {0};
  ncclResult_t rc = ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, NULL);
  if (rc == ncclSuccess) return 21;
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return 22;
  if (state != ncclRemoteError && state != ncclSystemError && state != ncclTimeout) return 23;
  ncclCommAbort(comm);
  return 0;
}

/* The ranks are forked first and get the id through pipes, as MPI programs broadcast it: a fork after
 * ncclGetUniqueId (whose root thread takes locks as ranks register) could copy a lock held. */
static int forkPair(int test) {
  int pipes[2][2];
  pid_t kids[2];
  for (int r = 0; r < 2; r++) {
    if (pipe(pipes[r]) != 0) return 1;
    fflush(stdout);
    kids[r] = fork();
    if (kids[r] == 0) {
      ncclUniqueId id;
      if (read(pipes[r][0], &id, sizeof id) != (ssize_t)sizeof id) _exit(30);
      _exit(test == 2 ? asyncRank(id, r) : configRank(id, r, test));
    }
  }
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  for (int r = 0; r < 2; r++)
    if (write(pipes[r][1], &id, sizeof id) != (ssize_t)sizeof id) return 1;
  int bad = 0;
  for (int r = 0; r < 2; r++) {
    int status = 0;
    waitpid(kids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "test %d rank %d: exit %d\n", test, r, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      bad = 1;
    }
  }
  return bad;
}

int main(void) {
  int n = (int)(sizeof kEvery / sizeof kEvery[0]);
  for (int i = 0; i < n; i++) EXPECT(kEvery[i] != NULL, "function %d is NULL", i);
  printf("%d functions of nccl.h linked\n", n);
  EXPECT(n == 64, "%d functions listed, nccl.h 2.30.7 has 64", n);

  /* Bad configs: named, ncclInvalidArgument, before any rank is contacted. */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclComm_t comm = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  expectRefused(ncclCommInitRankConfig(&comm, 2, id, 0, &cfg), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER",
                "a config without its magic");
  ncclConfig_t big = NCCL_CONFIG_INITIALIZER;
  big.size = sizeof(ncclConfig_t) + 8;
  expectRefused(ncclCommInitRankConfig(&comm, 2, id, 0, &big), ncclInvalidArgument, "config->size", "a bigger struct");
  ncclConfig_t blk = NCCL_CONFIG_INITIALIZER;
  blk.blocking = 2;
  expectRefused(ncclCommInitRankConfig(&comm, 2, id, 0, &blk), ncclInvalidArgument, "config->blocking", "blocking 2");
  ncclConfig_t ctas = NCCL_CONFIG_INITIALIZER;
  ctas.minCTAs = 8;
  ctas.maxCTAs = 2;
  expectRefused(ncclCommInitRankConfig(&comm, 2, id, 0, &ctas), ncclInvalidArgument, "minCTAs", "minCTAs > maxCTAs");
  expectRefused(ncclCommInitRankScalable(&comm, 2, 0, 0, &id, NULL), ncclInvalidArgument, "nId", "no ids");
  ncclConfig_t net = NCCL_CONFIG_INITIALIZER;
  net.netName = "IB";
  expectRefused(ncclCommInitRankConfig(&comm, 1, id, 0, &net), ncclInvalidUsage, "netName", "netName IB");

  /* Not built yet: ncclInvalidUsage naming why. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  expectRefused(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "not inside ncclGroupStart", "ncclGroupSimulateEnd");
  expectRefused(ncclRedOpDestroy(ncclSum, NULL), ncclInvalidArgument, "built in", "destroying ncclSum");

  /* The Param API over the knob registry. */
  const char** keys = NULL;
  int nKeys = 0;
  EXPECT(ncclParamGetAllParameterKeys(&keys, &nKeys) == ncclSuccess && nKeys > 20, "%d keys", nKeys);
  ncclParamHandle_t h;
  EXPECT(ncclParamBind(&h, "NCCL_BUFFSIZE") == ncclSuccess, "bind NCCL_BUFFSIZE");
  int64_t buffsize = 0;
  EXPECT(ncclParamGetI64(h, &buffsize) == ncclSuccess && buffsize == 4194304, "NCCL_BUFFSIZE %lld",
         (long long)buffsize);
  int8_t small = 0;
  expectRefused(ncclParamGetI8(h, &small), ncclInvalidArgument, "does not fit", "4 MiB into an int8");
  const char* value = NULL;
  int len = 0;
  EXPECT(ncclParamGetParameter("NCCL_ALGO", &value, &len) == ncclSuccess && value, "NCCL_ALGO");
  expectRefused(ncclParamBind(&h, "NCCL_IB_HCA"), ncclInvalidArgument, "topocoll does not read", "NCCL_IB_HCA");
  expectRefused(ncclParamBind(&h, "NCCL_NO_SUCH_KNOB"), ncclInvalidArgument, "not a knob", "an unknown key");

  EXPECT(forkPair(1) == 0, "blocking config");
  EXPECT(forkPair(0) == 0, "non-blocking config");
  EXPECT(forkPair(2) == 0, "async error after a peer died");
  if (failures) return 1;
  printf("every function OK\n");
  return 0;
}
