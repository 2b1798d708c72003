/* NCCL's API feature by feature, as programs written for NCCL use it: each rank a forked process (the unique id
 * through a pipe, as MPI programs broadcast it), at 1, 2, 3, 4 and 8 ranks, with blocking and non-blocking
 * communicators.
 *
 *   nccl_features FEATURE [NRANKS...]     FEATURE: init split shrink premulsum abort manage grow simulate
 *                                                 register signal scalable
 *
 * C99 against topocoll's nccl.h; exits 0 when every rank of every size passed, else prints what failed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static int nRanks, myRank, blockingMode;
static int growPipe[2]; /* grow: the existing rank 0 hands the grown communicator's id to the new ranks */
static ncclUniqueId jobIds[3]; /* the job's ids: one, or three for "scalable" (ncclCommInitRankScalable) */
static int nJobIds = 1;

#define CHECK(cond, code)                                                                                    \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "rank %d/%d blocking=%d %s:%d: FAILED %s (last error: %s)\n", myRank, nRanks,          \
              blockingMode, __FILE__, __LINE__, #cond, ncclGetLastError(NULL));                              \
      return code;                                                                                           \
    }                                                                                                        \
  } while (0)

/* Waits until a non-blocking communicator's calls completed: ncclSuccess, or the failure. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t rc) {
  if (rc != ncclSuccess && rc != ncclInProgress) return rc;
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
  }
  return state;
}

static ncclComm_t initComm(ncclUniqueId id, const char* name) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blockingMode;
  cfg.commName = name;
  ncclComm_t comm = NULL;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, nRanks, id, myRank, &cfg);
  if (!blockingMode && rc == ncclSuccess) return NULL; /* a non-blocking init returns ncclInProgress */
  if (settle(comm, rc) != ncclSuccess) return NULL;
  return comm;
}

/* Sum over the ranks of `comm` of `v`: -1 on failure. */
static long long sumOver(ncclComm_t comm, long long v) {
  long long in = v, out = 0;
  if (settle(comm, ncclAllReduce(&in, &out, 1, ncclInt64, ncclSum, comm, NULL)) != ncclSuccess) return -1;
  return out;
}

static int featureInit(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-init");
  CHECK(comm != NULL, 10);
  int count = 0, rank = -1;
  CHECK(ncclCommCount(comm, &count) == ncclSuccess && count == nRanks, 11);
  CHECK(ncclCommUserRank(comm, &rank) == ncclSuccess && rank == myRank, 12);
  /* Several calls in flight before the first wait (non-blocking: each returns ncclInProgress). */
  float a[4096], b[4096];
  for (int i = 0; i < 4096; i++) a[i] = (float)(myRank + 1);
  ncclResult_t rc1 = ncclAllReduce(a, a, 4096, ncclFloat32, ncclSum, comm, NULL);
  ncclResult_t rc2 = ncclBroadcast(a, b, 4096, ncclFloat32, 0, comm, NULL);
  CHECK(rc1 == ncclSuccess || (!blockingMode && rc1 == ncclInProgress), 13);
  CHECK(settle(comm, rc2) == ncclSuccess, 14);
  const float want = (float)(nRanks * (nRanks + 1) / 2);
  for (int i = 0; i < 4096; i++) CHECK(a[i] == want && b[i] == want, 15);
  /* Sends and receives in a ring: in a group (which makes the connections), then, non-blocking, outside one: each
   * call is issued and returns ncclInProgress, and ncclCommGetAsyncError says when both completed. */
  int next = (myRank + 1) % nRanks, prev = (myRank + nRanks - 1) % nRanks, out = myRank, got = -1;
  CHECK(ncclGroupStart() == ncclSuccess, 16);
  ncclSend(&out, 1, ncclInt32, next, comm, NULL);
  ncclRecv(&got, 1, ncclInt32, prev, comm, NULL);
  CHECK(settle(comm, ncclGroupEnd()) == ncclSuccess, 17);
  CHECK(got == prev, 18);
  if (!blockingMode) {
    got = -1;
    ncclResult_t s = ncclSend(&out, 1, ncclInt32, next, comm, NULL);
    ncclResult_t r = ncclRecv(&got, 1, ncclInt32, prev, comm, NULL);
    CHECK(s == ncclSuccess || s == ncclInProgress, 16);
    CHECK(settle(comm, r) == ncclSuccess, 17);
  }
  CHECK(got == prev, 18);
  CHECK(ncclCommFinalize(comm) == ncclSuccess, 19);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, 19);
  return 0;
}

