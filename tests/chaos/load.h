// Load: a steady open-loop HTTP load on ratelimitd for the chaos tests, and
// the per-phase figures taken from what it recorded.
//
//   Load load(daemon.port(), {.rate = 300, .connections = 4});
//   load.Start();
//   ... break Redis; note the times with load.Now() ...
//   load.Stop();
//   PhaseStats s = Stats(load.samples(), t_kill, t_back);
//
// Request i is due at start + i / rate and goes out on keep-alive connection
// i % connections (each connection has its own thread and sends one request
// at a time). Each request is POST /v1/check for key "load<i % keys>" on a
// fixed window limit (`limit` per hour). Every exchange is recorded: due time,
// send time, latency (send to full response), status (0: no answer: the
// connection failed, closed or timed out), the X-RateLimit-Degraded header
// and the key. Times are microseconds on the steady clock since the Load was
// made. Plain POSIX sockets; loopback only; every read times out after 2 s.
//
// Latency ends when the response's last bytes reached the socket (the
// kernel's receive timestamp, SO_TIMESTAMPNS), not when the load's thread got
// to run again: on a busy machine a woken thread can wait milliseconds for a
// CPU, and that wait is the load generator's, not the daemon's.
//
// Thread-safety: Start/Stop/samples from the test's thread; Now from any.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rlchaos {

struct Sample {
  int64_t due_us = 0;
  int64_t sent_us = 0;
  int64_t latency_us = 0;  // send -> whole response in the socket
  int status = 0;          // 0: no answer
  bool degraded = false;
  int key = 0;
};

struct LoadOptions {
  double rate = 300;  // requests per second, all connections together
  int connections = 4;
  int keys = 4;
  int64_t limit = 5000;  // fixed window, 1h
};

class Load {
 public:
  Load(int port, LoadOptions options);
  ~Load();  // Stop()
  void Start();
  void Stop();
  int64_t Now() const;  // microseconds since construction (steady clock)
  std::vector<Sample> samples() const;

 private:
  void Run(int conn);

  const int port_;
  const LoadOptions opts_;
  const std::chrono::steady_clock::time_point epoch_;
  int64_t start_us_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::vector<Sample> samples_;  // GUARDED_BY(mu_)
};

// One HTTP/1.1 exchange on a keep-alive connection (opened on first use,
// reopened after an error).
class Connection {
 public:
  explicit Connection(int port) : port_(port) {}
  ~Connection();
  // POST `target` with a JSON body; returns the status (0: no answer).
  // `latency_us`: from just before the send to the kernel's receive
  // timestamp of the response's last bytes.
  int Post(const std::string& target, const std::string& body, bool* degraded,
           std::string* response_body = nullptr, int64_t* latency_us = nullptr);

 private:
  bool Open();
  void Close();
  int port_;
  int fd_ = -1;
  std::string buffer_;
};

// Figures over the samples SENT in [from_us, to_us).
struct PhaseStats {
  int requests = 0;
  int answered = 0;  // status != 0
  int ok = 0;        // 200
  int denied = 0;    // 429
  int s503 = 0;
  int other_5xx = 0;
  int other = 0;
  int degraded = 0;
  int64_t p50_us = 0, p99_us = 0, max_us = 0;  // send -> response
  int64_t max_late_us = 0;                     // due -> sent (the load's own lag)
  std::string ToString() const;                // "requests=.. answered=.. p99_us=.."
};
PhaseStats Stats(const std::vector<Sample>& samples, int64_t from_us, int64_t to_us);

// The first send time at or after `from_us` from which every later answer is
// exact (answered, not degraded); -1 if the run never got there.
int64_t RecoveredAt(const std::vector<Sample>& samples, int64_t from_us);

// The body of POST /v1/check for `key` on a fixed window of `limit` per hour.
std::string CheckBody(const std::string& key, int64_t limit);
// A token bucket of `capacity` refilling 1 per hour: exactly `capacity` allowed.
std::string CapacityBody(const std::string& key, int64_t capacity);

}  // namespace rlchaos
