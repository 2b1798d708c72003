// Text and JSON views used by `topocoll topo ...`.
#pragma once

#include <string>

#include "topocoll/topology/system.h"

namespace topocoll::cli {

/// GPU x GPU, GPU x NIC and NIC x NIC path-type matrix in the style of `nvidia-smi topo -m`, with legend.
std::string pathMatrix(const topology::System& sys);
std::string pathMatrixJson(const topology::System& sys);
/// Hop list between two nodes named like "GPU0" (by dev), "NET3" (by dev), "CPU1" (by index).
std::string pathReport(const topology::System& sys, const std::string& from, const std::string& to, bool json);

}  // namespace topocoll::cli