/* One split pattern: colour and key of this rank; checks the new rank and size against what NCCL defines. */
static int splitOnce(ncclComm_t comm, int pattern) {
  int color, key;
  switch (pattern) {
    case 0: color = myRank % 2; key = nRanks - myRank; break;                   /* parity, reversed keys */
    case 1: color = 5; key = 0; break;                                          /* one colour, equal keys */
    case 2: color = myRank == nRanks - 1 ? NCCL_SPLIT_NOCOLOR : 0; key = myRank; break; /* the last rank out */
    default: color = myRank; key = 0; break;                                    /* every rank alone */
  }
  /* What NCCL gives: the members of my colour ordered by (key, parent rank). */
  int size = 0, expectRank = 0;
  for (int r = 0; r < nRanks; r++) {
    int c, k;
    switch (pattern) {
      case 0: c = r % 2; k = nRanks - r; break;
      case 1: c = 5; k = 0; break;
      case 2: c = r == nRanks - 1 ? NCCL_SPLIT_NOCOLOR : 0; k = r; break;
      default: c = r; k = 0; break;
    }
    if (c != color || color == NCCL_SPLIT_NOCOLOR) continue;
    size++;
    if (k < key || (k == key && r < myRank)) expectRank++;
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = "features-split-child";
  ncclComm_t child = (ncclComm_t)1;
  ncclResult_t rc = ncclCommSplit(comm, color, key, &child, pattern == 1 ? &cfg : NULL);
  CHECK(rc == ncclSuccess, 20 + pattern);
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(child == NULL, 30);
    return 0;
  }
  int count = 0, rank = -1;
  CHECK(ncclCommCount(child, &count) == ncclSuccess && count == size, 31);
  CHECK(ncclCommUserRank(child, &rank) == ncclSuccess && rank == expectRank, 32);
  long long want = 0;
  for (int r = 0; r < nRanks; r++) {
    int c = pattern == 0 ? r % 2 : pattern == 1 ? 5 : pattern == 2 ? (r == nRanks - 1 ? -1 : 0) : r;
    if (c == color) want += r;
  }
  CHECK(sumOver(child, myRank) == want, 33);
  CHECK(ncclCommDestroy(child) == ncclSuccess, 34);
  return 0;
}

static int featureSplit(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-split");
  CHECK(comm != NULL, 10);
  for (int p = 0; p < 4; p++) {
    int rc = splitOnce(comm, p);
    if (rc) return rc;
  }
  /* A colour below NCCL_SPLIT_NOCOLOR on one rank: every rank fails, naming it. */
  ncclComm_t child = (ncclComm_t)1;
  ncclResult_t rc = ncclCommSplit(comm, myRank == 0 ? -7 : 0, 0, &child, NULL);
  CHECK(rc == ncclInvalidArgument && child == NULL, 35);
  CHECK(strstr(ncclGetLastError(comm), "rank 0 gave color -7") != NULL, 36);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, 37);
  return 0;
}

