#include "daemon/engine/job.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/secure_random.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "ipc/random_segment_name.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Unguessable: the session id is all a Local RPC presents (0 means "none").
uint64_t NewSessionId() {
  uint64_t id = 0;
  while (id == 0) id = SecureRandom64();
  return id;
}

// Test-only (inert unless set): how long this node waits before it looks
// at its own failed collective, so that another node's report reaches it
// first as the rendezvous' abort (a heartbeat away).
constexpr char kDelayCollectiveCheck[] = "GRADSYNC_TEST_DELAY_COLLECTIVE_CHECK_MS";

absl::Duration CollectiveCheckDelay() {
  const char* value = std::getenv(kDelayCollectiveCheck);
  int64_t ms = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &ms) || ms <= 0) return absl::ZeroDuration();
  spdlog::warn("event=test_hook_armed hook={} delay_ms={}", kDelayCollectiveCheck, ms);
  return absl::Milliseconds(ms);
}

const char* StateName(JobState s) {
  switch (s) {
    case JobState::kAttaching:
      return "attaching";
    case JobState::kForming:
      return "forming";
    case JobState::kRunning:
      return "running";
    case JobState::kFailed:
      return "failed";
  }
  return "?";
}

}  // namespace

Job::Job(const DaemonConfig& config, std::shared_ptr<ipc::NodeSegment> node, uint64_t id,
         WorldFormer former, JobHooks hooks)
    : config_(config),
      node_(std::move(node)),
      id_(id),
      former_(std::move(former)),
      hooks_(std::move(hooks)),
      trainers_(config.local_size) {}

Job::~Job() {
  if (scheduler_) scheduler_->Stop();
  world_.link.reset();  // stops heart-beating and leaves the generation
  scheduler_.reset();
  broadcaster_.reset();
  replica_checker_.reset();
  // After the scheduler stopped: no collective can be running.
  gpu_reducer_.reset();
  gpu_session_.reset();
  for (auto& t : trainers_) {
    if (t && t->segment.header() != nullptr)
      ipc::SharedSegment::Remove(t->segment.name()).IgnoreError();
  }
}

Trainer* Job::FindLocked(uint64_t session) const { return HoldLocked(session).get(); }

std::shared_ptr<Trainer> Job::HoldLocked(uint64_t session) const {
  for (const auto& t : trainers_) {
    if (t && t->session_id == session && !t->gone.load()) return t;
  }
  return nullptr;
}

absl::StatusOr<uint64_t> Job::Attach(int local_rank, int64_t pid) {
  MonotonicMutexLock lock(&mu_);
  bool all_gone = attached_ever_ > 0;
  for (const auto& t : trainers_) {
    if (t && !t->gone.load()) all_gone = false;
  }
  if (all_gone) {
    // Ended between JobForAttach and here: the caller retries on a fresh job.
    return MakeError(v1::STATE, "this job has ended; attach to the next one");
  }
  if (state_ != JobState::kAttaching && TakesRejoinsLocked()) {
    return AttachRejoiningLocked(local_rank, pid);
  }
  if (state_ != JobState::kAttaching) {
    return MakeError(v1::STATE,
                     absl::StrCat("a job is ", StateName(state_),
                                  " on this daemon; new trainers can attach once its trainers "
                                  "have all closed",
                                  state_ == JobState::kFailed
                                      ? absl::StrCat(" (it failed: ", error_.message(), ")")
                                      : ""));
  }
  if (local_rank < 0 || local_rank >= config_.local_size) {
    return MakeError(
        v1::INVALID_ARGUMENT,
        absl::StrCat("local rank ", local_rank, " is not in [0, ", config_.local_size,
                     ") (the daemon runs with --local-size ", config_.local_size, ")"));
  }
  if (trainers_[local_rank] && !trainers_[local_rank]->gone.load()) {
    return MakeError(v1::STATE,
                     absl::StrCat("local rank ", local_rank, " is already attached by pid ",
                                  trainers_[local_rank]->pid));
  }
  auto t = std::make_shared<Trainer>();
  t->session_id = NewSessionId();
  t->local_rank = local_rank;
  t->pid = pid;
  t->attached_at = std::chrono::steady_clock::now();
  const uint64_t session = t->session_id;
  // A departed trainer's record goes now, or when the last RPC holding it ends.
  trainers_[local_rank] = std::move(t);
  ++attached_ever_;
  spdlog::info("event=attach job={} local_rank={} pid={}", id_, local_rank, pid);
  return session;
}

absl::Status Job::CheckDeviceKind(const Layout& layout) const {
  if (layout.empty()) return absl::OkStatus();
  const TensorInfo& first = layout[0];
  if (first.device < 0) {
    if (config_.backend == "nccl") {
      return MakeError(v1::INVALID_ARGUMENT,
                       absl::StrCat("tensor 0 '", first.name,
                                    "' is on the CPU, but this gradsyncd "
                                    "runs --backend=nccl (CUDA tensors only); use auto or gloo"));
    }
    return absl::OkStatus();
  }
  const std::string where = absl::StrCat("tensor 0 '", first.name, "' is on cuda:", first.device);
  if (config_.backend == "gloo" || config_.backend == "local") {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(where, ", but this gradsyncd runs --backend=", config_.backend,
                                  " (CPU tensors only); use auto or nccl"));
  }
  if (!hooks_.gpu.device) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(where,
                                  ", but this gradsyncd has no GPU device (it was built "
                                  "without the CUDA device, or none could be opened at start)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RegisterResult> Job::Register(uint64_t session, Layout layout, absl::Time deadline,
                                             std::optional<GpuTrainerSpec> cuda) {
  absl::StatusOr<RegisterResult> result =
      RegisterAndWait(session, std::move(layout), deadline, std::move(cuda));
  DeliverHealth();
  return result;
}

