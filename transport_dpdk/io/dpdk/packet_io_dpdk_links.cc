// packet_io_dpdk_links.cc — DpdkPacketIo's links to peers: the mesh route of a
// peer (learned MAC -> port), link hellos and memif ring priming, the control gate
// around memif use, and memif links going down reported as unreachable peers.
#include "transport_dpdk/io/dpdk/packet_io_dpdk.h"

#include <algorithm>
#include <cstring>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

namespace optireduce {
namespace transport {
namespace {

constexpr auto kHelloFast = std::chrono::milliseconds(10);
constexpr auto kHelloSlow = std::chrono::seconds(1);

}  // namespace

uint64_t DpdkPacketIo::MacKey(const dpdk::Mac& m) {
  uint64_t k = 0;
  std::memcpy(&k, m.data(), 6);
  return k;
}

int DpdkPacketIo::RoutePort(const Endpoint& peer) const {
  if (ports_.size() == 1) return 0;
  auto it = mac_to_port_.find(MacKey(peer.mac));
  return it == mac_to_port_.end() ? -1 : it->second;
}

bool DpdkPacketIo::LinkComingUp(PeerHandle peer) const {
  if (peer >= peers_.size()) return false;
  // A memif link's set-up: the PMD's handshake, then both sides' primer frames, which
  // take seconds with big buffers on a loaded host (the engine's first packets queue
  // behind them). A lost link's peer is gone: not coming up.
  const auto now = std::chrono::steady_clock::now();
  auto coming = [&](size_t pi) {
    return ports_[pi]->is_memif() && !link_lost_[pi] &&
           (!link_up_[pi] || primers_left_[pi] > 0 || now - last_primer_rx_[pi] < kPrimerHeard);
  };
  const int port = RoutePort(peers_[peer]);
  if (port >= 0) return coming(static_cast<size_t>(port));
  for (size_t pi = 0; pi < ports_.size(); ++pi) {
    if (coming(pi)) return true;  // its link is not known yet: any link still coming up
  }
  return false;
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
      // restart interval. Only for a link that never came up and for a while after the
      // device started: a lost link's peer is gone, and a peer that never answers must
      // not keep the interrupt thread waking every round (idle CPU).
      if (!link_lost_[pi] && std::chrono::steady_clock::now() - created_ < kConnectBoostFor) {
        gate_->NoteConnecting();
      }
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

size_t DpdkPacketIo::TakeUnreachable(UnreachableReport* out, size_t max) {
  const size_t n = std::min(max, unreachable_.size());
  for (size_t i = 0; i < n; ++i) {
    out[i] = UnreachableReport{};
    out[i].peer = unreachable_[i];
    out[i].link_down = true;  // this rank's own memif link went down
  }
  unreachable_.erase(unreachable_.begin(), unreachable_.begin() + n);
  return n;
}

std::string DpdkPacketIo::UnreachableCause() const {
  return "its memif link went down (its process closed the link or is gone)";
}

}  // namespace transport
}  // namespace optireduce
