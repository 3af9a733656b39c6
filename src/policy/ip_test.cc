// IpAddress and Cidr: parsing, printing, key form, containment.
#include "policy/ip.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace ratelimit::policy {
namespace {

IpAddress Ip(std::string_view s) {
  StatusOr<IpAddress> a = IpAddress::Parse(s);
  EXPECT_TRUE(a.ok()) << s;
  return a.ok() ? *a : IpAddress();
}

TEST(IpAddress, ParsesAndPrints) {
  EXPECT_EQ(Ip("203.0.113.7").ToString(), "203.0.113.7");
  EXPECT_TRUE(Ip("203.0.113.7").is_v4());
  EXPECT_EQ(Ip("203.0.113.7").v4(), 0xCB007107u);
  EXPECT_EQ(Ip("2001:DB8:0:0::17").ToString(), "2001:db8::17");
  EXPECT_FALSE(Ip("2001:db8::17").is_v4());
  EXPECT_EQ(Ip("::1").ToString(), "::1");
  // v4-mapped v6 is the same client as the v4 address.
  EXPECT_EQ(Ip("::ffff:192.0.2.1"), Ip("192.0.2.1"));
  EXPECT_TRUE(Ip("::ffff:192.0.2.1").is_v4());
  EXPECT_EQ(IpAddress::FromV4(0x7f000001), Ip("127.0.0.1"));
}

// ToString is written by hand (no sprintf); inet_ntop is the reference. The
// addresses are random with zero groups made likely, so every placement and
// length of the "::" run, ties between runs, and the forms ending in dotted
// decimal come up.
TEST(IpAddress, PrintsAsInetNtop) {
  std::mt19937_64 rng(42);
  auto check = [](const std::array<uint8_t, 16>& b) {
    char want[INET6_ADDRSTRLEN];
    ASSERT_NE(inet_ntop(AF_INET6, b.data(), want, sizeof want), nullptr);
    const IpAddress a = IpAddress::FromV6(b);
    if (a.is_v4()) {
      char v4[INET_ADDRSTRLEN];
      ASSERT_NE(inet_ntop(AF_INET, b.data() + 12, v4, sizeof v4), nullptr);
      EXPECT_EQ(a.ToString(), v4) << want;
    } else {
      EXPECT_EQ(a.ToString(), want);
    }
  };
  for (int n = 0; n < 200000; ++n) {
    std::array<uint8_t, 16> b{};
    const uint64_t zeros = rng();  // two bits a group: zero three times in four
    for (int g = 0; g < 8; ++g) {
      if (((zeros >> (2 * g)) & 3) != 0) continue;
      const uint64_t r = rng();
      const int width = static_cast<int>(r % 4);  // 1 to 4 hex digits
      const unsigned v = static_cast<unsigned>((r >> 8) & ((1u << (4 * (width + 1))) - 1));
      b[2 * g] = static_cast<uint8_t>(v >> 8);
      b[2 * g + 1] = static_cast<uint8_t>(v);
    }
    if (n % 8 == 0) {  // v4-mapped
      b = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      for (int i = 12; i < 16; ++i) b[i] = static_cast<uint8_t>(rng() % (n % 3 == 0 ? 10 : 256));
    }
    check(b);
  }
  for (const char* text :
       {"::", "::1", "::1.2.3.4", "::1.2.0.0", "::0.0.0.1", "1::", "1::1", "1:0:0:1:0:0:0:1",
        "1:0:0:1:0:0:1:1", "0:0:1::1", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8",
        "fe80::ffff:0:1", "::ffff:0:1.2.3.4", "ffff::", "0:0:0:0:0:1:0:0", "::255.255.255.255"}) {
    in6_addr raw;
    ASSERT_EQ(inet_pton(AF_INET6, text, &raw), 1) << text;
    std::array<uint8_t, 16> b;
    std::memcpy(b.data(), &raw, 16);
    check(b);
  }
  EXPECT_EQ(Ip("0.0.0.0").ToString(), "0.0.0.0");
  EXPECT_EQ(Ip("255.255.255.255").ToString(), "255.255.255.255");
  EXPECT_EQ(Ip("10.100.9.200").ToString(), "10.100.9.200");
}

TEST(IpAddress, RejectsMalformed) {
  for (std::string_view bad :
       {"", "1.2.3", "1.2.3.4.5", "256.1.1.1", "01.2.3.4", "1.2.3.4:80", "[::1]", "::1%eth0",
        "2001:db8:::1", "abc", " 1.2.3.4", "1.2.3.4 ", "gggg::1",
        "1111:2222:3333:4444:5555:6666:7777:8888:9999:0000:1111"}) {
    EXPECT_FALSE(IpAddress::Parse(bad).ok()) << bad;
  }
}

// An IPv4 client reaching an IPv6 server through NAT64/SIIT arrives as
// 64:ff9b::a.b.c.d: keyed as the IPv4 host it is, not by the /64 that every
// translated client shares.
TEST(IpAddress, KeyStringOfANat64AddressIsTheIpv4ItCarries) {
  EXPECT_EQ(Ip("64:ff9b::203.0.113.7").KeyString(64), "203.0.113.7");
  EXPECT_EQ(Ip("64:ff9b::cb00:7108").KeyString(48), "203.0.113.8");
  EXPECT_NE(Ip("64:ff9b::198.51.100.1").KeyString(64), Ip("64:ff9b::198.51.100.2").KeyString(64));
  EXPECT_EQ(Ip("64:ff9b::198.51.100.1").KeyString(64), Ip("198.51.100.1").KeyString(64));
  // Outside the /96 (64:ff9b:1::/48 is local use, its embedding not fixed): a /64 as usual.
  EXPECT_EQ(Ip("64:ff9b:1::c633:6401").KeyString(64), "64:ff9b:1::/64");
  EXPECT_EQ(Ip("64:ff9b:0:0:1::1").KeyString(64), "64:ff9b::/64");
}

TEST(IpAddress, KeyStringMasksV6ToPrefix) {
  EXPECT_EQ(Ip("203.0.113.7").KeyString(64), "203.0.113.7");
  EXPECT_EQ(Ip("2001:db8:1:2:3:4:5:6").KeyString(64), "2001:db8:1:2::/64");
  EXPECT_EQ(Ip("2001:db8:1:2:3:4:5:6").KeyString(48), "2001:db8:1::/48");
  EXPECT_EQ(Ip("2001:db8:1:2:3:4:5:6").KeyString(128), "2001:db8:1:2:3:4:5:6/128");
  EXPECT_EQ(Ip("2001:db8:1:2:3:4:5:6").KeyString(0), "::/0");
  EXPECT_EQ(Ip("2001:db8:1:2:ffff::").KeyString(60), "2001:db8:1::/60");
  // Two addresses in one /64 share a key.
  EXPECT_EQ(Ip("2001:db8::1").KeyString(64), Ip("2001:db8::ffff:1").KeyString(64));
}

TEST(Cidr, ParsesAndContains) {
  StatusOr<Cidr> net = Cidr::Parse("10.0.0.0/8");
  ASSERT_TRUE(net.ok());
  EXPECT_EQ(net->ToString(), "10.0.0.0/8");
  EXPECT_EQ(net->prefix_length(), 8);
  EXPECT_TRUE(net->Contains(Ip("10.255.1.2")));
  EXPECT_TRUE(net->Contains(Ip("::ffff:10.1.1.1")));
  EXPECT_FALSE(net->Contains(Ip("11.0.0.1")));
  EXPECT_FALSE(net->Contains(Ip("2001:db8::1")));

  StatusOr<Cidr> host = Cidr::Parse("127.0.0.1");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->ToString(), "127.0.0.1/32");
  EXPECT_TRUE(host->Contains(Ip("127.0.0.1")));
  EXPECT_FALSE(host->Contains(Ip("127.0.0.2")));

  StatusOr<Cidr> v6 = Cidr::Parse("2001:db8::/32");
  ASSERT_TRUE(v6.ok());
  EXPECT_TRUE(v6->Contains(Ip("2001:db8:ffff::1")));
  EXPECT_FALSE(v6->Contains(Ip("2001:db9::1")));
  EXPECT_EQ(Cidr::Parse("::1")->ToString(), "::1/128");
  EXPECT_TRUE(Cidr::Parse("0.0.0.0/0")->Contains(Ip("8.8.8.8")));
  EXPECT_TRUE(Cidr::Parse("10.0.0.0/9")->Contains(Ip("10.127.0.1")));
  EXPECT_FALSE(Cidr::Parse("10.0.0.0/9")->Contains(Ip("10.128.0.1")));
}

TEST(Cidr, RejectsMalformed) {
  for (std::string_view bad : {"10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/8x",
                               "foo/8", "", "/8", "10.0.0.1/8"}) {
    EXPECT_FALSE(Cidr::Parse(bad).ok()) << bad;
  }
  EXPECT_NE(Cidr::Parse("10.0.0.1/8").status().message().find("did you mean 10.0.0.0/8"),
            std::string::npos);
}

}  // namespace
}  // namespace ratelimit::policy
