// Data patterns of topocoll-perf's checks. Reductions use small non-negative integers chosen per op so that the
// exact result is representable in every type (fp8 e5m2 holds every integer up to 8, e4m3 up to 16, bf16 up to
// 256, half up to 2048; integer types wrap the same way in the reference as in the library), and every element of
// every rank is compared with the reference; avg on floating-point types allows the rounding of dividing by n.
// Copies (broadcast, all-gather, all-to-all, send/recv) move byte patterns that name the source rank and offset.
#include <cmath>
#include <cstring>

#include "perf.h"
#include "topocoll/collectives/reduce.h"
#include "topocoll/status.h"

namespace topocoll::perf {
namespace {

uint8_t pattern(int src, size_t byte) { return static_cast<uint8_t>(src * 37 + byte * 11 + (byte >> 8) + 5); }

// The largest integer up to which every integer is exact (integer types: any, they wrap alike).
int64_t exactLimit(DataType t) {
  switch (t) {
    case DataType::kFloat8e5m2:
      return 8;
    case DataType::kFloat8e4m3:
      return 16;
    case DataType::kBfloat16:
      return 256;
    case DataType::kFloat16:
      return 2048;
    case DataType::kFloat32:
      return 1 << 24;
    case DataType::kFloat64:
      return int64_t{1} << 53;
    default:
      return int64_t{1} << 62;
  }
}

// Rank r's value at `index` for `op`.
int64_t value(DataType t, RedOp op, int n, int r, size_t index) {
  int64_t room = std::max<int64_t>(2, exactLimit(t) / std::max(1, n));  // sum of n values stays exact
  if (isMulSum(op))  // summed after a scalar of 1 or 2: half the room
    return static_cast<int64_t>((index * 7 + r * 3) % std::max<int64_t>(1, std::min<int64_t>(room / 2, 5)));
  switch (op) {
    case RedOp::kSum:
      return static_cast<int64_t>((index * 7 + r * 3) % std::min<int64_t>(room, 5));
    case RedOp::kProd:
      return (index + r) % 4 == 0 ? 2 : 1;  // at most 2^ceil(n/4)
    case RedOp::kMax:
    case RedOp::kMin:
      return static_cast<int64_t>((index * 3 + r * 5) % 8);
    case RedOp::kAvg:
      return static_cast<int64_t>(index % std::min<int64_t>(room, 4));  // the same on every rank
  }
  return 0;
}

void encode(void* dst, DataType t, int64_t v) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
      *static_cast<uint8_t*>(dst) = static_cast<uint8_t>(v);
      break;
    case DataType::kInt32:
    case DataType::kUint32:
      *static_cast<uint32_t*>(dst) = static_cast<uint32_t>(v);
      break;
    case DataType::kInt64:
    case DataType::kUint64:
      *static_cast<uint64_t*>(dst) = static_cast<uint64_t>(v);
      break;
    case DataType::kFloat16:
      *static_cast<uint16_t*>(dst) = collectives::floatToHalf(static_cast<float>(v));
      break;
    case DataType::kBfloat16:
      *static_cast<uint16_t*>(dst) = collectives::floatToBf16(static_cast<float>(v));
      break;
    case DataType::kFloat8e4m3:
      *static_cast<uint8_t*>(dst) = collectives::floatToFp8e4m3(static_cast<float>(v));
      break;
    case DataType::kFloat8e5m2:
      *static_cast<uint8_t*>(dst) = collectives::floatToFp8e5m2(static_cast<float>(v));
      break;
    case DataType::kFloat32:
      *static_cast<float*>(dst) = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      *static_cast<double*>(dst) = static_cast<double>(v);
      break;
  }
}

double decodeFloat(const void* p, DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return collectives::halfToFloat(*static_cast<const uint16_t*>(p));
    case DataType::kBfloat16:
      return collectives::bf16ToFloat(*static_cast<const uint16_t*>(p));
    case DataType::kFloat8e4m3:
      return collectives::fp8e4m3ToFloat(*static_cast<const uint8_t*>(p));
    case DataType::kFloat8e5m2:
      return collectives::fp8e5m2ToFloat(*static_cast<const uint8_t*>(p));
    case DataType::kFloat32:
      return *static_cast<const float*>(p);
    case DataType::kFloat64:
      return *static_cast<const double*>(p);
    default:
      return 0;
  }
}

// Relative error one rounding of `t` may add.
double epsilon(DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return 0x1p-10;
    case DataType::kBfloat16:
      return 0x1p-7;
    case DataType::kFloat8e4m3:
      return 0x1p-3;
    case DataType::kFloat8e5m2:
      return 0x1p-2;
    case DataType::kFloat32:
      return 0x1p-23;
    default:
      return 0x1p-52;
  }
}

int64_t fold(RedOp op, int64_t a, int64_t b) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return a + b;
    case RedOp::kProd:
      return a * b;
    case RedOp::kMax:
      return std::max(a, b);
    case RedOp::kMin:
      return std::min(a, b);
  }
  return 0;
}

// A rank's PreMulSum scalar (-o mulsum), as nccl-tests' ncclVerifiablePremulScalar.
int64_t premulScalar(int r) { return r % 2 ? 2 : 1; }

}  // namespace

std::string opName(RedOp op) { return isMulSum(op) ? "mulsum" : to_string(op); }

void encodeValue(void* dst, DataType type, int64_t v) { encode(dst, type, v); }

void inputElement(void* dst, DataType type, RedOp op, bool reduces, int nRanks, int r, size_t index) {
  if (reduces) return encode(dst, type, value(type, op, nRanks, r, index));
  size_t es = sizeOf(type);
  for (size_t b = 0; b < es; ++b) static_cast<uint8_t*>(dst)[b] = pattern(r, index * es + b);
}

long checkOutput(const Test& t, const void* out, size_t count, DataType type, RedOp op, int me, int nRanks,
                 const Layout& l, int root) {
  size_t es = sizeOf(type);
  const uint8_t* p = static_cast<const uint8_t*>(out);
  uint8_t want[8];
  long wrong = 0;
  for (size_t j = 0; j < count; ++j) {
    Source s = t.source(me, j, l, nRanks, root);
    if (s.src == Source::kUnchecked) continue;
    if (s.src == Source::kReduced) {
      int64_t v = 0;
      if (isMulSum(op)) {
        for (int r = 0; r < nRanks; ++r) v += premulScalar(r) * value(type, op, nRanks, r, s.index);
      } else {
        v = value(type, op, nRanks, 0, s.index);
        for (int r = 1; r < nRanks; ++r) v = fold(op, v, value(type, op, nRanks, r, s.index));
      }
      if (op == RedOp::kAvg) v /= nRanks;  // exact: every rank holds the same value
      encode(want, type, v);
      if (op == RedOp::kAvg && isFloatingPoint(type)) {
        double got = decodeFloat(p + j * es, type);
        if (!(std::fabs(got - static_cast<double>(v)) <= nRanks * epsilon(type) * std::max(1.0, std::fabs(v * 1.0))))
          ++wrong;
        continue;
      }
    } else {
      inputElement(want, type, op, false, nRanks, s.src, s.index);
    }
    if (std::memcmp(want, p + j * es, es) != 0) ++wrong;
  }
  return wrong;
}

}  // namespace topocoll::perf
