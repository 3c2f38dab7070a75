// Peer death with real processes (peer_death_worker ranks): a rank _exits or is SIGKILLed
// before, during or between collectives — allreduce, broadcast, barrier, send/recv,
// recv-from-any — and every survivor raises gloo::IoException naming the dead rank within
// seconds, though the op timeout is 120 s: on the udp device from the ICMP port unreachable
// that quotes a probe to it, on the dpdk device over memif from its link going down.
// A rank that stops answering (SIGSTOP: a paused VM, a stalled host) is not dead: as on
// Gloo's TCP device (Gloo's TransportMultiProcTest.UnboundIoTimeout*), the survivors raise
// at the operation's timeout — no sooner than half of it, no later than twice it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/common/spawn.h"

#ifndef PEER_DEATH_WORKER_PATH
#error "PEER_DEATH_WORKER_PATH must name the peer_death_worker binary"
#endif

namespace optireduce {
namespace testing {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// (device, op, at, how)
using Case = std::tuple<std::string, std::string, std::string, std::string>;

class PeerDeath : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    dir_ = MakeWorkerDir("optireduce_death", {"store", "info", "memif"});
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { KillWorkersAndRemove(pids_, dir_); }
  std::string Read(const std::string& name) {
    std::ifstream f(dir_ + "/info/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  // Starts n peer_death_worker ranks for one case (rank `victim` dies).
  // `extra`: more worker arguments (e.g. --peer_dead_ms=N).
  void SpawnRanks(int n, int victim, const Case& c, const std::vector<std::string>& extra = {}) {
    const auto& [device, op, at, how] = c;
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> argv = {
          PEER_DEATH_WORKER_PATH, "--rank=" + std::to_string(r), "--size=" + std::to_string(n),
          "--store=" + dir_ + "/store", "--info=" + dir_ + "/info",
          "--memif_dir=" + dir_ + "/memif", "--victim=" + std::to_string(victim),
          "--device=" + device, "--op=" + op, "--at=" + at, "--how=" + how,
          "--timeout_ms=120000"};
      argv.insert(argv.end(), extra.begin(), extra.end());
      pids_.push_back(SpawnProcess(argv));
      ASSERT_GT(pids_.back(), 0);
    }
  }

  // Every survivor ends on its own (within 60 s, long before the 120 s op timeout) by
  // raising gloo::IoException that names the victim, at most `within_ms` after its death.
  void ExpectSurvivorsRaise(int n, int victim, long long within_ms);

  std::string dir_;
  std::vector<pid_t> pids_;
};

void PeerDeath::ExpectSurvivorsRaise(int n, int victim, long long within_ms) {
  std::vector<int> code(n, -1000);
  const auto limit = Clock::now() + std::chrono::seconds(60);
  int left = n - 1;
  while (left > 0 && Clock::now() < limit) {
    for (int r = 0; r < n; ++r) {
      if (r == victim || pids_[r] <= 0) continue;
      int st = 0;
      if (waitpid(pids_[r], &st, WNOHANG) == pids_[r]) {
        code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        pids_[r] = 0;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string died = Read("died." + std::to_string(victim));
  ASSERT_FALSE(died.empty()) << "the victim never reached its kill point";
  const long long died_at = std::stoll(died);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    ASSERT_EQ(code[r], 0) << "rank " << r
                          << " did not raise gloo::IoException (-1000 = hung; see stderr)";
    const std::string message = Read("message." + std::to_string(r));
    EXPECT_NE(message.find("peer rank " + std::to_string(victim)), std::string::npos)
        << "rank " << r << ": " << message;
    const long long failed_at = std::stoll(Read("failed." + std::to_string(r)));
    EXPECT_LT(failed_at - died_at, within_ms) << "rank " << r << ": " << message;
    RecordProperty("detect_ms_rank" + std::to_string(r), std::to_string(failed_at - died_at));
  }
}

TEST_P(PeerDeath, SurvivorsRaiseIoExceptionNamingTheDeadRank) {
  const int n = 3, victim = 2;
  ASSERT_NO_FATAL_FAILURE(SpawnRanks(n, victim, GetParam()));
  // The death is proven within milliseconds; 5 s leaves room for a loaded 2-core machine.
  // The op timeout (120 s) must play no part.
  ExpectSurvivorsRaise(n, victim, 5000);
}

// A stopped rank (SIGSTOP) of 3: its socket (memif link) stays open and it answers no probe.
// Gloo's semantics (TransportMultiProcTest.UnboundIoTimeout*): the others raise
// gloo::IoException at their operation's timeout (3 s here), no sooner than half of it and
// no later than twice it — silence is not a death.
class PeerPaused : public PeerDeath {};

TEST_P(PeerPaused, OthersRaiseAtTheOperationTimeout) {
  const int n = 3, victim = 2;
  const long long timeout_ms = 3000;
  ASSERT_NO_FATAL_FAILURE(
      SpawnRanks(n, victim, GetParam(), {"--timeout_ms=" + std::to_string(timeout_ms)}));
  std::vector<int> code(n, -1000);
  const auto limit = Clock::now() + std::chrono::seconds(60);
  int left = n - 1;
  while (left > 0 && Clock::now() < limit) {
    for (int r = 0; r < n; ++r) {
      if (r == victim || pids_[r] <= 0) continue;
      int st = 0;
      if (waitpid(pids_[r], &st, WNOHANG) == pids_[r]) {
        code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        pids_[r] = 0;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string died = Read("died." + std::to_string(victim));
  ASSERT_FALSE(died.empty()) << "the victim never reached its stop point";
  const long long stopped_at = std::stoll(died);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    ASSERT_EQ(code[r], 0) << "rank " << r
                          << " did not raise gloo::IoException (-1000 = hung; see stderr)";
    const std::string message = Read("message." + std::to_string(r));
    const long long took = std::stoll(Read("failed." + std::to_string(r))) - stopped_at;
    EXPECT_GE(took, timeout_ms / 2) << "rank " << r << ": " << message;
    EXPECT_LE(took, 2 * timeout_ms) << "rank " << r << ": " << message;
    RecordProperty("raise_ms_rank" + std::to_string(r), std::to_string(took));
  }
}

// A killed process's UDP socket is closed: a rank that only waits for its data probes it
// soon after it went quiet, and the ICMP port unreachable that answers the probe ends the
// wait — long before the silence bound (60 s here) or a probe interval of dead_after / 8
// (7.5 s). The survivors send nothing to the victim on their own (old-style Buffer recv).
class PeerDeathByProbe : public PeerDeath {};

TEST_P(PeerDeathByProbe, QuietDeadPeerIsFoundByTheFirstProbes) {
  const int n = 3, victim = 2;
  ASSERT_NO_FATAL_FAILURE(SpawnRanks(n, victim, GetParam(), {"--peer_dead_ms=60000"}));
  ExpectSurvivorsRaise(n, victim, 5000);
}

INSTANTIATE_TEST_SUITE_P(Udp, PeerDeathByProbe,
                         ::testing::Values(Case{"udp", "buffer_recv", "between", "kill"},
                                           Case{"udp", "buffer_recv", "between", "exit"}),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_" + std::get<3>(info.param);
                         });

// A device with one live and one dead (killed) peer and nothing posted stays nearly idle,
// so a job that lost a rank does not burn the cores of the ranks that remain: over 2 s
// its progress thread polls at most 500 times a second (idle, it sleeps 4 ms between
// polls on dpdk and until its next timer on udp; a spinning thread polls hundreds of
// thousands of times), the DPDK control gate parks the EAL interrupt thread at most 1000
// times a second (connect-speed rounds of 0.1 ms for a lost link would be 10000), and the
// device's progress thread (udp: the whole process) uses under 5% of a core (CPU time).
class PeerDeathIdle : public PeerDeath {};

TEST_P(PeerDeathIdle, DeviceWithADeadPeerWakesRarely) {
  const auto& [device, op, at, how] = GetParam();
  const int n = 3, victim = 2;
  ASSERT_NO_FATAL_FAILURE(SpawnRanks(n, victim, GetParam()));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    int st = 0;
    ASSERT_EQ(waitpid(pids_[r], &st, 0), pids_[r]);
    pids_[r] = 0;
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank " << r << " status " << st;
    std::istringstream cpu(Read("cpu." + std::to_string(r)));
    double thread = 0, process = 0, wall = 0;
    long long polls = 0, gate_rounds = 0;
    ASSERT_TRUE(cpu >> thread >> process >> wall >> polls >> gate_rounds)
        << "rank " << r << " wrote no idle figures";
    ASSERT_GT(wall, 1.0);
    ASSERT_GE(polls, 0) << "rank " << r << " has no progress thread of ours";
    const std::string figures =
        device + " rank " + std::to_string(r) + ": " + std::to_string(polls) + " polls, " +
        std::to_string(gate_rounds) + " control gate rounds, process CPU " +
        std::to_string(process) + " s (progress thread " + std::to_string(thread) +
        " s) in " + std::to_string(wall) + " s";
    EXPECT_LT(polls / wall, 500) << figures;
    if (device == "dpdk") {
      ASSERT_GE(gate_rounds, 0) << figures;
      EXPECT_LT(gate_rounds / wall, 1000) << figures;
    }
    // The device's own thread: under 5% of a core. (On dpdk the process also runs the
    // EAL's interrupt thread, whose wake-ups the gate-round bound above limits.)
    EXPECT_LT((device == "dpdk" ? thread : process) / wall, 0.05) << figures;
    RecordProperty("cpu_share_rank" + std::to_string(r), std::to_string(process / wall));
    std::cerr << figures << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Udp, PeerDeathIdle,
                         ::testing::Values(Case{"udp", "idle", "between", "kill"}),
                         [](const auto& info) { return std::get<0>(info.param); });
#ifdef OPTIREDUCE_TEST_DPDK
INSTANTIATE_TEST_SUITE_P(DpdkMemif, PeerDeathIdle,
                         ::testing::Values(Case{"dpdk", "idle", "between", "kill"}),
                         [](const auto& info) { return std::get<0>(info.param); });
#endif

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [device, op, at, how] = info.param;
  return device + "_" + op + "_" + at + "_" + how;
}

const auto kOps = ::testing::Values("allreduce", "broadcast", "barrier", "sendrecv", "recv_any");

INSTANTIATE_TEST_SUITE_P(Udp, PeerDeath,
                         ::testing::Combine(::testing::Values("udp"), kOps,
                                            ::testing::Values("before", "during", "between"),
                                            ::testing::Values("exit", "kill")),
                         Name);
// A stopped process keeps its socket: no ICMP; the operation's timeout decides.
INSTANTIATE_TEST_SUITE_P(Udp, PeerPaused,
                         ::testing::Values(Case{"udp", "sendrecv", "between", "stop"},
                                           Case{"udp", "sendrecv", "during", "stop"},
                                           Case{"udp", "allreduce", "between", "stop"},
                                           Case{"udp", "buffer_recv", "between", "stop"}),
                         Name);
// OptiReduce mode (bounded TAR past calibration): a dead peer is an error, not absorbed.
INSTANTIATE_TEST_SUITE_P(UdpOptiReduce, PeerDeath,
                         ::testing::Combine(::testing::Values("udp"),
                                            ::testing::Values("optireduce"),
                                            ::testing::Values("during", "between"),
                                            ::testing::Values("exit", "kill")),
                         Name);
// Old-style Buffers: the survivors only wait in Buffer::waitRecv for the victim's data.
INSTANTIATE_TEST_SUITE_P(UdpBufferRecv, PeerDeath,
                         ::testing::Combine(::testing::Values("udp"),
                                            ::testing::Values("buffer_recv"),
                                            ::testing::Values("before", "between"),
                                            ::testing::Values("kill")),
                         Name);
#ifdef OPTIREDUCE_TEST_DPDK
// OptiReduce mode on memif, every kind of death.
INSTANTIATE_TEST_SUITE_P(DpdkMemifOptiReduce, PeerDeath,
                         ::testing::Combine(::testing::Values("dpdk"),
                                            ::testing::Values("optireduce"),
                                            ::testing::Values("during", "between"),
                                            ::testing::Values("exit", "kill")),
                         Name);
// A victim that exits or is killed takes its memif links down: the survivors' backend
// reports the peers behind them at once (the memif PMD sees the control socket close). The
// PMD unmaps the link's shared memory from the EAL interrupt thread; the control gate keeps
// that apart from this rank's bursts (a survivor transmitting into unmapped memory would
// crash with SIGSEGV inside librte_net_memif).
INSTANTIATE_TEST_SUITE_P(DpdkMemif, PeerDeath,
                         ::testing::Combine(::testing::Values("dpdk"), kOps,
                                            ::testing::Values("before", "during", "between"),
                                            ::testing::Values("exit", "kill")),
                         Name);
INSTANTIATE_TEST_SUITE_P(DpdkMemifBufferRecv, PeerDeath,
                         ::testing::Combine(::testing::Values("dpdk"),
                                            ::testing::Values("buffer_recv"),
                                            ::testing::Values("between"),
                                            ::testing::Values("kill")),
                         Name);
// A stopped process keeps its memif links up: the operation's timeout decides.
INSTANTIATE_TEST_SUITE_P(DpdkMemif, PeerPaused,
                         ::testing::Values(Case{"dpdk", "sendrecv", "between", "stop"},
                                           Case{"dpdk", "allreduce", "during", "stop"}),
                         Name);
#endif

}  // namespace
}  // namespace testing
}  // namespace optireduce
