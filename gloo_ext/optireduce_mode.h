// GLOO_ALGO=optireduce: the bounded (time-limited, loss-tolerant) allreduce.
//
// OptiReduce mode (algorithms/bounded_transpose.h) with the settings of the environment:
// the library's Hadamard default (HadamardFor), OPTIREDUCE_MAX_LOSS, and
// OPTIREDUCE_TIMEOUT_MS as the hard cap of the adaptive bound. On a transport without a
// bounded service (Gloo TCP) it runs exact TAR and says so once on stderr.
#pragma once

#include <string>

#include <gloo/allreduce.h>

#include "algorithms/allreduce.h"
#include "algorithms/reduce_classifier.h"
#include "gloo_ext/config.h"

namespace optireduce {
namespace gloo_ext {

// Called by the interposer only for data types and ops TAR supports, with the kind it
// classified. Throws like gloo::allreduce (gloo::EnforceNotMet, gloo::IoException).
void RunOptiReduce(const ::gloo::AllreduceOptions& opts, const ReduceKind& kind);

// OPTIREDUCE_LAYOUT on the options of an interposed allreduce (transpose and optireduce:
// OpStats::group_size says which layout an operation ran).
void SetLayout(const LayoutChoice& choice, AllreduceOptions* extras);

// Per-operation statistics of the bounded mode as a JSON object ("{}" when none yet);
// returned by the Python package's optireduce.stats()["optireduce"].
std::string OptiReduceStatsJson();
void ResetOptiReduceStats();

}  // namespace gloo_ext
}  // namespace optireduce
