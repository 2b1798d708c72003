#include "topocoll/datatype.h"

#include <cctype>
#include <string>

namespace topocoll {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

const char* to_string(DataType t) {
  static const char* names[] = {"int8",  "uint8", "int32",  "uint32",   "int64",  "uint64",
                                "half",  "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  return isValid(t) ? names[static_cast<int>(t)] : "unknown";
}

const char* to_string(RedOp op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return isValid(op) ? names[static_cast<int>(op)] : "unknown";
}

std::optional<DataType> dataTypeFromString(std::string_view name) {
  struct Alias {
    const char* name;
    DataType type;
  };
  static const Alias aliases[] = {
      {"int8", DataType::kInt8},         {"char", DataType::kInt8},          {"uint8", DataType::kUint8},
      {"int32", DataType::kInt32},       {"int", DataType::kInt32},          {"uint32", DataType::kUint32},
      {"int64", DataType::kInt64},       {"uint64", DataType::kUint64},      {"half", DataType::kFloat16},
      {"float16", DataType::kFloat16},   {"fp16", DataType::kFloat16},       {"float", DataType::kFloat32},
      {"float32", DataType::kFloat32},   {"fp32", DataType::kFloat32},       {"double", DataType::kFloat64},
      {"float64", DataType::kFloat64},   {"fp64", DataType::kFloat64},       {"bfloat16", DataType::kBfloat16},
      {"bf16", DataType::kBfloat16},     {"f8e4m3", DataType::kFloat8e4m3},  {"fp8e4m3", DataType::kFloat8e4m3},
      {"float8e4m3", DataType::kFloat8e4m3}, {"f8e5m2", DataType::kFloat8e5m2}, {"fp8e5m2", DataType::kFloat8e5m2},
      {"float8e5m2", DataType::kFloat8e5m2},
  };
  std::string n = lower(name);
  for (auto& a : aliases)
    if (n == a.name) return a.type;
  return std::nullopt;
}

std::optional<RedOp> redOpFromString(std::string_view name) {
  std::string n = lower(name);
  for (int i = 0; i < kNumRedOps; ++i)
    if (n == to_string(static_cast<RedOp>(i))) return static_cast<RedOp>(i);
  if (n == "product") return RedOp::kProd;
  return std::nullopt;
}

}  // namespace topocoll
