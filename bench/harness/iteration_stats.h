// What one timed allreduce reports besides its time. Reliable algorithms leave the
// defaults; RunOptiReduce fills it from optireduce::OpStats (algorithms/op_stats.h):
// loss_pct / 100, and each phase's PhaseEnd.
#pragma once

#include <string>

namespace optireduce {
namespace bench {

struct IterationStats {
  double loss_fraction = 0;  // share of the gradient bytes that did not arrive (0..1)
  // Which timeout ended each phase, e.g. "early/hard"; "-" when none fired.
  std::string phase_timeouts = "-";
  // OptiReduce mode flagged the result as damaged (loss above the limit not repaired, or
  // an owner's shard estimated): a training loop would skip such a step.
  bool damaged = false;
};

}  // namespace bench
}  // namespace optireduce
