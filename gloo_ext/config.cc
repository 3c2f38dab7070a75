#include "gloo_ext/config.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <gloo/common/logging.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "rendezvous/redis_url.h"
#include "transport_dpdk/io/fault_injector.h"

extern char** environ;

namespace optireduce {
namespace gloo_ext {
namespace {

// One table for parsing, documentation and the unknown-name check.
const std::vector<VariableDoc>& Table() {
  static const std::vector<VariableDoc>* table = new std::vector<VariableDoc>{
      {"GLOO_ALGO", "", "ring | transpose | optireduce (case-insensitive)",
       "allreduce algorithm for gloo::allreduce (default ring = stock Gloo)"},
      {"OPTIREDUCE_HADAMARD", "", "0/off/false/no | 1/on/true/yes",
       "randomized Hadamard transform of float sums (default: off for transpose, on for "
       "optireduce)"},
      {"OPTIREDUCE_LAYOUT", "", "auto | flat | two-level | two-level:G (G >= 2)",
       "Transpose AllReduce's layout: auto (default: two-level from 128 ranks on), flat, or "
       "two-level with groups of G ranks (default G: the largest divisor of the rank count "
       "that is at most its square root); OptiReduce mode follows it (bounded across the "
       "groups, exact within them)"},
      {"OPTIREDUCE_TIMEOUT_MS", "GLOO_DPDK_TIMEOUT", "integer >= 0 (milliseconds)",
       "bounded-mode time limit per operation; 0 = adaptive (default)"},
      {"OPTIREDUCE_MAX_LOSS", "", "number in [0, 1]",
       "bounded mode: largest tolerated fraction of lost data per operation (default 0.05)"},
      {"OPTIREDUCE_REPAIR_BUDGET", "", "number in [0, 10]",
       "bounded mode: extra time, as a fraction of the bound, to repair an operation above "
       "the loss limit and to wait for a rank that has not started (default 1; 0 = never "
       "repair, the paper's behaviour: shortest tail, most damage)"},
      {"OPTIREDUCE_START_GRACE", "", "budget | learned",
       "bounded mode: how long a rank that has not started an operation is waited for: "
       "the 90th percentile x 1.25 of how late ranks started recent operations (learned, "
       "default: a straggler is left out and its contribution carried into the next "
       "operation on the buffer) or phase 1's half of the bound + the repair budget "
       "(budget)"},
      {"OPTIREDUCE_STATS_FILE", "", "file path (%p = process id)",
       "write the interposer's counters as JSON there at process exit"},
      {"OPTIREDUCE_UDP_HOST", "", "IPv4 address or host name",
       "UDP device: address to bind (default: the host torch passes)"},
      {"OPTIREDUCE_UDP_PORT_BASE", "", "integer 0..65535",
       "UDP device: first port to try (default 0 = ephemeral)"},
      {"OPTIREDUCE_UDP_PORT_RANGE", "", "integer 1..65536",
       "UDP device: how many ports from the base to try (default 64)"},
      {"OPTIREDUCE_UDP_MAX_DATAGRAM", "", "integer 0 or 512..65507",
       "UDP device: largest datagram (default 0 = from the interface MTU)"},
      {"OPTIREDUCE_UDP_OFFLOAD", "", "0/off/false/no | 1/on/true/yes",
       "UDP device: kernel segmentation offload and GRO for runs of datagrams (default on "
       "where the kernel has them)"},
      {"OPTIREDUCE_SOCKET_BUFFER_BYTES", "", "integer 65536..1073741824",
       "UDP device: SO_RCVBUF/SO_SNDBUF request (default 32 MiB)"},
      {"OPTIREDUCE_EAL_ARGS", "GLOO_DPDK_EAL_ARGS", "DPDK EAL arguments",
       "DPDK device: EAL arguments, whitespace separated"},
      {"OPTIREDUCE_DPDK_PORTS", "", "comma-separated port names or indexes",
       "DPDK device: ethdev ports to use (default: every probed port)"},
      {"OPTIREDUCE_DPDK_IPV4", "", "dotted IPv4 address",
       "DPDK device: source address in frames (default: derived from the MAC)"},
      {"OPTIREDUCE_DPDK_UDP_PORT", "", "integer 0..65535",
       "DPDK device: UDP port in frames (default 0 = 17000 + device number)"},
      {"OPTIREDUCE_DPDK_MTU", "", "0 or 576..9000",
       "DPDK device: IP MTU (default 0 = the port's MTU)"},
      {"OPTIREDUCE_DPDK_FILE_PREFIX", "GLOO_DPDK_FILE_PREFIX", "name without whitespace",
       "DPDK device: EAL --file-prefix"},
      {"OPTIREDUCE_DPDK_TX_COPY", "", "0/off/false/no | 1/on/true/yes",
       "DPDK device, A/B switch: copy every frame body instead of zero-copy bodies on memif "
       "(default 0)"},
      {"OPTIREDUCE_DPDK_TX_BACKLOG", "", "integer 32..2048",
       "DPDK device, A/B switch: frames of the per-port software TX backlog (default 2048)"},
      {"OPTIREDUCE_FAULTS", "", "drop=P,dup=P,reorder=P,corrupt=P,delay_us=N,seed=N",
       "datagram devices: injected faults on receive (tests, lab)"},
      {"OPTIREDUCE_SESSION_TOKEN", "", "unsigned 64-bit integer",
       "datagram devices: per-job packet token (default 0 = agreed at connect)"},
      {"OPTIREDUCE_PEER_DEAD_MS", "", "0 or integer 10..3600000 (milliseconds)",
       "datagram devices: a silence bound: a peer that operations are pending with and that "
       "answers no probe this long is gone and its context fails with gloo::IoException "
       "naming it (default 0 = none: silence fails nothing, the operation's timeout "
       "decides, as on Gloo's TCP; a proven death fails it at once either way)"},
      {"OPTIREDUCE_REDIS_URL", "", "redis://[[user:]password@]host[:port][/db]",
       "Redis rendezvous endpoint"},
      {"OPTIREDUCE_RUN_ID", "", "string", "Redis rendezvous: names this run of the job"},
      {"OPTIREDUCE_TORCH_LIB", "", "file path",
       "Python package: path of liboptireduce_torch.so to load"},
  };
  return *table;
}

// OPTIREDUCE_* names other modules own (not parsed here, known to UnknownOptiReduceNames).
struct OtherModuleNames {
  const char* name;  // a prefix when it ends in '_'
  const char* owner;
};
constexpr OtherModuleNames kOtherModuleNames[] = {
    {"OPTIREDUCE_TEST_", "tests/: test switches"},
    {"OPTIREDUCE_BENCH_", "bench/ programs' switches (bench/README.md)"},
    {"OPTIREDUCE_BUILD_DIR", "scripts/: build directory"},
    {"OPTIREDUCE_FUZZ_", "scripts/fuzz.sh: build directory, jobs, seed"},
    {"OPTIREDUCE_SANITIZE_JOBS", "scripts/sanitize.sh: jobs"},
    {"OPTIREDUCE_DEB13_", "scripts/test-debian13.sh: root cache, jobs"},
    {"OPTIREDUCE_GLOO_SOURCE", "tests/python/test_patched_gloo.py: a Gloo built with patches/"},
};

// Names of the original OptiReduce project that have no equivalent here.
constexpr const char* kIgnoredOriginalNames[] = {
    "GLOO_DPDK_CONFIG",          // IP=MAC file: addresses travel through rendezvous
    "GLOO_DPDK_THREADS_OFFSET",  // cores: EAL arguments (-l) in OPTIREDUCE_EAL_ARGS
    "GLOO_DPDK_SEND_TIMER",      // pacing is the transport's job
};

absl::Status Invalid(absl::string_view name, absl::string_view value,
                     absl::string_view allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, "='", value, "' is not valid; allowed values: ", allowed));
}

std::optional<bool> ParseBool(absl::string_view value) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v == "1" || v == "on" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "off" || v == "false" || v == "no") return false;
  return std::nullopt;
}

