// Fuzz target: gloo_ext::ParseConfig, which reads every environment variable a user can
// set. Input: lines "NAME=value"; NAME may be "#k" (the k-th documented variable) or
// "@k" (its GLOO_DPDK_ alias), so the fuzzer reaches every variable quickly.
// Checks: no crash; errors are InvalidArgument with a message; the Redis password never
// appears in an error message or in the parsed `sources`.
#include <map>
#include <string>

#include "gloo_ext/config.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using optireduce::gloo_ext::DocumentedVariables;

std::string NameOf(const std::string& key) {
  const auto& docs = DocumentedVariables();
  if (key.size() >= 2 && (key[0] == '#' || key[0] == '@') && !docs.empty()) {
    size_t k = 0;
    for (size_t i = 1; i < key.size() && i < 6; ++i) k = k * 10 + (key[i] & 0x0f);
    const auto& d = docs[k % docs.size()];
    return key[0] == '@' && d.alias[0] != '\0' ? d.alias : d.name;
  }
  return key;
}

// The password part of a redis URL ("redis://[user:]password@host..."), or "".
std::string PasswordOf(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return "";
  const size_t host_start = scheme + 3;
  const size_t path = url.find('/', host_start);
  const size_t at = url.rfind('@', path == std::string::npos ? std::string::npos : path);
  if (at == std::string::npos || at < host_start) return "";
  std::string userinfo = url.substr(host_start, at - host_start);
  const size_t colon = userinfo.find(':');
  return colon == std::string::npos ? userinfo : userinfo.substr(colon + 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> env;
  std::string text(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[NameOf(line.substr(0, eq))] = line.substr(eq + 1);
    pos = nl + 1;
  }
  auto result = optireduce::gloo_ext::ParseConfig(
      [&env](absl::string_view name) -> std::optional<std::string> {
        auto it = env.find(std::string(name));
        if (it == env.end()) return std::nullopt;
        return it->second;
      });
  std::vector<std::string> names;
  for (const auto& kv : env) names.push_back(kv.first);
  optireduce::gloo_ext::UnknownOptiReduceNames(names);

  // The password must not leak, unless the same text is legitimately echoed from
  // another variable (or is so short that it appears by chance).
  std::string password;
  auto url = env.find("OPTIREDUCE_REDIS_URL");
  if (url != env.end()) password = PasswordOf(url->second);
  bool checkable = password.size() >= 6;
  for (const auto& kv : env) {
    if (kv.first != "OPTIREDUCE_REDIS_URL" &&
        (kv.first.find(password) != std::string::npos ||
         kv.second.find(password) != std::string::npos)) {
      checkable = false;
    }
  }
  if (!result.ok()) {
    FUZZ_CHECK(result.status().code() == absl::StatusCode::kInvalidArgument, "code %d",
               static_cast<int>(result.status().code()));
    FUZZ_CHECK(!result.status().message().empty(), "error without a message");
    if (checkable) {
      FUZZ_CHECK(result.status().message().find(password) == absl::string_view::npos,
                 "the redis password appears in: %s",
                 std::string(result.status().message()).c_str());
    }
    return 0;
  }
  if (checkable) {
    for (const auto& s : result->sources) {
      FUZZ_CHECK(s.find(password) == std::string::npos, "the redis password appears in %s",
                 s.c_str());
    }
  }
  FUZZ_CHECK(result->max_loss >= 0 && result->max_loss <= 1, "max_loss %f", result->max_loss);
  return 0;
}
