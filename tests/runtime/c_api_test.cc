// The C API with ranks as threads of one process (tcclCommInitAll): every operation, in and out of place, groups,
// and the errors NCCL's API gives for bad arguments and mismatched calls.
#include "topocoll/topocoll.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace {

// Runs body(rank, comm) on one thread per rank and returns the per-rank results.
std::vector<tcclResult_t> onRanks(std::vector<tcclComm_t>& comms, const std::function<tcclResult_t(int, tcclComm_t)>& body) {
  std::vector<tcclResult_t> rc(comms.size());
  std::vector<std::thread> ts;
  for (size_t r = 0; r < comms.size(); ++r) ts.emplace_back([&, r] { rc[r] = body(static_cast<int>(r), comms[r]); });
  for (auto& t : ts) t.join();
  return rc;
}

class CApi : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    n_ = GetParam();
    comms_.assign(n_, nullptr);
    ASSERT_EQ(tcclCommInitAll(comms_.data(), n_, nullptr), tcclSuccess) << tcclGetLastError(nullptr);
  }
  void TearDown() override {
    for (auto c : comms_) EXPECT_EQ(tcclCommDestroy(c), tcclSuccess);
  }
  void expectAll(const std::vector<tcclResult_t>& rc) {
    for (size_t r = 0; r < rc.size(); ++r) EXPECT_EQ(rc[r], tcclSuccess) << "rank " << r << ": " << tcclGetLastError(comms_[r]);
  }
  int n_ = 0;
  std::vector<tcclComm_t> comms_;
};

TEST_P(CApi, QueriesAndVersion) {
  int v = 0;
  EXPECT_EQ(tcclGetVersion(&v), tcclSuccess);
  EXPECT_EQ(v, TCCL_VERSION_CODE);
  for (int r = 0; r < n_; ++r) {
    int count = 0, rank = -1, dev = 0;
    EXPECT_EQ(tcclCommCount(comms_[r], &count), tcclSuccess);
    EXPECT_EQ(tcclCommUserRank(comms_[r], &rank), tcclSuccess);
    EXPECT_EQ(tcclCommCuDevice(comms_[r], &dev), tcclSuccess);
    EXPECT_EQ(count, n_);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(dev, -1);  // host-memory rank
  }
}

TEST(CApiMemory, MemAllocGivesZeroedBuffersAndMemFreeRefusesStrangers) {
  void* p = nullptr;
  ASSERT_EQ(tcclMemAlloc(&p, 5000), tcclSuccess);
  ASSERT_NE(p, nullptr);
  const auto* b = static_cast<const unsigned char*>(p);
  EXPECT_TRUE(std::all_of(b, b + 5000, [](unsigned char c) { return c == 0; }));
  EXPECT_EQ(tcclMemFree(p), tcclSuccess);
  void* none = &p;
  EXPECT_EQ(tcclMemAlloc(&none, 0), tcclSuccess);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(tcclMemFree(nullptr), tcclSuccess);
  EXPECT_EQ(tcclMemAlloc(nullptr, 10), tcclInvalidArgument);
  int onStack = 0;
  EXPECT_EQ(tcclMemFree(&onStack), tcclInvalidUsage);
  EXPECT_NE(std::string(tcclGetLastError(nullptr)).find("not a pointer memAlloc returned"), std::string::npos)
      << tcclGetLastError(nullptr);
}

TEST_P(CApi, AllReduceSumInAndOutOfPlace) {
  const size_t count = 1000003;  // more than one 8 MiB piece of the engine at 8 bytes
  expectAll(onRanks(comms_, [&](int r, tcclComm_t c) {
    std::vector<double> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = (r + 1) * static_cast<double>(i % 7 + 1);
    tcclResult_t rc = tcclAllReduce(in.data(), out.data(), count, tcclFloat64, tcclSum, c, nullptr);
    if (rc != tcclSuccess) return rc;
    double ranks = n_ * (n_ + 1) / 2.0;
    for (size_t i = 0; i < count; ++i)
      if (out[i] != ranks * (i % 7 + 1)) return tcclInternalError;
    rc = tcclAllReduce(in.data(), in.data(), count, tcclFloat64, tcclMax, c, nullptr);
    for (size_t i = 0; i < count; ++i)
      if (in[i] != n_ * static_cast<double>(i % 7 + 1)) return tcclInternalError;
    return rc;
  }));
}

