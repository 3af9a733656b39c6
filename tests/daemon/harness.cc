#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

extern char** environ;

namespace rltest {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string ReadAll(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  char buf[16384];
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// recv() that also gives the kernel's receive time of the data (the socket
// has SO_TIMESTAMPNS), so an arrival time does not include the wait for this
// thread to be scheduled on a busy box. Falls back to the time of the call.
ssize_t RecvStamped(int fd, char* buf, size_t size, std::chrono::system_clock::time_point* at) {
  iovec iov{buf, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(fd, &msg, 0);
  *at = std::chrono::system_clock::now();
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      timespec ts;
      std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
      *at = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
    }
  }
  return n;
}

}  // namespace

int Connect(int port, const std::string& source_ip) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (!source_ip.empty()) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, source_ip.c_str(), &src.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string HttpResponse::Header(const std::string& name) const {
  const std::string l = Lower(name);
  for (const auto& [n, v] : headers) {
    if (Lower(n) == l) return v;
  }
  return "";
}

bool HttpResponse::Has(const std::string& name) const {
  const std::string l = Lower(name);
  for (const auto& [n, v] : headers) {
    if (Lower(n) == l) return true;
  }
  return false;
}

HttpResponse ParseResponse(const std::string& raw) {
  HttpResponse r;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos || raw.compare(0, 5, "HTTP/") != 0) return r;
  r.raw_head = raw.substr(0, end);
  std::istringstream in(r.raw_head);
  std::string line;
  std::getline(in, line);
  r.status = std::atoi(line.substr(9, 3).c_str());
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 1);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    r.headers.emplace_back(line.substr(0, colon), v);
  }
  std::string body = raw.substr(end + 4);
  if (Lower(r.Header("Transfer-Encoding")) == "chunked") {
    std::string decoded;
    size_t pos = 0;
    while (pos < body.size()) {
      const size_t eol = body.find("\r\n", pos);
      if (eol == std::string::npos) break;
      const size_t n = std::strtoul(body.substr(pos, eol - pos).c_str(), nullptr, 16);
      if (n == 0) break;
      decoded += body.substr(eol + 2, n);
      pos = eol + 2 + n + 2;
    }
    body = decoded;
  }
  r.body = body;
  return r;
}

