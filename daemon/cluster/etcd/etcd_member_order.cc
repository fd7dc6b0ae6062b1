#include "daemon/cluster/etcd/etcd_member_order.h"

#include <algorithm>

namespace gradsync {

EtcdMemberOrder::EtcdMemberOrder(size_t members) : members_(std::max<size_t>(members, 1)) {}

size_t EtcdMemberOrder::preferred() const {
  absl::MutexLock lock(&mu_);
  return preferred_;
}

void EtcdMemberOrder::MarkHealthy(size_t index) {
  absl::MutexLock lock(&mu_);
  preferred_ = index % members_;
}

void EtcdMemberOrder::MarkFailed(size_t index) {
  absl::MutexLock lock(&mu_);
  if (preferred_ == index) preferred_ = (index + 1) % members_;
}

}  // namespace gradsync
