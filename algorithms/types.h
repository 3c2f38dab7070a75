// Element types and reduction operators that optireduce's algorithms understand.
#pragma once

#include <cstddef>
#include <cstdint>

namespace optireduce {

enum class DataType : uint8_t {
  kUnknown = 0,
  kFloat32,
  kFloat64,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kOther,  // a type optireduce has no name for: reduced as given, never transformed
};

enum class ReduceOp : uint8_t {
  kUnknown = 0,  // a custom function: TAR still runs it, Hadamard never applies
  kSum,
  kProduct,
  kMin,
  kMax,
};

size_t ElementSize(DataType type);
const char* DataTypeName(DataType type);
const char* ReduceOpName(ReduceOp op);

inline bool IsFloatingPoint(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64;
}

}  // namespace optireduce
