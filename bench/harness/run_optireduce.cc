#include "bench/harness/run_optireduce.h"

#include <gloo/math.h>

#include "algorithms/allreduce.h"

namespace optireduce {
namespace bench {

// TODO(lead): replace with the bounded OptiReduce mode (per-phase deadlines, loss
// compensation) and fill `stats` from its per-operation statistics (loss fraction, which
// timeout ended each phase). Until then this is TAR with Hadamard kAuto over whatever
// transport the context uses: reliable, so the loss is 0 and no timeout fires.
void RunOptiReduce(const OptiReduceCall& call, IterationStats* stats) {
  optireduce::AllreduceOptions opts(call.context);
  opts.setInputs(call.buffers, call.elements);
  opts.setOutputs(call.buffers, call.elements);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  opts.setTag(call.tag);
  opts.setTimeout(call.timeout);
  opts.setHadamard(AllreduceOptions::Hadamard::kAuto);
  optireduce::allreduce(opts);
  *stats = IterationStats{};
}

}  // namespace bench
}  // namespace optireduce
