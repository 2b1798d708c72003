#include "topocoll/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "topocoll/env.h"
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
  EXPECT_THROW(Config::fromEnv(env({{"TOPOCOLL_NET_STREAMS", "-2"}})), Error);
  EXPECT_THROW(Config::fromEnv(env({{"TOPOCOLL_NET_STREAMS", "all"}})), Error);
  EXPECT_THROW(Config::fromEnv(env({{"TOPOCOLL_SOCKET_PACING", "-2"}})), Error);
  EXPECT_THROW(Config::fromEnv(env({{"TOPOCOLL_SOCKET_PACING", "fast"}})), Error);
}

TEST(Config, ChannelKnobsClampLikeNccl) {
  Config c = Config::fromEnv(env({{"NCCL_MIN_NRINGS", "4"}, {"NCCL_MIN_NCHANNELS", "200"}, {"NCCL_MAX_NCHANNELS", "0"}}));
  EXPECT_EQ(c.minNchannels, 64);  // new name wins over legacy, capped at MAXCHANNELS
  EXPECT_EQ(c.maxNchannels, 1);
}

TEST(Config, RegistryListsEveryKnobOnce) {
  std::set<std::string> names;
  for (auto& k : knobs()) EXPECT_TRUE(names.insert(k.name).second) << k.name;
  EXPECT_TRUE(names.count("NCCL_TOPO_FILE"));
  EXPECT_TRUE(names.count("NCCL_ALGO"));
}

TEST(Config, EveryKnobIsDocumentedAndRoundTripsItsDefault) {
  for (const Knob& k : knobs()) {
    SCOPED_TRACE(k.name);
    EXPECT_FALSE(k.doc.empty());
    EXPECT_FALSE(k.group.empty());
    EXPECT_FALSE(k.type.empty());
    EXPECT_TRUE(k.name.rfind("NCCL_", 0) == 0 || k.name.rfind("TOPOCOLL_", 0) == 0);
    // Setting a knob to its printed default leaves the configuration as it was (the default is written once, in
    // Config's initialisers, and the parser accepts what `topocoll params` prints).
    std::string def = k.defaultText();
    if (def.empty()) continue;
    Config c;
    k.set(c, def);
    EXPECT_EQ(k.get(c), def);
  }
}

TEST(Config, FromEnvSetsTheRegisteredField) {
  Config c = Config::fromEnv(env({{"NCCL_CROSS_NIC", "0"}, {"TOPOCOLL_TIMEOUT", "2.5"}, {"NCCL_HOSTID", "h7"},
                                  {"NCCL_NETDEVS_POLICY", "max:2"}, {"NCCL_NET_MERGE_LEVEL", "PXB"},
                                  {"TOPOCOLL_NET_STREAMS", "2"}, {"TOPOCOLL_SOCKET_PACING", "400"}}));
  EXPECT_EQ(c.crossNic, 0);
  EXPECT_DOUBLE_EQ(c.timeoutSec, 2.5);
  EXPECT_EQ(c.hostId, "h7");
  EXPECT_EQ(c.netDevsPolicy, 2);
  EXPECT_EQ(c.netDevsPolicyMax, 2);
  EXPECT_EQ(c.netMergeLevelValue, 5);
  EXPECT_EQ(c.netStreams, 2);
  EXPECT_EQ(c.socketPacing, 400);
  EXPECT_EQ(findKnob("NCCL_MIN_NRINGS"), findKnob("NCCL_MIN_NCHANNELS"));  // legacy alias
}

TEST(Config, MisspeltKnobsAreFlaggedOthersAreNot) {
  auto typos = knobTypos(env({{"NCCL_CROS_NIC", "1"}, {"TOPOCOLL_TIMEOT", "3"}, {"NCCL_IB_HCA", "mlx5"},
                              {"NCCL_CROSS_NIC", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}}));
  ASSERT_EQ(typos.size(), 2u);
  EXPECT_NE(typos[0].find("NCCL_CROS_NIC=1 is not a knob topocoll knows; did you mean NCCL_CROSS_NIC?"),
            std::string::npos);
  EXPECT_NE(typos[1].find("did you mean TOPOCOLL_TIMEOUT?"), std::string::npos);
}