/* The last rank dies after init; the others' AllReduce fails, they shrink without it and go on. */
static int featureShrink(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-shrink");
  CHECK(comm != NULL, 10);
  CHECK(sumOver(comm, 1) == nRanks, 40);
  int dead = nRanks - 1;
  if (nRanks > 1 && myRank == dead) _exit(0); /* gone without a word */
  if (nRanks > 1) {
    float buf[1024] = {0};
    ncclResult_t rc = settle(comm, ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, NULL));
    CHECK(rc != ncclSuccess, 41);
  }
  ncclComm_t child = NULL;
  int exclude[1] = {dead};
  ncclResult_t rc = ncclCommShrink(comm, exclude, nRanks > 1 ? 1 : 0, &child, NULL, NCCL_SHRINK_ABORT);
  CHECK(rc == ncclSuccess && child != NULL, 42);
  int count = 0;
  CHECK(ncclCommCount(child, &count) == ncclSuccess && count == (nRanks > 1 ? nRanks - 1 : 1), 43);
  long long want = 0;
  for (int r = 0; r < count; r++) want += r;
  CHECK(sumOver(child, myRank) == want, 44);
  /* Excluding oneself is the caller's mistake. */
  ncclComm_t bad = (ncclComm_t)1;
  CHECK(ncclCommShrink(child, &myRank, 1, &bad, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument && bad == NULL, 45);
  CHECK(ncclCommDestroy(child) == ncclSuccess, 46);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, 47);
  return 0;
}

static int featurePreMulSum(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-premulsum");
  CHECK(comm != NULL, 10);
  /* Host-immediate float scalar: sum over r of (r + 1) * 0.5. */
  float half = 0.5f;
  ncclRedOp_t op;
  CHECK(ncclRedOpCreatePreMulSum(&op, &half, ncclFloat32, ncclScalarHostImmediate, comm) == ncclSuccess, 50);
  CHECK((int)op >= (int)ncclNumOps, 51);
  half = 100.0f; /* taken at creation */
  float x[1000], y[1000];
  for (int i = 0; i < 1000; i++) x[i] = (float)(myRank + 1);
  CHECK(settle(comm, ncclAllReduce(x, y, 1000, ncclFloat32, op, comm, NULL)) == ncclSuccess, 52);
  const float want = 0.5f * (float)(nRanks * (nRanks + 1) / 2);
  for (int i = 0; i < 1000; i++) CHECK(y[i] == want, 53);
  /* ReduceScatter and Reduce with it. */
  float* all = malloc(sizeof(float) * 8 * nRanks);
  for (int i = 0; i < 8 * nRanks; i++) all[i] = (float)(myRank + 1);
  float part[8];
  CHECK(settle(comm, ncclReduceScatter(all, part, 8, ncclFloat32, op, comm, NULL)) == ncclSuccess, 54);
  for (int i = 0; i < 8; i++) CHECK(part[i] == want, 55);
  float root[8] = {0};
  CHECK(settle(comm, ncclReduce(all, root, 8, ncclFloat32, op, nRanks - 1, comm, NULL)) == ncclSuccess, 56);
  if (myRank == nRanks - 1)
    for (int i = 0; i < 8; i++) CHECK(root[i] == want, 57);
  free(all);
  /* With another datatype: ncclInvalidArgument naming both. */
  double d[4] = {0};
  CHECK(ncclAllReduce(d, d, 4, ncclFloat64, op, comm, NULL) == ncclInvalidArgument, 58);
  CHECK(strstr(ncclGetLastError(comm), "made for float") != NULL, 58);
  CHECK(ncclRedOpDestroy(op, comm) == ncclSuccess, 59);
  CHECK(ncclAllReduce(x, y, 1000, ncclFloat32, op, comm, NULL) == ncclInvalidArgument, 60);
  CHECK(ncclRedOpDestroy(op, comm) == ncclInvalidArgument, 61);
  /* A "device" scalar (a pointer read at each call) of doubles, and an integer type, as NCCL allows. */
  double scale = 3.0;
  ncclRedOp_t dop;
  CHECK(ncclRedOpCreatePreMulSum(&dop, &scale, ncclFloat64, ncclScalarDevice, comm) == ncclSuccess, 62);
  for (int i = 0; i < 4; i++) d[i] = myRank;
  scale = 2.0;
  CHECK(settle(comm, ncclAllReduce(d, d, 4, ncclFloat64, dop, comm, NULL)) == ncclSuccess, 63);
  for (int i = 0; i < 4; i++) CHECK(d[i] == 2.0 * (nRanks * (nRanks - 1) / 2), 64);
  int three = 3, iv = myRank + 1, ir = 0;
  ncclRedOp_t iop;
  CHECK(ncclRedOpCreatePreMulSum(&iop, &three, ncclInt32, ncclScalarHostImmediate, comm) == ncclSuccess, 65);
  CHECK(settle(comm, ncclAllReduce(&iv, &ir, 1, ncclInt32, iop, comm, NULL)) == ncclSuccess, 66);
  CHECK(ir == 3 * nRanks * (nRanks + 1) / 2, 67);
  CHECK(ncclRedOpDestroy(dop, comm) == ncclSuccess && ncclRedOpDestroy(iop, comm) == ncclSuccess, 68);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, 69);
  return 0;
}

