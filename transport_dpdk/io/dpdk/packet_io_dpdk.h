// packet_io_dpdk.h — the DPDK poll-mode backend: engine datagrams as UDP
// payloads in Ethernet/IPv4/UDP frames on one or several ethdev ports.
//
// One port (a NIC, af_packet on a bridged veth): every peer is reached
// through it. Several ports: a point-to-point mesh (one memif / net_ring
// link per peer); all ports send with the device's MAC (the first port's),
// the port reaching a peer is learned from the source MAC of frames received
// on it (link hellos speed that up) and frames to a peer not yet learned are
// flooded on every port (the wrong receivers drop them by MAC).
//
// Methods by job: packet_io_dpdk.cc (setup, addresses, counters),
// packet_io_dpdk_tx.cc (frames out, TX backlog), packet_io_dpdk_rx.cc (frames in,
// waiting for input), packet_io_dpdk_links.cc (mesh routes, hellos, memif links).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/counter_list.h"
#include "transport_dpdk/dpdk_attr.h"
#include "transport_dpdk/io/dpdk/dpdk_control_gate.h"
#include "transport_dpdk/io/dpdk/dpdk_frame.h"
#include "transport_dpdk/io/dpdk/dpdk_port.h"
#include "transport_dpdk/io/packet_io.h"

struct rte_mbuf;

// DpdkPacketIo's counters, by name (see counter_list.h); drops by Verdict are counted
// apart (rx_dropped).
#define OPTIREDUCE_DPDK_IO_COUNTERS(X)                                      \
  X(tx_frames)       /* datagrams handed to a port */                       \
  X(tx_backpressure) /* datagrams refused (backlog full / pool empty) */    \
  X(tx_deferred)     /* frames that waited in a port's backlog */           \
  X(tx_zero_copy)    /* frames whose body the PMD copied from the caller */ \
  X(tx_linearized)   /* of those, copied by us to wait in a backlog */      \
  X(tx_flooded)      /* datagrams sent on every mesh port */                \
  X(rx_frames)       /* frames received (all kinds) */                      \
  X(rx_delivered)    /* datagrams handed to the engine */                   \
  X(hellos_sent) X(hellos_received)                                   \
  X(links_lost)      /* memif links seen going down after being up */

namespace optireduce {
namespace transport {

class DpdkPacketIo : public PacketIo, public IoWaits {
 public:
  // Initialises the EAL if needed (see dpdk_eal.h) and opens the ports. window_bytes is
  // the engine's per-peer window (EngineOptions::window_bytes): the receive rings are
  // sized to hold it (unless attr.rx_descriptors is set).
  static absl::StatusOr<std::unique_ptr<DpdkPacketIo>> Create(
      const dpdk::attr& attr, size_t window_bytes);
  ~DpdkPacketIo() override;

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
  // Waiter-driven receive (engine_waiter.cc): ports still have no input wake-up, so the
  // polling user thread sleeps for its own backoff and only WakeWaiter() ends that early;
  // the progress thread meanwhile waits for Wake() only.
  void WaitForWake(std::chrono::microseconds timeout) override;
  void WaitAsWaiter(std::chrono::microseconds timeout) override;
  void WakeWaiter() override;
  // Host shared-memory ports (net_memif, net_ring) only: frames on a wire or
  // through a kernel interface carry no UDP checksum of ours.
  bool ProtectsPayload() const override;
  // Peers behind a memif link that went down after it was up: the peer's
  // process closed the link or is gone (the PMD saw its control socket close).
  // A single shared port (NIC, af_packet) reports nothing: its link going down
  // says nothing about one peer, and a flap must not fail a job (Gloo's TCP
  // survives one); the engine's probes judge those peers.
  size_t TakeUnreachable(UnreachableReport* out, size_t max) override;
  std::string UnreachableCause() const override;

  struct Counters {
    OPTIREDUCE_DPDK_IO_COUNTERS(OPTIREDUCE_COUNTER_FIELD)
    uint64_t rx_dropped[static_cast<int>(dpdk::Verdict::kCount)] = {};
    uint64_t rx_dropped_total = 0;
  };
  // Safe from any thread (a relaxed snapshot).
  Counters counters() const;
  std::string CountersString() const;

  const dpdk::Endpoint& self() const { return self_; }
  size_t port_count() const { return ports_.size(); }
  // Bytes the receive rings can hold (for the engine's incast window).
  size_t RxBufferBytes() const;
  // Frames a port's software transmit backlog holds (see TxBacklog).
  static constexpr unsigned kTxBacklogFrames = 2048;
  // Test hook: sends a raw frame on port `index` (no framing, no checks).
  bool SendRawFrame(size_t index, const uint8_t* frame, size_t len);
  bool LinkComingUp(PeerHandle peer) const override;
  // A primer from a link's peer this recent says it is still setting up its side.
  static constexpr std::chrono::milliseconds kPrimerHeard{100};

