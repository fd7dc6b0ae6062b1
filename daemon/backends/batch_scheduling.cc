#include "daemon/backends/batch_scheduling.h"

#include <sched.h>

namespace gradsync {

InheritedBatchScheduling::InheritedBatchScheduling() {
  const int policy = sched_getscheduler(0);
  // Only a normal thread is demoted: a real-time caller keeps its policy.
  if (policy != SCHED_OTHER) return;
  sched_param param{};
  param.sched_priority = 0;
  // On Linux pid 0 is the calling thread, not the whole process.
  if (sched_setscheduler(0, SCHED_BATCH, &param) == 0) previous_policy_ = policy;
}

InheritedBatchScheduling::~InheritedBatchScheduling() {
  if (previous_policy_ < 0) return;
  sched_param param{};
  param.sched_priority = 0;
  sched_setscheduler(0, previous_policy_, &param);
}

int SchedulingPolicyOf(int tid) { return sched_getscheduler(tid); }

}  // namespace gradsync
