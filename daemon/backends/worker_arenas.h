// WorkerArenas: the local trainers' gradient arenas as the Gloo worker maps
// them, so that a bucket's collective runs where the trainers' gradients
// are — no copy into the worker's buffer and back — and the worker writes
// the average there itself, right after the collective, while the sum is
// still in its cache (WriteAverage).
//
// Each arena is opened by name and accepted only when it is the very object
// the daemon mapped (device and inode) and holds the arena. The mapping is
// truncation-guarded (ipc/truncation_guard.h): a trainer that cuts its
// segment short cannot kill the worker with SIGBUS; the request that
// touched it fails, naming the segment.
#ifndef GRADSYNC_DAEMON_BACKENDS_WORKER_ARENAS_H_
#define GRADSYNC_DAEMON_BACKENDS_WORKER_ARENAS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "gradsync/v1/gloo_worker.pb.h"
#include "ipc/shared_segment.h"
#include "ipc/truncation_guard.h"

namespace gradsync {

class WorkerArenas {
 public:
  // Maps `arenas` (index i is arena i), replacing those mapped before. On
  // error nothing stays mapped; the error names the segment.
  absl::Status Map(const google::protobuf::RepeatedPtrField<v1::GlooWorkerArena>& arenas);

  // `bytes` bytes at `offset` of arena `index`, or nullptr when that is not
  // within a mapped arena.
  char* At(int index, uint64_t offset, uint64_t bytes) const;

  // OK unless arena `index` was found cut short under its mapping (what was
  // read from it since is zeros): INVALID_ARGUMENT naming the segment.
  absl::Status CheckWhole(int index) const;

 private:
  struct Mapped {
    ipc::SharedSegment segment;
    // Declared after segment: it must go before the mapping does.
    std::unique_ptr<ipc::TruncationGuard> guard;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  std::vector<Mapped> mapped_;
};

// Divides the `count` summed elements of `dtype` (float32 or float64) at
// `sum` by `divisor` in place — the operation the daemon's write-back does,
// so the result is bit-identical — and copies the average to each of
// `copies`. With `check`, returns whether an element of the average is
// NaN or Inf (else false).
bool WriteAverage(char* sum, size_t count, DType dtype, int divisor,
                  const std::vector<char*>& copies, bool check);

// For `count` elements at `average` already divided by the ring
// (ring_average.h): copies them to each of `copies` and, with `check`,
// tests those outside [checked_begin, checked_end) — the ring tested the
// others as it wrote them. Returns whether one it tested is NaN or Inf.
bool CopyAverage(const char* average, size_t count, DType dtype, size_t checked_begin,
                 size_t checked_end, const std::vector<char*>& copies, bool check);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_WORKER_ARENAS_H_
