#pragma once

#include <string>

#include "topocoll/config.h"
#include "topocoll/paths/paths.h"
#include "topocoll/topology/node_xml.h"
#include "topocoll/topology/system.h"
#include "topocoll/topology/xml.h"

namespace topocoll::testing {

inline std::string topoPath(const std::string& name) { return std::string(TOPO_DIR) + "/" + name; }

/// The system NCCL rank 0 would see for one host with every GPU used (nRanks = ranks of this host unless given).
inline topology::System nodeSystem(const topology::XmlDoc& doc, const Config& cfg = {}, int nRanks = -1) {
  std::vector<topology::LocalGpu> locals;
  auto devs = topology::gpuDevs(doc);
  for (size_t i = 0; i < devs.size(); ++i) locals.push_back({static_cast<int>(i), devs[i]});
  auto xml = topology::prepareNodeXml(doc, locals, cfg);
  auto sys = topology::buildSystem(xml);
  paths::computePaths(sys, cfg);
  paths::trimSystem(sys, 0, nRanks < 0 ? static_cast<int>(locals.size()) : nRanks);
  paths::computePaths(sys, cfg);
  paths::searchInit(sys);
  return sys;
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

}  // namespace topocoll::testing
