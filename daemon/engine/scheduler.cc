#include "daemon/engine/scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/hop_trace.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "daemon/engine/bucket_pieces.h"
#include "ipc/mark_checksum.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// How long the loop sleeps at most before re-checking deadlines and stop.
constexpr auto kIdleWait = std::chrono::milliseconds(50);
constexpr auto kSpin = std::chrono::microseconds(50);

// The daemon spins briefly before sleeping on the node doorbell: the next
// marks usually follow a completion within tens of microseconds (a trainer
// waking up), and catching them spinning saves a futex wake-up on the
// critical path. Unlike the trainers' spin (see client.cc), one spinning
// daemon costs little even when cores are scarce (measured on 2 cores, 2
// trainers, 4 KB: p50 ~20-40 us spinning vs ~55 us sleeping at once).
// $GRADSYNC_DAEMON_SPIN_US overrides.
std::chrono::nanoseconds SchedulerSpin() {
  if (const char* env = std::getenv("GRADSYNC_DAEMON_SPIN_US"); env && *env) {
    return std::chrono::microseconds(std::max(0, std::atoi(env)));
  }
  return kSpin;
}

// The reductions' own deadlines use the same timeout and say more (which
// trainer's event is stuck, what the backend saw): the watchdog gives them
// this margin first and only catches a reduction that ignores its deadline.
int64_t WatchdogMarginNs(int64_t timeout_ms) {
  return std::min<int64_t>(timeout_ms * 1000000 / 4, 1000000000);
}

}  // namespace

Scheduler::Scheduler(std::vector<Trainer*> trainers, const Layout& layout, BucketPlan plan,
                     const ipc::ArenaLayout& arena, Backend* backend, ipc::Doorbell* ready_bell,
                     SchedulerObserver* observer, FailFn fail, Options options)
    : trainers_(std::move(trainers)),
      layout_(layout),
      arena_(arena),
      backend_(backend),
      ready_bell_(ready_bell),
      observer_(observer),
      fail_(std::move(fail)),
      options_(options),
      reducer_(std::max(options.reduce_threads, options.tail_reduce_threads), 0),
      spin_(SchedulerSpin()) {
  active_in_iteration_ = options_.world_size;
  if (options_.stragglers) {
    std::vector<StragglerTracker::TrainerId> ids;
    for (const Trainer* t : trainers_) ids.push_back({t->local_rank, t->rank, t->pid});
    options_.stragglers->Begin(ids, /*exchanged=*/false);  // SizeAgreement says
  }
  SizeAgreement();
  active_trainers_.store(static_cast<uint32_t>(options_.world_size));
  averaging_world_size_.store(options_.world_size, std::memory_order_release);
  for (Trainer* t : trainers_) {
    arenas_.push_back(t->segment.arena());
    t->marked.assign(layout_.size(), 0);
    t->mark_checksums.assign(layout_.size(), 0);
    t->marked_count = 0;
  }
  active_arenas_ = arenas_;
  FollowWorldWithInputCopies(/*at_start=*/true);
  // A backend in another process may reduce in the arenas themselves. Not
  // in elastic jobs: they keep each bucket's sum apart (KeptSums) to redo
  // an iteration that a node's death interrupted.
  if (backend_ != nullptr && backend_->num_nodes() > 1 && !options_.gpu && !options_.reform) {
    std::vector<SharedArena> shared;
    for (const Trainer* t : trainers_) {
      const ipc::SharedSegment& segment = t->segment.shared();
      const auto* base = static_cast<const uint8_t*>(segment.data());
      shared.push_back({t->segment.arena(), t->segment.arena_bytes(), segment.name(),
                        static_cast<uint64_t>(t->segment.arena() - base),
                        static_cast<uint64_t>(segment.device()),
                        static_cast<uint64_t>(segment.inode())});
    }
    backend_->ShareArenas(std::move(shared));
  }
  order_ = ReverseRegistrationOrder(layout_.size());
  if (options_.gpu) {
    // The loop is inside the reducer while it polls events: it reports.
    options_.gpu->SetStallReporter(
        options_.stall_threshold_s,
        [this](uint32_t bucket, double waited_s, const std::string& what) {
          stall_reported_ = true;
          spdlog::warn("event=stall iteration={} bucket={} waited_s={:.1f} missing={}", iteration(),
                       bucket, waited_s, LogValue(what));
          if (observer_) observer_->OnStall(iteration(), bucket, waited_s, what.c_str());
        });
  }
  InstallPlan(std::move(plan));
  InitSplitCommit();
  plan_version_.store(1, std::memory_order_release);
  if (options_.start_iteration > 0) {
    // Joined a running job: the members' order and plan decisions.
    iteration_.store(options_.start_iteration, std::memory_order_release);
    order_ = options_.running_plan.order;
    plan_version_.store(options_.running_plan.plan_version, std::memory_order_release);
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) host_ = host;
}

// event=plan_pieces lists the sizes of the first this many buckets.
constexpr uint32_t kLoggedBucketSizes = 16;

static std::vector<ReduceSpan> TensorSpans(const PlannedBucket& bucket, const Layout& layout,
                                           const ipc::ArenaLayout& arena) {
  std::vector<ReduceSpan> pieces;
  for (uint32_t t : bucket.tensors) pieces.push_back({arena.tensor_offsets[t], layout[t].bytes()});
  std::sort(pieces.begin(), pieces.end(),
            [](const ReduceSpan& a, const ReduceSpan& b) { return a.offset < b.offset; });
  // Neighbours in the arena merge into one span (across the zero padding
  // between them), so an initial bucket is a single contiguous range.
  std::vector<ReduceSpan> spans;
  for (const ReduceSpan& p : pieces) {
    if (!spans.empty() &&
        ipc::AlignUp(spans.back().offset + spans.back().bytes, ipc::kTensorAlignment) >= p.offset) {
      spans.back().bytes = p.offset + p.bytes - spans.back().offset;
    } else {
      spans.push_back(p);
    }
  }
  return spans;
}

void Scheduler::InstallPlan(BucketPlan plan) {
  std::vector<std::vector<ReduceSpan>> spans;
  uint64_t staging = 0, bytes = 0, pieces = 0;
  // Each bucket's elements as its collectives reduce them (padding between
  // tensors included): the sizes every size rule of the cross-node path
  // reads (gather, count fold, ring average, pieces).
  std::string elements;
  for (const PlannedBucket& b : plan.buckets) {
    spans.push_back(TensorSpans(b, layout_, arena_));
    uint64_t span_bytes = 0;
    for (const ReduceSpan& s : spans.back()) {
      span_bytes += s.bytes;
      // The arena was planned from the same layout; never reduce past it.
      if (s.offset > arena_.total_bytes || s.bytes > arena_.total_bytes - s.offset) {
        bad_plan_ = absl::StrCat("bucket ", b.id, " spans [", s.offset, ", +", s.bytes,
                                 ") outside the ", arena_.total_bytes, "-byte arena");
      }
    }
    if (b.id < kLoggedBucketSizes) {
      absl::StrAppend(&elements, elements.empty() ? "" : ",", span_bytes / DTypeSize(b.dtype));
    }
    staging = std::max(staging, LocalReducer::StagingBytes(span_bytes, b.dtype));
    pieces +=
        CountBucketPieces(span_bytes / DTypeSize(b.dtype),
                          LocalReducer::StagingBytes(DTypeSize(b.dtype), b.dtype), kPieceBytes);
    bytes += b.bytes;
  }
  // A backend that offers its own (shared) staging is sized here, once per
  // plan; the reducer's private staging is then never used.
  staging_bytes_ = staging;
  if (backend_->num_nodes() > 1 && !options_.gpu && backend_->Staging(staging) == nullptr) {
    reducer_.EnsureStaging(staging);
  }
  if (options_.reform && !options_.gpu) {
    // Between iterations: no bucket's sum is kept yet (the GPU reducer
    // keeps its own in device memory).
    kept_offset_.clear();
    uint64_t kept_bytes = 0;
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
      uint64_t span_bytes = 0;
      for (const ReduceSpan& sp : spans[b]) span_bytes += sp.bytes;
      kept_offset_.push_back(kept_bytes);
      kept_bytes += LocalReducer::StagingBytes(span_bytes, plan.buckets[b].dtype);
    }
    kept_.resize(kept_bytes);
    kept_sums_.clear();
    for (uint64_t offset : kept_offset_) kept_sums_.push_back(KeptSums{kept_.data() + offset, 0});
  }
  if (backend_->num_nodes() > 1 && !options_.gpu) {
    // The collectives every node issues per iteration (bucket_pieces.h).
    spdlog::info("event=plan_pieces buckets={} pieces={} piece_mb={} bucket_elements={}{}",
                 plan.buckets.size(), pieces, kPieceBytes >> 20, elements,
                 plan.buckets.size() > kLoggedBucketSizes ? ",..." : "");
  }
  if (options_.gpu) {
    // Between iterations (or before the first): no collective is running.
    if (absl::Status st = options_.gpu->Prepare(plan, spans); !st.ok()) {
      bad_plan_ = std::string(st.message());
    }
  }
  spans_ = std::move(spans);
  bytes_per_iteration_ = bytes;
  remaining_.assign(plan.buckets.size(), 0);
  timelines_.assign(plan.buckets.size(), BucketTimeline{});
  for (const PlannedBucket& b : plan.buckets) {
    remaining_[b.id] = static_cast<uint32_t>(b.tensors.size() * ActiveLocalTrainers());
    timelines_[b.id].bucket = b.id;
    timelines_[b.id].bytes = b.bytes;
  }
  plan_ = std::move(plan);
  absl::MutexLock lock(&plan_mu_);
  published_plan_ = plan_;
}

