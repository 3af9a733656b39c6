// grpc_fuzzer: the gRPC face, Envoy's RateLimitService/ShouldRateLimit on
// its own unauthenticated port (src/grpc/). The request's protobuf (the
// descriptor count walked before the parse, then libprotobuf) -> the plan on
// an envoyproxy/ratelimit YAML config (kEnvoyDomains) -> the decision on a
// MemoryStore with a ManualClock -> the RateLimitResponse and
// response_headers_to_add; and, from the wire, the HTTP/2 server (nghttp2)
// with gRPC's framing and headers, in process: one end of a socketpair is
// the server's connection (H2Server::Serve), the other the client's.
//
// Input: one selector byte, then, by its bits 0-1:
//   0, 1  a RateLimitRequest message, decided by ShouldRateLimit
//         (should_rate_limit.h) 1 + (bits 4-5) times, the clock 300 ms on
//         each time (a per-second limit runs out, and refills); bits 2-3 the dialect of
//         response_headers_to_add (none, draft06, structured, legacy).
//   2     the streams of a well-formed HTTP/2 connection, which nghttp2's
//         client writes from them: up to 8, separated by kStreamSplit; each
//         is header lines "name: value\n" (a name of the defaults, a POST to
//         ShouldRateLimit with content-type application/grpc, replaces it)
//         up to an empty line, then the request's DATA. Bit 2 set: the
//         DATA is one gRPC message, prefixed here (flag 0, its length); bit
//         3 set: the last stream does not end (no END_STREAM).
//   3     raw bytes of a client's connection; bit 2 set: after the client
//         preface (the fuzzer need not find it).
// The client's bytes are all written, then its side shuts down: the server
// reads them in order and then EOF, so an input replays the same way (but
// for grpc-timeout's deadlines, which the server takes from the steady
// clock).
//
// Invariants:
//   - a call is answered exactly once, before ShouldRateLimit returns (the
//     memory store is synchronous); INTERNAL iff libprotobuf refuses the
//     bytes, and the descriptor walker counts what libprotobuf parses (it
//     bounds the parse's memory); an empty domain or no descriptors is
//     INVALID_ARGUMENT; the failure mode is open, so never UNAVAILABLE;
//   - an OK answer parses as a RateLimitResponse with one status per
//     descriptor, overall OVER_LIMIT iff a status is, an OVER_LIMIT status
//     has a current_limit and nothing remaining, a domain the config does
//     not have limits nothing, durations are non-negative and normalised,
//     response_headers_to_add only with a dialect, as tokens and values
//     without CR, LF or NUL;
//   - over HTTP/2 (2): the server's bytes are valid HTTP/2 to nghttp2's
//     client; every stream the client ended is closed before the connection
//     (answered or reset); an answer with :status 200 has one grpc-status,
//     and OK carries exactly one gRPC message, which keeps the invariants
//     above, another code none; any other :status is 405 or 415;
//     ParseGrpcTimeout agrees with the grammar on every header value sent;
//   - (2, 3) the connection closes once the client has, with nothing left
//     running (no timer keeps the io_context: libFuzzer's -timeout).
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nghttp2/nghttp2.h>

#include "envoy/config.h"
#include "envoy/plan.h"
#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "fuzz/server_fixture.h"
#include "fuzz/targets.h"
#include "grpc/h2_server.h"
#include "grpc/should_rate_limit.h"

namespace ratelimit::fuzz {
namespace {

namespace net = boost::asio;
namespace pb = ::envoy::service::ratelimit::v3;
using grpcface::GrpcCode;
using grpcface::RlsAnswer;

constexpr std::string_view kShouldRateLimit =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
constexpr std::string_view kStreamSplit = "|STREAM|";
constexpr size_t kMaxStreams = 8;
// The client's bytes are written before the server runs: they must fit in
// the socket's buffer.
constexpr size_t kMaxClientBytes = 64 << 10;

// The daemon's policy: only its store section matters here.
constexpr std::string_view kGrpcPolicy = R"(
store:
  type: memory
  max_keys: 64
  max_key_length: 256
  failure_mode: open
  expected_instances: 2
limits: {}
)";

// envoyproxy/ratelimit's format, with ratelimitd's extensions (docs/envoy.md).
constexpr std::array<std::string_view, 2> kEnvoyDomains = {
    R"(
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: header_match
    value: admin
    rate_limit: {unlimited: true}
  - key: header_match
    value: "api*"
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: api}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 2, name: login, replaces: [{name: user}]}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, name: user}
    descriptors:
      - key: plan
        value: bulk
        rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: experiment
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: banned
    rate_limit: {unit: day, requests_per_unit: 0}
)",
    R"(
