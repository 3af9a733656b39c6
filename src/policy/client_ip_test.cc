// ClientIp: the table of proxy chains, forgeries and malformed headers.
#include <gtest/gtest.h>

#include "policy/policy.h"

namespace ratelimit::policy {
namespace {

struct Case {
  const char* peer;
  std::optional<std::string_view> xff;
  std::optional<std::string_view> forwarded;
  const char* want;
  const char* why;
};

constexpr auto kNone = std::nullopt;

TEST(ClientIp, Table) {
  std::vector<Cidr> trusted = {*Cidr::Parse("10.0.0.0/8"), *Cidr::Parse("127.0.0.1"),
                               *Cidr::Parse("::1"), *Cidr::Parse("2001:db8:ffff::/48")};
  const Case cases[] = {
      {"203.0.113.5", kNone, kNone, "203.0.113.5", "no headers: the peer"},
      {"203.0.113.5", "1.2.3.4", kNone, "203.0.113.5", "spoofing: untrusted peer's XFF ignored"},
      {"203.0.113.5", kNone, "for=1.2.3.4", "203.0.113.5",
       "spoofing: untrusted peer's Forwarded ignored"},
      {"203.0.113.5", "10.0.0.9", kNone, "203.0.113.5", "spoofing a trusted address does not help"},
      {"10.0.0.1", kNone, kNone, "10.0.0.1", "trusted peer without headers: the peer"},
      {"10.0.0.1", "1.2.3.4", kNone, "1.2.3.4", "one proxy"},
      {"10.0.0.1", "9.9.9.9, 1.2.3.4", kNone, "1.2.3.4", "client-forged leftmost entry ignored"},
      {"10.0.0.1", "1.2.3.4, 10.0.0.2", kNone, "1.2.3.4", "trusted hops skipped right to left"},
      {"10.0.0.1", "10.0.0.3, 10.0.0.2", kNone, "10.0.0.3", "all trusted: the leftmost"},
      {"10.0.0.1", "  1.2.3.4 ,\t10.0.0.2  ", kNone, "1.2.3.4", "spaces and tabs"},
      {"10.0.0.1", "1.2.3.4:5678", kNone, "1.2.3.4", "v4 with port"},
      {"10.0.0.1", "[2001:db8::1]:443", kNone, "2001:db8::1", "bracketed v6 with port"},
      {"10.0.0.1", "2001:db8::1", kNone, "2001:db8::1", "bare v6"},
      {"10.0.0.1", "[2001:db8::1]", kNone, "2001:db8::1", "bracketed v6"},
      {"10.0.0.1", "garbage", kNone, "10.0.0.1", "malformed: the peer"},
      {"10.0.0.1", "garbage, 1.2.3.4", kNone, "1.2.3.4", "garbage left of the client is not read"},
      {"10.0.0.1", "1.2.3.4, garbage", kNone, "10.0.0.1", "malformed hop in the walk: the peer"},
      {"10.0.0.1", "1.2.3.4, unknown", kNone, "10.0.0.1", "unknown hop: the peer"},
      {"10.0.0.1", "", kNone, "10.0.0.1", "empty header"},
      {"10.0.0.1", "1.2.3.4,,10.0.0.2", kNone, "10.0.0.1", "empty element in the walk"},
      {"10.0.0.1", "[1.2.3.4]", kNone, "10.0.0.1", "bracketed v4 is malformed"},
      {"10.0.0.1", "1.2.3.4:99999", kNone, "10.0.0.1", "port out of range"},
      {"10.0.0.1", "01.2.3.4", kNone, "10.0.0.1", "leading zero"},
      {"10.0.0.1", "fe80::1%eth0", kNone, "10.0.0.1", "zone id"},
      {"10.0.0.1", "1.2.3.4, 2001:db8:ffff::9", kNone, "1.2.3.4", "trusted v6 proxy skipped"},
      {"::1", "1.2.3.4", kNone, "1.2.3.4", "trusted v6 peer"},
      {"::ffff:10.0.0.1", "1.2.3.4", kNone, "1.2.3.4", "v4-mapped peer is trusted"},
      {"10.0.0.1", kNone, "for=192.0.2.60;proto=http", "192.0.2.60", "Forwarded, one hop"},
      {"10.0.0.1", kNone, "for=192.0.2.60;proto=http, for=\"[2001:db8:cafe::17]:4711\"",
       "2001:db8:cafe::17", "Forwarded: rightmost untrusted wins"},
      {"10.0.0.1", kNone, "For=\"192.0.2.60:8080\"", "192.0.2.60",
       "case-insensitive name, quoted port"},
      {"10.0.0.1", kNone, "for=\"[2001:db8::1]\"", "2001:db8::1", "quoted bracketed v6"},
      {"10.0.0.1", kNone, "for=192.0.2.43;by=10.0.0.1;host=example.com", "192.0.2.43",
       "other params"},
      {"10.0.0.1", kNone, "proto=https;FOR = 192.0.2.43", "192.0.2.43", "for not first"},
      {"10.0.0.1", kNone, "for=192.0.2.60, for=10.0.0.5", "192.0.2.60",
       "Forwarded: trusted hop skipped"},
      {"10.0.0.1", kNone, "for=unknown", "10.0.0.1", "unknown node: the peer"},
      {"10.0.0.1", "5.6.7.8", "for=unknown", "5.6.7.8", "unknown node: fall back to XFF"},
      {"10.0.0.1", kNone, "for=_hidden", "10.0.0.1", "obfuscated node: the peer"},
      {"10.0.0.1", kNone, "for=\"_gazonk\"", "10.0.0.1", "quoted obfuscated node"},
      {"10.0.0.1", kNone, "for=\"192.0.2.1:_p1\"", "192.0.2.1", "obfuscated port"},
      {"10.0.0.1", "192.0.2.2", "for=192.0.2.1", "192.0.2.1", "Forwarded preferred over XFF"},
      {"10.0.0.1", "192.0.2.2", "for=\"192.0.2.1", "192.0.2.2", "unterminated quote: XFF"},
      {"10.0.0.1", "192.0.2.2", "proto=https", "192.0.2.2", "no for=: XFF"},
      {"10.0.0.1", kNone, "for=192.0.2.60;for=192.0.2.61", "10.0.0.1", "two for= in one element"},
      {"10.0.0.1", kNone, "for=\"garbage, for=192.0.2.9", "192.0.2.9",
       "client's broken element not read"},
      {"10.0.0.1", kNone, "for=", "10.0.0.1", "empty value"},
  };
  for (const Case& c : cases) {
    StatusOr<IpAddress> peer = IpAddress::Parse(c.peer);
    ASSERT_TRUE(peer.ok()) << c.peer;
    EXPECT_EQ(ClientIp(*peer, c.xff, c.forwarded, trusted).ToString(), c.want) << c.why;
  }
  EXPECT_GE(std::size(cases), 25u);
}

TEST(ClientIp, NoTrustedProxiesMeansPeerAlways) {
  IpAddress peer = *IpAddress::Parse("10.0.0.1");
  EXPECT_EQ(ClientIp(peer, "1.2.3.4", "for=1.2.3.4", {}), peer);
}

}  // namespace
}  // namespace ratelimit::policy
