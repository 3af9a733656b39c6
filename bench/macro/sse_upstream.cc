// sse_upstream: the streaming upstream of benchmark 10 (scripts/bench.sh):
// answers every request on a keep-alive connection like an LLM API's
// stream, chunked text/event-stream: a content event, the usage event
// {"usage":{"total_tokens":N}} (N = the request's X-Usage, else 70) and
// data: [DONE], in three chunks written at once. A thread per connection
// (the benchmark opens 64).
//
//   sse_upstream --port=9001
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {

std::string Chunk(const std::string& s) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", s.size());
  return size + s + "\r\n";
}

bool SendAll(int c, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string Usage(const std::string& head) {
  std::string lower = head;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const size_t at = lower.find("\r\nx-usage: ");
  if (at == std::string::npos) return "70";
  const size_t from = at + 11;
  return head.substr(from, head.find("\r\n", from) - from);
}

void Serve(int c) {
  int one = 1;
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::string in;
  char buf[16384];
  for (;;) {
    size_t end;
    while ((end = in.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) return ::close(c), void();
      in.append(buf, static_cast<size_t>(n));
    }
    const std::string head = in.substr(0, end + 2);
    in.erase(0, end + 4);  // GET requests: no body
    const std::string out =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
        Chunk("data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n") +
        Chunk("data: {\"id\":\"x\",\"usage\":{\"prompt_tokens\":1,\"total_tokens\":" + Usage(head) +
              "}}\n\n") +
        Chunk("data: [DONE]\n\n") + "0\r\n\r\n";
    if (!SendAll(c, out)) return ::close(c), void();
  }
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--port=", 7) == 0) port = std::atoi(argv[i] + 7);
  }
  if (port <= 0) {
    std::fprintf(stderr, "usage: sse_upstream --port=N\n");
    return 2;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1024) != 0) {
    std::perror("sse_upstream: bind/listen");
    return 1;
  }
  for (;;) {
    const int c = ::accept(fd, nullptr, nullptr);
    if (c >= 0) std::thread(Serve, c).detach();
  }
}
