// Reductions and copies on GPU memory (docs/gpu.md, "Device reductions"): the device side of the collectives'
// element-wise arithmetic. Results are bit-identical to the host's reduceMany + finishAvg (reduce.h) for every data
// type and operation, except the bit pattern of a NaN that arithmetic produces (x86 returns an operand's NaN,
// the GPU its canonical one; both are NaN). Every function exists in a build without CUDA: available() is then
// false and reduce/copy throw kInvalidUsage.
//
//   if (collectives::device::available()) {
//     const void* srcs[2] = {mine, peers};                     // device pointers (own or CUDA-IPC-mapped)
//     device::reduce(DataType::kFloat32, RedOp::kAvg, out, srcs, 2, n, /*avgRanks=*/2, stream);
//     cudaStreamSynchronize(stream);                           // reduce only enqueues
//   }
#pragma once

#include <cstddef>

#include "topocoll/datatype.h"

namespace topocoll::collectives::device {

constexpr int kMaxSources = 32;

/// Whether the GPU kernels are built in and a device is usable (cuda::deviceCount() > 0).
bool available();

/// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], LEFT TO RIGHT exactly as the host's
/// collectives::reduceMany (half/bf16/fp8 in fp32 and rounded the same way), then, when avgRanks > 0, the host's
/// finishAvg(dst, avgRanks) semantics (integers: truncating division). 1 <= nSrcs <= kMaxSources, all pointers
/// device-accessible (own memory or CUDA-IPC-mapped peers' memory), dst may alias srcs[k] exactly. Enqueued on
/// `stream` (a cudaStream_t, nullptr = legacy default stream); returns at once. Throws Error naming type, op and
/// the CUDA error on failure; kInvalidArgument for a bad type/op/nSrcs.
void reduce(DataType type, RedOp op, void* dst, const void* const* srcs, int nSrcs, size_t count, int avgRanks,
            void* stream);

/// cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream) with the same error reporting.
void copy(void* dst, const void* src, size_t bytes, void* stream);

}  // namespace topocoll::collectives::device
