// A job-scoped key-value store on Redis: every key lives under a prefix unique to one run
// of one job, expires after a TTL, and is deleted when every rank finished cleanly. It has
// the operations both Gloo's rendezvous::Store and torch's c10d::Store need
// (set/get/wait/check/add/compare_set/delete_key/num_keys), with absl::Status errors;
// RedisStore adapts it to Gloo, and a c10d::Store can wrap it the same way.
//
// Key layout (all strings; the user key is appended verbatim):
//   optireduce/<job_id>/joins                   join counter, agrees the run generation
//   optireduce/<job_id>/gen/<g>/k/<key>         a user key of generation g
//   optireduce/<job_id>/run/<run_id>/k/<key>    ... or of an explicitly named run
//   <run prefix>keys                            SET of the run's user keys (cleanup, num_keys)
//   <run prefix>done                            how many ranks called Finish()
//
// Run separation (why two runs of one job id never see each other's keys):
//  * If options.run_id is given (e.g. torchrun's TORCHELASTIC_RUN_ID + restart count), it
//    names the run. This is the robust choice when the launcher has such a nonce.
//  * Otherwise every rank INCRs the job's join counter once when it connects and takes
//    generation g = (n - 1) / world_size: the first world_size joins are run 0, the next
//    world_size are run 1, and so on. Each rank must connect exactly once per run.
//  * Finish(): each rank INCRs the run's done counter; the one that makes it world_size
//    deletes all the run's keys, and the join counter too when no later run joined yet,
//    so after a clean run nothing of the job is left in Redis and the next run is gen 0.
//    A rank that crashes leaves its run's keys to expire by TTL; the next run still gets a
//    fresh generation (when all ranks of the crashed run had joined). If a run crashed
//    before all its ranks joined, the join counter is misaligned until it expires (TTL)
//    or is deleted; rendezvous then fails with a timeout that says so — pass run_id to
//    avoid this class of problem entirely.
//  * set() overwrites (SET, not SETNX): within one run keys are written once by Gloo, and
//    torch's c10d set() overwrites anyway, so "already set" can never happen.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "rendezvous/redis_client.h"

namespace optireduce {
namespace rendezvous {

struct RedisOptions {
  // redis://[[user:]password@]host[:port][/db]
  std::string url;
  // Names the job; keys of different jobs never meet. Non-empty, no '/' or whitespace.
  std::string job_id;
  // Optional nonce naming this run of the job; empty = agree a generation by join counter.
  std::string run_id;
  // Number of ranks that use this store in a run. Required (> 0): it sizes the join
  // generations and tells Finish() when the last rank is done.
  int world_size = 0;
  std::chrono::milliseconds connect_timeout{5000};
  // Bounds each Redis command, including reconnecting after a dropped connection.
  std::chrono::milliseconds op_timeout{10000};
  // Default for wait() without a timeout and for get() of a key that is not there yet.
  std::chrono::milliseconds timeout{30000};
  // Every key written gets this expiry (refreshed on rewrite), so crashed jobs leave
  // nothing behind for long on a Redis shared by many jobs.
  std::chrono::seconds key_ttl{3600};
};

class RedisKv {
 public:
  // Parses the URL, connects, authenticates and joins the run (see above).
  static absl::StatusOr<std::unique_ptr<RedisKv>> Connect(const RedisOptions& options);

  // Calls Finish() if it was not called (errors are dropped: a destructor cannot report).
  ~RedisKv();
  RedisKv(const RedisKv&) = delete;
  RedisKv& operator=(const RedisKv&) = delete;

  // Sets (overwrites) key with TTL.
  absl::Status Set(absl::string_view key, absl::string_view value);
  // The value, or nullopt if the key does not exist; never waits.
  absl::StatusOr<std::optional<std::string>> TryGet(absl::string_view key);
  // Waits up to `timeout` for the key, then returns its value.
  absl::StatusOr<std::string> Get(absl::string_view key, std::chrono::milliseconds timeout);
  // INCRBY: creates the key at 0 if missing; returns the new value. Not retried on a
  // dropped connection (the error says the outcome is unknown).
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta);
  // c10d semantics: if the key is missing and `expected` is empty, or the key holds
  // `expected`, store `desired` and return it; otherwise return the current value (or
  // `expected` when the key is missing).
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired);
  // True when all keys exist.
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  // Waits until all keys exist. DeadlineExceededError naming the missing keys on timeout;
  // the Redis error (e.g. UnavailableError: server gone) if Redis fails meanwhile.
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // True if the key existed.
  absl::StatusOr<bool> DeleteKey(absl::string_view key);
  // Number of this run's keys (written through this API and not deleted).
  absl::StatusOr<int64_t> NumKeys();

  // This rank is done with the store. The last of world_size ranks deletes every key of
  // the run (see above); keys stay readable until then. Attempted once: later calls (and
  // the destructor) return OK without contacting Redis, also after a failed attempt, whose
  // keys then expire after key_ttl.
  absl::Status Finish();

  // "optireduce/<job_id>/gen/<g>/" or ".../run/<run_id>/".
  const std::string& run_prefix() const { return run_prefix_; }
  // The Redis key a user key is stored at.
  std::string RedisKey(absl::string_view key) const;
  const RedisOptions& options() const { return options_; }
  RedisClient& client() { return *client_; }

 private:
  RedisKv(const RedisOptions& options, std::unique_ptr<RedisClient> client);
  absl::Status Join();
  std::string Ttl() const;
  // Redis keys for `keys`, and the subset that does not exist yet.
  absl::StatusOr<std::vector<std::string>> Missing(const std::vector<std::string>& keys,
                                                   std::chrono::steady_clock::time_point deadline);

  const RedisOptions options_;
  std::unique_ptr<RedisClient> client_;
  std::string job_prefix_;   // optireduce/<job_id>/
  std::string run_prefix_;
  std::string joins_key_;
  std::string keyset_key_;
  std::string done_key_;
  // Value of the join counter when exactly this run has joined ("" with run_id): Finish()
  // deletes the counter only if it still holds this, i.e. no later run started.
  std::string joins_at_full_run_;
  absl::Mutex finish_mu_;
  bool finished_ ABSL_GUARDED_BY(finish_mu_) = false;
};

}  // namespace rendezvous
}  // namespace optireduce