BucketPlan Scheduler::plan() const {
  absl::MutexLock lock(&plan_mu_);
  return published_plan_;
}

void Scheduler::SetCaps(const BucketCaps& caps, uint64_t at_iteration, uint64_t config_version,
                        bool grow) {
  absl::MutexLock lock(&caps_mu_);
  if (config_version != 0) {
    if (config_version != last_queued_version_ + 1 && caps_gap_.empty()) {
      caps_gap_ = absl::StrCat("job-wide config version ", config_version,
                               " reached this node's scheduler after version ",
                               last_queued_version_, ": version ", last_queued_version_ + 1,
                               " is missing here, so this node would count its plan decisions "
                               "differently from the other nodes");
    }
    last_queued_version_ = config_version;
  }
  pending_caps_.push_back(PendingCaps{caps, at_iteration, config_version, grow});
}

void Scheduler::RestartConfigLog() {
  absl::MutexLock lock(&caps_mu_);
  pending_caps_.clear();
  last_queued_version_ = 0;
  caps_gap_.clear();
}

uint64_t Scheduler::HeldConfigVersion() {
  absl::MutexLock lock(&caps_mu_);
  for (auto it = pending_caps_.rbegin(); it != pending_caps_.rend(); ++it) {
    if (it->config_version != 0) return it->config_version;
  }
  return config_version_;
}

void Scheduler::MaybeRebuild() {
  bool decided = false;
  absl::Status cannot_follow;
  {
    absl::MutexLock lock(&caps_mu_);
    if (!caps_gap_.empty()) {
      cannot_follow = MakeError(v1::INTERNAL, caps_gap_);
      pending_caps_.clear();
    }
    // Every queued change in order, each at its boundary; one missed is an
    // error, never a plan the other nodes do not have.
    while (cannot_follow.ok() && !pending_caps_.empty()) {
      const PendingCaps& next = pending_caps_.front();
      if (next.grow) break;  // Grow's, after this boundary's plan decision
      if (config_agreed_ && next.config_version != 0) {
        // Nodes exchanged the versions they hold in this iteration's
        // agreement: a version every node holds applies at the first
        // boundary at or after its iteration, on every node alike, however
        // late it reached one of them (no guess of how fast the log
        // travels, no "too late").
        if (next.config_version > agreed_config_version_) break;
        if (next.at_iteration != 0 && iteration() < next.at_iteration) break;
        options_.caps = next.caps;
        config_version_ = next.config_version;
        pending_caps_.pop_front();
        decided = true;
        continue;
      }
      if (next.at_iteration != 0 && iteration() > next.at_iteration) {
        cannot_follow = MakeError(
            v1::STATE,
            absl::StrCat("config version ", next.config_version,
                         ": a job-wide bucket-cap change for iteration ", next.at_iteration,
                         " reached this node at iteration ", iteration(),
                         ": too late to change together with the other nodes"));
        pending_caps_.clear();
        break;
      }
      if (next.at_iteration != 0 && iteration() < next.at_iteration) break;
      options_.caps = next.caps;
      if (next.config_version != 0) config_version_ = next.config_version;
      pending_caps_.pop_front();
      decided = true;
    }
  }
  config_agreed_ = false;  // the next boundary needs the next iteration's agreement
  if (!cannot_follow.ok()) {
    fail_(cannot_follow, -1);  // outside caps_mu_: Fail takes the job's lock
    return;
  }
  if (iteration() == 1 && options_.rebuild_after_first_iteration) {
    // Across nodes every node asks, even one whose local rank 0 observed no
    // order (it joined before iteration 0): the rebuild is node 0's order
    // alone, so every node counts the same plan decisions.
    std::vector<uint32_t> order;
    if (observed_order_.size() == layout_.size()) order = observed_order_;
    if (options_.agree_order) {
      absl::StatusOr<std::vector<uint32_t>> agreed = options_.agree_order(order);
      if (!agreed.ok()) {
        fail_(MakeError(CodeOf(agreed.status()),
                        absl::StrCat("agreeing on the rebuilt bucket order: ",
                                     agreed.status().message())),
              -1);
        return;
      }
      order = std::move(*agreed);
    }
    if (order.size() == layout_.size()) {
      order_ = std::move(order);
      decided = true;
    }
  }
  if (!decided) return;
  const uint64_t version = plan_version_.fetch_add(1, std::memory_order_acq_rel) + 1;
  BucketPlan next = PlanBuckets(layout_, order_, options_.caps);
  bool same = next.buckets.size() == plan_.buckets.size();
  for (size_t b = 0; same && b < next.buckets.size(); ++b) {
    same = next.buckets[b].tensors == plan_.buckets[b].tensors;
  }
  if (!same) {
    spdlog::info(
        "event=plan_rebuilt iteration={} buckets_before={} buckets_after={} cap_mb={:.3f} "
        "first_cap_mb={:.3f}",
        iteration(), plan_.buckets.size(), next.buckets.size(),
        options_.caps.cap_bytes / double(1 << 20), options_.caps.first_cap_bytes / double(1 << 20));
    InstallPlan(std::move(next));
    if (!bad_plan_.empty()) {
      fail_(MakeError(v1::INTERNAL, bad_plan_), -1);
      return;
    }
  }
  const PlanStamp stamp{version, PlanFingerprint(plan_), iteration(), config_version_};
  spdlog::info(
      "event=plan_decided plan_version={} fingerprint={:016x} iteration={} "
      "config_version={} buckets={}",
      stamp.plan_version, stamp.fingerprint, stamp.iteration, stamp.config_version,
      plan_.buckets.size());
  // Before this plan's first collective: a node that decided otherwise
  // would pair different buckets (wrong sums, or Gloo aborting the daemon).
  if (options_.check_plan) {
    absl::Status st = options_.check_plan(stamp);
    if (st.ok()) return;
    // A node lost while the plans are compared is a membership change, as
    // inside a collective: an elastic job re-forms at this boundary (nothing
    // of the next iteration was summed). A plan that differs is not.
    const bool lost_a_node =
        CodeOf(st) == v1::PEER_FAILED || CodeOf(st) == v1::TIMEOUT || CodeOf(st) == v1::UNAVAILABLE;
    if (options_.reform && lost_a_node && !halted_.load(std::memory_order_acquire)) {
      Recover(st);
    } else {
      fail_(st, -1);
    }
  }
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  last_progress_ns_ = MonotonicNowNs();
  thread_ = std::thread([this] { Loop(); });
  watchdog_ = std::thread([this] { Watchdog(); });
}

