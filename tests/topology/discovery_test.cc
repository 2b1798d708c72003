#include "topocoll/topology/discovery.h"

#include <gtest/gtest.h>

#include "topocoll/topology/system.h"

namespace topocoll::topology {
namespace {

TEST(Discovery, ThisMachineGivesAValidTopologyThatLoadsAgain) {
  XmlDoc d = discoverLocalTopology();
  ASSERT_TRUE(d.root);
  EXPECT_EQ(d.root->name, "system");
  ASSERT_NE(d.root->child("cpu"), nullptr);
  std::string text = toString(*d.root);
  XmlDoc again = parseXml(text);
  EXPECT_EQ(toString(*again.root), text);
  // Builds into a system (no GPU needed): every CPU present, arch known.
  System s = buildSystem(again);
  EXPECT_GE(s.count(NodeType::CPU), 1);
  EXPECT_GT(s.of(NodeType::CPU)[0].arch, 0);
}

TEST(Discovery, HostIdOverrideIsStable) {
  EXPECT_EQ(hostHash("node-a"), hostHash("node-a"));
  EXPECT_NE(hostHash("node-a"), hostHash("node-b"));
}

TEST(Discovery, MissingSysfsStillGivesACpu) {
  DiscoveryOptions o;
  o.sysfsRoot = "/nonexistent-sysfs";
  o.useNvml = false;
  XmlDoc d = discoverLocalTopology(o);
  ASSERT_NE(d.root->child("cpu"), nullptr);
}

}  // namespace
}  // namespace topocoll::topology
