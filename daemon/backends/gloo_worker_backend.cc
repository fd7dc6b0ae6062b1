#include "daemon/backends/gloo_worker_backend.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/hop_trace.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/backends/count_fold.h"
#include "daemon/backends/gloo_store.h"
#include "daemon/backends/gloo_worker_process.h"
#include "daemon/backends/ring_average.h"
#include "gradsync/v1/gloo_worker.pb.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Debian 12's <sys/pidfd.h> lacks extern "C": the system call directly.
int PidfdKill(int pidfd) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0));
}

// How long past its own timeout a silent worker is given before it is
// killed: Gloo's waits end at the timeout, this only covers a hung worker.
constexpr absl::Duration kGrace = absl::Seconds(10);
// What of a dying worker's last words goes into logs and job errors.
constexpr size_t kMaxFatalBytes = 4096;
// How long a worker whose channel was closed may take to exit by itself.
constexpr int kExitWaitMs = 10000;

std::string DescribeExit(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with code ", WEXITSTATUS(wait_status));
  return "ended";
}

// Runs one store call of the worker's against the daemon's store, within
// `allowed` (the generation's Gloo keys: a worker taken over through Gloo
// cannot touch the rest of the job's store with the daemon's token).
v1::GlooWorkerRequest Serve(const v1::GlooStoreRequest& request, gloo::rendezvous::Store& store,
                            const std::string& allowed) {
  v1::GlooWorkerRequest reply;
  v1::GlooStoreReply* out = reply.mutable_store_reply();
  absl::Status status;
  try {
    const std::vector<std::string> keys(request.keys().begin(), request.keys().end());
    for (const std::string& key : keys) {
      if (!absl::StartsWith(key, allowed)) {
        status =
            MakeError(v1::INVALID_ARGUMENT, absl::StrCat("the Gloo worker asked for store key '",
                                                         key.substr(0, 64), "' outside ", allowed));
      }
    }
    if (!status.ok()) {
    } else if (request.op() != v1::GlooStoreRequest::WAIT && keys.size() != 1) {
      status = absl::InvalidArgumentError("a store set or get names exactly one key");
    } else if (request.op() == v1::GlooStoreRequest::SET) {
      store.set(keys[0], std::vector<char>(request.value().begin(), request.value().end()));
    } else if (request.op() == v1::GlooStoreRequest::GET) {
      const std::vector<char> value = store.get(keys[0]);
      out->set_value(value.data(), value.size());
    } else {
      store.wait(keys, std::chrono::milliseconds(request.timeout_ms()));
    }
  } catch (const GlooStoreError& e) {
    status = e.status();
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  ToProto(status, out->mutable_error());
  return reply;
}

}  // namespace

GlooWorkerBackend::GlooWorkerBackend(const GlooBackendOptions& options)
    : node_rank_(options.node_rank),
      num_nodes_(options.num_nodes),
      generation_(options.generation),
      store_prefix_(options.store_prefix),
      timeout_(options.timeout),
      wire_dtype_(options.wire_dtype) {}

absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> GlooWorkerBackend::Create(
    const GlooBackendOptions& options, std::vector<std::string> worker_argv) {
  ASSIGN_OR_RETURN(std::unique_ptr<GlooWorkerBackend> backend,
                   Start(options, std::move(worker_argv)));
  RETURN_IF_ERROR(backend->ConnectMesh(options));
  return backend;
}

absl::Status GlooWorkerBackend::ConnectMesh(const GlooBackendOptions& options) {
  wire_dtype_ = options.wire_dtype;
  if (num_nodes_ == 1) return absl::OkStatus();  // no worker
  return Connect(options);
}

absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> GlooWorkerBackend::Start(
    const GlooBackendOptions& options, std::vector<std::string> worker_argv) {
  if (options.num_nodes < 1 || options.node_rank < 0 || options.node_rank >= options.num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("gloo backend: node_rank=", options.node_rank,
                                                   " is out of range [0, ", options.num_nodes,
                                                   ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo backend: timeout must be positive");
  }
  std::unique_ptr<GlooWorkerBackend> backend(new GlooWorkerBackend(options));
  if (options.num_nodes == 1) return backend;  // nothing crosses nodes: no worker
  if (options.store == nullptr)
    return absl::InvalidArgumentError("gloo backend: no rendezvous store");
  RETURN_IF_ERROR(backend->Spawn(worker_argv));
  return backend;
}

absl::Status GlooWorkerBackend::Spawn(const std::vector<std::string>& argv) {
  std::optional<GlooWorkerProcess> worker = TakeSpareGlooWorker(argv);
  const bool spare = worker.has_value();
  if (!spare) {
    ASSIGN_OR_RETURN(GlooWorkerProcess spawned, SpawnGlooWorkerProcess(argv));
    worker.emplace(std::move(spawned));
  }
  // Adopted: this object reaps it from now on.
  pid_ = std::exchange(worker->pid, 0);
  pidfd_ = std::exchange(worker->pidfd, -1);
  buffer_fd_ = std::exchange(worker->buffer_fd, -1);
  channel_ = std::move(worker->channel);
  spdlog::info("event=gloo_worker_started node_rank={} generation={} pid={} spare={}", node_rank_,
               generation_, pid_, spare);
  return absl::OkStatus();
}

void GlooWorkerBackend::PrepareSpare(const std::vector<std::string>& worker_argv) {
  PrepareSpareGlooWorker(worker_argv);
}

std::string GlooWorkerBackend::Who() const {
  return absl::StrCat("the Gloo worker (pid ", pid_, ") of node_rank=", node_rank_,
                      " generation=", generation_);
}

absl::Status GlooWorkerBackend::Connect(const GlooBackendOptions& options) {
  v1::GlooWorkerRequest request;
  v1::GlooWorkerConnect* connect = request.mutable_connect();
  connect->set_node_rank(options.node_rank);
  connect->set_num_nodes(options.num_nodes);
  connect->set_host(options.host);
  connect->set_iface(options.iface);
  connect->set_generation(options.generation);
  connect->set_store_prefix(options.store_prefix);
  connect->set_timeout_ms(absl::ToInt64Milliseconds(options.timeout));
  connect->set_wire_dtype(static_cast<int32_t>(options.wire_dtype));
  connect->set_world_size(options.world_size);
  if (!channel_.Send(request).ok()) return WorkerDied("before connecting the mesh");
  absl::Status status = AwaitDone("while connecting the mesh", options.store.get());
  if (!status.ok()) Kill();
  return status;
}

namespace {

void ReadAverageCheck(const v1::GlooWorkerEvent& event, AverageCheck* check) {
  check->result_non_finite = event.result_non_finite();
  check->inputs_tested = {event.inputs_tested_begin(), event.inputs_tested_end()};
  check->input_non_finite = event.input_non_finite();
  check->input_element = event.input_element();
  check->input_value = event.input_value();
}

}  // namespace

ElementSpan GlooWorkerBackend::InputsTestedInCollective(size_t count, DType dtype) const {
  // The worker averages in Gloo's ring exactly where GlooBackend does,
  // except in a collective that carries deferred counts: that one sums the
  // piece with the counts appended, and the daemon must scan all of it.
  if (!CanAverageInRing(count, dtype, wire_dtype_, num_nodes_)) return {};
  if (pending_counts_ != nullptr &&
      CanFoldCounts(count, dtype, wire_dtype_, num_nodes_, pending_counts_n_)) {
    return {};
  }
  const ElementRange owned = RingOwnedElements(count, DTypeSize(dtype), node_rank_);
  return {owned.begin, owned.end};
}

absl::Status GlooWorkerBackend::AwaitDone(const std::string& during, gloo::rendezvous::Store* store,
                                          double* counts, size_t n, AverageCheck* check) {
  while (true) {
    v1::GlooWorkerEvent event;
    absl::Status received = channel_.Receive(&event, MonotonicNow() + timeout_ + kGrace);
    if (CodeOf(received) == v1::TIMEOUT) {
      Kill();
      return MakeError(v1::TIMEOUT, absl::StrCat(Who(), " did not answer within ",
                                                 absl::FormatDuration(timeout_ + kGrace), " ",
                                                 during, " (killed)"));
    }
    if (!received.ok()) return WorkerDied(during);
    if (event.has_done()) {
      absl::Status status = FromProto(event.done());
      if (check != nullptr) ReadAverageCheck(event, check);
      if (!status.ok() || counts == nullptr) return status;
      if (static_cast<size_t>(event.counts_size()) != n) {
        Kill();
        return MakeError(v1::INTERNAL, absl::StrCat(Who(), " answered ", event.counts_size(),
                                                    " summed counts for ", n, " ", during));
      }
      std::copy(event.counts().begin(), event.counts().end(), counts);
      return status;
    }
    if (event.has_fatal()) {
      fatal_ = event.fatal().substr(0, kMaxFatalBytes);  // its end of file follows
    } else if (event.has_store_request() && store != nullptr) {
      const std::string allowed = store_prefix_ + "/";
      if (!channel_.Send(Serve(event.store_request(), *store, allowed)).ok()) {
        return WorkerDied(during);
      }
    } else {
      Kill();
      return MakeError(v1::INTERNAL, absl::StrCat(Who(), " sent an unexpected message ", during));
    }
  }
}

absl::Status GlooWorkerBackend::WorkerDied(const std::string& during) {
  // What it said before it died is still in the channel (the daemon may
  // have noticed the death by a failed send, before reading it).
  v1::GlooWorkerEvent last;
  while (channel_.Receive(&last, MonotonicNow()).ok()) {
    if (last.has_fatal()) fatal_ = last.fatal().substr(0, kMaxFatalBytes);
  }
  // End of file: every copy of the channel is closed, i.e. the worker has
  // exited (or is exiting): this wait is short.
  int wait_status = 0;
  bool reap = false;
  {
    absl::MutexLock lock(&mu_);
    reap = !reaped_;
    reaped_ = true;
  }
  if (reap) {
    while (waitpid(pid_, &wait_status, 0) < 0 && errno == EINTR) {
    }
  }
  std::optional<std::string> abort_reason;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) abort_reason = abort_reason_;
  }
  // Abort kills the worker (SIGKILL) on purpose: that death is no failure
  // of its own, the abort's cause is. Any other end, or last words of its
  // own, is the worker's failure.
  const bool killed_to_abort =
      abort_reason.has_value() && fatal_.empty() &&
      (!reap || (WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL));
  if (killed_to_abort) {
    spdlog::info("event=gloo_worker_stopped node_rank={} generation={} pid={} reason={}",
                 node_rank_, generation_, pid_, LogValue(*abort_reason));
    return MakeError(v1::PEER_FAILED,
                     absl::StrCat(*abort_reason, " (node_rank=", node_rank_,
                                  " generation=", generation_, " aborted ", during, ")"));
  }
  std::string message =
      absl::StrCat(Who(), " ", reap ? DescribeExit(wait_status) : "ended", " ", during);
  if (!fatal_.empty()) {
    absl::StrAppend(&message, ": ", fatal_,
                    " (a malformed Gloo message, from a peer or from a stranger on the "
                    "worker's Gloo port; the daemon is unaffected)");
  }
  if (abort_reason.has_value()) absl::StrAppend(&message, " [aborted: ", *abort_reason, "]");
  spdlog::error("event=gloo_worker_died node_rank={} generation={} pid={} error={}", node_rank_,
                generation_, pid_, LogValue(message));
  return MakeError(v1::PEER_FAILED, message);
}

