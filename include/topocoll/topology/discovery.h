// Discovery of the local machine into NCCL's topology XML (what NCCL_TOPO_DUMP_FILE would contain). Follows the
// structure of NCCL 2.30.7's src/graph/xml.cc (ncclTopoFillGpu, ncclTopoGetXmlFromSys, ncclTopoFillNet): devices
// first, their PCI chains from sysfs, CPUs created on demand for the NUMA node a root port reports.
#pragma once

#include <string>
#include <vector>

#include "topocoll/topology/xml.h"

namespace topocoll::topology {

struct DiscoveryOptions {
  std::string sysfsRoot = "/sys";                // tests point this at a fake tree
  std::string nvmlLibrary = "libnvidia-ml.so.1";  // tests point this at a fake NVML
  bool useNvml = true;                           // dlopen `nvmlLibrary` when present
  std::string hostId;                            // NCCL_HOSTID override for the host hash
  // The socket plugin's devices when the machine has no InfiniBand device: interfaces chosen as NCCL does
  // (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, NCCL_COMM_ID's subnet), or exactly `socketDevices` when given.
  std::string socketIfname, socketFamily, commId;
  std::vector<std::string> socketDevices;
};

/// NCCL's host hash (hostname + boot id, or the NCCL_HOSTID value), as a 64-bit djb2 hash.
uint64_t hostHash(const std::string& hostIdOverride = "");

/// Builds the XML of this machine: every GPU NVML reports (PCI chain, sm, NVLinks with their target classes),
/// the network plugin's devices (InfiniBand ports that are ACTIVE; else the socket plugin's interfaces, which
/// attach to the first CPU when they are not PCI devices, 10 Gb/s when the kernel reports no speed), and the
/// CPUs those hang from (NUMA id as sysfs reports it, affinity, arch, vendor, family and model). Never fails on a
/// machine without GPUs.
XmlDoc discoverLocalTopology(const DiscoveryOptions& opts = {});

}  // namespace topocoll::topology
