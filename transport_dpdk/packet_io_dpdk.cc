#include "transport_dpdk/packet_io_dpdk.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "transport_dpdk/dpdk_eal.h"

namespace optireduce {
namespace transport {
namespace {

using dpdk::Verdict;

constexpr size_t kBurst = 32;
constexpr auto kHelloFast = std::chrono::milliseconds(10);
constexpr auto kHelloSlow = std::chrono::seconds(1);
// Frames a memif ring holds (the PMD's default, log2_ring_size=10).
constexpr uint32_t kMemifRing = 1024;
constexpr uint32_t kMinDatagram = 256;

uint32_t NextPow2(uint64_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 20)) p <<= 1;
  return p;
}

std::atomic<int> g_device_number{0};

}  // namespace

uint64_t DpdkPacketIo::MacKey(const dpdk::Mac& m) {
  uint64_t k = 0;
  std::memcpy(&k, m.data(), 6);
  return k;
}

absl::StatusOr<std::unique_ptr<DpdkPacketIo>> DpdkPacketIo::Create(
    const dpdk::attr& a) {
  if (a.tx_backlog < 32 || a.tx_backlog > kTxBacklogFrames) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dpdk attr.tx_backlog=", a.tx_backlog, " is not valid; allowed values: an integer 32..",
        kTxBacklogFrames, " (frames)"));
  }
  const std::string eal_args = dpdk::ResolveEalArgs(a.eal_args);
  absl::Status st = dpdk::EnsureEal(eal_args);
  if (!st.ok()) return st;
  if (rte_eth_dev_count_avail() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DPDK EAL found no ethdev ports (a --vdev may have failed to probe: "
        "see the EAL log above; no NIC bound to a DPDK driver?); EAL "
        "arguments: '", eal_args, "'"));
  }

  const std::vector<std::string>& specs = a.ports;
  std::vector<uint16_t> ids;
  if (specs.empty()) {
    uint16_t id;
    RTE_ETH_FOREACH_DEV(id) ids.push_back(id);
  } else {
    for (const auto& s : specs) {
      auto id = dpdk::FindPort(s);
      if (!id.ok()) return id.status();
      for (uint16_t seen : ids) {
        if (seen == *id) {
          return absl::InvalidArgumentError(absl::StrCat(
              "dpdk attr.ports names port '", s, "' twice"));
        }
      }
      ids.push_back(*id);
    }
  }

  // MTU: IPv4 + UDP headers + the engine's datagram.
  // A frame must fit one mbuf (a 16-bit data room, less the headroom) and
  // one IPv4 packet.
  constexpr uint32_t kMaxMtu = 65000;
  uint32_t mtu = a.mtu;
  bool set_mtu = a.mtu != 0;
  if (mtu == 0) {
    mtu = dpdk::OpenPort::PortMtu(ids[0]);
    if (mtu == 0) mtu = 1500;
    mtu = std::min<uint32_t>(mtu, 9000);
    // memif ports given big packet buffers ("bsize=", MemifMeshEalArgs's
    // buffer_size): frames up to the buffer size, so fewer packets (headers,
    // checksums, acks, pool and ring operations: 16 KiB frames made TAR over
    // memif 1.1-1.5x faster than 9 KiB ones at 4-64 MiB, 4 ranks). memif's
    // own MTU (1500) says nothing about its buffers, and frames longer than a
    // buffer take 22.11's chained-buffer path, which duplicated frames in our
    // runs: every rank must use the same bsize.
    uint32_t bsize = UINT32_MAX;
    for (uint16_t id : ids) bsize = std::min(bsize, dpdk::OpenPort::MemifBufferSize(id));
    if (bsize != UINT32_MAX && bsize > dpdk::kEthHeader + 1500) {
      mtu = std::max<uint32_t>(mtu, std::min<uint32_t>(kMaxMtu, bsize - dpdk::kEthHeader));
      set_mtu = true;
    }
  }
  const uint32_t overhead = dpdk::kIpv4Header + dpdk::kUdpHeader;
  if (mtu < overhead + kMinDatagram || mtu > kMaxMtu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dpdk mtu ", mtu, " is outside [", overhead + kMinDatagram, ", ", kMaxMtu,
        "]: it must hold the ", overhead,
        "-byte IPv4/UDP header plus a datagram of at least ", kMinDatagram,
        " bytes, and fit one mbuf and one IPv4 packet"));
  }

  std::unique_ptr<DpdkPacketIo> io(new DpdkPacketIo());
  io->max_datagram_ = mtu - overhead;
  io->udp_checksum_ = a.udp_checksum;

  // Rings: enough receive descriptors for a window of datagrams (the engine
  // sizes its window from what we can buffer), within sane bounds.
  // A mesh port serves one peer, and the engine shares its receive buffer
  // among all peers: split the window's frames across the ports.
  const uint64_t window_frames = std::max<uint64_t>(
      1, a.engine.window_bytes / io->max_datagram_ / ids.size());
  dpdk::PortRequest req;
  req.max_frame = mtu + dpdk::kEthHeader;
  req.mtu = set_mtu ? mtu : 0;
  req.rx_descriptors = a.rx_descriptors
                           ? a.rx_descriptors
                           : std::clamp<uint32_t>(NextPow2(window_frames), 512, 4096);
  req.tx_descriptors = a.tx_descriptors ? a.tx_descriptors : 1024;
  req.extra_mbufs = kTxBacklogFrames;
  for (uint16_t id : ids) {
    auto port = dpdk::OpenPort::Open(id, req);
    if (!port.ok()) return port.status();
    io->ports_.push_back(std::move(*port));
  }

  // The device's MAC: attr.mac, else the first port's, except for virtual
  // point-to-point ports whose MACs are not unique across processes (memif
  // gives every process the same "random" MAC, net_ring ports have none):
  // those get a random locally administered MAC.
  dpdk::Mac mac = io->ports_[0]->mac();
  if (!a.mac.empty()) {
    unsigned b[6];
    char tail;
    if (std::sscanf(a.mac.c_str(), "%x:%x:%x:%x:%x:%x%c", &b[0], &b[1], &b[2],
                    &b[3], &b[4], &b[5], &tail) != 6 ||
        (b[0] & 1) || b[0] > 255 || b[1] > 255 || b[2] > 255 || b[3] > 255 ||
        b[4] > 255 || b[5] > 255) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dpdk attr.mac '", a.mac, "' is not a unicast MAC like 02:00:00:00:00:01"));
    }
    for (int i = 0; i < 6; ++i) mac[i] = static_cast<uint8_t>(b[i]);
  } else if (MacKey(mac) == 0 || io->ports_[0]->host_shared_memory()) {
    std::random_device rd;
    for (auto& b : mac) b = static_cast<uint8_t>(rd());
    mac[0] = static_cast<uint8_t>((mac[0] & 0xFE) | 0x02);
  }
  io->self_.mac = mac;
  if (a.ipv4.empty()) {
    io->self_.ipv4_be = htonl((10u << 24) | (77u << 16) | (mac[4] << 8) | mac[5]);
  } else {
    in_addr in{};
    if (inet_pton(AF_INET, a.ipv4.c_str(), &in) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dpdk attr.ipv4 '", a.ipv4, "' is not an IPv4 address"));
    }
    io->self_.ipv4_be = in.s_addr;
  }
  const int number = g_device_number++;
  io->self_.port_be = htons(a.udp_port ? a.udp_port
                                       : static_cast<uint16_t>(17000 + number % 1000));
  io->self_.queue = 0;

  io->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (io->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  io->port_learned_.assign(io->ports_.size(), false);
  io->tx_stash_.resize(io->ports_.size());
  io->tx_backlog_.resize(io->ports_.size());
  io->queued_from_.resize(io->ports_.size());
  io->backlog_cap_ = a.tx_backlog;
  for (const auto& port : io->ports_) {
    io->tx_copies_.push_back(port->is_memif() && !a.tx_copy_bodies);
  }
  for (TxBacklog& b : io->tx_backlog_) b.ring.assign(kTxBacklogFrames, nullptr);
  for (size_t p = 0; p < io->ports_.size(); ++p) {
    // Twice the ring: the receiver's mapping is faulted in as it drains.
    io->primers_left_.push_back(io->ports_[p]->is_memif() ? 2 * kMemifRing : 0);
    io->priming_ = io->priming_ || io->primers_left_.back() > 0;
  }
  io->next_hello_.assign(io->ports_.size(), std::chrono::steady_clock::now());
  io->link_up_.assign(io->ports_.size(), false);
  io->link_lost_.assign(io->ports_.size(), false);
  for (const auto& port : io->ports_) {
    if (!port->is_memif() || io->gate_) continue;
    auto gate = dpdk::ControlGate::Get();
    if (!gate.ok()) return gate.status();
    io->gate_ = *gate;
  }
  if (io->ports_.size() > 1) io->SendHellos();
  return io;
}

