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

#include "algorithms/bounded_transpose.h"
#include "algorithms/op_stats.h"
#include "algorithms/timeout_policy.h"
#include "algorithms/two_level_plan.h"
#include "algorithms/types.h"

namespace optireduce {

class AllreduceOptions : public gloo::AllreduceOptions {
 public:
  enum class Hadamard : uint8_t {
    kOff,   // never transform
    kOn,    // transform; an error if the type/op is not a floating-point sum
    kAuto,  // transform floating-point sums, bypass everything else
    // The default. In OptiReduce mode: kAuto where a TAR shard (elements / N) is smaller
    // than a transform block, kOff where it is not (HadamardSpreadsShards: the transform
    // can only spread a shard the decision leaves out over the blocks that shard shares
    // with others). In reliable TAR: kOff (as GLOO_ALGO=transpose: exact sums).
    kDefault,
  };

  enum class Mode : uint8_t {
    kReliable,  // exact TAR over the transport's reliable service
    kBounded,   // OptiReduce mode: bounded time, tolerates loss (float sums only)
  };

  // How TAR arranges the ranks, exact or in OptiReduce mode (two_level_plan.h,
  // exact_transpose.h; algorithms/README.md).
  enum class Layout : uint8_t {
    kAuto,      // two-level from kTwoLevelMinRanks ranks on, when N has a divisor > 1
    kFlat,      // flat TAR: every rank sends to every rank
    kTwoLevel,  // two-level TAR: groups of groupSize() (or TwoLevelGroupSize(N))
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
  // Exact TAR sends each round in chunks of this many bytes and reduces and forwards a
  // chunk as soon as it is in, overlapping both phases with the transfer. 0: one chunk per
  // round (phase 2 starts once the whole phase 1 is reduced).
  void setPipelineChunkBytes(size_t bytes) { pipeline_chunk_bytes_ = bytes; }
  // Exact (reliable) operations of at most this many bytes without the Hadamard transform
  // run recursive doubling (recursive_doubling.h) instead of TAR: ceil(log2 N) exchanges of
  // the whole buffer cost less than TAR's 2(N-1) messages while per-message cost dominates.
  // 0: always TAR. OptiReduce mode (bounded) is not affected.
  void setSmallMessageBytes(size_t bytes) { small_message_bytes_ = bytes; }
  // TAR's layout. Two-level TAR: ranks in N/G groups of G run TAR's phase 1 within the
  // group, a whole TAR across the groups between the ranks that own the same part, and
  // phase 2 within the group: 2(G-1) + 2(N/G-1) messages per rank instead of 2(N-1). In
  // OptiReduce mode (kBounded) the TAR across the groups is the bounded one and the
  // phases within the group are exact (OpStats::group_size says which layout ran); exact
  // operations up to the small-message size run recursive doubling.
  void setLayout(Layout layout) { layout_ = layout; }
  // Two-level TAR's group size G; 0: TwoLevelGroupSize(N). A G that does not divide N
  // raises gloo::EnforceNotMet (on every rank: it depends on the options alone). G = 1 or
  // G = N is flat TAR. Every rank must name the same layout: the fingerprint exchange
  // raises when they differ.
  void setGroupSize(size_t group_size) { group_size_ = group_size; }
  // OptiReduce mode. Float sums on a transport with a bounded service run bounded; other
  // types/ops, and transports without one (Gloo TCP), run reliable TAR (stats say so).
  void setMode(Mode mode) { mode_ = mode; }
  // Largest fraction of bytes an operation may lose before it repairs (then flags damage).
  void setMaxLoss(double fraction) { max_loss_ = fraction; }
  void setCompensation(Compensation compensation) { compensation_ = compensation; }
  // Bounds per bucket size; by default one process-wide policy (DefaultTimeoutPolicy()).
  void setTimeoutPolicy(std::shared_ptr<TimeoutPolicy> policy) { policy_ = std::move(policy); }
  // A bounded channel to use instead of the context transport's own (tests, custom
  // transports); the caller keeps it alive during the call.
  void setBoundedChannel(BoundedChannel* channel) { channel_ = channel; }
  // Receives this call's statistics (OptiReduce mode); also in StatsRegistry.
  void setStatsOutput(OpStats* stats) { stats_out_ = stats; }

  DataType dataType() const { return type_; }
  ReduceOp reduceOp() const { return op_; }
  Hadamard hadamard() const { return hadamard_; }
  uint64_t hadamardSeed() const { return hadamard_seed_; }
  int hadamardLog2Block() const { return hadamard_log2_block_; }
  size_t maxSegmentBytes() const { return max_segment_bytes_; }
  size_t smallMessageBytes() const { return small_message_bytes_; }
  size_t pipelineChunkBytes() const { return pipeline_chunk_bytes_; }
  Layout layout() const { return layout_; }
  size_t groupSize() const { return group_size_; }
  Mode mode() const { return mode_; }
  double maxLoss() const { return max_loss_; }
  Compensation compensation() const { return compensation_; }
  const std::shared_ptr<TimeoutPolicy>& timeoutPolicy() const { return policy_; }
  BoundedChannel* boundedChannel() const { return channel_; }
  OpStats* statsOutput() const { return stats_out_; }

