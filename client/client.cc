#include "client/client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "client/cuda_tensors.h"
#include "client/daemon_connection.h"
#include "client/launcher_world_size.h"
#include "client/local_rank.h"
#include "client/trainer_device_factory.h"
#include "common/default_socket.h"
#include "common/hop_trace.h"
#include "common/monotonic.h"
#include "common/peer_credentials.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel_posix.h"
#include "ipc/mark_checksum.h"

namespace gradsync {
namespace {

using Clock = std::chrono::steady_clock;

// The daemon reports its own timeouts with a diagnosis; the client's own
// deadline comes a little later so that diagnosis arrives first.
constexpr int64_t kGraceMs = 5000;
// A daemon whose heartbeat stops for this long is treated as dead even if
// its socket stays open (e.g. it was SIGSTOPped).
constexpr auto kHeartbeatPatience = std::chrono::seconds(10);
constexpr auto kPollSlice = std::chrono::milliseconds(50);
constexpr auto kDefaultSpin = std::chrono::microseconds(30);

// How long gs_wait spins before sleeping. Spinning wins only when every
// spinning process (the node's trainers and the daemon) has a core of its
// own; otherwise spinners steal the CPU the daemon needs to finish the
// bucket. Never across nodes: the collective takes at least a network round
// trip (a 4 KB iteration on loopback ~150 µs), so a 30 µs spin right after
// the marks almost never sees the completion, and it holds the core the
// daemon, woken by those marks, and the Gloo worker need (2 daemons x 1
// trainer on 2 cores, 4 KB: 33 µs from mark to the daemon seeing it with the
// spin, 2.5 µs without; p50 iteration 329 -> 190 µs; docs/PERFORMANCE.md).
// $GRADSYNC_SPIN_US overrides.
std::chrono::nanoseconds WaitSpin(int local_size, int num_nodes) {
  if (const char* env = std::getenv("GRADSYNC_SPIN_US"); env && *env) {
    return std::chrono::microseconds(std::max(0, std::atoi(env)));
  }
  const unsigned cores = std::thread::hardware_concurrency();
  return num_nodes <= 1 && static_cast<unsigned>(local_size) + 1 <= cores
             ? kDefaultSpin
             : std::chrono::nanoseconds(0);
}

std::chrono::system_clock::time_point DeadlineIn(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

absl::Status RpcError(const grpc::Status& s, const std::string& what, const std::string& socket) {
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return MakeError(v1::TIMEOUT, absl::StrCat(what, " timed out waiting for gradsyncd at ", socket,
                                               " (", s.error_message(), ")"));
  }
  return MakeError(v1::UNAVAILABLE, absl::StrCat(what, " failed: cannot reach gradsyncd at ",
                                                 socket, " (", s.error_message(), ")"));
}

// A call within a session: the daemon answered Attach, so a transport
// failure now means it died (or closed the socket), not that it was never
// there; PEER_FAILED names it as gs_wait's lost-connection error does.
absl::Status SessionRpcError(const grpc::Status& s, const std::string& what,
                             const std::string& socket, int64_t daemon_pid) {
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return RpcError(s, what, socket);
  return MakeError(v1::PEER_FAILED,
                   absl::StrCat(what, " failed: lost the connection to gradsyncd (pid ", daemon_pid,
                                ") at ", socket, ": the daemon died (", s.error_message(), ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  std::unique_ptr<Client> c(new Client());
  c->socket_path_ = options.socket_path;
  if (c->socket_path_.empty()) {
    const char* env = std::getenv("GRADSYNC_SOCKET");
    c->socket_path_ = (env && *env) ? env : ClientDefaultSocketPath();
  }
  ASSIGN_OR_RETURN(c->local_rank_, ResolveLocalRank(options.local_rank, std::getenv("LOCAL_RANK")));
  c->device_ = options.device;
  const int64_t timeout_ms = options.timeout_ms > 0 ? options.timeout_ms : 30000;
  if (const char* env = std::getenv("GRADSYNC_DEBUG"); env && std::string_view(env) == "detail") {
    c->checksum_marks_ = true;
  }

  // Verified before gRPC sees the connection, which it then uses as is: a
  // channel from an fd never reconnects to whoever holds the path later.
  ASSIGN_OR_RETURN(
      const DaemonConnection daemon,
      ConnectToDaemon(c->socket_path_, MonotonicNow() + absl::Milliseconds(timeout_ms)));
  c->daemon_uid_ = daemon.daemon.uid;
  c->daemon_peer_ = DescribePeer(daemon.daemon);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  c->channel_ = grpc::CreateCustomInsecureChannelFromFd("gradsyncd", daemon.fd, args);
  c->stub_ = v1::Local::NewStub(c->channel_);

  v1::AttachRequest req;
  req.set_local_rank(c->local_rank_);
  req.set_pid(getpid());
  req.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
  v1::AttachResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout_ms));
  grpc::Status s = c->stub_->Attach(&ctx, req, &resp);
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return RpcError(s, "attach", c->socket_path_);
  }
  if (!s.ok()) {
    // The daemon closes the connection of a user it does not serve.
    return MakeError(v1::UNAVAILABLE,
                     absl::StrCat("attach failed: gradsyncd at ", c->socket_path_, " (",
                                  c->daemon_peer_, ") dropped the connection (", s.error_message(),
                                  "): a daemon serves only its own user, root and members of its "
                                  "--shm-group (see its log)"));
  }
  RETURN_IF_ERROR(FromProto(resp.error()));
  c->session_ = resp.session_id();
  c->daemon_pid_ = resp.daemon_pid();
  c->daemon_timeout_ms_ = resp.timeout_ms();
  c->spin_ = WaitSpin(resp.local_size(), resp.num_nodes());

