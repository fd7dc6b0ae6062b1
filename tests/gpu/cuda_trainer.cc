// cuda_trainer: sim_trainer's check on a real GPU, through the exported C
// ABI only (libgradsync's gs_*), as a framework would use it: gradients
// written by work queued on the trainer's own stream (cudaMemcpyAsync from
// pinned memory), gs_mark_ready right after queueing — no synchronize —
// and every synced step compared with the average over all trainers.
//
//   cuda_trainer --socket=S [--mode=flat|user] [--dtype=fp32|bf16] [--steps=N]
//                [--device=ORD] [--die-at-step=N [--die-after-marks=K]] [--withhold=I]
//                [--tensors=N] [--switch-stream-at=K] [--inf-at=R:S:I:J]
//                [--broadcast-root=R --broadcast-bytes=N]
//                [--pause-at=S:K] [--members-from=S:R,R,...]
//                [--catch-up --members-before-join=R,... --members-after-join=R,...]
//
// --die-at-step: SIGKILL itself in that step after marking two gradients
// (a trainer dying mid-iteration; its peers must get GS_ERR_PEER_FAILED),
// or --die-after-marks=K of them (K = the tensor count: after every mark,
// its stream synchronized first).
// --withhold: after step 0, never mark tensor I (still waits): the bucket
// holding it is never reduced on this node, so a peer node's collective
// for it spins until the timeout aborts it.
// --tensors: N small tensors instead of the model's (more than the client's
// pool of readiness events); --switch-stream-at: from the K-th mark of each
// step on, writes and marks go to a second stream.
// --broadcast-root: before the first step, gs_broadcast a device buffer of
// --broadcast-bytes (cudaMalloc'ed, written on the trainer's stream right
// before the call, not synchronized) from rank R, and check every byte.
// --inf-at: rank R writes +Inf at element J of tensor I in step S (the
// daemon's --nonfinite=error must then fail every trainer naming it).
// --pause-at: in step S, after K marks (K = the tensor count: after every
// mark, before gs_wait), synchronize the stream, print "paused at step S"
// and stop (SIGSTOP) until a test continues it (an elastic job's node is
// killed meanwhile). --members-from: from step S on, each result is the
// average over ranks R,... only (the survivors of an elastic job), and
// gs_get_job_info's world size must say so.
// --catch-up: nodes joining the running job, or a restarted trainer taking
// back its local rank. Every trainer keeps fp64 weights (SGD on the
// results); a joiner's trainer (gs_job_info's joined_running_job) starts at
// the job's iteration m after receiving the state of gs_job_info's
// catch_up_root ([iteration][weights], by gs_broadcast of a device buffer),
// which must be at m and within the tolerance of its own reference up to
// m; the others send it after the step whose gs_wait made nodes_joined or
// trainers_joined grow (step m-1). Steps before m average over --members-before-join, from
// m on over --members-after-join. Every trainer prints its weights' hash.
//
// Exit codes as sim_trainer: 0 matched; 1 a result differed; 2 a call
// failed ("error code=N: message"); 3 bad flags or no usable GPU.
#include <cuda_runtime_api.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "client/gradsync.h"
#include "common/half.h"

