// Cross-node allreduce on loopback: plain Gloo vs gradsync's GlooBackend
// in-process and in its worker process (what the daemon runs).
//
//   gloo_allreduce_bench [--nodes=2] [--sizes_mb=25,100] [--iters=10] [--rounds=4]
//                        [--op=allreduce|broadcast]
//
// The launcher hosts a RendezvousService and starts --nodes worker processes
// (this binary again, with --worker). Every worker joins, then connects two
// Gloo contexts over the same rendezvous store:
//   plain_gloo  a gloo::rendezvous::Context driven directly with
//               gloo::allreduce (ring, gloo::sum<float>): the reference;
//   gradsync    GlooBackend::AllreduceSum in this process;
//   gloo_worker GlooWorkerBackend::AllreduceSum, what the daemon runs: the
//               same GlooBackend in a worker process, on the buffer shared
//               with it (Staging, where the daemon's local sum writes), one
//               command round trip per allreduce;
//   worker_copy the same on ordinary memory: copied in and out each time;
//   worker_bf16, worker_fp16  gloo_worker with --wire-dtype bf16 / fp16 (cast
//               in place, pre-scaled by 1/nodes, 16-bit ring, cast back).
// wire_MB: bytes node 0's process running the collective (this one, or its
// Gloo worker) wrote per allreduce: the kernel's wchar in /proc/PID/io,
// i.e. what Gloo handed to its sockets (plus a few bytes of commands).
// --op=broadcast times a broadcast of the same bytes from node 0 instead
// (broadcast_bench's cross-node reference): plain_gloo is gloo::broadcast,
// gradsync GlooBackend::Broadcast, worker_copy GlooWorkerBackend::Broadcast
// on ordinary memory (what the daemon's Broadcaster runs per piece: copied
// into the worker's buffer on the root, out of it elsewhere); busbw = algbw
// for a broadcast (nccl-tests).
// Rows alternate per round so drift on a noisy VM hits both alike. Node 0
// prints, per size: mean time per allreduce, the p10 / p50 / p90 of the
// single allreduces (the statistic sync_bench compares with gradsync's
// iterations), algbw = bytes / mean time and
// busbw = algbw * 2(n-1)/n (nccl-tests definitions), and gradsync's busbw as
// a fraction of plain Gloo's (PERFORMANCE.md target: >= 0.95 at 100 MB).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/backends/gloo_backend.h"
#include "daemon/backends/gloo_store.h"
#include "daemon/backends/gloo_worker.h"
#include "daemon/backends/gloo_worker_backend.h"
#include "daemon/cluster/rendezvous_client.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_service.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/config.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"
#include "tests/testing/process.h"

ABSL_FLAG(int, nodes, 2, "processes (nodes) in the allreduce");
ABSL_FLAG(std::string, sizes_mb, "25,100", "comma-separated buffer sizes in MB (fp32)");
ABSL_FLAG(int, iters, 10, "timed allreduces per row and round");
ABSL_FLAG(int, warmup, 2, "untimed allreduces before each timed block");
ABSL_FLAG(int, rounds, 4, "alternating rounds of the two rows");
ABSL_FLAG(std::string, op, "allreduce", "allreduce or broadcast (from node 0)");
ABSL_FLAG(bool, worker, false, "internal: run as a worker");
ABSL_FLAG(int, rank, 0, "internal: worker rank");
ABSL_FLAG(std::string, leader, "", "internal: leader address");

namespace gradsync {
namespace {

constexpr char kJob[] = "gloo-bench";
constexpr char kToken[] = "gloo-bench-token";
constexpr absl::Duration kTimeout = absl::Seconds(120);

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "gloo_allreduce_bench: %s\n", why.c_str());
  std::exit(1);
}

// Bytes process `pid` passed to write(2) and friends so far (0 if unreadable).
uint64_t BytesWritten(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/io"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view view = line;
    uint64_t bytes = 0;
    if (absl::ConsumePrefix(&view, "wchar:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(view), &bytes)) {
      return bytes;
    }
  }
  return 0;
}