class Reader {
 public:
  explicit Reader(const EnvLookup& lookup, Config* config) : lookup_(lookup), config_(config) {}

  // The value of `name`, or of `alias` when only that is set. Records the source.
  absl::StatusOr<std::optional<std::pair<std::string, std::string>>> Get(
      absl::string_view name, absl::string_view alias = "") {
    // An empty value counts as unset (as `VAR= cmd` is a common way to unset).
    std::optional<std::string> value = lookup_(name);
    if (value && value->empty()) value.reset();
    std::optional<std::string> alias_value;
    if (!alias.empty()) alias_value = lookup_(alias);
    if (alias_value && alias_value->empty()) alias_value.reset();
    if (value && alias_value && *value != *alias_value) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "='", *value, "' and its alias ", alias, "='", *alias_value,
          "' disagree; set only one of them"));
    }
    if (value) {
      config_->sources.push_back(absl::StrCat(name, "=", Redact(name, *value)));
      return std::make_optional(std::make_pair(std::string(name), *value));
    }
    if (alias_value) {
      config_->sources.push_back(absl::StrCat(alias, "=", Redact(alias, *alias_value)));
      return std::make_optional(std::make_pair(std::string(alias), *alias_value));
    }
    return std::optional<std::pair<std::string, std::string>>();
  }

  // A switch (0/1, on/off, true/false, yes/no, any case); *out keeps its default if unset.
  absl::Status Bool(absl::string_view name, bool* out) {
    auto got = Get(name, "");
    if (!got.ok()) return got.status();
    if (!*got) return absl::OkStatus();
    std::optional<bool> on = ParseBool((*got)->second);
    if (!on) return Invalid(name, (*got)->second, "0, 1, on, off, true, false");
    *out = *on;
    return absl::OkStatus();
  }

  // An integer in [min, max]; `allowed` describes it in the error (default
  // "an integer in [min, max]").
  absl::Status Uint(absl::string_view name, absl::string_view alias, uint64_t min,
                    uint64_t max, uint64_t* out, absl::string_view allowed = "") {
    auto got = Get(name, alias);
    if (!got.ok()) return got.status();
    if (!*got) return absl::OkStatus();
    const auto& [used, text] = **got;
    uint64_t v = 0;
    const absl::string_view digits = absl::StripAsciiWhitespace(text);
    if (digits.empty() || digits[0] == '-' || digits[0] == '+' ||
        !absl::SimpleAtoi(digits, &v) || v < min || v > max) {
      return Invalid(used, text,
                     allowed.empty() ? absl::StrCat("an integer in [", min, ", ", max, "]")
                                     : std::string(allowed));
    }
    *out = v;
    return absl::OkStatus();
  }

  // A finite number in [min, max]; `allowed` describes it in the error, e.g.
  // "a number in [0, 1], e.g. 0.01".
  absl::Status Number(absl::string_view name, double min, double max, absl::string_view allowed,
                      double* out) {
    auto got = Get(name, "");
    if (!got.ok()) return got.status();
    if (!*got) return absl::OkStatus();
    const auto& [used, text] = **got;
    double v = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(text), &v) || !std::isfinite(v) ||
        v < min || v > max) {
      return Invalid(used, text, allowed);
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status String(absl::string_view name, absl::string_view alias, std::string* out) {
    auto got = Get(name, alias);
    if (!got.ok()) return got.status();
    if (*got) *out = (*got)->second;
    return absl::OkStatus();
  }

 private:
  static std::string Redact(absl::string_view name, absl::string_view value) {
    return name == "OPTIREDUCE_REDIS_URL" ? "<redacted>" : std::string(value);
  }

  const EnvLookup& lookup_;
  Config* config_;
};

