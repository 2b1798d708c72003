// Element-wise reductions. Each data type has one loop function compiled for several instruction sets
// (target_clones): the compiler vectorises the plain loops for AVX-512, AVX2 and the x86-64 baseline, and the
// dynamic loader picks the best clone for the CPU at start-up. No -march=native, so one binary runs anywhere.
#include "topocoll/collectives/reduce.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "topocoll/status.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TC_HAVE_F16C_PATH 1
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(TOPOCOLL_NO_TARGET_CLONES)
#define TC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TC_CLONES
#endif

namespace topocoll::collectives {

namespace {

// ---- conversions ------------------------------------------------------------------------------------------------

inline float bitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t floatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Branch-free select (all-ones mask picks a): keeps the conversion loops free of control flow so they vectorise.
inline uint32_t pick(bool cond, uint32_t a, uint32_t b) {
  uint32_t m = 0u - static_cast<uint32_t>(cond);
  return (a & m) | (b & ~m);
}

// IEEE binary16 <-> binary32 without branches (every case computed, the right one selected), so that the
// compiler vectorises the loops that use them; exact decode, round-to-nearest-even encode, NaN stays NaN.
inline float h2f(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t bits = static_cast<uint32_t>(h & 0x7fff) << 13;        // exponent and mantissa in place
  uint32_t exp = bits & 0x0f800000u;
  uint32_t normal = bits + ((127 - 15) << 23);
  uint32_t infnan = normal + ((128 - 16) << 23);                  // exponent all ones
  // Subnormal (and zero): the mantissa as a float with exponent 2^-14, minus the implicit one.
  float sub = bitsToFloat(normal + (1u << 23)) - bitsToFloat(113u << 23);
  uint32_t out = pick(exp == 0x0f800000u, infnan, pick(exp == 0, floatToBits(sub), normal));
  return bitsToFloat(out | sign);
}
inline uint16_t f2h(float f) {
  uint32_t u = floatToBits(f), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
  uint32_t infnan = pick(a > 0x7f800000u, 0x7e00u, 0x7c00u);
  // Subnormal results: adding 0.5 (as a float with exponent 2^-1) rounds at the right bit, to nearest even.
  const uint32_t denormMagic = ((127 - 15) + (23 - 10) + 1) << 23;
  uint32_t sub = floatToBits(bitsToFloat(a) + bitsToFloat(denormMagic)) - denormMagic;
  uint32_t norm = (a + (static_cast<uint32_t>(15 - 127) << 23) + 0xfff + ((a >> 13) & 1)) >> 13;
  uint32_t out = pick(a >= ((127 + 16) << 23), infnan, pick(a < (113u << 23), sub, norm));
  return static_cast<uint16_t>(out | sign);
}

inline float b2f(uint16_t b) { return bitsToFloat(static_cast<uint32_t>(b) << 16); }
inline uint16_t f2b(float f) {
  uint32_t u = floatToBits(f);
  uint32_t rounded = (u + 0x7fff + ((u >> 16) & 1)) >> 16, quiet = (u >> 16) | 0x40;
  return static_cast<uint16_t>(pick((u & 0x7fffffffu) > 0x7f800000u, quiet, rounded));
}

// fp8: decode by formula; encode by rounding to the nearest of the format's finite values (ties to the even code),
// saturating to the largest finite value, NaN to NaN.
template <int kExp, int kMan, int kBias, bool kIeeeInf>
struct Fp8 {
  static float decode(uint8_t v) {
    int sign = v >> 7, e = (v >> kMan) & ((1 << kExp) - 1), m = v & ((1 << kMan) - 1);
    float out;
    if (kIeeeInf && e == (1 << kExp) - 1) {
      out = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    } else if (!kIeeeInf && e == (1 << kExp) - 1 && m == (1 << kMan) - 1) {
      out = std::numeric_limits<float>::quiet_NaN();
    } else if (e == 0) {
      out = std::ldexp(static_cast<float>(m), 1 - kBias - kMan);
    } else {
      out = std::ldexp(1.0f + static_cast<float>(m) / (1 << kMan), e - kBias);
    }
    return sign ? -out : out;
  }
  // Codes 0..kMaxFinite in increasing order of value.
  static constexpr int kMaxFinite = kIeeeInf ? ((((1 << kExp) - 1) << kMan) - 1) : 0x7e;
  static const std::array<float, kMaxFinite + 1>& values() {
    static const auto table = [] {
      std::array<float, kMaxFinite + 1> t{};
      for (int c = 0; c <= kMaxFinite; ++c) t[c] = decode(static_cast<uint8_t>(c));
      return t;
    }();
    return table;
  }
  static uint8_t encode(float f) {
    uint8_t sign = std::signbit(f) ? 0x80 : 0;
    if (std::isnan(f)) return static_cast<uint8_t>(sign | (kIeeeInf ? 0x7f : 0x7f));
    float a = std::fabs(f);
    const auto& t = values();
    if (a >= t[kMaxFinite]) return static_cast<uint8_t>(sign | kMaxFinite);  // __NV_SATFINITE
    int hi = static_cast<int>(std::upper_bound(t.begin(), t.end(), a) - t.begin());  // t[hi-1] <= a < t[hi]
    int lo = hi - 1;
    float dlo = a - t[lo], dhi = t[hi] - a;
    int code = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    return static_cast<uint8_t>(sign | code);
  }
};
using E4M3 = Fp8<4, 3, 7, false>;
using E5M2 = Fp8<5, 2, 15, true>;

// ---- loops ------------------------------------------------------------------------------------------------------

// Integers wrap like NCCL's device code (computed in the unsigned type, so there is no undefined overflow).
template <typename T, int kOp>
struct IntOp {
  using U = std::make_unsigned_t<T>;
  T operator()(T a, T b) const {
    if constexpr (kOp == 1) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    else if constexpr (kOp == 2) return a > b ? a : b;
    else if constexpr (kOp == 3) return a < b ? a : b;
    else return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
};

// NCCL's max/min of floats propagate NaN (fmaxf would drop it).
template <typename F>
inline F fmaxNan(F a, F b) {
  return a != a ? a : (b != b ? b : (a > b ? a : b));
}
template <typename F>
inline F fminNan(F a, F b) {
  return a != a ? a : (b != b ? b : (a < b ? a : b));
}

template <typename F, int kOp>
struct FloatOp {
  F operator()(F a, F b) const {
    if constexpr (kOp == 1) return a * b;
    else if constexpr (kOp == 2) return fmaxNan(a, b);
    else if constexpr (kOp == 3) return fminNan(a, b);
    else return a + b;
  }
};

// Narrow floats: decode to fp32, reduce, round back.
template <typename Bits, float (*Dec)(Bits), Bits (*Enc)(float)>
struct Narrow {
  template <typename Ignored, int kOp>
  struct Op {
    Bits operator()(Bits a, Bits b) const { return Enc(FloatOp<float, kOp>{}(Dec(a), Dec(b))); }
  };
};

// One loop per (element type, op): the op is a loop-invariant switch the compiler unswitches, so each case is a
// plain vectorisable loop. Out of place, or in place (dst is one of the sources; every op here is commutative).
template <typename T, typename Op>
inline void run(Op f, void* dv, const void* av, const void* bv, size_t n) {
  T* __restrict d = static_cast<T*>(dv);
  if (dv == av && dv == bv) {
    for (size_t i = 0; i < n; ++i) d[i] = f(d[i], d[i]);
  } else if (dv == av || dv == bv) {
    const T* __restrict o = static_cast<const T*>(dv == av ? bv : av);
    for (size_t i = 0; i < n; ++i) d[i] = f(d[i], o[i]);
  } else {
    const T* __restrict a = static_cast<const T*>(av);
    const T* __restrict b = static_cast<const T*>(bv);
    for (size_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
  }
}

// Out of place with non-temporal stores (reduceStreaming): each 64-byte line of the output is computed into a local
// line (a vectorised loop; it stays in registers or the store buffer) and streamed out, so that the output's lines
// are not first read for ownership. Measured (2-rank ReduceScatter, 64 MiB out of place): 1.4x; reducing into an
// L1-sized buffer and streaming that out was no faster than regular stores.
template <typename T, typename Op>
inline void runStreaming(Op f, void* dv, const void* av, const void* bv, size_t n) {
  T* d = static_cast<T*>(dv);
  const T* a = static_cast<const T*>(av);
  const T* b = static_cast<const T*>(bv);
#if defined(TC_HAVE_F16C_PATH)
  constexpr size_t kLine = 64 / sizeof(T);
  size_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(d + i) % 64 != 0; ++i) d[i] = f(a[i], b[i]);
  for (; i + kLine <= n; i += kLine) {
    alignas(64) T line[kLine];
    for (size_t j = 0; j < kLine; ++j) line[j] = f(a[i + j], b[i + j]);
    const auto* src = reinterpret_cast<const __m128i*>(line);
    auto* dst = reinterpret_cast<__m128i*>(d + i);
    _mm_stream_si128(dst, _mm_load_si128(src));
    _mm_stream_si128(dst + 1, _mm_load_si128(src + 1));
    _mm_stream_si128(dst + 2, _mm_load_si128(src + 2));
    _mm_stream_si128(dst + 3, _mm_load_si128(src + 3));
  }
  for (; i < n; ++i) d[i] = f(a[i], b[i]);
  _mm_sfence();
#else
  for (size_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
#endif
}

// The op is a template parameter, so each (type, op) is its own plain loop the compiler vectorises.
template <typename T, template <typename, int> class Op, bool kStream = false>
inline void dispatch(int op, void* d, const void* a, const void* b, size_t n) {
  if constexpr (kStream) {
    switch (op) {
      case 1: return runStreaming<T>(Op<T, 1>{}, d, a, b, n);
      case 2: return runStreaming<T>(Op<T, 2>{}, d, a, b, n);
      case 3: return runStreaming<T>(Op<T, 3>{}, d, a, b, n);
      default: return runStreaming<T>(Op<T, 0>{}, d, a, b, n);
    }
  }
  switch (op) {
    case 1: return run<T>(Op<T, 1>{}, d, a, b, n);
    case 2: return run<T>(Op<T, 2>{}, d, a, b, n);
    case 3: return run<T>(Op<T, 3>{}, d, a, b, n);
    default: return run<T>(Op<T, 0>{}, d, a, b, n);
  }
}

#define TC_LOOP(NAME, T, OP)                                                                                 \
  TC_CLONES void NAME(int op, void* d, const void* a, const void* b, size_t n) { dispatch<T, OP>(op, d, a, b, n); } \
  TC_CLONES void NAME##Stream(int op, void* d, const void* a, const void* b, size_t n) {                       \
    dispatch<T, OP, true>(op, d, a, b, n);                                                                     \
  }
TC_LOOP(reduceI8, int8_t, IntOp)
TC_LOOP(reduceU8, uint8_t, IntOp)
TC_LOOP(reduceI32, int32_t, IntOp)
TC_LOOP(reduceU32, uint32_t, IntOp)
TC_LOOP(reduceI64, int64_t, IntOp)
TC_LOOP(reduceU64, uint64_t, IntOp)
TC_LOOP(reduceF32, float, FloatOp)
TC_LOOP(reduceF64, double, FloatOp)
template <typename T, int kOp>
using HalfOp = Narrow<uint16_t, h2f, f2h>::Op<T, kOp>;
template <typename T, int kOp>
using Bf16Op = Narrow<uint16_t, b2f, f2b>::Op<T, kOp>;
#if defined(TC_HAVE_F16C_PATH)
// Compilers do not vectorise half <-> float conversions, but x86's F16C converts 8 at a time: with it, half
// reductions run at the speed of float ones. Same results as the portable loop (round to nearest even, NaN kept).
template <int kOp>
__attribute__((target("avx2,f16c"))) inline __m256 f16cOp(__m256 a, __m256 b) {
  if constexpr (kOp == 1) return _mm256_mul_ps(a, b);
  if constexpr (kOp == 0) return _mm256_add_ps(a, b);
  __m256 r = kOp == 2 ? _mm256_max_ps(a, b) : _mm256_min_ps(a, b);  // returns b when either is NaN
  return _mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));  // a NaN a wins, as in fmaxNan
}
template <int kOp>
__attribute__((target("avx2,f16c"))) void reduceF16c(uint16_t* d, const uint16_t* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    __m128i r = _mm256_cvtps_ph(f16cOp<kOp>(x, y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), r);
  }
  Narrow<uint16_t, h2f, f2h>::Op<uint16_t, kOp> f;
  for (; i < n; ++i) d[i] = f(a[i], b[i]);
}
#endif

