// gradsyncd: the per-node gradient-synchronization daemon.
//
//   gradsyncd --socket PATH --listen HOST:PORT [--leader HOST:PORT]
//             --node-rank N --num-nodes N --local-size N --backend auto|gloo|nccl
//             --bucket-cap-mb 25 --first-bucket-cap-mb 1 --job-id ID
//             --job-token-file F --timeout-s 300
//             [--tls-cert F --tls-key F [--tls-ca F]] [--insecure]
//
// Every flag can also be set in a config file (--config FILE) or as
// GRADSYNCD_<FLAG> in the environment (daemon/flags.h); see --help.
// Defaults give a working single-node daemon. SIGTERM / SIGINT stop it
// cleanly (trainers get an error; segments and the socket are removed).
#include <grp.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log_value.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "daemon/backends/gloo_worker.h"
#include "daemon/backends/worker_zygote.h"
#include "daemon/config.h"
#include "daemon/daemon.h"
#include "daemon/flags.h"
#include "daemon/leader_self.h"
#include "daemon/log_output.h"
#include "daemon/malloc_arenas.h"
#include "daemon/run_gradsyncd.h"
#include "daemon/systemd_library.h"
#include "spdlog/spdlog.h"

// Every default comes from DaemonConfig (config.h), the one place it is written.
static const gradsync::DaemonConfig kDefaults;

ABSL_FLAG(std::string, socket, kDefaults.socket_path,
          "unix socket trainers attach to (default: $RUNTIME_DIRECTORY/gradsyncd.sock under "
          "systemd, else gradsyncd.sock in $XDG_RUNTIME_DIR/gradsync or /tmp/gradsync-<uid>, "
          "created 0700)");
ABSL_FLAG(std::string, listen, kDefaults.listen,
          "HOST:PORT for control, health, reflection and (leader) rendezvous; empty: off");
ABSL_FLAG(std::string, leader, kDefaults.leader,
          "HOST:PORT of the leader daemon (node 0 may name itself, so all nodes share one "
          "--leader); empty: this daemon leads");
ABSL_FLAG(std::string, rendezvous, kDefaults.rendezvous,
          "where the job's rendezvous lives: empty (default) for node 0's daemon (the leader; "
          "its loss ends the job), or etcd://HOST:PORT[,HOST:PORT...]/PREFIX for an etcd "
          "cluster every daemon talks to (no --leader; no node special)");
ABSL_FLAG(std::string, etcd_cert, kDefaults.etcd_cert,
          "PEM client certificate for etcd's --client-cert-auth (with --etcd-key)");
ABSL_FLAG(std::string, etcd_key, kDefaults.etcd_key, "PEM private key of --etcd-cert");
ABSL_FLAG(std::string, etcd_ca, kDefaults.etcd_ca,
          "PEM CA that verifies etcd's server certificate: TLS to etcd (https client URLs)");
ABSL_FLAG(std::string, etcd_user, kDefaults.etcd_user,
          "etcd auth user (with --etcd-password-file)");
ABSL_FLAG(std::string, etcd_password_file, "",
          "file holding --etcd-user's password (mode 0600, as --job-token-file)");
ABSL_FLAG(std::string, metrics_listen, kDefaults.metrics_listen,
          "HOST:PORT serving Prometheus metrics at /metrics over plain HTTP, readable by anyone "
          "who reaches it; empty: off");
ABSL_FLAG(std::string, trace_file, kDefaults.trace_file,
          "PATH: stream every job's scheduling events here as Chrome trace JSON for the whole "
          "run (chrome://tracing, Perfetto); empty: off");
ABSL_FLAG(int, node_rank, kDefaults.node_rank, "this node's rank in [0, num_nodes)");
ABSL_FLAG(int, num_nodes, kDefaults.num_nodes,
          "daemons (nodes) in the job; node 0's daemon (the leader) hosts the rendezvous, so "
          "its loss ends the job with an error naming it, elastic or not (with --rendezvous "
          "etcd://... no node is special)");
