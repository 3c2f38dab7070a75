// packet_io_dpdk_tx.cc — DpdkPacketIo's transmit side: building Ethernet/IPv4/UDP
// frames around engine datagrams (copied or, on memif, chained zero-copy), the
// per-port software backlog that absorbs a full TX ring, and TxBurst itself.
#include "transport_dpdk/io/dpdk/packet_io_dpdk.h"

#include <algorithm>
#include <cstring>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

namespace optireduce {
namespace transport {

rte_mbuf* DpdkPacketIo::TakeMbuf(size_t port) {
  Stash& st = tx_stash_[port];
  if (st.next == st.n) {
    st.n = st.next = 0;
    if (rte_pktmbuf_alloc_bulk(ports_[port]->pool(), st.m, 32) == 0) {
      st.n = 32;
    } else {
      return rte_pktmbuf_alloc(ports_[port]->pool());  // nearly empty pool
    }
  }
  return st.m[st.next++];
}

namespace {
// The body of a zero-copy frame belongs to the engine: nothing to free. The
// shared info lives in the carrying mbuf's own (unused) data room.
void KeepBody(void*, void*) {}
}  // namespace

rte_mbuf* DpdkPacketIo::BuildFrame(size_t port, const TxDatagram& d,
                                   const Endpoint& dst, bool zero_copy_body) {
  const dpdk::OpenPort& p = *ports_[port];
  rte_mbuf* m = TakeMbuf(port);
  if (!m) return nullptr;
  const size_t len = d.head_len + d.body_len;
  const size_t in_head = zero_copy_body ? d.head_len : len;
  uint8_t* f = reinterpret_cast<uint8_t*>(
      rte_pktmbuf_append(m, static_cast<uint16_t>(dpdk::kFrameHeader + in_head)));
  if (!f) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  dpdk::WriteHeaders(f, self_, dst, ip_id_++, len, !p.tx_ip_checksum());
  uint8_t* payload = f + dpdk::kFrameHeader;
  std::memcpy(payload, d.head, d.head_len);
  if (zero_copy_body) {
    rte_mbuf* body = TakeMbuf(port);
    if (!body) {
      rte_pktmbuf_free(m);
      return nullptr;
    }
    auto* shinfo = rte_pktmbuf_mtod(body, rte_mbuf_ext_shared_info*);
    shinfo->free_cb = KeepBody;
    shinfo->fcb_opaque = nullptr;
    rte_mbuf_ext_refcnt_set(shinfo, 1);
    void* addr = const_cast<void*>(static_cast<const void*>(d.body));
    // The IOVA is never used: the PMD copies through the virtual address.
    rte_pktmbuf_attach_extbuf(body, addr, reinterpret_cast<uintptr_t>(addr),
                              static_cast<uint16_t>(d.body_len), shinfo);
    body->data_len = static_cast<uint16_t>(d.body_len);
    body->pkt_len = d.body_len;
    if (rte_pktmbuf_chain(m, body) != 0) {
      rte_pktmbuf_free(body);
      rte_pktmbuf_free(m);
      return nullptr;
    }
  } else if (d.body_len) {
    std::memcpy(payload + d.head_len, d.body, d.body_len);
  }
  if (p.tx_ip_checksum()) {
    m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM;
    m->l2_len = dpdk::kEthHeader;
    m->l3_len = dpdk::kIpv4Header;
  }
  if (udp_checksum_) {
    uint8_t* udp = f + dpdk::kEthHeader + dpdk::kIpv4Header;
    uint16_t c;
    if (p.tx_udp_checksum()) {
      m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_UDP_CKSUM;
      m->l2_len = dpdk::kEthHeader;
      m->l3_len = dpdk::kIpv4Header;
      c = dpdk::UdpPseudoHeaderSum(self_.ipv4_be, dst.ipv4_be, dpdk::kUdpHeader + len);
    } else if (zero_copy_body) {
      c = dpdk::UdpChecksum(self_.ipv4_be, dst.ipv4_be, udp, dpdk::kUdpHeader + d.head_len,
                            static_cast<const uint8_t*>(d.body), d.body_len);
    } else {
      c = dpdk::UdpChecksum(self_.ipv4_be, dst.ipv4_be, udp, dpdk::kUdpHeader + len);
    }
    udp[6] = static_cast<uint8_t>(c >> 8);
    udp[7] = static_cast<uint8_t>(c);
  }
  return m;
}

void DpdkPacketIo::DrainBacklog(size_t pi) {
  TxBacklog& b = tx_backlog_[pi];
  const dpdk::OpenPort& port = *ports_[pi];
  if (b.size() == 0 || !Usable(pi)) return;
  uint32_t sent_total = 0;
  while (b.size() > 0) {
    // The contiguous run from head (the ring wraps).
    const uint32_t at = b.head % kTxBacklogFrames;
    const uint32_t run = std::min<uint32_t>(b.size(), kTxBacklogFrames - at);
    const uint16_t want = static_cast<uint16_t>(std::min<uint32_t>(run, 512));
    const uint16_t sent = rte_eth_tx_burst(port.id(), 0, &b.ring[at], want);
    b.head += sent;
    sent_total += sent;
    if (sent < want) break;  // ring full: the rest waits
  }
  if (sent_total) {
    Count(c_.tx_frames, sent_total);
    backlog_frames_.fetch_sub(sent_total, std::memory_order_relaxed);
  }
}

void DpdkPacketIo::DrainBacklogs() {
  if (backlog_frames_.load(std::memory_order_relaxed) == 0) return;
  for (size_t pi = 0; pi < ports_.size(); ++pi) DrainBacklog(pi);
}

void DpdkPacketIo::LinearizeUnsent(size_t pi, uint32_t from) {
  TxBacklog& b = tx_backlog_[pi];
  // Waiting: [head, tail); queued by this TxBurst: [from, tail). Start at the later of
  // the two — by distance to tail, since the counters run free and wrap.
  const uint32_t start = b.tail - b.head < b.tail - from ? b.head : from;
  bool dropped = false;
  for (uint32_t at = start; at != b.tail; ++at) {
    rte_mbuf*& m = b.ring[at % kTxBacklogFrames];
    if (m->nb_segs == 1) continue;
    // The head mbuf's data room holds a whole frame (the pool is sized for it):
    // the body is copied into it and the external segment let go.
    Count(c_.tx_linearized);
    if (rte_pktmbuf_linearize(m) != 0) {
      // Cannot happen with our pool sizes; dropping is the datagram way out.
      rte_pktmbuf_free(m);
      m = nullptr;
      dropped = true;
    }
  }
  if (!dropped) return;
  // Close the gaps, keeping the order.
  uint32_t w = start;
  for (uint32_t r = start; r != b.tail; ++r) {
    rte_mbuf* m = b.ring[r % kTxBacklogFrames];
    if (m) b.ring[w++ % kTxBacklogFrames] = m;
  }
  backlog_frames_.fetch_sub(b.tail - w, std::memory_order_relaxed);
  b.tail = w;
}

bool DpdkPacketIo::Enqueue(size_t pi, rte_mbuf* m) {
  TxBacklog& b = tx_backlog_[pi];
  if (b.size() >= backlog_cap_) {
    DrainBacklog(pi);
    if (b.size() >= backlog_cap_) return false;
  }
  b.ring[b.tail % kTxBacklogFrames] = m;
  ++b.tail;
  backlog_frames_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

size_t DpdkPacketIo::TxBurst(const TxDatagram* d, size_t n) {
  const dpdk::ControlGate::Pass pass = OpenGate();
  // Frames go through the port's backlog (in order); most leave at once in
  // the drain below, the rest on the next call.
  DrainBacklogs();
  for (size_t p = 0; p < ports_.size(); ++p) queued_from_[p] = tx_backlog_[p].tail;
  size_t done = 0;
  for (size_t i = 0; i < n; ++i) {
    const TxDatagram& t = d[i];
    if (t.peer >= peers_.size() || t.head_len + t.body_len > max_datagram_) {
      // The engine never does this; treat it as a loss rather than stall.
      ++done;
      continue;
    }
    const Endpoint& dst = peers_[t.peer];
    const int port = RoutePort(dst);
    if (port < 0) {
      // Mesh link to this peer not learned yet: flood (the wrong receivers
      // drop it by MAC). Best effort, like any datagram.
      for (size_t p = 0; p < ports_.size(); ++p) {
        if (!ports_[p]->started() || link_lost_[p]) continue;
        rte_mbuf* m = BuildFrame(p, t, dst);
        if (!m) continue;
        if (!Enqueue(p, m)) rte_pktmbuf_free(m);
      }
      Count(c_.tx_flooded);
      ++done;
      continue;
    }
    const size_t pi = static_cast<size_t>(port);
    if (link_lost_[pi]) {  // the peer behind this link is gone: a lost datagram
      ++done;
      continue;
    }
    if (tx_backlog_[pi].size() >= backlog_cap_) {
      DrainBacklog(pi);
      if (tx_backlog_[pi].size() >= backlog_cap_) {
        Count(c_.tx_backpressure, n - i);
        break;  // this link is full; datagrams [i, n) are refused
      }
    }
    // Small bodies are cheaper to copy than to chain.
    const bool zero_copy = tx_copies_[pi] && t.body_len >= 1024;
    rte_mbuf* m = BuildFrame(pi, t, dst, zero_copy);
    if (!m) {  // pool exhausted: backpressure
      Count(c_.tx_backpressure, n - i);
      break;
    }
    if (zero_copy) Count(c_.tx_zero_copy);
    Enqueue(pi, m);  // cannot fail: checked for room above
    ++done;
  }
  const uint32_t before = backlog_frames_.load(std::memory_order_relaxed);
  DrainBacklogs();
  for (size_t p = 0; p < ports_.size(); ++p) {
    if (tx_copies_[p]) LinearizeUnsent(p, queued_from_[p]);
  }
  const uint32_t after = backlog_frames_.load(std::memory_order_relaxed);
  if (after > 0 && after >= before) Count(c_.tx_deferred, after);
  if (done && gate_) gate_->NoteTraffic();
  return done;
}

bool DpdkPacketIo::SendRawFrame(size_t index, const uint8_t* frame, size_t len) {
  if (index >= ports_.size()) return false;
  const dpdk::ControlGate::Pass pass = OpenGate();
  if (!Usable(index)) return false;
  rte_mbuf* m = rte_pktmbuf_alloc(ports_[index]->pool());
  if (!m) return false;
  uint8_t* f = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(len)));
  if (!f) {
    rte_pktmbuf_free(m);
    return false;
  }
  std::memcpy(f, frame, len);
  if (rte_eth_tx_burst(ports_[index]->id(), 0, &m, 1) != 1) {
    rte_pktmbuf_free(m);
    return false;
  }
  return true;
}

}  // namespace transport
}  // namespace optireduce
