#include "topocoll/runtime/communicator.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <csignal>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "test_util.h"
#include "topocoll/plan.h"
#include "topocoll/status.h"

namespace topocoll::runtime {
namespace {

Env env(std::map<std::string, std::string> m) { return Env(std::move(m)); }

TEST(Launcher, Torchrun) {
  auto li = launchInfoFromEnv(env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"},
                                   {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.size, 8);
  EXPECT_EQ(li.localRank, 1);
  EXPECT_EQ(li.rootAddress, "10.0.0.1:29500");
  EXPECT_EQ(li.launcher, "torchrun");
}

TEST(Launcher, NcclCommIdWins) {
  auto li = launchInfoFromEnv(env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"NCCL_COMM_ID", "192.168.1.2:4000"},
                                   {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(li.rootAddress, "192.168.1.2:4000");
}

TEST(Launcher, MpirunOnOneHostDerivesAPortFromTheJob) {
  std::map<std::string, std::string> m = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                          {"OMPI_MCA_orte_ess_jobid", "12345"}};
  auto a = launchInfoFromEnv(env(m));
  m["OMPI_COMM_WORLD_RANK"] = "2";
  auto b = launchInfoFromEnv(env(m));
  EXPECT_EQ(a.launcher, "mpirun");
  EXPECT_EQ(a.rootAddress, b.rootAddress);
  EXPECT_EQ(a.jobKey, b.jobKey);
  EXPECT_EQ(a.rootAddress.rfind("127.0.0.1:", 0), 0u);
  m["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";  // several hosts: no address can be derived
  try {
    launchInfoFromEnv(env(m));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("NCCL_COMM_ID"), std::string::npos);
  }
}

TEST(Launcher, DerivedPortsAvoidTheEphemeralRange) {
  for (auto range : {std::pair{32768, 60999}, std::pair{10000, 20000}, std::pair{1024, 64000}, std::pair{40000, 65535}}) {
    for (uint64_t h = 0; h < 20000; h += 7) {
      int p = derivedRootPort(h * 0x9e3779b97f4a7c15ULL, range);
      EXPECT_TRUE(p >= 10000 && p <= 65535 && (p < range.first || p > range.second)) << p;
    }
  }
  EXPECT_THROW(derivedRootPort(1, {1024, 65535}), Error);  // nothing left: the user must give an address
  auto [lo, hi] = ephemeralPortRange();  // this machine's, read from /proc
  EXPECT_TRUE(lo > 0 && hi >= lo && hi <= 65535);
}

TEST(Launcher, TwoJobsOnOneAddressHaveDifferentMagicsWhenTheLauncherSaysSo) {
  std::map<std::string, std::string> m = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"NCCL_COMM_ID", "127.0.0.1:4000"}};
  auto plain = launchInfoFromEnv(env(m));
  EXPECT_FALSE(plain.jobIdentified);
  m["TORCHELASTIC_RUN_ID"] = "a";
  auto a = launchInfoFromEnv(env(m));
  m["TORCHELASTIC_RUN_ID"] = "b";
  auto b = launchInfoFromEnv(env(m));
  m["TORCHELASTIC_RESTART_COUNT"] = "1";
  auto bRestarted = launchInfoFromEnv(env(m));
  EXPECT_TRUE(a.jobIdentified);
  EXPECT_NE(a.jobKey, b.jobKey);
  EXPECT_NE(b.jobKey, bRestarted.jobKey);
  EXPECT_NE(plain.jobKey, a.jobKey);
  m.erase("TORCHELASTIC_RUN_ID");
  m["SLURM_JOB_ID"] = "77";
  EXPECT_NE(launchInfoFromEnv(env(m)).jobKey, plain.jobKey);
}

TEST(Launcher, SrunUsesTheFirstHostOfTheNodeList) {
  auto li = launchInfoFromEnv(env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                                   {"SLURM_JOB_NODELIST", "127.0.0.[1-4]"}, {"SLURM_JOB_ID", "777"}}));
  EXPECT_EQ(li.launcher, "srun");
  EXPECT_EQ(li.rootAddress.rfind("127.0.0.1:", 0), 0u);
  EXPECT_EQ(firstSlurmHost("gpu[07-12,20],cpu1"), "gpu07");
  EXPECT_EQ(firstSlurmHost("node3,node4"), "node3");
}

