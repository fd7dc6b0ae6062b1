#include "common/tls_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read it"));
  std::stringstream content;
  content << in.rdbuf();
  if (content.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is empty"));
  }
  return content.str();
}

absl::Status CheckPair(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        files.cert.empty() ? absl::StrCat("--tls-key ", files.key, " needs --tls-cert")
                           : absl::StrCat("--tls-cert ", files.cert, " needs --tls-key"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (!files.any()) return grpc::InsecureServerCredentials();
  RETURN_IF_ERROR(CheckPair(files));
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-ca ", files.ca, " needs --tls-cert and --tls-key (the server's own)"));
  }
  ASSIGN_OR_RETURN(std::string cert, ReadPem("--tls-cert", files.cert));
  ASSIGN_OR_RETURN(std::string key, ReadPem("--tls-key", files.key));
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({key, cert});
  if (!files.ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("--tls-ca", files.ca));
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files) {
  if (!files.any()) return grpc::InsecureChannelCredentials();
  RETURN_IF_ERROR(CheckPair(files));
  grpc::SslCredentialsOptions options;
  if (!files.ca.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("--tls-ca", files.ca));
  }
  if (!files.cert.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem("--tls-cert", files.cert));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadPem("--tls-key", files.key));
  }
  return grpc::SslCredentials(options);
}

}  // namespace gradsync
