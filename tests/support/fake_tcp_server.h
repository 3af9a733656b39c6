// FakeTcpServer: a scripted TCP peer on 127.0.0.1 for fault-injection tests
// (garbage replies, connections closed mid-reply, servers that never answer).
//
//   FakeTcpServer fake([](int fd) {
//     FakeTcpServer::ReadSome(fd);                 // the request
//     FakeTcpServer::WriteAll(fd, "$10\r\nabc");   // half a reply, then close
//   });
//   options.port = fake.port();
//
// Each accepted connection is handed to the handler on the server's own
// thread, one at a time; the socket is closed when the handler returns.
// Ownership: owns the listening socket and the thread; the destructor stops
// accepting and joins (handlers must return: use the timeouts below).
// Thread-safety: port() and accepted() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace ratelimit::testing {

// A TCP socket listening on 127.0.0.1 at a free port, served by a thread
// of its own (Serve) that polls fd() and wake_fd(): the destructor makes
// wake_fd() readable, joins the thread and closes both. Throws
// std::runtime_error naming `who`. FakeTcpServer's, TcpProxy's.
class LoopbackListener {
 public:
  explicit LoopbackListener(const char* who);
  ~LoopbackListener();
  LoopbackListener(const LoopbackListener&) = delete;
  LoopbackListener& operator=(const LoopbackListener&) = delete;

  void Serve(std::function<void()> run) { thread_ = std::thread(std::move(run)); }
  int fd() const { return fd_; }
  int wake_fd() const { return wake_[0]; }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  std::thread thread_;
};

class FakeTcpServer {
 public:
  using Handler = std::function<void(int fd)>;

  explicit FakeTcpServer(Handler handler);
  FakeTcpServer(const FakeTcpServer&) = delete;
  FakeTcpServer& operator=(const FakeTcpServer&) = delete;

  uint16_t port() const { return listener_.port(); }
  int accepted() const { return accepted_.load(); }

  // Reads what is available (waiting up to `timeout` for the first byte).
  // Returns "" on timeout, EOF or error.
  static std::string ReadSome(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(2));
  static void WriteAll(int fd, std::string_view data);
  // Waits until the peer closes (or `timeout`); returns true on EOF/reset.
  static bool WaitForClose(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(2));

 private:
  void Run();

  Handler handler_;
  std::atomic<int> accepted_{0};
  LoopbackListener listener_{"FakeTcpServer"};  // last: its thread stops first
};

}  // namespace ratelimit::testing
