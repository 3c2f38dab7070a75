// The one place where optireduce reads its environment variables.
//
// Every setting a user can give through the environment (GLOO_ALGO, OPTIREDUCE_*, and the
// original OptiReduce project's GLOO_DPDK_* names where they mean the same) is parsed and
// validated here, so that a typo fails at first use with a message naming the variable,
// its value and what is allowed, instead of silently running something else.
//
// It is also the only code that reads the process environment (ReadEnvironment): the
// layers below take plain structs — the transport its attrs (transport_dpdk/attr.h,
// dpdk_attr.h), rendezvous its RedisOptions — which gloo_ext/devices.h and
// gloo_ext/redis_options.h fill from a Config. The parser lives here, at the top of the
// layering (gloo_ext -> algorithms -> transport_dpdk), rather than below the transport:
// it names every variable of every layer in one table, validates with the lower layers'
// own parsers (fault specs, Redis URLs), and the lower layers stay free of the environment
// and of any upward dependency. tests/gloo_ext/check_config_reads.py fails the build's
// tests when a variable is read anywhere else.
//
// Entry points:
//   ParseConfig(lookup)      pure: parses the variables `lookup` returns (unit-testable);
//   ConfigFromEnvironment()  parses the process environment as it is now, every call (for
//                            C++ programs that make devices themselves: devices.h's
//                            *FromEnvironment() helpers);
//   GetConfig()              the process's configuration, parsed from the real environment
//                            once, at first use; the same result (or error) every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "algorithms/allreduce.h"

namespace optireduce {
namespace gloo_ext {

// What gloo::allreduce does when interposed (GLOO_ALGO).
enum class Algo : uint8_t {
  kRing,        // "ring": stock Gloo (the call is forwarded unchanged)
  kTranspose,   // "transpose": Transpose AllReduce over a reliable transport, exact
  kOptiReduce,  // "optireduce": TAR with the bounded (time-limited, lossy) service
};
const char* AlgoName(Algo algo);

// OPTIREDUCE_HADAMARD: whether TAR applies the randomized Hadamard transform.
enum class HadamardSetting : uint8_t {
  kDefault,  // unset: off for transpose, the library's default for optireduce (HadamardFor)
  kOff,      // 0/off/false/no
  kOn,       // 1/on/true/yes: transform float32/float64 sums, other data as is
};

// OPTIREDUCE_HADAMARD in OptiReduce mode, as AllreduceOptions::Hadamard: unset, the
// library's default (kDefault: float sums whose TAR shards are smaller than a transform
// block); 1, every float sum (kAuto); 0, none (kOff).
AllreduceOptions::Hadamard HadamardFor(HadamardSetting setting);

// OPTIREDUCE_LAYOUT: the layout of Transpose AllReduce (AllreduceOptions::Layout).
enum class LayoutSetting : uint8_t {
  kAuto,      // "auto" (default): two-level from AllreduceOptions::kTwoLevelMinRanks on
  kFlat,      // "flat"
  kTwoLevel,  // "two-level" or "two-level:G"
};
struct LayoutChoice {
  LayoutSetting layout = LayoutSetting::kAuto;
  int group_size = 0;  // "two-level:G": G; 0: the algorithm's choice
};
const char* LayoutName(LayoutSetting layout);

struct Config {
  Algo algo = Algo::kRing;
  HadamardSetting hadamard = HadamardSetting::kDefault;
  LayoutChoice layout;

  // Bounded mode (optireduce): per-operation time limit; 0 = adaptive estimate.
  std::chrono::milliseconds timeout{0};
  // Bounded mode: largest fraction of an operation's data that may be lost before the
  // operation is reported (and, per the lead's policy, redone reliably). In [0, 1].
  double max_loss = 0.05;  // == AllreduceOptions::kDefaultMaxLoss (config_test checks)
  // Bounded mode: time to repair an operation above max_loss (and for a rank that has not
  // started to start), as a fraction of the operation's bound. In [0, 10]; 0 = no repair.
  double repair_budget = 1.0;
  // Bounded mode: how long a rank that has not started an operation is waited for —
  // true (default): learned from how late ranks usually start, so a straggler is left
  // out and its contribution carried into the next operation on the buffer; false: the
  // repair budget (TimeoutOptions::learn_start_grace). OPTIREDUCE_START_GRACE=learned|budget.
  bool learn_start_grace = true;
  // Where the interposer writes its counters as JSON at process exit ("" = nowhere).
  // "%p" in the path is replaced by the process id.
  std::string stats_file;

