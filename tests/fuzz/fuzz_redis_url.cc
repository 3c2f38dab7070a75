// Fuzz target: rendezvous::ParseRedisUrl (credentials from OPTIREDUCE_REDIS_URL).
// Checks: no crash; a parsed URL has a host and a valid port; neither the error message
// nor Endpoint() (what logs print) contains the password.
#include <string>

#include "rendezvous/redis_url.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  auto parsed = optireduce::rendezvous::ParseRedisUrl(url);
  if (!parsed.ok()) {
    // The raw userinfo (before percent-decoding) must not be echoed either.
    const size_t scheme = url.find("://");
    const size_t at = url.rfind('@');
    if (scheme != std::string::npos && at != std::string::npos && at > scheme + 3 &&
        url.find('/', scheme + 3) > at) {
      const std::string userinfo = url.substr(scheme + 3, at - scheme - 3);
      const std::string rest = url.substr(at + 1);
      if (userinfo.size() >= 6 && rest.find(userinfo) == std::string::npos) {
        FUZZ_CHECK(parsed.status().message().find(userinfo) == absl::string_view::npos,
                   "credentials echoed: %s", std::string(parsed.status().message()).c_str());
      }
    }
    return 0;
  }
  FUZZ_CHECK(!parsed->host.empty(), "no host");
  FUZZ_CHECK(parsed->port > 0 && parsed->port < 65536, "port %d", parsed->port);
  FUZZ_CHECK(parsed->db >= 0, "db %d", parsed->db);
  const std::string endpoint = parsed->Endpoint();
  // (Unless the password happens to be a substring of host:port/db itself.)
  const std::string visible = parsed->host + ":" + std::to_string(parsed->port) + "/" +
                              std::to_string(parsed->db);
  if (parsed->password.size() >= 6 && visible.find(parsed->password) == std::string::npos) {
    FUZZ_CHECK(endpoint.find(parsed->password) == std::string::npos, "password in %s",
               endpoint.c_str());
  }
  return 0;
}
