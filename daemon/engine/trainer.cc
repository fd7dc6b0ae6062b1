#include "daemon/engine/trainer.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"

namespace gradsync {

std::string Trainer::Name() const {
  return absl::StrCat("rank ", rank, " (local ", local_rank, ", pid ", pid, ")");
}

absl::Status PostCompletion(Trainer& trainer, ipc::CompletionKind kind, uint32_t bucket,
                            uint64_t iteration, int32_t status, bool wake, int64_t patience_ms) {
  absl::MutexLock lock(&trainer.completion_mu);
  absl::Status st = PostCompletionLocked(trainer, kind, bucket, iteration, status, patience_ms);
  if (st.ok() && wake) trainer.segment.header()->completion_bell.Ring();
  return st;
}

absl::Status PostCompletionLocked(Trainer& trainer, ipc::CompletionKind kind, uint32_t bucket,
                                  uint64_t iteration, int32_t status, int64_t patience_ms,
                                  uint32_t flags) {
  ipc::CompletionEvent e{};
  e.kind = static_cast<uint16_t>(kind);
  e.bucket = bucket;
  e.iteration = iteration;
  e.sequence = trainer.completion_sequence;
  e.status = status;
  if (kind == ipc::CompletionKind::kIterationDone) e.rank = trainer.rank;
  e.flags = static_cast<uint16_t>(flags);
  auto& ring = trainer.segment.completion_ring();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(patience_ms);
  while (!ring.TryPush(e)) {
    trainer.segment.header()->completion_bell.Ring();
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(trainer.Name(), " does not consume its completion ring"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ++trainer.completion_sequence;
  return absl::OkStatus();
}

}  // namespace gradsync
