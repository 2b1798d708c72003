// Second layer: best paths between every CPU, GPU, NIC and NVSwitch, and the P2P / GDR / PXN policy that
// NCCL 2.30.7 applies on top (src/graph/paths.cc).
#pragma once

#include <vector>

#include "topocoll/config.h"
#include "topocoll/topology/system.h"
#include "topocoll/topology/xml.h"

namespace topocoll::paths {

using topology::NodeRef;
using topology::NodeType;
using topology::PathType;
using topology::System;

enum class GdrMode { kDisable = 0, kDefault = 1, kPci = 2 };

/// ncclTopoComputePaths: bottleneck-bandwidth BFS from every node, then CPU detours where P2P or GDR is not
/// allowed, GPU pairs that can use neither P2P nor SHM marked NET (useNetBetween, NCCL_SHM_DISABLE, other
/// containers), P2C and PXN routes. Results are stored in Node::paths. `shmDevByRank` (optional, indexed by rank)
/// is the peer info's shared-memory device: ranks of one host in different containers (different values) can use
/// neither P2P nor SHM.
void computePaths(System& sys, const Config& cfg, const std::vector<int>& shmDevByRank = {});

/// ncclTopoCheckNet: whether GPUs g1 and g2 (indices) of one host talk through the network rather than P2P or
/// SHM: both reach a NIC at PXB or better faster than they reach each other (NCCL_NET_DISABLE_INTRA=1: never).
bool useNetBetween(const System& sys, const Config& cfg, int g1, int g2);

/// The NCCL nodes a system splits into: domain[g] is the lowest GPU index connected to GPU g by paths other
/// than NET (ncclTopoTrimSystem's domains).
std::vector<int> gpuDomains(const System& sys);

/// ncclTopoTrimSystem: removes GPUs outside `myRank`'s connected domain and sets `sys.inter` (1 when the job has
/// ranks outside this system). Paths must be recomputed afterwards.
void trimSystem(System& sys, int myRank, int nRanks);

/// ncclTopoSearchInit: the per-channel maxBw and totalBw the search starts from.
void searchInit(System& sys);

/// What initTransportsRank does after building the system: paths, trim to `myRank`'s domain, paths again,
/// search init. `nRanks` is the job's size (more ranks than GPUs here means other nodes exist).
void prepareForSearch(System& sys, const Config& cfg, int myRank, int nRanks,
                      const std::vector<int>& shmDevByRank = {});

/// Rank 0's system for one host whose every GPU (by `dev`) is a rank; nRanks < 0 means a single-node job.
System hostSystem(const topology::XmlDoc& topo, const Config& cfg, int nRanks = -1);

/// NCCL's ncclTopoGetLocal: nodes of `resultType` with the best (bandwidth, then type) path from the given node.
std::vector<int> getLocal(const System& sys, NodeType type, int index, NodeType resultType, PathType* pathType = nullptr);
/// Index of the CPU closest to GPU `gpu` (fewest hops among the best).
int localCpu(const System& sys, int gpu);
/// The NET a rank uses for a channel (ncclTopoGetLocalNet); returns the NET's id, sets *dev.
int64_t localNet(const System& sys, const Config& cfg, int rank, int channel, int* dev = nullptr);
/// The GPU (index) that uses NET `netId` first (ncclTopoGetLocalGpu), or -1.
int localGpuOfNet(const System& sys, const Config& cfg, int64_t netId);
/// Whether GPU Direct RDMA is used between `rank`'s GPU and a NET.
GdrMode checkGdr(const System& sys, const Config& cfg, int rank, int64_t netId, bool read);
/// P2P allowed between two ranks of this system; *read is set for NVLink on Ampere.
bool checkP2p(const System& sys, const Config& cfg, int rank1, int rank2, bool* read = nullptr,
              int* intermediateRank = nullptr);
/// The GPU rank relaying `rank`'s traffic to `netId` (PXN), or `rank` itself.
int intermediateRank(const System& sys, int rank, int64_t netId);

/// Minimum / maximum path type from any GPU to any node of `type` (ncclTopoGetGpuMinPath / MaxPath).
int gpuMinPath(const System& sys, NodeType type);
int gpuMaxPath(const System& sys, NodeType type);

/// Closest NICs of a GPU, ordered by path type then bandwidth (descending), and closest GPUs of a NIC.
std::vector<int> closestNets(const System& sys, int gpu);
std::vector<int> closestGpus(const System& sys, int net);

/// The cpuset (NCCL's hex mask form, from the XML's `affinity`) of the CPU closest to a GPU: where that rank's
/// threads should run. Empty when the topology has no affinity.
std::string cpuAffinity(const System& sys, int gpu);

/// Number of channels NCCL gives point-to-point operations to a peer (ncclTopoGetNchannels).
int p2pChannelsToPeer(const System& sys, const Config& cfg, int gpu, int peerRank);

}  // namespace topocoll::paths
