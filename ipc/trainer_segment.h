// TrainerSegment: the shared memory between the daemon and one trainer.
//
//   [ header | readiness ring (trainer -> daemon) | completion ring
//     (daemon -> trainer) | gradient arena (page aligned) ]
//
// The daemon creates it at registration; the trainer opens it with the
// layout hash it expects. The header is validated on open (magic, layout
// version, sizes, hash) so a stale or foreign segment is refused clearly.
#ifndef GRADSYNC_IPC_TRAINER_SEGMENT_H_
#define GRADSYNC_IPC_TRAINER_SEGMENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ipc/doorbell.h"
#include "ipc/events.h"
#include "ipc/shared_segment.h"
#include "ipc/spsc_ring.h"
#include "ipc/truncation_guard.h"

namespace gradsync::ipc {

inline constexpr uint64_t kTrainerSegmentMagic = 0x5473'636e'7973'6447ull;  // "GdsyncsT"
// 2: ReadyEvent carries no_sync_iterations and checksum. 3: kIterationDone
// carries world_size and rank.
inline constexpr uint32_t kTrainerSegmentVersion = 3;
inline constexpr size_t kErrorMessageBytes = 1024;

struct TrainerSegmentHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;
  uint64_t segment_bytes;
  uint64_t layout_hash;  // hash of the registered tensor layout
  uint64_t ready_offset;
  uint64_t ready_capacity;
  uint64_t completion_offset;
  uint64_t completion_capacity;
  uint64_t arena_offset;
  uint64_t arena_bytes;
  int64_t daemon_pid;
  int32_t local_rank;
  uint32_t reserved;
  std::atomic<uint64_t> daemon_heartbeat;  // bumped by the daemon while alive
  // The daemon's last error for this trainer: written before a kError
  // completion is posted, so the trainer reads it after that entry.
  std::atomic<uint32_t> error_sequence;
  int32_t error_code;
  char error_message[kErrorMessageBytes];
  Doorbell completion_bell;  // the trainer sleeps here for completions
};

struct TrainerSegmentSpec {
  uint64_t layout_hash = 0;
  uint64_t arena_bytes = 0;
  uint64_t ring_capacity = 4096;  // power of two; entries per ring
  int32_t local_rank = 0;
  pid_t daemon_pid = 0;
};

class TrainerSegment {
 public:
  TrainerSegment() = default;
  TrainerSegment(TrainerSegment&&) = default;
  TrainerSegment& operator=(TrainerSegment&&) = default;

  // Daemon side. The mapping is guarded (ipc/truncation_guard.h): a trainer
  // that truncates its segment cannot kill the daemon, see Truncated().
  static absl::StatusOr<TrainerSegment> Create(const std::string& name,
                                               const TrainerSegmentSpec& spec, mode_t mode = 0600,
                                               gid_t group = -1);
  // Trainer side: validates the header against what registration returned;
  // `owner`: who must own it (nullopt: the caller; see SharedSegment::Open).
  static absl::StatusOr<TrainerSegment> Open(const std::string& name, uint64_t expected_layout_hash,
                                             uint64_t expected_arena_bytes,
                                             std::optional<uid_t> owner = std::nullopt);

  // Re-checks the header (magic, version, sizes): shared memory can be
  // scribbled on by a buggy peer at any time.
  absl::Status ValidateHeader() const;

  TrainerSegmentHeader* header() const { return header_; }
  SpscRing<ReadyEvent>& ready_ring() { return ready_; }
  SpscRing<CompletionEvent>& completion_ring() { return completion_; }
  uint8_t* arena() const { return arena_; }
  uint64_t arena_bytes() const { return arena_bytes_; }
  const std::string& name() const { return segment_.name(); }
  // The segment as mapped (its object's identity; the arena lies at
  // arena() - data() in it).
  const SharedSegment& shared() const { return segment_; }

  // Daemon side: true once the segment was found cut short under this
  // mapping; everything read from it since is zeros, not the trainer's.
  bool Truncated() const { return truncation_guard_ && truncation_guard_->truncated(); }

  // Daemon side: records the error message for the trainer to read.
  void SetError(int32_t code, const std::string& message);
  // Trainer side: the daemon's last error message ("" if none).
  std::string ErrorMessage() const;

 private:
  absl::Status Map(bool validate, uint64_t expected_hash, uint64_t expected_arena_bytes);

  SharedSegment segment_;
  // Declared after segment_: it must go before the mapping does.
  std::unique_ptr<TruncationGuard> truncation_guard_;
  TrainerSegmentHeader* header_ = nullptr;
  SpscRing<ReadyEvent> ready_;
  SpscRing<CompletionEvent> completion_;
  uint8_t* arena_ = nullptr;
  uint64_t arena_bytes_ = 0;
  // Geometry as this process computed it (never re-read from shm).
  uint64_t ready_capacity_ = 0;
  uint64_t completion_capacity_ = 0;
};

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_TRAINER_SEGMENT_H_
