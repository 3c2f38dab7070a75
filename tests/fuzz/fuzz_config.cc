// Fuzz target: gloo_ext::ParseConfig, which reads every environment variable a user can
// set. Input: lines "NAME=value"; NAME may be "#k" (the k-th documented variable) or
// "@k" (its GLOO_DPDK_ alias), so the fuzzer reaches every variable quickly.
// Checks: no crash; errors are InvalidArgument with a message; the Redis password never
// appears in an error message or in the parsed `sources` (checked differentially).
#include <map>
#include <string>

#include "gloo_ext/config.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/redis_password.h"

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

absl::StatusOr<optireduce::gloo_ext::Config> Parse(
    const std::map<std::string, std::string>& env) {
  return optireduce::gloo_ext::ParseConfig(
      [&env](absl::string_view name) -> std::optional<std::string> {
        auto it = env.find(std::string(name));
        if (it == env.end()) return std::nullopt;
        return it->second;
      });
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
  auto result = Parse(env);
  std::vector<std::string> names;
  for (const auto& kv : env) names.push_back(kv.first);
  optireduce::gloo_ext::UnknownOptiReduceNames(names);

  if (!result.ok()) {
    FUZZ_CHECK(result.status().code() == absl::StatusCode::kInvalidArgument, "code %d",
               static_cast<int>(result.status().code()));
    FUZZ_CHECK(!result.status().message().empty(), "error without a message");
  }
  // The Redis password never shows: with another password of the same shape, the error
  // message and the `sources` list stay the same.
  auto url = env.find("OPTIREDUCE_REDIS_URL");
  const std::string other = url == env.end() ? "" : optireduce_fuzz::WithOtherPassword(url->second);
  if (!other.empty()) {
    auto other_env = env;
    other_env["OPTIREDUCE_REDIS_URL"] = other;
    auto other_result = Parse(other_env);
    FUZZ_CHECK(result.ok() == other_result.ok(), "validity depends on the password's letters");
    if (!result.ok()) {
      FUZZ_CHECK(result.status().message() == other_result.status().message(),
                 "the error message shows the redis password: %s",
                 std::string(result.status().message()).c_str());
    } else {
      FUZZ_CHECK(result->sources == other_result->sources, "sources show the redis password");
    }
  }
  if (!result.ok()) return 0;
  FUZZ_CHECK(result->max_loss >= 0 && result->max_loss <= 1, "max_loss %f", result->max_loss);
  return 0;
}
