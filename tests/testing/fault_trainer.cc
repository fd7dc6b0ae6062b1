// fault_trainer: examples/mlp_trainer (the model and its training in
// examples/mlp_training.h) with the flags the integration tests use to
// fault it and to reach every corner of the C ABI: pause points (SIGSTOP at
// a stage), withheld or late-written gradients, an extra tensor, a slow
// backward, a random marking order, unused parameters (the "gate": unused
// on steps % --gate-every == 0, by the first --gate-unused-first samples
// only), uneven inputs (gs_join), poisoned gradients, a bounded gs_wait,
// a checked gs_broadcast between two steps, gs_check_replicas when due.
// `--single` runs the one-process reference of each (no daemon).
//
// It exits with 10 + the gs_status that stopped it, and prints the lines
// the tests wait for under mlp_trainer's name ("mlp_trainer: paused at
// backward", "mlp_trainer: gs_wait failed: ... error=\"...\"").
#include <getopt.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/gradsync.h"
#include "examples/mlp_training.h"

namespace {

using mlp::Die;
using mlp::Model;

struct Options {
  int steps = 20;
  int batch = 64;  // global batch per step (split across trainers)
  int dim = 16;
  int hidden = 32;
  double lr = 0.1;
  bool fp64 = false;
  bool single = false;         // reference: one process, whole batch, no daemon
  int accumulate = 1;          // micro-batches per optimizer step (no_sync for the first k-1)
  int gate_every = 0;          // > 0: the "gate" parameter is unused on steps % gate_every == 0
  int gate_unused_first = -1;  // >= 0: ... but only by samples [0, N) of the global batch
  bool stale_unused = false;   // leave non-zero garbage in a gradient before gs_mark_unused
  unsigned shuffle_seed = 0;   // > 0: mark gradients ready in a random order
  int sleep_ms = 0;            // pause inside backward (to kill a trainer mid-iteration)
  std::string out;             // write final parameters here
  std::string socket;
  int64_t wait_timeout_ms = -1;
  bool quiet = false;
  bool print_loss = false;   // each step's loss even when quiet (convergence tests)
  std::string extra_tensor;  // register one more tensor (layout mismatch tests)
  int withhold = -1;         // never mark this parameter after step 0 (stall/timeout tests)
  // Fault tests: stop this process (SIGSTOP) at a stage so a test can fault
  // it, or its daemon, there deterministically: "attach" (connected, not
  // registered), "register" (registered, nothing marked), "backward" (step
  // kPauseStep, one gradient marked), "marked" (step kPauseStep, every
  // gradient marked, before gs_wait). SIGCONT resumes it.
  std::string pause_at;
  bool write_after_mark = false;  // misuse: change step 0's first marked gradient after its mark
  // Uneven inputs (gs_join): rank r runs join_steps[r] steps, then joins.
  // With --single: the reference DDP's Join defines — each step, the sum of
  // the shard gradients of the ranks still running, divided by the world
  // size or (join_divide_by_active) by how many still run.
  std::vector<int> join_steps;
  bool join_divide_by_active = false;
  std::string after_join;  // misuse tests: "join" or "mark" once gs_join returned
  // Non-finite tests: rank poison_rank writes poison_value into element
  // poison_index of parameter poison_tensor (registration index, default
  // fc1.weight) at step poison_step, just before marking it. A
  // step gs_iteration_skipped names is not applied; with --single the
  // reference skips poison_step (what --nonfinite=skip must equal).
  int poison_rank = -1, poison_step = -1;
  double poison_value = std::nan("");
  size_t poison_index = 5;
  int poison_tensor = 0;
  // After step broadcast_step, every trainer fills a buffer with a pattern
  // of its own rank, gs_broadcasts it from broadcast_root and checks that
  // it holds the root's pattern (the weights are untouched).
  int broadcast_step = -1, broadcast_root = -1;
  // After each synchronized step that gs_job_info says is due (gradsyncd
  // --check-replicas-every), hash each parameter and gs_check_replicas.
  bool check_replicas = false;
  // Elastic jobs that nodes or restarted trainers join: a joiner
  // (gs_job_info.joined_running_job) receives the iteration count and the
  // weights from gs_job_info.catch_up_root by gs_broadcast and starts at
  // that iteration; the others send theirs each time
  // gs_job_info.nodes_joined or trainers_joined grows.
  bool catch_up = false;
  // --single with --join-steps: ranks that stopped are active again from
  // this step on (a replacement node's trainers joined).
  int rejoin_at = -1;
  // With --rejoin-at: only these ranks are active again (empty: all).
  std::vector<int> rejoin_ranks;
  // > 0: every trainer's shard is --batch / this, whatever the world size
  // it registered in (a job that grows keeps its shards).
  int shard_world = 0;
};

// Over one staging piece (4 MiB), and odd: a broadcast of two pieces, the
// second partial.
constexpr size_t kBroadcastBytes = (5u << 20) + 3;

constexpr int kPauseStep = 2;

// Says where it stops, then stops: the test waits for the line and for the
// stopped state in /proc rather than guessing a delay.
void PauseAt(const Options& opt, const char* stage) {
  if (opt.pause_at != stage) return;
  std::fprintf(stderr, "mlp_trainer: paused at %s\n", stage);
  std::fflush(stderr);
  raise(SIGSTOP);
}

// mlp::Backward over samples [first, last) with the fault flags' twists:
// --shuffle-seed marks the gradients in a random order, --sleep-ms pauses
// after fc2.weight (to kill a trainer mid-iteration). `mark` is called as
// each gradient is final.
template <typename T>
double Backward(const Model<T>& m, int step, int micro, int first, int last, double denominator,
                int gate_from, T* const* grads, const Options& opt, void (*mark)(int, void*),
                void* mark_ctx) {
  std::vector<int> order = mlp::BackwardOrder();
  if (opt.shuffle_seed != 0) {
    std::mt19937 gen(opt.shuffle_seed * 7919 + step * 31 + micro);
    std::shuffle(order.begin(), order.end(), gen);
  }
  const mlp::Samples samples{step, micro, first, last, denominator, gate_from};
  return mlp::Backward(m, samples, grads, order, [&](int p) {
    if (opt.sleep_ms > 0 && p == Model<T>::kW2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(opt.sleep_ms));
    }
    if (mark) mark(p, mark_ctx);
  });
}

