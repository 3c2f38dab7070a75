// Runs one rank of optireduce-bench: rendezvous, then for each element count verify,
// warm up, time iterations (Gloo's sampling rules) and let rank 0 print the table row.
#pragma once

#include "bench/harness/options.h"

namespace optireduce {
namespace bench {

// Exit status: 0 ok, 1 verification failed or a runtime error (printed to stderr).
int RunBenchRank(const BenchOptions& options);

// --local-ranks: forks options.local_ranks ranks that rendezvous through a FileStore.
int RunBenchLocal(const BenchOptions& options);

}  // namespace bench
}  // namespace optireduce
