#include "topocoll/cuda.h"

#include <atomic>
#include <mutex>

#include "topocoll/status.h"

#ifdef TOPOCOLL_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>
#endif

namespace topocoll::cuda {

namespace {
struct Probe {
  int count = 0;
  std::string why;
};

const Probe& probe() {
  static Probe p;
  static std::once_flag once;
  std::call_once(once, [] {
#ifdef TOPOCOLL_HAVE_CUDA
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
      p.why = fmt::format("no usable CUDA driver or device: {} ({})", cudaGetErrorName(rc), cudaGetErrorString(rc));
      (void)cudaGetLastError();  // not sticky: later calls must not see it
      n = 0;
    } else if (n == 0) {
      p.why = "no GPU";
    }
    p.count = n;
#else
    p.why = "built without CUDA (nvcc was not found at configure time)";
#endif
  });
  return p;
}
}  // namespace

#ifdef TOPOCOLL_HAVE_CUDA
namespace {
// cuDevicePrimaryCtxGetState and cuDeviceGet through the runtime's entry point table (nothing links libcuda),
// looked up once.
struct PrimaryCtxQuery {
  using StateFn = CUresult (*)(CUdevice, unsigned*, int*);
  using GetFn = CUresult (*)(CUdevice*, int);
  StateFn state = nullptr;
  GetFn get = nullptr;
};
const PrimaryCtxQuery& primaryCtxQuery() {
  static const PrimaryCtxQuery q = [] {
    PrimaryCtxQuery r;
    void* state = nullptr;
    void* get = nullptr;
    cudaDriverEntryPointQueryResult q1{}, q2{};
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &state, 12000, cudaEnableDefault, &q1) ==
            cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuDeviceGet", &get, 12000, cudaEnableDefault, &q2) == cudaSuccess) {
      r.state = reinterpret_cast<PrimaryCtxQuery::StateFn>(state);
      r.get = reinterpret_cast<PrimaryCtxQuery::GetFn>(get);
    }
    (void)cudaGetLastError();
    return r;
  }();
  return q;
}
}  // namespace
#endif

#ifdef TOPOCOLL_HAVE_CUDA
namespace {
// Whether any device's primary context is active in this process (true when it cannot tell).
bool anyDeviceInUse() {
  const PrimaryCtxQuery& q = primaryCtxQuery();
  if (q.state == nullptr || q.get == nullptr) return true;
  for (int d = 0; d < deviceCount(); ++d) {
    CUdevice cu = 0;
    unsigned flags = 0;
    int active = 0;
    if (q.get(&cu, d) != CUDA_SUCCESS || q.state(cu, &flags, &active) != CUDA_SUCCESS || active) return true;
  }
  return false;
}
}  // namespace
#endif

bool built() {
#ifdef TOPOCOLL_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int deviceCount() { return probe().count; }

std::string unavailableReason() { return probe().why; }

Location locate(const void* p) {
  Location loc;
#ifdef TOPOCOLL_HAVE_CUDA
  if (p == nullptr || deviceCount() == 0) return loc;
  // A process that has not used CUDA has no device memory: its host-memory collectives on a GPU machine must not
  // create a CUDA context (hundreds of MiB of GPU memory per process) by asking. Once used, it stays used.
  static std::atomic<bool> used{false};
  if (!used.load(std::memory_order_relaxed)) {
    if (!anyDeviceInUse()) return loc;  // every device: the buffer's need not be this thread's current one
    used.store(true, std::memory_order_relaxed);
  }
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return loc;
  }
  if (a.type == cudaMemoryTypeDevice) {
    loc.kind = MemoryKind::kDevice;
    loc.device = a.device;
  } else if (a.type == cudaMemoryTypeManaged) {
    loc.kind = MemoryKind::kManaged;
    loc.device = a.device;
  }
#else
  (void)p;
#endif
  return loc;
}

int deviceInUse() {
#ifdef TOPOCOLL_HAVE_CUDA
  if (deviceCount() == 0) return -1;
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {  // does not create a context
    (void)cudaGetLastError();
    return -1;
  }
  const PrimaryCtxQuery& q = primaryCtxQuery();
  if (q.state == nullptr || q.get == nullptr) return dev;  // cannot tell: a GPU rank, as NCCL would have it
  CUdevice cu = 0;
  unsigned flags = 0;
  int active = 0;
  if (q.get(&cu, dev) != CUDA_SUCCESS || q.state(cu, &flags, &active) != CUDA_SUCCESS) return dev;
  return active ? dev : -1;
#else
  return -1;
#endif
}

void waitForCaller(void* stream) {
#ifdef TOPOCOLL_HAVE_CUDA
  if (deviceCount() == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  TC_CUDA(cudaStreamSynchronize(st));
  unsigned flags = 0;
  if (st != nullptr && st != cudaStreamLegacy) TC_CUDA(cudaStreamGetFlags(st, &flags));
  if ((flags & cudaStreamNonBlocking) == 0) TC_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
#else
  (void)stream;
#endif
}

void check(int rc, const char* call, const char* file, int line) {
  if (rc == 0) return;
#ifdef TOPOCOLL_HAVE_CUDA
  auto e = static_cast<cudaError_t>(rc);
  (void)cudaGetLastError();
  fail(StatusCode::kSystemError, "{} failed at {}:{}: {}: {}", call, file, line, cudaGetErrorName(e),
       cudaGetErrorString(e));
#else
  fail(StatusCode::kSystemError, "{} failed at {}:{}: error {}", call, file, line, rc);
#endif
}

}  // namespace topocoll::cuda
