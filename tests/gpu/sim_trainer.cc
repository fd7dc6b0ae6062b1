// sim_trainer: a data-parallel trainer with CUDA gradients on the simulated
// device (gpu/sim/sim_device), driving the C++ client the way a framework
// drives libgradsync: its backward "kernels" (WriteAsync on its stream)
// write each gradient, it marks the gradient ready at once — without
// synchronizing its stream — and waits for the iteration.
//
// Every trainer knows every rank's gradients (deterministic functions of
// rank, step, micro-step, tensor, element), so after each synced step it
// checks its buffers against the sum over all trainers divided by the
// world size: exactly what one process on the whole batch would compute.
// The simulation maps device memory into the host, so results are read
// in place once gs_wait returned.
//
// Exit codes: 0 all steps matched; 1 a result differed (printed); 2 a call
// failed (printed as "error code=N: message"); 3 bad flags.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/half.h"
#include "common/status_code.h"
#include "gpu/sim/sim_device.h"

namespace {

using gradsync::DType;

struct Flags {
  std::string socket;
  std::string mode = "flat";  // flat | user
  DType dtype = DType::kFloat32;
  int device = -1;  // CUDA ordinal; -1: LOCAL_RANK % visible GPUs
  int steps = 6;
  int accumulate = 1;      // micro-steps per synced step (no_sync for the first k-1)
  int unused_every = 0;    // > 0: odd ranks leave "gate" unused every n-th micro-step
  int hold_stream_ms = 0;  // hold the stream's writes this long after marking
  unsigned shuffle_seed = 1;
  // SIGKILL self in this step after `die_after_marks` marks (the tensor
  // count: after every mark, its stream drained first).
  int die_at_step = -1;
  int die_after_marks = 2;
  // With --die-at-step: hold its stream from the start of that step (its
  // writes never run) and die without draining it: marked, never written.
  bool die_with_stream_held = false;
  // With --die-at-step, mid-backward: die only once the first tensor marked
  // in that step holds a result (its bucket was averaged and written back),
  // so that the death comes after part of the iteration was summed.
  bool die_once_averaged = false;
  // >= 0: stop self (SIGSTOP, after printing "paused at step S after K
  // marks") in this synced step after `pause_after_marks` marks (the
  // tensor count: after every mark, before gs_wait), for a test to SIGKILL
  // a node meanwhile and SIGCONT the survivors.
  int pause_at_step = -1;
  int pause_after_marks = 0;
  bool in_order = false;  // mark in reverse registration order every step (no shuffle)
  // An elastic job that lost a node: from this step on, each result is
  // the average over `members` (global ranks) only, and gs_get_job_info's
  // world size must say so.
  int members_from_step = -1;
  std::vector<int> members;
  // Nodes joining the running job, or a restarted trainer taking back its
  // local rank (--catch-up): a joiner's trainer starts at the job's
  // iteration m after receiving the state of gs_get_job_info's
  // catch_up_root (the iteration count and the weights, in device memory,
  // by gs_broadcast); the others send it once gs_get_job_info says nodes or
  // trainers joined (after step m-1). Each
  // step before m is the average over `members_before_join`, each from m on
  // over `members_after_join` (both lists of global ranks, or empty: every
  // rank of the world at registration).
  bool catch_up = false;
  std::vector<int> members_before_join;
  std::vector<int> members_after_join;
  bool mix = false;  // register a CPU and a CUDA tensor (must be refused)
  // > 0: a layout of this many small tensors "p<i>" instead of the model's
  // (more than the client's pool of readiness events).
  int tensors = 0;
  // > 0: "embed" has this many elements (a tensor larger than the daemon's
  // 1 MiB window for reading gradients back in a non-finite search).
  uint64_t embed_numel = 0;
  // >= 0: from this mark of each synced iteration on, writes and marks go
  // to a second stream, which --hold-stream-ms never holds: pooled
  // readiness events re-recorded there must still complete only after
  // the held stream's writes.
  int switch_stream_at = -1;
  // Under gradsyncd --check-replicas-every: keep host parameters (SGD on
  // the averaged gradients, equal on every trainer) and send their
  // fingerprints when a check is due; rank `drift_rank` perturbs
  // fc1.weight after step `drift_at` (a drifted replica).
  bool check_replicas = false;
  int drift_rank = -1;
  int drift_at = -1;
  // >= 0: gs_broadcast a host buffer of kBroadcastBytes from this rank
  // before the first step and after the first, checking the root's bytes
  // arrived (what DistributedOptimizer's constructor and broadcast_buffers
  // do with CUDA tensors, through the host).
  int broadcast_root = -1;
  // What --broadcast-root broadcasts at each point: "host" buffers,
  // "device" buffers (on this trainer's GPU, written on its stream right
  // before the call, never synchronized by the trainer), or "mix" (a host
  // then a device broadcast), of each of these sizes.
  std::string broadcast_memory = "host";
  std::vector<size_t> broadcast_sizes;
  // The root of the first device broadcast holds its stream (its copy of
  // piece 0 never runs) and SIGKILLs itself 300 ms into the broadcast.
  bool die_in_broadcast = false;
  // >= 0: rank `bad_rank` writes `bad_value` (nan or inf) at element
  // `bad_element` (-1: the last) of tensor `bad_tensor` in step `bad_step`;
  // `nonfinite` is the daemon's --nonfinite, what the trainer then expects:
  // error (gs_wait fails), skip (that step alone is skipped, everywhere) or
  // off (the value reaches every trainer's result). Under skip the trainer
  // also keeps host parameters (SGD on the results) next to a reference
  // that skipped the step, compares them at the end and prints their
  // fingerprint.
  int bad_rank = -1;
  int bad_step = -1;
  int bad_tensor = 0;
  int bad_element = 0;
  std::string bad_value = "nan";
  std::string nonfinite = "error";
};

// Two 4 MiB pieces and an odd tail.
constexpr size_t kBroadcastBytes = (5u << 20) + 3;

// Rank r's byte i before a broadcast.
unsigned char BroadcastByte(int r, size_t i) {
  return static_cast<unsigned char>((i * 131 + static_cast<size_t>(r) * 17 + i / 4096) & 0xff);
}

struct Tensor {
  std::string name;
  uint64_t numel;
};
// Several buckets with small caps; "gate" is last (first in reverse order).
std::vector<Tensor> kTensors = {{"embed", 700},      {"fc1.weight", 2048}, {"fc1.bias", 33},
                                {"fc2.weight", 512}, {"fc2.bias", 1},      {"gate", 3}};
const size_t kGate = 5;

// Rank r's gradient contribution at (step, micro), element j of tensor i.
// Polls simulated device memory (host-visible) until it no longer holds
// `written`: the daemon's write-back replaced it. False after 60 s.
bool WaitUntilOverwritten(const void* gradient, const void* written, size_t bytes) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::memcmp(gradient, written, bytes) == 0) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

