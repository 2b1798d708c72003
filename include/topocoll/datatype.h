// NCCL's data types and reduction operations, with NCCL's numeric values (nccl.h: ncclDataType_t, ncclRedOp_t) so
// that the C API can pass them through unchanged. Shared by the transports (message sizes), the collectives
// (reductions) and the tools (nccl-tests' type and op names).
#pragma once

#include "topocoll/export.h"

#include <cstddef>
#include <optional>
#include <string_view>

namespace topocoll {

enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
};
constexpr int kNumDataTypes = 12;

enum class RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };
constexpr int kNumRedOps = 5;

/// Bytes per element.
constexpr size_t sizeOf(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2: return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16: return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}
constexpr bool isValid(DataType t) { return static_cast<int>(t) >= 0 && static_cast<int>(t) < kNumDataTypes; }
constexpr bool isValid(RedOp op) { return static_cast<int>(op) >= 0 && static_cast<int>(op) < kNumRedOps; }
constexpr bool isFloatingPoint(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kBfloat16 ||
         t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2;
}

/// nccl-tests' names: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2.
TOPOCOLL_API const char* to_string(DataType t);
/// sum prod max min avg.
TOPOCOLL_API const char* to_string(RedOp op);
/// Accepts nccl-tests' names and the usual aliases (float32, fp32, float16, fp16, bf16, float64, char, int, ...).
TOPOCOLL_API std::optional<DataType> dataTypeFromString(std::string_view name);
TOPOCOLL_API std::optional<RedOp> redOpFromString(std::string_view name);

}  // namespace topocoll
