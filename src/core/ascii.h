// ASCII helpers for protocol tokens (header names, Forwarded parameters):
// case-insensitive in ASCII only, as HTTP's are; no locale. And the two the
// config parsers share (Trim, Quote).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ratelimit::core {

inline char AsciiLower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// `s` with ASCII letters in upper case.
inline std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

// True if a and b are equal ignoring ASCII case.
inline bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (AsciiLower(a[i]) != AsciiLower(b[i])) return false;
  }
  return true;
}

// `s` without leading and trailing spaces and tabs.
inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// `s` in single quotes, as the config errors show a value.
inline std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

}  // namespace ratelimit::core
