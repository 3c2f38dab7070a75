// gloo::AllreduceTranspose<T>: TAR as a gloo::Algorithm, a drop-in for gloo::AllreduceRing<T>.
//
//   gloo::AllreduceTranspose<float> algo(context, {ptr}, count);   // sum by default
//   algo.run();
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include <gloo/algorithm.h>
#include <gloo/common/logging.h>

#include "algorithms/allreduce.h"

namespace gloo {

template <typename T>
class AllreduceTranspose : public Algorithm {
 public:
  AllreduceTranspose(const std::shared_ptr<Context>& context, const std::vector<T*>& ptrs,
                     const int count,
                     const ReductionFunction<T>* fn = ReductionFunction<T>::sum,
                     optireduce::AllreduceOptions::Hadamard hadamard =
                         optireduce::AllreduceOptions::Hadamard::kOff)
      : Algorithm(context),
        ptrs_(ptrs),
        count_(count),
        fn_(fn),
        hadamard_(hadamard),
        // Old-style algorithms draw their slots from the context in construction order,
        // which every rank shares; TAR builds its own slot range from this value.
        tag_(static_cast<uint32_t>(context->nextSlot())) {
    GLOO_ENFORCE(!ptrs_.empty(), "AllreduceTranspose: no buffers");
    GLOO_ENFORCE(count_ >= 0, "AllreduceTranspose: negative count ", count_);
    GLOO_ENFORCE(fn_ != nullptr, "AllreduceTranspose: no reduction function");
  }

  void run() override {
    optireduce::AllreduceOptions opts(context_);
    // Like gloo::AllreduceRing: every local buffer contributes, every one gets the result.
    opts.setInputs(ptrs_, static_cast<size_t>(count_));
    opts.setOutputs(ptrs_, static_cast<size_t>(count_));
    const ReductionFunction<T>* fn = fn_;
    opts.setReduceFunction([fn](void* c, const void* a, const void* b, size_t n) {
      if (c != a) std::memcpy(c, a, n * sizeof(T));
      fn->call(static_cast<T*>(c), static_cast<const T*>(b), n);
    });
    opts.setReduceOp(ReduceOpOf(fn_->type()));
    opts.setDataType(DataTypeOf());
    opts.setHadamard(hadamard_);
    opts.setTag(tag_);
    optireduce::allreduce(opts);
  }

 private:
  static optireduce::ReduceOp ReduceOpOf(ReductionType type) {
    switch (type) {
      case SUM: return optireduce::ReduceOp::kSum;
      case PRODUCT: return optireduce::ReduceOp::kProduct;
      case MAX: return optireduce::ReduceOp::kMax;
      case MIN: return optireduce::ReduceOp::kMin;
      default: return optireduce::ReduceOp::kUnknown;
    }
  }
  static optireduce::DataType DataTypeOf() {
    if (std::is_same<T, float>::value) return optireduce::DataType::kFloat32;
    if (std::is_same<T, double>::value) return optireduce::DataType::kFloat64;
    if (std::is_same<T, int32_t>::value) return optireduce::DataType::kInt32;
    if (std::is_same<T, int64_t>::value) return optireduce::DataType::kInt64;
    if (std::is_same<T, uint64_t>::value) return optireduce::DataType::kUInt64;
    if (std::is_same<T, int8_t>::value) return optireduce::DataType::kInt8;
    if (std::is_same<T, uint8_t>::value) return optireduce::DataType::kUInt8;
    return optireduce::DataType::kOther;
  }

  std::vector<T*> ptrs_;
  const int count_;
  const ReductionFunction<T>* fn_;
  const optireduce::AllreduceOptions::Hadamard hadamard_;
  const uint32_t tag_;
};

}  // namespace gloo
