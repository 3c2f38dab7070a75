#include "gloo_ext/devices.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport_dpdk/attr.h"
#include "transport_dpdk/engine/engine_options.h"
#include "transport_dpdk/device.h"
#ifdef OPTIREDUCE_HAVE_DPDK
#include "transport_dpdk/dpdk_device.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"
#endif

namespace optireduce {
namespace gloo_ext {
namespace {

absl::StatusOr<std::string> InterfaceAddress(const std::string& interface) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError(absl::StrCat("getifaddrs failed looking up interface ",
                                            interface));
  }
  std::string found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (interface != a->ifa_name) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) {
      found = text;
      break;
    }
  }
  freeifaddrs(list);
  if (found.empty()) {
    return absl::NotFoundError(
        absl::StrCat("interface '", interface, "' has no IPv4 address (UDP device)"));
  }
  return found;
}

std::mutex devices_mu;
std::vector<std::weak_ptr<transport::Device>>& Devices() {
  static auto* devices = new std::vector<std::weak_ptr<transport::Device>>();
  return *devices;
}

std::shared_ptr<::gloo::transport::Device> Remember(std::shared_ptr<transport::Device> d) {
  std::lock_guard<std::mutex> lock(devices_mu);
  auto& devices = Devices();
  devices.erase(std::remove_if(devices.begin(), devices.end(),
                               [](const auto& w) { return w.expired(); }),
                devices.end());
  devices.push_back(d);
  return d;
}

}  // namespace

transport::EngineOptions EngineOptionsOf(const Config& config) {
  transport::EngineOptions engine;
  engine.session_token = config.session_token;
  engine.faults = config.faults;
  engine.peer_dead = std::chrono::milliseconds(config.peer_dead_ms);
  return engine;
}

transport::udp::attr UdpAttrOf(const Config& config) {
  transport::udp::attr attr;
  if (!config.udp_host.empty()) attr.hostname = config.udp_host;
  attr.port = config.udp_port_base;
  attr.max_datagram = config.udp_max_datagram;
  attr.segmentation_offload = config.udp_offload;
  attr.socket_buffer_bytes = config.socket_buffer_bytes;
  return attr;
}

transport::loop::attr LoopAttrOf(const Config&) { return transport::loop::attr(); }

transport::dpdk::attr DpdkAttrOf(const Config& config) {
  // The interface/hostname torch passes do not apply: DPDK owns its ports.
  transport::dpdk::attr attr;
  attr.eal_args = config.eal_args;
  if (!config.dpdk_file_prefix.empty()) {
#ifdef OPTIREDUCE_HAVE_DPDK
    // Appending to nothing would replace the backend's defaults with just the prefix.
    if (attr.eal_args.empty()) attr.eal_args = transport::dpdk::DefaultEalArgs();
#endif
    attr.eal_args += (attr.eal_args.empty() ? "" : " ");
    attr.eal_args += "--file-prefix=" + config.dpdk_file_prefix;
  }
  attr.ports = config.dpdk_ports;
  attr.ipv4 = config.dpdk_ipv4;
  attr.udp_port = config.dpdk_udp_port;
  attr.mtu = config.dpdk_mtu;
  attr.tx_copy_bodies = config.dpdk_tx_copy;
  attr.tx_backlog = config.dpdk_tx_backlog;
  return attr;
}

namespace {

// F(config) for the environment as it is now.
template <typename F>
auto FromEnvironment(F f) -> absl::StatusOr<decltype(f(std::declval<const Config&>()))> {
  absl::StatusOr<Config> config = ConfigFromEnvironment();
  if (!config.ok()) return config.status();
  return f(*config);
}

}  // namespace

absl::StatusOr<transport::EngineOptions> EngineOptionsFromEnvironment() {
  return FromEnvironment(EngineOptionsOf);
}
absl::StatusOr<transport::udp::attr> UdpAttrFromEnvironment() {
  return FromEnvironment(UdpAttrOf);
}
absl::StatusOr<transport::loop::attr> LoopAttrFromEnvironment() {
  return FromEnvironment(LoopAttrOf);
}
absl::StatusOr<transport::dpdk::attr> DpdkAttrFromEnvironment() {
  return FromEnvironment(DpdkAttrOf);
}

