// stats.h — counters of one device's engine, readable at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/counter_list.h"
#include "transport_dpdk/wire/wire_format.h"

namespace optireduce {
namespace transport {

// The engine's counters, by name (see counter_list.h). Drops, by reason, never touch user
// memory; malformed datagrams are counted by ParseError in `malformed` (below).
#define OPTIREDUCE_ENGINE_COUNTERS(X)                                                    \
  X(tx_packets) X(tx_bytes) X(tx_backpressure)                                           \
  X(rx_packets) X(rx_bytes)                                                              \
  /* fast_retransmits: packets found lost by the ack clock (RACK), not an RTO. */        \
  X(retransmits) X(rto_events) X(fast_retransmits)                                       \
  X(retransmitted_bytes)  /* payload bytes resent */                                     \
  X(tlp_probes)           /* tail-loss probes */                                         \
  X(spurious_retransmits) /* resends the receiver reported duplicate */                  \
  X(spurious_rtos)        /* RTOs the next ack proved unneeded (undone) */             \
  /* Acks that ended a silence of at least the RTO floor with packets outstanding, */ \
  /* and the summed length of those silences (time recovery waited on a timer). */   \
  X(long_silences) X(long_silence_us)                                                   \
  X(duplicates)           /* seq already received (re-acked) */                          \
  X(acks_sent) X(acks_received)                                                          \
  /* Acks carried in a sequenced packet that was going out anyway instead of an ACK */   \
  /* of their own; piggybacked acks taken from the peer's packets. */                   \
  X(acks_piggybacked) X(piggybacked_acks_received)                                      \
  X(eager_messages) X(rendezvous_messages)                                               \
  X(withdrawn_messages) /* peers' sends dropped unmatched at their sender's kWithdraw */  \
  X(bad_token)       /* session token of another job */                                  \
  X(bad_context)     /* no such context on this device */                                \
  X(bad_rank)        /* src/dst rank unknown or not connected */                         \
  X(bad_offset)      /* data outside the message or the target */                        \
  X(unknown_message) /* message id/slot/kind that does not match */                      \
  X(out_of_window)   /* seq beyond the receive window */                                 \
  X(unsupported)     /* packets of a kind this context cannot take */                    \
  X(failed_context)  /* for a context that failed (peer gone, timeout) */                \
  /* Datagrams that arrived before their sender was connected: kept and applied once */ \
  /* it is, or dropped beyond the bound (the sender retransmits them). */                \
  X(early_kept) X(early_dropped)                                                         \
  /* Bounded service (OptiReduce mode). */                                               \
  X(bounded_tx_packets) X(bounded_rx_packets)                                            \
  X(repair_requests_sent) X(repair_requests_received)                                    \
  X(repair_absent_sent) X(repair_absent_received) /* "cannot serve" answers */           \
  /* A deputy's requests for a late leader's decision, and the leaders' answers. */       \
  X(cede_asks_sent) X(cede_asks_received) X(cede_granted) X(cede_answers_received)       \
  /* Peer liveness: probes and answers, unreachable reports that proved a peer gone */   \
  /* (a memif link down, ICMP quoting a datagram sent to it and in flight) and those */    \
  /* that proved nothing (forged, or quoting too little: the peer is probed instead), */   \
  /* peers declared gone, contexts failed (by a gone peer or a timed-out wait). */         \
  X(pings_sent) X(pongs_received)                                                        \
  X(peers_unreachable) X(unreachable_unproven)                                           \
  X(peers_dead) X(contexts_failed)                                                       \
  /* Bounded packets the device refused (TX backpressure) and that were sent again. */   \
  X(bounded_tx_deferred)                                                                 \
  /* Repair requests folded into one already queued for the same operation; dropped: */ \
  /* the queue of repairs for a peer was full. */                                        \
  X(repair_requests_merged) X(repair_requests_dropped)                                   \
  /* Repair requests whose ranges were empty or inverted, or over the per-request */    \
  /* limit: those ranges are dropped (wire_format's ParseRepairRanges). */              \
  X(repair_ranges_empty) X(repair_ranges_over_limit)                                   \
  /* Progress thread: rounds of its loop (each polls the device once); sleeps */       \
  /* (WaitForInput calls); sleeps that ended early and found input (woken by the */    \
  /* datagram's arrival); sleeps that ran to their timeout and then found input */     \
  /* (only backends without input wake-ups should have many). */                       \
  X(progress_polls) X(progress_sleeps) X(sleeps_woken_by_input) X(late_inputs)         \
  /* Polls of a spin (no sleep after them) that found nothing and yielded the core. */ \
  X(progress_yields)                                                                    \
  /* Waiter-driven receive (engine_waiter.cc): polls of the device by a user thread */  \
  /* that waits for a completion, and the datagrams those polls received (each one */   \
  /* needed no hand-off from the progress thread). */                                  \
  X(waiter_polls) X(rx_by_waiter)                                                       \
  /* Destroyed contexts released once every peer confirmed it needs nothing more */    \
  /* from them (close probe answered), and those released only after the quiet */      \
  /* linger or its cap; the close probes sent. */                                     \
  X(closes_confirmed) X(closes_lingered) X(close_probes_sent)

// A plain snapshot; see Engine::GetStats / Device::stats().
struct Stats {
  OPTIREDUCE_ENGINE_COUNTERS(OPTIREDUCE_COUNTER_FIELD)
  uint64_t malformed[static_cast<int>(ParseError::kCount)] = {};  // by ParseError
  uint64_t bad_checksum = 0;  // also counted in malformed[kBadChecksum]
  uint64_t TotalDropped() const;
  std::string ToString() const;
  // Adds every counter of `other` (several devices' sum).
  Stats& operator+=(const Stats& other);
};

// The engine's live counters (written by the progress thread, read by anyone).
struct AtomicStats {
  OPTIREDUCE_ENGINE_COUNTERS(OPTIREDUCE_ATOMIC_COUNTER_FIELD)
  std::atomic<uint64_t> malformed[static_cast<int>(ParseError::kCount)] = {};
  Stats Snapshot() const;
};

}  // namespace transport
}  // namespace optireduce
