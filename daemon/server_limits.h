// The bounds on what clients can make the daemon hold: threads of its two
// gRPC servers (a grpc::ResourceQuota each; past it gRPC answers
// RESOURCE_EXHAUSTED instead of starting a thread) and the descriptors the
// process may open (raised to the hard limit at start, as most servers do:
// the common soft limit of 1024 is a few hundred idle connections away).
#ifndef GRADSYNC_DAEMON_SERVER_LIMITS_H_
#define GRADSYNC_DAEMON_SERVER_LIMITS_H_

#include <string>

#include "daemon/config.h"
#include "grpcpp/server_builder.h"

namespace gradsync {

// The unix-socket server: per local trainer one Watch stream, one Register
// waiting for the job to form and one Attach waiting for a job to end (one
// per local rank, see LocalService), plus short calls.
int LocalServerMaxThreads(const DaemonConfig& config);
// The --listen server: on the leader, the rendezvous calls of every node
// (Control runs on gRPC's callback API, bounded by ControlAdmission, and
// holds none of these threads).
int ListenServerMaxThreads(const DaemonConfig& config);

// Calls one --listen connection may have open at once: a node's link needs
// a handful; past the bound HTTP/2 refuses the stream before any handler.
inline constexpr int kMaxStreamsPerListenConnection = 100;

// Gives `builder` a resource quota named `name` allowing `max_threads`.
void LimitServerThreads(grpc::ServerBuilder& builder, const std::string& name, int max_threads);
// Caps the concurrent streams of each connection to `builder`'s server.
void LimitStreamsPerConnection(grpc::ServerBuilder& builder, int max_streams);

// Raises the soft RLIMIT_NOFILE to the hard limit; logs both.
void RaiseOpenFileLimit();

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_SERVER_LIMITS_H_
