// Argument checks and errors of the device reductions (include/topocoll/collectives/device.h); the kernels are in
// device_kernels.cu, built only with CUDA.
#include "topocoll/collectives/device.h"

#include "topocoll/cuda.h"
#include "topocoll/status.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>

#include "device_launch.h"
#endif

namespace topocoll::collectives::device {

bool available() { return cuda::deviceCount() > 0; }

namespace {
[[noreturn]] void unavailable(const char* what) {
  fail(StatusCode::kInvalidUsage, "device {}: no GPU path: {}", what, cuda::unavailableReason());
}
}  // namespace

void reduce(DataType type, RedOp op, void* dst, const void* const* srcs, int nSrcs, size_t count, int avgRanks,
            void* stream) {
  if (!isValid(type)) fail(StatusCode::kInvalidArgument, "device reduce: unknown data type {}", static_cast<int>(type));
  if (!isValid(op)) {
    fail(StatusCode::kInvalidArgument, "device reduce of {}: unknown reduction op {}", to_string(type),
         static_cast<int>(op));
  }
  if (nSrcs < 1 || nSrcs > kMaxSources) {
    fail(StatusCode::kInvalidArgument, "device reduce of {} {}: {} sources (1 to {})", to_string(type), to_string(op),
         nSrcs, kMaxSources);
  }
  if (avgRanks < 0) {
    fail(StatusCode::kInvalidArgument, "device reduce of {} {}: average over {} ranks", to_string(type), to_string(op),
         avgRanks);
  }
  // finishAvg divides by the count cast to the element type: 256 ranks would divide one-byte integers by zero.
  bool intType = static_cast<int>(type) <= static_cast<int>(DataType::kUint64);
  if (avgRanks > 1 && intType && sizeOf(type) == 1 && avgRanks % 256 == 0) {
    fail(StatusCode::kInvalidArgument, "device reduce of {} {}: average over {} ranks divides by zero in {}",
         to_string(type), to_string(op), avgRanks, to_string(type));
  }
  if (count == 0) return;
  if (dst == nullptr || srcs == nullptr) {
    fail(StatusCode::kInvalidArgument, "device reduce of {} {}: null {} for {} elements", to_string(type),
         to_string(op), dst == nullptr ? "destination" : "source list", count);
  }
  for (int s = 0; s < nSrcs; ++s) {
    if (srcs[s] == nullptr) {
      fail(StatusCode::kInvalidArgument, "device reduce of {} {}: source {} is null for {} elements", to_string(type),
           to_string(op), s, count);
    }
  }
#ifdef TOPOCOLL_HAVE_CUDA
  if (!available()) unavailable("reduce");
  int rc =
      detail::launchReduce(static_cast<int>(type), static_cast<int>(op), dst, srcs, nSrcs, count, avgRanks, stream);
  if (rc != 0) {
    auto e = static_cast<cudaError_t>(rc);
    (void)cudaGetLastError();
    fail(StatusCode::kSystemError, "device reduce of {} {} ({} sources, {} elements) failed: {}: {}", to_string(type),
         to_string(op), nSrcs, count, cudaGetErrorName(e), cudaGetErrorString(e));
  }
#else
  (void)stream;
  unavailable("reduce");
#endif
}

void copy(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
#ifdef TOPOCOLL_HAVE_CUDA
  if (!available()) unavailable("copy");
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(StatusCode::kSystemError, "device copy of {} bytes failed: cudaMemcpyAsync: {}: {}", bytes,
         cudaGetErrorName(e), cudaGetErrorString(e));
  }
#else
  (void)dst, (void)src, (void)stream;
  unavailable("copy");
#endif
}

}  // namespace topocoll::collectives::device