// What a gradsync call reported to the mark callback of Backward.
struct MarkCtx {
  gs_client* c;
  bool gate_used;
  int withhold;
  bool stale_unused;
  const Options* opt;
  bool pause_step = false;  // this is step kPauseStep: pause after the first mark
  int marked = 0;           // gradients marked this step
  bool write_after_mark = false;
  bool poison = false;  // this rank and step: poison --poison's tensor before its mark
  gs_status status = GS_OK;
};

// Parameter p's elements (Model's shapes).
size_t ParamElements(const Options& opt, int p) {
  using M = Model<float>;
  if (p == M::kW1) return static_cast<size_t>(opt.dim) * opt.hidden;
  if (p == M::kB1 || p == M::kW2) return static_cast<size_t>(opt.hidden);
  return 1;
}

template <typename T>
void MarkGradient(int p, void* v) {
  auto* m = static_cast<MarkCtx*>(v);
  if (m->status != GS_OK || p == m->withhold) return;
  if (p == Model<T>::kGate && !m->gate_used) {
    // A framework may leave an old value in an unused gradient's buffer;
    // gs_mark_unused promises the gradient contributes zeros regardless.
    if (m->stale_unused) static_cast<T*>(gs_grad_buffer(m->c, p))[0] = T(0.75);
    m->status = gs_mark_unused(m->c, p);
  } else {
    if (m->poison && p == m->opt->poison_tensor &&
        m->opt->poison_index < ParamElements(*m->opt, p)) {
      static_cast<T*>(gs_grad_buffer(m->c, p))[m->opt->poison_index] =
          static_cast<T>(m->opt->poison_value);
    }
    m->status = gs_mark_ready(m->c, p);
    if (m->status == GS_OK && m->write_after_mark) {
      // What GRADSYNC_DEBUG=detail exists to catch: the daemon may
      // already be reading this gradient.
      static_cast<T*>(gs_grad_buffer(m->c, p))[0] += T(1);
      m->write_after_mark = false;
    }
  }
  if (m->pause_step && ++m->marked == 1) PauseAt(*m->opt, "backward");
}

