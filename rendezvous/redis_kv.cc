#include "rendezvous/redis_kv.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace optireduce {
namespace rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Waits poll with EXISTS: first soon (rendezvous keys usually arrive within ms), then
// backing off so hundreds of waiting ranks do not hammer a shared Redis.
constexpr milliseconds kFirstPoll{2};
constexpr milliseconds kMaxPoll{50};

// The scripts make each logical operation (write + TTL + key tracking) atomic and one
// round trip. KEYS[1] = the user key, KEYS[2] = the run's key set, ARGV[last] = TTL s.
constexpr char kSetScript[] = R"lua(
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('SADD', KEYS[2], KEYS[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
)lua";

constexpr char kAddScript[] = R"lua(
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], KEYS[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return v
)lua";

// ARGV[1] = expected, ARGV[2] = desired, ARGV[3] = TTL.
constexpr char kCompareSetScript[] = R"lua(
local cur = redis.call('GET', KEYS[1])
if (cur == false and ARGV[1] == '') or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  redis.call('SADD', KEYS[2], KEYS[1])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  return ARGV[2]
end
if cur == false then return ARGV[1] end
return cur
)lua";

constexpr char kDeleteScript[] = R"lua(
local n = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], KEYS[1])
return n
)lua";

// KEYS[1] = done counter, KEYS[2] = key set, KEYS[3] = join counter.
// ARGV[1] = world size, ARGV[2] = TTL, ARGV[3] = join counter value of a full run ("" none).
// Returns 1 when this call was the last rank and cleaned up.
constexpr char kFinishScript[] = R"lua(
local d = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
if d < tonumber(ARGV[1]) then return 0 end
local keys = redis.call('SMEMBERS', KEYS[2])
for i = 1, #keys do redis.call('DEL', keys[i]) end
redis.call('DEL', KEYS[2], KEYS[1])
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) == ARGV[3] then
  redis.call('DEL', KEYS[3])
end
return 1
)lua";

