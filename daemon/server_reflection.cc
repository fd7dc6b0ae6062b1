#include "daemon/server_reflection.h"

#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"

namespace gradsync {

void EnableServerReflection() {
  // A reference keeps the linker from dropping the generated file, whose
  // static initializer adds grpc/health/v1/health.proto to the pool.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
}

}  // namespace gradsync
