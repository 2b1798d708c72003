// Registered buffers, windows and one-sided signals (NCCL's ncclCommRegister, ncclCommWindowRegister, ncclPutSignal,
// ncclSignal, ncclWaitSignal) on ranks that are threads of one process; tests/runtime/nccl_features.c runs them
// between processes through NCCL's API.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "ranks.h"
#include "topocoll/runtime/communicator.h"

namespace topocoll::testing {
namespace {

using runtime::Communicator;

void oneHost(int, runtime::InitOptions& o) { o.cfg.hostId = "one-host"; }

StatusCode codeOf(const std::function<void()>& f, std::string* why = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (why) *why = e.what();
    return e.code();
  }
  return StatusCode::kOk;
}

TEST(Registration, RecordsRangesAndRefusesOverlapsAndUnmappedMemory) {
  auto errors = runRanks(1, oneHost, [](Communicator& c, int) {
    std::vector<char> heap(1 << 16);
    void* shared = runtime::memAlloc(1 << 20);
    void* a = c.registerBuffer(heap.data(), heap.size());
    void* b = c.registerBuffer(shared, 1 << 20);
    EXPECT_NE(a, b);
    EXPECT_EQ(c.registeredBytes(), heap.size() + (1 << 20));
    std::string why;
    EXPECT_EQ(codeOf([&] { c.registerBuffer(heap.data() + 100, 10); }, &why), StatusCode::kInvalidArgument);
    EXPECT_NE(why.find("overlaps"), std::string::npos) << why;
    EXPECT_EQ(codeOf([&] { c.registerBuffer(heap.data() - 10, 20); }), StatusCode::kInvalidArgument);
    EXPECT_EQ(codeOf([&] { c.registerBuffer(reinterpret_cast<void*>(4096), 4096); }, &why),
              StatusCode::kInvalidArgument);
    EXPECT_NE(why.find("not mapped"), std::string::npos) << why;
    EXPECT_EQ(codeOf([&] { c.registerBuffer(nullptr, 8); }), StatusCode::kInvalidArgument);
    EXPECT_EQ(codeOf([&] { c.registerBuffer(heap.data(), 0); }), StatusCode::kInvalidArgument);
    c.deregisterBuffer(a);
    EXPECT_EQ(codeOf([&] { c.deregisterBuffer(a); }), StatusCode::kInvalidArgument);
    void* again = c.registerBuffer(heap.data() + 100, 10);  // the range is free again
    c.deregisterBuffer(again);
    c.deregisterBuffer(b);
    EXPECT_EQ(c.registeredBytes(), 0u);
    runtime::memFree(shared, 0);
  });
  EXPECT_EQ(errors[0], "");
}

// Each rank puts a stamped block into the next rank's window and signals it; the next rank waits, then reads.
TEST(Windows, PutsAndSignalsReachThePeers) {
  constexpr int kRanks = 3;
  constexpr size_t kPart = 4096;  // ints per rank
  auto errors = runRanks(kRanks, oneHost, [](Communicator& c, int r) {
    const size_t bytes = 2 * kRanks * kPart * sizeof(int);
    int* buf = static_cast<int*>(runtime::memAlloc(bytes));
    runtime::Window* w = c.registerWindow(buf, bytes, Communicator::kWinSymmetric);
    EXPECT_EQ(c.windowUserPtr(w), buf);
    const int next = (r + 1) % kRanks, prev = (r + kRanks - 1) % kRanks;
    for (int round = 0; round < 20; ++round) {
      int* src = buf + kRanks * kPart;
      for (size_t i = 0; i < kPart; ++i) src[i] = round * 1000000 + r * 10000 + static_cast<int>(i % 10000);
      c.putSignal(src, kPart * sizeof(int), next, w, r * kPart * sizeof(int));
      c.waitSignals({{prev, 1}});
      for (size_t i = 0; i < kPart; i += 97)
        ASSERT_EQ(buf[prev * kPart + i], round * 1000000 + prev * 10000 + static_cast<int>(i % 10000));
      // Nobody writes this rank's slot of prev again before prev knows it was read.
      c.signal(prev);
      c.waitSignals({{next, 1}});
    }
    // Signals from everyone (itself included), taken by one wait.
    for (int q = 0; q < kRanks; ++q) c.signal(q);
    std::vector<Communicator::SignalWait> all;
    for (int q = 0; q < kRanks; ++q) all.push_back({q, 1});
    c.waitSignals(all);
    std::string why;
    EXPECT_EQ(codeOf([&] { c.putSignal(buf, 8, next, w, bytes - 4); }, &why), StatusCode::kInvalidArgument);
    EXPECT_NE(why.find("offset"), std::string::npos) << why;
    int local[2] = {};
    EXPECT_EQ(codeOf([&] { c.putSignal(local, 8, next, w, 0); }, &why), StatusCode::kInvalidArgument);
    EXPECT_NE(why.find("NCCL_WIN_COLL_SYMMETRIC"), std::string::npos) << why;
    EXPECT_EQ(codeOf([&] { c.signal(kRanks); }), StatusCode::kInvalidArgument);
    EXPECT_EQ(codeOf([&] { c.waitSignals({{prev, 0}}); }), StatusCode::kInvalidArgument);
    c.barrier();
    c.deregisterWindow(w);
    EXPECT_EQ(codeOf([&] { c.windowUserPtr(w); }), StatusCode::kInvalidArgument);
    runtime::memFree(buf, 0);
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Windows, OneRanksBadBufferFailsEveryRank) {
  std::vector<StatusCode> codes(2);
  std::vector<std::string> whys(2);
  auto errors = runRanks(2, oneHost, [&](Communicator& c, int r) {
    std::vector<char> heap(8192);
    void* shared = runtime::memAlloc(8192);
    codes[r] = codeOf([&] { c.registerWindow(r == 1 ? heap.data() : shared, 8192, 0); }, &whys[r]);
    // The communicator goes on, and signals before any window are refused.
    EXPECT_EQ(codeOf([&] { c.signal(0); }), StatusCode::kInvalidUsage);
    c.barrier();
    runtime::memFree(shared, 0);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(codes[1], StatusCode::kInvalidArgument);
  EXPECT_EQ(codes[0], StatusCode::kInvalidUsage);
  EXPECT_NE(whys[0].find("rank 1's arguments"), std::string::npos) << whys[0];
  EXPECT_NE(whys[1].find("ncclMemAlloc"), std::string::npos) << whys[1];
}

TEST(Windows, AWaitEndsAtTheTimeoutOrAnAbort) {
  auto errors = runRanks(
      2, [](int r, runtime::InitOptions& o) { oneHost(r, o), o.cfg.timeoutSec = 1; },
      [](Communicator& c, int r) {
        void* buf = runtime::memAlloc(4096);
        runtime::Window* w = c.registerWindow(buf, 4096, Communicator::kWinSymmetric);
        (void)w;
        if (r == 0) {
          std::string why;
          const auto t0 = std::chrono::steady_clock::now();
          EXPECT_EQ(codeOf([&] { c.waitSignals({{1, 1}}); }, &why), StatusCode::kTimeout);
          EXPECT_NE(why.find("rank 1 sent 0 of the 1 signals"), std::string::npos) << why;
          EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
          std::thread watchdog([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            c.abort();
          });
          EXPECT_EQ(codeOf([&] { c.waitSignals({{1, 1}}); }), StatusCode::kAborted);
          watchdog.join();
        }
        runtime::memFree(buf, 0);
      });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace topocoll::testing
