#include "transport_dpdk/io/dpdk/dpdk_eal.h"

#include <pthread.h>
#include <sched.h>

#include <mutex>

#include <rte_eal.h>
#include <rte_errno.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace optireduce {
namespace transport {
namespace dpdk {
namespace {

struct EalState {
  std::mutex mu;
  bool attempted = false;
  absl::Status result;
  std::string args;
};

EalState& State() {
  static EalState* s = new EalState();  // never destroyed: EAL outlives main
  return *s;
}

bool HasCoreOption(const std::vector<std::string>& v) {
  for (const auto& a : v) {
    if (a == "-l" || a == "-c" || a == "--lcores" ||
        absl::StartsWith(a, "--lcores=") ||
        (a.size() > 2 && (absl::StartsWith(a, "-l") || absl::StartsWith(a, "-c")) &&
         a[1] != '-')) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::string DefaultEalArgs() {
  // --in-memory would need hugepages (--no-huge implies legacy memory).
  return "--no-huge --no-shconf -m 512 --no-pci --no-telemetry "
         "--log-level=*:warning";
}

std::string ResolveEalArgs(const std::string& attr_args) {
  return attr_args.empty() ? DefaultEalArgs() : attr_args;
}

std::vector<std::string> EalArgv(const std::string& args) {
  std::vector<std::string> v = {"optireduce"};
  for (absl::string_view a : absl::StrSplit(args, absl::ByAnyChar(" \t\n"),
                                            absl::SkipEmpty())) {
    v.emplace_back(a);
  }
  if (!HasCoreOption(v)) {
    // The EAL pins its main lcore (the calling thread) to this CPU; choose
    // the one we already run on rather than always CPU 0, which every rank
    // would then share. The affinity is restored after init anyway.
    int cpu = sched_getcpu();
    if (cpu < 0) cpu = 0;
    v.push_back("-l");
    v.push_back(std::to_string(cpu));
  }
  return v;
}

absl::Status EnsureEal(const std::string& args) {
  EalState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.attempted) {
    if (args != s.args) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DPDK EAL is already ", s.result.ok() ? "initialised" : "tried",
          " in this process with arguments '", s.args,
          "'; it cannot be initialised again with '", args,
          "' (one EAL per process: use the same OPTIREDUCE_EAL_ARGS / "
          "attr.eal_args, or leave them empty)"));
    }
    return s.result;
  }
  s.attempted = true;
  s.args = args;

  std::vector<std::string> argv_s = EalArgv(args);
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  cpu_set_t saved;
  CPU_ZERO(&saved);
  const bool have_saved =
      pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0;
  const int rc = rte_eal_init(static_cast<int>(argv_s.size()), argv.data());
  const int err = rte_errno;
  if (have_saved) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);

  if (rc < 0) {
    s.result = absl::UnavailableError(absl::StrCat(
        "rte_eal_init failed: ", rte_strerror(err), " (EAL arguments: '",
        absl::StrJoin(argv_s, " "),
        "'; set OPTIREDUCE_EAL_ARGS or attr.eal_args)"));
  } else {
    s.result = absl::OkStatus();
  }
  return s.result;
}

bool EalInitialized() {
  EalState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.attempted && s.result.ok();
}

std::string EalArgs() {
  EalState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.args;
}

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
