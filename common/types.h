#pragma once

#include <cstddef>
#include <cstdint>

namespace gs {

/// Element types; values equal gs_dtype_t's (capi/ static_asserts them).
enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
};
inline constexpr int kNumDataTypes = 7;

/// Reduction operators; values equal gs_redop_t's.
enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMin = 2, kMax = 3, kProd = 4 };
inline constexpr int kNumReduceOps = 5;

inline bool isValid(DataType t) {
  return static_cast<int>(t) < kNumDataTypes;
}
inline bool isValid(ReduceOp op) {
  return static_cast<int>(op) < kNumReduceOps;
}

inline size_t elementSize(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat16:
      return 2;
    case DataType::kBFloat16:
      return 2;
    case DataType::kFloat64:
      return 8;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kUInt8:
      return 1;
  }
  return 0;
}

const char* dataTypeName(DataType t);
const char* reduceOpName(ReduceOp op);

}  // namespace gs
