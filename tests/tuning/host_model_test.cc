#include "topocoll/tuning/host_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "topocoll/status.h"

namespace topocoll::tuning {
namespace {

Config knobs(std::map<std::string, std::string> env) { return Config::fromEnv(Env(std::move(env))); }

HostQuery query(int coll, uint64_t bytes, int nRanks = 2, HostLink link = HostLink::kP2p) {
  return {coll, link, nRanks, bytes, 128 << 10};
}

// A file under the build directory's temporary folder, removed when the test ends.
struct TempFile {
  std::string path = ::testing::TempDir() + "host_model_test_" + std::to_string(getpid()) + ".json";
  explicit TempFile(const std::string& text) { std::ofstream(path) << text; }
  ~TempFile() { std::remove(path.c_str()); }
};

TEST(HostModel, FitRecoversTheConstants) {
  std::vector<HostSample> pts;
  for (uint64_t bytes : {8ull, 4096ull, 1ull << 20, 16ull << 20}) {
    HostWork w = hostWork(query(kAllReduce, bytes, 4), kRing, 1);
    pts.push_back({w, 1.5 + w.steps * 2.5 + w.bytes / (1e3 * 6.0)});
  }
  HostCost k = fitHostCost(pts);
  EXPECT_NEAR(k.baseUs, 1.5, 1e-3);
  EXPECT_NEAR(k.stepUs, 2.5, 1e-3);
  EXPECT_NEAR(k.gbps, 6.0, 1e-3);
  EXPECT_EQ(fitHostCost({}).gbps, 0);
}

TEST(HostModel, FitKeepsBothTermsNonNegative) {
  // Times that fall with the size would need a negative bandwidth term: the fit keeps the latency term alone.
  std::vector<HostSample> pts;
  for (uint64_t bytes : {8ull, 1ull << 20}) pts.push_back({hostWork(query(kAllGather, bytes), kRing, 1), 10.0});
  HostCost k = fitHostCost(pts);
  EXPECT_GE(k.stepUs, 0);
  EXPECT_GT(k.gbps, 0);
}

TEST(HostModel, WorkFollowsTheAlgorithms) {
  EXPECT_EQ(hostWork(query(kAllReduce, 0), kRing, 1).steps, 0);
  EXPECT_EQ(hostWork(query(kAllReduce, 100, 1), kRing, 1).steps, 0);
  HostWork ring = hostWork(query(kAllReduce, 1 << 20, 4), kRing, 1);
  EXPECT_DOUBLE_EQ(ring.bytes, 1.5 * (1 << 20));
  EXPECT_DOUBLE_EQ(ring.steps, 3 * (2 + 1));  // blocks of 256 KiB: 2 chunks of 128 KiB, then the all-gather's step
  HostWork direct = hostWork(query(kAllReduce, 1 << 20, 4), kHostDirect, 1);
  EXPECT_DOUBLE_EQ(direct.steps, 1);
  EXPECT_DOUBLE_EQ(direct.bytes, 3.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(hostWork(query(kBroadcast, 1 << 20, 4), kRing, 2).steps, 3 + 4 - 1);
}

TEST(HostModel, DefaultsCoverEveryLinkAndCollective) {
  HostModel m = HostModel::defaults();
  for (int l = 0; l < kNumHostLinks; ++l)
    for (int c = 0; c < kNumColls; ++c)
      for (int p : {kLL, kSimple})
        EXPECT_GT(m.at(static_cast<HostLink>(l), c, kRing, p, 1).gbps, 0)
            << hostLinkName(static_cast<HostLink>(l)) << " " << collName(c) << " " << protoName(p);
}

TEST(HostModel, JsonRoundTrip) {
  HostModel m = HostModel::defaults();
  m.set({HostLink::kNet, kAllGather, kRing, kLL, 2, {0.5f, 7.5f, 0.25f}});
  TempFile f(m.toJson("test"));
  HostModel back = HostModel::load(f.path);
  EXPECT_EQ(back.toJson("test"), m.toJson("test"));
  EXPECT_EQ(back.source(), f.path);
  EXPECT_FLOAT_EQ(back.at(HostLink::kNet, kAllGather, kRing, kLL, 2).stepUs, 7.5f);
}

TEST(HostModel, BadFilesNameTheFileAndEntry) {
  auto message = [](const std::string& text) {
    TempFile f(text);
    try {
      HostModel::load(f.path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("not JSON"), std::string::npos);
  EXPECT_NE(message("{}").find("no \"entries\""), std::string::npos);
  std::string bad = message(
      R"({"entries": [{"link": "P2P", "coll": "AllReduce", "algo": "Ring", "proto": "Simple", "nChannels": 1,
          "stepUs": 1, "gbps": 1}, {"link": "PCIe", "coll": "AllReduce", "algo": "Ring", "proto": "Simple",
          "nChannels": 1, "stepUs": 1, "gbps": 1}]})");
  EXPECT_NE(bad.find("entry 1"), std::string::npos) << bad;
  EXPECT_NE(message(R"({"entries": [{"link": "P2P"}]})").find("entry 0"), std::string::npos);
  EXPECT_NE(message(R"({"entries": [{"link": "P2P", "coll": "AllReduce", "algo": "Ring", "proto": "Simple",
                      "nChannels": 3, "stepUs": 1, "gbps": 1}]})")
                .find("nChannels 3"),
            std::string::npos);
  EXPECT_THROW(HostModel::load("/nonexistent/host.json"), Error);
}

