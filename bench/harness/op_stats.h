// What one allreduce reports besides its time. Reliable algorithms leave the defaults;
// OptiReduce's bounded mode fills them from its per-operation statistics.
#pragma once

#include <string>

namespace optireduce {
namespace bench {

struct OpStats {
  double loss_fraction = 0;  // share of the gradient bytes that did not arrive (0..1)
  // Which timeout ended each phase, e.g. "early/hard"; "-" when none fired.
  std::string phase_timeouts = "-";
};

}  // namespace bench
}  // namespace optireduce
