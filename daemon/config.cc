#include "daemon/config.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::Status ValidateConfig(const DaemonConfig& c) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (c.socket_path.empty() || c.socket_path.size() >= 100) {
    return bad("--socket must be a path shorter than 100 bytes (unix socket limit)");
  }
  if (c.num_nodes < 1 || c.num_nodes > 4096) return bad("--num-nodes must be in [1, 4096]");
  if (c.node_rank < 0 || c.node_rank >= c.num_nodes) {
    return bad(absl::StrCat("--node-rank ", c.node_rank, " is not in [0, ", c.num_nodes, ")"));
  }
  if (c.local_size < 1 || c.local_size > 256) return bad("--local-size must be in [1, 256]");
  if (c.backend != "auto" && c.backend != "gloo" && c.backend != "nccl" && c.backend != "local") {
    return bad("--backend must be auto, gloo, nccl or local");
  }
  if (c.backend == "local" && c.num_nodes > 1) {
    return bad("--backend=local only works with --num-nodes=1");
  }
  if (!(c.bucket_cap_mb > 0 && c.bucket_cap_mb <= 4096)) {
    return bad("--bucket-cap-mb must be in (0, 4096]");
  }
  if (!(c.first_bucket_cap_mb > 0 && c.first_bucket_cap_mb <= 4096)) {
    return bad("--first-bucket-cap-mb must be in (0, 4096]");
  }
  if (c.timeout_ms < 100 || c.timeout_ms > 24ll * 3600 * 1000) {
    return bad("--timeout-s must be in [0.1, 86400]");
  }
  if (!(c.stall_threshold_s > 0)) return bad("--stall-threshold-s must be > 0");
  if (c.num_nodes > 1 && c.listen.empty() && c.is_leader()) {
    return bad("the leader of a multi-node job needs --listen for the rendezvous");
  }
  if (c.shm_prefix.empty() || c.shm_prefix.find('/') != std::string::npos ||
      c.shm_prefix.find('.') != std::string::npos) {
    return bad("--shm-prefix must be non-empty without '/' or '.'");
  }
  if ((c.ring_capacity & (c.ring_capacity - 1)) != 0 || c.ring_capacity < 64) {
    return bad("ring capacity must be a power of two >= 64");
  }
  return absl::OkStatus();
}

}  // namespace gradsync
