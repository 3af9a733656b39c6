// Lower-case hexadecimal of bytes, two digits a byte: the one formatter of
// digests and random ids (script SHA-1s, log redactions, reservation nonces,
// concurrency lease ids) and of `\xHH` escapes. Percent-encoding keeps its
// own upper-case digits (core/percent.h, RFC 3986 2.1).
//
//   core::Hex(std::span<const unsigned char>(digest, 4))  -> "09af3c7e"
//   core::AppendHexByte(out, 0x0a)                        -> out += "0a"
//
// Thread-safety: pure functions.
#pragma once

#include <span>
#include <string>

namespace ratelimit::core {

inline constexpr char kHexDigits[] = "0123456789abcdef";

inline void AppendHexByte(std::string& out, unsigned char b) {
  out.push_back(kHexDigits[b >> 4]);
  out.push_back(kHexDigits[b & 15]);
}

inline void AppendHex(std::string& out, std::span<const unsigned char> bytes) {
  out.reserve(out.size() + 2 * bytes.size());
  for (unsigned char b : bytes) AppendHexByte(out, b);
}

inline std::string Hex(std::span<const unsigned char> bytes) {
  std::string out;
  AppendHex(out, bytes);
  return out;
}

}  // namespace ratelimit::core