absl::Status GlooWorkerBackend::EnsureBuffer(size_t bytes) {
  if (bytes <= buffer_bytes_) return absl::OkStatus();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = (bytes + page - 1) / page * page;
  if (ftruncate(buffer_fd_, static_cast<off_t>(size)) != 0) {
    return absl::InternalError(absl::StrCat("growing the Gloo worker's buffer to ", size,
                                            " bytes: ", std::strerror(errno)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, buffer_fd_, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mapping the Gloo worker's buffer (", size,
                                            " bytes): ", std::strerror(errno)));
  }
  if (buffer_ != nullptr) munmap(buffer_, buffer_bytes_);
  buffer_ = p;
  buffer_bytes_ = size;
  return absl::OkStatus();
}

uint8_t* GlooWorkerBackend::Staging(uint64_t bytes) {
  if (num_nodes_ == 1 || !EnsureBuffer(bytes).ok()) return nullptr;
  return static_cast<uint8_t*>(buffer_);
}

absl::Status GlooWorkerBackend::AllreduceSum(void* data, size_t count, DType dtype) {
  RETURN_IF_ERROR(IssueAllreduceSum(data, count, dtype));
  return AwaitIssued();
}

absl::Status GlooWorkerBackend::CheckUsable() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(failure_);
  if (aborted_) {
    failure_ = MakeError(v1::PEER_FAILED,
                         absl::StrCat("gloo allreduce on node_rank=", node_rank_,
                                      " generation=", generation_, " aborted: ", abort_reason_));
    return failure_;
  }
  return absl::OkStatus();
}

