// Discovery of the local machine into NCCL's topology XML (what NCCL_TOPO_DUMP_FILE would contain). Follows the
// structure of NCCL 2.30.7's src/graph/xml.cc (ncclTopoFillGpu, ncclTopoGetXmlFromSys, ncclTopoFillNet): devices
// first, their PCI chains from sysfs, CPUs created on demand for the NUMA node a root port reports.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "topocoll/config.h"
#include "topocoll/topology/xml.h"

namespace topocoll::topology {

/// Whose discovery rules to follow where NCCL releases differ (TOPOCOLL_DISCOVERY_RULES; docs/topology.md).
enum class DiscoveryRules {
  kNccl230,  // NCCL 2.30.7: GPU link speed/width from NVML, <cpu affinity=""> when unknown, <gpu mlopart>
  kNccl228,  // NCCL 2.28.x: link speed/width from sysfs for GPUs too, no affinity when unknown, no mlopart
};

struct DiscoveryOptions {
  std::string sysfsRoot = "/sys";                // tests point this at a fake tree
  std::string nvmlLibrary = "libnvidia-ml.so.1";  // tests point this at a fake NVML
  bool useNvml = true;                           // dlopen `nvmlLibrary` when present
  std::string cudaLibrary = "libcuda.so.1";      // the CUDA driver, asked whether a GPU supports GPU Direct RDMA
  DiscoveryRules rules = DiscoveryRules::kNccl230;
  std::string hostId;                            // NCCL_HOSTID override for the host hash
  // The socket plugin's devices when the machine has no InfiniBand device: interfaces chosen as NCCL does
  // (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, NCCL_COMM_ID's subnet), or exactly `socketDevices` when given.
  std::string socketIfname, socketFamily, commId;
  std::vector<std::string> socketDevices;
};

/// The options the knobs in `cfg` select (NCCL_HOSTID, NCCL_SOCKET_*, NCCL_COMM_ID, TOPOCOLL_DISCOVERY_RULES).
DiscoveryOptions discoveryOptions(const Config& cfg);

/// NCCL's host hash (getHostHash): its 64-bit string hash of hostname + boot id, or of the NCCL_HOSTID value.
uint64_t hostHash(const std::string& hostIdOverride = "");

/// NCCL's 64-bit hash of a byte string (getHash in src/include/bitops.h), which host_hash is.
uint64_t ncclStringHash(std::string_view bytes);

/// Builds the XML of this machine: every GPU NVML reports (PCI chain, sm, NVLinks with their target classes),
/// each GPU's GPU Direct RDMA support as the CUDA driver reports it (nv_peermem's presence when no driver loads),
/// the network plugin's devices (InfiniBand ports that are ACTIVE; else the socket plugin's interfaces, which
/// attach to the first CPU when they are not PCI devices, 10 Gb/s when the kernel reports no speed), and the
/// CPUs those hang from (NUMA id as sysfs reports it, affinity, arch, vendor, family and model). Never fails on a
/// machine without GPUs.
XmlDoc discoverLocalTopology(const DiscoveryOptions& opts = {});

}  // namespace topocoll::topology