float Grad(int r, int step, int micro, size_t i, size_t j) {
  return std::sin(0.37f * static_cast<float>(j + 1) + 0.7f * static_cast<float>(i)) *
             static_cast<float>(1 + r) +
         0.01f * static_cast<float>(step) + 0.003f * static_cast<float>(micro);
}

bool Used(const Flags& f, int r, int step, int micro, size_t i) {
  if (i != kGate || f.unused_every <= 0 || r % 2 == 0) return true;
  return (step * f.accumulate + micro) % f.unused_every != 0;
}

// What rank r's buffer holds once its step's micro-steps are written:
// the sum of its used contributions (unused ones add nothing), as stored
// in the dtype.
float Stored(const Flags& f, int r, int step, size_t i, size_t j) {
  float h = 0;
  for (int m = 0; m < f.accumulate; ++m) {
    if (Used(f, r, step, m, i)) h += Grad(r, step, m, i, j);
  }
  return f.dtype == DType::kBFloat16 ? gradsync::BFloat16ToFloat(gradsync::FloatToBFloat16(h)) : h;
}

// FNV-1a of the bytes: a parameter's fingerprint.
uint64_t Fingerprint(const std::vector<float>& values) {
  const auto* p = reinterpret_cast<const unsigned char*>(values.data());
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

int Error(const absl::Status& st);

// 0 when every byte of `got` is the root's.
int CheckBroadcast(const unsigned char* got, size_t bytes, const Flags& f, int rank,
                   const std::string& what) {
  for (size_t i = 0; i < bytes; ++i) {
    if (got[i] == BroadcastByte(f.broadcast_root, i)) continue;
    std::printf("BROADCAST MISMATCH rank %d %s byte %zu: got %d expected %d\n", rank, what.c_str(),
                i, got[i], BroadcastByte(f.broadcast_root, i));
    std::fflush(stdout);
    return 1;
  }
  return 0;
}

// gs_broadcast of a host buffer of `bytes` from f.broadcast_root.
int HostBroadcast(gradsync::Client& c, const Flags& f, int rank, size_t bytes,
                  const std::string& what) {
  std::vector<unsigned char> buf(bytes);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = BroadcastByte(rank, i);
  if (absl::Status st = c.Broadcast(buf.data(), buf.size(), f.broadcast_root, -1); !st.ok()) {
    return Error(st);
  }
  return CheckBroadcast(buf.data(), bytes, f, rank, what);
}

// The same with a device buffer on this trainer's GPU, written on `stream`
// (the client's) and not synchronized: the client's copies must follow it.
int DeviceBroadcast(gradsync::Client& c, gradsync::gpu::SimTrainerDevice& device,
                    const gradsync::gpu::DeviceId& id, gradsync::gpu::Stream* stream, Flags& f,
                    int rank, size_t bytes, const std::string& what) {
  auto buf = device.Alloc(id, std::max<size_t>(bytes, 1));
  if (!buf.ok()) return Error(buf.status());
  std::vector<unsigned char> mine(bytes);
  for (size_t i = 0; i < bytes; ++i) mine[i] = BroadcastByte(rank, i);
  if (bytes > 0) {
    if (absl::Status st = device.WriteAsync(*buf, mine.data(), bytes, stream); !st.ok()) {
      return Error(st);
    }
  }
  if (f.die_in_broadcast && rank == f.broadcast_root) {
    f.die_in_broadcast = false;
    gradsync::gpu::SimPauseStream(stream).IgnoreError();
    std::printf("dying in the broadcast of %zu bytes\n", bytes);
    std::fflush(stdout);
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }).detach();
  }
  if (absl::Status st = c.Broadcast(*buf, bytes, f.broadcast_root, -1); !st.ok()) {
    return Error(st);
  }
  // The client synchronized its stream after its last copy: read in place.
  const int rc = CheckBroadcast(static_cast<const unsigned char*>(*buf), bytes, f, rank, what);
  if (absl::Status st = device.Free(*buf); !st.ok()) return Error(st);
  return rc;
}

