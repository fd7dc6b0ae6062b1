// One "node" of the multi-node tests: joins the test's leader with a
// RendezvousClient, connects a GlooBackend through a GlooStore, and runs one
// scenario. Results go to stdout (the test keeps them in a log) and to the
// exit code, which the test checks.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/half.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "daemon/backends/gloo_backend.h"
#include "daemon/backends/gloo_store.h"
#include "daemon/cluster/rendezvous_client.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "tests/multinode/exit_codes.h"
#include "tests/testing/wait.h"

ABSL_FLAG(std::string, leader, "", "HOST:PORT of the leader");
ABSL_FLAG(std::string, job_id, "job", "job id");
ABSL_FLAG(std::string, job_token, "token", "job token");
ABSL_FLAG(int, node_rank, 0, "this node's rank");
ABSL_FLAG(int, num_nodes, 2, "nodes in the job");
ABSL_FLAG(int, local_size, 1, "trainers on this node (only for world_size)");
ABSL_FLAG(std::string, scenario, "allreduce",
          "allreduce | mesh | until_failure | abort_self | wait_then_allreduce");
ABSL_FLAG(int64_t, timeout_ms, 20000, "Gloo connect and per-allreduce timeout");
ABSL_FLAG(int64_t, join_timeout_ms, 20000, "how long to try to join");
ABSL_FLAG(uint64_t, expect_generation, 0, "generation the first Join must return (0: any)");
ABSL_FLAG(bool, rejoin, false, "until_failure: report the failure, re-join, verify again");
ABSL_FLAG(std::string, ready_file, "", "created once the node is in its steady state");
ABSL_FLAG(std::string, go_file, "", "wait_then_allreduce: file to wait for");
ABSL_FLAG(int64_t, loop_elements, 512 * 1024,
          "until_failure: float32 elements of each allreduce (2 MB: Gloo's ring; 1024: the "
          "small-buffer gather, gather_sum.h)");

