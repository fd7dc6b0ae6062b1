// DaemonConfig: everything gradsyncd is told at start-up (flags, see main.cc)
// plus the runtime-settable knobs. Defaults give a working single-node daemon.
// This is the one place they are written: main.cc's flags take theirs from a
// default-constructed DaemonConfig.
#ifndef GRADSYNC_DAEMON_CONFIG_H_
#define GRADSYNC_DAEMON_CONFIG_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/default_socket.h"
#include "common/defaults.h"

namespace gradsync {

struct DaemonConfig {
  // Where trainers attach (gRPC over a unix socket) and its file mode; the
  // default is resolved for this process (common/default_socket.h).
  std::string socket_path = DaemonDefaultSocketPath();
  mode_t socket_mode = 0660;
  // Control + rendezvous (on the leader) + health + reflection. Empty: off.
  std::string listen = kDefaultListenAddress;
  std::string leader;  // HOST:PORT of the leader; empty: this daemon leads
  // Where the job's rendezvous lives: empty for the leader's (node 0's
  // daemon), or etcd://HOST:PORT[,HOST:PORT...]/PREFIX (rendezvous_address.h).
  std::string rendezvous;
  // Reaching etcd: TLS files (common/tls_credentials.h) and etcd auth.
  std::string etcd_cert, etcd_key, etcd_ca;
  std::string etcd_user;
  std::string etcd_password;  // read from --etcd-password-file
  // HOST:PORT of the Prometheus /metrics endpoint (HTTP, no auth). Empty: off.
  std::string metrics_listen;
  // The whole-run timeline (Chrome trace JSON) streamed here. Empty: off.
  std::string trace_file;

  int node_rank = 0;
  int num_nodes = 1;
  // Elastic membership bounds (torchrun's --nnodes MIN:MAX); 0: --num-nodes.
  // Only the fixed job (min = num = max) runs so far: see ValidateConfig and
  // docs/DESIGN.md, "Elastic jobs".
  int min_nodes = 0;
  int max_nodes = 0;
  int local_size = 1;            // trainers this daemon serves per job
  std::string backend = "auto";  // auto | gloo | nccl | local
  std::string host;              // address Gloo binds on this node ("" = from --listen)
  // The cross-node hop's element type for fp32 buckets: off | bf16 | fp16
  // (daemon/backends/wire_dtype.h); the same on every node of a job.
  std::string wire_dtype = "off";
  // Multi-node uneven inputs (gs_join): every iteration then starts with a
  // tiny allreduce of the active-trainer counts. Node 0's value is the job's.
  bool uneven_inputs = false;
  // Every this many synchronized iterations the trainers' parameter
  // fingerprints are compared (gs_check_replicas); 0: never. One node only.
  int check_replicas_every = 0;
  // NaN/Inf in an iteration's gradients: error | skip | off
  // (daemon/engine/nonfinite_mode.h). CPU gradients only.
  std::string nonfinite = "error";
  // Who is the straggler (daemon/observe/straggler_tracker.h): a trainer
  // last in more than `straggler_share` of the last `straggler_window`
  // iterations, with a median lateness above `straggler_late_ms`, is named.
  int straggler_window = 100;
  double straggler_share = 0.5;
  double straggler_late_ms = 10;

  double bucket_cap_mb = kDefaultBucketCapMib;
  double first_bucket_cap_mb = kDefaultFirstBucketCapMib;
  bool autotune = false;  // the leader tries candidate caps, then keeps the fastest
  std::string job_id = "default";
  std::string job_token;  // read from --job-token-file (common/token_file.h)
  // The network boundary (daemon/auth/call_auth.h, common/tls_credentials.h).
  bool insecure = false;                  // run without a token where one is required
  bool require_auth_for_reads = false;    // Control's reads need the token too
  std::string tls_cert, tls_key, tls_ca;  // --listen and the rendezvous client
  int64_t timeout_ms = 300 * 1000;
  double stall_threshold_s = 60;
  std::string log_level = "info";
  // text | json | journal; empty: journal when stderr is the journal, else text.
  std::string log_format;

  std::string shm_prefix = "gradsync";
  mode_t shm_mode = 0600;
  gid_t shm_group = static_cast<gid_t>(-1);  // >= 0 with shm_mode 0660
  int reduce_threads = 0;                    // 0: cores left by the trainers, 1..4
  uint32_t ring_capacity = 4096;

  uint64_t bucket_cap_bytes() const { return static_cast<uint64_t>(bucket_cap_mb * (1 << 20)); }
  uint64_t first_bucket_cap_bytes() const {
    return static_cast<uint64_t>(first_bucket_cap_mb * (1 << 20));
  }
  // Hosts the job's rendezvous: no --leader, and no etcd to hold it.
  bool is_leader() const { return leader.empty() && rendezvous.empty(); }
  int min_nodes_or_num() const { return min_nodes == 0 ? num_nodes : min_nodes; }
  int max_nodes_or_num() const { return max_nodes == 0 ? num_nodes : max_nodes; }
};

// Checks ranges and combinations; the message names the flag.
absl::Status ValidateConfig(const DaemonConfig& config);
// The network part of ValidateConfig: a multi-node daemon needs a token
// (unless --insecure); a single node without one listens on loopback only
// (or runs mutual TLS); TLS flags come in working combinations.
absl::Status ValidateNetworkAuth(const DaemonConfig& config);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CONFIG_H_
