// Reductions against a scalar reference for every type and op, the narrow-float conversions exhaustively, and the
// aliasing cases (in place on either source).
#include "topocoll/collectives/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "topocoll/memcopy.h"
#include "topocoll/status.h"

namespace topocoll::collectives {
namespace {

TEST(Conversions, HalfRoundTripsEveryValueAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(f))));
      continue;
    }
    ASSERT_EQ(floatToHalf(f), h) << std::hex << h;
  }
  EXPECT_EQ(halfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(halfToFloat(0x7bff), 65504.0f);                    // largest finite half
  EXPECT_EQ(floatToHalf(1.0f + 1.0f / 2048), 0x3c00);           // halfway: to the even neighbour (1.0)
  EXPECT_EQ(floatToHalf(1.0f + 3.0f / 2048), 0x3c02);           // halfway: to the even neighbour (1.00195)
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);                     // rounds up to infinity
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));       // smallest subnormal
}

TEST(Conversions, Bfloat16IsTheTopHalfOfAFloatRoundedToNearestEven) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(floatToBf16(f), b);
  }
  EXPECT_EQ(floatToBf16(1.0f + 1.0f / 256), 0x3f80);  // tie to even
  EXPECT_EQ(floatToBf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Conversions, Fp8FormatsDecodeRoundTripAndSaturate) {
  // OCP FP8: E4M3 max 448, no infinity, S.1111.111 is NaN; E5M2 max 57344, IEEE-like infinities and NaNs.
  EXPECT_EQ(fp8e4m3ToFloat(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(fp8e4m3ToFloat(0x7f)));
  EXPECT_EQ(fp8e4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8e5m2ToFloat(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(fp8e5m2ToFloat(0x7c)));
  EXPECT_EQ(fp8e5m2ToFloat(0x01), std::ldexp(1.0f, -16));
  for (int v = 0; v < 256; ++v) {
    float a = fp8e4m3ToFloat(static_cast<uint8_t>(v)), b = fp8e5m2ToFloat(static_cast<uint8_t>(v));
    if (!std::isnan(a)) {
      EXPECT_EQ(fp8e4m3ToFloat(floatToFp8e4m3(a)), a) << v;
    }
    if (!std::isnan(b) && !std::isinf(b)) {
      EXPECT_EQ(fp8e5m2ToFloat(floatToFp8e5m2(b)), b) << v;
    }
  }
  EXPECT_EQ(floatToFp8e4m3(1000.0f), 0x7e);  // saturates to the largest finite value (__NV_SATFINITE)
  EXPECT_EQ(floatToFp8e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(floatToFp8e5m2(1e6f), 0x7b);
  EXPECT_EQ(floatToFp8e4m3(1.0625f), 0x38);  // halfway between 1.0 (0x38) and 1.125 (0x39): even code
  EXPECT_EQ(floatToFp8e4m3(1.1875f), 0x3a);  // halfway between 1.125 (0x39) and 1.25 (0x3a): even code
}

// The reference: element by element in double (integers in the unsigned type), rounded like the library.
double decode(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DataType::kUint8: return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kUint32: return static_cast<const uint32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kUint64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DataType::kFloat16: return halfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kBfloat16: return bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat8e4m3: return fp8e4m3ToFloat(static_cast<const uint8_t*>(p)[i]);
    case DataType::kFloat8e5m2: return fp8e5m2ToFloat(static_cast<const uint8_t*>(p)[i]);
  }
  return 0;
}

// Small values that every type holds exactly, so sums and products of two are exact in every type too.
std::vector<uint8_t> fill(DataType t, size_t n, int seed) {
  std::vector<uint8_t> buf(n * sizeOf(t));
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) {
    int v = static_cast<int>(rng() % 7) + 1;  // 1..7
    if (t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64) v -= 4;
    switch (t) {
      case DataType::kInt8: reinterpret_cast<int8_t*>(buf.data())[i] = static_cast<int8_t>(v); break;
      case DataType::kUint8: buf[i] = static_cast<uint8_t>(v); break;
      case DataType::kInt32: reinterpret_cast<int32_t*>(buf.data())[i] = v; break;
      case DataType::kUint32: reinterpret_cast<uint32_t*>(buf.data())[i] = static_cast<uint32_t>(v); break;
      case DataType::kInt64: reinterpret_cast<int64_t*>(buf.data())[i] = v; break;
      case DataType::kUint64: reinterpret_cast<uint64_t*>(buf.data())[i] = static_cast<uint64_t>(v); break;
      case DataType::kFloat16: reinterpret_cast<uint16_t*>(buf.data())[i] = floatToHalf(v * 0.5f); break;
      case DataType::kFloat32: reinterpret_cast<float*>(buf.data())[i] = v * 0.5f; break;
      case DataType::kFloat64: reinterpret_cast<double*>(buf.data())[i] = v * 0.5; break;
      case DataType::kBfloat16: reinterpret_cast<uint16_t*>(buf.data())[i] = floatToBf16(v * 0.5f); break;
      case DataType::kFloat8e4m3: buf[i] = floatToFp8e4m3(v * 0.5f); break;
      case DataType::kFloat8e5m2: buf[i] = floatToFp8e5m2(v * 0.5f); break;
    }
  }
  return buf;
}

// A result rounded to the type, as the library rounds each step (integers here never overflow or need rounding).
double roundTo(DataType t, double v) {
  switch (t) {
    case DataType::kFloat16: return halfToFloat(floatToHalf(static_cast<float>(v)));
    case DataType::kFloat32: return static_cast<float>(v);
    case DataType::kBfloat16: return bf16ToFloat(floatToBf16(static_cast<float>(v)));
    case DataType::kFloat8e4m3: return fp8e4m3ToFloat(floatToFp8e4m3(static_cast<float>(v)));
    case DataType::kFloat8e5m2: return fp8e5m2ToFloat(floatToFp8e5m2(static_cast<float>(v)));
    default: return v;
  }
}

double refOp(DataType t, RedOp op, double a, double b) {
  switch (op) {
    case RedOp::kProd: return roundTo(t, a * b);
    case RedOp::kMax: return std::max(a, b);
    case RedOp::kMin: return std::min(a, b);
    default: return roundTo(t, a + b);
  }
}

class AllTypesAndOps : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(AllTypesAndOps, TwoInputsOutOfPlaceAndInPlaceMatchTheReference) {
  auto t = static_cast<DataType>(std::get<0>(GetParam()));
  auto op = static_cast<RedOp>(std::get<1>(GetParam()));
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{4099}}) {
    auto a = fill(t, n, 1), b = fill(t, n, 2);
    std::vector<uint8_t> out(a.size());
    reduce(t, op, out.data(), a.data(), b.data(), n);
    auto inA = a, inB = b;
    reduce(t, op, inA.data(), inA.data(), b.data(), n);  // dst == a
    reduce(t, op, inB.data(), a.data(), inB.data(), n);  // dst == b
    for (size_t i = 0; i < n; ++i) {
      double want = refOp(t, op, decode(t, a.data(), i), decode(t, b.data(), i));
      ASSERT_EQ(decode(t, out.data(), i), want) << to_string(t) << " " << to_string(op) << " n=" << n << " i=" << i;
      ASSERT_EQ(decode(t, inA.data(), i), want);
      ASSERT_EQ(decode(t, inB.data(), i), want);
    }
  }
}