// One trainer's run: the model, where its gradients live (gradsync's
// buffers, or local ones with --single) and its shard of every batch.
template <typename T>
struct Trainer {
  explicit Trainer(const Options& o) : opt(o), model(o.dim, o.hidden) {}

  const Options& opt;
  Model<T> model;
  gs_client* c = nullptr;
  int rank = 0, world = 1;
  std::vector<std::vector<T>> local_grads = std::vector<std::vector<T>>(Model<T>::kCount);
  T* grads[Model<T>::kCount + 1];
  bool uneven = false;  // --join-steps
  int join_world = 0;
  int first = 0, last = 0;  // this trainer's samples of each global batch
  int steps = 0;
  uint64_t membership_changes = 0;  // gs_job_info's, as last seen
  uint64_t nodes_joined = 0;        // gs_job_info's, as last seen
  uint64_t trainers_joined = 0;     // gs_job_info's, as last seen
};

// Connects and registers the model's gradients with gradsync (the
// gradients then live in its buffers), or with --single gives them local
// buffers. Returns 0, or the exit code.
template <typename T>
int Attach(Trainer<T>& t) {
  const Options& opt = t.opt;
  const int nparams = Model<T>::kCount;
  if (opt.single) {
    for (int p = 0; p < nparams; ++p) {
      t.local_grads[p].assign(t.model.params[p].size(), T(0));
      t.grads[p] = t.local_grads[p].data();
    }
    return 0;
  }
  gs_connect_options co{};
  co.socket_path = opt.socket.empty() ? nullptr : opt.socket.c_str();
  co.local_rank = -1;
  co.timeout_ms = 10000;
  gs_status st = gs_connect(&co, &t.c);
  if (st != GS_OK) return Die(t.c, "gs_connect", st);
  PauseAt(opt, "attach");
  std::vector<gs_tensor_spec> specs = mlp::TensorSpecs(t.model);
  if (!opt.extra_tensor.empty()) {
    specs.push_back({opt.extra_tensor.c_str(), specs[0].dtype, 1, -1, nullptr});
  }
  st = gs_register(t.c, specs.data(), specs.size());
  if (st != GS_OK) return Die(t.c, "gs_register", st);
  st = gs_world(t.c, &t.rank, &t.world);
  if (st != GS_OK) return Die(t.c, "gs_world", st);
  PauseAt(opt, "register");
  for (int p = 0; p < nparams; ++p) t.grads[p] = static_cast<T*>(gs_grad_buffer(t.c, p));
  return 0;
}

// This trainer's shard and step count; 2 when the batch does not split.
template <typename T>
int PlanShard(Trainer<T>& t) {
  const Options& opt = t.opt;
  if (opt.batch % t.world != 0) {
    std::fprintf(stderr, "mlp_trainer: --batch %d is not divisible by the world size %d\n",
                 opt.batch, t.world);
    return 2;
  }
  t.uneven = !opt.join_steps.empty();
  t.join_world = static_cast<int>(opt.join_steps.size());
  if (t.uneven && !opt.single && t.join_world != t.world) {
    std::fprintf(stderr, "mlp_trainer: --join-steps lists %d ranks, the world has %d\n",
                 t.join_world, t.world);
    return 2;
  }
  if (t.uneven && opt.single && opt.batch % t.join_world != 0) return 2;
  const int shard = opt.batch / (opt.shard_world > 0 ? opt.shard_world : t.world);
  t.first = t.rank * shard;
  t.last = t.first + shard;
  t.steps = opt.steps;
  if (t.uneven) {
    t.steps = opt.single ? *std::max_element(opt.join_steps.begin(), opt.join_steps.end())
                         : opt.join_steps[t.rank];
  }
  return 0;
}

// --single with --join-steps: DDP's Join, where the ranks still running
// contribute and the joined ones zeros. Returns the summed loss.
template <typename T>
double JoinReferenceBackward(Trainer<T>& t, int step, int gate_from) {
  const Options& opt = t.opt;
  const int join_shard = opt.batch / t.join_world;
  int active = 0;
  double loss = 0;
  for (int r = 0; r < t.join_world; ++r) {
    const bool rejoined =
        opt.rejoin_at >= 0 && step >= opt.rejoin_at &&
        (opt.rejoin_ranks.empty() ||
         std::find(opt.rejoin_ranks.begin(), opt.rejoin_ranks.end(), r) != opt.rejoin_ranks.end());
    if (opt.join_steps[r] <= step && !rejoined) continue;
    ++active;
    loss += Backward(t.model, step, 0, r * join_shard, (r + 1) * join_shard, double(join_shard),
                     gate_from, t.grads, opt, nullptr, nullptr);
  }
  const T divisor = static_cast<T>(opt.join_divide_by_active ? active : t.join_world);
  for (int p = 0; p < Model<T>::kCount; ++p) {
    for (T& g : t.local_grads[p]) g /= divisor;
  }
  return loss;
}

