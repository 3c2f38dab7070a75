// Command-line options of optireduce-bench. The names and meanings follow Gloo's upstream
// benchmark harness (gloo/benchmark/options.cc) so scripts written for it run unchanged;
// our additions are marked "extra".
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/harness/run_optireduce.h"
#include "gloo_ext/config.h"

namespace optireduce {
namespace bench {

struct BenchOptions {
  // Participation.
  int rank = 0;
  int size = 0;
  // Rendezvous: Redis if redis_host is set, else the file system if shared_path is set.
  std::string redis_host;
  int redis_port = 6379;
  std::string redis_password;  // extra; or OPTIREDUCE_REDIS_URL
  std::string prefix = "prefix";
  std::string shared_path;
  int local_ranks = 0;  // extra: fork this many ranks here (FileStore in a temp dir)
  bool local_child = false;  // set (not a flag) in the ranks --local-ranks forks: loopback
  // Transport.
  std::string transport = "tcp";
  std::vector<std::string> tcp_devices;  // network interfaces (tcp; udp binds to its IPv4)
  bool sync = false;
  bool busy_poll = false;
  // Suite.
  std::string benchmark;  // the algorithm (positional)
  bool verify = true;
  bool verify_last = false;  // extra: verify one more operation after the timed ones
  bool show_all_errors = false;
  long elements = -1;  // -1: sweep 100 .. 5,000,000
  long iteration_count = -1;
  std::chrono::nanoseconds iteration_time = std::chrono::seconds(2);
  int warmup_iters = 5;
  int inputs = 1;
  int threads = 1;
  bool show_nanos = false;
  int base = 2;  // allreduce_bcube
  // Extras.
  std::string csv;                // append one row per element count
  std::string samples_csv;        // append every timed iteration (for latency CDFs)
  std::string counters_csv;       // each rank writes FILE.RANK: what its transport resent
  std::string straggler_dist;     // e.g. "exp:5" (ms), see straggler.h
  int straggler_rank = -1;        // -1: the last rank
  uint64_t seed = 1;              // straggler draws
  std::chrono::seconds timeout{300};  // every context operation and rendezvous
  // optireduce: the library's defaults, then OPTIREDUCE_* variables, then the flags.
  double repair_budget = 1.0;     // TimeoutOptions::repair_budget_fraction
  bool learn_start_grace = false;  // --start-grace learned (TimeoutOptions)
  std::chrono::milliseconds bound_cap{0};  // OPTIREDUCE_TIMEOUT_MS (0: adaptive only)
  OptiReduceSettings optireduce;   // --hadamard auto|on|off, --max-loss
};

// The algorithms this harness runs.
const std::vector<std::string>& KnownBenchmarks();

// Parses argv. On a bad flag or value the error message names the flag and what is
// allowed. A request for help returns NotFoundError("help").
absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, const char* const* argv);

// As above, with OptiReduce mode's settings first taken from the library's variables in
// `env` (OPTIREDUCE_MAX_LOSS, OPTIREDUCE_TIMEOUT_MS/GLOO_DPDK_TIMEOUT,
// OPTIREDUCE_REPAIR_BUDGET, OPTIREDUCE_START_GRACE, OPTIREDUCE_HADAMARD), read by the
// library's own parser (same spellings and messages as in a PyTorch job); flags override.
absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, const char* const* argv,
                                               const gloo_ext::EnvLookup& env);

// The --help text.
std::string BenchUsage(const char* argv0);

}  // namespace bench
}  // namespace optireduce
