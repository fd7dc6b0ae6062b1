// SpscRing: a lock-free single-producer single-consumer ring in shared memory.
//
// Used twice per trainer: readiness (trainer -> daemon) and completion
// (daemon -> trainer). The producer owns `head`, the consumer owns `tail`;
// each sits on its own cache line so the two sides never false-share. A full
// ring is back-pressure: TryPush fails and the producer retries; an entry is
// never overwritten. Both counters only grow (64-bit: no wrap in practice).
//
// The memory is shared with another process that may be buggy or dead, so
// the consumer validates what it reads: a head that is behind the tail or
// more than `capacity` ahead is corruption and is reported, never followed.
#ifndef GRADSYNC_IPC_SPSC_RING_H_
#define GRADSYNC_IPC_SPSC_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradsync::ipc {

inline constexpr size_t kCacheLine = 64;

// The control block, placed in shared memory before the slots.
struct RingControl {
  alignas(kCacheLine) std::atomic<uint64_t> head;  // next slot to write (producer)
  alignas(kCacheLine) std::atomic<uint64_t> tail;  // next slot to read (consumer)
  alignas(kCacheLine) uint64_t capacity;           // power of two, fixed at init
};
static_assert(sizeof(RingControl) == 3 * kCacheLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "rings need address-free atomics to work across processes");

enum class PopResult { kOk, kEmpty, kCorrupt };

// A typed view over (control block, slots) living in shared memory.
template <typename Entry>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<Entry>, "entries are copied as bytes");

 public:
  SpscRing() = default;
  // `capacity` comes from this process's own layout, never from the shared
  // control block, so garbage there cannot make us index out of bounds.
  SpscRing(RingControl* control, Entry* slots, uint64_t capacity)
      : control_(control), slots_(slots), capacity_(capacity) {}

  // Bytes of shared memory needed for `capacity` entries (slots after control).
  static size_t BytesFor(uint64_t capacity) {
    return sizeof(RingControl) + capacity * sizeof(Entry);
  }

  // Initializes a freshly created ring. `capacity` must be a power of two.
  static void Init(RingControl* control, uint64_t capacity) {
    control->head.store(0, std::memory_order_relaxed);
    control->tail.store(0, std::memory_order_relaxed);
    control->capacity = capacity;
    std::atomic_thread_fence(std::memory_order_release);
  }

  bool valid() const { return control_ != nullptr; }
  uint64_t capacity() const { return capacity_; }

  // Producer side. Returns false when the ring is full (back-pressure).
  bool TryPush(const Entry& e) {
    const uint64_t head = control_->head.load(std::memory_order_relaxed);
    const uint64_t tail = control_->tail.load(std::memory_order_acquire);
    // head - tail > capacity means the consumer side is corrupt: refuse too.
    if (head - tail >= capacity_) return false;
    slots_[head & (capacity_ - 1)] = e;
    control_->head.store(head + 1, std::memory_order_release);
    return true;
  }

  // Consumer side. kCorrupt means the producer side of the shared memory is
  // inconsistent (garbage or a bug); the entry is not consumed.
  PopResult TryPop(Entry* out) {
    const uint64_t tail = control_->tail.load(std::memory_order_relaxed);
    const uint64_t head = control_->head.load(std::memory_order_acquire);
    if (head == tail) return PopResult::kEmpty;
    if (head - tail > capacity_) return PopResult::kCorrupt;  // also catches head < tail
    *out = slots_[tail & (capacity_ - 1)];
    control_->tail.store(tail + 1, std::memory_order_release);
    return PopResult::kOk;
  }

  // Entries waiting to be consumed (approximate while the peer runs). The
  // tail is read first: both counters only grow, so a tail read after the
  // head could pass it and make the difference wrap to ~2^64.
  uint64_t Size() const {
    const uint64_t tail = control_->tail.load(std::memory_order_acquire);
    const uint64_t head = control_->head.load(std::memory_order_acquire);
    return head - tail;
  }

  // Checks the control block against the capacity this side expects.
  absl::Status Validate(uint64_t expected_capacity) const {
    if (control_->capacity != expected_capacity) {
      return absl::DataLossError(
          absl::StrCat("ring capacity is ", control_->capacity, ", expected ", expected_capacity));
    }
    const uint64_t head = control_->head.load(std::memory_order_acquire);
    const uint64_t tail = control_->tail.load(std::memory_order_acquire);
    if (head - tail > expected_capacity) {
      return absl::DataLossError(
          absl::StrCat("ring counters are inconsistent: head=", head, " tail=", tail));
    }
    return absl::OkStatus();
  }

 private:
  RingControl* control_ = nullptr;
  Entry* slots_ = nullptr;
  uint64_t capacity_ = 0;  // power of two
};

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_SPSC_RING_H_
