#include "policy/ip.h"

#include "core/ascii.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace ratelimit::policy {
namespace {

using core::Quote;
constexpr std::array<uint8_t, 12> kV4MappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
constexpr std::array<uint8_t, 12> kNat64WellKnownPrefix = {0, 0x64, 0xff, 0x9b, 0, 0,
                                                           0, 0,    0,    0,    0, 0};

// Keeps the first `bits` bits of `b`, zeroes the rest.
std::array<uint8_t, 16> Mask(std::array<uint8_t, 16> b, int bits) {
  for (int i = 0; i < 16; ++i) {
    const int keep = bits - i * 8;
    if (keep >= 8) continue;
    b[i] = keep <= 0 ? 0 : static_cast<uint8_t>(b[i] & (0xff << (8 - keep)));
  }
  return b;
}

}  // namespace

StatusOr<IpAddress> IpAddress::Parse(std::string_view text) {
  // Longest IPv6 text form is 45 characters ("ffff:...:255.255.255.255").
  if (text.empty() || text.size() > 45) return InvalidArgument("invalid IP address " + Quote(text));
  char buf[64];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  IpAddress a;
  if (text.find(':') == std::string_view::npos) {
    in_addr v4;
    if (inet_pton(AF_INET, buf, &v4) != 1)
      return InvalidArgument("invalid IP address " + Quote(text));
    std::memcpy(a.bytes_.data(), kV4MappedPrefix.data(), 12);
    std::memcpy(a.bytes_.data() + 12, &v4, 4);  // network order == our byte order
    return a;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, buf, &v6) != 1)
    return InvalidArgument("invalid IP address " + Quote(text));
  std::memcpy(a.bytes_.data(), &v6, 16);
  return a;
}

IpAddress IpAddress::FromV4(uint32_t host_order) {
  IpAddress a;
  std::memcpy(a.bytes_.data(), kV4MappedPrefix.data(), 12);
  a.bytes_[12] = static_cast<uint8_t>(host_order >> 24);
  a.bytes_[13] = static_cast<uint8_t>(host_order >> 16);
  a.bytes_[14] = static_cast<uint8_t>(host_order >> 8);
  a.bytes_[15] = static_cast<uint8_t>(host_order);
  return a;
}

IpAddress IpAddress::FromV6(const std::array<uint8_t, 16>& bytes) {
  IpAddress a;
  a.bytes_ = bytes;
  return a;
}

bool IpAddress::is_v4() const {
  return std::memcmp(bytes_.data(), kV4MappedPrefix.data(), kV4MappedPrefix.size()) == 0;
}

uint32_t IpAddress::v4() const {
  return (uint32_t{bytes_[12]} << 24) | (uint32_t{bytes_[13]} << 16) | (uint32_t{bytes_[14]} << 8) |
         uint32_t{bytes_[15]};
}

// Dotted decimal, or RFC 5952's IPv6 text (lowercase, no leading zeros, the
// longest run of two or more zero groups as "::", the first if two tie), with
// glibc inet_ntop's one extra rule: an address whose first six groups are zero
// ends in dotted decimal ("::1.2.3.4", not "::102:304"; "::1" stays "::1").
// Written out by hand: inet_ntop formats with sprintf, and the client's IP is
// printed on every request (callgrind: 1,690 instructions a v4 address went
// to inet_ntop). ip_test.cc checks the output against inet_ntop.
namespace {

char* AppendDecimal(char* out, unsigned v) {  // 0..255
  if (v >= 100) *out++ = static_cast<char>('0' + v / 100);
  if (v >= 10) *out++ = static_cast<char>('0' + v / 10 % 10);
  *out++ = static_cast<char>('0' + v % 10);
  return out;
}

char* AppendDotted(char* out, const uint8_t* b) {
  for (int i = 0; i < 4; ++i) {
    if (i > 0) *out++ = '.';
    out = AppendDecimal(out, b[i]);
  }
  return out;
}

char* AppendHex(char* out, unsigned v) {  // 0..0xffff, no leading zeros
  static constexpr char kDigits[] = "0123456789abcdef";
  bool started = false;
  for (int shift = 12; shift >= 0; shift -= 4) {
    const unsigned d = (v >> shift) & 0xf;
    if (d != 0 || started || shift == 0) {
      *out++ = kDigits[d];
      started = true;
    }
  }
  return out;
}

}  // namespace