// The byte at `i` of rank `rank`'s --broadcast-after buffer.
uint8_t BroadcastPattern(int rank, size_t i) {
  return static_cast<uint8_t>((static_cast<size_t>(rank) * 131 + i * 7 + i / 4099) & 0xff);
}

// --broadcast-after: returns 0, or the exit code (4: wrong bytes).
int CheckedBroadcast(gs_client* c, int rank, int step, int root) {
  std::vector<uint8_t> buf(kBroadcastBytes);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = BroadcastPattern(rank, i);
  const gs_status st = gs_broadcast(c, buf.data(), buf.size(), root, -1);
  if (st != GS_OK) return Die(c, "gs_broadcast", st);
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != BroadcastPattern(root, i)) {
      std::fprintf(stderr,
                   "mlp_trainer: gs_broadcast from rank %d after step %d: byte %zu is %d, the "
                   "root's is %d\n",
                   root, step, i, int(buf[i]), int(BroadcastPattern(root, i)));
      gs_close(c);
      return 4;
    }
  }
  std::fprintf(stderr, "mlp_trainer: gs_broadcast from rank %d after step %d: %zu bytes ok\n", root,
               step, buf.size());
  return 0;
}

// --catch-up: the job's state, [iteration][every parameter], made equal to
// rank `root`'s (gs_job_info.catch_up_root) by gs_broadcast; `iteration` is
// this trainer's count, which must be the root's. Returns 0, or the exit
// code (5: another iteration count).
template <typename T>
int BroadcastState(Trainer<T>& t, uint64_t iteration, int root) {
  std::vector<uint8_t> state(sizeof(uint64_t));
  std::memcpy(state.data(), &iteration, sizeof(iteration));
  for (const std::vector<T>& p : t.model.params) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(p.data());
    state.insert(state.end(), bytes, bytes + p.size() * sizeof(T));
  }
  const gs_status st = gs_broadcast(t.c, state.data(), state.size(), root, -1);
  if (st != GS_OK) return Die(t.c, "gs_broadcast of the job's state", st);
  uint64_t root_iteration = 0;
  std::memcpy(&root_iteration, state.data(), sizeof(root_iteration));
  if (root_iteration != iteration) {
    std::fprintf(stderr, "mlp_trainer: rank %d is at iteration %llu, this trainer at %llu\n", root,
                 static_cast<unsigned long long>(root_iteration),
                 static_cast<unsigned long long>(iteration));
    gs_close(t.c);
    return 5;
  }
  size_t at = sizeof(uint64_t);
  for (std::vector<T>& p : t.model.params) {
    std::memcpy(p.data(), state.data() + at, p.size() * sizeof(T));
    at += p.size() * sizeof(T);
  }
  return 0;
}

// FNV-1a of a parameter's bytes: --check-replicas' fingerprint.
template <typename T>
uint64_t Fingerprint(const std::vector<T>& values) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(T); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// With --check-replicas, checks the replicas when `info` says a check is
// due. Returns 0, or the exit code.
template <typename T>
int CheckReplicasIfDue(Trainer<T>& t, const gs_job_info& info) {
  if (!t.opt.check_replicas || !info.check_replicas_due) return 0;
  std::vector<uint64_t> hashes;
  for (int p = 0; p < Model<T>::kCount; ++p) hashes.push_back(Fingerprint(t.model.params[p]));
  const gs_status st = gs_check_replicas(t.c, hashes.data(), hashes.size());
  if (st != GS_OK) return Die(t.c, "gs_check_replicas", st);
  std::fprintf(stderr, "mlp_trainer: replicas checked after iteration %llu (world size %d)\n",
               static_cast<unsigned long long>(info.iteration), info.world_size);
  return 0;
}

