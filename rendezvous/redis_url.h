// Parses the Redis endpoint URL every optireduce rendezvous is configured with:
//   redis://[[user:]password@]host[:port][/db]
// (also "redis://:password@host" for a password without ACL user, as redis-cli accepts).
// User and password may be percent-encoded so they can hold ':', '@' or '/'.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optireduce {
namespace rendezvous {

struct RedisUrl {
  std::string host;
  int port = 6379;
  std::string user;      // empty: the "default" user (AUTH <password>)
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECT target; 0 is Redis' default database

  // "host:port/db" without credentials, for error messages and logs.
  std::string Endpoint() const;
};

// Returns InvalidArgumentError naming the part of the URL that is wrong (scheme, host,
// port, db, percent-encoding). The password never appears in error messages.
absl::StatusOr<RedisUrl> ParseRedisUrl(absl::string_view url);

}  // namespace rendezvous
}  // namespace optireduce
