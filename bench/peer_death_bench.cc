// peer_death_bench: how long after a peer's death the survivors raise, Gloo's TCP device vs
// ours (udp, dpdk over memif), and the idle CPU of a device with one live and one dead peer.
//
//   peer_death_bench [--trials=20] [--devices=tcp,udp,dpdk] [--csv=FILE]
//                    [--stop_timeout_ms=3000] [--worker=PATH]
//
// Each trial runs 3 ranks of peer_death_worker (tests/transport) on this host: allreduce in
// a loop, rank 2 SIGKILLed between collectives with a 120 s op timeout (a death: found by
// the device), or SIGSTOPped (a host that stops answering, no ICMP, no FIN: not a death,
// the op timeout decides) with a --stop_timeout_ms op timeout. Time = survivor's exception
// - victim's death (wall clock, both ranks of each trial). Prints a table; --csv also writes
// one row per sample. --worker runs another build's peer_death_worker (before/after).
//
// A killed process's sockets close only after the kernel freed its memory (about 7 ms per
// 100 MiB touched here), and a DPDK rank holds its mbuf pools: when tcp and dpdk are both
// measured, a last row runs Gloo's TCP with a victim that holds as much resident memory as
// the dpdk victims did, so the two are compared on the same teardown.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/spawn.h"

#ifndef PEER_DEATH_WORKER_PATH
#error "PEER_DEATH_WORKER_PATH must name the peer_death_worker binary"
#endif

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Trial {
  bool ok = false;
  std::vector<double> ms;      // per survivor
  std::vector<std::string> cpu;  // idle runs: per survivor "thread process wall"
  long victim_rss_mib = -1;
  std::string note;
};

