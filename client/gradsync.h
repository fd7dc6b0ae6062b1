/* gradsync.h — the C ABI trainers link (libgradsync.so).
 *
 * A trainer connects to its node's gradsyncd, registers its gradient layout,
 * and then, every iteration, marks each gradient ready (or unused) as soon as
 * backward has produced it and waits for the iteration's synchronization:
 *
 *   gs_connect -> gs_register -> { write grads into gs_grad_buffer(i);
 *                                  gs_mark_ready(i) for every i; gs_wait } ... -> gs_close
 *
 * After gs_wait returns GS_OK every gradient buffer holds the average of
 * that gradient over all trainers of the job (sum / world size).
 *
 * CUDA gradients (spec.device >= 0; a layout is all CPU or all CUDA, on one
 * GPU per trainer): with every cuda_ptr NULL the daemon owns a flat device
 * buffer per trainer and gs_grad_buffer returns device pointers into it;
 * with every cuda_ptr set the gradients stay in the caller's memory, which
 * must stay allocated (not freed, not reused by a caching allocator) until
 * gs_close returns. gs_mark_ready records a readiness event on the stream
 * set by gs_set_cuda_stream (default: the legacy default stream) after the
 * work queued there so far — it never synchronizes the host. gs_wait
 * returns once the daemon has observed every bucket's collective complete:
 * the result is in device memory and the caller's streams need no further
 * wait.
 *
 * C99, no C++ types; every call returns a gs_status and never aborts the
 * trainer. gs_last_error() describes the most recent failure.
 */
#ifndef GRADSYNC_CLIENT_GRADSYNC_H_
#define GRADSYNC_CLIENT_GRADSYNC_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GS_API __attribute__((visibility("default")))
#else
#define GS_API
#endif

/* The version of this header; gs_version() returns the library's. The
 * library's SONAME (libgradsync.so.<major>) changes only with the major. */
#define GS_VERSION_MAJOR 0
#define GS_VERSION_MINOR 1
#define GS_VERSION_PATCH 0
#define GS_VERSION_CODE(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))
#define GS_VERSION GS_VERSION_CODE(GS_VERSION_MAJOR, GS_VERSION_MINOR, GS_VERSION_PATCH)

/* GS_VERSION of the loaded library (it may be newer than this header). */
GS_API int gs_version(void);

typedef struct gs_client gs_client; /* opaque */

/* The numbers match gradsync.v1.Code in proto/gradsync/v1/local.proto. */
typedef enum {
  GS_OK = 0,
  GS_ERR_INVALID_ARGUMENT = 1, /* bad argument or layout */
  GS_ERR_UNAVAILABLE = 2,      /* the daemon cannot be reached */
  GS_ERR_MISMATCH = 3,         /* trainers/nodes registered different layouts */
  GS_ERR_PEER_FAILED = 4,      /* another trainer, daemon or node failed */
  GS_ERR_TIMEOUT = 5,          /* the wait passed its deadline */
  GS_ERR_STATE = 6,            /* call not valid now (e.g. mark before register) */
  GS_ERR_INTERNAL = 7,
  /* The node ran short of something (room in /dev/shm for the job's
   * segments, file descriptors): free it or ask for less, then retry.
   * Additive: a library built before this code existed returns
   * GS_ERR_INTERNAL for the same failure. */
  GS_ERR_RESOURCE_EXHAUSTED = 8
} gs_status;

typedef enum { GS_FLOAT32 = 0, GS_FLOAT64 = 1, GS_FLOAT16 = 2, GS_BFLOAT16 = 3 } gs_dtype;

typedef struct {
  const char* name; /* unique in the layout; used in error messages */
  gs_dtype dtype;
  uint64_t numel; /* element count, >= 1 */
  int device;     /* -1: CPU (arena in shm); >= 0: CUDA ordinal */
  void* cuda_ptr; /* CUDA tensors only */
} gs_tensor_spec;

/* gs_connect verifies who runs the daemon (the socket's peer credentials)
 * and refuses (GS_ERR_UNAVAILABLE) any user but root, the caller's own user,
 * the user named by $GRADSYNC_DAEMON_UID (a uid or a user name), and on
 * GS_DEFAULT_SOCKET the owner of its directory; every shared-memory segment
 * it maps must then belong to that same user. */
/*
 * The struct grows at its end; `size` says how much of it the caller knows.
 * Start from GS_CONNECT_OPTIONS_INIT (which sets size) and assign fields:
 *
 *   gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
 *   o.socket_path = path;
 *
 * size == 0 (a positional or zeroed initializer written before the field
 * existed) means the three original fields; a size larger than this
 * library's struct (a caller built against a newer header) is refused with
 * GS_ERR_INVALID_ARGUMENT. Binaries built against the original header (no
 * size field) keep working: they bind to gs_connect@GRADSYNC_0, which reads
 * the original layout (client/gradsync_original_layout.cc).
 */