// Every broadcast of one point of the run ("at start", "between steps").
int BroadcastAndCheck(gradsync::Client& c, gradsync::gpu::SimTrainerDevice& device,
                      const gradsync::gpu::DeviceId& id, gradsync::gpu::Stream* stream, Flags& f,
                      int rank, const char* when) {
  const bool host = f.broadcast_memory != "device";
  const bool on_device = f.broadcast_memory != "host";
  for (size_t bytes : f.broadcast_sizes) {
    if (host) {
      const std::string what = absl::StrCat(when, " host ", bytes);
      if (int rc = HostBroadcast(c, f, rank, bytes, what); rc != 0) return rc;
      std::printf("broadcast ok rank %d %s\n", rank, what.c_str());
    }
    if (on_device) {
      const std::string what = absl::StrCat(when, " device ", bytes);
      if (int rc = DeviceBroadcast(c, device, id, stream, f, rank, bytes, what); rc != 0) return rc;
      std::printf("broadcast ok rank %d %s\n", rank, what.c_str());
    }
  }
  std::printf("broadcast ok rank %d %s\n", rank, when);
  std::fflush(stdout);
  return 0;
}

int Error(const absl::Status& st) {
  std::printf("error code=%d: %s\n", static_cast<int>(gradsync::CodeOf(st)),
              std::string(st.message()).c_str());
  std::fflush(stdout);
  return 2;
}

std::vector<int> ParseRanks(const std::string& v) {
  std::vector<int> out;
  for (absl::string_view n : absl::StrSplit(v, ','))
    out.push_back(std::atoi(std::string(n).c_str()));
  return out;
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq),
                      v = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--socket")
      f->socket = v;
    else if (key == "--mode")
      f->mode = v;
    else if (key == "--dtype")
      f->dtype = v == "bf16" ? DType::kBFloat16 : v == "fp64" ? DType::kFloat64 : DType::kFloat32;
    else if (key == "--device")
      f->device = std::atoi(v.c_str());
    else if (key == "--steps")
      f->steps = std::atoi(v.c_str());
    else if (key == "--accumulate")
      f->accumulate = std::max(1, std::atoi(v.c_str()));
    else if (key == "--unused-every")
      f->unused_every = std::atoi(v.c_str());
    else if (key == "--hold-stream-ms")
      f->hold_stream_ms = std::atoi(v.c_str());
    else if (key == "--shuffle-seed")
      f->shuffle_seed = static_cast<unsigned>(std::atoi(v.c_str()));
    else if (key == "--die-at-step")
      f->die_at_step = std::atoi(v.c_str());
    else if (key == "--die-after-marks")
      f->die_after_marks = std::atoi(v.c_str());
    else if (key == "--die-with-stream-held")
      f->die_with_stream_held = true;
    else if (key == "--die-once-averaged")
      f->die_once_averaged = true;
    else if (key == "--mix")
      f->mix = true;
    else if (key == "--pause-at-step")
      f->pause_at_step = std::atoi(v.c_str());
    else if (key == "--pause-after-marks")
      f->pause_after_marks = std::atoi(v.c_str());
    else if (key == "--in-order")
      f->in_order = true;
    else if (key == "--members-from-step")
      f->members_from_step = std::atoi(v.c_str());
    else if (key == "--members")
      for (absl::string_view n : absl::StrSplit(v, ','))
        f->members.push_back(std::atoi(std::string(n).c_str()));
    else if (key == "--catch-up")
      f->catch_up = true;
    else if (key == "--members-before-join")
      f->members_before_join = ParseRanks(v);
    else if (key == "--members-after-join")
      f->members_after_join = ParseRanks(v);
    else if (key == "--tensors")
      f->tensors = std::atoi(v.c_str());
    else if (key == "--embed-numel")
      f->embed_numel = std::strtoull(v.c_str(), nullptr, 10);
    else if (key == "--switch-stream-at")
      f->switch_stream_at = std::atoi(v.c_str());
    else if (key == "--check-replicas")
      f->check_replicas = true;
    else if (key == "--drift-rank")
      f->drift_rank = std::atoi(v.c_str());
    else if (key == "--drift-at")
      f->drift_at = std::atoi(v.c_str());
    else if (key == "--broadcast-root")
      f->broadcast_root = std::atoi(v.c_str());
    else if (key == "--broadcast-memory")
      f->broadcast_memory = v;
    else if (key == "--broadcast-sizes")
      for (absl::string_view n : absl::StrSplit(v, ',')) {
        f->broadcast_sizes.push_back(std::strtoull(std::string(n).c_str(), nullptr, 10));
      }
    else if (key == "--die-in-broadcast")
      f->die_in_broadcast = true;
    else if (key == "--bad-rank")
      f->bad_rank = std::atoi(v.c_str());
    else if (key == "--bad-step")
      f->bad_step = std::atoi(v.c_str());
    else if (key == "--bad-tensor")
      f->bad_tensor = std::atoi(v.c_str());
    else if (key == "--bad-element")
      f->bad_element = std::atoi(v.c_str());
    else if (key == "--bad-value")
      f->bad_value = v;
    else if (key == "--nonfinite")
      f->nonfinite = v;
    else
      return false;
  }
  if (f->broadcast_sizes.empty()) f->broadcast_sizes.push_back(kBroadcastBytes);
  return (f->mode == "flat" || f->mode == "user") && f->steps > 0 &&
         (f->broadcast_memory == "host" || f->broadcast_memory == "device" ||
          f->broadcast_memory == "mix") &&
         (f->bad_value == "nan" || f->bad_value == "inf");
}

