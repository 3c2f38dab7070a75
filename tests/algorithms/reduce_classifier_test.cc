#include "algorithms/reduce_classifier.h"

#include <gloo/math.h>
#include <gtest/gtest.h>

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);

template <typename T>
void ExpectKind(DataType type) {
  EXPECT_EQ(ClassifyReduce(RawFunc(&gloo::sum<T>), sizeof(T)).op, ReduceOp::kSum);
  EXPECT_EQ(ClassifyReduce(RawFunc(&gloo::product<T>), sizeof(T)).op, ReduceOp::kProduct);
  EXPECT_EQ(ClassifyReduce(RawFunc(&gloo::min<T>), sizeof(T)).op, ReduceOp::kMin);
  EXPECT_EQ(ClassifyReduce(RawFunc(&gloo::max<T>), sizeof(T)).op, ReduceOp::kMax);
  // min/max tell signed from unsigned; sums of either are bit-identical.
  EXPECT_EQ(ClassifyReduce(RawFunc(&gloo::max<T>), sizeof(T)).type, type);
  EXPECT_EQ(ClassifyReduce(RawFunc(&gloo::min<T>), sizeof(T)).type, type);
  if (IsFloatingPoint(type)) {
    EXPECT_EQ(ClassifyReduce(RawFunc(&gloo::sum<T>), sizeof(T)).type, type);
  } else {
    EXPECT_FALSE(IsFloatingPoint(ClassifyReduce(RawFunc(&gloo::sum<T>), sizeof(T)).type));
  }
}

TEST(ReduceClassifier, RecognisesGlooFunctions) {
  ExpectKind<float>(DataType::kFloat32);
  ExpectKind<double>(DataType::kFloat64);
  ExpectKind<int32_t>(DataType::kInt32);
  ExpectKind<int64_t>(DataType::kInt64);
  ExpectKind<uint64_t>(DataType::kUInt64);
  ExpectKind<int8_t>(DataType::kInt8);
  ExpectKind<uint8_t>(DataType::kUInt8);
}

TEST(ReduceClassifier, CustomFunctionIsUnknown) {
  ReduceFunc avg = [](void* c, const void* a, const void* b, size_t n) {
    for (size_t i = 0; i < n; i++) {
      static_cast<float*>(c)[i] =
          (static_cast<const float*>(a)[i] + static_cast<const float*>(b)[i]) / 2;
    }
  };
  ReduceKind kind = ClassifyReduce(avg, 4);
  EXPECT_EQ(kind.op, ReduceOp::kUnknown);
  EXPECT_EQ(kind.type, DataType::kUnknown);
  EXPECT_EQ(ClassifyReduce(ReduceFunc(), 4).op, ReduceOp::kUnknown);
  EXPECT_EQ(ClassifyReduce(RawFunc(&gloo::sum<float>), 3).op, ReduceOp::kUnknown);
}

}  // namespace
}  // namespace optireduce
