// The hardware model NCCL builds from a topology XML (ncclTopoSystem), as value types.
//
// Nodes live in one vector per type and are referred to by (type, index). Links are stored on their source
// node, sorted the way NCCL sorts them (bandwidth descending at insertion, then NVLink, PCI down, PCI up, SYS),
// because the search visits them in that order. Bandwidths are floats in GB/s, as in NCCL, so that every
// comparison and rounding behaves the same.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "topocoll/topology/xml.h"

namespace topocoll::topology {

enum class NodeType : int { GPU = 0, PCI = 1, NVS = 2, CPU = 3, NIC = 4, NET = 5, GIN = 6, RMA = 7, DEV = 8, CXB = 9 };
constexpr int kNodeTypes = 10;
const char* to_string(NodeType t);

/// Link types share their numbering with path types (NCCL keeps them aligned).
enum class LinkType : int { LOC = 0, NVL = 1, C2C = 3, PCI = 4, SYS = 9, NET = 10 };
const char* to_string(LinkType t);

enum class PathType : int { LOC = 0, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB, SYS, NET, DIS };
constexpr int kPathTypes = 12;
const char* to_string(PathType t);
/// Parses a path type name; returns -1 when unknown.
int pathTypeFromString(const std::string& s);

// NCCL's constants (src/graph/topo.h, NCCL 2.30.7).
constexpr float kLocBw = 5000.0f;
constexpr float kPciBw = 12.0f;  // PCI Gen3 x16
constexpr int kCpuArchX86 = 1, kCpuArchPower = 2, kCpuArchArm = 3, kCpuArchMixed = 4;
constexpr int kCpuVendorIntel = 1, kCpuVendorAmd = 2, kCpuVendorZhaoxin = 3, kCpuVendorMixed = 4;
constexpr int kCpuModelIntelBdw = 1, kCpuModelIntelSkl = 2, kCpuModelIntelSrp = 3, kCpuModelIntelErp = 4;
constexpr int kCpuModelYongfeng = 1;
constexpr int kCpuModelAmdRome = 4;  // RCCL's NCCL_TOPO_CPU_TYPE_ROME
constexpr int kUndef = -1;
/// NCCL_TOPO_MAX_NODES (src/include/graph.h): the most nodes of one type a host's system may have.
constexpr int kTopoMaxNodes = 640;

// AMD GPUs (RCCL's XML, version 2: a `gcn` attribute on <gpu>). RCCL's src/graph/topo.cc ncclTopoAddGpu gives every
// AMD GPU compute capability 60 ("no direct mapping between CUDA SM and HIP GFX") and reads `sm` as the CU count.
constexpr int kAmdGpuCompCap = 60;
/// RCCL's name for an architecture, from the `gcn` attribute (old numeric values "906", "908", "910", "940",
/// "941", "942" map to gfx906 ... gfx942; archinfo.cc convertGcnArchToGcnArchName).
std::string gcnArchName(const std::string& gcn);
/// Bandwidth of one XGMI link in GB/s by architecture (RCCL topo.h ncclTopoXGMISpeed): gfx90a 36, gfx94x 48,
/// gfx95x 48, gfx1250 64, older (Vega gfx906, MI100 gfx908) 24.
float xgmiWidth(const std::string& gcnName);

/// NVLink bandwidth of one link, by compute capability.
float nvlinkBw(int cudaCompCap);
/// Bandwidth between two CPUs of one host, from the CPU's arch/vendor/model.
float interCpuBw(int arch, int vendor, int model);

struct NodeRef {
  NodeType type = NodeType::GPU;
  int index = -1;
  bool operator==(const NodeRef&) const = default;
};

struct Link {
  LinkType type = LinkType::LOC;
  float bw = 0;
  NodeRef rem;
};

/// A link named by its source node and its position in that node's link list.
struct LinkRef {
  NodeRef node;
  int link = -1;
};

/// A precomputed route (NCCL's ncclTopoLinkList): hops from the path's owner towards its target.
struct Path {
  std::vector<LinkRef> list;
  float bw = 0;
  PathType type = PathType::DIS;
  int count() const { return static_cast<int>(list.size()); }
};

struct Node {
  NodeType type = NodeType::GPU;
  int64_t id = 0;
  // GPU
  int dev = kUndef;  // NVML index (GPU, DEV) or plugin index (NET)
  int rank = kUndef;
  int cudaCompCap = kUndef;
  int gdrSupport = 0;
  int mloPart = kUndef;
  std::string gcn;  // AMD GPUs (GPU, DEV): RCCL's architecture name, e.g. "gfx942"; empty for NVIDIA GPUs
  int cu = 0;       // AMD GPUs: compute units (RCCL's `sm`)
  int parent = -1;  // GPU: index of its DEV node
  // DEV / PCI
  uint64_t device = 0;  // vendor<<48 | device<<32 | subsystem_vendor<<16 | subsystem_device
  int nGpus = 0;
  // NET
  uint64_t pciId = 0, asic = 0;
  int port = kUndef;
  float bw = 0, latency = 0;
  int collSupport = 0, maxChannels = 0, localGpu = -1;
  int railId = kUndef, planeId = kUndef;
  std::string name;  // NET name, for display
  // CPU
  int arch = kUndef, vendor = kUndef, model = kUndef;
  std::string affinity;  // cpuset mask as in the XML
  std::string busId;     // original bus id string (PCI-like nodes), for display