typedef struct {
  const char* socket_path; /* NULL: $GRADSYNC_SOCKET, else the default (below) */
  int local_rank;          /* -1: $LOCAL_RANK, else 0 */
  int timeout_ms;          /* connect/attach timeout; <= 0: 30 s */
  size_t size;             /* sizeof(gs_connect_options), or 0 (above) */
} gs_connect_options;

#define GS_CONNECT_OPTIONS_INIT \
  { NULL, -1, 0, sizeof(gs_connect_options) }

/* A system-wide daemon's socket (systemd's RuntimeDirectory=gradsync), used
 * when neither the option nor $GRADSYNC_SOCKET names one and it exists; else
 * the per-user one, $XDG_RUNTIME_DIR/gradsync/gradsyncd.sock or
 * /tmp/gradsync-<uid>/gradsyncd.sock (gradsync::kSystemSocketPath in
 * common/defaults.h, checked at compile time; common/default_socket.h). */
#define GS_DEFAULT_SOCKET "/run/gradsync/gradsyncd.sock"

/* Attaches to the node's daemon. On failure *out is still set (when out is
 * not NULL) so that gs_last_error can describe the failure; gs_close it. */
GS_API gs_status gs_connect(const gs_connect_options* opts, gs_client** out);

/* Registers the gradient layout; returns once every trainer of the node has
 * registered the same layout (GS_ERR_MISMATCH names the first difference).
 * GS_ERR_PEER_FAILED names the culprit when the daemon ("gradsyncd (pid N)")
 * died, or another node or the leader failed; GS_ERR_TIMEOUT names the local
 * ranks or the node ranks that never registered. */
GS_API gs_status gs_register(gs_client* c, const gs_tensor_spec* specs, size_t count);

/* This trainer's global rank and the job's world size (after gs_register). */
GS_API gs_status gs_world(gs_client* c, int* rank, int* world_size);

/* The gradient buffer of tensor `index`, valid until gs_close: shared
 * memory for CPU tensors, a device pointer for CUDA tensors (into the
 * daemon's flat buffer, or the caller's cuda_ptr); NULL for bad indices or
 * before gs_register. */
GS_API void* gs_grad_buffer(gs_client* c, size_t index);

/* Gradient `index` is final for this iteration: do not write its buffer
 * again until gs_wait returns. With GRADSYNC_DEBUG=detail in the environment
 * at gs_connect (off by default, like TORCH_DISTRIBUTED_DEBUG; it costs one
 * pass over each CPU gradient per mark) the daemon checks before reducing
 * that no CPU gradient changed since its mark, and fails the job with
 * GS_ERR_INVALID_ARGUMENT naming the trainer and the tensor (a misuse of
 * this call, not a disagreement between trainers); CUDA gradients are not
 * checked. A write after the daemon's check is not detected. */
GS_API gs_status gs_mark_ready(gs_client* c, size_t index);

/* Gradient `index` was not produced this iteration: it contributes zeros
 * (its buffer is zeroed; CUDA: asynchronously on the chosen stream) — unless it accumulated a
 * gradient in earlier no_sync iterations, which is kept and reduced. Validated before anything is
 * touched: a refused call leaves the buffer alone. */
GS_API gs_status gs_mark_unused(gs_client* c, size_t index);

/* Waits until every bucket of this iteration is reduced. timeout_ms < 0:
 * the daemon's timeout. On GS_ERR_TIMEOUT the message names the tensors
 * this trainer has not marked, if any. */
GS_API gs_status gs_wait(gs_client* c, int64_t timeout_ms);

/* enabled = 0: following iterations post nothing and gradients accumulate
 * in the buffers; the next synced iteration reduces the accumulation.
 * Every trainer must accumulate the same number of iterations between
 * synced ones: one out of step fails the iteration with GS_ERR_MISMATCH
 * naming it and a peer with what each summed (checked among the trainers of
 * a node; trainers on different nodes are not compared). */
GS_API gs_status gs_set_sync(gs_client* c, int enabled);

