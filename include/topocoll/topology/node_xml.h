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

/// Returns the fused per-host XML NCCL would build its system from (with the network plugin's devices, see
/// applyPluginDevices). Throws Error(kInvalidArgument) when a rank
/// names a GPU the topology lacks or a GPU appears twice.
XmlDoc prepareNodeXml(const XmlDoc& file, const std::vector<LocalGpu>& ranks, const Config& cfg);

/// The network plugin's devices (ncclTopoPopulateNics): TOPOCOLL_NET_DEVICES when set (an XML <net> of the same
/// name is that device, other <net>s go, the others are added), else the XML's <net>s, or, when it has none, one
/// 10 Gb/s socket device "eth0" under the first CPU as NCCL's socket plugin reports on a machine with one Ethernet
/// interface. Returns true when all devices are socket devices (which NCCL never fuses). Exposed for tests.
bool applyPluginDevices(XmlDoc& doc, const Config& cfg);

/// The physical NET devices' network view plus NIC fusion (ncclTopoProcessNet with NCCL's IB plugin), applied
/// in place. Exposed for tests.
void processNets(XmlNode& root, const Config& cfg);
/// The same with the fusion groups (indices of <net> elements in document order) already decided.
void applyNets(XmlNode& root, const Config& cfg, const std::vector<std::vector<int>>& groups);

}  // namespace topocoll::topology