ABSL_FLAG(int, min_nodes, kDefaults.min_nodes,
          "fewest nodes an elastic job may shrink to (torchrun's --nnodes MIN); 0: --num-nodes "
          "(a fixed job: a node's death ends it with GS_ERR_PEER_FAILED naming the node). "
          "Below --num-nodes, when a node other than node 0 dies the survivors re-form and "
          "redo the interrupted iteration over their trainers (CPU and CUDA gradients; "
          "node 0's loss still ends the "
          "job, unless the rendezvous is in etcd: --rendezvous). A daemon stopped with "
          "SIGTERM or SIGINT leaves such a job, and the survivors re-form without it at once. "
          "A trainer that died before its first or after its last mark of an iteration is "
          "counted out; one that died mid-iteration too, while another trainer on its node "
          "is active (every node redoes the iteration without it); one restarted with its "
          "local rank rejoins at an iteration boundary with its rank "
          "(gs_job_info.joined_running_job). Memory: such "
          "a job keeps two more buffers the size of the gradients (the local sums, for a "
          "redo, and the last iteration's result, for survivors a death left one iteration "
          "apart): in host memory per node with CPU gradients, in device memory on every GPU "
          "the daemon serves with CUDA gradients (2 x the flat gradient per GPU); with two or "
          "more trainers on a node, also a copy of each trainer's gradients (host memory, or "
          "device memory on that trainer's GPU)");
ABSL_FLAG(int, max_nodes, kDefaults.max_nodes,
          "most nodes an elastic job may grow to (torchrun's --nnodes MAX); 0: --num-nodes. "
          "The job starts with --num-nodes nodes; a node that is no member of the running "
          "job (a replacement for a dead one, or a --node-rank from --num-nodes up to "
          "--max-nodes - 1) joins it at an iteration boundary, its trainers fetching the "
          "job's state with gs_broadcast (gs_job_info.joined_running_job), on the embedded "
          "leader or etcd (there, while node 0 is a member). Above --num-nodes it needs "
          "--min-nodes below --num-nodes");
ABSL_FLAG(int, local_size, kDefaults.local_size, "trainers on this node");
ABSL_FLAG(std::string, backend, kDefaults.backend, "auto | gloo | nccl | local");
ABSL_FLAG(std::string, host, kDefaults.host,
          "address the cross-node backend binds (default: --listen host)");
ABSL_FLAG(double, bucket_cap_mb, kDefaults.bucket_cap_mb, "bucket size cap in MiB");
ABSL_FLAG(double, first_bucket_cap_mb, kDefaults.first_bucket_cap_mb, "first bucket's cap in MiB");
ABSL_FLAG(bool, autotune, kDefaults.autotune,
          "one node (the generation's first member: node 0 unless it died, which on "
          "--rendezvous etcd:// the others survive) tries candidate bucket caps "
          "(0.25-200 MiB) for a few iterations each, then applies the fastest job-wide; "
          "until then --bucket-cap-mb and --first-bucket-cap-mb apply. Give it to every "
          "node of the job");
ABSL_FLAG(std::string, job_id, kDefaults.job_id, "job identifier shared by all daemons of a job");
ABSL_FLAG(std::string, job_token_file, "",
          "file holding the job's shared secret (mode 0600); needed by multi-node daemons");
ABSL_FLAG(bool, insecure, kDefaults.insecure,
          "run without --job-token-file where one is required (anyone reaching --listen may "
          "join the job, drain or reconfigure it)");
ABSL_FLAG(bool, require_auth_for_reads, kDefaults.require_auth_for_reads,
          "GetStats/GetConfig/GetTrace need the token (or a TLS client certificate) too");
ABSL_FLAG(std::string, tls_cert, kDefaults.tls_cert,
          "PEM certificate of --listen and the rendezvous client");
ABSL_FLAG(std::string, tls_key, kDefaults.tls_key, "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, kDefaults.tls_ca,
          "PEM CA: verifies the leader, and requires client certificates it signed (mutual TLS)");
ABSL_FLAG(double, timeout_s, kDefaults.timeout_ms / 1000.0,
          "how long any wait may last before it becomes an error");
