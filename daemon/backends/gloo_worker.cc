#include "daemon/backends/gloo_worker.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hop_trace.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/backends/average_writer.h"
#include "daemon/backends/count_fold.h"
#include "daemon/backends/gloo_backend.h"
#include "daemon/backends/gloo_store.h"
#include "daemon/backends/worker_arenas.h"
#include "daemon/backends/worker_channel.h"
#include "gradsync/v1/gloo_worker.pb.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// The channel the terminate handler reports on (set once, before Gloo runs).
WorkerChannel* g_channel = nullptr;

std::string Endpoint(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return absl::StrCat(host, ":", port);
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  port = ntohs(in6->sin6_port);
  return absl::StrCat("[", host, "]:", port);
}

// "127.0.0.1:41234 <- 127.0.0.1:50000" for each connected TCP socket of this
// process: only Gloo's pairs own TCP sockets here, so a stranger who got
// into a pair is among them.
std::string GlooConnections() {
  std::vector<std::string> out;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) {
      const int fd = std::atoi(entry->d_name);
      if (fd <= 2 || fd == dirfd(dir)) continue;
      sockaddr_storage local{}, peer{};
      socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
      if (local.ss_family != AF_INET && local.ss_family != AF_INET6) continue;
      if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
      out.push_back(absl::StrCat(Endpoint(local), " <- ", Endpoint(peer)));
    }
    closedir(dir);
  }
  return out.empty() ? "none" : absl::StrJoin(out, ", ");
}

// std::terminate cannot resume: it says what happened, then the worker dies
// and the daemon turns that into a job error.
[[noreturn]] void ReportAndAbort() {
  std::string what = "unknown exception";
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
  }
  const std::string fatal = absl::StrCat("uncaught exception on a Gloo thread: ", what,
                                         "; the worker's Gloo connections: ", GlooConnections());
  spdlog::critical("event=gloo_worker_fatal error={}", LogValue(fatal));
  if (g_channel != nullptr) {
    v1::GlooWorkerEvent event;
    event.set_fatal(fatal);
    g_channel->Send(event).IgnoreError();
  }
  std::abort();
}

// Gloo's rendezvous::Store, answered by the daemon over the channel.
class ChannelStore final : public gloo::rendezvous::Store {
 public:
  explicit ChannelStore(WorkerChannel& channel) : channel_(channel) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    v1::GlooStoreRequest request;
    request.set_op(v1::GlooStoreRequest::SET);
    request.add_keys(key);
    request.set_value(data.data(), data.size());
    Call(request);
  }
  std::vector<char> get(const std::string& key) override {
    v1::GlooStoreRequest request;
    request.set_op(v1::GlooStoreRequest::GET);
    request.add_keys(key);
    const std::string value = Call(request);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(0));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    v1::GlooStoreRequest request;
    request.set_op(v1::GlooStoreRequest::WAIT);
    for (const std::string& key : keys) request.add_keys(key);
    request.set_timeout_ms(timeout.count());
    Call(request);
  }

 private:
  // Throws GlooStoreError (what GlooBackend expects of a store) on failure.
  std::string Call(const v1::GlooStoreRequest& request) {
    v1::GlooWorkerEvent event;
    *event.mutable_store_request() = request;
    if (absl::Status st = channel_.Send(event); !st.ok()) throw GlooStoreError(st);
    v1::GlooWorkerRequest reply;
    if (absl::Status st = channel_.Receive(&reply, absl::InfiniteFuture()); !st.ok()) {
      throw GlooStoreError(st);
    }
    if (!reply.has_store_reply()) {
      throw GlooStoreError(MakeError(v1::INTERNAL, "the daemon did not answer a store request"));
    }
    if (absl::Status st = FromProto(reply.store_reply().error()); !st.ok()) {
      throw GlooStoreError(st);
    }
    return reply.store_reply().value();
  }

  WorkerChannel& channel_;
};

