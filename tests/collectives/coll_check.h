// Inputs and serial references for collective tests: every rank's input is small integers, exact in every type
// (fp8 included) whatever the summation order, so results compare bit for bit with a serial reduction in rank order.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "topocoll/collectives/algorithms.h"
#include "topocoll/collectives/reduce.h"
#include "topocoll/datatype.h"

namespace topocoll::testing {

/// Every data type and reduction op.
constexpr DataType kTypes[] = {DataType::kInt8,    DataType::kUint8,    DataType::kInt32,       DataType::kUint32,
                               DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,     DataType::kFloat32,
                               DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};
constexpr RedOp kOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};

/// Element i of rank r's input for `op` (sums stay <= 8 ranks x 1, products <= 2^8).
inline int inputValue(RedOp op, int r, size_t i) {
  switch (op) {
    case RedOp::kProd: return (r * 7 + i * 3) % 5 == 0 ? 2 : 1;
    case RedOp::kMax:
    case RedOp::kMin: return static_cast<int>((r * 3 + i) % 5);
    default: return static_cast<int>((r + i) % 2);
  }
}

inline void store(DataType t, void* p, size_t i, int v) {
  char* b = static_cast<char*>(p);
  switch (t) {
    case DataType::kInt8: reinterpret_cast<int8_t*>(b)[i] = static_cast<int8_t>(v); break;
    case DataType::kUint8: reinterpret_cast<uint8_t*>(b)[i] = static_cast<uint8_t>(v); break;
    case DataType::kInt32: reinterpret_cast<int32_t*>(b)[i] = v; break;
    case DataType::kUint32: reinterpret_cast<uint32_t*>(b)[i] = static_cast<uint32_t>(v); break;
    case DataType::kInt64: reinterpret_cast<int64_t*>(b)[i] = v; break;
    case DataType::kUint64: reinterpret_cast<uint64_t*>(b)[i] = static_cast<uint64_t>(v); break;
    case DataType::kFloat16: reinterpret_cast<uint16_t*>(b)[i] = collectives::floatToHalf(static_cast<float>(v)); break;
    case DataType::kFloat32: reinterpret_cast<float*>(b)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: reinterpret_cast<double*>(b)[i] = v; break;
    case DataType::kBfloat16: reinterpret_cast<uint16_t*>(b)[i] = collectives::floatToBf16(static_cast<float>(v)); break;
    case DataType::kFloat8e4m3: reinterpret_cast<uint8_t*>(b)[i] = collectives::floatToFp8e4m3(static_cast<float>(v)); break;
    case DataType::kFloat8e5m2: reinterpret_cast<uint8_t*>(b)[i] = collectives::floatToFp8e5m2(static_cast<float>(v)); break;
  }
}

/// Rank r's input of `count` elements (`offset` shifts the pattern, for AllGather/ReduceScatter blocks).
inline std::vector<char> makeInput(DataType t, RedOp op, int r, size_t count) {
  std::vector<char> v(count * sizeOf(t) + 1);
  for (size_t i = 0; i < count; ++i) store(t, v.data(), i, inputValue(op, r, i));
  return v;
}

/// The serial reduction over ranks 0..n-1 of their inputs of `count` elements (then Avg's division).
inline std::vector<char> reference(DataType t, RedOp op, int n, size_t count) {
  std::vector<char> acc = makeInput(t, op, 0, count);
  for (int r = 1; r < n; ++r) {
    std::vector<char> in = makeInput(t, op, r, count);
    if (count) collectives::reduce(t, op, acc.data(), acc.data(), in.data(), count);
  }
  if (op == RedOp::kAvg && count) collectives::finishAvg(t, acc.data(), count, n);
  return acc;
}

/// Index of the first differing element, or -1.
inline long long firstDiff(const void* a, const void* b, size_t count, DataType t) {
  size_t es = sizeOf(t);
  for (size_t i = 0; i < count; ++i)
    if (std::memcmp(static_cast<const char*>(a) + i * es, static_cast<const char*>(b) + i * es, es) != 0)
      return static_cast<long long>(i);
  return -1;
}

}  // namespace topocoll::testing
