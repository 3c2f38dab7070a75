// The udp backend with real processes: conformance, faults, a peer killed
// mid-collective, forged packets, idle CPU of the progress thread.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/worker_processes.h"
#include "transport_dpdk/device.h"
#include "transport_dpdk/wire/wire_format.h"

namespace optireduce {
namespace testing {
namespace {

class UdpConformance : public Workers, public ::testing::WithParamInterface<int> {};

TEST_P(UdpConformance, AllCollectivesExact) {
  Start(GetParam(), {"--mode=conformance", "--sizes=0,1,1024,262144"});
  ExpectAllSucceeded(Reap(std::chrono::seconds(150)));
}

INSTANTIATE_TEST_SUITE_P(Ranks, UdpConformance, ::testing::Values(2, 3, 4, 8));

TEST_F(Workers, UdpAllreduce64MiB) {
  Start(4, {"--mode=conformance", "--cases=allreduce,AllreduceRingChunked",
            "--sizes=16777216"});
  ExpectAllSucceeded(Reap(std::chrono::seconds(150)));
}

class UdpFaults : public Workers, public ::testing::WithParamInterface<const char*> {};

TEST_P(UdpFaults, ExactUnderFaults) {
  Start(4, {"--mode=conformance", std::string("--faults=") + GetParam(),
            "--cases=AllreduceRing,AllreduceRingChunked,allreduce,broadcast,allgather,"
            "sendrecv,recv_any,send_before_recv",
            "--sizes=0,1,1024,262144"});
  ExpectAllSucceeded(Reap(std::chrono::seconds(150)));
}

INSTANTIATE_TEST_SUITE_P(
    Specs, UdpFaults,
    ::testing::Values("drop=0.01,dup=0.01,reorder=0.02,seed=5",
                      "drop=0.1,dup=0.02,reorder=0.05,corrupt=0.01,seed=9",
                      // The loss patterns of a cloud (fault_injector.h), on the udp wrapper.
                      "burst_loss=0.01,burst_len=8,ack_drop=0.05,tx_partial=0.3,seed=4",
                      "tail=8"));

// A peer that delivered its message, closed its context and exited leaves a receive from
// several sources waiting on the others: rank 0's probes to its closed port draw ICMP port
// unreachable, which must not fail the context (Gloo's TCP pair closed by its peer fails
// only what was posted on that pair).
TEST_F(Workers, APeerThatClosedAfterItsSendFailsNoReceiveFromOtherSources) {
  Start(3, {"--mode=early_exit", "--timeout_ms=20000"});
  ExpectAllSucceeded(Reap(std::chrono::seconds(60)));
}

TEST_F(Workers, PeerKilledMidCollectiveRaisesIoException) {
  const int n = 4, victim = 2;
  const long timeout_ms = 3000;
  Start(n, {"--mode=kill", "--timeout_ms=" + std::to_string(timeout_ms)});
  // Wait until every rank completed at least one allreduce.
  const auto until = Clock::now() + std::chrono::seconds(30);
  for (int r = 0; r < n; ++r) {
    while (!fs::exists(dir_ + "/info/started." + std::to_string(r)) && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // mid-collective
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const long long killed_at = ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
  ASSERT_EQ(kill(pids_[victim], SIGKILL), 0);
  auto exits = Reap(std::chrono::seconds(30));
  for (const auto& e : exits) {
    if (e.rank == victim) continue;
    EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung after the peer died";
    EXPECT_EQ(e.code, 0) << "rank " << e.rank << " did not fail with gloo::IoException";
    std::ifstream f(dir_ + "/info/failed." + std::to_string(e.rank));
    long long failed_at = 0;
    ASSERT_TRUE(f >> failed_at) << "rank " << e.rank << " recorded no IoException";
    // Within its timeout (plus slack for a loaded 2-core machine).
    EXPECT_LE(failed_at - killed_at, timeout_ms + 3000) << "rank " << e.rank;
  }
}

// Forges datagrams to rank 0's UDP port from a raw socket.
void Forge(uint16_t port, uint32_t ctx, uint64_t token) {
  using namespace optireduce::transport;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto send = [&](WireHeader h, std::vector<uint8_t> payload, bool break_crc = false) {
    h.payload_length = static_cast<uint32_t>(payload.size());
    std::vector<uint8_t> d(kHeaderBytes + payload.size());
    EncodeHeader(h, payload.data(), payload.size(), d.data());
    std::copy(payload.begin(), payload.end(), d.begin() + kHeaderBytes);
    if (break_crc) d[kHeaderBytes - 1] ^= 0;  // (reserved stays zero)
    if (break_crc) d.back() ^= 0x5a;
    sendto(fd, d.data(), d.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to));
  };
  WireHeader base;
  base.type = static_cast<uint8_t>(PacketType::kData);
  base.flags = kFlagEager;
  base.session_token = token;
  base.src_rank = 1;
  base.dst_rank = 0;
  base.dst_context = ctx;
  base.total_length = 64;
  for (int k = 0; k < 5; ++k) {
    WireHeader h = base;
    h.session_token = token ^ 0xdeadbeef;  // another job
    send(h, std::vector<uint8_t>(64, 0xAA));
    h = base;
    h.src_rank = 77;  // unknown rank
    send(h, std::vector<uint8_t>(64, 0xAA));
    h = base;
    h.dst_context = ctx + 1000;  // no such context
    send(h, std::vector<uint8_t>(64, 0xAA));
    h = base;
    h.offset = 32;  // runs past total_length: rejected by the parser
    send(h, std::vector<uint8_t>(64, 0xAA));
    h = base;
    h.message_id = 1ull << 40;  // a message that does not exist
    h.seq = 4000;  // inside the receive window, not yet used
    send(h, std::vector<uint8_t>(64, 0xAA));
    h = base;
    h.seq = 1ull << 40;  // far outside the receive window
    send(h, std::vector<uint8_t>(64, 0xAA));
    h = base;
    send(h, std::vector<uint8_t>(64, 0xAA), /*break_crc=*/true);
  }
  close(fd);
}

TEST_F(Workers, ForgedPacketsAreDroppedAndCounted) {
  Start(3, {"--mode=forged"});
  const std::string target = dir_ + "/info/target";
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (!fs::exists(target) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(fs::exists(target));
  std::ifstream f(target);
  unsigned port = 0, ctx = 0;
  unsigned long long token = 0;
  ASSERT_TRUE(f >> port >> ctx >> token);
  Forge(static_cast<uint16_t>(port), ctx, token);
  std::ofstream(dir_ + "/info/forged") << "1";
  ExpectAllSucceeded(Reap(std::chrono::seconds(60)));
}

TEST(UdpDevice, IdleProgressThreadUsesLittleCpu) {
  transport::udp::attr a;
  auto dev = transport::udp::CreateDeviceOrError(a);
  ASSERT_TRUE(dev.ok()) << dev.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double before = (*dev)->ProgressThreadCpuSeconds();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double used = (*dev)->ProgressThreadCpuSeconds() - before;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(used / wall, 0.20) << "idle progress thread used " << 100 * used / wall
                               << "% of a core";
  RecordProperty("idle_cpu_percent", std::to_string(100 * used / wall));
  printf("idle progress thread: %.2f%% of a core\n", 100 * used / wall);
}

TEST(UdpDevice, BadAttrsAreClearErrors) {
  transport::udp::attr a;
  a.hostname = "no.such.host.invalid";
  auto d = transport::udp::CreateDeviceOrError(a);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("no.such.host.invalid"), std::string::npos);
  transport::udp::attr b;
  b.max_datagram = 100;
  d = transport::udp::CreateDeviceOrError(b);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("max_datagram"), std::string::npos);
}

}  // namespace
}  // namespace testing
}  // namespace optireduce
