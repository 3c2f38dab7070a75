// packet_io_dpdk_rx.cc — DpdkPacketIo's receive side: RxBurst (polls every usable
// port in turn, parses and checks frames, learns mesh routes, hands payloads to
// the engine in place) and waiting for input (WaitForInput, Wake, and the waits of
// waiter-driven receive).
#include "transport_dpdk/io/dpdk/packet_io_dpdk.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

namespace optireduce {
namespace transport {
namespace {

using dpdk::Verdict;

constexpr size_t kBurst = 32;

}  // namespace

size_t DpdkPacketIo::RxBurst(RxDatagram* out, size_t max) {
  if (!rx_held_.empty()) {
    rte_pktmbuf_free_bulk(rx_held_.data(), static_cast<unsigned>(rx_held_.size()));
    rx_held_.clear();
  }
  size_t linear_used = 0;
  const dpdk::ControlGate::Pass pass = OpenGate();
  if (gate_ && memif_open_) WatchLinks();
  DrainBacklogs();
  const auto now = std::chrono::steady_clock::now();
  for (auto& p : ports_) {
    if (memif_open_ || !p->is_memif()) p->Watchdog(now);
  }
  if (ports_.size() > 1) SendHellos();
  if (priming_) SendPrimers();
  size_t got = 0;
  rte_mbuf* mbufs[kBurst];
  const size_t nports = ports_.size();
  for (size_t k = 0; k < nports && got < max; ++k) {
    const size_t pi = (rx_next_port_ + k) % nports;
    const dpdk::OpenPort& port = *ports_[pi];
    if (!Usable(pi)) continue;
    const uint16_t want = static_cast<uint16_t>(std::min(kBurst, max - got));
    const uint16_t nb = rte_eth_rx_burst(port.id(), 0, mbufs, want);
    if (nb) Count(c_.rx_frames, nb);
    for (uint16_t i = 0; i < nb; ++i) {
      rte_mbuf* m = mbufs[i];
      uint8_t* frame;
      const size_t len = rte_pktmbuf_pkt_len(m);
      if (m->nb_segs > 1) {
        if (rx_linear_.size() <= linear_used) rx_linear_.emplace_back();
        auto& buf = rx_linear_[linear_used++];
        buf.resize(len);
        frame = static_cast<uint8_t*>(
            const_cast<void*>(rte_pktmbuf_read(m, 0, static_cast<uint32_t>(len), buf.data())));
        if (frame != buf.data()) std::memcpy(buf.data(), frame, len), frame = buf.data();
      } else {
        frame = rte_pktmbuf_mtod(m, uint8_t*);
      }
      bool verify_ip = true, verify_udp = true;
      if (port.rx_checksum()) {
        const uint64_t ipf = m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK;
        const uint64_t l4f = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
        verify_ip = ipf != RTE_MBUF_F_RX_IP_CKSUM_GOOD;
        verify_udp = l4f != RTE_MBUF_F_RX_L4_CKSUM_GOOD;
      }
      dpdk::Parsed p = dpdk::ParseFrame(frame, len, self_, verify_ip, verify_udp);
      if (p.verdict == Verdict::kOk || p.verdict == Verdict::kHello) {
        if (nports > 1) {
          mac_to_port_[MacKey(p.src_mac)] = static_cast<int>(pi);
          port_learned_[pi] = true;
        }
      }
      if (p.verdict == Verdict::kOk && p.payload_len > 0 &&
          p.payload_len <= max_datagram_) {
        out[got].data = p.payload;
        out[got].len = p.payload_len;
        ++got;
        rx_held_.push_back(m);
        continue;
      }
      if (p.verdict == Verdict::kHello) {
        Count(c_.hellos_received);
        // A full-size hello is a primer (SendPrimers): the peer's side of the set-up.
        if (len > dpdk::kHelloFrame) last_primer_rx_[pi] = now;
      } else {
        Count(c_.rx_dropped[static_cast<int>(p.verdict == Verdict::kOk
                                                 ? Verdict::kBadIpHeader
                                                 : p.verdict)]);
      }
      rte_pktmbuf_free(m);
    }
  }
  rx_next_port_ = (rx_next_port_ + 1) % nports;
  if (got) Count(c_.rx_delivered, got);
  if (got && gate_) gate_->NoteTraffic();
  return got;
}

namespace {
// Sleeps on `fd` (an eventfd) for `timeout` or until it is written; drains it.
void SleepOnEventFd(int fd, std::chrono::microseconds timeout) {
  if (timeout.count() <= 0) return;
  pollfd p = {fd, POLLIN, 0};
  timespec ts;
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  if (ppoll(&p, 1, &ts, nullptr) > 0) {
    uint64_t v;
    while (read(fd, &v, sizeof(v)) == sizeof(v)) {
    }
  }
}

void WriteEventFd(int fd) {
  uint64_t one = 1;
  ssize_t r = write(fd, &one, sizeof(one));
  (void)r;
}
}  // namespace

std::chrono::microseconds DpdkPacketIo::BoundByBacklog(std::chrono::microseconds timeout) const {
  // Frames wait in a TX backlog for a ring to free up: come back soon (the drain itself
  // runs under the engine's lock, in RxBurst / TxBurst).
  if (backlog_frames_.load(std::memory_order_relaxed) > 0) {
    return std::min(timeout, std::chrono::microseconds(20));
  }
  return timeout;
}

void DpdkPacketIo::WaitForInput(std::chrono::microseconds timeout) {
  // Virtual and real ports have no file descriptor to wait on in general:
  // sleep (the engine grows the timeout while idle), but return at once on
  // Wake().
  SleepOnEventFd(wake_fd_, BoundByBacklog(timeout));
}

void DpdkPacketIo::WaitForWake(std::chrono::microseconds timeout) {
  // The polling waiter drains the backlog meanwhile.
  SleepOnEventFd(wake_fd_, timeout);
}

void DpdkPacketIo::WaitAsWaiter(std::chrono::microseconds timeout) {
  SleepOnEventFd(waiter_wake_fd_, BoundByBacklog(timeout));
}

void DpdkPacketIo::Wake() { WriteEventFd(wake_fd_); }

void DpdkPacketIo::WakeWaiter() { WriteEventFd(waiter_wake_fd_); }

}  // namespace transport
}  // namespace optireduce
