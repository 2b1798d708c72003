/* A program written against NCCL's API (nccl.h) on device buffers, as NCCL users write it: cudaMalloc'ed buffers, a
 * CUDA stream per rank, ncclCommInitRank in forked processes, every collective on the stream then
 * cudaStreamSynchronize, and a check of every element. It compiles unchanged against NVIDIA's nccl.h and topocoll's
 * (include/topocoll/nccl_compat) and runs on libtopocoll_nccl.so (or on NCCL itself with one GPU per rank).
 * Exit code 77 (skipped) when no GPU is usable. NRANKS ranks share device 0 (TOPOCOLL_ALLOW_SHARED_GPU=1). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef NRANKS
#define NRANKS 4
#endif
#define COUNT 1000003

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    ncclResult_t rc_ = (call);                                                                        \
    if (rc_ != ncclSuccess) {                                                                         \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call, ncclGetErrorString(rc_),         \
              ncclGetLastError(NULL));                                                                \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)
#define CUDACHECK(call)                                                                               \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                          \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, cudaGetErrorString(e_));               \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)

static float value(int r, int i) { return (float)(r + 1) * (float)(i % 5 + 1); }

static int run(int rank, ncclUniqueId id) {
  ncclComm_t comm;
  cudaStream_t s;
  float *in, *out, *h = malloc(sizeof(float) * COUNT * NRANKS);
  int bad = 0, n = 0;
  const char* firstBad = NULL; /* the first check that failed */
#define STAGE(name) \
  if (bad && !firstBad) firstBad = name
  CUDACHECK(cudaSetDevice(0));
  CUDACHECK(cudaStreamCreate(&s));
  CUDACHECK(cudaMalloc((void**)&in, sizeof(float) * COUNT * NRANKS));
  CUDACHECK(cudaMalloc((void**)&out, sizeof(float) * COUNT * NRANKS));
  for (int i = 0; i < COUNT * NRANKS; i++) h[i] = value(rank, i);
  CUDACHECK(cudaMemcpy(in, h, sizeof(float) * COUNT * NRANKS, cudaMemcpyHostToDevice));
  CHECK(ncclCommInitRank(&comm, NRANKS, id, rank));
  CHECK(ncclCommCount(comm, &n));
  if (n != NRANKS) bad++;
  STAGE("ncclCommCount");

  CHECK(ncclAllReduce(in, out, COUNT, ncclFloat, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(h, out, sizeof(float) * COUNT, cudaMemcpyDeviceToHost));
  for (int i = 0; i < COUNT; i++) bad += h[i] != (float)(NRANKS * (NRANKS + 1) / 2) * (float)(i % 5 + 1);
  STAGE("ncclAllReduce sum");

  CHECK(ncclBroadcast(in, out, COUNT, ncclFloat, 1, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(h, out, sizeof(float) * COUNT, cudaMemcpyDeviceToHost));
  for (int i = 0; i < COUNT; i++) bad += h[i] != value(1, i);
  STAGE("ncclBroadcast");

  CHECK(ncclReduce(in, out, COUNT, ncclFloat, ncclMax, 0, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  if (rank == 0) {
    CUDACHECK(cudaMemcpy(h, out, sizeof(float) * COUNT, cudaMemcpyDeviceToHost));
    for (int i = 0; i < COUNT; i++) bad += h[i] != value(NRANKS - 1, i);
  }
  STAGE("ncclReduce max");

  CHECK(ncclAllGather(in, out, COUNT, ncclFloat, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(h, out, sizeof(float) * COUNT * NRANKS, cudaMemcpyDeviceToHost));
  for (int r = 0; r < NRANKS; r++)
    for (int i = 0; i < COUNT; i++) bad += h[r * COUNT + i] != value(r, i);
  STAGE("ncclAllGather");

  CHECK(ncclReduceScatter(in, out, COUNT, ncclFloat, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(h, out, sizeof(float) * COUNT, cudaMemcpyDeviceToHost));
  for (int i = 0; i < COUNT; i++) bad += h[i] != (float)(NRANKS * (NRANKS + 1) / 2) * (float)((rank * COUNT + i) % 5 + 1);
  STAGE("ncclReduceScatter");

  /* in place AllReduce with the average */
  CUDACHECK(cudaMemcpy(out, in, sizeof(float) * COUNT, cudaMemcpyDeviceToDevice));
  CHECK(ncclAllReduce(out, out, COUNT, ncclFloat, ncclAvg, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(h, out, sizeof(float) * COUNT, cudaMemcpyDeviceToHost));
  for (int i = 0; i < COUNT; i++)
    bad += h[i] != (float)(NRANKS * (NRANKS + 1) / 2) * (float)(i % 5 + 1) / (float)NRANKS;
  STAGE("ncclAllReduce avg in place");

  /* a ring of sends and receives on the stream, in a group */
  CHECK(ncclGroupStart());
  CHECK(ncclSend(in, COUNT, ncclFloat, (rank + 1) % NRANKS, comm, s));
  CHECK(ncclRecv(out, COUNT, ncclFloat, (rank + NRANKS - 1) % NRANKS, comm, s));
  CHECK(ncclGroupEnd());
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(h, out, sizeof(float) * COUNT, cudaMemcpyDeviceToHost));
  for (int i = 0; i < COUNT; i++) bad += h[i] != value((rank + NRANKS - 1) % NRANKS, i);
  STAGE("ncclSend/ncclRecv");

  CHECK(ncclCommDestroy(comm));
  CUDACHECK(cudaFree(in));
  CUDACHECK(cudaFree(out));
  CUDACHECK(cudaStreamDestroy(s));
  free(h);
  if (bad)
    printf("rank %d: WRONG (%d elements; first in %s)\n", rank, bad, firstBad);
  else
    printf("rank %d: OK\n", rank);
  return bad ? 1 : 0;
}

int main(void) {
  int rank = -1, pipes[NRANKS][2], probe[2];
  setenv("TOPOCOLL_ALLOW_SHARED_GPU", "1", 0);
  /* Whether a GPU is there, asked in a child: the parent must not touch CUDA before it forks. */
  if (pipe(probe) != 0) return 1;
  if (fork() == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    _exit(count > 0 ? 0 : 77);
  }
  int st = 0;
  wait(&st);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("SKIPPED: no usable GPU\n");
    return 77;
  }
  for (int r = 0; r < NRANKS; r++)
    if (pipe(pipes[r]) != 0) return 1;
  fflush(stdout);
  for (int r = 0; r < NRANKS; r++) {
    if (fork() == 0) {
      ncclUniqueId id;
      rank = r;
      if (r == 0) {
        CHECK(ncclGetUniqueId(&id));
        for (int q = 1; q < NRANKS; q++)
          if (write(pipes[q][1], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(1);
      } else if (read(pipes[r][0], &id, sizeof(id)) != (ssize_t)sizeof(id)) {
        _exit(1);
      }
      int rc = run(r, id);
      fflush(stdout);
      _exit(rc);
    }
  }
  int failed = 0;
  for (int r = 0; r < NRANKS; r++) {
    int status = 0;
    wait(&status);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  printf("%s\n", failed ? "FAILED" : "all ranks OK");
  return failed ? 1 : 0;
}
