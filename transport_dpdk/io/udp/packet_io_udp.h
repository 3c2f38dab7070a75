// packet_io_udp.h — kernel UDP backend: one nonblocking IPv4 socket per
// device, sendmmsg/recvmmsg bursts (with UDP segmentation offload on send and
// UDP GRO on receive where the kernel has them), poll() on the socket + an
// eventfd to sleep when idle.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <memory>
#include <vector>

#include "transport_dpdk/attr.h"
#include "transport_dpdk/io/packet_io.h"

namespace optireduce {
namespace transport {

class UdpPacketIo : public PacketIo, public IoWaits {
 public:
  static absl::StatusOr<std::unique_ptr<UdpPacketIo>> Create(
      const udp::attr& attr);
  ~UdpPacketIo() override;

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
  // The kernel checksums every UDP datagram and drops those that fail.
  bool ProtectsPayload() const override { return true; }
  // ICMP port-unreachable reports (IP_RECVERR error queue) mapped to peers, with the
  // start of the datagram each quotes.
  size_t TakeUnreachable(UnreachableReport* out, size_t max) override;
  std::string UnreachableCause() const override {
    return "its address reported ICMP port unreachable (its socket is closed)";
  }

  // The kernel's actual receive buffer size (after doubling).
  size_t ReceiveBufferBytes() const { return rcvbuf_bytes_; }
  uint16_t port() const { return ntohs(local_.sin_port); }
  // Segmentation offload in use (send side); false after the kernel refused a run.
  bool SegmentationOffload() const { return gso_; }
  // Messages handed to the kernel carrying more than one datagram, and received messages
  // that the kernel had coalesced (more than one datagram each): counters for tests.
  uint64_t SegmentedSends() const { return segmented_sends_; }
  uint64_t CoalescedReceives() const { return coalesced_receives_; }
  // ICMP port-unreachable reports read from the error queue (any address).
  uint64_t UnreachableReports() const { return unreachable_reports_; }

 private:
  UdpPacketIo() = default;

  int fd_ = -1;
  int wake_fd_ = -1;         // Wake(): the progress thread
  int waiter_wake_fd_ = -1;  // WakeWaiter(): a user thread in WaitAsWaiter
  uint32_t max_datagram_ = 0;
  size_t rcvbuf_bytes_ = 0;
  sockaddr_in local_{};
  std::vector<sockaddr_in> peers_;  // by PeerHandle
  bool gso_ = false;
  bool gro_ = false;
  uint32_t rx_slot_bytes_ = 0;
  uint64_t segmented_sends_ = 0;
  uint64_t coalesced_receives_ = 0;
  uint64_t unreachable_reports_ = 0;
  // The error queue may hold reports (poll saw POLLERR, or a call failed with
  // the error the kernel keeps for the last report): TakeUnreachable reads it.
  std::atomic<bool> errors_pending_{false};
  std::vector<uint8_t> rx_storage_;
  std::vector<uint8_t*> rx_slots_;
  // Datagrams of the last recvmmsg not yet returned (a coalesced message holds many): they
  // are handed out before the slots are reused.
  std::vector<RxDatagram> rx_pending_;
  size_t rx_pending_next_ = 0;
};

// Encodes/decodes the UDP backend's IoAddress (IPv4 + port).
IoAddress UdpAddress(const sockaddr_in& sin);

}  // namespace transport
}  // namespace optireduce
