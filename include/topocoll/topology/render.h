// Human-readable and graphical views of a system graph.
#pragma once

#include <string>

#include "topocoll/topology/system.h"

namespace topocoll::topology {

/// Short label of a node: "GPU0 (rank 0)", "NET3 mlx5_3", "PCI 0000:65:00.0", "CPU0 (numa 0)".
std::string nodeLabel(const System& sys, NodeRef ref);

/// The system as an indented tree from each CPU, with link types and bandwidths (`topocoll topo show`).
std::string renderTree(const System& sys);

/// Graphviz DOT: nodes coloured by type, edges labelled "TYPE GB/s". `extraEdges` is appended verbatim inside
/// the graph (used to overlay channels).
std::string renderDot(const System& sys, const std::string& title, const std::string& extraEdges = "");

}  // namespace topocoll::topology