namespace gradsync {
namespace {

using testing::ExitCode;

void Say(const std::string& line) {
  std::printf("node %d: %s\n", absl::GetFlag(FLAGS_node_rank), line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void Exit(ExitCode code, const std::string& why) {
  Say(absl::StrCat("exit ", static_cast<int>(code), ": ", why));
  std::fflush(stdout);
  std::_Exit(static_cast<int>(code));
}

void Touch(const std::string& path) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << "ready\n";
}

bool IsPeerFailure(const absl::Status& status) {
  const v1::Code code = CodeOf(status);
  return code == v1::UNAVAILABLE || code == v1::PEER_FAILED || code == v1::TIMEOUT;
}

// Joins, retrying while the previous generation is still active (STATE):
// a restarted node waits until the others have noticed the failure.
absl::StatusOr<JoinResult> JoinWithRetry(RendezvousClient& client) {
  const absl::Time deadline =
      MonotonicNow() + absl::Milliseconds(absl::GetFlag(FLAGS_join_timeout_ms));
  JoinParams params;
  params.node_rank = absl::GetFlag(FLAGS_node_rank);
  params.num_nodes = absl::GetFlag(FLAGS_num_nodes);
  params.local_size = absl::GetFlag(FLAGS_local_size);
  params.host = "127.0.0.1";
  for (;;) {
    params.timeout = std::max(deadline - MonotonicNow(), absl::Milliseconds(1));
    absl::StatusOr<JoinResult> result = client.Join(params);
    if (result.ok() || CodeOf(result.status()) != v1::STATE || MonotonicNow() >= deadline) {
      return result;
    }
    Say(absl::StrCat("join refused for now, retrying: ", result.status().ToString()));
    absl::SleepFor(absl::Milliseconds(100));  // paces the retries; orders nothing
  }
}

// `expected`: the generation Join must return (0: any).
JoinResult JoinOrExit(RendezvousClient& client, uint64_t expected) {
  absl::StatusOr<JoinResult> joined = JoinWithRetry(client);
  if (!joined.ok()) Exit(ExitCode::kJoinFailed, joined.status().ToString());
  const int num_nodes = absl::GetFlag(FLAGS_num_nodes);
  if (static_cast<int>(joined->peers.size()) != num_nodes) {
    Exit(ExitCode::kFailed, absl::StrCat("join returned ", joined->peers.size(), " peers"));
  }
  int world_size = 0;
  for (int r = 0; r < num_nodes; ++r) {
    if (joined->peers[r].node_rank != r) Exit(ExitCode::kFailed, "peers not ordered by rank");
    world_size += joined->peers[r].local_size;
  }
  const int me = absl::GetFlag(FLAGS_node_rank);
  if (joined->peers[me].local_size != absl::GetFlag(FLAGS_local_size) ||
      joined->world_size != world_size) {
    Exit(ExitCode::kFailed, absl::StrCat("bad world: world_size=", joined->world_size));
  }
  if (expected != 0 && joined->generation != expected) {
    Exit(ExitCode::kFailed,
         absl::StrCat("joined generation ", joined->generation, ", expected ", expected));
  }
  Say(absl::StrCat("joined generation=", joined->generation, " world_size=", world_size));
  return *std::move(joined);
}

std::unique_ptr<GlooBackend> ConnectOrExit(std::shared_ptr<RendezvousClient> client,
                                           uint64_t generation) {
  const absl::Duration timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  GlooBackendOptions options;
  options.node_rank = absl::GetFlag(FLAGS_node_rank);
  options.num_nodes = absl::GetFlag(FLAGS_num_nodes);
  options.host = "127.0.0.1";
  options.generation = generation;
  options.store_prefix = GlooKeyPrefix(generation);
  options.timeout = timeout;
  options.store = std::make_shared<GlooStore>(std::move(client), timeout);
  absl::StatusOr<std::unique_ptr<GlooBackend>> backend = GlooBackend::Create(options);
  if (!backend.ok()) Exit(ExitCode::kFailed, backend.status().ToString());
  return *std::move(backend);
}

// Exactly representable values whose sums over <= 3 nodes stay exact in
// every dtype (the half types get integers only, |sum| <= 78).
double Value(int rank, size_t i, bool fraction) {
  const double sign = (i % 2) ? -1.0 : 1.0;
  return sign * (rank + 1) * static_cast<double>(i % 13 + 1) + (fraction ? 0.25 * rank : 0.0);
}

double Expected(int num_nodes, size_t i, bool fraction) {
  double sum = 0;
  for (int r = 0; r < num_nodes; ++r) sum += Value(r, i, fraction);
  return sum;
}

uint16_t ToBFloat16(float f) {  // values here are exact: truncation is enough
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

float FromBFloat16(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// One allreduce of `count` elements of `dtype`, every element checked.
absl::Status CheckOne(GlooBackend& backend, DType dtype, size_t count) {
  const int rank = absl::GetFlag(FLAGS_node_rank);
  const int n = absl::GetFlag(FLAGS_num_nodes);
  const bool fraction = dtype == DType::kFloat32 || dtype == DType::kFloat64;
  std::vector<unsigned char> buffer(count * DTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    const double v = Value(rank, i, fraction);
    switch (dtype) {
      case DType::kFloat32:
        reinterpret_cast<float*>(buffer.data())[i] = static_cast<float>(v);
        break;
      case DType::kFloat64:
        reinterpret_cast<double*>(buffer.data())[i] = v;
        break;
      case DType::kFloat16:
        reinterpret_cast<uint16_t*>(buffer.data())[i] = FloatToFloat16(static_cast<float>(v));
        break;
      case DType::kBFloat16:
        reinterpret_cast<uint16_t*>(buffer.data())[i] = ToBFloat16(static_cast<float>(v));
        break;
    }
  }
  if (absl::Status s = backend.AllreduceSum(buffer.data(), count, dtype); !s.ok()) return s;
  for (size_t i = 0; i < count; ++i) {
    double got = 0;
    switch (dtype) {
      case DType::kFloat32:
        got = reinterpret_cast<const float*>(buffer.data())[i];
        break;
      case DType::kFloat64:
        got = reinterpret_cast<const double*>(buffer.data())[i];
        break;
      case DType::kFloat16:
        got = Float16ToFloat(reinterpret_cast<const uint16_t*>(buffer.data())[i]);
        break;
      case DType::kBFloat16:
        got = FromBFloat16(reinterpret_cast<const uint16_t*>(buffer.data())[i]);
        break;
    }
    const double want = Expected(n, i, fraction);
    if (got != want) {
      return absl::InternalError(absl::StrFormat("%s count=%d: element %d is %g, expected %g",
                                                 DTypeName(dtype), count, i, got, want));
    }
  }
  return absl::OkStatus();
}

void RunSuiteOrExit(GlooBackend& backend, bool small) {
  struct Case {
    DType dtype;
    size_t count;
  };
  std::vector<Case> cases = {
      {DType::kFloat32, 1},    {DType::kFloat32, 3},    {DType::kFloat32, 1000},
      {DType::kFloat64, 1},    {DType::kFloat64, 1000}, {DType::kFloat16, 1},
      {DType::kFloat16, 4099}, {DType::kBFloat16, 1},   {DType::kBFloat16, 4099}};
  if (!small) {
    // A few MB each, sizes not divisible by the node count.
    cases.push_back({DType::kFloat32, (1u << 20) + 7});
    cases.push_back({DType::kFloat64, (1u << 19) + 3});
    cases.push_back({DType::kBFloat16, (1u << 20) + 5});
  }
  for (const Case& c : cases) {
    if (absl::Status s = CheckOne(backend, c.dtype, c.count); !s.ok()) {
      Exit(ExitCode::kFailed, s.ToString());
    }
  }
  Say(absl::StrCat("verified ", cases.size(), " allreduces"));
}

// A broadcast from every node in turn: each root reaches every other node
// over their own pair, so every pair of the mesh carries data.
void BroadcastFromEveryRootOrExit(GlooBackend& backend) {
  const int rank = absl::GetFlag(FLAGS_node_rank);
  const int n = absl::GetFlag(FLAGS_num_nodes);
  for (int root = 0; root < n; ++root) {
    std::vector<int32_t> data(1000, rank == root ? -1 : 0);
    for (size_t i = 0; rank == root && i < data.size(); ++i) data[i] = root * 100000 + i;
    if (absl::Status s = backend.Broadcast(data.data(), data.size() * sizeof(int32_t), root);
        !s.ok()) {
      Exit(ExitCode::kFailed, absl::StrCat("broadcast from node ", root, ": ", s.ToString()));
    }
    for (size_t i = 0; i < data.size(); ++i) {
      if (data[i] != static_cast<int32_t>(root * 100000 + i)) {
        Exit(ExitCode::kFailed,
             absl::StrFormat("broadcast from node %d: element %d is %d", root, i, data[i]));
      }
    }
  }
  Say(absl::StrCat("verified a broadcast from each of ", n, " nodes"));
}

int Main() {
  RendezvousClientOptions options;
  options.leader = absl::GetFlag(FLAGS_leader);
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.job_token = absl::GetFlag(FLAGS_job_token);
  std::shared_ptr<RendezvousClient> client = RendezvousClient::Connect(options);
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  const int rank = absl::GetFlag(FLAGS_node_rank);

  if (scenario == "allreduce") {
    const JoinResult joined = JoinOrExit(*client, absl::GetFlag(FLAGS_expect_generation));
    std::unique_ptr<GlooBackend> backend = ConnectOrExit(client, joined.generation);
    RunSuiteOrExit(*backend, /*small=*/false);
    Say(absl::StrCat("ok generation=", joined.generation));
    return static_cast<int>(ExitCode::kOk);
  }

  if (scenario == "mesh") {
    // Sums exact at any node count (fp64), then data over every pair.
    const JoinResult joined = JoinOrExit(*client, absl::GetFlag(FLAGS_expect_generation));
    std::unique_ptr<GlooBackend> backend = ConnectOrExit(client, joined.generation);
    if (absl::Status s = CheckOne(*backend, DType::kFloat64, 1000); !s.ok()) {
      Exit(ExitCode::kFailed, s.ToString());
    }
    BroadcastFromEveryRootOrExit(*backend);
    Say(absl::StrCat("ok generation=", joined.generation));
    return static_cast<int>(ExitCode::kOk);
  }

  if (scenario == "until_failure") {
    const JoinResult joined = JoinOrExit(*client, absl::GetFlag(FLAGS_expect_generation));
    std::unique_ptr<GlooBackend> backend = ConnectOrExit(client, joined.generation);
    RunSuiteOrExit(*backend, /*small=*/true);
    std::vector<float> data(static_cast<size_t>(absl::GetFlag(FLAGS_loop_elements)));
    absl::Status failure;
    uint64_t iteration = 0;
    for (; iteration < 10'000'000; ++iteration) {
      failure = backend->AllreduceSum(data.data(), data.size(), DType::kFloat32);
      if (!failure.ok()) break;
      if (iteration == 0) Touch(absl::GetFlag(FLAGS_ready_file));
    }
    if (failure.ok()) Exit(ExitCode::kFailed, "no failure seen");
    Say(absl::StrCat("allreduce failed at iteration ", iteration, ": ", failure.ToString()));
    if (!IsPeerFailure(failure)) Exit(ExitCode::kFailed, "unexpected error code");
    // After a failure the backend stays failed.
    if (backend->AllreduceSum(data.data(), data.size(), DType::kFloat32).ok()) {
      Exit(ExitCode::kFailed, "allreduce succeeded after a failure");
    }
    if (!absl::GetFlag(FLAGS_rejoin)) {
      return static_cast<int>(ExitCode::kFailedAsExpected);
    }
    HeartbeatParams heartbeat;
    heartbeat.node_rank = rank;
    heartbeat.generation = joined.generation;
    heartbeat.iteration = iteration;
    heartbeat.node_error = failure;
    absl::StatusOr<HeartbeatResult> answer = client->Heartbeat(heartbeat);
    if (!answer.ok()) Exit(ExitCode::kFailed, answer.status().ToString());
    if (!answer->abort) Exit(ExitCode::kFailed, "leader did not abort after a reported error");
    Say(absl::StrCat("leader says abort: ", answer->abort_reason));
    backend.reset();
    const JoinResult rejoined = JoinOrExit(*client, joined.generation + 1);
    backend = ConnectOrExit(client, rejoined.generation);
    RunSuiteOrExit(*backend, /*small=*/false);
    Say(absl::StrCat("ok generation=", rejoined.generation));
    return static_cast<int>(ExitCode::kOk);
  }

  if (scenario == "abort_self") {
    const JoinResult joined = JoinOrExit(*client, absl::GetFlag(FLAGS_expect_generation));
    std::unique_ptr<GlooBackend> backend = ConnectOrExit(client, joined.generation);
    // The peer never enters this allreduce; only Abort can end it before
    // the (long) timeout.
    // Not an ordering the test relies on: an Abort that lands before the
    // allreduce starts fails it the same way (the abort is sticky). The
    // delay makes the intended case, a collective blocked in a receive,
    // the likely one; Gloo exposes no state that says a receive is blocked.
    std::thread aborter([&backend] {
      absl::SleepFor(absl::Milliseconds(300));
      backend->Abort("test abort from the node itself");
    });
    std::vector<float> data(1024, 1.0f);
    const absl::Status first = backend->AllreduceSum(data.data(), data.size(), DType::kFloat32);
    aborter.join();
    Say(absl::StrCat("in-flight allreduce: ", first.ToString()));
    const absl::Status second = backend->AllreduceSum(data.data(), data.size(), DType::kFloat32);
    Say(absl::StrCat("next allreduce: ", second.ToString()));
    Touch(absl::GetFlag(FLAGS_ready_file));
    if (CodeOf(first) != v1::PEER_FAILED || CodeOf(second) != v1::PEER_FAILED ||
        first.message().find("test abort") == absl::string_view::npos) {
      Exit(ExitCode::kFailed, "abort did not fail the allreduce with PEER_FAILED");
    }
    return static_cast<int>(ExitCode::kOk);
  }

  if (scenario == "wait_then_allreduce") {
    const JoinResult joined = JoinOrExit(*client, absl::GetFlag(FLAGS_expect_generation));
    std::unique_ptr<GlooBackend> backend = ConnectOrExit(client, joined.generation);
    const std::string go = absl::GetFlag(FLAGS_go_file);
    if (!testing::WaitUntil([&] { return std::ifstream(go).good(); }, absl::Seconds(30))) {
      Exit(ExitCode::kFailed, "go file never appeared");
    }
    std::vector<float> data(1024, 1.0f);
    const absl::Status status = backend->AllreduceSum(data.data(), data.size(), DType::kFloat32);
    Say(absl::StrCat("allreduce after the peer aborted: ", status.ToString()));
    if (!IsPeerFailure(status)) Exit(ExitCode::kFailed, "expected a peer failure");
    return static_cast<int>(ExitCode::kOk);
  }

  Exit(ExitCode::kUsage, absl::StrCat("unknown scenario ", scenario));
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int code = gradsync::Main();
  std::fflush(stdout);
  // Skip static destructors: gRPC and Gloo threads may still be unwinding.
  std::_Exit(code);
}