  // The Watch stream lets the daemon notice our death and push errors.
  c->watch_ctx_ = std::make_unique<grpc::ClientContext>();
  Client* raw = c.get();
  c->watch_thread_ = std::thread([raw] { raw->WatchLoop(); });
  // Return only once the daemon holds the stream: a trainer that dies
  // right after connecting must still be noticed.
  bool established = false;
  {
    MonotonicMutexLock lock(&raw->watch_mu_);
    auto settled = [raw] {
      raw->watch_mu_.AssertReaderHeld();
      return raw->watch_established_ || !raw->watch_error_.ok() || raw->watch_ended_;
    };
    const bool up =
        raw->watch_mu_.AwaitWithTimeout(absl::Condition(&settled), absl::Milliseconds(timeout_ms));
    established = up && raw->watch_established_;
  }
  // (Destroying `c` joins the Watch thread, which takes watch_mu_.)
  if (!established) {
    return MakeError(v1::UNAVAILABLE,
                     absl::StrCat("gradsyncd at ", c->socket_path_,
                                  " accepted the attach but not the Watch stream"));
  }
  return c;
}

Client::~Client() { Close().IgnoreError(); }

void Client::WatchLoop() {
  v1::WatchRequest req;
  req.set_session_id(session_);
  std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader = stub_->Watch(watch_ctx_.get(), req);
  v1::WatchEvent event;
  while (reader->Read(&event)) {
    MonotonicMutexLock lock(&watch_mu_);
    watch_established_ = true;
    if (event.has_error() && event.error().code() != v1::OK) {
      if (watch_error_.ok()) watch_error_ = FromProto(event.error());
      if (ipc::Doorbell* b = completion_bell_.load()) b->Ring();
    }
  }
  {
    MonotonicMutexLock lock(&watch_mu_);
    watch_ended_ = true;
  }
  reader->Finish().IgnoreError();
  if (closing_.load()) return;
  MonotonicMutexLock lock(&watch_mu_);
  if (watch_error_.ok()) {
    watch_error_ = MakeError(
        v1::PEER_FAILED, absl::StrCat("lost the connection to gradsyncd (pid ", daemon_pid_,
                                      ") at ", socket_path_, ": the daemon died or was stopped"));
  }
  if (ipc::Doorbell* b = completion_bell_.load()) b->Ring();
}

absl::Status Client::ConnectionError() const {
  MonotonicMutexLock lock(&watch_mu_);
  return watch_error_;
}

absl::Status Client::Failed(absl::Status error) {
  if (failure_.ok()) failure_ = error;
  return failure_;
}

absl::Status Client::CheckNotJoined(const char* call) const {
  if (!joined_) return absl::OkStatus();
  return MakeError(v1::INVALID_ARGUMENT,
                   absl::StrCat(call, " on rank ", rank_, " (local ", local_rank_,
                                ") after its gs_join: a joined trainer takes part in no more "
                                "iterations"));
}

absl::Status Client::CheckUsable() const {
  if (closed_) return MakeError(v1::STATE, "the client is closed");
  RETURN_IF_ERROR(failure_);
  if (!registered_) return MakeError(v1::STATE, "register the gradient layout first");
  return absl::OkStatus();
}

absl::Status Client::Register(const std::vector<TensorSpec>& specs) {
  if (closed_) return MakeError(v1::STATE, "the client is closed");
  RETURN_IF_ERROR(failure_);
  if (registered_) return MakeError(v1::STATE, "the layout is already registered");
  v1::RegisterRequest req;
  req.set_session_id(session_);
  for (const TensorSpec& s : specs) {
    v1::TensorSpec* t = req.add_tensors();
    t->set_name(s.name);
    t->set_dtype(static_cast<v1::DType>(s.dtype));
    t->set_numel(s.numel);
    t->set_device(s.device);
  }
  absl::StatusOr<Layout> layout = LayoutFromProto(req.tensors());
  if (!layout.ok()) return MakeError(v1::INVALID_ARGUMENT, layout.status().message());
  if (!layout->empty() && (*layout)[0].device >= 0) {
    if (!device_) {
      absl::StatusOr<std::shared_ptr<gpu::TrainerDevice>> d = NewDefaultTrainerDevice();
      if (!d.ok()) {
        return MakeError(v1::INVALID_ARGUMENT, absl::StrCat("tensor 0 '", (*layout)[0].name,
                                                            "' is on cuda:", (*layout)[0].device,
                                                            ": ", d.status().message()));
      }
      device_ = std::move(*d);
    }
    // From the request on the daemon may hold our events: every failure
    // below leaves them to Close, which destroys them after Detach.
    ASSIGN_OR_RETURN(cuda_, CudaTensors::Prepare(device_, specs, cuda_stream_, &req));
  }
  CudaTensors* cuda = cuda_.get();

  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  // Forming a multi-node job may take the daemon's timeout for the
  // rendezvous and again for connecting Gloo.
  ctx.set_deadline(DeadlineIn(2 * daemon_timeout_ms_ + kGraceMs));
  grpc::Status s = stub_->Register(&ctx, req, &resp);
  if (!s.ok()) return Failed(SessionRpcError(s, "register", socket_path_, daemon_pid_));
  if (absl::Status st = FromProto(resp.error()); !st.ok()) return Failed(st);
  if (absl::Status st = CheckLauncherWorldSize(resp.world_size(), std::getenv("WORLD_SIZE"));
      !st.ok()) {
    return Failed(st);
  }

  if (resp.layout_hash() != LayoutHash(*layout) ||
      static_cast<size_t>(resp.tensor_offsets_size()) != layout->size()) {
    return Failed(MakeError(v1::INTERNAL, "the daemon answered with a different layout"));
  }
  // Owned by the daemon we verified, whoever we are (root included).
  auto node = ipc::NodeSegment::Open(resp.node_segment_name(), daemon_uid_);
  if (!node.ok()) return Failed(MakeError(v1::INTERNAL, node.status().ToString()));
  auto seg = ipc::TrainerSegment::Open(resp.segment_name(), resp.layout_hash(), resp.arena_bytes(),
                                       daemon_uid_);
  if (!seg.ok()) return Failed(MakeError(v1::INTERNAL, seg.status().ToString()));
  node_ = std::move(*node);
  segment_ = std::move(*seg);
  buffers_.resize(layout->size());
  if (cuda) {
    if (absl::Status st = cuda->Attach(resp, *layout); !st.ok()) return Failed(st);
    for (size_t i = 0; i < layout->size(); ++i) buffers_[i] = static_cast<uint8_t*>(cuda->ptr(i));
  }
  for (size_t i = 0; !cuda_ && i < layout->size(); ++i) {
    const uint64_t off = resp.tensor_offsets(static_cast<int>(i));
    if (off + (*layout)[i].bytes() > segment_.arena_bytes()) {
      return Failed(MakeError(v1::INTERNAL, absl::StrCat("tensor ", i, " lies outside the arena")));
    }
    buffers_[i] = segment_.arena() + off;
  }
  layout_ = std::move(*layout);
  marked_.assign(layout_.size(), 0);
  accumulated_.assign(layout_.size(), 0);
  rank_ = resp.rank();
  world_size_ = resp.world_size();
  job_rank_ = rank_;
  job_world_size_ = world_size_;
  check_replicas_every_ = resp.check_replicas_every();
  // A node that joined a running job: its iterations continue the job's.
  iteration_ = resp.start_iteration();
  // Not checked yet: a check due at the iteration a joiner starts at runs in
  // the grown world, and its trainers take part once they received the
  // job's state (gs_job_info.check_replicas_due says so).
  checked_iteration_ = 0;
  joined_running_job_ = resp.joined_running_job();
  catch_up_root_ = resp.catch_up_root();
  completion_bell_.store(&segment_.header()->completion_bell);
  registered_ = true;
  return absl::OkStatus();
}

void* Client::GradBuffer(size_t index) const {
  if (!registered_ || closed_ || index >= buffers_.size()) return nullptr;
  return buffers_[index];
}

absl::Status Client::SetCudaStream(void* stream) {
  if (closed_) return MakeError(v1::STATE, "the client is closed");
  cuda_stream_ = stream;
  if (cuda_) cuda_->SetStream(stream);
  return absl::OkStatus();
}

absl::Status Client::MarkReady(size_t index) {
  RETURN_IF_ERROR(CheckMarkable(index));
  accumulated_[index] = 1;
  RecordHop(Hop::kTrainerMark, rank_);
  return Post(index, ipc::ReadyKind::kReady);
}

absl::Status Client::MarkUnused(size_t index) {
  // Validate first: a refused call must leave the gradient alone.
  RETURN_IF_ERROR(CheckMarkable(index));
  if (accumulated_[index]) {
    // Gradients accumulated in earlier no_sync iterations stay: "unused"
    // means nothing was added this iteration, not that the sum is lost.
    return Post(index, ipc::ReadyKind::kReady);
  }
  if (cuda_) {
    // Ordered before the readiness event Post records on the same stream.
    if (absl::Status st = cuda_->Zero(index, layout_[index].bytes()); !st.ok()) return Failed(st);
  } else {
    std::memset(buffers_[index], 0, layout_[index].bytes());
  }
  return Post(index, ipc::ReadyKind::kUnused);
}

absl::Status Client::CheckMarkable(size_t index) const {
  RETURN_IF_ERROR(CheckUsable());
  RETURN_IF_ERROR(CheckNotJoined("gs_mark_ready/gs_mark_unused"));
  if (index >= layout_.size()) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat("tensor index ", index, " is out of range (", layout_.size(),
                                  " tensors registered)"));
  }
  if (marked_[index]) {
    return MakeError(v1::INVALID_ARGUMENT, absl::StrCat("tensor ", index, " '", layout_[index].name,
                                                        "' is already marked this iteration"));
  }
  return absl::OkStatus();
}

