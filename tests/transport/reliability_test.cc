// Reliability of the udp transport with real processes (reliability_worker ranks):
//  - FaultSoak: thousands of collectives on 4 ranks under drop + dup + reorder + corrupt +
//    delay (OPTIREDUCE_FAULTS): reliable TAR and Gloo's ring exact every time, OptiReduce's
//    bounded mode within bound + repair budget every time, RSS flat after warm-up.
//    OPTIREDUCE_TEST_SOAK_SECONDS sets its length (default 60 s, and at least 600 iterations;
//    see SECURITY.md).
//  - PeerFailureLatePeer: a rank calls one bounded collective three bounds late: absorbed.
//  - PeerFailure: a rank SIGKILLed at each point of a bounded collective and during
//    reliable TAR; survivors' bounded operations return (damage flagged) until the
//    transport finds the rank gone, then raise gloo::IoException naming it, within
//    seconds (its death is proven by ICMP); reliable TAR raises likewise; the killed rank restarts on its old port into a new job while the old
//    job's packets still arrive: the new job is exact and the stale packets are dropped.
#include <arpa/inet.h>
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

#include "tests/common/spawn.h"

#ifndef RELIABILITY_WORKER_PATH
#error "RELIABILITY_WORKER_PATH must name the reliability_worker binary"
#endif

namespace optireduce {
namespace testing {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// A free UDP port on 127.0.0.1 (bound, read back, released).
uint16_t FreeUdpPort() {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

// Worker processes by rank; every one still running is killed and reaped on teardown,
// the temporary directory removed.
class ReliabilityProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeWorkerDir("optireduce_reliability", {"store1", "store2", "info"});
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { KillWorkersAndRemove(pids_, dir_); }

  // Starts (or restarts) rank r; the environment (OPTIREDUCE_FAULTS) is inherited.
  void StartRank(int r, int n, const std::vector<std::string>& extra) {
    std::vector<std::string> a = {RELIABILITY_WORKER_PATH, "--rank=" + std::to_string(r),
                                  "--size=" + std::to_string(n), "--store=" + dir_ + "/store1",
                                  "--store2=" + dir_ + "/store2", "--info=" + dir_ + "/info"};
    a.insert(a.end(), extra.begin(), extra.end());
    const pid_t pid = SpawnProcess(a);
    ASSERT_GE(pid, 0);
    if (pids_.size() <= static_cast<size_t>(r)) pids_.resize(r + 1, 0);
    pids_[r] = pid;
  }

  // Waits for rank r to end (up to `limit`); returns its exit code, -signal, or 1000 when
  // it was still running (then it is killed).
  int WaitRank(int r, std::chrono::seconds limit) {
    const auto end = Clock::now() + limit;
    int st = 0;
    while (waitpid(pids_[r], &st, WNOHANG) != pids_[r]) {
      if (Clock::now() > end) {
        kill(pids_[r], SIGKILL);
        waitpid(pids_[r], nullptr, 0);
        pids_[r] = 0;
        return 1000;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    pids_[r] = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  }

  std::string dir_;
  std::vector<pid_t> pids_;
};

TEST_F(ReliabilityProcesses, FaultSoak) {
  const char* faults = "drop=0.01,dup=0.01,reorder=0.02,corrupt=0.005,delay_us=200,seed=17";
  const char* seconds = std::getenv("OPTIREDUCE_TEST_SOAK_SECONDS");
  const long run_s = seconds ? std::atol(seconds) : 60;  // and at least 600 iterations
  setenv("OPTIREDUCE_FAULTS", faults, 1);
  const int n = 4;
  for (int r = 0; r < n; r++) StartRank(r, n, {"--mode=soak", "--seconds=" + std::to_string(run_s)});
  unsetenv("OPTIREDUCE_FAULTS");
  for (int r = 0; r < n; r++) {
    EXPECT_EQ(WaitRank(r, std::chrono::seconds(run_s + 150)), 0)
        << "rank " << r << " failed or hung (1000 = killed; see its stderr)";
  }
  for (int r = 0; r < n; r++) {
    std::ifstream f(dir_ + "/info/soak." + std::to_string(r));
    long iterations = 0, start = 0, warm = 0, end = 0;
    if (f >> iterations >> start >> warm >> end) {
      RecordProperty("rank" + std::to_string(r) + "_iterations", std::to_string(iterations));
      RecordProperty("rank" + std::to_string(r) + "_rss_kib_start_warm_end",
                     std::to_string(start) + "/" + std::to_string(warm) + "/" +
                         std::to_string(end));
    }
  }
}

class PeerFailure : public ReliabilityProcesses,
                    public ::testing::WithParamInterface<const char*> {};

TEST_P(PeerFailure, SurvivorsFinishInTimeAndRestartedRankJoinsNewJobCleanly) {
  const std::string at = GetParam();
  const int n = 4, victim = 2;
  std::vector<std::string> ports;
  for (int r = 0; r < n; r++) {
    const uint16_t p = FreeUdpPort();
    ASSERT_NE(p, 0);
    ports.push_back(std::to_string(p));
  }
  // The repair case needs losses (so every rank asks for repairs).
  if (at == "repair") setenv("OPTIREDUCE_FAULTS", "drop=0.05,seed=3", 1);
  // The victim comes back at once on its old port, so no ICMP report proves its death:
  // the survivors find it gone by an explicit silence bound (without one, each wait's
  // timeout decides, as on Gloo's TCP transport).
  setenv("OPTIREDUCE_PEER_DEAD_MS", "1000", 1);
  for (int r = 0; r < n; r++) {
    StartRank(r, n, {"--mode=peerfail", "--kill_at=" + at, "--victim=" + std::to_string(victim),
                     "--port=" + ports[r], "--victim_port=" + ports[victim],
                     "--timeout_ms=2000"});
  }
  // The victim kills itself at its point; restart it at once on its old port, so that it
  // is there while the old job's survivors still send to it.
  const int code = WaitRank(victim, std::chrono::seconds(60));
  EXPECT_EQ(code, -SIGKILL) << "the victim should have SIGKILLed itself " << at;
  StartRank(victim, n, {"--mode=rejoin", "--port=" + ports[victim]});
  unsetenv("OPTIREDUCE_FAULTS");
  unsetenv("OPTIREDUCE_PEER_DEAD_MS");
  for (int r = 0; r < n; r++) {
    EXPECT_EQ(WaitRank(r, std::chrono::seconds(90)), 0)
        << "rank " << r << (r == victim ? " (restarted)" : " (survivor)")
        << " failed or hung (1000 = killed; see its stderr)";
  }
}

// Next to a dead peer, a merely late one (it calls one operation three bounds late): the
// others complete that operation without it, flagged, no exception; exact afterwards.
TEST_F(ReliabilityProcesses, PeerFailureLatePeerIsAbsorbedNotAnError) {
  const int n = 4, late = 2;
  for (int r = 0; r < n; r++) StartRank(r, n, {"--mode=late", "--victim=" + std::to_string(late)});
  for (int r = 0; r < n; r++) {
    EXPECT_EQ(WaitRank(r, std::chrono::seconds(120)), 0)
        << "rank " << r << (r == late ? " (late)" : "")
        << " failed or hung (1000 = killed; see its stderr)";
  }
}

INSTANTIATE_TEST_SUITE_P(KillPoints, PeerFailure,
                         ::testing::Values("before1", "during1", "between", "during2", "repair",
                                           "tar"));

}  // namespace
}  // namespace testing
}  // namespace optireduce
