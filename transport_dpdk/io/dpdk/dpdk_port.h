// dpdk_port.h — finding, configuring and starting ethdev ports for the DPDK
// backend. A port is owned by at most one device at a time in a process;
// when the device goes away the port is stopped (not closed) so that a later
// device can open it again. Mempools live for the whole process: frames of
// a freed pool could still sit in another port's ring (net_ring).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "transport_dpdk/io/dpdk/dpdk_frame.h"

struct rte_mempool;

namespace optireduce {
namespace transport {
namespace dpdk {

// "0: net_memif0 (net_memif), 1: ..." for error messages.
std::string ListPorts();

// A port by ethdev name, or by index when the string is a number.
absl::StatusOr<uint16_t> FindPort(const std::string& name_or_index);

struct PortRequest {
  uint32_t max_frame = 0;  // largest frame (Ethernet header included)
  uint32_t rx_descriptors = 1024;
  uint32_t tx_descriptors = 1024;
  uint32_t mtu = 0;        // IP MTU to set if the port's is smaller
  uint32_t extra_mbufs = 0;  // mbufs the caller holds outside the rings (TX backlog)
};

// What the port is, when it is a memif (see dpdk_port.cc: start order).
struct MemifLink {
  bool is_memif = false;
  bool client = false;
  std::string marker;  // file the server creates once its queues exist
};

class OpenPort {
 public:
  static absl::StatusOr<std::unique_ptr<OpenPort>> Open(
      uint16_t port_id, const PortRequest& request);
  ~OpenPort();
  OpenPort(const OpenPort&) = delete;
  OpenPort& operator=(const OpenPort&) = delete;

  uint16_t id() const { return id_; }
  const std::string& name() const { return name_; }
  const Mac& mac() const { return mac_; }
  const std::string& driver() const { return driver_; }
  bool is_memif() const { return driver_ == "net_memif"; }
  // A link through this host's memory (net_memif, net_ring): nothing on the way
  // can corrupt a frame, and its MAC is not unique across processes.
  bool host_shared_memory() const { return is_memif() || driver_ == "net_ring"; }
  rte_mempool* pool() const { return pool_; }
  uint32_t rx_descriptors() const { return rxd_; }
  uint32_t tx_descriptors() const { return txd_; }
  bool tx_ip_checksum() const { return tx_ip_csum_; }
  bool tx_udp_checksum() const { return tx_udp_csum_; }
  bool rx_checksum() const { return rx_csum_; }

  // Whether rx/tx may be called (the port is started).
  bool started() const { return started_; }
  // Link watchdog, called from the polling thread: a port whose link stays
  // down is restarted with growing intervals. That re-runs a memif client's
  // handshake, which fails for good when it races the server's setup (the
  // server listens at probe time but has no queues until it is started).
  void Watchdog(std::chrono::steady_clock::time_point now);
  uint64_t restarts() const { return restarts_; }

  // The MTU the port reports (0 if it does not say).
  static uint32_t PortMtu(uint16_t port_id);
  // The packet buffer size a net_memif port was given with its "bsize="
  // devarg; 0 when the port is not a memif or has no bsize devarg.
  static uint32_t MemifBufferSize(uint16_t port_id);

 private:
  OpenPort() = default;
  uint16_t id_ = 0;
  std::string name_;
  std::string driver_;
  Mac mac_{};
  rte_mempool* pool_ = nullptr;
  uint32_t rxd_ = 0, txd_ = 0;
  bool tx_ip_csum_ = false, tx_udp_csum_ = false, rx_csum_ = false;
  bool started_ = false;
  bool claimed_ = false;  // we hold the port's in-use flag
  MemifLink memif_;
  using Clock = std::chrono::steady_clock;
  Clock::time_point next_check_{};
  Clock::time_point down_since_{};
  Clock::duration restart_after_ = std::chrono::milliseconds(300);
  uint64_t restarts_ = 0;
};

}  // namespace dpdk
}  // namespace transport
}  // namespace optireduce
