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

#include "topocoll/memcopy.h"
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

// K sources folded into kSpan elements of `line` starting at element i: line = s[0] op s[1] op ... (kFirst), or
// line op s[0] op ... . K is a constant, so each element is one expression whose partial results stay in registers.
template <typename T, size_t kSpan, int K, bool kFirst, typename Op>
[[gnu::always_inline]] inline void foldInto(Op f, T* __restrict line, const T* const* s, size_t i) {
  for (size_t j = 0; j < kSpan; ++j) {
    T v = kFirst ? s[0][i + j] : f(line[j], s[0][i + j]);
    for (int k = 1; k < K; ++k) v = f(v, s[k][i + j]);
    line[j] = v;
  }
}
template <typename T, size_t kSpan, bool kFirst, typename Op>
[[gnu::always_inline]] inline int foldSome(Op f, T* line, const T* const* s, int left, size_t i) {
  switch (left) {
    case 1: return foldInto<T, kSpan, 1, kFirst>(f, line, s, i), 1;
    case 2: return foldInto<T, kSpan, 2, kFirst>(f, line, s, i), 2;
    case 3: return foldInto<T, kSpan, 3, kFirst>(f, line, s, i), 3;
    default: return foldInto<T, kSpan, 4, kFirst>(f, line, s, i), 4;
  }
}

// reduceToMany: every source folded into four 64-byte lines (reduceMany's order: s0 op s1, then op s2, ...), then
// those lines stored into every output; the sources are read and the outputs written in the same pass, as a memcpy
// interleaves its loads and stores (out of the caches: 4 sources into 4 outputs 2.3x faster than reducing into
// scratch and copying that out, bench/reduce_bench). Outputs in streamMask get non-temporal stores where the span is
// 16-byte aligned in them. All of a span's loads come before its stores, so an output may be one of the sources.
// Inlined into each instruction set's clone of its caller (a separate function would be compiled for the baseline).
template <typename T, typename Op>
[[gnu::always_inline]] inline void runFanout(Op f, void* const* dv, int nd, uint32_t streamMask, const void* const* sv,
                                             int ns, size_t n, DataType type, int avgRanks) {
  const T* s[32];
  T* d[32];
  for (int k = 0; k < ns; ++k) s[k] = static_cast<const T*>(sv[k]);
  for (int k = 0; k < nd; ++k) d[k] = static_cast<T*>(dv[k]);
  const auto one = [&](size_t i) {
    T v = s[0][i];
    for (int k = 1; k < ns; ++k) v = f(v, s[k][i]);
    if (avgRanks > 1) finishAvg(type, &v, 1, avgRanks);
    for (int k = 0; k < nd; ++k) d[k][i] = v;
  };
  constexpr size_t kSpan = 256 / sizeof(T);  // four lines a step: the loop's overhead is paid once for them
  size_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(d[0] + i) % 64 != 0; ++i) one(i);
  for (; i + kSpan <= n; i += kSpan) {
    alignas(64) T line[kSpan];
    for (int k = foldSome<T, kSpan, true>(f, line, s, ns, i); k < ns;)
      k += foldSome<T, kSpan, false>(f, line, s + k, ns - k, i);
    if (avgRanks > 1) finishAvg(type, line, kSpan, avgRanks);  // avg: the sum divided, as reduceMany + finishAvg
    for (int k = 0; k < nd; ++k) {
#if defined(TC_HAVE_F16C_PATH)
      if ((streamMask >> k & 1) && reinterpret_cast<uintptr_t>(d[k] + i) % 16 == 0) {
        const auto* l = reinterpret_cast<const __m128i*>(line);
        auto* o = reinterpret_cast<__m128i*>(d[k] + i);
        for (size_t q = 0; q < sizeof line / 16; ++q) _mm_stream_si128(o + q, _mm_load_si128(l + q));
        continue;
      }
#endif
      std::memcpy(d[k] + i, line, sizeof line);
    }
  }
  for (; i < n; ++i) one(i);