absl::Status ValidateOptions(const RedisOptions& o) {
  if (o.job_id.empty()) return absl::InvalidArgumentError("redis store: job_id is empty");
  for (absl::string_view name : {absl::string_view("job_id"), absl::string_view("run_id")}) {
    const std::string& v = name == "job_id" ? o.job_id : o.run_id;
    if (v.size() > 200) {
      return absl::InvalidArgumentError(
          absl::StrCat("redis store: ", name, " is longer than 200 characters"));
    }
    for (char c : v) {
      if (c == '/' || static_cast<unsigned char>(c) <= ' ' || c == 0x7f) {
        return absl::InvalidArgumentError(absl::StrCat(
            "redis store: ", name, " \"", v, "\" contains '/', whitespace or a control character"));
      }
    }
  }
  if (o.world_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis store: world_size must be positive, got ", o.world_size));
  }
  if (o.key_ttl.count() <= 0) {
    return absl::InvalidArgumentError("redis store: key_ttl must be at least 1 s");
  }
  if (o.timeout.count() <= 0) {
    return absl::InvalidArgumentError("redis store: timeout must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

RedisKv::RedisKv(const RedisOptions& options, std::unique_ptr<RedisClient> client)
    : options_(options), client_(std::move(client)) {
  job_prefix_ = absl::StrCat("optireduce/", options_.job_id, "/");
  joins_key_ = absl::StrCat(job_prefix_, "joins");
}

absl::StatusOr<std::unique_ptr<RedisKv>> RedisKv::Connect(const RedisOptions& options) {
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  auto url = ParseRedisUrl(options.url);
  if (!url.ok()) return url.status();
  RedisClientOptions copts;
  copts.url = *url;
  copts.connect_timeout = options.connect_timeout;
  copts.op_timeout = options.op_timeout;
  auto client = RedisClient::Connect(copts);
  if (!client.ok()) return client.status();
  std::unique_ptr<RedisKv> kv(new RedisKv(options, *std::move(client)));
  absl::Status joined = kv->Join();
  if (!joined.ok()) {
    absl::MutexLock lock(&kv->finish_mu_);
    kv->finished_ = true;  // never joined: nothing to finish
    return joined;
  }
  return kv;
}

absl::Status RedisKv::Join() {
  if (!options_.run_id.empty()) {
    run_prefix_ = absl::StrCat(job_prefix_, "run/", options_.run_id, "/");
  } else {
    auto n = client_->Command({"INCR", joins_key_}, RedisClient::Retry::kNever);
    if (!n.ok()) {
      return absl::Status(n.status().code(),
                          absl::StrCat("joining job ", options_.job_id, ": ", n.status().message()));
    }
    auto ttl = client_->Command({"EXPIRE", joins_key_, Ttl()});
    if (!ttl.ok()) return ttl.status();
    const int64_t gen = (n->integer - 1) / options_.world_size;
    run_prefix_ = absl::StrCat(job_prefix_, "gen/", gen, "/");
    joins_at_full_run_ = absl::StrCat((gen + 1) * options_.world_size);
  }
  keyset_key_ = absl::StrCat(run_prefix_, "keys");
  done_key_ = absl::StrCat(run_prefix_, "done");
  return absl::OkStatus();
}

RedisKv::~RedisKv() { Finish().IgnoreError(); }

std::string RedisKv::Ttl() const { return absl::StrCat(options_.key_ttl.count()); }

std::string RedisKv::RedisKey(absl::string_view key) const {
  return absl::StrCat(run_prefix_, "k/", key);
}

absl::Status RedisKv::Set(absl::string_view key, absl::string_view value) {
  auto r = client_->Command({"EVAL", kSetScript, "2", RedisKey(key), keyset_key_,
                             std::string(value), Ttl()});
  return r.status();
}

absl::StatusOr<std::optional<std::string>> RedisKv::TryGet(absl::string_view key) {
  auto r = client_->Command({"GET", RedisKey(key)});
  if (!r.ok()) return r.status();
  if (r->type == RedisReply::Type::kNil) return std::optional<std::string>();
  return std::optional<std::string>(std::move(r->str));
}

absl::StatusOr<std::string> RedisKv::Get(absl::string_view key, milliseconds timeout) {
  absl::Status waited = Wait({std::string(key)}, timeout);
  if (!waited.ok()) return waited;
  auto v = TryGet(key);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    return absl::NotFoundError(absl::StrCat("redis store: key '", key, "' of ", run_prefix_,
                                            " was deleted or expired right after it appeared"));
  }
  return **std::move(v);
}

absl::StatusOr<int64_t> RedisKv::Add(absl::string_view key, int64_t delta) {
  auto r = client_->Command({"EVAL", kAddScript, "2", RedisKey(key), keyset_key_,
                             absl::StrCat(delta), Ttl()},
                            RedisClient::Retry::kNever);
  if (!r.ok()) return r.status();
  return r->integer;
}

absl::StatusOr<std::string> RedisKv::CompareSet(absl::string_view key,
                                                absl::string_view expected,
                                                absl::string_view desired) {
  auto r = client_->Command({"EVAL", kCompareSetScript, "2", RedisKey(key), keyset_key_,
                             std::string(expected), std::string(desired), Ttl()});
  if (!r.ok()) return r.status();
  return std::move(r->str);
}

absl::StatusOr<std::vector<std::string>> RedisKv::Missing(
    const std::vector<std::string>& keys, Clock::time_point deadline) {
  std::vector<std::string> missing;
  if (keys.empty()) return missing;
  // One round trip for the common case: EXISTS counts how many are there.
  std::vector<std::string> argv = {"EXISTS"};
  for (const auto& k : keys) argv.push_back(RedisKey(k));
  auto n = client_->Command(argv, RedisClient::Retry::kIdempotent, deadline);
  if (!n.ok()) return n.status();
  if (n->integer == static_cast<long long>(keys.size())) return missing;
  for (const auto& k : keys) {
    auto one = client_->Command({"EXISTS", RedisKey(k)}, RedisClient::Retry::kIdempotent,
                                deadline);
    if (!one.ok()) return one.status();
    if (one->integer == 0) missing.push_back(k);
  }
  // Keys may have appeared between the two steps; report whatever is still missing.
  return missing;
}

absl::StatusOr<bool> RedisKv::Check(const std::vector<std::string>& keys) {
  auto missing = Missing(keys, Clock::time_point::max());
  if (!missing.ok()) return missing.status();
  return missing->empty();
}

absl::Status RedisKv::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout;
  milliseconds poll = kFirstPoll;
  std::vector<std::string> last_missing = keys;  // as of the last check that finished
  auto timed_out = [&](Clock::time_point now, absl::string_view note) {
    const std::string hint =
        options_.run_id.empty()
            ? absl::StrCat(" (if a rank of an earlier run of job '", options_.job_id,
                           "' crashed before joining, the join counter ", joins_key_,
                           " is misaligned: delete it or pass a run_id)")
            : std::string();
    return absl::DeadlineExceededError(absl::StrCat(
        "redis store: wait timed out after ",
        std::chrono::duration_cast<milliseconds>(now - start).count(), " ms (timeout ",
        timeout.count(), " ms) at ", client_->Endpoint(), "; missing keys [",
        absl::StrJoin(last_missing, ", "), "] under ", run_prefix_, note, hint));
  };
  for (;;) {
    auto missing = Missing(keys, deadline);
    const Clock::time_point now = Clock::now();
    if (!missing.ok()) {
      // A check cut short by the caller's own deadline is a timeout, not a Redis failure.
      if (now >= deadline) {
        return timed_out(now, absl::StrCat(" (last check unfinished: ",
                                           missing.status().message(), ")"));
      }
      return absl::Status(missing.status().code(),
                          absl::StrCat("while waiting for keys [", absl::StrJoin(keys, ", "),
                                       "] of ", run_prefix_, ": ", missing.status().message()));
    }
    if (missing->empty()) return absl::OkStatus();
    last_missing = *missing;
    if (now >= deadline) return timed_out(now, "");
    std::this_thread::sleep_for(
        std::min(poll, std::chrono::duration_cast<milliseconds>(deadline - now) +
                           milliseconds(1)));
    poll = std::min(poll * 2, kMaxPoll);
  }
}

absl::StatusOr<bool> RedisKv::DeleteKey(absl::string_view key) {
  auto r = client_->Command({"EVAL", kDeleteScript, "2", RedisKey(key), keyset_key_});
  if (!r.ok()) return r.status();
  return r->integer > 0;
}

absl::StatusOr<int64_t> RedisKv::NumKeys() {
  auto r = client_->Command({"SCARD", keyset_key_});
  if (!r.ok()) return r.status();
  return r->integer;
}

absl::Status RedisKv::Finish() {
  absl::MutexLock lock(&finish_mu_);
  if (finished_) return absl::OkStatus();
  // One attempt only, even if it fails: a dropped connection may have counted this rank
  // already, and counting it twice would delete the run's keys while a rank still needs
  // them. On failure the keys expire after key_ttl instead.
  finished_ = true;
  auto r = client_->Command({"EVAL", kFinishScript, "3", done_key_, keyset_key_, joins_key_,
                             absl::StrCat(options_.world_size), Ttl(), joins_at_full_run_},
                            RedisClient::Retry::kNever);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("finishing ", run_prefix_, ": ", r.status().message(),
                                     " (the run's keys will expire after key_ttl)"));
  }
  return absl::OkStatus();
}

}  // namespace rendezvous
}  // namespace optireduce