DpdkPacketIo::~DpdkPacketIo() {
  for (TxBacklog& b : tx_backlog_) {
    for (; b.head != b.tail; ++b.head) rte_pktmbuf_free(b.ring[b.head % kTxBacklogFrames]);
  }
  for (Stash& st : tx_stash_) {
    if (st.next < st.n) rte_pktmbuf_free_bulk(st.m + st.next, st.n - st.next);
  }
  if (!rx_held_.empty()) {
    rte_pktmbuf_free_bulk(rx_held_.data(), static_cast<unsigned>(rx_held_.size()));
  }
  {
    // Stopping a memif port runs the PMD's disconnect: not beside its control handler.
    dpdk::ControlGate::Pass pass = gate_ ? gate_->Enter() : dpdk::ControlGate::Pass();
    ports_.clear();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

IoAddress DpdkPacketIo::LocalAddress() const { return dpdk::EncodeAddress(self_); }

std::string DpdkPacketIo::Describe() const {
  std::string names;
  for (const auto& p : ports_) absl::StrAppend(&names, names.empty() ? "" : ",", p->name());
  return absl::StrCat("dpdk [", names, "] ", dpdk::EndpointToString(self_),
                      " mtu ", max_datagram_ + dpdk::kIpv4Header + dpdk::kUdpHeader);
}

std::string DpdkPacketIo::AddressToString(const IoAddress& a) const {
  auto e = dpdk::DecodeAddress(a);
  if (!e.ok()) return "<not a dpdk address>";
  return dpdk::EndpointToString(*e);
}

absl::StatusOr<PeerHandle> DpdkPacketIo::ResolvePeer(const IoAddress& a) {
  auto e = dpdk::DecodeAddress(a);
  if (!e.ok()) return e.status();
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].mac == e->mac && peers_[i].ipv4_be == e->ipv4_be &&
        peers_[i].port_be == e->port_be && peers_[i].queue == e->queue) {
      return static_cast<PeerHandle>(i);
    }
  }
  peers_.push_back(*e);
  return static_cast<PeerHandle>(peers_.size() - 1);
}