absl::Status Client::Post(size_t index, ipc::ReadyKind kind) {
  if (!sync_) {
    // Accumulating: nothing is posted.
    marked_[index] = 1;
    ++marked_count_;
    return absl::OkStatus();
  }

  uint16_t event_slot = 0;
  if (cuda_) {
    // The daemon reads the gradient only once it sees this event complete.
    absl::StatusOr<uint16_t> slot = cuda_->Record(index, iteration_);
    if (!slot.ok()) return Failed(slot.status());
    event_slot = *slot;
  }
  ipc::ReadyEvent e{};
  e.event_slot = event_slot;
  e.tensor = static_cast<uint32_t>(index);
  e.kind = static_cast<uint32_t>(kind);
  e.iteration = iteration_;
  e.sequence = ready_sequence_;
  e.no_sync_iterations = no_sync_iterations_;
  // CUDA gradients are not checksummed: that would copy them to the host.
  if (checksum_marks_ && !cuda_) {
    e.checksum = ipc::MarkChecksum(buffers_[index], layout_[index].bytes());
  }
  RETURN_IF_ERROR(PushReady(e));
  marked_[index] = 1;  // only once the daemon can see it
  ++marked_count_;
  return absl::OkStatus();
}

absl::Status Client::PushReady(const ipc::ReadyEvent& e) {
  auto& ring = segment_.ready_ring();
  const auto deadline = Clock::now() + std::chrono::milliseconds(daemon_timeout_ms_ + kGraceMs);
  while (!ring.TryPush(e)) {
    // Full ring: back-pressure while the daemon is busy reducing.
    node_.ready_bell().Ring();
    if (absl::Status st = ConnectionError(); !st.ok()) return Failed(st);
    if (Clock::now() > deadline) {
      return MakeError(v1::TIMEOUT, "the readiness ring stayed full: the daemon is not consuming");
    }
    std::this_thread::yield();
  }
  ++ready_sequence_;
  node_.ready_bell().Ring();
  return absl::OkStatus();
}

