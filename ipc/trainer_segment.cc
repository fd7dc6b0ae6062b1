#include "ipc/trainer_segment.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ipc/arena.h"

namespace gradsync::ipc {
namespace {

struct Geometry {
  uint64_t ready_offset, completion_offset, arena_offset, total;
};

Geometry ComputeGeometry(uint64_t ring_capacity, uint64_t arena_bytes) {
  Geometry g;
  g.ready_offset = AlignUp(sizeof(TrainerSegmentHeader), kCacheLine);
  g.completion_offset =
      AlignUp(g.ready_offset + SpscRing<ReadyEvent>::BytesFor(ring_capacity), kCacheLine);
  g.arena_offset = AlignUp(g.completion_offset + SpscRing<CompletionEvent>::BytesFor(ring_capacity),
                           kBucketAlignment);
  g.total = AlignUp(g.arena_offset + arena_bytes, kBucketAlignment);
  return g;
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

absl::StatusOr<TrainerSegment> TrainerSegment::Create(const std::string& name,
                                                      const TrainerSegmentSpec& spec, mode_t mode,
                                                      gid_t group) {
  if (!IsPowerOfTwo(spec.ring_capacity) || spec.ring_capacity > (1u << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring capacity ", spec.ring_capacity, " is not a power of two <= 2^24"));
  }
  // Larger sizes would wrap the geometry arithmetic into a small segment.
  if (spec.arena_bytes > kMaxArenaBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena of ", spec.arena_bytes, " bytes exceeds ", kMaxArenaBytes));
  }
  const Geometry g = ComputeGeometry(spec.ring_capacity, spec.arena_bytes);
  ASSIGN_OR_RETURN(SharedSegment segment, SharedSegment::Create(name, g.total, mode, group));

  TrainerSegment ts;
  ts.segment_ = std::move(segment);
  // Before the first write: the name is visible from here on.
  ASSIGN_OR_RETURN(ts.truncation_guard_,
                   TruncationGuard::Watch(ts.segment_.data(), ts.segment_.size()));
  auto* h = new (ts.segment_.data()) TrainerSegmentHeader();
  h->layout_version = kTrainerSegmentVersion;
  h->header_bytes = sizeof(TrainerSegmentHeader);
  h->segment_bytes = g.total;
  h->layout_hash = spec.layout_hash;
  h->ready_offset = g.ready_offset;
  h->ready_capacity = spec.ring_capacity;
  h->completion_offset = g.completion_offset;
  h->completion_capacity = spec.ring_capacity;
  h->arena_offset = g.arena_offset;
  h->arena_bytes = spec.arena_bytes;
  h->daemon_pid = spec.daemon_pid;
  h->local_rank = spec.local_rank;
  h->completion_bell.Init();
  auto* base = static_cast<uint8_t*>(ts.segment_.data());
  SpscRing<ReadyEvent>::Init(reinterpret_cast<RingControl*>(base + g.ready_offset),
                             spec.ring_capacity);
  SpscRing<CompletionEvent>::Init(reinterpret_cast<RingControl*>(base + g.completion_offset),
                                  spec.ring_capacity);
  // The magic goes last: a reader that sees it sees a complete header.
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kTrainerSegmentMagic;
  RETURN_IF_ERROR(ts.Map(/*validate=*/false, 0, 0));
  return ts;
}

absl::StatusOr<TrainerSegment> TrainerSegment::Open(const std::string& name,
                                                    uint64_t expected_layout_hash,
                                                    uint64_t expected_arena_bytes,
                                                    std::optional<uid_t> owner) {
  TrainerSegment ts;
  ASSIGN_OR_RETURN(ts.segment_, SharedSegment::Open(name, 0660, owner));
  RETURN_IF_ERROR(ts.Map(/*validate=*/true, expected_layout_hash, expected_arena_bytes));
  return ts;
}

absl::Status TrainerSegment::Map(bool validate, uint64_t expected_hash,
                                 uint64_t expected_arena_bytes) {
  if (segment_.size() < sizeof(TrainerSegmentHeader)) {
    return absl::DataLossError(absl::StrCat("segment ", name(), " is ", segment_.size(),
                                            " bytes: smaller than its header"));
  }
  header_ = static_cast<TrainerSegmentHeader*>(segment_.data());
  // Copy the plain fields once; the decisions below never re-read shm.
  struct {
    uint64_t magic, segment_bytes, layout_hash, ready_offset, ready_capacity, completion_offset,
        completion_capacity, arena_offset, arena_bytes;
    uint32_t layout_version, header_bytes;
  } h;
  h.magic = header_->magic;
  h.layout_version = header_->layout_version;
  h.header_bytes = header_->header_bytes;
  h.segment_bytes = header_->segment_bytes;
  h.layout_hash = header_->layout_hash;
  h.ready_offset = header_->ready_offset;
  h.ready_capacity = header_->ready_capacity;
  h.completion_offset = header_->completion_offset;
  h.completion_capacity = header_->completion_capacity;
  h.arena_offset = header_->arena_offset;
  h.arena_bytes = header_->arena_bytes;
  if (validate) {
    if (h.magic != kTrainerSegmentMagic) {
      return absl::DataLossError(absl::StrCat("segment ", name(), " has bad magic 0x",
                                              absl::Hex(h.magic),
                                              ": not a gradsync trainer segment"));
    }
    if (h.layout_version != kTrainerSegmentVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "segment ", name(), " has layout version ", h.layout_version, ", this build speaks ",
          kTrainerSegmentVersion, ": daemon and client are from different releases"));
    }
    if (h.layout_hash != expected_hash) {
      return absl::FailedPreconditionError(absl::StrCat("segment ", name(), " has layout hash ",
                                                        absl::Hex(h.layout_hash), ", expected ",
                                                        absl::Hex(expected_hash)));
    }
    if (h.arena_bytes != expected_arena_bytes) {
      return absl::FailedPreconditionError(absl::StrCat("segment ", name(), " arena is ",
                                                        h.arena_bytes, " bytes, expected ",
                                                        expected_arena_bytes));
    }
    if (!IsPowerOfTwo(h.ready_capacity) || h.ready_capacity != h.completion_capacity ||
        h.ready_capacity > (1u << 24)) {
      return absl::DataLossError(
          absl::StrCat("segment ", name(), " has bad ring capacity ", h.ready_capacity));
    }
  }
  if (h.arena_bytes > kMaxArenaBytes || h.ready_capacity > (1u << 24)) {
    return absl::DataLossError(absl::StrCat("segment ", name(), " header has impossible sizes"));
  }
  const Geometry g = ComputeGeometry(h.ready_capacity, h.arena_bytes);
  if (h.header_bytes != sizeof(TrainerSegmentHeader) || h.segment_bytes != g.total ||
      h.ready_offset != g.ready_offset || h.completion_offset != g.completion_offset ||
      h.arena_offset != g.arena_offset || g.total > segment_.size()) {
    return absl::DataLossError(
        absl::StrCat("segment ", name(), " header geometry does not match its sizes"));
  }
  auto* base = static_cast<uint8_t*>(segment_.data());
  ready_capacity_ = h.ready_capacity;
  completion_capacity_ = h.completion_capacity;
  ready_ = SpscRing<ReadyEvent>(
      reinterpret_cast<RingControl*>(base + g.ready_offset),
      reinterpret_cast<ReadyEvent*>(base + g.ready_offset + sizeof(RingControl)), ready_capacity_);
  completion_ = SpscRing<CompletionEvent>(
      reinterpret_cast<RingControl*>(base + g.completion_offset),
      reinterpret_cast<CompletionEvent*>(base + g.completion_offset + sizeof(RingControl)),
      completion_capacity_);
  arena_ = base + g.arena_offset;
  arena_bytes_ = h.arena_bytes;
  return validate ? ValidateHeader() : absl::OkStatus();
}

absl::Status TrainerSegment::ValidateHeader() const {
  if (header_->magic != kTrainerSegmentMagic) {
    return absl::DataLossError(absl::StrCat("segment ", name(), " header was overwritten (magic 0x",
                                            absl::Hex(header_->magic), ")"));
  }
  if (header_->layout_version != kTrainerSegmentVersion ||
      header_->ready_capacity != ready_capacity_ ||
      header_->completion_capacity != completion_capacity_ ||
      header_->arena_bytes != arena_bytes_) {
    return absl::DataLossError(absl::StrCat("segment ", name(), " header was overwritten"));
  }
  if (auto st = ready_.Validate(ready_capacity_); !st.ok()) {
    return absl::DataLossError(absl::StrCat("segment ", name(), " readiness ", st.message()));
  }
  if (auto st = completion_.Validate(completion_capacity_); !st.ok()) {
    return absl::DataLossError(absl::StrCat("segment ", name(), " completion ", st.message()));
  }
  return absl::OkStatus();
}

void TrainerSegment::SetError(int32_t code, const std::string& message) {
  const size_t n = std::min(message.size(), kErrorMessageBytes - 1);
  std::memcpy(header_->error_message, message.data(), n);
  header_->error_message[n] = '\0';
  header_->error_code = code;
  header_->error_sequence.fetch_add(1, std::memory_order_release);
}

std::string TrainerSegment::ErrorMessage() const {
  if (header_->error_sequence.load(std::memory_order_acquire) == 0) return "";
  char copy[kErrorMessageBytes];
  std::memcpy(copy, header_->error_message, kErrorMessageBytes);
  copy[kErrorMessageBytes - 1] = '\0';  // never trust a terminator in shared memory
  return std::string(copy);
}

}  // namespace gradsync::ipc
