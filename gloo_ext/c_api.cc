#include "gloo_ext/c_api.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_join.h"
#include "gloo_ext/config.h"
#include "gloo_ext/devices.h"
#include "gloo_ext/interposer.h"
#include "gloo_ext/optireduce_mode.h"
#include "rendezvous/redis_kv.h"

#define OPTIREDUCE_EXPORT __attribute__((visibility("default")))

struct optireduce_redis {
  std::unique_ptr<optireduce::rendezvous::RedisKv> kv;
};

namespace {

thread_local std::string last_error;

int Fail(const absl::Status& status) {
  last_error = std::string(status.message());
  return status.code() == absl::StatusCode::kOk ? static_cast<int>(absl::StatusCode::kUnknown)
                                                : static_cast<int>(status.code());
}

int Ok() {
  last_error.clear();
  return 0;
}

// Runs `body` (returning int), turning C++ exceptions into error codes: nothing may unwind
// through the C boundary into ctypes.
template <typename F>
int Guard(F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    last_error = e.what();
    return static_cast<int>(absl::StatusCode::kInternal);
  } catch (...) {
    last_error = "unknown C++ exception";
    return static_cast<int>(absl::StatusCode::kInternal);
  }
}

char* CopyString(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p != nullptr) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

void* CopyBytes(const std::string& s, size_t* len) {
  // malloc(0) may return NULL; always hand out a valid pointer.
  void* p = std::malloc(s.empty() ? 1 : s.size());
  if (p != nullptr && !s.empty()) std::memcpy(p, s.data(), s.size());
  *len = s.size();
  return p;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string StatsJson() {
  return absl::StrCat("{\"interposer\": ", optireduce::gloo_ext::CountersJson(),
                      ", \"optireduce\": ", optireduce::gloo_ext::OptiReduceStatsJson(),
                      ", \"transport\": ", optireduce::gloo_ext::DeviceStatsJson(),
                      ", \"interposed\": ",
                      optireduce::gloo_ext::InterposerIsFirstInLookup() ? "true" : "false",
                      "}");
}

std::vector<std::string> Keys(const char* const* keys, size_t n) {
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; i++) out.emplace_back(keys[i]);
  return out;
}

// OPTIREDUCE_STATS_FILE: written when the process exits normally.
struct StatsFileAtExit {
  ~StatsFileAtExit() {
    const absl::StatusOr<optireduce::gloo_ext::Config>& config =
        optireduce::gloo_ext::GetConfig();
    if (!config.ok() || config->stats_file.empty()) return;
    const std::string path =
        absl::StrReplaceAll(config->stats_file, {{"%p", std::to_string(getpid())}});
    FILE* f = std::fopen(path.c_str(), "a");  // after the per-operation lines
    if (f == nullptr) {
      std::fprintf(stderr, "optireduce: cannot write OPTIREDUCE_STATS_FILE=%s\n", path.c_str());
      return;
    }
    const std::string json = StatsJson();
    std::fprintf(f, "%s\n", json.c_str());
    std::fclose(f);
  }
};
StatsFileAtExit stats_file_at_exit;

}  // namespace