namespace {

struct Tensor {
  const char* name;
  uint64_t numel;
};
std::vector<Tensor> kTensors = {{"embed", 70000},
                                {"fc1.weight", 262144},
                                {"fc1.bias", 513},
                                {"fc2.weight", 4096},
                                {"fc2.bias", 1}};
std::vector<std::string> generated_names;  // --tensors: owns the names

float Grad(int r, int step, size_t i, size_t j) {
  return std::sin(0.37f * static_cast<float>(j % 1000 + 1) + 0.7f * static_cast<float>(i)) *
             static_cast<float>(1 + r) +
         0.01f * static_cast<float>(step);
}

int Fail(gs_client* c, gs_status st, const char* what) {
  std::printf("error code=%d: %s: %s\n", static_cast<int>(st), what, gs_last_error(c));
  std::fflush(stdout);
  return 2;
}

int CudaFail(cudaError_t e, const char* what) {
  std::printf("cuda error in %s: %s\n", what, cudaGetErrorString(e));
  std::fflush(stdout);
  return 3;
}

unsigned char BroadcastByte(int rank, size_t i) {
  return static_cast<unsigned char>((i * 131 + static_cast<size_t>(rank) * 17 + i / 4096) & 0xff);
}

// gs_broadcast of a device buffer of `bytes` from `root`; 0 when every
// byte of it is the root's afterwards.
int DeviceBroadcast(gs_client* c, cudaStream_t stream, int rank, int root, size_t bytes) {
  std::vector<unsigned char> host(bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = BroadcastByte(rank, i);
  void* buf = nullptr;
  if (cudaError_t e = cudaMalloc(&buf, bytes); e != cudaSuccess) return CudaFail(e, "cudaMalloc");
  // Queued on the stream gs_set_cuda_stream named: gs_broadcast's copies follow it.
  if (cudaError_t e = cudaMemcpyAsync(buf, host.data(), bytes, cudaMemcpyHostToDevice, stream);
      e != cudaSuccess) {
    return CudaFail(e, "cudaMemcpyAsync");
  }
  if (gs_status st = gs_broadcast(c, buf, bytes, root, -1); st != GS_OK) {
    return Fail(c, st, "gs_broadcast");
  }
  // gs_broadcast returned with the bytes in device memory.
  if (cudaError_t e = cudaMemcpy(host.data(), buf, bytes, cudaMemcpyDeviceToHost);
      e != cudaSuccess) {
    return CudaFail(e, "cudaMemcpy");
  }
  cudaFree(buf);
  for (size_t i = 0; i < bytes; ++i) {
    if (host[i] == BroadcastByte(root, i)) continue;
    std::printf("BROADCAST MISMATCH rank %d byte %zu: got %d expected %d\n", rank, i, host[i],
                BroadcastByte(root, i));
    std::fflush(stdout);
    return 1;
  }
  std::printf("broadcast ok rank %d device %zu\n", rank, bytes);
  std::fflush(stdout);
  return 0;
}

// Global ranks, comma-separated.
std::vector<int> ParseRanks(const std::string& v) {
  std::vector<int> out;
  for (size_t at = 0; at < v.size();) {
    const size_t comma = std::min(v.find(',', at), v.size());
    out.push_back(std::atoi(v.substr(at, comma - at).c_str()));
    at = comma + 1;
  }
  return out;
}

// --catch-up: the job's state, [iteration][every weight] (fp64), copied to
// a device buffer on `stream` and made rank `root`'s by gs_broadcast;
// *iteration and *weights become its. Returns 0, or the exit code.
int BroadcastState(gs_client* c, cudaStream_t stream, int root, uint64_t* iteration,
                   std::vector<std::vector<double>>* weights) {
  std::vector<double> state(1);
  std::memcpy(state.data(), iteration, sizeof(*iteration));
  for (const std::vector<double>& w : *weights) state.insert(state.end(), w.begin(), w.end());
  const size_t bytes = state.size() * sizeof(double);
  void* buf = nullptr;
  if (cudaError_t e = cudaMalloc(&buf, bytes); e != cudaSuccess) return CudaFail(e, "cudaMalloc");
  // Queued on the stream gs_set_cuda_stream named: gs_broadcast's copies follow it.
  if (cudaError_t e = cudaMemcpyAsync(buf, state.data(), bytes, cudaMemcpyHostToDevice, stream);
      e != cudaSuccess) {
    return CudaFail(e, "cudaMemcpyAsync");
  }
  if (gs_status st = gs_broadcast(c, buf, bytes, root, -1); st != GS_OK) {
    return Fail(c, st, "gs_broadcast of the job's state");
  }
  if (cudaError_t e = cudaMemcpy(state.data(), buf, bytes, cudaMemcpyDeviceToHost);
      e != cudaSuccess) {
    return CudaFail(e, "cudaMemcpy");
  }
  cudaFree(buf);
  std::memcpy(iteration, state.data(), sizeof(*iteration));
  size_t at = 1;
  for (std::vector<double>& w : *weights) {
    std::copy(state.begin() + at, state.begin() + at + w.size(), w.begin());
    at += w.size();
  }
  return 0;
}

// FNV-1a of every weight's bytes: replicas that trained alike hash alike.
uint64_t WeightsHash(const std::vector<std::vector<double>>& weights) {
  uint64_t h = 1469598103934665603ull;
  for (const std::vector<double>& w : weights) {
    const auto* p = reinterpret_cast<const unsigned char*>(w.data());
    for (size_t k = 0; k < w.size() * sizeof(double); ++k) h = (h ^ p[k]) * 1099511628211ull;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket, mode = "flat", dtype_name = "fp32";
  int steps = 5, device = -1, die_at_step = -1, withhold = -1, tensors = 0, switch_at = -1;
  int die_after_marks = 2;
  int broadcast_root = -1;
  size_t broadcast_bytes = 0;
  int inf_rank = -1, inf_step = -1, inf_tensor = -1;
  long long inf_element = -1;
  int pause_step = -1, pause_marks = 0, members_from = -1;
  std::vector<int> members;
  bool catch_up = false;
  std::vector<int> members_before_join, members_after_join;
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      v = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--socket")
      socket = v;
    else if (key == "--mode")
      mode = v;
    else if (key == "--steps")
      steps = std::atoi(v.c_str());
    else if (key == "--device")
      device = std::atoi(v.c_str());
    else if (key == "--dtype")
      dtype_name = v;
    else if (key == "--die-at-step")
      die_at_step = std::atoi(v.c_str());
    else if (key == "--die-after-marks")
      die_after_marks = std::atoi(v.c_str());
    else if (key == "--withhold")
      withhold = std::atoi(v.c_str());
    else if (key == "--tensors")
      tensors = std::atoi(v.c_str());
    else if (key == "--switch-stream-at")
      switch_at = std::atoi(v.c_str());
    else if (key == "--broadcast-root")
      broadcast_root = std::atoi(v.c_str());
    else if (key == "--broadcast-bytes")
      broadcast_bytes = std::strtoull(v.c_str(), nullptr, 10);
    else if (key == "--inf-at") {
      if (std::sscanf(v.c_str(), "%d:%d:%d:%lld", &inf_rank, &inf_step, &inf_tensor,
                      &inf_element) != 4) {
        return 3;
      }
    } else if (key == "--pause-at") {
      if (std::sscanf(v.c_str(), "%d:%d", &pause_step, &pause_marks) != 2) return 3;
    } else if (key == "--catch-up") {
      catch_up = true;
    } else if (key == "--members-before-join") {
      members_before_join = ParseRanks(v);
    } else if (key == "--members-after-join") {
      members_after_join = ParseRanks(v);
    } else if (key == "--members-from") {
      const size_t colon = v.find(':');
      if (colon == std::string::npos) return 3;
      members_from = std::atoi(v.substr(0, colon).c_str());
      members = ParseRanks(v.substr(colon + 1));
    } else
      return 3;
  }
  if (dtype_name != "fp32" && dtype_name != "bf16") return 3;
  if (tensors > 0) {
    // Many small tensors: more than the client's pool of readiness events.
    generated_names.clear();
    for (int i = 0; i < tensors; ++i) generated_names.push_back("p" + std::to_string(i));
    kTensors.clear();
    for (int i = 0; i < tensors; ++i) {
      kTensors.push_back({generated_names[i].c_str(), static_cast<uint64_t>(1 + i % 37)});
    }
  }
  const size_t kNum = kTensors.size();
  const bool bf16 = dtype_name == "bf16";
  const gs_dtype dtype = bf16 ? GS_BFLOAT16 : GS_FLOAT32;
  const size_t elem = bf16 ? 2 : 4;
  const char* lr = std::getenv("LOCAL_RANK");
  const int local_rank = lr ? std::atoi(lr) : 0;
  int gpus = 0;
  if (cudaError_t e = cudaGetDeviceCount(&gpus); e != cudaSuccess || gpus == 0) {
    return CudaFail(e == cudaSuccess ? cudaErrorNoDevice : e, "cudaGetDeviceCount");
  }
  if (device < 0) device = local_rank % gpus;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaFail(e, "cudaSetDevice");
  cudaStream_t stream, second;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaFail(e, "cudaStreamCreate");
  }
  // --switch-stream-at: marks from then on are recorded on a second stream
  // (pooled readiness events re-recorded across streams).
  if (cudaError_t e = cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaFail(e, "cudaStreamCreate");
  }

  gs_connect_options opts = GS_CONNECT_OPTIONS_INIT;
  opts.socket_path = socket.empty() ? nullptr : socket.c_str();
  opts.local_rank = local_rank;
  opts.timeout_ms = 30000;
  gs_client* c = nullptr;
  if (gs_status st = gs_connect(&opts, &c); st != GS_OK) return Fail(c, st, "gs_connect");
  if (gs_status st = gs_set_cuda_stream(c, stream); st != GS_OK)
    return Fail(c, st, "gs_set_cuda_stream");

  // User pointer: one allocation, sub-allocated (one exported base).
  void* pool = nullptr;
  std::vector<gs_tensor_spec> specs;
  uint64_t offset = 0;
  if (mode == "user") {
    uint64_t total = 0;
    for (const Tensor& t : kTensors) total += (t.numel * elem + 511) / 512 * 512;
    if (cudaError_t e = cudaMalloc(&pool, total); e != cudaSuccess)
      return CudaFail(e, "cudaMalloc");
  }
  for (const Tensor& t : kTensors) {
    void* p = pool ? static_cast<char*>(pool) + offset : nullptr;
    offset += (t.numel * elem + 511) / 512 * 512;
    specs.push_back({t.name, dtype, t.numel, device, p});
  }
  if (gs_status st = gs_register(c, specs.data(), specs.size()); st != GS_OK) {
    return Fail(c, st, "gs_register");
  }
  int rank = 0, world = 1;
  gs_world(c, &rank, &world);
  if (broadcast_root >= 0) {
    if (int rc = DeviceBroadcast(c, stream, rank, broadcast_root, broadcast_bytes); rc != 0) {
      return rc;
    }
  }

  // What a trainer's gradient holds as stored in the dtype (bf16 rounds).
  auto stored = [bf16](float v) {
    return bf16 ? gradsync::BFloat16ToFloat(gradsync::FloatToBFloat16(v)) : v;
  };
  // One pinned region (thousands of tensors: one cudaMallocHost).
  std::vector<void*> pinned(kNum);
  uint64_t pinned_bytes = 0;
  for (const Tensor& t : kTensors) pinned_bytes += (t.numel * elem + 15) / 16 * 16;
  void* pinned_region = nullptr;
  if (cudaError_t e = cudaMallocHost(&pinned_region, pinned_bytes); e != cudaSuccess) {
    return CudaFail(e, "cudaMallocHost");
  }
  for (size_t i = 0, at = 0; i < kNum; ++i) {
    pinned[i] = static_cast<char*>(pinned_region) + at;
    at += (kTensors[i].numel * elem + 15) / 16 * 16;
  }
  std::vector<unsigned char> raw;
  // bf16: the device sums in fp32 and rounds once; fp32: only summation order.
  const double tolerance = bf16 ? 1e-2 : 1e-5;
  // The ranks step `step` averages over: all, the survivors, or those
  // before/after nodes joined at `join_at` (-1 while none did).
  int join_at = -1;
  auto members_of = [&](int step) {
    if (!members_before_join.empty() && (join_at < 0 || step < join_at)) {
      return members_before_join;
    }
    if (!members_after_join.empty() && join_at >= 0 && step >= join_at) {
      return members_after_join;
    }
    if (members_from >= 0 && step >= members_from) return members;
    std::vector<int> all;
    for (int r = 0; r < world; ++r) all.push_back(r);
    return all;
  };
  auto expected_average = [&](const std::vector<int>& in_step, int step, size_t i, size_t j) {
    double expected = 0;
    for (int r : in_step) expected += stored(Grad(r, step, i, j));
    return expected / static_cast<double>(in_step.size());
  };
  // SGD in fp64 on the results, and on the expected averages.
  std::vector<std::vector<double>> weights(kNum), reference(kNum);
  for (size_t i = 0; i < kNum; ++i) weights[i].assign(kTensors[i].numel, 1.0);
  reference = weights;
  gs_job_info joined = GS_JOB_INFO_INIT;
  if (gs_status st = gs_get_job_info(c, &joined); st != GS_OK)
    return Fail(c, st, "gs_get_job_info");
  uint64_t nodes_joined = joined.nodes_joined;
  uint64_t trainers_joined = joined.trainers_joined;
  if (catch_up && joined.joined_running_job) {
    join_at = static_cast<int>(joined.iteration);
    for (int step = 0; step < join_at; ++step) {
      const std::vector<int> in_step = members_of(step);
      for (size_t i = 0; i < kNum; ++i) {
        for (size_t j = 0; j < kTensors[i].numel; ++j) {
          reference[i][j] -= 0.1 * expected_average(in_step, step, i, j);
        }
      }
    }
    uint64_t iteration = joined.iteration;
    const int root = joined.catch_up_root;
    if (int rc = BroadcastState(c, stream, root, &iteration, &weights); rc != 0) return rc;
    if (iteration != joined.iteration) {
      std::printf("CATCH-UP MISMATCH rank %d: rank %d is at iteration %llu, this trainer at %d\n",
                  rank, root, static_cast<unsigned long long>(iteration), join_at);
      std::fflush(stdout);
      return 1;
    }
    for (size_t i = 0; i < kNum; ++i) {
      for (size_t j = 0; j < kTensors[i].numel; ++j) {
        const double want = reference[i][j], got = weights[i][j];
        if (std::fabs(got - want) <= 10 * tolerance * std::max(1.0, std::fabs(want))) continue;
        std::printf("CATCH-UP MISMATCH rank %d tensor %zu element %zu: got %.9g expected %.9g\n",
                    rank, i, j, got, want);
        std::fflush(stdout);
        return 1;
      }
    }
    std::printf(
        "rank %d joined the running job at iteration %d: state from rank %d, world size %d\n", rank,
        join_at, root, joined.world_size);
    std::fflush(stdout);
  }
  for (int step = std::max(join_at, 0); step < steps; ++step) {
    cudaStream_t current = stream;
    if (gs_status st = gs_set_cuda_stream(c, current); st != GS_OK)
      return Fail(c, st, "gs_set_cuda_stream");
    auto maybe_pause = [&](size_t marks) -> int {
      if (step != pause_step || static_cast<int>(marks) != pause_marks) return 0;
      // The marks so far complete before this process stops.
      if (cudaError_t e = cudaStreamSynchronize(current); e != cudaSuccess) {
        return CudaFail(e, "cudaStreamSynchronize");
      }
      std::printf("rank %d paused at step %d after %zu marks\n", rank, step, marks);
      std::fflush(stdout);
      raise(SIGSTOP);
      return 0;
    };
    for (size_t k = 0; k < kNum; ++k) {
      const size_t i = kNum - 1 - k;  // backward: last layer first
      if (int rc = maybe_pause(k); rc != 0) return rc;
      if (static_cast<int>(k) == switch_at) {
        current = second;
        if (gs_status st = gs_set_cuda_stream(c, current); st != GS_OK)
          return Fail(c, st, "gs_set_cuda_stream");
      }
      if (step == die_at_step && static_cast<int>(k) == die_after_marks) {
        std::printf("rank %d dying at step %d after %zu marks\n", rank, step, k);
        std::fflush(stdout);
        raise(SIGKILL);
      }
      for (size_t j = 0; j < kTensors[i].numel; ++j) {
        const bool inf = rank == inf_rank && step == inf_step &&
                         static_cast<int>(i) == inf_tensor &&
                         static_cast<long long>(j) == inf_element;
        const float g = inf ? std::numeric_limits<float>::infinity() : Grad(rank, step, i, j);
        if (bf16) {
          static_cast<uint16_t*>(pinned[i])[j] = gradsync::FloatToBFloat16(g);
        } else {
          static_cast<float*>(pinned[i])[j] = g;
        }
      }
      if (cudaError_t e = cudaMemcpyAsync(gs_grad_buffer(c, i), pinned[i], kTensors[i].numel * elem,
                                          cudaMemcpyHostToDevice, current);
          e != cudaSuccess) {
        return CudaFail(e, "cudaMemcpyAsync");
      }
      if (step > 0 && static_cast<int>(i) == withhold) continue;
      if (gs_status st = gs_mark_ready(c, i); st != GS_OK) return Fail(c, st, "gs_mark_ready");
    }
    if (int rc = maybe_pause(kNum); rc != 0) return rc;
    if (step == die_at_step && static_cast<size_t>(die_after_marks) == kNum) {
      // Dead after its last mark, with its gradients complete.
      if (cudaError_t e = cudaStreamSynchronize(current); e != cudaSuccess) {
        return CudaFail(e, "cudaStreamSynchronize");
      }
      std::printf("rank %d dying at step %d after all %zu marks\n", rank, step, kNum);
      std::fflush(stdout);
      raise(SIGKILL);
    }
    if (gs_status st = gs_wait(c, -1); st != GS_OK) return Fail(c, st, "gs_wait");
    const std::vector<int> in_step = members_of(step);
    gs_job_info info = GS_JOB_INFO_INIT;
    if (gs_status st = gs_get_job_info(c, &info); st != GS_OK)
      return Fail(c, st, "gs_get_job_info");
    if (info.world_size != static_cast<int>(in_step.size())) {
      std::printf("WORLD MISMATCH rank %d step %d: the daemon divided by %d, expected %zu\n", rank,
                  step, info.world_size, in_step.size());
      std::fflush(stdout);
      return 1;
    }
    for (size_t i = 0; i < kNum; ++i) {
      raw.resize(kTensors[i].numel * elem);
      if (cudaError_t e =
              cudaMemcpy(raw.data(), gs_grad_buffer(c, i), raw.size(), cudaMemcpyDeviceToHost);
          e != cudaSuccess) {
        return CudaFail(e, "cudaMemcpy");
      }
      for (size_t j = 0; j < kTensors[i].numel; ++j) {
        const double expected = expected_average(in_step, step, i, j);
        float value;
        if (bf16) {
          uint16_t b;
          std::memcpy(&b, raw.data() + j * 2, 2);
          value = gradsync::BFloat16ToFloat(b);
        } else {
          std::memcpy(&value, raw.data() + j * 4, 4);
        }
        if (std::fabs(value - expected) > tolerance * std::max(1.0, std::fabs(expected))) {
          std::printf(
              "MISMATCH rank %d step %d tensor %zu '%s' element %zu: got %.7g expected %.7g\n",
              rank, step, i, kTensors[i].name, j, value, expected);
          std::fflush(stdout);
          return 1;
        }
        weights[i][j] -= 0.1 * value;
        reference[i][j] -= 0.1 * expected;
      }
    }
    const bool nodes_came = info.nodes_joined != nodes_joined;
    if (catch_up && (nodes_came || info.trainers_joined != trainers_joined)) {
      // Nodes or restarted trainers join at the next iteration: they get
      // this state.
      nodes_joined = info.nodes_joined;
      trainers_joined = info.trainers_joined;
      join_at = step + 1;
      uint64_t iteration = info.iteration;
      if (int rc = BroadcastState(c, stream, info.catch_up_root, &iteration, &weights); rc != 0) {
        return rc;
      }
      std::printf("rank %d: %s joined after iteration %llu: state sent from rank %d\n", rank,
                  nodes_came ? "nodes" : "trainers", static_cast<unsigned long long>(iteration),
                  info.catch_up_root);
      std::fflush(stdout);
    }
  }
  std::printf("weights %016llx\n", static_cast<unsigned long long>(WeightsHash(weights)));
  std::printf("OK rank %d world %d steps %d\n", rank, world, steps);
  std::fflush(stdout);
  gs_close(c);
  cudaFreeHost(pinned_region);
  if (pool) cudaFree(pool);  // only after gs_close returned (gradsync.h)
  return 0;
}
