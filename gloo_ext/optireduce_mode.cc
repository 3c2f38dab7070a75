#include "gloo_ext/optireduce_mode.h"

#include "algorithms/allreduce.h"
#include "gloo_ext/config.h"

namespace optireduce {
namespace gloo_ext {

void RunOptiReduce(const ::gloo::AllreduceOptions& opts) {
  // Placeholder until the bounded mode lands: reliable TAR (see the header).
  const Config& config = GetConfigOrThrow();
  const auto hadamard = config.hadamard == HadamardSetting::kOff
                            ? AllreduceOptions::Hadamard::kOff
                            : AllreduceOptions::Hadamard::kAuto;
  optireduce::allreduce(opts, hadamard);
}

std::string OptiReduceStatsJson() { return "{}"; }

void ResetOptiReduceStats() {}

}  // namespace gloo_ext
}  // namespace optireduce