ABSL_FLAG(double, stall_threshold_s, kDefaults.stall_threshold_s,
          "log a stall report after this long without progress");
ABSL_FLAG(std::string, log_level, kDefaults.log_level, "trace | debug | info | warn | error");
ABSL_FLAG(std::string, log_format, kDefaults.log_format,
          "text | json (one JSON object per line) | journal (systemd journal fields); empty: "
          "journal when stderr is the journal ($JOURNAL_STREAM), else text");
ABSL_FLAG(std::string, shm_prefix, kDefaults.shm_prefix, "name prefix of shared-memory segments");
ABSL_FLAG(std::string, shm_group, "", "group allowed to map segments (mode 0660); empty: 0600");
ABSL_FLAG(std::string, wire_dtype, kDefaults.wire_dtype,
          "off | bf16 | fp16: fp32 gradients cross nodes as this 16-bit type (half the bytes; "
          "pre-scaled by 1/world size, fp16 saturates at 65504); every node must agree");
ABSL_FLAG(bool, uneven_inputs, kDefaults.uneven_inputs,
          "allow gs_join (uneven inputs) in multi-node jobs: every iteration then starts with "
          "one small allreduce of active-trainer counts; node 0's value is the job's "
          "(one node: gs_join works without it)");
ABSL_FLAG(int, check_replicas_every, kDefaults.check_replicas_every,
          "every N synchronized iterations compare a fingerprint (a hash per tensor) of every "
          "trainer's parameters and fail the job with GS_ERR_MISMATCH naming the first tensor "
          "that differs and the trainers on each side; 0: off. One node only for now");
ABSL_FLAG(std::string, nonfinite, kDefaults.nonfinite,
          "error | skip | off: a NaN or Inf in an iteration's CPU gradients fails the iteration "
          "on every trainer naming the trainer, tensor, index and value (error), makes every "
          "trainer skip that step (skip: gs_iteration_skipped), or is not checked (off)");
ABSL_FLAG(int, straggler_window, kDefaults.straggler_window,
          "who is the straggler: iterations each trainer's lateness figures cover "
          "(gradsyncctl stragglers, /metrics)");
ABSL_FLAG(double, straggler_share, kDefaults.straggler_share,
          "a trainer last of the job in more than this share of the window's iterations, and "
          "late by more than --straggler-late-ms (median), is named a straggler (log line "
          "event=straggler, at most once a minute per trainer)");
ABSL_FLAG(double, straggler_late_ms, kDefaults.straggler_late_ms,
          "see --straggler-share: the median lateness, in ms, a straggler exceeds");
ABSL_FLAG(int, reduce_threads, kDefaults.reduce_threads,
          "threads for the local reduction; 0: the cores the trainers leave free (1..4), "
          "and every core (1..4) for the buckets left once all trainers marked everything");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "gradsyncd: %s\n", message.c_str());
  return 2;
}

// Blocks the stop signals before any thread starts (every thread inherits
// the mask); one thread then waits for them. Returns the set to wait on.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return stop_signals;
}

// --rendezvous and how to reach etcd.
absl::Status RendezvousFromFlags(gradsync::DaemonConfig* config) {
  config->rendezvous = absl::GetFlag(FLAGS_rendezvous);
  config->etcd_cert = absl::GetFlag(FLAGS_etcd_cert);
  config->etcd_key = absl::GetFlag(FLAGS_etcd_key);
  config->etcd_ca = absl::GetFlag(FLAGS_etcd_ca);
  config->etcd_user = absl::GetFlag(FLAGS_etcd_user);
  if (const std::string f = absl::GetFlag(FLAGS_etcd_password_file); !f.empty()) {
    absl::StatusOr<std::string> password = gradsync::ReadTokenFile(f);
    if (!password.ok()) {
      return absl::Status(password.status().code(),
                          absl::StrCat("--etcd-password-file: ", password.status().message()));
    }
    config->etcd_password = std::move(*password);
  }
  return absl::OkStatus();
}