void Scheduler::Stop() {
  // Sequentially consistent with BeginReduction: a reduction that starts
  // now is either seen here and aborted, or sees stop_ and does not run.
  stop_.store(true);
  int64_t since = inflight_since_ns_.load();
  if (since > 0 && inflight_since_ns_.compare_exchange_strong(since, kStopped)) {
    // A backend that ignores its own timeout would otherwise hold the join.
    AbortReduction("the job is stopping");
  }
  ready_bell_->Ring();
  if (thread_.joinable()) thread_.join();
  {
    MonotonicMutexLock lock(&watchdog_mu_);
    watchdog_stop_ = true;
    watchdog_cv_.Signal();
  }
  if (watchdog_.joinable()) watchdog_.join();
}

bool Scheduler::BeginReduction(uint32_t bucket, int64_t start_ns) {
  inflight_bucket_.store(bucket);
  inflight_iteration_.store(iteration());
  inflight_since_ns_.store(std::max<int64_t>(start_ns, 1));  // > 0: in flight
  return !stop_.load();
}

void Scheduler::AbortReduction(const std::string& reason) {
  if (options_.gpu) {
    options_.gpu->Abort(reason);
  } else {
    backend_->Abort(reason);
  }
}

void Scheduler::AbortTimedOutReduction(const std::string& reason) {
  if (!options_.reform) {
    AbortReduction(reason);
    return;
  }
  // Elastic: what hung may be a peer that went silent (a stopped machine);
  // abort only this generation's collectives, as a node's death does
  // (Job::OnWorldFailure), so that the survivors can re-form. The
  // reduction's own polls are past their deadline already, so it returns.
  backend_->Abort(reason);
  if (options_.gpu) options_.gpu->AbortCollectives(reason);
}

absl::Status Scheduler::TimedOut(uint32_t bucket, const absl::Status& st) const {
  const std::string what =
      options_.gpu ? "GPU reduction" : absl::StrCat(backend_->name(), " allreduce");
  return MakeError(v1::TIMEOUT,
                   absl::StrCat("bucket ", bucket, " of iteration ", iteration(), ": the ", what,
                                " did not complete within the ", options_.timeout_ms / 1000.0,
                                " s timeout; the scheduler aborted it",
                                // PEER_FAILED is the abort itself echoed back: nothing new.
                                st.ok() || CodeOf(st) == v1::PEER_FAILED
                                    ? ""
                                    : absl::StrCat(" (it then returned: ", st.message(), ")")));
}

void Scheduler::Watchdog() {
  const int64_t limit_ns = options_.timeout_ms * 1000000 + WatchdogMarginNs(options_.timeout_ms);
  while (true) {
    // Idle: a reduction that starts now is due one limit from now at the
    // earliest, so sleeping that long never misses one.
    int64_t wait_ns = limit_ns;
    int64_t since = inflight_since_ns_.load();
    if (since > 0) {
      // Read before the exchange below, which proves they belong to `since`.
      const uint32_t bucket = inflight_bucket_.load();
      const uint64_t it = inflight_iteration_.load();
      const int64_t left_ns = since + limit_ns - MonotonicNowNs();
      if (left_ns > 0) {
        wait_ns = left_ns;
      } else if (inflight_since_ns_.compare_exchange_strong(since, kTimedOut)) {
        spdlog::error("event=reduction_timeout iteration={} bucket={} timeout_s={:.3f}", it, bucket,
                      options_.timeout_ms / 1000.0);
        AbortTimedOutReduction(absl::StrCat("bucket ", bucket, " of iteration ", it,
                                            " did not complete within the ",
                                            options_.timeout_ms / 1000.0, " s timeout"));
      }
    }
    MonotonicMutexLock lock(&watchdog_mu_);
    if (watchdog_stop_) return;
    watchdog_cv_.WaitWithTimeout(&watchdog_mu_,
                                 absl::Nanoseconds(std::max<int64_t>(wait_ns, 1000000)));
    if (watchdog_stop_) return;
  }
}

void Scheduler::RequestReform(const absl::Status& error) {
  {
    absl::MutexLock lock(&reform_mu_);
    reform_request_ = error;
    reform_requested_.store(true, std::memory_order_release);
  }
  ready_bell_->Ring();
}

bool Scheduler::CollectiveFailed(const absl::Status& error) {
  if (!options_.reform || halted_.load(std::memory_order_acquire)) {
    fail_(error, kCollectiveFailed);
    return false;
  }
  return Recover(error);
}

bool Scheduler::Recover(const absl::Status& error) {
  // gs_broadcast waits meanwhile (growing()), whichever way this ends.
  struct Reforming {
    std::atomic<bool>& flag;
    ~Reforming() { flag.store(false, std::memory_order_release); }
  } reforming{reforming_};
  reforming_.store(true, std::memory_order_release);
  absl::Status cause = error;
  for (;;) {
    spdlog::warn("event=iteration_interrupted iteration={} next_bucket={} error={}", iteration(),
                 next_bucket_, LogValue(cause.message()));
    absl::StatusOr<Reformed> world = options_.reform(cause, iteration());
    {
      // Requests of the old world are answered by this re-formation.
      absl::MutexLock lock(&reform_mu_);
      reform_requested_.store(false, std::memory_order_release);
      reform_request_ = absl::OkStatus();
    }
    if (!world.ok()) {
      fail_(world.status(), -1);
      return false;
    }
    if (halted_.load(std::memory_order_acquire)) return false;
    AdoptWorld(*world);
    bool collective_failed = false;
    absl::Status settled = SettleSplitIteration(&collective_failed);
    if (settled.ok() && options_.resume_broadcast) {
      settled = options_.resume_broadcast(&collective_failed);
    }
    if (halted_.load(std::memory_order_acquire) || stop_.load(std::memory_order_acquire)) {
      return false;
    }
    if (settled.ok()) break;
    if (!collective_failed) {
      fail_(settled, -1);
      return false;
    }
    // Another node lost while the survivors settled: re-form again, from
    // the iteration this node is in now.
    cause = settled;
  }
  members_changed_ = true;
  RewindIteration();
  return true;
}

void Scheduler::RewindIteration() {
  // Every bucket again in plan order, those launched from their kept sums
  // (their arenas may hold the old world's average already).
  size_t kept = options_.gpu ? options_.gpu->kept_buckets() : 0;
  for (const KeptSums& k : kept_sums_) kept += k.pieces > 0;
  next_bucket_ = 0;
  active_agreed_ = false;
  agreement_in_flight_ = false;
  divide_by_active_ = false;
  skip_step_ = false;
  skip_culprit_.clear();
  skip_trainer_.clear();
  // The redo runs with the counts as they are now: a trainer lost
  // mid-iteration needs no second one.
  trainer_lost_mid_iteration_ = false;
  last_progress_ns_ = MonotonicNowNs();
  spdlog::warn(
      "event=iteration_redo iteration={} world_size={} nodes={} node_index={} "
      "kept_buckets={}",
      iteration(), options_.world_size, agreement_nodes_, options_.node_index, kept);
  ready_bell_->Ring();
}

void Scheduler::AdoptWorld(Reformed& world) {
  backend_ = world.backend;
  options_.world_size = world.world_size;
  options_.node_index = world.node_index;
  options_.agree_order = std::move(world.agree_order);
  options_.check_plan = std::move(world.check_plan);
  SizeAgreement();
  active_in_iteration_ = options_.world_size;
  active_trainers_.store(static_cast<uint32_t>(options_.world_size));
  averaging_world_size_.store(options_.world_size, std::memory_order_release);
  if (options_.gpu) {
    // Its communicators were re-formed with the world (Job::Reform).
    options_.gpu->SetWorldSize(options_.world_size);
  } else if (backend_->num_nodes() > 1 && backend_->Staging(staging_bytes_) == nullptr) {
    reducer_.EnsureStaging(staging_bytes_);
  }
  FollowWorldWithInputCopies(/*at_start=*/false);
  // The new generation's config log starts at version 1 (its queue was
  // restarted by the re-formation: RestartConfigLog).
  config_version_ = 0;
  config_agreed_ = false;
}

void Scheduler::SizeAgreement() {
  const int nodes = backend_ != nullptr ? backend_->num_nodes() : 1;
  agreement_nodes_ = std::max(1, nodes);
  straggler_slot_ = kAgreementHeader + 3 * static_cast<size_t>(agreement_nodes_);
  const bool exchanged = nodes > 1 && ExchangesCounts();
  // Slots are places among the generation's members (a re-formed or grown
  // world too), so every member, a joiner included, sizes them alike.
  size_t straggler_slots = 0;
  if (options_.stragglers) {
    options_.stragglers->SetWorld(options_.node_index, agreement_nodes_, exchanged);
    if (exchanged) straggler_slots = options_.stragglers->agreement_slots();
  }
  agreement_.assign(straggler_slot_ + straggler_slots, 0);
}

