// Harness for tests that run the real ratelimitd binary (and real nginx,
// curl, upstream servers) on loopback with ports chosen at run time.
//
//   Daemon d({"--listen", "127.0.0.1:0"});          // waits for the "listening" log line
//   HttpResponse r = Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "a"}});
//   EXPECT_EQ(r.status, 200);
//
// Plain POSIX sockets (no Beast) so the tests compile fast and cannot share
// a bug with the server's HTTP code. Thread-safety: TestUpstream serves on
// its own threads; everything else is for the test's thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rltest {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  int status = 0;  // 0: no answer (connection failed or closed)
  Headers headers;
  std::string body;
  std::string raw_head;
  // First value of `name` (case-insensitive), or "" if absent.
  std::string Header(const std::string& name) const;
  bool Has(const std::string& name) const;
};

// One request on a fresh connection (Connection: close). `source_ip` binds the
// client side (e.g. "127.0.0.2") so tests can act as different clients.
HttpResponse Http(int port, const std::string& method, const std::string& target,
                  const Headers& headers = {}, const std::string& body = "",
                  const std::string& source_ip = "");
// A POST of a JSON body (the decision API's /v1/check, ...).
HttpResponse PostJson(int port, const std::string& target, const std::string& body);
// Sends raw bytes and reads the answer until the server closes (or timeout).
HttpResponse RawHttp(int port, const std::string& bytes,
                     std::chrono::milliseconds timeout = std::chrono::seconds(5));
HttpResponse ParseResponse(const std::string& raw);
// A connected socket (10 s send/receive timeouts; `source_ip` as for Http), or -1.
int Connect(int port, const std::string& source_ip = "");
bool SendAll(int fd, const std::string& bytes);  // false if the peer closed or reset
// Reads exactly one response (head, then its Content-Length or chunked body)
// from a keep-alive connection. `pending` keeps bytes read beyond it (the next
// pipelined response). Status 0 on close, reset or timeout.
HttpResponse ReadResponse(int fd, std::string& pending, std::chrono::milliseconds timeout);

// The next local midnight after `now` in `zone` that starts a day (or, with
// `month`, the 1st of a month), in Unix seconds, by glibc's reading of
// tzdata (mktime under TZ): the boundaries calendar quotas must report,
// computed without ratelimitd's code.
int64_t NextLocalMidnight(const char* zone, time_t now, bool month);

int FreePort();
std::string MakeTempDir();
void WriteFile(const std::string& path, const std::string& content);
std::string ReadFile(const std::string& path);

class Daemon {
 public:
  // Starts RATELIMITD_PATH with `args`; --listen 127.0.0.1:0 and
  // --admin-listen 127.0.0.1:0 are added unless given.
  explicit Daemon(std::vector<std::string> args);
  ~Daemon();
  int port() const { return port_; }
  int admin_port() const { return admin_port_; }  // 0: the admin API is off
  pid_t pid() const { return pid_; }
  bool started() const { return port_ > 0; }
  void Signal(int sig);
  // Waits for exit; returns the exit code, or -1 on timeout / killed by a signal.
  int Wait(std::chrono::milliseconds timeout);
  std::string Log() const;  // everything written to stderr so far
  // Waits until the log contains `text`.
  bool WaitForLog(const std::string& text, std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int admin_port_ = 0;
  bool exited_ = false;
  std::string dir_;
  std::string log_path_;
};

// A tiny HTTP/1.1 upstream: answers every request with 200 and a JSON echo
// {"method":..,"target":..,"headers":{lower-case name: [values]},"body":..};
// /slow waits 1.5 s first; /big answers 100 KiB. Every answer carries
// X-Upstream: yes and two Set-Cookie fields (a=1, b=2). Keep-alive supported.
// Records when each request arrived (for shaping tests): the kernel's receive
// time of its first byte, on the system clock.
class TestUpstream {
 public:
  struct Arrival {
    std::chrono::system_clock::time_point at;
    std::string target;
  };
  TestUpstream();
  ~TestUpstream();
  int port() const { return port_; }
  int requests() const { return requests_.load(); }
  int connections() const { return connections_.load(); }
  std::vector<Arrival> arrivals() const {
    std::lock_guard<std::mutex> lock(arrivals_mu_);
    return arrivals_;
  }

 private:
  void Serve(int fd);
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::atomic<int> connections_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
  std::vector<int> fds_;
  mutable std::mutex arrivals_mu_;
  std::vector<Arrival> arrivals_;  // GUARDED_BY(arrivals_mu_)
};

}  // namespace rltest
