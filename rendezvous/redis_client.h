// A blocking Redis protocol client on hiredis 0.14: one connection, AUTH (password or
// ACL user+password), SELECT, per-command timeouts, and reconnection with backoff when the
// connection drops. Every call is bounded in time; nothing here waits forever.
//
// Thread-safe: commands from several threads are serialised on the one connection.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rendezvous/redis_url.h"

struct redisContext;

namespace optireduce {
namespace rendezvous {

// An owned copy of a hiredis reply (error replies become a non-OK Status instead).
struct RedisReply {
  enum class Type { kString, kStatus, kInteger, kNil, kArray };
  Type type = Type::kNil;
  std::string str;            // kString, kStatus
  long long integer = 0;      // kInteger
  std::vector<RedisReply> elements;  // kArray
};

struct RedisClientOptions {
  RedisUrl url;
  // Bounds establishing a connection (TCP connect + AUTH + SELECT) in Connect(); a server
  // that refuses is retried with backoff until this runs out.
  std::chrono::milliseconds connect_timeout{5000};
  // Bounds one command: socket read/write timeout, and the total time spent reconnecting
  // after the connection dropped.
  std::chrono::milliseconds op_timeout{10000};
};

class RedisClient {
 public:
  // Whether a command may be re-sent after the connection dropped while it was in flight.
  // A dropped INCR may or may not have been applied, so it is reported, not repeated.
  enum class Retry { kIdempotent, kNever };

  // Connects, authenticates and selects the database. Errors:
  //   UnavailableError         host unreachable / refused / timed out (after retries)
  //   PermissionDeniedError    AUTH rejected, or the server demands a password
  //   InvalidArgumentError     bad options (e.g. non-positive timeouts)
  static absl::StatusOr<std::unique_ptr<RedisClient>> Connect(const RedisClientOptions& options);

  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs one command given as binary-safe arguments. Server error replies become
  // FailedPreconditionError (PermissionDeniedError for NOAUTH/WRONGPASS/NOPERM) naming the
  // command; lost connections become UnavailableError after reconnecting failed within
  // op_timeout.
  // `deadline` (if earlier than now + op_timeout) caps the time spent, so callers with
  // their own timeout (a wait) are never held longer than they asked for.
  absl::StatusOr<RedisReply> Command(
      const std::vector<std::string>& argv, Retry retry = Retry::kIdempotent,
      std::chrono::steady_clock::time_point deadline =
          std::chrono::steady_clock::time_point::max());

  const RedisClientOptions& options() const { return options_; }
  // "host:port/db", without credentials.
  std::string Endpoint() const { return options_.url.Endpoint(); }

 private:
  explicit RedisClient(const RedisClientOptions& options);

  // (Re)establishes the connection; tries until `deadline`. Replaces context_.
  absl::Status ConnectUntil(std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One attempt: TCP connect, timeouts, AUTH, SELECT.
  absl::Status ConnectOnce(std::chrono::milliseconds connect_timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends argv on the current connection; `io_error` tells whether the connection broke.
  absl::StatusOr<RedisReply> SendOnce(const std::vector<std::string>& argv, bool* io_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropConnection() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RedisClientOptions options_;
  absl::Mutex mu_;
  redisContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::chrono::milliseconds socket_timeout_ ABSL_GUARDED_BY(mu_){0};
};

}  // namespace rendezvous
}  // namespace optireduce
