// optireduce::rendezvous::RedisStore — a gloo::rendezvous::Store on Redis for clusters
// where one Redis serves many jobs: connect/operation timeouts, reconnection, AUTH/ACL,
// SELECT, a per-run key prefix (no "already set" when a job id is reused), key expiry, and
// deletion of the run's keys when every rank finished. See redis_kv.h for the key layout
// and the run/generation scheme.
//
//   auto store = optireduce::rendezvous::RedisStore::Connect(options);  // StatusOr
//   gloo::rendezvous::Context ctx(rank, size);
//   ctx.connectFullMesh(**store, device);
//   ...
//   (*store)->Finish();   // or let the last reference go
//
// The Store virtuals throw gloo::IoException (as Gloo expects) with the cause in the text.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "absl/status/statusor.h"
#include "rendezvous/redis_kv.h"

namespace optireduce {
namespace rendezvous {

class RedisStore : public ::gloo::rendezvous::Store {
 public:
  // InvalidArgumentError for bad options or URL (naming the part), UnavailableError when
  // Redis cannot be reached within connect_timeout, PermissionDeniedError for bad AUTH.
  static absl::StatusOr<std::shared_ptr<RedisStore>> Connect(const RedisOptions& options);

  // Finishes (best effort) if Finish() was not called.
  ~RedisStore() override;

  // Overwrites; the key expires after key_ttl.
  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to options().timeout for the key, then returns it.
  std::vector<char> get(const std::string& key) override;
  // Waits up to options().timeout.
  void wait(const std::vector<std::string>& keys) override;
  // Throws gloo::IoException naming the missing keys when `timeout` passes.
  // gloo::kNoTimeout (0) means options().timeout.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // This rank is done with the store; the last rank deletes the run's keys.
  absl::Status Finish() { return kv_->Finish(); }

  // The full c10d-style API (add, compare_set, check, delete_key, num_keys, ...).
  RedisKv& kv() { return *kv_; }
  const RedisOptions& options() const { return kv_->options(); }

 private:
  explicit RedisStore(std::unique_ptr<RedisKv> kv) : kv_(std::move(kv)) {}
  std::unique_ptr<RedisKv> kv_;
};

}  // namespace rendezvous
}  // namespace optireduce
