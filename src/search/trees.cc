// NCCL's binary and double binary trees. Follows NCCL 2.30.7 src/graph/trees.cc (Apache-2.0); seed 003 draws them.
#include "topocoll/search/trees.h"

namespace topocoll::search {

void getBtree(int nranks, int rank, int* u, int* d0, int* d1, int* parentChildType) {
  int bit;
  for (bit = 1; bit < nranks; bit <<= 1)
    if (bit & rank) break;
  if (rank == 0) {
    *u = -1;
    *d0 = -1;
    // A child of rank 0 is above it, so it is child 1.
    *d1 = nranks > 1 ? bit >> 1 : -1;
    return;
  }
  int up = (rank ^ bit) | (bit << 1);
  if (up >= nranks) up = rank ^ bit;
  *parentChildType = rank < up ? 0 : 1;
  *u = up;
  int lowbit = bit >> 1;
  int down0 = lowbit == 0 ? -1 : rank - lowbit;
  int down1 = lowbit == 0 ? -1 : rank + lowbit;
  while (down1 >= nranks) {
    down1 = lowbit == 0 ? -1 : rank + lowbit;
    lowbit >>= 1;
  }
  *d0 = down0;
  *d1 = down1;
}

void getDtree(int nranks, int rank, int* s0, int* d0_0, int* d0_1, int* parentChildType0, int* s1, int* d1_0,
              int* d1_1, int* parentChildType1) {
  getBtree(nranks, rank, s0, d0_0, d0_1, parentChildType0);
  int u, d0, d1;
  if (nranks % 2 == 1) {
    int shiftrank = (rank - 1 + nranks) % nranks;
    getBtree(nranks, shiftrank, &u, &d0, &d1, parentChildType1);
    *s1 = u == -1 ? -1 : (u + 1) % nranks;
    *d1_0 = d0 == -1 ? -1 : (d0 + 1) % nranks;
    *d1_1 = d1 == -1 ? -1 : (d1 + 1) % nranks;
  } else {
    getBtree(nranks, nranks - 1 - rank, &u, &d0, &d1, parentChildType1);
    *s1 = u == -1 ? -1 : nranks - 1 - u;
    *d1_0 = d0 == -1 ? -1 : nranks - 1 - d0;
    *d1_1 = d1 == -1 ? -1 : nranks - 1 - d1;
  }
}

}  // namespace topocoll::search
