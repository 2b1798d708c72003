// The GPU kernels' conversions (src/collectives/device_math.h), compiled for the host here, give reduce.cc's results
// bit for bit: every half/bf16/fp8 code decoded, and encodings of every 251st float plus the values at and next to
// each midpoint between neighbouring codes (where rounding decides). Runs without a GPU.
#include "collectives/device_math.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "topocoll/collectives/reduce.h"

namespace topocoll::collectives {
namespace {

namespace dm = device_math;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Floats where an encoder can go wrong: a stride through all 2^32 patterns, and around every midpoint of the
// decoded codes (both signs, the midpoint and one float either side), plus the largest finite code and above.
std::vector<float> probes(int codes, const std::function<float(uint32_t)>& decode) {
  std::vector<float> out;
  for (uint64_t u = 0; u < (1ull << 32); u += 251) out.push_back(fromBits(static_cast<uint32_t>(u)));
  std::vector<float> finite;
  for (int c = 0; c < codes / 2; ++c) {
    float f = decode(static_cast<uint32_t>(c));
    if (std::isfinite(f)) finite.push_back(f);
  }
  for (size_t i = 0; i + 1 < finite.size(); ++i) {
    for (float f : {finite[i], (finite[i] + finite[i + 1]) / 2}) {
      for (int d = -1; d <= 1; ++d) {
        float g = fromBits(bits(f) + d);
        out.push_back(g);
        out.push_back(-g);
      }
    }
  }
  float top = finite.back();
  for (float f : {top, std::nextafter(top, 1e30f), top * 1.0625f, top * 2, 1e30f}) out.push_back(f);
  return out;
}

template <typename Code>
void expectSameEncoding(int codes, Code (*ours)(float), Code (*host)(float), float (*decode)(Code)) {
  auto dec = [decode](uint32_t c) { return decode(static_cast<Code>(c)); };
  size_t wrong = 0;
  for (float f : probes(codes, dec)) {
    if (ours(f) != host(f) && ++wrong <= 5) {
      ADD_FAILURE() << "encoding float 0x" << std::hex << bits(f) << " (" << f << "): ours 0x" << +ours(f)
                    << ", host 0x" << +host(f);
    }
  }
  EXPECT_EQ(wrong, 0u);
}

template <typename Code>
void expectSameDecoding(int codes, float (*ours)(Code), float (*host)(Code)) {
  for (int c = 0; c < codes; ++c) {
    ASSERT_EQ(bits(ours(static_cast<Code>(c))), bits(host(static_cast<Code>(c)))) << "code 0x" << std::hex << c;
  }
}

TEST(DeviceMath, HalfAsTheHost) {
  expectSameDecoding<uint16_t>(65536, dm::halfToFloat, halfToFloat);
  expectSameEncoding<uint16_t>(65536, dm::floatToHalf, floatToHalf, halfToFloat);
}

TEST(DeviceMath, Bfloat16AsTheHost) {
  expectSameDecoding<uint16_t>(65536, dm::bf16ToFloat, bf16ToFloat);
  expectSameEncoding<uint16_t>(65536, dm::floatToBf16, floatToBf16, bf16ToFloat);
}

TEST(DeviceMath, Fp8E4M3AsTheHost) {
  expectSameDecoding<uint8_t>(256, dm::E4M3::decode, fp8e4m3ToFloat);
  expectSameEncoding<uint8_t>(256, dm::E4M3::encode, floatToFp8e4m3, fp8e4m3ToFloat);
}

TEST(DeviceMath, Fp8E5M2AsTheHost) {
  expectSameDecoding<uint8_t>(256, dm::E5M2::decode, fp8e5m2ToFloat);
  expectSameEncoding<uint8_t>(256, dm::E5M2::encode, floatToFp8e5m2, fp8e5m2ToFloat);
}

}  // namespace
}  // namespace topocoll::collectives
