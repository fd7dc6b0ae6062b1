// How a caller proves it holds the job token: call metadata, never a field
// of the request body, so one place on each side handles it (clients:
// AttachCallToken; the daemon: daemon/auth/call_auth.h). Over plaintext the
// metadata is as visible as any byte of the call: across an untrusted
// network, use TLS (common/tls_credentials.h).
#ifndef GRADSYNC_COMMON_CALL_TOKEN_H_
#define GRADSYNC_COMMON_CALL_TOKEN_H_

#include <string>

#include "grpcpp/client_context.h"

namespace gradsync {

inline constexpr char kCallTokenMetadataKey[] = "x-gradsync-token";

// Adds the token to the call; an empty token adds nothing.
inline void AttachCallToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata(kCallTokenMetadataKey, token);
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_CALL_TOKEN_H_
