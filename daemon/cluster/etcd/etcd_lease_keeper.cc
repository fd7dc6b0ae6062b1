#include "daemon/cluster/etcd/etcd_lease_keeper.h"

#include <algorithm>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/monotonic.h"

namespace gradsync {

EtcdLeaseKeeper::EtcdLeaseKeeper(EtcdClient* client, EtcdLease lease,
                                 std::function<void(absl::Status)> on_lost)
    : client_(client), lease_(lease), on_lost_(std::move(on_lost)) {
  thread_ = std::thread([this] { Run(); });
}

EtcdLeaseKeeper::~EtcdLeaseKeeper() { Stop(); }

void EtcdLeaseKeeper::Stop() {
  {
    MonotonicMutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

int64_t EtcdLeaseKeeper::renewals() const {
  MonotonicMutexLock lock(&mu_);
  return renewals_;
}

bool EtcdLeaseKeeper::lost() const {
  MonotonicMutexLock lock(&mu_);
  return lost_;
}

void EtcdLeaseKeeper::Run() {
  const absl::Duration interval = std::max(lease_.ttl / 3, absl::Milliseconds(100));
  // The lease counts as alive until `expires`: a TTL after the last renewal
  // that succeeded was sent (sent, not answered: etcd renewed it at most
  // that late).
  absl::Time expires = MonotonicNow() + lease_.ttl;
  absl::Time next = MonotonicNow() + interval;
  absl::Status last_error;
  while (true) {
    {
      MonotonicMutexLock lock(&mu_);
      while (!stopping_) {
        const absl::Duration wait = next - MonotonicNow();
        if (wait <= absl::ZeroDuration()) break;
        wake_.WaitWithTimeout(&mu_, wait);
      }
      if (stopping_) return;
    }
    const absl::Time sent = MonotonicNow();
    // Never past the lease's end (a renewal after it proves nothing), and
    // no longer than an interval or one member's attempt: the next try
    // starts at another member, and Stop waits no longer than this.
    const absl::Time give_up =
        std::min(expires, sent + std::max(interval, client_->options().attempt_timeout));
    absl::StatusOr<absl::Duration> renewed = client_->KeepAliveOnce(lease_.id, give_up);
    absl::Status lost;
    if (renewed.ok()) {
      expires = sent + *renewed;
      next = sent + interval;
      MonotonicMutexLock lock(&mu_);
      ++renewals_;
      continue;
    }
    if (renewed.status().code() == absl::StatusCode::kNotFound) {
      lost = renewed.status();
    } else if (MonotonicNow() >= expires) {
      lost = absl::UnavailableError(
          absl::StrCat(client_->Describe(), ": lease ", lease_.id,
                       " not renewed for its whole TTL (", absl::FormatDuration(lease_.ttl),
                       "); etcd may have expired it; last error: ", renewed.status().message()));
    } else {
      // Try again soon, while the lease still lives.
      next = std::min(MonotonicNow() + std::min(interval, absl::Milliseconds(500)), expires);
      continue;
    }
    {
      MonotonicMutexLock lock(&mu_);
      if (stopping_) return;
      lost_ = true;
    }
    if (on_lost_) on_lost_(lost);
    return;
  }
}

}  // namespace gradsync