// --catch-up on a trainer whose node joined the running job: the job's
// state and the iteration to start at (*first_step). Returns 0, or the
// exit code.
template <typename T>
int CatchUp(Trainer<T>& t, int* first_step) {
  gs_job_info info = GS_JOB_INFO_INIT;
  const gs_status st = gs_get_job_info(t.c, &info);
  if (st != GS_OK) return Die(t.c, "gs_get_job_info", st);
  if (!info.joined_running_job) return 0;
  if (int code = BroadcastState(t, info.iteration, info.catch_up_root); code != 0) return code;
  *first_step = static_cast<int>(info.iteration);
  // The root the state came from: a re-run after the root's node died changes it.
  const gs_status again = gs_get_job_info(t.c, &info);
  if (again != GS_OK) return Die(t.c, "gs_get_job_info", again);
  std::fprintf(stderr,
               "mlp_trainer: joined the running job at iteration %llu: state from rank %d, "
               "world size %d, rank %d\n",
               static_cast<unsigned long long>(info.iteration), info.catch_up_root, info.world_size,
               info.rank);
  // A check due at the iteration it starts at runs in the grown world: the
  // members check after handing over this state, and so does this trainer.
  return CheckReplicasIfDue(t, info);
}

// After a step's SGD: says when the job's members changed (an elastic
// re-formation: "mlp_trainer: the job's members changed ...") and, with
// --check-replicas, checks the replicas when due. Returns 0, or the exit
// code.
template <typename T>
int AfterStep(Trainer<T>& t) {
  gs_client* c = t.c;
  gs_job_info info = GS_JOB_INFO_INIT;
  gs_status st = gs_get_job_info(c, &info);
  if (st != GS_OK) return Die(c, "gs_get_job_info", st);
  if (info.membership_changes != t.membership_changes) {
    t.membership_changes = info.membership_changes;
    std::fprintf(stderr,
                 "mlp_trainer: the job's members changed (%llu times) by iteration %llu: world "
                 "size %d, rank %d\n",
                 static_cast<unsigned long long>(info.membership_changes),
                 static_cast<unsigned long long>(info.iteration), info.world_size, info.rank);
  }
  const bool nodes_joined = info.nodes_joined != t.nodes_joined;
  if (t.opt.catch_up && (nodes_joined || info.trainers_joined != t.trainers_joined)) {
    // Nodes or restarted trainers join before the next iteration: they get
    // this state.
    t.nodes_joined = info.nodes_joined;
    t.trainers_joined = info.trainers_joined;
    if (int code = BroadcastState(t, info.iteration, info.catch_up_root); code != 0) return code;
    st = gs_get_job_info(c, &info);  // the root that sent it (a re-run changes it)
    if (st != GS_OK) return Die(c, "gs_get_job_info", st);
    std::fprintf(stderr, "mlp_trainer: %s joined after iteration %llu: state sent from rank %d\n",
                 nodes_joined ? "nodes" : "trainers",
                 static_cast<unsigned long long>(info.iteration), info.catch_up_root);
  }
  return CheckReplicasIfDue(t, info);
}

