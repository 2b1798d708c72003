// topocoll-perf --device: device buffers (cudaMalloc, as nccl-tests allocates), a stream per rank, the device's own
// cudaMemcpy device-to-device bandwidth measured in the run, and the copy bound of each collective on ONE GPU shared
// by every rank (docs/gpu.md, "Device collectives"). Without a CUDA build every entry fails with the reason.
#include <algorithm>
#include <chrono>

#include "perf.h"
#include "topocoll/cuda.h"
#include "topocoll/status.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace topocoll::perf {

#ifdef TOPOCOLL_HAVE_CUDA
void* deviceAlloc(size_t bytes) {
  void* p = nullptr;
  TC_CUDA(cudaMalloc(&p, bytes));
  return p;
}
void deviceFree(void* p) { TC_CUDA(cudaFree(p)); }
// Synchronized: a cudaMemcpy from pageable memory may return before the data landed, and the collectives run on a
// non-blocking stream that nothing orders after it.
void toDevice(void* dst, const void* src, size_t bytes) {
  TC_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  TC_CUDA(cudaDeviceSynchronize());
}
void toHost(void* dst, const void* src, size_t bytes) { TC_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault)); }
void selectDevice(int localRank) {
  const int n = cuda::deviceCount();
  if (n == 0) fail(StatusCode::kInvalidUsage, "--device: {}", cuda::unavailableReason());
  TC_CUDA(cudaSetDevice(std::max(localRank, 0) % n));
}
void* deviceStream() {
  cudaStream_t s = nullptr;
  TC_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
std::string deviceName() {
  int d = 0;
  TC_CUDA(cudaGetDevice(&d));
  cudaDeviceProp p{};
  TC_CUDA(cudaGetDeviceProperties(&p, d));
  return fmt::format("{} (device {}, bus {:04x}:{:02x}:{:02x})", p.name, d, p.pciDomainID, p.pciBusID, p.pciDeviceID);
}
double copyBandwidth(size_t bytes, int iters) {
  void *a = deviceAlloc(bytes), *b = deviceAlloc(bytes);
  TC_CUDA(cudaMemset(a, 1, bytes));
  TC_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // warm-up
  TC_CUDA(cudaDeviceSynchronize());
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) TC_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  TC_CUDA(cudaDeviceSynchronize());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  deviceFree(a);
  deviceFree(b);
  return static_cast<double>(bytes) * iters / s / 1e9;
}
#else
[[noreturn]] void noCuda() { fail(StatusCode::kInvalidUsage, "--device: {}", cuda::unavailableReason()); }
void* deviceAlloc(size_t) { noCuda(); }
void deviceFree(void*) {}
void toDevice(void*, const void*, size_t) { noCuda(); }
void toHost(void*, const void*, size_t) { noCuda(); }
void selectDevice(int) { noCuda(); }
void* deviceStream() { noCuda(); }
std::string deviceName() { noCuda(); }
double copyBandwidth(size_t, int) { noCuda(); }
#endif

double copyTraffic(const std::string& test, int n, bool inPlace, double c) {
  const double k = inPlace ? n - 1 : n;  // the ranks (or pieces) that copy
  if (test == "all_reduce_perf") return c * (3.0 * n - 1);  // two-shot: reduce (S + S/n per rank), gather 2(n-1)S/n
  if (test == "all_gather_perf") return 2.0 * n * k * c;   // each rank copies k pieces of c
  if (test == "reduce_scatter_perf") return n * c * (n + 1.0);  // each rank reads n pieces of c, writes one
  if (test == "broadcast_perf") return 2.0 * k * c;
  if (test == "reduce_perf") return c * (n + 1.0);  // the root reads n inputs, writes one
  if (test == "alltoall_perf") return 2.0 * n * n * c * (inPlace ? 2 : 1);  // in place: the input copied aside first
  return 0;
}

}  // namespace topocoll::perf