std::vector<size_t> SizesBytes() {
  std::vector<size_t> out;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_sizes_mb), ',')) {
    double mb = 0;
    if (!absl::SimpleAtod(part, &mb) || mb <= 0) Die(absl::StrCat("bad size '", part, "'"));
    out.push_back(static_cast<size_t>(mb * 1e6) / sizeof(float) * sizeof(float));
  }
  return out;
}

void Fill(std::vector<float>& data, int rank) {
  for (size_t i = 0; i < data.size(); ++i) data[i] = 1e-3f * static_cast<float>(i % 7 + rank);
}

int Worker() {
  spdlog::set_level(spdlog::level::warn);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int n = absl::GetFlag(FLAGS_nodes);
  const bool bcast = absl::GetFlag(FLAGS_op) == "broadcast";
  RendezvousClientOptions client_options;
  client_options.leader = absl::GetFlag(FLAGS_leader);
  client_options.job_id = kJob;
  client_options.job_token = kToken;
  std::shared_ptr<RendezvousClient> client = RendezvousClient::Connect(client_options);
  JoinParams join;
  join.node_rank = rank;
  join.num_nodes = n;
  join.host = "127.0.0.1";
  join.timeout = kTimeout;
  absl::StatusOr<JoinResult> joined = client->Join(join);
  if (!joined.ok()) Die(joined.status().ToString());
  auto store = std::make_shared<GlooStore>(client, kTimeout);

  // The reference: Gloo used directly, rendezvous through the same store.
  auto plain = std::make_shared<gloo::rendezvous::Context>(rank, n);
  plain->setTimeout(absl::ToChronoMilliseconds(kTimeout));
  {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::PrefixStore prefix(GenerationKeyPrefix(joined->generation) + "plain", *store);
    plain->connectFullMesh(prefix, device);
  }

  GlooBackendOptions options;
  options.node_rank = rank;
  options.num_nodes = n;
  options.host = "127.0.0.1";
  options.generation = joined->generation;
  options.store_prefix = GlooKeyPrefix(joined->generation);
  options.timeout = kTimeout;
  options.store = store;
  absl::StatusOr<std::unique_ptr<GlooBackend>> backend = GlooBackend::Create(options);
  if (!backend.ok()) Die(backend.status().ToString());

  // The daemon's path; its keys prefixed so they do not meet GlooBackend's.
  gloo::rendezvous::PrefixStore worker_keys("worker", *store);
  GlooBackendOptions worker_options = options;
  worker_options.store = std::shared_ptr<gloo::rendezvous::Store>(store, &worker_keys);
  absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> worker =
      GlooWorkerBackend::Create(worker_options);
  if (!worker.ok()) Die(worker.status().ToString());
  // The same with a compressed wire, each over keys of its own.
  std::unique_ptr<GlooWorkerBackend> wire_workers[2];
  gloo::rendezvous::PrefixStore bf16_keys("worker_bf16", *store);
  gloo::rendezvous::PrefixStore fp16_keys("worker_fp16", *store);
  gloo::rendezvous::PrefixStore* wire_keys[2] = {&bf16_keys, &fp16_keys};
  const WireDType wire_dtypes[2] = {WireDType::kBFloat16, WireDType::kFloat16};
  for (int w = 0; w < (bcast ? 0 : 2); ++w) {  // allreduce only
    GlooBackendOptions wire_options = options;
    wire_options.store = std::shared_ptr<gloo::rendezvous::Store>(store, wire_keys[w]);
    wire_options.wire_dtype = wire_dtypes[w];
    wire_options.world_size = n;
    absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> created =
        GlooWorkerBackend::Create(wire_options);
    if (!created.ok()) Die(created.status().ToString());
    wire_workers[w] = std::move(*created);
  }

  auto plain_allreduce = [&](std::vector<float>& data) {
    gloo::AllreduceOptions opts(plain);
    opts.setOutput<float>(data.data(), data.size());
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
    opts.setTimeout(absl::ToChronoMilliseconds(kTimeout));
    gloo::allreduce(opts);
  };
  auto gradsync_allreduce = [&](std::vector<float>& data) {
    absl::Status status = (*backend)->AllreduceSum(data.data(), data.size(), DType::kFloat32);
    if (!status.ok()) Die(status.ToString());
  };
  auto worker_allreduce = [&](float* data, size_t count) {
    absl::Status status = (*worker)->AllreduceSum(data, count, DType::kFloat32);
    if (!status.ok()) Die(status.ToString());
  };
  auto broadcast = [&](int impl, std::vector<float>& data) {
    const size_t bytes = data.size() * sizeof(float);
    if (impl == 0) {
      gloo::BroadcastOptions opts(plain);
      opts.setOutput<float>(data.data(), data.size());
      opts.setRoot(0);
      opts.setTimeout(absl::ToChronoMilliseconds(kTimeout));
      gloo::broadcast(opts);
      return;
    }
    absl::Status status = impl == 1 ? (*backend)->Broadcast(data.data(), bytes, 0)
                                    : (*worker)->Broadcast(data.data(), bytes, 0);
    if (!status.ok()) Die(status.ToString());
  };
  auto run = [&](int impl, std::vector<float>& data) {
    if (bcast) return broadcast(impl, data);
    if (impl == 0) plain_allreduce(data);
    if (impl == 1) gradsync_allreduce(data);
    if (impl == 2) {
      worker_allreduce(reinterpret_cast<float*>((*worker)->Staging(data.size() * sizeof(float))),
                       data.size());
    }
    if (impl == 3) worker_allreduce(data.data(), data.size());
    if (impl >= 4) {
      GlooWorkerBackend& w = *wire_workers[impl - 4];
      const size_t bytes = data.size() * sizeof(float);
      absl::Status status =
          w.AllreduceSum(reinterpret_cast<float*>(w.Staging(bytes)), data.size(), DType::kFloat32);
      if (!status.ok()) Die(status.ToString());
    }
  };
  constexpr int kImpls = 6;
  const char* const kNames[kImpls] = {"plain_gloo",  "gradsync",    "gloo_worker",
                                      "worker_copy", "worker_bf16", "worker_fp16"};
  // The rows each op runs (the compressed wire and the Staging buffer are
  // allreduce only).
  auto active = [&](int impl) { return !bcast || impl == 0 || impl == 1 || impl == 3; };
  auto barrier = [&] {
    gloo::BarrierOptions opts(plain);
    gloo::barrier(opts);
  };

  const int iters = absl::GetFlag(FLAGS_iters);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (rank == 0) {
    std::printf("%5s %9s %-11s %9s %9s %11s %11s %9s %9s %9s %9s %9s\n", "nodes", "size_MB", "impl",
                "time_ms", "min_ms", "algbw_GB/s", "busbw_GB/s", "vs_plain", "wire_MB", "p10_ms",
                "p50_ms", "p90_ms");
  }
  for (size_t bytes : SizesBytes()) {
    std::vector<float> data(bytes / sizeof(float));
    double total_s[kImpls] = {};
    uint64_t wire_bytes[kImpls] = {};
    double min_s[kImpls];
    std::fill(min_s, min_s + kImpls, 1e30);
    std::vector<double> samples_s[kImpls];
    for (int round = 0; round < rounds; ++round) {
      for (int impl = 0; impl < kImpls; ++impl) {
        if (!active(impl)) continue;
        Fill(data, rank);
        if (impl == 2) {
          std::memcpy((*worker)->Staging(bytes), data.data(), bytes);
        }
        if (impl >= 4) {
          std::memcpy(wire_workers[impl - 4]->Staging(bytes), data.data(), bytes);
        }
        for (int i = 0; i < warmup; ++i) run(impl, data);
        barrier();
        const pid_t writer = impl == 2 || impl == 3 ? (*worker)->worker_pid()
                             : impl >= 4            ? wire_workers[impl - 4]->worker_pid()
                                                    : getpid();
        const uint64_t written_before = BytesWritten(writer);
        for (int i = 0; i < iters; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          run(impl, data);
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          total_s[impl] += s;
          min_s[impl] = std::min(min_s[impl], s);
          samples_s[impl].push_back(s);
        }
        wire_bytes[impl] += BytesWritten(writer) - written_before;
      }
    }
    if (rank != 0) continue;
    double busbw[kImpls];
    for (int impl = 0; impl < kImpls; ++impl) {
      if (!active(impl)) continue;
      const double mean_s = total_s[impl] / (rounds * iters);
      const double algbw = static_cast<double>(bytes) / mean_s / 1e9;
      busbw[impl] = bcast ? algbw : algbw * 2.0 * (n - 1) / n;
      const std::string ratio = impl == 0 ? "" : absl::StrFormat("%.3f", busbw[impl] / busbw[0]);
      const double wire_mb = wire_bytes[impl] / 1e6 / (rounds * iters);
      std::vector<double>& v = samples_s[impl];
      std::sort(v.begin(), v.end());
      auto at = [&v](size_t num, size_t den) {
        return v.empty() ? 0.0 : v[std::min(v.size() - 1, v.size() * num / den)] * 1e3;
      };
      std::printf("%5d %9.3f %-11s %9.2f %9.2f %11.3f %11.3f %9s %9.2f %9.3f %9.3f %9.3f\n", n,
                  bytes / 1e6, kNames[impl], mean_s * 1e3, min_s[impl] * 1e3, algbw, busbw[impl],
                  ratio.c_str(), wire_mb, at(1, 10), at(1, 2), at(9, 10));
    }
    std::fflush(stdout);
  }
  barrier();
  return 0;
}