size_t DpdkPacketIo::RxBufferBytes() const {
  size_t total = 0;
  for (const auto& p : ports_) {
    // memif rings hold 1024 frames by default whatever rxd says.
    const size_t frames = p->is_memif()
                              ? std::min<size_t>(p->rx_descriptors(), kMemifRing)
                              : p->rx_descriptors();
    total += frames * max_datagram_;
  }
  return total;
}

int DpdkPacketIo::RoutePort(const Endpoint& peer) const {
  if (ports_.size() == 1) return 0;
  auto it = mac_to_port_.find(MacKey(peer.mac));
  return it == mac_to_port_.end() ? -1 : it->second;
}

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

void DpdkPacketIo::SendPrimers() {
  bool left = false;
  for (size_t p = 0; p < ports_.size(); ++p) {
    if (primers_left_[p] == 0) continue;
    left = true;
    if (!Usable(p)) continue;
    rte_mbuf* m[32];
    const unsigned n = std::min<unsigned>(32, primers_left_[p]);
    if (rte_pktmbuf_alloc_bulk(ports_[p]->pool(), m, n) != 0) continue;
    const uint16_t len = static_cast<uint16_t>(dpdk::kFrameHeader + max_datagram_);
    bool built = true;
    for (unsigned i = 0; i < n && built; ++i) {
      auto* f = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m[i], len));
      if (f) dpdk::WriteHello(f, self_.mac);  // the rest of the frame is padding
      built = f != nullptr;
    }
    if (!built) {  // cannot happen: the pool's mbufs hold a whole frame; stop priming
      rte_pktmbuf_free_bulk(m, n);
      primers_left_[p] = 0;
      continue;
    }
    // Until the link is up memif takes nothing; the receiver drops hellos.
    const uint16_t sent = rte_eth_tx_burst(ports_[p]->id(), 0, m, static_cast<uint16_t>(n));
    if (sent < n) rte_pktmbuf_free_bulk(m + sent, n - sent);
    primers_left_[p] -= sent;
    Count(c_.hellos_sent, sent);
  }
  priming_ = left;
}