absl::StatusOr<RegisterResult> Job::RegisterAndWait(uint64_t session, Layout layout,
                                                    absl::Time deadline,
                                                    std::optional<GpuTrainerSpec> cuda) {
  // Held for the whole call: a trainer that leaves while we wait may be
  // replaced in trainers_ by the next one to attach.
  std::shared_ptr<Trainer> t;
  bool last = false;
  std::string forming_report;
  {
    MonotonicMutexLock lock(&mu_);
    t = HoldLocked(session);
    if (t == nullptr) return MakeError(v1::STATE, "unknown session: attach first");
    if (state_ == JobState::kFailed) return PeerError(*t);
    if (t->registered) return MakeError(v1::STATE, "this trainer already registered its layout");
    if (t->rejoining) {
      return RegisterRejoiningLocked(*t, std::move(layout), std::move(cuda), deadline);
    }
    // Refused before counting: the trainer learns at once, the job is unharmed.
    RETURN_IF_ERROR(CheckDeviceKind(layout));
    const bool is_cuda = !layout.empty() && layout[0].device >= 0;
    if (is_cuda != cuda.has_value()) {
      return MakeError(v1::INVALID_ARGUMENT,
                       is_cuda ? "CUDA tensors need a CUDA registration (device id, mode, events)"
                               : "a CUDA registration came with CPU tensors");
    }
    t->layout = std::move(layout);
    t->cuda = std::move(cuda);
    t->registered = true;
    ++registered_;
    spdlog::info("event=register job={} local_rank={} tensors={} layout_hash={:016x}", id_,
                 t->local_rank, t->layout.size(), LayoutHash(t->layout));
    last = registered_ == config_.local_size;
    if (!last) forming_report = MissingLocalRanksLocked();
  }
  // The last local trainer to register forms the world on its own thread.
  if (last) Form();
  // Until then the other nodes wait for this one: the leader learns whom
  // it waits for (a failure is only a less precise error elsewhere).
  if (!forming_report.empty() && hooks_.report_forming) hooks_.report_forming(forming_report);

  MonotonicMutexLock lock(&mu_);
  auto settled = [this, &t] {
    mu_.AssertReaderHeld();
    return state_ == JobState::kRunning || state_ == JobState::kFailed || t->gone.load();
  };
  // `deadline` is on the monotonic scale: waits take what is left of it.
  bool done = mu_.AwaitWithTimeout(absl::Condition(&settled), deadline - MonotonicNow());
  if (!done && state_ == JobState::kForming) {
    // Forming across nodes has its own timeout, whose error names the
    // missing node or the unreachable leader: wait for that verdict, up to
    // one more timeout in case forming hangs.
    done = mu_.AwaitWithTimeout(absl::Condition(&settled),
                                deadline + absl::Milliseconds(config_.timeout_ms) - MonotonicNow());
  }
  if (t->gone.load()) return MakeError(v1::STATE, "the trainer left during registration");
  if (!done) {
    const std::string missing = MissingLocalRanksLocked();
    FailLocked(MakeError(v1::TIMEOUT,
                         absl::StrCat("registration timed out: ",
                                      missing.empty()
                                          ? absl::StrCat(registered_, " of ", config_.local_size,
                                                         " local trainers registered (forming "
                                                         "the job across nodes)")
                                          : missing)),
               -1);
  }
  if (state_ == JobState::kFailed) return PeerError(*t);

  RegisterResult r;
  r.segment_name = t->segment.name();
  r.node_segment_name = node_->name();
  r.layout_hash = LayoutHash(layout_);
  r.arena_bytes = arena_.total_bytes;
  r.tensor_offsets = gpu_session_ ? flat_plan_.tensor_offsets : arena_.tensor_offsets;
  if (gpu_session_ && gpu_session_->flat()) {
    r.flat_buffer_handle = gpu_session_->flat_handle(t->local_rank).ToBytes();
    r.flat_buffer_bytes = gpu_session_->flat_bytes();
  }
  r.rank = t->rank;
  r.world_size = world_.world_size;
  r.plan = scheduler_->plan();
  r.start_iteration = world_.start_iteration;
  r.joined_running_job = world_.start_iteration > 0;
  r.catch_up_root = world_.running_plan.catch_up_root;
  return r;
}

std::string Job::MissingLocalRanksLocked() const {
  std::vector<int> missing;
  for (int r = 0; r < config_.local_size; ++r) {
    if (!trainers_[r] || !trainers_[r]->registered || trainers_[r]->gone.load()) {
      missing.push_back(r);
    }
  }
  if (missing.empty()) return "";
  return absl::StrCat(registered_, " of ", config_.local_size,
                      " local trainers registered; missing local ranks ",
                      absl::StrJoin(missing, ", "));
}

void Job::Form() {
  // Phase 1, under mu_: the local trainers agree on the layout; the job is
  // now forming (no new trainer can attach). CUDA layouts: what each
  // trainer registered, copied for phase 2.
  std::optional<Layout> layout;
  std::vector<GpuTrainerSpec> gpu_specs;
  std::vector<std::pair<int, int64_t>> gpu_trainers;  // local rank, pid
  {
    MonotonicMutexLock lock(&mu_);
    layout = BeginFormLocked();
    if (layout && !layout->empty() && (*layout)[0].device >= 0) {
      for (const auto& t : trainers_) {
        gpu_specs.push_back(*t->cuda);
        gpu_trainers.emplace_back(t->local_rank, t->pid);
      }
    }
  }
  if (!layout) return;

  // Phase 2, without mu_: forming talks to the leader and may block until
  // the timeout. A trainer may leave meanwhile, failing the job. So may
  // opening the GPU path (handles, buffers, the communicators, whose GPU
  // counts and unique id cross nodes through the rendezvous store).
  absl::StatusOr<JobWorld> world =
      former_(*layout, LayoutHash(*layout),
              [this](const absl::Status& error) { OnWorldFailure(/*epoch=*/0, error); });
  absl::StatusOr<GpuStart> gpu = GpuStart{};
  bool mapping = false;  // counted in departures_in_flight_
  if (world.ok() && !gpu_specs.empty()) {
    std::vector<std::string> names;
    for (const auto& [local_rank, pid] : gpu_trainers) {
      names.push_back(absl::StrCat("rank ", world->rank_offset + local_rank, " (local ", local_rank,
                                   ", pid ", pid, ")"));
    }
    // OpenGpu maps the trainers' memory outside gpu_session_: a trainer
    // that leaves meanwhile (the job failed, its Register returned) must
    // not get its Detach answered until that mapping is closed or handed to
    // gpu_session_, where Leave finds it. A job that already failed maps
    // nothing.
    bool open = false;
    std::shared_ptr<std::atomic<bool>> cancel;
    {
      MonotonicMutexLock lock(&mu_);
      open = state_ != JobState::kFailed;
      if (open) {
        ++departures_in_flight_;
        cancel = gpu_open_cancel_ = std::make_shared<std::atomic<bool>>(false);
      }
    }
    if (open) {
      gpu = OpenGpu(std::move(cancel), *layout, *world, gpu_specs, names);
      mapping = true;
    }
  }

  // Phase 3, under mu_ again: start the job, unless it failed meanwhile.
  {
    MonotonicMutexLock lock(&mu_);
    if (state_ == JobState::kFailed) {
      // `world` (and `gpu`) are torn down below, without mu_: its link
      // joins a thread that may call Fail.
    } else if (!world.ok()) {
      FailLocked(world.status(), -1);
    } else if (!gpu.ok()) {
      FailLocked(gpu.status(), -1);
    } else if (absl::Status st = StartLocked(layout_, std::move(*world), std::move(*gpu));
               !st.ok()) {
      FailLocked(st, -1);
    }
  }
  if (mapping) {
    if (gpu.ok()) gpu->session.reset();  // not started: closes what phase 2 mapped
    MonotonicMutexLock lock(&mu_);
    --departures_in_flight_;
  }
}

