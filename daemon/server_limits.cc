#include "daemon/server_limits.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "common/log_value.h"
#include "grpc/grpc.h"
#include "grpcpp/resource_quota.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Threads gRPC keeps for polling and short calls on top of the long ones.
constexpr int kSpareThreads = 16;

}  // namespace

int LocalServerMaxThreads(const DaemonConfig& config) {
  return 3 * config.local_size + kSpareThreads;
}

int ListenServerMaxThreads(const DaemonConfig& config) {
  // A node holds at most a Join or Wait, a heartbeat and a store call at a
  // time; one more for luck, and spares (reflection off the leader).
  return 4 * config.num_nodes + 2 * kSpareThreads;
}

void LimitServerThreads(grpc::ServerBuilder& builder, const std::string& name, int max_threads) {
  grpc::ResourceQuota quota(name);
  quota.SetMaxThreads(max_threads);
  builder.SetResourceQuota(quota);
}

void LimitStreamsPerConnection(grpc::ServerBuilder& builder, int max_streams) {
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, max_streams);
}

void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("event=nofile_limit error={}", LogValue(std::strerror(errno)));
    return;
  }
  const rlim_t before = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      spdlog::warn("event=nofile_limit soft={} hard={} error={}", before, limit.rlim_max,
                   LogValue(std::strerror(errno)));
      return;
    }
  }
  spdlog::info("event=nofile_limit soft_before={} soft={} hard={}", before, limit.rlim_cur,
               limit.rlim_max);
}

}  // namespace gradsync
