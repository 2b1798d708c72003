/* A rank of a job that loses a host and goes on without it (tests/runtime/cluster_faults_test.sh), against
 * topocoll's C API (topocoll.h) and a launcher's environment (RANK, WORLD_SIZE, NCCL_COMM_ID):
 *
 *   cluster_shrink DEAD_RANK...
 *
 * It runs AllReduce of 1 MiB in a loop ("looping" once the first one completed, for the test to strike) until a call
 * fails, prints "failed: <error>", then shrinks the communicator without DEAD_RANK... (ncclCommShrink with
 * NCCL_SHRINK_ABORT, as a program that handles the failure of a host would), runs AllReduce on the survivors and
 * checks every element: "shrunk: N ranks, AllReduce OK". Exit status 0 only then. */
#include <stdio.h>
#include <stdlib.h>

#include "topocoll/topocoll.h"

#define COUNT (256 * 1024)

int main(int argc, char** argv) {
  int nDead = argc - 1;
  int* dead = calloc((size_t)(nDead > 0 ? nDead : 1), sizeof(int));
  for (int i = 0; i < nDead; i++) dead[i] = atoi(argv[i + 1]);
  tcclComm_t comm = NULL;
  if (tcclCommInitFromEnv(&comm) != tcclSuccess) {
    printf("init failed: %s\n", tcclGetLastError(NULL));
    return 2;
  }
  int rank = -1, n = 0;
  tcclCommUserRank(comm, &rank);
  tcclCommCount(comm, &n);
  float* buf = malloc(sizeof(float) * COUNT);
  for (long iter = 0;; iter++) {
    for (int i = 0; i < COUNT; i++) buf[i] = 1.0f;
    if (tcclAllReduce(buf, buf, COUNT, tcclFloat32, tcclSum, comm, NULL) != tcclSuccess) {
      printf("failed: %s\n", tcclGetLastError(comm));
      break;
    }
    if (iter == 0) printf("looping: %d ranks\n", n);
    fflush(stdout);
  }
  fflush(stdout);
  tcclComm_t child = NULL;
  if (tcclCommShrink(comm, dead, nDead, &child, TCCL_SHRINK_ABORT) != tcclSuccess || !child) {
    printf("shrink failed: %s\n", tcclGetLastError(comm));
    return 3;
  }
  int m = 0, me = -1;
  tcclCommCount(child, &m);
  tcclCommUserRank(child, &me);
  for (int i = 0; i < COUNT; i++) buf[i] = (float)(me + 1);
  if (tcclAllReduce(buf, buf, COUNT, tcclFloat32, tcclSum, child, NULL) != tcclSuccess) {
    printf("AllReduce on the survivors failed: %s\n", tcclGetLastError(child));
    return 4;
  }
  int bad = 0;
  for (int i = 0; i < COUNT; i++) bad += buf[i] != (float)(m * (m + 1) / 2);
  printf("shrunk: %d ranks (rank %d of them), AllReduce %s\n", m, me, bad ? "WRONG" : "OK");
  tcclCommDestroy(child);
  tcclCommDestroy(comm);
  free(buf);
  free(dead);
  return bad ? 5 : 0;
}
