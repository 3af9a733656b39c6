// grpc_h2_load: a load driver for Envoy's rate limit service (ShouldRateLimit)
// that speaks gRPC the way Envoy does: HTTP/2 frames from nghttp2 (Envoy's
// own HTTP/2 codec), not gRPC C++'s client stack. One thread, epoll, a few
// connections (Envoy keeps one per worker thread), every call a stream.
//
//   grpc_h2_load --target=127.0.0.1:8081 --mode=closed --inflight=64 --duration-ms=3000
//       the most calls/s with `inflight` calls outstanding (closed loop)
//   grpc_h2_load --target=127.0.0.1:8081 --mode=open --rate=20000 --duration-ms=3000
//       calls at a fixed rate (open loop): call i is due at start + i / rate and
//       its latency counts from then, so a stall shows in the percentiles (no
//       coordinated omission)
//
// Prints one line: calls=N rps=R p50_us=.. p99_us=.. p999_us=.. errors=N
// over_limit=N (errors: a call without HTTP 200 and grpc-status 0, an
// unparsable answer, none within 2 s of the end, or a lost connection, which
// also makes the exit status 1). Every call asks domain
// `bench`, descriptor {key: k, value: one of --keys values}, with
// `grpc-timeout` set as Envoy sets it from its filter's timeout. Used by
// scripts/bench.sh (row 8). Loopback only; bounded by --duration-ms.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.pb.h"

#include "flags.h"
#include "pacing.h"

namespace {

namespace pb = ::envoy::service::ratelimit::v3;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string target = "127.0.0.1:8081";
  std::string mode = "closed";
  int64_t inflight = 64;
  int64_t connections = 4;
  double rate = 1000;
  int64_t duration_ms = 3000;
  int64_t warmup_ms = 500;
  int64_t keys = 10000;
  int64_t timeout_ms = 5000;
};

// One call: a stream. Pooled; `body` points into the prebuilt requests.
struct Call {
  Clock::time_point due;
  const std::string* body = nullptr;
  size_t sent = 0;
  int http_status = 0;
  int grpc_status = -1;
  std::string answer;  // the length-prefixed response message
  size_t conn = 0;
};

struct Conn {
  int fd = -1;
  nghttp2_session* session = nullptr;
  std::string out;
  size_t out_off = 0;
  bool dead = false;
};

class Driver {
 public:
  explicit Driver(const Options& o) : o_(o) {}

  int Run();

 private:
  bool Connect(Conn& c);
  void Submit(Clock::time_point due);
  void Flush(Conn& c);
  void Read(Conn& c);
  void Done(Call* call, bool reset);
  Call* NewCall() {
    if (free_.empty()) return new Call;
    Call* c = free_.back();
    free_.pop_back();
    *c = Call{};
    return c;
  }

  static ssize_t ReadBody(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                          nghttp2_data_source* source, void*) {
    auto* call = static_cast<Call*>(source->ptr);
    const size_t n = std::min(length, call->body->size() - call->sent);
    std::memcpy(buf, call->body->data() + call->sent, n);
    call->sent += n;
    if (call->sent == call->body->size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }
  static int OnHeader(nghttp2_session* s, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void*) {
    auto* call = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, frame->hd.stream_id));
    if (call == nullptr) return 0;
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":status") call->http_status = std::atoi(v.c_str());
    if (n == "grpc-status") call->grpc_status = std::atoi(v.c_str());
    return 0;
  }
  static int OnData(nghttp2_session* s, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
                    void*) {
    auto* call = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, stream_id));
    if (call != nullptr) call->answer.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }
  static int OnClose(nghttp2_session* s, int32_t stream_id, uint32_t error_code, void* self) {
    auto* call = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, stream_id));
    if (call != nullptr) static_cast<Driver*>(self)->Done(call, error_code != NGHTTP2_NO_ERROR);
    return 0;
  }

  Options o_;
  std::string host_;
  int port_ = 0;
  std::vector<Conn> conns_;
  std::vector<std::string> bodies_;
  std::vector<Call*> free_;
  std::vector<nghttp2_nv> headers_;
  std::string authority_, timeout_;
  size_t next_body_ = 0, next_conn_ = 0;
  int64_t outstanding_ = 0, completed_ = 0;
  Clock::time_point measure_from_, measure_until_;
  bool stopping_ = false;
  std::vector<uint32_t> latency_ns_;
  int64_t errors_ = 0, over_ = 0;
  pb::RateLimitResponse response_;  // reused for parsing
};

nghttp2_nv Header(const std::string& name, const std::string& value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE};
}