// One 3-rank run; victim 2.
// ballast_mib: every rank holds that much touched memory (0: none).
Trial Run(const std::string& worker, const std::string& device, const std::string& op,
          const std::string& how, long timeout_ms, long ballast_mib = 0) {
  Trial t;
  char tmpl[] = "/tmp/optireduce_death_bench_XXXXXX";
  if (!mkdtemp(tmpl)) {
    t.note = "mkdtemp failed";
    return t;
  }
  const std::string dir = tmpl;
  for (const char* d : {"store", "info", "memif"}) fs::create_directory(dir + "/" + d);
  const int n = 3, victim = 2;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = {
        worker, "--rank=" + std::to_string(r), "--size=3",
        "--store=" + dir + "/store", "--info=" + dir + "/info", "--memif_dir=" + dir + "/memif",
        "--victim=2", "--device=" + device, "--op=" + op, "--at=between", "--how=" + how,
        "--timeout_ms=" + std::to_string(timeout_ms)};
    if (ballast_mib > 0) argv.push_back("--ballast_mb=" + std::to_string(ballast_mib));
    pids.push_back(optireduce::testing::SpawnProcess(argv));
  }
  std::vector<int> code(n, -1000);
  const auto limit = Clock::now() + std::chrono::seconds(150);
  int left = n - 1;
  while (left > 0 && Clock::now() < limit) {
    for (int r = 0; r < n; ++r) {
      if (r == victim || pids[r] <= 0) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        pids[r] = 0;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (pid_t p : pids) {
    if (p > 0) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
  const std::string died = Read(dir + "/info/died.2");
  t.ok = !died.empty();
  const std::string rss = Read(dir + "/info/rss.2");
  if (!rss.empty()) t.victim_rss_mib = std::stol(rss);
  for (int r = 0; r < n && t.ok; ++r) {
    if (r == victim) continue;
    if (code[r] != 0) {
      t.ok = false;
      t.note = "rank " + std::to_string(r) + " exit " + std::to_string(code[r]);
      break;
    }
    if (op == "idle") {
      t.cpu.push_back(Read(dir + "/info/cpu." + std::to_string(r)));
    } else {
      t.ms.push_back(static_cast<double>(std::stoll(Read(dir + "/info/failed." +
                                                         std::to_string(r))) -
                                         std::stoll(died)));
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = {{"trials", "20"},
                                             {"devices", "tcp,udp,dpdk"},
                                             {"stop_timeout_ms", "3000"},
                                             {"worker", PEER_DEATH_WORKER_PATH}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos) {
      fprintf(stderr,
              "usage: %s [--trials=20] [--devices=tcp,udp,dpdk] [--csv=FILE] "
              "[--stop_timeout_ms=3000] [--worker=PATH]\n",
              argv[0]);
      return 2;
    }
    args[a.substr(2, a.find('=') - 2)] = a.substr(a.find('=') + 1);
  }
  const int trials = std::stoi(args["trials"]);
  const long stop_timeout_ms = std::stol(args["stop_timeout_ms"]);
  const std::string worker = args["worker"];
  std::vector<std::string> devices;
  std::stringstream ss(args["devices"]);
  for (std::string d; std::getline(ss, d, ',');) devices.push_back(d);
  FILE* csv = args.count("csv") ? fopen(args["csv"].c_str(), "w") : nullptr;
  if (csv) fprintf(csv, "device,how,trial,survivor_ms,victim_rss_mib\n");

  printf("peer death -> survivors' gloo::IoException (3 ranks, allreduce loop, rank 2 dies "
         "between collectives; %d trials, both survivors each; worker %s)\n\n", trials,
         worker.c_str());
  printf("| device | death | op timeout s | victim RSS MiB | samples | median ms | max ms | "
         "failed trials |\n");
  printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  struct Row {
    std::string device, how;
    long ballast_mib = 0;
  };
  std::vector<Row> rows;
  for (const std::string& device : devices) {
    rows.push_back({device, "kill"});
    // SIGSTOP: no FIN, no ICMP — not a death: the op timeout decides, as on Gloo TCP.
    rows.push_back({device, "stop"});
  }
  const bool match_dpdk =
      std::count(devices.begin(), devices.end(), "tcp") && std::count(devices.begin(), devices.end(), "dpdk");
  if (match_dpdk) rows.push_back({"tcp", "kill", -1});  // ballast: the dpdk victims' RSS
  std::vector<long> dpdk_rss;
  for (Row& row : rows) {
    const std::string& device = row.device;
    const std::string& how = row.how;
    if (row.ballast_mib < 0) {
      std::sort(dpdk_rss.begin(), dpdk_rss.end());
      row.ballast_mib = dpdk_rss.empty() ? 0 : dpdk_rss[dpdk_rss.size() / 2];
    }
    std::vector<double> all;
    std::vector<long> rss;
    int failed = 0;
    for (int k = 0; k < trials; ++k) {
      const long timeout_ms = how == "stop" ? stop_timeout_ms : 120000;
      Trial t = Run(worker, device, "allreduce", how, timeout_ms, row.ballast_mib);
      if (!t.ok) {
        ++failed;
        fprintf(stderr, "%s %s trial %d: %s\n", device.c_str(), how.c_str(), k, t.note.c_str());
        continue;
      }
      if (t.victim_rss_mib >= 0) rss.push_back(t.victim_rss_mib);
      if (device == "dpdk" && how == "kill" && t.victim_rss_mib >= 0) {
        dpdk_rss.push_back(t.victim_rss_mib);
      }
      for (double ms : t.ms) {
        all.push_back(ms);
        if (csv) {
          fprintf(csv, "%s,%s,%d,%.0f,%ld\n", device.c_str(), how.c_str(), k, ms,
                  t.victim_rss_mib);
        }
      }
    }
    std::sort(all.begin(), all.end());
    std::sort(rss.begin(), rss.end());
    const double median = all.empty() ? -1 : all[all.size() / 2];
    const double max = all.empty() ? -1 : all.back();
    printf("| %s | %s | %.0f | %ld | %zu | %.0f | %.0f | %d |\n", device.c_str(),
           how == "kill" ? "SIGKILL" : "SIGSTOP",
           (how == "stop" ? stop_timeout_ms : 120000) / 1000.0, rss.empty() ? -1 : rss[rss.size() / 2],
           all.size(), median, max, failed);
    fflush(stdout);
  }

  printf("\nidle CPU, 2 s with one live and one dead (SIGKILLed) peer, nothing posted "
         "(%% of one core; progress thread / whole process)\n\n");
  printf("| device | rank | progress thread %% | process %% |\n|---|---:|---:|---:|\n");
  for (const std::string& device : devices) {
    Trial t = Run(worker, device, "idle", "kill", 120000);
    if (!t.ok) {
      printf("| %s | - | run failed: %s | |\n", device.c_str(), t.note.c_str());
      continue;
    }
    for (size_t r = 0; r < t.cpu.size(); ++r) {
      double thread = 0, process = 0, wall = 1;
      std::stringstream in(t.cpu[r]);
      in >> thread >> process >> wall;
      if (thread < 0) {
        printf("| %s | %zu | n/a | %.2f |\n", device.c_str(), r, 100 * process / wall);
      } else {
        printf("| %s | %zu | %.2f | %.2f |\n", device.c_str(), r, 100 * thread / wall,
               100 * process / wall);
      }
    }
  }
  if (csv) fclose(csv);
  return 0;
}
