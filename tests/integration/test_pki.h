// TestPki: a certificate authority, node and client certificates, and an
// unrelated second CA, made at run time with Debian's `openssl` CLI in a
// scratch directory (no key material is checked in).
//
//   ca.pem                  the job's CA
//   node.pem / node.key     signed by it; SAN 127.0.0.1 and localhost; no
//                           extended key usage, so a daemon uses it as its
//                           server and its client certificate
//   operator.pem / .key     a client certificate signed by the CA
//   other-ca.pem            an unrelated CA
//   stranger.pem / .key     signed by the unrelated CA (SAN 127.0.0.1 too)
#ifndef GRADSYNC_TESTS_INTEGRATION_TEST_PKI_H_
#define GRADSYNC_TESTS_INTEGRATION_TEST_PKI_H_

#include <string>

#include "absl/status/status.h"
#include "tests/testing/files.h"

namespace gradsync::testing {

class TestPki {
 public:
  TestPki() = default;
  // Runs openssl; an error names the step and holds its output.
  absl::Status Generate();
  std::string File(const std::string& name) const { return dir_.File(name); }

 private:
  ScratchDir dir_{"gspki"};
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_TEST_PKI_H_