bool Scheduler::GrowDueAt(uint64_t next) {
  absl::MutexLock lock(&caps_mu_);
  if (!caps_gap_.empty()) return false;  // MaybeRebuild fails the job
  // Walks the queue as MaybeRebuild will: changes that apply at this
  // boundary, then a grow entry that does too.
  for (const PendingCaps& c : pending_caps_) {
    const bool agreed = config_agreed_ && c.config_version != 0;
    if (agreed && c.config_version > agreed_config_version_) return false;
    if (c.at_iteration != 0 && next < c.at_iteration) return false;
    if (c.grow) return true;
  }
  return false;
}

bool Scheduler::Grow() {
  {
    absl::MutexLock lock(&caps_mu_);
    // Any later entry belongs to this generation's log, which ends here:
    // the grown generation's log starts afresh (RestartConfigLog).
    if (!pending_caps_.empty() && pending_caps_.front().grow) pending_caps_.pop_front();
  }
  const RunningPlan plan{order_, options_.caps, plan_version(), std::max(catch_up_root_, 0)};
  spdlog::info("event=job_growing iteration={} plan_version={} world_size={}", iteration(),
               plan.plan_version, options_.world_size);
  absl::StatusOr<Reformed> world = options_.grow(iteration(), plan);
  if (!world.ok()) {
    fail_(world.status(), -1);  // it aborts a broadcast waiting for the grown world
    growing_.store(false, std::memory_order_release);
    return false;
  }
  if (halted_.load(std::memory_order_acquire)) {
    growing_.store(false, std::memory_order_release);
    return false;
  }
  AdoptWorld(*world);
  growing_.store(false, std::memory_order_release);
  spdlog::warn("event=job_grown iteration={} world_size={} nodes={} node_index={}", iteration(),
               options_.world_size, agreement_nodes_, options_.node_index);
  return true;
}

void Scheduler::WaitIdle() {
  Halt();
  absl::MutexLock lock(&launch_mu_);
}

void Scheduler::Loop() {
  if (!bad_plan_.empty()) {
    fail_(MakeError(v1::INTERNAL, bad_plan_), -1);
    halted_.store(true, std::memory_order_release);
  }
  while (!stop_.load(std::memory_order_acquire)) {
    const uint32_t seen = ready_bell_->Sequence();
    if (halted_.load(std::memory_order_acquire)) {
      ready_bell_->Wait(seen, kIdleWait, std::chrono::nanoseconds(0));
      continue;
    }
    if (departures_requested_.load(std::memory_order_acquire) && !TakeDepartures()) continue;
    if (rejoins_requested_.load(std::memory_order_acquire)) TakeRejoins();
    if (reform_requested_.load(std::memory_order_acquire)) {
      absl::Status error;
      {
        absl::MutexLock lock(&reform_mu_);
        error = reform_request_;
      }
      Recover(error);
      continue;
    }
    const int64_t now = MonotonicNowNs();
    bool progress = false;
    if (FailIfTruncated()) continue;
    for (Trainer* t : trainers_) {
      if (!ConsumeReadyRing(*t, now, &progress)) break;
    }
    while (!halted_.load(std::memory_order_acquire) && next_bucket_ < remaining_.size() &&
           remaining_[next_bucket_] == 0) {
      if (!active_agreed_ && !AgreeActiveTrainers()) break;
      if (next_bucket_ + 1 == remaining_.size() && !IssueLostTrainerCount()) break;
      if (!Launch(next_bucket_)) break;
      ++next_bucket_;
      progress = true;
    }
    if (!halted_.load(std::memory_order_acquire) && next_bucket_ == remaining_.size()) {
      if (!IterationStands()) continue;
      FinishIteration();
      progress = true;
    }
    if (progress) {
      last_progress_ns_ = MonotonicNowNs();
      continue;
    }
    CheckDeadlines(now);
    ready_bell_->Wait(seen, kIdleWait, spin_);
  }
}

bool Scheduler::FailIfTruncated() {
  for (const Trainer* t : trainers_) {
    if (!t->segment.Truncated()) continue;
    spdlog::error("event=segment_truncated segment={} trainer={}", t->segment.name(),
                  LogValue(t->Name()));
    fail_(MakeError(v1::INVALID_ARGUMENT,
                    absl::StrCat(t->Name(), ": its shared-memory segment ", t->segment.name(),
                                 " was truncated under the daemon (ftruncate while the job "
                                 "ran); nothing read from it since is used")),
          t->local_rank);
    return true;
  }
  const ipc::NodeSegment* node = options_.node_segment;
  if (node != nullptr && node->Truncated()) {
    spdlog::error("event=segment_truncated segment={} trainer=none", node->name());
    fail_(MakeError(v1::INTERNAL,
                    absl::StrCat("the node segment ", node->name(),
                                 " was truncated under the daemon (ftruncate while the job "
                                 "ran): its readiness doorbell is gone")),
          -1);
    return true;
  }
  return false;
}

bool Scheduler::ConsumeReadyRing(Trainer& t, int64_t now_ns, bool* progress) {
  ipc::ReadyEvent e;
  while (true) {
    const ipc::PopResult r = t.segment.ready_ring().TryPop(&e);
    if (r == ipc::PopResult::kEmpty) return true;
    // What a truncated ring reads is zeros, not the trainer's entries: say so
    // instead of blaming the entry.
    if (r != ipc::PopResult::kOk && FailIfTruncated()) return false;
    if (r == ipc::PopResult::kCorrupt) {
      fail_(MakeError(v1::INVALID_ARGUMENT,
                      absl::StrCat(t.Name(), ": its readiness ring is corrupt (",
                                   t.segment.ValidateHeader().message(), ")")),
            t.local_rank);
      return false;
    }
    const ipc::ReadyExpectation expect{
        static_cast<uint32_t>(layout_.size()), iteration(), t.ready_sequence,
        options_.gpu ? options_.gpu->event_slots(static_cast<size_t>(t.local_rank)) : 0};
    if (absl::Status st = ipc::ValidateReadyEvent(e, expect); !st.ok()) {
      if (FailIfTruncated()) return false;
      fail_(MakeError(v1::INVALID_ARGUMENT,
                      absl::StrCat(t.Name(), " sent a bad readiness entry: ", st.message())),
            t.local_rank);
      return false;
    }
    ++t.ready_sequence;
    if (t.joined.load(std::memory_order_relaxed)) {
      fail_(MakeError(v1::INVALID_ARGUMENT,
                      absl::StrCat(t.Name(), " sent a readiness entry after gs_join")),
            t.local_rank);
      return false;
    }
    if (e.kind == static_cast<uint32_t>(ipc::ReadyKind::kJoin)) {
      if (!Join(t, e)) return false;
      *progress = true;
      continue;
    }
    if (t.marked[e.tensor] != 0) {
      if (FailIfTruncated()) return false;
      fail_(MakeError(v1::INVALID_ARGUMENT,
                      absl::StrCat(t.Name(), " marked tensor ", e.tensor, " '",
                                   layout_[e.tensor].name, "' twice in iteration ", iteration())),
            t.local_rank);
      return false;
    }
    if (!CheckInStep(t, e)) return false;
    RecordHop(Hop::kDaemonMarkSeen, options_.node_rank);
    // The pooled event this mark recorded: what the reduction polls.
    if (options_.gpu) {
      options_.gpu->NoteReady(static_cast<size_t>(t.local_rank), e.tensor, e.event_slot);
    }
    t.marked[e.tensor] = static_cast<uint8_t>(e.kind);
    ++t.marked_count;
    if (e.checksum != 0) {
      t.mark_checksums[e.tensor] = e.checksum;
      ++checksummed_marks_;
    }
    if (marks_++ == 0) {
      iteration_start_ns_ = now_ns;
      in_iteration_.store(true, std::memory_order_release);
    }
    if (t.marked_count == 1 && options_.allow_marks && !options_.allow_marks(t)) return false;
    if (t.local_rank == 0 && iteration() == 0) observed_order_.push_back(e.tensor);
    const uint32_t b = plan_.bucket_of_tensor[e.tensor];
    BucketTimeline& tl = timelines_[b];
    if (remaining_[b] == plan_.buckets[b].tensors.size() * ActiveLocalTrainers()) {
      tl.first_ready_ns = now_ns;
      if (observer_) observer_->OnBucketFirstReady(iteration(), b, now_ns);
    }
    if (--remaining_[b] == 0) {
      tl.last_ready_ns = now_ns;
      if (observer_) observer_->OnBucketLastReady(iteration(), b, now_ns);
    }
    if (options_.stragglers) options_.stragglers->OnMark(t.local_rank, b, now_ns);
    if (observer_) {
      observer_->OnReady(iteration(), t.local_rank, e.tensor,
                         e.kind == static_cast<uint32_t>(ipc::ReadyKind::kUnused), now_ns);
    }
    *progress = true;
  }
}