TC_CLONES void reduceF16Portable(int op, void* d, const void* a, const void* b, size_t n) {
  dispatch<uint16_t, HalfOp>(op, d, a, b, n);
}

void reduceF16(int op, void* d, const void* a, const void* b, size_t n) {
#if defined(TC_HAVE_F16C_PATH)
  static const bool f16c = [] {
    // CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c").
    unsigned a = 0, b = 0, c = 0, d = 0;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    return __builtin_cpu_supports("avx2") && ((c >> 29) & 1);
  }();
  if (f16c) {
    auto* dd = static_cast<uint16_t*>(d);
    auto* aa = static_cast<const uint16_t*>(a);
    auto* bb = static_cast<const uint16_t*>(b);
    switch (op) {
      case 1: return reduceF16c<1>(dd, aa, bb, n);
      case 2: return reduceF16c<2>(dd, aa, bb, n);
      case 3: return reduceF16c<3>(dd, aa, bb, n);
      default: return reduceF16c<0>(dd, aa, bb, n);
    }
  }
#endif
  reduceF16Portable(op, d, a, b, n);
}
TC_LOOP(reduceBF16, uint16_t, Bf16Op)
#undef TC_LOOP
// fp8 rounds through a table search: no vector form, and a niche type on the host.
void reduceE4M3(int op, void* d, const void* a, const void* b, size_t n) {
  dispatch<uint8_t, Narrow<uint8_t, E4M3::decode, E4M3::encode>::Op>(op, d, a, b, n);
}
void reduceE5M2(int op, void* d, const void* a, const void* b, size_t n) {
  dispatch<uint8_t, Narrow<uint8_t, E5M2::decode, E5M2::encode>::Op>(op, d, a, b, n);
}