bool Driver::Connect(Conn& c) {
  c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port_));
  if (::inet_pton(AF_INET, host_.c_str(), &a.sin_addr) != 1) return false;
  const int one = 1;
  ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)
    return false;
  nghttp2_session_callbacks* cbs;
  nghttp2_session_callbacks_new(&cbs);
  nghttp2_session_callbacks_set_on_header_callback(cbs, &Driver::OnHeader);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &Driver::OnData);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &Driver::OnClose);
  const int rv = nghttp2_session_client_new(&c.session, cbs, this);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) return false;
  // Windows large enough that flow control never holds an answer back.
  const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                             {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
  nghttp2_submit_settings(c.session, NGHTTP2_FLAG_NONE, settings, 2);
  nghttp2_session_set_local_window_size(c.session, NGHTTP2_FLAG_NONE, 0, 1 << 24);
  return true;
}

void Driver::Submit(Clock::time_point due) {
  // Round-robin over the live connections.
  for (size_t tries = 0; tries < conns_.size(); ++tries) {
    const size_t ci = next_conn_++ % conns_.size();
    Conn& c = conns_[ci];
    if (c.dead) continue;
    Call* call = NewCall();
    call->due = due;
    call->conn = ci;
    call->body = &bodies_[next_body_++ % bodies_.size()];
    nghttp2_data_provider prd;
    prd.source.ptr = call;
    prd.read_callback = &Driver::ReadBody;
    const int32_t id =
        nghttp2_submit_request(c.session, nullptr, headers_.data(), headers_.size(), &prd, call);
    if (id < 0) {
      free_.push_back(call);
      c.dead = true;
      continue;
    }
    ++outstanding_;
    return;
  }
  if (due >= measure_from_ && due < measure_until_) ++errors_;  // no connection left
}

void Driver::Flush(Conn& c) {
  if (c.dead) return;
  for (;;) {
    const uint8_t* data;
    const ssize_t n = nghttp2_session_mem_send(c.session, &data);
    if (n <= 0) break;
    c.out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
  }
  while (c.out_off < c.out.size()) {
    const ssize_t n =
        ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // EPOLLOUT resumes
    } else {
      c.dead = true;
      return;
    }
  }
  c.out.clear();
  c.out_off = 0;
}

