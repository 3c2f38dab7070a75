#include "bench/harness/run_optireduce.h"

#include <gloo/math.h>

#include "algorithms/allreduce.h"
#include "algorithms/op_stats.h"

namespace optireduce {
namespace bench {
namespace {

const char* Short(PhaseEnd end) {
  switch (end) {
    case PhaseEnd::kComplete: return "done";
    case PhaseEnd::kEarlyTimeout: return "early";
    case PhaseEnd::kDeadline: return "hard";
    case PhaseEnd::kPeerTimeout: return "peer";
    case PhaseEnd::kPeerFailed: return "failed";
  }
  return "?";
}

}  // namespace

// OptiReduce mode: TAR over the context transport's bounded service (udp, dpdk), with the
// process-wide adaptive timeout policy; over Gloo TCP it runs exact TAR.
void RunOptiReduce(const OptiReduceCall& call, IterationStats* stats) {
  optireduce::AllreduceOptions opts(call.context);
  opts.setInputs(call.buffers, call.elements);
  opts.setOutputs(call.buffers, call.elements);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  opts.setTag(call.tag);
  opts.setTimeout(call.timeout);
  opts.setHadamard(call.settings.hadamard);
  opts.setMaxLoss(call.settings.max_loss);
  opts.setMode(AllreduceOptions::Mode::kBounded);
  opts.setLayout(call.settings.layout);
  opts.setGroupSize(call.settings.group_size);
  OpStats op;
  opts.setStatsOutput(&op);
  optireduce::allreduce(opts);
  *stats = IterationStats{};
  if (op.mode == OpMode::kBounded) {
    stats->loss_fraction = op.loss_pct / 100.0;
    stats->damaged = op.damaged;
    stats->phase_timeouts =
        std::string(Short(op.phase[0].end)) + "/" + Short(op.phase[1].end);
  } else if (op.mode != OpMode::kNone) {
    stats->phase_timeouts = op.mode == OpMode::kCalibration ? "calib" : "-";
  }
}

}  // namespace bench
}  // namespace optireduce
