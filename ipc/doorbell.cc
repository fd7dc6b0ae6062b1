#include "ipc/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

namespace gradsync::ipc {
namespace {

// Shared (not FUTEX_PRIVATE_FLAG): the word is mapped in several processes.
long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

void Doorbell::Ring() {
  // seq_cst on both sides (here and in Wait) forbids the store-load
  // reordering where we miss a new sleeper while it misses our bump:
  // with acq_rel/acquire that lost wake-up is allowed by the C++ model.
  sequence.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) {
    Futex(&sequence, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

Doorbell::WaitResult Doorbell::Wait(uint32_t seen, std::chrono::nanoseconds timeout,
                                    std::chrono::nanoseconds spin) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // Clamp so `start + timeout` cannot overflow: nanoseconds::max() (~292
  // years) would otherwise wrap into the past and time out at once.
  constexpr std::chrono::nanoseconds kForever = std::chrono::hours(24 * 365 * 100);
  timeout = std::min(timeout, kForever);
  spin = std::max(std::min(spin, timeout), std::chrono::nanoseconds(0));
  const auto deadline = start + timeout;
  const auto spin_until = start + spin;

  // Spin: a wake-up within a few microseconds costs no syscall. spin == 0
  // goes straight to sleep (64 pauses alone can take several microseconds).
  if (sequence.load(std::memory_order_acquire) != seen) return WaitResult::kRung;
  for (int i = 1; spin.count() > 0; ++i) {
    CpuRelax();
    if (sequence.load(std::memory_order_acquire) != seen) return WaitResult::kRung;
    if ((i & 63) == 0 && Clock::now() >= spin_until) break;
  }

  // Sleep. Announce ourselves first (seq_cst) so that a ringer that bumps
  // the sequence after our check sees sleepers > 0 and issues FUTEX_WAKE;
  // FUTEX_WAIT itself re-checks the word atomically against `seen`.
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  WaitResult result = WaitResult::kTimeout;
  while (true) {
    if (sequence.load(std::memory_order_seq_cst) != seen) {
      result = WaitResult::kRung;
      break;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
    timespec ts;
    ts.tv_sec = static_cast<time_t>(left.count() / 1000000000);
    ts.tv_nsec = static_cast<long>(left.count() % 1000000000);
    Futex(&sequence, FUTEX_WAIT, seen, &ts);  // EAGAIN / EINTR / ETIMEDOUT: loop re-checks
  }
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return result;
}

}  // namespace gradsync::ipc