std::optional<Layout> Job::BeginFormLocked() {
  // A trainer may have left (or another formed the world) since the caller
  // saw every local trainer registered.
  if (state_ != JobState::kAttaching || registered_ != config_.local_size) return std::nullopt;
  const Layout& reference = trainers_[0]->layout;
  for (int r = 1; r < config_.local_size; ++r) {
    if (auto diff = FirstDifference(reference, trainers_[r]->layout)) {
      FailLocked(MakeError(v1::MISMATCH,
                           absl::StrCat("layout mismatch on node ", config_.node_rank,
                                        ": local rank ", r, " (pid ", trainers_[r]->pid,
                                        ") registered a different layout than local rank 0 (pid ",
                                        trainers_[0]->pid, "): first difference at ", *diff)),
                 -1);
      return std::nullopt;
    }
  }
  state_ = JobState::kForming;
  layout_ = reference;
  return layout_;
}

BucketCaps Job::InitialCaps(const JobWorld& world) const {
  return world.caps.cap_bytes > 0
             ? world.caps
             : BucketCaps{config_.bucket_cap_bytes(), config_.first_bucket_cap_bytes()};
}

absl::StatusOr<Job::GpuStart> Job::OpenGpu(std::shared_ptr<std::atomic<bool>> cancel,
                                           const Layout& layout, const JobWorld& world,
                                           const std::vector<GpuTrainerSpec>& specs,
                                           const std::vector<std::string>& names) const {
  // The same planner over the real sizes as StartLocked's arena: every
  // initial bucket is one contiguous range of each trainer's flat buffer.
  BucketPlan plan =
      PlanBuckets(layout, ReverseRegistrationOrder(layout.size()), InitialCaps(world));
  std::vector<uint64_t> real_bytes;
  for (const TensorInfo& t : layout) real_bytes.push_back(t.bytes());
  std::vector<std::vector<uint32_t>> groups;
  for (const PlannedBucket& b : plan.buckets) groups.push_back(b.tensors);
  auto flat = ipc::PlanArena(real_bytes, groups);
  if (!flat.ok()) return MakeError(v1::INTERNAL, flat.status().message());
  GpuStart start;
  start.flat_plan = std::move(*flat);

  std::vector<GpuSession::TrainerInput> inputs;
  for (size_t t = 0; t < specs.size(); ++t) inputs.push_back({&specs[t], names[t]});
  // One node: the job id is unique per daemon, so every job's
  // communicators are a fresh generation.
  ASSIGN_OR_RETURN(const GpuSession::WorldInput in,
                   GpuWorldInput(world, world.generation != 0 ? world.generation : id_,
                                 [cancel] { return cancel->load(std::memory_order_acquire); }));
  ASSIGN_OR_RETURN(start.session,
                   GpuSession::Open(hooks_.gpu.device.get(), layout, start.flat_plan, inputs, in));
  return start;
}

absl::StatusOr<GpuSession::WorldInput> Job::GpuWorldInput(const JobWorld& world,
                                                          uint64_t generation,
                                                          std::function<bool()> cancelled) const {
  GpuSession::WorldInput in;
  in.generation = generation;
  in.timeout = absl::Milliseconds(config_.timeout_ms);
  // Its place among the generation's members: node ranks 0..n-1 in a job
  // that starts here, other places for a node joining a re-formed one or a
  // survivor of a re-formation (GPU counts and the unique id travel under
  // the generation's keys).
  in.node_rank = world.node_index;
  in.num_nodes = world.num_nodes;
  in.node_name = absl::StrCat("node ", config_.node_rank);
  in.publish = world.publish;
  in.fetch = world.fetch;
  in.is_context_lost = hooks_.gpu.is_context_lost;
  in.cancelled = std::move(cancelled);
  if (in.num_nodes > 1 && (!in.publish || !in.fetch)) {
    return MakeError(v1::INTERNAL, "a multi-node world without the rendezvous exchange");
  }
  return in;
}

