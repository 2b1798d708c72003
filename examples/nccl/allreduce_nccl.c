/* A program written for NCCL's API, built against topocoll's nccl.h and run on libtopocoll_nccl.so (or built
 * against NVIDIA's nccl.h and run with LD_LIBRARY_PATH=<prefix>/lib/topocoll/nccl, the drop-in libnccl.so.2).
 * N forked ranks sum a vector of ints on host memory (stream NULL).
 *   cc allreduce_nccl.c $(pkg-config --cflags --libs topocoll-nccl) -o allreduce_nccl && ./allreduce_nccl 2 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nccl.h>

#define NCCLCHECK(call)                                                                                     \
  do {                                                                                                      \
    ncclResult_t r_ = (call);                                                                               \
    if (r_ != ncclSuccess) {                                                                                \
      fprintf(stderr, "%s failed: %s: %s\n", #call, ncclGetErrorString(r_), ncclGetLastError(NULL));        \
      exit(1);                                                                                              \
    }                                                                                                       \
  } while (0)

static int runRank(ncclUniqueId id, int nranks, int rank) {
  enum { kCount = 1 << 18 };
  int* buf = malloc(kCount * sizeof(int));
  for (int i = 0; i < kCount; ++i) buf[i] = rank + i % 7;
  ncclComm_t comm;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  NCCLCHECK(ncclAllReduce(buf, buf, kCount, ncclInt32, ncclSum, comm, NULL)); /* in place */
  int wrong = 0;
  for (int i = 0; i < kCount; ++i) wrong += buf[i] != nranks * (nranks - 1) / 2 + nranks * (i % 7);
  NCCLCHECK(ncclCommDestroy(comm));
  printf("rank %d of %d: ncclAllReduce in place: %s\n", rank, nranks, wrong ? "WRONG" : "correct");
  free(buf);
  fflush(stdout); /* the forked ranks leave by _exit */
  return wrong ? 1 : 0;
}

int main(int argc, char** argv) {
  const int nranks = argc > 1 ? atoi(argv[1]) : 2;
  int version;
  NCCLCHECK(ncclGetVersion(&version));
  printf("NCCL API version %d (topocoll)\n", version);
  fflush(stdout);
  /* Ranks 1.. are forked first and get the id through a pipe, as an MPI program broadcasts it (forking after
   * ncclGetUniqueId would copy the root's thread's locks in whatever state they are). */
  int pipes[2];
  if (pipe(pipes) != 0) return 1;
  for (int r = 1; r < nranks; ++r)
    if (fork() == 0) {
      ncclUniqueId id;
      if (read(pipes[0], &id, sizeof id) != (ssize_t)sizeof id) _exit(1);
      _exit(runRank(id, nranks, r));
    }
  ncclUniqueId id; /* the root lives in this process, rank 0 */
  NCCLCHECK(ncclGetUniqueId(&id));
  for (int r = 1; r < nranks; ++r)
    if (write(pipes[1], &id, sizeof id) != (ssize_t)sizeof id) return 1;
  int failed = runRank(id, nranks, 0);
  for (int status, r = 1; r < nranks; ++r)
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  return failed;
}
