// The narrow float formats' conversions as the GPU kernels compute them (device_kernels.cu), compiled for the host
// too so that a host test (tests/collectives/device_math_test.cc) checks them against reduce.cc's without a GPU.
// Same results as reduce.cc's: exact decoding; round to nearest even; NaN encodes as the format's quiet NaN with
// the sign kept; fp8 saturates to its largest finite value (NCCL's __NV_SATFINITE). reduce.cc rounds fp8 by a table
// search, which has no fast GPU form: here the rounding is arithmetic (scale to the code's quantum, rint).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TC_HD __host__ __device__ __forceinline__
#else
#define TC_HD inline
#endif

namespace topocoll::collectives::device_math {

TC_HD uint32_t bitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
TC_HD float floatOf(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
// a * b and a + b rounded once (no contraction into FMA on the GPU).
TC_HD float mulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TC_HD float addRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TC_HD float rintRn(float a) {
#if defined(__CUDA_ARCH__)
  return rintf(a);
#else
  return std::nearbyint(a);
#endif
}

constexpr uint32_t kQuietNaN = 0x7fc00000u;

// IEEE binary16.
TC_HD float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return floatOf(sign | 0x7f800000u | (m << 13));                      // inf, NaN (payload kept)
  if (e == 0) return floatOf(sign | bitsOf(mulRn(static_cast<float>(m), 0x1p-24f)));  // subnormal, exact
  return floatOf(sign | ((e + 112) << 23) | (m << 13));
}
TC_HD uint16_t floatToHalf(float f) {
  uint32_t u = bitsOf(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= (143u << 23)) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536: past the largest, to inf
  if (a < (113u << 23)) {
    // Below 2^-14 the result is subnormal: adding 0.5 leaves the quantum 2^-24 as the float's last bit.
    return static_cast<uint16_t>(sign | (bitsOf(addRn(floatOf(a), 0.5f)) - bitsOf(0.5f)));
  }
  return static_cast<uint16_t>(sign | ((a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13));
}

// bfloat16: the upper half of a float.
TC_HD float bf16ToFloat(uint16_t b) { return floatOf(static_cast<uint32_t>(b) << 16); }
TC_HD uint16_t floatToBf16(float f) {
  uint32_t u = bitsOf(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// fp8 with kExp exponent and kMan mantissa bits. E4M3 (kIeeeInf false): no infinities, 0x7f/0xff are NaN.
// E5M2: IEEE-like.
template <int kExp, int kMan, int kBias, bool kIeeeInf>
struct Fp8 {
  static constexpr int kMaxExp = (1 << kExp) - 1;
  static constexpr int kMaxFinite = kIeeeInf ? ((kMaxExp << kMan) - 1) : 0x7e;  // largest finite code
  static constexpr int kMaxFiniteExp = kMaxFinite >> kMan;
  static constexpr int kMaxFiniteMan = kMaxFinite & ((1 << kMan) - 1);

  TC_HD static float decode(uint8_t v) {
    uint32_t sign = static_cast<uint32_t>(v >> 7) << 31;
    int e = (v >> kMan) & kMaxExp, m = v & ((1 << kMan) - 1);
    if (kIeeeInf && e == kMaxExp) return floatOf(sign | (m ? kQuietNaN : 0x7f800000u));
    if (!kIeeeInf && e == kMaxExp && m == (1 << kMan) - 1) return floatOf(sign | kQuietNaN);
    if (e == 0) return floatOf(sign | bitsOf(mulRn(static_cast<float>(m), minQuantum())));
    return floatOf(sign | (static_cast<uint32_t>(e - kBias + 127) << 23) | (static_cast<uint32_t>(m) << (23 - kMan)));
  }

  TC_HD static uint8_t encode(float f) {
    uint32_t u = bitsOf(f), a = u & 0x7fffffffu;
    uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);
    if (a >= maxFiniteBits()) return static_cast<uint8_t>(sign | kMaxFinite);
    int exp = static_cast<int>(a >> 23) - 127;
    if (exp < 1 - kBias) {
      // Subnormal codes (and the smallest normal, code 1 << kMan, which rounding may reach): multiples of 2^-q.
      return static_cast<uint8_t>(sign | static_cast<int>(rintRn(mulRn(floatOf(a), invMinQuantum()))));
    }
    // [2^exp, 2^(exp+1)) holds 2^kMan codes; rounding up to 2^(kMan+1) lands on the next binade's first code.
    float q = rintRn(mulRn(floatOf(a), floatOf(static_cast<uint32_t>(127 + kMan - exp) << 23)));
    return static_cast<uint8_t>(sign | (((exp + kBias) << kMan) + static_cast<int>(q) - (1 << kMan)));
  }

 private:
  TC_HD static float minQuantum() { return floatOf(static_cast<uint32_t>(127 + 1 - kBias - kMan) << 23); }
  TC_HD static float invMinQuantum() { return floatOf(static_cast<uint32_t>(127 - 1 + kBias + kMan) << 23); }
  TC_HD static uint32_t maxFiniteBits() {
    return (static_cast<uint32_t>(kMaxFiniteExp - kBias + 127) << 23) |
           (static_cast<uint32_t>(kMaxFiniteMan) << (23 - kMan));
  }
};
using E4M3 = Fp8<4, 3, 7, false>;
using E5M2 = Fp8<5, 2, 15, true>;

}  // namespace topocoll::collectives::device_math
