// http_fuzzer: raw HTTP/1.1 bytes -> Beast's request parser (with the
// session's limits) -> Router::Handle (src/server/router.cc) -> every face
// but the gateway's upstream exchange (fuzz/gateway_fuzzer.cc): decision API
// and batch, /v1/auth (nginx auth_request), the demo page and /demo/state,
// the rules (Policy::Resolve, client identity behind proxies, Enforcer) on
// a MemoryStore, and the admin listener (AdminApi).
//
// Input: one selector byte, then the bytes a client sends (pipelined
// requests are answered in order, at most 8). The selector picks
//   bits 0-1  the TCP peer: 10.0.0.1 and ::1 are trusted proxies,
//             203.0.113.7 and 2001:db8::7 are not;
//   bits 2-3  the config: header dialect draft06, structured, legacy or
//             none, with failure modes open / closed / local / open;
//   bits 4-5  the listener (printable selectors in brackets):
//             3 ['0'-'?']  public, demo on, no admin API
//             0 ['@'-'O']  public, demo on, with the admin API (/demo/state)
//             1 ['P'-'_']  admin listener, no token
//             2 [' '-'/']  admin listener, token kAdminToken required.
//
// Invariants: CheckReply (server_fixture.h) for every answer; each request
// is answered exactly once, before Handle returns (MemoryStore is synchronous).
#include <array>
#include <string>
#include <string_view>

#include <boost/beast/http/read.hpp>

#include "fuzz/server_fixture.h"
#include "fuzz/targets.h"
#include "server/admin.h"
#include "server/http.h"
#include "server/session.h"

namespace ratelimit::fuzz {
namespace {

namespace http = server::http;

constexpr std::string_view kConfigTemplate = R"(
server:
  demo: true
  headers: @DIALECT@
store:
  type: memory
  max_keys: 64
  max_key_length: 256
  failure_mode: @FAILURE@
  closed_status: 429
  expected_instances: 2
clients:
  api_key_header: X-API-Key
  user_header: X-User
  trusted_proxies: [10.0.0.0/8, "::1/128"]
  ipv6_prefix: 56
limits:
  burst: {algorithm: token_bucket, capacity: 5, refill_per_second: 1}
  free_daily: {algorithm: fixed_window, limit: 1000, window: 1d}
plans:
  free:
    limits: [free_daily]
  pro:
    limits:
      - {name: pro_daily, algorithm: fixed_window, limit: 100000, window: 1d}
  internal:
    limits:
      - {name: internal_daily, algorithm: sliding_window, limit: 3, window: 1m, shadow: true}
default_plan: free
api_keys:
  "pro-key": pro
  "internal-key": internal
global: [burst]
routes:
  - name: login
    methods: [POST]
    path: /login
    match: exact
    key_by: ip
    limits:
      - {name: login, algorithm: sliding_log, limit: 2, window: 15m}
  - name: search
    path: /api/search
    cost: 5
    failure_mode: closed
    limits:
      - {name: search_burst, algorithm: token_bucket, capacity: 20, refill_per_second: 2}
  - name: item
    methods: [GET, HEAD]
    path: "/api/items/{id}"
    match: template
    shadow: true
    limits:
      - {name: item_reads, algorithm: sliding_window, limit: 3, window: 1m}
  - name: ping
    path: /api/ping
    match: exact
    limits:
      - {name: ping, algorithm: token_bucket, capacity: 2, refill_per_second: 1}
  - name: api
    path: /api
    limits: []
)";

std::string Config(int index) {
  static constexpr std::array<std::string_view, 4> kDialects = {"draft06", "structured", "legacy",
                                                                "none"};
  static constexpr std::array<std::string_view, 4> kFailure = {"open", "closed", "local", "open"};
  std::string yaml(kConfigTemplate);
  yaml.replace(yaml.find("@DIALECT@"), 9, kDialects[index]);
  yaml.replace(yaml.find("@FAILURE@"), 9, kFailure[index]);
  return yaml;
}

constexpr std::string_view kAdminToken = "fuzz-admin-token";

enum class Listener { kPublicAdmin = 0, kAdmin = 1, kAdminToken = 2, kPublic = 3 };

struct Peer {
  const char* text;
  policy::IpAddress address;
};

}  // namespace

int FuzzHttp(const uint8_t* data, size_t size) {
  static const std::array<std::shared_ptr<const policy::Policy>, 4> kPolicies = {
      CompilePolicy(Config(0)), CompilePolicy(Config(1)), CompilePolicy(Config(2)),
      CompilePolicy(Config(3))};
  static const std::array<Peer, 4> kPeers = {
      Peer{"10.0.0.1", *policy::IpAddress::Parse("10.0.0.1")},
      Peer{"203.0.113.7", *policy::IpAddress::Parse("203.0.113.7")},
      Peer{"::1", *policy::IpAddress::Parse("::1")},
      Peer{"2001:db8::7", *policy::IpAddress::Parse("2001:db8::7")}};
  if (size == 0) return 0;
  const Peer& peer = kPeers[data[0] & 3];
  ServerFixture f(kPolicies[(data[0] >> 2) & 3]);
  const auto listener = static_cast<Listener>((data[0] >> 4) & 3);
  server::AdminApi admin(f.enforcer(),
                         listener == Listener::kAdminToken ? std::string(kAdminToken) : "");
  std::unique_ptr<server::Router> admin_router;
  server::Router* router = &f.router();
  if (listener == Listener::kAdmin || listener == Listener::kAdminToken) {
    admin_router = server::Router::Admin(f.holder(), f.enforcer(), admin);
    router = admin_router.get();
  } else if (listener == Listener::kPublicAdmin) {
    admin_router = std::make_unique<server::Router>(f.holder(), f.enforcer(), /*gateway=*/nullptr,
                                                    /*demo=*/true, &admin);
    router = admin_router.get();
  }
  const server::SessionLimits limits;  // the defaults of ServerConfig, as the server uses them

  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  for (int n = 0; n < 8 && !in.empty(); ++n) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(limits.max_header_bytes));
    parser.body_limit(limits.max_body_bytes);
    parser.eager(true);
    const boost::beast::error_code ec = FeedAndClose(parser, in);
    if (ec || !parser.is_done()) break;  // the session answers 400/413/431 and closes
    const server::Request req = parser.release();
    int answers = 0;
    router->Handle(req, peer.address, peer.text, [&](server::Reply r) {
      ++answers;
      CheckReply(r, std::string(req.method_string()) + " " + std::string(req.target()));
    });
    RL_FUZZ_CHECK(answers == 1,
                  "answered " + std::to_string(answers) + " times: " + std::string(req.target()));
    if (!req.keep_alive()) break;
    f.clock().Advance(std::chrono::milliseconds(300));
  }
  return 0;
}

}  // namespace ratelimit::fuzz
