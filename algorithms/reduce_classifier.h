// Recognises what an opaque Gloo reduce function computes.
//
// gloo::AllreduceOptions carries no data type and no operator: only an element size and a
// function pointer (a copy of gloo::sum<T>/product/min/max compiled into the caller).
// Calling the function once on probe values tells type and operator apart reliably.
// Results are cached per function pointer, so the probe runs once per function.
#pragma once

#include <cstddef>
#include <functional>

#include "algorithms/types.h"

namespace optireduce {

using ReduceFunc = std::function<void(void*, const void*, const void*, size_t)>;

struct ReduceKind {
  DataType type = DataType::kUnknown;
  ReduceOp op = ReduceOp::kUnknown;
};

// Classifies `fn` applied to elements of `element_size` bytes. Returns kUnknown fields when
// the function matches none of the known kinds (a custom reduction).
ReduceKind ClassifyReduce(const ReduceFunc& fn, size_t element_size);

}  // namespace optireduce