// The parsed flags as a checked DaemonConfig; an error's message is what
// gradsyncd prints before exiting with 2.
absl::StatusOr<gradsync::DaemonConfig> ConfigFromFlags(const std::string& log_level) {
  gradsync::DaemonConfig config;
  config.socket_path = absl::GetFlag(FLAGS_socket);
  config.listen = absl::GetFlag(FLAGS_listen);
  config.leader = absl::GetFlag(FLAGS_leader);
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  config.trace_file = absl::GetFlag(FLAGS_trace_file);
  config.node_rank = absl::GetFlag(FLAGS_node_rank);
  config.num_nodes = absl::GetFlag(FLAGS_num_nodes);
  config.min_nodes = absl::GetFlag(FLAGS_min_nodes);
  config.max_nodes = absl::GetFlag(FLAGS_max_nodes);
  config.local_size = absl::GetFlag(FLAGS_local_size);
  config.backend = absl::GetFlag(FLAGS_backend);
  config.host = absl::GetFlag(FLAGS_host);
  config.bucket_cap_mb = absl::GetFlag(FLAGS_bucket_cap_mb);
  config.first_bucket_cap_mb = absl::GetFlag(FLAGS_first_bucket_cap_mb);
  config.autotune = absl::GetFlag(FLAGS_autotune);
  config.job_id = absl::GetFlag(FLAGS_job_id);
  // Checked before the cast: converting NaN or an out-of-range double to an
  // integer is undefined. ValidateConfig checks the real range.
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(std::fabs(timeout_s) <= 1e12)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout-s ", timeout_s, " is not in [0.1, 86400]"));
  }
  config.timeout_ms = static_cast<int64_t>(timeout_s * 1000);
  config.stall_threshold_s = absl::GetFlag(FLAGS_stall_threshold_s);
  config.log_level = log_level;
  config.log_format = absl::GetFlag(FLAGS_log_format);
  config.shm_prefix = absl::GetFlag(FLAGS_shm_prefix);
  config.reduce_threads = absl::GetFlag(FLAGS_reduce_threads);
  config.wire_dtype = absl::GetFlag(FLAGS_wire_dtype);
  config.uneven_inputs = absl::GetFlag(FLAGS_uneven_inputs);
  config.check_replicas_every = absl::GetFlag(FLAGS_check_replicas_every);
  config.nonfinite = absl::GetFlag(FLAGS_nonfinite);
  config.straggler_window = absl::GetFlag(FLAGS_straggler_window);
  config.straggler_share = absl::GetFlag(FLAGS_straggler_share);
  config.straggler_late_ms = absl::GetFlag(FLAGS_straggler_late_ms);
  if (const std::string group = absl::GetFlag(FLAGS_shm_group); !group.empty()) {
    const struct group* g = getgrnam(group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--shm-group ", group, ": no such group"));
    }
    config.shm_group = g->gr_gid;
    config.shm_mode = 0660;
  }
  if (const std::string f = absl::GetFlag(FLAGS_job_token_file); !f.empty()) {
    absl::StatusOr<std::string> token = gradsync::ReadTokenFile(f);
    if (!token.ok()) {
      return absl::Status(token.status().code(),
                          absl::StrCat("--job-token-file: ", token.status().message()));
    }
    config.job_token = std::move(*token);
  }
  config.insecure = absl::GetFlag(FLAGS_insecure);
  config.require_auth_for_reads = absl::GetFlag(FLAGS_require_auth_for_reads);
  config.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  config.tls_key = absl::GetFlag(FLAGS_tls_key);
  config.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  RETURN_IF_ERROR(RendezvousFromFlags(&config));
  RETURN_IF_ERROR(gradsync::AdoptLeaderNamingSelf(&config));
  RETURN_IF_ERROR(gradsync::ValidateConfig(config));
  return config;
}

