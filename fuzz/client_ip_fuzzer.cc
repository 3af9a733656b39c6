// client_ip_fuzzer: ClientIp behind proxies, IpAddress and Cidr (src/policy/client_ip.cc, ip.cc).
//
// Input: lines separated by '\n':
//   1: the peer address (text; unparseable -> 203.0.113.9, still fuzzing the parser)
//   2: trusted proxies, CIDRs separated by spaces (unparseable ones are skipped)
//   3: X-Forwarded-For value (absent if there is no line 3)
//   4: Forwarded value (absent if there is no line 4)
//
// Invariants:
//   - a peer no trusted CIDR contains is always the answer, whatever the headers say;
//   - the answer differs from the peer only when the peer is trusted;
//   - when X-Forwarded-For named an untrusted client, elements left of it are
//     never read: prefixing garbage does not change the answer;
//   - IpAddress and Cidr text round-trips: Parse(ToString(x)) == x.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/targets.h"
#include "policy/ip.h"
#include "policy/policy.h"

namespace ratelimit::fuzz {
namespace {

using policy::Cidr;
using policy::IpAddress;

std::string_view NextLine(std::string_view& in, bool* found) {
  *found = !in.empty();
  const size_t nl = in.find('\n');
  std::string_view line = in.substr(0, nl);
  in = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  return line;
}

void CheckAddress(const IpAddress& a) {
  StatusOr<IpAddress> again = IpAddress::Parse(a.ToString());
  RL_FUZZ_CHECK(again.ok() && *again == a, a.ToString());
  for (int prefix : {0, 1, 48, 64, 127, 128}) (void)a.KeyString(prefix);
}

bool Trusted(const IpAddress& a, const std::vector<Cidr>& trusted) {
  for (const Cidr& c : trusted) {
    if (c.Contains(a)) return true;
  }
  return false;
}

}  // namespace

int FuzzClientIp(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  bool has_peer, has_trusted, has_xff, has_fwd;
  const std::string_view peer_text = NextLine(in, &has_peer);
  const std::string_view trusted_text = NextLine(in, &has_trusted);
  const std::string_view xff_text = NextLine(in, &has_xff);
  const std::string_view fwd_text = NextLine(in, &has_fwd);

  IpAddress peer = *IpAddress::Parse("203.0.113.9");
  if (StatusOr<IpAddress> p = IpAddress::Parse(peer_text); p.ok()) {
    peer = *p;
    CheckAddress(peer);
  }
  std::vector<Cidr> trusted;
  size_t pos = 0;
  while (pos <= trusted_text.size()) {
    size_t end = trusted_text.find(' ', pos);
    if (end == std::string_view::npos) end = trusted_text.size();
    std::string_view item = trusted_text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    StatusOr<Cidr> c = Cidr::Parse(item);
    if (!c.ok()) continue;
    StatusOr<Cidr> again = Cidr::Parse(c->ToString());
    RL_FUZZ_CHECK(again.ok() && *again == *c, std::string(item) + " -> " + c->ToString());
    RL_FUZZ_CHECK(c->Contains(c->address()), c->ToString());
    trusted.push_back(*c);
  }

  const std::optional<std::string_view> xff =
      has_xff ? std::optional<std::string_view>(xff_text) : std::nullopt;
  const std::optional<std::string_view> fwd =
      has_fwd ? std::optional<std::string_view>(fwd_text) : std::nullopt;
  const IpAddress client = policy::ClientIp(peer, xff, fwd, trusted);
  CheckAddress(client);
  const bool peer_trusted = Trusted(peer, trusted);
  if (!peer_trusted)
    RL_FUZZ_CHECK(client == peer, "untrusted peer " + peer.ToString() + " -> " + client.ToString());
  RL_FUZZ_CHECK(policy::ClientIp(peer, xff, fwd, {}) == peer, "no trusted proxies");

  if (peer_trusted && xff.has_value()) {
    const IpAddress from_xff = policy::ClientIp(peer, xff, std::nullopt, trusted);
    if (from_xff != peer && !Trusted(from_xff, trusted)) {
      const std::string forged =
          "not an address, [::1]:99999, 10.0.0.1" + std::string(",") + std::string(*xff);
      const IpAddress again = policy::ClientIp(peer, forged, std::nullopt, trusted);
      RL_FUZZ_CHECK(again == from_xff, "prefix changed the client: " + from_xff.ToString() +
                                           " -> " + again.ToString());
    }
  }
  return 0;
}

}  // namespace ratelimit::fuzz
