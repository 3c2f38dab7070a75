// packet_io_dpdk.cc — DpdkPacketIo's setup and bookkeeping: opening the ports
// (MTU, ring sizes, MAC and IPv4 address), teardown, peer addresses, and the
// counters. Frames go out in packet_io_dpdk_tx.cc, come in in
// packet_io_dpdk_rx.cc; mesh routing and memif links: packet_io_dpdk_links.cc.
#include "transport_dpdk/io/dpdk/packet_io_dpdk.h"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"

namespace optireduce {
namespace transport {
namespace {

using dpdk::Verdict;

// Frames a memif ring holds (the PMD's default, log2_ring_size=10).
constexpr uint32_t kMemifRing = 1024;
// A memif port's mempool with big frames, at most (see RingRequest).
constexpr uint64_t kMemifPoolBytes = 64ull << 20;
constexpr uint32_t kMinDatagram = 256;

uint32_t NextPow2(uint64_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 20)) p <<= 1;
  return p;
}

std::atomic<int> g_device_number{0};

// A frame must fit one mbuf (a 16-bit data room, less the headroom) and one IPv4 packet.
constexpr uint32_t kMaxMtu = 65000;
constexpr uint32_t kIpUdpOverhead = dpdk::kIpv4Header + dpdk::kUdpHeader;

// The device's ethdev ports: attr.ports (by name or index, each once), else every port
// the EAL probed.
absl::StatusOr<std::vector<uint16_t>> PortIds(const dpdk::attr& a) {
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
  return ids;
}

// The IP MTU (IPv4 + UDP headers + the engine's datagram): attr.mtu, else the first port's
// (or the memif buffers'). *set_mtu: the ports are to be configured to it.
absl::StatusOr<uint32_t> ChooseMtu(const dpdk::attr& a, const std::vector<uint16_t>& ids,
                                   bool* set_mtu) {
  uint32_t mtu = a.mtu;
  *set_mtu = a.mtu != 0;
  if (mtu == 0) {
    mtu = dpdk::OpenPort::PortMtu(ids[0]);
    if (mtu == 0) mtu = 1500;
    mtu = std::min<uint32_t>(mtu, 9000);
    // memif ports given big packet buffers ("bsize=", MemifMeshEalArgs's
    // buffer_size): frames up to the buffer size, so fewer packets (headers,
    // checksums, acks, pool and ring operations per byte). memif's own MTU
    // (1500) says nothing about its buffers, and a frame longer than a buffer
    // takes 22.11's chained-buffer path, which can duplicate frames: every rank
    // must use the same bsize.
    uint32_t bsize = UINT32_MAX;
    for (uint16_t id : ids) bsize = std::min(bsize, dpdk::OpenPort::MemifBufferSize(id));
    if (bsize != UINT32_MAX && bsize > dpdk::kEthHeader + 1500) {
      mtu = std::max<uint32_t>(mtu, std::min<uint32_t>(kMaxMtu, bsize - dpdk::kEthHeader));
      *set_mtu = true;
    }
  }
  if (mtu < kIpUdpOverhead + kMinDatagram || mtu > kMaxMtu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dpdk mtu ", mtu, " is outside [", kIpUdpOverhead + kMinDatagram, ", ", kMaxMtu,
        "]: it must hold the ", kIpUdpOverhead,
        "-byte IPv4/UDP header plus a datagram of at least ", kMinDatagram,
        " bytes, and fit one mbuf and one IPv4 packet"));
  }
  return mtu;
}

// What each port is opened with (frame size, MTU, ring sizes, mbufs for the TX backlog),
// and the TX backlog's cap in frames (*backlog_cap, from attr.tx_backlog).
dpdk::PortRequest RingRequest(const dpdk::attr& a, const std::vector<uint16_t>& ids,
                              uint32_t mtu, bool set_mtu, uint32_t max_datagram,
                              size_t window_bytes, uint32_t* backlog_cap) {
  // Rings: enough receive descriptors for a window of datagrams (the engine
  // sizes its window from what we can buffer), within sane bounds.
  // A mesh port serves one peer, and the engine shares its receive buffer
  // among all peers: split the window's frames across the ports.
  const uint64_t window_frames = std::max<uint64_t>(
      1, window_bytes / max_datagram / ids.size());
  dpdk::PortRequest req;
  req.max_frame = mtu + dpdk::kEthHeader;
  req.mtu = set_mtu ? mtu : 0;
  req.rx_descriptors = a.rx_descriptors
                           ? a.rx_descriptors
                           : std::clamp<uint32_t>(NextPow2(window_frames), 512, 4096);
  req.tx_descriptors = a.tx_descriptors ? a.tx_descriptors : 1024;
  *backlog_cap = a.tx_backlog;
  // memif ports given big buffers: their rings are slots of the link's shared memory
  // (1024 a direction), whatever rxd/txd say, and our mempool holds only the frames
  // between the PMD and the engine (received ones are copied out of the ring into
  // mbufs) and the TX backlog. Counted in frames as for a NIC, a pool of 64 KiB frames
  // would take ~270 MiB per link; kMemifPoolBytes bounds it, the backlog taking what
  // is left (at most a quarter of the pool, so a full backlog never starves the
  // receive side).
  bool memif_buffers = !a.rx_descriptors && !a.tx_descriptors;
  for (uint16_t id : ids) memif_buffers = memif_buffers && dpdk::OpenPort::MemifBufferSize(id) > 0;
  if (memif_buffers) {
    const uint64_t room = req.max_frame + RTE_PKTMBUF_HEADROOM;
    const uint64_t frames = std::max<uint64_t>(1536 + 256, kMemifPoolBytes / room);
    if (req.rx_descriptors + req.tx_descriptors + 512 + *backlog_cap > frames) {
      req.rx_descriptors = req.tx_descriptors = 512;
      *backlog_cap = static_cast<uint32_t>(
          std::clamp<uint64_t>(std::min<uint64_t>(frames / 4, frames - 1536), 32, *backlog_cap));
    }
  }
  req.extra_mbufs = *backlog_cap;
  return req;
}