// reduceToMany gives reduceMany's bits (then finishAvg's for avg) in every output, whatever the number of sources (in
// folds of up to 4) and outputs, the outputs' alignments (each its own, so the head before the first 64-byte line
// differs), the lengths (head, whole 256-byte spans, tail), with and without non-temporal stores, and writes nothing
// around the outputs.
TEST_P(AllTypesAndOps, ReduceToManyGivesReduceManysBitsInEveryOutput) {
  auto t = static_cast<DataType>(std::get<0>(GetParam()));
  auto op = static_cast<RedOp>(std::get<1>(GetParam()));
  const size_t es = sizeOf(t);
  constexpr int kOuts = 8;
  for (int ns : {1, 2, 3, 5, 6, 7, 8, 9})
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1023}, size_t{4099}})
      for (uint32_t mask : {0u, 1u, 0xa5u, 0xffu})
        for (size_t shift = es; shift < 64 + es; shift += es * 13)
          for (int nd : {1, 3, kOuts}) {
          std::vector<std::vector<uint8_t>> in;
          std::vector<const void*> srcs;
          for (int k = 0; k < ns; ++k) in.push_back(fill(t, n, 1 + k));
          for (auto& v : in) srcs.push_back(v.data());
          std::vector<uint8_t> want(n * es + 1);
          reduceMany(t, op, want.data(), srcs.data(), ns, n);
          if (op == RedOp::kAvg) finishAvg(t, want.data(), n, ns);
          std::vector<std::vector<uint8_t>> out(kOuts, std::vector<uint8_t>(n * es + 256, 0xee));
          std::vector<void*> dsts;
          std::vector<size_t> offs;
          for (int k = 0; k < kOuts; ++k) {  // output k starts (k + 1) * shift bytes past a 64-byte line, plus 64
            const size_t line = (64 - reinterpret_cast<uintptr_t>(out[k].data()) % 64) % 64;
            offs.push_back(line + 64 + ((k + 1) * shift) % 64);
            dsts.push_back(out[k].data() + offs.back());
          }
          reduceToMany(t, op, dsts.data(), nd, mask, srcs.data(), ns, n, op == RedOp::kAvg ? ns : 0);
          for (int k = 0; k < kOuts; ++k) {
            const auto& o = out[k];
            const size_t written = k < nd ? n * es : 0;
            const auto guard = [](uint8_t x) { return x == 0xee; };
            const bool untouched = std::all_of(o.begin(), o.begin() + offs[k], guard) &&
                                   std::all_of(o.begin() + offs[k] + written, o.end(), guard);
            ASSERT_TRUE(untouched && (written == 0 || std::memcmp(dsts[k], want.data(), written) == 0))
                << to_string(t) << " " << to_string(op) << " sources " << ns << " outputs " << nd << " n=" << n
                << " mask " << mask << " output " << k << " shift " << shift;
          }
        }
}

