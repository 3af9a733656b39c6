// RedisServer: a real redis-server child process for tests, on a free
// loopback port in a fresh temporary directory.
//
//   RedisServer server;                                   // started and answering PING
//   auto options = ParseRedisUrl(server.url());
//   server.Cli("SET", "k", "1");                          // "OK"
//   server.Pause(); ... server.Resume();                  // SIGSTOP / SIGCONT
//   RedisServer tls({.tls = true});                       // TLS-only, certs made at run time
//
// Failures throw std::runtime_error carrying the server's log (GoogleTest
// reports it as a test failure). A missing redis-server binary is an error,
// never a skip. The binary is `redis-server` on PATH unless RL_REDIS_SERVER
// names another.
//
// Ownership: owns the child process and the temporary directory; the
// destructor SIGKILLs the child and removes the directory (set
// RL_KEEP_TEST_DIRS=1 to keep it). The child also gets SIGKILL if the thread
// that started it dies (PR_SET_PDEATHSIG), so start servers from the test's
// main thread. Thread-safety: thread-compatible (one test thread drives it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/test_certificates.h"

namespace ratelimit::testing {

struct RedisServerOptions {
  // Extra redis-server command-line config, e.g. {"--maxmemory", "10mb"}.
  std::vector<std::string> args;
  // Serve TLS only (plain port disabled), with certificates made at start.
  bool tls = false;
  // 0: a free port picked at start. (Cluster nodes need port + 10000 free too.)
  uint16_t port = 0;
  // A config file, first on the command line (a sentinel needs a writable one:
  // {.args = {"--sentinel"}, .config_file = path}).
  std::string config_file;
};

class RedisServer {
 public:
  explicit RedisServer(RedisServerOptions options = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  uint16_t port() const { return port_; }
  // "redis://127.0.0.1:PORT", or for TLS "rediss://127.0.0.1:PORT?tls_ca_file=...".
  std::string url() const;
  const std::string& dir() const { return dir_; }
  // REQUIRES: options.tls.
  const TestCertificates& certificates() const { return certs_; }
  bool running() const { return pid_ > 0; }

  void Stop();     // SIGTERM, wait (SIGKILL after 5 s)
  void Kill();     // SIGKILL, wait
  void Pause();    // SIGSTOP, and wait until it has stopped
  void Resume();   // SIGCONT
  void Restart();  // Stop if running, then start again on the same port

  // Runs one command and returns the reply as text: strings and statuses as
  // is, integers in decimal, nil as "(nil)", errors as their text, arrays as
  // their elements joined by '\n'. Throws if the server cannot be reached.
  template <typename... Args>
  std::string Cli(const Args&... args) {
    return CliArgs({std::string(args)...});
  }
  std::string CliArgs(const std::vector<std::string>& args);

  // The server's log so far.
  std::string Log() const;

 private:
  void Start();
  void WaitUntilReady();
  std::vector<std::string> CommandLine() const;
  [[noreturn]] void Die(const std::string& what);

  RedisServerOptions options_;
  std::string exe_;
  std::string dir_;
  std::string log_file_;
  TestCertificates certs_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace ratelimit::testing
