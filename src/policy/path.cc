// CanonicalPath: the one form of a request path that route matching sees.
// See policy.h for the contract and docs/configuration.md ("Route matching").
#include <string>
#include <string_view>

#include "core/percent.h"
#include "policy/policy.h"

namespace ratelimit::policy {
namespace {

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    char c = s[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != prefix[i]) return false;
  }
  return true;
}

const Status kAmbiguousParameters = InvalidArgument(
    "request path has parameters on an empty or dot segment (';x', '.;x', '..;x'): upstreams "
    "disagree on what it names");

const Status kAmbiguousLeadingSlashes =
    InvalidArgument("request path starts with '//': URL parsers read its first segment as a host");
const Status kAmbiguousBackslash = InvalidArgument(
    "request path contains a '\\' or '%5C': upstreams disagree on whether it separates "
    "segments");

// True when `path` (starting with '/', its query cut off) is its own
// canonical form, as most are: every segment non-empty and not starting with
// '.', no percent-escape, no path parameter (';'), no '\', no upper case, no control
// character or space. Then the decoding and the walk over segments below
// would return it unchanged.
bool AlreadyCanonical(std::string_view path) {
  if (path == "/") return true;
  for (size_t i = 0; i < path.size(); ++i) {
    const auto c = static_cast<unsigned char>(path[i]);
    if (c == '/') {
      if (i + 1 == path.size() || path[i + 1] == '/' || path[i + 1] == '.') return false;
    } else if (c == '%' || c == ';' || c == '\\' || c <= ' ' || c == 0x7f ||
               (c >= 'A' && c <= 'Z')) {
      return false;
    }
  }
  return true;
}

}  // namespace

StatusOr<std::string> CanonicalPath(std::string_view target) {
  // Absolute form (a request to a proxy, RFC 9112 3.2.2): keep only the path.
  for (std::string_view scheme : {"http://", "https://"}) {
    if (StartsWithNoCase(target, scheme)) {
      target.remove_prefix(scheme.size());
      const size_t end = target.find_first_of("/?#");
      if (end == std::string_view::npos || target[end] != '/') {
        target = "/";
      } else {
        target.remove_prefix(end);
      }
      break;
    }
  }
  if (const size_t q = target.find_first_of("?#"); q != std::string_view::npos) {
    target = target.substr(0, q);
  }
  if (target.empty() || target[0] != '/') {
    return InvalidArgument("request target must start with '/'");
  }
  // A path starting with "//" is a network-path reference to a WHATWG URL
  // parser (Node's `new URL(req.url, base)`, Deno, Bun, Hono) and to Python's
  // urlsplit: "//evil/login" is host "evil", path "/login" there, so merging
  // the slashes (our "/evil/login") would let a client reach /login outside
  // its route. No one reading is safe for every upstream: refused.
  if (target.size() >= 2 && target[1] == '/') return kAmbiguousLeadingSlashes;
  if (AlreadyCanonical(target)) return std::string(target);  // the request path's usual case

  // Decode, rejecting what would change the path's structure or smuggle bytes,
  // and dropping each segment's parameters: from a ';' to the segment's end
  // (RFC 3986 3.3; "/login;jsessionid=x" is "/login" to Tomcat, Jetty and
  // Spring, which serve it as /login). Only a ';' as sent is a separator: an
  // escaped one (%3B) is data, as for those servers, and stays in the segment.
  // Their bytes are checked like any others. A segment that is empty, "." or
  // ".." without its parameters (";x", ".;x", "..;x") is refused: those
  // servers drop it or resolve it as a dot segment, while nginx, Envoy, Go or
  // Express serve it as a name ("/admin/..;/users" is /users to the first and
  // under /admin to the others), so no one reading of it is safe for every
  // upstream, and no client needs it.
  std::string decoded;
  decoded.reserve(target.size());
  Status refused = Status::Ok();
  bool in_parameters = false;
  bool has_parameters = false;  // the current segment
  size_t segment = 0;           // where it starts in `decoded`
  auto ambiguous = [&] {        // the current segment, once it ends
    if (!has_parameters) return false;
    const std::string_view s(decoded.data() + segment, decoded.size() - segment);
    return s.empty() || s == "." || s == "..";
  };
  const core::PercentResult r =
      core::PercentDecodeEach(target, /*plus_is_space=*/false, [&](char c, bool escaped) {
        const auto b = static_cast<unsigned char>(c);
        if (!escaped && (IsControl(b) || c == ' ')) {
          refused = InvalidArgument("request path contains a control character or space");
        } else if (c == '\\') {
          // WHATWG URL parsers turn a raw '\' into '/' ("/x/..\login" is
          // "/login" to them), and some servers decode %5C into one too.
          refused = kAmbiguousBackslash;
        } else if (escaped && b == '/') {
          refused = InvalidArgument("request path contains an encoded '/' (%2F)");
        } else if (escaped && IsControl(b)) {
          refused = InvalidArgument("request path contains an encoded control character");
        } else if (!escaped && c == '/' && ambiguous()) {
          refused = kAmbiguousParameters;
        } else {
          if (!escaped && c == '/') {
            in_parameters = has_parameters = false;
            decoded += c;
            segment = decoded.size();
          } else if (!escaped && c == ';') {
            in_parameters = has_parameters = true;
          } else if (!in_parameters) {
            decoded += c;
          }
          return true;
        }
        return false;
      });
  if (r == core::PercentResult::kMalformed) {
    return InvalidArgument("request path has a malformed percent-escape");
  }
  if (!refused.ok()) return refused;
  if (ambiguous()) return kAmbiguousParameters;

  // Segments: drop empty and ".", resolve ".." (never above the root), lower-case.
  std::string out;
  out.reserve(decoded.size() + 1);
  size_t pos = 1;  // decoded[0] == '/'
  while (pos <= decoded.size()) {
    size_t end = decoded.find('/', pos);
    if (end == std::string::npos) end = decoded.size();
    std::string_view seg(decoded.data() + pos, end - pos);
    pos = end + 1;
    if (seg.empty() || seg == ".") continue;
    if (seg == "..") {
      const size_t last = out.rfind('/');
      out.resize(last == std::string::npos ? 0 : last);
      continue;
    }
    out += '/';
    for (char c : seg) out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  if (out.empty()) out.push_back('/');
  return out;
}

}  // namespace ratelimit::policy