 private:
  using Endpoint = dpdk::Endpoint;
  DpdkPacketIo() = default;
  static uint64_t MacKey(const dpdk::Mac& m);
  int RoutePort(const Endpoint& peer) const;
  // zero_copy_body: the frame's second segment points at d.body (an external
  // buffer) instead of holding a copy; only for ports whose PMD copies frames
  // out in rte_eth_tx_burst (see tx_copies_), and such frames never outlive
  // TxBurst (LinearizeUnsent).
  rte_mbuf* BuildFrame(size_t port, const TxDatagram& d, const Endpoint& dst,
                       bool zero_copy_body = false);
  // An mbuf from the port's pool, taken in bulk (one pool operation per
  // burst: the pool has no per-thread cache for non-EAL threads).
  rte_mbuf* TakeMbuf(size_t port);
  void SendHellos();
  void Count(std::atomic<uint64_t>& c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  std::vector<std::unique_ptr<dpdk::OpenPort>> ports_;
  Endpoint self_;
  uint32_t max_datagram_ = 0;
  bool udp_checksum_ = true;
  // Per port: its PMD copies each frame out before rte_eth_tx_burst returns
  // (net_memif, into the shared ring), so a frame's body may point at the
  // engine's memory for the duration of TxBurst: our own copy of it is saved.
  // net_ring hands the mbuf itself to the peer, and NIC PMDs DMA later: never.
  std::vector<bool> tx_copies_;
  std::vector<uint32_t> queued_from_;  // per port: backlog tail when TxBurst began
  uint16_t ip_id_ = 0;
  // A wait's timeout, at most 20 µs while frames sit in the TX backlog.
  std::chrono::microseconds BoundByBacklog(std::chrono::microseconds timeout) const;
  int wake_fd_ = -1;         // Wake(): the progress thread
  int waiter_wake_fd_ = -1;  // WakeWaiter(): a user thread in WaitAsWaiter
  std::vector<Endpoint> peers_;  // by PeerHandle
  absl::flat_hash_map<uint64_t, int> mac_to_port_;  // learned (mesh only)
  std::vector<bool> port_learned_;
  // Per memif port: full-size hello frames still to send once the link is up.
  // They cycle through every buffer of the shared ring, so both processes
  // fault its pages in now, not in the middle of the first transfers (each
  // 4 KiB page of the ring, 1024 buffers a direction, costs a minor fault).
  std::vector<uint32_t> primers_left_;
  // Per port: when the peer's last primer arrived (its side of the set-up). Not plain
  // hellos: those also recur on a link in use.
  std::vector<std::chrono::steady_clock::time_point> last_primer_rx_;
  bool priming_ = false;
  void SendPrimers();
  std::vector<std::chrono::steady_clock::time_point> next_hello_;
  std::vector<rte_mbuf*> rx_held_;  // delivered by the last RxBurst
  struct Stash {
    rte_mbuf* m[32];
    unsigned n = 0, next = 0;
  };
  std::vector<Stash> tx_stash_;  // per port
  // Per port: built frames the port's TX ring did not take yet, sent first
  // (in order) on the next TxBurst / RxBurst. A full memif ring (the peer is
  // slower) or a busy af_packet ring then costs a short wait instead of a
  // loss the engine would have to detect and retransmit, and a full link to
  // one peer no longer refuses the datagrams behind it for other peers.
  struct TxBacklog {
    std::vector<rte_mbuf*> ring;  // kTxBacklogFrames slots
    uint32_t head = 0, tail = 0;  // free-running; size = tail - head
    uint32_t size() const { return tail - head; }
  };
  std::vector<TxBacklog> tx_backlog_;
  std::atomic<uint32_t> backlog_frames_{0};  // all ports (read by WaitForInput)
  uint32_t backlog_cap_ = kTxBacklogFrames;  // attr.tx_backlog, 32..2048
  // Sends what port `pi`'s backlog holds, as far as its ring takes it.
  void DrainBacklog(size_t pi);
  void DrainBacklogs();
  // Frames queued since backlog position `from` that still wait and point at
  // the caller's memory get their own copy (TxBurst keeps no pointers).
  void LinearizeUnsent(size_t pi, uint32_t from);
  // Queues a built frame on port `pi` (drains first when full); false if
  // the backlog stays full (the frame is not taken).
  bool Enqueue(size_t pi, rte_mbuf* m);
  // memif ports are used only while this process's EAL interrupt thread is held
  // in the control gate (dpdk_control_gate.h): the PMD tears a link down there.
  // Null when no port is a memif.
  dpdk::ControlGate* gate_ = nullptr;
  bool memif_open_ = false;  // this call holds a gate pass (or there is no gate)
  bool Usable(size_t pi) const {
    return ports_[pi]->started() && !link_lost_[pi] && (memif_open_ || !ports_[pi]->is_memif());
  }
  // Opens the gate for one datapath call (TxBurst, RxBurst, SendRawFrame).
  dpdk::ControlGate::Pass OpenGate();
  // Per memif port: its link was up / went down since (the peer is gone). A
  // memif client port that its watchdog brings up again counts as up again.
  std::vector<bool> link_up_, link_lost_;
  // When the device was made, and how long after it a memif link that is still connecting
  // gets the control gate's short rounds (WatchLinks).
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  static constexpr std::chrono::seconds kConnectBoostFor{30};
  std::vector<PeerHandle> unreachable_;  // for TakeUnreachable
  // Notes memif links that went down (under the gate): their peers become
  // unreachable and the frames queued for them are dropped.
  void WatchLinks();
  std::vector<std::vector<uint8_t>> rx_linear_;  // multi-segment frames
  size_t rx_next_port_ = 0;

  struct AtomicCounters {
    OPTIREDUCE_DPDK_IO_COUNTERS(OPTIREDUCE_ATOMIC_COUNTER_FIELD)
    std::atomic<uint64_t> rx_dropped[static_cast<int>(dpdk::Verdict::kCount)] = {};
    Counters Snapshot() const;
  } c_;
};

}  // namespace transport
}  // namespace optireduce
