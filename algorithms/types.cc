#include "algorithms/types.h"

namespace optireduce {

size_t ElementSize(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kUnknown: return 0;
    case DataType::kOther: return 0;
  }
  return 0;
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt64: return "uint64";
    case DataType::kFloat16: return "float16";
    case DataType::kUnknown: return "unknown";
    case DataType::kOther: return "other";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kUnknown: return "custom";
  }
  return "custom";
}

}  // namespace optireduce