/* Uneven inputs (PyTorch DDP's Join): this trainer ran out of data. Call it
 * between iterations (after gs_wait, before any mark; else GS_ERR_STATE).
 * From the daemon's current iteration on, the job counts this trainer as
 * contributing zeros to every gradient (its buffers are neither read nor
 * written), and the other trainers keep iterating. gs_join blocks until
 * every trainer of the job, on every node, has joined, and returns GS_OK
 * then, or the job's error if it fails first (no deadline of its own: the
 * daemon's collective timeout and its liveness bound the wait). Afterwards
 * every per-iteration call (mark, wait, set_sync) and a second gs_join
 * return GS_ERR_INVALID_ARGUMENT naming this trainer; gs_close it. The
 * trainer's parameters stay where its last step left them (DDP's
 * final-model broadcast is not done).
 *
 * divide_by_initial_world_size (DDP's argument of the same name, default 1
 * there): nonzero: every later average still divides by the job's world
 * size; 0: by the number of trainers still active in that iteration. Every
 * trainer that joins must pass the same value (else GS_ERR_MISMATCH). CPU
 * gradients only (a CUDA job fails with GS_ERR_INVALID_ARGUMENT). Across
 * nodes the job must be started with gradsyncd --uneven-inputs (node 0's
 * value decides; it adds one small allreduce per iteration), else
 * GS_ERR_STATE naming the flag; one node needs nothing. */
GS_API gs_status gs_join(gs_client* c, int divide_by_initial_world_size);

/* Makes `bytes` bytes at `buf` on every trainer of the job, on every node,
 * equal to those of the trainer whose global rank is `root_rank` (the
 * root's buffer is only read): bytes, so any dtype; 0 bytes to GiBs, in
 * pieces (no buffer of that size is allocated anywhere). What PyTorch DDP's
 * constructor and Horovod's broadcast_parameters do with parameters,
 * buffers and optimizer state. Every trainer of the job calls it, with the
 * same bytes and root_rank, between iterations (after gs_wait, before any
 * mark; a trainer with marked tensors gets GS_ERR_STATE and nothing
 * happens). It returns GS_OK once this trainer's buffer holds the root's
 * bytes, or an error that fails the job, naming the culprit:
 * GS_ERR_STATE when another trainer is mid-iteration (it marked gradients)
 * while this one broadcasts; GS_ERR_MISMATCH when trainers (or nodes)
 * pass different bytes or root_rank; GS_ERR_INVALID_ARGUMENT for a
 * root_rank outside the job; GS_ERR_TIMEOUT naming the trainers that did
 * not call within timeout_ms (<= 0: the daemon's timeout); GS_ERR_PEER_FAILED
 * naming a trainer, node or daemon that died meanwhile.
 *
 * `buf` is host memory, or, in a job whose gradients are CUDA tensors,
 * CUDA device memory on this trainer's GPU (told apart by the pointer,
 * cuPointerGetAttributes; managed memory counts as host): every trainer
 * of the job passes the same kind, else GS_ERR_MISMATCH. Host bytes go
 * through shared memory on the node (one copy out of the root, one into
 * each other trainer) and once per node with the cross-node backend's
 * broadcast. Device bytes never touch host memory: they go through the
 * daemon's device staging on each GPU, copied device to device on the
 * stream set by gs_set_cuda_stream (after the work queued there, which
 * this call then waits for), and across GPUs and nodes with ncclBroadcast;
 * the call returns with the bytes in device memory. Device memory on
 * another GPU than the gradients' is refused (GS_ERR_INVALID_ARGUMENT). In
 * a job with CPU gradients `buf` must be host memory. */
GS_API gs_status gs_broadcast(gs_client* c, void* buf, size_t bytes, int root_rank,
                              int64_t timeout_ms);

/* What this trainer sees of its job: refreshed by every gs_wait that
 * returns GS_OK (it rides on the completion entry gs_wait reads anyway: no
 * extra call to the daemon), readable any time after gs_register.
 *
 * The struct grows at its end. Start from GS_JOB_INFO_INIT (which sets
 * size) and pass it; on return size says how much of it this library
 * filled (less than the caller's sizeof when the library is older: the
 * fields past it were left as the caller set them). A size smaller than
 * the first version of the struct is refused with GS_ERR_INVALID_ARGUMENT.
 *
 *   gs_job_info info = GS_JOB_INFO_INIT;
 *   gs_wait(c, -1); gs_get_job_info(c, &info);
 */