absl::Status Client::Join(bool divide_by_initial_world_size) {
  RETURN_IF_ERROR(CheckUsable());
  RETURN_IF_ERROR(CheckNotJoined("gs_join"));
  if (marked_count_ != 0) {
    return MakeError(v1::STATE, absl::StrCat("rank ", rank_, " (local ", local_rank_,
                                             "): gs_join must be called between iterations (",
                                             marked_count_, " tensors are marked)"));
  }
  ipc::ReadyEvent e{};
  e.kind = static_cast<uint32_t>(ipc::ReadyKind::kJoin);
  e.tensor = divide_by_initial_world_size ? ipc::kJoinDivideByInitialWorldSize : 0;
  e.iteration = iteration_;
  e.sequence = ready_sequence_;
  RETURN_IF_ERROR(PushReady(e));
  joined_ = true;
  // No deadline of its own: the other trainers may run many iterations;
  // the job's failure, the daemon's death or its hang end the wait.
  return AwaitCompletion(-1, /*joined=*/true);
}

std::string Client::UnmarkedTensors() const {
  std::string out;
  size_t listed = 0, missing = 0;
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (marked_[i]) continue;
    ++missing;
    if (listed++ < 8) absl::StrAppend(&out, out.empty() ? "" : ", ", layout_[i].name);
  }
  if (missing > 8) absl::StrAppend(&out, " and ", missing - 8, " more");
  return out;
}