// One optimizer step: its micro-batches' backward passes (each synced
// through gradsync, the last one reduced), then SGD. Returns 0, or the
// exit code.
template <typename T>
int Step(Trainer<T>& t, int step, MarkCtx& mctx) {
  const Options& opt = t.opt;
  const int nparams = Model<T>::kCount;
  gs_client* c = t.c;
  const bool gate_step = opt.gate_every <= 0 || step % opt.gate_every != 0;
  // The first sample (global batch index) that uses the gate this step.
  const int gate_from = gate_step                    ? 0
                        : opt.gate_unused_first >= 0 ? opt.gate_unused_first
                                                     : opt.batch;
  const bool gate_used = t.last > gate_from;
  double loss = 0;
  if (t.uneven && opt.single) loss += JoinReferenceBackward(t, step, gate_from);
  for (int micro = 0; micro < (t.uneven && opt.single ? 0 : opt.accumulate); ++micro) {
    const bool sync = micro == opt.accumulate - 1;
    if (c) {
      gs_status st = gs_set_sync(c, sync ? 1 : 0);
      if (st != GS_OK) return Die(c, "gs_set_sync", st);
      if (!opt.extra_tensor.empty()) {
        st = gs_mark_ready(c, nparams);
        if (st != GS_OK) return Die(c, "gs_mark_ready", st);
      }
    }
    mctx.gate_used = gate_used;
    mctx.withhold = step > 0 ? opt.withhold : -1;
    mctx.pause_step = step == kPauseStep && sync;
    mctx.marked = 0;
    mctx.write_after_mark = opt.write_after_mark && step == 0 && sync;
    mctx.poison = sync && step == opt.poison_step && t.rank == opt.poison_rank;
    loss += Backward(t.model, step, micro, t.first, t.last, double(t.last - t.first), gate_from,
                     t.grads, opt, c ? &MarkGradient<T> : nullptr, &mctx);
    if (c && mctx.status != GS_OK) return Die(c, "gs_mark_ready", mctx.status);
    if (mctx.pause_step) PauseAt(opt, "marked");
    if (c) {
      gs_status st = gs_wait(c, opt.wait_timeout_ms);
      if (st != GS_OK) return Die(c, "gs_wait", st);
    }
  }
  // Single process: the gradient is already the mean over the batch. With
  // gradsync it is the average of the trainers' shard means, the same thing.
  // A skipped step (--nonfinite=skip) only zeroes the gradients.
  const bool apply = c ? gs_iteration_skipped(c) == 0 : step != opt.poison_step;
  if (!apply && c && t.rank == 0) std::printf("step %d skipped: non-finite gradients\n", step);
  mlp::SgdStep(t.model, t.grads, opt.lr, apply);
  if ((!opt.quiet || opt.print_loss) && t.rank == 0) {
    std::printf("step %3d  loss %.6f  (rank %d of %d)\n", step,
                loss / (double(t.last - t.first) * opt.accumulate), t.rank, t.world);
    std::fflush(stdout);
  }
  if (c) {
    if (int code = AfterStep(t); code != 0) return code;
  }
  if (c && step == opt.broadcast_step) return CheckedBroadcast(c, t.rank, step, opt.broadcast_root);
  return 0;
}

// After the last step: gs_join when out of data (uneven inputs), then the
// final weights (checksum, --out). Returns 0, or the exit code.
template <typename T>
int Finish(Trainer<T>& t) {
  const Options& opt = t.opt;
  gs_client* c = t.c;
  if (c && t.uneven) {
    // Out of data: the others go on without this trainer; wait for them.
    gs_status st = gs_join(c, opt.join_divide_by_active ? 0 : 1);
    if (st != GS_OK) return Die(c, "gs_join", st);
    if (opt.after_join == "join") return Die(c, "second gs_join", gs_join(c, 1));
    if (opt.after_join == "mark") return Die(c, "gs_mark_ready after gs_join", gs_mark_ready(c, 0));
  }
  if (!opt.quiet) {
    std::printf("rank %d final weights checksum %.15g\n", t.rank, mlp::Checksum(t.model));
  }
  if (!opt.out.empty() && !mlp::WriteWeights(t.model, opt.out)) return 3;
  if (c) gs_close(c);
  return 0;
}

template <typename T>
int Run(const Options& opt) {
  Trainer<T> t(opt);
  if (int code = Attach(t); code != 0) return code;
  if (int code = PlanShard(t); code != 0) return code;
  MarkCtx mctx{t.c, true, -1, opt.stale_unused, &opt};
  int first_step = 0;
  if (opt.catch_up && t.c != nullptr) {
    if (int code = CatchUp(t, &first_step); code != 0) return code;
  }
  for (int step = first_step; step < t.steps; ++step) {
    if (int code = Step(t, step, mctx); code != 0) return code;
  }
  return Finish(t);
}

