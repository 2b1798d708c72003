#include "topocoll/topology/xml.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <random>

#include "topocoll/status.h"
#include "test_util.h"

namespace topocoll::topology {
namespace {

std::vector<std::string> publicXmls() {
  std::vector<std::string> out;
  if (DIR* d = opendir(TOPO_DIR)) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 4 && n.substr(n.size() - 4) == ".xml") out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Xml, EveryPublicTopologyRoundTripsByteForByte) {
  auto files = publicXmls();
  ASSERT_GE(files.size(), 30u);
  for (auto& f : files) {
    SCOPED_TRACE(f);
    XmlDoc d = loadXmlFile(testing::topoPath(f));
    std::string once = toString(*d.root);
    std::string twice = toString(*parseXml(once).root);
    EXPECT_EQ(once, twice);
    // Nothing is lost: element and attribute counts match the source.
    int elements = 0, attrs = 0;
    d.root->visit([&](XmlNode& n) {
      ++elements;
      attrs += static_cast<int>(n.attrs.size());
    });
    int elements2 = 0, attrs2 = 0;
    parseXml(once).root->visit([&](XmlNode& n) {
      ++elements2;
      attrs2 += static_cast<int>(n.attrs.size());
    });
    EXPECT_EQ(elements, elements2);
    EXPECT_EQ(attrs, attrs2);
  }
}

TEST(Xml, CanonicalFormIsNcclsDumpFormat) {
  XmlDoc d = parseXml("<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\"/></cpu></system>");
  EXPECT_EQ(toString(*d.root),
            "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\"/>\n  </cpu>\n</system>\n");
}

TEST(Xml, UnknownElementsAndAttributesAreKept) {
  XmlDoc d = parseXml("<system version=\"1\" vendor_note=\"x\"><rack id=\"7\"><slot/></rack></system>");
  std::string s = toString(*d.root);
  EXPECT_NE(s.find("vendor_note=\"x\""), std::string::npos);
  EXPECT_NE(s.find("<rack id=\"7\">"), std::string::npos);
  EXPECT_NE(s.find("<slot/>"), std::string::npos);
}

TEST(Xml, MalformedXmlNamesFileAndLine) {
  try {
    parseXml("<system version=\"1\">\n  <cpu numaid=\"0\">\n</system>\n", "broken.xml");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("broken.xml:"), std::string::npos) << m;
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  }
}

TEST(Xml, DuplicateAttributeIsAnError) {
  EXPECT_THROW(parseXml("<system version=\"1\" version=\"2\"/>"), Error);
}

TEST(Xml, MissingFileIsNotFound) {
  try {
    loadXmlFile("/nonexistent/topo.xml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/topo.xml"), std::string::npos);
  }
}

TEST(Xml, TrimRemovesBranchesWithoutKeep) {
  XmlDoc d = parseXml(
      "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"a\"><gpu dev=\"0\" keep=\"1\"/></pci>"
      "<pci busid=\"b\"><gpu dev=\"1\"/></pci></cpu><cpu numaid=\"1\"/></system>");
  trimXml(*d.root);
  EXPECT_EQ(toString(*d.root),
            "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"a\">\n      <gpu dev=\"0\"/>\n    </pci>\n"
            "  </cpu>\n</system>\n");
}

TEST(Xml, FuseAppendsWhatIsNew) {
  XmlDoc a = parseXml("<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"a\"><gpu dev=\"0\"/></pci></cpu></system>");
  XmlDoc b = parseXml("<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"b\"><gpu dev=\"1\"/></pci></cpu></system>");
  fuseXml(*a.root, *b.root);
  std::string s = toString(*a.root);
  EXPECT_LT(s.find("busid=\"a\""), s.find("busid=\"b\""));
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 10);
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A scratch directory, removed with what is in it.
struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/topocoll-xml-test-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

TEST(Xml, OnlyRegularFilesOfBoundedSizeAreRead) {
  EXPECT_NE(errorOf([] { loadXmlFile("/dev/zero"); }).find("/dev/zero: is not a regular file"), std::string::npos);
  TempDir dir;
  EXPECT_NE(errorOf([&] { loadXmlFile(dir.path); }).find(dir.path + ": is a directory"), std::string::npos);
  std::string fifo = dir.path + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(errorOf([&] { loadXmlFile(fifo); }).find("is not a regular file"), std::string::npos);
  std::string big = dir.path + "/big.xml";  // sparse: no disk used
  int fd = open(big.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kMaxXmlFileBytes) + 1), 0);
  close(fd);
  EXPECT_NE(errorOf([&] { loadXmlFile(big); }).find("over the 64 MiB limit"), std::string::npos);
}

