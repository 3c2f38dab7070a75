#include "gloo_ext/redis_options.h"

#include <string>

namespace optireduce {
namespace gloo_ext {

absl::StatusOr<rendezvous::RedisOptions> RedisOptionsOf(const Config& config,
                                                        absl::string_view job_id,
                                                        int world_size) {
  if (config.redis_url.empty()) {
    return absl::InvalidArgumentError(
        "OPTIREDUCE_REDIS_URL is not set (expected redis://[user:password@]host:port[/db])");
  }
  rendezvous::RedisOptions o;
  o.url = config.redis_url;
  o.run_id = config.run_id;
  o.job_id = std::string(job_id);
  o.world_size = world_size;
  return o;
}

absl::StatusOr<rendezvous::RedisOptions> RedisOptionsFromEnvironment(absl::string_view job_id,
                                                                     int world_size) {
  absl::StatusOr<Config> config = ConfigFromEnvironment();
  if (!config.ok()) return config.status();
  return RedisOptionsOf(*config, job_id, world_size);
}

}  // namespace gloo_ext
}  // namespace optireduce