#if defined(TC_HAVE_F16C_PATH)
  if (streamMask) _mm_sfence();
#endif
}

// The op is a template parameter, so each (type, op) is its own plain loop the compiler vectorises.
template <typename T, template <typename, int> class Op>
inline void dispatch(int op, void* d, const void* a, const void* b, size_t n) {
  switch (op) {
    case 1: return run<T>(Op<T, 1>{}, d, a, b, n);
    case 2: return run<T>(Op<T, 2>{}, d, a, b, n);
    case 3: return run<T>(Op<T, 3>{}, d, a, b, n);
    default: return run<T>(Op<T, 0>{}, d, a, b, n);
  }
}

template <typename T, template <typename, int> class Op>
[[gnu::always_inline]] inline void dispatchFanout(int op, void* const* d, int nd, uint32_t mask, const void* const* s,
                                                  int ns, size_t n, DataType t, int avg) {
  switch (op) {
    case 1: return runFanout<T>(Op<T, 1>{}, d, nd, mask, s, ns, n, t, avg);
    case 2: return runFanout<T>(Op<T, 2>{}, d, nd, mask, s, ns, n, t, avg);
    case 3: return runFanout<T>(Op<T, 3>{}, d, nd, mask, s, ns, n, t, avg);
    default: return runFanout<T>(Op<T, 0>{}, d, nd, mask, s, ns, n, t, avg);
  }
}
// reduce<X> (two inputs) and fanout<X> (reduceToMany's loop) of each type whose loops vectorise (half and fp8 go
// through reduceMany in blocks for reduceToMany).
#define TC_LOOP(X, T, OP)                                                                                     \
  TC_CLONES void reduce##X(int op, void* d, const void* a, const void* b, size_t n) {                        \
    dispatch<T, OP>(op, d, a, b, n);                                                                         \
  }                                                                                                          \
  TC_CLONES void fanout##X(int op, void* const* d, int nd, uint32_t mask, const void* const* s, int ns,       \
                           size_t n, DataType t, int avg) {                                                  \
    dispatchFanout<T, OP>(op, d, nd, mask, s, ns, n, t, avg);                                                \
  }
TC_LOOP(I8, int8_t, IntOp)
TC_LOOP(U8, uint8_t, IntOp)
TC_LOOP(I32, int32_t, IntOp)
TC_LOOP(U32, uint32_t, IntOp)
TC_LOOP(I64, int64_t, IntOp)
TC_LOOP(U64, uint64_t, IntOp)
TC_LOOP(F32, float, FloatOp)
TC_LOOP(F64, double, FloatOp)
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
TC_LOOP(BF16, uint16_t, Bf16Op)
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
using FanoutFn = void (*)(int, void* const*, int, uint32_t, const void* const*, int, size_t, DataType, int);
constexpr FanoutFn kFanoutLoops[kNumDataTypes] = {fanoutI8,  fanoutU8,  fanoutI32, fanoutU32,  fanoutI64, fanoutU64,
                                                  nullptr,   fanoutF32, fanoutF64, fanoutBF16, nullptr,   nullptr};

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

