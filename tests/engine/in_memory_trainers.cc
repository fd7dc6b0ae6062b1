#include "tests/engine/in_memory_trainers.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "ipc/mark_checksum.h"
#include "ipc/shared_segment.h"
#include "tests/engine/patience.h"

namespace gradsync::testing {

// ---- trainer side ----

absl::StatusOr<std::unique_ptr<InMemoryTrainer>> InMemoryTrainer::Open(const Attachment& at,
                                                                       const Layout& layout) {
  std::unique_ptr<InMemoryTrainer> t(new InMemoryTrainer());
  ASSIGN_OR_RETURN(ipc::NodeSegment node, ipc::NodeSegment::Open(at.node_segment_name));
  ASSIGN_OR_RETURN(ipc::TrainerSegment seg,
                   ipc::TrainerSegment::Open(at.segment_name, at.layout_hash, at.arena_bytes));
  if (at.tensor_offsets.size() != layout.size()) {
    return absl::InternalError("registration returned offsets for a different layout");
  }
  for (size_t i = 0; i < layout.size(); ++i) {
    if (at.tensor_offsets[i] + layout[i].bytes() > seg.arena_bytes()) {
      return absl::InternalError(absl::StrCat("tensor ", i, " lies outside the arena"));
    }
  }
  t->layout_ = layout;
  t->node_ = std::move(node);
  t->segment_ = std::move(seg);
  t->offsets_ = at.tensor_offsets;
  t->marked_.assign(layout.size(), 0);
  t->accumulated_.assign(layout.size(), 0);
  return t;
}

double InMemoryTrainer::Get(size_t i, size_t e) const {
  const uint8_t* p = buffer(i);
  switch (layout_[i].dtype) {
    case DType::kFloat32:
      return reinterpret_cast<const float*>(p)[e];
    case DType::kFloat64:
      return reinterpret_cast<const double*>(p)[e];
    case DType::kFloat16:
      return Float16ToFloat(reinterpret_cast<const uint16_t*>(p)[e]);
    case DType::kBFloat16:
      return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(p)[e]);
  }
  return 0;
}

void InMemoryTrainer::Set(size_t i, size_t e, double value) {
  uint8_t* p = buffer(i);
  switch (layout_[i].dtype) {
    case DType::kFloat32:
      reinterpret_cast<float*>(p)[e] = static_cast<float>(value);
      break;
    case DType::kFloat64:
      reinterpret_cast<double*>(p)[e] = value;
      break;
    case DType::kFloat16:
      reinterpret_cast<uint16_t*>(p)[e] = FloatToFloat16(static_cast<float>(value));
      break;
    case DType::kBFloat16:
      reinterpret_cast<uint16_t*>(p)[e] = FloatToBFloat16(static_cast<float>(value));
      break;
  }
}

double InMemoryTrainer::SetRounded(size_t i, size_t e, double value) {
  Set(i, e, value);
  return Get(i, e);
}

absl::Status InMemoryTrainer::MarkReady(size_t i) {
  if (i >= layout_.size() || marked_[i]) return absl::InvalidArgumentError("bad mark");
  accumulated_[i] = 1;
  return Post(i, ipc::ReadyKind::kReady);
}

absl::Status InMemoryTrainer::MarkUnused(size_t i) {
  if (i >= layout_.size() || marked_[i]) return absl::InvalidArgumentError("bad mark");
  if (accumulated_[i]) return Post(i, ipc::ReadyKind::kReady);
  std::memset(buffer(i), 0, layout_[i].bytes());
  return Post(i, ipc::ReadyKind::kUnused);
}

absl::Status InMemoryTrainer::Post(size_t i, ipc::ReadyKind kind) {
  marked_[i] = 1;
  if (!sync_) return absl::OkStatus();
  ipc::ReadyEvent e{};
  e.tensor = static_cast<uint32_t>(i);
  e.kind = static_cast<uint32_t>(kind);
  e.iteration = iteration_;
  e.sequence = ready_sequence_;
  e.no_sync_iterations = no_sync_iterations_;
  if (checksum_marks_) e.checksum = ipc::MarkChecksum(buffer(i), layout_[i].bytes());
  RETURN_IF_ERROR(PostRaw(e));
  ++ready_sequence_;
  return absl::OkStatus();
}

