#include "topocoll/config.h"

#include <gtest/gtest.h>

#include "topocoll/status.h"

namespace topocoll {
namespace {

Env env(std::map<std::string, std::string> m) { return Env(std::move(m)); }

TEST(Config, DefaultsAreNccls) {
  Config c = Config::fromEnv(Env());
  EXPECT_FALSE(c.p2pLevel.has_value());
  EXPECT_EQ(c.crossNic, 2);
  EXPECT_EQ(c.nvlsEnable, 2);
  EXPECT_EQ(c.maxNchannels, 64);
  EXPECT_EQ(c.minNchannels, 0);
  EXPECT_EQ(c.netMergeLevelValue, 1);
}

TEST(Config, PathLevelsByNameAndOldNumbers) {
  EXPECT_EQ(parsePathLevel("K", "LOC"), 0);
  EXPECT_EQ(parsePathLevel("K", "NVL"), 1);
  EXPECT_EQ(parsePathLevel("K", "PIX"), 4);
  EXPECT_EQ(parsePathLevel("K", "PXB"), 5);
  EXPECT_EQ(parsePathLevel("K", "PHB"), 8);
  EXPECT_EQ(parsePathLevel("K", "SYS"), 9);
  // Old style integers: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 SYS, larger clamps to SYS.
  EXPECT_EQ(parsePathLevel("K", "0"), 0);
  EXPECT_EQ(parsePathLevel("K", "1"), 4);
  EXPECT_EQ(parsePathLevel("K", "2"), 5);
  EXPECT_EQ(parsePathLevel("K", "3"), 8);
  EXPECT_EQ(parsePathLevel("K", "7"), 9);
}

TEST(Config, UnknownLevelNamesTheKnob) {
  try {
    Config::fromEnv(env({{"NCCL_P2P_LEVEL", "FAST"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL_P2P_LEVEL=FAST"), std::string::npos);
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  }
}

TEST(Config, P2pDisableMeansLoc) {
  Config c = Config::fromEnv(env({{"NCCL_P2P_DISABLE", "1"}}));
  ASSERT_TRUE(c.p2pLevel.has_value());
  EXPECT_EQ(*c.p2pLevel, 0);
}

TEST(Config, ContradictoryP2pKnobsAreRejected) {
  EXPECT_THROW(Config::fromEnv(env({{"NCCL_P2P_DISABLE", "1"}, {"NCCL_P2P_LEVEL", "SYS"}})), Error);
}

TEST(Config, BadIntegersAreRejected) {
  EXPECT_THROW(Config::fromEnv(env({{"NCCL_CROSS_NIC", "yes"}})), Error);
  EXPECT_THROW(Config::fromEnv(env({{"NCCL_CROSS_NIC", "3"}})), Error);
  EXPECT_THROW(Config::fromEnv(env({{"NCCL_NETDEVS_POLICY", "MAX:0"}})), Error);
}

TEST(Config, ChannelKnobsClampLikeNccl) {
  Config c = Config::fromEnv(env({{"NCCL_MIN_NRINGS", "4"}, {"NCCL_MIN_NCHANNELS", "200"}, {"NCCL_MAX_NCHANNELS", "0"}}));
  EXPECT_EQ(c.minNchannels, 64);  // new name wins over legacy, capped at MAXCHANNELS
  EXPECT_EQ(c.maxNchannels, 1);
}

TEST(Config, RegistryListsEveryKnobOnce) {
  std::set<std::string> names;
  for (auto& k : knobRegistry()) EXPECT_TRUE(names.insert(k.name).second) << k.name;
  EXPECT_TRUE(names.count("NCCL_TOPO_FILE"));
  EXPECT_TRUE(names.count("NCCL_ALGO"));
}

}  // namespace
}  // namespace topocoll
