// The CUDA IPC part of a P2P connection between two GPU ranks (NCCL 2.30.7 src/transport/p2p.cc: p2pSendSetup /
// p2pRecvSetup ask the proxy for a buffer, ncclP2pAllocateShareableBuffer, p2pMap; Apache-2.0; our own code). The
// connection's Simple FIFO data lives in device memory, allocated by the owner's proxy (the receiver's in write mode,
// the sender's in read mode) with cudaMalloc and exported with cudaIpcGetMemHandle; the counters, the LL lines and
// the host Simple slots (host buffers, step headers) stay in the host block of the shared-memory P2P connection.
#pragma once

#include <cstdint>
#include <string>

#include "topocoll/transport/proxy.h"
#include "topocoll/transport/transport.h"

namespace topocoll::transport {

/// The connect record's payload between GPU ranks: exactly the 100 bytes NCCL's ncclConnect leaves.
#pragma pack(push, 4)
struct CudaIpcInfo {
  ShareableBuffer buf;      // host block (counters, LL, host Simple slots); buf.reserved: the single-copy probe nonce
  uint8_t handle[64] = {};  // cudaIpcMemHandle_t of the device FIFO; same process: its address in the first 8 bytes
  uint64_t devSize = 0;     // bytes of the device FIFO this side owns (0: the peer owns it)
  uint32_t flags = 0;       // CudaIpcFlags
};
#pragma pack(pop)
static_assert(sizeof(CudaIpcInfo) == sizeof(ConnectRecord::payload), "handle 64 + size + flags + host block");

enum CudaIpcFlags : uint32_t {
  kIpcRead = 1u << 0,    // read mode: the sender owns the device FIFO
  kIpcDirect = 1u << 1,  // same process, P2P direct (host buffers by pointer)
  kIpcOwner = 1u << 2,   // this record's side owns the device FIFO (handle and devSize are set)
  kIpcSameProcess = 1u << 3,
};
constexpr uint32_t kIpcKnownFlags = 0xf;

/// Why the peer's record must be refused ("" when acceptable): unknown flags, a read/write mode other than ours, a
/// device FIFO owned by the wrong side or of another size than `devSize` (NCCL_BUFFSIZE differs), a same-process
/// claim from another process or a null address.
std::string checkCudaIpcInfo(const CudaIpcInfo& peer, bool read, bool peerSends, bool sameProcess, uint64_t devSize);

/// Device FIFOs this process's proxies have allocated and not freed, and peers' FIFOs it has opened and not closed.
struct CudaIpcCounts {
  long allocated = 0, imported = 0;
};
CudaIpcCounts cudaIpcCounts();

}  // namespace topocoll::transport