absl::Status Client::Wait(int64_t timeout_ms) {
  RETURN_IF_ERROR(CheckUsable());
  RETURN_IF_ERROR(CheckNotJoined("gs_wait"));
  if (!sync_) {
    // Accumulating: nothing was posted, the next synced iteration reduces
    // the sum. The marks start over.
    ++no_sync_iterations_;
    std::fill(marked_.begin(), marked_.end(), 0);
    marked_count_ = 0;
    return absl::OkStatus();
  }
  return AwaitCompletion(timeout_ms >= 0 ? timeout_ms : daemon_timeout_ms_ + kGraceMs,
                         /*joined=*/false);
}

absl::Status Client::AwaitCompletion(int64_t budget, bool joined) {
  const auto deadline =
      budget >= 0 ? Clock::now() + std::chrono::milliseconds(budget) : Clock::time_point::max();
  uint64_t heartbeat = node_.header()->heartbeat.load(std::memory_order_acquire);
  auto heartbeat_seen = Clock::now();
  ipc::Doorbell& bell = segment_.header()->completion_bell;
  auto& ring = segment_.completion_ring();
  while (true) {
    const uint32_t seen = bell.Sequence();
    ipc::CompletionEvent e;
    const ipc::PopResult r = ring.TryPop(&e);
    if (r == ipc::PopResult::kCorrupt) {
      return Failed(MakeError(v1::INTERNAL, "the completion ring is corrupt"));
    }
    if (r == ipc::PopResult::kOk) {
      if (e.sequence != completion_sequence_) {
        return Failed(
            MakeError(v1::INTERNAL, absl::StrCat("completion entry has sequence ", e.sequence,
                                                 ", expected ", completion_sequence_)));
      }
      ++completion_sequence_;
      switch (static_cast<ipc::CompletionKind>(e.kind)) {
        case ipc::CompletionKind::kBucketDone:
          continue;
        case ipc::CompletionKind::kAllJoined:
          if (!joined) {
            return Failed(
                MakeError(v1::INTERNAL, "the daemon ended the join before this trainer joined"));
          }
          return absl::OkStatus();
        case ipc::CompletionKind::kIterationDone:
          if (joined || e.iteration != iteration_) {
            return Failed(
                MakeError(v1::INTERNAL, absl::StrCat("daemon completed iteration ", e.iteration,
                                                     " while this trainer is at ", iteration_)));
          }
          if (e.world_size == 0 || e.rank < 0) {
            return Failed(
                MakeError(v1::INTERNAL,
                          absl::StrCat("daemon completed iteration ", e.iteration,
                                       " with world size ", e.world_size, " and rank ", e.rank)));
          }
          job_world_size_ = static_cast<int>(e.world_size);
          job_rank_ = e.rank;
          ++iteration_;
          step_skipped_ = (e.flags & ipc::kCompletionSkipStep) != 0;
          if ((e.flags & ipc::kCompletionMembersChanged) != 0) ++membership_changes_;
          if ((e.flags & ipc::kCompletionNodesJoined) != 0) ++nodes_joined_;
          if ((e.flags & ipc::kCompletionTrainersJoined) != 0) ++trainers_joined_;
          if ((e.flags & (ipc::kCompletionNodesJoined | ipc::kCompletionTrainersJoined)) != 0) {
            catch_up_root_ = e.catch_up_root;
          }
          no_sync_iterations_ = 0;
          std::fill(marked_.begin(), marked_.end(), 0);
          std::fill(accumulated_.begin(), accumulated_.end(), 0);  // reduced: a fresh start
          marked_count_ = 0;
          RecordHop(Hop::kTrainerWoken, rank_);
          return absl::OkStatus();
        case ipc::CompletionKind::kError: {
          std::string message = segment_.ErrorMessage();
          if (message.empty()) message = "the daemon reported an error";
          const int code = v1::Code_IsValid(e.status) && e.status != 0 ? e.status : v1::INTERNAL;
          return Failed(MakeError(static_cast<v1::Code>(code), message));
        }
        default:
          return Failed(MakeError(v1::INTERNAL, absl::StrCat("unknown completion kind ", e.kind)));
      }
    }
    if (absl::Status st = ConnectionError(); !st.ok()) return Failed(st);
    const auto now = Clock::now();
    const uint64_t hb = node_.header()->heartbeat.load(std::memory_order_acquire);
    if (hb != heartbeat) {
      heartbeat = hb;
      heartbeat_seen = now;
    } else if (now - heartbeat_seen > kHeartbeatPatience) {
      return Failed(MakeError(v1::PEER_FAILED,
                              absl::StrCat("gradsyncd (pid ", daemon_pid_,
                                           ") stopped heart-beating: it is hung or stopped")));
    }
    if (now >= deadline) {
      const std::string unmarked = UnmarkedTensors();
      return MakeError(
          v1::TIMEOUT,
          absl::StrCat("iteration ", iteration_, " not synchronized within ", budget,
                       " ms on rank ", rank_, ": ",
                       unmarked.empty()
                           ? "every tensor is marked here; other trainers have not marked theirs "
                             "or the collective is slow (see gradsyncctl stats)"
                           : absl::StrCat("this trainer has not marked ", unmarked,
                                          " (call gs_mark_ready or gs_mark_unused for each)")));
    }
    const auto left = deadline == Clock::time_point::max()
                          ? std::chrono::nanoseconds(kPollSlice)
                          : std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
    bell.Wait(seen, std::min<std::chrono::nanoseconds>(left, kPollSlice), spin_);
  }
}

