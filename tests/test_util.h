#pragma once

#include <algorithm>
#include <string>

#include "topocoll/config.h"
#include "topocoll/paths/paths.h"
#include "topocoll/topology/node_xml.h"
#include "topocoll/topology/system.h"
#include "topocoll/topology/xml.h"

namespace topocoll::testing {

inline std::string topoPath(const std::string& name) { return std::string(TOPO_DIR) + "/" + name; }

/// The system NCCL rank 0 would see for one host with every GPU used.
inline topology::System nodeSystem(const topology::XmlDoc& doc, const Config& cfg = {}, int nRanks = -1) {
  return paths::hostSystem(doc, cfg, nRanks);
}

inline topology::System nodeSystemFromFile(const std::string& name, const Config& cfg = {}, int nRanks = -1) {
  return nodeSystem(topology::loadXmlFile(topoPath(name)), cfg, nRanks);
}

inline const topology::Path& gpuPath(const topology::System& s, int g1, int g2) {
  return s.of(topology::NodeType::GPU)[g1].paths[0][g2];
}
inline const topology::Path& netPath(const topology::System& s, int g, int n) {
  return s.of(topology::NodeType::GPU)[g].paths[static_cast<int>(topology::NodeType::NET)][n];
}

/// The smallest bandwidth among a path's links (what its bandwidth must equal).
inline float minLinkBw(const topology::System& s, const topology::Path& p) {
  float mn = 1e30f;
  for (auto& hop : p.list) mn = std::min(mn, s.link(hop).bw);
  return mn;
}

}  // namespace topocoll::testing