  // UDP device (GLOO_DEVICE_TRANSPORT=UDP).
  std::string udp_host;        // bind address override; "" = what torch asks for
  uint16_t udp_port_base = 0;  // 0 = ephemeral ports; else first port of a range
  int udp_port_range = 64;     // ports tried from udp_port_base
  size_t udp_max_datagram = 0;  // 0 = transport default (MTU based)
  bool udp_offload = true;      // udp::attr::segmentation_offload
  size_t socket_buffer_bytes = 32 << 20;

  // DPDK device (GLOO_DEVICE_TRANSPORT=DPDK).
  std::string eal_args;                 // EAL arguments, whitespace separated
  std::vector<std::string> dpdk_ports;  // ethdev ports by name or index ("" = all probed)
  std::string dpdk_ipv4;                // IPv4 in our frames ("" = derived from the MAC)
  uint16_t dpdk_udp_port = 0;           // UDP port in our frames (0 = 17000 + device no.)
  uint32_t dpdk_mtu = 0;                // IP MTU (0 = the port's, capped at 9000)
  std::string dpdk_file_prefix;         // EAL --file-prefix ("" = as given in eal_args)
  // A/B switches (dpdk::attr::tx_copy_bodies, tx_backlog).
  bool dpdk_tx_copy = false;            // copy frame bodies (no zero-copy on memif)
  uint32_t dpdk_tx_backlog = 2048;      // per-port software TX backlog, frames

  // Both datagram devices.
  std::string faults;           // fault injection spec (validated here)
  uint64_t session_token = 0;   // 0 = agreed per job at connect time
  uint32_t peer_dead_ms = 0;  // silence bound, 0: none (EngineOptions::peer_dead)

  // Redis rendezvous (gloo_ext/redis_options.h; optireduce.RedisStore reads the same names).
  std::string redis_url;  // validated here when set; the password is never printed
  std::string run_id;

  // Where each setting came from, for logs: "NAME=value" of every variable read.
  std::vector<std::string> sources;
};

// Returns the environment value of `name`, or nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(absl::string_view name)>;

// Parses and validates. The first bad variable gives InvalidArgumentError:
//   "GLOO_ALGO='rng' is not valid; allowed values: ring, transpose, optireduce"
// When an OPTIREDUCE_ name and its GLOO_DPDK_ alias are both set, the OPTIREDUCE_ one wins
// if they agree and it is an error if they differ.
absl::StatusOr<Config> ParseConfig(const EnvLookup& lookup);

// OPTIREDUCE_* names present in `names` that this module does not know. Names starting
// with OPTIREDUCE_TEST_ (tests' switches) or OPTIREDUCE_BENCH_ (bench programs' switches,
// bench/README.md) and the build scripts' OPTIREDUCE_BUILD_DIR are known.
std::vector<std::string> UnknownOptiReduceNames(const std::vector<std::string>& names);

// The environment variables this module reads, with their aliases and meaning (for
// documentation and `--help`-like output).
struct VariableDoc {
  const char* name;
  const char* alias;  // "" when none
  const char* allowed;
  const char* meaning;
};
const std::vector<VariableDoc>& DocumentedVariables();

// The process environment as an EnvLookup: the value of `name` now, or nullopt when unset.
// The one place in optireduce's libraries and programs that reads the environment.
std::optional<std::string> ReadEnvironment(absl::string_view name);

// ParseConfig(ReadEnvironment): the environment as it is now, parsed on every call.
absl::StatusOr<Config> ConfigFromEnvironment();

// The process's configuration from the real environment, parsed once (thread-safe).
// Prints one warning to stderr, once per process, for unknown OPTIREDUCE_* variables.
const absl::StatusOr<Config>& GetConfig();

// GetConfig() or throws gloo::EnforceNotMet with the parse error (for Gloo entry points).
const Config& GetConfigOrThrow();

}  // namespace gloo_ext
}  // namespace optireduce
