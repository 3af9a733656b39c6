// CanonicalPath: equivalent spellings meet in one form; tricks are rejected.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "policy/policy.h"

namespace ratelimit::policy {
namespace {

TEST(CanonicalPath, Table) {
  struct Case {
    std::string_view in, want;
  };
  const Case cases[] = {
      {"/", "/"},
      {"/login", "/login"},
      {"/Login", "/login"},
      {"/a//login", "/a/login"},
      {"/login/", "/login"},
      {"/./login", "/login"},
      {"/a/../login", "/login"},
      {"/%6Cogin", "/login"},
      {"/%6cogin", "/login"},
      {"/LOGIN/.", "/login"},
      {"/../login", "/login"},
      {"/a/b/../../../login", "/login"},
      {"/login?next=/admin", "/login"},
      {"/login#frag", "/login"},
      {"/login/?a=/b", "/login"},
      {"/%2e%2e/admin", "/admin"},
      {"/a/%2E/b", "/a/b"},
      {"/api//items///7", "/api/items/7"},
      {"/a/..", "/"},
      {"/...", "/..."},
      {"/a%20b", "/a b"},
      {"/caf%C3%A9", "/caf\xC3\xA9"},
      {"/%7Buser%7D", "/{user}"},
      {"/a%25b", "/a%b"},
      {"http://example.com/Login", "/login"},
      {"HTTPS://example.com:443/a/b?x", "/a/b"},
      {"http://example.com", "/"},
      {"http://example.com?x=1", "/"},
      {"/?", "/"},
      {"/login;jsessionid=x", "/login"},
  };
  for (const Case& c : cases) {
    StatusOr<std::string> got = CanonicalPath(c.in);
    ASSERT_TRUE(got.ok()) << c.in << ": " << got.status().message();
    EXPECT_EQ(*got, c.want) << c.in;
  }
}

// A segment's parameters (RFC 3986 3.3: from a ';' to the segment's end) are
// not part of the path an upstream such as Tomcat, Jetty or Spring serves:
// "/login;x=1" is their "/login", and must be ours, or ";x" escapes the
// route's limits. They go before the dot segments are resolved, as there
// ("/a/..;/login" is "/login"). An escaped ';' (%3B) is data, not a
// separator (RFC 3986 2.2; those servers decode it after the split too).
// A segment that is empty or a dot segment without its parameters is
// refused: nginx, Envoy, Go and Express read "..;" and ";x" as names
// ("/admin/..;/users" is under /admin to them, /users to Tomcat).
TEST(CanonicalPath, PathParametersAreDroppedAndAnEscapedSemicolonIsData) {
  struct Case {
    std::string_view in, want;
  };
  const Case cases[] = {
      {"/login;jsessionid=x", "/login"},
      {"/Login;X=1/", "/login"},
      {"/login;", "/login"},
      {"/login;a;b=c,d", "/login"},
      {"/a;x/b;y", "/a/b"},
      {"/login;a/b", "/login/b"},  // up to the segment's end only
      {"/api/items/42;v=2", "/api/items/42"},
      {"/a/..x;y/login", "/a/..x/login"},
      {"/a/b;x/../login", "/a/login"},  // a named segment's parameters: as Tomcat, as nginx
      {"/login;x?a;b", "/login"},
      {"/login;x=%41%3B", "/login"},  // escapes in a parameter: dropped with it
      {"http://h/Login;x", "/login"},
      {"/login%3Bx=1", "/login;x=1"},  // escaped: data
      {"/login%3bx;y", "/login;x"},
      {"/%3B", "/;"},
  };
  for (const Case& c : cases) {
    StatusOr<std::string> got = CanonicalPath(c.in);
    ASSERT_TRUE(got.ok()) << c.in << ": " << got.status().message();
    EXPECT_EQ(*got, c.want) << c.in;
  }
  // A parameter's bytes are checked like the path's.
  for (std::string_view bad :
       {"/login;x=%2F", "/login;x=%zz", "/login;a b", "/login;x=%00",
        // Empty or dot segments with parameters: the upstreams disagree.
        "/a/..;/login", "/a/..;x=1/login", "/a/%2e%2e;x/login", "/.;x/login", "/;x/login", "/;",
        "/admin/;x/../users", "/admin/..;", "/admin/.;x"}) {
    StatusOr<std::string> got = CanonicalPath(bad);
    ASSERT_FALSE(got.ok()) << bad << " -> " << *got;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  }
}

// CanonicalPath returns a path that is canonical already as it is, without
// decoding it. "/a" + t and "/%61" + t decode to the same bytes, and the
// escape keeps the second off that shortcut: whatever t, both must give the
// same answer. Random t over the characters that matter to the rules.
TEST(CanonicalPath, TheShortcutForCanonicalPathsAgreesWithTheFullWalk) {
  constexpr std::string_view kAlphabet = "//..aZ9-~%2Ef e\x7f\xc3;;=3B\\5C";
  std::mt19937 rng(20261205);
  size_t shortcut = 0;
  for (int i = 0; i < 200'000; ++i) {
    std::string t;
    const size_t n = rng() % 12;
    for (size_t j = 0; j < n; ++j) t += kAlphabet[rng() % kAlphabet.size()];
    const std::string plain = "/a" + t, escaped = "/%61" + t;
    const StatusOr<std::string> a = CanonicalPath(plain), b = CanonicalPath(escaped);
    ASSERT_EQ(a.ok(), b.ok()) << plain;
    if (!a.ok()) continue;
    ASSERT_EQ(*a, *b) << plain;
    if (*a == plain) ++shortcut;
  }
  EXPECT_GT(shortcut, 1000u);  // the comparison did cover canonical inputs
}

// A path starting with "//" is a host to WHATWG URL parsers (Node's
// `new URL(req.url, base)`, Deno, Bun, Hono) and to Python's urlsplit:
// "//evil/login" is their "/login", not our "/evil/login". They also read a raw
// '\' as '/' ("/x/..\login" is "/login"), and some servers decode %5C into a
// separator. All are refused (400) as ambiguous; "//" inside a path is merged.
TEST(CanonicalPath, LeadingDoubleSlashAndBackslashesAreRefused) {
  for (std::string_view bad :
       {"//login", "//evil/login", "///login", "//", "http://h//evil/login", "/x/..\\login",
        "/\\evil/login", "\\login", "/login\\", "/a\\b", "/a%5Cb", "/a%5cb", "/x/..%5Clogin",
        "/login;x=%5C", "/login;x\\y"}) {
    StatusOr<std::string> got = CanonicalPath(bad);
    ASSERT_FALSE(got.ok()) << bad << " -> " << *got;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  for (std::string_view good : {"/a//login", "/a///b//", "/login?next=//evil", "/login?a=\\b"}) {
    EXPECT_TRUE(CanonicalPath(good).ok()) << good;
  }
}

TEST(CanonicalPath, RejectsMalformed) {
  for (std::string_view bad :
       {std::string_view(""), std::string_view("login"), std::string_view("*"),
        std::string_view("/a%2Fb"), std::string_view("/a%2fb"), std::string_view("/a%00"),
        std::string_view("/a%zz"), std::string_view("/a%4"), std::string_view("/a%"),
        std::string_view("/a\x01"
                         "b"),
        std::string_view("/a b"), std::string_view("/a%0a"), std::string_view("/a\x7f"),
        std::string_view("/a\0b", 4), std::string_view("?x=1"), std::string_view("ftp://x/y")}) {
    StatusOr<std::string> got = CanonicalPath(bad);
    ASSERT_FALSE(got.ok()) << bad << " -> " << *got;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ratelimit::policy