void PrintUsage() {
  std::fprintf(stderr,
               "usage: fault_trainer [--steps N] [--batch N] [--hidden N] [--dim N] [--lr X]\n"
               "  [--fp64] [--single] [--accumulate K] [--gate-every K]\n"
               "  [--gate-unused-first N] [--stale-unused] [--shuffle-seed S] [--sleep-ms N]\n"
               "  [--out FILE] [--socket PATH] [--wait-timeout-ms N] [--quiet] [--print-loss]\n"
               "  fault tests: [--extra-tensor NAME] [--withhold P] [--write-after-mark]\n"
               "  [--pause-at attach|register|backward|marked]\n"
               "  uneven inputs: [--join-steps N0,N1,... (steps per rank, then gs_join)]\n"
               "  [--join-divide-by-active] [--after-join join|mark]\n"
               "  non-finite gradients: [--poison RANK:STEP[:VALUE[:INDEX[:TENSOR]]]\n"
               "  (parameter TENSOR's [INDEX] = VALUE, default nan, INDEX 5, TENSOR 0:\n"
               "  fc1.weight; --single: skip STEP's update, the --nonfinite=skip reference)]\n"
               "  [--broadcast-after STEP:ROOT (a checked gs_broadcast after STEP)]\n"
               "  [--check-replicas (gs_check_replicas when gs_job_info says it is due)]\n"
               "  elastic jobs: [--catch-up (a joiner receives the state from the catch-up\n"
               "  root, the others send it when nodes or trainers join)] [--rejoin-at STEP\n"
               "  (--single: ranks past\n"
               "  their --join-steps are active again from STEP)] [--rejoin-ranks R0,R1,...\n"
               "  (only these ranks are)] [--shard-world N (shards of\n"
               "  --batch / N, whatever the world size)]\n"
               "  (LOCAL_RANK selects the trainer's local rank)\n");
}

// --poison RANK:STEP[:VALUE[:INDEX[:TENSOR]]] (VALUE: nan, inf, -inf, ...;
// default nan; INDEX into parameter TENSOR, by registration index: default
// 5 into 0, fc1.weight).
bool ParsePoison(const char* arg, Options& opt) {
  char* end = nullptr;
  opt.poison_rank = static_cast<int>(std::strtol(arg, &end, 10));
  if (*end != ':') return false;
  opt.poison_step = static_cast<int>(std::strtol(end + 1, &end, 10));
  if (*end == ':') opt.poison_value = std::strtod(end + 1, &end);
  if (*end == ':') opt.poison_index = std::strtoul(end + 1, &end, 10);
  if (*end == ':') opt.poison_tensor = static_cast<int>(std::strtol(end + 1, &end, 10));
  return *end == '\0' && opt.poison_tensor >= 0 && opt.poison_tensor < Model<float>::kCount;
}

// --broadcast-after STEP:ROOT.
bool ParseBroadcastAfter(const char* arg, Options& opt) {
  char* end = nullptr;
  opt.broadcast_step = static_cast<int>(std::strtol(arg, &end, 10));
  if (*end != ':') return false;
  opt.broadcast_root = static_cast<int>(std::strtol(end + 1, &end, 10));
  return *end == '\0' && opt.broadcast_step >= 0 && opt.broadcast_root >= 0;
}

// N0,N1,...: --join-steps (the steps of each rank, then gs_join) and
// --rejoin-ranks.
bool ParseCounts(const char* arg, std::vector<int>* out) {
  for (const char* p = arg;;) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n < 0) return false;
    out->push_back(static_cast<int>(n));
    if (*end != ',') return true;
    p = end + 1;
  }
}

enum class Flag { kTaken, kUnknown, kBadValue };

// One of the flags the example trainer has too.
Flag TrainingFlag(int ch, const char* arg, Options& opt) {
  switch (ch) {
    case 's':
      opt.steps = std::atoi(arg);
      break;
    case 'b':
      opt.batch = std::atoi(arg);
      break;
    case 'H':
      opt.hidden = std::atoi(arg);
      break;
    case 'D':
      opt.dim = std::atoi(arg);
      break;
    case 'l':
      opt.lr = std::atof(arg);
      break;
    case '6':
      opt.fp64 = true;
      break;
    case '1':
      opt.single = true;
      break;
    case 'a':
      opt.accumulate = std::max(1, std::atoi(arg));
      break;
    case 'o':
      opt.out = arg;
      break;
    case 'S':
      opt.socket = arg;
      break;
    case 'q':
      opt.quiet = true;
      break;
    default:
      return Flag::kUnknown;
  }
  return Flag::kTaken;
}