absl::Status GlooWorkerBackend::IssueAllreduceSum(void* data, size_t count, DType dtype) {
  RETURN_IF_ERROR(CheckAllreduceArgs(data, count, dtype, "gloo"));
  RETURN_IF_ERROR(CheckUsable());
  Issued issued{count, dtype, false, nullptr};
  if (pending_counts_ != nullptr && count == 0) {
    return Fail(
        MakeError(v1::INTERNAL, "gloo allreduce: counts to send with an allreduce of 0 elements"));
  }
  if (count == 0 || num_nodes_ == 1) {
    issued_.push_back(issued);
    return absl::OkStatus();
  }
  const size_t bytes = count * DTypeSize(dtype);
  uint8_t* const base = static_cast<uint8_t*>(buffer_);
  uint8_t* const begin = static_cast<uint8_t*>(data);
  // Data already in the shared buffer (Staging) is reduced where it is.
  const bool shared = base != nullptr && begin >= base && begin + bytes <= base + buffer_bytes_;
  if (!shared) {
    // Copied to the buffer's start: it would overwrite one still in flight.
    if (ElementsInFlight()) {
      return Fail(MakeError(v1::INTERNAL,
                            "gloo allreduce: data outside the shared buffer issued while another "
                            "allreduce is in flight"));
    }
    if (absl::Status st = EnsureBuffer(bytes); !st.ok()) return Fail(st);
    std::memcpy(buffer_, data, bytes);
    issued.copy_back = data;
  }
  v1::GlooWorkerRequest request;
  v1::GlooWorkerAllreduce* allreduce = request.mutable_allreduce();
  allreduce->set_count(count);
  allreduce->set_dtype(static_cast<v1::DType>(dtype));
  allreduce->set_buffer_bytes(buffer_bytes_);
  allreduce->set_offset(shared ? static_cast<uint64_t>(begin - base) : 0);
  if (pending_counts_ != nullptr) {
    allreduce->mutable_counts()->Add(pending_counts_, pending_counts_ + pending_counts_n_);
    issued.counts = std::exchange(pending_counts_, nullptr);
    issued.counts_n = std::exchange(pending_counts_n_, 0);
  }
  return SendIssued(request, issued);
}

void GlooWorkerBackend::ShareArenas(std::vector<SharedArena> arenas) {
  absl::MutexLock lock(&mu_);
  shared_arenas_ = std::move(arenas);
  arenas_changed_ = true;
}

int GlooWorkerBackend::ArenaOf(const uint8_t* data, uint64_t bytes) const {
  for (size_t i = 0; i < arenas_.size(); ++i) {
    const SharedArena& a = arenas_[i];
    if (data >= a.base && bytes <= a.bytes &&
        data - a.base <= static_cast<ptrdiff_t>(a.bytes - bytes)) {
      return static_cast<int>(i) + 1;
    }
  }
  return 0;
}

