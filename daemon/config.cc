#include "daemon/config.h"

#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/backends/wire_dtype.h"
#include "daemon/engine/nonfinite_mode.h"
#include "daemon/host_syntax.h"
#include "daemon/listen_address.h"
#include "daemon/rendezvous_address.h"

namespace gradsync {

namespace {

// Every message names the flags and the values given: the operator sees at
// start what to fix, instead of a rendezvous timeout once trainers arrive.
absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(message); }

// How many nodes, which one this is, and the elastic range.
absl::Status ValidateJobShape(const DaemonConfig& c) {
  if (c.num_nodes < 1 || c.num_nodes > 4096) {
    return Bad(absl::StrCat("--num-nodes ", c.num_nodes, " is not in [1, 4096]"));
  }
  if (c.min_nodes != 0 && (c.min_nodes < 1 || c.min_nodes > c.num_nodes)) {
    return Bad(absl::StrCat("--min-nodes ", c.min_nodes, " is not in [1, ", c.num_nodes,
                            "] (--num-nodes ", c.num_nodes, "; 0 or unset: --num-nodes)"));
  }
  if (c.max_nodes != 0 && (c.max_nodes < c.num_nodes || c.max_nodes > 4096)) {
    return Bad(absl::StrCat("--max-nodes ", c.max_nodes, " is not in [", c.num_nodes,
                            ", 4096] (--num-nodes ", c.num_nodes, "; 0 or unset: --num-nodes)"));
  }
  // Nodes join a running job (docs/DESIGN.md, "Elastic jobs"), on either
  // rendezvous, in an elastic job (the one that re-forms at a death): a
  // range above --num-nodes of a fixed job is refused at start rather than
  // accepted and never used.
  if (c.max_nodes_or_num() != c.num_nodes && c.min_nodes_or_num() == c.num_nodes) {
    return Bad(absl::StrCat("--max-nodes ", c.max_nodes_or_num(), " above --num-nodes ",
                            c.num_nodes,
                            " needs an elastic job: give --min-nodes below --num-nodes too"));
  }
  // Node ranks name daemons; --max-nodes bounds them (ranks from
  // --num-nodes on join the job while it runs).
  if (c.node_rank < 0 || c.node_rank >= c.max_nodes_or_num()) {
    return Bad(absl::StrCat("--node-rank ", c.node_rank, " is not in [0, ", c.max_nodes_or_num(),
                            ") (--num-nodes ", c.num_nodes, ", --max-nodes ", c.max_nodes_or_num(),
                            ")"));
  }
  return absl::OkStatus();
}

// Who hosts the rendezvous, and the form of every address flag.
absl::Status ValidateAddresses(const DaemonConfig& c) {
  // Without --leader (or etcd) a daemon hosts the rendezvous; only node 0 may.
  if (c.num_nodes > 1 && c.node_rank > 0 && c.leader.empty() && c.rendezvous.empty()) {
    return Bad(absl::StrCat("--node-rank ", c.node_rank, " of --num-nodes ", c.num_nodes,
                            " needs --leader HOST:PORT (only node 0 hosts the rendezvous)"));
  }
  if (c.num_nodes > 1 && c.node_rank == 0 && !c.leader.empty()) {
    return Bad(absl::StrCat("--node-rank 0 of --num-nodes ", c.num_nodes,
                            " hosts the rendezvous and must not be given --leader ", c.leader,
                            " (drop --leader, or give this node its own --node-rank)"));
  }
  if (c.num_nodes == 1 && !c.leader.empty()) {
    return Bad(absl::StrCat("--leader ", c.leader,
                            " needs --num-nodes > 1 (--num-nodes 1 is a single-node job)"));
  }
  if (!c.leader.empty() && c.leader.rfind(':') == std::string::npos) {
    return Bad(absl::StrCat("--leader ", c.leader, " must be HOST:PORT"));
  }
  if (!c.metrics_listen.empty()) {
    const size_t colon = c.metrics_listen.rfind(':');
    int port = -1;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(c.metrics_listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
      return Bad(absl::StrCat("--metrics-listen ", c.metrics_listen,
                              " must be HOST:PORT (port in [0, 65535])"));
    }
  }
  // Addresses are checked for form here (nothing is resolved): a typo such
  // as 256.1.1.1 would otherwise surface only when Gloo binds it, on a
  // multi-node job, or never on one node.
  if (!c.host.empty()) {
    RETURN_IF_ERROR(CheckHost("--host", c.host));
  }
  const std::pair<const char*, const std::string*> host_ports[] = {
      {"--listen", &c.listen}, {"--leader", &c.leader}, {"--metrics-listen", &c.metrics_listen}};
  for (const auto& [flag, value] : host_ports) {
    if (value->empty() || value->rfind("unix:", 0) == 0) continue;
    RETURN_IF_ERROR(CheckHostPort(flag, *value));
  }
  if (c.num_nodes > 1 && c.listen.empty() && c.is_leader()) {
    return Bad(absl::StrCat("--node-rank 0 of --num-nodes ", c.num_nodes,
                            " needs --listen HOST:PORT: the leader serves the rendezvous there"));
  }
  return absl::OkStatus();
}

// The engine's modes, sizes and limits, and this node's local resources
// (trainers, shared memory).
absl::Status ValidateEngine(const DaemonConfig& c) {
  if (absl::StatusOr<WireDType> wire = ParseWireDType(c.wire_dtype); !wire.ok()) {
    return absl::InvalidArgumentError(wire.status().message());
  }
  if (absl::StatusOr<NonFiniteMode> mode = ParseNonFiniteMode(c.nonfinite); !mode.ok()) {
    return mode.status();
  }
  if (c.straggler_window < 1 || c.straggler_window > 100000) {
    return Bad(absl::StrCat("--straggler-window ", c.straggler_window, " is not in [1, 100000]"));
  }
  if (!(c.straggler_share >= 0 && c.straggler_share < 1)) {
    return Bad(absl::StrCat("--straggler-share ", c.straggler_share, " is not in [0, 1)"));
  }
  if (!(c.straggler_late_ms >= 0 && c.straggler_late_ms <= 3600e3)) {
    return Bad(
        absl::StrCat("--straggler-late-ms ", c.straggler_late_ms, " is not in [0, 3600000]"));
  }
  if (c.local_size < 1 || c.local_size > 256) {
    return Bad(absl::StrCat("--local-size ", c.local_size, " is not in [1, 256]"));
  }
  if (c.backend != "auto" && c.backend != "gloo" && c.backend != "nccl" && c.backend != "local") {
    return Bad(absl::StrCat("--backend ", c.backend, " must be auto, gloo, nccl or local"));
  }
  if (c.backend == "local" && c.num_nodes > 1) {
    return Bad(
        absl::StrCat("--backend local only works with --num-nodes 1 (not ", c.num_nodes, ")"));
  }
  if (!(c.bucket_cap_mb > 0 && c.bucket_cap_mb <= 4096)) {
    return Bad(absl::StrCat("--bucket-cap-mb ", c.bucket_cap_mb, " is not in (0, 4096]"));
  }
  if (!(c.first_bucket_cap_mb > 0 && c.first_bucket_cap_mb <= 4096)) {
    return Bad(
        absl::StrCat("--first-bucket-cap-mb ", c.first_bucket_cap_mb, " is not in (0, 4096]"));
  }
  if (c.timeout_ms < 100 || c.timeout_ms > 24ll * 3600 * 1000) {
    return Bad(absl::StrCat("--timeout-s ", c.timeout_ms / 1000.0, " is not in [0.1, 86400]"));
  }
  if (c.check_replicas_every < 0) {
    return Bad(
        absl::StrCat("--check-replicas-every ", c.check_replicas_every, " must be >= 0 (0: off)"));
  }
  if (c.check_replicas_every > 0 && c.num_nodes > 1 && c.uneven_inputs) {
    return Bad(absl::StrCat("--check-replicas-every ", c.check_replicas_every,
                            " with --uneven-inputs is supported on one node only (--num-nodes ",
                            c.num_nodes,
                            "): a node whose trainers all joined would never compare"));
  }
  if (!(c.stall_threshold_s > 0)) {
    return Bad(absl::StrCat("--stall-threshold-s ", c.stall_threshold_s, " must be > 0"));
  }
  if (c.shm_prefix.empty() || c.shm_prefix.find('/') != std::string::npos ||
      c.shm_prefix.find('.') != std::string::npos) {
    return Bad(
        absl::StrCat("--shm-prefix '", c.shm_prefix, "' must be non-empty without '/' or '.'"));
  }
  if ((c.ring_capacity & (c.ring_capacity - 1)) != 0 || c.ring_capacity < 64) {
    return Bad(absl::StrCat("ring capacity ", c.ring_capacity, " must be a power of two >= 64"));
  }
  return absl::OkStatus();
}

// --rendezvous etcd://...: its form, and what a job on etcd cannot do yet.
absl::Status ValidateRendezvous(const DaemonConfig& c) {
  const bool etcd_flags = !c.etcd_cert.empty() || !c.etcd_key.empty() || !c.etcd_ca.empty() ||
                          !c.etcd_user.empty() || !c.etcd_password.empty();
  if (c.rendezvous.empty()) {
    if (!etcd_flags) return absl::OkStatus();
    return Bad(
        "--etcd-cert, --etcd-key, --etcd-ca, --etcd-user and --etcd-password-file need "
        "--rendezvous etcd://HOST:PORT/PREFIX");
  }
  RETURN_IF_ERROR(ParseEtcdRendezvous(c.rendezvous).status());
  const std::string flag = absl::StrCat("--rendezvous ", c.rendezvous);
  if (c.num_nodes == 1) {
    return Bad(absl::StrCat(flag, " needs --num-nodes > 1 (a single node has no rendezvous)"));
  }
  if (!c.leader.empty()) {
    return Bad(absl::StrCat(flag, " keeps the rendezvous in etcd: drop --leader ", c.leader));
  }
  if (c.etcd_cert.empty() != c.etcd_key.empty()) {
    return Bad("--etcd-cert and --etcd-key go together (etcd's client certificate)");
  }
  if (c.etcd_password.empty() != c.etcd_user.empty()) {
    return Bad("--etcd-user and --etcd-password-file go together (etcd auth)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const DaemonConfig& c) {
  if (c.socket_path.empty() || c.socket_path.size() >= 100) {
    return Bad(absl::StrCat("--socket '", c.socket_path,
                            "' must be a path shorter than 100 bytes (unix socket limit)"));
  }
  RETURN_IF_ERROR(ValidateJobShape(c));
  RETURN_IF_ERROR(ValidateAddresses(c));
  RETURN_IF_ERROR(ValidateRendezvous(c));
  RETURN_IF_ERROR(ValidateEngine(c));
  RETURN_IF_ERROR(ValidateNetworkAuth(c));
  return absl::OkStatus();
}

absl::Status ValidateNetworkAuth(const DaemonConfig& c) {
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return Bad(c.tls_cert.empty() ? absl::StrCat("--tls-key ", c.tls_key, " needs --tls-cert")
                                  : absl::StrCat("--tls-cert ", c.tls_cert, " needs --tls-key"));
  }
  if (!c.tls_ca.empty() && c.tls_cert.empty()) {
    return Bad(absl::StrCat("--tls-ca ", c.tls_ca, " needs --tls-cert and --tls-key"));
  }
  // /metrics has no token check: where reads need one, only this host may scrape.
  if (c.require_auth_for_reads && !c.metrics_listen.empty() &&
      !ListensOnLoopbackOnly(c.metrics_listen)) {
    return Bad(absl::StrCat("--metrics-listen ", c.metrics_listen,
                            " serves stats without a token, which --require-auth-for-reads "
                            "forbids: bind it to 127.0.0.1 or drop one of the two"));
  }
  if (c.insecure || !c.job_token.empty()) return absl::OkStatus();
  // Anyone who reaches the rendezvous could join the job, read its layouts
  // and abort it: said at start, not at the first trainer.
  if (c.num_nodes > 1) {
    return Bad(absl::StrCat("--num-nodes ", c.num_nodes,
                            " needs --job-token-file (mode 0600, the same on every node); "
                            "--insecure runs the job without one"));
  }
  const bool mutual_tls = !c.tls_ca.empty();
  if (!c.listen.empty() && !mutual_tls && !ListensOnLoopbackOnly(c.listen)) {
    return Bad(absl::StrCat("--listen ", c.listen,
                            " is reachable from other hosts: give --job-token-file (mode 0600) "
                            "or --tls-ca (mutual TLS), or --insecure to accept changes from "
                            "anyone"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
