#include "load.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <strings.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace rlchaos {

using std::chrono::microseconds;
using std::chrono::steady_clock;

std::string CheckBody(const std::string& key, int64_t limit) {
  return R"({"key":")" + key + R"(","limit":{"name":"w","algorithm":"fixed_window","limit":)" +
         std::to_string(limit) + R"(,"window":"1h"}})";
}

std::string CapacityBody(const std::string& key, int64_t capacity) {
  return R"({"key":")" + key + R"(","limit":{"name":"b","algorithm":"token_bucket","capacity":)" +
         std::to_string(capacity) + R"(,"refill_per_second":0.001}})";
}

// ---- Connection --------------------------------------------------------------

Connection::~Connection() { Close(); }

void Connection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buffer_.clear();
}

bool Connection::Open() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
  timeval tv{.tv_sec = 2, .tv_usec = 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port_));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    Close();
    return false;
  }
  return true;
}

namespace {

int64_t RealtimeMicros() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000 + ts.tv_nsec / 1000;
}

// recv(2) that also returns the kernel's receive timestamp (CLOCK_REALTIME,
// microseconds) of the bytes read, or leaves `*rx_us` alone if there is none.
ssize_t RecvStamped(int fd, char* buf, size_t len, int64_t* rx_us) {
  iovec iov{.iov_base = buf, .iov_len = len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(fd, &msg, 0);
  if (n <= 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      timespec ts{};
      std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
      *rx_us = int64_t{ts.tv_sec} * 1'000'000 + ts.tv_nsec / 1000;
    }
  }
  return n;
}

}  // namespace

int Connection::Post(const std::string& target, const std::string& body, bool* degraded,
                     std::string* response_body, int64_t* latency_us) {
  *degraded = false;
  if (fd_ < 0 && !Open()) return 0;
  const int64_t sent_real_us = RealtimeMicros();
  int64_t rx_us = -1;
  std::string req = "POST " + target +
                    " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t off = 0; off < req.size();) {
    ssize_t n = ::send(fd_, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      Close();
      return 0;
    }
    off += static_cast<size_t>(n);
  }
  // Head, then Content-Length bytes of body.
  size_t head_end = std::string::npos;
  size_t need = std::string::npos;
  char chunk[4096];
  while (true) {
    if (head_end == std::string::npos) {
      head_end = buffer_.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        need = 0;
        std::istringstream lines(buffer_.substr(0, head_end));
        std::string line;
        while (std::getline(lines, line)) {
          if (!line.empty() && line.back() == '\r') line.pop_back();
          const size_t colon = line.find(':');
          if (colon == std::string::npos) continue;
          std::string name = line.substr(0, colon);
          std::string value = line.substr(colon + 1);
          value.erase(0, value.find_first_not_of(' '));
          if (strcasecmp(name.c_str(), "Content-Length") == 0)
            need = std::strtoul(value.c_str(), nullptr, 10);
          if (strcasecmp(name.c_str(), "X-RateLimit-Degraded") == 0) *degraded = value == "true";
        }
      }
    }
    if (head_end != std::string::npos && buffer_.size() >= head_end + 4 + need) break;
    ssize_t n = RecvStamped(fd_, chunk, sizeof(chunk), &rx_us);
    if (n <= 0) {
      if (latency_us != nullptr) *latency_us = RealtimeMicros() - sent_real_us;
      Close();
      return 0;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
  if (latency_us != nullptr) {
    // No timestamp (not expected on Linux): the time now, an upper bound.
    *latency_us = (rx_us >= 0 ? rx_us : RealtimeMicros()) - sent_real_us;
  }
  int status = 0;
  if (buffer_.rfind("HTTP/1.1 ", 0) == 0) status = std::atoi(buffer_.c_str() + 9);
  if (response_body != nullptr) *response_body = buffer_.substr(head_end + 4, need);
  const bool close = buffer_.substr(0, head_end).find("Connection: close") != std::string::npos;
  buffer_.erase(0, head_end + 4 + need);
  if (close) Close();
  return status;
}

