#include <gtest/gtest.h>

#include <set>

#include "topocoll/search/trees.h"

namespace topocoll::search {
namespace {

struct T {
  int u, d0, d1;
};

// Seed 003 prints the first tree of NCCL's double binary tree for 12 and 13 ranks. Its program is an older NCCL
// that stores rank 0's only child in d0; NCCL 2.30.7 stores it in d1 (the child is above rank 0). Apart from that
// slot the first tree is identical.
TEST(Trees, FirstTreeMatchesSeed003For13Ranks) {
  const T seed[13] = {{-1, 8, -1}, {2, -1, -1}, {4, 1, 3},  {2, -1, -1}, {8, 2, 6},  {6, -1, -1}, {4, 5, 7},
                      {6, -1, -1}, {0, 4, 12},  {10, -1, -1}, {12, 9, 11}, {10, -1, -1}, {8, 10, -1}};
  for (int r = 0; r < 13; ++r) {
    int u, d0, d1, t = 0;
    getBtree(13, r, &u, &d0, &d1, &t);
    EXPECT_EQ(u, seed[r].u) << r;
    if (r == 0) {
      EXPECT_EQ(d0, -1);
      EXPECT_EQ(d1, seed[0].d0);
    } else {
      EXPECT_EQ(d0, seed[r].d0) << r;
      EXPECT_EQ(d1, seed[r].d1) << r;
    }
  }
}

TEST(Trees, FirstTreeMatchesSeed003For12Ranks) {
  const T seed[12] = {{-1, 8, -1}, {2, -1, -1}, {4, 1, 3},  {2, -1, -1}, {8, 2, 6},   {6, -1, -1},
                      {4, 5, 7},   {6, -1, -1}, {0, 4, 10}, {10, -1, -1}, {8, 9, 11}, {10, -1, -1}};
  for (int r = 1; r < 12; ++r) {
    int u, d0, d1, t = 0;
    getBtree(12, r, &u, &d0, &d1, &t);
    EXPECT_EQ(u, seed[r].u) << r;
    EXPECT_EQ(d0, seed[r].d0) << r;
    EXPECT_EQ(d1, seed[r].d1) << r;
  }
}

// The corrected diagrams of seed 003: odd counts shift the second tree by one rank, even counts mirror it.
TEST(Trees, SecondTreeShiftsForOddAndMirrorsForEven) {
  int s0, a, b, t0 = 0, s1, c, d, t1 = 0;
  // 13 ranks: the second tree is the first shifted by +1, so its root is 1 with child 9.
  getDtree(13, 1, &s0, &a, &b, &t0, &s1, &c, &d, &t1);
  EXPECT_EQ(s1, -1);
  EXPECT_EQ(d, 9);
  getDtree(13, 9, &s0, &a, &b, &t0, &s1, &c, &d, &t1);
  EXPECT_EQ(s1, 1);
  EXPECT_EQ(c, 5);
  EXPECT_EQ(d, 0);
  // 12 ranks: mirrored, the root is 11 (mirror of 0) with child 3 (mirror of 8).
  getDtree(12, 11, &s0, &a, &b, &t0, &s1, &c, &d, &t1);
  EXPECT_EQ(s1, -1);
  EXPECT_EQ(d, 3);
  getDtree(12, 3, &s0, &a, &b, &t0, &s1, &c, &d, &t1);
  EXPECT_EQ(s1, 11);
  EXPECT_EQ(c, 7);
  EXPECT_EQ(d, 1);
}

class DtreeProperty : public ::testing::TestWithParam<int> {};

// Each tree spans every rank, every rank has at most two children, and (for n > 2) no rank is an interior node
// of both trees: the two trees share the load.
TEST_P(DtreeProperty, TwoSpanningTreesWithDisjointInteriors) {
  int n = GetParam();
  for (int tree = 0; tree < 2; ++tree) {
    std::vector<int> parent(n), children(n, 0);
    int roots = 0;
    for (int r = 0; r < n; ++r) {
      int s0, a, b, t0 = 0, s1, c, d, t1 = 0;
      getDtree(n, r, &s0, &a, &b, &t0, &s1, &c, &d, &t1);
      parent[r] = tree == 0 ? s0 : s1;
      children[r] = tree == 0 ? (a >= 0) + (b >= 0) : (c >= 0) + (d >= 0);
      EXPECT_LE(children[r], 2);
      if (parent[r] < 0) ++roots;
    }
    EXPECT_EQ(roots, 1);
    for (int r = 0; r < n; ++r) {  // every rank reaches the root without cycles
      int x = r, steps = 0;
      while (parent[x] >= 0 && steps <= n) {
        x = parent[x];
        ++steps;
      }
      EXPECT_LE(steps, n);
    }
  }
  if (n > 2 && n % 2 == 0) {
    for (int r = 0; r < n; ++r) {
      int s0, a, b, t0 = 0, s1, c, d, t1 = 0;
      getDtree(n, r, &s0, &a, &b, &t0, &s1, &c, &d, &t1);
      bool interior0 = a >= 0 || b >= 0, interior1 = c >= 0 || d >= 0;
      EXPECT_FALSE(interior0 && interior1 && s0 >= 0 && s1 >= 0) << "rank " << r << " of " << n;
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Sizes, DtreeProperty, ::testing::Values(1, 2, 3, 4, 5, 8, 11, 12, 13, 16, 64, 127, 1024));

}  // namespace
}  // namespace topocoll::search
