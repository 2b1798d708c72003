// What NCCL's ncclTopoGetSystem does to a topology file before building the graph, for one host:
// each local rank marks its GPU (rank, keep), the network plugin's devices are numbered and multi-port
// NICs fused into virtual NICs, unused branches are trimmed, and the ranks' views are fused back together.
#pragma once

#include <vector>

#include "topocoll/config.h"
#include "topocoll/topology/xml.h"

namespace topocoll::topology {

/// A rank of this host and the GPU it drives (the `dev` attribute of a <gpu> in the topology).
struct LocalGpu {
  int rank = 0;
  int dev = 0;
};

/// All <gpu> `dev` values of the document, ascending. Throws naming file:line on a missing or duplicate dev.
std::vector<int> gpuDevs(const XmlDoc& doc);

/// Returns the fused per-host XML NCCL would build its system from. Throws Error(kInvalidArgument) when a rank
/// names a GPU the topology lacks or a GPU appears twice.
XmlDoc prepareNodeXml(const XmlDoc& file, const std::vector<LocalGpu>& ranks, const Config& cfg);

/// The physical NET devices' network view plus NIC fusion (ncclTopoProcessNet with NCCL's IB plugin), applied
/// in place. Exposed for tests.
void processNets(XmlNode& root, const Config& cfg);
/// The same with the fusion groups (indices of <net> elements in document order) already decided.
void applyNets(XmlNode& root, const Config& cfg, const std::vector<std::vector<int>>& groups);

}  // namespace topocoll::topology
