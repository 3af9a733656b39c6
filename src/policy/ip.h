// IpAddress and Cidr: v4 and v6 addresses as 16 bytes (v4 mapped), parsing,
// prefix matching, and the key form used for rate limiting.
//
//   auto a = IpAddress::Parse("2001:db8::17");
//   auto net = Cidr::Parse("10.0.0.0/8");
//   bool t = net->Contains(*a);
//   std::string k = a->KeyString(64);   // "2001:db8::/64" for v6, "203.0.113.7" for v4
//
// Parsing is strict: dotted-quad IPv4 (no leading zeros, as inet_pton), RFC 4291 IPv6
// text; no brackets, ports or zone ids. "::ffff:1.2.3.4" is the same address as
// "1.2.3.4" (is_v4() is true for both). A Cidr's address must have no host bits set
// ("10.0.0.1/8" is rejected: a typo should not silently widen trust).
//
// Thread-safety: value types.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "ratelimit/status.h"

namespace ratelimit::policy {

class IpAddress {
 public:
  IpAddress() = default;
  static StatusOr<IpAddress> Parse(std::string_view text);  // no brackets, no port, no zone
  static IpAddress FromV4(uint32_t host_order);
  static IpAddress FromV6(const std::array<uint8_t, 16>& bytes);

  bool is_v4() const;
  // The last 32 bits as a host-order integer: the IPv4 address when is_v4(),
  // or the one a NAT64 address (64:ff9b::/96) carries.
  uint32_t v4() const;
  const std::array<uint8_t, 16>& bytes() const { return bytes_; }
  std::string ToString() const;
  // v4: the address; v6: the address masked to `v6_prefix` bits, as "addr/prefix";
  // in NAT64's well-known prefix 64:ff9b::/96, the IPv4 address it carries.
  std::string KeyString(int v6_prefix) const;

  friend bool operator==(const IpAddress&, const IpAddress&) = default;

 private:
  std::array<uint8_t, 16> bytes_{};  // v4 as ::ffff:a.b.c.d
};

class Cidr {
 public:
  static StatusOr<Cidr> Parse(std::string_view text);  // "10.0.0.0/8", "::1/128", "127.0.0.1"
  bool Contains(const IpAddress& a) const;
  std::string ToString() const;  // "10.0.0.0/8", "2001:db8::/32"
  const IpAddress& address() const { return base_; }
  // In the address family's own terms: 0..32 for v4, 0..128 for v6.
  int prefix_length() const { return base_.is_v4() ? prefix_ - 96 : prefix_; }

  friend bool operator==(const Cidr&, const Cidr&) = default;

 private:
  IpAddress base_;
  int prefix_ = 0;  // in the 128-bit space
};

}  // namespace ratelimit::policy