TEST_P(CApi, BroadcastReduceGatherScatterAlltoAll) {
  const size_t count = 17;
  const int root = n_ - 1;
  expectAll(onRanks(comms_, [&](int r, tcclComm_t c) {
    std::vector<int32_t> in(count * n_), out(count * n_, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int32_t>(r * 1000 + i);
    if (tcclBroadcast(in.data(), out.data(), count, tcclInt32, root, c, nullptr) != tcclSuccess) return tcclInternalError;
    for (size_t i = 0; i < count; ++i)
      if (out[i] != static_cast<int32_t>(root * 1000 + i)) return tcclInvalidUsage;
    std::fill(out.begin(), out.end(), -1);
    if (tcclReduce(in.data(), out.data(), count, tcclInt32, tcclSum, root, c, nullptr) != tcclSuccess) return tcclInternalError;
    if (r == root)
      for (size_t i = 0; i < count; ++i)
        if (out[i] != static_cast<int32_t>(1000 * n_ * (n_ - 1) / 2 + n_ * i)) return tcclInvalidUsage;
    if (tcclAllGather(in.data(), out.data(), count, tcclInt32, c, nullptr) != tcclSuccess) return tcclInternalError;
    for (int q = 0; q < n_; ++q)
      for (size_t i = 0; i < count; ++i)
        if (out[q * count + i] != static_cast<int32_t>(q * 1000 + i)) return tcclInvalidUsage;
    if (tcclAlltoAll(in.data(), out.data(), count, tcclInt32, c, nullptr) != tcclSuccess) return tcclInternalError;
    for (int q = 0; q < n_; ++q)
      for (size_t i = 0; i < count; ++i)
        if (out[q * count + i] != static_cast<int32_t>(q * 1000 + r * count + i)) return tcclInvalidUsage;
    std::vector<int32_t> one(count, -1);
    if (tcclReduceScatter(in.data(), one.data(), count, tcclInt32, tcclSum, c, nullptr) != tcclSuccess) return tcclInternalError;
    for (size_t i = 0; i < count; ++i)
      if (one[i] != static_cast<int32_t>(1000 * n_ * (n_ - 1) / 2 + n_ * (r * count + i))) return tcclInvalidUsage;
    if (tcclScatter(in.data(), one.data(), count, tcclInt32, root, c, nullptr) != tcclSuccess) return tcclInternalError;
    for (size_t i = 0; i < count; ++i)
      if (one[i] != static_cast<int32_t>(root * 1000 + r * count + i)) return tcclInvalidUsage;
    return tcclBarrier(c, nullptr);
  }));
}

TEST_P(CApi, GroupedSendRecvInAnyOrder) {
  const size_t count = 3 << 20;  // 12 MiB of int32 per pair: larger than any socket buffer
  expectAll(onRanks(comms_, [&](int r, tcclComm_t c) {
    std::vector<std::vector<int32_t>> in(n_), out(n_);
    tcclGroupStart();
    for (int q = n_ - 1; q >= 0; --q) {  // receives first, in reverse order: the group must still complete
      out[q].assign(count, -1);
      tcclRecv(out[q].data(), count, tcclInt32, q, c, nullptr);
    }
    for (int q = 0; q < n_; ++q) {
      in[q].assign(count, r * 100 + q);
      tcclSend(in[q].data(), count, tcclInt32, q, c, nullptr);
    }
    tcclResult_t rc = tcclGroupEnd();
    for (int q = 0; q < n_ && rc == tcclSuccess; ++q)
      if (out[q][0] != q * 100 + r || out[q][count - 1] != q * 100 + r) rc = tcclInvalidUsage;
    return rc;
  }));
}

// Every rank sends its rank to rank 0, which takes them from any rank and learns each sender (tcclRecvAny).
TEST_P(CApi, ReceivesFromAnyRankNameTheirSender) {
  if (n_ < 2) GTEST_SKIP() << "needs two ranks";
  expectAll(onRanks(comms_, [&](int r, tcclComm_t c) {
    if (r > 0) return tcclSend(&r, 1, tcclInt32, 0, c, nullptr);
    std::vector<int> peers, seen(n_, 0);
    for (int q = 1; q < n_; ++q) peers.push_back(q);
    int x = -1, src = -1;
    EXPECT_EQ(tcclRecvAny(&x, 1, tcclInt32, peers.data(), n_ - 1, nullptr, c), tcclInvalidArgument);
    EXPECT_NE(std::string(tcclGetLastError(c)).find("source is NULL"), std::string::npos) << tcclGetLastError(c);
    EXPECT_EQ(tcclRecvAny(&x, 1, tcclInt32, nullptr, 1, &src, c), tcclInvalidArgument);
    for (int q = 1; q < n_; ++q) {
      tcclResult_t rc = tcclRecvAny(&x, 1, tcclInt32, peers.data(), n_ - 1, &src, c);
      if (rc != tcclSuccess) return rc;
      if (x != src || src < 1 || src >= n_ || seen[src]++) return tcclInternalError;
    }
    return tcclSuccess;
  }));
}

TEST_P(CApi, BadArgumentsGiveNcclsResultCodes) {
  tcclComm_t c = comms_[0];
  int x = 0;
  EXPECT_EQ(tcclAllReduce(nullptr, &x, 1, tcclInt32, tcclSum, c, nullptr), tcclInvalidArgument);
  EXPECT_NE(std::string(tcclGetLastError(c)).find("sendbuff is NULL"), std::string::npos) << tcclGetLastError(c);
  EXPECT_EQ(tcclAllReduce(&x, &x, 1, static_cast<tcclDataType_t>(12), tcclSum, c, nullptr), tcclInvalidArgument);
  EXPECT_EQ(tcclAllReduce(&x, &x, 1, tcclInt32, static_cast<tcclRedOp_t>(9), c, nullptr), tcclInvalidArgument);
  EXPECT_EQ(tcclBroadcast(&x, &x, 1, tcclInt32, n_, c, nullptr), tcclInvalidArgument);
  EXPECT_NE(std::string(tcclGetLastError(c)).find("root " + std::to_string(n_) + " is out of range"), std::string::npos);
  EXPECT_EQ(tcclSend(&x, 1, tcclInt32, -1, c, nullptr), tcclInvalidArgument);
  EXPECT_EQ(tcclAllReduce(&x, &x, SIZE_MAX / 2, tcclInt32, tcclSum, c, nullptr), tcclInvalidArgument);
  int stream = 0;
  EXPECT_EQ(tcclAllReduce(&x, &x, 1, tcclInt32, tcclSum, c, &stream), tcclInvalidUsage);
  EXPECT_EQ(tcclAllReduce(&x, &x, 1, tcclInt32, tcclSum, nullptr, nullptr), tcclInvalidArgument);
  EXPECT_EQ(tcclGroupEnd(), tcclInvalidUsage);
  EXPECT_STREQ(tcclGetErrorString(tcclInvalidUsage), "invalid usage (run with NCCL_DEBUG=WARN for details)");
  // Zero elements with NULL buffers are fine, as in NCCL.
  if (n_ == 1) {
    EXPECT_EQ(tcclAllReduce(nullptr, nullptr, 0, tcclInt32, tcclSum, c, nullptr), tcclSuccess);
  }
}

TEST_P(CApi, MismatchedCallsAreNamedOnEveryRank) {
  if (n_ < 2) GTEST_SKIP() << "needs two ranks";
  auto rc = onRanks(comms_, [&](int r, tcclComm_t c) {
    std::vector<float> buf(r == 0 ? 8 : 16, 1.0f);
    return tcclAllReduce(buf.data(), buf.data(), buf.size(), tcclFloat32, tcclSum, c, nullptr);
  });
  for (int r = 0; r < n_; ++r) {
    EXPECT_EQ(rc[r], tcclInvalidUsage);
    // Found by the transfers (sizes differ): both ranks of each mismatched message are named.
    EXPECT_NE(std::string(tcclGetLastError(comms_[r])).find("size or type mismatch"), std::string::npos)
        << tcclGetLastError(comms_[r]);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CApi, ::testing::Values(1, 2, 3, 4));

// A send to itself whose receive was refused (fuzz_c_api found it waiting forever): it fails within TOPOCOLL_TIMEOUT.
TEST(CApiSelf, UnmatchedSendToItselfTimesOut) {
  setenv("TOPOCOLL_TIMEOUT", "1", 1);
  tcclComm_t c = nullptr;
  ASSERT_EQ(tcclCommInitAll(&c, 1, nullptr), tcclSuccess) << tcclGetLastError(nullptr);
  unsetenv("TOPOCOLL_TIMEOUT");
  std::vector<char> buf(76);
  ASSERT_EQ(tcclGroupStart(), tcclSuccess);
  EXPECT_EQ(tcclSend(buf.data(), buf.size(), tcclInt8, 0, c, nullptr), tcclSuccess);
  EXPECT_EQ(tcclRecv(nullptr, buf.size(), tcclInt8, 0, c, nullptr), tcclInvalidArgument);
  EXPECT_NE(tcclGroupEnd(), tcclSuccess);
  // tcclGroupEnd has no communicator: its error is the thread's.
  EXPECT_NE(std::string(tcclGetLastError(nullptr)).find("TOPOCOLL_TIMEOUT"), std::string::npos) << tcclGetLastError(nullptr);
  EXPECT_EQ(tcclCommDestroy(c), tcclSuccess);
}

}  // namespace

namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// What the process holds: address space, mappings, descriptors, threads, and /dev/shm entries.
struct Holdings {
  long vmKiB = 0, maps = 0, fds = 0, threads = 0, shm = 0;
};
// Entries of `dir` whose names match the extended regex `only` (all when empty).
long countEntries(const char* dir, const char* only = "") {
  std::string cmd = std::string("ls -A ") + dir + " 2>/dev/null" +
                    (*only ? std::string(" | grep -icE '") + only + "'" : std::string(" | wc -l"));
  FILE* f = popen(cmd.c_str(), "r");
  long n = 0;
  if (f) {
    if (std::fscanf(f, "%ld", &n) != 1) n = -1;
    pclose(f);
  }
  return n;
}
Holdings holdings() {
  Holdings h;
  FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  while (f && std::fgets(line, sizeof(line), f)) {
    std::sscanf(line, "VmSize: %ld", &h.vmKiB);
    std::sscanf(line, "Threads: %ld", &h.threads);
  }
  if (f) std::fclose(f);
  f = std::fopen("/proc/self/maps", "r");
  while (f && std::fgets(line, sizeof(line), f))
    if (std::strchr(line, '\n')) ++h.maps;
  if (f) std::fclose(f);
  h.fds = countEntries("/proc/self/fd") - 1;  // the listing's own descriptor
  h.shm = countEntries("/dev/shm", "topocoll|nccl");  // the library's names: other processes make their own
  return h;
}

// One communicator's life through NCCL's calls: a unique id (a root thread), init, a collective, destroy.
void oneCommunicator() {
  tcclUniqueId id;
  ASSERT_EQ(tcclGetUniqueId(&id), tcclSuccess) << tcclGetLastError(nullptr);
  tcclComm_t c = nullptr;
  ASSERT_EQ(tcclCommInitRank(&c, 1, id, 0), tcclSuccess) << tcclGetLastError(nullptr);
  float x = 1;
  ASSERT_EQ(tcclAllReduce(&x, &x, 1, tcclFloat32, tcclSum, c, nullptr), tcclSuccess) << tcclGetLastError(c);
  ASSERT_EQ(tcclCommDestroy(c), tcclSuccess);
}

}  // namespace