bool GlooWorkerBackend::ReducesInArenas(const uint8_t* data, uint64_t bytes,
                                        absl::Span<uint8_t* const> copies) {
  if (num_nodes_ == 1) return false;
  {
    absl::MutexLock lock(&mu_);
    if (arenas_changed_) {
      // Requests already sent keep the mapping they were sent with: the
      // worker maps the new arenas with the next one, in order.
      arenas_ = shared_arenas_;
      arenas_changed_ = false;
      arenas_unsent_ = !arenas_.empty();
    }
  }
  const int arena = ArenaOf(data, bytes);
  if (arena == 0) return false;
  const ptrdiff_t offset = data - arenas_[arena - 1].base;
  for (const uint8_t* copy : copies) {
    const int other = ArenaOf(copy, bytes);
    if (other == 0 || other == arena || copy - arenas_[other - 1].base != offset) return false;
  }
  return true;
}

absl::Status GlooWorkerBackend::IssueAllreduceAverage(uint8_t* data, size_t count, DType dtype,
                                                      int divisor,
                                                      absl::Span<uint8_t* const> copies,
                                                      AverageCheck* check) {
  RETURN_IF_ERROR(CheckAllreduceArgs(data, count, dtype, "gloo"));
  RETURN_IF_ERROR(CheckUsable());
  const uint64_t bytes = count * DTypeSize(dtype);
  if (count == 0 || divisor < 1 || (dtype != DType::kFloat32 && dtype != DType::kFloat64) ||
      !ReducesInArenas(data, bytes, copies)) {
    return Fail(MakeError(
        v1::INTERNAL, absl::StrCat("gloo allreduce: cannot average ", count, " ", DTypeName(dtype),
                                   " by ", divisor, " in the shared arenas")));
  }
  const int arena = ArenaOf(data, bytes);
  v1::GlooWorkerRequest request;
  v1::GlooWorkerAllreduce* allreduce = request.mutable_allreduce();
  allreduce->set_count(count);
  allreduce->set_dtype(static_cast<v1::DType>(dtype));
  allreduce->set_buffer_bytes(buffer_bytes_);
  allreduce->set_offset(static_cast<uint64_t>(data - arenas_[arena - 1].base));
  allreduce->set_arena(arena);
  allreduce->set_divisor(divisor);
  allreduce->set_check_result(check != nullptr);
  for (const uint8_t* copy : copies) allreduce->add_copy_arenas(ArenaOf(copy, bytes));
  if (std::exchange(arenas_unsent_, false)) {
    for (const SharedArena& a : arenas_) {
      v1::GlooWorkerArena* out = allreduce->add_arenas();
      out->set_segment(a.segment);
      out->set_device(a.device);
      out->set_inode(a.inode);
      out->set_offset(a.segment_offset);
      out->set_bytes(a.bytes);
    }
  }
  Issued issued{count, dtype, false, nullptr};
  issued.check = check;
  if (pending_counts_ != nullptr) {
    allreduce->mutable_counts()->Add(pending_counts_, pending_counts_ + pending_counts_n_);
    issued.counts = std::exchange(pending_counts_, nullptr);
    issued.counts_n = std::exchange(pending_counts_n_, 0);
  }
  return SendIssued(request, issued);
}

absl::Status GlooWorkerBackend::SendIssued(const v1::GlooWorkerRequest& request, Issued issued) {
  if (!issued.counts_only) RecordHop(Hop::kDaemonIssue, node_rank_);
  if (!channel_.Send(request).ok()) {
    return Fail(WorkerDied(
        absl::StrCat("during an allreduce of ", issued.count, " ", DTypeName(issued.dtype))));
  }
  issued.sent = true;
  issued_.push_back(issued);
  return absl::OkStatus();
}

