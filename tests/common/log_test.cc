#include "topocoll/log.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "topocoll/config.h"
#include "topocoll/env.h"
#include "topocoll/status.h"

namespace topocoll::log {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Log, LevelsAreNcclsNames) {
  EXPECT_EQ(parseLevel(""), Level::kNone);
  EXPECT_EQ(parseLevel("VERSION"), Level::kVersion);
  EXPECT_EQ(parseLevel("warn"), Level::kWarn);  // NCCL compares case-insensitively
  EXPECT_EQ(parseLevel("INFO"), Level::kInfo);
  EXPECT_EQ(parseLevel("TRACE"), Level::kTrace);
  EXPECT_THROW(parseLevel("LOUD"), Error);
}

TEST(Log, SubsystemListsAndExclusions) {
  EXPECT_EQ(parseSubsys(""), kDefaultSubsys);
  EXPECT_EQ(parseSubsys("INIT,GRAPH"), kInit | kGraph);
  EXPECT_EQ(parseSubsys("ALL"), kAll);
  uint64_t m = parseSubsys("^NET,SHM");
  EXPECT_EQ(m & (kNet | kShm), 0u);
  EXPECT_NE(m & kInit, 0u);
  EXPECT_NE(m & kColl, 0u);
  try {
    parseSubsys("INIT,GRAF");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'GRAF'"), std::string::npos) << e.what();
  }
}

TEST(Log, FileNamePatterns) {
  std::string pid = std::to_string(getpid());
  EXPECT_EQ(expandFileName("/tmp/x.%p.log"), "/tmp/x." + pid + ".log");
  EXPECT_EQ(expandFileName("100%%"), "100%");
  EXPECT_EQ(expandFileName("a%q"), "a%q");  // NCCL echoes what it does not understand
  EXPECT_EQ(expandFileName("%h").find('/'), std::string::npos);
}

TEST(Log, LinesHaveNcclsPrefixAndRespectLevelAndMask) {
  std::string path = ::testing::TempDir() + "/topocoll-log-%p.txt";
  configure({Level::kInfo, kInit | kGraph, path});
  setThreadRank(3);
  TC_INFO(kInit, "hello {}", 42);
  TC_INFO(kNet, "not shown: NET is masked");
  TC_TRACE(kInit, "not shown: TRACE is above INFO");
  TC_WARN("something broke at {}", "peer 2");
  std::string text = slurp(expandFileName(path));
  configure({Level::kNone, kDefaultSubsys, ""});
  setThreadRank(0);
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(^[^:\s]+:\d+:\d+ \[3\] NCCL INFO hello 42\n)"))) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(\n[^:\s]+:\d+:\d+ \[3\] log_test\.cc:\d+ NCCL WARN something broke at peer 2\n)")))
      << text;
  EXPECT_EQ(text.find("not shown"), std::string::npos) << text;
  EXPECT_EQ(lastError(), "something broke at peer 2");
  std::remove(expandFileName(path).c_str());
}

// A forked child logs as itself: its own pid and thread id in the prefix and, with %p in NCCL_DEBUG_FILE, its own
// file; the parent's file holds only the parent's lines.
TEST(Log, ForkedChildLogsUnderItsOwnPidIntoItsOwnFile) {
  std::string path = ::testing::TempDir() + "/topocoll-fork-%p.txt";
  configure({Level::kInfo, kInit, path});
  TC_INFO(kInit, "parent before fork");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TC_INFO(kInit, "child line");
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  TC_INFO(kInit, "parent after fork");
  std::string mine = expandFileName(path);
  std::string theirs = ::testing::TempDir() + "/topocoll-fork-" + std::to_string(child) + ".txt";
  configure({Level::kNone, kDefaultSubsys, ""});
  std::string parentText = slurp(mine), childText = slurp(theirs);
  EXPECT_NE(parentText.find("parent before fork"), std::string::npos) << parentText;
  EXPECT_NE(parentText.find("parent after fork"), std::string::npos) << parentText;
  EXPECT_EQ(parentText.find("child line"), std::string::npos) << parentText;
  EXPECT_TRUE(std::regex_search(childText, std::regex("^[^:\\s]+:" + std::to_string(child) + ":" +
                                                          std::to_string(child) + " \\[0\\] NCCL INFO child line\n")))
      << childText;
  std::remove(mine.c_str());
  std::remove(theirs.c_str());
}

TEST(Log, OffMeansNothingIsFormatted) {
  configure({Level::kNone, kAll, ""});
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  TC_INFO(kInit, "{}", count());
  EXPECT_EQ(evaluated, 0);  // arguments are not even evaluated when the line is off
  EXPECT_FALSE(enabled(Level::kWarn, kAll));
}

TEST(Log, BadDebugKnobsFailAtTheApiEdge) {
  EXPECT_THROW(Config::fromEnv(Env(std::map<std::string, std::string>{{"NCCL_DEBUG", "LOUD"}})), Error);
  EXPECT_THROW(Config::fromEnv(Env(std::map<std::string, std::string>{{"NCCL_DEBUG_SUBSYS", "INIT,BOGUS"}})), Error);
  // ... while the logger itself keeps its defaults rather than failing whatever call logs first.
  Settings s = settingsFromEnv(Env(std::map<std::string, std::string>{{"NCCL_DEBUG", "LOUD"}, {"NCCL_DEBUG_SUBSYS", "BOGUS"}}));
  EXPECT_EQ(s.level, Level::kNone);
  EXPECT_EQ(s.subsys, kDefaultSubsys);
}

}  // namespace
}  // namespace topocoll::log
