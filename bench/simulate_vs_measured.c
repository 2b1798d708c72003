/* ncclGroupSimulateEnd's estimate against the measured time of the same call, through NCCL's API on topocoll
 * (docs/nccl-api.md, "Simulation"). Forked ranks on this machine; for each collective and size, rank 0 prints the
 * cost model's estimate, the measured mean (the slowest rank's, over -n back-to-back calls after a warm-up) and
 * their ratio.
 *
 *   build/bench/simulate_vs_measured [-np N] [-n ITERS] [-l 8,65536,1048576,16777216]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                            \
  do {                                                                                         \
    ncclResult_t rc_ = (call);                                                                 \
    if (rc_ != ncclSuccess) {                                                                  \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, ncclGetErrorString(rc_), ncclGetLastError(NULL)); \
      _exit(1);                                                                                \
    }                                                                                          \
  } while (0)

enum { kAllReduce, kAllGather, kBroadcast, kNumColls };
static const char* kNames[] = {"AllReduce", "AllGather", "Broadcast"};

static void call(int coll, float* in, float* out, size_t count, int n, ncclComm_t comm) {
  switch (coll) {
    case kAllReduce: CHECK(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, NULL)); break;
    case kAllGather: CHECK(ncclAllGather(in, out, count / n, ncclFloat32, comm, NULL)); break;
    default: CHECK(ncclBroadcast(in, out, count, ncclFloat32, 0, comm, NULL)); break;
  }
}

static int rank(ncclUniqueId id, int me, int n, int iters, const size_t* bytes, int nSizes) {
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, me));
  size_t most = 0;
  for (int i = 0; i < nSizes; i++) most = bytes[i] > most ? bytes[i] : most;
  float *in = NULL, *out = NULL;
  CHECK(ncclMemAlloc((void**)&in, most + 64));
  CHECK(ncclMemAlloc((void**)&out, most + 64));
  double t, slowest;
  if (me == 0) printf("%-10s %12s %14s %14s %8s\n", "coll", "bytes", "estimate_us", "measured_us", "ratio");
  for (int c = 0; c < kNumColls; c++)
    for (int i = 0; i < nSizes; i++) {
      size_t count = bytes[i] / sizeof(float);
      count -= count % (size_t)n;  /* AllGather splits it */
      if (count == 0) count = (size_t)n;
      ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
      CHECK(ncclGroupStart());
      call(c, in, out, count, n, comm);
      CHECK(ncclGroupSimulateEnd(&sim));
      for (int w = 0; w < 3; w++) call(c, in, out, count, n, comm);
      t = now();
      for (int k = 0; k < iters; k++) call(c, in, out, count, n, comm);
      t = (now() - t) / iters * 1e6;
      CHECK(ncclAllReduce(&t, &slowest, 1, ncclFloat64, ncclMax, comm, NULL));
      if (me == 0)
        printf("%-10s %12zu %14.2f %14.2f %8.2f\n", kNames[c], count * sizeof(float), sim.estimatedTime, slowest,
               sim.estimatedTime > 0 ? slowest / sim.estimatedTime : 0.0);
    }
  fflush(stdout);
  CHECK(ncclMemFree(in));
  CHECK(ncclMemFree(out));
  CHECK(ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char** argv) {
  int n = 2, iters = 50, nSizes = 4;
  size_t bytes[32] = {8, 65536, 1048576, 16777216};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-np")) n = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-l")) {
      nSizes = 0;
      for (char* tok = strtok(argv[i + 1], ","); tok && nSizes < 32; tok = strtok(NULL, ",")) bytes[nSizes++] = strtoull(tok, NULL, 0);
    } else {
      fprintf(stderr, "usage: %s [-np N] [-n ITERS] [-l SIZES]\n", argv[0]);
      return 2;
    }
  }
  if (n < 1 || iters < 1 || nSizes < 1) {
    fprintf(stderr, "-np, -n and -l need positive values\n");
    return 2;
  }
  int pipes[64][2];
  pid_t kids[64];
  if (n > 64) n = 64;
  for (int r = 0; r < n; r++) {
    if (pipe(pipes[r]) != 0) return 1;
    fflush(stdout);
    kids[r] = fork();
    if (kids[r] == 0) {
      ncclUniqueId id;
      if (read(pipes[r][0], &id, sizeof id) != (ssize_t)sizeof id) _exit(1);
      _exit(rank(id, r, n, iters, bytes, nSizes));
    }
  }
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  for (int r = 0; r < n; r++)
    if (write(pipes[r][1], &id, sizeof id) != (ssize_t)sizeof id) return 1;
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    waitpid(kids[r], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return bad;
}
