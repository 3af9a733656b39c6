// Small process helpers for test harnesses: run a command and capture its
// output, find an executable on PATH, pick a free loopback port.
//
//   std::string out;
//   int rc = RunCommand({"openssl", "version"}, &out);   // rc == 0, out == "OpenSSL 3..."
//
// Thread-safety: thread-compatible; RunCommand forks, so call it from test
// threads, not from signal handlers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ratelimit::testing {

// Runs argv[0] (searched on PATH) with stdout and stderr captured into *output.
// Returns the exit status, or -1 if it could not be run or was killed.
int RunCommand(const std::vector<std::string>& argv, std::string* output);

// Absolute path of `name` on PATH, or "" when absent.
std::string FindExecutable(const std::string& name);

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0).
uint16_t PickFreePort();

}  // namespace ratelimit::testing