typedef struct {
  size_t size;                 /* sizeof(gs_job_info): set by GS_JOB_INFO_INIT */
  uint64_t iteration;          /* synchronized iterations the job completed: the same
                                  on every trainer of every node (no_sync iterations
                                  are not counted); 0 before the first gs_wait */
  int world_size;              /* trainers the last iteration's sum was divided by:
                                  the job's world size, or the trainers still active
                                  after gs_join(c, 0); before the first gs_wait the
                                  job's world size (gs_world) */
  int rank;                    /* this trainer's global rank in that iteration */
  int check_replicas_due;      /* nonzero: call gs_check_replicas now (below) */
  uint64_t membership_changes; /* how many times an elastic job's members
                                  changed (the survivors of a node's death
                                  re-formed) in the iterations completed so
                                  far: it grows after the gs_wait of the
                                  iteration where they did, whose world_size
                                  is then the new world's (re-shard data
                                  here); 0 in a fixed job. It also grows
                                  when nodes join (nodes_joined) */
  uint64_t nodes_joined;       /* how many times nodes joined the running elastic
                                  job right after an iteration completed so far:
                                  it grows after that iteration's gs_wait (whose
                                  world_size is still the old world's; the next
                                  iteration's is the grown one), and every
                                  trainer then calls gs_broadcast of its state
                                  (parameters, buffers, optimizer state, the
                                  iteration) from catch_up_root before its
                                  next mark, as the joiners' trainers do, and
                                  only then gs_check_replicas where one is due
                                  (it runs in the grown world, joiners
                                  included) */
  int joined_running_job;      /* nonzero: this trainer's node joined the job
                                  while it ran; `iteration` is the job's
                                  iteration count it starts at, and before its
                                  first mark it receives the job's state with
                                  gs_broadcast from catch_up_root (above), then
                                  calls gs_check_replicas if
                                  check_replicas_due is set, as the members do
                                  at that boundary; also set on a trainer that
                                  took back the local rank of one that died on
                                  a node that stayed */
  uint64_t trainers_joined;    /* how many times trainers restarted on nodes
                                  that stayed in the running elastic job joined
                                  it right after an iteration completed so far
                                  (each took back a dead trainer's local rank
                                  and rank): it grows after that iteration's
                                  gs_wait, and every trainer then calls
                                  gs_broadcast of its state from catch_up_root
                                  before its next mark, as for nodes_joined */
  int catch_up_root;           /* the root of that catch-up gs_broadcast: the
                                  lowest rank alive and a member before the
                                  joiners came (rank 0's trainer may be the one
                                  that died); set when nodes_joined or
                                  trainers_joined grows, and on a joiner */
} gs_job_info;

#define GS_JOB_INFO_INIT \
  { sizeof(gs_job_info), 0, 0, -1, 0, 0, 0, 0, 0, 0 }

/* Fills *info (above). GS_ERR_STATE before gs_register. */
GS_API gs_status gs_get_job_info(gs_client* c, gs_job_info* info);

/* gradsyncd --check-replicas-every N: after every N-th synchronized
 * iteration (gs_job_info.check_replicas_due), once this trainer has
 * applied that iteration's update to its parameters (after the optimizer
 * step), it passes one 64-bit hash of each registered tensor's parameter
 * (not gradient), `count` of them in registration order; any hash function,
 * the same on every trainer (the Python package hashes the bytes). Every
 * trainer of the job still iterating calls it; it returns once all local
 * trainers' hashes were compared. GS_ERR_MISMATCH (the job fails) names
 * the first tensor whose hashes differ and the trainers (and nodes) on
 * each side; GS_ERR_TIMEOUT names the trainers that did not call within
 * the daemon's timeout. GS_ERR_STATE when no check is due (not the N-th
 * iteration, already checked, mid-iteration, or the daemon runs without
 * the flag); GS_ERR_INVALID_ARGUMENT for a count other than the layout's.
 * Across nodes every node compares them (its Gloo context, one small
 * exchange); the reference is the first member's lowest rank. */
GS_API gs_status gs_check_replicas(gs_client* c, const uint64_t* hashes, size_t count);

/* CUDA tensors: the cudaStream_t (as void*) the readiness events are
 * recorded on and unused gradients zeroed on, from the next mark on; NULL:
 * the legacy default stream. Record after the stream's last write of the
 * gradient, i.e. call gs_mark_ready after queueing backward's work there. */
GS_API gs_status gs_set_cuda_stream(gs_client* c, void* stream);

/* 1 when the iteration the last successful gs_wait completed must not be
 * applied, else 0: its gradients hold a NaN or Inf and gradsyncd runs
 * --nonfinite=skip. Every trainer of the job gets the same answer for the
 * same iteration (skip the optimizer step, like AMP's GradScaler), so the
 * replicas stay equal; the gradient buffers then hold unspecified values.
 * (--nonfinite=error, the default, fails such an iteration instead.) */
GS_API int gs_iteration_skipped(const gs_client* c);

/* The message of the last failure on this client ("" if none). */
GS_API const char* gs_last_error(const gs_client* c);

/* Detaches and frees the client. Gradient buffers become invalid. */
GS_API void gs_close(gs_client* c);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GRADSYNC_CLIENT_GRADSYNC_H_ */
