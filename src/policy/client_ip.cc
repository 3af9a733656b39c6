// ClientIp: who the client is when proxies stand in between (RFC 7239
// Forwarded, X-Forwarded-For). The rules are in policy.h and
// docs/configuration.md ("Client IP behind proxies").
#include <optional>
#include <string_view>
#include <vector>

#include "core/ascii.h"
#include "policy/policy.h"

namespace ratelimit::policy {
namespace {

using core::Trim;
// One hop as a proxy reported it.
struct Hop {
  enum Kind { kAddress, kOpaque, kMalformed } kind;
  IpAddress address;
};

// A port: 1..5 digits, at most 65535.
bool IsPort(std::string_view s) {
  if (s.empty() || s.size() > 5) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  return v <= 65535;
}

// A node: "1.2.3.4", "1.2.3.4:80", "[2001:db8::1]", "[2001:db8::1]:80", bare
// "2001:db8::1", "unknown", "_hidden". `obfuscated_port` allows ":_abc"
// (Forwarded only).
Hop ParseNode(std::string_view s, bool obfuscated_port) {
  if (s.empty()) return {Hop::kMalformed, {}};
  if (core::EqualsIgnoreCase(s, "unknown") || s[0] == '_') return {Hop::kOpaque, {}};
  auto port_ok = [&](std::string_view p) {
    return IsPort(p) || (obfuscated_port && p.size() > 1 && p[0] == '_');
  };
  std::string_view addr = s;
  if (s[0] == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos) return {Hop::kMalformed, {}};
    addr = s.substr(1, close - 1);
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty() && (rest[0] != ':' || !port_ok(rest.substr(1)))) return {Hop::kMalformed, {}};
    if (addr.find(':') == std::string_view::npos) return {Hop::kMalformed, {}};  // [1.2.3.4]
  } else if (const size_t colon = s.find(':');
             colon != std::string_view::npos && s.find(':', colon + 1) == std::string_view::npos) {
    addr = s.substr(0, colon);  // v4 with port
    if (!port_ok(s.substr(colon + 1))) return {Hop::kMalformed, {}};
  }
  StatusOr<IpAddress> a = IpAddress::Parse(addr);
  if (!a.ok()) return {Hop::kMalformed, {}};
  return {Hop::kAddress, *a};
}

// The value of the `for` parameter of one Forwarded element, unquoted; nullopt
// if the element is malformed or has no `for`.
std::optional<std::string> ForwardedFor(std::string_view element) {
  std::optional<std::string> result;
  size_t i = 0;
  while (i <= element.size()) {
    // Find the end of this pair, honouring quotes.
    std::string_view rest = element.substr(i);
    const size_t eq = rest.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    std::string_view name = Trim(rest.substr(0, eq));
    if (name.empty()) return std::nullopt;
    size_t v = i + eq + 1;
    while (v < element.size() && (element[v] == ' ' || element[v] == '\t')) ++v;
    std::string value;
    size_t end = 0;  // one past the pair's value
    if (v < element.size() && element[v] == '"') {
      size_t k = v + 1;
      bool closed = false;
      for (; k < element.size(); ++k) {
        if (element[k] == '\\' && k + 1 < element.size()) {
          value += element[++k];
        } else if (element[k] == '"') {
          closed = true;
          break;
        } else {
          value += element[k];
        }
      }
      if (!closed) return std::nullopt;
      end = k + 1;
      while (end < element.size() && (element[end] == ' ' || element[end] == '\t')) ++end;
      if (end < element.size() && element[end] != ';') return std::nullopt;
    } else {
      end = element.find(';', v);
      if (end == std::string_view::npos) end = element.size();
      value = std::string(Trim(element.substr(v, end - v)));
      if (value.empty() || value.find('"') != std::string::npos) return std::nullopt;
    }
    if (core::EqualsIgnoreCase(name, "for")) {
      if (result.has_value()) return std::nullopt;  // two `for` in one element
      result = std::move(value);
    }
    if (end >= element.size()) break;
    i = end + 1;  // past ';'
  }
  return result;
}

// Walks `header` (a comma-separated list) from the right and returns the
// client, or nullopt if the walk met something it cannot use (then the
// caller falls back). Elements left of the client are never parsed: they
// are whatever the client wrote.
template <typename ParseElement>
std::optional<IpAddress> Walk(std::string_view header, const std::vector<Cidr>& trusted,
                              ParseElement parse) {
  auto is_trusted = [&](const IpAddress& a) {
    for (const Cidr& c : trusted) {
      if (c.Contains(a)) return true;
    }
    return false;
  };
  std::optional<IpAddress> leftmost;
  size_t end = header.size();
  while (true) {
    const size_t comma = header.rfind(',', end == 0 ? 0 : end - 1);
    const bool first = comma == std::string_view::npos || end == 0;
    const size_t begin = first ? 0 : comma + 1;
    Hop hop = parse(Trim(header.substr(begin, end - begin)));
    if (hop.kind != Hop::kAddress) return std::nullopt;  // malformed, unknown or obfuscated
    if (!is_trusted(hop.address)) return hop.address;
    leftmost = hop.address;
    if (first) break;
    end = comma;
  }
  return leftmost;  // every hop is a trusted proxy
}

}  // namespace

IpAddress ClientIp(const IpAddress& peer, std::optional<std::string_view> x_forwarded_for,
                   std::optional<std::string_view> forwarded, const std::vector<Cidr>& trusted) {
  bool peer_trusted = false;
  for (const Cidr& c : trusted) {
    if (c.Contains(peer)) {
      peer_trusted = true;
      break;
    }
  }
  if (!peer_trusted) return peer;
  if (forwarded.has_value() && !Trim(*forwarded).empty()) {
    std::optional<IpAddress> a = Walk(*forwarded, trusted, [](std::string_view element) {
      std::optional<std::string> node = ForwardedFor(element);
      if (!node.has_value()) return Hop{Hop::kMalformed, {}};
      return ParseNode(*node, /*obfuscated_port=*/true);
    });
    if (a.has_value()) return *a;
  }
  if (x_forwarded_for.has_value() && !Trim(*x_forwarded_for).empty()) {
    std::optional<IpAddress> a = Walk(*x_forwarded_for, trusted, [](std::string_view element) {
      return ParseNode(element, /*obfuscated_port=*/false);
    });
    if (a.has_value()) return *a;
  }
  return peer;
}

}  // namespace ratelimit::policy
