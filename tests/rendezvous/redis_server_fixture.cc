#include "tests/rendezvous/redis_server_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optireduce {
namespace testing {

constexpr char RedisServer::kPassword[];

int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = -1;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

namespace {

// True once the server answers an authenticated PING.
bool Answers(int port) {
  struct timeval tv = {0, 200 * 1000};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  bool ok = false;
  if (c != nullptr && c->err == 0) {
    redisSetTimeout(c, tv);
    auto* r = static_cast<redisReply*>(redisCommand(c, "AUTH %s", RedisServer::kPassword));
    if (r != nullptr) {
      ok = r->type == REDIS_REPLY_STATUS;
      freeReplyObject(r);
    }
    if (ok) {
      r = static_cast<redisReply*>(redisCommand(c, "PING"));
      ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
      if (r != nullptr) freeReplyObject(r);
    }
  }
  if (c != nullptr) redisFree(c);
  return ok;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start() {
  char tmpl[] = "/tmp/optireduce-redis-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  std::unique_ptr<RedisServer> server(new RedisServer());
  server->dir_ = tmpl;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int port = FreeLoopbackPort();
    if (port <= 0) continue;
    const std::string port_s = std::to_string(port);
    const std::string log = server->dir_ + "/redis.log";
    std::vector<std::string> args = {"/usr/bin/redis-server", "--port", port_s, "--bind",
                                     "127.0.0.1", "--requirepass", kPassword, "--save", "",
                                     "--appendonly", "no", "--dir", server->dir_,
                                     "--logfile", log, "--daemonize", "no"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return absl::InternalError("fork failed");
    if (pid == 0) {
      // Die with the test process, whatever way it ends.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    server->pid_ = pid;
    server->port_ = port;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Answers(port)) return server;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {  // failed to start (port taken?)
        server->pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    server->Kill();
  }
  return absl::UnavailableError(
      absl::StrCat("redis-server did not start; see logs in ", server->dir_));
}

void RedisServer::Kill() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

void RedisServer::Pause() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}

void RedisServer::Resume() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}

RedisServer::~RedisServer() {
  Kill();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string RedisServer::Url() const {
  return absl::StrCat("redis://:", kPassword, "@127.0.0.1:", port_);
}

}  // namespace testing
}  // namespace optireduce