domain: mesh
descriptors:
  - key: service
    value: payments
    rate_limits:
      - {unit: second, requests_per_unit: 5, name: burst, algorithm: token_bucket, burst: 10}
      - {unit: minute, requests_per_unit: 100, name: minute}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: day, requests_per_unit: 2, align: calendar}
      - key: plan
        value: pro
        rate_limit: {unit: second, requests_per_unit: 50, algorithm: sliding_window}
  - key: login
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log}
  - key: shape
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket, burst: 4}
  - key: huge
    rate_limit: {unit: year, requests_per_unit: 4294967295}
)"};

std::shared_ptr<const envoy::Config> LoadEnvoyConfig() {
  auto c = std::make_shared<envoy::Config>();
  for (size_t i = 0; i < kEnvoyDomains.size(); ++i) {
    const Status s =
        envoy::ParseDomain(kEnvoyDomains[i], "domain" + std::to_string(i) + ".yaml", *c);
    RL_FUZZ_CHECK(s.ok(), s.ToString());
  }
  return c;
}

// What every call decides by: the fixture's store and clock, the config.
struct Service {
  std::shared_ptr<const envoy::Config> config;
  ServerFixture& fixture;
  policy::HeaderDialect headers;

  void Call(std::string_view request, std::function<void(RlsAnswer)> done) const {
    const std::shared_ptr<const policy::Policy>& policy = fixture.policy();
    grpcface::ShouldRateLimit(
        request,
        {.config = config,
         .enforcer = &fixture.enforcer(),
         .failure_mode = policy->config().store.failure_mode,
         .store = std::shared_ptr<const policy::StoreConfig>(policy, &policy->config().store),
         .headers = headers,
         .clock = &fixture.clock()},
        std::move(done));
  }
};

bool NoCrLfNul(std::string_view v) {
  return v.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

// The invariants of a RateLimitResponse answering `request` (which parsed).
void CheckResponse(const pb::RateLimitRequest& request, std::string_view bytes,
                   const envoy::Config& config, policy::HeaderDialect headers) {
  pb::RateLimitResponse r;
  RL_FUZZ_CHECK(r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())),
                "the answer does not parse");
  const auto text = [&r] { return r.ShortDebugString(); };  // only when a check fails
  RL_FUZZ_CHECK(r.statuses_size() == request.descriptors_size(),
                std::to_string(r.statuses_size()) + " statuses for " +
                    std::to_string(request.descriptors_size()) + " descriptors: " + text());
  const bool known = config.domains.contains(request.domain());
  bool over = false;
  for (const pb::RateLimitResponse::DescriptorStatus& s : r.statuses()) {
    RL_FUZZ_CHECK(
        s.code() == pb::RateLimitResponse::OK || s.code() == pb::RateLimitResponse::OVER_LIMIT,
        text());
    over = over || s.code() == pb::RateLimitResponse::OVER_LIMIT;
    if (s.code() == pb::RateLimitResponse::OVER_LIMIT) {
      RL_FUZZ_CHECK(s.has_current_limit() && s.limit_remaining() == 0, text());
    }
    RL_FUZZ_CHECK(known || !s.has_current_limit(), "a limit of an unknown domain: " + text());
    const auto& d = s.duration_until_reset();
    RL_FUZZ_CHECK(d.seconds() >= 0 && d.nanos() >= 0 && d.nanos() < 1'000'000'000,
                  "duration_until_reset: " + text());
  }
  RL_FUZZ_CHECK(
      r.overall_code() == (over ? pb::RateLimitResponse::OVER_LIMIT : pb::RateLimitResponse::OK),
      "overall_code: " + text());
  RL_FUZZ_CHECK(headers != policy::HeaderDialect::kNone || r.response_headers_to_add().empty(),
                text());
  for (const auto& h : r.response_headers_to_add()) {
    RL_FUZZ_CHECK(!h.key().empty(), text());
    for (char c : h.key()) RL_FUZZ_CHECK(IsTokenChar(c), text());
    RL_FUZZ_CHECK(NoCrLfNul(h.value()), text());
  }
}

