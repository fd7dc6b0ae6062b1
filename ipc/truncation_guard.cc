#include "ipc/truncation_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync::ipc {
namespace {

// One guarded mapping. `begin` != 0 marks a published slot: it is written
// last on registration and cleared first on removal, so the handler never
// sees a half-written range. Only lock-free atomics: the handler reads them.
struct Slot {
  std::atomic<bool> claimed{false};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> truncated{false};
};
static_assert(std::atomic<uintptr_t>::is_always_lock_free);

Slot g_slots[TruncationGuard::kMaxGuards];
struct sigaction g_previous;  // written once, before the handler is installed
uintptr_t g_page_size = 4096;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  uintptr_t end = 0;
  // BUS_ADRERR: an access past the end of a mapped object. Other causes
  // (alignment, hardware memory errors, a kill) are never ours to hide.
  if (info->si_code == BUS_ADRERR) {
    for (Slot& slot : g_slots) {
      const uintptr_t b = slot.begin.load(std::memory_order_acquire);
      if (b == 0 || addr < b) continue;
      const uintptr_t e = slot.end.load(std::memory_order_acquire);
      if (addr >= e) continue;
      slot.truncated.store(true, std::memory_order_release);
      if (e > end) end = e;
    }
  }
  if (end != 0) {
    const uintptr_t from = addr & ~(g_page_size - 1);
    // mmap is a plain system call on Linux (no lock, no allocation): safe
    // here. MAP_FIXED replaces the dead pages in one step.
    const int saved_errno = errno;
    void* zeros = mmap(reinterpret_cast<void*>(from), end - from, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    errno = saved_errno;
    if (zeros != MAP_FAILED) return;  // the access is retried on the zero pages
  }
  // Not a guarded mapping: what would have happened without us.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  sigaction(SIGBUS, &g_previous, nullptr);
  // A fault recurs when the access is retried; a sent signal must be re-sent.
  if (info->si_code <= 0) raise(sig);
}

absl::Status InstallOnce() {
  static std::once_flag once;
  static int install_errno = 0;
  std::call_once(once, [] {
    g_page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = &OnSigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &g_previous) != 0) install_errno = errno;
  });
  if (install_errno != 0) {
    return absl::InternalError(
        absl::StrCat("installing the SIGBUS handler: ", std::strerror(install_errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TruncationGuard>> TruncationGuard::Watch(void* begin, size_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(begin);
  if (b == 0 || bytes == 0) {
    return absl::InvalidArgumentError("TruncationGuard: nothing to guard");
  }
  RETURN_IF_ERROR(InstallOnce());
  for (int i = 0; i < kMaxGuards; ++i) {
    Slot& slot = g_slots[i];
    bool expected = false;
    if (!slot.claimed.compare_exchange_strong(expected, true)) continue;
    slot.truncated.store(false, std::memory_order_relaxed);
    // Whole pages: the zero pages replace whole pages.
    slot.end.store((b + bytes + g_page_size - 1) & ~(g_page_size - 1), std::memory_order_relaxed);
    slot.begin.store(b, std::memory_order_release);
    return std::unique_ptr<TruncationGuard>(new TruncationGuard(i));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("TruncationGuard: ", kMaxGuards, " mappings are guarded already"));
}

TruncationGuard::~TruncationGuard() {
  Slot& slot = g_slots[slot_];
  slot.begin.store(0, std::memory_order_release);
  slot.end.store(0, std::memory_order_relaxed);
  slot.claimed.store(false, std::memory_order_release);
}

bool TruncationGuard::truncated() const {
  return g_slots[slot_].truncated.load(std::memory_order_acquire);
}

}  // namespace gradsync::ipc