bool Scheduler::CheckInStep(const Trainer& t, const ipc::ReadyEvent& e) {
  if (no_sync_reference_ == nullptr) {
    no_sync_iterations_ = e.no_sync_iterations;
    no_sync_reference_ = &t;
    return true;
  }
  if (e.no_sync_iterations == no_sync_iterations_) return true;
  // Which one is "wrong" is not knowable here: name both, fail everyone alike.
  const std::string message = absl::StrCat(
      "trainers out of step in iteration ", iteration(), ": ", t.Name(), " summed ",
      e.no_sync_iterations + 1, " iteration(s) into tensor ", e.tensor, " '",
      layout_[e.tensor].name, "' (", e.no_sync_iterations, " under no_sync) but ",
      no_sync_reference_->Name(), " summed ", no_sync_iterations_ + 1, " (", no_sync_iterations_,
      " under no_sync); every trainer must skip synchronization (gs_set_sync(0) / no_sync) in "
      "the same iterations");
  spdlog::error(
      "event=out_of_step iteration={} trainer={} no_sync={} reference={} "
      "reference_no_sync={}",
      iteration(), LogValue(t.Name()), e.no_sync_iterations, LogValue(no_sync_reference_->Name()),
      no_sync_iterations_);
  fail_(MakeError(v1::MISMATCH, message), -1);
  return false;
}

bool Scheduler::ExchangesCounts() const {
  // Elastic jobs always do, on the GPU path too: the switch to a grown
  // generation (GrowDueAt) and a caps change apply where every node holds
  // the entry, which only this exchange shows; without it a node that read
  // the entry one iteration late would grow a boundary after the others.
  return options_.uneven_inputs || !options_.gpu || static_cast<bool>(options_.reform);
}

uint32_t Scheduler::ActiveLocalTrainers() const {
  return static_cast<uint32_t>(trainers_.size()) - joined_local_.load(std::memory_order_relaxed);
}

int Scheduler::Divisor() const {
  return divide_by_active_ ? active_in_iteration_ : options_.world_size;
}

bool Scheduler::Join(Trainer& t, const ipc::ReadyEvent& e) {
  if (options_.gpu) {
    fail_(MakeError(v1::INVALID_ARGUMENT,
                    absl::StrCat(t.Name(),
                                 " called gs_join: uneven inputs are supported for CPU "
                                 "gradients only")),
          t.local_rank);
    return false;
  }
  if (backend_->num_nodes() > 1 && !options_.uneven_inputs) {
    fail_(MakeError(v1::STATE, absl::StrCat(t.Name(),
                                            " called gs_join, but this multi-node job runs "
                                            "without --uneven-inputs on node 0's gradsyncd "
                                            "(start every daemon with it to allow gs_join)")),
          t.local_rank);
    return false;
  }
  if (t.marked_count != 0) {
    fail_(MakeError(v1::INVALID_ARGUMENT,
                    absl::StrCat(t.Name(), " called gs_join in iteration ", iteration(),
                                 " after marking ", t.marked_count, " of ", layout_.size(),
                                 " tensors; join between iterations")),
          t.local_rank);
    return false;
  }
  CountAsJoined(t, (e.tensor & ipc::kJoinDivideByInitialWorldSize) != 0);
  return true;
}

void Scheduler::CountAsJoined(Trainer& t, bool divide_by_initial_world_size) {
  t.divide_by_initial_world_size = divide_by_initial_world_size;
  t.joined.store(true, std::memory_order_relaxed);
  joined_local_.fetch_add(1, std::memory_order_acq_rel);
  // Ready with zeros for every tensor it has not marked: nothing of it is
  // read or written from now on (one that died mid-iteration marked some).
  for (size_t b = 0; b < remaining_.size(); ++b) {
    for (uint32_t tensor : plan_.buckets[b].tensors) remaining_[b] -= t.marked[tensor] == 0;
  }
  RebuildActiveArenas();
  // The GPU path's dead trainer (gs_join is refused there): out of every
  // later reduction.
  if (options_.gpu) options_.gpu->DeactivateTrainer(static_cast<size_t>(t.local_rank));
  spdlog::info(
      "event=trainer_joined iteration={} trainer={} divide_by_initial_world_size={} "
      "local_active={}",
      iteration(), LogValue(t.Name()), t.divide_by_initial_world_size, active_arenas_.size());
}

bool Scheduler::AgreeActiveTrainers() {
  double* counts = agreement_.data();
  std::fill(agreement_.begin(), agreement_.end(), 0);
  for (const Trainer* t : trainers_) {
    if (!t->joined.load(std::memory_order_relaxed)) {
      counts[0] += 1;
    } else {
      counts[t->divide_by_initial_world_size ? 1 : 2] += 1;
    }
  }
  // Each node's trainers agree among themselves (CheckInStep); the nodes
  // compare theirs here (before the first bucket counts as done).
  const size_t slot_of_node = kAgreementHeader + static_cast<size_t>(options_.node_index);
  if (no_sync_reference_ != nullptr && slot_of_node < agreement_.size()) {
    counts[slot_of_node] = no_sync_iterations_ + 1.0;
  }
  // And the newest job-wide config version each node holds (see MaybeRebuild).
  const size_t config_slot =
      kAgreementHeader + static_cast<size_t>(agreement_nodes_ + options_.node_index);
  if (config_slot < agreement_.size())
    counts[config_slot] = static_cast<double>(HeldConfigVersion());
  // Elastic jobs: trainers rejoining after this iteration, and where their
  // state comes from (scheduler_rejoin.cc).
  counts[3] = AnnounceRejoins();
  const size_t root_slot =
      kAgreementHeader + static_cast<size_t>(2 * agreement_nodes_ + options_.node_index);
  if (root_slot < agreement_.size()) counts[root_slot] = LowestActiveRankSlot();
  if (agreement_.size() > straggler_slot_) {
    options_.stragglers->WriteAgreement(counts + straggler_slot_);
  }
  // Every node exchanges, every iteration: a node whose trainers all joined
  // still follows the others' collectives, and whether the exchange happens
  // must not depend on what only one node knows (node 0's --uneven-inputs
  // decides it for the job; without it gs_join is refused across nodes).
  // CPU jobs always exchange, for the no_sync counts.
  bool deferred = false;
  const bool exchanged = backend_->num_nodes() > 1 && ExchangesCounts();
  if (exchanged) {
    // Without uneven inputs nobody joins (gs_join is refused across nodes),
    // so nothing before the first bucket's write-back needs the summed
    // counts: the backend may fold them into the first bucket's collective
    // or run them while that bucket is summed, instead of a collective and
    // a round trip the iteration waits for. Whether it does depends only
    // on what every node shares (node 0's --uneven-inputs, the plan, the
    // wire dtype), so every node issues the same collectives.
    uint64_t first_bucket_bytes = 0;
    DType dtype = DType::kFloat32;
    if (next_bucket_ < spans_.size()) {
      for (const ReduceSpan& span : spans_[next_bucket_]) first_bucket_bytes += span.bytes;
      dtype = plan_.buckets[next_bucket_].dtype;
    }
    // Elastic jobs never defer: a node whose trainer died counts it as
    // joined (scheduler_departure.cc), which only that node knows.
    const bool deferrable = !options_.uneven_inputs && !options_.reform && counts[1] == 0 &&
                            counts[2] == 0 && first_bucket_bytes > 0;
    // What the first collective will carry: the reducer widens halves to
    // float32 (a guess that is off costs overlap, never correctness).
    const DType staged = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    const size_t next_count = first_bucket_bytes / DTypeSize(dtype);
    if (!BeginReduction(0, MonotonicNowNs())) {
      EndReduction();
      return false;
    }
    const absl::Status st = deferrable
                                ? backend_->AllreduceCountsWithNext(counts, agreement_.size(),
                                                                    next_count, staged, &deferred)
                                : backend_->AllreduceCounts(counts, agreement_.size());
    const int64_t slot = EndReduction();
    if (slot == kStopped) return false;
    if (!st.ok() || slot == kTimedOut) {
      CollectiveFailed(
          slot == kTimedOut && CodeOf(st) != v1::TIMEOUT
              ? TimedOut(0, st)
              : MakeError(CodeOf(st) == v1::INTERNAL ? v1::PEER_FAILED : CodeOf(st),
                          absl::StrCat("iteration ", iteration(),
                                       ": agreeing how many trainers are active: ",
                                       backend_->name(), " allreduce failed: ", st.message())));
      return false;
    }
    if (deferred) {
      agreement_in_flight_ = true;  // Launch finishes it
    } else if (!FinishAgreement()) {
      return false;
    }
  }
  if (!deferred) ReadJoinSlots(counts, exchanged);
  // Deferred, the counts are still this node's; nobody joined, so the job's
  // active count is its world size.
  const int active = deferred ? options_.world_size : static_cast<int>(counts[0]);
  if (counts[1] > 0 && counts[2] > 0) {
    fail_(MakeError(v1::MISMATCH,
                    absl::StrCat("iteration ", iteration(), ": ", counts[1],
                                 " trainer(s) joined with divide_by_initial_world_size=1 and ",
                                 counts[2], " with 0; every trainer must pass the same")),
          -1);
    return false;
  }
  active_agreed_ = true;
  active_in_iteration_ = active;
  divide_by_active_ = counts[2] > 0;
  // The GPU reducer pre-scales each local sum by the divisor.
  if (options_.gpu) options_.gpu->SetWorldSize(Divisor());
  active_trainers_.store(static_cast<uint32_t>(active), std::memory_order_release);
  averaging_world_size_.store(Divisor(), std::memory_order_release);
  if (active > 0) return true;
  // Every trainer of the job joined: DDP's join context exits everywhere.
  spdlog::info("event=all_joined iteration={}", iteration());
  all_joined_.store(true, std::memory_order_release);
  Halt();
  // All at once, like "iteration done": the first trainer to return and
  // detach must not get its "detached" error posted ahead of the others'.
  int culprit = -1;
  const absl::Status st = PostToAll(ipc::CompletionKind::kAllJoined, iteration(), &culprit);
  for (Trainer* t : trainers_) t->segment.header()->completion_bell.Ring();
  if (!st.ok()) fail_(MakeError(v1::PEER_FAILED, st.message()), culprit);
  return false;
}

