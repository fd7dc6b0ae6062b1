#include "tests/integration/test_pki.h"

#include <chrono>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tests/testing/process.h"

namespace gradsync::testing {
namespace {

constexpr char kOpenssl[] = "/usr/bin/openssl";

}  // namespace

absl::Status TestPki::Generate() {
  int step = 0;
  auto run = [&](std::vector<std::string> args) -> absl::Status {
    args.insert(args.begin(), kOpenssl);
    const std::string log = dir_.File(absl::StrCat("openssl.", step++, ".log"));
    Process p = Process::Spawn(args, log);
    const ExitStatus st = p.Wait(std::chrono::seconds(60));
    if (st.exited && st.code == 0) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("openssl ", args[1], " (step ", step - 1,
                                            "): ", st.ToString(), "\n", p.Log()));
  };
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  auto make_ca = [&](const std::string& name) {
    std::vector<std::string> args = {"req", "-x509"};
    args.insert(args.end(), ec.begin(), ec.end());
    args.insert(args.end(), {"-keyout", File(name + ".key"), "-out", File(name + ".pem"), "-days",
                             "2", "-subj", "/CN=" + name});
    return run(args);
  };
  std::ofstream(File("leaf.ext")) << "basicConstraints=CA:FALSE\n"
                                  << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  auto make_leaf = [&](const std::string& name, const std::string& ca) -> absl::Status {
    std::vector<std::string> req = {"req"};
    req.insert(req.end(), ec.begin(), ec.end());
    req.insert(req.end(), {"-keyout", File(name + ".key"), "-out", File(name + ".csr"), "-subj",
                           "/CN=" + name});
    RETURN_IF_ERROR(run(req));
    return run({"x509", "-req", "-in", File(name + ".csr"), "-CA", File(ca + ".pem"), "-CAkey",
                File(ca + ".key"), "-CAcreateserial", "-out", File(name + ".pem"), "-days", "2",
                "-extfile", File("leaf.ext")});
  };
  for (absl::Status st : {make_ca("ca"), make_ca("other-ca"), make_leaf("node", "ca"),
                          make_leaf("operator", "ca"), make_leaf("stranger", "other-ca")}) {
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace gradsync::testing
