#include "daemon/cluster/etcd/etcd_operation_deadline.h"

#include <utility>

namespace gradsync {
namespace {

thread_local const EtcdOperationDeadline* innermost = nullptr;

}  // namespace

EtcdOperationDeadline::EtcdOperationDeadline(std::string operation, absl::Time deadline,
                                             absl::Duration budget)
    : outer_(innermost), operation_(std::move(operation)), deadline_(deadline), budget_(budget) {
  // The enclosing operation ends first: its deadline binds, and its name.
  if (outer_ != nullptr && outer_->deadline_ <= deadline_) {
    operation_ = outer_->operation_;
    deadline_ = outer_->deadline_;
    budget_ = outer_->budget_;
  }
  innermost = this;
}

EtcdOperationDeadline::~EtcdOperationDeadline() { innermost = outer_; }

const EtcdOperationDeadline* EtcdOperationDeadline::Current() { return innermost; }

}  // namespace gradsync
