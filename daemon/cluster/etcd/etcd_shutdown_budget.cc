#include "daemon/cluster/etcd/etcd_shutdown_budget.h"

#include "common/log_value.h"
#include "common/monotonic.h"
#include "spdlog/spdlog.h"

namespace gradsync {

void EtcdShutdownBudget::Begin(absl::Duration total) {
  absl::MutexLock lock(&mu_);
  if (deadline_ != absl::InfiniteFuture()) return;
  total_ = total;
  deadline_ = MonotonicNow() + total;
}

absl::Time EtcdShutdownBudget::deadline() const {
  absl::MutexLock lock(&mu_);
  return deadline_;
}

void EtcdShutdownBudget::NoteSkipped(const std::string& op, const std::string& etcd,
                                     const std::string& error) {
  absl::Duration total;
  {
    absl::MutexLock lock(&mu_);
    if (noted_) return;
    noted_ = true;
    total = total_;
  }
  spdlog::warn(
      "event=etcd_leave_skipped budget_ms={} op={} etcd={} error={} "
      "note={}",
      absl::ToInt64Milliseconds(total), op, LogValue(etcd), LogValue(error),
      LogValue("the shutdown's etcd budget is spent: the other nodes learn of this node's "
               "departure from its lease's expiry"));
}

}  // namespace gradsync