// A long-lived service creates and destroys communicators all its life: after a warm-up, 1,000 more leave the
// process's address space, mappings, descriptors, threads and /dev/shm where they were (each unique id's root
// thread is reaped once its job is bootstrapped).
TEST(CApiLeaks, AThousandCommunicatorsLeaveNothingBehind) {
  for (int i = 0; i < 20; ++i) ASSERT_NO_FATAL_FAILURE(oneCommunicator());
  const Holdings before = holdings();
  for (int i = 0; i < 1000; ++i) ASSERT_NO_FATAL_FAILURE(oneCommunicator());
  const Holdings after = holdings();
  // A root whose job just finished may still be running its last loop: at most one thread and its descriptors.
  EXPECT_LE(after.threads, before.threads + 1);
  EXPECT_LE(after.fds, before.fds + 2);
  EXPECT_LE(after.maps, before.maps + 8);
  // A new malloc arena for a thread reserves 64 MiB at once; a thread's stack left behind per communicator would add
  // 8 MiB each (8 GiB here). Sanitizers' allocators keep their own per-thread state: VmSize is only checked without.
  if (!kSanitized) {
    EXPECT_LE(after.vmKiB, before.vmKiB + 256 * 1024) << "VmSize grew from " << before.vmKiB << " to " << after.vmKiB
                                                      << " KiB";
  }
  EXPECT_EQ(after.shm, before.shm);
  std::printf("1000 communicators: VmSize %ld -> %ld KiB, maps %ld -> %ld, fds %ld -> %ld, threads %ld -> %ld\n",
              before.vmKiB, after.vmKiB, before.maps, after.maps, before.fds, after.fds, before.threads, after.threads);
}

