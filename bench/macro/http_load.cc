// http_load: a small HTTP/1.1 keep-alive load generator for the benchmarks.
//
// wrk measures the most a server can take (closed loop), but its latency is
// not meaningful at a fixed rate, and wrk2 is not packaged for Debian 12. This
// holds a fixed rate (open loop): request i is DUE at start + i / rate; it goes
// out on the first idle connection, and its latency is counted from the time it
// was due, not the time it was sent, so a stalled server cannot hide its queue
// (no coordinated omission). With --rate=0 it is closed loop like wrk.
//
//   http_load --port=8080 --kind=check --rate=20000 --connections=64 --duration-ms=3000
//
// Requests (built once, --keys distinct client keys, used round-robin):
//   get      GET / (nginx `return 200`)
//   check    POST /v1/check {"key": "k<i>", "limits": --limits (default: token bucket 10, 5/s)}
//   gateway  GET /api/x with X-API-Key: k<i>
// Prints one line of key=value pairs (parsed by scripts/bench.sh): requests,
// rate, p50/p99/p99.9/p99.99 and the maximum in microseconds, status counts, errors (failed or
// malformed exchanges), never_sent (due but no connection free before the
// end: the rate was not held; counted in the latency). One thread, epoll;
// loopback only; bounded by --duration-ms.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "core/ascii.h"
#include "flags.h"
#include "pacing.h"

namespace {

namespace core = ratelimit::core;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string host = "127.0.0.1";
  int64_t port = 8080;
  std::string kind = "get";
  int64_t connections = 64;
  int64_t duration_ms = 3000;
  int64_t warmup_ms = 500;
  double rate = 0;
  int64_t keys = 100'000;
  std::string path = "/api/x";
  std::string key_prefix = "k";  // keys are <prefix><n> (scripts/soak.sh: a new prefix per run)
  // --kind=check: the request's "limits" (a JSON array). The default is full
  // again 0.2 s after a decision; a long window keeps every key live in the store.
  std::string limits =
      R"([{"name":"b","algorithm":"token_bucket","capacity":10,"refill_per_second":5}])";
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  const bench::Usage usage{"http_load",
                           "--host --port --kind=get|check|gateway --connections --duration-ms "
                           "--warmup-ms --rate --keys --key-prefix --path --limits"};
  bench::ParseLoadFlags(argc, argv, usage, f,
                        {{"host", &f.host},
                         {"port", &f.port},
                         {"kind", &f.kind},
                         {"key-prefix", &f.key_prefix},
                         {"path", &f.path},
                         {"limits", &f.limits}});
  if (f.connections < 1 || f.keys < 1) usage.Fail("(zero)");
  if (f.kind != "get" && f.kind != "check" && f.kind != "gateway") usage.Fail("--kind");
  return f;
}

std::vector<std::string> BuildRequests(const Flags& f) {
  std::vector<std::string> out;
  const int64_t n = f.kind == "get" ? 1 : f.keys;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    // Spread consecutive requests over the key space.
    std::string key = f.key_prefix;  // (not prefix + ...: GCC 12 -Wrestrict false positive)
    key += std::to_string((i * 2654435761LL) % f.keys);
    if (f.kind == "get") {
      out.push_back("GET / HTTP/1.1\r\nHost: bench\r\n\r\n");
    } else if (f.kind == "check") {
      const std::string body = "{\"key\":\"" + key + "\",\"limits\":" + f.limits + "}";
      out.push_back(
          "POST /v1/check HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
          "Content-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body);
    } else {
      out.push_back("GET " + f.path + " HTTP/1.1\r\nHost: bench\r\nX-API-Key: " + key + "\r\n\r\n");
    }
  }
  return out;
}

struct Conn {
  int fd = -1;
  bool busy = false;
  Clock::time_point due;  // of the request in flight
  std::string out;
  size_t out_off = 0;
  std::string in;
};

struct Stats {
  std::vector<uint32_t> latency_ns;
  int64_t s2xx = 0, s429 = 0, other = 0, errors = 0, degraded = 0;
};

int Connect(const Flags& f) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(f.port));
  ::inet_pton(AF_INET, f.host.c_str(), &a.sin_addr);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Returns the length of one complete response at the front of `in`, 0 if