TEST(Xml, ARootThatIsNotSystemIsNamed) {
  EXPECT_NE(errorOf([] { systemElement(parseXml("<graphs version=\"1\"/>", "g.xml")); })
                .find("g.xml:1: the root element is <graphs>: this is a graph file (NCCL_GRAPH_FILE), use --graph-in"),
            std::string::npos);
  EXPECT_NE(errorOf([] { systemElement(parseXml("<foo><system/></foo>", "f.xml")); })
                .find("the root element is <foo>; a topology's root is <system>"),
            std::string::npos);
  EXPECT_EQ(systemElement(parseXml("<system version=\"1\"/>")).name, "system");
}

// The old trimming: a full copy, the edit, then trimXml.
std::string trimmedTheLongWay(const XmlNode& root, const XmlNode* target, const std::function<void(XmlNode&)>& edit) {
  auto copy = root.clone();
  XmlNode* t = nullptr;
  std::function<void(const XmlNode&, XmlNode&)> match = [&](const XmlNode& a, XmlNode& b) {
    if (&a == target) t = &b;
    for (size_t i = 0; i < a.subs.size(); ++i) match(*a.subs[i], *b.subs[i]);
  };
  match(root, *copy);
  edit(*t);
  trimXml(*copy);
  return toString(*copy);
}

TEST(Xml, TrimmedCopiesEqualTrimmingAFullCopy) {
  auto edit = [](XmlNode& g) {
    g.set("keep", "1");
    g.set("rank", "7");
    g.setIfUnset("gdr", "1");
  };
  // Real machines, each GPU in turn, with the NICs kept as NCCL keeps them.
  for (const char* name : {"seed-h100-8gpu-8nic-nvswitch.xml", "ws-rtx3090-8gpu-pcie-2plx-1ib56g-2numa.xml"}) {
    XmlDoc d = loadXmlFile(testing::topoPath(name));
    d.root->visit([](XmlNode& n) {
      if (n.name == "net") n.set("keep", "1");
    });
    TrimmedCopies copies(*d.root);
    d.root->visit([&](XmlNode& g) {
      if (g.name != "gpu") return;
      EXPECT_EQ(toString(*copies.copy(&g, edit)), trimmedTheLongWay(*d.root, &g, edit)) << name;
    });
  }
  // Unknown elements around removable ones, a kept branch whose inside keeps its own keep="1", a target inside it.
  XmlDoc odd = parseXml(
      "<system version=\"1\"><foo><pci busid=\"1\"/><bar/></foo><cpu numaid=\"0\"><pci busid=\"2\" keep=\"1\">"
      "<pci busid=\"3\"><gpu dev=\"0\"/></pci><nic><net keep=\"1\"/></nic></pci><pci busid=\"4\"><gpu dev=\"1\"/>"
      "</pci></cpu><cpu numaid=\"1\"><nic/></cpu></system>");
  TrimmedCopies copies(*odd.root);
  odd.root->visit([&](XmlNode& g) {
    if (g.name != "gpu") return;
    EXPECT_EQ(toString(*copies.copy(&g, edit)), trimmedTheLongWay(*odd.root, &g, edit));
  });
  // An edit that does not keep: nothing on the target's path is kept for it.
  XmlNode* gpu1 = odd.root->findWith("gpu", "dev", "1");
  auto noKeep = [](XmlNode& g) { g.set("rank", "1"); };
  EXPECT_EQ(toString(*copies.copy(gpu1, noKeep)), trimmedTheLongWay(*odd.root, gpu1, noKeep));
}

TEST(Xml, FuseMatchesTheFirstEqualSiblingAndCollapsesRepeats) {
  XmlDoc a = parseXml("<system version=\"1\"><x a=\"1\" b=\"2\"/><y><z/></y><x a=\"1\"/></system>");
  XmlDoc b = parseXml(
      "<system version=\"1\"><x b=\"2\" a=\"1\"/><y><w/></y><q/><q/><y/><x a=\"1\"><k/></x></system>");
  fuseXml(*a.root, *b.root);
  EXPECT_EQ(toString(*a.root),
            "<system version=\"1\">\n  <x a=\"1\" b=\"2\"/>\n  <y>\n    <z/>\n    <w/>\n  </y>\n  <x a=\"1\"/>\n"
            "  <q/>\n  <y/>\n  <x a=\"1\">\n    <k/>\n  </x>\n</system>\n");
}

TEST(Xml, ManyAttributesAreCheckedForDuplicatesQuickly) {
  std::string x = "<system";
  for (int i = 0; i < 20000; ++i) x += " a" + std::to_string(i) + "=\"1\"";
  EXPECT_EQ(parseXml(x + "/>").root->attrs.size(), 20000u);
  EXPECT_NE(errorOf([&] { parseXml(x + " a77=\"2\"/>"); }).find("duplicate attribute 'a77'"), std::string::npos);
}

}  // namespace
}  // namespace topocoll::topology
