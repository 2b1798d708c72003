// NCCL's binary and double binary trees over nodes (src/graph/trees.cc).
#pragma once

namespace topocoll::search {

/// ncclGetBtree: parent and children of `rank` in NCCL's binary tree over nranks (-1 when absent);
/// *parentChildType is 0 when `rank` is its parent's first child, 1 when its second.
void getBtree(int nranks, int rank, int* up, int* down0, int* down1, int* parentChildType);
/// ncclGetDtree: the two trees of the double binary tree (the second is the first shifted by one for odd nranks,
/// mirrored for even nranks).
void getDtree(int nranks, int rank, int* s0, int* d0_0, int* d0_1, int* parentChildType0, int* s1, int* d1_0,
              int* d1_1, int* parentChildType1);

}  // namespace topocoll::search