absl::Status Job::StartLocked(const Layout& layout, JobWorld world, GpuStart gpu) {
  world_ = std::move(world);
  BucketCaps caps = InitialCaps(world_);
  BucketPlan plan = PlanBuckets(layout, ReverseRegistrationOrder(layout.size()), caps);
  // The arena is laid out by the initial plan, as on every member (the
  // order of a bucket's elements on the wire follows it).
  std::vector<uint64_t> tensor_bytes;
  for (const TensorInfo& t : layout) tensor_bytes.push_back(t.device >= 0 ? 0 : t.bytes());
  std::vector<std::vector<uint32_t>> groups;
  for (const PlannedBucket& b : plan.buckets) groups.push_back(b.tensors);
  auto arena = ipc::PlanArena(tensor_bytes, groups);
  if (!arena.ok()) return MakeError(v1::INTERNAL, arena.status().message());
  arena_ = std::move(*arena);
  if (world_.start_iteration > 0) {
    // Joined a running job: the members' plan from the first iteration.
    caps = world_.running_plan.caps;
    plan = PlanBuckets(layout, world_.running_plan.order, caps);
  }
  const bool cuda = gpu.session != nullptr;
  if (cuda) {
    flat_plan_ = std::move(gpu.flat_plan);
    gpu_session_ = std::move(gpu.session);
    gpu_backend_name_ = absl::StrCat("gpu-", gpu_session_->device().name());
    // (It sizes its staging when the scheduler installs a plan.)
    // Elastic jobs keep every bucket's local sum for a redo (Reform).
    gpu_reducer_ = std::make_unique<GpuReducer>(gpu_session_.get(), layout_, world_.world_size,
                                                hooks_.gpu.unsafe_skip_event_wait, reforms());
    if (hooks_.gpu.unsafe_skip_event_wait) {
      spdlog::warn("event=unsafe_skip_event_wait job={} (test-only: results may be wrong)", id_);
    }
  }

  ASSIGN_OR_RETURN(std::vector<Trainer*> trainers, CreateSegmentsLocked(LayoutHash(layout)));
  CreateStatsLocked(layout, plan.buckets.size(), trainers.size());
  Scheduler::Options opts = SchedulerOptionsLocked(caps, cuda);
  if (reforms()) {
    opts.reform = [this](const absl::Status& error, uint64_t iteration) {
      return Reform(error, iteration);
    };
    opts.leave_job = [this](const absl::Status& error, int culprit) { Depart(error, culprit); };
    opts.grow = [this](uint64_t iteration, const RunningPlan& running) {
      return Grow(iteration, running);
    };
    opts.on_rejoined = [this](Trainer* fresh, uint64_t start, int root) {
      OnTrainerRejoined(fresh, start, root);
    };
    opts.on_rejoin_refused = [this](Trainer* fresh, const absl::Status& error) {
      OnTrainerRejoinRefused(fresh, error);
    };
  }
  opts.start_iteration = world_.start_iteration;
  opts.running_plan = world_.running_plan;
  broadcaster_ = std::make_unique<Broadcaster>(
      trainers, world_.backend.get(),
      [this](const absl::Status& error, int culprit) { Fail(error, culprit); },
      BroadcasterOptionsLocked());
  opts.allow_marks = [b = broadcaster_.get()](const Trainer& t) { return b->AllowMarks(t); };
  if (reforms()) {
    // The catch-up broadcast of a join, whose root's node may die during it.
    opts.on_catch_up = [b = broadcaster_.get()](int root, uint64_t start,
                                                std::vector<uint8_t> old_members) {
      b->ExpectCatchUp(root, start, std::move(old_members));
    };
    if (world_.start_iteration > 0) {
      // This node joins: none of its trainers holds the state.
      broadcaster_->ExpectCatchUp(world_.running_plan.catch_up_root, world_.start_iteration, {});
    }
    // A death during a broadcast re-forms the job like one during an
    // iteration; the re-formation then settles the broadcast.
    broadcaster_->set_on_world_failure(
        [this](uint64_t epoch, const absl::Status& error) { OnWorldFailure(epoch, error); });
    opts.resume_broadcast = [b = broadcaster_.get()](bool* collective_failed) {
      return b->Resume(collective_failed);
    };
  }
  scheduler_ = std::make_unique<Scheduler>(
      trainers, layout_, std::move(plan), cuda ? flat_plan_ : arena_, world_.backend.get(),
      &node_->ready_bell(), stats_.get(),
      [this](const absl::Status& error, int culprit) { Fail(error, culprit); }, opts);
  broadcaster_->set_scheduler(scheduler_.get());
  broadcaster_->set_gpu(gpu_session_.get());
  replica_checker_ = std::make_unique<ReplicaChecker>(
      trainers, layout_, world_.backend.get(),
      [this](const absl::Status& error, int culprit) { Fail(error, culprit); },
      ReplicaChecker::Options{config_.check_replicas_every, config_.node_rank, world_.world_size,
                              world_.uneven_inputs});
  // This node's place among the members: a node that joined a running job
  // need not be at its node rank.
  replica_checker_->SetWorld(world_.backend.get(), world_.node_index);
  replica_checker_->set_scheduler(scheduler_.get());
  state_ = JobState::kRunning;
  running_since_ = std::chrono::steady_clock::now();
  if (world_.link) {
    Scheduler* scheduler = scheduler_.get();
    WorldLink* link = world_.link.get();
    link->SetProgress([scheduler] { return scheduler->iteration(); });
    link->SetConfigListener(
        [scheduler](const BucketCaps& caps, uint64_t at, uint64_t version, bool grow) {
          scheduler->SetCaps(caps, at, version, grow);
        });
    stats_->set_stall_listener([link](const std::string& d) { link->ReportStall(d); });
  }
  scheduler_->Start();
  health_queue_.push_back({true, ""});
  spdlog::info(
      "event=job_running job={} world_size={} rank_offset={} buckets={} arena_bytes={} backend={}",
      id_, world_.world_size, world_.rank_offset, scheduler_->plan().buckets.size(),
      cuda ? flat_plan_.total_bytes : arena_.total_bytes, BackendNameLocked());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Trainer*>> Job::CreateSegmentsLocked(uint64_t layout_hash) {
  std::vector<Trainer*> trainers;
  for (auto& t : trainers_) {
    RETURN_IF_ERROR(CreateSegmentLocked(*t, layout_hash));
    t->rank = world_.rank_offset + t->local_rank;
    trainers.push_back(t.get());
  }
  return trainers;
}

absl::Status Job::CreateSegmentLocked(Trainer& t, uint64_t layout_hash) {
  ipc::TrainerSegmentSpec spec;
  spec.layout_hash = layout_hash;
  spec.arena_bytes = arena_.total_bytes;
  spec.ring_capacity = config_.ring_capacity;
  spec.local_rank = t.local_rank;
  spec.daemon_pid = getpid();
  auto seg = ipc::CreateUnderRandomName<ipc::TrainerSegment>(
      config_.shm_prefix, getpid(), absl::StrCat("j", id_, ".r", t.local_rank),
      [&](const std::string& name) {
        return ipc::TrainerSegment::Create(name, spec, config_.shm_mode, config_.shm_group);
      });
  if (!seg.ok()) {
    // A /dev/shm too small for the job is the operator's to fix, not a bug.
    if (seg.status().code() == absl::StatusCode::kResourceExhausted) {
      return MakeError(v1::RESOURCE_EXHAUSTED, seg.status().message());
    }
    return MakeError(v1::INTERNAL, seg.status().ToString());
  }
  t.segment = std::move(*seg);
  return absl::OkStatus();
}

void Job::CreateStatsLocked(const Layout& layout, size_t num_buckets, size_t num_trainers) {
  std::vector<std::string> names;
  for (const TensorInfo& t : layout) names.push_back(t.name);
  constexpr size_t kTracedIterations = 8;
  size_t recorder_events =
      FlightRecorder::CapacityFor(kTracedIterations, num_buckets, layout.size(), num_trainers);
  // The timeline's writer tails the ring: give it room to lag.
  if (hooks_.timeline) recorder_events = std::max(recorder_events, TimelineWriter::kMinRingEvents);
  stats_ = std::make_unique<JobStats>(world_.rank_offset, world_.world_size, recorder_events,
                                      hooks_.trace_dir, config_.job_id, config_.node_rank,
                                      config_.num_nodes, std::move(names));
  if (hooks_.timeline) stats_->StreamTo(hooks_.timeline);
  stats_->stragglers().SetOptions(StragglerOptions{static_cast<uint32_t>(config_.straggler_window),
                                                   config_.straggler_share,
                                                   config_.straggler_late_ms});
  stats_->set_iteration_durations(hooks_.iteration_durations);

  if (hooks_.on_iteration_done) {
    stats_->set_iteration_listener(
        [hook = hooks_.on_iteration_done, id = id_](uint64_t it, uint64_t bytes, int64_t end) {
          hook(id, it, bytes, end);
        });
  }
}

Scheduler::Options Job::SchedulerOptionsLocked(const BucketCaps& caps, bool cuda) const {
  Scheduler::Options opts;
  opts.world_size = world_.world_size;
  opts.uneven_inputs = world_.uneven_inputs;
  // Validated at start-up (ValidateConfig).
  opts.nonfinite = ParseNonFiniteMode(config_.nonfinite).value_or(NonFiniteMode::kError);
  opts.node_rank = config_.node_rank;
  opts.node_index = world_.node_index;
  opts.timeout_ms = config_.timeout_ms;
  opts.stall_threshold_s = config_.stall_threshold_s;
  opts.caps = caps;
  opts.agree_order = world_.agree_order;
  opts.check_plan = world_.check_plan;
  opts.node_segment = node_.get();
  opts.stragglers = stats_ ? &stats_->stragglers() : nullptr;
  if (cuda) {
    opts.gpu = gpu_reducer_.get();
    opts.is_context_lost = hooks_.gpu.is_context_lost;
  }
  // Auto: the cores the node's trainers leave free (they compute backward
  // while buckets are reduced), at least 1; more than 4 threads gain
  // nothing on a memory-bound sum.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  opts.reduce_threads = config_.reduce_threads > 0 ? config_.reduce_threads
                                                   : std::clamp(cores - config_.local_size, 1, 4);
  // Once every trainer has marked everything, their cores are free too.
  opts.tail_reduce_threads =
      config_.reduce_threads > 0 ? config_.reduce_threads : std::clamp(cores, 1, 4);
  return opts;
}

Broadcaster::Options Job::BroadcasterOptionsLocked() const {
  Broadcaster::Options bopts;
  bopts.node_rank = config_.node_rank;
  bopts.num_nodes = world_.num_nodes;
  bopts.node_index = world_.node_index;
  bopts.rank_offset = world_.rank_offset;
  bopts.world_size = world_.world_size;
  bopts.timeout_ms = config_.timeout_ms;
  bopts.shm_prefix = config_.shm_prefix;
  bopts.shm_mode = config_.shm_mode;
  bopts.shm_group = config_.shm_group;
  return bopts;
}

std::string Job::BackendNameLocked() const {
  if (!gpu_backend_name_.empty()) return gpu_backend_name_;
  return world_.backend ? world_.backend->name() : "";
}

void Job::Fail(const absl::Status& error, int culprit) {
  absl::Status explained = error;
  if (culprit == Scheduler::kCollectiveFailed) {
    absl::SleepFor(CollectiveCheckDelay());
    // Ask the leader why, without holding the lock (it is an RPC).
    std::shared_ptr<WorldLink> link;
    {
      MonotonicMutexLock lock(&mu_);
      link = world_.link;
      explaining_ = link != nullptr;
    }
    if (link) explained = link->Explain(error);
    culprit = -1;
  } else if (culprit < 0 && ExplainingElsewhere()) {
    return;  // a job-wide symptom: the explanation in flight ends the job
  }
  {
    MonotonicMutexLock lock(&mu_);
    explaining_ = false;
    FailLocked(explained, culprit);
  }
  DeliverHealth();
}

bool Job::ExplainingElsewhere() const {
  MonotonicMutexLock lock(&mu_);
  if (!explaining_) return false;
  spdlog::info("event=job_failure_deferred job={} until=collective_failure_explained", id_);
  return true;
}

void Job::Depart(const absl::Status& error, int culprit) {
  {
    MonotonicMutexLock lock(&mu_);
    FailLocked(error, culprit, /*expected=*/false, /*departing=*/true);
  }
  DeliverHealth();
}

void Job::AwaitDeparted(absl::Duration limit) {
  std::shared_ptr<WorldLink> link;
  {
    MonotonicMutexLock lock(&mu_);
    link = world_.link;
  }
  if (link) link->AwaitDeparted(limit);
}

void Job::FailLocked(const absl::Status& error, int culprit, bool expected, bool departing) {
  if (state_ == JobState::kFailed) return;
  state_ = JobState::kFailed;
  error_ = error;
  culprit_ = culprit;
  failure_expected_ = expected;
  departing_ = departing;
  spdlog::log(expected ? spdlog::level::info : spdlog::level::err,
              "event={} job={} code={} culprit_local_rank={} message={}",
              expected ? "job_closing" : "job_failed", id_, v1::Code_Name(CodeOf(error)), culprit,
              LogValue(error.message()));
  if (scheduler_) scheduler_->Halt();
  if (!expected) {
    if (stats_) stats_->OnError(std::string(error.message()), CodeOf(error) == v1::TIMEOUT);
    health_queue_.push_back({false, std::string(error.message())});
  }
  // Reported before the sockets close: the other nodes' collectives fail
  // when they do, and the leader should hear the cause first.
  if (world_.link && departing) {
    world_.link->ReportDeparture(error);
  } else if (world_.link) {
    world_.link->ReportError(error);
  }
  if (world_.backend) world_.backend->Abort(std::string(error.message()));
  if (broadcaster_) broadcaster_->Abort(error);
  if (replica_checker_) replica_checker_->Abort(error);
  if (gpu_session_) gpu_session_->Abort(std::string(error.message()));
  if (gpu_open_cancel_) gpu_open_cancel_->store(true, std::memory_order_release);
  for (auto& t : trainers_) {
    if (!t || t->gone.load() || t->segment.header() == nullptr) continue;
    const absl::Status mine = PeerError(*t);
    t->segment.SetError(CodeOf(mine), std::string(mine.message()));
    PostCompletion(*t, ipc::CompletionKind::kError, 0, scheduler_ ? scheduler_->iteration() : 0,
                   CodeOf(mine), /*wake=*/true, /*patience_ms=*/20)
        .IgnoreError();
  }
}

absl::StatusOr<Broadcaster::StepResult> Job::Broadcast(uint64_t session, uint64_t bytes,
                                                       int root_rank, uint64_t step, bool device,
                                                       int fused_slot, absl::Time deadline) {
  std::shared_ptr<Trainer> t;
  Broadcaster* broadcaster = nullptr;
  {
    MonotonicMutexLock lock(&mu_);
    t = HoldLocked(session);
    if (!t) return MakeError(v1::STATE, "unknown session");
    if (state_ == JobState::kFailed) return PeerError(*t);
    if (state_ != JobState::kRunning || !broadcaster_) {
      return MakeError(v1::STATE, "gs_broadcast before the job runs: call gs_register first");
    }
    broadcaster = broadcaster_.get();  // lives as long as the job
  }
  absl::StatusOr<Broadcaster::StepResult> r =
      broadcaster->Step(*t, bytes, root_rank, step, device, fused_slot, deadline);
  if (r.ok()) return r;
  MonotonicMutexLock lock(&mu_);
  // The job failed (by this call or another): the error this trainer gets.
  if (state_ == JobState::kFailed) return PeerError(*t);
  return r.status();
}

absl::Status Job::CheckReplicas(uint64_t session, uint64_t iteration,
                                const std::vector<uint64_t>& hashes, absl::Time deadline) {
  std::shared_ptr<Trainer> t;
  ReplicaChecker* checker = nullptr;
  {
    MonotonicMutexLock lock(&mu_);
    t = HoldLocked(session);
    if (!t) return MakeError(v1::STATE, "unknown session");
    if (state_ == JobState::kFailed) return PeerError(*t);
    if (state_ != JobState::kRunning || !replica_checker_) {
      return MakeError(v1::STATE, "gs_check_replicas before the job runs: call gs_register first");
    }
    checker = replica_checker_.get();  // lives as long as the job
  }
  const absl::Status st = checker->Check(*t, iteration, hashes, deadline);
  if (st.ok()) return st;
  MonotonicMutexLock lock(&mu_);
  if (state_ == JobState::kFailed) return PeerError(*t);
  return st;
}

void Job::DeliverHealth() {
  if (!hooks_.on_health) return;
  absl::MutexLock deliver(&hooks_mu_);
  std::vector<HealthChange> changes;
  {
    MonotonicMutexLock lock(&mu_);
    changes.swap(health_queue_);
  }
  for (const HealthChange& c : changes) hooks_.on_health(c.serving, c.reason);
}

absl::Status Job::PeerError(const Trainer& t) const {
  if (culprit_ < 0 || culprit_ == t.local_rank) return error_;
  const Trainer* c = trainers_[culprit_].get();
  return MakeError(v1::PEER_FAILED,
                   absl::StrCat(c ? c->Name() : absl::StrCat("local rank ", culprit_),
                                " failed: ", error_.message()));
}

void Job::Leave(uint64_t session, bool graceful, const std::string& reason) {
  int local_rank = -1;
  const bool last = RemoveTrainer(session, graceful, reason, &local_rank);
  DeliverHealth();
  if (last) {
    ReleaseWorld();
  } else if (local_rank >= 0) {
    if (hooks_.gpu.test_pause) hooks_.gpu.test_pause("departure");
    ReleaseDeparted(local_rank);
  }
  // GPU path: the trainer may free its gradient memory and destroy its
  // events once gs_close returns (user-pointer mode), so its Detach returns
  // only after the daemon let go of them. Whoever releases them — this
  // call, or the last trainer's ReleaseWorld (which may have taken the
  // session before we looked), or another Leave of this same session (its
  // Watch stream broke meanwhile) — is counted in departures_in_flight_:
  // wait for every such release, ours counted off first.
  MonotonicMutexLock lock(&mu_);
  if (!last && local_rank >= 0) --departures_in_flight_;  // ReleaseWorld counts off its own
  auto released = [this] {
    mu_.AssertReaderHeld();
    return departures_in_flight_ == 0;
  };
  // Each release is bounded (the scheduler's halt and the device gate's
  // deadline); this bound only keeps a bug from pinning the RPC thread.
  if (!mu_.AwaitWithTimeout(absl::Condition(&released),
                            absl::Milliseconds(2 * config_.timeout_ms) + absl::Seconds(30))) {
    spdlog::error("event=departure_release_overdue job={} local_rank={} in_flight={}", id_,
                  local_rank, departures_in_flight_);
  }
}

void Job::ReleaseDeparted(int local_rank) {
  // The job failed in RemoveTrainer, so a reduction in flight stops.
  Scheduler* scheduler = nullptr;
  {
    MonotonicMutexLock lock(&mu_);
    if (!gpu_session_) return;
    scheduler = scheduler_.get();
  }
  // No scheduler: the job failed while starting, and nothing reduces.
  if (scheduler != nullptr) scheduler->WaitIdle();
  // If another trainer left last meanwhile, ReleaseWorld holds
  // gpu_release_mu_ until the whole session (ours included) is gone, and
  // gpu_session_ is then empty. The device calls are bounded (the device
  // gate's deadline), and the halted scheduler needs no lock of ours.
  absl::MutexLock release(&gpu_release_mu_);
  MonotonicMutexLock lock(&mu_);
  if (gpu_session_) gpu_session_->ReleaseTrainer(static_cast<size_t>(local_rank));
}

void Job::ReleaseWorld() {
  // Every trainer is gone: stop the scheduler and leave the cluster now,
  // not when the next job replaces this one (the stats stay readable).
  std::shared_ptr<WorldLink> link;
  Scheduler* scheduler = nullptr;
  std::unique_ptr<GpuReducer> gpu_reducer;
  std::unique_ptr<GpuSession> gpu_session;
  Broadcaster* broadcaster = nullptr;
  absl::ReleasableMutexLock release(&gpu_release_mu_);  // see Leave
  {
    MonotonicMutexLock lock(&mu_);
    link = std::move(world_.link);
    scheduler = scheduler_.get();
    broadcaster = broadcaster_.get();  // lives as long as the job
    gpu_reducer = std::move(gpu_reducer_);
    gpu_session = std::move(gpu_session_);
  }
  if (hooks_.gpu.test_pause && gpu_session) hooks_.gpu.test_pause("world_release");
  if (scheduler) scheduler->Stop();
  // A device broadcast's piece runs on the session too (an RPC thread's).
  if (broadcaster && gpu_session) {
    broadcaster->StopAndWait(absl::Milliseconds(2 * config_.timeout_ms) + absl::Seconds(30));
  }
  // Only now, with the scheduler stopped, is no collective running: the
  // communicators, buffers, handles and events can go.
  gpu_reducer.reset();
  gpu_session.reset();
  release.Release();
  {
    // Every departed trainer's handles are closed: their Detach may return
    // now, without waiting for the leader below.
    MonotonicMutexLock lock(&mu_);
    --departures_in_flight_;
  }
  link.reset();  // outside the lock: it talks to the leader
  spdlog::info("event=job_released job={}", id_);
}

bool Job::ShrinksOnTrainerDeathLocked(const Trainer& dead) const {
  if (state_ != JobState::kRunning || !scheduler_ || !elastic() || !world_.link ||
      !hooks_.reform_world) {
    return false;
  }
  // The last trainer of a node takes its node out instead (below).
  return !LastLiveTrainerLocked(dead);
}

bool Job::NodeLeavesOnTrainerDeathLocked(const Trainer& dead) const {
  if (state_ != JobState::kRunning || !elastic() || !world_.link) return false;
  return LastLiveTrainerLocked(dead);
}

bool Job::LastLiveTrainerLocked(const Trainer& dead) const {
  for (const auto& other : trainers_) {
    if (other && other.get() != &dead && !other->gone.load()) return false;
  }
  return true;
}

bool Job::RemoveTrainer(uint64_t session, bool graceful, const std::string& reason,
                        int* local_rank) {
  MonotonicMutexLock lock(&mu_);
  Trainer* t = FindLocked(session);
  if (t == nullptr) return false;
  *local_rank = t->local_rank;
  t->gone.store(true);
  ++departures_in_flight_;  // until its Leave released what it may free
  spdlog::info("event=leave job={} local_rank={} pid={} graceful={} reason={}", id_, t->local_rank,
               t->pid, graceful, LogValue(reason));
  if (t->segment.header() != nullptr) ipc::SharedSegment::Remove(t->segment.name()).IgnoreError();
  if (state_ == JobState::kAttaching) {
    if (t->registered) --registered_;
  } else if (t->rejoining && !t->admitted && state_ == JobState::kRunning && scheduler_) {
    // Not in the job yet: nothing to fail. Should the scheduler have just
    // taken it in, this counts it out again (it marked nothing).
    scheduler_->RequestDeparture(t->local_rank, reason);
    if (gpu_session_) {
      // As a dead trainer's: any GPU handles the scheduler opened for it at
      // the boundary stay until the job ends or the next restart replaces
      // them; releasing them now would halt the scheduler.
      --departures_in_flight_;
      *local_rank = -1;
    }
  } else if (!graceful && ShrinksOnTrainerDeathLocked(*t)) {
    // Its node stays in the elastic job (scheduler_departure.cc).
    scheduler_->RequestDeparture(t->local_rank, reason);
    if (gpu_session_) {
      // Nobody waits on a dead trainer's Detach, and halting the scheduler
      // to release its GPU handles now would stop the job: the scheduler
      // stops reading them (GpuReducer::DeactivateTrainer) and they go
      // with the session when the job ends.
      --departures_in_flight_;
      *local_rank = -1;
    }
  } else if (!graceful && NodeLeavesOnTrainerDeathLocked(*t)) {
    // It leaves the elastic job as a daemon stopped by SIGTERM does, and
    // the others go on without it. Kubernetes stops a Pod's trainers
    // before its sidecar, so a last trainer's death is what a scale-down
    // looks like.
    FailLocked(MakeError(v1::PEER_FAILED,
                         absl::StrCat(t->Name(), " died: ", reason,
                                      "; it was its node's last trainer, so the node leaves the "
                                      "elastic job")),
               t->local_rank, /*expected=*/false, /*departing=*/true);
  } else if (state_ != JobState::kFailed) {
    FailLocked(MakeError(v1::PEER_FAILED,
                         absl::StrCat(t->Name(), graceful ? " detached" : " died", ": ", reason)),
               t->local_rank, /*expected=*/graceful);
  }
  for (const auto& other : trainers_) {
    if (other && !other->gone.load()) return false;
  }
  return state_ != JobState::kAttaching;
}

absl::Status Job::WaitForChange(uint64_t session, absl::Duration timeout, bool* gone) {
  MonotonicMutexLock lock(&mu_);
  auto changed = [this, session] {
    mu_.AssertReaderHeld();
    return state_ == JobState::kFailed || FindLocked(session) == nullptr;
  };
  mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  Trainer* t = FindLocked(session);
  *gone = (t == nullptr);
  if (state_ != JobState::kFailed || t == nullptr) return absl::OkStatus();
  return PeerError(*t);
}

absl::Status Job::MarkWatched(uint64_t session) {
  MonotonicMutexLock lock(&mu_);
  Trainer* t = FindLocked(session);
  if (t == nullptr) return absl::NotFoundError("unknown session");  // detached meanwhile
  if (t->watched.exchange(true)) {
    return MakeError(v1::STATE,
                     absl::StrFormat("session %016x (local rank %d, pid %d) already has a Watch "
                                     "stream; a session holds one",
                                     session, t->local_rank, t->pid));
  }
  return absl::OkStatus();
}

std::vector<uint64_t> Job::ReapUnwatched(std::chrono::milliseconds grace) {
  std::vector<uint64_t> lost;
  {
    MonotonicMutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& t : trainers_) {
      if (t && !t->gone.load() && !t->watched.load() && now - t->attached_at > grace) {
        lost.push_back(t->session_id);
      }
    }
  }
  for (uint64_t session : lost) {
    Leave(session, /*graceful=*/false,
          "it never opened its Watch stream (it died right after attaching?)");
  }
  return lost;
}

