// stats.h — counters of one device's engine, readable at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "transport_dpdk/wire_format.h"

namespace optireduce {
namespace transport {

// A plain snapshot; see Engine::GetStats / Device::stats().
struct Stats {
  uint64_t tx_packets = 0, tx_bytes = 0, tx_backpressure = 0;
  uint64_t rx_packets = 0, rx_bytes = 0;
  // fast_retransmits: packets found lost by the ack clock (RACK), not an RTO.
  uint64_t retransmits = 0, rto_events = 0, fast_retransmits = 0;
  uint64_t retransmitted_bytes = 0;  // payload bytes resent
  uint64_t tlp_probes = 0;           // tail-loss probes
  uint64_t spurious_retransmits = 0; // resends the receiver reported duplicate
  uint64_t duplicates = 0;        // seq already received (re-acked)
  uint64_t acks_sent = 0, acks_received = 0;
  uint64_t eager_messages = 0, rendezvous_messages = 0;
  // Drops, by reason. None of these ever touch user memory.
  uint64_t malformed[static_cast<int>(ParseError::kCount)] = {};  // by ParseError
  uint64_t bad_checksum = 0;      // also counted in malformed[kBadChecksum]
  uint64_t bad_token = 0;         // session token of another job
  uint64_t bad_context = 0;       // no such context on this device
  uint64_t bad_rank = 0;          // src/dst rank unknown or not connected
  uint64_t bad_offset = 0;        // data outside the message or the target
  uint64_t unknown_message = 0;   // message id/slot/kind that does not match
  uint64_t out_of_window = 0;     // seq beyond the receive window
  uint64_t unsupported = 0;       // packets of a kind this context cannot take
  uint64_t failed_context = 0;    // for a context that failed (peer gone, timeout)
  // Datagrams that arrived before their sender was connected: kept and applied
  // once it is, or dropped beyond the bound (the sender retransmits them).
  uint64_t early_kept = 0, early_dropped = 0;
  // Bounded service (OptiReduce mode).
  uint64_t bounded_tx_packets = 0, bounded_rx_packets = 0;
  uint64_t repair_requests_sent = 0, repair_requests_received = 0;
  uint64_t repair_absent_sent = 0, repair_absent_received = 0;  // "cannot serve" answers
  // Peer liveness: probes and answers, ICMP port-unreachable reports mapped to a
  // peer, peers declared gone, contexts failed (by a gone peer or a timed-out wait).
  uint64_t pings_sent = 0, pongs_received = 0;
  uint64_t peers_unreachable = 0, peers_dead = 0, contexts_failed = 0;
  // Bounded packets the device refused (TX backpressure) and that were sent again later.
  uint64_t bounded_tx_deferred = 0;
  // Repair requests folded into one already queued for the same operation; dropped: the
  // queue of repairs for a peer was full.
  uint64_t repair_requests_merged = 0, repair_requests_dropped = 0;
  // Progress thread: sleeps (WaitForInput calls); sleeps that ended early and found input
  // (woken by the datagram's arrival); sleeps that ran to their timeout and then found
  // input (it waited for the timer: only backends without input wake-ups should have many).
  uint64_t progress_sleeps = 0, sleeps_woken_by_input = 0, late_inputs = 0;
  // Destroyed contexts released once every peer confirmed it needs nothing more from them
  // (close probe answered), and those released only after the quiet-linger or its cap.
  uint64_t closes_confirmed = 0, closes_lingered = 0;
  uint64_t TotalDropped() const;
  std::string ToString() const;
};

// The engine's live counters (relaxed atomics: written by the progress
// thread, read by anyone).
struct AtomicStats {
  std::atomic<uint64_t> tx_packets{0}, tx_bytes{0}, tx_backpressure{0};
  std::atomic<uint64_t> rx_packets{0}, rx_bytes{0};
  std::atomic<uint64_t> retransmits{0}, rto_events{0}, fast_retransmits{0};
  std::atomic<uint64_t> retransmitted_bytes{0}, tlp_probes{0}, spurious_retransmits{0};
  std::atomic<uint64_t> duplicates{0}, acks_sent{0}, acks_received{0};
  std::atomic<uint64_t> eager_messages{0}, rendezvous_messages{0};
  std::atomic<uint64_t> malformed[static_cast<int>(ParseError::kCount)] = {};
  std::atomic<uint64_t> bad_token{0}, bad_context{0}, bad_rank{0};
  std::atomic<uint64_t> bad_offset{0}, unknown_message{0}, out_of_window{0};
  std::atomic<uint64_t> unsupported{0}, failed_context{0};
  std::atomic<uint64_t> early_kept{0}, early_dropped{0};
  std::atomic<uint64_t> bounded_tx_packets{0}, bounded_rx_packets{0};
  std::atomic<uint64_t> repair_requests_sent{0}, repair_requests_received{0};
  std::atomic<uint64_t> repair_absent_sent{0}, repair_absent_received{0};
  std::atomic<uint64_t> pings_sent{0}, pongs_received{0};
  std::atomic<uint64_t> peers_unreachable{0}, peers_dead{0}, contexts_failed{0};
  std::atomic<uint64_t> bounded_tx_deferred{0};
  std::atomic<uint64_t> repair_requests_merged{0}, repair_requests_dropped{0};
  std::atomic<uint64_t> progress_sleeps{0}, sleeps_woken_by_input{0}, late_inputs{0};
  std::atomic<uint64_t> closes_confirmed{0}, closes_lingered{0};
  Stats Snapshot() const;
};

inline void Bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
  c.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace transport
}  // namespace optireduce
