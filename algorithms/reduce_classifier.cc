#include "algorithms/reduce_classifier.h"

#include <cstring>
#include <mutex>
#include <map>
#include <utility>

namespace optireduce {
namespace {

using RawFunc = void (*)(void*, const void*, const void*, size_t);

// Probe inputs: a = {3, -2, 5, -2}, b = {4, 6, -1, -3}. Chosen so sum, product, min and max
// give pairwise different results in every candidate type, and so that an integer min/max
// applied to float bit patterns (two negative floats compare reversed as integers) does not
// pass for a float one. Signed and unsigned integers of one width are told apart by min/max;
// their sums and products are bit-identical, so either answer is exact for those.
template <typename T>
ReduceOp ProbeAs(const ReduceFunc& fn) {
  const T a[4] = {T(3), T(-2), T(5), T(-2)};
  const T b[4] = {T(4), T(6), T(-1), T(-3)};
  T c[4] = {};
  T expect_sum[4], expect_prod[4], expect_min[4], expect_max[4];
  for (int i = 0; i < 4; i++) {
    expect_sum[i] = T(a[i] + b[i]);
    expect_prod[i] = T(a[i] * b[i]);
    expect_min[i] = a[i] < b[i] ? a[i] : b[i];
    expect_max[i] = a[i] < b[i] ? b[i] : a[i];
  }
  fn(c, a, b, 4);
  if (std::memcmp(c, expect_sum, sizeof(c)) == 0) return ReduceOp::kSum;
  if (std::memcmp(c, expect_prod, sizeof(c)) == 0) return ReduceOp::kProduct;
  if (std::memcmp(c, expect_min, sizeof(c)) == 0) return ReduceOp::kMin;
  if (std::memcmp(c, expect_max, sizeof(c)) == 0) return ReduceOp::kMax;
  return ReduceOp::kUnknown;
}

ReduceKind ClassifyUncached(const ReduceFunc& fn, size_t element_size) {
  // Integer candidates first: a float function applied to integer bit patterns is
  // well-defined (denormals, NaNs) and cannot reproduce the integer results, while an
  // integer function applied to float bit patterns could overflow (undefined behaviour).
  struct Candidate {
    DataType type;
    ReduceOp (*probe)(const ReduceFunc&);
  };
  static const Candidate k8[] = {{DataType::kInt64, &ProbeAs<int64_t>},
                                 {DataType::kUInt64, &ProbeAs<uint64_t>},
                                 {DataType::kFloat64, &ProbeAs<double>}};
  static const Candidate k4[] = {{DataType::kInt32, &ProbeAs<int32_t>},
                                 {DataType::kFloat32, &ProbeAs<float>}};
  static const Candidate k1[] = {{DataType::kInt8, &ProbeAs<int8_t>},
                                 {DataType::kUInt8, &ProbeAs<uint8_t>}};
  const Candidate* begin = nullptr;
  size_t count = 0;
  switch (element_size) {
    case 8: begin = k8; count = 3; break;
    case 4: begin = k4; count = 2; break;
    case 1: begin = k1; count = 2; break;
    default: return {};
  }
  for (size_t i = 0; i < count; i++) {
    ReduceOp op = begin[i].probe(fn);
    if (op != ReduceOp::kUnknown) {
      return {begin[i].type, op};
    }
  }
  return {};
}

}  // namespace

ReduceKind ClassifyReduce(const ReduceFunc& fn, size_t element_size) {
  if (!fn) {
    return {};
  }
  const RawFunc* raw = fn.target<RawFunc>();
  if (raw == nullptr) {
    // A lambda or functor: no stable identity to cache by, probe every time (cheap).
    return ClassifyUncached(fn, element_size);
  }
  static std::mutex mu;
  // Keyed by function and element size: the same function named with another size is
  // another question.
  static auto* cache = new std::map<std::pair<RawFunc, size_t>, ReduceKind>();
  const auto key = std::make_pair(*raw, element_size);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  ReduceKind kind = ClassifyUncached(fn, element_size);
  std::lock_guard<std::mutex> lock(mu);
  (*cache)[key] = kind;
  return kind;
}

}  // namespace optireduce
