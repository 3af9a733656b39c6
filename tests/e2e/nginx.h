// A real nginx child process for the end-to-end tests, run in the foreground
// from a config in `prefix` (nginx.conf there, logs and temp files too).
//
//   Nginx nginx(dir, port);          // waits until the port accepts
//   ASSERT_TRUE(nginx.running()) << ReadFile(dir + "/error.log");
//
// The destructor asks nginx to quit (SIGQUIT) and SIGKILLs it after 2 s.
// Thread-safety: thread-compatible (the test's thread drives it).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace rltest {

inline std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) {
    s.replace(p, from.size(), to);
  }
  return s;
}

inline bool PortOpen(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(0x7f000001);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

class Nginx {
 public:
  Nginx(const std::string& prefix, int port) : port_(port) {
    const std::string conf = prefix + "/nginx.conf";
    std::vector<std::string> args = {"/usr/sbin/nginx",     "-p", prefix, "-e",
                                     prefix + "/error.log", "-c", conf,   "-g",
                                     "daemon off;"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
    for (int i = 0; i < 200 && pid_ > 0 && !PortOpen(port_); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Nginx() {
    if (pid_ > 0) {
      ::kill(pid_, SIGQUIT);
      int status = 0;
      for (int i = 0; i < 200; ++i) {
        if (::waitpid(pid_, &status, WNOHANG) == pid_) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
  }
  Nginx(const Nginx&) = delete;
  Nginx& operator=(const Nginx&) = delete;
  bool running() const { return pid_ > 0 && PortOpen(port_); }

 private:
  pid_t pid_ = -1;
  int port_;
};

}  // namespace rltest
