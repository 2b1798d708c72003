// GB/s of the device reductions (include/topocoll/collectives/device.h) next to cudaMemcpy device to device in the
// same run (docs/gpu.md, "Device reductions"). Bandwidth counts every byte moved through memory: a reduce of n
// sources of B bytes reads n*B and writes B, a copy of B bytes reads B and writes B; time is the median of
// --iters runs timed with CUDA events. "of copy" is the reduce's bandwidth over the copy's at the same B.
//
//   device_reduce_bench [--mib 256] [--iters 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "topocoll/collectives/device.h"
#include "topocoll/cuda.h"
#include "topocoll/status.h"

namespace {

using topocoll::DataType;
using topocoll::RedOp;
namespace device = topocoll::collectives::device;

#define CHECK(call)                                                           \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// Median seconds of one run of f.
double timeIt(int iters, const std::function<void()>& f) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();  // warm up
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(a));
    f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1e3);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 256;
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mib")) mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  if (!device::available()) {
    std::printf("no GPU: %s\n", topocoll::cuda::unavailableReason().c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; buffers of %zu MiB; median of %d runs\n", prop.name, prop.multiProcessorCount, mib,
              iters);
  const size_t bytes = mib << 20;
  constexpr int kMaxSrc = 8;
  std::vector<void*> buf(kMaxSrc + 1);
  for (auto& p : buf) {
    CHECK(cudaMalloc(&p, bytes + 16));
    CHECK(cudaMemset(p, 0, bytes + 16));  // zeros: finite in every type, so no NaN slow paths
  }
  double copyS = timeIt(iters, [&] { CHECK(cudaMemcpy(buf[1], buf[0], bytes, cudaMemcpyDeviceToDevice)); });
  double copyGBs = 2.0 * bytes / copyS / 1e9;
  std::printf("%-28s %10s %12s %10s\n", "what", "time us", "GB/s (r+w)", "of copy");
  std::printf("%-28s %10.1f %12.1f %9.0f%%\n", "cudaMemcpy D2D", copyS * 1e6, copyGBs, 100.0);
  struct Case {
    DataType type;
    RedOp op;
    int n;
    size_t offset;     // bytes added to every source pointer (all 16-byte aligned when both are 0)
    size_t dstOffset;  // and to the destination
  };
  const Case cases[] = {
      {DataType::kFloat32, RedOp::kSum, 1, 0, 0},    {DataType::kFloat32, RedOp::kSum, 2, 0, 0},
      {DataType::kFloat32, RedOp::kSum, 4, 0, 0},    {DataType::kFloat32, RedOp::kSum, 8, 0, 0},
      {DataType::kFloat32, RedOp::kAvg, 2, 0, 0},    {DataType::kFloat32, RedOp::kSum, 2, 4, 4},
      {DataType::kFloat32, RedOp::kSum, 2, 4, 8},    {DataType::kFloat16, RedOp::kSum, 2, 0, 0},
      {DataType::kBfloat16, RedOp::kSum, 2, 0, 0},   {DataType::kFloat8e4m3, RedOp::kSum, 2, 0, 0},
      {DataType::kFloat8e5m2, RedOp::kSum, 2, 0, 0}, {DataType::kFloat64, RedOp::kSum, 2, 0, 0},
      {DataType::kInt32, RedOp::kSum, 2, 0, 0},      {DataType::kInt8, RedOp::kMax, 2, 0, 0},
      {DataType::kFloat16, RedOp::kSum, 8, 0, 0},    {DataType::kFloat8e4m3, RedOp::kSum, 8, 0, 0},
  };
  for (const Case& c : cases) {
    std::vector<const void*> srcs;
    for (int s = 0; s < c.n; ++s) srcs.push_back(static_cast<char*>(buf[s]) + c.offset);
    void* dst = static_cast<char*>(buf[kMaxSrc]) + c.dstOffset;
    size_t count = bytes / topocoll::sizeOf(c.type);
    int avg = c.op == RedOp::kAvg ? c.n : 0;
    double s = timeIt(iters, [&] { device::reduce(c.type, c.op, dst, srcs.data(), c.n, count, avg, nullptr); });
    double gbs = (c.n + 1.0) * count * topocoll::sizeOf(c.type) / s / 1e9;
    std::string what = std::string(topocoll::to_string(c.type)) + " " + topocoll::to_string(c.op) + " x" +
                       std::to_string(c.n) + (c.offset == c.dstOffset ? (c.offset ? " offset 4" : "") : " offsets 4/8");
    std::printf("%-28s %10.1f %12.1f %9.0f%%\n", what.c_str(), s * 1e6, gbs, 100.0 * gbs / copyGBs);
  }
  for (auto p : buf) CHECK(cudaFree(p));
  return 0;
}