// attr.mac ("02:00:00:00:00:01", unicast) into *mac.
absl::Status ParseMac(const std::string& text, dpdk::Mac* mac) {
  unsigned b[6];
  char tail;
  if (std::sscanf(text.c_str(), "%x:%x:%x:%x:%x:%x%c", &b[0], &b[1], &b[2],
                  &b[3], &b[4], &b[5], &tail) != 6 ||
      (b[0] & 1) || b[0] > 255 || b[1] > 255 || b[2] > 255 || b[3] > 255 ||
      b[4] > 255 || b[5] > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dpdk attr.mac '", text, "' is not a unicast MAC like 02:00:00:00:00:01"));
  }
  for (int i = 0; i < 6; ++i) (*mac)[i] = static_cast<uint8_t>(b[i]);
  return absl::OkStatus();
}

// The device's IPv4 address (network order): attr.ipv4, else 10.77.<mac[4]>.<mac[5]>.
absl::StatusOr<uint32_t> Ipv4Of(const dpdk::attr& a, const dpdk::Mac& mac) {
  if (a.ipv4.empty()) return htonl((10u << 24) | (77u << 16) | (mac[4] << 8) | mac[5]);
  in_addr in{};
  if (inet_pton(AF_INET, a.ipv4.c_str(), &in) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dpdk attr.ipv4 '", a.ipv4, "' is not an IPv4 address"));
  }
  return in.s_addr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DpdkPacketIo>> DpdkPacketIo::Create(
    const dpdk::attr& a, size_t window_bytes) {
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
  auto ids = PortIds(a);
  if (!ids.ok()) return ids.status();
  bool set_mtu = false;
  auto mtu = ChooseMtu(a, *ids, &set_mtu);
  if (!mtu.ok()) return mtu.status();

  std::unique_ptr<DpdkPacketIo> io(new DpdkPacketIo());
  io->max_datagram_ = *mtu - kIpUdpOverhead;
  io->udp_checksum_ = a.udp_checksum;
  uint32_t backlog_cap = 0;
  const dpdk::PortRequest req =
      RingRequest(a, *ids, *mtu, set_mtu, io->max_datagram_, window_bytes, &backlog_cap);
  for (uint16_t id : *ids) {
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
    if (absl::Status parsed = ParseMac(a.mac, &mac); !parsed.ok()) return parsed;
  } else if (MacKey(mac) == 0 || io->ports_[0]->host_shared_memory()) {
    std::random_device rd;
    for (auto& b : mac) b = static_cast<uint8_t>(rd());
    mac[0] = static_cast<uint8_t>((mac[0] & 0xFE) | 0x02);
  }
  io->self_.mac = mac;
  auto ipv4 = Ipv4Of(a, mac);
  if (!ipv4.ok()) return ipv4.status();
  io->self_.ipv4_be = *ipv4;
  const int number = g_device_number++;
  io->self_.port_be = htons(a.udp_port ? a.udp_port
                                       : static_cast<uint16_t>(17000 + number % 1000));
  io->self_.queue = 0;

  io->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (io->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  io->waiter_wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (io->waiter_wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  io->port_learned_.assign(io->ports_.size(), false);
  io->tx_stash_.resize(io->ports_.size());
  io->tx_backlog_.resize(io->ports_.size());
  io->queued_from_.resize(io->ports_.size());
  io->backlog_cap_ = backlog_cap;
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
  io->last_primer_rx_.assign(io->ports_.size(), std::chrono::steady_clock::time_point{});
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
  if (waiter_wake_fd_ >= 0) close(waiter_wake_fd_);
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

bool DpdkPacketIo::ProtectsPayload() const {
  if (ports_.empty()) return false;
  for (const auto& port : ports_) {
    if (!port->host_shared_memory()) return false;
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
