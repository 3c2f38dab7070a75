#include "bench/harness/options.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "bench/harness/straggler.h"
#include "bench/local_ranks.h"
#include "gloo_ext/config.h"

namespace optireduce {
namespace bench {
namespace {

absl::Status Bad(const std::string& flag, const std::string& value, const std::string& allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": invalid value '", value, "' (allowed: ", allowed, ")"));
}

absl::Status ParseInt(const std::string& flag, const std::string& v, long lo, long hi, long* out) {
  long x = 0;
  if (!absl::SimpleAtoi(v, &x) || x < lo || x > hi) {
    return Bad(flag, v, absl::StrCat("an integer from ", lo, " to ", hi));
  }
  *out = x;
  return absl::OkStatus();
}

// Gloo's boolean flags: 1/true/yes (first letter t or y) is true; we also insist the rest
// is a recognisable false rather than silently treating a typo as false.
absl::Status ParseBool(const std::string& flag, const std::string& v, bool* out) {
  std::string s = v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "t" || s == "yes" || s == "y") {
    *out = true;
  } else if (s == "0" || s == "false" || s == "f" || s == "no" || s == "n") {
    *out = false;
  } else {
    return Bad(flag, v, "true/false, yes/no or 1/0");
  }
  return absl::OkStatus();
}

// "2s", "500ms", "100us" or a plain number of seconds (Gloo accepts s and ms).
absl::Status ParseDuration(const std::string& flag, const std::string& v,
                           std::chrono::nanoseconds* out) {
  size_t i = 0;
  while (i < v.size() && (std::isdigit(static_cast<unsigned char>(v[i])) || v[i] == '.')) i++;
  double num = 0;
  if (i == 0 || !absl::SimpleAtod(v.substr(0, i), &num) || num <= 0) {
    return Bad(flag, v, "a positive duration such as 2s, 500ms or 100us");
  }
  const std::string unit = v.substr(i);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1e9;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "us") scale = 1e3;
  else return Bad(flag, v, "a positive duration such as 2s, 500ms or 100us");
  *out = std::chrono::nanoseconds(static_cast<long long>(num * scale));
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& KnownBenchmarks() {
  static const std::vector<std::string> kNames = {
      "allreduce_ring",  "allreduce_ring_chunked", "allreduce_halving_doubling",
      "allreduce_bcube", "allreduce",              "transpose",
      "optireduce"};
  return kNames;
}