absl::Status Client::SetSync(bool enabled) {
  RETURN_IF_ERROR(CheckUsable());
  RETURN_IF_ERROR(CheckNotJoined("gs_set_sync"));
  if (marked_count_ != 0) {
    return MakeError(v1::STATE, "gs_set_sync must be called between iterations");
  }
  sync_ = enabled;
  return absl::OkStatus();
}

absl::Status Client::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  closing_.store(true);
  absl::Status result;
  // CUDA teardown order (cuda_tensors.h): our mapping of the daemon's
  // buffer goes before Detach (the daemon frees it from then on), our
  // events after it (the daemon polls them until then).
  constexpr absl::Duration kCudaDrain = absl::Seconds(10);  // queued backward kernels
  if (cuda_) result = cuda_->ReleaseMemory(kCudaDrain);
  if (stub_ && session_ != 0) {
    v1::DetachRequest req;
    req.set_session_id(session_);
    v1::DetachResponse resp;
    grpc::ClientContext ctx;
    // The last trainer's detach leaves the cluster. A CUDA trainer's detach
    // also waits until the daemon closed what it maps of ours (a release in
    // flight, or a job still opening its GPU path, bounded by twice the
    // daemon's timeout plus 30 s): answered only then, it must not be cut
    // short here, or the caller frees memory the daemon still maps. The
    // daemon maps nothing of a CPU trainer's: 10 s, so a stopped daemon
    // does not hold gs_close for minutes.
    const int64_t detach_ms =
        cuda_ ? std::max<int64_t>(10000, 2 * daemon_timeout_ms_ + 30000 + kGraceMs) : 10000;
    ctx.set_deadline(DeadlineIn(detach_ms));
    grpc::Status s = stub_->Detach(&ctx, req, &resp);
    if (!s.ok() && result.ok()) result = RpcError(s, "detach", socket_path_);
  }
  if (watch_ctx_) watch_ctx_->TryCancel();
  if (watch_thread_.joinable()) watch_thread_.join();
  segment_ = ipc::TrainerSegment();
  node_ = ipc::NodeSegment();
  buffers_.clear();
  cuda_.reset();  // after Detach: the daemon no longer polls our events
  return result;
}

}  // namespace gradsync
