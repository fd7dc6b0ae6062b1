#include "daemon/backends/gloo_backend.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/half_convert.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/backends/batch_scheduling.h"
#include "daemon/backends/gather_sum.h"
#include "daemon/backends/gloo_mesh.h"
#include "daemon/backends/gloo_store.h"
#include "daemon/backends/ring_average.h"
#include "daemon/backends/wire_cast.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/config.h"
#include "gloo/context.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

bool LooksLikeTimeout(const std::string& what) {
  const std::string lower = absl::AsciiStrToLower(what);
  return lower.find("timeout") != std::string::npos || lower.find("timed out") != std::string::npos;
}

// Gloo's TCP pairs write with writev(2), which raises SIGPIPE once the peer
// has reset the connection: by default that kills the process exactly when
// a peer dies. Ignored (unless the program has a handler of its own), the
// write fails with EPIPE and Gloo reports the peer failure as an exception.
void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current = {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore = {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

// Prefixes a message while keeping the status' gradsync code.
absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  return MakeError(CodeOf(status), absl::StrCat(prefix, status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooBackend>> GlooBackend::Create(
    const GlooBackendOptions& options) {
  if (options.num_nodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: num_nodes=", options.num_nodes, " must be >= 1"));
  }
  if (options.node_rank < 0 || options.node_rank >= options.num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("gloo backend: node_rank=", options.node_rank,
                                                   " is out of range [0, ", options.num_nodes,
                                                   ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo backend: timeout must be positive");
  }
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo backend: world_size=", options.world_size, " must be >= 1"));
  }
  if (options.num_nodes == 1) {
    return std::unique_ptr<GlooBackend>(new GlooBackend(options, nullptr));
  }
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("gloo backend: no rendezvous store");
  }
  if (options.store_prefix.empty()) {
    return absl::InvalidArgumentError("gloo backend: no key prefix in the rendezvous store");
  }
  if (options.host.empty() && options.iface.empty()) {
    return absl::InvalidArgumentError("gloo backend: neither host nor iface given");
  }

  IgnoreSigpipe();
  const std::string where =
      absl::StrCat("gloo connect of node_rank=", options.node_rank,
                   " generation=", options.generation, " (", options.num_nodes, " nodes): ");
  try {
    gloo::transport::tcp::attr attr;
    if (!options.iface.empty()) {
      attr.iface = options.iface;
    } else {
      attr.hostname = options.host;
    }
    std::shared_ptr<gloo::transport::Device> device;
    {
      // The device starts Gloo's event-loop thread: SCHED_BATCH, so that
      // it never preempts the thread whose send it waits for (see
      // batch_scheduling.h).
      InheritedBatchScheduling batch;
      device = gloo::transport::tcp::CreateDevice(attr);
    }
    auto context = std::make_shared<MeshContext>(options.node_rank, options.num_nodes);
    // Gloo waits up to 5x the context timeout for a pair to connect; a fifth
    // of ours while connecting keeps Create within about `timeout` when a
    // peer dies mid-connect. Allreduces get the full timeout explicitly.
    context->setTimeout(
        absl::ToChronoMilliseconds(std::max(options.timeout / 5, absl::Seconds(1))));
    // Generation-scoped keys: the leader refuses and discards them once the
    // generation is over, and a Wait on them fails when it aborts.
    gloo::rendezvous::PrefixStore store(options.store_prefix, *options.store);
    context->ConnectAllPairs(store, device);
    context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
    spdlog::info("event=gloo_connected node_rank={} num_nodes={} generation={} device={}",
                 options.node_rank, options.num_nodes, options.generation, LogValue(device->str()));
    return std::unique_ptr<GlooBackend>(new GlooBackend(options, std::move(context)));
  } catch (const GlooStoreError& e) {
    return Annotate(e.status(), where);
  } catch (const gloo::IoException& e) {
    // A peer's connection failed: that node, not a daemon of ours, is gone.
    return MakeError(LooksLikeTimeout(e.what()) ? v1::TIMEOUT : v1::PEER_FAILED,
                     absl::StrCat(where, e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(where, e.what()));
  } catch (const std::exception& e) {
    // Includes gloo::Exception (e.g. an unresolvable host in CreateDevice).
    return absl::UnavailableError(absl::StrCat(where, e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(where, "unknown exception"));
  }
}

GlooBackend::GlooBackend(const GlooBackendOptions& options, std::shared_ptr<gloo::Context> context)
    : node_rank_(options.node_rank),
      num_nodes_(options.num_nodes),
      generation_(options.generation),
      timeout_(options.timeout),
      context_(std::move(context)),
      wire_dtype_(options.wire_dtype),
      world_size_(options.world_size) {}

GlooBackend::~GlooBackend() = default;

void GlooBackend::ReserveStaging(size_t elements) {
  if (staging_.size() < elements) staging_.resize(elements);
}

std::string GlooBackend::Describe(size_t count, DType dtype) const {
  return absl::StrCat("allreduce of ", count, " ", DTypeName(dtype), " (", count * DTypeSize(dtype),
                      " bytes) on node_rank=", node_rank_, " generation=", generation_);
}

template <typename T>
void GlooBackend::RunAllreduce(T* data, size_t count) {
  gloo::AllreduceOptions opts(context_);
  opts.setOutput<T>(data, count);  // in place: the output is also the input
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  opts.setReduceFunction(static_cast<ReduceFn>(&gloo::sum<T>));
  opts.setTimeout(absl::ToChronoMilliseconds(timeout_));
  gloo::allreduce(opts);
}

template <typename T>
absl::Status GlooBackend::RunGatherSum(T* data, size_t count) {
  const size_t row = GatherRowElements(count);
  const size_t doubles = (row * sizeof(T) + sizeof(double) - 1) / sizeof(double);
  if (gather_send_.size() < doubles) gather_send_.resize(doubles);
  if (gathered_.size() < doubles * static_cast<size_t>(num_nodes_)) {
    gathered_.resize(doubles * static_cast<size_t>(num_nodes_));
  }
  T* send = reinterpret_cast<T*>(gather_send_.data());
  T* gathered = reinterpret_cast<T*>(gathered_.data());
  PrepareGather(data, count, num_nodes_, send, gathered);
  gloo::AllgatherOptions opts(context_);
  opts.setInput<T>(send, row);
  opts.setOutput<T>(gathered, row * static_cast<size_t>(num_nodes_));
  opts.setTimeout(absl::ToChronoMilliseconds(timeout_));
  gloo::allgather(opts);
  if (const int node = CheckGatheredRows(gathered, count, num_nodes_); node >= 0) {
    return MakeError(v1::PEER_FAILED,
                     absl::StrCat(Describe(count, sizeof(T) == sizeof(float) ? DType::kFloat32
                                                                             : DType::kFloat64),
                                  ": node_rank=", node,
                                  " sent a collective of another length (the nodes issued "
                                  "different collectives)"));
  }
  SumGathered(gathered, count, num_nodes_, data);
  return absl::OkStatus();
}

void GlooBackend::RunCompressedAllreduce(float* data, size_t count) {
  // The casts run where the buffer is (the worker's shared memory): no
  // copy; the ring moves half the bytes.
  NarrowInPlace(data, count, wire_dtype_, 1.0f / static_cast<float>(world_size_));
  auto* wire = reinterpret_cast<uint16_t*>(data);
  gloo::AllreduceOptions opts(context_);
  opts.setOutput<uint16_t>(wire, count);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  opts.setReduceFunction(WireSum(wire_dtype_));
  opts.setTimeout(absl::ToChronoMilliseconds(timeout_));
  gloo::allreduce(opts);
  WidenInPlace(data, count, wire_dtype_, static_cast<float>(world_size_));
}

// A template, not a std::function: no allocation per collective.
template <typename Run>
absl::Status GlooBackend::RunGuarded(const void* data, size_t count, DType dtype, Run&& run) {
  RETURN_IF_ERROR(CheckAllreduceArgs(data, count, dtype, "gloo"));
  if (count == 0) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(failure_);
    if (aborted_) {
      failure_ = MakeError(v1::PEER_FAILED,
                           absl::StrCat(Describe(count, dtype), " aborted: ", abort_reason_));
      return failure_;
    }
  }
  if (context_ == nullptr) return absl::OkStatus();  // one node: nothing to exchange

  try {
    return run();
  } catch (const gloo::IoException& e) {
    // "Connection closed by peer" and the like: another node failed (which
    // one the leader tells, see ClusterLink::Explain: in a ring the closed
    // connection is often a survivor's that gave up first).
    const v1::Code code = LooksLikeTimeout(e.what()) ? v1::TIMEOUT : v1::PEER_FAILED;
    return Fail(MakeError(code, absl::StrCat(Describe(count, dtype), " failed: ", e.what())));
  } catch (const gloo::EnforceNotMet& e) {
    return Fail(absl::InternalError(absl::StrCat(Describe(count, dtype), " failed: ", e.what())));
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(absl::StrCat(Describe(count, dtype), " failed: ", e.what())));
  } catch (...) {
    return Fail(absl::InternalError(absl::StrCat(Describe(count, dtype), " failed")));
  }
}

absl::Status GlooBackend::AllreduceSum(void* data, size_t count, DType dtype) {
  return RunGuarded(data, count, dtype, [&]() -> absl::Status {
    switch (dtype) {
      case DType::kFloat32:
        if (wire_dtype_ != WireDType::kOff) {
          RunCompressedAllreduce(static_cast<float*>(data), count);
        } else if (UseGatherSum(count, dtype, wire_dtype_, num_nodes_)) {
          RETURN_IF_ERROR(FailIfError(RunGatherSum(static_cast<float*>(data), count)));
        } else {
          RunAllreduce(static_cast<float*>(data), count);
        }
        break;
      case DType::kFloat64:
        if (UseGatherSum(count, dtype, wire_dtype_, num_nodes_)) {
          RETURN_IF_ERROR(FailIfError(RunGatherSum(static_cast<double*>(data), count)));
        } else {
          RunAllreduce(static_cast<double*>(data), count);
        }
        break;
      case DType::kFloat16:
        RunAllreduce(static_cast<gloo::float16*>(data), count);
        break;
      case DType::kBFloat16: {
        // Whole blocks (AVX2 where the CPU has it): the bits the scalar
        // conversions give, at a fraction of the passes' time.
        ReserveStaging(count);
        uint16_t* values = static_cast<uint16_t*>(data);
        float* wide = staging_.data();
        BFloat16ToFloatBlock(values, wide, count);
        RunAllreduce(wide, count);
        FloatToBFloat16Block(wide, values, count);
        break;
      }
    }
    return absl::OkStatus();
  });
}

absl::Status GlooBackend::AllreduceAverage(void* data, size_t count, DType dtype, int divisor,
                                           bool check, RingAverageOutcome* outcome) {
  *outcome = RingAverageOutcome{};
  if (divisor <= 0 || context_ == nullptr ||
      !CanAverageInRing(count, dtype, wire_dtype_, num_nodes_)) {
    return AllreduceSum(data, count, dtype);
  }
  RingAverage ring(static_cast<char*>(data), count, dtype, divisor, check);
  RETURN_IF_ERROR(RunGuarded(data, count, dtype, [&]() -> absl::Status {
    gloo::AllreduceOptions opts(context_);
    if (dtype == DType::kFloat64) {
      opts.setOutput<double>(static_cast<double*>(data), count);
    } else {
      opts.setOutput<float>(static_cast<float*>(data), count);
    }
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(ring.ReduceFunction());
    opts.setTimeout(absl::ToChronoMilliseconds(timeout_));
    gloo::allreduce(opts);
    RETURN_IF_ERROR(FailIfError(ring.Verify()));
    return FailIfError(CheckOwnedRange(ring, count, dtype, check));
  }));
  outcome->divided = true;
  outcome->averaged_begin = ring.averaged_begin();
  outcome->averaged_end = ring.averaged_end();
  outcome->non_finite = ring.non_finite();
  outcome->input_non_finite = ring.input_non_finite();
  outcome->input_element = ring.input_element();
  outcome->input_value = ring.input_value();
  return absl::OkStatus();
}

absl::Status GlooBackend::CheckOwnedRange(const RingAverage& ring, size_t count, DType dtype,
                                          bool check) const {
  // The daemon left these inputs unscanned, trusting the ring to test them.
  const ElementRange owned = RingOwnedElements(count, DTypeSize(dtype), node_rank_);
  if (!check || (ring.averaged_begin() == owned.begin && ring.averaged_end() == owned.end)) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat(
      "Gloo's ring averaged elements [", ring.averaged_begin(), ", ", ring.averaged_end(),
      ") of a ", count, "-element piece on node_rank=", node_rank_, ", not [", owned.begin, ", ",
      owned.end, "): inputs outside both would go unchecked for NaN or Inf"));
}

absl::Status GlooBackend::Broadcast(void* data, size_t bytes, int root_node) {
  const std::string what = absl::StrCat("broadcast of ", bytes, " bytes from node_rank=", root_node,
                                        " on node_rank=", node_rank_, " generation=", generation_);
  if (root_node < 0 || root_node >= num_nodes_) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no such node"));
  }
  if (bytes != 0 && data == nullptr) return absl::InvalidArgumentError(what + ": null buffer");
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(failure_);
    if (aborted_) {
      failure_ = MakeError(v1::PEER_FAILED, absl::StrCat(what, " aborted: ", abort_reason_));
      return failure_;
    }
  }
  if (context_ == nullptr || bytes == 0) return absl::OkStatus();
  try {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(data), bytes);  // the root's is the input
    opts.setRoot(root_node);
    opts.setTimeout(absl::ToChronoMilliseconds(timeout_));
    gloo::broadcast(opts);
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    const v1::Code code = LooksLikeTimeout(e.what()) ? v1::TIMEOUT : v1::PEER_FAILED;
    return Fail(MakeError(code, absl::StrCat(what, " failed: ", e.what())));
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(absl::StrCat(what, " failed: ", e.what())));
  } catch (...) {
    return Fail(absl::InternalError(what + " failed"));
  }
}