std::string BenchUsage(const char* argv0) {
  return absl::StrCat(
      "Usage: ", argv0, " [OPTIONS] BENCHMARK\n\n",
      "Participation:\n"
      "  -s, --size=SIZE           Number of processes\n"
      "  -r, --rank=RANK           Rank of this process\n"
      "      --local-ranks=N       (extra) fork N ranks on this host; no rendezvous flags\n"
      "Rendezvous:\n"
      "  -h, --redis-host=HOST     Redis server host (password: --redis-password or the URL\n"
      "                            in OPTIREDUCE_REDIS_URL, used when no host is given)\n"
      "  -p, --redis-port=PORT     Redis server port (default 6379)\n"
      "      --redis-password=PW   (extra) Redis AUTH password\n"
      "  -x, --prefix=PREFIX       Rendezvous prefix (unique for this run)\n"
      "      --shared-path=PATH    File system rendezvous in this shared directory\n"
      "Transport:\n"
      "  -t, --transport=NAME      tcp, udp or dpdk (default tcp); dpdk takes its ports\n"
      "                            from OPTIREDUCE_EAL_ARGS, or with --local-ranks from\n"
      "                            a memif mesh between the ranks (bench/README.md)\n"
      "      --tcp-device=DEV[,DEV] Network interface(s) to use\n"
      "      --sync=BOOL           Switch pairs to sync mode (default false)\n"
      "      --busy-poll=BOOL      Busy-poll in sync mode (default false)\n"
      "Benchmark parameters:\n"
      "      --verify              Verify the result of the first iteration (default)\n"
      "      --no-verify           Do not verify the result of the first iteration\n"
      "      --verify-last         (extra) After the timed iterations, run one more\n"
      "                            (untimed, fresh pattern) and report its relative\n"
      "                            error (--csv rel_error_last): the error of a steady-\n"
      "                            state operation, not of the exact calibration run\n"
      "      --show-all-errors     Print every verification error\n"
      "      --inputs=N            Input buffers per process (default 1)\n"
      "      --elements=N          Floats per input buffer (-1: sweep 100..5000000)\n"
      "      --warmup-iters=N      Warm-up iterations (default 5)\n"
      "      --iteration-count=N   Iterations to time (default: by --iteration-time)\n"
      "      --iteration-time=T    Minimum time to run each size (default 2s)\n"
      "      --threads=N           Threads, each with its own context (default 1)\n"
      "      --nanos               Show times in ns instead of us\n"
      "      --base=N              The base for allreduce_bcube (default 2)\n"
      "Extras:\n"
      "      --csv=FILE            Append one CSV row per element count\n"
      "      --samples-csv=FILE    Append every timed iteration (us) for latency CDFs\n"
      "      --counters-csv=FILE   Each rank writes FILE.RANK: packets its transport sent,\n"
      "                            resent and resent needlessly (reported duplicate) over\n"
      "                            the whole run (ours: the engine's counters; Gloo TCP:\n"
      "                            the namespace's kernel TCP, DSACKed segments)\n"
      "      --straggler-ms-dist=D Sleep a drawn delay (ms) before each iteration on the\n"
      "                            straggler rank: const:X, exp:MEAN, uniform:A:B,\n"
      "                            normal:MEAN:STD, pareto:SCALE:SHAPE,\n"
      "                            spike:P:MS (delay MS with probability P)\n"
      "      --straggler-rank=R    Rank that straggles (default: the last)\n"
      "      --seed=N              Seed of the straggler draws (default 1)\n"
      "      --timeout=SECONDS     Rendezvous/operation timeout (default 300)\n"
      "      --repair-budget=F     optireduce: repair/wait-for-late-rank time as a fraction\n"
      "                            of the bound (default 1, 0 = never repair)\n"
      "      --start-grace=G       optireduce: how long a rank that has not started is\n"
      "                            waited for: learned (P90 x 1.25 of how late ranks\n"
      "                            started, default) or budget (the repair budget)\n"
      "      --hadamard=auto|on|off optireduce: the randomized Hadamard transform: auto\n"
      "                            (default, as the library: float sums whose TAR shards\n"
      "                            are under a transform block), on (every float sum,\n"
      "                            = OPTIREDUCE_HADAMARD=1), off (= OPTIREDUCE_HADAMARD=0)\n"
      "      --max-loss=F          optireduce: loss fraction above which an operation\n"
      "                            repairs, then flags damage (default 0.05, as the library)\n"
      "      --layout=flat|2d|auto transpose, optireduce: TAR's layout: flat, two-level\n"
      "                            (2d: groups of --group-size) or the library's choice\n"
      "                            (auto, default: two-level from 128 ranks)\n"
      "      --group-size=G        transpose, optireduce: two-level TAR's group size, a\n"
      "                            divisor of the ranks (default 0: the library's choice,\n"
      "                            the largest divisor up to sqrt(N))\n"
      "  The library's OPTIREDUCE_MAX_LOSS, _TIMEOUT_MS, _REPAIR_BUDGET, _START_GRACE and\n"
      "  _HADAMARD variables set these defaults, as in a PyTorch job; flags override them.\n\n"
      "BENCHMARK is one of: ",
      absl::StrJoin(KnownBenchmarks(), ", "), "\n");
}