absl::StatusOr<Algo> ParseAlgo(absl::string_view value) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v == "ring") return Algo::kRing;
  if (v == "transpose") return Algo::kTranspose;
  if (v == "optireduce") return Algo::kOptiReduce;
  return Invalid("GLOO_ALGO", value, "ring, transpose, optireduce (case-insensitive)");
}

// "auto", "flat", "two-level" or "two-level:G" (G >= 2), any case.
absl::StatusOr<LayoutChoice> ParseLayout(absl::string_view value) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  LayoutChoice choice;
  if (v == "auto") return choice;
  if (v == "flat") {
    choice.layout = LayoutSetting::kFlat;
    return choice;
  }
  constexpr absl::string_view kTwoLevel = "two-level";
  if (!absl::StartsWith(v, kTwoLevel)) return absl::InvalidArgumentError("unknown layout");
  choice.layout = LayoutSetting::kTwoLevel;
  absl::string_view rest = absl::string_view(v).substr(kTwoLevel.size());
  if (rest.empty()) return choice;
  int g = 0;
  if (!absl::ConsumePrefix(&rest, ":") || !absl::SimpleAtoi(rest, &g) || g < 2 ||
      rest.find_first_not_of("0123456789") != absl::string_view::npos) {
    return absl::InvalidArgumentError("bad group size");
  }
  choice.group_size = g;
  return choice;
}

