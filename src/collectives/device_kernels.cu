// The device reductions (include/topocoll/collectives/device.h, docs/gpu.md "Device reductions"): one kernel per
// (data type, op), avg sharing sum's with a division at the end. Each thread folds the sources left to right into
// registers and stores once, so dst may alias any source exactly. When every pointer has the same offset within
// 16 bytes, the elements before the first 16-byte boundary (head) and after the last (tail) are done one by one
// and the rest with 16-byte loads and stores; otherwise every element is done one by one. The grid fills the GPU
// once (SMs x resident blocks per SM) and strides over the data.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device_launch.h"
#include "device_math.h"
#include "topocoll/collectives/device.h"

namespace topocoll::collectives::device::detail {

namespace {

namespace dm = device_math;

constexpr int kThreads = 512;

struct Args {
  void* dst;
  const void* srcs[kMaxSources];
  int nSrcs;
  int avgRanks;    // divide at the end when > 1
  size_t head;     // elements done one by one before the 16-byte body
  size_t chunks;   // 16-byte chunks of the body
  size_t scalars;  // head + tail
};

// ---- element operations, as reduce.cc's ---------------------------------------------------------------------------

enum Op { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };

// Integers wrap (computed unsigned); avg divides truncating by the count cast to the element type, as finishAvg.
template <typename T, int kOp>
struct IntOp {
  using Elem = T;
  __device__ __forceinline__ static T apply(T a, T b) {
    using U = std::make_unsigned_t<T>;
    if constexpr (kOp == kProd) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    else if constexpr (kOp == kMax) return a > b ? a : b;
    else if constexpr (kOp == kMin) return a < b ? a : b;
    else return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
  __device__ __forceinline__ static T divide(T x, int k) { return static_cast<T>(x / static_cast<T>(k)); }
};

// Max and min propagate NaN (the first operand's when both are), unlike fmaxf; +0/-0 ties give the second operand.
template <typename F>
__device__ __forceinline__ F maxNan(F a, F b) {
  return a != a ? a : (b != b ? b : (a > b ? a : b));
}
template <typename F>
__device__ __forceinline__ F minNan(F a, F b) {
  return a != a ? a : (b != b ? b : (a < b ? a : b));
}

struct F32 {
  __device__ __forceinline__ static float add(float a, float b) { return __fadd_rn(a, b); }
  __device__ __forceinline__ static float mul(float a, float b) { return __fmul_rn(a, b); }
  __device__ __forceinline__ static float div(float a, int k) { return __fdiv_rn(a, static_cast<float>(k)); }
};
struct F64 {
  __device__ __forceinline__ static double add(double a, double b) { return __dadd_rn(a, b); }
  __device__ __forceinline__ static double mul(double a, double b) { return __dmul_rn(a, b); }
  __device__ __forceinline__ static double div(double a, int k) { return __ddiv_rn(a, static_cast<double>(k)); }
};

template <typename F, typename Arith, int kOp>
__device__ __forceinline__ F floatApply(F a, F b) {
  if constexpr (kOp == kProd) return Arith::mul(a, b);
  else if constexpr (kOp == kMax) return maxNan(a, b);
  else if constexpr (kOp == kMin) return minNan(a, b);
  else return Arith::add(a, b);
}

template <typename F, typename Arith, int kOp>
struct FloatOp {
  using Elem = F;
  __device__ __forceinline__ static F apply(F a, F b) { return floatApply<F, Arith, kOp>(a, b); }
  __device__ __forceinline__ static F divide(F x, int k) { return Arith::div(x, k); }
};

// Half, bfloat16, fp8: decode to fp32, reduce, round back at every step.
template <typename Bits, float (*Dec)(Bits), Bits (*Enc)(float), int kOp>
struct NarrowOp {
  using Elem = Bits;
  __device__ __forceinline__ static Bits apply(Bits a, Bits b) {
    return Enc(floatApply<float, F32, kOp>(Dec(a), Dec(b)));
  }
  __device__ __forceinline__ static Bits divide(Bits x, int k) { return Enc(F32::div(Dec(x), k)); }
};
template <int kOp>
using HalfOp = NarrowOp<uint16_t, dm::halfToFloat, dm::floatToHalf, kOp>;
template <int kOp>
using Bf16Op = NarrowOp<uint16_t, dm::bf16ToFloat, dm::floatToBf16, kOp>;
template <int kOp>
using E4M3Op = NarrowOp<uint8_t, dm::E4M3::decode, dm::E4M3::encode, kOp>;
template <int kOp>
using E5M2Op = NarrowOp<uint8_t, dm::E5M2::decode, dm::E5M2::encode, kOp>;

// ---- the kernel ---------------------------------------------------------------------------------------------------

template <typename E>
union Chunk {
  uint4 v;
  E e[sizeof(uint4) / sizeof(E)];
};

template <class Op>
__global__ void __launch_bounds__(kThreads) reduceKernel(const Args a) {
  using E = typename Op::Elem;
  constexpr int kPer = sizeof(uint4) / sizeof(E);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int n = a.nSrcs;
  const bool avg = a.avgRanks > 1;

  // Body: 16-byte chunks starting after the head.
  for (size_t c = first; c < a.chunks; c += stride) {
    Chunk<E> acc, in;
    acc.v = reinterpret_cast<const uint4*>(static_cast<const E*>(a.srcs[0]) + a.head)[c];
#pragma unroll 4
    for (int s = 1; s < n; ++s) {
      in.v = reinterpret_cast<const uint4*>(static_cast<const E*>(a.srcs[s]) + a.head)[c];
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc.e[j] = Op::apply(acc.e[j], in.e[j]);
    }
    if (avg) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) acc.e[j] = Op::divide(acc.e[j], a.avgRanks);
    }
    reinterpret_cast<uint4*>(static_cast<E*>(a.dst) + a.head)[c] = acc.v;
  }