extern "C" {

OPTIREDUCE_EXPORT int optireduce_torch_abi_version(void) { return OPTIREDUCE_TORCH_ABI_VERSION; }

OPTIREDUCE_EXPORT const char* optireduce_torch_version(void) { return OPTIREDUCE_VERSION; }

OPTIREDUCE_EXPORT const char* optireduce_last_error(void) { return last_error.c_str(); }

OPTIREDUCE_EXPORT void optireduce_free(void* p) { std::free(p); }

OPTIREDUCE_EXPORT int optireduce_config_check(void) {
  return Guard([] {
    const auto& config = optireduce::gloo_ext::GetConfig();
    return config.ok() ? Ok() : Fail(config.status());
  });
}

OPTIREDUCE_EXPORT char* optireduce_config_json(void) {
  const auto& config = optireduce::gloo_ext::GetConfig();
  if (!config.ok()) {
    Fail(config.status());
    return nullptr;
  }
  std::vector<std::string> sources;
  for (const std::string& s : config->sources) sources.push_back(JsonString(s));
  return CopyString(absl::StrCat(
      "{\"algo\": ", JsonString(optireduce::gloo_ext::AlgoName(config->algo)),
      ", \"hadamard\": ",
      JsonString(config->hadamard == optireduce::gloo_ext::HadamardSetting::kDefault
                     ? "default"
                     : config->hadamard == optireduce::gloo_ext::HadamardSetting::kOn ? "on"
                                                                                    : "off"),
      ", \"layout\": ", JsonString(optireduce::gloo_ext::LayoutName(config->layout.layout)),
      ", \"group_size\": ", config->layout.group_size,
      ", \"timeout_ms\": ", config->timeout.count(), ", \"max_loss\": ", config->max_loss,
      ", \"repair_budget\": ", config->repair_budget,
      ", \"start_grace\": ", JsonString(config->learn_start_grace ? "learned" : "budget"),
      ", \"udp_host\": ", JsonString(config->udp_host),
      ", \"udp_port_base\": ", config->udp_port_base,
      ", \"faults\": ", JsonString(config->faults),
      ", \"eal_args\": ", JsonString(config->eal_args),
      ", \"dpdk_ports\": [", absl::StrJoin(config->dpdk_ports, ", ",
                                           [](std::string* out, const std::string& p) {
                                             out->append(JsonString(p));
                                           }),
      "]",
      ", \"sources\": [", absl::StrJoin(sources, ", "), "]}"));
}

OPTIREDUCE_EXPORT char* optireduce_stats_json(void) { return CopyString(StatsJson()); }

OPTIREDUCE_EXPORT void optireduce_reset_stats(void) {
  optireduce::gloo_ext::ResetCounters();
  optireduce::gloo_ext::ResetOptiReduceStats();
}

OPTIREDUCE_EXPORT int optireduce_have_dpdk(void) {
  return optireduce::gloo_ext::HaveDpdkDevice() ? 1 : 0;
}

OPTIREDUCE_EXPORT int optireduce_is_interposed(void) {
  return optireduce::gloo_ext::InterposerIsFirstInLookup() ? 1 : 0;
}

OPTIREDUCE_EXPORT optireduce_redis* optireduce_redis_open(const char* url, const char* job_id,
                                                          const char* run_id, int world_size,
                                                          int64_t timeout_ms,
                                                          int64_t connect_timeout_ms) {
  optireduce_redis* handle = nullptr;
  Guard([&] {
    optireduce::rendezvous::RedisOptions options;
    options.url = url != nullptr ? url : "";
    options.job_id = job_id != nullptr ? job_id : "";
    options.run_id = run_id != nullptr ? run_id : "";
    options.world_size = world_size;
    if (timeout_ms > 0) options.timeout = std::chrono::milliseconds(timeout_ms);
    if (connect_timeout_ms > 0) {
      options.connect_timeout = std::chrono::milliseconds(connect_timeout_ms);
    }
    auto kv = optireduce::rendezvous::RedisKv::Connect(options);
    if (!kv.ok()) return Fail(kv.status());
    handle = new optireduce_redis{std::move(*kv)};
    return Ok();
  });
  return handle;
}

OPTIREDUCE_EXPORT int optireduce_redis_close(optireduce_redis* h) {
  if (h == nullptr) return Ok();
  const int rc = Guard([&] {
    absl::Status s = h->kv->Finish();
    return s.ok() ? Ok() : Fail(s);
  });
  delete h;
  return rc;
}

OPTIREDUCE_EXPORT int optireduce_redis_set(optireduce_redis* h, const char* key,
                                           const void* value, size_t len) {
  return Guard([&] {
    absl::Status s = h->kv->Set(key, absl::string_view(static_cast<const char*>(value), len));
    return s.ok() ? Ok() : Fail(s);
  });
}

OPTIREDUCE_EXPORT int optireduce_redis_get(optireduce_redis* h, const char* key,
                                           int64_t timeout_ms, void** value, size_t* len) {
  return Guard([&] {
    auto got = h->kv->Get(key, timeout_ms > 0 ? std::chrono::milliseconds(timeout_ms)
                                              : h->kv->options().timeout);
    if (!got.ok()) return Fail(got.status());
    *value = CopyBytes(*got, len);
    return Ok();
  });
}

OPTIREDUCE_EXPORT int optireduce_redis_add(optireduce_redis* h, const char* key, int64_t delta,
                                           int64_t* result) {
  return Guard([&] {
    auto got = h->kv->Add(key, delta);
    if (!got.ok()) return Fail(got.status());
    *result = *got;
    return Ok();
  });
}

OPTIREDUCE_EXPORT int optireduce_redis_compare_set(optireduce_redis* h, const char* key,
                                                   const void* expected, size_t expected_len,
                                                   const void* desired, size_t desired_len,
                                                   void** value, size_t* len) {
  return Guard([&] {
    auto got = h->kv->CompareSet(
        key, absl::string_view(static_cast<const char*>(expected), expected_len),
        absl::string_view(static_cast<const char*>(desired), desired_len));
    if (!got.ok()) return Fail(got.status());
    *value = CopyBytes(*got, len);
    return Ok();
  });
}

OPTIREDUCE_EXPORT int optireduce_redis_check(optireduce_redis* h, const char* const* keys,
                                             size_t n, int* result) {
  return Guard([&] {
    auto got = h->kv->Check(Keys(keys, n));
    if (!got.ok()) return Fail(got.status());
    *result = *got ? 1 : 0;
    return Ok();
  });
}

OPTIREDUCE_EXPORT int optireduce_redis_wait(optireduce_redis* h, const char* const* keys,
                                            size_t n, int64_t timeout_ms) {
  return Guard([&] {
    absl::Status s = h->kv->Wait(Keys(keys, n), timeout_ms > 0
                                                    ? std::chrono::milliseconds(timeout_ms)
                                                    : h->kv->options().timeout);
    return s.ok() ? Ok() : Fail(s);
  });
}

OPTIREDUCE_EXPORT int optireduce_redis_delete_key(optireduce_redis* h, const char* key,
                                                  int* existed) {
  return Guard([&] {
    auto got = h->kv->DeleteKey(key);
    if (!got.ok()) return Fail(got.status());
    *existed = *got ? 1 : 0;
    return Ok();
  });
}

OPTIREDUCE_EXPORT int optireduce_redis_num_keys(optireduce_redis* h, int64_t* result) {
  return Guard([&] {
    auto got = h->kv->NumKeys();
    if (!got.ok()) return Fail(got.status());
    *result = *got;
    return Ok();
  });
}

}  // extern "C"