int Launcher(const char* self) {
  const int n = absl::GetFlag(FLAGS_nodes);
  if (n < 2) Die("--nodes must be >= 2");
  const std::string op = absl::GetFlag(FLAGS_op);
  if (op != "allreduce" && op != "broadcast") Die("--op must be allreduce or broadcast");
  RendezvousService service(kJob, CallAuth(CallAuthPolicy{kToken}), n, kTimeout,
                            absl::InfiniteDuration());
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) Die("cannot start the rendezvous server");
  const std::string leader = absl::StrCat("127.0.0.1:", port);
  std::printf(
      "# gloo %s over loopback: %d processes, fp32, %s; Gloo %d.%d.%d; "
      "iters=%d x rounds=%d (warmup %d)\n",
      absl::GetFlag(FLAGS_op).c_str(), n,
      absl::GetFlag(FLAGS_op) == "broadcast" ? "from node 0" : "ring", GLOO_VERSION_MAJOR,
      GLOO_VERSION_MINOR, GLOO_VERSION_PATCH, absl::GetFlag(FLAGS_iters),
      absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_warmup));
  std::fflush(stdout);

  std::vector<testing::Process> workers;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> args = {self,
                                     "--worker",
                                     absl::StrCat("--rank=", r),
                                     absl::StrCat("--nodes=", n),
                                     "--leader=" + leader,
                                     "--sizes_mb=" + absl::GetFlag(FLAGS_sizes_mb),
                                     absl::StrCat("--iters=", absl::GetFlag(FLAGS_iters)),
                                     absl::StrCat("--warmup=", absl::GetFlag(FLAGS_warmup)),
                                     absl::StrCat("--rounds=", absl::GetFlag(FLAGS_rounds)),
                                     "--op=" + absl::GetFlag(FLAGS_op)};
    workers.push_back(testing::Process::Spawn(args, ""));  // they print to our stdout
    if (!workers.back().started()) Die("cannot start a worker");
  }
  // Every worker must finish; a failed one makes the others fail within the
  // timeout, so this wait ends (the bound only guards against a hang).
  int failures = 0;
  for (testing::Process& worker : workers) {
    const testing::ExitStatus status = worker.Wait(std::chrono::hours(1));
    if (!status.exited || status.code != 0) ++failures;
  }
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (failures > 0) {
    std::fprintf(stderr, "gloo_allreduce_bench: %d worker(s) failed\n", failures);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  // GlooWorkerBackend starts this binary again as its Gloo worker.
  if (argc == 2 && std::string(argv[1]) == gradsync::kGlooWorkerFlag) {
    return gradsync::RunGlooWorker();
  }
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_worker)) return gradsync::Worker();
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return 1;
  self[len] = '\0';
  return gradsync::Launcher(self);
}