using LoopFn = void (*)(int, void*, const void*, const void*, size_t);
constexpr LoopFn kLoops[kNumDataTypes] = {reduceI8,  reduceU8,  reduceI32, reduceU32,  reduceI64,  reduceU64,
                                          reduceF16, reduceF32, reduceF64, reduceBF16, reduceE4M3, reduceE5M2};
// Half (F16C) and fp8 keep their regular loops (their conversions, not the stores, bound them).
constexpr LoopFn kStreamLoops[kNumDataTypes] = {
    reduceI8Stream,  reduceU8Stream,  reduceI32Stream, reduceU32Stream,   reduceI64Stream, reduceU64Stream,
    reduceF16,       reduceF32Stream, reduceF64Stream, reduceBF16Stream, reduceE4M3,      reduceE5M2};

void check(DataType type, RedOp op) {
  if (!isValid(type)) fail(StatusCode::kInvalidArgument, "unknown data type {}", static_cast<int>(type));
  if (!isValid(op)) fail(StatusCode::kInvalidArgument, "unknown reduction op {}", static_cast<int>(op));
}

template <typename T>
void divideInt(void* d, size_t n, int k) {
  T* p = static_cast<T*>(d);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(k));
}

// The same truncating quotient through floating point F with a multiplication, which vectorises where integer
// division does not (int8 at 16 MiB: 14.8 ms that way). Exact: r = 1/q rounded and |x| + 1/2 (exact in F) make a
// product within 2^(1-p) relative (p: F's significand bits, 24 or 53) of (|x| + 1/2) / q, which lies at least 1/(2q)
// from every integer; for |x| < 2^b the error is below 2^(b+1-p) / q < 1/(2q) as b + 2 < p (b: 8 or 32), so
// truncating gives trunc(|x| / q). q >= 2 keeps the quotient within int32 (uint32's too).
template <typename T, typename F>
[[gnu::always_inline]] inline void divideIntVia(void* d, size_t n, int k) {
  const T q = static_cast<T>(k);
  if (!(q > 1)) return divideInt<T>(d, n, k);  // a one-byte divisor that wrapped (k >= 128): the scalar rule
  T* p = static_cast<T*>(d);
  const F r = F(1) / static_cast<F>(q);
  for (size_t i = 0; i < n; ++i) {
    const F x = static_cast<F>(p[i]);
    // The sign back on, then the conversion truncates toward zero (0 stays 0: 0.5 r < 1).
    p[i] = static_cast<T>(static_cast<int32_t>(std::copysign((std::fabs(x) + F(0.5)) * r, x)));
  }
}
TC_CLONES void divideInt8(void* d, size_t n, int k) { divideIntVia<int8_t, float>(d, n, k); }
TC_CLONES void divideUint8(void* d, size_t n, int k) { divideIntVia<uint8_t, float>(d, n, k); }
TC_CLONES void divideInt32(void* d, size_t n, int k) { divideIntVia<int32_t, double>(d, n, k); }
TC_CLONES void divideUint32(void* d, size_t n, int k) { divideIntVia<uint32_t, double>(d, n, k); }

}  // namespace

