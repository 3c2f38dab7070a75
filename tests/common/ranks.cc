#include "tests/common/ranks.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

namespace optireduce {
namespace testing {

std::shared_ptr<gloo::transport::Device> TcpDevice(int rank) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return gloo::transport::tcp::CreateDevice(attr);
}

namespace {

std::shared_ptr<gloo::Context> Connect(gloo::rendezvous::Store& store, int rank, int size,
                                       const RankOptions& options) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(options.context_timeout);
  std::shared_ptr<gloo::transport::Device> device = options.device(rank);
  context->connectFullMesh(store, device);
  return context;
}

}  // namespace

void RunThreads(int size, const RankBody& body, const RankOptions& options) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(size);
  for (int rank = 0; rank < size; rank++) {
    threads.emplace_back([&, rank] {
      try {
        auto context = Connect(store, rank, size, options);
        body(context);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < size; rank++) {
    EXPECT_EQ(errors[rank], "") << "rank " << rank << " of " << size << " threw";
  }
}

std::string RunProcesses(int size, const RankBody& body, const RankOptions& options) {
  TempDir dir;
  // Children report a failure message through a per-rank file.
  std::vector<pid_t> pids(size, -1);
  for (int rank = 0; rank < size; rank++) {
    pid_t pid = fork();
    if (pid < 0) {
      for (int r = 0; r < rank; r++) kill(pids[r], SIGKILL);
      for (int r = 0; r < rank; r++) waitpid(pids[r], nullptr, 0);
      return std::string("fork failed: ") + std::strerror(errno);
    }
    if (pid == 0) {
      std::string error;
      try {
        gloo::rendezvous::FileStore store(dir.path());
        auto context = Connect(store, rank, size, options);
        body(context);
        if (::testing::Test::HasFailure()) error = "gtest assertion failed";
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (!error.empty()) {
        std::string path = dir.path() + "/error." + std::to_string(rank);
        if (FILE* f = std::fopen(path.c_str(), "w")) {
          std::fputs(error.c_str(), f);
          std::fclose(f);
        }
      }
      std::fflush(nullptr);
      _exit(error.empty() ? 0 : 1);
    }
    pids[rank] = pid;
  }
  std::string failures;
  const auto limit = std::chrono::steady_clock::now() + options.process_limit;
  int remaining = size;
  std::vector<int> status(size, 0);
  std::vector<bool> done(size, false);
  while (remaining > 0) {
    bool progressed = false;
    for (int rank = 0; rank < size; rank++) {
      if (done[rank]) continue;
      if (waitpid(pids[rank], &status[rank], WNOHANG) == pids[rank]) {
        done[rank] = true;
        remaining--;
        progressed = true;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > limit) {
      for (int rank = 0; rank < size; rank++) {
        if (!done[rank]) {
          kill(pids[rank], SIGKILL);
          waitpid(pids[rank], &status[rank], 0);
          done[rank] = true;
          failures += "rank " + std::to_string(rank) + " hung and was killed; ";
        }
      }
      break;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < size; rank++) {
    std::string path = dir.path() + "/error." + std::to_string(rank);
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[4096] = {};
      size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
      std::fclose(f);
      failures += "rank " + std::to_string(rank) + ": " + std::string(buf, n) + "; ";
    } else if (WIFSIGNALED(status[rank]) && failures.find("rank " + std::to_string(rank)) == std::string::npos) {
      failures += "rank " + std::to_string(rank) + " died of signal " +
                  std::to_string(WTERMSIG(status[rank])) + "; ";
    } else if (WIFEXITED(status[rank]) && WEXITSTATUS(status[rank]) != 0) {
      failures += "rank " + std::to_string(rank) + " exited with " +
                  std::to_string(WEXITSTATUS(status[rank])) + "; ";
    }
  }
  return failures;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/optireduce-test-XXXXXX";
  char* p = mkdtemp(tmpl);
  if (p == nullptr) {
    throw std::runtime_error(std::string("mkdtemp failed: ") + std::strerror(errno));
  }
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace testing
}  // namespace optireduce
