// Loss recovery end to end on the deterministic path model
// (transport_dpdk/reliable/path_model.h): the engine's sender and receiver
// components exchange a 4 MiB message through seeded faults on a virtual clock.
// Assertions are on counters, never on time.
#include <gtest/gtest.h>

#include "transport_dpdk/reliable/path_model.h"

namespace optireduce {
namespace transport {
namespace {

struct Totals {
  uint64_t rtos = 0, probes = 0, retransmitted = 0, lost = 0;
  int incomplete = 0;
  std::chrono::microseconds max_rto{0};
};

Totals RunSeeds(double drop, double burst, double ack_drop, int seeds) {
  Totals t;
  for (int k = 1; k <= seeds; ++k) {
    PathModelConfig c = PathModelConfig::Defaults();
    c.drop = drop;
    c.burst_loss = burst;
    c.ack_drop = ack_drop;
    c.seed = static_cast<uint64_t>(k);
    const PathModelResult r = RunPathModel(c);
    if (!r.completed) ++t.incomplete;
    t.rtos += r.sender.rto_events;
    t.probes += r.sender.tlp_probes;
    t.retransmitted += r.sender.retransmitted_bytes;
    t.lost += r.data_bytes_dropped;
    t.max_rto = std::max(t.max_rto, r.max_rto);
  }
  return t;
}

TEST(PathModel, LosslessPathSendsNothingTwice) {
  const Totals t = RunSeeds(0, 0, 0, 3);
  EXPECT_EQ(t.incomplete, 0);
  EXPECT_EQ(t.retransmitted, 0u);
  EXPECT_EQ(t.rtos, 0u);
}

// With a queue on the path (srtt ~3.5 ms, steady), a lost tail is found by a
// probe: an RTO barely above srtt would fire first and skip the probe.
TEST(PathModel, RandomLossIsRecoveredByRackAndProbesNotRtos) {
  const Totals t = RunSeeds(0.01, 0, 0, 30);
  EXPECT_EQ(t.incomplete, 0);
  EXPECT_EQ(t.rtos, 0u);
  EXPECT_GT(t.probes, 0u);
  EXPECT_LE(t.retransmitted, t.lost * 3 / 2);
}

// Lost acks are covered by later acks, a lost last ack by the probe's ack:
// an RTO needs both the last ack and the probe's ack lost (one seed of 30).
TEST(PathModel, AckLossCostsAnRtoOnlyWhenTheProbesAckIsLostToo) {
  const Totals t = RunSeeds(0, 0, 0.05, 30);
  EXPECT_EQ(t.incomplete, 0);
  EXPECT_LE(t.rtos, 1u);
}

// A burst that swallows the few datagrams of a thin flight (one retransmission
// per RTO) takes several RTOs in a row: the first six do not back off, so the
// RTO stays far below its ceiling.
TEST(PathModel, BurstLossDoesNotBackTheRtoOffToItsCeiling) {
  const Totals t = RunSeeds(0, 0.01, 0, 40);
  EXPECT_EQ(t.incomplete, 0);
  EXPECT_LT(t.max_rto, PathModelConfig::Defaults().sender.max_rto / 2);
  EXPECT_LE(t.retransmitted, t.lost * 3 / 2);
}

}  // namespace
}  // namespace transport
}  // namespace optireduce