void DpdkPacketIo::SendHellos() {
  const auto now = std::chrono::steady_clock::now();
  for (size_t p = 0; p < ports_.size(); ++p) {
    if (now < next_hello_[p] || !Usable(p)) continue;
    next_hello_[p] = now + (port_learned_[p] ? std::chrono::duration_cast<
                                                   std::chrono::steady_clock::duration>(kHelloSlow)
                                             : kHelloFast);
    rte_mbuf* m = rte_pktmbuf_alloc(ports_[p]->pool());
    if (!m) continue;
    uint8_t* f = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, dpdk::kHelloFrame));
    if (!f) {
      rte_pktmbuf_free(m);
      continue;
    }
    dpdk::WriteHello(f, self_.mac);
    if (rte_eth_tx_burst(ports_[p]->id(), 0, &m, 1) == 1) {
      Count(c_.hellos_sent);
    } else {
      rte_pktmbuf_free(m);
    }
  }
}

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

void DpdkPacketIo::WaitForInput(std::chrono::microseconds timeout) {
  // Virtual and real ports have no file descriptor to wait on in general:
  // sleep (the engine grows the timeout while idle), but return at once on
  // Wake().
  if (timeout.count() <= 0) return;
  // Frames wait in a TX backlog for a ring to free up: come back soon (the
  // drain itself runs under the engine's lock, in RxBurst / TxBurst).
  if (backlog_frames_.load(std::memory_order_relaxed) > 0) {
    timeout = std::min(timeout, std::chrono::microseconds(20));
  }
  pollfd fd = {wake_fd_, POLLIN, 0};
  timespec ts;
  ts.tv_sec = timeout.count() / 1000000;
  ts.tv_nsec = (timeout.count() % 1000000) * 1000;
  if (ppoll(&fd, 1, &ts, nullptr) > 0) {
    uint64_t v;
    while (read(wake_fd_, &v, sizeof(v)) == sizeof(v)) {
    }
  }
}

dpdk::ControlGate::Pass DpdkPacketIo::OpenGate() {
  dpdk::ControlGate::Pass pass;
  if (gate_) pass = gate_->TryEnter();
  memif_open_ = !gate_ || static_cast<bool>(pass);
  return pass;
}