// The daemon's buffer, mapped as far as the current request needs.
class SharedBuffer {
 public:
  ~SharedBuffer() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  // nullptr if the memfd cannot be mapped that far.
  void* Map(size_t bytes) {
    if (bytes <= size_) return data_;
    if (data_ != nullptr) munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, kGlooWorkerBufferFd, 0);
    if (p == MAP_FAILED) return nullptr;
    data_ = p;
    size_ = bytes;
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

v1::GlooWorkerEvent Done(const absl::Status& status) {
  v1::GlooWorkerEvent event;
  ToProto(status, event.mutable_done());
  return event;
}

// What a request asks of its result beyond the sum.
struct AverageRequest {
  int divisor = 0;  // 0: the sum
  bool check = false;
};

// One allreduce request's collectives: `count` elements at `elements` (none:
// the counts alone) and the `counts`, summed in place — folded into the
// bucket's collective where they fold (count_fold.h), else their own
// collective first, then the bucket's: the order every node issues. With
// `average`, the bucket's may also divide (`ring` says whether it did).
absl::Status RunCollectives(GlooBackend& backend, const GlooBackendOptions& options, char* elements,
                            size_t count, DType dtype, std::vector<double>* counts,
                            std::vector<char>* folded, const AverageRequest& average,
                            RingAverageOutcome* ring) {
  *ring = RingAverageOutcome{};
  const size_t n = counts->size();
  absl::Status status;
  // The counts alone (no elements) are not a bucket's hop.
  const auto hop = [&](Hop h) {
    if (count > 0) RecordHop(h, options.node_rank);
  };
  if (n > 0 && CanFoldCounts(count, dtype, options.wire_dtype, options.num_nodes, n)) {
    // One collective: the bucket with the counts' limbs appended.
    const size_t bytes = count * DTypeSize(dtype);
    folded->resize(bytes + n * kCountLimbs * DTypeSize(dtype));
    // The counts alone come with no elements (null): memcpy must not see it.
    if (bytes > 0) std::memcpy(folded->data(), elements, bytes);
    RETURN_IF_ERROR(EncodeCounts(counts->data(), n, dtype, folded->data() + bytes));
    hop(Hop::kWorkerGlooStart);
    status = backend.AllreduceSum(folded->data(), count + n * kCountLimbs, dtype);
    hop(Hop::kWorkerGlooDone);
    RETURN_IF_ERROR(status);
    if (bytes > 0) std::memcpy(elements, folded->data(), bytes);
    DecodeCounts(folded->data() + bytes, n, dtype, counts->data());
    return absl::OkStatus();
  }
  if (n > 0) RETURN_IF_ERROR(backend.AllreduceCounts(counts->data(), n));
  hop(Hop::kWorkerGlooStart);
  status = average.divisor > 0 ? backend.AllreduceAverage(elements, count, dtype, average.divisor,
                                                          average.check, ring)
                               : backend.AllreduceSum(elements, count, dtype);
  hop(Hop::kWorkerGlooDone);
  return status;
}

// Which of this node's inputs the ring tested while reducing, and the
// first NaN or Inf among them: the daemon's scan skipped them.
void ReportTestedInputs(const RingAverageOutcome& ring, v1::GlooWorkerEvent* done) {
  if (!ring.divided) return;
  done->set_inputs_tested_begin(ring.averaged_begin);
  done->set_inputs_tested_end(ring.averaged_end);
  done->set_input_non_finite(ring.input_non_finite);
  done->set_input_element(ring.input_element);
  done->set_input_value(ring.input_value);
}

// The middle pieces of a bucket cut in several are at least half of
// kPieceBytes (8 MiB); its first and last, a quarter, are handed over only
// when the next request already waits (bucket_pieces.h).
constexpr uint64_t kOverlapMinBytes = 4 << 20;

// What the allreduce requests keep from one to the next. Capacity kept
// across requests: no allocation per iteration.
struct AllreduceState {
  SharedBuffer buffer;
  WorkerArenas arenas;
  std::vector<double> counts;
  std::vector<char> folded;  // a small bucket and the counts it carries
  std::vector<char*> copies;
  RingAverageOutcome ring;
  AverageWriter::Job job;  // the next one handed to the AverageWriter
};

// Where the request's `count` elements are (the shared buffer, or a
// trainer's arena) and, for an average, every other arena it is copied to.
absl::Status Locate(const v1::GlooWorkerAllreduce& allreduce, DType dtype, AllreduceState* state,
                    char** elements) {
  *elements = nullptr;
  state->copies.clear();
  const uint64_t bytes = allreduce.count() * DTypeSize(dtype);
  if (allreduce.arena() > 0) {
    const int arena = allreduce.arena() - 1;
    *elements = state->arenas.At(arena, allreduce.offset(), bytes);
    if (*elements == nullptr) {
      return absl::InternalError(absl::StrCat(allreduce.count(), " elements at offset ",
                                              allreduce.offset(), " are not within mapped arena ",
                                              arena));
    }
  } else if (allreduce.offset() > allreduce.buffer_bytes() ||
             allreduce.count() >
                 (allreduce.buffer_bytes() - allreduce.offset()) / DTypeSize(dtype)) {
    return absl::InternalError(absl::StrCat(allreduce.count(), " elements at offset ",
                                            allreduce.offset(), " exceed the ",
                                            allreduce.buffer_bytes(), "-byte shared buffer"));
  } else if (allreduce.count() > 0) {
    void* data = state->buffer.Map(allreduce.buffer_bytes());
    if (data == nullptr) {
      return absl::InternalError(
          absl::StrCat("cannot map the shared buffer's ", allreduce.buffer_bytes(), " bytes"));
    }
    *elements = static_cast<char*>(data) + allreduce.offset();
  }
  for (const int arena : allreduce.copy_arenas()) {
    char* copy = state->arenas.At(arena - 1, allreduce.offset(), bytes);
    if (copy == nullptr || allreduce.arena() <= 0) {
      return absl::InternalError(absl::StrCat("cannot copy the average to arena ", arena - 1));
    }
    state->copies.push_back(copy);
  }
  if (allreduce.divisor() < 0 ||
      (allreduce.divisor() > 0 && dtype != DType::kFloat32 && dtype != DType::kFloat64)) {
    return absl::InternalError(
        absl::StrCat("cannot average ", DTypeName(dtype), " by ", allreduce.divisor()));
  }
  return absl::OkStatus();
}

absl::Status MapArenas(const v1::GlooWorkerAllreduce& allreduce, const GlooBackendOptions& options,
                       AllreduceState* state) {
  if (absl::Status st = state->arenas.Map(allreduce.arenas()); !st.ok()) {
    return MakeError(CodeOf(st), absl::StrCat("mapping the trainers' arenas: ", st.message()));
  }
  spdlog::info("event=gloo_worker_arenas_mapped node_rank={} arenas={}", options.node_rank,
               allreduce.arenas_size());
  return absl::OkStatus();
}

// Any arena of the request cut short while the worker used it.
absl::Status CheckArenasWhole(const v1::GlooWorkerAllreduce& allreduce,
                              const WorkerArenas& arenas) {
  if (allreduce.arena() > 0) RETURN_IF_ERROR(arenas.CheckWhole(allreduce.arena() - 1));
  for (const int arena : allreduce.copy_arenas()) RETURN_IF_ERROR(arenas.CheckWhole(arena - 1));
  return absl::OkStatus();
}

// One allreduce request: its collectives, then (`divisor` > 0) the average
// handed to `writer`, which answers it; else answered here, in order
// after whatever `writer` still holds. False when the daemon is gone.
bool RunAllreduce(const v1::GlooWorkerAllreduce& allreduce, GlooBackend& backend,
                  const GlooBackendOptions& options, AllreduceState* state, AverageWriter& writer,
                  WorkerChannel& channel) {
  if (allreduce.count() > 0) RecordHop(Hop::kWorkerReceived, options.node_rank);
  const auto dtype = static_cast<DType>(allreduce.dtype());
  absl::Status status;
  char* elements = nullptr;
  // The writer may still be averaging in the arenas a remap would unmap.
  if (allreduce.arenas_size() > 0) writer.Drain();
  if (!IsValidDType(static_cast<int32_t>(dtype))) {
    status = absl::InvalidArgumentError(absl::StrCat("invalid dtype ", allreduce.dtype()));
  } else if (allreduce.arenas_size() > 0 && !(status = MapArenas(allreduce, options, state)).ok()) {
  } else if ((status = Locate(allreduce, dtype, state, &elements)).ok()) {
    // No elements: the counts alone (started ahead of a larger bucket).
    state->counts.assign(allreduce.counts().begin(), allreduce.counts().end());
    const AverageRequest average{static_cast<int>(allreduce.divisor()), allreduce.check_result()};
    status = RunCollectives(backend, options, elements, allreduce.count(), dtype, &state->counts,
                            &state->folded, average, &state->ring);
    if (status.ok()) status = CheckArenasWhole(allreduce, state->arenas);
  }
  AverageWriter::Job& job = state->job;
  job.done = Done(status);
  if (status.ok() && allreduce.check_result()) ReportTestedInputs(state->ring, &job.done);
  if (status.ok() && allreduce.counts_size() > 0) {
    job.done.mutable_counts()->Add(state->counts.begin(), state->counts.end());
  }
  if (status.ok() && allreduce.divisor() > 0) {
    job.sum = elements;
    job.count = allreduce.count();
    job.dtype = dtype;
    job.divisor = allreduce.divisor();
    job.check = allreduce.check_result();
    job.divided = state->ring.divided;
    job.checked_begin = state->ring.averaged_begin;
    job.checked_end = state->ring.averaged_end;
    job.ring_non_finite = state->ring.non_finite;
    job.copies.assign(state->copies.begin(), state->copies.end());
    job.arenas.clear();
    job.arenas.push_back(allreduce.arena() - 1);
    for (const int arena : allreduce.copy_arenas()) job.arenas.push_back(arena - 1);
    // A piece of a bucket cut in several (bucket_pieces.h: those pieces are
    // at least half of kPieceBytes), or the next request already waiting:
    // the next collective runs while the writer averages this one. A lone
    // small bucket is written at once: a hand-off would only add a wake-up.
    // An average the ring wrote, with nothing to copy or check, is done.
    const bool work_left = !job.divided || !job.copies.empty() || job.check;
    pollfd next{channel.fd(), POLLIN, 0};
    if (work_left &&
        (allreduce.count() * DTypeSize(dtype) >= kOverlapMinBytes || poll(&next, 1, 0) == 1)) {
      writer.Post(job);
    } else {
      writer.WriteNow(job);
    }
    return true;
  }
  writer.Drain();
  return channel.Send(job.done).ok();
}

}  // namespace

