// Fuzz target: rendezvous::ParseRedisUrl (credentials from OPTIREDUCE_REDIS_URL).
// Checks: no crash; a parsed URL has a host and a valid port; the password never shows:
// the error message must not change when the password's letters and digits are replaced
// by others of the same class (so validity is unchanged), and Endpoint() (what logs
// print) must not contain it.
#include <string>

#include "rendezvous/redis_url.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/redis_password.h"

using optireduce_fuzz::WithOtherPassword;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  auto parsed = optireduce::rendezvous::ParseRedisUrl(url);
  const std::string other = WithOtherPassword(url);
  if (!other.empty()) {
    auto parsed_other = optireduce::rendezvous::ParseRedisUrl(other);
    FUZZ_CHECK(parsed.ok() == parsed_other.ok(), "validity depends on the password's letters");
    if (!parsed.ok()) {
      FUZZ_CHECK(parsed.status().message() == parsed_other.status().message(),
                 "the error message shows the password: %s",
                 std::string(parsed.status().message()).c_str());
    } else {
      FUZZ_CHECK(parsed->Endpoint() == parsed_other->Endpoint(), "Endpoint() shows the password");
    }
  }
  if (!parsed.ok()) return 0;
  FUZZ_CHECK(!parsed->host.empty(), "no host");
  FUZZ_CHECK(parsed->port > 0 && parsed->port < 65536, "port %d", parsed->port);
  FUZZ_CHECK(parsed->db >= 0, "db %d", parsed->db);
  return 0;
}
