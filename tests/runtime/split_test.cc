// Communicators made from a communicator: split (colours, keys, no colour) and shrink (excluded ranks that are
// gone), on threads over an in-memory parent; the new communicators are real (TCP bootstrap, their own roots).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <numeric>
#include <vector>

#include "ranks.h"
#include "topocoll/runtime/communicator.h"

namespace topocoll::testing {
namespace {

using runtime::Communicator;

void configure(int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; }

// AllReduce of each rank's `value` over `c`: the sum every rank gets.
int64_t sumOf(Communicator& c, int64_t value) {
  int64_t out = 0;
  c.allReduce(&value, &out, 1, DataType::kInt64, RedOp::kSum);
  return out;
}

TEST(Split, ColoursAndKeysOrderTheNewRanks) {
  constexpr int n = 6;
  std::vector<int> newRank(n, -1), newSize(n, -1);
  std::vector<int64_t> sums(n, -1);
  auto errors = runRanks(n, configure, [&](Communicator& c, int r) {
    // Two colours (rank parity); keys reverse the order within each.
    auto child = c.split(r % 2, n - r);
    ASSERT_NE(child, nullptr);
    newRank[r] = child->rank();
    newSize[r] = child->nRanks();
    sums[r] = sumOf(*child, r);
    // The parent goes on working beside its child.
    EXPECT_EQ(sumOf(c, 1), n);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(newSize[r], 3) << r;
    EXPECT_EQ(newRank[r], (n - 1 - r) / 2) << r;  // the highest parent rank has the lowest key
    EXPECT_EQ(sums[r], r % 2 ? 1 + 3 + 5 : 0 + 2 + 4) << r;
  }
}

TEST(Split, EqualKeysKeepTheParentsOrderAndNoColorGetsNull) {
  constexpr int n = 4;
  std::vector<int> newRank(n, -2);
  auto errors = runRanks(n, configure, [&](Communicator& c, int r) {
    auto child = c.split(r == 1 ? Communicator::kNoColor : 7, 0);
    if (r == 1) {
      EXPECT_EQ(child, nullptr);
      return;
    }
    ASSERT_NE(child, nullptr);
    newRank[r] = child->rank();
    EXPECT_EQ(child->nRanks(), 3);
    EXPECT_EQ(sumOf(*child, 10), 30);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(newRank[0], 0);
  EXPECT_EQ(newRank[2], 1);
  EXPECT_EQ(newRank[3], 2);
}

TEST(Split, ChildOutlivesItsParentAndSplitsAgain) {
  constexpr int n = 4;
  std::vector<int64_t> sums(n, -1);
  auto group = bootstrap::makeInMemoryGroup(n);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        runtime::InitOptions o;
        o.cfg.hostId = "one-host";
        auto parent = Communicator::initWithBootstrap(std::move(group[r]), o);
        EXPECT_EQ(sumOf(*parent, r), 6);
        auto child = parent->split(0, r);
        parent.reset();
        auto grandchild = child->split(r < 2 ? 0 : 1, 0);
        sums[r] = sumOf(*grandchild, r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(sums, (std::vector<int64_t>{1, 1, 5, 5}));
}

TEST(Split, AColorBelowNoColorFailsOnEveryRank) {
  constexpr int n = 3;
  std::vector<StatusCode> codes(n, StatusCode::kOk);
  auto errors = runRanks(n, configure, [&](Communicator& c, int r) {
    try {
      c.split(r == 2 ? -5 : 0, 0);
    } catch (const Error& e) {
      codes[r] = e.code();
      throw;
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(codes[r], StatusCode::kInvalidArgument) << errors[r];
    EXPECT_NE(errors[r].find("rank 2 gave color -5"), std::string::npos) << errors[r];
  }
}

TEST(Grow, TheRanksKeepTheirRanksAndNewOnesJoin) {
  constexpr int n = 2, grown = 3;
  bootstrap::RootHandle root;
  const bootstrap::UniqueId id = bootstrap::createUniqueId(&root);
  std::vector<int64_t> sums(grown, -1);
  std::thread newcomer([&] {
    runtime::InitOptions o;
    o.cfg.hostId = "one-host";
    auto c = Communicator::init(id, grown, 2, o);
    sums[2] = sumOf(*c, 2);
  });
  auto errors = runRanks(n, configure, [&](Communicator& c, int r) {
    auto g = c.grow(grown, r == 1 ? &id : nullptr);
    EXPECT_EQ(g->rank(), r);
    EXPECT_EQ(g->nRanks(), grown);
    sums[r] = sumOf(*g, r);
  });
  newcomer.join();
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(sums, (std::vector<int64_t>{3, 3, 3}));
}

TEST(Grow, NoRankOrTwoRanksWithTheIdFailOnEveryRank) {
  bootstrap::RootHandle root;
  const bootstrap::UniqueId id = bootstrap::createUniqueId(&root);
  for (bool both : {false, true}) {
    auto errors = runRanks(2, configure, [&](Communicator& c, int) {
      try {
        c.grow(3, both ? &id : nullptr);
        ADD_FAILURE() << "grew";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), StatusCode::kInvalidUsage);
        EXPECT_NE(std::string(e.what()).find(both ? "both give a unique id" : "no existing rank gives"),
                  std::string::npos)
            << e.what();
      }
    });
    EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  }
}

TEST(Shrink, TheRanksThatStayMakeACommunicator) {
  constexpr int n = 5;
  std::vector<int> newRank(n, -1);
  std::vector<int64_t> sums(n, -1);
  auto errors = runRanks(n, configure, [&](Communicator& c, int r) {
    EXPECT_EQ(sumOf(c, 1), n);
    if (r == 1 || r == 3) return;  // excluded: they do not call shrink (and leave)
    auto child = c.shrink({3, 1});
    newRank[r] = child->rank();
    EXPECT_EQ(child->nRanks(), 3);
    sums[r] = sumOf(*child, r);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(newRank, (std::vector<int>{0, -1, 1, -1, 2}));
  for (int r : {0, 2, 4}) EXPECT_EQ(sums[r], 0 + 2 + 4);
}

TEST(Shrink, AfterARankAbortedTheSurvivorsGoOn) {
  constexpr int n = 4;
  std::vector<int64_t> sums(n, -1);
  std::atomic<int> failed{0}, summed{0};
  auto errors = runRanks(n, configure, [&](Communicator& c, int r) {
    EXPECT_EQ(sumOf(c, 1), n);
    ++summed;
    if (r == 2) {
      // Only once every rank has its sum: a slow rank (under TSan) still in that AllReduce would fail with the job.
      while (summed.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      c.bootstrap().abort("rank 2 leaves");  // the job fails: the others learn it
      return;
    }
    auto child = c.shrink({2}, /*abortFirst=*/true);
    EXPECT_TRUE(c.aborted());
    sums[r] = sumOf(*child, r);
    ++failed;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(failed.load(), 3);
  for (int r : {0, 1, 3}) EXPECT_EQ(sums[r], 4);
}

TEST(Shrink, BadExcludeListsNameTheArgument) {
  auto errors = runRanks(2, configure, [&](Communicator& c, int r) {
    auto expectFails = [&](const std::vector<int>& ex, const char* words) {
      try {
        c.shrink(ex);
        ADD_FAILURE() << "no error for " << words;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    };
    expectFails({r}, "this rank is in the excluded ranks");
    expectFails({0, 1}, "this rank is in the excluded ranks");  // every rank
    expectFails({5}, "out of range");
    expectFails({1 - r, 1 - r}, "excluded twice");
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
}

}  // namespace
}  // namespace topocoll::testing

namespace topocoll::testing {
namespace {

// ncclConfig_t's minCTAs / maxCTAs (NCCL_MIN_CTAS / NCCL_MAX_CTAS) bound the channels, as NCCL's connect stage does.
TEST(ChannelBounds, MaxCtasCapsAndMinCtasCopiesTheChannels) {
  for (auto bounds : {std::pair{-1, 1}, std::pair{4, -1}}) {
    const int minCtas = bounds.first, maxCtas = bounds.second;
    std::vector<int> channels(2, -1);
    auto errors = runRanks(2, [&](int, runtime::InitOptions& o) {
      o.cfg.hostId = "one-host";
      o.cfg.minCtas = minCtas;
      o.cfg.maxCtas = maxCtas;
    }, [&](runtime::Communicator& c, int r) { channels[r] = c.connect().nChannels; });
    EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
    for (int n : channels) {
      if (maxCtas > 0) {
        EXPECT_EQ(n, maxCtas);
      }
      if (minCtas > 0) {
        EXPECT_GE(n, minCtas);
      }
    }
  }
}

}  // namespace
}  // namespace topocoll::testing
