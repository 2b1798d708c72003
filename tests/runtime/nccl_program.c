/* A program written against NCCL's API (nccl.h), unchanged except that its buffers are host memory and its stream
 * is NULL (and ncclMemAlloc gives host memory): built with topocoll's nccl.h and linked with libtopocoll_nccl.so. Three ranks (forked processes) run
 * AllReduce, Broadcast, AllGather, ReduceScatter and a grouped Send/Recv ring, and check every element. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define NRANKS 3
#define COUNT 1000

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    ncclResult_t rc_ = (call);                                                                        \
    if (rc_ != ncclSuccess) {                                                                         \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call, ncclGetErrorString(rc_),         \
              ncclGetLastError(NULL));                                                                \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)

static int run(int rank, ncclUniqueId id) {
  ncclComm_t comm;
  int n = 0, me = -1;
  float *in = malloc(sizeof(float) * COUNT * NRANKS), *out = NULL;
  int bad = 0;
  CHECK(ncclCommInitRank(&comm, NRANKS, id, rank));
  CHECK(ncclMemAlloc((void**)&out, sizeof(float) * COUNT * NRANKS)); /* host memory here, device memory in NCCL */
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &me));
  if (n != NRANKS || me != rank) bad++;
  for (int i = 0; i < COUNT * NRANKS; i++) in[i] = (float)(rank + 1) * (float)(i % 5 + 1);

  CHECK(ncclAllReduce(in, out, COUNT, ncclFloat, ncclSum, comm, NULL));
  for (int i = 0; i < COUNT; i++) bad += out[i] != 6.0f * (float)(i % 5 + 1);

  CHECK(ncclBroadcast(in, out, COUNT, ncclFloat, 2, comm, NULL));
  for (int i = 0; i < COUNT; i++) bad += out[i] != 3.0f * (float)(i % 5 + 1);

  CHECK(ncclAllGather(in, out, COUNT, ncclFloat, comm, NULL));
  for (int r = 0; r < NRANKS; r++)
    for (int i = 0; i < COUNT; i++) bad += out[r * COUNT + i] != (float)(r + 1) * (float)(i % 5 + 1);

  CHECK(ncclReduceScatter(in, out, COUNT, ncclFloat, ncclMax, comm, NULL));
  for (int i = 0; i < COUNT; i++) bad += out[i] != 3.0f * (float)((rank * COUNT + i) % 5 + 1);

  /* ring exchange: send to the next rank, receive from the previous one, in a group */
  CHECK(ncclGroupStart());
  CHECK(ncclRecv(out, COUNT, ncclFloat, (rank + NRANKS - 1) % NRANKS, comm, NULL));
  CHECK(ncclSend(in, COUNT, ncclFloat, (rank + 1) % NRANKS, comm, NULL));
  CHECK(ncclGroupEnd());
  int prev = (rank + NRANKS - 1) % NRANKS;
  for (int i = 0; i < COUNT; i++) bad += out[i] != (float)(prev + 1) * (float)(i % 5 + 1);

  CHECK(ncclCommDestroy(comm));
  free(in);
  CHECK(ncclMemFree(out));
  printf("rank %d: %s\n", rank, bad ? "WRONG" : "OK");
  return bad ? 1 : 0;
}

int main(void) {
  int version = 0, rank = -1;
  int pipes[NRANKS][2];
  CHECK(ncclGetVersion(&version));
  if (version < NCCL_VERSION(2, 19, 0)) {
    fprintf(stderr, "NCCL %d is too old\n", version);
    return 1;
  }
  /* As MPI programs do: rank 0 creates the id and sends it to the others (here through pipes). */
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
