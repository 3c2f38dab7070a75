// GLOO_ALGO=optireduce: the bounded (time-limited, loss-tolerant) allreduce.
//
// One function, in its own file, so the bounded mode can replace its body without touching
// the interposer. Until then it runs reliable TAR with the Hadamard transform on float sums
// (OPTIREDUCE_HADAMARD=0 turns it off), which is what the bounded mode does when nothing is
// lost.
#pragma once

#include <string>

#include <gloo/allreduce.h>

namespace optireduce {
namespace gloo_ext {

// Called by the interposer only for data types and ops TAR supports (classified).
// Throws like gloo::allreduce (gloo::EnforceNotMet, gloo::IoException).
void RunOptiReduce(const ::gloo::AllreduceOptions& opts);

// Per-operation statistics of the bounded mode as a JSON object ("{}" when none yet);
// returned by the Python package's optireduce.stats()["optireduce"].
std::string OptiReduceStatsJson();
void ResetOptiReduceStats();

}  // namespace gloo_ext
}  // namespace optireduce
