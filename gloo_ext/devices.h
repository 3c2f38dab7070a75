// Gloo devices of optireduce's datagram transport, configured from the environment
// (gloo_ext/config.h). Used by the c10d registration (GLOO_DEVICE_TRANSPORT=UDP|DPDK) and
// by C++ programs that want the same settings as PyTorch users.
//
// The transport reads no environment variable: it takes its attr structs. The *Of(config)
// functions below fill them from a Config the way the PyTorch devices do; the
// *FromEnvironment() ones do that for the environment as it is now
// (ConfigFromEnvironment(), every variable validated). A C++ program that wants the
// environment's settings writes, e.g.
//   auto attr = optireduce::gloo_ext::DpdkAttrFromEnvironment();          // StatusOr
//   auto engine = optireduce::gloo_ext::EngineOptionsFromEnvironment();   // StatusOr
//   if (attr.ok() && engine.ok())
//     device = optireduce::transport::dpdk::CreateDevice(*attr, *engine);
// and then overrides what it sets itself. A backend's attr holds the backend's settings
// only; the engine's (faults, session token, silence bound) are EngineOptionsOf's.
#pragma once

#include <memory>
#include <string>

#include <gloo/transport/device.h>

#include "absl/status/statusor.h"
#include "gloo_ext/config.h"
#include "transport_dpdk/attr.h"
#include "transport_dpdk/dpdk_attr.h"
#include "transport_dpdk/engine/engine_options.h"

namespace optireduce {
namespace gloo_ext {

// The engine's options, for every backend's device: OPTIREDUCE_FAULTS,
// OPTIREDUCE_SESSION_TOKEN, OPTIREDUCE_PEER_DEAD_MS; the other fields keep their defaults.
transport::EngineOptions EngineOptionsOf(const Config& config);
// hostname = OPTIREDUCE_UDP_HOST (else the attr's default), port =
// OPTIREDUCE_UDP_PORT_BASE (CreateUdpDevice below also tries the rest of the range),
// OPTIREDUCE_UDP_MAX_DATAGRAM, OPTIREDUCE_UDP_OFFLOAD, OPTIREDUCE_SOCKET_BUFFER_BYTES.
transport::udp::attr UdpAttrOf(const Config& config);
// The loop backend has no variable of its own: its defaults.
transport::loop::attr LoopAttrOf(const Config& config);
// OPTIREDUCE_EAL_ARGS (+ OPTIREDUCE_DPDK_FILE_PREFIX), OPTIREDUCE_DPDK_PORTS, _IPV4,
// _UDP_PORT, _MTU, _TX_COPY, _TX_BACKLOG.
transport::dpdk::attr DpdkAttrOf(const Config& config);

// The same from ConfigFromEnvironment(); its error names the bad variable.
absl::StatusOr<transport::EngineOptions> EngineOptionsFromEnvironment();
absl::StatusOr<transport::udp::attr> UdpAttrFromEnvironment();
absl::StatusOr<transport::loop::attr> LoopAttrFromEnvironment();
absl::StatusOr<transport::dpdk::attr> DpdkAttrFromEnvironment();

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