// In place: outputs that are the sources (the same ranges); every line is read before it is written. Two sources into
// one output that is the second source compute srcs[1] op srcs[0], as reduce() in place does (reduce.h).
TEST_P(AllTypesAndOps, ReduceToManyInPlaceOnItsSources) {
  auto t = static_cast<DataType>(std::get<0>(GetParam()));
  auto op = static_cast<RedOp>(std::get<1>(GetParam()));
  const size_t n = 4099;
  for (int ns : {2, 3, 5})
    for (uint32_t mask : {0u, 3u}) {
      std::vector<std::vector<uint8_t>> in;
      std::vector<const void*> srcs;
      std::vector<void*> dsts;
      for (int k = 0; k < ns; ++k) in.push_back(fill(t, n, 4 + k));
      for (auto& v : in) srcs.push_back(v.data()), dsts.push_back(v.data());
      std::vector<uint8_t> want(n * sizeOf(t));
      reduceMany(t, op, want.data(), srcs.data(), ns, n);
      if (op == RedOp::kAvg) finishAvg(t, want.data(), n, ns);
      reduceToMany(t, op, dsts.data(), ns, mask, srcs.data(), ns, n, op == RedOp::kAvg ? ns : 0);
      for (int k = 0; k < ns; ++k)
        ASSERT_EQ(in[k], want) << to_string(t) << " " << to_string(op) << " sources " << ns << " output " << k;
    }
  auto a = fill(t, n, 1), b = fill(t, n, 2), want = b;
  reduce(t, op, want.data(), a.data(), want.data(), n);
  if (op == RedOp::kAvg) finishAvg(t, want.data(), n, 2);
  const void* srcs[2] = {a.data(), b.data()};
  void* dst = b.data();
  reduceToMany(t, op, &dst, 1, 0, srcs, 2, n, op == RedOp::kAvg ? 2 : 0);
  ASSERT_EQ(b, want) << to_string(t) << " " << to_string(op) << " two sources into the second";
}