absl::Status InMemoryTrainer::PostJoin(bool divide_by_initial_world_size) {
  ipc::ReadyEvent e{};
  e.kind = static_cast<uint32_t>(ipc::ReadyKind::kJoin);
  e.tensor = divide_by_initial_world_size ? ipc::kJoinDivideByInitialWorldSize : 0;
  e.iteration = iteration_;
  e.sequence = ready_sequence_;
  RETURN_IF_ERROR(PostRaw(e));
  ++ready_sequence_;
  return absl::OkStatus();
}

absl::Status InMemoryTrainer::PostRaw(const ipc::ReadyEvent& e) {
  // The tests' rings are larger than any iteration: full means a bug.
  if (!segment_.ready_ring().TryPush(e)) return absl::ResourceExhaustedError("readiness ring full");
  node_.ready_bell().Ring();
  return absl::OkStatus();
}

absl::Status InMemoryTrainer::Wait(absl::Duration timeout) {
  if (!sync_) {
    ++no_sync_iterations_;
    std::fill(marked_.begin(), marked_.end(), 0);
    return absl::OkStatus();
  }
  timeout = Patience(timeout);
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  ipc::Doorbell& bell = segment_.header()->completion_bell;
  while (true) {
    const uint32_t seen = bell.Sequence();
    ipc::CompletionEvent e;
    const ipc::PopResult r = segment_.completion_ring().TryPop(&e);
    if (r == ipc::PopResult::kCorrupt) return absl::DataLossError("completion ring corrupt");
    if (r == ipc::PopResult::kOk) {
      if (e.sequence != completion_sequence_) {
        return absl::DataLossError(
            absl::StrCat("completion sequence ", e.sequence, ", expected ", completion_sequence_));
      }
      ++completion_sequence_;
      switch (static_cast<ipc::CompletionKind>(e.kind)) {
        case ipc::CompletionKind::kBucketDone:
          continue;
        case ipc::CompletionKind::kIterationDone:
          if (e.iteration != iteration_) {
            return absl::DataLossError(absl::StrCat(
                "iteration ", e.iteration, " completed while the trainer is at ", iteration_));
          }
          ++iteration_;
          no_sync_iterations_ = 0;
          std::fill(marked_.begin(), marked_.end(), 0);
          std::fill(accumulated_.begin(), accumulated_.end(), 0);
          return absl::OkStatus();
        case ipc::CompletionKind::kAllJoined:
          return absl::OkStatus();
        case ipc::CompletionKind::kError: {
          const int code = v1::Code_IsValid(e.status) && e.status != 0 ? e.status : v1::INTERNAL;
          return MakeError(static_cast<v1::Code>(code), segment_.ErrorMessage());
        }
        default:
          return absl::DataLossError(absl::StrCat("unknown completion kind ", e.kind));
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      GaveUp();
      return absl::UnknownError(
          absl::StrCat("the test gave up: no completion within ", absl::FormatDuration(timeout)));
    }
    bell.Wait(seen,
              std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(50)),
              std::chrono::nanoseconds(0));
  }
}

// ---- daemon side ----