int64_t NextLocalMidnight(const char* zone, time_t now, bool month) {
  const char* old = std::getenv("TZ");  // NOLINT(concurrency-mt-unsafe): test set-up only
  const std::string saved = old != nullptr ? old : "";
  setenv("TZ", zone, 1);  // NOLINT(concurrency-mt-unsafe)
  tzset();
  std::tm tm{};
  localtime_r(&now, &tm);
  if (month) {
    tm.tm_mon += 1;
    tm.tm_mday = 1;
  } else {
    tm.tm_mday += 1;
  }
  tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
  tm.tm_isdst = -1;
  const time_t boundary = mktime(&tm);
  if (old != nullptr) {
    setenv("TZ", saved.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
  } else {
    unsetenv("TZ");  // NOLINT(concurrency-mt-unsafe)
  }
  tzset();
  return boundary;
}

HttpResponse PostJson(int port, const std::string& target, const std::string& body) {
  return Http(port, "POST", target, {{"Content-Type", "application/json"}}, body);
}

HttpResponse Http(int port, const std::string& method, const std::string& target,
                  const Headers& headers, const std::string& body, const std::string& source_ip) {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                    "\r\nConnection: close\r\n";
  for (const auto& [n, v] : headers) req += n + ": " + v + "\r\n";
  if (!body.empty() || method == "POST" || method == "PUT") {
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  int fd = Connect(port, source_ip);
  if (fd < 0) return {};
  SendAll(fd, req);
  std::string raw = ReadAll(fd, std::chrono::seconds(15));
  ::close(fd);
  return ParseResponse(raw);
}

HttpResponse ReadResponse(int fd, std::string& pending, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // The length of the first complete response in `pending`, or 0 if not all here.
  auto complete = [&pending]() -> size_t {
    const size_t end = pending.find("\r\n\r\n");
    if (end == std::string::npos) return 0;
    const std::string head = Lower(pending.substr(0, end));
    const size_t body = end + 4;
    if (head.find("\r\ntransfer-encoding: chunked") != std::string::npos) {
      const size_t last = pending.find("\r\n0\r\n\r\n", end);
      return last == std::string::npos ? 0 : last + 7;
    }
    size_t length = 0;
    if (const size_t cl = head.find("\r\ncontent-length:"); cl != std::string::npos) {
      length = std::strtoul(head.c_str() + cl + 17, nullptr, 10);
    }
    return pending.size() >= body + length ? body + length : 0;
  };
  char buf[16384];
  size_t n = complete();
  while (n == 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return {};
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return {};
    const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
    if (got <= 0) return {};
    pending.append(buf, static_cast<size_t>(got));
    n = complete();
  }
  HttpResponse r = ParseResponse(pending.substr(0, n));
  pending.erase(0, n);
  return r;
}

HttpResponse RawHttp(int port, const std::string& bytes, std::chrono::milliseconds timeout) {
  int fd = Connect(port, "");
  if (fd < 0) return {};
  SendAll(fd, bytes);
  std::string raw = ReadAll(fd, timeout);
  ::close(fd);
  return ParseResponse(raw);
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string MakeTempDir() {
  std::string t = "/tmp/rltest.XXXXXX";
  if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp");
  return t;
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// --- Daemon -----------------------------------------------------------------

Daemon::Daemon(std::vector<std::string> args) {
  dir_ = MakeTempDir();
  log_path_ = dir_ + "/stderr.log";
  bool has_listen = false, has_admin = false;
  for (const auto& a : args) {
    has_listen = has_listen || a == "--listen" || a.rfind("--listen=", 0) == 0;
    has_admin = has_admin || a == "--admin-listen" || a.rfind("--admin-listen=", 0) == 0;
  }
  std::vector<std::string> argv_s = {RATELIMITD_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  if (!has_listen) {
    argv_s.push_back("--listen");
    argv_s.push_back("127.0.0.1:0");
  }
  if (!has_admin) {  // never the default 9090: tests run in parallel
    argv_s.push_back("--admin-listen");
    argv_s.push_back("127.0.0.1:0");
  }
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, (dir_ + "/stdout.log").c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&fa);
  if (pid_ <= 0) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::istringstream lines(ReadFile(log_path_));
    std::string line;
    while (std::getline(lines, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || j.value("msg", "") != "listening") continue;
      const std::string addr = j.value("addr", "");
      port_ = std::atoi(addr.substr(addr.rfind(':') + 1).c_str());
      const std::string admin = j.value("admin", "");
      if (!admin.empty()) admin_port_ = std::atoi(admin.substr(admin.rfind(':') + 1).c_str());
      return;
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Daemon::~Daemon() {
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

void Daemon::Signal(int sig) {
  if (pid_ > 0 && !exited_) ::kill(pid_, sig);
}

int Daemon::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

std::string Daemon::Log() const { return ReadFile(log_path_); }

bool Daemon::WaitForLog(const std::string& text, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Log().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// --- TestUpstream -------------------------------------------------------------

TestUpstream::TestUpstream() {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(listen_fd_, 128);
  socklen_t len = sizeof a;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  acceptor_ = std::thread([this] {
    while (!stop_) {
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        if (stop_) return;
        continue;
      }
      connections_++;
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
      workers_.emplace_back([this, fd] { Serve(fd); });
    }
  });
}

TestUpstream::~TestUpstream() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  acceptor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  for (auto& t : workers_) t.join();
  for (int fd : fds_) ::close(fd);
}

void TestUpstream::Serve(int fd) {
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
  std::string buf;
  char tmp[8192];
  std::chrono::system_clock::time_point last_read{};
  while (!stop_) {
    // When the request's first byte reached this socket.
    std::optional<std::chrono::system_clock::time_point> arrived;
    if (!buf.empty()) arrived = last_read;  // it came with the previous request
    size_t end;
    while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = RecvStamped(fd, tmp, sizeof tmp, &last_read);
      if (n <= 0) return;
      if (!arrived) arrived = last_read;
      buf.append(tmp, static_cast<size_t>(n));
    }
    std::istringstream head(buf.substr(0, end));
    std::string line, method, target, version;
    std::getline(head, line);
    std::istringstream(line) >> method >> target >> version;
    nlohmann::json headers = nlohmann::json::object();
    size_t content_length = 0;
    bool close = false;
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = Lower(line.substr(0, colon));
      std::string v = line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      headers[name].push_back(v);
      if (name == "content-length") content_length = std::strtoul(v.c_str(), nullptr, 10);
      if (name == "connection" && Lower(v) == "close") close = true;
    }
    buf.erase(0, end + 4);
    while (buf.size() < content_length) {
      ssize_t n = RecvStamped(fd, tmp, sizeof tmp, &last_read);
      if (n <= 0) return;
      buf.append(tmp, static_cast<size_t>(n));
    }
    std::string body = buf.substr(0, content_length);
    buf.erase(0, content_length);
    {
      std::lock_guard<std::mutex> lock(arrivals_mu_);
      arrivals_.push_back({*arrived, target});
    }
    requests_++;
    if (target.rfind("/slow", 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    nlohmann::json echo = {
        {"method", method}, {"target", target}, {"headers", headers}, {"body", body}};
    std::string out_body =
        target.rfind("/big", 0) == 0 ? std::string(100 * 1024, 'x') : echo.dump();
    std::string resp =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(out_body.size()) +
        "\r\n"
        "X-Upstream: yes\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
        "Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\n"
        "Keep-Alive: timeout=5\r\n\r\n";
    if (method != "HEAD") resp += out_body;
    if (!SendAll(fd, resp) || close) return;
  }
}

}  // namespace rltest
