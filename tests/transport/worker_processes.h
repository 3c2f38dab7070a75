// Real worker processes for the multi-process transport tests: Workers starts
// transport_worker ranks (fork + exec), reaps them with a time limit and kills
// whatever is left on teardown, so no test leaves processes or temp files.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/spawn.h"

#ifndef TRANSPORT_WORKER_PATH
#error "TRANSPORT_WORKER_PATH must name the transport_worker binary"
#endif

namespace optireduce {
namespace testing {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Exit {
  int rank;
  bool timed_out = false;
  int code = -1;  // exit code, or -signal
  Clock::time_point when;
};

// Starts N workers; reaps them; kills everything left on teardown.
class Workers : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/optireduce_transport_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directory(dir_ + "/store");
    fs::create_directory(dir_ + "/info");
  }
  void TearDown() override {
    for (pid_t p : pids_) {
      if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
      }
    }
    pids_.clear();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void Start(int n, const std::vector<std::string>& extra) {
    // A fresh store per start (FileStore keys cannot be reused).
    static int gen = 0;
    const std::string store = dir_ + "/store/" + std::to_string(gen++);
    fs::create_directory(store);
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> a = {TRANSPORT_WORKER_PATH, "--rank=" + std::to_string(r),
                                    "--size=" + std::to_string(n), "--store=" + store,
                                    "--info=" + dir_ + "/info"};
      a.insert(a.end(), extra.begin(), extra.end());
      const pid_t pid = SpawnProcess(a);
      ASSERT_GE(pid, 0);
      pids_.push_back(pid);
    }
  }

  // Waits for every started worker up to `limit`; kills the rest.
  std::vector<Exit> Reap(std::chrono::seconds limit) {
    std::vector<Exit> out(pids_.size());
    for (size_t i = 0; i < out.size(); ++i) out[i].rank = static_cast<int>(i);
    const auto end = Clock::now() + limit;
    size_t left = pids_.size();
    for (pid_t p : pids_) if (p <= 0) --left;
    while (left > 0) {
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] <= 0) continue;
        int st = 0;
        if (waitpid(pids_[i], &st, WNOHANG) == pids_[i]) {
          out[i].code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
          out[i].when = Clock::now();
          pids_[i] = 0;
          --left;
        }
      }
      if (left == 0) break;
      if (Clock::now() > end) {
        for (size_t i = 0; i < pids_.size(); ++i) {
          if (pids_[i] <= 0) continue;
          kill(pids_[i], SIGKILL);
          waitpid(pids_[i], nullptr, 0);
          pids_[i] = 0;
          out[i].timed_out = true;
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pids_.clear();
    return out;
  }

  void ExpectAllSucceeded(const std::vector<Exit>& exits) {
    for (const auto& e : exits) {
      EXPECT_FALSE(e.timed_out) << "rank " << e.rank << " hung (killed)";
      EXPECT_EQ(e.code, 0) << "rank " << e.rank << " failed (see stderr)";
    }
  }

  std::string dir_;
  std::vector<pid_t> pids_;
};

}  // namespace testing
}  // namespace optireduce
