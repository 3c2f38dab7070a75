// The --counters-csv counters of Gloo's TCP: /proc/net/snmp and /proc/net/netstat parsed
// (shape checked, errors naming the line or the counter) and turned into sent, resent and
// spurious segments.
#include <gtest/gtest.h>

#include "bench/harness/proc_net_counters.h"
#include "bench/harness/resend_counters.h"

namespace optireduce {
namespace bench {
namespace {

// Shaped as a 6.x kernel prints them (fewer counters); Tcp MaxConn is signed.
constexpr char kSnmp[] =
    "Ip: Forwarding DefaultTTL InReceives\n"
    "Ip: 2 64 5000\n"
    "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens OutSegs RetransSegs InErrs\n"
    "Tcp: 1 200 120000 -1 4 9000 120 0\n"
    "Udp: InDatagrams NoPorts\n"
    "Udp: 10 0\n";

constexpr char kNetstat[] =
    "TcpExt: SyncookiesSent TCPDSACKUndo TCPDSACKRecv TCPDSACKOfoRecv TCPSpuriousRTOs "
    "TCPDSACKRecvSegs\n"
    "TcpExt: 0 2 30 4 1 41\n"
    "IpExt: InNoRoutes InOctets\n"
    "IpExt: 0 123456789012\n"
    "MPTcpExt: MPCapableSYNRX\n"
    "MPTcpExt: 0\n";

// An older kernel: no TCPDSACKRecvSegs.
constexpr char kOldNetstat[] =
    "TcpExt: TCPDSACKUndo TCPDSACKRecv TCPDSACKOfoRecv TCPSpuriousRTOs\n"
    "TcpExt: 2 30 4 1\n";

ProcNetCounters MustParse(const char* text, const char* origin) {
  absl::StatusOr<ProcNetCounters> c = ProcNetCounters::Parse(text, origin);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : *ProcNetCounters::Parse("", origin);
}

TEST(ProcNetCounters, PairsEachGroupsNamesWithTheValuesLineAfterThem) {
  const ProcNetCounters n = MustParse(kNetstat, "netstat");
  EXPECT_EQ(*n.Get("TcpExt", "TCPDSACKRecv"), 30u);
  EXPECT_EQ(*n.Get("TcpExt", "TCPDSACKRecvSegs"), 41u);
  EXPECT_EQ(*n.Get("IpExt", "InOctets"), 123456789012u);
  EXPECT_EQ(*n.Get("MPTcpExt", "MPCapableSYNRX"), 0u);
  EXPECT_TRUE(n.Has("TcpExt", "TCPSpuriousRTOs"));
  EXPECT_FALSE(n.Has("IpExt", "TCPDSACKRecv"));  // names belong to their group

  const absl::StatusOr<uint64_t> missing = n.Get("TcpExt", "NoSuchCounter");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "netstat has no counter TcpExt NoSuchCounter");
}

TEST(ProcNetCounters, ASignedValueIsAnErrorOnlyWhereItIsAsked) {
  const ProcNetCounters s = MustParse(kSnmp, "snmp");
  EXPECT_EQ(*s.Get("Tcp", "OutSegs"), 9000u);
  const absl::StatusOr<uint64_t> max_conn = s.Get("Tcp", "MaxConn");
  EXPECT_EQ(max_conn.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(max_conn.status().message(), "snmp: Tcp MaxConn is '-1', not an unsigned integer");
}

TEST(ProcNetCounters, RefusesTextOfAnotherShapeNamingTheLine) {
  struct Case {
    const char* text;
    const char* error;
  } cases[] = {
      {"TcpExt: A B C\nTcpExt: 1 2\n",
       "f line 2: 2 values for the 3 names of TcpExt on line 1"},
      {"TcpExt: A B\nTcpExt: 1 2\nIpExt: X Y\n",
       "f line 3: names of IpExt with no values line after them"},
      {"TcpExt: A B\n1 2\n", "f line 2: expected 'Group: ...', got '1 2'"},
      {": A\n: 1\n", "f line 1: expected 'Group: ...', got ': A'"},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<ProcNetCounters> p = ProcNetCounters::Parse(c.text, "f");
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(p.status().message(), c.error) << c.text;
  }
  // Blank lines and a missing final newline are fine; an empty file has no counters.
  const absl::StatusOr<ProcNetCounters> p = ProcNetCounters::Parse("\nT: a\n\nT: 7", "f");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p->Get("T", "a"), 7u);
  EXPECT_FALSE(ProcNetCounters::Parse("", "f")->Has("T", "a"));

  const absl::StatusOr<uint64_t> word = ProcNetCounters::Parse("T: a\nT: x7\n", "f")->Get("T", "a");
  EXPECT_EQ(word.status().message(), "f: T a is 'x7', not an unsigned integer");
}

TEST(ProcNetCounters, ReadNamesAFileItCannotOpen) {
  const absl::StatusOr<ProcNetCounters> r = ProcNetCounters::Read("/proc/net/no-such-file");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "cannot open /proc/net/no-such-file");
}

TEST(KernelTcpCounters, SpuriousIsTheDuplicateSegmentsThePeersReported) {
  const absl::StatusOr<ResendCounters> c =
      KernelTcpCounters(MustParse(kSnmp, "snmp"), MustParse(kNetstat, "netstat"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, "kernel-tcp");
  EXPECT_EQ(c->sent_packets, 9000u);
  EXPECT_EQ(c->resent_packets, 120u);
  // TCPDSACKRecvSegs; not the DSACK count, the spurious RTOs or the undos.
  EXPECT_EQ(c->spurious, 41u);
  EXPECT_EQ(c->resent_bytes, 0u);
  EXPECT_EQ(c->timeouts, 0u);
}

TEST(KernelTcpCounters, WithoutSegmentCountsEachDsackIsOneSegment) {
  const absl::StatusOr<ResendCounters> c =
      KernelTcpCounters(MustParse(kSnmp, "snmp"), MustParse(kOldNetstat, "netstat"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->spurious, 34u);  // TCPDSACKRecv + TCPDSACKOfoRecv
}

TEST(KernelTcpCounters, AMissingCounterIsAnErrorNamingIt) {
  const ProcNetCounters snmp = MustParse(kSnmp, "/proc/net/snmp");
  const absl::StatusOr<ResendCounters> no_dsack = KernelTcpCounters(
      snmp, MustParse("TcpExt: TCPDSACKRecv TCPSpuriousRTOs\nTcpExt: 3 1\n",
                      "/proc/net/netstat"));
  EXPECT_EQ(no_dsack.status().message(),
            "/proc/net/netstat has no counter TcpExt TCPDSACKOfoRecv");

  const absl::StatusOr<ResendCounters> no_retrans = KernelTcpCounters(
      MustParse("Tcp: OutSegs\nTcp: 5\n", "/proc/net/snmp"),
      MustParse(kNetstat, "/proc/net/netstat"));
  EXPECT_EQ(no_retrans.status().message(), "/proc/net/snmp has no counter Tcp RetransSegs");
}

TEST(ResendCounters, WithoutOurDevicesTheNamespacesKernelCountersAreRead) {
  // This process's namespace: the running kernel's files parse and have every counter.
  const ResendCounters a = ReadResendCounters({});
  EXPECT_EQ(a.source, "kernel-tcp") << a.error;
  EXPECT_EQ(a.error, "");
  const ResendCounters d = Delta(a, ReadResendCounters({}));
  EXPECT_EQ(d.source, "kernel-tcp");
  // The counters only grow: the later read minus the earlier one does not wrap around.
  EXPECT_LT(d.spurious, uint64_t{1} << 40);
  EXPECT_LT(d.resent_packets, uint64_t{1} << 40);
}

}  // namespace
}  // namespace bench
}  // namespace optireduce