// The invariants of ShouldRateLimit's answer to the message `bytes`.
void CheckAnswer(std::string_view bytes, const RlsAnswer& a, const Service& service) {
  pb::RateLimitRequest request;
  const bool parses = request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  const size_t walked = grpcface::DescriptorsIn(bytes, envoy::kMaxDescriptorsPerRequest);
  const std::string what =
      "code " + std::to_string(static_cast<int>(a.code)) + " (" + a.message.substr(0, 200) + ")";
  const size_t walked_entries = grpcface::EntriesIn(bytes, envoy::kMaxEntriesPerRequest);
  if (parses) {
    const size_t parsed = static_cast<size_t>(request.descriptors_size());
    RL_FUZZ_CHECK(walked == std::min(parsed, envoy::kMaxDescriptorsPerRequest + 1),
                  "the walker counted " + std::to_string(walked) + " descriptors, the parse " +
                      std::to_string(parsed));
    size_t entries = 0;
    for (const auto& d : request.descriptors()) entries += static_cast<size_t>(d.entries_size());
    RL_FUZZ_CHECK(walked_entries == std::min(entries, envoy::kMaxEntriesPerRequest + 1),
                  "the walker counted " + std::to_string(walked_entries) + " entries, the parse " +
                      std::to_string(entries));
  }
  if (walked > envoy::kMaxDescriptorsPerRequest || walked_entries > envoy::kMaxEntriesPerRequest) {
    RL_FUZZ_CHECK(a.code == GrpcCode::kInvalidArgument, what);
    return;
  }
  RL_FUZZ_CHECK((a.code == GrpcCode::kInternal) == !parses, what);
  if (!parses) return;
  RL_FUZZ_CHECK(a.code == GrpcCode::kOk || a.code == GrpcCode::kInvalidArgument, what);
  if (request.domain().empty() || request.descriptors_size() == 0) {
    RL_FUZZ_CHECK(a.code == GrpcCode::kInvalidArgument, what);
  }
  if (a.code == GrpcCode::kOk) CheckResponse(request, a.message, *service.config, service.headers);
}

// 0, 1: the message, decided `rounds` times.
void FuzzMessage(std::string_view message, int rounds, const Service& service) {
  for (int i = 0; i < rounds; ++i) {
    int answers = 0;
    service.Call(message, [&](RlsAnswer a) {
      ++answers;
      CheckAnswer(message, a, service);
    });
    RL_FUZZ_CHECK(answers == 1, "answered " + std::to_string(answers) + " times");
    service.fixture.clock().Advance(std::chrono::milliseconds(300));
  }
}

// ParseGrpcTimeout against the grammar: 1-8 ASCII digits, then a unit.
void CheckGrpcTimeout(std::string_view v) {
  const std::chrono::nanoseconds got = grpcface::ParseGrpcTimeout(v);
  bool valid = v.size() >= 2 && v.size() <= 9 &&
               std::string_view("HMSmun").find(v.back()) != std::string_view::npos;
  int64_t n = 0;
  for (size_t i = 0; valid && i + 1 < v.size(); ++i) {
    valid = v[i] >= '0' && v[i] <= '9';
    n = n * 10 + (v[i] - '0');
  }
  if (!valid) {
    RL_FUZZ_CHECK(got.count() == -1, std::string(v));
    return;
  }
  using std::chrono::nanoseconds;
  nanoseconds want{};
  switch (v.back()) {
    case 'H':
      want = n > nanoseconds::max() / std::chrono::hours(1) ? nanoseconds::max()
                                                            : nanoseconds(std::chrono::hours(n));
      break;
    case 'M': want = std::chrono::minutes(n); break;
    case 'S': want = std::chrono::seconds(n); break;
    case 'm': want = std::chrono::milliseconds(n); break;
    case 'u': want = std::chrono::microseconds(n); break;
    default: want = nanoseconds(n); break;
  }
  RL_FUZZ_CHECK(got == want, std::string(v) + " -> " + std::to_string(got.count()));
}