absl::StatusOr<std::string> BindHost(const Config& config, const std::string& interface,
                                     const std::string& hostname) {
  if (!config.udp_host.empty()) return config.udp_host;
  if (!interface.empty()) return InterfaceAddress(interface);
  if (!hostname.empty()) return hostname;
  return std::string("127.0.0.1");
}

absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateUdpDevice(
    const Config& config, const std::string& interface, const std::string& hostname) {
  absl::StatusOr<std::string> host = BindHost(config, interface, hostname);
  if (!host.ok()) return host.status();
  transport::udp::attr attr = UdpAttrOf(config);
  const transport::EngineOptions engine = EngineOptionsOf(config);
  attr.hostname = *host;
  if (config.udp_port_base == 0) {
    attr.port = 0;
    auto device = transport::udp::CreateDeviceOrError(attr, engine);
    if (!device.ok()) return device.status();
    return Remember(*device);
  }
  absl::Status last;
  const int last_port = std::min(65535, config.udp_port_base + config.udp_port_range - 1);
  for (int port = config.udp_port_base; port <= last_port; port++) {
    attr.port = static_cast<uint16_t>(port);
    auto device = transport::udp::CreateDeviceOrError(attr, engine);
    if (device.ok()) return Remember(*device);
    last = device.status();
    // Only "port taken" moves on to the next port; anything else is a real error.
    if (!absl::IsUnavailable(last)) return last;
  }
  return absl::UnavailableError(absl::StrCat(
      "no free UDP port in ", config.udp_port_base, "..", last_port, " on ", *host,
      " (OPTIREDUCE_UDP_PORT_BASE/OPTIREDUCE_UDP_PORT_RANGE); last error: ", last.message()));
}

bool HaveDpdkDevice() {
#ifdef OPTIREDUCE_HAVE_DPDK
  return true;
#else
  return false;
#endif
}

#ifdef OPTIREDUCE_HAVE_DPDK
namespace {

// A DPDK device's settings: its backend's attr and its engine's options.
struct DpdkSettings {
  transport::dpdk::attr attr;
  transport::EngineOptions engine;
};

// "" when a device made with `have_settings` serves a caller asking for `want_settings`;
// else which setting differs, with both values. EAL args are compared resolved (empty =
// the defaults).
std::string DpdkAttrDifference(const DpdkSettings& have_settings,
                               const DpdkSettings& want_settings) {
  const transport::dpdk::attr& have = have_settings.attr;
  const transport::dpdk::attr& want = want_settings.attr;
  auto differ = [](const char* name, const std::string& a, const std::string& b) {
    return absl::StrCat(name, ": the device has '", a, "', this call asks for '", b, "'");
  };
  const std::string eal_have = transport::dpdk::ResolveEalArgs(have.eal_args);
  const std::string eal_want = transport::dpdk::ResolveEalArgs(want.eal_args);
  if (eal_have != eal_want) {
    return differ("OPTIREDUCE_EAL_ARGS (with OPTIREDUCE_DPDK_FILE_PREFIX)", eal_have, eal_want);
  }
  if (have.ports != want.ports) {
    return differ("OPTIREDUCE_DPDK_PORTS", absl::StrJoin(have.ports, ","),
                  absl::StrJoin(want.ports, ","));
  }
  if (have.ipv4 != want.ipv4) return differ("OPTIREDUCE_DPDK_IPV4", have.ipv4, want.ipv4);
  if (have.udp_port != want.udp_port) {
    return differ("OPTIREDUCE_DPDK_UDP_PORT", absl::StrCat(have.udp_port),
                  absl::StrCat(want.udp_port));
  }
  if (have.mtu != want.mtu) {
    return differ("OPTIREDUCE_DPDK_MTU", absl::StrCat(have.mtu), absl::StrCat(want.mtu));
  }
  if (have.tx_copy_bodies != want.tx_copy_bodies) {
    return differ("OPTIREDUCE_DPDK_TX_COPY", absl::StrCat(have.tx_copy_bodies),
                  absl::StrCat(want.tx_copy_bodies));
  }
  if (have.tx_backlog != want.tx_backlog) {
    return differ("OPTIREDUCE_DPDK_TX_BACKLOG", absl::StrCat(have.tx_backlog),
                  absl::StrCat(want.tx_backlog));
  }
  const transport::EngineOptions& have_engine = have_settings.engine;
  const transport::EngineOptions& want_engine = want_settings.engine;
  if (have_engine.faults != want_engine.faults) {
    return differ("OPTIREDUCE_FAULTS", have_engine.faults, want_engine.faults);
  }
  if (have_engine.peer_dead != want_engine.peer_dead) {
    return differ("OPTIREDUCE_PEER_DEAD_MS", absl::StrCat(have_engine.peer_dead.count()),
                  absl::StrCat(want_engine.peer_dead.count()));
  }
  if (have_engine.session_token != want_engine.session_token) {
    return differ("OPTIREDUCE_SESSION_TOKEN", absl::StrCat(have_engine.session_token),
                  absl::StrCat(want_engine.session_token));
  }
  return "";
}

// The process's DPDK device. There is one EAL per process and a port serves one device,
// so every caller (torch makes a device per process group: new_group makes more) shares
// it; its contexts are kept apart by the engine (context ids in every packet), as on a
// UDP device. Held weakly: it goes (and its ports stop) when the last group using it is
// destroyed, and a later call makes a new one (a device still being destroyed on another
// thread holds its ports until its destructor ends: that call fails with "already used").
// `mu` also serialises creation, so two threads asking at once get the same device.
struct SharedDpdkDevice {
  std::mutex mu;
  DpdkSettings settings;
  std::weak_ptr<transport::Device> device;
};
SharedDpdkDevice& SharedDpdk() {
  static auto* shared = new SharedDpdkDevice();
  return *shared;
}

}  // namespace
#endif

absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateDpdkDevice(
    const Config& config, const std::string& interface, const std::string& hostname) {
#ifdef OPTIREDUCE_HAVE_DPDK
  const DpdkSettings settings{DpdkAttrOf(config), EngineOptionsOf(config)};
  SharedDpdkDevice& shared = SharedDpdk();
  std::lock_guard<std::mutex> lock(shared.mu);
  if (std::shared_ptr<transport::Device> existing = shared.device.lock()) {
    const std::string difference = DpdkAttrDifference(shared.settings, settings);
    if (!difference.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this process already has a DPDK device and every DPDK device of a process "
          "shares it (one EAL, one set of ports), but the settings differ: ",
          difference, "; give every process group the same DPDK settings"));
    }
    return std::shared_ptr<::gloo::transport::Device>(existing);
  }
  auto device = transport::dpdk::CreateDeviceOrError(settings.attr, settings.engine);
  if (!device.ok()) return device.status();
  shared.settings = settings;
  shared.device = *device;
  return Remember(*device);
#else
  return absl::UnimplementedError(
      "GLOO_DEVICE_TRANSPORT=DPDK: this optireduce build has no DPDK device (built without "
      "libdpdk); use GLOO_DEVICE_TRANSPORT=UDP");
#endif
}

std::string DeviceStatsJson() {
  transport::Stats sum;
  int alive = 0;
  std::lock_guard<std::mutex> lock(devices_mu);
  for (const auto& weak : Devices()) {
    std::shared_ptr<transport::Device> d = weak.lock();
    if (!d) continue;
    alive++;
    sum += d->stats();
  }
  return absl::StrCat("{\"devices\": ", alive, ", \"tx_packets\": ", sum.tx_packets,
                      ", \"rx_packets\": ", sum.rx_packets, ", \"tx_bytes\": ", sum.tx_bytes,
                      ", \"rx_bytes\": ", sum.rx_bytes, ", \"retransmits\": ", sum.retransmits,
                      ", \"dropped\": ", sum.TotalDropped(), "}");
}

}  // namespace gloo_ext
}  // namespace optireduce
