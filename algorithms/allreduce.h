// optireduce::allreduce — Transpose AllReduce (TAR) for any Gloo transport.
//
// Takes everything gloo::AllreduceOptions takes (context, inputs/outputs as pointers or
// unbound buffers, element count, reduce function, tag, timeout) plus optireduce's extras.
// Over a reliable transport (Gloo TCP, optireduce's reliable service) the result is exact
// up to the order of floating-point additions, which is fixed: the owner of a shard adds
// contributions in the order own, (r+1) mod N, (r+2) mod N, ...
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include <gloo/allreduce.h>

#include "algorithms/types.h"

namespace optireduce {

class AllreduceOptions : public gloo::AllreduceOptions {
 public:
  enum class Hadamard : uint8_t {
    kOff,   // never transform
    kOn,    // transform; an error if the type/op is not a floating-point sum
    kAuto,  // transform floating-point sums, bypass everything else
  };

  explicit AllreduceOptions(const std::shared_ptr<gloo::Context>& context)
      : gloo::AllreduceOptions(context) {}

  // Type and operator of the data. When not set they are recognised from the reduce
  // function (gloo::sum<T>, product, min, max); a custom function is reduced as given.
  void setDataType(DataType type) { type_ = type; }
  void setReduceOp(ReduceOp op) { op_ = op; }
  void setHadamard(Hadamard mode) { hadamard_ = mode; }
  // Shared by all ranks; the transform's signs are drawn from it and a per-(context, tag)
  // operation counter, so every call uses fresh signs.
  void setHadamardSeed(uint64_t seed) { hadamard_seed_ = seed; }
  void setHadamardLog2Block(int log2_block) { hadamard_log2_block_ = log2_block; }
  // Upper bound on the scratch memory per peer; larger shards are reduced in rounds.
  void setMaxSegmentBytes(size_t bytes) { max_segment_bytes_ = bytes; }

  DataType dataType() const { return type_; }
  ReduceOp reduceOp() const { return op_; }
  Hadamard hadamard() const { return hadamard_; }
  uint64_t hadamardSeed() const { return hadamard_seed_; }
  int hadamardLog2Block() const { return hadamard_log2_block_; }
  size_t maxSegmentBytes() const { return max_segment_bytes_; }

  // The Gloo part of the options (context, buffers, count, function, tag, timeout).
  const gloo::detail::AllreduceOptionsImpl& glooOptions() const { return impl_; }

  static constexpr size_t kDefaultMaxSegmentBytes = 32 * 1024 * 1024;
  static constexpr uint64_t kDefaultHadamardSeed = 0x6f707469726564ULL;  // "optired"

 private:
  DataType type_ = DataType::kUnknown;
  ReduceOp op_ = ReduceOp::kUnknown;
  Hadamard hadamard_ = Hadamard::kOff;
  uint64_t hadamard_seed_ = kDefaultHadamardSeed;
  int hadamard_log2_block_ = -1;                 // -1: the Hadamard module's default
  size_t max_segment_bytes_ = kDefaultMaxSegmentBytes;
};

// Runs TAR. Throws gloo::EnforceNotMet on bad input (message names the problem) and
// gloo::IoException when a peer does not answer within the timeout.
void allreduce(const AllreduceOptions& opts);

// The same algorithm for plain gloo::AllreduceOptions (used by the PyTorch interposer).
void allreduce(const gloo::AllreduceOptions& opts, AllreduceOptions::Hadamard hadamard);

// Read access to the protected state of plain gloo::AllreduceOptions.
const gloo::detail::AllreduceOptionsImpl& GlooOptionsOf(const gloo::AllreduceOptions& opts);

}  // namespace optireduce