// Avg without a divisor (avgRanks 0) reduces as sum, as reduceMany alone does, on every path (half and fp8 take the
// blockwise one).
TEST(Reduce, ReduceToManyAvgWithoutDivisorIsSum) {
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kFloat8e4m3, DataType::kInt8}) {
    const size_t n = 1000, es = sizeOf(t);
    std::vector<std::vector<uint8_t>> in;
    std::vector<const void*> srcs;
    for (int k = 0; k < 3; ++k) in.push_back(fill(t, n, 7 + k));
    for (auto& v : in) srcs.push_back(v.data());
    std::vector<uint8_t> want(n * es), got(n * es);
    reduceMany(t, RedOp::kAvg, want.data(), srcs.data(), 3, n);
    void* dst = got.data();
    reduceToMany(t, RedOp::kAvg, &dst, 1, 0, srcs.data(), 3, n, 0);
    EXPECT_EQ(got, want) << to_string(t);
  }
}

TEST_P(AllTypesAndOps, ManyInputsFoldLeftToRight) {
  auto t = static_cast<DataType>(std::get<0>(GetParam()));
  auto op = static_cast<RedOp>(std::get<1>(GetParam()));
  if (op == RedOp::kProd && t == DataType::kUint8) GTEST_SKIP() << "7^3 wraps in uint8 (wrapping is tested below)";
  const size_t n = 5000;  // more than one 16 KiB block for 4- and 8-byte types
  std::vector<std::vector<uint8_t>> in;
  std::vector<const void*> ptrs;
  for (int s = 0; s < 3; ++s) in.push_back(fill(t, n, 10 + s));
  for (auto& v : in) ptrs.push_back(v.data());
  std::vector<uint8_t> out(in[0].size());
  reduceMany(t, op, out.data(), ptrs.data(), 3, n);
  for (size_t i = 0; i < n; ++i) {
    double want = refOp(t, op, refOp(t, op, decode(t, in[0].data(), i), decode(t, in[1].data(), i)),
                        decode(t, in[2].data(), i));
    ASSERT_EQ(decode(t, out.data(), i), want) << to_string(t) << " " << to_string(op) << " i=" << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Reduce, AllTypesAndOps,
                         ::testing::Combine(::testing::Range(0, kNumDataTypes), ::testing::Range(0, kNumRedOps)),
                         [](const auto& info) {
                           return std::string(to_string(static_cast<DataType>(std::get<0>(info.param)))) + "_" +
                                  to_string(static_cast<RedOp>(std::get<1>(info.param)));
                         });

TEST(Reduce, AvgIsSumThenDivide) {
  std::vector<int32_t> a = {7, -7, 9}, b = {2, 2, 2};
  std::vector<int32_t> out(3);
  reduce(DataType::kInt32, RedOp::kAvg, out.data(), a.data(), b.data(), 3);
  finishAvg(DataType::kInt32, out.data(), 3, 2);
  EXPECT_EQ(out, (std::vector<int32_t>{4, -2, 5}));  // truncating division, like NCCL's SumPostDiv
  std::vector<float> f = {3.0f, 1.0f};
  finishAvg(DataType::kFloat32, f.data(), 2, 4);
  EXPECT_EQ(f, (std::vector<float>{0.75f, 0.25f}));
}

// finishAvg divides 8- and 32-bit integers through float and double (vectorised): the same truncating quotient as
// integer division, for the extremes and random values of every such type and every rank count up to 300 (one-byte
// divisors that wrap keep the scalar rule).
template <typename T>
void checkAvgMatchesIntegerDivision(DataType type) {
  std::mt19937_64 rng(17);
  std::vector<T> values = {std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), T(0), T(1), T(-1),
                           static_cast<T>(std::numeric_limits<T>::max() - 1),
                           static_cast<T>(std::numeric_limits<T>::min() + 1)};
  for (int i = 0; i < 4000; ++i) values.push_back(static_cast<T>(rng()));
  for (int k = 1; k <= 300; ++k) {
    if (static_cast<T>(k) == 0) continue;  // a one-byte count of 256: division by zero
    std::vector<T> got = values;
    finishAvg(type, got.data(), got.size(), k);
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(got[i], static_cast<T>(values[i] / static_cast<T>(k)))
          << "value " << +values[i] << " over " << k << " ranks, type " << static_cast<int>(type);
  }
}