// NCCL's own knobs are never "misspelt" ours, whatever ours they are near (NCCL_IB_DISABLE is two edits from
// NCCL_NVB_DISABLE, NCCL_RAS_ENABLE from NCCL_PAT_ENABLE); every name NCCL 2.30.7 reads is in the list.
TEST(Config, NcclsOwnKnobsAreNeverCalledTypos) {
  std::map<std::string, std::string> vars;
  for (const char* k : {"NCCL_IB_DISABLE", "NCCL_RAS_ENABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_NVLS_ENABLE",
                        "NCCL_CUMEM_ENABLE", "NCCL_DEBUG_TIMESTAMP_FORMAT", "NCCL_GIN_ENABLE", "NCCL_WIN_ENABLE",
                        "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT"}) {
    EXPECT_TRUE(isNcclKnobName(k)) << k;
    vars[k] = "1";
  }
  EXPECT_TRUE(knobTypos(env(vars)).empty());
  EXPECT_FALSE(isNcclKnobName("NCCL_CROS_NIC"));
  EXPECT_FALSE(isNcclKnobName("TOPOCOLL_TIMEOUT"));
  // Still flagged: a misspelling of NCCL's knob that is near ours.
  EXPECT_EQ(knobTypos(env({{"NCCL_NVB_DISABL", "1"}})).size(), 1u);
}

TEST(Config, KnobsNeverReadAreNotAdvertised) {
  // NCCL_P2P_PXN_LEVEL and NCCL_IGNORE_DISABLED_P2P steer NCCL's runtime send/recv routing and NVML P2P checks,
  // which the planner does not model; they are not listed rather than listed and ignored.
  EXPECT_EQ(findKnob("NCCL_P2P_PXN_LEVEL"), nullptr);
  EXPECT_EQ(findKnob("NCCL_IGNORE_DISABLED_P2P"), nullptr);
}

TEST(Config, BadValuesNameTheKnob) {
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"TOPOCOLL_TIMEOUT", "-1"}, {"TOPOCOLL_TIMEOUT", "nan"}, {"TOPOCOLL_SIMULATE_GPUS", "yes"},
           {"NCCL_SOCKET_FAMILY", "AF_UNIX"}, {"NCCL_NET_MERGE_LEVEL", "FAR"}, {"NCCL_MAX_P2P_NCHANNELS", "65"},
           {"NCCL_CROSS_NIC", "99999999999999999999"}}) {
    try {
      Config::fromEnv(env({{k, v}}));
      ADD_FAILURE() << k << "=" << v << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(k + "=" + v), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace topocoll

namespace topocoll {
namespace {

// NCCL's config files: NCCL_CONF_FILE (else ~/.nccl.conf), then /etc/nccl.conf, beneath the environment.
class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/topocoll-conf-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(ConfigFiles, EnvironmentThenUserFileThenSystemFile) {
  write(".nccl.conf", "NCCL_ALGO=Tree\n# NCCL_PROTO=LL\nNCCL_BUFFSIZE=1048576\r\nNOT_A_KNOB_LINE\n");
  std::string etc = write("etc.conf", "NCCL_ALGO=Ring\nNCCL_PROTO=Simple\nNCCL_NTHREADS=256\nHOME_GROWN=1\n");
  Env env = Env(std::map<std::string, std::string>{{"NCCL_NTHREADS", "128"}}).withConfigFiles(dir_, etc);
  EXPECT_EQ(env.get("NCCL_NTHREADS"), "128");         // the environment wins
  EXPECT_EQ(env.get("NCCL_ALGO"), "Tree");            // then the user's file
  EXPECT_EQ(env.get("NCCL_BUFFSIZE"), "1048576");     // CR of a CRLF line dropped
  EXPECT_EQ(env.get("NCCL_PROTO"), "Simple");         // a commented line is skipped
  EXPECT_EQ(env.get("HOME_GROWN"), std::nullopt);     // only the variables an Env keeps
  Config cfg = Config::fromEnv(env);
  EXPECT_EQ(cfg.buffSize, 1048576);
}

TEST_F(ConfigFiles, NcclConfFileReplacesTheHomeFile) {
  write(".nccl.conf", "NCCL_ALGO=Tree\n");
  std::string mine = write("mine.conf", "NCCL_ALGO=Ring=x\n");
  Env env = Env(std::map<std::string, std::string>{{"NCCL_CONF_FILE", mine}}).withConfigFiles(dir_, "");
  EXPECT_EQ(env.get("NCCL_ALGO"), "Ring=x");  // everything after the first '='
  Env missing = Env(std::map<std::string, std::string>{{"NCCL_CONF_FILE", dir_ + "/none.conf"}}).withConfigFiles(dir_, dir_ + "/none-either");
  EXPECT_EQ(missing.get("NCCL_ALGO"), std::nullopt);  // a missing file is skipped, as NCCL does
}

}  // namespace
}  // namespace topocoll
