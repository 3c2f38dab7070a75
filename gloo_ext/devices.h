// Gloo devices of optireduce's datagram transport, configured from the environment
// (gloo_ext/config.h). Used by the c10d registration (GLOO_DEVICE_TRANSPORT=UDP|DPDK) and
// by C++ programs that want the same settings as PyTorch users.
#pragma once

#include <memory>
#include <string>

#include <gloo/transport/device.h>

#include "absl/status/statusor.h"
#include "gloo_ext/config.h"

namespace optireduce {
namespace gloo_ext {

// Which address the device binds: OPTIREDUCE_UDP_HOST if set, else the IPv4 address of
// `interface` if given (as GLOO_SOCKET_IFNAME passes it), else `hostname`, else 127.0.0.1.
absl::StatusOr<std::string> BindHost(const Config& config, const std::string& interface,
                                     const std::string& hostname);

// The UDP device. With OPTIREDUCE_UDP_PORT_BASE set, binds the first free port of
// [base, base + OPTIREDUCE_UDP_PORT_RANGE) (several ranks share a host).
absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateUdpDevice(
    const Config& config, const std::string& interface, const std::string& hostname);

// True when this build has the DPDK device.
bool HaveDpdkDevice();

// The DPDK device (EAL arguments from OPTIREDUCE_EAL_ARGS); UnimplementedError when this
// build has none. A process has one EAL and its ports serve one device, so while a DPDK
// device made here is alive every later call returns that same device (torch makes one
// device per process group); its groups are kept apart by context. A call whose settings
// differ from the live device's gets FailedPreconditionError naming the variable and both
// values.
absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateDpdkDevice(
    const Config& config, const std::string& interface, const std::string& hostname);

// Summed counters of every device created through this file that is still alive, as JSON:
// {"devices": N, "tx_packets": .., "rx_packets": .., "retransmits": .., "dropped": ..}
// (shows that traffic really went over optireduce's transport).
std::string DeviceStatsJson();

}  // namespace gloo_ext
}  // namespace optireduce
