#include "cli.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <fmt/format.h>

#include <iostream>

#include "topocoll/status.h"
#include "topocoll/topology/discovery.h"

namespace topocoll::cli {

namespace {
constexpr const char* kDefaultTopo = "/var/run/nvidia-topologyd/virtualTopology.xml";
}  // namespace

topology::XmlDoc loadTopology(const std::string& flag, const Config& cfg, std::string* name) {
  std::string path = flag.empty() ? cfg.topoFile : flag;
  if (path.empty() && access(kDefaultTopo, R_OK) == 0) path = kDefaultTopo;
  if (!path.empty()) {
    *name = path;
    return topology::loadXmlFile(path);
  }
  *name = "<discovered>";
  topology::DiscoveryOptions opts;
  opts.hostId = cfg.hostId;
  opts.socketIfname = cfg.socketIfname;
  opts.socketFamily = cfg.socketFamily;
  opts.commId = cfg.commId;
  return topology::discoverLocalTopology(opts);
}

void writeOut(const std::string& path, const std::string& content) {
  if (path.empty() || path == "-") {
    std::cout << content;
    return;
  }
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(StatusCode::kSystemError, "{}: cannot open for writing", path);
  out << content;
  if (!out) fail(StatusCode::kSystemError, "{}: write error", path);
}

std::string dotToSvg(const std::string& dot) {
  char tmpl[] = "/tmp/topocoll-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) fail(StatusCode::kSystemError, "cannot create a temporary file");
  FILE* f = fdopen(fd, "w");
  fputs(dot.c_str(), f);
  fclose(f);
  std::string cmd = std::string("dot -Tsvg ") + tmpl + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string svg;
  if (p) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) svg.append(buf, n);
    int rc = pclose(p);
    if (rc != 0) svg.clear();
  }
  unlink(tmpl);
  if (svg.empty())
    fail(StatusCode::kSystemError, "Graphviz 'dot' is needed to write SVG (apt-get install graphviz), or use --out FILE.dot");
  return svg;
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ringsAndTrees(const search::Connect& c, int nRanks) {
  std::string out;
  for (size_t ch = 0; ch < c.rings.size(); ++ch) {
    std::string line = fmt::format("Channel {:02d}/{:02d} :", ch, c.rings.size());
    for (int r : c.rings[ch]) line += fmt::format(" {}", r);
    out += line + "\n";
  }
  for (int r = 0; r < std::min<int>(nRanks, 64); ++r) {
    std::string line = fmt::format("Rank {:3d} Trees", r);
    for (size_t ch = 0; ch < c.trees[r].size(); ++ch) {
      const auto& t = c.trees[r][ch];
      line += fmt::format(" [{}] {}/{}/{}->{}->{}", ch, t.down[0], t.down[1], t.down[2], r, t.up);
    }
    out += line + "\n";
  }
  if (nRanks > 64) out += fmt::format("... ({} more ranks; --json has all)\n", nRanks - 64);
  return out;
}

}  // namespace topocoll::cli
