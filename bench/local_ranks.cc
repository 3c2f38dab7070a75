#include "bench/local_ranks.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

namespace optireduce {
namespace bench {

std::shared_ptr<gloo::transport::Device> MakeDevice(const std::string& transport) {
  if (transport == "tcp") {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    return gloo::transport::tcp::CreateDevice(attr);
  }
  throw std::invalid_argument("unknown transport '" + transport + "' (allowed: tcp)");
}

int RunLocalRanks(int size, const std::string& transport, int limit_seconds,
                  const std::function<int(const RankEnv&)>& body) {
  char tmpl[] = "/tmp/optireduce-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; rank++) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      break;
    }
    if (pid == 0) {
      int status = 1;
      try {
        gloo::rendezvous::FileStore store(dir);
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        context->setTimeout(std::chrono::seconds(limit_seconds));
        auto device = MakeDevice(transport);
        context->connectFullMesh(store, device);
        status = body(RankEnv{rank, size, context});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(status);
    }
    pids.push_back(pid);
  }
  int result = pids.size() == static_cast<size_t>(size) ? 0 : 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_seconds);
  for (size_t i = 0; i < pids.size(); i++) {
    int status = 0;
    while (waitpid(pids[i], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "rank %zu still running after %d s: killing all ranks\n", i,
                     limit_seconds);
        for (pid_t p : pids) kill(p, SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (result == 0) result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

}  // namespace bench
}  // namespace optireduce