/* Abort from a watchdog thread while the main thread waits in an AllReduce the last rank never joins. */
struct Watchdog {
  ncclComm_t comm;
  ncclResult_t rc;
};
static void* watchdog(void* arg) {
  struct Watchdog* w = arg;
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  w->rc = ncclCommAbort(w->comm);
  return NULL;
}
static int featureAbort(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-abort");
  CHECK(comm != NULL, 10);
  CHECK(sumOver(comm, 1) == nRanks, 70);
  if (myRank == nRanks - 1 && nRanks > 1) {
    struct timespec ts = {1, 0}; /* never calls the AllReduce; leaves once the others aborted */
    nanosleep(&ts, NULL);
    ncclCommAbort(comm);
    return 0;
  }
  struct Watchdog w = {comm, ncclInternalError};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, watchdog, &w) == 0, 71);
  float buf[256] = {0};
  ncclResult_t rc = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL);
  if (rc == ncclInProgress) { /* non-blocking: wait as a framework does, until the abort ends it */
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && ncclCommGetAsyncError(comm, &state) == ncclSuccess) {
    }
    rc = state == ncclInProgress ? ncclInvalidUsage : state;
  }
  pthread_join(t, NULL);
  CHECK(w.rc == ncclSuccess, 72);
  if (nRanks > 1) CHECK(rc != ncclSuccess, 73);
  /* The handle is dead: calls on it fail, never crash. */
  int count = 0;
  CHECK(ncclCommCount(comm, &count) == ncclInvalidArgument, 74);
  return 0;
}

/* Revoke (in-flight work ends, then only split, shrink, destroy) and suspend/resume. */
static int featureManage(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-manage");
  CHECK(comm != NULL, 10);
  CHECK(sumOver(comm, 1) == nRanks, 80);
  CHECK(ncclCommSuspend(comm, 2) == ncclInvalidArgument, 81);
  CHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM) == ncclSuccess, 81);
  uint64_t v = 0;
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v) == ncclSuccess && v == 1, 82);
  CHECK(sumOver(comm, 1) == -1 && strstr(ncclGetLastError(comm), "suspended"), 83);
  CHECK(ncclCommResume(comm) == ncclSuccess && ncclCommResume(comm) == ncclInvalidUsage, 84);
  CHECK(sumOver(comm, 2) == 2 * nRanks, 85);
  CHECK(ncclCommRevoke(comm, 1) == ncclInvalidArgument, 86);
  CHECK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) == ncclSuccess, 86);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) CHECK(ncclCommGetAsyncError(comm, &state) == ncclSuccess, 87);
  CHECK(state == ncclSuccess, 87);
  CHECK(sumOver(comm, 1) == -1 && strstr(ncclGetLastError(comm), "revoked"), 88);
  ncclComm_t child = NULL;
  CHECK(ncclCommSplit(comm, 0, nRanks - myRank, &child, NULL) == ncclSuccess && child != NULL, 89);
  int rank = -1;
  CHECK(ncclCommUserRank(child, &rank) == ncclSuccess && rank == nRanks - 1 - myRank, 90);
  CHECK(sumOver(child, myRank) == (long long)nRanks * (nRanks - 1) / 2, 91);
  CHECK(ncclCommDestroy(child) == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess, 92);
  return 0;
}

/* The first half of the ranks make a communicator; it grows to all of them (the others join with the id that the
 * existing rank 0 made with ncclCommGetUniqueId). */
