// redis_url_fuzzer: ParseRedisUrl and RedactedUrl (src/redis/url.cc), and the
// config dump's text redaction RedactUrl (src/policy/config_dump.cc).
//
// Invariants for a URL ParseRedisUrl accepts with a password:
//   - RedactedUrl (what logs print) does not depend on the password: the same
//     options with another password give the same text;
//   - RedactUrl (what the config dump prints) does not depend on the password
//     text either: replacing the password's bytes in the URL (found the way
//     ParseRedisUrl finds them) gives the same text.
// And for every accepted URL whose user and host are plain (letters, digits,
// '.', '-', '_', and ':' in an IPv6 host), RedactedUrl parses back to the
// same host, port, db and TLS setting. (RedactedUrl prints user and host
// decoded and ParseRedisUrl accepts any bytes in a host, so other URLs need
// not read back: reported, cosmetic.)
#include <string>
#include <string_view>

#include "fuzz/targets.h"
#include "policy/config.h"
#include "redis/url.h"

namespace ratelimit::fuzz {
namespace {

bool Plain(std::string_view s, bool colon_ok) {
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || (colon_ok && c == ':');
    if (!ok) return false;
  }
  return true;
}

// The URL with the password's text (as ParseRedisUrl delimits it) replaced by `other`.
std::string ReplacePassword(std::string_view url, std::string_view other) {
  const size_t start = url.find("://") + 3;
  const size_t authority_end = url.find_first_of("/?", start);
  const size_t at =
      url.rfind('@', authority_end == std::string_view::npos ? url.size() : authority_end);
  const size_t colon = url.find(':', start);
  return std::string(url.substr(0, colon + 1)) + std::string(other) + std::string(url.substr(at));
}

}  // namespace

int FuzzRedisUrl(const uint8_t* data, size_t size) {
  const std::string_view url(reinterpret_cast<const char*>(data), size);
  const std::string text_redacted = policy::RedactUrl(url);  // any input: no crash
  StatusOr<redis::Options> o = redis::ParseRedisUrl(url);
  if (!o.ok()) {
    RL_FUZZ_CHECK(o.status().code() == StatusCode::kInvalidArgument, url);
    return 0;
  }
  RL_FUZZ_CHECK(!o->host.empty() && o->port != 0 && o->db >= 0, url);
  const std::string redacted = redis::RedactedUrl(*o);

  if (!o->password.empty()) {
    redis::Options other = *o;
    other.password = o->password == "x" ? "y" : "x";
    RL_FUZZ_CHECK(redis::RedactedUrl(other) == redacted,
                  "RedactedUrl shows the password: " + std::string(url) + " -> " + redacted);
    const std::string replaced = ReplacePassword(url, other.password);
    StatusOr<redis::Options> check = redis::ParseRedisUrl(replaced);
    RL_FUZZ_CHECK(check.ok() && check->password == other.password && check->host == o->host,
                  "password not where expected: " + replaced);
    RL_FUZZ_CHECK(policy::RedactUrl(replaced) == text_redacted,
                  "RedactUrl shows the password: " + std::string(url) + " -> " + text_redacted);
  }

  if (Plain(o->user, false) && Plain(o->host, true)) {
    StatusOr<redis::Options> back = redis::ParseRedisUrl(redacted);
    RL_FUZZ_CHECK(back.ok(), std::string(url) + " -> " + redacted + ": " + back.status().message());
    RL_FUZZ_CHECK(back->host == o->host && back->port == o->port && back->db == o->db &&
                      back->tls == o->tls && back->user == (o->password.empty() ? "" : o->user),
                  std::string(url) + " -> " + redacted);
  }
  return 0;
}

}  // namespace ratelimit::fuzz