absl::StatusOr<std::unique_ptr<InMemoryNode>> InMemoryNode::Create(const std::string& tag,
                                                                   const Layout& layout,
                                                                   const Options& options) {
  std::unique_ptr<InMemoryNode> n(new InMemoryNode());
  n->layout_ = layout;
  // What Job::StartLocked does: plan in reverse registration order, lay the
  // arena out bucket by bucket.
  n->plan_ = PlanBuckets(layout, ReverseRegistrationOrder(layout.size()), options.caps);
  std::vector<uint64_t> bytes;
  for (const TensorInfo& t : layout) bytes.push_back(t.bytes());
  std::vector<std::vector<uint32_t>> groups;
  for (const PlannedBucket& b : n->plan_.buckets) groups.push_back(b.tensors);
  ASSIGN_OR_RETURN(n->arena_, ipc::PlanArena(bytes, groups));

  const std::string prefix = UniqueShmPrefix(tag);
  const std::string node_name = ipc::SegmentName(prefix, getpid(), "node");
  ASSIGN_OR_RETURN(ipc::NodeSegment node, ipc::NodeSegment::Create(node_name, getpid()));
  n->names_.push_back(node_name);
  n->node_ = std::move(node);

  const uint64_t hash = LayoutHash(layout);
  for (int r = 0; r < options.local_size; ++r) {
    ipc::TrainerSegmentSpec spec;
    spec.layout_hash = hash;
    spec.arena_bytes = n->arena_.total_bytes;
    spec.ring_capacity = options.ring_capacity;
    spec.local_rank = r;
    spec.daemon_pid = getpid();
    const std::string name = ipc::SegmentName(prefix, getpid(), absl::StrCat("r", r));
    ASSIGN_OR_RETURN(ipc::TrainerSegment seg, ipc::TrainerSegment::Create(name, spec));
    n->names_.push_back(name);
    auto t = std::make_unique<Trainer>();
    t->session_id = 100 + r;
    t->local_rank = r;
    // A pid of its own, so messages that name the trainer are unambiguous.
    t->pid = 4200 + r;
    t->rank = options.rank_offset + r;
    t->layout = layout;
    t->registered = true;
    t->segment = std::move(seg);
    n->trainers_.push_back(std::move(t));

    ASSIGN_OR_RETURN(
        std::unique_ptr<InMemoryTrainer> end,
        InMemoryTrainer::Open(
            {name, node_name, hash, n->arena_.total_bytes, n->arena_.tensor_offsets}, layout));
    n->ends_.push_back(std::move(end));
  }
  return n;
}

InMemoryNode::~InMemoryNode() {
  for (const std::string& name : names_) ipc::SharedSegment::Remove(name).IgnoreError();
}

std::vector<Trainer*> InMemoryNode::trainers() {
  std::vector<Trainer*> out;
  for (auto& t : trainers_) out.push_back(t.get());
  return out;
}

// ---- names ----

namespace {

// A test binary killed by Bazel's timeout (SIGTERM skips destructors)
// leaves its segments behind: the next run removes those whose process is
// gone ("gse<pid>_...").
void SweepDeadTestSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  std::vector<std::string> dead;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (!absl::StartsWith(name, "gse")) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + 3, &end, 10);
    if (pid <= 0 || end == nullptr || *end != '_') continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) dead.push_back(name);
  }
  closedir(dir);
  for (const std::string& name : dead) ipc::SharedSegment::Remove(name).IgnoreError();
}

}  // namespace

std::string UniqueShmPrefix(const std::string& tag) {
  static std::once_flag swept;
  std::call_once(swept, SweepDeadTestSegments);
  static std::atomic<int> counter{0};
  // No dot: SegmentName() appends ".<pid>.<suffix>".
  return absl::StrCat("gse", getpid(), "_", tag, "_", counter.fetch_add(1));
}

std::vector<std::string> SegmentsWithPrefix(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (const dirent* entry = readdir(dir)) {
    // "<prefix>.": "gse1_x_1" must not claim "gse1_x_10.*".
    if (absl::StartsWith(entry->d_name, absl::StrCat(prefix, "."))) out.push_back(entry->d_name);
  }
  closedir(dir);
  return out;
}

size_t RemoveSegmentsWithPrefix(const std::string& prefix) {
  const std::vector<std::string> names = SegmentsWithPrefix(prefix);
  for (const std::string& name : names) ipc::SharedSegment::Remove(name).IgnoreError();
  return names.size();
}

}  // namespace gradsync::testing