// A model where each combination is cheap in a known range, to check what the limits leave.
HostModel toyModel() {
  HostModel m;
  for (int c = 0; c < kNumColls; ++c)
    for (int a = 0; a < kNumHostAlgos; ++a)
      for (int p : {kLL, kSimple})
        for (int ch = 1; ch <= 2; ++ch) {
          // LL: cheap steps, low bandwidth; Direct: one step; 2 channels: more bandwidth, costlier steps.
          float step = (p == kLL ? 1.0f : 3.0f) * (ch == 2 ? 1.5f : 1.0f);
          float bw = (p == kLL ? 1.0f : 4.0f) * (ch == 2 ? 1.6f : 1.0f) * (a == kTree ? 0.5f : 1.0f);
          m.set({HostLink::kP2p, c, a, p, ch, {0, step, bw}});
        }
  return m;
}

TEST(HostModel, SelectPicksTheCheapest) {
  HostModel m = toyModel();
  HostLimits lim = hostLimits(knobs({}), 2, true, 8);
  HostChoice small = hostSelect(m, query(kAllReduce, 64), lim);
  EXPECT_EQ(small.algo, kHostDirect);
  EXPECT_EQ(small.proto, kLL);
  HostChoice big = hostSelect(m, query(kAllReduce, 64 << 20), lim);
  EXPECT_EQ(big.algo, kRing);
  EXPECT_EQ(big.proto, kSimple);
  EXPECT_EQ(big.nChannels, 2);
  // The other collectives run their rings and chains whatever is cheaper for AllReduce.
  EXPECT_EQ(hostSelect(m, query(kAllGather, 64), lim).algo, kRing);
}

// Across hosts the NICs bound the calibrated rate: the channels share min(channels, rails) of them, and LL's lines
// put twice its data on the wire.
TEST(HostModel, NetIsBoundByItsNics) {
  HostModel m;
  m.set({HostLink::kNet, kAllGather, kRing, kSimple, 1, {100, 0, 2.0f}});
  m.set({HostLink::kNet, kAllGather, kRing, kSimple, 2, {200, 0, 1.5f}});
  m.set({HostLink::kNet, kAllGather, kRing, kLL, 2, {200, 0, 1.5f}});
  HostQuery q = query(kAllGather, 64 << 20, 2, HostLink::kNet);
  const double bytes = hostWork(q, kRing, 1).bytes;
  EXPECT_NEAR(hostTime(m, q, kRing, kSimple, 1), 100 + bytes / 2e3, 1e-6);  // no NIC rate: the constants alone
  q.netGBps = 0.25;  // one 2 Gbit/s NIC
  EXPECT_NEAR(hostTime(m, q, kRing, kSimple, 1), 100 + bytes / 0.25e3, 1e-6);
  EXPECT_NEAR(hostTime(m, q, kRing, kSimple, 2), 200 + bytes / 0.25e3, 1e-6);  // both channels on it
  EXPECT_NEAR(hostTime(m, q, kRing, kLL, 2), 200 + 2 * bytes / 0.25e3, 1e-6);
  HostLimits lim = hostLimits(knobs({{"NCCL_PROTO", "Simple"}}), 2, false, 8);
  EXPECT_EQ(hostSelect(m, q, lim).nChannels, 1);
  q.rails = 2;  // eth0 and eth1 on separate networks: a channel each
  EXPECT_NEAR(hostTime(m, q, kRing, kSimple, 2), 200 + bytes / 0.5e3, 1e-6);
  EXPECT_EQ(hostSelect(m, q, lim).nChannels, 2);
  q.link = HostLink::kP2p;  // one host: no NIC in the way
  EXPECT_NEAR(hostTime(m, q, kRing, kSimple, 1), -1, 1e-6);
}

