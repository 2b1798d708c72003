// What NCCL's ncclTopoGetSystem does to a topology file before building the graph, for one host:
// each local rank marks its GPU (rank, keep), the network plugin's devices are numbered and multi-port
// NICs fused into virtual NICs, unused branches are trimmed, and the ranks' views are fused back together.
#pragma once

#include <vector>

#include "topocoll/config.h"
#include "topocoll/topology/xml.h"

namespace topocoll::topology {

/// A rank of this host (or NVLink clique) and the GPU it drives: the `dev` attribute of a <gpu> of host `host` of
/// the topology (hosts are the distinct host_hash values of its <cpu>s, in document order).
struct LocalGpu {
  int rank = 0;
  int dev = 0;
  int host = 0;
};

/// How many hosts the XML describes: 1, or several for the fused XML of a multi-node NVLink domain.
int xmlHostCount(const XmlDoc& doc);
/// The XML with only hosts [first, first + count) (their <cpu>s and everything below).
XmlDoc selectHosts(const XmlDoc& doc, int first, int count);
/// The <gpu> `dev` values of host `host`, ascending. Throws naming file:line on a missing or duplicate dev.
std::vector<int> gpuDevs(const XmlDoc& doc, int host = 0);

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