std::string IpAddress::ToString() const {
  char buf[48];  // INET6_ADDRSTRLEN is 46
  char* out = buf;
  if (is_v4()) {
    out = AppendDotted(out, bytes_.data() + 12);
    return std::string(buf, static_cast<size_t>(out - buf));
  }
  unsigned words[8];
  for (int i = 0; i < 8; ++i) words[i] = (unsigned{bytes_[2 * i]} << 8) | bytes_[2 * i + 1];
  int best = -1, best_len = 0;
  for (int i = 0; i < 8;) {
    if (words[i] != 0) {
      ++i;
      continue;
    }
    int j = i;
    while (j < 8 && words[j] == 0) ++j;
    if (j - i > best_len) {
      best = i;
      best_len = j - i;
    }
    i = j;
  }
  if (best_len < 2) best = -1;
  for (int i = 0; i < 8; ++i) {
    if (i == best) {
      *out++ = ':';
      if (i + best_len == 8) *out++ = ':';
      i += best_len - 1;
      continue;
    }
    if (i > 0) *out++ = ':';
    if (i == 6 && best == 0 && best_len == 6) {  // "::a.b.c.d", as inet_ntop
      out = AppendDotted(out, bytes_.data() + 12);
      break;
    }
    out = AppendHex(out, words[i]);
  }
  return std::string(buf, static_cast<size_t>(out - buf));
}

std::string IpAddress::KeyString(int v6_prefix) const {
  if (is_v4()) return ToString();
  // 64:ff9b::/96 (RFC 6052's well-known prefix): an IPv4 host translated by
  // NAT64/SIIT, its address in the last 32 bits. Keyed as that IPv4 host:
  // masked to a /64, every IPv4 client behind the translator would be one.
  if (std::memcmp(bytes_.data(), kNat64WellKnownPrefix.data(), kNat64WellKnownPrefix.size()) == 0) {
    return FromV4(v4()).ToString();
  }
  if (v6_prefix < 0) v6_prefix = 0;
  if (v6_prefix > 128) v6_prefix = 128;
  std::string s = FromV6(Mask(bytes_, v6_prefix)).ToString();
  s += '/';
  s += std::to_string(v6_prefix);
  return s;
}

StatusOr<Cidr> Cidr::Parse(std::string_view text) {
  const size_t slash = text.find('/');
  StatusOr<IpAddress> a = IpAddress::Parse(text.substr(0, slash));
  if (!a.ok()) return InvalidArgument("invalid CIDR " + Quote(text) + ": not an IP address");
  const int max = a->is_v4() ? 32 : 128;
  int bits = max;
  if (slash != std::string_view::npos) {
    std::string_view p = text.substr(slash + 1);
    auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), bits);
    if (p.empty() || p.size() > 3 || ec != std::errc() || ptr != p.data() + p.size() || bits < 0 ||
        bits > max) {
      return InvalidArgument("invalid CIDR " + Quote(text) + ": prefix length must be 0.." +
                             std::to_string(max));
    }
  }
  Cidr c;
  c.prefix_ = a->is_v4() ? bits + 96 : bits;
  if (Mask(a->bytes(), c.prefix_) != a->bytes()) {
    return InvalidArgument("invalid CIDR " + Quote(text) + ": host bits are set (did you mean " +
                           IpAddress::FromV6(Mask(a->bytes(), c.prefix_)).ToString() + "/" +
                           std::to_string(bits) + "?)");
  }
  c.base_ = *a;
  return c;
}

bool Cidr::Contains(const IpAddress& a) const {
  const auto& x = a.bytes();
  const auto& y = base_.bytes();
  const int full = prefix_ / 8;
  if (std::memcmp(x.data(), y.data(), full) != 0) return false;
  const int rest = prefix_ % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (x[full] & mask) == (y[full] & mask);
}

std::string Cidr::ToString() const {
  return base_.ToString() + "/" + std::to_string(prefix_length());
}

}  // namespace ratelimit::policy