static int featureGrow(ncclUniqueId id) {
  const int old = nRanks > 1 ? nRanks / 2 : 1, full = nRanks;
  ncclComm_t grown = NULL;
  if (myRank < old) {
    nRanks = old; /* the first communicator's size */
    ncclComm_t comm = initComm(id, "features-grow");
    nRanks = full;
    CHECK(comm != NULL, 10);
    ncclUniqueId gid;
    const ncclUniqueId* give = NULL;
    if (myRank == 0) {
      CHECK(ncclCommGetUniqueId(comm, &gid) == ncclSuccess, 100);
      CHECK(ncclCommGetUniqueId(comm, &gid) == ncclInvalidUsage, 101); /* one outstanding at a time */
      for (int r = old; r < full; r++) CHECK(write(growPipe[1], &gid, sizeof gid) == (ssize_t)sizeof gid, 102);
      give = &gid;
    }
    if (full == old) {
      CHECK(ncclCommGrow(comm, full, give, -1, &grown, NULL) == ncclInvalidArgument, 103);
      CHECK(ncclCommDestroy(comm) == ncclSuccess, 104);
      return 0;
    }
    CHECK(ncclCommGrow(comm, full, give, -1, &grown, NULL) == ncclSuccess && grown != NULL, 105);
    CHECK(ncclCommDestroy(comm) == ncclSuccess, 106);
  } else {
    ncclUniqueId gid;
    CHECK(read(growPipe[0], &gid, sizeof gid) == (ssize_t)sizeof gid, 107);
    CHECK(ncclCommGrow(NULL, full, &gid, myRank, &grown, NULL) == ncclSuccess && grown != NULL, 108);
  }
  int count = 0, rank = -1;
  CHECK(ncclCommCount(grown, &count) == ncclSuccess && count == full, 109);
  CHECK(ncclCommUserRank(grown, &rank) == ncclSuccess && rank == myRank, 110);
  CHECK(sumOver(grown, myRank) == (long long)full * (full - 1) / 2, 111);
  CHECK(ncclCommDestroy(grown) == ncclSuccess, 112);
  return 0;
}

/* ncclGroupSimulateEnd: an estimate from the cost model, nothing run; a bad simInfo and a missing group refused. */
static int featureSimulate(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-simulate");
  CHECK(comm != NULL, 10);
  float in[4096], out[4096];
  for (int i = 0; i < 4096; i++) in[i] = 1.0f, out[i] = -1.0f;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart() == ncclSuccess, 120);
  CHECK(ncclAllReduce(in, out, 4096, ncclFloat32, ncclSum, comm, NULL) == ncclSuccess, 121);
  CHECK(ncclBroadcast(in, out, 4096, ncclFloat32, 0, comm, NULL) == ncclSuccess, 121);
  CHECK(ncclGroupSimulateEnd(&sim) == ncclSuccess, 122);
  CHECK(nRanks == 1 ? sim.estimatedTime >= 0 : sim.estimatedTime > 0, 123);
  for (int i = 0; i < 4096; i++) CHECK(out[i] == -1.0f, 124); /* nothing ran */
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0;
  CHECK(ncclGroupStart() == ncclSuccess, 125);
  CHECK(ncclGroupSimulateEnd(&bad) == ncclInvalidArgument, 125);
  CHECK(ncclGroupSimulateEnd(&sim) == ncclInvalidUsage, 126); /* no group open */
  /* The communicator goes on: the next call runs. */
  CHECK(sumOver(comm, 1) == nRanks, 127);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, 128);
  return 0;
}