  std::vector<Link> links;
  /// paths[t][i]: route from this node to node i of type t (filled by the paths layer).
  std::array<std::vector<Path>, kNodeTypes> paths;
  uint64_t used = 0;  // search scratch
};

/// The system graph of one job node (or of a multi-host NVLink domain).
struct System {
  int systemId = 0;
  std::vector<uint64_t> hostHashes;
  std::array<std::vector<Node>, kNodeTypes> nodes;
  float maxBw = 0, totalBw = 0;
  int inter = 0;

  std::vector<Node>& of(NodeType t) { return nodes[static_cast<int>(t)]; }
  const std::vector<Node>& of(NodeType t) const { return nodes[static_cast<int>(t)]; }
  Link& link(LinkRef r) { return at(r.node).links[r.link]; }
  const Link& link(LinkRef r) const { return at(r.node).links[r.link]; }
  Node& at(NodeRef r) { return nodes[static_cast<int>(r.type)][r.index]; }
  const Node& at(NodeRef r) const { return nodes[static_cast<int>(r.type)][r.index]; }
  int count(NodeType t) const { return static_cast<int>(of(t).size()); }
  /// Index of the node of type t with that id, or -1.
  int indexOf(NodeType t, int64_t id) const;
  /// Index of the GPU with that rank, or -1.
  int gpuIndexOfRank(int rank) const;
  /// Whether RCCL's rules apply: the GPUs are AMD's (see gcnArchName).
  bool amdGpus() const { return !of(NodeType::GPU).empty() && !of(NodeType::GPU)[0].gcn.empty(); }
  /// Removes a node and every link to it (ncclTopoRemoveNode); indices above it shift down. Paths are dropped.
  void removeNode(NodeType t, int index);
};

/// NCCL's id helpers: the top 8 bits of a node id carry the system (host) index.
constexpr int64_t kLocalIdMask = 0x00ffffffffffffffLL;
inline int systemIdOf(int64_t id) { return static_cast<int>(static_cast<uint64_t>(id) >> 56); }
inline int64_t localIdOf(int64_t id) { return id & kLocalIdMask; }
inline int64_t makeId(int systemId, int64_t localId) {
  return static_cast<int64_t>((static_cast<uint64_t>(systemId) << 56) + static_cast<uint64_t>(localId & kLocalIdMask));
}
/// "0000:65:02.0" -> 0x65020 (hex digits, separators dropped), as NCCL's busIdToInt64.
int64_t busIdToInt64(const std::string& busId);

/// Builds the system graph from a topology XML whose <system> is `doc.root` (ncclTopoGetSystemFromXml).
/// `localHostHash` selects systemId; when 0, the first host is local. GPUs without a `rank` attribute are
/// left out, as NCCL does. Throws Error naming file:line and attribute on invalid input.
System buildSystem(const XmlDoc& doc, uint64_t localHostHash = 0);

}  // namespace topocoll::topology