bool Scheduler::FinishAgreement() {
  if (!CheckNodesInStep()) return false;
  const double* held = agreement_.data() + kAgreementHeader + agreement_nodes_;
  agreed_config_version_ = static_cast<uint64_t>(*std::min_element(held, held + agreement_nodes_));
  config_agreed_ = true;
  if (agreement_.size() > straggler_slot_) {
    options_.stragglers->ReadAgreement(agreement_.data() + straggler_slot_);
  }
  return true;
}

bool Scheduler::CheckNodesInStep() {
  const double* by_node = agreement_.data() + kAgreementHeader;
  const int nodes = agreement_nodes_;
  int first = -1;
  for (int n = 0; n < nodes; ++n) {
    if (by_node[n] == 0) continue;  // every trainer of node n joined
    if (first < 0) {
      first = n;
      continue;
    }
    if (by_node[n] == by_node[first]) continue;
    const auto summed = [](double slot) { return static_cast<uint64_t>(slot); };
    const std::string message =
        absl::StrCat("nodes out of step in iteration ", iteration(), ": node ", first,
                     "'s trainers summed ", summed(by_node[first]), " iteration(s) (",
                     summed(by_node[first]) - 1, " under no_sync) but node ", n, "'s summed ",
                     summed(by_node[n]), " (", summed(by_node[n]) - 1,
                     " under no_sync); every trainer of every node must skip synchronization "
                     "(gs_set_sync(0) / no_sync) in the same iterations");
    spdlog::error(
        "event=nodes_out_of_step iteration={} node={} no_sync={} other_node={} "
        "other_no_sync={}",
        iteration(), first, summed(by_node[first]) - 1, n, summed(by_node[n]) - 1);
    fail_(MakeError(v1::MISMATCH, message), -1);
    return false;
  }
  return true;
}

bool Scheduler::CheckUnwrittenSinceMark(uint32_t bucket) {
  for (size_t i = 0; i < trainers_.size(); ++i) {
    const Trainer& t = *trainers_[i];
    for (uint32_t tensor : plan_.buckets[bucket].tensors) {
      const uint32_t at_mark = t.mark_checksums[tensor];
      if (at_mark == 0) continue;
      const uint32_t now =
          ipc::MarkChecksum(arenas_[i] + arena_.tensor_offsets[tensor], layout_[tensor].bytes());
      if (now == at_mark) continue;
      if (FailIfTruncated()) return false;
      spdlog::error("event=written_after_mark iteration={} trainer={} tensor={} name={}",
                    iteration(), LogValue(t.Name()), tensor, LogValue(layout_[tensor].name));
      fail_(MakeError(v1::INVALID_ARGUMENT,
                      absl::StrCat(t.Name(), " wrote tensor ", tensor, " '", layout_[tensor].name,
                                   "' after marking it in iteration ", iteration(),
                                   " (GRADSYNC_DEBUG=detail: checksum ", absl::Hex(at_mark),
                                   " at the mark, ", absl::Hex(now),
                                   " before the reduction); mark a gradient only once it is "
                                   "final")),
            t.local_rank);
      return false;
    }
  }
  return true;
}

bool Scheduler::Launch(uint32_t bucket) {
  const PlannedBucket& b = plan_.buckets[bucket];
  BucketTimeline& tl = timelines_[bucket];
  tl.iteration = iteration();
  tl.launch_ns = MonotonicNowNs();
  RecordHop(Hop::kDaemonLaunch, options_.node_rank);
  if (options_.gpu) return LaunchGpu(bucket);
  // Off by default: no entry carries a checksum, nothing is read.
  if (checksummed_marks_ != 0 && !CheckUnwrittenSinceMark(bucket)) return false;
  if (!BeginReduction(bucket, tl.launch_ns)) {
    EndReduction();
    return false;
  }
  ReduceTimings timings;
  const size_t threads = backend_->num_nodes() <= 1 && LocalTrainersAllMarked()
                             ? std::max(options_.reduce_threads, options_.tail_reduce_threads)
                             : options_.reduce_threads;
  NonFiniteReport nonfinite;
  KeptResultSink* const kept_result_sink = KeptResultSinkFor();
  absl::Status st = reducer_.Reduce(
      active_arenas_, spans_[bucket], b.dtype, Divisor(), *backend_, &timings, threads,
      options_.nonfinite == NonFiniteMode::kOff ? nullptr : &nonfinite,
      options_.reform ? &kept_sums_[bucket] : nullptr, kept_result_sink, InputCopiesForReduce());
  const int64_t slot = EndReduction();
  if (slot == kStopped) return false;  // Stop aborted it: the job is over
  // A trainer's arena cut short mid-sum: the result is garbage, and says so.
  if (FailIfTruncated()) return false;
  // The backend's own timeout, if it won the race, says more: keep it.
  if (slot == kTimedOut && CodeOf(st) != v1::TIMEOUT) {
    CollectiveFailed(TimedOut(bucket, st));
    return false;
  }
  if (!st.ok()) {
    CollectiveFailed(
        MakeError(CodeOf(st) == v1::INTERNAL ? v1::PEER_FAILED : CodeOf(st),
                  absl::StrCat("bucket ", bucket, " of iteration ", iteration(), ": ",
                               backend_->name(), " allreduce failed: ", st.message())));
    return false;
  }
  if (agreement_in_flight_) {
    agreement_in_flight_ = false;
    if (!FinishAgreement()) return false;
  }
  if (nonfinite.result_non_finite &&
      !HandleNonFinite(bucket, nonfinite.local ? DescribeNonFinite(bucket, nonfinite) : "")) {
    return false;
  }
  if (!KeepResult(bucket, kept_result_sink)) return false;
  return FinishLaunch(bucket, timings);
}