void reduceToMany(DataType type, RedOp op, void* const* dsts, int nDsts, uint32_t streamMask, const void* const* srcs,
                  int nSrcs, size_t count, int avgRanks) {
  check(type, op);
  if (nSrcs < 1 || nSrcs > 32 || nDsts < 1 || nDsts > 32)
    fail(StatusCode::kInvalidArgument, "reduceToMany needs 1-32 sources and outputs, got {} and {}", nSrcs, nDsts);
  if (count == 0) return;
  const int code = static_cast<int>(op) == 4 ? 0 : static_cast<int>(op);
  const int divisor = op == RedOp::kAvg && avgRanks > 1 ? avgRanks : 0;
  if (nSrcs == 2 && nDsts == 1 && !streamMask) {  // the plain loop: faster in the caches
    reduce(type, op, dsts[0], srcs[0], srcs[1], count);
    if (divisor) finishAvg(type, dsts[0], count, divisor);
    return;
  }
  if (FanoutFn loop = kFanoutLoops[static_cast<int>(type)])
    return loop(code, dsts, nDsts, streamMask, srcs, nSrcs, count, type, divisor);
  // Half and fp8: reduceMany into a block that stays in L1, finished, then copied into every output (the outputs that
  // are also sources only after the whole block is read).
  const size_t es = sizeOf(type), block = (4u << 10) / es;
  alignas(64) char tmp[4u << 10];
  const void* at[32];
  for (size_t off = 0; off < count; off += block) {
    const size_t len = std::min(block, count - off), b = off * es;
    for (int k = 0; k < nSrcs; ++k) at[k] = static_cast<const char*>(srcs[k]) + b;
    reduceMany(type, op, tmp, at, nSrcs, len);
    if (divisor) finishAvg(type, tmp, len, divisor);
    for (int k = 0; k < nDsts; ++k) {
      char* d = static_cast<char*>(dsts[k]) + b;
      if (streamMask >> k & 1) copyStreaming(d, tmp, len * es);
      else std::memcpy(d, tmp, len * es);
    }
  }
}

void copyToMany(void* const* dsts, int nDsts, uint32_t streamMask, const void* src, size_t bytes) {
  if (nDsts < 1 || nDsts > 32) fail(StatusCode::kInvalidArgument, "copyToMany needs 1-32 outputs, got {}", nDsts);
  if (bytes) fanoutU8(0, dsts, nDsts, streamMask, &src, 1, bytes, DataType::kUint8, 0);
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

namespace {
template <typename T>
void multiplyAs(void* dst, const void* src, size_t count, const void* scalar) {
  T s;
  std::memcpy(&s, scalar, sizeof s);
  auto* d = static_cast<T*>(dst);
  auto* a = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;  // wraps instead of overflowing
      d[i] = static_cast<T>(static_cast<U>(a[i]) * static_cast<U>(s));
    } else {
      d[i] = a[i] * s;
    }
  }
}
template <typename Bits, typename Decode, typename Encode>
void multiplyThroughFloat(void* dst, const void* src, size_t count, const void* scalar, Decode dec, Encode enc) {
  Bits sb;
  std::memcpy(&sb, scalar, sizeof sb);
  const float s = dec(sb);
  auto* d = static_cast<Bits*>(dst);
  auto* a = static_cast<const Bits*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = enc(dec(a[i]) * s);
}
}  // namespace

void preMultiply(DataType type, void* dst, const void* src, size_t count, const void* scalar) {
  if (count == 0) return;
  switch (type) {
    case DataType::kInt8: return multiplyAs<int8_t>(dst, src, count, scalar);
    case DataType::kUint8: return multiplyAs<uint8_t>(dst, src, count, scalar);
    case DataType::kInt32: return multiplyAs<int32_t>(dst, src, count, scalar);
    case DataType::kUint32: return multiplyAs<uint32_t>(dst, src, count, scalar);
    case DataType::kInt64: return multiplyAs<int64_t>(dst, src, count, scalar);
    case DataType::kUint64: return multiplyAs<uint64_t>(dst, src, count, scalar);
    case DataType::kFloat32: return multiplyAs<float>(dst, src, count, scalar);
    case DataType::kFloat64: return multiplyAs<double>(dst, src, count, scalar);
    case DataType::kFloat16: return multiplyThroughFloat<uint16_t>(dst, src, count, scalar, h2f, f2h);
    case DataType::kBfloat16: return multiplyThroughFloat<uint16_t>(dst, src, count, scalar, b2f, f2b);
    case DataType::kFloat8e4m3:
      return multiplyThroughFloat<uint8_t>(dst, src, count, scalar, E4M3::decode, E4M3::encode);
    case DataType::kFloat8e5m2:
      return multiplyThroughFloat<uint8_t>(dst, src, count, scalar, E5M2::decode, E5M2::encode);
  }
  fail(StatusCode::kInvalidArgument, "preMultiply: data type {} is not one of NCCL's", static_cast<int>(type));
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