/* Registration: ncclMemAlloc and heap buffers registered, collectives on them, and the refusals. */
static int featureRegister(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-register");
  CHECK(comm != NULL, 10);
  const size_t n = 1 << 18; /* 1 MiB of floats: the mapped path from 1 MiB */
  float* shared = NULL;
  CHECK(ncclMemAlloc((void**)&shared, n * sizeof(float)) == ncclSuccess && shared != NULL, 130);
  float* heap = malloc(n * sizeof(float));
  void *hs = NULL, *hh = NULL, *bad = (void*)1;
  CHECK(ncclCommRegister(comm, shared, n * sizeof(float), &hs) == ncclSuccess && hs != NULL, 131);
  CHECK(ncclCommRegister(comm, heap, n * sizeof(float), &hh) == ncclSuccess && hh != NULL && hh != hs, 132);
  for (size_t i = 0; i < n; i++) shared[i] = (float)(myRank + 1), heap[i] = 0.0f;
  CHECK(settle(comm, ncclAllReduce(shared, heap, n, ncclFloat32, ncclSum, comm, NULL)) == ncclSuccess, 133);
  const float want = (float)(nRanks * (nRanks + 1) / 2);
  for (size_t i = 0; i < n; i += 997) CHECK(heap[i] == want, 134);
  CHECK(settle(comm, ncclAllReduce(shared, shared, n, ncclFloat32, ncclSum, comm, NULL)) == ncclSuccess, 135);
  for (size_t i = 0; i < n; i += 997) CHECK(shared[i] == want, 136);
  /* Overlapping, unmapped, NULL and empty ranges; a dead handle. */
  CHECK(ncclCommRegister(comm, shared + 16, 64, &bad) == ncclInvalidArgument && bad == NULL, 137);
  CHECK(strstr(ncclGetLastError(comm), "overlaps") != NULL, 137);
  CHECK(ncclCommRegister(comm, (void*)(uintptr_t)4096, 4096, &bad) == ncclInvalidArgument, 138);
  CHECK(strstr(ncclGetLastError(comm), "not mapped") != NULL, 138);
  CHECK(ncclCommRegister(comm, NULL, 64, &bad) == ncclInvalidArgument, 139);
  CHECK(ncclCommRegister(comm, heap, 0, &bad) == ncclInvalidArgument, 139);
  CHECK(ncclCommDeregister(comm, hh) == ncclSuccess, 140);
  CHECK(ncclCommDeregister(comm, hh) == ncclInvalidArgument, 141);
  CHECK(ncclCommRegister(comm, heap + 8, 64, &hh) == ncclSuccess, 142); /* free again */
  CHECK(ncclCommDeregister(comm, hh) == ncclSuccess && ncclCommDeregister(comm, hs) == ncclSuccess, 143);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, 144);
  CHECK(ncclMemFree(shared) == ncclSuccess, 145);
  free(heap);
  return 0;
}