bool Job::HasSession(uint64_t session) const {
  MonotonicMutexLock lock(&mu_);
  return FindLocked(session) != nullptr;
}

size_t Job::TrainerRecords() const {
  MonotonicMutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& t : trainers_) n += t != nullptr;
  return n;
}

bool Job::Finished() const {
  MonotonicMutexLock lock(&mu_);
  if (attached_ever_ == 0) return false;
  for (const auto& t : trainers_) {
    if (t && !t->gone.load()) return false;
  }
  return true;
}

JobState Job::state() const {
  MonotonicMutexLock lock(&mu_);
  return state_;
}

absl::Status Job::error() const {
  MonotonicMutexLock lock(&mu_);
  return error_;
}

std::vector<Job::TrainerInfo> Job::Trainers() const {
  MonotonicMutexLock lock(&mu_);
  std::vector<TrainerInfo> out;
  for (const auto& t : trainers_) {
    if (!t) continue;
    const char* st = t->gone.load()                ? "gone"
                     : state_ == JobState::kFailed ? "failed"
                     : t->registered               ? "registered"
                                                   : "attached";
    out.push_back({t->rank, t->local_rank, t->pid, st, t->iterations.load()});
  }
  return out;
}

int Job::world_size() const {
  MonotonicMutexLock lock(&mu_);
  return world_.world_size;
}