// The server's side of one in-process connection, and what the client got
// back: `client` is written to the server, then the client shuts down its
// side; returns the server's bytes once it has closed the connection.
std::string Exchange(std::string_view client, const Service& service) {
  int fds[2];
  RL_FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
  client = client.substr(0, kMaxClientBytes);
  for (size_t sent = 0; sent < client.size();) {
    const ssize_t n = send(fds[1], client.data() + sent, client.size() - sent, MSG_NOSIGNAL);
    RL_FUZZ_CHECK(n > 0, "send to the socketpair");
    sent += static_cast<size_t>(n);
  }
  shutdown(fds[1], SHUT_WR);

  net::io_context ioc;
  grpcface::H2Server server(ioc, {});
  server.Handle(std::string(kShouldRateLimit), [&service](const grpcface::GrpcCall& call) {
    const std::string request(call.request());  // the call's bytes go when the handler returns
    int answers = 0;
    service.Call(request, [&, call](RlsAnswer a) {
      ++answers;
      CheckAnswer(request, a, service);
      if (a.code == GrpcCode::kOk) return call.Reply(std::move(a.message));
      call.Finish(a.code, std::move(a.message));
    });
    RL_FUZZ_CHECK(answers == 1, "answered " + std::to_string(answers) + " times");
  });
  // A socketpair is no TCP socket, but Conn only reads, writes and closes it.
  net::ip::tcp::socket conn(net::make_strand(ioc));
  conn.assign(net::ip::tcp::v4(), fds[0]);
  server.Serve(std::move(conn));

  net::local::stream_protocol::socket peer(ioc);
  peer.assign(net::local::stream_protocol(), fds[1]);
  std::string got;
  std::array<char, 16 << 10> buf;
  std::function<void()> read = [&] {
    peer.async_read_some(net::buffer(buf), [&](const boost::system::error_code& ec, size_t n) {
      got.append(buf.data(), n);
      if (!ec) read();
    });
  };
  read();
  ioc.run();  // until the server has closed, and the client has read it all
  RL_FUZZ_CHECK(server.connections() == 0, "the connection outlived its client");
  return got;
}

// 2: the client's view of a stream.
struct ClientStream {
  std::vector<std::pair<std::string, std::string>> headers;  // what the client sends
  std::string body;
  bool end = true;                       // END_STREAM sent
  std::optional<std::string> message;    // the request message, when one well-framed message
  std::string status;                    // :status
  std::vector<std::string> grpc_status;  // every grpc-status (headers and trailers)
  std::string data;
  int closes = 0;
  uint32_t error = 0;
  size_t sent = 0;  // body bytes handed to nghttp2's client
};

struct Client {
  std::map<int32_t, ClientStream*> streams;

  static Client& Self(void* p) { return *static_cast<Client*>(p); }
  ClientStream* Find(int32_t id) {
    const auto it = streams.find(id);
    return it == streams.end() ? nullptr : it->second;
  }

