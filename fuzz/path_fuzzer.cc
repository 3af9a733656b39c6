// path_fuzzer: CanonicalPath and CanonicalRoutePath (src/policy/path.cc, policy.cc).
//
// Invariants of an accepted path: it starts with '/'; no "//", no "." or ".."
// segment, no trailing '/' (except "/"), no upper-case ASCII letter, no
// control character, no '\\'. Canonical(Canonical(x)) == Canonical(x) whenever the
// first result holds none of the five bytes a second pass reads differently
// ('%' is decoded again, '?' and '#' end the path, ' ' is refused, ';' starts
// a segment's parameters): the path is fully decoded by design
// (docs/configuration.md), so "/a%2541" is "/a%41" and "/a%3Bb" is "/a;b".
// No ';' is left that the request sent as it is (parameters are dropped).
#include <string>
#include <string_view>

#include "fuzz/targets.h"
#include "policy/policy.h"

namespace ratelimit::fuzz {

int FuzzPath(const uint8_t* data, size_t size) {
  using policy::CanonicalPath;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  StatusOr<std::string> out = CanonicalPath(in);
  if (out.ok()) {
    const std::string& p = *out;
    const std::string detail = std::string(in) + " -> " + p;
    RL_FUZZ_CHECK(!p.empty() && p[0] == '/', detail);
    RL_FUZZ_CHECK(p.find("//") == std::string::npos, detail);
    RL_FUZZ_CHECK(p.find("/./") == std::string::npos && !p.ends_with("/."), detail);
    RL_FUZZ_CHECK(p.find("/../") == std::string::npos && !p.ends_with("/.."), detail);
    RL_FUZZ_CHECK(p == "/" || p.back() != '/', detail);
    for (char c : p) {
      RL_FUZZ_CHECK(!(c >= 'A' && c <= 'Z'), detail);
      RL_FUZZ_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f, detail);
      RL_FUZZ_CHECK(c != '\\', detail);  // a separator to WHATWG parsers: refused
    }
    if (in.find('%') == std::string_view::npos) {
      RL_FUZZ_CHECK(p.find(';') == std::string::npos, detail);
    }
    if (p.find_first_of("%?# ;") == std::string::npos) {
      StatusOr<std::string> again = CanonicalPath(p);
      RL_FUZZ_CHECK(again.ok(), detail + ": " + again.status().message());
      RL_FUZZ_CHECK(*again == p, detail + " -> " + *again);
    }
  } else {
    RL_FUZZ_CHECK(out.status().code() == StatusCode::kInvalidArgument, in);
  }
  // Route paths: the same bytes under each match type; an accepted route path
  // is canonical in the same sense.
  for (auto match : {policy::RouteClass::Match::kExact, policy::RouteClass::Match::kPrefix,
                     policy::RouteClass::Match::kTemplate}) {
    StatusOr<std::string> route = policy::CanonicalRoutePath(in, match);
    if (!route.ok()) continue;
    RL_FUZZ_CHECK(!route->empty() && (*route)[0] == '/', std::string(in) + " -> " + *route);
    RL_FUZZ_CHECK(route->find("//") == std::string::npos, std::string(in) + " -> " + *route);
    RL_FUZZ_CHECK(route->find(';') == std::string::npos, std::string(in) + " -> " + *route);
  }
  return 0;
}

}  // namespace ratelimit::fuzz