bool GlooWorkerBackend::ElementsInFlight() const {
  for (size_t i = issued_head_; i < issued_.size(); ++i) {
    if (!issued_[i].counts_only) return true;
  }
  return false;
}

absl::Status GlooWorkerBackend::AllreduceCountsWithNext(double* counts, size_t n, size_t next_count,
                                                        DType next_dtype, bool* deferred) {
  *deferred = false;
  if (num_nodes_ == 1 || n == 0) return AllreduceCounts(counts, n);
  if (counts == nullptr) return absl::InvalidArgumentError("gloo allreduce: null counts");
  if (pending_counts_ != nullptr) {
    return Fail(MakeError(v1::INTERNAL, "gloo allreduce: counts deferred twice"));
  }
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(failure_);
  }
  *deferred = true;
  // The worker folds them into a small collective (it decides the same
  // from the request); a larger one's counts start now, on their own.
  if (CanFoldCounts(next_count, next_dtype, wire_dtype_, num_nodes_, n)) {
    pending_counts_ = counts;
    pending_counts_n_ = n;
    return absl::OkStatus();
  }
  v1::GlooWorkerRequest request;
  v1::GlooWorkerAllreduce* allreduce = request.mutable_allreduce();
  allreduce->set_count(0);
  allreduce->set_dtype(static_cast<v1::DType>(DType::kFloat64));
  allreduce->set_buffer_bytes(buffer_bytes_);
  allreduce->set_offset(0);
  allreduce->mutable_counts()->Add(counts, counts + n);
  Issued issued{0, DType::kFloat64, false, nullptr, counts, n, /*counts_only=*/true};
  return SendIssued(request, issued);
}

absl::Status GlooWorkerBackend::Broadcast(void* data, size_t bytes, int root_node) {
  if (root_node < 0 || root_node >= num_nodes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo broadcast: root node_rank=", root_node, " of ", num_nodes_, " nodes"));
  }
  if (bytes != 0 && data == nullptr)
    return absl::InvalidArgumentError("gloo broadcast: null buffer");
  const std::string during =
      absl::StrCat("during a broadcast of ", bytes, " bytes from node_rank=", root_node);
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(failure_);
    if (aborted_) {
      failure_ = MakeError(v1::PEER_FAILED,
                           absl::StrCat("gloo broadcast on node_rank=", node_rank_,
                                        " generation=", generation_, " aborted: ", abort_reason_));
      return failure_;
    }
  }
  if (num_nodes_ == 1 || bytes == 0) return absl::OkStatus();
  if (issued_head_ != issued_.size() || pending_counts_ != nullptr) {
    return Fail(MakeError(v1::INTERNAL, "gloo broadcast issued while an allreduce is in flight"));
  }
  if (absl::Status st = EnsureBuffer(bytes); !st.ok()) return Fail(st);
  if (node_rank_ == root_node) std::memcpy(buffer_, data, bytes);
  v1::GlooWorkerRequest request;
  v1::GlooWorkerBroadcast* broadcast = request.mutable_broadcast();
  broadcast->set_bytes(bytes);
  broadcast->set_root_node(root_node);
  broadcast->set_buffer_bytes(buffer_bytes_);
  broadcast->set_offset(0);
  if (!channel_.Send(request).ok()) return Fail(WorkerDied(during));
  if (absl::Status st = AwaitDone(during, nullptr); !st.ok()) return Fail(st);
  if (node_rank_ != root_node) std::memcpy(data, buffer_, bytes);
  wire_payload_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status GlooWorkerBackend::AwaitIssued() {
  // Counts started on their own complete ahead of the collective awaited.
  while (issued_head_ < issued_.size() && issued_[issued_head_].counts_only) {
    const Issued counts = issued_[issued_head_++];
    absl::Status status =
        AwaitDone(absl::StrCat("during an allreduce of ", counts.counts_n, " counts"), nullptr,
                  counts.counts, counts.counts_n);
    if (!status.ok()) {
      issued_.clear(), issued_head_ = 0;
      return Fail(status);
    }
    wire_payload_bytes_.fetch_add(counts.counts_n * sizeof(double), std::memory_order_relaxed);
  }
  if (issued_head_ == issued_.size()) {
    return MakeError(v1::INTERNAL, "gloo allreduce: awaited with none issued");
  }
  const Issued issued = issued_[issued_head_++];
  if (issued_head_ == issued_.size()) issued_.clear(), issued_head_ = 0;
  if (!issued.sent) return absl::OkStatus();
  // The worker answers in the order it was asked: this `done` is `issued`'s.
  absl::Status status =
      AwaitDone(absl::StrCat("during an allreduce of ", issued.count, " ", DTypeName(issued.dtype)),
                nullptr, issued.counts, issued.counts_n, issued.check);
  if (!status.ok()) {
    issued_.clear(), issued_head_ = 0;  // the worker is gone: nothing else will answer
    return Fail(status);
  }
  RecordHop(Hop::kDaemonDoneReceived, node_rank_);
  const size_t bytes = issued.count * DTypeSize(issued.dtype);
  if (issued.copy_back != nullptr) std::memcpy(issued.copy_back, buffer_, bytes);
  const bool compressed = wire_dtype_ != WireDType::kOff && issued.dtype == DType::kFloat32;
  // Counts sent with it crossed uncompressed, as float64.
  wire_payload_bytes_.fetch_add(
      (compressed ? issued.count * sizeof(uint16_t) : bytes) + issued.counts_n * sizeof(double),
      std::memory_order_relaxed);
  return absl::OkStatus();
}

