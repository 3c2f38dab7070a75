#include "rendezvous/redis_url.h"

#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"

namespace optireduce {
namespace rendezvous {
namespace {

constexpr absl::string_view kScheme = "redis://";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes %XX escapes; `part` names the URL component for the error message.
absl::StatusOr<std::string> PercentDecode(absl::string_view in, absl::string_view part) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("redis URL: truncated percent-escape in the ", part));
    }
    int hi = HexValue(in[i + 1]);
    int lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("redis URL: bad percent-escape in the ", part));
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

}  // namespace

std::string RedisUrl::Endpoint() const {
  return absl::StrCat(host, ":", port, "/", db);
}

absl::StatusOr<RedisUrl> ParseRedisUrl(absl::string_view url) {
  // The whole URL is never echoed back: it may contain a password.
  if (!absl::StartsWithIgnoreCase(url, kScheme)) {
    return absl::InvalidArgumentError(
        "redis URL: scheme must be \"redis://\" (form redis://[user:password@]host:port[/db])");
  }
  absl::string_view rest = url.substr(kScheme.size());
  RedisUrl out;

  // Credentials end at the LAST '@' before the path, so an unescaped '@' in a password
  // still parses the way the user meant.
  size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  absl::string_view path = slash == absl::string_view::npos ? "" : rest.substr(slash + 1);
  size_t at = authority.rfind('@');
  if (at != absl::string_view::npos) {
    absl::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    size_t colon = userinfo.find(':');
    absl::string_view user = userinfo.substr(0, colon);
    absl::string_view password =
        colon == absl::string_view::npos ? "" : userinfo.substr(colon + 1);
    if (colon == absl::string_view::npos) {
      // "redis://secret@host": like redis-cli, a lone userinfo is the password.
      password = user;
      user = "";
    }
    auto u = PercentDecode(user, "user");
    if (!u.ok()) return u.status();
    auto p = PercentDecode(password, "password");
    if (!p.ok()) return p.status();
    out.user = *std::move(u);
    out.password = *std::move(p);
    if (!out.user.empty() && out.password.empty()) {
      return absl::InvalidArgumentError(
          "redis URL: user given without a password (form user:password@host)");
    }
  }

  // host[:port]; IPv6 literals in brackets: [::1]:6379.
  absl::string_view host;
  absl::string_view port;
  if (absl::StartsWith(authority, "[")) {
    size_t close = authority.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError("redis URL: host: unterminated '[' in IPv6 address");
    }
    host = authority.substr(1, close - 1);
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') {
        return absl::InvalidArgumentError("redis URL: host: junk after IPv6 address");
      }
      port = after.substr(1);
      if (port.empty()) return absl::InvalidArgumentError("redis URL: port: empty after ':'");
    }
  } else {
    size_t colon = authority.rfind(':');
    host = authority.substr(0, colon);
    if (colon != absl::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return absl::InvalidArgumentError("redis URL: port: empty after ':'");
    }
  }
  if (host.empty()) return absl::InvalidArgumentError("redis URL: host is empty");
  for (char c : host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
          c == ':')) {
      return absl::InvalidArgumentError(
          absl::StrCat("redis URL: host \"", host, "\" contains an invalid character"));
    }
  }
  out.host = std::string(host);

  if (!port.empty()) {
    int p = 0;
    if (!absl::SimpleAtoi(port, &p) || p < 1 || p > 65535 ||
        !std::isdigit(static_cast<unsigned char>(port[0]))) {
      return absl::InvalidArgumentError(
          absl::StrCat("redis URL: port \"", port, "\" is not a number in 1..65535"));
    }
    out.port = p;
  }

  if (!path.empty()) {
    int db = 0;
    if (!absl::SimpleAtoi(path, &db) || db < 0 ||
        !std::isdigit(static_cast<unsigned char>(path[0]))) {
      return absl::InvalidArgumentError(
          absl::StrCat("redis URL: db \"", path, "\" is not a non-negative database number"));
    }
    out.db = db;
  }
  return out;
}

}  // namespace rendezvous
}  // namespace optireduce
