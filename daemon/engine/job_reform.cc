// Job's elastic re-formation (docs/DESIGN.md, "Elastic jobs"): a node of a
// running job with --min-nodes < --num-nodes died, so the survivors form a
// new generation among themselves and the scheduler redoes the iteration.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/engine/job.h"
#include "spdlog/spdlog.h"

namespace gradsync {

void Job::OnWorldFailure(uint64_t epoch, const absl::Status& error) {
  Scheduler* scheduler = nullptr;
  {
    MonotonicMutexLock lock(&mu_);
    if (epoch != world_epoch_) return;  // an old world's link: already re-formed
    if (state_ == JobState::kRunning && scheduler_ && elastic() && hooks_.reform_world) {
      // A collective in flight waits for a dead peer: end it now, the
      // scheduler's failure path then re-forms.
      if (world_.backend) world_.backend->Abort(std::string(error.message()));
      // The GPU path's collective waits for the dead peer the same way.
      if (gpu_session_) gpu_session_->AbortCollectives(std::string(error.message()));
      scheduler = scheduler_.get();
    }
  }
  if (scheduler == nullptr) {
    Fail(error, -1);
    return;
  }
  scheduler->RequestReform(error);
}

absl::StatusOr<Scheduler::Reformed> Job::Reform(const absl::Status& error, uint64_t iteration) {
  std::shared_ptr<WorldLink> old_link;
  uint64_t old_generation = 0;
  {
    MonotonicMutexLock lock(&mu_);
    if (state_ == JobState::kFailed) return error_;
    // From now on the old link's reports are stale.
    ++world_epoch_;
    old_link = world_.link;
    old_generation = world_.generation;
  }
  if (!old_link) return error;
  // Which node died (the leader's silence count): only a death re-forms; a
  // node that reported an error, or a dead leader, ends the job as always.
  const absl::Status explained = old_link->Explain(error);
  const std::vector<int> dead = old_link->DeadNodes();
  if (dead.empty()) return explained;
  spdlog::warn("event=job_reforming job={} generation={} iteration={} dead_node_ranks={} reason={}",
               id_, old_generation, iteration, absl::StrJoin(dead, ","),
               LogValue(explained.message()));
  uint64_t epoch = 0;
  Layout layout;              // copied under mu_: reform_world runs without it
  GpuSession* gpu = nullptr;  // the scheduler's, alive while it runs
  {
    MonotonicMutexLock lock(&mu_);
    if (state_ == JobState::kFailed) return error_;
    epoch = ++world_epoch_;
    layout = layout_;
    gpu = gpu_session_.get();
    retired_backends_.push_back(std::move(world_.backend));
    world_.link.reset();
    if (stats_) stats_->set_stall_listener(nullptr);
  }
  // Stops its heartbeats and leaves the aborted generation.
  old_link.reset();
  absl::StatusOr<JobWorld> world =
      hooks_.reform_world(layout, ResumePoint{old_generation, iteration, false, {}},
                          [this, epoch](const absl::Status& e) { OnWorldFailure(epoch, e); });
  if (world.ok() && gpu != nullptr) world = ReformGpu(*gpu, *std::move(world));
  if (!world.ok()) {
    return MakeError(
        v1::PEER_FAILED,
        absl::StrCat(explained.message(), "; the survivors could not re-form (", "--min-nodes ",
                     config_.min_nodes_or_num(), "): ", world.status().message()));
  }
  absl::Status failed;
  {
    MonotonicMutexLock lock(&mu_);
    if (state_ != JobState::kFailed) return InstallReformedLocked(*std::move(world));
    failed = error_;
    // Stopped while re-forming: leave the new generation as the old one
    // would have been left, so the others need not wait out this node.
    if (departing_ && world->link) world->link->ReportDeparture(error_);
  }
  return failed;  // `world` is torn down unused, without mu_ (its link calls back)
}

absl::StatusOr<JobWorld> Job::ReformGpu(GpuSession& gpu, JobWorld world) {
  ASSIGN_OR_RETURN(const GpuSession::WorldInput in,
                   GpuWorldInput(world, world.generation, [&gpu] { return gpu.aborted(); }));
  if (absl::Status st = gpu.Reform(in); !st.ok()) return st;
  return world;
}

absl::StatusOr<Scheduler::Reformed> Job::InstallReformedLocked(JobWorld world, bool grown) {
  world_.world_size = world.world_size;
  world_.rank_offset = world.rank_offset;
  world_.generation = world.generation;
  world_.num_nodes = world.num_nodes;
  world_.node_index = world.node_index;
  world_.backend = std::move(world.backend);
  world_.agree_order = std::move(world.agree_order);
  world_.check_plan = std::move(world.check_plan);
  world_.publish = std::move(world.publish);
  world_.fetch = std::move(world.fetch);
  world_.link = std::move(world.link);
  ++reformations_;
  // Broadcasts from now on run among the new generation's members.
  if (broadcaster_) {
    broadcaster_->SetWorld(world_.backend.get(), world_.num_nodes, world_.node_index, world_epoch_,
                           grown);
  }
  if (replica_checker_) replica_checker_->SetWorld(world_.backend.get(), world_.node_index);
  Scheduler* scheduler = scheduler_.get();
  WorldLink* link = world_.link.get();
  link->SetProgress([scheduler] { return scheduler->iteration(); });
  scheduler->RestartConfigLog();  // before the listener hands over what the link read
  link->SetConfigListener([scheduler](const BucketCaps& caps, uint64_t at, uint64_t version,
                                      bool grow) { scheduler->SetCaps(caps, at, version, grow); });
  // On the scheduler thread, the only one that reports stalls.
  if (stats_) stats_->set_stall_listener([link](const std::string& d) { link->ReportStall(d); });
  spdlog::warn("event=job_reformed job={} generation={} nodes={} node_index={} world_size={}", id_,
               world_.generation, world_.num_nodes, world_.node_index, world_.world_size);
  Scheduler::Reformed reformed;
  reformed.backend = world_.backend.get();
  reformed.world_size = world_.world_size;
  reformed.node_index = world_.node_index;
  reformed.agree_order = world_.agree_order;
  reformed.check_plan = world_.check_plan;
  return reformed;
}

}  // namespace gradsync
