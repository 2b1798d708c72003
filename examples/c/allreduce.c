/* topocoll's C API: N processes (forked here; under a launcher use tcclCommInitFromEnv) sum a vector.
 *   cc allreduce.c $(pkg-config --cflags --libs topocoll) -o allreduce && ./allreduce 2 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <topocoll/topocoll.h>

#define CHECK(call)                                                                                 \
  do {                                                                                              \
    tcclResult_t r_ = (call);                                                                       \
    if (r_ != tcclSuccess) {                                                                        \
      fprintf(stderr, "%s failed: %s: %s\n", #call, tcclGetErrorString(r_), tcclGetLastError(NULL)); \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)

static int runRank(tcclUniqueId id, int nranks, int rank) {
  enum { kCount = 1 << 20 };
  float* in = malloc(kCount * sizeof(float));
  float* out = malloc(kCount * sizeof(float));
  for (int i = 0; i < kCount; ++i) in[i] = (float)(rank + 1);
  tcclComm_t comm;
  CHECK(tcclCommInitRank(&comm, nranks, id, rank));
  CHECK(tcclAllReduce(in, out, kCount, tcclFloat32, tcclSum, comm, NULL));
  const float want = nranks * (nranks + 1) / 2.0f;
  int wrong = 0;
  for (int i = 0; i < kCount; ++i) wrong += out[i] != want;
  CHECK(tcclCommDestroy(comm));
  printf("rank %d of %d: AllReduce of %d floats: every element %s %.0f\n", rank, nranks, kCount,
         wrong ? "is NOT" : "is", want);
  free(in);
  free(out);
  fflush(stdout); /* the forked ranks leave by _exit */
  return wrong ? 1 : 0;
}

int main(int argc, char** argv) {
  const int nranks = argc > 1 ? atoi(argv[1]) : 2;
  if (nranks < 1) {
    fprintf(stderr, "usage: %s [NRANKS]\n", argv[0]);
    return 2;
  }
  int version;
  CHECK(tcclGetVersion(&version));
  printf("topocoll %d, %d ranks\n", version, nranks);
  fflush(stdout);
  /* Ranks 1.. are forked first and get the id through a pipe, as an MPI program broadcasts it (forking after
   * tcclGetUniqueId would copy the root's thread's locks in whatever state they are). */
  int pipes[2];
  if (pipe(pipes) != 0) return 1;
  for (int r = 1; r < nranks; ++r)
    if (fork() == 0) {
      tcclUniqueId id;
      if (read(pipes[0], &id, sizeof id) != (ssize_t)sizeof id) _exit(1);
      _exit(runRank(id, nranks, r));
    }
  tcclUniqueId id; /* the root lives in this process, rank 0 */
  CHECK(tcclGetUniqueId(&id));
  for (int r = 1; r < nranks; ++r)
    if (write(pipes[1], &id, sizeof id) != (ssize_t)sizeof id) return 1;
  int failed = runRank(id, nranks, 0);
  for (int status, r = 1; r < nranks; ++r)
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  return failed;
}
