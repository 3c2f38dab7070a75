#include "transport_dpdk/engine/stats.h"

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
      spurious_retransmits, ", spurious rto ", spurious_rtos, ", silences ", long_silences,
      "/", long_silence_us, " us), dup ", duplicates, ", acks ", acks_sent, "/",
      acks_received, " (piggybacked ", acks_piggybacked, "/", piggybacked_acks_received,
      "), eager ", eager_messages, ", rdv ", rendezvous_messages,
      "; dropped: token ", bad_token, " ctx ", bad_context, " rank ", bad_rank,
      " offset ", bad_offset, " msg ", unknown_message, " window ",
      out_of_window, " unsupported ", unsupported, " to failed ctx ", failed_context,
      " early ", early_dropped, " (kept ", early_kept, "); bounded tx ",
      bounded_tx_packets, " rx ", bounded_rx_packets, " repair req ",
      repair_requests_sent, "/", repair_requests_received, " absent ",
      repair_absent_sent, "/", repair_absent_received, " cede ask ", cede_asks_sent, "/",
      cede_asks_received, " granted ", cede_granted, " answers ", cede_answers_received,
      "; liveness ping/pong ",
      pings_sent, "/", pongs_received, " unreachable ", peers_unreachable, " (unproven ", unreachable_unproven, ") dead ",
      peers_dead, " failed ctx ", contexts_failed, "; bounded deferred ", bounded_tx_deferred,
      " repair merged ", repair_requests_merged, " dropped ", repair_requests_dropped,
      "; polls ", progress_polls, " (yielded ", progress_yields, ") sleeps ", progress_sleeps, " woken by input ",
      sleeps_woken_by_input, " late input ", late_inputs, "; waiter polls ", waiter_polls,
      " rx ", rx_by_waiter, "; closes confirmed ", closes_confirmed, " lingered ", closes_lingered, " (close probes ", close_probes_sent, ")");
  for (int i = 1; i < static_cast<int>(ParseError::kCount); ++i) {
    if (malformed[i]) {
      absl::StrAppend(&s, " ", ParseErrorName(static_cast<ParseError>(i)), " ",
                      malformed[i]);
    }
  }
  return s;
}

Stats& Stats::operator+=(const Stats& other) {
  OPTIREDUCE_ENGINE_COUNTERS(OPTIREDUCE_COUNTER_ADD)
  for (int i = 0; i < static_cast<int>(ParseError::kCount); ++i) malformed[i] += other.malformed[i];
  bad_checksum += other.bad_checksum;
  return *this;
}

Stats AtomicStats::Snapshot() const {
  Stats snapshot;
  OPTIREDUCE_ENGINE_COUNTERS(OPTIREDUCE_COUNTER_SNAPSHOT)
  for (int i = 0; i < static_cast<int>(ParseError::kCount); ++i) {
    snapshot.malformed[i] = CounterValue(malformed[i]);
  }
  snapshot.bad_checksum = snapshot.malformed[static_cast<int>(ParseError::kBadChecksum)];
  return snapshot;
}

}  // namespace transport
}  // namespace optireduce
