// The result table (Gloo's columns plus loss, relative error and phase timeouts) and CSV.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/harness/iteration_stats.h"
#include "bench/harness/options.h"

namespace optireduce {
namespace bench {

struct SizeResult {
  size_t elements = 0;
  size_t bytes = 0;                // per buffer
  std::vector<int64_t> nanos;      // per iteration, rank 0's samples (as Gloo reports)
  std::vector<IterationStats> stats;      // per iteration, same order
  double rel_error = 0;            // of the verified run, max over ranks (0: not verified)
  bool verified = false;
  double rel_error_last = 0;       // --verify-last: of one operation after the timed ones
  bool verified_last = false;
  int threads = 1;
};

void PrintHeader(const BenchOptions& o, const std::string& device);
void PrintRow(const BenchOptions& o, const SizeResult& r);
void PrintFooter();
// Appends a row (and the header when the file is new or empty). Returns false on I/O error.
bool AppendCsv(const BenchOptions& o, const SizeResult& r);

// The p-th percentile (0..1) of sorted samples, Gloo's way (index p * n, clamped).
int64_t Percentile(const std::vector<int64_t>& sorted, double p);

}  // namespace bench
}  // namespace optireduce
