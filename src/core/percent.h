// Percent-decoding (RFC 3986 2.1), the one decoder of request paths
// (policy/path.cc), Redis URLs (redis/url.cc) and admin queries (admin.cc);
// and the one encoder, of gRPC's grpc-message (grpc/h2_server.cc) and of
// route paths in the config's dump (policy/config_dump.cc).
//
//   core::PercentDecode("a%2Fb")                     -> "a/b"
//   core::PercentDecode("a+b", core::kPlusIsSpace)   -> "a b"   (form queries)
//   core::PercentDecode("%4")                        -> nullopt (malformed)
//   core::PercentEncode("a%b\n\xc3\xa9")              -> "a%25b%0A%C3%A9"
//
// PercentDecodeEach hands each decoded byte to a callback with whether it came
// from an escape, for callers that refuse some bytes (an encoded '/' in a path).
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ratelimit::core {

// 0..15 for a hex digit (either case), -1 otherwise.
inline int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

enum class PercentResult { kOk, kMalformed, kStopped };
inline constexpr bool kPlusIsSpace = true;

// Calls emit(byte, escaped) for every decoded byte, in order; emit returns
// false to stop (kStopped). kMalformed at a '%' not followed by two hex digits.
template <typename Emit>
PercentResult PercentDecodeEach(std::string_view in, bool plus_is_space, Emit&& emit) {
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    bool escaped = false;
    if (c == '%') {
      const int hi = i + 2 < in.size() ? HexDigitValue(in[i + 1]) : -1;
      const int lo = hi >= 0 ? HexDigitValue(in[i + 2]) : -1;
      if (lo < 0) return PercentResult::kMalformed;
      c = static_cast<char>(hi * 16 + lo);
      escaped = true;
      i += 2;
    } else if (plus_is_space && c == '+') {
      c = ' ';
    }
    if (!emit(c, escaped)) return PercentResult::kStopped;
  }
  return PercentResult::kOk;
}

// Every byte outside printable ASCII (0x20-0x7e), and '%', as %XX (upper-case
// hex); the rest as it is. PercentDecode gives back the same bytes.
inline std::string PercentEncode(std::string_view in) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(in.size());
  for (const char ch : in) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// The decoded text, or nullopt when an escape is malformed.
inline std::optional<std::string> PercentDecode(std::string_view in, bool plus_is_space = false) {
  std::string out;
  out.reserve(in.size());
  const PercentResult r = PercentDecodeEach(in, plus_is_space, [&out](char c, bool) {
    out.push_back(c);
    return true;
  });
  if (r != PercentResult::kOk) return std::nullopt;
  return out;
}

}  // namespace ratelimit::core
