#include "support/fake_tcp_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>

namespace ratelimit::testing {

LoopbackListener::LoopbackListener(const char* who) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) throw std::runtime_error(std::string(who) + ": socket failed");
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd_, 64) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || pipe(wake_) != 0) {
    close(fd_);
    throw std::runtime_error(std::string(who) + ": bind/listen failed");
  }
  port_ = ntohs(addr.sin_port);
}

LoopbackListener::~LoopbackListener() {
  char c = 'x';
  (void)!write(wake_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  close(fd_);
  close(wake_[0]);
  close(wake_[1]);
}

FakeTcpServer::FakeTcpServer(Handler handler) : handler_(std::move(handler)) {
  listener_.Serve([this] { Run(); });
}

void FakeTcpServer::Run() {
  while (true) {
    pollfd fds[2] = {{listener_.fd(), POLLIN, 0}, {listener_.wake_fd(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    int fd = accept(listener_.fd(), nullptr, nullptr);
    if (fd < 0) continue;
    accepted_.fetch_add(1);
    handler_(fd);
    close(fd);
  }
}

std::string FakeTcpServer::ReadSome(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return "";
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

void FakeTcpServer::WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

bool FakeTcpServer::WaitForClose(int fd, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1))) <= 0) continue;
    char buf[4096];
    if (read(fd, buf, sizeof(buf)) <= 0) return true;
  }
  return false;
}

}  // namespace ratelimit::testing
