#include "rendezvous/redis_store.h"

#include <gloo/common/error.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optireduce {
namespace rendezvous {
namespace {

[[noreturn]] void ThrowIo(const absl::Status& status) {
  throw ::gloo::IoException(absl::StrCat("optireduce RedisStore: ", status.ToString()));
}

}  // namespace

absl::StatusOr<std::shared_ptr<RedisStore>> RedisStore::Connect(const RedisOptions& options) {
  auto kv = RedisKv::Connect(options);
  if (!kv.ok()) return kv.status();
  return std::shared_ptr<RedisStore>(new RedisStore(*std::move(kv)));
}

RedisStore::~RedisStore() = default;  // ~RedisKv finishes

void RedisStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = kv_->Set(key, absl::string_view(data.data(), data.size()));
  if (!s.ok()) ThrowIo(s);
}

std::vector<char> RedisStore::get(const std::string& key) {
  auto v = kv_->Get(key, kv_->options().timeout);
  if (!v.ok()) ThrowIo(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void RedisStore::wait(const std::vector<std::string>& keys) {
  wait(keys, kv_->options().timeout);
}

void RedisStore::wait(const std::vector<std::string>& keys,
                      const std::chrono::milliseconds& timeout) {
  absl::Status s =
      kv_->Wait(keys, timeout == ::gloo::kNoTimeout ? kv_->options().timeout : timeout);
  if (!s.ok()) ThrowIo(s);
}

}  // namespace rendezvous
}  // namespace optireduce
