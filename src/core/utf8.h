// ValidUtf8: whether bytes are well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), and where they stop being
// so. For text that must be Unicode: a decision key, a YAML config.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ratelimit::core {

// The offset of the first byte of `s` that does not begin a well-formed
// UTF-8 sequence, or s.size() when all of `s` is well-formed.
inline size_t Utf8ValidPrefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + n >= s.size()) return i;
    for (size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return i;
    }
    i += n + 1;
  }
  return i;
}

inline bool ValidUtf8(std::string_view s) { return Utf8ValidPrefix(s) == s.size(); }

}  // namespace ratelimit::core