TEST(Launcher, NothingFoundIsInvalidUsage) {
  EXPECT_THROW(launchInfoFromEnv(env({})), Error);
  EXPECT_THROW(launchInfoFromEnv(env({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"NCCL_COMM_ID", "1.2.3.4:5"}})), Error);
  EXPECT_THROW(launchInfoFromEnv(env({{"RANK", "x"}, {"WORLD_SIZE", "4"}})), Error);
}

// The secret of an environment-launched job: the same on every rank from TOPOCOLL_JOB_SECRET or a key file that only
// its user can read; without either, a key anyone who knows the root address and the job ids can compute.
TEST(Launcher, JobSecretFromTheEnvironmentOrAPrivateKeyFile) {
  const Env base = env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"NCCL_COMM_ID", "10.0.0.1:4000"}});
  const LaunchInfo li = launchInfoFromEnv(base);
  auto keyWith = [&](std::map<std::string, std::string> knobs, bool* secret) {
    knobs.insert({"RANK", "0"});
    return jobKeyFromEnv(Config::fromEnv(env(knobs)), li, secret);
  };
  bool secret = true;
  const AuthKey open = keyWith({}, &secret);
  EXPECT_FALSE(secret);
  EXPECT_TRUE(open.sameAs(keyWith({}, &secret)));  // every rank computes it
  const AuthKey a = keyWith({{"TOPOCOLL_JOB_SECRET", "correct horse battery staple"}}, &secret);
  EXPECT_TRUE(secret);
  EXPECT_FALSE(a.sameAs(open));
  EXPECT_TRUE(a.sameAs(keyWith({{"TOPOCOLL_JOB_SECRET", "correct horse battery staple"}}, &secret)));
  EXPECT_FALSE(a.sameAs(keyWith({{"TOPOCOLL_JOB_SECRET", "correct horse battery stapler"}}, &secret)));

  char path[] = "/tmp/topocoll-secret-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = "correct horse battery staple\n";  // a trailing newline is not part of the secret
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  ASSERT_EQ(::chmod(path, 0600), 0);
  EXPECT_TRUE(a.sameAs(keyWith({{"TOPOCOLL_JOB_SECRET_FILE", path}}, &secret)));
  EXPECT_TRUE(secret);
  ASSERT_EQ(::chmod(path, 0644), 0);
  try {
    keyWith({{"TOPOCOLL_JOB_SECRET_FILE", path}}, &secret);
    ADD_FAILURE() << "a key file others can read was used";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("mode 0644 lets other users read it"), std::string::npos) << e.what();
  }
  ::unlink(path);
  EXPECT_THROW(keyWith({{"TOPOCOLL_JOB_SECRET_FILE", path}}, &secret), Error);  // gone
  EXPECT_THROW(keyWith({{"TOPOCOLL_JOB_SECRET", "x"}, {"TOPOCOLL_JOB_SECRET_FILE", "/etc/hostname"}}, &secret), Error);
  // The secret is never printed by the knob listing.
  Config c = Config::fromEnv(env({{"TOPOCOLL_JOB_SECRET", "hunter2"}}));
  for (const auto& k : knobs()) {
    if (k.name == "TOPOCOLL_JOB_SECRET") EXPECT_EQ(k.get(c), "(set)");
  }
}

TEST(InitOptions, TimeoutAndSimulationKnobs) {
  auto o = InitOptions::fromEnv(env({{"TOPOCOLL_TIMEOUT", "2.5"}, {"TOPOCOLL_SIMULATE_GPUS", "1"}}));
  EXPECT_EQ(o.bootstrap.timeout.count(), 2500);
  EXPECT_EQ(o.cfg.simulateGpus, 1);
  EXPECT_THROW(InitOptions::fromEnv(env({{"TOPOCOLL_TIMEOUT", "-1"}})), Error);
  EXPECT_THROW(InitOptions::fromEnv(env({{"TOPOCOLL_SIMULATE_GPUS", "yes"}})), Error);
}

// Ranks as threads over the in-memory bootstrap, each on its own "host" (NCCL_HOSTID).
std::vector<std::unique_ptr<Communicator>> initGroup(int n, int perHost, bool simulate,
                                                     const std::string& topo = "seed-h100-8gpu-8nic-nvswitch.xml") {
  auto group = bootstrap::makeInMemoryGroup(n);
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        InitOptions o;
        o.cfg.hostId = "host" + std::to_string(r / perHost);
        o.cfg.simulateGpus = simulate ? 1 : 0;
        o.cfg.topoFile = testing::topoPath(topo);
        comms[r] = Communicator::initWithBootstrap(std::move(group[r]), o);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return comms;
}

