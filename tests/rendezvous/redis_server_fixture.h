// Test helper: a real redis-server on a free loopback port, with a password, no
// persistence, in its own temp dir. The destructor always kills it (SIGKILL + waitpid) and
// removes the dir, and the child also dies with the test process (PR_SET_PDEATHSIG), so a
// failing or crashing test leaves no server behind.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace optireduce {
namespace testing {

class RedisServer {
 public:
  static constexpr char kPassword[] = "s3cret-test-pw";

  // Picks a free port, starts /usr/bin/redis-server, waits (<= 5 s) until it answers an
  // authenticated PING; retries with another port if the server fails to start.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start();
  ~RedisServer();

  int port() const { return port_; }
  // redis://:<password>@127.0.0.1:<port>
  std::string Url() const;
  // SIGKILLs the server now and reaps it (idempotent).
  void Kill();
  // SIGSTOP / SIGCONT: a server that accepts connections but never answers.
  void Pause();
  void Resume();

 private:
  RedisServer() = default;
  int pid_ = -1;
  int port_ = 0;
  std::string dir_;
};

// A port on 127.0.0.1 that nothing listens on (bound to port 0, read, closed).
int FreeLoopbackPort();

}  // namespace testing
}  // namespace optireduce
