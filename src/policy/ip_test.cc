// IpAddress and Cidr: parsing, printing, key form, containment.
#include "policy/ip.h"

#include <gtest/gtest.h>

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

TEST(IpAddress, RejectsMalformed) {
  for (std::string_view bad :
       {"", "1.2.3", "1.2.3.4.5", "256.1.1.1", "01.2.3.4", "1.2.3.4:80", "[::1]", "::1%eth0",
        "2001:db8:::1", "abc", " 1.2.3.4", "1.2.3.4 ", "gggg::1",
        "1111:2222:3333:4444:5555:6666:7777:8888:9999:0000:1111"}) {
    EXPECT_FALSE(IpAddress::Parse(bad).ok()) << bad;
  }
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
