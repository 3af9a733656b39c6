// MakeTestCertificates: a throwaway CA, a server certificate for localhost /
// 127.0.0.1 / ::1 and a client certificate, made with the `openssl` CLI at
// test time (nothing checked in, nothing expires between runs).
//
//   TestCertificates certs = MakeTestCertificates(dir);   // throws on failure
//   redis-server --tls-cert-file certs.server_cert --tls-key-file certs.server_key ...
//
// Thread-safety: thread-compatible. Files are PEM, valid for 2 days.
#pragma once

#include <string>

namespace ratelimit::testing {

struct TestCertificates {
  std::string ca_cert;
  std::string ca_key;
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
};

// Writes the files into `dir` (which must exist). Throws std::runtime_error
// with openssl's output when a step fails.
TestCertificates MakeTestCertificates(const std::string& dir);

}  // namespace ratelimit::testing