/* Windows and one-sided signals: a ring of puts, signals from everyone, the refusals, a peer that ends. */
static int featureSignal(ncclUniqueId id) {
  ncclComm_t comm = initComm(id, "features-signal");
  CHECK(comm != NULL, 10);
  const size_t part = 256; /* ints per rank's slot */
  const size_t bytes = (size_t)nRanks * part * sizeof(int) * 2;
  int* wbuf = NULL;
  CHECK(ncclMemAlloc((void**)&wbuf, bytes) == ncclSuccess, 150);
  ncclWindow_t win = NULL;
  CHECK(ncclCommWindowRegister(comm, wbuf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC) == ncclSuccess && win, 151);
  void* user = NULL;
  CHECK(ncclWinGetUserPtr(comm, win, &user) == ncclSuccess && user == wbuf, 152);
  /* Each rank puts its stamp (from the second half of its window) into the next rank's slot of its own rank. */
  int* src = wbuf + (size_t)nRanks * part;
  for (size_t i = 0; i < part; i++) src[i] = myRank * 100000 + (int)i;
  const int next = (myRank + 1) % nRanks, prev = (myRank + nRanks - 1) % nRanks;
  CHECK(ncclPutSignal(src, part, ncclInt32, next, win, (size_t)myRank * part * sizeof(int), 0, 0, 0, comm, NULL) ==
            ncclSuccess, 153);
  ncclWaitSignalDesc_t d = {1, prev, 0, 0};
  CHECK(ncclWaitSignal(1, &d, comm, NULL) == ncclSuccess, 154);
  for (size_t i = 0; i < part; i++) CHECK(wbuf[(size_t)prev * part + i] == prev * 100000 + (int)i, 155);
  /* A signal from every rank to every rank (itself included), twice; one wait with a descriptor per rank. */
  for (int round = 0; round < 2; round++)
    for (int q = 0; q < nRanks; q++) CHECK(ncclSignal(q, 0, 0, 0, comm, NULL) == ncclSuccess, 156);
  ncclWaitSignalDesc_t all[8];
  for (int q = 0; q < nRanks; q++) all[q].opCnt = 2, all[q].peer = q, all[q].sigIdx = 0, all[q].ctx = 0;
  CHECK(ncclWaitSignal(nRanks, all, comm, NULL) == ncclSuccess, 157);
  /* Refusals: NCCL's (signal index, context, flags, opCnt), a put past the peer's part, a source outside a
   * symmetric window, a peer out of range, a heap window (every rank fails alike), a dead window. */
  CHECK(ncclSignal(next, 1, 0, 0, comm, NULL) == ncclInvalidArgument, 158);
  CHECK(ncclSignal(next, 0, 1, 0, comm, NULL) == ncclInvalidArgument, 158);
  CHECK(ncclSignal(nRanks, 0, 0, 0, comm, NULL) == ncclInvalidArgument, 158);
  ncclWaitSignalDesc_t zero = {0, prev, 0, 0};
  CHECK(ncclWaitSignal(1, &zero, comm, NULL) == ncclInvalidArgument, 159);
  CHECK(ncclPutSignal(src, part, ncclInt32, next, win, bytes, 0, 0, 0, comm, NULL) == ncclInvalidArgument, 160);
  CHECK(strstr(ncclGetLastError(comm), "offset") != NULL, 160);
  int heapSrc[4] = {0};
  CHECK(ncclPutSignal(heapSrc, 4, ncclInt32, next, win, 0, 0, 0, 0, comm, NULL) == ncclInvalidArgument, 161);
  CHECK(strstr(ncclGetLastError(comm), "NCCL_WIN_COLL_SYMMETRIC") != NULL, 161);
  int* heap = malloc(4096);
  ncclWindow_t hw = (ncclWindow_t)1;
  CHECK(ncclCommWindowRegister(comm, heap, 4096, &hw, 0) == ncclInvalidArgument && hw == NULL, 162);
  CHECK(strstr(ncclGetLastError(comm), "ncclMemAlloc") != NULL, 162);
  free(heap);
  CHECK(ncclCommWindowRegister(comm, wbuf, bytes, &hw, 0x10) == ncclInvalidArgument, 163);
  /* The communicator still works after the refusals. */
  CHECK(sumOver(comm, 1) == nRanks, 164);
  /* A rank that ends before it signals: the waiting rank fails at once, naming it. */
  if (nRanks >= 2) {
    if (myRank == nRanks - 1) _exit(0);
    if (myRank == 0) {
      ncclWaitSignalDesc_t gone = {1, nRanks - 1, 0, 0};
      CHECK(ncclWaitSignal(1, &gone, comm, NULL) == ncclRemoteError, 165);
      CHECK(strstr(ncclGetLastError(comm), "ended") != NULL, 165);
    }
    CHECK(ncclCommAbort(comm) == ncclSuccess, 166);
    return 0;
  }
  CHECK(ncclCommWindowDeregister(comm, win) == ncclSuccess, 167);
  CHECK(ncclCommWindowDeregister(comm, win) == ncclInvalidArgument, 168);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, 169);
  CHECK(ncclMemFree(wbuf) == ncclSuccess, 169);
  return 0;
}

/* ncclCommInitRankScalable with the ids of three roots (every rank the same ids), and the refusals. */
static int featureScalable(ncclUniqueId id) {
  (void)id;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blockingMode;
  ncclComm_t comm = NULL;
  ncclResult_t rc = ncclCommInitRankScalable(&comm, nRanks, myRank, nJobIds, jobIds, &cfg);
  CHECK(rc == ncclSuccess || (!blockingMode && rc == ncclInProgress), 170);
  CHECK(comm != NULL && settle(comm, rc) == ncclSuccess, 171);
  CHECK(sumOver(comm, myRank) == (long long)nRanks * (nRanks - 1) / 2, 172);
  ncclComm_t none = NULL;
  CHECK(ncclCommInitRankScalable(&none, nRanks, myRank, 0, jobIds, &cfg) == ncclInvalidArgument, 173);
  CHECK(ncclCommInitRankScalable(&none, nRanks, myRank, 2, NULL, &cfg) == ncclInvalidArgument, 173);
  CHECK(ncclCommDestroy(comm) == ncclSuccess, 174);
  return 0;
}

