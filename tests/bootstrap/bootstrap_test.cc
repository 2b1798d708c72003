#include "topocoll/bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <cstring>
#include <thread>

#include "bootstrap/stream.h"
#include "bootstrap/wire.h"
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

// A raw TCP connection to the root of `id` (a stranger, or a fake rank).
int connectToRoot(const UniqueId& id) {
  WireAddr w;
  std::memcpy(&w, id.bytes.data() + 8, sizeof(w));
  SocketAddress a;
  EXPECT_TRUE(SocketAddress::fromWire(w, &a));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.len), 0);
  return fd;
}

// A fake rank: a connection to the root of `id` that proved it holds the job's secret.
Socket authenticatedToRoot(const UniqueId& id) {
  WireAddr w;
  std::memcpy(&w, id.bytes.data() + 8, sizeof(w));
  SocketAddress a;
  EXPECT_TRUE(SocketAddress::fromWire(w, &a));
  const auto until = std::chrono::steady_clock::now() + 5s;
  Socket s = Socket::connect(a, until, Interrupt{}, "a fake rank reaching the root");
  authenticate(s, keyOf(id), until, Interrupt{}, "a fake rank reaching the root");
  return s;
}

uint64_t magicOf(const UniqueId& id) {
  uint64_t m;
  std::memcpy(&m, id.bytes.data(), 8);
  return m;
}

