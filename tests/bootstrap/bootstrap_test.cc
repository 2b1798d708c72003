#include "topocoll/bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dirent.h>

#include <cstring>
#include <thread>

#include "bootstrap/socket.h"
#include "topocoll/status.h"

namespace topocoll::bootstrap {
namespace {

using namespace std::chrono_literals;

// Runs fn(bootstrap) on every rank, each in its own thread; rethrows the first failure.
void runRanks(const UniqueId& id, int n, const std::function<void(Bootstrap&)>& fn, Options opts = {}) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto bs = TcpBootstrap::connect(id, r, n, opts);
        fn(*bs);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

void runTcp(int n, const std::function<void(Bootstrap&)>& fn, Options opts = {}) {
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  runRanks(id, n, fn, opts);
}

void exercise(Bootstrap& bs) {
  int n = bs.nRanks(), me = bs.rank();
  std::vector<int64_t> v(n, -1);
  v[me] = 1000 + me;
  bs.allGather(v.data(), sizeof(int64_t));
  for (int r = 0; r < n; ++r) EXPECT_EQ(v[r], 1000 + r);
  // Tagged messages to the next rank, received in reverse tag order (exercises the unexpected queue).
  int next = (me + 1) % n, prev = (me - 1 + n) % n;
  for (int tag = 0; tag < 3; ++tag) {
    int x = me * 10 + tag;
    bs.send(next, tag, &x, sizeof(x));
  }
  for (int tag = 2; tag >= 0; --tag) {
    int x = -1;
    bs.recv(prev, tag, &x, sizeof(x));
    EXPECT_EQ(x, prev * 10 + tag);
  }
  bs.barrier();
  int64_t b = me == n - 1 ? 42 : 0;
  bs.broadcast(n - 1, &b, sizeof(b));
  EXPECT_EQ(b, 42);
}

class BootstrapSizes : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapSizes, InMemoryGroupAgrees) {
  int n = GetParam();
  auto group = makeInMemoryGroup(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { exercise(*group[r]); });
  for (auto& t : threads) t.join();
}

TEST_P(BootstrapSizes, TcpRanksAgree) { runTcp(GetParam(), exercise); }

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapSizes, ::testing::Values(1, 2, 3, 8, 11));

TEST(Bootstrap, Ipv6Loopback) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) GTEST_SKIP() << "no IPv6";
  close(fd);
  RootHandle root;
  UniqueId id;
  try {
    id = createUniqueId(&root, "[::1]:0");
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  runRanks(id, 3, exercise);
}

TEST(Bootstrap, LargeAllGatherDoesNotDeadlock) {
  runTcp(4, [](Bootstrap& bs) {
    const size_t slice = 1 << 20;
    std::vector<uint8_t> buf(slice * bs.nRanks());
    std::memset(buf.data() + slice * bs.rank(), bs.rank() + 1, slice);
    bs.allGather(buf.data(), slice);
    for (int r = 0; r < bs.nRanks(); ++r) EXPECT_EQ(buf[slice * r + slice / 2], r + 1);
  });
}

TEST(Bootstrap, MissingRankIsNamedWithinTheTimeout) {
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  Options opts;
  opts.timeout = 1500ms;
  std::vector<std::string> errors(2);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 of 3 never starts
    threads.emplace_back([&, r] {
      try {
        TcpBootstrap::connect(id, r, 3, opts);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 5s);
  for (auto& e : errors) EXPECT_NE(e.find("rank(s) 2 of 3 never registered"), std::string::npos) << e;
}

int openFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

TEST(Bootstrap, FailedInitLeaksNothingAndCanBeRetriedWithANewId) {
  int before = openFds();
  {
    RootHandle root;
    UniqueId id = createUniqueId(&root, "127.0.0.1:0");
    Options opts;
    opts.timeout = 300ms;
    EXPECT_THROW(TcpBootstrap::connect(id, 0, 2, opts), Error);  // rank 1 never comes
  }
  EXPECT_EQ(openFds(), before);  // root thread joined, every socket closed
  runTcp(2, exercise);           // a new id works
}

TEST(Bootstrap, StrangersWithGarbageOrWrongMagicAreDropped) {
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  // A stranger writes garbage to the root before the ranks arrive.
  sockaddr_in rootAddr{};
  std::memcpy(&rootAddr.sin_port, id.bytes.data() + 8 + 2, 2);
  rootAddr.sin_family = AF_INET;
  rootAddr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&rootAddr), sizeof(rootAddr)), 0);
  const char junk[64] = "GET / HTTP/1.0\r\n\r\n not a topocoll registration at all.....";
  ASSERT_GT(write(fd, junk, sizeof(junk)), 0);
  close(fd);
  runRanks(id, 2, exercise);
}

TEST(Bootstrap, AbortFlagStopsAWaitingRank) {
  std::atomic<bool> abort{false};
  Options opts;
  opts.abortFlag = &abort;
  auto group = makeInMemoryGroup(2, opts);
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    abort = true;
  });
  int x;
  try {
    group[0]->recv(1, 7, &x, sizeof(x));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kAborted);
  }
  t.join();
}

TEST(Bootstrap, SizeMismatchAndBadRanksAreErrors) {
  auto group = makeInMemoryGroup(2);
  int x = 1;
  group[0]->send(1, 3, &x, sizeof(x));
  int64_t y;
  EXPECT_THROW(group[1]->recv(0, 3, &y, sizeof(y)), Error);
  EXPECT_THROW(group[0]->send(5, 0, &x, sizeof(x)), Error);
  UniqueId id{};
  EXPECT_THROW(TcpBootstrap::connect(id, 3, 2), Error);
}

TEST(Interfaces, NcclSocketIfnameSyntax) {
  EXPECT_TRUE(matchInterface("eth0", "eth"));
  EXPECT_TRUE(matchInterface("ens1f0", "eth,ens"));
  EXPECT_FALSE(matchInterface("lo", "eth,ens"));
  EXPECT_TRUE(matchInterface("lo", "^docker,eth"));
  EXPECT_FALSE(matchInterface("docker0", "^docker,eth"));
  EXPECT_TRUE(matchInterface("eth0", "=eth0"));
  EXPECT_FALSE(matchInterface("eth01", "=eth0"));
  EXPECT_FALSE(matchInterface("eth0", "^=eth0"));
  Address lo = chooseAddress("lo");
  EXPECT_NE(lo.toString().find("127.0.0.1"), std::string::npos);
  EXPECT_THROW(chooseAddress("nosuchif"), Error);
  EXPECT_THROW(chooseAddress("", "AF_UNIX"), Error);
  runTcp(2, exercise, [] {
    Options o;
    o.socketIfname = "lo";
    return o;
  }());
}

}  // namespace
}  // namespace topocoll::bootstrap
