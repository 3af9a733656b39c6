// ASCII helpers for protocol tokens (header names, Forwarded parameters):
// case-insensitive in ASCII only, as HTTP's are; no locale.
#pragma once

#include <cstddef>
#include <string_view>

namespace ratelimit::core {

inline char AsciiLower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// True if a and b are equal ignoring ASCII case.
inline bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (AsciiLower(a[i]) != AsciiLower(b[i])) return false;
  }
  return true;
}

}  // namespace ratelimit::core