TEST(Reduce, IntegerAvgIsTruncatingIntegerDivision) {
  checkAvgMatchesIntegerDivision<int8_t>(DataType::kInt8);
  checkAvgMatchesIntegerDivision<uint8_t>(DataType::kUint8);
  checkAvgMatchesIntegerDivision<int32_t>(DataType::kInt32);
  checkAvgMatchesIntegerDivision<uint32_t>(DataType::kUint32);
  checkAvgMatchesIntegerDivision<int64_t>(DataType::kInt64);
  checkAvgMatchesIntegerDivision<uint64_t>(DataType::kUint64);
}

TEST(Reduce, IntegersWrapAndFloatsKeepNan) {
  std::vector<int8_t> a = {127}, b = {1}, out(1);
  reduce(DataType::kInt8, RedOp::kSum, out.data(), a.data(), b.data(), 1);
  EXPECT_EQ(out[0], -128);
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {nan, 1.0f}, y = {1.0f, nan}, r(2);
  reduce(DataType::kFloat32, RedOp::kMax, r.data(), x.data(), y.data(), 2);
  EXPECT_TRUE(std::isnan(r[0]) && std::isnan(r[1]));
}

TEST(Reduce, BadTypeOrOpIsAnError) {
  float a = 1, b = 2, c;
  EXPECT_THROW(reduce(static_cast<DataType>(12), RedOp::kSum, &c, &a, &b, 1), Error);
  EXPECT_THROW(reduce(DataType::kFloat32, static_cast<RedOp>(5), &c, &a, &b, 1), Error);
  EXPECT_THROW(reduceMany(DataType::kFloat32, RedOp::kSum, &c, nullptr, 0, 1), Error);
}

}  // namespace
}  // namespace topocoll::collectives

// copyToMany puts every byte into every output whatever their alignments (each its own) and the length, with and
// without non-temporal stores, and writes nothing around them.
TEST(CopyToMany, EveryOutputGetsEveryByteAndNothingElse) {
  std::vector<uint8_t> src(4096 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
  for (uint32_t mask : {0u, 5u, 7u})
    for (size_t so : {0, 3, 16})
      for (size_t n : {1, 63, 64, 255, 256, 257, 1000, 4096}) {
        std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(4096 + 256, 0xee));
        std::vector<void*> dsts;
        for (int k = 0; k < 3; ++k) dsts.push_back(out[k].data() + 64 + k * 7);
        topocoll::collectives::copyToMany(dsts.data(), 3, mask, src.data() + so, n);
        for (int k = 0; k < 3; ++k)
          for (size_t i = 0; i < out[k].size(); ++i) {
            const size_t off = 64 + k * 7;
            const bool inside = i >= off && i < off + n;
            ASSERT_EQ(out[k][i], inside ? src[so + i - off] : 0xee)
                << "mask " << mask << ", src offset " << so << ", " << n << " bytes, output " << k << ", byte " << i;
          }
      }
}

// The streaming copy moves every byte whatever the alignment of either side and the length (head, 64-byte body,
// tail), and writes nothing outside the destination.
TEST(CopyStreaming, EveryAlignmentAndLengthCopiesExactly) {
  using topocoll::copyStreaming;
  std::vector<uint8_t> src(4096 + 64), dst(4096 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t so : {0, 1, 8, 15, 16, 33})
    for (size_t dof : {0, 1, 7, 16, 31, 48})
      for (size_t n : {0, 1, 15, 16, 63, 64, 65, 127, 128, 1000, 4096}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        copyStreaming(dst.data() + 32 + dof, src.data() + so, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          bool inside = i >= 32 + dof && i < 32 + dof + n;
          uint8_t want = inside ? src[so + i - 32 - dof] : 0xee;
          ASSERT_EQ(dst[i], want) << "src offset " << so << ", dst offset " << dof << ", " << n << " bytes, byte " << i;
        }
      }
}