void reduce(DataType type, RedOp op, void* dst, const void* a, const void* b, size_t count) {
  check(type, op);
  if (count == 0) return;
  kLoops[static_cast<int>(type)](static_cast<int>(op) == 4 ? 0 : static_cast<int>(op), dst, a, b, count);
}

void reduceStreaming(DataType type, RedOp op, void* dst, const void* a, const void* b, size_t count) {
  check(type, op);
  if (count == 0) return;
  kStreamLoops[static_cast<int>(type)](static_cast<int>(op) == 4 ? 0 : static_cast<int>(op), dst, a, b, count);
}

void reduceMany(DataType type, RedOp op, void* dst, const void* const* srcs, int n, size_t count) {
  check(type, op);
  if (n < 1) fail(StatusCode::kInvalidArgument, "reduceMany needs at least one source, got {}", n);
  if (count == 0) return;  // buffers of no elements may be NULL (the C API allows it): nothing to touch
  size_t es = sizeOf(type);
  if (n == 1) {
    if (dst != srcs[0]) std::memmove(dst, srcs[0], count * es);
    return;
  }
  // Blocks that stay in L1/L2 while every source is folded in.
  const size_t block = std::max<size_t>(1, (16u << 10) / es);
  auto* d = static_cast<char*>(dst);
  for (size_t off = 0; off < count; off += block) {
    size_t len = std::min(block, count - off), b = off * es;
    reduce(type, op, d + b, static_cast<const char*>(srcs[0]) + b, static_cast<const char*>(srcs[1]) + b, len);
    for (int s = 2; s < n; ++s) reduce(type, op, d + b, d + b, static_cast<const char*>(srcs[s]) + b, len);
  }
}

