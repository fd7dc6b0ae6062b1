#include "daemon/auth/call_auth.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/call_token.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

grpc::Status Refuse(const grpc::ServerContextBase& context, absl::string_view rpc,
                    absl::string_view reason, const std::string& message) {
  spdlog::warn("event=call_refused rpc={} peer={} reason={}", std::string(rpc), context.peer(),
               std::string(reason));
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const absl::string_view longer = a.size() >= b.size() ? a : b;
  for (size_t i = 0; i < longer.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

bool IsLoopbackPeer(absl::string_view peer) {
  return absl::StartsWith(peer, "ipv4:127.") || absl::StartsWith(peer, "ipv6:[::1]:") ||
         absl::StartsWith(peer, "ipv6:[::ffff:127.") || absl::StartsWith(peer, "unix:");
}

CallAuth::CallAuth(CallAuthPolicy policy) : policy_(std::move(policy)) {}

grpc::Status CallAuth::CheckChange(const grpc::ServerContextBase& context,
                                   absl::string_view rpc) const {
  // With --tls-ca the handshake already refused every client without a
  // certificate that CA signed; a call that got here carries one.
  if (policy_.tls_client_certs && context.auth_context() != nullptr &&
      context.auth_context()->IsPeerAuthenticated()) {
    return grpc::Status::OK;
  }
  if (!policy_.token.empty()) {
    const auto& metadata = context.client_metadata();
    const auto it = metadata.find(kCallTokenMetadataKey);
    if (it == metadata.end()) {
      return Refuse(context, rpc, "no_token",
                    absl::StrCat(rpc, " refused: the call carries no job token (metadata ",
                                 kCallTokenMetadataKey,
                                 "; gradsyncctl --token-file) and no verified TLS client "
                                 "certificate"));
    }
    if (!ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()),
                            policy_.token)) {
      return Refuse(context, rpc, "wrong_token",
                    absl::StrCat(rpc, " refused: the job token does not match this daemon's"));
    }
    return grpc::Status::OK;
  }
  if (policy_.insecure || policy_.listen_loopback_only || IsLoopbackPeer(context.peer())) {
    return grpc::Status::OK;
  }
  return Refuse(context, rpc, "not_loopback",
                absl::StrCat(rpc, " refused from ", context.peer(),
                             ": this daemon has no job token, so it accepts changes only from "
                             "loopback (start it with --job-token-file)"));
}

grpc::Status CallAuth::CheckRead(const grpc::ServerContextBase& context,
                                 absl::string_view rpc) const {
  if (!policy_.require_auth_for_reads) return grpc::Status::OK;
  return CheckChange(context, rpc);
}

std::string CallAuth::Describe() const {
  const char* mode = !policy_.token.empty() ? "token"
                     : policy_.insecure     ? "insecure"
                                            : "loopback_only";
  return absl::StrCat("mode=", mode, " tls_client_certs=", policy_.tls_client_certs,
                      " require_auth_for_reads=", policy_.require_auth_for_reads);
}

}  // namespace gradsync