  // The Gloo part of the options (context, buffers, count, function, tag, timeout).
  const gloo::detail::AllreduceOptionsImpl& glooOptions() const { return impl_; }

  static constexpr size_t kDefaultMaxSegmentBytes = 32 * 1024 * 1024;
  static constexpr size_t kDefaultPipelineChunkBytes = 1024 * 1024;
  // Chosen from optireduce-sweep (bench/README.md): the largest size at which recursive
  // doubling was still faster than TAR on every transport at 2 and 4 ranks.
  static constexpr size_t kDefaultSmallMessageBytes = 64 * 1024;
  // kAuto's switch-over: two-level TAR from this many ranks on. Chosen by the scaling model
  // (bench/README.md): below it flat TAR's N-1 messages per phase cost less than the extra
  // round two-level TAR adds.
  static constexpr int kTwoLevelMinRanks = 128;
  // The loss limit of every entry point (this API, OPTIREDUCE_MAX_LOSS, optireduce-bench).
  static constexpr double kDefaultMaxLoss = optireduce::kDefaultMaxLoss;
  // OptiReduce mode's default Hadamard block (2^17 elements): a lost 1 KiB packet's damage
  // spreads over 512x more coordinates than its size. Measured end to end at 1% loss
  // (tests/algorithms/bounded_transpose_test) the max-abs error shrinks 4.3x with 2^15,
  // 5.0x with 2^16, 6.2x with 2^17, 6.4x with 2^18; the transform costs ~10% more per
  // extra doubling (algorithms/README.md), so 2^17. It is also the size below which a TAR
  // shard is transformed by default (Hadamard::kDefault).
  static constexpr int kBoundedHadamardLog2Block = 17;
  static constexpr uint64_t kDefaultHadamardSeed = 0x6f707469726564ULL;  // "optired"

 private:
  DataType type_ = DataType::kUnknown;
  ReduceOp op_ = ReduceOp::kUnknown;
  Hadamard hadamard_ = Hadamard::kDefault;
  uint64_t hadamard_seed_ = kDefaultHadamardSeed;
  int hadamard_log2_block_ = -1;                 // -1: the Hadamard module's default
  size_t max_segment_bytes_ = kDefaultMaxSegmentBytes;
  size_t small_message_bytes_ = kDefaultSmallMessageBytes;
  size_t pipeline_chunk_bytes_ = kDefaultPipelineChunkBytes;
  Layout layout_ = Layout::kAuto;
  size_t group_size_ = 0;
  Mode mode_ = Mode::kReliable;
  double max_loss_ = kDefaultMaxLoss;
  Compensation compensation_ = Compensation::kDebias;
  std::shared_ptr<TimeoutPolicy> policy_;
  BoundedChannel* channel_ = nullptr;
  OpStats* stats_out_ = nullptr;
};

// Whether OptiReduce mode's default (Hadamard::kDefault) transforms an allreduce of
// `elements` over `ranks` ranks with blocks of 2^log2_block elements: when a TAR shard
// (elements / ranks) is smaller than a block. Every counted byte is repaired, so the
// transform only acts on a shard the decision leaves out (zero in the transformed domain,
// carried): the inverse spreads it over the blocks it shares with other shards, and a block
// wholly inside it stays zero in both domains. With shards of a block or more the transform
// would freeze the same contiguous range while costing two passes over the buffer. A
// function of the call alone: the same on every rank.
bool HadamardSpreadsShards(size_t elements, int ranks, int log2_block);

// The policy used when AllreduceOptions has none.
TimeoutPolicy& DefaultTimeoutPolicy();
void SetDefaultTimeoutOptions(const TimeoutOptions& options);

// Runs TAR. Throws gloo::EnforceNotMet on bad input (message names the problem) and
// gloo::IoException when a peer does not answer within the timeout.
void allreduce(const AllreduceOptions& opts);

// The same algorithm for plain gloo::AllreduceOptions (used by the PyTorch interposer),
// with the extras taken from `extras` (its own context and buffers are ignored).
void allreduce(const gloo::AllreduceOptions& opts, const AllreduceOptions& extras);
void allreduce(const gloo::AllreduceOptions& opts, AllreduceOptions::Hadamard hadamard);

// Read access to the protected state of plain gloo::AllreduceOptions.
const gloo::detail::AllreduceOptionsImpl& GlooOptionsOf(const gloo::AllreduceOptions& opts);

}  // namespace optireduce
