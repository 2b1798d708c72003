// Copies whose destination nobody reads soon, shared by the transports and the collectives.
#pragma once

#include <cstddef>

namespace topocoll {

/// memcpy whose stores bypass the caches (x86-64: SSE2 non-temporal stores, then a store fence; elsewhere memcpy):
/// for large copies whose destination nobody reads soon. A regular store first reads its line for ownership; these
/// do not, so a copy out of DRAM moves two accesses per byte instead of three. dst and src must not overlap.
void copyStreaming(void* dst, const void* src, size_t bytes);

/// Messages (a collective's output, a point-to-point message) from this size are not expected to stay in the caches
/// (the project's machines have 1-4 MiB of L2 per core): their copies into memory nobody reads during the call use
/// copyStreaming. Measured (bench/results/2026-11-24-coll-streaming-copies-ab-7d972f8.md; docs/transport.md,
/// "Shareable buffers"): 1.2-1.6x at 16-64 MiB, slower at 1-4 MiB, where the destination would stay in the cache.
constexpr size_t kStreamCopyMin = size_t{16} << 20;

}  // namespace topocoll
