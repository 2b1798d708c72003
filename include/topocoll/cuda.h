// The GPU path's small shared vocabulary (docs/gpu.md): whether CUDA was built in, whether a device is usable, what
// a pointer is, and CUDA errors as topocoll::Error naming the call, file and line. Every function works in a build
// without CUDA (it then reports no device), so callers need no #ifdef; only code that calls the CUDA runtime itself
// includes <cuda_runtime.h> under TOPOCOLL_HAVE_CUDA.
//
//   if (topocoll::cuda::deviceCount() > 0) { ... }
//   auto where = topocoll::cuda::locate(ptr);            // {kDevice, dev 0} for cudaMalloc'ed memory
//   TC_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));   // throws Error("cudaMemcpyAsync ...: ...")
#pragma once

#include <cstddef>
#include <string>

namespace topocoll::cuda {

/// Whether this build has the GPU path (nvcc was found at configure time).
bool built();
/// CUDA devices visible to this process; 0 without a CUDA build, a driver or a GPU. Never throws.
int deviceCount();
/// Why deviceCount() is 0 ("built without CUDA", "no CUDA driver: ...", "no GPU"), "" when a device is there.
std::string unavailableReason();

enum class MemoryKind { kHost, kDevice, kManaged };
struct Location {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // the device owning it (kDevice, kManaged)
};
/// Where `p` lives. Host memory (pageable, pinned, or unknown to CUDA) for every pointer when no device is usable, or
/// while no device's primary context is active in this process (it has no device memory then, and asking CUDA would
/// create a context: host-memory jobs on GPU machines stay free of CUDA). Device memory of contexts made with the
/// driver API's cuCtxCreate alone is not recognised.
Location locate(const void* p);

/// The process's current CUDA device when the process has started using it (its primary context is active: it
/// called cudaSetDevice, allocated, launched, ... as every NCCL program does before ncclCommInitRank), else -1. A
/// process that never touched CUDA (a host-memory job on a GPU machine: PyTorch CPU tensors, host perf runs) is
/// not a GPU rank, so several of them on one machine are not "duplicate GPUs". Never creates a context.
int deviceInUse();

/// Blocks until the work queued before now on `stream` (a cudaStream_t; nullptr: the legacy default stream) is done,
/// and, unless `stream` was created with cudaStreamNonBlocking, the work on the legacy default stream too: an operation
/// that NCCL would enqueue on `stream` then runs after everything it would have waited for (a plain cudaMemcpy
/// device-to-device returns before it is done). Nothing to do without a usable device.
void waitForCaller(void* stream);

/// Throws Error(kSystemError) "<call> failed at <file>:<line>: <cuda error name>: <text>" when rc is not 0.
void check(int rc, const char* call, const char* file, int line);

}  // namespace topocoll::cuda

#define TC_CUDA(call) ::topocoll::cuda::check(static_cast<int>(call), #call, __FILE__, __LINE__)
