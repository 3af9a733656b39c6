#include "support/test_certificates.h"

#include <fstream>
#include <stdexcept>
#include <vector>

#include "support/subprocess.h"

namespace ratelimit::testing {
namespace {

void Run(const std::vector<std::string>& argv) {
  std::string output;
  if (RunCommand(argv, &output) != 0) {
    std::string cmd;
    for (const std::string& a : argv) cmd += a + " ";
    throw std::runtime_error("MakeTestCertificates: `" + cmd + "` failed:\n" + output);
  }
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("MakeTestCertificates: cannot write " + path);
}

// A key and a certificate signed by the CA, with the given extensions.
void MakeLeaf(const std::string& dir, const std::string& name, const std::string& cn,
              const std::string& extensions, const TestCertificates& ca, std::string* cert,
              std::string* key) {
  *key = dir + "/" + name + ".key";
  *cert = dir + "/" + name + ".crt";
  const std::string csr = dir + "/" + name + ".csr";
  const std::string ext = dir + "/" + name + ".ext";
  WriteFile(ext, extensions);
  Run({"openssl", "req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
       "ec_paramgen_curve:prime256v1", "-keyout", *key, "-out", csr, "-subj", "/CN=" + cn});
  Run({"openssl", "x509", "-req", "-in", csr, "-CA", ca.ca_cert, "-CAkey", ca.ca_key,
       "-CAcreateserial", "-out", *cert, "-days", "2", "-extfile", ext});
}

}  // namespace

TestCertificates MakeTestCertificates(const std::string& dir) {
  TestCertificates c;
  c.ca_cert = dir + "/ca.crt";
  c.ca_key = dir + "/ca.key";
  Run({"openssl", "req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
       "ec_paramgen_curve:prime256v1", "-keyout", c.ca_key, "-out", c.ca_cert, "-days", "2",
       "-subj", "/CN=ratelimit-test-ca"});
  MakeLeaf(dir, "server", "localhost",
           "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n"
           "basicConstraints=CA:FALSE\n"
           "keyUsage=digitalSignature,keyEncipherment\n"
           "extendedKeyUsage=serverAuth\n",
           c, &c.server_cert, &c.server_key);
  MakeLeaf(dir, "client", "ratelimit-test-client",
           "basicConstraints=CA:FALSE\n"
           "keyUsage=digitalSignature,keyEncipherment\n"
           "extendedKeyUsage=clientAuth\n",
           c, &c.client_cert, &c.client_key);
  return c;
}

}  // namespace ratelimit::testing
