// Discovery of the local machine into NCCL's topology XML (what NCCL_TOPO_DUMP_FILE would contain).
#pragma once

#include <string>

#include "topocoll/topology/xml.h"

namespace topocoll::topology {

struct DiscoveryOptions {
  std::string sysfsRoot = "/sys";    // tests point this at a fake tree
  std::string procRoot = "/proc";
  bool useNvml = true;               // dlopen libnvidia-ml.so.1 when present
  std::string hostId;                // NCCL_HOSTID override for the host hash
};

/// NCCL's host hash (hostname + boot id, or the NCCL_HOSTID value), as a 64-bit djb2 hash.
uint64_t hostHash(const std::string& hostIdOverride = "");

/// Builds the XML of this machine: CPUs (NUMA nodes with affinity, arch, vendor, family/model), the PCI path of
/// every GPU (from NVML, when available) and NIC (/sys/class/infiniband, else /sys/class/net devices), with
/// link speed/width, and GPU NVLinks. Never fails on a machine without GPUs.
XmlDoc discoverLocalTopology(const DiscoveryOptions& opts = {});

}  // namespace topocoll::topology