bool HasWhitespace(absl::string_view s) {
  for (char c : s) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) return true;
  }
  return false;
}

std::vector<std::string> EnvironmentNames() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; e++) {
    absl::string_view entry(*e);
    names.emplace_back(entry.substr(0, entry.find('=')));
  }
  return names;
}

}  // namespace

const char* AlgoName(Algo algo) {
  switch (algo) {
    case Algo::kRing: return "ring";
    case Algo::kTranspose: return "transpose";
    case Algo::kOptiReduce: return "optireduce";
  }
  return "?";
}

const char* LayoutName(LayoutSetting layout) {
  switch (layout) {
    case LayoutSetting::kAuto: return "auto";
    case LayoutSetting::kFlat: return "flat";
    case LayoutSetting::kTwoLevel: return "two-level";
  }
  return "?";
}

absl::StatusOr<Config> ParseConfig(const EnvLookup& lookup) {
  Config c;
  Reader r(lookup, &c);

  std::string text;
  if (auto s = r.String("GLOO_ALGO", "", &text); !s.ok()) return s;
  if (!text.empty()) {
    absl::StatusOr<Algo> algo = ParseAlgo(text);
    if (!algo.ok()) return algo.status();
    c.algo = *algo;
  }

  if (auto got = r.Get("OPTIREDUCE_HADAMARD"); !got.ok()) {
    return got.status();
  } else if (*got) {
    std::optional<bool> on = ParseBool((*got)->second);
    if (!on) return Invalid("OPTIREDUCE_HADAMARD", (*got)->second, "0, 1, on, off, true, false");
    c.hadamard = *on ? HadamardSetting::kOn : HadamardSetting::kOff;
  }

  if (auto got = r.Get("OPTIREDUCE_LAYOUT"); !got.ok()) {
    return got.status();
  } else if (*got) {
    absl::StatusOr<LayoutChoice> layout = ParseLayout((*got)->second);
    if (!layout.ok()) {
      return Invalid("OPTIREDUCE_LAYOUT", (*got)->second,
                     "auto, flat, two-level or two-level:G with G >= 2");
    }
    c.layout = *layout;
  }

  uint64_t v = 0;
  if (auto s = r.Uint("OPTIREDUCE_TIMEOUT_MS", "GLOO_DPDK_TIMEOUT", 0, 24ull * 3600 * 1000, &v);
      !s.ok()) {
    return s;
  }
  c.timeout = std::chrono::milliseconds(v);

  if (auto s = r.Number("OPTIREDUCE_MAX_LOSS", 0, 1, "a number in [0, 1], e.g. 0.05",
                        &c.max_loss);
      !s.ok()) {
    return s;
  }
  if (auto s = r.Number("OPTIREDUCE_REPAIR_BUDGET", 0, 10,
                        "a fraction of the bound in [0, 10], e.g. 0.25 (0 = never repair)",
                        &c.repair_budget);
      !s.ok()) {
    return s;
  }

  std::string grace;
  if (auto s = r.String("OPTIREDUCE_START_GRACE", "", &grace); !s.ok()) return s;
  if (!grace.empty()) {
    const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(grace));
    if (v != "budget" && v != "learned") {
      return Invalid("OPTIREDUCE_START_GRACE", grace, "budget, learned");
    }
    c.learn_start_grace = v == "learned";
  }

  if (auto s = r.String("OPTIREDUCE_STATS_FILE", "", &c.stats_file); !s.ok()) return s;

  if (auto s = r.String("OPTIREDUCE_UDP_HOST", "", &c.udp_host); !s.ok()) return s;
  if (HasWhitespace(c.udp_host)) {
    return Invalid("OPTIREDUCE_UDP_HOST", c.udp_host, "an IPv4 address or host name");
  }
  v = c.udp_port_base;
  if (auto s = r.Uint("OPTIREDUCE_UDP_PORT_BASE", "", 0, 65535, &v); !s.ok()) return s;
  c.udp_port_base = static_cast<uint16_t>(v);
  v = c.udp_port_range;
  if (auto s = r.Uint("OPTIREDUCE_UDP_PORT_RANGE", "", 1, 65536, &v); !s.ok()) return s;
  c.udp_port_range = static_cast<int>(v);
  v = c.udp_max_datagram;
  if (auto s = r.Uint("OPTIREDUCE_UDP_MAX_DATAGRAM", "", 0, 65507, &v); !s.ok()) return s;
  if (v != 0 && v < 512) {
    return Invalid("OPTIREDUCE_UDP_MAX_DATAGRAM", std::to_string(v), "0 or 512..65507");
  }
  c.udp_max_datagram = v;
  if (auto s = r.Bool("OPTIREDUCE_UDP_OFFLOAD", &c.udp_offload); !s.ok()) return s;
  v = c.socket_buffer_bytes;
  if (auto s = r.Uint("OPTIREDUCE_SOCKET_BUFFER_BYTES", "", 65536, 1ull << 30, &v); !s.ok()) {
    return s;
  }
  c.socket_buffer_bytes = v;

  if (auto s = r.String("OPTIREDUCE_EAL_ARGS", "GLOO_DPDK_EAL_ARGS", &c.eal_args); !s.ok()) {
    return s;
  }
  if (auto got = r.Get("OPTIREDUCE_DPDK_PORTS"); !got.ok()) {
    return got.status();
  } else if (*got) {
    for (absl::string_view port : absl::StrSplit((*got)->second, ',')) {
      port = absl::StripAsciiWhitespace(port);
      if (port.empty() || HasWhitespace(port)) {
        return Invalid("OPTIREDUCE_DPDK_PORTS", (*got)->second,
                       "comma-separated port names or indexes, e.g. net_memif0,net_memif1");
      }
      c.dpdk_ports.emplace_back(port);
    }
  }
  if (auto s = r.String("OPTIREDUCE_DPDK_IPV4", "", &c.dpdk_ipv4); !s.ok()) return s;
  if (!c.dpdk_ipv4.empty()) {
    in_addr addr;
    if (inet_pton(AF_INET, c.dpdk_ipv4.c_str(), &addr) != 1) {
      return Invalid("OPTIREDUCE_DPDK_IPV4", c.dpdk_ipv4, "a dotted IPv4 address");
    }
  }
  v = c.dpdk_udp_port;
  if (auto s = r.Uint("OPTIREDUCE_DPDK_UDP_PORT", "", 0, 65535, &v); !s.ok()) return s;
  c.dpdk_udp_port = static_cast<uint16_t>(v);
  if (auto s = r.Bool("OPTIREDUCE_DPDK_TX_COPY", &c.dpdk_tx_copy); !s.ok()) return s;
  v = c.dpdk_tx_backlog;
  if (auto s = r.Uint("OPTIREDUCE_DPDK_TX_BACKLOG", "", 32, 2048, &v,
                      "an integer 32..2048 (frames; [32, 2048])");
      !s.ok()) {
    return s;
  }
  c.dpdk_tx_backlog = static_cast<uint32_t>(v);
  v = c.dpdk_mtu;
  if (auto s = r.Uint("OPTIREDUCE_DPDK_MTU", "", 0, 9000, &v); !s.ok()) return s;
  if (v != 0 && v < 576) return Invalid("OPTIREDUCE_DPDK_MTU", std::to_string(v), "0 or 576..9000");
  c.dpdk_mtu = static_cast<uint32_t>(v);
  if (auto s = r.String("OPTIREDUCE_DPDK_FILE_PREFIX", "GLOO_DPDK_FILE_PREFIX",
                        &c.dpdk_file_prefix);
      !s.ok()) {
    return s;
  }
  if (HasWhitespace(c.dpdk_file_prefix)) {
    return Invalid(lookup("OPTIREDUCE_DPDK_FILE_PREFIX") ? "OPTIREDUCE_DPDK_FILE_PREFIX"
                                                         : "GLOO_DPDK_FILE_PREFIX",
                   c.dpdk_file_prefix, "a name without whitespace");
  }

  if (auto s = r.String("OPTIREDUCE_FAULTS", "", &c.faults); !s.ok()) return s;
  if (!c.faults.empty()) {
    absl::StatusOr<transport::FaultSpec> spec = transport::ParseFaultSpec(c.faults);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "OPTIREDUCE_FAULTS='", c.faults, "' is not valid (", spec.status().message(),
          "); allowed: comma-separated drop=P,dup=P,reorder=P,corrupt=P (P in [0,1]), "
          "delay_us=N, seed=N"));
    }
  }
  if (auto s = r.Uint("OPTIREDUCE_SESSION_TOKEN", "", 0, UINT64_MAX, &c.session_token);
      !s.ok()) {
    return s;
  }
  v = c.peer_dead_ms;
  constexpr absl::string_view kPeerDeadAllowed = "0 (no bound) or an integer in [10, 3600000]";
  if (auto s = r.Uint("OPTIREDUCE_PEER_DEAD_MS", "", 0, 3600000, &v, kPeerDeadAllowed); !s.ok()) {
    return s;
  }
  if (v > 0 && v < 10) {
    return Invalid("OPTIREDUCE_PEER_DEAD_MS", absl::StrCat(v), kPeerDeadAllowed);
  }
  c.peer_dead_ms = static_cast<uint32_t>(v);

  if (auto s = r.String("OPTIREDUCE_REDIS_URL", "", &c.redis_url); !s.ok()) return s;
  if (!c.redis_url.empty()) {
    absl::StatusOr<rendezvous::RedisUrl> url = rendezvous::ParseRedisUrl(c.redis_url);
    if (!url.ok()) {
      // ParseRedisUrl never prints the password; neither do we.
      return absl::InvalidArgumentError(absl::StrCat(
          "OPTIREDUCE_REDIS_URL is not valid (", url.status().message(),
          "); allowed: redis://[[user:]password@]host[:port][/db]"));
    }
  }
  if (auto s = r.String("OPTIREDUCE_RUN_ID", "", &c.run_id); !s.ok()) return s;
  return c;
}