  // Head and tail (or everything, when the pointers' offsets differ) element by element.
  const size_t bodyElems = a.chunks * kPer;
  for (size_t j = first; j < a.scalars; j += stride) {
    size_t i = j < a.head ? j : j + bodyElems;
    E acc = static_cast<const E*>(a.srcs[0])[i];
    for (int s = 1; s < n; ++s) acc = Op::apply(acc, static_cast<const E*>(a.srcs[s])[i]);
    if (avg) acc = Op::divide(acc, a.avgRanks);
    static_cast<E*>(a.dst)[i] = acc;
  }
}

int smCount() {
  static int cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 1;
  if (dev < 64 && cached[dev] > 0) return cached[dev];
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1) sms = 1;
  if (dev < 64) cached[dev] = sms;
  return sms;
}

template <class Op>
int launch(void* dst, const void* const* srcs, int n, size_t count, int avgRanks, cudaStream_t stream) {
  using E = typename Op::Elem;
  constexpr size_t kPer = sizeof(uint4) / sizeof(E);
  Args a{};
  a.dst = dst;
  a.nSrcs = n;
  a.avgRanks = avgRanks;
  uintptr_t misalign = reinterpret_cast<uintptr_t>(dst) % sizeof(uint4);
  bool same = misalign % sizeof(E) == 0;
  for (int s = 0; s < n; ++s) {
    a.srcs[s] = srcs[s];
    same = same && reinterpret_cast<uintptr_t>(srcs[s]) % sizeof(uint4) == misalign;
  }
  if (same) {
    a.head = (misalign == 0 ? 0 : (sizeof(uint4) - misalign) / sizeof(E));
    if (a.head > count) a.head = count;
    a.chunks = (count - a.head) / kPer;
    a.scalars = count - a.chunks * kPer;
  } else {
    a.head = a.scalars = count;
  }
  // Resident blocks per SM for this kernel on this GPU (one kind of GPU per process is assumed for the cache).
  static const int perSm = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, reduceKernel<Op>, kThreads, 0) != cudaSuccess || b < 1) {
      (void)cudaGetLastError();
      b = 1;
    }
    return b;
  }();
  size_t work = a.chunks > a.scalars ? a.chunks : a.scalars;
  size_t blocks = (work + kThreads - 1) / kThreads;
  size_t full = static_cast<size_t>(smCount()) * perSm;
  if (blocks > full) blocks = full;
  if (blocks < 1) blocks = 1;
  void* params[] = {&a};
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(&reduceKernel<Op>),
                                           dim3(static_cast<unsigned>(blocks)), dim3(kThreads), params, 0, stream));
}

template <template <int> class OpOf>
int byOp(int op, void* dst, const void* const* srcs, int n, size_t count, int avgRanks, cudaStream_t stream) {
  switch (op) {
    case kProd: return launch<OpOf<kProd>>(dst, srcs, n, count, avgRanks, stream);
    case kMax: return launch<OpOf<kMax>>(dst, srcs, n, count, avgRanks, stream);
    case kMin: return launch<OpOf<kMin>>(dst, srcs, n, count, avgRanks, stream);
    default: return launch<OpOf<kSum>>(dst, srcs, n, count, avgRanks, stream);  // sum, avg
  }
}

template <typename T>
struct Int {
  template <int kOp>
  using Op = IntOp<T, kOp>;
};
template <int kOp>
using Float32Op = FloatOp<float, F32, kOp>;
template <int kOp>
using Float64Op = FloatOp<double, F64, kOp>;

}  // namespace

int launchReduce(int type, int op, void* dst, const void* const* srcs, int n, size_t count, int avgRanks,
                 void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (type) {  // DataType's values (datatype.h)
    case 0: return byOp<Int<int8_t>::Op>(op, dst, srcs, n, count, avgRanks, s);
    case 1: return byOp<Int<uint8_t>::Op>(op, dst, srcs, n, count, avgRanks, s);
    case 2: return byOp<Int<int32_t>::Op>(op, dst, srcs, n, count, avgRanks, s);
    case 3: return byOp<Int<uint32_t>::Op>(op, dst, srcs, n, count, avgRanks, s);
    case 4: return byOp<Int<int64_t>::Op>(op, dst, srcs, n, count, avgRanks, s);
    case 5: return byOp<Int<uint64_t>::Op>(op, dst, srcs, n, count, avgRanks, s);
    case 6: return byOp<HalfOp>(op, dst, srcs, n, count, avgRanks, s);
    case 7: return byOp<Float32Op>(op, dst, srcs, n, count, avgRanks, s);
    case 8: return byOp<Float64Op>(op, dst, srcs, n, count, avgRanks, s);
    case 9: return byOp<Bf16Op>(op, dst, srcs, n, count, avgRanks, s);
    case 10: return byOp<E4M3Op>(op, dst, srcs, n, count, avgRanks, s);
    case 11: return byOp<E5M2Op>(op, dst, srcs, n, count, avgRanks, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace topocoll::collectives::device::detail
