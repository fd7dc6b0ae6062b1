// Server reflection on the --listen port, so that a gRPC CLI (grpcurl,
// grpc_cli) can list, describe and call every service the port serves with
// no .proto files at hand.
//
// Reflection answers from the binary's generated descriptor pool. The
// Control schema is there because the daemon implements it; the health
// service is gRPC's built-in one, which does not use C++ protobuf, so its
// schema is there only if the daemon links the generated grpc.health.v1
// messages and something references them — else reflection lists the
// service but answers "Symbol not found" when asked to describe it.
#ifndef GRADSYNC_DAEMON_SERVER_REFLECTION_H_
#define GRADSYNC_DAEMON_SERVER_REFLECTION_H_

namespace gradsync {

// Registers the reflection plugin for servers built after this call, with
// the health service's schema in the pool. Call before building the server.
void EnableServerReflection();

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_SERVER_REFLECTION_H_