  static int OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* p) {
    ClientStream* s = Self(p).Find(frame->hd.stream_id);
    if (s == nullptr) return 0;
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":status") s->status = v;
    if (n == "grpc-status") s->grpc_status.emplace_back(v);
    return 0;
  }
  static int OnData(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                    void* p) {
    if (ClientStream* s = Self(p).Find(id))
      s->data.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }
  static int OnClose(nghttp2_session*, int32_t id, uint32_t error, void* p) {
    if (ClientStream* s = Self(p).Find(id)) {
      ++s->closes;
      s->error = error;
    }
    return 0;
  }
  static ssize_t ReadBody(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                          nghttp2_data_source* source, void*) {
    auto* s = static_cast<ClientStream*>(source->ptr);
    const size_t n = std::min(length, s->body.size() - s->sent);
    s->body.copy(reinterpret_cast<char*>(buf), n, s->sent);
    s->sent += n;
    if (s->sent == s->body.size()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      if (!s->end) *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    }
    return static_cast<ssize_t>(n);
  }
};

// One stream of the input: header lines, an empty line, the body.
ClientStream ParseStream(std::string_view in, bool frame) {
  ClientStream s;
  s.headers = {{":method", "POST"},
               {":scheme", "http"},
               {":authority", "ratelimit"},
               {":path", std::string(kShouldRateLimit)},
               {"content-type", "application/grpc"},
               {"te", "trailers"}};
  while (!in.empty()) {
    const size_t eol = in.find('\n');
    const std::string_view line = in.substr(0, eol);
    in.remove_prefix(eol == std::string_view::npos ? in.size() : eol + 1);
    if (line.empty()) break;
    const size_t colon = line.find(": ", 1);  // from 1: a pseudo-header's name starts with ':'
    const std::string name(line.substr(0, colon));
    const std::string value(colon == std::string_view::npos ? "" : line.substr(colon + 2));
    CheckGrpcTimeout(value);
    const auto it = std::find_if(s.headers.begin(), s.headers.end(),
                                 [&](const auto& h) { return h.first == name; });
    if (it != s.headers.end()) {
      it->second = value;
    } else {
      s.headers.emplace_back(name, value);
    }
  }
  if (frame) {
    const auto n = static_cast<uint32_t>(in.size());
    s.body = {'\0', static_cast<char>(n >> 24), static_cast<char>(n >> 16),
              static_cast<char>(n >> 8), static_cast<char>(n)};
  }
  s.body.append(in);
  if (s.body.size() >= 5 && s.body[0] == '\0') {
    const auto* b = reinterpret_cast<const unsigned char*>(s.body.data());
    const size_t len = (size_t{b[1]} << 24) | (size_t{b[2]} << 16) | (size_t{b[3]} << 8) | b[4];
    if (len + 5 == s.body.size()) s.message = s.body.substr(5);
  }
  return s;
}

