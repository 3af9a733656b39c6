// SseUpstream: a loopback HTTP/1.1 upstream that streams like an LLM API,
// for the metered-cost tests (issue 21). Thread-safety: serves on its own
// threads; Release() and last_event_sent from any thread.
//
//   ratelimit::testing::SseUpstream up;  // up.url(): "http://127.0.0.1:PORT"
//
// One request per connection, answered by path (the request header X-Usage
// says what the answer reports):
//   /sse      text/event-stream, chunked: a content event, then (with
//             X-Hold: 1) waits for Release(), then the usage event written in
//             two halves 5 ms apart, then data: [DONE]; with X-Small: 1, the
//             usage event and data: [DONE] at once, with a Content-Length
//   /header   X-Usage as a response header, a small body
//   /json     application/json {"usage":{"total_tokens":<X-Usage>}}, with a
//             Content-Length (with X-Chunked: 1, chunked in two pieces; with
//             X-Status: N, an error of status N whose JSON has no usage)
//   /trailer  chunked with the usage in the trailer field X-Usage
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace ratelimit::testing {

class SseUpstream {
 public:
  SseUpstream();
  ~SseUpstream();
  SseUpstream(const SseUpstream&) = delete;
  SseUpstream& operator=(const SseUpstream&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Lets the held /sse answers (X-Hold: 1) go on.
  void Release() { released_ = true; }
  std::atomic<int> last_event_sent{0};  // usage events written so far

 private:
  void Accept();
  void Serve(int c);

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> released_{false};
  std::thread acceptor_;
  std::vector<std::thread> workers_;  // the acceptor's; joined after it
};

// Reads a client connection `fd` into `got` until an /sse answer's first
// (content) event has arrived; false if the connection ended before it.
bool ReadFirstEvent(int fd, std::string& got);

}  // namespace ratelimit::testing