int RunGlooWorker() {
  // The daemon's log format, told apart by component (and the pid).
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e level=%l component=gloo-worker pid=%P %v");
  WorkerChannel channel(kGlooWorkerChannelFd);
  // A worker must never outlive its daemon (nor keep its Gloo ports), even
  // while its main thread is inside a collective: the daemon's end of the
  // channel closing (exit, crash, or the backend's destructor) ends it.
  // (Not PR_SET_PDEATHSIG: that fires when the spawning *thread* exits.)
  std::thread([fd = channel.fd()] {
    pollfd hangup{fd, 0, 0};
    while (poll(&hangup, 1, -1) < 0 && errno == EINTR) {
    }
    _exit(0);
  }).detach();
  g_channel = &channel;
  std::set_terminate(&ReportAndAbort);

  v1::GlooWorkerRequest request;
  if (!channel.Receive(&request, absl::InfiniteFuture()).ok() || !request.has_connect()) return 1;
  const v1::GlooWorkerConnect& connect = request.connect();
  GlooBackendOptions options;
  options.node_rank = connect.node_rank();
  options.num_nodes = connect.num_nodes();
  options.host = connect.host();
  options.iface = connect.iface();
  options.generation = connect.generation();
  options.store_prefix = connect.store_prefix();
  options.timeout = absl::Milliseconds(connect.timeout_ms());
  options.wire_dtype = static_cast<WireDType>(connect.wire_dtype());
  options.world_size = connect.world_size();
  options.store = std::make_shared<ChannelStore>(channel);
  absl::StatusOr<std::unique_ptr<GlooBackend>> backend = GlooBackend::Create(options);
  if (!channel.Send(Done(backend.status())).ok() || !backend.ok()) return 1;

  AllreduceState state;
  SharedBuffer& buffer = state.buffer;
  AverageWriter writer(channel, state.arenas);
  while (channel.Receive(&request, absl::InfiniteFuture()).ok()) {
    if (request.has_broadcast()) {
      writer.Drain();  // answered in order (the daemon awaits every allreduce first)
      const v1::GlooWorkerBroadcast& broadcast = request.broadcast();
      absl::Status status;
      void* data = nullptr;
      if (broadcast.offset() > broadcast.buffer_bytes() ||
          broadcast.bytes() > broadcast.buffer_bytes() - broadcast.offset()) {
        status = absl::InternalError(absl::StrCat(broadcast.bytes(), " bytes at offset ",
                                                  broadcast.offset(), " exceed the ",
                                                  broadcast.buffer_bytes(), "-byte shared buffer"));
      } else if ((data = buffer.Map(broadcast.buffer_bytes())) == nullptr) {
        status = absl::InternalError(
            absl::StrCat("cannot map the shared buffer's ", broadcast.buffer_bytes(), " bytes"));
      } else {
        status = (*backend)->Broadcast(static_cast<char*>(data) + broadcast.offset(),
                                       broadcast.bytes(), broadcast.root_node());
      }
      if (!channel.Send(Done(status)).ok()) return 1;
      continue;
    }
    if (!request.has_allreduce()) return 1;
    if (!RunAllreduce(request.allreduce(), **backend, options, &state, writer, channel)) return 1;
  }
  return 0;  // the daemon closed the channel: the generation is over
}

}  // namespace gradsync
