// Job's elastic growth (docs/DESIGN.md, "Elastic jobs"): nodes wait to join
// the running job, so at an iteration boundary (nothing in flight) every
// member leaves its generation and forms the next one with them.
#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "daemon/engine/job.h"
#include "spdlog/spdlog.h"

namespace gradsync {

absl::StatusOr<Scheduler::Reformed> Job::Grow(uint64_t iteration, const RunningPlan& plan) {
  std::shared_ptr<WorldLink> old_link;
  uint64_t old_generation = 0;
  uint64_t epoch = 0;
  Layout layout;              // copied under mu_: reform_world runs without it
  GpuSession* gpu = nullptr;  // the scheduler's, alive while it runs
  {
    MonotonicMutexLock lock(&mu_);
    if (state_ == JobState::kFailed) return error_;
    old_link = world_.link;
    if (!old_link || !hooks_.reform_world) {
      return MakeError(v1::INTERNAL, "nodes join a job that has no elastic cluster link");
    }
    // From now on the old link's reports are stale.
    epoch = ++world_epoch_;
    old_generation = world_.generation;
    layout = layout_;
    gpu = gpu_session_.get();
    // Nothing runs on it any more; its worker outlives the job's last
    // collective there on every member (kept until the job ends).
    retired_backends_.push_back(std::move(world_.backend));
    world_.link.reset();
    if (stats_) stats_->set_stall_listener(nullptr);
  }
  spdlog::info("event=job_growing job={} generation={} iteration={}", id_, old_generation,
               iteration);
  // The other members leave the generation at this boundary too: this one
  // must not abort it for them on its way out.
  old_link->Retire();
  old_link.reset();
  ResumePoint resume;
  resume.generation = old_generation;
  resume.iteration = iteration;
  resume.grow = true;
  resume.plan = plan;
  absl::StatusOr<JobWorld> world = hooks_.reform_world(
      layout, resume, [this, epoch](const absl::Status& e) { OnWorldFailure(epoch, e); });
  if (world.ok() && gpu != nullptr) world = ReformGpu(*gpu, *std::move(world));
  if (!world.ok()) {
    return MakeError(v1::PEER_FAILED,
                     absl::StrCat("nodes joining the running job at iteration ", iteration,
                                  " (generation ", old_generation,
                                  "): the members could not form the next generation with them: ",
                                  world.status().message()));
  }
  absl::Status failed;
  {
    MonotonicMutexLock lock(&mu_);
    if (state_ != JobState::kFailed)
      return InstallReformedLocked(*std::move(world), /*grown=*/true);
    failed = error_;
    // Stopped while growing: leave the new generation as Reform does.
    if (departing_ && world->link) world->link->ReportDeparture(error_);
  }
  return failed;  // `world` is torn down unused, without mu_ (its link calls back)
}

}  // namespace gradsync