// The GPU path's device where the backend may use one. No device is not an
// error unless --backend=nccl asked for it (the error names the flag).
absl::StatusOr<gradsync::GpuRuntime> MakeGpuRuntime(
    const gradsync::DaemonConfig& config, const gradsync::GpuRuntimeFactory& gpu_factory) {
  if (config.backend == "gloo" || config.backend == "local") return gradsync::GpuRuntime();
  absl::StatusOr<gradsync::GpuRuntime> made = gpu_factory(config);
  if (made.ok()) return made;
  if (config.backend == "nccl") {
    return absl::Status(made.status().code(),
                        absl::StrCat("--backend=nccl: ", made.status().message()));
  }
  spdlog::info("event=no_gpu_device reason={}", gradsync::LogValue(made.status().message()));
  return gradsync::GpuRuntime();
}

// Abseil, as Debian builds it, checks every Mutex acquisition for lock-order
// cycles: a global graph updated under a global lock on each Lock, which
// the daemon's hot paths (and every thread's start-up) pay for, and an
// abort when it suspects a cycle. Production runs without it; the tests
// turn it on (.bazelrc: GRADSYNC_MUTEX_DEADLOCK_CHECK=1) so a lock-order
// inversion still fails them.
void ConfigureMutexDeadlockDetection() {
  const char* check = std::getenv("GRADSYNC_MUTEX_DEADLOCK_CHECK");
  const bool on = check != nullptr && std::strcmp(check, "1") == 0;
  absl::SetMutexDeadlockDetectionMode(on ? absl::OnDeadlockCycle::kAbort
                                         : absl::OnDeadlockCycle::kIgnore);
}

}  // namespace

int gradsync::RunGradsyncd(int argc, char** argv, const GpuRuntimeFactory& gpu_factory) {
  ConfigureMutexDeadlockDetection();  // before any Mutex is taken
  // This executable, started by a GlooWorkerBackend, is its Gloo worker.
  if (argc == 2 && std::strcmp(argv[1], kGlooWorkerFlag) == 0) return RunGlooWorker();
  absl::SetProgramUsageMessage(
      "gradsyncd --socket PATH --listen HOST:PORT [--leader HOST:PORT | --rendezvous "
      "etcd://HOST:PORT/PREFIX] --node-rank N --num-nodes N --local-size N ...");
  if (std::optional<int> exit_code = ParseDaemonFlags(argc, argv)) return *exit_code;

  gradsync::LimitMallocArenas();  // before any thread starts
  // Before any thread starts, and before the stop signals are blocked: a
  // job across nodes runs a Gloo worker per generation (and a spare).
  const absl::Status zygote =
      absl::GetFlag(FLAGS_num_nodes) > 1 || absl::GetFlag(FLAGS_max_nodes) > 1
          ? gradsync::StartWorkerZygote(&gradsync::RunGlooWorker)
          : absl::OkStatus();
  const sigset_t stop_signals = BlockStopSignals();

  if (absl::Status st = gradsync::ConfigureLogging(
          absl::GetFlag(FLAGS_log_format), "%Y-%m-%dT%H:%M:%S.%e level=%l component=gradsyncd %v");
      !st.ok()) {
    return Fail(std::string(st.message()));
  }
  const std::string level = absl::AsciiStrToLower(absl::GetFlag(FLAGS_log_level));
  spdlog::set_level(spdlog::level::from_str(level));
  if (!zygote.ok()) {
    spdlog::warn("event=gloo_worker_zygote_unavailable fallback=exec error={}",
                 LogValue(zygote.message()));
  }

  absl::StatusOr<gradsync::DaemonConfig> config = ConfigFromFlags(level);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  absl::StatusOr<gradsync::GpuRuntime> gpu = MakeGpuRuntime(*config, gpu_factory);
  if (!gpu.ok()) return Fail(std::string(gpu.status().message()));
  gradsync::Daemon daemon(*config, std::move(*gpu));
  if (absl::Status st = daemon.Start(); !st.ok()) {
    spdlog::critical("event=start_failed error={}", LogValue(st.message()));
    return 1;
  }
  gradsync::NotifySystemd("READY=1");

  std::thread signals([&daemon, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    daemon.RequestShutdown(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  });
  signals.detach();
  daemon.Run();
  gradsync::NotifySystemd("STOPPING=1");
  return 0;
}
