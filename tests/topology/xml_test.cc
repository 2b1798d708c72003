#include "topocoll/topology/xml.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>

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

}  // namespace
}  // namespace topocoll::topology