bool IsBad(const Flags& f, int rank, int step, size_t i, size_t j) {
  if (rank != f.bad_rank || step != f.bad_step || i != static_cast<size_t>(f.bad_tensor)) {
    return false;
  }
  return f.bad_element < 0 ? j + 1 == kTensors[i].numel : j == static_cast<size_t>(f.bad_element);
}

float BadValue(const Flags& f) {
  return f.bad_value == "inf" ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
}

// Under --nonfinite=skip: the step the job skipped must be exactly the bad one.
int CheckSkip(const Flags& f, bool skipped, int rank, int step) {
  const bool expected = f.nonfinite == "skip" && step == f.bad_step;
  if (skipped == expected) return 0;
  std::printf("%s rank %d step %d\n", skipped ? "UNEXPECTED SKIP" : "MISSING SKIP", rank, step);
  std::fflush(stdout);
  return 1;
}

// Under --nonfinite=skip: the parameters equal the reference's (which
// skipped the bad step) and their fingerprint is printed for the test to
// compare across trainers.
int CheckParameters(const Flags& f, int rank, const std::vector<std::vector<float>>& params,
                    const std::vector<std::vector<double>>& reference) {
  const double tol = f.dtype == DType::kBFloat16 ? 5e-2 : 1e-4;
  uint64_t print = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    for (size_t j = 0; j < params[i].size(); ++j) {
      if (std::fabs(params[i][j] - reference[i][j]) <=
          tol * std::max(1.0, std::fabs(reference[i][j]))) {
        continue;
      }
      std::printf("PARAMETER MISMATCH rank %d tensor %zu element %zu: %.7g vs reference %.7g\n",
                  rank, i, j, params[i][j], reference[i][j]);
      std::fflush(stdout);
      return 1;
    }
    print = print * 31 + Fingerprint(params[i]);
  }
  std::printf("params rank %d fingerprint %llu\n", rank, static_cast<unsigned long long>(print));
  std::fflush(stdout);
  return 0;
}

// The global ranks whose average step `step` is (see Flags); `join_at`:
// the iteration nodes joined at, -1 while none did.
std::vector<int> MembersOf(const Flags& f, int step, int world, int join_at) {
  if (!f.members_before_join.empty() && (join_at < 0 || step < join_at)) {
    return f.members_before_join;
  }
  if (!f.members_after_join.empty() && join_at >= 0 && step >= join_at) {
    return f.members_after_join;
  }
  if (f.members_from_step >= 0 && step >= f.members_from_step) return f.members;
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  return all;
}

// Element j of tensor i after step `step`: the average over `in_step`;
// *bad when a member wrote a non-finite value there.
double ExpectedAverage(const Flags& f, const std::vector<int>& in_step, int step, size_t i,
                       size_t j, bool* bad) {
  double expected = 0;
  *bad = false;
  for (int r : in_step) {
    expected += Stored(f, r, step, i, j);
    *bad = *bad || IsBad(f, r, step, i, j);
  }
  return expected / static_cast<double>(in_step.size());
}