static int runRank(const char* feature, ncclUniqueId id) {
  if (!strcmp(feature, "init")) return featureInit(id);
  if (!strcmp(feature, "split")) return featureSplit(id);
  if (!strcmp(feature, "shrink")) return featureShrink(id);
  if (!strcmp(feature, "premulsum")) return featurePreMulSum(id);
  if (!strcmp(feature, "abort")) return featureAbort(id);
  if (!strcmp(feature, "manage")) return featureManage(id);
  if (!strcmp(feature, "grow")) return featureGrow(id);
  if (!strcmp(feature, "simulate")) return featureSimulate(id);
  if (!strcmp(feature, "register")) return featureRegister(id);
  if (!strcmp(feature, "signal")) return featureSignal(id);
  if (!strcmp(feature, "scalable")) return featureScalable(id);
  fprintf(stderr, "unknown feature %s (init split shrink premulsum abort manage grow simulate register signal scalable)\n",
          feature);
  return 2;
}

/* One job of `n` forked ranks; 0 when all of them passed. */
static int ranksOfJob(const char* feature, int n, int blocking) {
  int (*pipes)[2] = calloc((size_t)n, sizeof *pipes);
  pid_t* kids = calloc((size_t)n, sizeof *kids);
  if (pipe(growPipe) != 0) return 1;
  for (int r = 0; r < n; r++) {
    if (pipe(pipes[r]) != 0) return 1;
    fflush(stdout);
    fflush(stderr);
    kids[r] = fork();
    if (kids[r] == 0) {
      nJobIds = strcmp(feature, "scalable") ? 1 : 3;
      if (read(pipes[r][0], jobIds, sizeof jobIds[0] * nJobIds) != (ssize_t)(sizeof jobIds[0] * nJobIds)) _exit(3);
      ncclUniqueId id = jobIds[0];
      nRanks = n;
      myRank = r;
      blockingMode = blocking;
      _exit(runRank(feature, id));
    }
  }
  nJobIds = strcmp(feature, "scalable") ? 1 : 3;
  for (int k = 0; k < nJobIds; k++)
    if (ncclGetUniqueId(&jobIds[k]) != ncclSuccess) return 1;
  const ssize_t idBytes = (ssize_t)(sizeof jobIds[0] * nJobIds);
  for (int r = 0; r < n; r++)
    if (write(pipes[r][1], jobIds, (size_t)idBytes) != idBytes) return 1;
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int status = 0;
    waitpid(kids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "%s, %d ranks, blocking=%d: rank %d exit %d\n", feature, n, blocking, r,
              WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
      bad = 1;
    }
    close(pipes[r][0]);
    close(pipes[r][1]);
  }
  free(pipes);
  free(kids);
  close(growPipe[0]);
  close(growPipe[1]);
  return bad;
}

/* Each job in a process of its own, so that no job's ranks inherit another's root (ncclGetUniqueId's thread). */
static int job(const char* feature, int n, int blocking) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) _exit(ranksOfJob(feature, n, blocking));
  int status = 0;
  waitpid(pid, &status, 0);
  return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FEATURE [NRANKS...]   (init split shrink premulsum abort manage grow simulate)\n", argv[0]);
    return 2;
  }
  int sizes[16] = {1, 2, 3, 4, 8}, nSizes = 5;
  if (argc > 2) {
    nSizes = 0;
    for (int i = 2; i < argc && nSizes < 16; i++) sizes[nSizes++] = atoi(argv[i]);
  }
  int failed = 0;
  for (int i = 0; i < nSizes; i++)
    for (int blocking = 1; blocking >= 0; blocking--) {
      int bad = job(argv[1], sizes[i], blocking);
      printf("%-10s %d ranks %-12s %s\n", argv[1], sizes[i], blocking ? "blocking" : "non-blocking",
             bad ? "FAILED" : "ok");
      failed |= bad;
    }
  return failed;
}