void DpdkPacketIo::WatchLinks() {
  for (size_t pi = 0; pi < ports_.size(); ++pi) {
    if (!ports_[pi]->is_memif() || !ports_[pi]->started()) continue;
    rte_eth_link link{};
    if (rte_eth_link_get_nowait(ports_[pi]->id(), &link) != 0) continue;
    if (link.link_status == RTE_ETH_LINK_UP) {
      link_up_[pi] = true;
      link_lost_[pi] = false;
      continue;
    }
    if (!link_up_[pi]) {
      // Connecting: the PMD's handshake runs in the interrupt thread, one message per
      // gate round at best; short rounds keep it well inside the client watchdog's
      // restart interval.
      gate_->NoteConnecting();
      continue;
    }
    link_up_[pi] = false;
    link_lost_[pi] = true;
    Count(c_.links_lost);
    // Frames still queued for the gone peer go nowhere.
    TxBacklog& b = tx_backlog_[pi];
    const uint32_t queued = b.size();
    for (; b.head != b.tail; ++b.head) rte_pktmbuf_free(b.ring[b.head % kTxBacklogFrames]);
    backlog_frames_.fetch_sub(queued, std::memory_order_relaxed);
    for (size_t h = 0; h < peers_.size(); ++h) {
      if (RoutePort(peers_[h]) == static_cast<int>(pi)) {  // one memif link, one peer
        unreachable_.push_back(static_cast<PeerHandle>(h));
      }
    }
  }
}

size_t DpdkPacketIo::TakeUnreachable(PeerHandle* out, size_t max) {
  const size_t n = std::min(max, unreachable_.size());
  std::copy(unreachable_.begin(), unreachable_.begin() + n, out);
  unreachable_.erase(unreachable_.begin(), unreachable_.begin() + n);
  return n;
}

std::string DpdkPacketIo::UnreachableCause() const {
  return "its memif link went down (its process closed the link or is gone)";
}

bool DpdkPacketIo::ProtectsPayload() const {
  if (ports_.empty()) return false;
  for (const auto& port : ports_) {
    if (!port->host_shared_memory()) return false;
  }
  return true;
}

void DpdkPacketIo::Wake() {
  uint64_t one = 1;
  ssize_t r = write(wake_fd_, &one, sizeof(one));
  (void)r;
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

DpdkPacketIo::Counters DpdkPacketIo::AtomicCounters::Snapshot() const {
  Counters snapshot;
  OPTIREDUCE_DPDK_IO_COUNTERS(OPTIREDUCE_COUNTER_SNAPSHOT)
  for (int i = 0; i < static_cast<int>(Verdict::kCount); ++i) {
    snapshot.rx_dropped[i] = CounterValue(rx_dropped[i]);
    snapshot.rx_dropped_total += snapshot.rx_dropped[i];
  }
  return snapshot;
}

DpdkPacketIo::Counters DpdkPacketIo::counters() const { return c_.Snapshot(); }

std::string DpdkPacketIo::CountersString() const {
  Counters c = counters();
  std::string s = absl::StrCat("tx ", c.tx_frames, " (flooded ", c.tx_flooded,
                               ", backpressure ", c.tx_backpressure, ", deferred ",
                               c.tx_deferred, ", zero-copy ", c.tx_zero_copy,
                               ", linearized ", c.tx_linearized, "), rx ",
                               c.rx_frames, " delivered ", c.rx_delivered,
                               ", hellos ", c.hellos_sent, "/", c.hellos_received,
                               ", memif links lost ", c.links_lost);
  for (const auto& p : ports_) {
    if (p->restarts()) absl::StrAppend(&s, ", ", p->name(), " restarts ", p->restarts());
  }
  for (int i = 0; i < static_cast<int>(Verdict::kCount); ++i) {
    if (c.rx_dropped[i]) {
      absl::StrAppend(&s, ", ", dpdk::VerdictName(static_cast<Verdict>(i)), " ",
                      c.rx_dropped[i]);
    }
  }
  return s;
}

}  // namespace transport
}  // namespace optireduce