// --catch-up: the job's state, [iteration][every weight] (fp64), written
// to a device buffer on this trainer's GPU on `stream` and made rank
// `root`'s by gs_broadcast; *iteration and *weights become its. Returns 0, or
// the exit code.
int BroadcastState(gradsync::Client& c, gradsync::gpu::SimTrainerDevice& device,
                   const gradsync::gpu::DeviceId& id, gradsync::gpu::Stream* stream, int root,
                   uint64_t* iteration, std::vector<std::vector<double>>* weights) {
  std::vector<double> state(1);
  std::memcpy(state.data(), iteration, sizeof(*iteration));
  for (const std::vector<double>& w : *weights) state.insert(state.end(), w.begin(), w.end());
  const size_t bytes = state.size() * sizeof(double);
  auto buf = device.Alloc(id, bytes);
  if (!buf.ok()) return Error(buf.status());
  if (absl::Status st = device.WriteAsync(*buf, state.data(), bytes, stream); !st.ok()) {
    return Error(st);
  }
  if (absl::Status st = c.Broadcast(*buf, bytes, root, -1); !st.ok()) return Error(st);
  // The client synchronized its stream after its last copy: read in place.
  std::memcpy(state.data(), *buf, bytes);
  if (absl::Status st = device.Free(*buf); !st.ok()) return Error(st);
  std::memcpy(iteration, state.data(), sizeof(*iteration));
  size_t at = 1;
  for (std::vector<double>& w : *weights) {
    std::copy(state.begin() + at, state.begin() + at + w.size(), w.begin());
    at += w.size();
  }
  return 0;
}

