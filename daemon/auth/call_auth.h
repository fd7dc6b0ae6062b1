// CallAuth: who may call what on the daemon's --listen port. The one place
// Control and Rendezvous handlers ask before they act.
//
// A call that changes anything (Control's SetConfig and Drain, every
// Rendezvous call) is accepted when
//   - it carries the job token as call metadata (common/call_token.h),
//     compared in constant time, or
//   - the listener runs mutual TLS (--tls-ca) and the peer presented a
//     certificate that CA signed, or
//   - the daemon has no token: with --insecure from anyone, else only from a
//     loopback peer (a single-node daemon on its default 127.0.0.1 listen).
// Read-only calls (GetStats, GetConfig, GetTrace, GetStragglers) are open unless
// --require-auth-for-reads, which puts them under the same rule.
// A refusal is UNAUTHENTICATED naming the RPC (never the token) and is
// logged as event=call_refused with the peer.
//
// Thread-safe: immutable after construction.
#ifndef GRADSYNC_DAEMON_AUTH_CALL_AUTH_H_
#define GRADSYNC_DAEMON_AUTH_CALL_AUTH_H_

#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

namespace gradsync {

struct CallAuthPolicy {
  std::string token;              // the job token; empty: none
  bool tls_client_certs = false;  // the listener verifies client certificates
  bool require_auth_for_reads = false;
  bool insecure = false;  // no token: accept changes from anyone
  // --listen is bound to loopback only, so every peer is on this host (the
  // plaintext listener hands accepted fds to gRPC, whose peer reads "fd:N").
  bool listen_loopback_only = false;
};

class CallAuth {
 public:
  explicit CallAuth(CallAuthPolicy policy = {});

  // OK, or UNAUTHENTICATED naming `rpc` ("Control.Drain").
  grpc::Status CheckChange(const grpc::ServerContextBase& context, absl::string_view rpc) const;
  grpc::Status CheckRead(const grpc::ServerContextBase& context, absl::string_view rpc) const;

  // One line for the start-up log: what a caller needs (mode=token ...).
  std::string Describe() const;

 private:
  const CallAuthPolicy policy_;
};

// Compares without an early exit, so the time taken says nothing about how
// much of a secret matched.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "ipv6:[::ffff:127.0.0.1]:5000",
// "unix:..." are loopback; anything else is not.
bool IsLoopbackPeer(absl::string_view peer);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_AUTH_CALL_AUTH_H_