std::string Scheduler::DescribeNonFinite(uint32_t bucket, const NonFiniteReport& report) const {
  // report.trainer indexes the arenas reduced: the trainers that have not joined.
  const Trainer* culprit = nullptr;
  size_t active = 0;
  for (const Trainer* t : trainers_) {
    if (t->joined.load(std::memory_order_relaxed)) continue;
    if (active++ == report.trainer) culprit = t;
  }
  std::string tensor = "?";
  for (uint32_t i : plan_.buckets[bucket].tensors) {
    const uint64_t at = arena_.tensor_offsets[i];
    if (report.arena_offset < at || report.arena_offset >= at + layout_[i].bytes()) continue;
    tensor = absl::StrCat(i, " '", layout_[i].name, "' element ",
                          (report.arena_offset - at) / DTypeSize(layout_[i].dtype));
    break;
  }
  return DescribeCulprit(culprit, tensor, report.value);
}

std::string Scheduler::DescribeGpuNonFinite(const GpuNonFiniteReport& report) const {
  // The GPU session's trainers are this node's, in local-rank order.
  const Trainer* culprit = report.trainer < trainers_.size() ? trainers_[report.trainer] : nullptr;
  return DescribeCulprit(
      culprit,
      absl::StrCat(report.tensor, " '", layout_[report.tensor].name, "' element ", report.element),
      report.value);
}

std::string Scheduler::DescribeCulprit(const Trainer* trainer, const std::string& tensor,
                                       double value) const {
  return absl::StrCat(trainer ? trainer->Name() : "a trainer", " on node ", options_.node_rank,
                      " (host ", host_, "): tensor ", tensor, " = ", value);
}

bool Scheduler::HandleNonFinite(uint32_t bucket, const std::string& culprit) {
  const bool nodes = backend_->num_nodes() > 1;
  if (options_.nonfinite == NonFiniteMode::kSkip) {
    // Every node saw the same reduced result, so every node skips alike.
    if (!skip_step_ || (skip_culprit_.empty() && !culprit.empty())) {
      skip_culprit_ = culprit;
      skip_trainer_ = culprit.substr(0, culprit.find(": tensor "));
    }
    skip_step_ = true;
    return true;
  }
  spdlog::error("event=nonfinite_gradient iteration={} bucket={} culprit={}", iteration(), bucket,
                LogValue(culprit.empty() ? "another node" : culprit));
  if (!culprit.empty()) {
    fail_(MakeError(v1::INVALID_ARGUMENT,
                    absl::StrCat("iteration ", iteration(), ": non-finite gradient from ", culprit,
                                 " (--nonfinite=error; --nonfinite=skip skips such steps)")),
          -1);
    return false;
  }
  // Only the node that holds it knows the culprit; it reports the job's
  // failure to the leader, and the collective's explanation relays it.
  fail_(MakeError(v1::INVALID_ARGUMENT,
                  absl::StrCat("iteration ", iteration(), ": bucket ", bucket,
                               " holds a non-finite gradient after the ",
                               nodes ? "cross-node allreduce" : "local sum",
                               nodes ? " but not in this node's trainers' gradients (the culprit "
                                       "is another node's, or the sum overflowed)"
                                     : " of finite gradients: the sum overflowed",
                               " (--nonfinite=error)")),
        nodes ? kCollectiveFailed : -1);
  return false;
}

bool Scheduler::LocalTrainersAllMarked() const {
  for (const Trainer* t : trainers_) {
    if (!t->joined.load(std::memory_order_relaxed) && t->marked_count < layout_.size()) {
      return false;
    }
  }
  return true;
}

bool Scheduler::LaunchGpu(uint32_t bucket) {
  // WaitIdle's other half: a reduction starts only under launch_mu_ and
  // not after Halt, so once a detaching trainer's WaitIdle got the lock,
  // nothing writes into its memory again.
  absl::ReleasableMutexLock lock(&launch_mu_);
  if (halted_.load(std::memory_order_acquire)) return false;
  if (!BeginReduction(bucket, timelines_[bucket].launch_ns)) {
    EndReduction();
    return false;
  }
  const PlannedBucket& b = plan_.buckets[bucket];
  ReduceTimings timings;
  int culprit = GpuReducer::kNoCulprit;
  const absl::Time deadline = MonotonicNow() + absl::Milliseconds(options_.timeout_ms);
  GpuNonFiniteReport nonfinite;
  KeptResultSink* const kept_result_sink = KeptResultSinkFor();
  absl::Status st = options_.gpu->Reduce(
      b, spans_[bucket], deadline, &timings, &culprit,
      options_.nonfinite == NonFiniteMode::kOff ? nullptr : &nonfinite, kept_result_sink);
  const int64_t slot = EndReduction();
  if (slot == kStopped) return false;  // Stop aborted it: the job is over
  if (!st.ok() || slot == kTimedOut) {
    const std::string where = absl::StrCat("bucket ", bucket, " of iteration ", iteration(), ": ");
    if (slot == kTimedOut && CodeOf(st) != v1::TIMEOUT) {
      // Its own deadlines (events, streams) would have said more; what
      // hung is what the watchdog aborted. Elastic: a collective that hung
      // on a silent node re-forms without it (Job::Reform asks the leader
      // which node is silent; none: the job fails with this error).
      if (options_.reform && culprit == GpuReducer::kCollective &&
          !DeviceLost(options_.gpu->last_device_error())) {
        lock.Release();
        CollectiveFailed(TimedOut(bucket, st));
        return false;
      }
      fail_(TimedOut(bucket, st), kCollectiveFailed);
    } else if (culprit == GpuReducer::kCollective) {
      // A peer died (UNAVAILABLE), the group was aborted, or it hung past
      // its timeout: the trainers see PEER_FAILED or TIMEOUT, nothing else.
      const absl::Status error =
          MakeError(CodeOf(st) == v1::TIMEOUT ? v1::TIMEOUT : v1::PEER_FAILED,
                    absl::StrCat(where, "the GPU allreduce failed: ", st.message()));
      if (!DeviceLost(options_.gpu->last_device_error())) {
        // Re-forming waits on other nodes: a detaching trainer's WaitIdle
        // need not wait for it (nothing touches trainers' memory meanwhile).
        lock.Release();
        CollectiveFailed(error);  // elastic: the loop then redoes the iteration
        return false;
      }
      fail_(error, kCollectiveFailed);
    } else {
      const Trainer* blamed = culprit >= 0 ? trainers_[culprit] : nullptr;
      if (blamed != nullptr && options_.leave_job &&
          !DeviceLost(options_.gpu->last_device_error())) {
        // Waiting for the Watch stream must not hold up a detaching
        // trainer's WaitIdle (no reduction runs meanwhile).
        lock.Release();
        if (TrainerDiedMeanwhile(*blamed)) {
          // Its death decides (TakeDepartures), unless it already did: it
          // marked everything, so this iteration counts it, yet the work
          // it queued before its marks never completed.
          if (blamed->departing) LeaveForIncompleteWork(*blamed, st);
          return false;
        }
      }
      fail_(MakeError(CodeOf(st), absl::StrCat(where, st.message())),
            blamed != nullptr ? blamed->local_rank : -1);
    }
    // A sticky CUDA error: this process can never use the GPU again. The
    // trainers already have the job's error; a fresh daemon recovers.
    ExitIfDeviceLost(options_.is_context_lost, options_.gpu->last_device_error(),
                     "the GPU reduction");
    return false;
  }
  if (nonfinite.result_non_finite &&
      !HandleNonFinite(bucket, nonfinite.local ? DescribeGpuNonFinite(nonfinite) : "")) {
    return false;
  }
  if (!KeepResult(bucket, kept_result_sink, &lock)) return false;
  return FinishLaunch(bucket, timings);
}

bool Scheduler::DeviceLost(const absl::Status& device_error) const {
  return !device_error.ok() &&
         (gpu::IsDeviceLost(device_error) ||
          (options_.is_context_lost && options_.is_context_lost(device_error)));
}

