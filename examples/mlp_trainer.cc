// mlp_trainer: a small data-parallel trainer with no ML framework, written
// against gradsync's C ABI (client/gradsync.h). The model and its
// hand-written backward are in mlp_training.h.
//
// Each of N trainers computes the mean gradient over its 1/N shard of every
// global batch, writing each gradient straight into gradsync's shared memory
// and marking it ready as soon as it is final; gradsync averages them, so
// the weights follow exactly what one process training on the whole batch
// computes. `--single` runs that reference in-process (no daemon) for
// comparison. LOCAL_RANK selects the trainer's local rank.
//
// --checkpoint FILE: rank 0 saves the weights and the next step there every
// --checkpoint-every steps; a trainer started when FILE exists resumes
// from it (restarting a job from its last checkpoint). --timestamps adds
// to rank 0's step lines when the step completed on the monotonic clock
// (tests/bench/elastic_recovery_bench.py times recoveries with it).
#include <getopt.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "client/gradsync.h"
#include "examples/mlp_training.h"

namespace {

struct Options {
  int steps = 20;
  int batch = 64;  // global batch per step (split across trainers)
  int dim = 16;
  int hidden = 32;
  double lr = 0.1;
  int accumulate = 1;  // micro-batches per optimizer step (no_sync for the first k-1)
  bool fp64 = false;
  bool single = false;  // reference: one process, whole batch, no daemon
  bool quiet = false;
  std::string socket;
  std::string out;  // write final parameters here
  std::string checkpoint;
  int checkpoint_every = 1;
  bool timestamps = false;
};

long long MonotonicMicros() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<long long>(t.tv_sec) * 1000000 + t.tv_nsec / 1000;
}

// The step to start at: 0, or the checkpoint's when --checkpoint names an
// existing file (loaded into `model`); -1 when that file cannot be loaded.
template <typename T>
int StartStep(const Options& opt, mlp::Model<T>& model) {
  if (opt.checkpoint.empty()) return 0;
  FILE* probe = std::fopen(opt.checkpoint.c_str(), "r");
  if (!probe) return 0;
  std::fclose(probe);
  int next_step = 0;
  return mlp::LoadCheckpoint(model, &next_step, opt.checkpoint) ? next_step : -1;
}