TEST(Communicator, SimulatedGpuRanksAgreeWithThePlanner) {
  auto comms = initGroup(8, 4, true);
  ASSERT_TRUE(comms[0]);
  Plan p = makePlan(topology::loadXmlFile(testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml")), JobSpec{2, 4, {}}, {});
  for (auto& c : comms) {
    ASSERT_TRUE(c);
    EXPECT_EQ(c->nNodes(), 2);
    EXPECT_EQ(c->localRanks(), 4);
    EXPECT_EQ(c->connect().rings, p.connect.rings);
    for (int r = 0; r < 8; ++r)
      for (int ch = 0; ch < p.connect.nChannels; ++ch) {
        EXPECT_EQ(c->connect().trees[r][ch].up, p.connect.trees[r][ch].up);
        EXPECT_EQ(c->connect().trees[r][ch].down, p.connect.trees[r][ch].down);
      }
    EXPECT_EQ(c->model().bandwidths[tuning::kAllReduce][tuning::kRing][tuning::kSimple],
              p.model.bandwidths[tuning::kAllReduce][tuning::kRing][tuning::kSimple]);
  }
  EXPECT_EQ(comms[5]->localRank(), 1);
  EXPECT_EQ(comms[5]->peers()[5].dev, 1);
}

// The plan a communicator executes is the planner's front door's for the same topology and job, byte for byte (rank
// 0's: the system and graphs are its own), and every rank executes the same job-wide part (rings, trees, channels).
TEST(Communicator, ExecutesThePlannersPlanByteForByte) {
  struct Shape {
    const char* topo;
    int ranks, perHost;
  };
  for (const Shape& sh : {Shape{"seed-h100-8gpu-8nic-nvswitch.xml", 8, 4}, Shape{"seed-h100-8gpu-8nic-nvswitch.xml", 3, 3},
                          Shape{"oci-bm-gpu-h100-8-8gpu-16x200g-roce-2numa.xml", 16, 8},
                          Shape{"ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml", 4, 2}}) {
    SCOPED_TRACE(fmt::format("{} ranks, {} a host, {}", sh.ranks, sh.perHost, sh.topo));
    auto comms = initGroup(sh.ranks, sh.perHost, true, sh.topo);
    ASSERT_TRUE(comms[0]);
    const std::string path = testing::topoPath(sh.topo);
    Plan p = makePlan(topology::loadXmlFile(path), JobSpec{sh.ranks / sh.perHost, sh.perHost, {}}, {});
    EXPECT_EQ(planToJson(comms[0]->plan(), topoName(path), 4, false, false),
              planToJson(p, topoName(path), 4, false, false));
    const auto want = nlohmann::json::parse(planToJson(p, "", 4, false, false));
    for (auto& c : comms) {
      ASSERT_TRUE(c);
      const auto mine = nlohmann::json::parse(planToJson(c->plan(), "", 4, false, false));
      for (const char* part : {"connect", "tuning", "selection"})  // the system and graphs are each rank's own
        EXPECT_EQ(mine[part], want[part]) << "rank " << c->rank() << ": " << part;
    }
  }
}


// Issue 36, item 7: a peer that destroyed its communicator while its process lives on is named as such (not "process
// is gone"). Two processes connect (which makes each watch the other's proxy); rank 1 destroys its communicator and
// sleeps; rank 0's next receive from it fails with that reason, well within the timeout.
//
// Both ranks are forked before any thread exists (rank 0 hosts the root and hands the unique id to rank 1 over a
// pipe): a child forked while another thread holds the allocator's lock hangs under the sanitizers. The parent waits
// at most a minute and then kills both.
TEST(CommunicatorProcesses, APeerThatDestroyedItsCommunicatorIsNamedAsSuch) {
  int out[2], idPipe[2];
  ASSERT_EQ(::pipe(out), 0);
  ASSERT_EQ(::pipe(idPipe), 0);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = ::fork();
    if (pids[r] != 0) continue;
    ::close(out[0]);
    int code = 1;
    try {
      bootstrap::RootHandle root;
      bootstrap::UniqueId id;
      if (r == 0) {
        ::close(idPipe[0]);
        id = bootstrap::createUniqueId(&root, "127.0.0.1:0");
        if (::write(idPipe[1], id.bytes.data(), id.bytes.size()) != static_cast<ssize_t>(id.bytes.size()))
          throw std::runtime_error("rank 0 could not hand the unique id over");
        ::close(idPipe[1]);
      } else {
        ::close(idPipe[1]);
        size_t got = 0;
        for (ssize_t k; got < id.bytes.size() && (k = ::read(idPipe[0], id.bytes.data() + got, id.bytes.size() - got)) > 0;)
          got += static_cast<size_t>(k);
        if (got != id.bytes.size()) throw std::runtime_error("rank 1 got no unique id");
      }
      InitOptions o;
      o.cfg.timeoutSec = 20;
      o.cfg.socketIfname = "lo";
      auto comm = Communicator::init(id, 2, r, o);
      int32_t v = r;
      if (r == 0) comm->send(&v, 1, DataType::kInt32, 1), comm->recv(&v, 1, DataType::kInt32, 1);
      else comm->recv(&v, 1, DataType::kInt32, 0), comm->send(&v, 1, DataType::kInt32, 0);
      if (r == 1) {
        comm.reset();
        std::this_thread::sleep_for(std::chrono::seconds(2));
        ::_exit(0);
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        comm->recv(&v, 1, DataType::kInt32, 1);
      } catch (const Error& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::string m = fmt::format("{:.1f} s: {}", s, e.what());
        code = m.find("rank 1 destroyed its communicator") != std::string::npos && s < 10 ? 0 : 2;
        ssize_t w = ::write(out[1], m.data(), m.size());
        (void)w;
      }
    } catch (const std::exception& e) {
      ssize_t w = ::write(out[1], e.what(), std::strlen(e.what()));
      (void)w;
    }
    ::_exit(code);
  }
  ::close(out[1]);
  ::close(idPipe[0]);
  ::close(idPipe[1]);
  std::string said;
  char buf[512];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{out[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) {
      said += " [no answer within 60 s: both ranks killed]";
      ::kill(pids[0], SIGKILL);
      ::kill(pids[1], SIGKILL);
      break;
    }
    const ssize_t k = ::read(out[0], buf, sizeof buf);
    if (k <= 0) break;
    said.append(buf, static_cast<size_t>(k));
  }
  ::close(out[0]);
  int st0 = 0, st1 = 0;
  ::waitpid(pids[0], &st0, 0);
  ::waitpid(pids[1], &st1, 0);
  EXPECT_TRUE(WIFEXITED(st0) && WEXITSTATUS(st0) == 0) << said;
  EXPECT_TRUE(WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
}

TEST(Communicator, HostMemoryRanksGetRingsAndTrees) {
  auto comms = initGroup(5, 2, false);  // hosts of 2, 2 and 1 ranks
  ASSERT_TRUE(comms[0]);
  const auto& c = comms[0]->connect();
  EXPECT_EQ(c.nNodes, 3);
  EXPECT_TRUE(comms[0]->hostMemory());
  ASSERT_FALSE(c.rings.empty());
  for (auto& ring : c.rings) {
    std::vector<int> seen(5, 0);
    for (int r : ring) seen[r]++;
    for (int v : seen) EXPECT_EQ(v, 1);
  }
  for (int ch = 0; ch < c.nChannels; ++ch) {
    int roots = 0;
    for (int r = 0; r < 5; ++r) roots += c.trees[r][ch].up < 0;
    EXPECT_EQ(roots, 1);
  }
}

TEST(Communicator, DuplicateGpuDetected) {
  auto group = bootstrap::makeInMemoryGroup(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        InitOptions o;
        o.cfg.hostId = "same-host";
        o.cfg.simulateGpus = 1;
        o.cfg.simulateGpuDev = 3;  // both ranks on GPU 3
        o.cfg.topoFile = testing::topoPath("seed-h100-8gpu-8nic-nvswitch.xml");
        Communicator::initWithBootstrap(std::move(group[r]), o);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) EXPECT_NE(e.find("Duplicate GPU detected : rank 0 and rank 1"), std::string::npos) << e;
}

}  // namespace
}  // namespace topocoll::runtime
