// Redis rendezvous options from the environment's configuration (gloo_ext/config.h).
// rendezvous/ reads no environment variable: it takes RedisOptions; this file fills them
// from OPTIREDUCE_REDIS_URL and OPTIREDUCE_RUN_ID for C++ programs (the bench harness) as
// the Python package's optireduce.RedisStore does.
//
//   auto options = optireduce::gloo_ext::RedisOptionsFromEnvironment("job42", 8);
//   if (options.ok()) store = optireduce::rendezvous::RedisStore::Connect(*options);
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gloo_ext/config.h"
#include "rendezvous/redis_kv.h"

namespace optireduce {
namespace gloo_ext {

// url = OPTIREDUCE_REDIS_URL (required: InvalidArgumentError naming the variable when it
// is unset), run_id = OPTIREDUCE_RUN_ID; the rest are RedisOptions' defaults.
absl::StatusOr<rendezvous::RedisOptions> RedisOptionsOf(const Config& config,
                                                        absl::string_view job_id,
                                                        int world_size);

// The same from ConfigFromEnvironment() (the environment as it is now).
absl::StatusOr<rendezvous::RedisOptions> RedisOptionsFromEnvironment(absl::string_view job_id,
                                                                     int world_size);

}  // namespace gloo_ext
}  // namespace optireduce