// Once one channel per rail keeps the NICs the bound, more channels only add TCP flows to each NIC: the model stays
// at the rails even where its summed terms price another channel's fewer steps as a gain.
TEST(HostModel, NoMoreFlowsThanRailsWhereTheNicsBound) {
  HostModel m;
  m.set({HostLink::kNet, kAllReduce, kRing, kSimple, 1, {0, 250, 2.0f}});
  m.set({HostLink::kNet, kAllReduce, kRing, kSimple, 2, {150, 280, 3.0f}});
  HostQuery q = query(kAllReduce, 16 << 20, 4, HostLink::kNet);
  q.chunkBytes = 512 << 10;
  HostLimits lim = hostLimits(knobs({{"NCCL_PROTO", "Simple"}, {"NCCL_ALGO", "Ring"}}), 2, false, 8);
  EXPECT_EQ(hostSelect(m, q, lim).nChannels, 2);  // no NIC rate: the constants alone, and two have fewer steps
  EXPECT_FALSE(hostSelect(m, q, lim).railBound);
  q.netGBps = 0.0625;                             // one 500 Mbit/s NIC: the wire is the bound with one channel
  EXPECT_EQ(netFlowChannels(m, q, kRing, kSimple, 2), 1);
  EXPECT_LT(hostTime(m, q, kRing, kSimple, 2), hostTime(m, q, kRing, kSimple, 1));  // what the sums alone say
  EXPECT_EQ(hostSelect(m, q, lim).nChannels, 1);
  EXPECT_TRUE(hostSelect(m, q, lim).railBound);  // the log line says why
  q.rails = 2;  // a flow per rail
  EXPECT_EQ(netFlowChannels(m, q, kRing, kSimple, 2), 2);
  EXPECT_EQ(hostSelect(m, q, lim).nChannels, 2);
  EXPECT_FALSE(hostSelect(m, q, lim).railBound);
  q.rails = 1;
  q.netGBps = 100;  // a NIC faster than one channel's host side: the second channel is worth its flow
  EXPECT_EQ(netFlowChannels(m, q, kRing, kSimple, 2), 2);
  EXPECT_EQ(hostSelect(m, q, lim).nChannels, 2);
  q.netGBps = 0.0625;
  HostLimits two = hostLimits(knobs({{"NCCL_PROTO", "Simple"}, {"NCCL_ALGO", "Ring"}, {"NCCL_MIN_NCHANNELS", "2"}}),
                              2, false, 8);
  EXPECT_EQ(hostSelect(m, q, two).nChannels, 2);  // the user's floor wins
  EXPECT_FALSE(hostSelect(m, q, two).railBound);
  m.set({HostLink::kNet, kAllReduce, kRing, kSimple, 2, {1e6f, 280, 3.0f}});  // two dearer anyway: not the cap's doing
  EXPECT_EQ(hostSelect(m, q, lim).nChannels, 1);
  EXPECT_FALSE(hostSelect(m, q, lim).railBound);
  q.link = HostLink::kP2p;  // one host: no NIC, no flows
  EXPECT_EQ(netFlowChannels(m, q, kRing, kSimple, 2), 2);
}