absl::Status GlooBackend::Fail(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    // Whatever Gloo says, an operation we aborted failed because of the abort.
    if (aborted_) {
      status = MakeError(v1::PEER_FAILED,
                         absl::StrCat(status.message(), " [aborted: ", abort_reason_, "]"));
    }
    if (failure_.ok()) failure_ = status;
  }
  spdlog::error("event=gloo_allreduce_failed node_rank={} generation={} code={} error={}",
                node_rank_, generation_, v1::Code_Name(CodeOf(status)), LogValue(status.message()));
  // Neighbours blocked on this node learn of the failure now, not at their
  // timeout.
  CloseContext(absl::StrCat("gradsync: node_rank=", node_rank_, " failed"));
  return status;
}

void GlooBackend::Abort(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
  }
  spdlog::warn("event=gloo_abort node_rank={} generation={} reason={}", node_rank_, generation_,
               LogValue(reason));
  CloseContext(absl::StrCat("gradsync abort: ", reason));
}

void GlooBackend::CloseContext(const std::string& reason) {
  if (context_ == nullptr) return;
  // Gloo's own failure path, triggered on purpose: a receive wait that times
  // out makes the transport context fail every pending operation of every
  // pair (waking threads blocked in them) and close the sockets. The probe
  // buffer has no receive posted, so its 1 ms wait always times out.
  char probe_byte = 0;
  try {
    std::unique_ptr<gloo::transport::UnboundBuffer> probe =
        context_->createUnboundBuffer(&probe_byte, sizeof(probe_byte));
    probe->waitRecv(nullptr, std::chrono::milliseconds(1));
  } catch (const std::exception&) {
    // Expected: the timeout we asked for (or the pairs had failed already).
  }
  spdlog::info("event=gloo_context_closed node_rank={} generation={} reason={}", node_rank_,
               generation_, LogValue(reason));
}

}  // namespace gradsync