// Each rank's error ("" when it succeeded), every rank in its own thread; `nOf(r)` is the job size rank r was
// started with and `rankOf(i)` the rank thread i registers as.
std::vector<std::string> tryRanks(const UniqueId& id, int threads, const std::function<int(int)>& rankOf,
                                  const std::function<int(int)>& nOf, Options opts,
                                  const std::function<void(Bootstrap&)>& fn = exercise) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(threads);
  for (int i = 0; i < threads; ++i) {
    ts.emplace_back([&, i] {
      try {
        auto bs = TcpBootstrap::connect(id, rankOf(i), nOf(i), opts);
        fn(*bs);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  return errors;
}

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(Bootstrap, StrangersWithGarbageOrWrongMagicAreDropped) {
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  int fd = connectToRoot(id);  // garbage before the ranks arrive
  const char junk[64] = "GET / HTTP/1.0\r\n\r\n not a topocoll registration at all.....";
  ASSERT_GT(write(fd, junk, sizeof(junk)), 0);
  close(fd);
  runRanks(id, 2, exercise);
}

TEST(Bootstrap, AnIdleConnectionDoesNotDelayTheJob) {
  // The root reads every connection at once: a connection that sends nothing (held open longer than the ranks'
  // timeout) costs nothing. Before, the root waited 10 s for it and a 2 s timeout failed the job.
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  int idle = connectToRoot(id);
  int half = connectToRoot(id);  // half a header, then silence
  ASSERT_EQ(write(half, "\x01\x02\x03", 3), 3);
  Options opts;
  opts.timeout = 2s;
  auto start = std::chrono::steady_clock::now();
  runRanks(id, 3, exercise, opts);
  EXPECT_LT(secondsSince(start), 1.5);  // a fraction of the per-connection 10 s
  close(idle);
  close(half);
}

TEST(Bootstrap, GarbageAfterAValidHeaderIsDropped) {
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  // A fake rank that holds the secret: the job's magic and a registration header, then a body that is no
  // registration (no address, job size -7).
  Socket fake = authenticatedToRoot(id);
  Header h{magicOf(id), 1, kTagRegister, sizeof(Registration)};
  std::vector<uint8_t> garbage(sizeof(Registration), 0xff);
  ASSERT_EQ(write(fake.fd(), &h, sizeof(h)), static_cast<ssize_t>(sizeof(h)));
  ASSERT_EQ(write(fake.fd(), garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  // And a header that claims 1 GiB.
  Socket big = authenticatedToRoot(id);
  Header hb{magicOf(id), 0, kTagRegister, 1ull << 30};
  ASSERT_EQ(write(big.fd(), &hb, sizeof(hb)), static_cast<ssize_t>(sizeof(hb)));
  Options opts;
  opts.timeout = 5s;
  runRanks(id, 3, exercise, opts);
}

// A stranger who knows everything public about a job (the root's address and the magic, which environment-launched
// jobs derive from public facts) but not its secret cannot register as a missing rank, nor get a ring neighbour's
// data: the root refuses its proof, it is told so at once, and the job completes with its own ranks. The stranger
// is another user of the host (nobody, where the test runs as root), forked before the job's root thread starts (a
// fork after a thread has started can hang the child) and handed the forged id through a pipe.
TEST(Bootstrap, AStrangerWithoutTheSecretCannotJoin) {
  int toChild[2], fromChild[2];
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(pipe(fromChild), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(toChild[1]);
    close(fromChild[0]);
    std::string said = "(no id came)";
    UniqueId forged;
    if (read(toChild[0], forged.bytes.data(), forged.bytes.size()) == static_cast<ssize_t>(forged.bytes.size())) {
      if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) {
        said = "(could not become nobody)";
      } else {
        try {
          Options o;
          o.timeout = 10s;
          TcpBootstrap::connect(forged, 1, 2, o);
          said = "(the stranger joined)";
        } catch (const Error& e) {
          said = e.what();
        }
      }
    }
    ssize_t w = write(fromChild[1], said.data(), said.size());
    _exit(w > 0 ? 0 : 1);
  }
  close(toChild[0]);
  close(fromChild[1]);
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  UniqueId forged = id;
  forged.bytes[40] ^= 0x5a;  // the secret (bytes 32-63) differs; the magic and the address are the job's
  ASSERT_EQ(write(toChild[1], forged.bytes.data(), forged.bytes.size()), static_cast<ssize_t>(forged.bytes.size()));
  close(toChild[1]);
  std::string strangerError;
  char buf[1024];
  for (ssize_t k; (k = read(fromChild[0], buf, sizeof buf)) > 0;) strangerError.append(buf, static_cast<size_t>(k));
  close(fromChild[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_NE(strangerError.find("different job's root"), std::string::npos) << strangerError;
  EXPECT_NE(strangerError.find("refused this side's proof"), std::string::npos) << strangerError;
  // Raw bytes without the exchange (a port scanner, a stranger speaking the old protocol) are dropped too.
  int raw = connectToRoot(id);
  Header h{magicOf(id), 1, kTagRegister, sizeof(Registration)};
  ASSERT_EQ(write(raw, &h, sizeof(h)), static_cast<ssize_t>(sizeof(h)));
  runRanks(id, 2, exercise);
  close(raw);
}

TEST(Bootstrap, ARankRegisteredTwiceIsNamedOnEveryRank) {
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  Options opts;
  opts.timeout = 20s;
  auto start = std::chrono::steady_clock::now();
  // Threads register as ranks 0, 1, 1 of 3: rank 2 never comes, but the duplicate is the fault named at once.
  auto errors = tryRanks(id, 3, [](int i) { return i == 2 ? 1 : i; }, [](int) { return 3; }, opts);
  EXPECT_LT(secondsSince(start), 10);  // long before the timeout
  for (auto& e : errors) EXPECT_NE(e.find("rank 1 registered twice"), std::string::npos) << e;
}

TEST(Bootstrap, AJobSizeMismatchIsNamedOnEveryRank) {
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0", 0, 3);  // the root expects 3 ranks
  Options opts;
  opts.timeout = 20s;
  auto errors = tryRanks(id, 3, [](int i) { return i; }, [](int i) { return i == 2 ? 5 : 3; }, opts);
  for (auto& e : errors)
    EXPECT_NE(e.find("rank 2 was started with WORLD_SIZE=5, the root with 3"), std::string::npos) << e;
  // A root that learns the size from the first rank to register names that rank.
  RootHandle root2;
  UniqueId id2 = createUniqueId(&root2, "127.0.0.1:0");
  auto errors2 = tryRanks(id2, 2, [](int i) { return i; }, [](int i) { return i == 0 ? 4 : 3; }, opts);
  for (auto& e : errors2)
    EXPECT_TRUE(e.find("rank 1 was started with WORLD_SIZE=3, rank 0 with 4") != std::string::npos ||
                e.find("rank 0 was started with WORLD_SIZE=4, rank 1 with 3") != std::string::npos)
        << e;
}

TEST(Bootstrap, TwoJobsOnOneAddress) {
  RootHandle rootA;
  UniqueId a = createUniqueId(&rootA, "127.0.0.1:0");
  WireAddr w;
  std::memcpy(&w, a.bytes.data() + 8, sizeof(w));
  SocketAddress addr;
  ASSERT_TRUE(SocketAddress::fromWire(w, &addr));
  // Job B's root cannot listen there, and says why.
  RootHandle rootB;
  try {
    createUniqueId(&rootB, addr.toString(), 0x1234);
    FAIL() << "a second root listened at " << addr.toString();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in use by another job"), std::string::npos) << e.what();
  }
  // Job B's ranks reach job A's root: refused by the magic, at once; job A completes.
  Options opts;
  opts.timeout = 20s;
  UniqueId b = uniqueIdFor(addr.toString(), 0x1234, AuthKey::random());
  auto start = std::chrono::steady_clock::now();
  auto errorsB = tryRanks(b, 2, [](int i) { return i; }, [](int) { return 2; }, opts);
  EXPECT_LT(secondsSince(start), 10);
  for (auto& e : errorsB) EXPECT_NE(e.find("connected to a different job's root"), std::string::npos) << e;
  runRanks(a, 2, exercise, opts);
}

// Ranks that are up and waiting in an allGather; `victim` leaves (its bootstrap is destroyed, which closes its
// sockets as a killed process would) or aborts. Returns the survivors' errors.
std::vector<std::string> failDuringAllGather(int n, int victim, bool viaAbort) {
  RootHandle root;
  UniqueId id = createUniqueId(&root, "127.0.0.1:0");
  Options opts;
  opts.timeout = 20s;
  return tryRanks(id, n, [](int i) { return i; }, [n](int) { return n; }, opts, [&](Bootstrap& bs) {
    bs.barrier();
    bs.setPhase("the test's allgather");
    if (bs.rank() == victim) {
      if (viaAbort) bs.abort("its topology file is broken");
      return;  // the bootstrap is destroyed: its connections close
    }
    std::vector<int> v(bs.nRanks());
    bs.allGather(v.data(), sizeof(int));
  });
}

TEST(Bootstrap, ARankThatLeavesIsNamedByEverySurvivor) {
  auto start = std::chrono::steady_clock::now();
  auto errors = failDuringAllGather(5, 2, false);
  EXPECT_LT(secondsSince(start), 10);
  for (int r = 0; r < 5; ++r) {
    if (r == 2) continue;
    EXPECT_NE(errors[r].find("rank 2 died during the test's allgather"), std::string::npos) << r << ": " << errors[r];
  }
}

TEST(Bootstrap, AnAbortIsNamedByEverySurvivor) {
  auto errors = failDuringAllGather(4, 1, true);
  for (int r = 0; r < 4; ++r) {
    if (r == 1) continue;
    EXPECT_NE(errors[r].find("rank 1 failed during the test's allgather: its topology file is broken"),
              std::string::npos)
        << r << ": " << errors[r];
  }
}

TEST(Bootstrap, AnInMemoryAbortReachesEveryWaitingRank) {
  auto group = makeInMemoryGroup(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      group[r]->setPhase("the test's allgather");
      if (r == 1) {
        group[r]->abort("its topology file is broken");
        return;
      }
      std::vector<int> v(3);
      try {
        group[r]->allGather(v.data(), sizeof(int));
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r : {0, 2})
    EXPECT_EQ(errors[r], "rank 1 failed during the test's allgather: its topology file is broken") << r;
}

TEST(Bootstrap, NegativeTagsAreTheBootstrapsOwn) {
  runTcp(2, [](Bootstrap& bs) {
    int x = 0;
    EXPECT_THROW(bs.send((bs.rank() + 1) % 2, -7, &x, sizeof(x)), Error);
    EXPECT_THROW(bs.recv((bs.rank() + 1) % 2, -7, &x, sizeof(x)), Error);
  });
}

TEST(Bootstrap, RootHandleIsMovable) {
  RootHandle a;
  UniqueId id = createUniqueId(&a, "127.0.0.1:0");
  RootHandle b = std::move(a);
  EXPECT_EQ(a.root, nullptr);
  runRanks(id, 2, exercise);  // the moved-to handle keeps the root alive
  static_assert(!std::is_copy_constructible_v<RootHandle>);
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
  SocketAddress lo = chooseAddress("lo");
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
