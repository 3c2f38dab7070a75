#include "bench/harness/resend_counters.h"

#include <cstdio>

#include "transport_dpdk/device.h"

namespace optireduce {
namespace bench {

absl::StatusOr<ResendCounters> KernelTcpCounters(const ProcNetCounters& snmp,
                                                 const ProcNetCounters& netstat) {
  ResendCounters c;
  c.source = "kernel-tcp";
  absl::StatusOr<uint64_t> out = snmp.Get("Tcp", "OutSegs");
  if (!out.ok()) return out.status();
  absl::StatusOr<uint64_t> retrans = snmp.Get("Tcp", "RetransSegs");
  if (!retrans.ok()) return retrans.status();
  c.sent_packets = *out;
  c.resent_packets = *retrans;
  if (netstat.Has("TcpExt", "TCPDSACKRecvSegs")) {
    absl::StatusOr<uint64_t> segs = netstat.Get("TcpExt", "TCPDSACKRecvSegs");
    if (!segs.ok()) return segs.status();
    c.spurious = *segs;
    return c;
  }
  absl::StatusOr<uint64_t> below = netstat.Get("TcpExt", "TCPDSACKRecv");
  if (!below.ok()) return below.status();
  absl::StatusOr<uint64_t> above = netstat.Get("TcpExt", "TCPDSACKOfoRecv");
  if (!above.ok()) return above.status();
  c.spurious = *below + *above;
  return c;
}

ResendCounters ReadResendCounters(
    const std::vector<std::shared_ptr<gloo::transport::Device>>& devices) {
  ResendCounters c;
  bool ours = false;
  for (const auto& d : devices) {
    auto* dev = dynamic_cast<optireduce::transport::Device*>(d.get());
    if (!dev) continue;
    ours = true;
    const transport::Stats s = dev->stats();
    c.sent_packets += s.tx_packets;
    c.resent_packets += s.retransmits;
    c.resent_bytes += s.retransmitted_bytes;
    c.spurious += s.spurious_retransmits;
    c.timeouts += s.rto_events;
  }
  if (ours) {
    c.source = "engine";
    return c;
  }
  absl::StatusOr<ResendCounters> kernel = [] () -> absl::StatusOr<ResendCounters> {
    absl::StatusOr<ProcNetCounters> snmp = ProcNetCounters::Read("/proc/net/snmp");
    if (!snmp.ok()) return snmp.status();
    absl::StatusOr<ProcNetCounters> netstat = ProcNetCounters::Read("/proc/net/netstat");
    if (!netstat.ok()) return netstat.status();
    return KernelTcpCounters(*snmp, *netstat);
  }();
  if (kernel.ok()) return *kernel;
  c.source = "none";
  c.error = std::string(kernel.status().message());
  return c;
}

ResendCounters Delta(const ResendCounters& a, const ResendCounters& b) {
  ResendCounters d;
  d.source = b.source;
  d.error = b.error.empty() ? a.error : b.error;
  if (a.source != b.source) d.source = "none";
  d.sent_packets = b.sent_packets - a.sent_packets;
  d.resent_packets = b.resent_packets - a.resent_packets;
  d.resent_bytes = b.resent_bytes - a.resent_bytes;
  d.spurious = b.spurious - a.spurious;
  d.timeouts = b.timeouts - a.timeouts;
  return d;
}

bool WriteResendCsv(const std::string& path, int rank, const ResendCounters& c) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "rank,source,sent_packets,resent_packets,resent_bytes,spurious,timeouts\n");
  std::fprintf(f, "%d,%s,%llu,%llu,%llu,%llu,%llu\n", rank, c.source.c_str(),
               static_cast<unsigned long long>(c.sent_packets),
               static_cast<unsigned long long>(c.resent_packets),
               static_cast<unsigned long long>(c.resent_bytes),
               static_cast<unsigned long long>(c.spurious),
               static_cast<unsigned long long>(c.timeouts));
  return std::fclose(f) == 0;
}

}  // namespace bench
}  // namespace optireduce
