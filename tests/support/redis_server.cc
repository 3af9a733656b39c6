#include "support/redis_server.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/subprocess.h"

namespace ratelimit::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string ReplyText(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR: return std::string(r->str, r->len);
    case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
    case REDIS_REPLY_ARRAY: {
      std::string out;
      for (size_t i = 0; i < r->elements; ++i) {
        if (i > 0) out += "\n";
        out += ReplyText(r->element[i]);
      }
      return out;
    }
    default: return "(nil)";
  }
}

bool TcpAccepts(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// Waits for `pid` up to `timeout`; returns true once it has been reaped.
bool WaitFor(pid_t pid, milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
}

}  // namespace

RedisServer::RedisServer(RedisServerOptions options) : options_(std::move(options)) {
  const char* env = std::getenv("RL_REDIS_SERVER");
  exe_ = FindExecutable(env != nullptr && *env != '\0' ? env : "redis-server");
  if (exe_.empty()) {
    throw std::runtime_error(
        "redis-server not found on PATH (set RL_REDIS_SERVER); the Redis tests need a real server");
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / "rl-redis-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  log_file_ = dir_ + "/redis.log";
  if (options_.tls) certs_ = MakeTestCertificates(dir_);
  port_ = options_.port != 0 ? options_.port : PickFreePort();
  Start();
}

RedisServer::~RedisServer() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    WaitFor(pid_, milliseconds(5000));
    pid_ = -1;
  }
  const char* keep = std::getenv("RL_KEEP_TEST_DIRS");
  if (keep == nullptr || std::string(keep) != "1") {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string RedisServer::url() const {
  const std::string hostport = "127.0.0.1:" + std::to_string(port_);
  if (!options_.tls) return "redis://" + hostport;
  return "rediss://" + hostport + "?tls_ca_file=" + certs_.ca_cert;
}

std::vector<std::string> RedisServer::CommandLine() const {
  std::vector<std::string> a = {exe_};
  if (!options_.config_file.empty()) a.push_back(options_.config_file);
  for (const char* s : {"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"}) {
    a.push_back(s);
  }
  a.insert(a.end(), {dir_, "--daemonize", "no"});
  if (options_.tls) {
    for (const std::string& s :
         {std::string("--port"), std::string("0"), std::string("--tls-port"), std::to_string(port_),
          std::string("--tls-cert-file"), certs_.server_cert, std::string("--tls-key-file"),
          certs_.server_key, std::string("--tls-ca-cert-file"), certs_.ca_cert,
          std::string("--tls-auth-clients"), std::string("optional")}) {
      a.push_back(s);
    }
  } else {
    a.push_back("--port");
    a.push_back(std::to_string(port_));
  }
  a.insert(a.end(), options_.args.begin(), options_.args.end());
  return a;
}

void RedisServer::Start() {
  const std::vector<std::string> argv = CommandLine();
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    int fd = open(log_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  pid_ = pid;
  WaitUntilReady();
}

void RedisServer::WaitUntilReady() {
  const auto end = Clock::now() + milliseconds(10000);
  while (Clock::now() < end) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      Die("redis-server exited during startup");
    }
    if (options_.tls) {
      if (Log().find("Ready to accept connections") != std::string::npos && TcpAccepts(port_)) {
        return;
      }
    } else {
      redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, timeval{0, 200000});
      if (c != nullptr && c->err == 0) {
        auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
        if (reply != nullptr) {
          freeReplyObject(reply);
          redisFree(c);
          return;
        }
      }
      if (c != nullptr) redisFree(c);
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  Die("redis-server did not answer PING within 10 s");
}

void RedisServer::Die(const std::string& what) {
  std::string cmd;
  for (const std::string& s : CommandLine()) cmd += (s.empty() ? "''" : s) + " ";
  throw std::runtime_error(what + "\ncommand: " + cmd + "\n--- redis log ---\n" + Log());
}

void RedisServer::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGCONT);
  kill(pid_, SIGTERM);
  if (!WaitFor(pid_, milliseconds(5000))) {
    kill(pid_, SIGKILL);
    WaitFor(pid_, milliseconds(5000));
  }
  pid_ = -1;
}

void RedisServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  WaitFor(pid_, milliseconds(5000));
  pid_ = -1;
}

void RedisServer::Pause() {
  if (pid_ <= 0) return;
  kill(pid_, SIGSTOP);
  // Return once it has stopped, not merely been signalled: a clock read after
  // Pause() is then a time from which the server answers nothing.
  const auto give_up = Clock::now() + milliseconds(5000);
  while (Clock::now() < give_up) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WUNTRACED | WNOHANG);
    if (r != 0) return;  // stopped (or gone, or not our child: nothing to wait for)
    std::this_thread::sleep_for(milliseconds(1));
  }
}

void RedisServer::Resume() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

void RedisServer::Restart() {
  Stop();
  Start();
}

std::string RedisServer::CliArgs(const std::vector<std::string>& args) {
  if (options_.tls) {
    std::vector<std::string> argv = {"redis-cli", "--raw",    "-h",
                                     "127.0.0.1", "-p",       std::to_string(port_),
                                     "--tls",     "--cacert", certs_.ca_cert};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string out;
    if (RunCommand(argv, &out) != 0) throw std::runtime_error("redis-cli failed: " + out);
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, timeval{2, 0});
  if (c == nullptr || c->err != 0) {
    std::string err = c != nullptr ? c->errstr : "out of memory";
    if (c != nullptr) redisFree(c);
    throw std::runtime_error("RedisServer::Cli: cannot connect: " + err);
  }
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* reply = static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  if (reply == nullptr) {
    std::string err = c->errstr;
    redisFree(c);
    throw std::runtime_error("RedisServer::Cli: " + err);
  }
  std::string text = ReplyText(reply);
  freeReplyObject(reply);
  redisFree(c);
  return text;
}

std::string RedisServer::Log() const {
  std::ifstream in(log_file_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ratelimit::testing