uint64_t Job::generation() const {
  MonotonicMutexLock lock(&mu_);
  return world_.generation;
}

std::string Job::backend_name() const {
  MonotonicMutexLock lock(&mu_);
  return BackendNameLocked();
}

void Job::FillStats(v1::Stats* out) const {
  MonotonicMutexLock lock(&mu_);
  out->set_generation(world_.generation);
  out->set_backend(BackendNameLocked());
  out->set_world_size(world_.world_size);
  if (world_.backend) {
    const WireStats wire = world_.backend->wire_stats();
    out->set_wire_dtype(wire.dtype);
    out->set_wire_bytes(wire.payload_bytes);
  }
  const uint64_t per_iteration = stats_ ? stats_->bytes_per_iteration() : 0;
  for (const auto& t : trainers_) {
    if (!t) continue;
    v1::TrainerStats* ts = out->add_trainers();
    ts->set_rank(t->rank);
    ts->set_local_rank(t->local_rank);
    ts->set_pid(t->pid);
    ts->set_state(t->gone.load()                ? "gone"
                  : state_ == JobState::kFailed ? "failed"
                  : t->registered               ? "registered"
                                                : "attached");
    ts->set_iterations(t->iterations.load());
    ts->set_bytes_reduced(t->iterations.load() * per_iteration);
    ts->set_joined(t->joined.load());
  }
  if (scheduler_) {
    // What this iteration averages over, as the trainers' gs_get_job_info
    // reports it, not the formed world (a dead trainer is still in that).
    out->set_world_size(scheduler_->averaging_world_size());
    out->set_active_trainers(static_cast<int32_t>(scheduler_->active_trainers()));
    out->set_joined_local_trainers(static_cast<int32_t>(scheduler_->joined_local_trainers()));
  }
  if (stats_ && scheduler_) {
    std::vector<uint32_t> tensors_per_bucket;
    for (const PlannedBucket& b : scheduler_->plan().buckets) {
      tensors_per_bucket.push_back(static_cast<uint32_t>(b.tensors.size()));
    }
    stats_->FillStats(out, tensors_per_bucket);
  }
  if (state_ == JobState::kFailed && !failure_expected_ && out->recent_errors_size() == 0) {
    out->add_recent_errors(std::string(error_.message()));
  }
}