void finishAvg(DataType type, void* dst, size_t count, int nRanks) {
  check(type, RedOp::kAvg);
  if (nRanks < 1) fail(StatusCode::kInvalidArgument, "average over {} ranks", nRanks);
  if (nRanks == 1 || count == 0) return;
  switch (type) {
    case DataType::kInt8: return divideInt8(dst, count, nRanks);
    case DataType::kUint8: return divideUint8(dst, count, nRanks);
    case DataType::kInt32: return divideInt32(dst, count, nRanks);
    case DataType::kUint32: return divideUint32(dst, count, nRanks);
    case DataType::kInt64: return divideInt<int64_t>(dst, count, nRanks);
    case DataType::kUint64: return divideInt<uint64_t>(dst, count, nRanks);
    case DataType::kFloat32: {
      auto* p = static_cast<float*>(dst);
      for (size_t i = 0; i < count; ++i) p[i] /= static_cast<float>(nRanks);
      return;
    }
    case DataType::kFloat64: {
      auto* p = static_cast<double*>(dst);
      for (size_t i = 0; i < count; ++i) p[i] /= nRanks;
      return;
    }
    case DataType::kFloat16:
    case DataType::kBfloat16: {
      auto* p = static_cast<uint16_t*>(dst);
      bool half = type == DataType::kFloat16;
      for (size_t i = 0; i < count; ++i)
        p[i] = half ? f2h(h2f(p[i]) / nRanks) : f2b(b2f(p[i]) / nRanks);
      return;
    }
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2: {
      auto* p = static_cast<uint8_t*>(dst);
      bool e4 = type == DataType::kFloat8e4m3;
      for (size_t i = 0; i < count; ++i)
        p[i] = e4 ? E4M3::encode(E4M3::decode(p[i]) / nRanks) : E5M2::encode(E5M2::decode(p[i]) / nRanks);
      return;
    }
  }
}

float halfToFloat(uint16_t h) { return h2f(h); }
uint16_t floatToHalf(float f) { return f2h(f); }
float bf16ToFloat(uint16_t b) { return b2f(b); }
uint16_t floatToBf16(float f) { return f2b(f); }
float fp8e4m3ToFloat(uint8_t v) { return E4M3::decode(v); }
uint8_t floatToFp8e4m3(float f) { return E4M3::encode(f); }
float fp8e5m2ToFloat(uint8_t v) { return E5M2::decode(v); }
uint8_t floatToFp8e5m2(float f) { return E5M2::encode(f); }

}  // namespace topocoll::collectives