WireStats GlooWorkerBackend::wire_stats() const {
  WireStats stats;
  stats.dtype = WireDTypeName(wire_dtype_);
  stats.payload_bytes = wire_payload_bytes_.load(std::memory_order_relaxed);
  return stats;
}

absl::Status GlooWorkerBackend::Fail(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_ && CodeOf(status) != v1::PEER_FAILED) {
      status = MakeError(v1::PEER_FAILED,
                         absl::StrCat(status.message(), " [aborted: ", abort_reason_, "]"));
    }
    if (failure_.ok()) failure_ = status;
  }
  // The worker's own failure path already closed its pairs; killing it
  // also frees its ports and memory now rather than at the job's end.
  Kill();
  // And it may be writing an average into the trainers' arenas: once the
  // failure is reported, nothing of it may land there.
  if (pidfd_ >= 0) {
    pollfd exited{pidfd_, POLLIN, 0};
    while (poll(&exited, 1, kExitWaitMs) < 0 && errno == EINTR) {
    }
  }
  return status;
}

void GlooWorkerBackend::Kill() {
  if (pidfd_ >= 0) {
    PidfdKill(pidfd_);
    return;
  }
  absl::MutexLock lock(&mu_);  // no pidfd (old kernel): the pid, while not reaped
  if (pid_ > 0 && !reaped_) kill(pid_, SIGKILL);
}

void GlooWorkerBackend::Abort(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
  }
  spdlog::warn("event=gloo_abort node_rank={} generation={} reason={}", node_rank_, generation_,
               LogValue(reason));
  // Its sockets close with it: the neighbours fail at once, and an
  // AllreduceSum waiting for it sees end of file.
  Kill();
}

GlooWorkerBackend::~GlooWorkerBackend() {
  channel_.Close();  // the worker's end of file: it closes its pairs and exits
  bool reap = false;
  {
    absl::MutexLock lock(&mu_);
    reap = pid_ > 0 && !reaped_;
    reaped_ = true;
  }
  if (reap) {
    pollfd exited{pidfd_, POLLIN, 0};
    if (pidfd_ < 0 || poll(&exited, 1, kExitWaitMs) != 1) Kill();
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  if (pidfd_ >= 0) close(pidfd_);
  if (buffer_ != nullptr) munmap(buffer_, buffer_bytes_);
  if (buffer_fd_ >= 0) close(buffer_fd_);
}

}  // namespace gradsync