// One of the flags that fault the trainer or reach a corner of the C ABI.
Flag FaultFlag(int ch, const char* arg, Options& opt) {
  switch (ch) {
    case 'g':
      opt.gate_every = std::atoi(arg);
      break;
    case 'G':
      opt.gate_unused_first = std::atoi(arg);
      break;
    case 'u':
      opt.stale_unused = true;
      break;
    case 'r':
      opt.shuffle_seed = static_cast<unsigned>(std::atoi(arg));
      break;
    case 'z':
      opt.sleep_ms = std::atoi(arg);
      break;
    case 'w':
      opt.wait_timeout_ms = std::atoll(arg);
      break;
    case 'x':
      opt.extra_tensor = arg;
      break;
    case 'L':
      opt.print_loss = true;
      break;
    case 'W':
      opt.withhold = std::atoi(arg);
      break;
    case 'P':
      opt.pause_at = arg;
      break;
    case 'A':
      opt.write_after_mark = true;
      break;
    case 'J':
      return ParseCounts(arg, &opt.join_steps) ? Flag::kTaken : Flag::kBadValue;
    case 'j':
      opt.join_divide_by_active = true;
      break;
    case 'K':
      opt.after_join = arg;
      break;
    case 'N':
      return ParsePoison(arg, opt) ? Flag::kTaken : Flag::kBadValue;
    case 'B':
      return ParseBroadcastAfter(arg, opt) ? Flag::kTaken : Flag::kBadValue;
    case 'C':
      opt.check_replicas = true;
      break;
    case 'U':
      opt.catch_up = true;
      break;
    case 'R':
      opt.rejoin_at = std::atoi(arg);
      break;
    case 'k':
      return ParseCounts(arg, &opt.rejoin_ranks) ? Flag::kTaken : Flag::kBadValue;
    case 'Y':
      opt.shard_world = std::atoi(arg);
      break;
    default:
      return Flag::kUnknown;
  }
  return Flag::kTaken;
}

// The command line into `opt`; false (after a usage message where the flag
// is unknown) when it does not parse.
bool ParseFlags(int argc, char** argv, Options& opt) {
  static option longopts[] = {{"steps", required_argument, nullptr, 's'},
                              {"batch", required_argument, nullptr, 'b'},
                              {"hidden", required_argument, nullptr, 'H'},
                              {"dim", required_argument, nullptr, 'D'},
                              {"lr", required_argument, nullptr, 'l'},
                              {"fp64", no_argument, nullptr, '6'},
                              {"single", no_argument, nullptr, '1'},
                              {"accumulate", required_argument, nullptr, 'a'},
                              {"gate-every", required_argument, nullptr, 'g'},
                              {"gate-unused-first", required_argument, nullptr, 'G'},
                              {"stale-unused", no_argument, nullptr, 'u'},
                              {"shuffle-seed", required_argument, nullptr, 'r'},
                              {"sleep-ms", required_argument, nullptr, 'z'},
                              {"out", required_argument, nullptr, 'o'},
                              {"socket", required_argument, nullptr, 'S'},
                              {"wait-timeout-ms", required_argument, nullptr, 'w'},
                              {"extra-tensor", required_argument, nullptr, 'x'},
                              {"quiet", no_argument, nullptr, 'q'},
                              {"print-loss", no_argument, nullptr, 'L'},
                              {"withhold", required_argument, nullptr, 'W'},
                              {"pause-at", required_argument, nullptr, 'P'},
                              {"write-after-mark", no_argument, nullptr, 'A'},
                              {"join-steps", required_argument, nullptr, 'J'},
                              {"join-divide-by-active", no_argument, nullptr, 'j'},
                              {"after-join", required_argument, nullptr, 'K'},
                              {"poison", required_argument, nullptr, 'N'},
                              {"broadcast-after", required_argument, nullptr, 'B'},
                              {"check-replicas", no_argument, nullptr, 'C'},
                              {"catch-up", no_argument, nullptr, 'U'},
                              {"rejoin-at", required_argument, nullptr, 'R'},
                              {"rejoin-ranks", required_argument, nullptr, 'k'},
                              {"shard-world", required_argument, nullptr, 'Y'},
                              {nullptr, 0, nullptr, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
    Flag flag = TrainingFlag(ch, optarg, opt);
    if (flag == Flag::kUnknown) flag = FaultFlag(ch, optarg, opt);
    if (flag == Flag::kBadValue) return false;
    if (flag == Flag::kUnknown) {
      PrintUsage();
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!ParseFlags(argc, argv, opt)) return 2;
  return opt.fp64 ? Run<double>(opt) : Run<float>(opt);
}
