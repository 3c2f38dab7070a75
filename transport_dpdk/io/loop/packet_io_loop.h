// packet_io_loop.h — in-process datagram backend: endpoints are queues in a
// process-wide fabric, so several ranks can run as threads of one process.
#pragma once

#include <memory>
#include <vector>

#include "transport_dpdk/io/packet_io.h"

namespace optireduce {
namespace transport {

class LoopEndpoint;

class LoopPacketIo : public PacketIo, public IoWaits {
 public:
  LoopPacketIo(size_t max_datagram, size_t queue_capacity);
  ~LoopPacketIo() override;

  std::string Describe() const override;
  uint32_t MaxDatagram() const override { return max_datagram_; }
  IoAddress LocalAddress() const override;
  absl::StatusOr<PeerHandle> ResolvePeer(const IoAddress& address) override;
  std::string AddressToString(const IoAddress& address) const override;
  size_t TxBurst(const TxDatagram* datagrams, size_t n) override;
  size_t RxBurst(RxDatagram* out, size_t max) override;
  IoWaits& Waits() override { return *this; }
  void WaitForInput(std::chrono::microseconds timeout) override;
  void Wake() override;
  void WaitForWake(std::chrono::microseconds timeout) override;
  void WaitAsWaiter(std::chrono::microseconds timeout) override;
  void WakeWaiter() override;
  bool WakesOnInput() const override { return true; }
  // Datagrams are copied between queues in this process's memory.
  bool ProtectsPayload() const override { return true; }

 private:
  const uint32_t max_datagram_;
  std::shared_ptr<LoopEndpoint> self_;
  std::vector<std::weak_ptr<LoopEndpoint>> peers_;  // by PeerHandle
  std::vector<IoAddress> peer_addresses_;
  std::vector<std::vector<uint8_t>> rx_held_;  // returned by the last RxBurst
};

}  // namespace transport
}  // namespace optireduce
