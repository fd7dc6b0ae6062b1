#include "ipc/node_segment.h"

#include <new>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync::ipc {

absl::StatusOr<NodeSegment> NodeSegment::Create(const std::string& name, pid_t daemon_pid,
                                                mode_t mode, gid_t group) {
  ASSIGN_OR_RETURN(SharedSegment segment,
                   SharedSegment::Create(name, sizeof(NodeSegmentHeader), mode, group));
  NodeSegment ns;
  ns.segment_ = std::move(segment);
  ASSIGN_OR_RETURN(ns.truncation_guard_,
                   TruncationGuard::Watch(ns.segment_.data(), ns.segment_.size()));
  ns.header_ = new (ns.segment_.data()) NodeSegmentHeader();
  ns.header_->layout_version = kNodeSegmentVersion;
  ns.header_->header_bytes = sizeof(NodeSegmentHeader);
  ns.header_->daemon_pid = daemon_pid;
  ns.header_->ready_bell.Init();
  std::atomic_thread_fence(std::memory_order_release);
  ns.header_->magic = kNodeSegmentMagic;
  return ns;
}

absl::StatusOr<NodeSegment> NodeSegment::Open(const std::string& name, std::optional<uid_t> owner) {
  ASSIGN_OR_RETURN(SharedSegment segment, SharedSegment::Open(name, 0660, owner));
  if (segment.size() < sizeof(NodeSegmentHeader)) {
    return absl::DataLossError(absl::StrCat("node segment ", name, " is too small"));
  }
  NodeSegment ns;
  ns.segment_ = std::move(segment);
  ns.header_ = static_cast<NodeSegmentHeader*>(ns.segment_.data());
  if (ns.header_->magic != kNodeSegmentMagic) {
    return absl::DataLossError(
        absl::StrCat("node segment ", name, " has bad magic 0x", absl::Hex(ns.header_->magic)));
  }
  if (ns.header_->layout_version != kNodeSegmentVersion ||
      ns.header_->header_bytes != sizeof(NodeSegmentHeader)) {
    return absl::FailedPreconditionError(absl::StrCat("node segment ", name, " has layout version ",
                                                      ns.header_->layout_version,
                                                      ", this build speaks ", kNodeSegmentVersion));
  }
  return ns;
}

absl::Status NodeSegment::Check() const {
  if (header_ == nullptr) return absl::FailedPreconditionError("no node segment");
  const std::string& n = segment_.name();
  if (Truncated()) {
    return absl::DataLossError(absl::StrCat("node segment ", n, " was truncated under the daemon"));
  }
  if (header_->magic != kNodeSegmentMagic) {
    return absl::DataLossError(
        absl::StrCat("node segment ", n, " has bad magic 0x", absl::Hex(header_->magic)));
  }
  if (header_->layout_version != kNodeSegmentVersion ||
      header_->header_bytes != sizeof(NodeSegmentHeader)) {
    return absl::DataLossError(absl::StrCat("node segment ", n, " has layout version ",
                                            header_->layout_version, " and header size ",
                                            header_->header_bytes));
  }
  if (absl::Status st = segment_.CheckStillNamed(); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("node ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace gradsync::ipc