// incomplete, -1 if malformed. Sets `status`, and `close` if the server said
// `Connection: close` (nginx does after keepalive_requests). No allocation:
// the driver's CPU is taken from the servers it measures.
ssize_t ParseResponse(std::string_view in, int& status, bool& close, bool& degraded) {
  const size_t head_end = in.find("\r\n\r\n");
  if (head_end == std::string_view::npos) return in.size() > 65536 ? -1 : 0;
  if (in.size() < 12 || in.substr(0, 5) != "HTTP/") return -1;
  if (std::from_chars(in.data() + 9, in.data() + 12, status).ec != std::errc()) return -1;
  size_t content_length = 0;
  bool have_length = false;
  size_t pos = in.find("\r\n") + 2;
  while (pos < head_end) {
    const size_t eol = in.find("\r\n", pos);
    std::string_view line = in.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos) {
      const std::string_view name = line.substr(0, colon);
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (core::EqualsIgnoreCase(name, "content-length")) {
        if (std::from_chars(value.data(), value.data() + value.size(), content_length).ec !=
            std::errc()) {
          return -1;
        }
        have_length = true;
      } else if (core::EqualsIgnoreCase(name, "x-ratelimit-degraded")) {
        degraded = true;  // ratelimitd's store failed and its failure mode decided
      } else if (core::EqualsIgnoreCase(name, "connection")) {
        for (size_t i = 0; i + 5 <= value.size(); ++i) {
          if (core::EqualsIgnoreCase(value.substr(i, 5), "close")) close = true;
        }
      } else if (core::EqualsIgnoreCase(name, "transfer-encoding")) {
        return -1;  // not produced by the servers under test
      }
    }
    pos = eol + 2;
  }
  if (!have_length && status != 204 && status != 304) return -1;
  const size_t total = head_end + 4 + content_length;
  return in.size() >= total ? static_cast<ssize_t>(total) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  const std::vector<std::string> requests = BuildRequests(f);
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);

  const int ep = ::epoll_create1(0);
  bench::Pacer pacer;

  std::vector<Conn> conns(f.connections);
  for (size_t i = 0; i < conns.size(); ++i) {
    conns[i].fd = Connect(f);
    if (conns[i].fd < 0) {
      std::fprintf(stderr, "http_load: cannot connect to %s:%lld\n", f.host.c_str(),
                   static_cast<long long>(f.port));
      return 2;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP;
    ev.data.u64 = i;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev);
  }

  Stats stats;
  stats.latency_ns.reserve(8'000'000);
  size_t next_request = 0;
  std::vector<size_t> idle;
  for (size_t i = 0; i < conns.size(); ++i) idle.push_back(i);
  std::deque<Clock::time_point> backlog;  // due, not yet sent (all connections busy)
  size_t max_backlog = 0;

  const auto start = Clock::now();
  const auto measure_from = start + std::chrono::milliseconds(f.warmup_ms);
  const auto end = measure_from + std::chrono::milliseconds(f.duration_ms);
  const double interval_ns = f.rate > 0 ? 1e9 / f.rate : 0;
  int64_t scheduled = 0;  // open loop: requests made due so far
  bool stopping = false;

  auto flush_out = [&](Conn& c) -> bool {
    while (c.out_off < c.out.size()) {
      const ssize_t n =
          ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_off += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return true;
      } else {
        return false;
      }
    }
    return true;
  };
  auto send_on = [&](size_t ci, Clock::time_point due) {
    Conn& c = conns[ci];
    c.busy = true;
    c.due = due;
    c.out = requests[next_request++ % requests.size()];
    c.out_off = 0;
    if (!flush_out(c)) {
      ++stats.errors;
      c.busy = false;
    }
  };
  auto dispatch = [&]() {
    while (!backlog.empty() && !idle.empty()) {
      const size_t ci = idle.back();
      idle.pop_back();
      send_on(ci, backlog.front());
      backlog.pop_front();
    }
  };
  auto arm_timer = [&](Clock::time_point at) { pacer.WakeAt(at); };

  if (f.rate <= 0) {
    for (size_t i = 0; i < conns.size(); ++i) send_on(i, Clock::now());
    idle.clear();
    arm_timer(end);
  } else {
    arm_timer(start);
  }

  std::vector<epoll_event> events(256);
  size_t busy_count = f.rate <= 0 ? conns.size() : 0;
  while (true) {
    const int n = pacer.Wait(ep, events);
    const auto now = Clock::now();
    if (now >= end) {
      stopping = true;
      arm_timer(now + std::chrono::milliseconds(100));  // only answers to wait for now
    }
    for (int e = 0; e < n; ++e) {
      Conn& c = conns[events[e].data.u64];
      const size_t ci = events[e].data.u64;
      if (events[e].events & EPOLLOUT) {
        if (c.busy && !flush_out(c)) ++stats.errors;
      }
      if (events[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        char buf[16384];
        bool closed = false;
        for (;;) {
          const ssize_t r = ::recv(c.fd, buf, sizeof buf, 0);
          if (r > 0) {
            c.in.append(buf, static_cast<size_t>(r));
            // A short read emptied the socket: stop here rather than pay a
            // recv that fails with EAGAIN. (Edge-triggered, a TCP socket
            // reports each segment that arrives later; a close the event
            // already carries, EPOLLRDHUP, is read to its end below.)
            if (static_cast<size_t>(r) < sizeof buf &&
                !(events[e].events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)))
              break;
            continue;
          }
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          closed = true;  // EOF or error; a response read before it still counts
          break;
        }
        while (c.busy) {
          int status = 0;
          bool server_closes = false, degraded = false;
          const ssize_t len = ParseResponse(c.in, status, server_closes, degraded);
          if (len == 0) break;
          const auto done = Clock::now();
          if (len < 0) {
            ++stats.errors;
            c.in.clear();
          } else {
            c.in.erase(0, static_cast<size_t>(len));
            if (server_closes) closed = true;  // do not send on it again: reconnect
            if (c.due >= measure_from && c.due < end) {
              bench::Record(stats.latency_ns, done - c.due);
              if (degraded) ++stats.degraded;
              if (status == 429)
                ++stats.s429;
              else if (status >= 200 && status < 300)
                ++stats.s2xx;
              else
                ++stats.other;
            }
          }
          c.busy = false;
          --busy_count;
          if (stopping || closed) {
            if (!stopping && f.rate > 0) idle.push_back(ci);
            break;
          }
          if (f.rate <= 0) {
            send_on(ci, done);
            ++busy_count;
          } else {
            idle.push_back(ci);
          }
        }
        if (closed) {
          // The server closed the connection (e.g. nginx after keepalive_requests):
          // an error only if a request was still waiting on it. Reconnect.
          ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
          ::close(c.fd);
          c.in.clear();
          c.fd = Connect(f);
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP;
          ev.data.u64 = ci;
          ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
          if (c.busy) {
            ++stats.errors;
            c.busy = false;
            --busy_count;
            if (!stopping && f.rate > 0) idle.push_back(ci);
          }
          if (!stopping && f.rate <= 0) {
            send_on(ci, Clock::now());
            ++busy_count;
          }
        }
      }
    }
    if (f.rate > 0 && !stopping) {
      // Make due everything scheduled up to now, then arm the timer for the next one.
      for (;;) {
        const auto due = start + std::chrono::nanoseconds(static_cast<int64_t>(
                                     interval_ns * static_cast<double>(scheduled)));
        if (due > now || due >= end) {
          arm_timer(std::min(due, end));
          break;
        }
        backlog.push_back(due);
        ++scheduled;
      }
      max_backlog = std::max(max_backlog, backlog.size());
      const size_t before = idle.size();
      dispatch();
      busy_count += before - idle.size();
    }
    if (stopping && busy_count == 0) break;
    if (stopping && now >= end + std::chrono::seconds(2)) {
      stats.errors += static_cast<int64_t>(busy_count);  // unanswered for 2 s
      break;
    }
  }
  // Requests due in the window but never sent (the server could not keep up
  // with the rate) count in the latency with what they had waited by the end:
  // a lower bound, so the percentiles are never flattered.
  int64_t never_sent = 0;
  const auto stopped = Clock::now();
  for (const auto& due : backlog) {
    if (due < measure_from) continue;
    ++never_sent;
    bench::Record(stats.latency_ns, stopped - due);
  }

  auto& v = stats.latency_ns;
  auto pct = [&](double q) { return bench::Percentile(v, q) / 1000.0; };
  const double secs = static_cast<double>(f.duration_ms) / 1000.0;
  const int64_t answered = stats.s2xx + stats.s429 + stats.other;  // never_sent excluded
  std::printf(
      "requests=%lld secs=%.3f rate=%.0f target_rate=%.0f p50_us=%.1f p99_us=%.1f p999_us=%.1f "
      "p9999_us=%.1f max_us=%.1f s2xx=%lld s429=%lld other=%lld degraded=%lld errors=%lld "
      "never_sent=%lld max_backlog=%zu connections=%lld\n",
      static_cast<long long>(answered), secs, static_cast<double>(answered) / secs, f.rate,
      pct(0.5), pct(0.99), pct(0.999), pct(0.9999), pct(1.0), static_cast<long long>(stats.s2xx),
      static_cast<long long>(stats.s429), static_cast<long long>(stats.other),
      static_cast<long long>(stats.degraded), static_cast<long long>(stats.errors),
      static_cast<long long>(never_sent), max_backlog, static_cast<long long>(f.connections));
  for (auto& c : conns) ::close(c.fd);
  return answered > 0 && stats.errors == 0 && stats.other == 0 && stats.degraded == 0 ? 0 : 1;
}
