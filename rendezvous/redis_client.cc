#include "rendezvous/redis_client.h"

#include <sys/time.h>

#include <algorithm>
#include <thread>

#include <hiredis/hiredis.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace optireduce {
namespace rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Backoff between reconnection attempts: short at first (a restarting server is back in
// milliseconds), capped so a long outage costs few attempts.
constexpr milliseconds kFirstBackoff{20};
constexpr milliseconds kMaxBackoff{500};

struct timeval ToTimeval(milliseconds ms) {
  struct timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

milliseconds Remaining(Clock::time_point deadline) {
  return std::max(milliseconds(0),
                  std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// Converts a hiredis reply; an error reply anywhere becomes `*error`.
RedisReply Convert(const redisReply* r, std::string* error) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) {
        out.elements.push_back(Convert(r->element[i], error));
      }
      break;
    case REDIS_REPLY_ERROR:
      error->assign(r->str, r->len);
      break;
    default:  // REDIS_REPLY_NIL
      out.type = RedisReply::Type::kNil;
      break;
  }
  return out;
}

bool IsAuthError(absl::string_view error) {
  return absl::StartsWith(error, "NOAUTH") || absl::StartsWith(error, "WRONGPASS") ||
         absl::StartsWith(error, "NOPERM");
}

}  // namespace

RedisClient::RedisClient(const RedisClientOptions& options) : options_(options) {}

RedisClient::~RedisClient() {
  absl::MutexLock lock(&mu_);
  DropConnection();
}

absl::StatusOr<std::unique_ptr<RedisClient>> RedisClient::Connect(
    const RedisClientOptions& options) {
  if (options.connect_timeout <= milliseconds(0) || options.op_timeout <= milliseconds(0)) {
    return absl::InvalidArgumentError(
        "redis client: connect_timeout and op_timeout must be positive");
  }
  if (options.url.host.empty()) {
    return absl::InvalidArgumentError("redis client: host is empty");
  }
  std::unique_ptr<RedisClient> client(new RedisClient(options));
  absl::MutexLock lock(&client->mu_);
  absl::Status s = client->ConnectUntil(Clock::now() + options.connect_timeout);
  if (!s.ok()) return s;
  return client;
}

void RedisClient::DropConnection() {
  if (context_ != nullptr) {
    redisFree(context_);
    context_ = nullptr;
  }
}

absl::Status RedisClient::ConnectOnce(milliseconds connect_timeout) {
  DropConnection();
  const RedisUrl& url = options_.url;
  redisContext* c =
      redisConnectWithTimeout(url.host.c_str(), url.port, ToTimeval(connect_timeout));
  if (c == nullptr) {
    return absl::ResourceExhaustedError("redis client: cannot allocate a hiredis context");
  }
  if (c->err != 0) {
    std::string why = c->errstr;
    redisFree(c);
    return absl::UnavailableError(
        absl::StrCat("redis ", Endpoint(), ": cannot connect: ", why));
  }
  if (redisSetTimeout(c, ToTimeval(options_.op_timeout)) != REDIS_OK) {
    std::string why = c->errstr;
    redisFree(c);
    return absl::UnavailableError(
        absl::StrCat("redis ", Endpoint(), ": cannot set socket timeout: ", why));
  }
  context_ = c;
  socket_timeout_ = options_.op_timeout;

  // The handshake: AUTH (if configured), SELECT (if not db 0), PING. PING catches a server
  // that demands a password the URL does not give, at connect time rather than later.
  std::vector<std::vector<std::string>> handshake;
  if (!url.password.empty()) {
    if (url.user.empty()) {
      handshake.push_back({"AUTH", url.password});
    } else {
      handshake.push_back({"AUTH", url.user, url.password});
    }
  }
  if (url.db != 0) handshake.push_back({"SELECT", std::to_string(url.db)});
  handshake.push_back({"PING"});
  for (const auto& argv : handshake) {
    bool io_error = false;
    auto reply = SendOnce(argv, &io_error);
    if (reply.ok()) continue;
    DropConnection();
    if (io_error) return reply.status();
    if (argv[0] == "AUTH") {
      return absl::PermissionDeniedError(absl::StrCat(
          reply.status().message(), " (AUTH with ",
          url.user.empty() ? "password only" : absl::StrCat("user '", url.user, "'"), ")"));
    }
    if (reply.status().code() == absl::StatusCode::kPermissionDenied) {
      return absl::PermissionDeniedError(absl::StrCat(
          reply.status().message(), " (the server requires authentication; the URL gives ",
          url.password.empty() ? "no password" : "credentials without this permission", ")"));
    }
    return reply.status();
  }
  return absl::OkStatus();
}

