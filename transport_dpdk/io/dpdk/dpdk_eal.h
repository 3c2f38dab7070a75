// dpdk_eal.h — one DPDK EAL per process, initialised on first use.
//
// rte_eal_init may run once per process. The first caller's argument string
// wins; a later caller asking for the same string reuses it, a different
// string is an error naming both. The calling thread's CPU affinity is saved
// before rte_eal_init (which pins it to the main lcore) and restored after.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace optireduce {
namespace transport {
namespace dpdk {

// "--no-huge --no-shconf -m 512 --no-pci --no-telemetry --log-level=*:warning":
// works without hugepages and with several processes at once.
std::string DefaultEalArgs();

// attr_args if non-empty, else DefaultEalArgs().
std::string ResolveEalArgs(const std::string& attr_args);

// The argv handed to rte_eal_init for `args`: a program name, the args, and
// "-l <cpu>" (the CPU the caller runs on) when no core option was given.
std::vector<std::string> EalArgv(const std::string& args);

// Initialises the EAL with `args` (already resolved) or checks that it was
// initialised with the same args. Errors carry DPDK's reason.
absl::Status EnsureEal(const std::string& args);

// Whether this process initialised the EAL (and with which args).
bool EalInitialized();
std::string EalArgs();

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
