// resend_counters.h — what a rank's transport resent during a run, for comparing loss
// recovery across transports (optireduce-bench --counters-csv).
//
// Ours (udp, dpdk): the engine's counters of every device of the rank. Gloo's TCP: the
// kernel's TCP counters of the rank's network namespace (/proc/net/snmp, Tcp OutSegs and
// RetransSegs) — all TCP of that namespace, so only meaningful where the rank has one of
// its own (bench/lab gives each rank one).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/transport/device.h>

namespace optireduce {
namespace bench {

struct ResendCounters {
  std::string source;        // "engine" or "kernel-tcp"
  uint64_t sent_packets = 0;     // packets (segments) sent, first copies and resends
  uint64_t resent_packets = 0;   // retransmissions (probes included)
  uint64_t resent_bytes = 0;     // payload bytes resent (engine only; 0 for the kernel)
  uint64_t spurious = 0;         // resends the receiver reported duplicate (engine only)
  uint64_t timeouts = 0;         // RTOs (engine only)
};

// The counters now (cumulative since the devices' or the namespace's start).
ResendCounters ReadResendCounters(
    const std::vector<std::shared_ptr<gloo::transport::Device>>& devices);

// b - a, field by field.
ResendCounters Delta(const ResendCounters& a, const ResendCounters& b);

// Writes "rank,source,sent_packets,resent_packets,resent_bytes,spurious,timeouts" with a
// header line to `path`. False if it cannot be written.
bool WriteResendCsv(const std::string& path, int rank, const ResendCounters& c);

}  // namespace bench
}  // namespace optireduce
