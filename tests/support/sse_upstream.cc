#include "support/sse_upstream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <string_view>

namespace ratelimit::testing {
namespace {

using std::chrono::milliseconds;

bool Send(int c, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::send(c, s.data(), s.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    s.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string Chunk(std::string_view s) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", s.size());
  return size + std::string(s) + "\r\n";
}

// `name` in lower case; the request's names in any case.
std::string HeaderValue(const std::string& req, const std::string& name) {
  std::string lower = req;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const size_t at = lower.find("\r\n" + name + ": ");
  if (at == std::string::npos) return "";
  const size_t from = at + name.size() + 4;
  return req.substr(from, req.find("\r\n", from) - from);
}

}  // namespace

SseUpstream::SseUpstream() {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(fd_, 512);
  socklen_t len = sizeof a;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  acceptor_ = std::thread([this] { Accept(); });
}

SseUpstream::~SseUpstream() {
  stop_ = true;
  Release();
  ::shutdown(fd_, SHUT_RDWR);
  ::close(fd_);
  acceptor_.join();
  for (std::thread& t : workers_) t.join();
}

bool ReadFirstEvent(int fd, std::string& got) {
  char buf[4096];
  while (got.find("Hello") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
  return true;
}

void SseUpstream::Accept() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int c = ::accept(fd_, nullptr, nullptr);
    if (c < 0) continue;
    workers_.emplace_back([this, c] {
      Serve(c);
      ::close(c);
    });
  }
}

void SseUpstream::Serve(int c) {
  int one = 1;
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::string req;
  char buf[4096];
  while (req.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(c, buf, sizeof buf, 0);
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  const size_t sp = req.find(' ');
  const std::string path = req.substr(sp + 1, req.find(' ', sp + 1) - sp - 1);
  const std::string usage = HeaderValue(req, "x-usage");
  if (path == "/header") {
    Send(c, "HTTP/1.1 200 OK\r\nX-Usage: " + usage +
                "\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    return;
  }
  if (path == "/json" && !HeaderValue(req, "x-status").empty()) {  // an error, without usage
    const std::string body = R"({"error":{"message":"slow down","type":"rate_limit"}})";
    Send(c, "HTTP/1.1 " + HeaderValue(req, "x-status") +
                " Error\r\nContent-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    return;
  }
  if (path == "/json") {  // a non-streaming answer: one JSON document
    const std::string body =
        "{\"id\":\"x\",\"usage\":{\"prompt_tokens\":1,\"total_tokens\":" + usage + "}}";
    if (HeaderValue(req, "x-chunked") == "1") {
      Send(c,
           "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
           "Connection: close\r\n\r\n" +
               Chunk(body.substr(0, 10)) + Chunk(body.substr(10)) + "0\r\n\r\n");
    } else {
      Send(c,
           "HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
           "Content-Length: " +
               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    }
    return;
  }
  if (path == "/trailer") {
    Send(c,
         "HTTP/1.1 200 OK\r\nTrailer: X-Usage\r\nTransfer-Encoding: chunked\r\n"
         "Connection: close\r\n\r\n" +
             Chunk("embedding") + "0\r\nX-Usage: " + usage + "\r\n\r\n");
    return;
  }
  if (HeaderValue(req, "x-small") == "1") {  // the whole stream at once, with a length
    const std::string body =
        "data: {\"usage\":{\"total_tokens\":" + usage + "}}\n\ndata: [DONE]\n\n";
    Send(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    return;
  }
  Send(c,
       "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
       "Connection: close\r\n\r\n" +
           Chunk("data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n"));
  if (HeaderValue(req, "x-hold") == "1") {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!released_ && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(2));
    }
    // The client has gone: a few more events before the end, so that the
    // gateway's writes meet the closed connection.
    for (int i = 0; i < 4; ++i) {
      if (!Send(c, Chunk("data: {\"choices\":[{\"delta\":{\"content\":\"more\"}}]}\n\n"))) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  const std::string event =
      "data: {\"id\":\"x\",\"usage\":{\"prompt_tokens\":1,\"total_tokens\":" + usage + "}}\n\n";
  const size_t half = event.size() / 2;  // an event split across pieces
  Send(c, Chunk(event.substr(0, half)));
  std::this_thread::sleep_for(milliseconds(5));
  Send(c, Chunk(event.substr(half)));
  last_event_sent.fetch_add(1);
  Send(c, Chunk("data: [DONE]\n\n") + "0\r\n\r\n");
}

}  // namespace ratelimit::testing
