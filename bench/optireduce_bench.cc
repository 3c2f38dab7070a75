// optireduce-bench: Gloo's benchmark harness for allreduce, with Gloo's flags, plus the
// optireduce algorithms, loss/relative-error/timeout columns, CSV output, stragglers and
// --local-ranks. See bench/README.md.
//
//   optireduce-bench --local-ranks 4 --elements 1000000 allreduce_ring_chunked
//   optireduce-bench --size 4 --rank R --shared-path /mnt/rdv --tcp-device eth0 transpose
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "algorithms/op_stats.h"
#include "gloo_ext/config.h"
#include "bench/harness/options.h"
#include "bench/harness/runner.h"

int main(int argc, char** argv) {
  using namespace optireduce::bench;
  // OptiReduce mode's OPTIREDUCE_* variables apply as in a PyTorch job (flags override).
  auto options = ParseBenchOptions(argc, argv, optireduce::gloo_ext::ReadEnvironment);
  if (!options.ok()) {
    if (absl::IsNotFound(options.status())) {
      std::fputs(BenchUsage(argv[0]).c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "%s: %s\nTry '%s --help' for more information.\n", argv[0],
                 std::string(options.status().message()).c_str(), argv[0]);
    return 2;
  }
  // As in PyTorch jobs: OPTIREDUCE_STATS_FILE logs every OptiReduce-mode operation.
  if (const std::optional<std::string> path =
          optireduce::gloo_ext::ReadEnvironment("OPTIREDUCE_STATS_FILE")) {
    optireduce::StatsRegistry::Get().SetLogPath(*path);
  }
  if (options->local_ranks > 0) return RunBenchLocal(*options);
  return RunBenchRank(*options);
}