void FuzzStreams(std::string_view in, bool frame, bool leave_last_open, const Service& service) {
  // Within the server's initial flow-control window (64 KiB), and so within
  // what Exchange writes: every request ends.
  in = in.substr(0, 32 << 10);
  std::vector<ClientStream> streams;  // not resized below: nghttp2 holds pointers into it
  while (streams.size() < kMaxStreams) {
    const size_t split = in.find(kStreamSplit);
    streams.push_back(ParseStream(in.substr(0, split), frame));
    if (split == std::string_view::npos) break;
    in.remove_prefix(split + kStreamSplit.size());
  }
  if (leave_last_open) streams.back().end = false;

  Client client;
  nghttp2_session_callbacks* cb = nullptr;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, Client::OnHeader);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, Client::OnData);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, Client::OnClose);
  nghttp2_session* session = nullptr;
  nghttp2_session_client_new(&session, cb, &client);
  nghttp2_session_callbacks_del(cb);
  const std::unique_ptr<nghttp2_session, decltype(&nghttp2_session_del)> owned(session,
                                                                               nghttp2_session_del);
  // The answers never wait for a window the client would have to open.
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, NGHTTP2_MAX_WINDOW_SIZE}};
  nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings, std::size(settings));
  nghttp2_submit_window_update(session, NGHTTP2_FLAG_NONE, 0, 1 << 30);
  for (ClientStream& s : streams) {
    std::vector<nghttp2_nv> nv;
    for (auto& [n, v] : s.headers) {
      nv.push_back({reinterpret_cast<uint8_t*>(n.data()), reinterpret_cast<uint8_t*>(v.data()),
                    n.size(), v.size(), NGHTTP2_NV_FLAG_NONE});
    }
    nghttp2_data_provider body{};
    body.source.ptr = &s;
    body.read_callback = Client::ReadBody;
    const bool headers_only = s.body.empty() && s.end;
    const int32_t id = nghttp2_submit_request(session, nullptr, nv.data(), nv.size(),
                                              headers_only ? nullptr : &body, nullptr);
    if (id > 0) client.streams.emplace(id, &s);
  }
  std::string out;
  for (;;) {
    const uint8_t* bytes = nullptr;
    const ssize_t n = nghttp2_session_mem_send(session, &bytes);
    RL_FUZZ_CHECK(n >= 0, nghttp2_strerror(static_cast<int>(n)));
    if (n == 0) break;
    out.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(n));
  }

  const std::string answer = Exchange(out, service);
  const ssize_t rv = nghttp2_session_mem_recv(
      session, reinterpret_cast<const uint8_t*>(answer.data()), answer.size());
  RL_FUZZ_CHECK(rv == static_cast<ssize_t>(answer.size()),
                std::string("the server's bytes are not HTTP/2 to nghttp2's client: ") +
                    (rv < 0 ? nghttp2_strerror(static_cast<int>(rv)) : "not all read"));
  for (const auto& [id, s] : client.streams) {
    if (!s->end) continue;
    const std::string where = "stream " + std::to_string(id) + " (" + s->body.substr(0, 100) + ")";
    RL_FUZZ_CHECK(s->closes == 1, where + ": closed " + std::to_string(s->closes) + " times");
    if (s->error != NGHTTP2_NO_ERROR) continue;  // reset: an answer too
    if (s->status != "200") {
      RL_FUZZ_CHECK(s->status == "405" || s->status == "415", where + ": :status " + s->status);
      RL_FUZZ_CHECK(s->grpc_status.empty() && s->data.empty(), where);
      continue;
    }
    RL_FUZZ_CHECK(s->grpc_status.size() == 1,
                  where + ": " + std::to_string(s->grpc_status.size()) + " grpc-status");
    if (s->grpc_status[0] != "0") {
      RL_FUZZ_CHECK(s->data.empty(), where + ": grpc-status " + s->grpc_status[0] + " with data");
      continue;
    }
    RL_FUZZ_CHECK(s->message.has_value(), where + ": OK to a request that is not one message");
    const auto* b = reinterpret_cast<const unsigned char*>(s->data.data());
    RL_FUZZ_CHECK(s->data.size() >= 5 && b[0] == 0 &&
                      ((size_t{b[1]} << 24) | (size_t{b[2]} << 16) | (size_t{b[3]} << 8) | b[4]) ==
                          s->data.size() - 5,
                  where + ": the answer is not one gRPC message");
    pb::RateLimitRequest request;
    RL_FUZZ_CHECK(request.ParseFromString(*s->message),
                  where + ": OK to a request that does not parse");
    CheckResponse(request, std::string_view(s->data).substr(5), *service.config, service.headers);
  }
}

}  // namespace

int FuzzGrpc(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const policy::Policy> policy = CompilePolicy(kGrpcPolicy);
  static const std::shared_ptr<const envoy::Config> config = LoadEnvoyConfig();
  static constexpr std::array<policy::HeaderDialect, 4> kDialects = {
      policy::HeaderDialect::kNone, policy::HeaderDialect::kDraft06,
      policy::HeaderDialect::kStructured, policy::HeaderDialect::kLegacy};
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  ServerFixture f(policy);
  const Service service{config, f, kDialects[(selector >> 2) & 3]};
  switch (selector & 3) {
    case 0:
    case 1: FuzzMessage(in, 1 + ((selector >> 4) & 3), service); break;
    case 2: FuzzStreams(in, (selector & 4) != 0, (selector & 8) != 0, service); break;
    default: {
      std::string client = (selector & 4) != 0 ? "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" : "";
      client.append(in);
      (void)Exchange(client, service);
    }
  }
  return 0;
}

}  // namespace ratelimit::fuzz