// ---- Load ----------------------------------------------------------------------

Load::Load(int port, LoadOptions options)
    : port_(port), opts_(options), epoch_(steady_clock::now()) {}

Load::~Load() { Stop(); }

int64_t Load::Now() const {
  return std::chrono::duration_cast<microseconds>(steady_clock::now() - epoch_).count();
}

void Load::Start() {
  stop_ = false;
  start_us_ = Now();
  for (int c = 0; c < opts_.connections; ++c) threads_.emplace_back([this, c] { Run(c); });
}

void Load::Stop() {
  stop_ = true;
  for (auto& t : threads_) t.join();
  threads_.clear();
}

std::vector<Sample> Load::samples() const {
  std::lock_guard lock(mu_);
  std::vector<Sample> out = samples_;
  std::sort(out.begin(), out.end(),
            [](const Sample& a, const Sample& b) { return a.sent_us < b.sent_us; });
  return out;
}

void Load::Run(int conn) {
  Connection c(port_);
  const double period_us = 1e6 / opts_.rate;
  std::vector<Sample> mine;
  for (int64_t i = conn; !stop_.load(); i += opts_.connections) {
    Sample s;
    s.due_us = start_us_ + static_cast<int64_t>(static_cast<double>(i) * period_us);
    const int64_t now = Now();
    if (s.due_us > now) std::this_thread::sleep_for(microseconds(s.due_us - now));
    if (stop_.load()) break;
    s.key = static_cast<int>(i % opts_.keys);
    const std::string body = CheckBody("load" + std::to_string(s.key), opts_.limit);
    s.sent_us = Now();
    s.status = c.Post("/v1/check", body, &s.degraded, nullptr, &s.latency_us);
    mine.push_back(s);
  }
  std::lock_guard lock(mu_);
  samples_.insert(samples_.end(), mine.begin(), mine.end());
}

// ---- figures --------------------------------------------------------------------

PhaseStats Stats(const std::vector<Sample>& samples, int64_t from_us, int64_t to_us) {
  PhaseStats p;
  std::vector<int64_t> lat;
  for (const Sample& s : samples) {
    if (s.sent_us < from_us || s.sent_us >= to_us) continue;
    ++p.requests;
    if (s.status != 0) ++p.answered;
    if (s.status == 200) {
      ++p.ok;
    } else if (s.status == 429) {
      ++p.denied;
    } else if (s.status == 503) {
      ++p.s503;
    } else if (s.status >= 500) {
      ++p.other_5xx;
    } else if (s.status != 0) {
      ++p.other;
    }
    if (s.degraded) ++p.degraded;
    lat.push_back(s.latency_us);
    p.max_late_us = std::max(p.max_late_us, s.sent_us - s.due_us);
  }
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    auto at = [&](double q) {
      size_t i = static_cast<size_t>(q * static_cast<double>(lat.size() - 1) + 0.5);
      return lat[std::min(i, lat.size() - 1)];
    };
    p.p50_us = at(0.50);
    p.p99_us = at(0.99);
    p.max_us = lat.back();
  }
  return p;
}

std::string PhaseStats::ToString() const {
  std::ostringstream o;
  o << "requests=" << requests << " answered=" << answered << " s200=" << ok << " s429=" << denied
    << " s503=" << s503 << " other5xx=" << other_5xx << " other=" << other
    << " degraded=" << degraded << " p50_us=" << p50_us << " p99_us=" << p99_us
    << " max_us=" << max_us << " max_late_us=" << max_late_us;
  return o.str();
}

int64_t RecoveredAt(const std::vector<Sample>& samples, int64_t from_us) {
  int64_t at = -1;
  for (const Sample& s : samples) {
    if (s.sent_us < from_us) continue;
    const bool exact = s.status != 0 && !s.degraded;
    if (!exact) {
      at = -1;
    } else if (at < 0) {
      at = s.sent_us;
    }
  }
  return at;
}

}  // namespace rlchaos