bool Scheduler::FinishLaunch(uint32_t bucket, const ReduceTimings& timings) {
  BucketTimeline& tl = timelines_[bucket];
  tl.local_done_ns = tl.launch_ns + timings.local_reduce_ns;
  tl.collective_done_ns = tl.local_done_ns + timings.collective_ns;
  tl.write_back_ns = timings.write_back_ns;
  tl.reduce_threads = timings.threads;
  // No per-bucket completion entry: trainers wait for the iteration, and a
  // model with more buckets than ring slots must not fill the ring.
  tl.done_ns = MonotonicNowNs();
  if (observer_) observer_->OnBucketDone(tl);
  return true;
}

void Scheduler::FinishIteration() {
  const uint64_t it = iteration();
  // Survivors still in it after a death may need it from here (the
  // trainers' next backward overwrites their copy).
  if (kept_result_.enabled())
    kept_result_.Complete(it, plan_.buckets.size(), Divisor(), skip_step_);
  // Trainers that died after marking everything: members of this
  // iteration, gone from the next.
  for (Trainer* t : trainers_) {
    if (t->departing) {
      t->departing = false;
      CountAsJoined(*t, /*divide_by_initial_world_size=*/false);
    }
  }
  // Every bucket's average is in every arena: nothing is redone any more.
  for (KeptSums& kept : kept_sums_) kept.pieces = 0;
  if (options_.gpu) options_.gpu->DropKeptSums();
  for (Trainer* t : trainers_) {
    std::fill(t->marked.begin(), t->marked.end(), 0);
    if (checksummed_marks_ != 0) std::fill(t->mark_checksums.begin(), t->mark_checksums.end(), 0);
    t->marked_count = 0;
    if (!t->joined.load(std::memory_order_relaxed)) ++t->iterations;
  }
  next_bucket_ = 0;
  active_agreed_ = false;
  agreement_in_flight_ = false;
  marks_ = 0;
  no_sync_reference_ = nullptr;
  checksummed_marks_ = 0;
  in_iteration_.store(false, std::memory_order_release);
  stall_reported_ = false;
  const int64_t start = iteration_start_ns_;
  const bool skip = skip_step_;
  if (skip) {
    spdlog::warn("event=nonfinite_step_skipped iteration={} culprit={}", it,
                 LogValue(skip_culprit_.empty() ? "another node" : skip_culprit_));
    if (observer_) observer_->OnNonFiniteSkipped(it, skip_trainer_);
  }
  skip_step_ = false;
  skip_culprit_.clear();
  skip_trainer_.clear();
  // The next iteration's entries can only arrive after "iteration done" is
  // seen, so all resets above happen first.
  iteration_.store(it + 1, std::memory_order_release);
  // "Iteration done" reaches every trainer's ring before any trainer can
  // act on it: holding all the rings' producer locks, a trainer that returns
  // and detaches at once cannot get its "detached" error posted ahead of
  // its peers' "iteration done".
  int culprit = -1;
  // Nodes join at this boundary: the trainers learn it from this entry,
  // before the next iteration, to hand the joiners their state.
  const bool grow = options_.grow && GrowDueAt(it + 1);
  if (grow) growing_.store(true, std::memory_order_release);
  const bool rejoin = trainers_rejoin_;
  trainers_rejoin_ = false;
  const uint32_t flags = (skip ? ipc::kCompletionSkipStep : 0) |
                         (members_changed_ || grow ? ipc::kCompletionMembersChanged : 0) |
                         (grow ? ipc::kCompletionNodesJoined : 0) |
                         (rejoin ? ipc::kCompletionTrainersJoined : 0);
  members_changed_ = false;
  if (grow || rejoin) TellCatchUp(it + 1);
  if (rejoin) OpenRejoinedOnGpu();
  if (rejoin) TellRejoined(it + 1);
  const absl::Status st =
      PostToAll(ipc::CompletionKind::kIterationDone, it, &culprit, flags,
                grow || rejoin ? static_cast<int32_t>(std::max(catch_up_root_, 0)) : 0);
  for (Trainer* t : trainers_) t->segment.header()->completion_bell.Ring();
  RecordHop(Hop::kDaemonPosted, options_.node_rank);
  if (!st.ok()) {
    fail_(MakeError(v1::PEER_FAILED, st.message()), culprit);
    return;
  }
  // Once the trainers are on their way: when the last bucket's reduction
  // returned, its collective had completed.
  if (options_.stragglers && !timelines_.empty()) {
    options_.stragglers->OnIterationDone(it, timelines_);
  }
  if (rejoin) AdmitRejoins();
  // The next iteration's entries wait in the rings until this returns: the
  // plan changes exactly at the boundary.
  // A committed iteration follows the plan decisions the other survivors
  // made at this boundary already (SettleSplitIteration compared them).
  if (!committing_split_) MaybeRebuild();
  if (grow && !Grow()) return;
  for (size_t b = 0; b < remaining_.size(); ++b) {
    remaining_[b] = static_cast<uint32_t>(plan_.buckets[b].tensors.size() * ActiveLocalTrainers());
  }
  if (observer_) observer_->OnIterationDone(it, bytes_per_iteration_, start, MonotonicNowNs());
}

absl::Status Scheduler::PostToAll(ipc::CompletionKind kind, uint64_t it, int* culprit,
                                  uint32_t flags, int32_t catch_up_root) {
  // Locked and unlocked by hand, in local-rank order: no allocation here.
  for (Trainer* t : trainers_) t->completion_mu.Lock();
  absl::Status st;
  const bool to_joined = kind == ipc::CompletionKind::kAllJoined;
  for (Trainer* t : trainers_) {
    // A joined trainer waits for kAllJoined only.
    if (t->joined.load(std::memory_order_relaxed) != to_joined) continue;
    // Iteration done carries the divisor its trainers see (gs_get_job_info).
    const uint32_t world =
        kind == ipc::CompletionKind::kIterationDone ? static_cast<uint32_t>(Divisor()) : 0;
    const int32_t root = kind == ipc::CompletionKind::kIterationDone ? catch_up_root : 0;
    st = PostCompletionLocked(*t, kind, world, it, root, /*patience_ms=*/1000, flags);
    if (!st.ok()) {
      *culprit = t->local_rank;
      break;
    }
  }
  for (Trainer* t : trainers_) t->completion_mu.Unlock();
  return st;
}

void Scheduler::CheckDeadlines(int64_t now_ns) {
  if (marks_ == 0) return;  // between iterations: trainers may be loading data
  const double idle_s = (now_ns - last_progress_ns_) / 1e9;
  if (!stall_reported_ && idle_s >= options_.stall_threshold_s) {
    stall_reported_ = true;
    const std::string missing = DescribeMissing(next_bucket_);
    spdlog::warn("event=stall iteration={} bucket={} waited_s={:.1f} missing={}", iteration(),
                 next_bucket_, idle_s, LogValue(missing));
    if (observer_) observer_->OnStall(iteration(), next_bucket_, idle_s, missing.c_str());
  }
  if (idle_s * 1000 >= options_.timeout_ms) {
    fail_(MakeError(v1::TIMEOUT, absl::StrCat("iteration ", iteration(), " made no progress for ",
                                              options_.timeout_ms / 1000.0,
                                              " s; still waiting for ", DescribeMissing(-1))),
          -1);
  }
}

std::string Scheduler::DescribeMissing(int64_t only_bucket) const {
  constexpr size_t kMaxNames = 8;
  std::string out;
  for (const Trainer* t : trainers_) {
    if (t->marked_count == layout_.size() || t->joined.load(std::memory_order_relaxed)) continue;
    std::string names;
    size_t listed = 0, missing = 0;
    for (size_t i = 0; i < layout_.size(); ++i) {
      if (t->marked[i] != 0) continue;
      if (only_bucket >= 0 && plan_.bucket_of_tensor[i] != only_bucket) continue;
      ++missing;
      if (listed++ < kMaxNames) absl::StrAppend(&names, names.empty() ? "" : ", ", layout_[i].name);
    }
    if (missing == 0) continue;
    if (missing > kMaxNames) absl::StrAppend(&names, " and ", missing - kMaxNames, " more");
    absl::StrAppend(&out, out.empty() ? "" : "; ", t->Name(), " has not marked ", names);
  }
  return out.empty() ? "nothing (the cross-node collective)" : out;
}

}  // namespace gradsync
