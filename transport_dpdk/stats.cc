#include "transport_dpdk/stats.h"

#include "absl/strings/str_cat.h"

namespace optireduce {
namespace transport {

uint64_t Stats::TotalDropped() const {
  uint64_t n = bad_token + bad_context + bad_rank + bad_offset +
               unknown_message + out_of_window + unsupported + failed_context +
               early_dropped;
  for (uint64_t m : malformed) n += m;
  return n;
}

std::string Stats::ToString() const {
  std::string s = absl::StrCat(
      "tx ", tx_packets, " pkts/", tx_bytes, " B, rx ", rx_packets, " pkts/",
      rx_bytes, " B, retx ", retransmits, "/", retransmitted_bytes, " B (rto ",
      rto_events, ", fast ", fast_retransmits, ", tlp ", tlp_probes, ", spurious ",
      spurious_retransmits, "), dup ", duplicates, ", acks ", acks_sent, "/",
      acks_received, ", eager ", eager_messages, ", rdv ", rendezvous_messages,
      "; dropped: token ", bad_token, " ctx ", bad_context, " rank ", bad_rank,
      " offset ", bad_offset, " msg ", unknown_message, " window ",
      out_of_window, " unsupported ", unsupported, " to failed ctx ", failed_context,
      " early ", early_dropped, " (kept ", early_kept, "); bounded tx ",
      bounded_tx_packets, " rx ", bounded_rx_packets, " repair req ",
      repair_requests_sent, "/", repair_requests_received, " absent ",
      repair_absent_sent, "/", repair_absent_received, "; liveness ping/pong ",
      pings_sent, "/", pongs_received, " unreachable ", peers_unreachable, " dead ",
      peers_dead, " failed ctx ", contexts_failed, "; bounded deferred ", bounded_tx_deferred,
      " repair merged ", repair_requests_merged, " dropped ", repair_requests_dropped,
      "; sleeps ", progress_sleeps, " woken by input ", sleeps_woken_by_input, " late input ",
      late_inputs, "; closes confirmed ", closes_confirmed, " lingered ", closes_lingered);
  for (int i = 1; i < static_cast<int>(ParseError::kCount); ++i) {
    if (malformed[i]) {
      absl::StrAppend(&s, " ", ParseErrorName(static_cast<ParseError>(i)), " ",
                      malformed[i]);
    }
  }
  return s;
}

Stats AtomicStats::Snapshot() const {
  Stats s;
  auto r = [](const std::atomic<uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  s.tx_packets = r(tx_packets);
  s.tx_bytes = r(tx_bytes);
  s.tx_backpressure = r(tx_backpressure);
  s.rx_packets = r(rx_packets);
  s.rx_bytes = r(rx_bytes);
  s.retransmits = r(retransmits);
  s.rto_events = r(rto_events);
  s.fast_retransmits = r(fast_retransmits);
  s.retransmitted_bytes = r(retransmitted_bytes);
  s.tlp_probes = r(tlp_probes);
  s.spurious_retransmits = r(spurious_retransmits);
  s.duplicates = r(duplicates);
  s.acks_sent = r(acks_sent);
  s.acks_received = r(acks_received);
  s.eager_messages = r(eager_messages);
  s.rendezvous_messages = r(rendezvous_messages);
  for (int i = 0; i < static_cast<int>(ParseError::kCount); ++i) {
    s.malformed[i] = r(malformed[i]);
  }
  s.bad_checksum = s.malformed[static_cast<int>(ParseError::kBadChecksum)];
  s.bad_token = r(bad_token);
  s.bad_context = r(bad_context);
  s.bad_rank = r(bad_rank);
  s.bad_offset = r(bad_offset);
  s.unknown_message = r(unknown_message);
  s.out_of_window = r(out_of_window);
  s.unsupported = r(unsupported);
  s.failed_context = r(failed_context);
  s.early_kept = r(early_kept);
  s.early_dropped = r(early_dropped);
  s.bounded_tx_packets = r(bounded_tx_packets);
  s.bounded_rx_packets = r(bounded_rx_packets);
  s.repair_requests_sent = r(repair_requests_sent);
  s.repair_requests_received = r(repair_requests_received);
  s.repair_absent_sent = r(repair_absent_sent);
  s.repair_absent_received = r(repair_absent_received);
  s.pings_sent = r(pings_sent);
  s.pongs_received = r(pongs_received);
  s.peers_unreachable = r(peers_unreachable);
  s.peers_dead = r(peers_dead);
  s.contexts_failed = r(contexts_failed);
  s.bounded_tx_deferred = r(bounded_tx_deferred);
  s.repair_requests_merged = r(repair_requests_merged);
  s.repair_requests_dropped = r(repair_requests_dropped);
  s.progress_sleeps = r(progress_sleeps);
  s.sleeps_woken_by_input = r(sleeps_woken_by_input);
  s.late_inputs = r(late_inputs);
  s.closes_confirmed = r(closes_confirmed);
  s.closes_lingered = r(closes_lingered);
  return s;
}

}  // namespace transport
}  // namespace optireduce
