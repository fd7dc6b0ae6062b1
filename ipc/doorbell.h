// Doorbell: wake a sleeping process through a futex word in shared memory.
//
// The waiter spins briefly (a wake-up that arrives within a few microseconds
// costs no syscall), then sleeps in FUTEX_WAIT on the word. Ringers bump the
// word and issue FUTEX_WAKE only when someone announced it sleeps. There is
// no mutex or condition variable in shared memory: a process that dies while
// ringing or waiting can never leave the other side blocked forever (every
// wait has a timeout).
//
// Usage without lost wake-ups:
//   uint32_t seen = bell.Sequence();     // 1. read the sequence
//   if (!work_available()) bell.Wait(seen, timeout);  // 2. check, then wait
// and the producer publishes its work before calling Ring().
#ifndef GRADSYNC_IPC_DOORBELL_H_
#define GRADSYNC_IPC_DOORBELL_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace gradsync::ipc {

struct alignas(64) Doorbell {
  std::atomic<uint32_t> sequence;  // bumped by every Ring(); the futex word
  std::atomic<uint32_t> sleepers;  // waiters inside FUTEX_WAIT

  void Init() {
    sequence.store(0, std::memory_order_relaxed);
    sleepers.store(0, std::memory_order_relaxed);
  }

  uint32_t Sequence() const { return sequence.load(std::memory_order_acquire); }

  // Wakes every waiter. Cheap (no syscall) when nobody sleeps.
  void Ring();

  enum class WaitResult { kRung, kTimeout };

  // Returns kRung as soon as the sequence differs from `seen`, kTimeout when
  // `timeout` passes first. Spins for up to `spin` before sleeping (0: sleeps at once).
  // `std::chrono::nanoseconds::max()` means no practical limit.
  WaitResult Wait(uint32_t seen, std::chrono::nanoseconds timeout,
                  std::chrono::nanoseconds spin = std::chrono::microseconds(20));
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex needs a plain 32-bit word");

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_DOORBELL_H_