void Driver::Read(Conn& c) {
  uint8_t buf[65536];
  for (;;) {
    const ssize_t r = ::recv(c.fd, buf, sizeof buf, 0);
    if (r > 0) {
      if (nghttp2_session_mem_recv(c.session, buf, static_cast<size_t>(r)) < 0) {
        c.dead = true;
        return;
      }
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.dead = true;  // EOF or error
    return;
  }
}

void Driver::Done(Call* call, bool reset) {
  const auto now = Clock::now();
  --outstanding_;
  ++completed_;
  if (call->due >= measure_from_ && call->due < measure_until_) {
    bench::Record(latency_ns_, now - call->due);
    // The answer: one message, 5-byte prefix (uncompressed, length) + RateLimitResponse.
    const std::string& a = call->answer;
    if (reset || call->http_status != 200 || call->grpc_status != 0 || a.size() < 5 || a[0] != 0 ||
        !response_.ParseFromArray(a.data() + 5, static_cast<int>(a.size() - 5))) {
      ++errors_;
    } else if (response_.overall_code() != pb::RateLimitResponse::OK) {
      ++over_;
    }
  }
  const size_t ci = call->conn;
  free_.push_back(call);
  if (o_.mode == "closed" && !stopping_ && !conns_[ci].dead) Submit(now);
}

int Driver::Run() {
  const size_t colon = o_.target.rfind(':');
  if (colon == std::string::npos) return 2;
  host_ = o_.target.substr(0, colon);
  port_ = std::atoi(o_.target.c_str() + colon + 1);
  authority_ = o_.target;
  timeout_ = std::to_string(o_.timeout_ms) + "m";
  static const std::string kMethod = ":method", kPost = "POST", kScheme = ":scheme", kHttp = "http",
                           kPath = ":path",
                           kRpc = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                           kAuthority = ":authority", kType = "content-type",
                           kGrpc = "application/grpc", kTe = "te", kTrailers = "trailers",
                           kTimeout = "grpc-timeout";
  headers_ = {Header(kMethod, kPost),         Header(kScheme, kHttp), Header(kPath, kRpc),
              Header(kAuthority, authority_), Header(kType, kGrpc),   Header(kTe, kTrailers),
              Header(kTimeout, timeout_)};

  // The requests, serialized once: gRPC's 5-byte prefix, then the message.
  for (int64_t i = 0; i < o_.keys; ++i) {
    pb::RateLimitRequest req;
    req.set_domain("bench");
    auto* e = req.add_descriptors()->add_entries();
    e->set_key("k");
    e->set_value(std::to_string(i));
    const std::string msg = req.SerializeAsString();
    std::string framed(5, '\0');
    const uint32_t len = htonl(static_cast<uint32_t>(msg.size()));
    std::memcpy(framed.data() + 1, &len, 4);
    bodies_.push_back(framed + msg);
  }

  ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  const int ep = ::epoll_create1(0);
  bench::Pacer pacer;
  conns_.resize(static_cast<size_t>(o_.connections));
  for (size_t i = 0; i < conns_.size(); ++i) {
    if (!Connect(conns_[i])) {
      std::fprintf(stderr, "grpc_h2_load: cannot connect to %s\n", o_.target.c_str());
      return 2;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
    ev.data.u64 = i;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, conns_[i].fd, &ev);
  }
  latency_ns_.reserve(8'000'000);

  const auto start = Clock::now();
  measure_from_ = start + std::chrono::milliseconds(o_.warmup_ms);
  measure_until_ = measure_from_ + std::chrono::milliseconds(o_.duration_ms);
  const double interval_ns = o_.mode == "open" ? 1e9 / o_.rate : 0;
  int64_t scheduled = 0;
  auto arm_timer = [&](Clock::time_point at) { pacer.WakeAt(at); };
  if (o_.mode == "closed") {
    for (int64_t i = 0; i < o_.inflight; ++i) Submit(start);
    arm_timer(measure_until_);
  } else {
    arm_timer(start);
  }
  for (Conn& c : conns_) Flush(c);

  std::vector<epoll_event> events(64);
  for (;;) {
    const int n = pacer.Wait(ep, events);
    auto now = Clock::now();
    if (now >= measure_until_) {
      stopping_ = true;
      arm_timer(now + std::chrono::milliseconds(100));  // only answers to wait for now
    }
    for (int e = 0; e < n; ++e) {
      Conn& c = conns_[events[e].data.u64];
      if (c.dead) continue;
      if (events[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) Read(c);
    }
    if (o_.mode == "open" && !stopping_) {
      // Make due every call scheduled up to now; arm the timer for the next.
      now = Clock::now();
      for (;;) {
        const auto due = start + std::chrono::nanoseconds(static_cast<int64_t>(
                                     interval_ns * static_cast<double>(scheduled)));
        if (due > now || due >= measure_until_) {
          arm_timer(std::min(due, measure_until_));
          break;
        }
        Submit(due);
        ++scheduled;
      }
    }
    // Writes: new calls, WINDOW_UPDATEs and SETTINGS acks, a send that
    // EAGAIN'd (EPOLLOUT) — one pass over the connections covers them all.
    for (Conn& c : conns_) Flush(c);
    bool all_dead = true;
    for (const Conn& c : conns_) all_dead = all_dead && c.dead;
    if (stopping_ && outstanding_ == 0) break;
    if (all_dead) break;
    if (stopping_ && now >= measure_until_ + std::chrono::seconds(2)) break;
  }
  // Calls never answered, and a connection lost on the way: errors (a lost
  // connection also fails the run: what was due on it is not measured).
  errors_ += outstanding_;
  int64_t lost = 0;
  for (const Conn& c : conns_) lost += c.dead ? 1 : 0;
  errors_ += lost;
  for (Conn& c : conns_) {
    nghttp2_session_del(c.session);
    ::close(c.fd);
  }

  auto& v = latency_ns_;
  auto pct = [&](double q) { return static_cast<long long>(bench::Percentile(v, q) / 1000); };
  const long long p50 = pct(0.5), p99 = pct(0.99), p999 = pct(0.999);
  std::printf(
      "calls=%zu rps=%.0f p50_us=%lld p99_us=%lld p999_us=%lld errors=%lld over_limit=%lld\n",
      v.size(), static_cast<double>(v.size()) * 1000.0 / static_cast<double>(o_.duration_ms), p50,
      p99, p999, static_cast<long long>(errors_), static_cast<long long>(over_));
  if (lost > 0)
    std::fprintf(stderr, "grpc_h2_load: %lld connection(s) lost\n", static_cast<long long>(lost));
  return completed_ == 0 || lost > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const bench::Usage usage{"grpc_h2_load",
                           "--target --mode=closed|open --inflight --connections --rate "
                           "--duration-ms --warmup-ms --keys --timeout-ms"};
  bench::ParseFlags(argc, argv, usage,
                    {{"target", &o.target},
                     {"mode", &o.mode},
                     {"inflight", &o.inflight},
                     {"connections", &o.connections},
                     {"rate", &o.rate},
                     {"duration-ms", &o.duration_ms},
                     {"warmup-ms", &o.warmup_ms},
                     {"keys", &o.keys},
                     {"timeout-ms", &o.timeout_ms}});
  o.keys = std::max<int64_t>(1, o.keys);
  if ((o.mode != "closed" && o.mode != "open") || o.rate <= 0 || o.inflight < 1 ||
      o.connections < 1) {
    usage.Fail("--mode closed|open, --rate > 0, --inflight >= 1, --connections >= 1");
  }
  Driver d(o);
  return d.Run();
}