// --catch-up on a trainer whose node joined the running job at iteration
// m: the reference's steps before m (the members' averages), then the
// job's state from rank 0, which must be at m with weights within 1e-12 of
// that reference. Returns 0, or the exit code.
int CatchUp(gradsync::Client& c, gradsync::gpu::SimTrainerDevice& device,
            const gradsync::gpu::DeviceId& id, gradsync::gpu::Stream* stream, const Flags& f,
            int join_at, std::vector<std::vector<double>>* reference,
            std::vector<std::vector<double>>* weights) {
  for (int step = 0; step < join_at; ++step) {
    const std::vector<int> in_step = MembersOf(f, step, c.world_size(), join_at);
    for (size_t i = 0; i < kTensors.size(); ++i) {
      for (size_t j = 0; j < kTensors[i].numel; ++j) {
        bool bad = false;
        (*reference)[i][j] -= 0.1 * ExpectedAverage(f, in_step, step, i, j, &bad);
      }
    }
  }
  uint64_t iteration = static_cast<uint64_t>(join_at);
  const int root = c.job_info().catch_up_root;
  if (int rc = BroadcastState(c, device, id, stream, root, &iteration, weights); rc != 0) return rc;
  if (iteration != static_cast<uint64_t>(join_at)) {
    std::printf("CATCH-UP MISMATCH rank %d: rank %d is at iteration %llu, this trainer at %d\n",
                c.rank(), root, static_cast<unsigned long long>(iteration), join_at);
    std::fflush(stdout);
    return 1;
  }
  for (size_t i = 0; i < kTensors.size(); ++i) {
    for (size_t j = 0; j < kTensors[i].numel; ++j) {
      const double want = (*reference)[i][j], got = (*weights)[i][j];
      if (std::fabs(got - want) <= 1e-12 * std::max(1.0, std::fabs(want))) continue;
      std::printf("CATCH-UP MISMATCH rank %d tensor %zu element %zu: got %.17g expected %.17g\n",
                  c.rank(), i, j, got, want);
      std::fflush(stdout);
      return 1;
    }
  }
  std::printf(
      "joined the running job at iteration %d: state from rank %d, world size %d, rank %d\n",
      join_at, root, c.job_info().world_size, c.rank());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) {
    std::fprintf(stderr, "sim_trainer: bad flags\n");
    return 3;
  }
  if (f.embed_numel > 0) kTensors[0].numel = f.embed_numel;
  if (f.tensors > 0) {
    kTensors.clear();
    for (int i = 0; i < f.tensors; ++i) {
      kTensors.push_back({absl::StrCat("p", i), static_cast<uint64_t>(1 + i % 5)});
    }
  }
  const char* lr = std::getenv("LOCAL_RANK");
  const int local_rank = lr ? std::atoi(lr) : 0;
  auto sim = gradsync::gpu::SimTrainerDevice::CreateFromEnv();
  if (!sim.ok()) return Error(sim.status());
  std::shared_ptr<gradsync::gpu::SimTrainerDevice> device = std::move(*sim);
  if (f.device < 0) {
    auto opts = gradsync::gpu::SimOptions::FromEnv();
    if (!opts.ok()) return Error(opts.status());
    const int visible =
        opts->visible.empty() ? opts->num_gpus : static_cast<int>(opts->visible.size());
    f.device = local_rank % visible;
  }

  gradsync::ConnectOptions co;
  co.socket_path = f.socket;
  co.local_rank = local_rank;
  co.device = device;
  auto client = gradsync::Client::Connect(co);
  if (!client.ok()) return Error(client.status());
  gradsync::Client& c = **client;

  auto id = device->IdOfOrdinal(f.device);
  if (!id.ok()) return Error(id.status());
  // As a framework's trainer does (torch.cuda.set_device): its kernels go to
  // the current device, and a launch on another device's stream fails.
  if (absl::Status st = device->SetDevice(*id); !st.ok()) return Error(st);
  auto stream = device->CreateStream(*id);
  if (!stream.ok()) return Error(stream.status());
  // Like a framework's current stream: the sim's "native" handle is its Stream*.
  if (absl::Status st = c.SetCudaStream(*stream); !st.ok()) return Error(st);
  gradsync::gpu::Stream* second = nullptr;
  if (f.switch_stream_at >= 0) {
    auto s2 = device->CreateStream(*id);
    if (!s2.ok()) return Error(s2.status());
    second = *s2;
  }

  const size_t elem = gradsync::DTypeSize(f.dtype);
  std::vector<gradsync::TensorSpec> specs;
  std::vector<void*> own(kTensors.size(), nullptr);
  std::vector<void*> allocations;  // user mode: freed right after gs_close, as gradsync.h allows
  if (f.mode == "user") {
    // Two allocations, sub-allocated like a caching allocator does: the
    // client must export each base once and send offsets.
    uint64_t first = 0, second = 0;
    for (size_t i = 0; i < kTensors.size(); ++i) {
      (i % 2 == 0 ? first : second) += (kTensors[i].numel * elem + 511) / 512 * 512;
    }
    auto a = device->Alloc(*id, first);
    auto b = device->Alloc(*id, second);
    if (!a.ok()) return Error(a.status());
    if (!b.ok()) return Error(b.status());
    allocations = {*a, *b};
    uint64_t oa = 0, ob = 0;
    for (size_t i = 0; i < kTensors.size(); ++i) {
      uint64_t& o = i % 2 == 0 ? oa : ob;
      own[i] = static_cast<uint8_t*>(i % 2 == 0 ? *a : *b) + o;
      o += (kTensors[i].numel * elem + 511) / 512 * 512;
    }
  }
  for (size_t i = 0; i < kTensors.size(); ++i) {
    specs.push_back({kTensors[i].name, f.dtype, kTensors[i].numel, f.device, own[i]});
  }
  if (f.mix) specs[1].device = -1, specs[1].cuda_ptr = nullptr;
  if (absl::Status st = c.Register(specs); !st.ok()) return Error(st);
  const int rank = c.rank(), world = c.world_size();

  std::mt19937 shuffle(f.shuffle_seed + 101 * rank);
  std::vector<std::vector<float>> host(kTensors.size());
  std::vector<std::vector<uint16_t>> host16(kTensors.size());
  std::vector<std::vector<double>> host64(kTensors.size());  // --dtype=fp64's writes
  for (size_t i = 0; i < kTensors.size(); ++i) host[i].assign(kTensors[i].numel, 0.f);
  std::vector<std::vector<float>> params(kTensors.size());
  for (size_t i = 0; i < kTensors.size(); ++i) params[i].assign(kTensors[i].numel, 1.f);
  std::vector<std::vector<double>> reference(kTensors.size());
  for (size_t i = 0; i < kTensors.size(); ++i) reference[i].assign(kTensors[i].numel, 1.0);
  // SGD in double on the results received.
  std::vector<std::vector<double>> weights = reference;

  if (f.broadcast_root >= 0) {
    if (int rc = BroadcastAndCheck(c, *device, *id, *stream, f, rank, "at start"); rc != 0) {
      return rc;
    }
  }
  int join_at = -1;  // the iteration nodes joined at (this trainer's or others')
  uint64_t nodes_joined = c.job_info().nodes_joined;
  uint64_t trainers_joined = c.job_info().trainers_joined;
  if (f.catch_up && c.job_info().joined_running_job) {
    join_at = static_cast<int>(c.job_info().iteration);
    if (int rc = CatchUp(c, *device, *id, *stream, f, join_at, &reference, &weights); rc != 0) {
      return rc;
    }
  }
  for (int step = std::max(join_at, 0); step < f.steps; ++step) {
    if (f.broadcast_root >= 0 && step == 1) {
      if (int rc = BroadcastAndCheck(c, *device, *id, *stream, f, rank, "between steps"); rc != 0) {
        return rc;
      }
    }
    for (int m = 0; m < f.accumulate; ++m) {
      const bool synced = m == f.accumulate - 1;
      if (absl::Status st = c.SetSync(synced); !st.ok()) return Error(st);
      if (f.hold_stream_ms > 0 || (f.die_with_stream_held && step == f.die_at_step && synced)) {
        gradsync::gpu::SimPauseStream(*stream).IgnoreError();
      }
      std::vector<size_t> order(kTensors.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
      if (!f.in_order) std::shuffle(order.begin(), order.end(), shuffle);
      int marks = 0;
      gradsync::gpu::Stream* current = *stream;
      if (absl::Status st = c.SetCudaStream(current); !st.ok()) return Error(st);
      auto maybe_pause = [&]() -> absl::Status {
        if (step != f.pause_at_step || !synced || marks != f.pause_after_marks) {
          return absl::OkStatus();
        }
        // The simulated stream runs in this process: drain it first, so the
        // marks made so far are complete while it is stopped.
        if (absl::Status st = device->SynchronizeStream(*id, current, absl::Seconds(30));
            !st.ok()) {
          return st;
        }
        std::printf("paused at step %d after %d marks\n", step, marks);
        std::fflush(stdout);
        raise(SIGSTOP);
        return absl::OkStatus();
      };
      for (size_t i : order) {
        if (absl::Status st = maybe_pause(); !st.ok()) return Error(st);
        if (second != nullptr && synced && marks == f.switch_stream_at) {
          current = second;
          if (absl::Status st = c.SetCudaStream(current); !st.ok()) return Error(st);
        }
        if (step == f.die_at_step && synced && marks == f.die_after_marks) {
          if (f.die_once_averaged) {
            // Its write first: until then the memory holds the last result.
            if (absl::Status st = device->SynchronizeStream(*id, current, absl::Seconds(30));
                !st.ok()) {
              return Error(st);
            }
            const size_t first = order[0];
            const void* written = f.dtype == DType::kFloat64 ? host64[first].data()
                                  : f.dtype == DType::kBFloat16
                                      ? static_cast<const void*>(host16[first].data())
                                      : host[first].data();
            if (!WaitUntilOverwritten(c.GradBuffer(first), written, host[first].size() * elem)) {
              std::printf("rank %d step %d: tensor %zu never received its result\n", rank, step,
                          first);
              std::fflush(stdout);
              return 1;
            }
          }
          std::printf("dying at step %d after %d marks\n", step, marks);
          std::fflush(stdout);
          raise(SIGKILL);
        }
        ++marks;
        if (!Used(f, rank, step, m, i)) {
          if (absl::Status st = c.MarkUnused(i); !st.ok()) return Error(st);
          continue;
        }
        // Backward accumulates into the gradient (after a sync: from zero).
        for (size_t j = 0; j < host[i].size(); ++j) host[i][j] += Grad(rank, step, m, i, j);
        if (synced) {
          for (size_t j = 0; j < host[i].size(); ++j) {
            if (IsBad(f, rank, step, i, j)) host[i][j] = BadValue(f);
          }
        }
        const void* src = host[i].data();
        if (f.dtype == DType::kBFloat16) {
          host16[i].resize(host[i].size());
          for (size_t j = 0; j < host[i].size(); ++j) {
            host16[i][j] = gradsync::FloatToBFloat16(host[i][j]);
          }
          src = host16[i].data();
        } else if (f.dtype == DType::kFloat64) {
          host64[i].assign(host[i].begin(), host[i].end());
          src = host64[i].data();
        }
        if (absl::Status st =
                device->WriteAsync(c.GradBuffer(i), src, host[i].size() * elem, current);
            !st.ok()) {
          return Error(st);
        }
        // No synchronize: the readiness event orders the daemon after the write.
        if (absl::Status st = c.MarkReady(i); !st.ok()) return Error(st);
      }
      if (absl::Status st = maybe_pause(); !st.ok()) return Error(st);
      if (step == f.die_at_step && synced && marks == f.die_after_marks) {
        // Dead after its last mark, its gradients complete: the simulated
        // stream runs in this process, so it drains first (unless held).
        if (absl::Status st = f.die_with_stream_held
                                  ? absl::OkStatus()
                                  : device->SynchronizeStream(*id, current, absl::Seconds(30));
            !st.ok()) {
          return Error(st);
        }
        std::printf("dying at step %d after all %d marks\n", step, marks);
        std::fflush(stdout);
        raise(SIGKILL);
      }
      if (f.hold_stream_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(f.hold_stream_ms));
        gradsync::gpu::SimResumeStream(*stream).IgnoreError();
      }
      if (absl::Status st = c.Wait(-1); !st.ok()) return Error(st);
    }
    if (int rc = CheckSkip(f, c.step_skipped(), rank, step); rc != 0) return rc;
    if (c.step_skipped()) {
      std::printf("skipped rank %d step %d\n", rank, step);
      std::fflush(stdout);
      for (auto& h : host) std::fill(h.begin(), h.end(), 0.f);
      continue;  // neither the parameters nor the reference take this step
    }

    // The step's result: the average over every trainer that was a member
    // of this iteration (all of them, unless an elastic job lost a node).
    const std::vector<int> in_step = MembersOf(f, step, world, join_at);
    if (c.job_info().world_size != static_cast<int>(in_step.size())) {
      std::printf("WORLD MISMATCH rank %d step %d: the daemon divided by %d, expected %zu\n", rank,
                  step, c.job_info().world_size, in_step.size());
      std::fflush(stdout);
      return 1;
    }
    const double tol = f.dtype == DType::kBFloat16  ? 2e-2
                       : f.dtype == DType::kFloat64 ? 1e-12
                                                    : 1e-5;
    for (size_t i = 0; i < kTensors.size(); ++i) {
      const uint8_t* got = static_cast<const uint8_t*>(c.GradBuffer(i));
      for (size_t j = 0; j < kTensors[i].numel; ++j) {
        bool bad = false;
        double expected = ExpectedAverage(f, in_step, step, i, j, &bad);
        if (bad) expected = BadValue(f);
        double value;
        if (f.dtype == DType::kBFloat16) {
          uint16_t v;
          std::memcpy(&v, got + j * elem, elem);
          value = gradsync::BFloat16ToFloat(v);
        } else if (f.dtype == DType::kFloat64) {
          std::memcpy(&value, got + j * elem, elem);
        } else {
          float v;
          std::memcpy(&v, got + j * elem, elem);
          value = v;
        }
        params[i][j] -= 0.1f * static_cast<float>(value);
        weights[i][j] -= 0.1 * value;
        reference[i][j] -= 0.1 * expected;
        if (bad && !std::isfinite(value)) {
          std::printf("nonfinite through rank %d step %d tensor %zu element %zu = %g\n", rank, step,
                      i, j, value);
          std::fflush(stdout);
          continue;
        }
        // Written so that a NaN where none is expected is a mismatch too.
        if (!(std::fabs(value - expected) <= tol * std::max(1.0, std::fabs(expected)))) {
          std::printf(
              "MISMATCH rank %d step %d tensor %zu '%s' element %zu: got %.7g expected %.7g\n",
              rank, step, i, kTensors[i].name.c_str(), j, value, expected);
          std::fflush(stdout);
          return 1;
        }
      }
      std::fill(host[i].begin(), host[i].end(), 0.f);  // the optimizer consumed it
    }
    if (rank == f.drift_rank && step == f.drift_at) params[1][1] += 1e-3f;
    const bool nodes_came = c.job_info().nodes_joined != nodes_joined;
    if (f.catch_up && (nodes_came || c.job_info().trainers_joined != trainers_joined)) {
      // Nodes or restarted trainers join at the next iteration: they get
      // this state.
      nodes_joined = c.job_info().nodes_joined;
      trainers_joined = c.job_info().trainers_joined;
      join_at = step + 1;
      uint64_t iteration = c.job_info().iteration;
      const int root = c.job_info().catch_up_root;
      if (int rc = BroadcastState(c, *device, *id, *stream, root, &iteration, &weights); rc != 0) {
        return rc;
      }
      std::printf("%s joined after iteration %llu: state sent from rank %d\n",
                  nodes_came ? "nodes" : "trainers", static_cast<unsigned long long>(iteration),
                  root);
      std::fflush(stdout);
    }
    if (f.check_replicas && c.job_info().check_replicas_due) {
      std::vector<uint64_t> hashes;
      for (const std::vector<float>& p : params) hashes.push_back(Fingerprint(p));
      if (absl::Status st = c.CheckReplicas(hashes); !st.ok()) return Error(st);
      std::printf("check ok rank %d iteration %llu\n", rank,
                  static_cast<unsigned long long>(c.job_info().iteration));
      std::fflush(stdout);
    }
  }
  if (f.bad_rank >= 0 && f.nonfinite == "skip") {
    if (int rc = CheckParameters(f, rank, params, reference); rc != 0) return rc;
  }
  // Bit for bit: replicas that trained alike end with the same hash.
  uint64_t weights_hash = 0;
  for (const std::vector<double>& w : weights) {
    const auto* p = reinterpret_cast<const unsigned char*>(w.data());
    for (size_t k = 0; k < w.size() * sizeof(double); ++k) {
      weights_hash = (weights_hash ^ p[k]) * 1099511628211ull;
    }
  }
  std::printf("weights %016llx\n", static_cast<unsigned long long>(weights_hash));
  std::printf("OK rank %d world %d steps %d\n", rank, world, f.steps);
  std::fflush(stdout);
  if (absl::Status st = c.Close(); !st.ok()) return Error(st);
  // The contract ends at gs_close: the daemon no longer maps this memory
  // (the simulation refuses a free while another live process maps it).
  for (void* p : allocations) {
    if (absl::Status st = device->Free(p); !st.ok()) return Error(st);
  }
  return 0;
}
