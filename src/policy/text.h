// Small text helpers shared by the policy module's parsers (config, client
// IP, trusted proxies, identities).
#pragma once

#include <string>
#include <string_view>

namespace ratelimit::policy {

// `s` in single quotes, as the config's error messages show a value.
inline std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

// `s` without leading and trailing spaces and tabs.
inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace ratelimit::policy