// Across two hosts a tree AllReduce sends the message once each way over each NIC (up one way, down the other, at
// once), the ring 2(n-1)/n of it: with two ranks or more a host, Tree wins large messages on the built-in constants;
// with one rank a host the tree keeps its 2 x bytes (it measured slower there) and the ring wins from 128 KiB;
// across three hosts or more a tree's inner host carries more than the ring.
TEST(HostModel, TreeAcrossTwoHostsCarriesTheMessageOnceEachWay) {
  const HostModel m = HostModel::defaults();
  HostLimits lim = hostLimits(knobs({}), 2, false, 8);
  auto at = [&](int hosts, int ranks, uint64_t bytes) {
    HostQuery q = query(kAllReduce, bytes, ranks, HostLink::kNet);
    q.chunkBytes = 512 << 10;
    q.netGBps = 0.25;  // 2 Gbit/s
    q.hosts = hosts;
    return q;
  };
  const HostQuery two = at(2, 4, 16 << 20);
  EXPECT_DOUBLE_EQ(wireBytes(two, kTree, hostWork(two, kTree, 1)), 16 << 20);
  EXPECT_DOUBLE_EQ(wireBytes(two, kRing, hostWork(two, kRing, 1)), 1.5 * (16 << 20));
  for (uint64_t bytes : {4u << 20, 16u << 20, 64u << 20}) {
    EXPECT_EQ(hostSelect(m, at(2, 4, bytes), lim).algo, kTree) << bytes;  // 2 x 2
    EXPECT_EQ(hostSelect(m, at(2, 8, bytes), lim).algo, kTree) << bytes;  // 2 x 4
    EXPECT_EQ(hostSelect(m, at(2, 2, bytes), lim).algo, kRing) << bytes;  // 2 x 1
    EXPECT_EQ(hostSelect(m, at(3, 6, bytes), lim).algo, kRing) << bytes;  // 3 x 2
    EXPECT_EQ(hostSelect(m, at(4, 4, bytes), lim).algo, kRing) << bytes;  // 4 x 1
  }
  const HostQuery one = at(2, 2, 16 << 20);  // one rank a host: the tree keeps its 2 x bytes (measured slower)
  EXPECT_DOUBLE_EQ(wireBytes(one, kTree, hostWork(one, kTree, 1)), 2.0 * (16 << 20));
  EXPECT_EQ(hostSelect(m, at(2, 2, 128 << 10), lim).algo, kRing);
  const HostQuery three = at(3, 6, 16 << 20);
  EXPECT_DOUBLE_EQ(wireBytes(three, kTree, hostWork(three, kTree, 1)), 2.0 * (16 << 20));
  EXPECT_EQ(hostSelect(m, at(2, 4, 16 << 20), hostLimits(knobs({{"NCCL_ALGO", "Ring"}}), 2, false, 8)).algo, kRing);
  // The tree runs one channel across hosts: with two rails the ring's two channels (both NICs) carry more.
  HostQuery rails = at(2, 4, 16 << 20);
  rails.rails = 2;
  EXPECT_EQ(hostSelect(m, rails, lim).algo, kRing);
  EXPECT_EQ(hostSelect(m, rails, lim).nChannels, 2);
  HostLimits tree2 = hostLimits(knobs({{"NCCL_ALGO", "Tree"}, {"NCCL_MIN_NCHANNELS", "2"}}), 2, false, 8);
  EXPECT_EQ(hostSelect(m, rails, tree2).algo, kTree);
  EXPECT_EQ(hostSelect(m, rails, tree2).nChannels, 1);
}

TEST(HostModel, KnobsForce) {
  HostModel m = toyModel();
  auto pick = [&](std::map<std::string, std::string> env, uint64_t bytes, bool oneHost = true, int rings = 2) {
    return hostSelect(m, query(kAllReduce, bytes), hostLimits(knobs(env), rings, oneHost, 8));
  };
  EXPECT_EQ(pick({{"NCCL_ALGO", "Tree"}}, 64).algo, kTree);
  EXPECT_EQ(pick({{"NCCL_ALGO", "ring"}, {"NCCL_PROTO", "Simple"}}, 64).proto, kSimple);
  EXPECT_EQ(pick({{"NCCL_PROTO", "LL"}}, 64 << 20).proto, kLL);
  EXPECT_EQ(pick({{"NCCL_PROTO", "LL128"}}, 64).proto, kSimple);  // runs as Simple
  EXPECT_EQ(pick({{"NCCL_ALGO", "^Tree,Ring"}, {"TOPOCOLL_DIRECT_MAX", "1073741824"}}, 64 << 20).algo, kHostDirect);
  EXPECT_EQ(pick({{"NCCL_ALGO", "^Tree,Ring"}}, 64 << 20).algo, kRing);  // beyond TOPOCOLL_DIRECT_MAX: Ring
  EXPECT_EQ(pick({{"TOPOCOLL_DIRECT_MAX", "-1"}}, 64).algo, kRing);
  EXPECT_EQ(pick({{"TOPOCOLL_DIRECT_MAX", "32"}}, 64).algo, kRing);
  EXPECT_NE(pick({}, 64, false).algo, kHostDirect);  // several hosts
  EXPECT_EQ(pick({{"NCCL_MAX_NCHANNELS", "1"}}, 64 << 20).nChannels, 1);
  EXPECT_EQ(pick({{"NCCL_MIN_NCHANNELS", "2"}}, 64).nChannels, 2);
  EXPECT_EQ(pick({{"NCCL_MIN_NCHANNELS", "4"}}, 64, true, 8).nChannels, 4);
  EXPECT_EQ(pick({}, 64 << 20, true, 1).nChannels, 1);  // one ring
  EXPECT_THROW(hostLimits(knobs({{"NCCL_ALGO", "Butterfly"}}), 2, true, 8), Error);
}

TEST(HostModel, NothingCalibratedFallsBackToRingSimple) {
  HostModel empty;
  HostChoice c = hostSelect(empty, query(kAllReduce, 1 << 20), hostLimits(knobs({}), 2, true, 8));
  EXPECT_EQ(c.algo, kRing);
  EXPECT_EQ(c.proto, kSimple);
  EXPECT_EQ(c.nChannels, 1);
}

}  // namespace
}  // namespace topocoll::tuning
