#include "support/tcp_proxy.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "support/fake_tcp_server.h"

namespace ratelimit::testing {
namespace {

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  return addr;
}

// Writes all of `data` (a blocking socket); false if the peer is gone.
bool SendAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

TcpProxy::TcpProxy(uint16_t target) : target_(target) {
  listener_.Serve([this] { Run(); });
}

void TcpProxy::Run() {
  std::vector<std::pair<int, int>> links;  // {accepted, to the target}
  auto drop = [&](size_t i) {
    close(links[i].first);
    close(links[i].second);
    links.erase(links.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (true) {
    std::vector<pollfd> fds = {{listener_.fd(), POLLIN, 0}, {listener_.wake_fd(), POLLIN, 0}};
    for (const auto& [a, b] : links) {
      fds.push_back({a, POLLIN, 0});
      fds.push_back({b, POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    // Bytes each way; a side that closes or fails ends its link.
    for (size_t i = links.size(); i-- > 0;) {
      bool gone = false;
      for (int side = 0; side < 2 && !gone; ++side) {
        const pollfd& p = fds[2 + 2 * i + static_cast<size_t>(side)];
        if (p.revents == 0) continue;
        const int from = side == 0 ? links[i].first : links[i].second;
        const int to = side == 0 ? links[i].second : links[i].first;
        char buf[16384];
        const ssize_t n = read(from, buf, sizeof(buf));
        gone = n <= 0 || !SendAll(to, buf, static_cast<size_t>(n));
      }
      if (gone) drop(i);
    }
    if (fds[0].revents != 0) {
      const int in = accept(listener_.fd(), nullptr, nullptr);
      if (in < 0) continue;
      accepted_.fetch_add(1);
      const int out = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in to = Loopback(target_.load());
      if (out < 0 || connect(out, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
        if (out >= 0) close(out);
        close(in);
        continue;
      }
      int one = 1;
      setsockopt(in, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      links.emplace_back(in, out);
    }
  }
  for (const auto& [a, b] : links) {
    close(a);
    close(b);
  }
}

}  // namespace ratelimit::testing