std::vector<std::string> UnknownOptiReduceNames(const std::vector<std::string>& names) {
  std::vector<std::string> unknown;
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, "OPTIREDUCE_")) continue;
    bool known = false;
    for (const OtherModuleNames& other : kOtherModuleNames) {
      const absl::string_view owned = other.name;
      known = known || (absl::EndsWith(owned, "_") ? absl::StartsWith(name, owned) : name == owned);
    }
    for (const VariableDoc& doc : Table()) known = known || name == doc.name;
    if (!known) unknown.push_back(name);
  }
  return unknown;
}

const std::vector<VariableDoc>& DocumentedVariables() { return Table(); }

std::optional<std::string> ReadEnvironment(absl::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

absl::StatusOr<Config> ConfigFromEnvironment() { return ParseConfig(ReadEnvironment); }

const absl::StatusOr<Config>& GetConfig() {
  static const absl::StatusOr<Config>* config = [] {
    auto* parsed = new absl::StatusOr<Config>(ConfigFromEnvironment());
    const std::vector<std::string> names = EnvironmentNames();
    const std::vector<std::string> unknown = UnknownOptiReduceNames(names);
    if (!unknown.empty()) {
      std::fprintf(stderr,
                   "optireduce: warning: unknown environment variable(s) %s are ignored "
                   "(known: see gloo_ext/README.md)\n",
                   absl::StrJoin(unknown, ", ").c_str());
    }
    for (const char* ignored : kIgnoredOriginalNames) {
      if (ReadEnvironment(ignored).has_value()) {
        std::fprintf(stderr,
                     "optireduce: warning: %s (original OptiReduce) has no meaning here and "
                     "is ignored (see gloo_ext/README.md)\n",
                     ignored);
      }
    }
    return parsed;
  }();
  return *config;
}

const Config& GetConfigOrThrow() {
  const absl::StatusOr<Config>& config = GetConfig();
  GLOO_ENFORCE(config.ok(), "optireduce: ", config.status().message());
  return *config;
}

AllreduceOptions::Hadamard HadamardFor(HadamardSetting setting) {
  switch (setting) {
    case HadamardSetting::kOff:
      return AllreduceOptions::Hadamard::kOff;
    case HadamardSetting::kOn:
      return AllreduceOptions::Hadamard::kAuto;
    case HadamardSetting::kDefault:
      break;
  }
  return AllreduceOptions::Hadamard::kDefault;
}

}  // namespace gloo_ext
}  // namespace optireduce