absl::Status RedisClient::ConnectUntil(Clock::time_point deadline) {
  milliseconds backoff = kFirstBackoff;
  int attempts = 0;
  absl::Status last;
  for (;;) {
    milliseconds remaining = Remaining(deadline);
    if (remaining <= milliseconds(0) && attempts > 0) break;
    ++attempts;
    // Each attempt gets at most what is left, but at least a few ms to make progress.
    last = ConnectOnce(std::min(options_.connect_timeout,
                                std::max(remaining, milliseconds(10))));
    if (last.ok()) return last;
    // Credentials and options do not get better by retrying.
    if (last.code() != absl::StatusCode::kUnavailable) return last;
    remaining = Remaining(deadline);
    if (remaining <= milliseconds(0)) break;
    std::this_thread::sleep_for(std::min(backoff, remaining));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  return absl::UnavailableError(
      absl::StrCat(last.message(), " (gave up after ", attempts, " attempt",
                   attempts == 1 ? "" : "s", ")"));
}

absl::StatusOr<RedisReply> RedisClient::SendOnce(const std::vector<std::string>& argv,
                                                 bool* io_error) {
  *io_error = false;
  std::vector<const char*> args;
  std::vector<size_t> lens;
  args.reserve(argv.size());
  lens.reserve(argv.size());
  for (const auto& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  ReplyPtr reply(static_cast<redisReply*>(
      redisCommandArgv(context_, static_cast<int>(argv.size()), args.data(), lens.data())));
  const std::string& cmd = argv.empty() ? std::string("(empty)") : argv[0];
  if (reply == nullptr) {
    *io_error = true;
    std::string why = context_->errstr[0] != '\0' ? context_->errstr : "connection lost";
    if (context_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      why = absl::StrCat("no reply within ", socket_timeout_.count(), " ms (op_timeout ",
                         options_.op_timeout.count(), " ms)");
    }
    return absl::UnavailableError(
        absl::StrCat("redis ", Endpoint(), ": ", cmd, " failed: ", why));
  }
  std::string error;
  RedisReply out = Convert(reply.get(), &error);
  if (!error.empty()) {
    std::string msg = absl::StrCat("redis ", Endpoint(), ": ", cmd, " failed: ", error);
    if (IsAuthError(error)) return absl::PermissionDeniedError(msg);
    return absl::FailedPreconditionError(msg);
  }
  return out;
}

absl::StatusOr<RedisReply> RedisClient::Command(const std::vector<std::string>& argv,
                                                Retry retry, Clock::time_point deadline) {
  if (argv.empty()) return absl::InvalidArgumentError("redis client: empty command");
  absl::MutexLock lock(&mu_);
  const Clock::time_point own_deadline = Clock::now() + options_.op_timeout;
  const bool caller_bounded = deadline < own_deadline;
  deadline = std::min(deadline, own_deadline);
  std::string lost;  // why the connection dropped, for the final error
  for (;;) {
    if (context_ == nullptr) {
      absl::Status s = ConnectUntil(deadline);
      if (!s.ok()) {
        if (lost.empty()) return s;
        return absl::Status(s.code(), absl::StrCat("connection lost (", lost,
                                                   ") and reconnecting within op_timeout ",
                                                   options_.op_timeout.count(),
                                                   " ms failed: ", s.message()));
      }
    }
    // The socket timeout is op_timeout, shortened to the caller's deadline so a hung
    // server cannot hold a wait past its own timeout.
    const milliseconds socket_timeout =
        caller_bounded ? std::max(milliseconds(1), Remaining(deadline)) : options_.op_timeout;
    if (socket_timeout != socket_timeout_) {
      if (redisSetTimeout(context_, ToTimeval(socket_timeout)) == REDIS_OK) {
        socket_timeout_ = socket_timeout;
      }
    }
    bool io_error = false;
    auto reply = SendOnce(argv, &io_error);
    if (!io_error) return reply;
    DropConnection();
    lost = std::string(reply.status().message());
    if (retry == Retry::kNever) {
      return absl::UnavailableError(absl::StrCat(
          lost, "; the connection dropped during non-idempotent ", argv[0],
          ", so whether it was applied is unknown"));
    }
    if (Remaining(deadline) <= milliseconds(0)) {
      return absl::UnavailableError(absl::StrCat(
          lost, caller_bounded ? " (caller's deadline reached)"
                               : absl::StrCat(" (op_timeout ", options_.op_timeout.count(),
                                              " ms spent)")));
    }
  }
}

}  // namespace rendezvous
}  // namespace optireduce
