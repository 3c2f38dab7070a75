#include "bench/harness/resend_counters.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "transport_dpdk/device.h"

namespace optireduce {
namespace bench {
namespace {

// Tcp OutSegs and RetransSegs of this network namespace: /proc/net/snmp has a "Tcp:" line
// of names followed by a "Tcp:" line of values.
bool ReadKernelTcp(uint64_t* out_segs, uint64_t* retrans_segs) {
  std::ifstream f("/proc/net/snmp");
  std::string names, line;
  while (std::getline(f, line)) {
    if (line.rfind("Tcp:", 0) != 0) continue;
    if (names.empty()) {
      names = line;
      continue;
    }
    // Names and values pair up word by word ("Tcp:" with "Tcp:"); MaxConn is signed.
    std::istringstream n(names), v(line);
    std::string name, value;
    int found = 0;
    while (n >> name && v >> value) {
      if (name == "OutSegs") {
        *out_segs = std::strtoull(value.c_str(), nullptr, 10);
        ++found;
      }
      if (name == "RetransSegs") {
        *retrans_segs = std::strtoull(value.c_str(), nullptr, 10);
        ++found;
      }
    }
    return found == 2;
  }
  return false;
}

}  // namespace

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
  c.source = "kernel-tcp";
  if (!ReadKernelTcp(&c.sent_packets, &c.resent_packets)) c.source = "none";
  return c;
}

ResendCounters Delta(const ResendCounters& a, const ResendCounters& b) {
  ResendCounters d;
  d.source = b.source;
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
