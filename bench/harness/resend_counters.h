// resend_counters.h — what a rank's transport resent during a run, for comparing loss
// recovery across transports (optireduce-bench --counters-csv).
//
// Ours (udp, dpdk), source "engine": the engine's counters of every device of the rank.
// `spurious` is the engine's spurious_retransmits: resent packets (probes included) whose
// duplicate the receiver reported (the ack's DSACK field names a packet it already had).
// The engine's spurious_rtos is not added: it counts RTOs the next ack undid, events rather
// than packets, and the packets such an RTO resent are counted here once their duplicates
// are reported.
//
// Gloo's TCP, source "kernel-tcp": the kernel's TCP counters of the rank's network
// namespace — all TCP of that namespace, so only meaningful where the rank has one of its
// own (bench/lab gives each rank one). sent_packets and resent_packets are /proc/net/snmp's
// Tcp OutSegs and RetransSegs (segments). `spurious` is the segments the peers reported
// receiving twice (DSACK, RFC 2883): /proc/net/netstat's TcpExt TCPDSACKRecvSegs, the
// kernel's estimate of duplicate segments (DSACKed range / MSS); a kernel without it gives
// TCPDSACKRecv + TCPDSACKOfoRecv (one per DSACK below / above the cumulative ack, each
// taken as one segment). Not added: TCPSpuriousRTOs (RTOs F-RTO found spurious) and
// TCPDSACKUndo (recoveries undone by DSACKs) count events, not segments, and their
// needless resends are DSACKed and counted already. A resend whose duplicate the peer
// never reported (DSACK off) is not counted, for either source.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/transport/device.h>

#include "absl/status/statusor.h"
#include "bench/harness/proc_net_counters.h"

namespace optireduce {
namespace bench {

struct ResendCounters {
  std::string source;        // "engine", "kernel-tcp", or "none" (counters unreadable)
  uint64_t sent_packets = 0;     // packets (segments) sent, first copies and resends
  uint64_t resent_packets = 0;   // retransmissions (probes included)
  uint64_t resent_bytes = 0;     // payload bytes resent (engine only; 0 for the kernel)
  uint64_t spurious = 0;         // resends the receiver reported duplicate (see above)
  uint64_t timeouts = 0;         // RTOs (engine only)
  std::string error;             // why source is "none"; empty otherwise
};

// The counters now (cumulative since the devices' or the namespace's start). Where the
// kernel's counters cannot be read or lack a counter used above, source is "none" and
// `error` says which.
ResendCounters ReadResendCounters(
    const std::vector<std::shared_ptr<gloo::transport::Device>>& devices);

// Gloo TCP's counters (source "kernel-tcp") from a namespace's /proc/net/snmp and
// /proc/net/netstat. An error names the missing counter: Tcp OutSegs or RetransSegs, or
// both TCPDSACKRecvSegs and one of TCPDSACKRecv / TCPDSACKOfoRecv.
absl::StatusOr<ResendCounters> KernelTcpCounters(const ProcNetCounters& snmp,
                                                 const ProcNetCounters& netstat);

// b - a, field by field.
ResendCounters Delta(const ResendCounters& a, const ResendCounters& b);

// Writes "rank,source,sent_packets,resent_packets,resent_bytes,spurious,timeouts" with a
// header line to `path`. False if it cannot be written.
bool WriteResendCsv(const std::string& path, int rank, const ResendCounters& c);

}  // namespace bench
}  // namespace optireduce