namespace {

// Issue 36, item 7: a destroyed handle (used, or destroyed again) and a pointer that is no handle fail with
// tcclInvalidArgument and say which; they do not read freed memory.
TEST(CApiHandles, ADestroyedHandleIsRefusedNotUsed) {
  tcclComm_t c = nullptr;
  ASSERT_EQ(tcclCommInitAll(&c, 1, nullptr), tcclSuccess) << tcclGetLastError(nullptr);
  ASSERT_EQ(tcclCommDestroy(c), tcclSuccess);
  float x = 1;
  EXPECT_EQ(tcclAllReduce(&x, &x, 1, tcclFloat32, tcclSum, c, nullptr), tcclInvalidArgument);
  EXPECT_NE(std::string(tcclGetLastError(c)).find("comm was destroyed"), std::string::npos) << tcclGetLastError(c);
  int n = 0;
  EXPECT_EQ(tcclCommCount(c, &n), tcclInvalidArgument);
  EXPECT_EQ(tcclCommDestroy(c), tcclInvalidArgument);  // twice
  EXPECT_EQ(tcclCommAbort(c), tcclInvalidArgument);
}

TEST(CApiHandles, APointerThatIsNoHandleIsRefused) {
  alignas(64) unsigned char junk[256] = {};
  auto c = reinterpret_cast<tcclComm_t>(junk);
  float x = 1;
  EXPECT_EQ(tcclAllReduce(&x, &x, 1, tcclFloat32, tcclSum, c, nullptr), tcclInvalidArgument);
  EXPECT_NE(std::string(tcclGetLastError(nullptr)).find("not a communicator"), std::string::npos)
      << tcclGetLastError(nullptr);
  EXPECT_EQ(tcclCommDestroy(c), tcclInvalidArgument);
  for (unsigned char b : junk) EXPECT_EQ(b, 0);  // nothing written into it
}

// A watchdog thread aborts a communicator while another thread waits in a call on it (the other rank never calls):
// the call returns an error, abort returns once it left, and the handle is refused from then on.
TEST(CApiHandles, AbortFromAnotherThreadEndsTheWaitingCall) {
  tcclComm_t comms[2] = {};
  ASSERT_EQ(tcclCommInitAll(comms, 2, nullptr), tcclSuccess) << tcclGetLastError(nullptr);
  std::vector<float> buf(1024, 1.0f);
  std::atomic<int> rc{-1};
  std::thread caller([&] { rc = tcclAllReduce(buf.data(), buf.data(), buf.size(), tcclFloat32, tcclSum, comms[0], nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(rc.load(), -1);  // still waiting for rank 1
  EXPECT_EQ(tcclCommAbort(comms[0]), tcclSuccess);
  caller.join();
  EXPECT_NE(rc.load(), tcclSuccess);
  int n = 0;
  EXPECT_EQ(tcclCommCount(comms[0], &n), tcclInvalidArgument);
  EXPECT_EQ(tcclCommAbort(comms[1]), tcclSuccess);
}

// PreMulSum ops: each rank's input times its own scalar, summed; destroyed ops and other datatypes are refused.
TEST(CApiOps, PreMulSumScalesEachRanksInput) {
  tcclComm_t comms[2] = {};
  ASSERT_EQ(tcclCommInitAll(comms, 2, nullptr), tcclSuccess) << tcclGetLastError(nullptr);
  std::vector<std::vector<double>> in = {std::vector<double>(100, 1.0), std::vector<double>(100, 10.0)};
  std::vector<std::vector<double>> out(2, std::vector<double>(100, 0.0));
  double scalars[2] = {3.0, 0.5};
  tcclRedOp_t ops[2];
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(tcclRedOpCreatePreMulSum(&ops[r], &scalars[r], tcclFloat64, tcclScalarHostImmediate, comms[r]),
              tcclSuccess);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      EXPECT_EQ(tcclAllReduce(in[r].data(), out[r].data(), 100, tcclFloat64, ops[r], comms[r], nullptr), tcclSuccess)
          << tcclGetLastError(comms[r]);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(out[r][99], 3.0 * 1.0 + 0.5 * 10.0);
  float f = 0;
  EXPECT_EQ(tcclAllReduce(&f, &f, 1, tcclFloat32, ops[0], comms[0], nullptr), tcclInvalidArgument);
  EXPECT_EQ(tcclRedOpDestroy(ops[0], comms[0]), tcclSuccess);
  EXPECT_EQ(tcclRedOpDestroy(ops[0], comms[0]), tcclInvalidArgument);
  EXPECT_EQ(tcclRedOpDestroy(tcclSum, comms[0]), tcclInvalidArgument);
  for (tcclComm_t c : comms) EXPECT_EQ(tcclCommDestroy(c), tcclSuccess);
}

// count x nranks past the address space: every rank's call fails at once, naming the count (it used to time out).
TEST(CApiArgs, CountTimesRanksOverflowFailsEveryRankAtOnce) {
  tcclComm_t comms[2] = {};
  ASSERT_EQ(tcclCommInitAll(comms, 2, nullptr), tcclSuccess) << tcclGetLastError(nullptr);
  const size_t huge = size_t{1} << 61;  // x 4 bytes fits, x 2 ranks does not
  float x = 0;
  for (tcclComm_t c : comms) {
    EXPECT_EQ(tcclGather(&x, &x, huge, tcclFloat32, 0, c, nullptr), tcclInvalidArgument);
    EXPECT_NE(std::string(tcclGetLastError(c)).find("x 2 ranks overflows"), std::string::npos) << tcclGetLastError(c);
    EXPECT_EQ(tcclScatter(&x, &x, huge, tcclFloat32, 0, c, nullptr), tcclInvalidArgument);
    EXPECT_EQ(tcclAlltoAll(&x, &x, huge, tcclFloat32, c, nullptr), tcclInvalidArgument);
    EXPECT_EQ(tcclAllGather(&x, &x, huge, tcclFloat32, c, nullptr), tcclInvalidArgument);
    EXPECT_EQ(tcclReduceScatter(&x, &x, huge, tcclFloat32, tcclSum, c, nullptr), tcclInvalidArgument);
  }
  for (tcclComm_t c : comms) EXPECT_EQ(tcclCommDestroy(c), tcclSuccess);
}

}  // namespace
