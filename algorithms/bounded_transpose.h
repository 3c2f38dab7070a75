// TAR over a bounded channel: OptiReduce mode.
//
// Phase 1: every rank sends shard j to its owner j without retransmission. The leader of
// the operation (bounded_agreement.h) waits for its contributions until the start grace
// and decides which ranks count: those whose data reached it. Every owner then sums
// exactly the counted contributions (repairing lost packets until they are complete) and,
// if it is counted itself, sends its reduced shard to everyone (phase 2), again repaired
// until complete. The shard of an owner that is not counted is zero on every rank, and
// every rank keeps what of its own contribution was not applied for its next operation on
// the same buffer (`carry_out`). The result is the same on every rank, bit for bit.
// No barrier anywhere: a straggler costs its own contribution (deferred, not lost).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "algorithms/bounded_agreement.h"
#include "algorithms/bounded_channel.h"
#include "algorithms/hadamard.h"
#include "algorithms/op_stats.h"
#include "algorithms/reduce_classifier.h"
#include "algorithms/timeout_policy.h"
#include "algorithms/two_level_plan.h"
#include "algorithms/types.h"

namespace gloo {
class Context;
}

namespace optireduce {

enum class Compensation : uint8_t { kDebias, kZeroFill };

// One default loss limit for every entry point (the C++ API, OPTIREDUCE_MAX_LOSS,
// optireduce-bench): a benchmark of the C++ API measures what a PyTorch job gets. 5%, as
// a limit for abnormal loss, not for the ~1% a lossy cloud path drops all
// the time (then half of the operations would repair, adding traffic when the path is
// already lossy); the Hadamard transform and debiasing keep the error of a few % loss small
// (BoundedTranspose.LossIsBoundedMeasuredAndSmall). In the lab at 1% loss, limits of 0.01
// and 0.05 give the same tail within noise (bench/RESULTS.md has the loss table).
constexpr double kDefaultMaxLoss = 0.05;

struct BoundedTransposeArgs {
  gloo::Context* context = nullptr;
  BoundedChannel* channel = nullptr;
  // The ranks that run this TAR (two_level_plan.h): every rank of the context when its
  // size is 0, else a team of them (two-level OptiReduce mode's phase B). Ranks, leaders,
  // deputies, `must_wait` and the decision below are member indices of the team; the
  // stats name context ranks.
  Team team{0, 0, 0, 1};
  char* data = nullptr;  // float32/float64 elements, summed
  size_t elements = 0;
  // The elements of the whole allreduce this TAR is part of (0: `elements`): the size the
  // transport states in every packet and checks (BoundedChannel::BeginOperation).
  size_t op_elements = 0;
  DataType type = DataType::kFloat32;
  uint64_t op = 0;  // the same on every rank for the same operation
  uint32_t tag = 0;  // for error messages
  TimeBound bound;
  // When set, called once this rank's phase-1 data is queued (before any wait); what it
  // returns replaces `bound` (OptiReduce mode's agreed bound, which may wait for this
  // rank's concurrent calibrations: allreduce.cc). The bound in effect goes into the stats.
  std::function<TimeBound()> settle_bound;
  double max_loss = kDefaultMaxLoss;
  Compensation compensation = Compensation::kDebias;
  // Transform the result back (inverse Hadamard with this seed and layout) while placing
  // the other owners' shards, block by block: each block is written and transformed while
  // it is in cache — one pass over the buffer instead of a placement pass and a transform
  // pass.
  bool inverse_hadamard = false;
  uint64_t hadamard_seed = 0;
  hadamard::Options hadamard;
  // Agreement: the operation's leader (LeaderOf), the Gloo slot its decision travels on,
  // and until when waits that must end complete (the decision, repairs of counted data)
  // may take: the operation's timeout. `must_wait`: ranks the leader waits for however
  // late they are (BoundedContextState::MustWait); empty: none.
  int leader = 0;
  uint64_t decision_slot = 0;
  std::chrono::milliseconds timeout{0};  // 0: the context's timeout
  std::vector<bool> must_wait;
  // Ranks left out of the last decision seen on the context (still catching up): how late
  // they start this operation is their straggle, not the ranks' usual skew, so the start
  // lag (OpStats::start_lag_ms, which the start grace learns from) leaves them out; empty:
  // none.
  std::vector<bool> catching_up;
  // Out: the decision this operation followed.
  Decision* decision_out = nullptr;
  // Out: what of this rank's contribution was not applied, in the caller's domain
  // (transformed back when `inverse_hadamard`), over `elements` values; no ranges when all
  // of it was applied.
  Carry* carry_out = nullptr;
};

// Runs both phases on `args.data` in place and fills the phase fields of `stats`. Throws
// gloo::IoException naming the rank when a peer whose data is missing is gone
// (BoundedReceive::PeerStatus), and what the channel's Send throws; either way the
// operation's sources are released before the exception leaves.
void BoundedTranspose(const BoundedTransposeArgs& args, OpStats* stats);

// Sizes (and faults in) the calling thread's scratch for a later BoundedTranspose of this
// shape, so that the first bounded operation does not spend its deadline on page faults.
// Calibration operations call it.
void PrepareBoundedTranspose(DataType type, size_t elements, int rank, int ranks);

// Operation id of one phase (1 or 2) of the `counter`-th operation with `tag`.
uint64_t BoundedOpId(uint32_t tag, uint64_t counter, int phase);

}  // namespace optireduce
