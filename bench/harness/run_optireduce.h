// The `optireduce` benchmark's single entry point. Everything the harness knows about the
// OptiReduce algorithm goes through RunOptiReduce, so switching the benchmark to the
// bounded mode is an edit of run_optireduce.cc only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <gloo/context.h>

#include "algorithms/allreduce.h"
#include "bench/harness/iteration_stats.h"

namespace optireduce {
namespace bench {

// The per-call settings of OptiReduce mode that the harness exposes as flags; the defaults
// are the library's (what a PyTorch job gets without OPTIREDUCE_* variables).
struct OptiReduceSettings {
  // The randomized Hadamard transform: --hadamard auto (default: the library's,
  // Hadamard::kDefault), on (every float sum, as OPTIREDUCE_HADAMARD=1), off (as
  // OPTIREDUCE_HADAMARD=0).
  AllreduceOptions::Hadamard hadamard = AllreduceOptions::Hadamard::kDefault;
  // Loss above which an operation repairs and then flags damage (--max-loss,
  // OPTIREDUCE_MAX_LOSS).
  double max_loss = AllreduceOptions::kDefaultMaxLoss;
  // TAR's layout and two-level group size (--layout, --group-size), for `transpose` and
  // `optireduce` (two-level OptiReduce mode: algorithms/README.md).
  AllreduceOptions::Layout layout = AllreduceOptions::Layout::kAuto;
  size_t group_size = 0;
};

struct OptiReduceCall {
  std::shared_ptr<gloo::Context> context;
  std::vector<float*> buffers;  // inputs; every one holds the sum afterwards
  size_t elements = 0;          // per buffer
  uint32_t tag = 0;
  std::chrono::milliseconds timeout{300000};
  OptiReduceSettings settings;
};

// Runs one allreduce (float sum, in place over all buffers) and fills `stats`.
void RunOptiReduce(const OptiReduceCall& call, IterationStats* stats);

}  // namespace bench
}  // namespace optireduce
