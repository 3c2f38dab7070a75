// ControlGate (transport_dpdk/io/dpdk/dpdk_control_gate.h): the EAL interrupt thread's round
// ends only at a moment no datapath pass is held, so a pass held across the end of a
// round leaves the gate open for the datapath; the thread leaves once it is released.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "transport_dpdk/io/dpdk/dpdk_control_gate.h"
#include "transport_dpdk/io/dpdk/dpdk_eal.h"

namespace optireduce {
namespace testing {
namespace {

namespace dpdk = transport::dpdk;
using Clock = std::chrono::steady_clock;

const std::string kEal = "--no-huge --no-shconf -m 256 --no-pci --no-telemetry --log-level=*:error";

// Polls `done` until it holds or `limit` passes; true if it held.
template <typename F>
bool Within(std::chrono::milliseconds limit, F done) {
  const auto give_up = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(DpdkControlGate, RoundEndingWhileAPassIsHeldKeepsTheGateOpen) {
  ASSERT_TRUE(dpdk::EnsureEal(kEal).ok());
  auto gate_or = dpdk::ControlGate::Get();
  ASSERT_TRUE(gate_or.ok()) << gate_or.status();
  dpdk::ControlGate* gate = *gate_or;

  dpdk::ControlGate::Pass held = gate->Enter();
  ASSERT_TRUE(held) << "the interrupt thread never parked";
  const uint64_t deferrals = gate->deferrals();
  const uint64_t closes = gate->closes_with_pass_held();
  // The round ends while `held` is out: the thread puts its leave off instead of
  // closing the gate, so a second datapath call still gets in.
  ASSERT_TRUE(Within(std::chrono::milliseconds(2000), [&] { return gate->deferrals() > deferrals; }));
  dpdk::ControlGate::Pass second = gate->TryEnter();
  EXPECT_TRUE(second) << "the gate closed while a pass was held";
  second.Release();
  const uint64_t parks = gate->parks();
  held.Release();
  // Released, the thread leaves and comes back for its next round.
  EXPECT_TRUE(Within(std::chrono::milliseconds(2000), [&] { return gate->parks() > parks; }));
  EXPECT_EQ(gate->closes_with_pass_held(), closes);
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