template <typename T>
int Run(const Options& opt) {
  using Model = mlp::Model<T>;
  Model model(opt.dim, opt.hidden);
  std::vector<std::vector<T>> local_grads(Model::kCount);
  T* grads[Model::kCount];
  gs_client* c = nullptr;
  int rank = 0, world = 1;
  if (opt.single) {
    for (int p = 0; p < Model::kCount; ++p) {
      local_grads[p].assign(model.params[p].size(), T(0));
      grads[p] = local_grads[p].data();
    }
  } else {
    // Connect, then register the gradients: they then live in gradsync's
    // shared memory, where backward writes them.
    gs_connect_options co{};
    co.socket_path = opt.socket.empty() ? nullptr : opt.socket.c_str();
    co.local_rank = -1;  // from $LOCAL_RANK
    co.timeout_ms = 10000;
    if (gs_status st = gs_connect(&co, &c); st != GS_OK) return mlp::Die(c, "gs_connect", st);
    const std::vector<gs_tensor_spec> specs = mlp::TensorSpecs(model);
    if (gs_status st = gs_register(c, specs.data(), specs.size()); st != GS_OK) {
      return mlp::Die(c, "gs_register", st);
    }
    if (gs_status st = gs_world(c, &rank, &world); st != GS_OK) return mlp::Die(c, "gs_world", st);
    for (int p = 0; p < Model::kCount; ++p) grads[p] = static_cast<T*>(gs_grad_buffer(c, p));
  }
  if (opt.batch % world != 0) {
    std::fprintf(stderr, "mlp_trainer: --batch %d is not divisible by the world size %d\n",
                 opt.batch, world);
    if (c) gs_close(c);
    return 2;
  }
  const int shard = opt.batch / world;
  const int start = StartStep(opt, model);
  if (start < 0) {
    if (c) gs_close(c);
    return 2;
  }
  for (int step = start; step < opt.steps; ++step) {
    double loss = 0;
    for (int micro = 0; micro < opt.accumulate; ++micro) {
      // Only the last micro-batch is reduced; the others accumulate locally.
      const bool sync = micro == opt.accumulate - 1;
      if (c) {
        if (gs_status st = gs_set_sync(c, sync ? 1 : 0); st != GS_OK) {
          return mlp::Die(c, "gs_set_sync", st);
        }
      }
      gs_status marked = GS_OK;
      auto mark_ready = [&](int p) {
        if (c && marked == GS_OK) marked = gs_mark_ready(c, p);
      };
      const mlp::Samples samples{step, micro, rank * shard, (rank + 1) * shard, double(shard)};
      loss += mlp::Backward(model, samples, grads, mlp::BackwardOrder(), mark_ready);
      if (marked != GS_OK) return mlp::Die(c, "gs_mark_ready", marked);
      // Blocks until every gradient holds the average over all trainers.
      if (c) {
        if (gs_status st = gs_wait(c, -1); st != GS_OK) return mlp::Die(c, "gs_wait", st);
      }
    }
    mlp::SgdStep(model, grads, opt.lr, /*apply=*/true);
    if (rank == 0 && !opt.checkpoint.empty() && (step + 1) % opt.checkpoint_every == 0 &&
        !mlp::SaveCheckpoint(model, step + 1, opt.checkpoint)) {
      std::fprintf(stderr, "mlp_trainer: cannot write the checkpoint %s\n", opt.checkpoint.c_str());
      if (c) gs_close(c);
      return 3;
    }
    if (!opt.quiet && rank == 0) {
      std::printf("step %3d  loss %.6f  (rank %d of %d)", step,
                  loss / (double(shard) * opt.accumulate), rank, world);
      if (opt.timestamps) std::printf(" mono_us=%lld", MonotonicMicros());
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (!opt.quiet) {
    std::printf("rank %d final weights checksum %.15g\n", rank, mlp::Checksum(model));
  }
  if (c) gs_close(c);
  if (!opt.out.empty() && !mlp::WriteWeights(model, opt.out)) return 3;
  return 0;
}

// The command line into `opt`; false (after a usage message) when it does
// not parse.
bool ParseFlags(int argc, char** argv, Options& opt) {
  static option longopts[] = {{"steps", required_argument, nullptr, 's'},
                              {"batch", required_argument, nullptr, 'b'},
                              {"hidden", required_argument, nullptr, 'H'},
                              {"dim", required_argument, nullptr, 'D'},
                              {"lr", required_argument, nullptr, 'l'},
                              {"accumulate", required_argument, nullptr, 'a'},
                              {"fp64", no_argument, nullptr, '6'},
                              {"single", no_argument, nullptr, '1'},
                              {"quiet", no_argument, nullptr, 'q'},
                              {"socket", required_argument, nullptr, 'S'},
                              {"out", required_argument, nullptr, 'o'},
                              {"checkpoint", required_argument, nullptr, 'c'},
                              {"checkpoint-every", required_argument, nullptr, 'e'},
                              {"timestamps", no_argument, nullptr, 't'},
                              {nullptr, 0, nullptr, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
    switch (ch) {
      case 's':
        opt.steps = std::atoi(optarg);
        break;
      case 'b':
        opt.batch = std::atoi(optarg);
        break;
      case 'H':
        opt.hidden = std::atoi(optarg);
        break;
      case 'D':
        opt.dim = std::atoi(optarg);
        break;
      case 'l':
        opt.lr = std::atof(optarg);
        break;
      case 'a':
        opt.accumulate = std::max(1, std::atoi(optarg));
        break;
      case '6':
        opt.fp64 = true;
        break;
      case '1':
        opt.single = true;
        break;
      case 'q':
        opt.quiet = true;
        break;
      case 'S':
        opt.socket = optarg;
        break;
      case 'o':
        opt.out = optarg;
        break;
      case 'c':
        opt.checkpoint = optarg;
        break;
      case 'e':
        opt.checkpoint_every = std::max(1, std::atoi(optarg));
        break;
      case 't':
        opt.timestamps = true;
        break;
      default:
        std::fprintf(stderr,
                     "usage: mlp_trainer [--steps N] [--batch N] [--hidden N] [--dim N] [--lr X]\n"
                     "  [--accumulate K] [--fp64] [--single] [--quiet] [--socket PATH]\n"
                     "  [--out FILE] [--checkpoint FILE] [--checkpoint-every N] [--timestamps]\n"
                     "  (LOCAL_RANK selects the trainer's local rank)\n");
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