namespace {

// OptiReduce mode's settings from the library's variables, by the library's parser.
absl::StatusOr<BenchOptions> DefaultsFromLibraryConfig(const gloo_ext::EnvLookup& env) {
  static const absl::flat_hash_set<std::string>* const kNames =
      new absl::flat_hash_set<std::string>{"OPTIREDUCE_MAX_LOSS", "OPTIREDUCE_TIMEOUT_MS",
                                           "GLOO_DPDK_TIMEOUT", "OPTIREDUCE_REPAIR_BUDGET",
                                           "OPTIREDUCE_START_GRACE", "OPTIREDUCE_HADAMARD"};
  const absl::StatusOr<gloo_ext::Config> config =
      gloo_ext::ParseConfig([&](absl::string_view name) -> std::optional<std::string> {
        if (!kNames->contains(name)) return std::nullopt;
        return env(name);
      });
  if (!config.ok()) return config.status();
  BenchOptions o;
  o.optireduce.max_loss = config->max_loss;
  o.optireduce.hadamard = gloo_ext::HadamardFor(config->hadamard);
  o.repair_budget = config->repair_budget;
  o.learn_start_grace = config->learn_start_grace;
  o.bound_cap = config->timeout;
  return o;
}

absl::StatusOr<BenchOptions> Parse(int argc, const char* const* argv, BenchOptions o) {
  bool have_size = false, have_rank = false;
  std::vector<std::string> positional;

  using Handler = std::function<absl::Status(const std::string& flag, const std::string& v)>;
  struct Spec {
    bool takes_value;
    Handler fn;
  };
  long tmp = 0;
  auto integer = [&](long lo, long hi, auto setter) {
    return Spec{true, [&tmp, lo, hi, setter](const std::string& f, const std::string& v) {
                  absl::Status s = ParseInt(f, v, lo, hi, &tmp);
                  if (s.ok()) setter(tmp);
                  return s;
                }};
  };
  auto flag = [](auto setter) {
    return Spec{false, [setter](const std::string&, const std::string&) {
                  setter();
                  return absl::OkStatus();
                }};
  };
  auto text = [](std::string* out, bool allow_empty) {
    return Spec{true, [out, allow_empty](const std::string& f, const std::string& v) {
                  if (!allow_empty && v.empty()) return Bad(f, v, "a non-empty string");
                  *out = v;
                  return absl::OkStatus();
                }};
  };
  const std::map<std::string, Spec> specs = {
      {"--size", integer(1, 4096, [&](long v) { o.size = int(v); have_size = true; })},
      {"--rank", integer(0, 4095, [&](long v) { o.rank = int(v); have_rank = true; })},
      {"--local-ranks", integer(1, 64, [&](long v) { o.local_ranks = int(v); })},
      {"--redis-host", text(&o.redis_host, false)},
      {"--redis-port", integer(1, 65535, [&](long v) { o.redis_port = int(v); })},
      {"--redis-password", text(&o.redis_password, true)},
      {"--prefix", text(&o.prefix, false)},
      {"--shared-path", text(&o.shared_path, false)},
      {"--transport", Spec{true, [&](const std::string& f, const std::string& v) {
                             if (v != "tcp" && v != "udp" && v != "dpdk")
                               return Bad(f, v, "tcp, udp, dpdk");
                             const std::string built = AvailableTransports();
                             if (!absl::StrContains(absl::StrCat(built, ","), v + ","))
                               return Bad(f, v, absl::StrCat(built, " in this build"));
                             o.transport = v;
                             return absl::OkStatus();
                           }}},
      {"--tcp-device", Spec{true, [&](const std::string& f, const std::string& v) {
                              o.tcp_devices.clear();
                              for (absl::string_view d : absl::StrSplit(v, ',', absl::SkipEmpty()))
                                o.tcp_devices.emplace_back(d);
                              if (o.tcp_devices.empty())
                                return Bad(f, v, "interface names separated by commas");
                              return absl::OkStatus();
                            }}},
      {"--sync", Spec{true, [&](const std::string& f, const std::string& v) {
                        return ParseBool(f, v, &o.sync);
                      }}},
      {"--busy-poll", Spec{true, [&](const std::string& f, const std::string& v) {
                             return ParseBool(f, v, &o.busy_poll);
                           }}},
      {"--verify", flag([&] { o.verify = true; })},  // Gloo's flag; on by default here
      {"--no-verify", flag([&] { o.verify = false; })},
      {"--verify-last", flag([&] { o.verify_last = true; })},
      {"--show-all-errors", flag([&] { o.show_all_errors = true; })},
      {"--nanos", flag([&] { o.show_nanos = true; })},
      {"--elements", integer(-1, 1L << 31, [&](long v) { o.elements = v; })},
      {"--iteration-count", integer(-1, 1000000000, [&](long v) { o.iteration_count = v; })},
      {"--iteration-time", Spec{true, [&](const std::string& f, const std::string& v) {
                                  return ParseDuration(f, v, &o.iteration_time);
                                }}},
      {"--warmup-iters", integer(0, 1000000, [&](long v) { o.warmup_iters = int(v); })},
      {"--inputs", integer(1, 64, [&](long v) { o.inputs = int(v); })},
      {"--threads", integer(1, 64, [&](long v) { o.threads = int(v); })},
      {"--base", integer(2, 64, [&](long v) { o.base = int(v); })},
      {"--csv", text(&o.csv, false)},
      {"--samples-csv", text(&o.samples_csv, false)},
      {"--counters-csv", text(&o.counters_csv, false)},
      {"--straggler-ms-dist", Spec{true, [&](const std::string& f, const std::string& v) {
                                     auto d = StragglerDist::Parse(v);
                                     if (!d.ok()) return Bad(f, v, std::string(d.status().message()));
                                     o.straggler_dist = v;
                                     return absl::OkStatus();
                                   }}},
      {"--straggler-rank", integer(0, 4095, [&](long v) { o.straggler_rank = int(v); })},
      {"--seed", integer(0, 1L << 62, [&](long v) { o.seed = uint64_t(v); })},
      {"--timeout", integer(1, 86400, [&](long v) { o.timeout = std::chrono::seconds(v); })},
      {"--repair-budget", Spec{true, [&](const std::string& f, const std::string& v) {
                                 double x = 0;
                                 if (!absl::SimpleAtod(v, &x) || !(x >= 0 && x <= 10))
                                   return Bad(f, v, "a fraction of the bound in [0, 10]");
                                 o.repair_budget = x;
                                 return absl::OkStatus();
                               }}},
      {"--hadamard", Spec{true, [&](const std::string& f, const std::string& v) {
                            if (v == "auto") {
                              o.optireduce.hadamard = AllreduceOptions::Hadamard::kDefault;
                            } else if (v == "on") {
                              o.optireduce.hadamard = AllreduceOptions::Hadamard::kAuto;
                            } else if (v == "off") {
                              o.optireduce.hadamard = AllreduceOptions::Hadamard::kOff;
                            } else {
                              return Bad(f, v, "auto, on or off");
                            }
                            return absl::OkStatus();
                          }}},
      {"--max-loss", Spec{true, [&](const std::string& f, const std::string& v) {
                            double x = 0;
                            if (!absl::SimpleAtod(v, &x) || !(x >= 0 && x <= 1))
                              return Bad(f, v, "a fraction of the operation's bytes in [0, 1]");
                            o.optireduce.max_loss = x;
                            return absl::OkStatus();
                          }}},
      {"--layout", Spec{true, [&](const std::string& f, const std::string& v) {
                          using Layout = AllreduceOptions::Layout;
                          if (v == "flat") {
                            o.optireduce.layout = Layout::kFlat;
                          } else if (v == "2d") {
                            o.optireduce.layout = Layout::kTwoLevel;
                          } else if (v == "auto") {
                            o.optireduce.layout = Layout::kAuto;
                          } else {
                            return Bad(f, v, "flat, 2d or auto");
                          }
                          return absl::OkStatus();
                        }}},
      {"--group-size", integer(0, 1 << 20, [&](long v) { o.optireduce.group_size = size_t(v); })},
      {"--start-grace", Spec{true, [&](const std::string& f, const std::string& v) {
                               if (v != "budget" && v != "learned")
                                 return Bad(f, v, "budget or learned");
                               o.learn_start_grace = v == "learned";
                               return absl::OkStatus();
                             }}},
  };
  const std::map<std::string, std::string> short_names = {
      {"-s", "--size"}, {"-r", "--rank"}, {"-h", "--redis-host"},
      {"-p", "--redis-port"}, {"-x", "--prefix"}, {"-t", "--transport"}};
  const std::map<std::string, std::string> unsupported = {
      {"--ib-device", "the ibverbs transport is not supported (allowed transports: tcp, udp, dpdk)"},
      {"--ib-port", "the ibverbs transport is not supported (allowed transports: tcp, udp, dpdk)"},
      {"--ib-index", "the ibverbs transport is not supported (allowed transports: tcp, udp, dpdk)"},
      {"--gpudirect", "GPUDirect needs CUDA, which this build does not have"},
      {"--halfprecision", "only float32 is benchmarked"},
      {"--destinations", "only allreduce benchmarks are supported"},
      {"--messages", "only allreduce benchmarks are supported"},
  };

  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--help") return absl::NotFoundError("help");
    if (arg.size() < 2 || arg[0] != '-') {
      positional.push_back(arg);
      continue;
    }
    std::string name = arg, value;
    bool inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        inline_value = true;
      }
    } else {
      // -s4 or -s 4
      name = arg.substr(0, 2);
      if (arg.size() > 2) {
        value = arg.substr(2);
        inline_value = true;
      }
      auto it = short_names.find(name);
      if (it == short_names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown option '", arg, "' (short options: -s -r -h -p -x -t; see --help)"));
      }
      name = it->second;
    }
    if (auto u = unsupported.find(name); u != unsupported.end()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not supported: ", u->second));
    }
    auto it = specs.find(name);
    if (it == specs.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown option '", name, "' (see --help for the list)"));
    }
    if (it->second.takes_value && !inline_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, ": needs a value"));
      value = argv[++i];
    } else if (!it->second.takes_value && inline_value) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": takes no value"));
    }
    if (absl::Status s = it->second.fn(name, value); !s.ok()) return s;
  }

  const std::string known = absl::StrJoin(KnownBenchmarks(), ", ");
  if (positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing benchmark (the positional argument; allowed: ", known, ")"));
  }
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "more than one benchmark given ('", absl::StrJoin(positional, "', '"),
        "'); give exactly one of: ", known));
  }
  o.benchmark = positional[0];
  const auto& names = KnownBenchmarks();
  if (std::find(names.begin(), names.end(), o.benchmark) == names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown benchmark '", o.benchmark, "' (allowed: ", known, ")"));
  }
  if (o.sync && (o.benchmark == "allreduce" || o.benchmark == "transpose" ||
                 o.benchmark == "optireduce")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sync: sync mode works only with the old-style algorithms (allreduce_ring, "
        "allreduce_ring_chunked, allreduce_halving_doubling, allreduce_bcube); Gloo's "
        "pairs refuse unbound buffers in sync mode, which '", o.benchmark, "' uses"));
  }
  if (o.transport == "dpdk" && o.tcp_devices.size() > 1) {
    // One EAL per process and a port serves one device: a second dpdk device could only
    // fail. dpdk's ports come from OPTIREDUCE_EAL_ARGS / OPTIREDUCE_DPDK_PORTS.
    return Bad("--tcp-device", absl::StrJoin(o.tcp_devices, ","),
               "one interface with --transport dpdk (which makes one device per process; "
               "its ports come from OPTIREDUCE_EAL_ARGS and OPTIREDUCE_DPDK_PORTS)");
  }
  if (o.busy_poll && !o.sync) {
    return absl::InvalidArgumentError("--busy-poll: can only be used with --sync=true");
  }
  if (o.elements == 0 || o.elements < -1) {
    return Bad("--elements", std::to_string(o.elements), "a positive count, or -1 to sweep");
  }
  if (o.iteration_count == 0) {
    return Bad("--iteration-count", "0", "a positive count, or -1 to use --iteration-time");
  }
  if (o.local_ranks > 0) {
    if (have_rank || have_size || !o.redis_host.empty() || !o.shared_path.empty()) {
      return absl::InvalidArgumentError(
          "--local-ranks: cannot be combined with --rank, --size, --redis-host or "
          "--shared-path (it forks the ranks and rendezvous itself)");
    }
    o.size = o.local_ranks;
  } else {
    if (!have_size) return absl::InvalidArgumentError("--size: required (or use --local-ranks N)");
    if (!have_rank) return absl::InvalidArgumentError("--rank: required (or use --local-ranks N)");
    if (o.rank >= o.size) {
      return Bad("--rank", std::to_string(o.rank),
                 absl::StrCat("0 to --size - 1 = ", o.size - 1));
    }
    if (o.redis_host.empty() && o.shared_path.empty() &&
        !gloo_ext::ReadEnvironment("OPTIREDUCE_REDIS_URL")) {
      return absl::InvalidArgumentError(
          "no rendezvous: give --redis-host, --shared-path, OPTIREDUCE_REDIS_URL or --local-ranks");
    }
  }
  if (o.straggler_rank >= o.size) {
    return Bad("--straggler-rank", std::to_string(o.straggler_rank),
               absl::StrCat("0 to ", o.size - 1));
  }
  if (o.benchmark == "allreduce_bcube" && o.size % o.base != 0) {
    return Bad("--base", std::to_string(o.base),
               absl::StrCat("a divisor of the number of processes (", o.size, ")"));
  }
  return o;
}

}  // namespace

absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, const char* const* argv) {
  return Parse(argc, argv, BenchOptions());
}

absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, const char* const* argv,
                                               const gloo_ext::EnvLookup& env) {
  absl::StatusOr<BenchOptions> defaults = DefaultsFromLibraryConfig(env);
  if (!defaults.ok()) return defaults.status();
  return Parse(argc, argv, *std::move(defaults));
}

}  // namespace bench
}  // namespace optireduce
