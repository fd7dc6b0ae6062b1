// gRPC credentials from PEM files, for the daemon's --listen server and for
// its clients (the rendezvous client, gradsyncctl). gRPC's SSL credentials
// do the TLS; this only reads the files and names the one that is missing.
//
// Server: --tls-cert and --tls-key; with --tls-ca, every client must present
// a certificate that CA signed (mutual TLS). Without any, plaintext.
// Client: --tls-ca verifies the server (default: the system's roots);
// --tls-cert/--tls-key are its own certificate for a mutual-TLS server.
#ifndef GRADSYNC_COMMON_TLS_CREDENTIALS_H_
#define GRADSYNC_COMMON_TLS_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace gradsync {

struct TlsFiles {
  std::string cert;  // PEM certificate chain
  std::string key;   // PEM private key of `cert`
  std::string ca;    // PEM CA bundle: who signs the other side

  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Plaintext when no file is given. InvalidArgument naming the flag (cert
// without key or the reverse, an unreadable or empty file).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_TLS_CREDENTIALS_H_
