// Between device.cc (argument checks, errors; compiled by the C++ compiler) and device_kernels.cu (the kernels;
// compiled by nvcc, which then needs none of our headers that pull in fmt).
#pragma once

#include <cstddef>

namespace topocoll::collectives::device::detail {

/// Enqueues dst = srcs[0] op ... op srcs[n-1] (then / avgRanks when avgRanks > 1) on `stream`; arguments already
/// checked (type 0..11, op 0..4, 1 <= n <= kMaxSources, count > 0). Returns the cudaError_t of the launch.
int launchReduce(int type, int op, void* dst, const void* const* srcs, int n, size_t count, int avgRanks, void* stream);

}  // namespace topocoll::collectives::device::detail