absl::StatusOr<JobStats::BoundedTrace> Job::TraceJson(size_t max_bytes) const {
  MonotonicMutexLock lock(&mu_);
  if (!stats_) return MakeError(v1::STATE, "the job has not started: nothing recorded yet");
  return stats_->TraceJsonWithin("GetTrace", max_bytes);
}

void Job::SetCaps(const BucketCaps& caps, uint64_t at_iteration) {
  MonotonicMutexLock lock(&mu_);
  if (scheduler_) scheduler_->SetCaps(caps, at_iteration);
}

double Job::IterationRate() const {
  MonotonicMutexLock lock(&mu_);
  if (!scheduler_ || !stats_ || state_ != JobState::kRunning) return 0;
  // Before the first completions only the average since the start is
  // known; biased high while the job is young (10 ms floor).
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - running_since_).count();
  const double since_start = (scheduler_->iteration() + 1) / std::max(s, 0.01);
  return std::max(since_start, stats_->RecentIterationRate());
}

bool Job::InIteration() const {
  MonotonicMutexLock lock(&mu_);
  return scheduler_ && state_ == JobState::kRunning && scheduler_->in_iteration();
}

uint64_t Job::iteration() const {
  MonotonicMutexLock lock(&mu_);
  return scheduler_ ? scheduler_->iteration() : 0;
}

}  // namespace gradsync
